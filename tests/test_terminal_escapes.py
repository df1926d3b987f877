"""Text from a file never reaches the terminal raw (nmt/fs/text.py `printable`): a model card,
a version, a config value or a file name holding terminal escapes is printed with them escaped, by
`nmt info` (Markdown and JSON), `nmt export` and every `error:` line."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import nmt_server

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\nforged line\r\x7f"   # retitle, clear the screen, C1 CSI, a newline
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")                # every control but the output's own newlines


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, text=True)


def assert_clean(result: subprocess.CompletedProcess) -> None:
    for stream in (result.stdout, result.stderr):
        assert not RAW.search(stream), repr(stream)
        assert not any(line.startswith("forged line") for line in stream.splitlines()), stream


def hostile_model(model_file: Path, out: Path, edit: Callable[[dict[str, Any]], Any] = lambda payload: None) -> Path:
    """`model_file` written again by nmt's own writer, with a hostile card; `edit` changes the rest."""
    from nmt.modelfile.file import export_model
    from nmt.modelfile.tensors import write_model_file

    payload = export_model(model_file, out.with_name("plain.nmt"))
    card = payload["card"]
    card["languages"] = {"src": "de" + HOSTILE, "tgt": "en" + HOSTILE}
    card["data_files"] = {"train": "train" + HOSTILE, HOSTILE: "dev"}
    card["dev"]["signature"] = HOSTILE
    edit(payload)
    write_model_file(payload, out)
    return out


def test_info_and_export_escape_a_hostile_card(model_file, tmp_path):
    model = hostile_model(model_file, tmp_path / "hostile.nmt")
    result = run_cli("info", str(model))
    assert result.returncode == 0, result.stderr
    assert_clean(result)
    assert "source de\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\nforged line\\r\\x7f, target en" in result.stdout
    result = run_cli("info", "--json", str(model))
    assert result.returncode == 0, result.stderr
    assert_clean(result)
    assert json.loads(result.stdout)["languages"]["src"] == "de" + HOSTILE       # the same data, escaped as JSON
    result = run_cli("export", str(model), "-o", str(tmp_path / "copy.nmt"))
    assert result.returncode == 0, result.stderr
    assert_clean(result)
    assert "sacreBLEU \\x1b]0;pwned" in result.stderr


def test_error_lines_escape_what_they_quote(model_file, tmp_path):
    model = hostile_model(model_file, tmp_path / "version.nmt",
                          lambda payload: payload.update(nmt_version="9" + HOSTILE, format=3))
    result = run_cli("info", str(model))
    assert result.returncode == 2 and "written by nmt 9\\x1b]0;pwned\\x07" in result.stderr, result.stderr
    assert_clean(result)
    model = hostile_model(model_file, tmp_path / "config.nmt",
                          lambda payload: payload["config"]["decoding"].update(beam_size=HOSTILE))
    result = run_cli("translate", "-m", str(model))
    assert result.returncode == 2 and "`decoding.beam_size` must be int, got '\\x1b]0;pwned" in result.stderr
    assert_clean(result)
    name = tmp_path / f"in{HOSTILE}.de"
    for args in (["info", str(name)], ["translate", "-m", str(model_file), "-i", str(name)],
                 ["evaluate", "--hyp", str(name), "--ref", str(name)]):
        result = run_cli(*args)
        assert result.returncode == 2 and "in\\x1b]0;pwned" in result.stderr, result.stderr
        assert_clean(result)


@pytest.mark.parametrize("text, shown", [("a\x1b[2Jb", "a\\x1b[2Jb"), ("tab\there", "tab\\there"),
                                         ("c1\x9bx", "c1\\x9bx"), ("Fußball ▁", "Fußball ▁")])
def test_printable(text, shown):
    from nmt.cli.common import error_line, printable

    assert printable(text) == shown
    assert error_line(f"x\n{text}") == f"error: x {printable(' '.join(text.split()))}"


def test_training_and_preprocessing_logs_escape_the_text_of_their_files(capsys):
    """The dev examples training prints and the file names preprocessing logs come from the user's files."""
    from nmt.data.preprocess import log
    from nmt.train.validation import example_lines

    shown = example_lines(HOSTILE, "a dog", HOSTILE)
    assert not RAW.search(shown) and shown.count("\n") == 2 and "\\x1b]0;pwned" in shown
    log(f"reading {HOSTILE}.de")
    assert not RAW.search(capsys.readouterr().err.rstrip("\n"))
