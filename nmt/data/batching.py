"""Bucketed, token-budget batches of padded tensors: each epoch's rows are permuted from a seed, cut into pools,
each pool sorted by length and cut into batches of padded size (sentences x longest side) within `batch_tokens`,
then the batches shuffled: little padding, new batches every epoch. With DDP every rank computes the same cut and
takes every `world_size`-th batch, without communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt.data.corpus import IdFile
from nmt.data.rows import padded_ids
from nmt.data.special import BOS, EOS, PAD


@dataclass
class Batch:
    """A padded batch, rows sorted by source length (longest first) for packed RNNs."""

    src: Tensor          # (batch, src_len) int64; each row ends with EOS, then PAD
    src_lengths: Tensor  # (batch,) int64, on the CPU (pack_padded_sequence wants it there)
    tgt_in: Tensor       # (batch, tgt_len) int64: BOS y_1 .. y_n, then PAD
    tgt_out: Tensor      # (batch, tgt_len) int64: y_1 .. y_n EOS, then PAD
    indices: Tensor      # (batch,) positions of the rows in the split

    @property
    def src_mask(self) -> Tensor:
        return self.src != PAD                                   # (batch, src_len) True at real tokens

    @property
    def n_tgt_tokens(self) -> int:
        return int((self.tgt_out != PAD).sum())

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_lengths.sum())                       # EOS included, as in `src`

    @property
    def cells(self) -> tuple[int, int]:
        return self.src.numel(), self.tgt_out.numel()

    def to(self, device: torch.device) -> Batch:
        if device.type == "cpu":
            return self
        move = lambda t: t.pin_memory().to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.src), self.src_lengths, move(self.tgt_in), move(self.tgt_out), self.indices)


def bucket_size(n: int, step: int) -> int:
    """n rounded up to `step`, beyond 8 steps to 8, 10, 12, 14, 16, 20, ... steps: at most ~25% waste, and
    the number of shapes grows with the log of the largest."""
    units = math.ceil(n / step)
    if units <= 8:
        return units * step
    scale = 2 ** (units.bit_length() - 4)                       # units in [8*scale, 16*scale)
    return math.ceil(units / (2 * scale)) * 2 * scale * step


def pad_rows(ids: np.ndarray, offsets: np.ndarray, rows: np.ndarray, prefix: int | None, suffix: int | None) -> Tensor:
    return torch.from_numpy(padded_ids(ids, offsets, rows, prefix, suffix))


class ParallelIds:
    """Source and target id files of one split, collated into `Batch`es."""

    RELEASE_EVERY = 4    # collated batches between `IdFile.release` calls (~3 ms each at 10M pairs)

    def __init__(self, src: IdFile, tgt: IdFile) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"source has {len(src)} sentences but target has {len(tgt)}")
        self.src, self.tgt = src, tgt
        self.src_lengths = src.read_lengths(plus_one=True)   # with EOS
        self.tgt_lengths = tgt.read_lengths(plus_one=True)   # with BOS (tgt_in) or EOS (tgt_out)
        self._collated = 0

    def __len__(self) -> int:
        return len(self.src)

    def collate(self, rows: np.ndarray) -> Batch:
        rows = rows[np.argsort(-self.src_lengths[rows].astype(np.int64), kind="stable")]
        src = pad_rows(self.src.ids, self.src.offsets, rows, None, EOS)
        tgt_in = pad_rows(self.tgt.ids, self.tgt.offsets, rows, BOS, None)
        tgt_out = pad_rows(self.tgt.ids, self.tgt.offsets, rows, None, EOS)
        self._collated += 1
        if self._collated % self.RELEASE_EVERY == 0:     # keep the memory-mapped pages read so far bounded
            self.src.release()
            self.tgt.release()
        return Batch(src, torch.from_numpy(self.src_lengths[rows].astype(np.int64)), tgt_in, tgt_out,
                     torch.from_numpy(rows.astype(np.int64)))


def batch_bounds(lengths: np.ndarray, pool_starts: np.ndarray, pool_ends: np.ndarray, batch_tokens: int,
                 batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`nmt.data.rows.cut_by_budget` over all pools [start, end) of length-sorted `lengths` at once (a vectorised
    binary search per batch); returns (starts, ends) in position order."""
    live = pool_starts < pool_ends
    start, end = pool_starts[live].astype(np.int64), pool_ends[live].astype(np.int64)
    starts, ends = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    while len(start):
        if batch_tokens:
            lo, hi = start + 1, end.copy()                    # lo always fits: one sentence alone
            while (lo < hi).any():
                mid = (lo + hi + 1) // 2
                fits = (mid - start) * lengths[mid - 1] <= batch_tokens
                lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid - 1)
            stop = lo
        else:
            stop = np.minimum(start + batch_size, end)
        starts.append(start)
        ends.append(stop)
        more = stop < end
        start, end = stop[more], end[more]
    all_starts, all_ends = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(all_starts, kind="stable")
    return all_starts[order], all_ends[order]


