"""Two machines as two torchrun launchers on loopback: one process each, gloo, static rendezvous."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .conftest import free_port

WORKER = Path(__file__).with_name("ddp_worker.py")


def test_two_nodes_train_to_identical_parameters_and_only_global_rank0_writes(prepared, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    nodes = []
    for node in (0, 1):
        # Each "machine" has its own disk: the same relative layout under node0/ and node1/.
        run = tmp_path / f"node{node}" / "run"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
               str(WORKER), str(prepared), str(run), str(tmp_path)]
        nodes.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.kill()
        raise AssertionError("the two nodes did not finish in 300 s:\n" + "\n---\n".join(
            node.communicate()[0][-3000:] for node in nodes)) from None
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]

    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    run0, run1 = tmp_path / "node0" / "run", tmp_path / "node1" / "run"
    assert not run1.exists()                    # node 1 (global rank 1) wrote nothing
    events = [json.loads(line) for line in (run0 / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "validation"] == [3, 6]
    saved = torch.load(run0 / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], rank0[k]) for k in rank0)
