"""Progress on stderr: a tqdm bar on a terminal, plain periodic lines (no carriage returns) in a log file."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from nmt.progress import LogLines, progress_bar

from .conftest import make_config


def test_a_stream_that_is_no_terminal_gets_plain_lines():
    stream = io.StringIO()
    bar = progress_bar("train", "upd", total=10, initial=2, stream=stream, every_seconds=0)
    assert isinstance(bar, LogLines)
    bar.update(1)
    bar.set_postfix(loss="3.215", lr="1.00e-03")
    bar.update(2)
    bar.close()
    lines = stream.getvalue().split("\n")
    assert "\r" not in stream.getvalue() and lines[-1] == ""
    assert lines[0].startswith("train: 3/10 upd, ") and "elapsed" in lines[0]
    assert lines[1].startswith("train: 5/10 upd, ") and lines[1].endswith(", loss=3.215 lr=1.00e-03")
    assert len(lines) == 3                    # close() adds nothing: the last line showed the last count


def test_lines_come_every_so_often_and_once_at_the_end_unless_the_bar_does_not_stay():
    stream = io.StringIO()
    with progress_bar("encoding", "pairs", stream=stream, every_seconds=3600) as bar:
        for _ in range(1000):
            bar.update(50)
    assert stream.getvalue().count("\n") == 1 and stream.getvalue().startswith("encoding: 50000 pairs, ")
    quiet = io.StringIO()
    with progress_bar("sampling", "pairs", stream=quiet, every_seconds=3600, leave=False) as bar:
        bar.update(5)
    with progress_bar("train", "upd", stream=quiet, every_seconds=0, disable=True) as bar:
        bar.update(5)
    assert quiet.getvalue() == ""


def test_preprocess_and_train_with_stderr_in_a_file_write_no_carriage_returns(tmp_path, corpus_dir):
    config = make_config(tmp_path, corpus_dir, training={"max_updates": 3, "validate_every": 3, "log_every": 1,
                                                         "val_max_sentences": 5})
    log = tmp_path / "log.txt"
    with log.open("w") as stderr:
        for command in ("preprocess", "train"):
            result = subprocess.run([sys.executable, "-m", "nmt", command, "--config", str(config)],
                                    stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=600)
            assert result.returncode == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "\r" not in text
    lines = text.split("\n")
    assert any(line.startswith("train: 3/3 upd, ") for line in lines), text[-2000:]
    assert any(line.startswith("validation @ 3: ") for line in lines)
    assert Path(tmp_path / "run" / "last.pt").is_file()
