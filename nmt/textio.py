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


def iter_lines(stream: BinaryIO, name: str, block_size: int = 1 << 20) -> Iterator[str]:
    """Split on b"\\n" only, strip one b"\\r" right before it, decode UTF-8 strictly.

    Reads blocks with `read1` where the stream has it, so a pipe's lines come out as soon as they
    arrive, and a file's in large blocks (the splitting and decoding run in C, not per line).
    Raises `TextInputError` naming `name` and the 1-based line number, after yielding every line
    before the bad one. A final line without "\\n" is still a line.
    """
    read = getattr(stream, "read1", stream.read)
    number, pending = 0, []            # pending: the bytes of an unfinished line
    try:
        while block := read(block_size):
            cut = block.rfind(b"\n")
            if cut < 0:
                pending.append(block)
                continue
            head = b"".join([*pending, block[:cut]]) if pending else block[:cut]
            pending = [block[cut + 1 :]] if cut + 1 < len(block) else []
            for line in _decode_lines(head, name, number):
                number += 1
                yield line[:-1] if line.endswith("\r") else line
        if pending:
            yield from _decode_lines(b"".join(pending), name, number)
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise TextInputError(f"{name}: cannot be read after line {number} ({reason})") from None


def _decode_lines(raw: bytes, name: str, lines_before: int) -> Iterator[str]:
    """The lines of `raw` (lines joined by b"\\n", no final one), decoded; on invalid UTF-8 the
    lines before the bad one, then a `TextInputError` naming it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        for number, line in enumerate(raw.split(b"\n"), start=lines_before + 1):
            yield decode_line(line, name, number)
        return
    yield from text.split("\n")


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
