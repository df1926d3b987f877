"""Beam search in numpy with the rule of nmt.decode.search.beam_search, step for step.

All sentences' beams are rows of one array (active*width, ...): one beam per sentence at the first step,
`k` after. At each step the best 2k candidates of a sentence are ranked; EOS candidates among the best k
finish (normalised by the GNMT length penalty, plus the coverage penalty), the best k that do not end
continue. A sentence stops once it has `n_best` finished and no alive beam can still beat the n_best-th
(an alive log p can only fall and lp only grow up to the row's limit), when nothing is left to extend, or,
with `early_stop`, once a step's best candidate ended. Stopped sentences leave the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.data.special import BOS, EOS, PAD
from nmt.runtime.search import (
    NEG_INF,
    Hypothesis,
    StepModel,
    _block_repeated_ngrams,
    _constrain,
    _force_tokens,
    _prefix_lengths,
    coverage_penalty,
    length_penalty,
    max_output_lengths,
    top_candidates,
)


@dataclass
class _Beams:
    """The search's bookkeeping: alive rows (active*width, ...) and the finished pool (batch, k, ...)."""

    k: int
    active: np.ndarray            # (active,) sentences still searching
    prev: np.ndarray              # (active*width,) last tokens
    alive_scores: np.ndarray      # (active*width,) log p so far, float32
    alive_tokens: np.ndarray      # (active*width, t)
    alive_attn: np.ndarray | None  # (active*width, t, src_len)
    alive_cov: np.ndarray | None  # (active*width, src_len) Σ_i α_ij
    fin_scores: np.ndarray        # (batch, k) normalised scores, -inf where empty
    fin_logp: np.ndarray          # (batch, k) log p (kept with coverage only)
    fin_tokens: np.ndarray        # (batch, k, steps)
    fin_lengths: np.ndarray       # (batch, k) EOS included
    fin_attn: np.ndarray | None   # (batch, k, steps, src_len)
    top_ended: np.ndarray         # (batch,) early_stop: a step's best candidate ended

    def keep(self, keep: np.ndarray) -> np.ndarray:
        """Only the sentences `keep` (positions in `active`) stay; returns their alive rows."""
        rows = (keep[:, None] * self.k + np.arange(self.k)).reshape(-1)
        self.active, self.prev = self.active[keep], self.prev[rows]
        self.alive_scores, self.alive_tokens = self.alive_scores[rows], self.alive_tokens[rows]
        if self.alive_attn is not None:
            self.alive_attn = self.alive_attn[rows]
        if self.alive_cov is not None:
            self.alive_cov = self.alive_cov[rows]
        return rows


def _start(batch: int, k: int, steps: int, src_len: int, attention: bool, coverage: bool) -> _Beams:
    return _Beams(
        k, np.arange(batch), np.full(batch, BOS, np.int64), np.zeros(batch, np.float32),
        np.zeros((batch, 0), np.int64), np.zeros((batch, 0, src_len), np.float32) if attention else None,
        np.zeros((batch, src_len), np.float32) if coverage else None, np.full((batch, k), NEG_INF, np.float32),
        np.full((batch, k), NEG_INF, np.float32), np.full((batch, k, steps), PAD, np.int64),
        np.zeros((batch, k), np.int64), np.zeros((batch, k, steps, src_len), np.float32) if attention else None,
        np.zeros(batch, bool))


def _finish(b: _Beams, t: int, top_scores: np.ndarray, top_token: np.ndarray, source_rows: np.ndarray,
            weights: np.ndarray, alpha: float, cov_scores: np.ndarray | None) -> np.ndarray:
    """EOS candidates ranked within the top k join the finished pool, which keeps its best k.
    returns the pool's scores (active, k), best first."""
    k, n_active, steps = b.k, len(b.active), b.fin_tokens.shape[2]
    finishing = (top_token == EOS) & (top_scores > NEG_INF) & (np.arange(top_scores.shape[1]) < k)
    norm = top_scores / np.float32(length_penalty(float(t + 1), alpha))
    if cov_scores is not None:
        norm = norm + cov_scores[source_rows]
    pool = np.concatenate([b.fin_scores[b.active], np.where(finishing, norm, NEG_INF)], 1)   # (active, 3k)
    fin_best, pick = top_candidates(pool, k)                                                  # (active, k)
    from_new, old = pick >= k, np.minimum(pick, k - 1)
    new_idx = np.maximum(pick - k, 0)
    rows = np.take_along_axis(source_rows, new_idx, 1)                                       # (active, k)
    if cov_scores is not None:
        old_logp = np.take_along_axis(b.fin_logp[b.active], old, 1)
        b.fin_logp[b.active] = np.where(from_new, np.take_along_axis(top_scores, new_idx, 1), old_logp)
    candidates = np.concatenate([b.alive_tokens, np.full((len(b.alive_tokens), 1), EOS, np.int64)], 1)
    fresh = np.full((n_active, k, steps), PAD, np.int64)
    fresh[:, :, : t + 1] = candidates[rows]
    old_tokens = np.take_along_axis(b.fin_tokens[b.active], old[:, :, None], 1)
    b.fin_tokens[b.active] = np.where(from_new[:, :, None], fresh, old_tokens)
    old_len = np.take_along_axis(b.fin_lengths[b.active], old, 1)
    b.fin_lengths[b.active] = np.where(from_new, t + 1, old_len)
    if b.fin_attn is not None and b.alive_attn is not None:
        cand_attn = np.concatenate([b.alive_attn, weights[:, None]], 1)                     # (rows, t+1, src_len)
        fresh_attn = np.zeros((n_active, k, *b.fin_attn.shape[2:]), np.float32)
        fresh_attn[:, :, : t + 1] = cand_attn[rows]
        old_attn = np.take_along_axis(b.fin_attn[b.active], old[:, :, None, None], 1)
        b.fin_attn[b.active] = np.where(from_new[:, :, None, None], fresh_attn, old_attn)
    b.fin_scores[b.active] = fin_best
    return fin_best


