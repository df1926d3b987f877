"""The one reader of text lines: only b"\\n" ends a line, and a last line without it is one too; one b"\\r"
before it is dropped, any other `\\r` (and U+2028, NEL, VT, FF) is content. UTF-8 is decoded strictly, and a line
over `MAX_LINE_BYTES` is refused while streaming. Errors name the source and the 1-based line number.
"""

from __future__ import annotations

import gzip
import re
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from nmt.fs.bounded import file_kind

MAX_LINE_BYTES = 1 << 20    # 1 MiB, ~1000x a long sentence: one 50 MB "line" made translate peak at 1.4 GB


class TextInputError(ValueError):
    """Text that cannot be read: missing or unreadable file, broken gzip, invalid UTF-8 (names line)."""


def iter_lines(stream: BinaryIO, name: str, block_size: int = 1 << 20,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of `stream`, then (after every line before the bad one) a `TextInputError` naming `name` and
    the line on invalid UTF-8 or a line over `max_line_bytes`. `read1` where the stream has it: a pipe's lines come
    out as soon as they arrive, a file's in large blocks (split and decoded in C, not per line)."""
    read = getattr(stream, "read1", stream.read)
    number, waiting = 0, 0
    pending: list[bytes] = []               # the bytes of an unfinished line, `waiting` in all
    try:
        while block := read(block_size):
            cut = block.rfind(b"\n")
            if cut >= 0:                   # the lines this block ends
                for line in _decode_lines(b"".join([*pending, block[:cut]]), name, number, max_line_bytes):
                    number += 1
                    yield line[:-1] if line.endswith("\r") else line
                pending, waiting, block = [], 0, block[cut + 1 :]
            if block:
                pending.append(block)
                waiting += len(block)
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
    """The lines of `raw` (joined by b"\\n", no final one) as `iter_lines` yields them."""
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        for number, encoded in enumerate(raw.split(b"\n"), start=lines_before + 1):
            if len(encoded) > max_line_bytes:
                raise _too_long(name, number, max_line_bytes) from None
            try:
                line = encoded.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TextInputError(f"{name} line {number}: invalid UTF-8 (byte {encoded[exc.start]:#04x} at "
                                     f"column {exc.start + 1})") from None
            yield line
        return
    if len(raw) > max_line_bytes and max(map(len, lines)) * 4 > max_line_bytes:   # a character is <= 4 bytes
        for number, line in enumerate(lines, start=lines_before + 1):
            if len(line) * 4 > max_line_bytes and len(line.encode("utf-8")) > max_line_bytes:
                raise _too_long(name, number, max_line_bytes)
            yield line
        return
    yield from lines


MISSING = "does not exist"


def input_problem(path: str | Path) -> str | None:
    """Why `path` cannot be an input file, as words after its name ("does not exist", "is a FIFO (named pipe), not
    a file"); None for a regular file or a link to one. A pipe read twice or a folder is named, not called missing."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return MISSING
    return None if stat.S_ISREG(mode) else f"is {file_kind(mode)}, not a file"


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


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")    # C0, DEL, C1 (ESC, BEL, CSI, OSC, newlines), U+2028-9


def printable(text: object) -> str:
    """`text` with each control character escaped (\\x1b, \\n): a value from a file shown on a terminal never
    moves the cursor or retitles the window, and a newline in it cannot pass for a line of nmt's own."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_lines(name: str, lines: object) -> list[str]:
    """`lines` (an iterable of strings) as a list; one string is refused (it would be translated per character), and
    so is a lone surrogate, which no tokenizer can encode."""
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
        if not line.isascii() and not _encodable(line):
            raise ValueError(f"{name}[{i}] is not valid Unicode (a lone surrogate)")
    return items                                             # type: ignore[return-value]
