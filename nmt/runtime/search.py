"""Greedy and beam search in numpy with the rule of nmt.decode.rule, step for step and to the tie: ties go to
the lower index (as torch.max and the candidates' order). Sentences are rows, all beams rows of one array
(active*width, ...): one per sentence at the first step, `k` after; a sentence whose n-best list is final
leaves the arrays. The only Python loop is over output positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nmt.config import EXTRA_OUTPUT_PIECES
from nmt.data.special import BOS, EOS, PAD
from nmt.decode.settings import SearchSettings

NEG_INF = np.float32(-np.inf)
# Greedy search drops ended rows at this fraction of the batch, as PyTorch's: same rows, same float32 products.
DROP_ENDED_FRACTION = 0.25


class Rows(Protocol):
    def take(self, index: np.ndarray) -> Any: ...


class StepModel(Protocol):
    def encode(self, src: np.ndarray, src_lengths: np.ndarray, greedy: bool) -> tuple[Rows, Rows]:
        """src: (batch, src_len) -> memory, initial state (one row per sentence)."""

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
    """ratio * source length (EOS not counted) + EXTRA_OUTPUT_PIECES, at least min_len + 1, at most `cap`: the
    cap wins."""
    real = np.maximum(src_lengths - 1, 0).astype(np.float32)
    limits = np.maximum((np.float32(ratio) * real + np.float32(EXTRA_OUTPUT_PIECES)).astype(np.int64), min_len + 1)
    return np.minimum(limits, cap) if cap is not None else limits


def _output_limits(src_lengths: np.ndarray, prefix: np.ndarray | None, s: SearchSettings) -> np.ndarray:
    """max_output_lengths, raised to fit a forced prefix (batch, len) and its EOS."""
    limits = max_output_lengths(src_lengths, s.max_len_ratio, s.min_len, s.max_len)
    return limits if prefix is None else np.maximum(limits, (prefix != PAD).sum(1) + 1)


def _constrain(logp: np.ndarray, t: int, min_len: int, at_limit: np.ndarray, history: np.ndarray, no_repeat: int,
              forced: np.ndarray | None) -> None:
    """In place: never PAD or BOS; no EOS before `min_len`; only EOS on a row's last allowed step; no token that
    repeats an n-gram of `history` (rows, t); only a row's forced token (rows,), PAD where none."""
    logp[:, PAD] = NEG_INF
    logp[:, BOS] = NEG_INF
    if t < min_len:
        logp[~at_limit, EOS] = NEG_INF
    if at_limit.any():
        eos = logp[at_limit, EOS]
        logp[at_limit] = NEG_INF
        logp[at_limit, EOS] = eos
    if 1 <= no_repeat <= t:
        ngrams = np.lib.stride_tricks.sliding_window_view(history, no_repeat, axis=1)   # (rows, t-n+1, n)
        matches = (ngrams[:, :, :-1] == history[:, None, t - no_repeat + 1:]).all(-1)    # (rows, t-n+1)
        np.put_along_axis(logp, np.where(matches, ngrams[:, :, -1], PAD), NEG_INF, axis=1)
    if forced is not None:
        rows = np.flatnonzero(forced != PAD)
        kept = logp[rows, forced[rows]]
        logp[rows] = NEG_INF
        logp[rows, forced[rows]] = kept


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


def greedy_search(model: StepModel, src: np.ndarray, src_lengths: np.ndarray, s: SearchSettings = SearchSettings(),
                  prefix: np.ndarray | None = None) -> list[Hypothesis]:
    """The most probable token at each step for every sentence at once; prefix: (batch, len) PAD-padded."""
    memory, state = model.encode(src, src_lengths, greedy=True)
    batch = src.shape[0]
    limits = _output_limits(src_lengths, prefix, s)
    steps = int(limits.max())
    tokens = np.full((batch, steps), PAD, np.int64)
    scores = np.zeros(batch, np.float32)
    lengths = np.zeros(batch, np.int64)
    attention = np.zeros((batch, steps, src.shape[1]), np.float32) if s.return_attention else None
    rows = np.arange(batch)                                     # the sentence of each row decoded
    going = np.ones(batch, bool)
    ended = 0
    prev = np.full(batch, BOS, np.int64)
    for t in range(steps):
        logp, state, weights = model.step(prev, state, memory)   # (rows, vocab)
        forced = prefix[rows, t] if prefix is not None and t < prefix.shape[1] else None
        _constrain(logp, t, s.min_len, limits[rows] - 1 <= t, tokens[rows, :t], s.no_repeat_ngram, forced)
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
    return _hypotheses(model.vocab_ids(tokens), lengths, scores, scores, attention, src_lengths)


