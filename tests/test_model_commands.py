"""`nmt average` and `nmt info`: what they refuse and what they report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import load_config

from .conftest import nmt_server


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return nmt_server().run(*args, text=True)


def test_averaging_one_checkpoint_is_refused_and_writes_nothing(trained_run, tmp_path):
    best = str(trained_run / "best.pt")
    for args in ([best], [best, best], [best, str(trained_run / ".." / trained_run.name / "best.pt")]):
        out = tmp_path / "avg.pt"
        result = run_cli("average", *args, "-o", str(out))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith("error: averaging needs at least two different checkpoints, got ")
        assert not out.exists() and list(tmp_path.iterdir()) == []
    hard = tmp_path / "hard.pt"
    hard.hardlink_to(trained_run / "best.pt")
    for args in ([best, best, str(trained_run / "last.pt")], [best, str(trained_run / "last.pt"), str(hard)]):
        result = run_cli("average", *args, "-o", str(tmp_path / "avg.pt"))
        assert result.returncode == 2 and "is the same checkpoint as" in result.stderr, result.stderr
    hard.unlink()
    two = [str(trained_run / "best.pt"), str(trained_run / "last.pt")]
    result = run_cli("average", *two, "-o", str(tmp_path / "avg.pt"))
    assert result.returncode == 0 and "averaged 2 checkpoints" in result.stderr, result.stderr


RACE = """
import sys
import nmt.fs.folders as f
_commit = f.PendingFile.commit
def commit(self, *args):
    self.path.write_bytes(b"theirs")            # another process finished first
    _commit(self, *args)
f.PendingFile.commit = commit
from nmt.cli.main import main
sys.argv = ["nmt", *sys.argv[1:]]
main()
"""


def test_average_and_export_never_replace_a_file_another_process_wrote_meanwhile(trained_run, tmp_path):
    out = tmp_path / "new.pt"
    best, last = str(trained_run / "best.pt"), str(trained_run / "last.pt")
    for args in (["average", best, last, "-o", str(out)], ["export", best, "-o", str(out)],
                 ["export", best, "-o", str(out), "--force"]):        # --force replaces only the file it checked
        out.unlink(missing_ok=True)
        result = subprocess.run([sys.executable, "-c", RACE, *args], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1], timeout=300)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and "was created by another process meanwhile" in lines[-1], result.stderr
        assert out.read_bytes() == b"theirs" and [p.name for p in tmp_path.iterdir()] == ["new.pt"]


def test_averaging_a_model_file_says_it_is_no_checkpoint(trained_run, model_file, tmp_path):
    result = run_cli("average", str(model_file), str(trained_run / "best.pt"), "-o", str(tmp_path / "avg.pt"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"{model_file} is a model file (nmt export or a Hugging Face folder's), not a training" in lines[0]


@pytest.fixture(scope="module")
def luong_run(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Luong (general) model with input feeding after one update: enough for its card."""
    from nmt.train.trainer import Trainer

    run = tmp_path_factory.mktemp("luong") / "run"
    config = load_config(prepared, [f"training.run_dir={run}", "model.attention=luong_general",
                                    "model.attention_dim=512",   # smoke's back to the default: general has none
                                    "training.max_updates=1", "training.validate_every=1",
                                    "training.val_max_sentences=5", "training.log_examples=0"])
    Trainer(config).train()
    return run


def test_info_reports_input_feeding_only_where_the_decoder_has_it(trained_run, luong_run):
    bahdanau = json.loads(run_cli("info", "--json", str(trained_run / "best.pt")).stdout)["architecture"]
    assert bahdanau["attention"] == "bahdanau" and bahdanau["input_feeding"] is None   # it feeds c_i, not h~
    luong = json.loads(run_cli("info", "--json", str(luong_run / "best.pt")).stdout)["architecture"]
    assert luong["attention"] == "luong_general" and luong["input_feeding"] is True
