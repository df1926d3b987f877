import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .conftest import free_port

WORKER = Path(__file__).with_name("ddp_worker.py")


def train_two_ranks(prepared: Path, run: Path, out: Path, *overrides: str) -> list[dict]:
    """Train on two gloo ranks (ddp_worker.py) on a free port; returns each rank's final parameters."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(WORKER), str(prepared), str(run), str(out), *overrides]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    return ranks


def test_two_gloo_ranks_end_with_identical_parameters(prepared, tmp_path):
    run = tmp_path / "run"
    rank0, _ = train_two_ranks(prepared, run, tmp_path)
    # Only rank 0 writes: one metrics log with one line per event, checkpoints once.
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "validation"] == [3, 6]
    assert (run / "last.pt").is_file() and (run / "best.pt").is_file()
    saved = torch.load(run / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], rank0[k]) for k in rank0)


def test_the_plateau_schedule_of_rank_0_sets_every_rank_s_learning_rate(prepared, tmp_path):
    from nmt.config import load_config

    # Only rank 0 validates; the worker makes no validation improve, so the lr halves at update 3.
    train_two_ranks(prepared, tmp_path / "run", tmp_path, "training.lr_schedule=plateau",
                    "training.plateau_patience=0", "training.plateau_factor=0.5")
    lrs = [float((tmp_path / f"rank{r}.lr").read_text()) for r in (0, 1)]
    assert lrs[0] == lrs[1] == load_config(prepared).training.lr * 0.5, lrs


def test_a_resumed_two_rank_run_with_dropout_repeats_the_uninterrupted_one(prepared, tmp_path):
    """Each rank draws its own dropout masks: last.pt holds every rank's RNG state, and each rank resumes its
    own, so rank 1's gradients, and with them rank 0's losses and parameters, match a run never stopped."""
    from nmt.config import load_config
    from nmt.train.checkpoint import load_checkpoint

    assert load_config(prepared).model.dropout > 0
    logged = ("training.log_every=1", "training.save_every_minutes=0")
    straight, _ = train_two_ranks(prepared, tmp_path / "a", tmp_path, *logged)
    (tmp_path / "b").mkdir()
    train_two_ranks(prepared, tmp_path / "split", tmp_path / "b", *logged, "training.max_updates=4")
    assert len(load_checkpoint(tmp_path / "split" / "last.pt")["rng"]["ranks"]) == 2
    resumed, _ = train_two_ranks(prepared, tmp_path / "split", tmp_path / "b", *logged, "--resume")

    def losses(run: Path) -> dict[int, float]:
        events = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return {e["step"]: e["loss"] for e in events if e["event"] == "train"}
    assert list(losses(tmp_path / "split")) == [1, 2, 3, 4, 5, 6]
    assert losses(tmp_path / "split") == losses(tmp_path / "a")
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
