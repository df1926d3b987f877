"""Several training processes (torchrun: RANK, WORLD_SIZE, LOCAL_RANK) under DistributedDataParallel.

Each rank trains on its shard of each epoch's batches; only rank 0 validates and writes the run folder, and
broadcasts the decisions that depend on it (stop now, the plateau schedule's lr), so all ranks step alike.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


class Ranks:
    """This process's place among the training processes; a plain `nmt train` is rank 0 of 1."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._started = False           # this process joined the process group (and so leaves it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, torch.device]:
        """Join the process group (NCCL, or gloo on CPUs); returns `model` in DDP and this rank's device."""
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            self._started = True
        if device.type == "cuda":
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
            model.to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, device

    def from_rank0(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (only rank 0 validates, and ranks' clocks differ)."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank (a collective: all ranks call it alike)."""
        if self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def close(self) -> None:
        if self._started and dist.is_initialized():
            dist.destroy_process_group()
        self._started = False
