"""The rule every search follows, eager (nmt.decode.search) or captured (nmt.decode.graphs).

Hypotheses rank by log p(y) / lp(y), lp = ((5 + |y|) / 6)^α (GNMT, |y| counting EOS), plus the coverage penalty
cp = β Σ_j log min(Σ_i α_ij, 1). A sentence stops once its n_best-th finished score is at least what its best alive
beam could still reach, s / lp(max_len) (log p only falls, lp only grows). `early_stop` (OpenNMT-py: stop when the
top beam ends) decodes ~14% fewer rows but can miss a longer hypothesis that α > 0 ranks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.config import EXTRA_OUTPUT_PIECES
from nmt.data.special import BOS, EOS, PAD
from nmt.decode.settings import SearchSettings

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]          # output ids, EOS excluded
    score: float               # log p(y) / lp(y) (+ coverage penalty) in beam search; log p(y) otherwise
    attention: Tensor | None   # (len(tokens) + 1, src_len) weights, the EOS step included; None unless asked
    log_prob: float = 0.0      # log p(y), EOS included


@dataclass
class Sampler:
    """Draws from p(y)^(1/temperature), cut to the `top_k` most probable pieces and the smallest set holding
    `top_p` of the probability. One generator per run: same seed and batches, same samples."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def __call__(self, logp: Tensor) -> Tensor:
        """logp: (rows, vocab), -inf where forbidden -> sampled tokens (rows,)."""
        logits = logp / self.temperature if self.temperature != 1.0 else logp.clone()
        if 0 < self.top_k < logits.size(1):
            kth = logits.topk(self.top_k, dim=1).values[:, -1:]                # (rows, 1)
            logits.masked_fill_(logits < kth, NEG_INF)
        if self.top_p < 1.0:
            ordered, order = logits.sort(dim=1, descending=True)                 # (rows, vocab)
            probs = ordered.softmax(-1)
            outside = probs.cumsum(-1) - probs >= self.top_p                     # the most probable always stays
            logits.scatter_(1, order, ordered.masked_fill(outside, NEG_INF))
        return torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)


