"""Greedy and beam search in numpy, with the rules of nmt.decode.search, over an exported step.

The rules are PyTorch's, to the tie: the same output limits, the same constraints (no PAD or BOS, no EOS
before `min_len`, only EOS on a row's last step, forced prefix tokens, blocked repeated n-grams), the GNMT
length and coverage penalties, the same finishing and stopping tests and the same n-best list. Ties go to
the lower index (torch.max and the candidates' order). Sentences are vectorised as rows; the only Python
loop is over output positions. The model is anything with `encode`, `step` and `vocab_ids` (nmt.runtime.session).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nmt.data.special import BOS, EOS, PAD

NEG_INF = np.float32(-np.inf)
# Greedy search drops ended rows once they are this fraction of the batch (as nmt.decode.search does:
# the step's products then see the same rows as PyTorch's, so float32 outputs stay equal).
DROP_ENDED_FRACTION = 0.25


class Rows(Protocol):
    def take(self, index: np.ndarray) -> Any: ...


class StepModel(Protocol):
    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Rows, Rows]:
        """src: (batch, src_len) -> memory (one row per sentence), initial state (one row per sentence)."""

    def step(self, prev: np.ndarray, state: Rows, memory: Rows) -> tuple[np.ndarray, Rows, np.ndarray]:
        """prev: (rows,) -> log p (rows, vocab) float32, new state, attention (rows, src_len)."""

    def vocab_ids(self, tokens: np.ndarray) -> np.ndarray: ...


@dataclass
class Hypothesis:
    tokens: list[int]               # output ids, EOS excluded
    score: float                    # log p(y) / lp(y) (+ coverage penalty) in beam search; log p(y) in greedy
    attention: np.ndarray | None    # (len(tokens) + 1, src_len), the EOS step included; None unless asked
    log_prob: float = 0.0           # log p(y), EOS included


def length_penalty(length: Any, alpha: float) -> Any:
    """GNMT ((5 + |y|) / 6)^α, in float32 for arrays as torch computes it."""
    return ((np.float32(5.0) + length) / np.float32(6.0)) ** np.float32(alpha) if isinstance(length, np.ndarray) \
        else ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: np.ndarray, ratio: float, min_len: int = 0, cap: int | None = None) -> np.ndarray:
    """ratio * source length (EOS not counted) + 10, at least min_len + 1, at most `cap`: the cap wins."""
    real = np.maximum(src_lengths - 1, 0).astype(np.float32)
    limits = np.maximum((np.float32(ratio) * real + np.float32(10)).astype(np.int64), min_len + 1)
    return np.minimum(limits, cap) if cap is not None else limits


def _prefix_lengths(prefix: np.ndarray | None, limits: np.ndarray) -> np.ndarray:
    return limits if prefix is None else np.maximum(limits, (prefix != PAD).sum(1) + 1)


def _constrain(logp: np.ndarray, t: int, min_len: int, at_limit: np.ndarray) -> None:
    """In place: never PAD or BOS; no EOS before `min_len`; only EOS on a row's last allowed step."""
    logp[:, PAD] = NEG_INF
    logp[:, BOS] = NEG_INF
    if t < min_len:
        logp[~at_limit, EOS] = NEG_INF
    if at_limit.any():
        eos = logp[at_limit, EOS]
        logp[at_limit] = NEG_INF
        logp[at_limit, EOS] = eos


def _force_tokens(logp: np.ndarray, forced: np.ndarray) -> None:
    """In place: a row with a forced token (not PAD) may produce only it, at its own log-probability."""
    rows = np.flatnonzero(forced != PAD)
    if rows.size:
        kept = logp[rows, forced[rows]]
        logp[rows] = NEG_INF
        logp[rows, forced[rows]] = kept


def _block_repeated_ngrams(logp: np.ndarray, history: np.ndarray, n: int) -> None:
    """In place: forbid tokens that would repeat an n-gram of `history` (rows, t)."""
    t = history.shape[1]
    if n < 1 or t < n:
        return
    if n == 1:
        np.put_along_axis(logp, history, NEG_INF, axis=1)
        return
    ngrams = np.lib.stride_tricks.sliding_window_view(history, n, axis=1)   # (rows, t-n+1, n)
    matches = (ngrams[:, :, :-1] == history[:, None, t - n + 1:]).all(-1)     # (rows, t-n+1)
    np.put_along_axis(logp, np.where(matches, ngrams[:, :, -1], PAD), NEG_INF, axis=1)


