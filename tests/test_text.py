"""The one reader of text lines: '\\n' only, one CRLF '\\r' stripped, strict UTF-8 with line numbers."""

from __future__ import annotations

import gzip
import io

import pytest

from nmt.data.corpus import DataError
from nmt.data.corpus import read_lines as corpus_read_lines
from nmt.evaluate import EvaluationError, read_text
from nmt.fs.text import TextInputError, iter_lines, read_lines

# Characters Python's str.splitlines() (and universal newlines) treat as line ends; here they are content.
INSIDE = ["a\rb", "c\x0bd", "e\x0cf", "g\x1ch", "i\x1dj", "k\x1el", "m\x85n", "o\u2028p", "q\u2029r"]


def lines_of(data: bytes) -> list[str]:
    return list(iter_lines(io.BytesIO(data), "stdin"))


def test_only_newline_ends_a_line():
    data = "\n".join(INSIDE).encode() + b"\n"
    assert lines_of(data) == INSIDE


@pytest.mark.parametrize(("data", "expected"), [
    (b"", []),
    (b"\n", [""]),
    (b"\n\n", ["", ""]),
    (b"a", ["a"]),                       # a last line without "\n" is still a line
    (b"a\nb", ["a", "b"]),
    (b"a\r\nb\r\n", ["a", "b"]),         # CRLF endings
    (b"a\r\r\n", ["a\r"]),               # only one "\r" belongs to the ending
    (b"a\r", ["a\r"]),                   # no "\n" after it: the "\r" is content
    (b"\r\n", [""]),
    (b"a\rb\r\n", ["a\rb"]),
])
def test_line_boundaries(data, expected):
    assert lines_of(data) == expected


def test_invalid_utf8_names_source_line_and_byte():
    stream = iter_lines(io.BytesIO(b"ok\nfine\nbad \xff here\nnever\n"), "stdin")
    assert next(stream) == "ok" and next(stream) == "fine"
    with pytest.raises(TextInputError) as info:
        next(stream)
    assert str(info.value) == "stdin line 3: invalid UTF-8 (byte 0xff at column 5)"


@pytest.mark.parametrize("bad", [b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"])
def test_truncated_surrogate_and_overlong_sequences_are_invalid(bad):
    with pytest.raises(TextInputError, match="stdin line 2: invalid UTF-8"):
        lines_of(b"x\n" + bad + b"\n")


def test_read_lines_plain_gzip_and_errors(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_bytes(b"x\ry\r\nz\xe2\x80\xa8w\n")
    assert read_lines(plain) == ["x\ry", "z\u2028w"]
    packed = tmp_path / "a.txt.gz"
    with gzip.open(packed, "wb") as handle:
        handle.write(b"eins\nzwei\r\ndrei")
    assert read_lines(packed) == ["eins", "zwei", "drei"]

    with pytest.raises(TextInputError, match=f"^{tmp_path}/missing.txt does not exist$"):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(TextInputError, match="is a folder"):
        read_lines(tmp_path)
    garbage = tmp_path / "garbage.gz"
    garbage.write_bytes(b"this is not gzip data\n")
    with pytest.raises(TextInputError, match=f"^{garbage}: cannot be read"):
        read_lines(garbage)
    truncated = tmp_path / "truncated.gz"
    truncated.write_bytes(packed.read_bytes()[:-6])
    with pytest.raises(TextInputError, match=f"^{truncated}: cannot be read"):
        read_lines(truncated)
    bad = tmp_path / "bad.gz"
    with gzip.open(bad, "wb") as handle:
        handle.write(b"gut\n\xfe\n")
    with pytest.raises(TextInputError, match=f"^{bad} line 2: invalid UTF-8 \\(byte 0xfe at column 1\\)$"):
        read_lines(bad)


def test_corpus_and_evaluate_readers_use_the_same_rules(tmp_path):
    path = tmp_path / "t.en"
    path.write_bytes("a\x85b\nc\x0cd\r\n\n".encode())
    assert corpus_read_lines(path) == read_text(path) == ["a\x85b", "c\x0cd", ""]
    path.write_bytes(b"fine\n\x80\n")
    with pytest.raises(DataError, match=f"{path} line 2: invalid UTF-8"):
        corpus_read_lines(path)
    with pytest.raises(EvaluationError, match=f"{path} line 2: invalid UTF-8"):
        read_text(path)
