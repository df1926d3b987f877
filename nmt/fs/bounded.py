"""Reading JSON and YAML that may be hostile: bounded in size, nesting and (YAML) alias expansion.

Any file nmt reads may come from someone else: JSON nested 100,000 deep overflows Python's stack, and YAML aliases
of aliases expand to 9^9 nodes (a "billion laughs"). Each input is held to bounds far above any real file before it
is built; a breach is a `BoundError` (a ValueError, reported as an unreadable file) naming the bound.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 32                    # nesting of lists and mappings (nmt's own files nest 4 deep)
MAX_JSON_BYTES = 64 << 20         # a data manifest, a marker, a model file's metadata, a score file
MAX_YAML_BYTES = 1 << 20          # a config file (nmt's are ~4 KB)
MAX_YAML_NODES = 100_000          # scalars, lists and mappings, with every alias expanded
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
YAML_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml when built with it


class BoundError(ValueError):
    """An input past a bound; `line`: where in a YAML text, if known (the message says it too)."""

    def __init__(self, problem: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {problem}" if line is not None else problem)
        self.problem, self.line = problem, line


def loads_json(text: str | bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` that refuses a document over `max_bytes` or nested deeper than `max_depth`, and a key given
    twice in one object (json.loads would keep the last silently, as YAML would; nmt's config loader refuses that)."""
    if len(text) > max_bytes:
        raise BoundError(f"larger than {_size(max_bytes)}")
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
        too_deep = _depth_over(value, max_depth)
    except RecursionError:        # the C decoder stops at the interpreter's recursion limit (~1000 deep)
        too_deep = True
    if too_deep:
        raise BoundError(f"JSON nested deeper than {max_depth} levels")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))    # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice[:40]!r} is given twice in one object")
    return value


def _depth_over(value: Any, max_depth: int) -> bool:
    """Whether lists and mappings nest deeper than `max_depth` in `value` (walked without recursion)."""
    stack = [(value, 0)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth >= max_depth:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def read_bytes(path: str | Path, max_bytes: int, follow: bool = True) -> bytes:
    """The bytes of the regular file `path`, refused past `max_bytes`; a pipe or device is an OSError
    (reading one would wait forever or never end), as is a missing file, or a link unless `follow`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)})", str(path))
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BoundError(f"larger than {_size(max_bytes)}")
    return data


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON in the file `path`, within the bounds; errors as `json.loads(read_text())` raises them."""
    return loads_json(read_bytes(path, max_bytes).decode("utf-8"), max_bytes, max_depth)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(count: int) -> str:
    return f"{count >> 20} MB" if count >= 1 << 20 else f"{count >> 10} KB" if count >= 1 << 10 else f"{count} bytes"


def check_yaml(text: str, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_DEPTH,
               max_nodes: int = MAX_YAML_NODES) -> None:
    """Refuse YAML past the bounds, counting nodes with aliases expanded, from libyaml's event stream (iterative
    in C: no recursion, no nodes built). Syntax errors are left to the loader that follows."""
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise BoundError(f"larger than {_size(max_bytes)}")
    nodes, depth = 0, 0
    sizes: dict[str, int] = {}            # anchor -> expanded nodes of what it names
    open_anchors: list[tuple[str | None, int]] = []   # (anchor, nodes before it) of each open list or mapping
    try:
        for event in yaml.parse(text, Loader=YAML_LOADER):
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:     # undefined, or inside what it names: a loop
                    raise _marked(event, f"alias *{event.anchor} refers to no finished anchor")
                nodes += sizes[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, _OPEN):
                depth, nodes = depth + 1, nodes + 1
                open_anchors.append((event.anchor, nodes - 1))
                if depth > max_depth:
                    raise _marked(event, f"nested deeper than {max_depth} levels")
            elif isinstance(event, _CLOSE):
                depth -= 1
                anchor, before = open_anchors.pop()
                if anchor is not None:
                    sizes[anchor] = nodes - before
            if nodes > max_nodes:
                raise _marked(event, f"more than {max_nodes:,} values once its aliases (*name) are expanded")
    except yaml.YAMLError:
        return                            # the loader reports it, with its line


def _marked(event: yaml.Event, problem: str) -> BoundError:
    mark = event.start_mark
    return BoundError(problem, mark.line + 1 if mark is not None else None)


def load_yaml(text: str, loader: type | None = None, **bounds: int) -> Any:
    """`yaml.load(text, loader)` (libyaml's safe loader by default) after `check_yaml(text, **bounds)`."""
    check_yaml(text, **bounds)
    return yaml.load(text, Loader=loader or YAML_LOADER)
