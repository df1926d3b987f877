import json
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def test_two_gloo_ranks_end_with_identical_parameters(prepared, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           str(WORKER), str(prepared), str(run), str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                                                 **_env()})
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    # Only rank 0 writes: one metrics log with one line per event, checkpoints once.
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "validation"] == [3, 6]
    assert (run / "last.pt").is_file() and (run / "best.pt").is_file()
    saved = torch.load(run / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], rank0[k]) for k in rank0)


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
