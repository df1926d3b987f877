"""`training.tensorboard: true`: the run's scalars and attention images, read back from the event files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nmt.config import load_config
from nmt.train.trainer import Trainer

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def config_for(prepared, run_dir, **training):
    overrides = [f"training.run_dir={run_dir}", "training.tensorboard=true"]
    return load_config(prepared, overrides + [f"training.{k}={v}" for k, v in training.items()])


def read_events(run_dir):
    events = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    return events


def test_training_writes_the_scalars_of_metrics_jsonl_and_an_attention_image_per_validation(prepared, tmp_path):
    run = tmp_path / "run"
    settings = dict(max_updates=4, log_every=2, validate_every=2, val_max_sentences=5)
    Trainer(config_for(prepared, run, **settings)).train()
    events = read_events(run)
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/ppl", "train/lr", "train/tgt_tokens_per_s",
            "dev/loss", "dev/ppl", "dev/bleu", "dev/chrf"} <= scalars
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in logged if e["event"] == "train"]
    dev = [e for e in logged if e["event"] == "validation"]
    assert [s.step for s in events.Scalars("train/loss")] == [e["step"] for e in train] == [2, 4]
    assert [s.value for s in events.Scalars("train/loss")] == pytest.approx([e["loss"] for e in train], rel=1e-6)
    assert [s.value for s in events.Scalars("dev/chrf")] == pytest.approx([e["chrf"] for e in dev], rel=1e-6)
    assert [s.step for s in events.Scalars("dev/bleu")] == [2, 4]
    pytest.importorskip("matplotlib")
    assert [image.step for image in events.Images("dev/attention")] == [2, 4]
    assert all(image.encoded_image_string.startswith(b"\x89PNG") for image in events.Images("dev/attention"))


def test_a_resumed_run_continues_the_events_and_overwrite_removes_them(prepared, tmp_path):
    run = tmp_path / "run"
    settings = dict(log_every=2, validate_every=2, val_max_sentences=5)
    Trainer(config_for(prepared, run, max_updates=4, **settings)).train()
    Trainer(config_for(prepared, run, max_updates=6, **settings), resume=True).train()
    assert [s.step for s in read_events(run).Scalars("train/loss")] == [2, 4, 6]
    Trainer(config_for(prepared, run, max_updates=2, **settings), overwrite=True).train()   # nmt's folder
    assert [s.step for s in read_events(run).Scalars("train/loss")] == [2]


def test_without_the_package_the_option_is_an_error_before_the_run_folder_is_touched(prepared, tmp_path):
    run = tmp_path / "run"
    code = ("import sys; sys.modules['tensorboard'] = None; from nmt.cli.main import main; "
            f"sys.argv = ['nmt', 'train', '--config', {str(prepared)!r}, '--set', 'training.run_dir={run}', "
            "'--set', 'training.tensorboard=true']; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("error: `training.tensorboard: true` needs the tensorboard "
                                                       "package: pip install 'nmt[tensorboard]'")
    assert not run.exists()
