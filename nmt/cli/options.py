"""Command-line options made from `DecodingConfig`'s fields, so that a decoding key is declared once: its name
(`beam_size` -> `--beam-size`), type (a Literal -> str), help, and default None (the model's own setting). Ranges
are checked where the YAML file's are, so an option and a YAML key give the same message.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import typer

from nmt.config import DecodingConfig

F = TypeVar("F", bound=Callable[..., Any])


def option_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def decoding_parameters(keys: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """Keyword parameters with typer options for the DecodingConfig fields `keys` (all when empty)."""
    hints = typing.get_type_hints(DecodingConfig)
    fields = {f.name: f for f in dataclasses.fields(DecodingConfig)}
    params = []
    for name in keys or tuple(fields):
        kind = str if typing.get_origin(hints[name]) is Literal else hints[name]
        flag = option_name(name)
        declaration = f"{flag}/--no-{flag[2:]}" if kind is bool else flag
        option = typer.Option(None, declaration, help=fields[name].metadata["help"], show_default=False)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=kind | None))
    return params


def decoding_options(*keys: str) -> Callable[[F], F]:
    """Give a command the options of the DecodingConfig fields `keys` (all when none), in `**decoding` (None: not
    given)."""
    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        generated = decoding_parameters(keys)
        command.__signature__ = signature.replace(parameters=[*own, *generated])   # type: ignore[attr-defined]
        command.__annotations__ = {**{p.name: p.annotation for p in own}, **{p.name: p.annotation for p in generated}}
        return command
    return decorate


def given(decoding: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in decoding.items() if value is not None}