def length_penalty(length: Any, alpha: float) -> Any:
    """GNMT length penalty ((5 + |y|) / 6)^α, of a float or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, ratio: float, min_len: int = 0, cap: int | None = None) -> Tensor:
    """Per sentence: ratio * source length + EXTRA_OUTPUT_PIECES tokens, EOS included (src_lengths count EOS),
    at least min_len + 1, at most `cap`: the cap wins."""
    real = (src_lengths - 1).clamp(min=0).float()
    limits = (ratio * real + EXTRA_OUTPUT_PIECES).long().clamp(min=min_len + 1)
    return limits.clamp(max=cap) if cap is not None else limits


def output_limits(s: SearchSettings, src_lengths: Tensor, device: torch.device, prefix: Tensor | None = None
                  ) -> Tensor:
    """(batch,) output lengths, EOS included; raised so that every sentence can finish after its prefix."""
    limits = max_output_lengths(src_lengths, s.max_len_ratio, s.min_len, s.max_len).to(device)
    return limits if prefix is None else torch.maximum(limits, (prefix != PAD).sum(1).to(device) + 1)


@dataclass
class Bans:
    """The constants of `step_logp`, made once per search (in a graph, once per chunk)."""

    banned: Tensor      # (2,) PAD and BOS, never produced
    not_eos: Tensor     # (vocab,) True but at EOS

    @classmethod
    def make(cls, vocab: int, device: torch.device) -> Bans:
        banned = torch.full((2,), PAD, device=device)
        banned[1:].fill_(BOS)           # a kernel: `banned[1] = BOS` copies a host scalar, which a capture refuses
        return cls(banned, torch.arange(vocab, device=device) != EOS)


def step_logp(logits: Tensor, bans: Bans, eos_banned: Tensor | None, at_limit: Tensor, masked: bool) -> Tensor:
    """log p (rows, vocab) in float32, also under autocast: never PAD or BOS; no EOS where `eos_banned` (before
    min_len tokens); only EOS on a row's last allowed step, which wins over min_len. eos_banned, at_limit: (rows,)
    bool; `masked`: mask every row (static shapes) rather than index the few at their limit."""
    logp = logits.log_softmax(-1, dtype=torch.float32)
    logp.index_fill_(1, bans.banned, NEG_INF)
    if eos_banned is not None:
        logp[:, EOS].masked_fill_(eos_banned, NEG_INF)
    if masked:
        logp.masked_fill_(at_limit.unsqueeze(1) & bans.not_eos, NEG_INF)
    else:
        logp[at_limit] = logp[at_limit].masked_fill(bans.not_eos, NEG_INF)
    return logp


@dataclass
class BeamStep:
    """What one step of beam search decides for each sentence."""

    scores: Tensor      # (sentences, 2k) log p of the best candidates, best first
    tokens: Tensor      # (sentences, 2k) their tokens
    rows: Tensor        # (sentences, 2k) the alive rows they extend
    ends: Tensor        # (sentences, 2k) their token is EOS
    finished: Tensor    # (sentences, k) normalised scores of those that finish (EOS within the top k), else -inf
    alive: Tensor       # (sentences, k) log p of the best k that do not end: they continue
    pick: Tensor        # (sentences, k) their columns among the 2k

    def top_ended(self) -> Tensor:
        """(sentences,) the best candidate is an EOS (early_stop's test)."""
        return self.ends[:, 0] & (self.scores[:, 0] > NEG_INF)


def beam_step(logp: Tensor, alive: Tensor, base: Tensor, k: int, penalty: Tensor | float, fill: Any,
              bonus: Tensor | None = None, out_rows: Tensor | None = None,
              out_finished: Tensor | None = None) -> BeamStep:
    """An EOS candidate among a sentence's best k finishes a hypothesis; the best k others continue.
    logp: (sentences*width, vocab), made candidates in place; alive: (sentences*width,) log p so far; base:
    (sentences, 1) first rows; penalty: lp(t + 1); fill: -inf (a tensor in a graph); bonus: coverage penalty per
    alive row; out_*: a graph's records."""
    vocab = logp.size(1)
    candidates = logp.add_(alive.unsqueeze(1)).view(base.size(0), -1)   # (sentences, width*vocab)
    scores, ids = candidates.topk(min(2 * k, candidates.size(1)), dim=1)  # (sentences, 2k), best first
    if scores.size(1) < 2 * k:                                           # a tiny vocabulary: -inf pads
        missing = 2 * k - scores.size(1)
        scores = torch.cat([scores, scores.new_full((scores.size(0), missing), NEG_INF)], dim=1)
        ids = torch.cat([ids, ids.new_zeros(ids.size(0), missing)], dim=1)
    beams, tokens = ids // vocab, ids % vocab
    ends = tokens == EOS
    rows = torch.add(base, beams, out=out_rows) if out_rows is not None else base + beams
    norm = scores[:, :k] / penalty                                       # -inf stays -inf: a dead beam never ends
    if bonus is not None:
        norm = norm + bonus[rows[:, :k]]
    finished = (torch.where(ends[:, :k], norm, fill, out=out_finished) if out_finished is not None
                else torch.where(ends[:, :k], norm, fill))
    best, pick = scores.masked_fill(ends, NEG_INF).topk(k, dim=1)
    return BeamStep(scores, tokens, rows, ends, finished, best, pick)


def sentence_done(last_kept: Tensor, best_alive: Tensor, lp_limit: Tensor, top_ended: Tensor | None) -> Tensor:
    """(sentences,) the stop test (none alive: done); with early_stop (top_ended given), also once a best
    candidate ended."""
    done = last_kept >= best_alive / lp_limit
    return done if top_ended is None else done | (top_ended & (last_kept > NEG_INF))


def coverage_penalty(coverage: Tensor, src_mask: Tensor, beta: float) -> Tensor:
    """GNMT cp = β Σ_j log min(Σ_i α_ij, 1) over real source positions. coverage, src_mask: (rows, src_len)."""
    covered = coverage.clamp(min=1e-10, max=1.0).log().masked_fill(~src_mask, 0.0)
    return beta * covered.sum(1)                                        # (rows,)


def collect(tokens: Tensor, lengths: Tensor, scores: Tensor, attention: Tensor | None,
            src_lengths: Tensor) -> list[Hypothesis]:
    """Tensors -> one Hypothesis per row (EOS stripped from tokens, kept in the attention)."""
    rows = zip(tokens.tolist(), lengths.tolist(), scores.tolist(), strict=True)
    return [Hypothesis(row[: n - 1] if n > 0 and row[n - 1] == EOS else row[:n], score,
                       attention[i, :n, : int(src_lengths[i])].cpu() if attention is not None else None, score)
            for i, (row, n, score) in enumerate(rows)]


def collect_beams(tokens: Tensor, lengths: Tensor, scores: Tensor, log_probs: Tensor | None, alpha: float,
                  attention: Tensor | None, src_lengths: Tensor, n_best: int) -> list[list[Hypothesis]]:
    """(batch, k, ...) tensors -> each sentence's first n_best hypotheses, the empty slots (-inf) left out;
    log p, unless given (coverage), is the score times lp(length)."""
    if log_probs is None:
        log_probs = scores * length_penalty(lengths.float(), alpha)
    tokens_l, lengths_l = tokens[:, :n_best].tolist(), lengths[:, :n_best].tolist()
    scores_l, log_probs_l = scores[:, :n_best].tolist(), log_probs[:, :n_best].tolist()
    return [[Hypothesis(tokens_l[i][j][: n - 1], scores_l[i][j],
                        attention[i, j, :n, : int(src_lengths[i])].cpu() if attention is not None else None,
                        log_probs_l[i][j])
             for j, n in enumerate(lengths_l[i]) if scores_l[i][j] != NEG_INF]
            for i in range(len(tokens_l))]