def coverage_penalty(coverage: np.ndarray, src_mask: np.ndarray, beta: float) -> np.ndarray:
    """GNMT cp = β Σ_j log min(Σ_i α_ij, 1) over real source positions; coverage, src_mask: (rows, src_len)."""
    covered = np.where(src_mask, np.log(np.clip(coverage, np.float32(1e-10), np.float32(1.0))), np.float32(0))
    return np.float32(beta) * covered.sum(1, dtype=np.float32)


def top_candidates(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The best `n` of each row of x (rows, m), best first, ties to the lower index; padded with -inf
    scores (id 0) where a row has fewer than n entries."""
    rows, m = x.shape
    take = min(n, m)
    if take < m:
        ids = np.argpartition(-x, take - 1, axis=1)[:, :take]               # (rows, take), ties in any order
        kth = np.take_along_axis(x, ids, 1).min(1, keepdims=True)           # (rows, 1) the take-th largest
        unsure = np.flatnonzero((x == kth).sum(1) > (np.take_along_axis(x, ids, 1) == kth).sum(1))
        if unsure.size:                           # ties left out at the boundary: admit the lowest indices
            sub, bound = x[unsure], kth[unsure]
            ties = sub == bound
            chosen = (sub > bound) | (ties & (np.cumsum(ties, axis=1) <= take - (sub > bound).sum(1, keepdims=True)))
            ids[unsure] = np.nonzero(chosen)[1].reshape(len(unsure), take)
    else:
        ids = np.broadcast_to(np.arange(m), (rows, m))
    scores = np.take_along_axis(x, ids, axis=1)
    order = np.lexsort((ids, -scores), axis=1)                               # best first, then lower index
    scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    if take < n:
        scores = np.concatenate([scores, np.full((rows, n - take), NEG_INF, np.float32)], 1)
        ids = np.concatenate([ids, np.zeros((rows, n - take), np.int64)], 1)
    return scores, ids


def greedy_search(model: StepModel, src: np.ndarray, src_lengths: np.ndarray, max_len_ratio: float = 2.0,
                  min_len: int = 1, return_attention: bool = False, max_len: int | None = None,
                  no_repeat_ngram: int = 0, prefix: np.ndarray | None = None) -> list[Hypothesis]:
    """The most probable token at each step for every sentence at once; prefix: (batch, len) PAD-padded."""
    memory, state = model.encode(src, src_lengths, greedy=True)
    batch = src.shape[0]
    limits = _prefix_lengths(prefix, max_output_lengths(src_lengths, max_len_ratio, min_len, max_len))
    steps = int(limits.max())
    tokens = np.full((batch, steps), PAD, np.int64)
    scores = np.zeros(batch, np.float32)
    lengths = np.zeros(batch, np.int64)
    attention = np.zeros((batch, steps, src.shape[1]), np.float32) if return_attention else None
    rows = np.arange(batch)                                     # the sentence of each row decoded
    going = np.ones(batch, bool)
    ended = 0
    prev = np.full(batch, BOS, np.int64)
    for t in range(steps):
        logp, state, weights = model.step(prev, state, memory)   # (rows, vocab)
        _constrain(logp, t, min_len, limits[rows] - 1 <= t)
        if no_repeat_ngram:
            _block_repeated_ngrams(logp, tokens[rows, :t], no_repeat_ngram)
        if prefix is not None and t < prefix.shape[1]:
            _force_tokens(logp, prefix[rows, t])
        prev = logp.argmax(-1)                                    # first maximum, as torch.max
        best = logp[np.arange(len(prev)), prev]
        recording = np.flatnonzero(going) if ended else slice(None)
        live = rows[recording]
        tokens[live, t] = prev[recording]
        scores[live] += best[recording]
        lengths[live] += 1
        if attention is not None:
            attention[live, t] = weights[recording]
        going &= prev != EOS
        ended = len(rows) - int(going.sum())
        if ended and ended >= DROP_ENDED_FRACTION * len(rows):
            keep = np.flatnonzero(going)
            if keep.size == 0:
                break
            rows, prev, going, ended = rows[keep], prev[keep], going[keep], 0
            state, memory = state.take(keep), memory.take(keep)
    out = []
    for i, (row, n, score) in enumerate(zip(model.vocab_ids(tokens).tolist(), lengths.tolist(), scores.tolist(),
                                            strict=True)):
        kept: Any = attention[i, :n, : int(src_lengths[i])] if attention is not None else None
        out.append(Hypothesis(row[: n - 1] if n and row[n - 1] == EOS else row[:n], score, kept, score))
    return out