def _hypotheses(tokens: np.ndarray, lengths: np.ndarray, scores: np.ndarray, log_probs: np.ndarray,
               attention: np.ndarray | None, src_lengths: np.ndarray) -> list[Hypothesis]:
    """One per row of tokens (rows, steps), its EOS dropped, attention cut to its output and source lengths."""
    out = []
    for i, (row, n, score, log_prob) in enumerate(zip(tokens.tolist(), lengths.tolist(), scores.tolist(),
                                                      log_probs.tolist(), strict=True)):
        kept: Any = attention[i, :n, : int(src_lengths[i])] if attention is not None else None
        out.append(Hypothesis(row[: n - 1] if n and row[n - 1] == EOS else row[:n], score, kept, log_prob))
    return out


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
        np.zeros((batch, k), np.int64), np.zeros((batch, k, steps, src_len), np.float32) if attention else None)


def _merged(pool: np.ndarray, new: Any, from_new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """The pool's entries `old` (active, k), or `new` where from_new; new's steps (axis 2) padded with 0 (PAD)."""
    if np.ndim(new) > 2:
        new = np.pad(new, [(0, 0), (0, 0), (0, pool.shape[2] - new.shape[2])] + [(0, 0)] * (pool.ndim - 3))
    index = (..., *(None,) * (pool.ndim - 2))
    return np.where(from_new[index], new, np.take_along_axis(pool, old[index], 1))


def _finish(b: _Beams, t: int, top_scores: np.ndarray, top_token: np.ndarray, source_rows: np.ndarray,
            alpha: float, cov_scores: np.ndarray | None) -> np.ndarray:
    """EOS candidates ranked within the top k join the finished pool, which keeps its best k.
    returns the pool's scores (active, k), best first."""
    k, a = b.k, b.active
    finishing = (top_token == EOS) & (top_scores > NEG_INF) & (np.arange(top_scores.shape[1]) < k)
    norm = top_scores / np.float32(length_penalty(float(t + 1), alpha))
    if cov_scores is not None:
        norm = norm + cov_scores[source_rows]
    pool = np.concatenate([b.fin_scores[a], np.where(finishing, norm, NEG_INF)], 1)          # (active, 3k)
    fin_best, pick = top_candidates(pool, k)                                                  # (active, k)
    from_new, old, new = pick >= k, np.minimum(pick, k - 1), np.maximum(pick - k, 0)
    rows = np.take_along_axis(source_rows, new, 1)                                           # (active, k)
    if cov_scores is not None:
        b.fin_logp[a] = _merged(b.fin_logp[a], np.take_along_axis(top_scores, new, 1), from_new, old)
    ended = np.concatenate([b.alive_tokens, np.full((len(b.alive_tokens), 1), EOS, np.int64)], 1)  # (rows, t+1)
    b.fin_tokens[a] = _merged(b.fin_tokens[a], ended[rows], from_new, old)
    b.fin_lengths[a] = _merged(b.fin_lengths[a], t + 1, from_new, old)
    if b.fin_attn is not None and b.alive_attn is not None:
        b.fin_attn[a] = _merged(b.fin_attn[a], b.alive_attn[rows], from_new, old)
    b.fin_scores[a] = fin_best
    return fin_best


def _continue(b: _Beams, top_scores: np.ndarray, top_token: np.ndarray,
              source_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best k candidates that do not end become the alive beams; returns their scores (active, k)
    and the rows of the step's output they continue (active*k,)."""
    alive_best, pick = top_candidates(np.where(top_token == EOS, NEG_INF, top_scores), b.k)
    rows = np.take_along_axis(source_rows, pick, 1).reshape(-1)
    b.prev = np.take_along_axis(top_token, pick, 1).reshape(-1)
    b.alive_scores = alive_best.reshape(-1)
    b.alive_tokens = np.concatenate([b.alive_tokens[rows], b.prev[:, None]], 1)
    if b.alive_attn is not None:
        b.alive_attn = b.alive_attn[rows]
    if b.alive_cov is not None:
        b.alive_cov = b.alive_cov[rows]
    return alive_best, rows


def beam_search(model: StepModel, src: np.ndarray, src_lengths: np.ndarray, s: SearchSettings = SearchSettings(),
                prefix: np.ndarray | None = None) -> list[list[Hypothesis]]:
    """The `n_best` hypotheses of every sentence, best first; when a sentence stops is nmt.decode.rule's rule."""
    batch, k, alpha = src.shape[0], s.beam_size, s.alpha
    n_best = min(s.n_best, k)
    memory, state = model.encode(src, src_lengths, greedy=False)       # one memory row per sentence
    limits = _output_limits(src_lengths, prefix, s)
    steps = int(limits.max())
    b = _start(batch, k, steps, src.shape[1], s.return_attention, bool(s.coverage))
    src_mask = src != PAD
    top_ended = np.zeros(batch, bool)                                  # early_stop: a step's best candidate ended
    for t in range(steps):
        n_active = len(b.active)
        width = len(b.prev) // n_active
        logp, state, weights = model.step(b.prev, state, memory)        # (active*width, vocab)
        vocab = logp.shape[1]
        forced = np.repeat(prefix[b.active, t], width) if prefix is not None and t < prefix.shape[1] else None
        _constrain(logp, t, s.min_len, np.repeat(limits[b.active] - 1 <= t, width), b.alive_tokens,
                   s.no_repeat_ngram, forced)
        logp += b.alive_scores[:, None]
        top_scores, top_ids = top_candidates(logp.reshape(n_active, width * vocab), 2 * k)   # (active, 2k)
        top_token = top_ids % vocab
        source_rows = (np.arange(n_active) * width)[:, None] + top_ids // vocab
        cov_scores = None
        if b.alive_cov is not None:
            b.alive_cov = b.alive_cov + weights                        # this step's α included
            cov_scores = coverage_penalty(b.alive_cov, np.repeat(src_mask[b.active], width, 0), s.coverage)
        if b.alive_attn is not None:                                   # this step's α, once for both pools
            b.alive_attn = np.concatenate([b.alive_attn, weights[:, None]], 1)      # (active*width, t+1, src_len)
        fin_best = _finish(b, t, top_scores, top_token, source_rows, alpha, cov_scores)
        alive_best, rows = _continue(b, top_scores, top_token, source_rows)
        state = state.take(rows)
        best_alive, last_kept = alive_best[:, 0], fin_best[:, n_best - 1]
        bound = best_alive / length_penalty(limits[b.active].astype(np.float32), alpha)
        done = ((last_kept > NEG_INF) & (last_kept >= bound)) | (best_alive == NEG_INF)
        if s.early_stop:
            top_ended[b.active] |= (top_token[:, 0] == EOS) & (top_scores[:, 0] > NEG_INF)
            done |= top_ended[b.active] & (last_kept > NEG_INF)
        if done.any():
            keep = np.flatnonzero(~done)
            if keep.size == 0:
                break
            state, memory = state.take(b.keep(keep)), memory.take(keep)
    if not s.coverage:                                                   # log p = score * lp(|y|)
        b.fin_logp = b.fin_scores * length_penalty(b.fin_lengths.astype(np.float32), alpha)

    def first(x: np.ndarray) -> np.ndarray:                            # (batch, k, ...) -> (batch*n_best, ...)
        return x[:, :n_best].reshape(batch * n_best, *x.shape[2:])

    found = _hypotheses(model.vocab_ids(first(b.fin_tokens)), first(b.fin_lengths), first(b.fin_scores),
                       first(b.fin_logp), None if b.fin_attn is None else first(b.fin_attn),
                       np.repeat(src_lengths, n_best))
    return [[h for h in found[i * n_best: (i + 1) * n_best] if h.score > NEG_INF] for i in range(batch)]
