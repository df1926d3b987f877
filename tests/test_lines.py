"""Line integrity end to end: one output line per input line whatever the line contains."""

from __future__ import annotations

import subprocess

from .conftest import nmt_server

LINES = ["ein Hund", "", "a\rb Katze", "zwei\u2028Katzen", "drei\x85Hunde", "vier\x0bfünf", "ff\x0cgg", "   ",
         "ein Mann \x1c läuft"]


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, stdin=stdin)


def test_translate_keeps_one_line_per_input_line(trained_run, tmp_path):
    data = ("\r\n".join(LINES[:3]) + "\n" + "\n".join(LINES[3:])).encode()     # mixed endings, no final newline
    source = tmp_path / "in.de"
    source.write_bytes(data)
    ckpt = str(trained_run / "best.pt")
    from_stdin = run_cli("translate", "--checkpoint", ckpt, "-q", "--beam-size", "1", "--threads", "1", stdin=data)
    assert from_stdin.returncode == 0, from_stdin.stderr
    out = from_stdin.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(LINES)
    assert out[1] == "" and out[7] == ""                                     # empty inputs, empty outputs
    result = run_cli("translate", "--checkpoint", ckpt, "-q", "--beam-size", "1", "--threads", "1",
                     "-i", str(source), "-o", str(tmp_path / "out.en"), "--alignments", str(tmp_path / "al.txt"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.en").read_bytes() == from_stdin.stdout
    assert (tmp_path / "al.txt").read_text().count("\n") == len(LINES)


def test_n_best_gives_exactly_k_lines_per_input_line(trained_run):
    result = run_cli("translate", "--checkpoint", str(trained_run / "best.pt"), "-q", "--n-best", "3",
                     "--beam-size", "3", "--threads", "1", stdin="\n".join(LINES).encode() + b"\n")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.decode().split("\n")[:-1]
    assert len(rows) == 3 * len(LINES)
    assert [int(r.split(" ||| ")[0]) for r in rows] == [i for i in range(len(LINES)) for _ in range(3)]
    assert all(len(r.split(" ||| ")) == 3 for r in rows)
    assert rows[3:6] == ["1 |||  ||| 0.0000"] * 3                            # the empty line
    help_text = run_cli("translate", "--help").stdout.decode()
    assert "--n-best" in help_text and "|||" in help_text


def test_evaluate_counts_only_newlines(tmp_path):
    hyp, ref = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp.write_bytes("a dog\u2028runs\nthe\x85cat\r\nform\x0cfeed\nlone\rcr\n".encode())
    ref.write_bytes(b"a dog runs\r\nthe cat\nform feed\nlone cr")
    result = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", "-")
    assert result.returncode == 0, result.stderr
    assert b'"sentences": 4' in result.stdout
