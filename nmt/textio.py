"""The one reader of text lines: only b"\\n" ends a line, UTF-8 is decoded strictly.

A `\\r` right before the `\\n` is part of a CRLF ending and is dropped; any other `\\r`, and
U+2028, NEL, VT or FF, are content. A last line without `\\n` is still a line. Errors name the
source and the 1-based line number.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


class TextInputError(ValueError):
    """Text that cannot be read: missing or unreadable file, broken gzip, invalid UTF-8 (names line)."""


def decode_line(raw: bytes, name: str, number: int) -> str:
    """One line's bytes (without its ending) as text, or a `TextInputError` naming the line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextInputError(
            f"{name} line {number}: invalid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
        ) from None


def iter_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    """Split on b"\\n" only, strip one b"\\r" right before it, decode UTF-8 strictly.

    Raises `TextInputError` naming `name` and the 1-based line number. A final line without
    "\\n" is still a line.
    """
    number = 0
    try:
        for raw in stream:            # binary streams split on b"\n" only
            number += 1
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            yield decode_line(raw, name, number)
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise TextInputError(f"{name}: cannot be read after line {number} ({reason})") from None


def open_text(path: str | Path) -> BinaryIO:
    """A binary handle on a plain or gzipped (.gz) file; problems are `TextInputError`s naming it."""
    path = Path(path)
    if path.is_dir():
        raise TextInputError(f"{path} is a folder, not a text file")
    if not path.exists():
        raise TextInputError(f"{path} does not exist")
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # type: ignore[return-value]
    except OSError as exc:
        raise TextInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (plain or .gz), without their endings."""
    with open_text(path) as handle:
        return list(iter_lines(handle, str(path)))
