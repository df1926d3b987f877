"""Id sequences as padded rows, and batches cut by a token budget: numpy only, so that the onnxruntime
translator (nmt.runtime), which imports no torch, cuts and pads as the PyTorch paths do."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from nmt.data.special import PAD


def flatten(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Id arrays -> (offsets (n+1,), one flat id array), the layout `padded_ids` reads."""
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids in sequences], out=offsets[1:])
    flat = np.concatenate(sequences) if sequences else np.zeros(0, dtype=np.int64)
    return offsets, flat


def padded_ids(ids: np.ndarray, offsets: np.ndarray, rows: np.ndarray, prefix: int | None,
               suffix: int | None) -> np.ndarray:
    """Sentences `rows` of a flat id array as a PAD-padded (len(rows), max_len) int64 array, with `prefix`/`suffix`."""
    starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]
    extra = (prefix is not None) + (suffix is not None)
    width = int(lengths.max(initial=0)) + extra
    cols = np.arange(width)[None, :] - (prefix is not None)                       # (batch, width)
    inside = (cols >= 0) & (cols < lengths[:, None])
    gathered = ids[np.clip(starts[:, None] + cols, 0, max(len(ids) - 1, 0))] if len(ids) else np.zeros_like(cols)
    out = np.where(inside, gathered, PAD).astype(np.int64)
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(rows)), lengths + (prefix is not None)] = suffix
    return out


def padded_prefixes(prefix_ids: list[np.ndarray], rows: np.ndarray) -> np.ndarray | None:
    """The target prefixes of `rows` as a PAD-padded (len(rows), longest) array; None when all are empty."""
    offsets, flat = flatten([prefix_ids[row] for row in rows.tolist()])
    if flat.size == 0:
        return None
    return padded_ids(flat, offsets, np.arange(len(rows)), None, None)


def cut_by_budget(order: np.ndarray, lengths: np.ndarray, batch_tokens: int, batch_size: int) -> list[np.ndarray]:
    """Cut `order` into consecutive batches of padded size (n * max length) <= batch_tokens, or n <= batch_size
    when batch_tokens is 0; a single over-long sentence forms its own batch."""
    batches, start, longest = [], 0, 0
    for pos, length in enumerate(lengths[order].tolist()):
        n = pos - start + 1
        grown = max(longest, length)
        full = n * grown > batch_tokens if batch_tokens else n > batch_size
        if full and n > 1:
            batches.append(order[start:pos])
            start, grown = pos, length
        longest = grown
    if start < len(order):
        batches.append(order[start:])
    return batches


def longest_first(offsets: np.ndarray, keep: np.ndarray, budget: int) -> list[np.ndarray]:
    """The sequences `keep` (bool per sequence) of a flat layout, longest first (ties in input order), cut
    into batches of at most `budget` padded ids, EOS counted: a translation's batches."""
    lengths = np.diff(offsets) + 1                                       # with EOS
    chosen = np.flatnonzero(keep)
    order = chosen[np.argsort(-lengths[chosen], kind="stable")]
    return cut_by_budget(order, lengths, max(1, budget), 0)


def truncated(encoded: list[np.ndarray], limit: int,
              warning: Callable[[int, int], str]) -> tuple[list[np.ndarray], np.ndarray]:
    """Each id sequence cut to `limit` pieces, and which were cut (bool, one per sequence); each cut one
    gets a line on stderr, `warning(index, pieces)`."""
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    cut = lengths > limit
    kept = list(encoded)
    for i in np.flatnonzero(cut).tolist():             # the over-long lines only
        print(warning(i, int(lengths[i])), file=sys.stderr, flush=True)
        kept[i] = encoded[i][:limit]
    return kept, cut
