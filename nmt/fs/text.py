"""The one reader of text lines: only b"\\n" ends a line, UTF-8 is decoded strictly.

A `\\r` right before the `\\n` is part of a CRLF ending and is dropped; any other `\\r`, and
U+2028, NEL, VT or FF, are content. A last line without `\\n` is still a line. A line longer
than `MAX_LINE_BYTES` is an error (a binary file, or text without newlines), found while
streaming: a reader never holds more than that bound plus one block. Errors name the source and
the 1-based line number.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MAX_LINE_BYTES = 1 << 20    # 1 MiB, ~1000x a long sentence: one 50 MB "line" made translate peak at 1.4 GB


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


def iter_lines(stream: BinaryIO, name: str, block_size: int = 1 << 20,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Split on b"\\n" only, strip one b"\\r" right before it, decode UTF-8 strictly.

    Reads blocks with `read1` where the stream has it, so a pipe's lines come out as soon as they
    arrive, and a file's in large blocks (the splitting and decoding run in C, not per line).
    Raises `TextInputError` naming `name` and the 1-based line number, after yielding every line
    before the bad one: invalid UTF-8, or a line over `max_line_bytes` (refused as soon as that
    many bytes arrived without a newline). A final line without "\\n" is still a line.
    """
    read = getattr(stream, "read1", stream.read)
    number, pending, waiting = 0, [], 0    # pending: the bytes of an unfinished line, `waiting` in all
    try:
        while block := read(block_size):
            cut = block.rfind(b"\n")
            if cut < 0:
                pending.append(block)
                waiting += len(block)
                if waiting > max_line_bytes:
                    raise _too_long(name, number + 1, max_line_bytes)
                continue
            head = b"".join([*pending, block[:cut]]) if pending else block[:cut]
            pending = [block[cut + 1 :]] if cut + 1 < len(block) else []
            waiting = len(block) - cut - 1
            for line in _decode_lines(head, name, number, max_line_bytes):
                number += 1
                yield line[:-1] if line.endswith("\r") else line
            if waiting > max_line_bytes:
                raise _too_long(name, number + 1, max_line_bytes)
        if pending:
            yield from _decode_lines(b"".join(pending), name, number, max_line_bytes)
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise TextInputError(f"{name}: cannot be read after line {number} ({reason})") from None


def _too_long(name: str, number: int, max_line_bytes: int) -> TextInputError:
    return TextInputError(f"{name} line {number}: longer than {max_line_bytes} bytes, the limit for one line "
                          "(is it a text file with \\n line endings?)")


def _decode_lines(raw: bytes, name: str, lines_before: int, max_line_bytes: int) -> Iterator[str]:
    """The lines of `raw` (lines joined by b"\\n", no final one), decoded; on invalid UTF-8 or a line
    over `max_line_bytes`, the lines before the bad one, then a `TextInputError` naming it."""
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        for number, encoded in enumerate(raw.split(b"\n"), start=lines_before + 1):
            if len(encoded) > max_line_bytes:
                raise _too_long(name, number, max_line_bytes) from None
            yield decode_line(encoded, name, number)
        return
    if len(raw) > max_line_bytes and max(map(len, lines)) * 4 > max_line_bytes:   # a character is <= 4 bytes
        for number, line in enumerate(lines, start=lines_before + 1):
            if len(line) * 4 > max_line_bytes and len(line.encode("utf-8")) > max_line_bytes:
                raise _too_long(name, number, max_line_bytes)
            yield line
        return
    yield from lines


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


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")        # C0, DEL and C1: ESC, BEL, CSI, OSC, newlines


def printable(text: object) -> str:
    """`text` with each control character written as its escape (\\x1b, \\n): a value from a file (a model
    card, a file name, an error quoting either) shown on a terminal never moves the cursor, clears the
    screen or retitles the window, and a newline inside a value cannot pass for a line of nmt's own."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def as_lines(name: str, lines: object) -> list[str]:
    """`lines` as a list of strings: any iterable of them (a generator is read once), but not one string
    (which would be translated character by character) and no bytes or other items."""
    if isinstance(lines, (str, bytes)):
        raise TypeError(f"{name} must be a list of strings, not one {'string' if isinstance(lines, str) else 'bytes'}"
                        "; for one sentence pass [sentence]")
    try:
        items: list[object] = list(lines)                    # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{name} must be a list of strings, not {type(lines).__name__}") from None
    for i, line in enumerate(items):
        if not isinstance(line, str):
            raise TypeError(f"{name}[{i}] is {type(line).__name__}, not a string")
    return items                                             # type: ignore[return-value]