def _continue(b: _Beams, top_scores: np.ndarray, top_token: np.ndarray, source_rows: np.ndarray,
              weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best k candidates that do not end become the alive beams; returns their scores (active, k)
    and the rows of the step's output they continue (active*k,)."""
    alive_best, pick = top_candidates(np.where(top_token == EOS, NEG_INF, top_scores), b.k)
    rows = np.take_along_axis(source_rows, pick, 1).reshape(-1)
    b.prev = np.take_along_axis(top_token, pick, 1).reshape(-1)
    b.alive_scores = alive_best.reshape(-1)
    b.alive_tokens = np.concatenate([b.alive_tokens[rows], b.prev[:, None]], 1)
    if b.alive_attn is not None:
        b.alive_attn = np.concatenate([b.alive_attn, weights[:, None]], 1)[rows]
    if b.alive_cov is not None:
        b.alive_cov = b.alive_cov[rows]
    return alive_best, rows


def beam_search(model: StepModel, src: np.ndarray, src_lengths: np.ndarray, beam_size: int = 5, alpha: float = 1.0,
                max_len_ratio: float = 2.0, min_len: int = 1, n_best: int = 1, no_repeat_ngram: int = 0,
                return_attention: bool = False, max_len: int | None = None, prefix: np.ndarray | None = None,
                coverage: float = 0.0, early_stop: bool = False) -> list[list[Hypothesis]]:
    """The `n_best` hypotheses of every sentence, best first (see the module's docstring)."""
    batch, k = src.shape[0], beam_size
    n_best = min(n_best, k)
    memory, state = model.encode(src, src_lengths, greedy=False)       # one memory row per sentence
    limits = _prefix_lengths(prefix, max_output_lengths(src_lengths, max_len_ratio, min_len, max_len))
    steps = int(limits.max())
    b = _start(batch, k, steps, src.shape[1], return_attention, bool(coverage))
    src_mask = src != PAD
    for t in range(steps):
        n_active = len(b.active)
        width = len(b.prev) // n_active
        logp, state, weights = model.step(b.prev, state, memory)        # (active*width, vocab)
        vocab = logp.shape[1]
        _constrain(logp, t, min_len, np.repeat(limits[b.active] - 1 <= t, width))
        if no_repeat_ngram:
            _block_repeated_ngrams(logp, b.alive_tokens, no_repeat_ngram)
        if prefix is not None and t < prefix.shape[1]:
            _force_tokens(logp, np.repeat(prefix[b.active, t], width))
        logp += b.alive_scores[:, None]
        top_scores, top_ids = top_candidates(logp.reshape(n_active, width * vocab), 2 * k)   # (active, 2k)
        top_token = top_ids % vocab
        source_rows = (np.arange(n_active) * width)[:, None] + top_ids // vocab
        cov_scores = None
        if b.alive_cov is not None:
            b.alive_cov = b.alive_cov + weights                        # this step's α included
            cov_scores = coverage_penalty(b.alive_cov, np.repeat(src_mask[b.active], width, 0), coverage)
        fin_best = _finish(b, t, top_scores, top_token, source_rows, weights, alpha, cov_scores)
        alive_best, rows = _continue(b, top_scores, top_token, source_rows, weights)
        state = state.take(rows)
        done = _done(b, fin_best, alive_best, limits, alpha, n_best, top_scores, top_token, early_stop)
        if done.any():
            keep = np.flatnonzero(~done)
            if keep.size == 0:
                break
            state, memory = state.take(b.keep(keep)), memory.take(keep)
    if not coverage:                                                     # log p = score * lp(|y|)
        b.fin_logp = b.fin_scores * length_penalty(b.fin_lengths.astype(np.float32), alpha)
    return _collect(model.vocab_ids(b.fin_tokens), b, src_lengths, n_best)


def _done(b: _Beams, fin_best: np.ndarray, alive_best: np.ndarray, limits: np.ndarray, alpha: float, n_best: int,
          top_scores: np.ndarray, top_token: np.ndarray, early_stop: bool) -> np.ndarray:
    """(active,) sentences whose n-best list is final (see the module's docstring)."""
    best_alive = alive_best[:, 0]
    bound = best_alive / length_penalty(limits[b.active].astype(np.float32), alpha)
    last_kept = fin_best[:, n_best - 1]
    done = ((last_kept > NEG_INF) & (last_kept >= bound)) | (best_alive == NEG_INF)
    if early_stop:
        b.top_ended[b.active] |= (top_token[:, 0] == EOS) & (top_scores[:, 0] > NEG_INF)
        done |= b.top_ended[b.active] & (last_kept > NEG_INF)
    return done


def _collect(tokens: np.ndarray, b: _Beams, src_lengths: np.ndarray, n_best: int) -> list[list[Hypothesis]]:
    tokens_l, lengths_l = tokens[:, :n_best].tolist(), b.fin_lengths[:, :n_best].tolist()
    scores_l, logp_l = b.fin_scores[:, :n_best].tolist(), b.fin_logp[:, :n_best].tolist()
    out = []
    for i in range(len(tokens_l)):
        hyps = []
        for j in range(n_best):
            n = lengths_l[i][j]
            if scores_l[i][j] == float("-inf"):
                continue
            weights: Any = b.fin_attn[i, j, :n, : int(src_lengths[i])] if b.fin_attn is not None else None
            hyps.append(Hypothesis(tokens_l[i][j][: n - 1], scores_l[i][j], weights, logp_l[i][j]))
        out.append(hyps)
    return out