class BucketBatchSampler:
    """`corpora`: (start, end, weight) row ranges an epoch takes `weight` times (a seeded subset for the fraction)."""

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int = 2000,
                 batch_size: int = 0, pool_batches: int = 100, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1,
                 corpora: Sequence[tuple[int, int, float]] | None = None) -> None:
        if not batch_tokens and not batch_size:
            raise ValueError("one of batch_tokens and batch_size must be positive")
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        longest = np.maximum(self.src_lengths, self.tgt_lengths)           # padded size counts the longer side
        self.scale = scale = int(longest.max(initial=0)) + 1
        if scale**3 >= 2**62:
            raise ValueError(f"sentences of {scale - 1} tokens are too long to sort; lower data.max_len")
        # (sentences,) one sort key: (longer side, target, source) length
        self.key = (longest.astype(np.int32 if scale**3 < 2**31 else np.int64) * scale + self.tgt_lengths) * scale
        self.key += self.src_lengths
        self.batch_tokens, self.batch_size = batch_tokens, batch_size
        per_batch = batch_tokens / max(float(longest.mean()), 1.0) if len(longest) and batch_tokens \
            else batch_size or 1
        self.pool_size = max(1, int(pool_batches * per_batch))
        self.seed, self.shuffle, self.rank, self.world_size = seed, shuffle, rank, world_size
        self.corpora = list(corpora) if corpora is not None else None

    def epoch_rows(self, rng: np.random.Generator) -> np.ndarray:
        n = len(self.src_lengths)
        index = np.int32 if n < 2**31 else np.int64                    # row numbers: half the memory
        if self.corpora is None or all(weight == 1 for _, _, weight in self.corpora):
            return np.arange(n, dtype=index)
        parts = []
        for start, end, weight in self.corpora:
            size = end - start
            whole, extra = divmod(round(weight * size), size) if size else (0, 0)
            parts.append(np.tile(np.arange(start, end, dtype=index), whole))
            if extra:
                parts.append((start + np.sort(rng.permutation(size)[:extra])).astype(index))
        return np.concatenate(parts) if parts else np.zeros(0, index)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches for `epoch`, as arrays of sentence positions."""
        rng = np.random.default_rng([self.seed, epoch])
        rows = self.epoch_rows(rng)
        pool_size = self.pool_size if self.shuffle else max(len(rows), 1)      # unshuffled: one pool
        if self.shuffle:
            rng.shuffle(rows)                                            # in place: no second array
        key = self.key[rows]
        for start in range(0, len(rows), pool_size):                  # a loop over pools, not sentences
            pool = slice(start, start + pool_size)
            by_length = np.argsort(key[pool], kind="stable")
            rows[pool], key[pool] = rows[pool][by_length], key[pool][by_length]
        pool_starts = np.arange(0, len(rows), pool_size)
        pool_ends = np.minimum(pool_starts + pool_size, len(rows))
        longest = np.floor_divide(key, self.scale**2, out=key)          # the longer side, sorted within pools
        starts, ends = batch_bounds(longest, pool_starts, pool_ends, self.batch_tokens, self.batch_size)
        picked = rng.permutation(len(starts)) if self.shuffle else np.arange(len(starts))
        if self.world_size > 1:   # every rank must run the same number of steps
            usable = len(picked) // self.world_size * self.world_size
            picked = picked[self.rank : usable : self.world_size]
        return [rows[starts[i] : ends[i]] for i in picked.tolist()]

