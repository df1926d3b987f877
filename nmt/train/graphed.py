"""A training update on a GPU as one captured CUDA graph per padded batch shape: about 1,750 kernel launches
(6 ms of compute in 59 ms on an H200, bench/profile_gpu_step.py) become one. Static shapes, no host sync:
batches padded to buckets, the encoder unpacked (GRU only), PAD masked in the loss, lr and token count on the
GPU. The first batch of a shape runs eagerly (a real update and the warm-up), then is captured; dropout's
graph-safe offsets make a replay draw what the eager run would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from nmt.data.batching import Batch, bucket_size
from nmt.data.special import BOS, EOS, PAD
from nmt.device import capturing
from nmt.model.seq2seq import Seq2Seq
from nmt.train.loss import output_cross_entropy

MAX_GRAPHS = 64            # batch shapes kept (a Multi30k epoch has 27); least recently used dropped


def applies(model: Seq2Seq, device: torch.device, world_size: int, amp_dtype: torch.dtype | None,
            rnn_type: str, accumulate: int) -> bool:
    return (device.type == "cuda" and world_size == 1 and amp_dtype != torch.float16 and rnn_type == "gru"
            and accumulate == 1 and isinstance(model, Seq2Seq))


def capturable_optimizer(optimizer_class: type, parameters: Iterable[nn.Parameter], lr: float, device: torch.device,
                         **kwargs: Any) -> torch.optim.Optimizer:
    """A fused Adam/AdamW whose step can be captured: its step counts on the GPU, its lr a GPU tensor."""
    return optimizer_class(list(parameters), lr=torch.tensor(lr, device=device), fused=True, capturable=True,
                           **kwargs)


@dataclass
class _Static:
    """A padded batch at fixed addresses: what a captured update reads, and the loss it writes."""

    src: Tensor          # (rows, src_len)
    src_lengths: Tensor  # (rows,) on the GPU
    tgt_in: Tensor       # (rows, tgt_len)
    tgt_out: Tensor      # (rows, tgt_len)
    tokens: Tensor       # () target tokens, float
    loss: Tensor         # () the summed loss of the last update

    def load(self, batch: Batch) -> None:
        """Copy `batch` in, padded with PAD; a padded row's source is EOS alone, its target input BOS."""
        rows = batch.src.size(0)
        lengths = torch.ones(self.src_lengths.shape, dtype=torch.long)
        lengths[:rows] = batch.src_lengths
        for target, value, first in ((self.src, batch.src, EOS), (self.tgt_in, batch.tgt_in, BOS),
                                     (self.tgt_out, batch.tgt_out, PAD)):
            padded = torch.full(target.shape, PAD, dtype=torch.long)
            padded[:rows, : value.size(1)] = value
            padded[rows:, 0] = first
            target.copy_(padded.pin_memory(), non_blocking=True)
        self.src_lengths.copy_(lengths.pin_memory(), non_blocking=True)
        self.tokens.fill_(batch.n_tgt_tokens)


class GraphedUpdates:
    """Training updates replayed from CUDA graphs, one per padded batch shape, sharing one memory pool."""

    def __init__(self, model: Seq2Seq, optimizer: torch.optim.Optimizer, amp_dtype: torch.dtype | None,
                 clip_grad_norm: float, label_smoothing: float) -> None:
        self.model, self.optimizer, self.amp_dtype = model, optimizer, amp_dtype
        self.clip_grad_norm, self.label_smoothing = clip_grad_norm, label_smoothing
        self.device = next(model.parameters()).device
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream(device=self.device)
        self.graphs: OrderedDict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, _Static]] = OrderedDict()

    @staticmethod
    def shape(batch: Batch) -> tuple[int, int, int]:
        """The padded (rows, source length, target length) of `batch`."""
        rows, src_len = batch.src.shape
        return bucket_size(rows, 8), bucket_size(src_len, 4), bucket_size(batch.tgt_in.size(1), 4)

    def update(self, batch: Batch) -> Tensor:
        """One optimiser update on `batch`; returns its summed loss, on the GPU."""
        with torch.cuda.device(self.device):                 # cuda:N's streams, whatever device is current
            key = self.shape(batch)
            if key in self.graphs:
                self.graphs.move_to_end(key)
                graph, static = self.graphs[key]
                static.load(batch)
                graph.replay()
                return static.loss
            while len(self.graphs) >= MAX_GRAPHS:          # least recently used first: memory stays bounded
                self.graphs.popitem(last=False)
            rows, src_len, tgt_len = key
            new = lambda *shape: torch.zeros(shape, dtype=torch.long, device=self.device)  # noqa: E731
            static = _Static(new(rows, src_len), new(rows), new(rows, tgt_len), new(rows, tgt_len),
                             torch.ones((), device=self.device), torch.zeros((), device=self.device))
            static.load(batch)
            side = torch.cuda.Stream()                     # warm-up on a side stream, as torch.cuda.graphs asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._run(static)                          # a real update
            torch.cuda.current_stream().wait_stream(side)
            loss = static.loss.clone()
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.pool, self.capture_stream):
                self._run(static)                          # recorded, not run
            self.optimizer.zero_grad(set_to_none=True)     # the gradients live in the graph's pool
            self.graphs[key] = (graph, static)
            return loss

    def _run(self, s: _Static) -> None:
        """Forward, loss, backward, clipping and the optimiser step; static shapes, no host sync."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # autocast's cast cache does not survive a capture: off here, for the eager run too (same kernels)
        with torch.autocast("cuda", dtype=self.amp_dtype or torch.bfloat16, enabled=self.amp_dtype is not None,
                            cache_enabled=False):
            features, _ = self.model(s.src, s.src_lengths, s.tgt_in, 1.0, features_only=True)
            output: nn.Linear = self.model.decoder.output
            loss = output_cross_entropy(features, output.weight, output.bias, s.tgt_out, self.label_smoothing,
                                        all_rows=True)
        (loss / s.tokens).backward()
        if self.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        s.loss.copy_(loss.detach())

