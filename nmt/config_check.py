"""Checking a raw YAML mapping against a dataclass schema (nmt.config): names (with a "did you mean" hint), types,
ranges and paths; the first problem is a one-line `ConfigError` naming the key."""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import types
import typing
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A problem with the configuration that the user can fix; the message names the key."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, base_dir: Path | None, stored: bool) -> Any:
    """`value` checked against the annotation `tp`; an int (or a string such as 3e-4) where a float is expected."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, f"{key}.", base_dir, stored)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        # A mapping can only be a section and a list only a list: let their own errors through.
        if isinstance(value, dict):
            options = tuple(o for o in options if dataclasses.is_dataclass(o)) or options
        elif isinstance(value, list):
            options = tuple(o for o in options if typing.get_origin(o) is list) or options
        if len(options) == 1:
            return _coerce(value, options[0], key, base_dir, stored)
        for option in options:
            try:
                return _coerce(value, option, key, base_dir, stored)
            except ConfigError:
                continue
        raise ConfigError(f"`{key}` must be {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        raise ConfigError(f"`{key}` must be one of {_type_name(tp)}, got {value!r}{hint}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"`{key}` must be {_type_name(tp)}, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]", base_dir, stored) for i, v in enumerate(value)]
    if tp in (type(None), bool, int, str) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    if tp is float:
        try:  # PyYAML reads 3e-4 (no dot) as a string
            number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"`{key}` must be a finite number, got {value!r}")
            return number
    raise ConfigError(f"`{key}` must be {_type_name(tp)}, got {value!r}")


_RANGE_CHECKS = (("ge", operator.lt, ">="), ("gt", operator.le, ">"), ("le", operator.gt, "<="))
INT_LIMIT = 2**31 - 1     # every integer key: counts, sizes and seeds far beyond any real use are typos
STORED_INT_LIMIT = 2**63 - 1    # in stored configs (earlier nmt versions had no INT_LIMIT): what torch can take


def build(cls: Any, raw: Any, prefix: str, base_dir: Path | None, stored: bool = False) -> Any:
    """Build dataclass `cls` from the mapping `raw`, checking every key (see `stored_config` for `stored`)."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"`{prefix.rstrip('.') or 'config'}` must be a mapping of keys to values, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f"; did you mean `{prefix}{close[0]}`?" if close else ""
            raise ConfigError(f"unknown key `{key}`{hint}")
        value = _coerce(value, hints[name], key, base_dir, stored)
        meta = fields[name].metadata
        checked = not (stored and meta.get("since_saved"))
        for bound, fails, words in _RANGE_CHECKS:
            if checked and meta.get(bound) is not None and fails(value, meta[bound]):
                raise ConfigError(f"`{key}` must be {words} {meta[bound]}, got {value}")
        limit = STORED_INT_LIMIT if stored else INT_LIMIT
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise ConfigError(f"`{key}` must be at most {limit}, got {value}")
        if meta.get("path") and value is not None and base_dir is not None:
            value = _resolve_paths(value, base_dir)
        values[name] = value
    return cls(**values)


def _resolve_paths(value: Any, base_dir: Path) -> Any:
    """A path (or the plain paths in a list) resolved against `base_dir`; sections resolved themselves."""
    if isinstance(value, list):
        return [_resolve_paths(v, base_dir) for v in value]
    if isinstance(value, str):
        return str((base_dir / Path(value).expanduser()).resolve())
    return value
