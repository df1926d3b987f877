"""Greedy, beam and sampling search over whole batches as tensors, eager, by the rule of nmt.decode.rule: all
sentences and beams are one (batch×beam, …) tensor, the only Python loop is over output positions, and sentences
whose search is over are dropped. With a shortlist they run on subset positions (a prefix too), return vocab ids.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.data.special import BOS, EOS, PAD
from nmt.decode.rule import (
    NEG_INF,
    Bans,
    BeamStep,
    Hypothesis,
    Sampler,
    beam_step,
    collect,
    collect_beams,
    coverage_penalty,
    length_penalty,
    max_output_lengths,
    output_limits,
    sentence_done,
    step_logp,
)
from nmt.decode.settings import SearchSettings
from nmt.decode.steps import Decoding
from nmt.model.seq2seq import Seq2Seq

__all__ = ["Hypothesis", "Sampler", "SearchModel", "SearchSettings", "beam_search", "coverage_penalty",
           "force_decode", "greedy_search", "length_penalty", "max_output_lengths", "search"]


class SearchModel(Protocol):
    """What the searches need of a model or an ensemble (nmt.decode.steps.Decoding, EnsembleDecoding)."""

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Any, Any]: ...

    # prev_tokens: (rows,) -> logits (rows, vocab), state, attention (rows, src_len)
    def step(self, prev_tokens: Tensor, state: Any, memory: Any) -> tuple[Tensor, Any, Tensor]: ...

    def vocab_ids(self, tokens: Tensor) -> Tensor: ...          # subset positions -> vocabulary ids

    # teacher-forced log p (batch, tgt_len) of each tgt_out token after the tgt_in tokens
    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor: ...


def search_model(model: SearchModel | nn.Module) -> SearchModel:
    """A `SearchModel` as it is; a plain Seq2Seq or Ensemble with an inference step for this call."""
    if isinstance(model, Seq2Seq):
        return Decoding(model)
    return model.decoding() if isinstance(model, nn.Module) else model  # type: ignore[operator]


def _block_repeated_ngrams(logp: Tensor, history: Tensor, n: int) -> None:
    """Forbid tokens that would repeat an n-gram already in `history` (rows, t). In place."""
    t = history.size(1)
    if n < 1 or t < n:                                                  # no complete n-gram yet
        return
    ngrams = history.unfold(1, n, 1)                                    # (rows, t-n+1, n)
    current = history[:, t - n + 1 :]                                   # (rows, n-1) the last n-1 tokens
    matches = (ngrams[:, :, :-1] == current.unsqueeze(1)).all(-1)      # (rows, t-n+1)
    banned = ngrams[:, :, -1].masked_fill(~matches, PAD)                # PAD is banned anyway
    logp.scatter_(1, banned, NEG_INF)


def _next_logp(logits: Tensor, t: int, s: SearchSettings, bans: Bans, at_limit: Tensor, history: Tensor | None,
               forced: Tensor | None) -> Tensor:
    """Eager log p of position t (rows, vocab): constrained, n-grams blocked, a prefix's token forced."""
    logp = step_logp(logits, bans, ~at_limit if t < s.min_len else None, at_limit, masked=False)
    if history is not None:
        _block_repeated_ngrams(logp, history, s.no_repeat_ngram)
    if forced is not None:
        column = forced.unsqueeze(1)                                    # (rows, 1)
        kept = logp.gather(1, column)
        logp.masked_fill_((forced != PAD).unsqueeze(1), NEG_INF)
        logp.scatter_(1, column, kept)
    return logp


# ------------------------------------------------------------------ greedy and sampling

# Greedy drops ended rows once they are this share of the batch: a drop copies every kept row's memory
# (1 thread, sent/s: every step 436, 0.25 493, 0.5 462).
DROP_ENDED_FRACTION = 0.25


@torch.no_grad()
def greedy_search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                  settings: SearchSettings = SearchSettings(), prefix: Tensor | None = None) -> list[Hypothesis]:
    """The most probable token at each step; with a sampler, a drawn one, n_best rows per sentence (rows
    i*n .. (i+1)*n-1). prefix: (batch, len) tokens to force, PAD-padded."""
    model, s = search_model(model), settings
    memory, state = model.encode(src, src_lengths, fold_context=False)   # one row per sentence
    if s.sampler is not None and s.n_best > 1:                         # one row per sample
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(s.n_best)
        memory, state, src = memory.index_select(rows), state.index_select(rows), src[rows]
        src_lengths = src_lengths[rows.to(src_lengths.device)]
        prefix = prefix[rows.to(prefix.device)] if prefix is not None else None
    batch, device = src.size(0), src.device
    limits = output_limits(s, src_lengths, device, prefix)
    steps = int(limits.max())
    tokens = src.new_full((batch, steps), PAD)                          # (batch, steps)
    scores = torch.zeros(batch, device=device)                          # log p, in fp32 under autocast too
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    attention = torch.zeros(batch, steps, src.size(1), device=device) if s.return_attention else None
    rows = torch.arange(batch, device=device)                           # the sentence of each row decoded
    going = torch.ones(batch, dtype=torch.bool, device=device)          # rows that have not ended
    ended = 0                                                           # rows decoded on although ended
    bans: Bans | None = None
    prev = src.new_full((batch,), BOS)
    for t in range(steps):
        logits, state, weights = model.step(prev, state, memory)
        bans = bans or Bans.make(logits.size(1), device)
        logp = _next_logp(logits, t, s, bans, limits[rows] - 1 <= t,
                          tokens[rows, :t] if s.no_repeat_ngram else None,
                          prefix[rows, t] if prefix is not None and t < prefix.size(1) else None)
        if s.sampler is None:
            best, prev = logp.max(-1)                                    # (rows,)
        else:                                    # ended rows draw nothing: their logp may be all -inf, and
            prev = torch.full_like(going, EOS, dtype=torch.long)        # the generator's stream stays the live rows'
            prev[going] = s.sampler(logp[going])
            best = logp.gather(1, prev.unsqueeze(1)).squeeze(1)
        recording = going.nonzero().squeeze(1) if ended else slice(None)   # ended rows record nothing
        live = rows[recording]
        tokens[live, t] = prev[recording]
        scores[live] += best[recording]
        lengths[live] += 1
        if attention is not None:
            attention[live, t] = weights[recording].float()
        going &= prev != EOS
        ended = rows.numel() - int(going.sum())
        if ended and ended >= DROP_ENDED_FRACTION * rows.numel():
            keep = going.nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            rows, prev, going, ended = rows[keep], prev[keep], going[keep], 0
            state, memory = state.index_select(keep), memory.index_select(keep)
    return collect(model.vocab_ids(tokens), lengths, scores, attention, src_lengths)


# ------------------------------------------------------------------ beam


@dataclass
class _Beams:
    """The alive beams of the active sentences, (active*width, ...): width 1 at the first step, then k."""

    prev: Tensor                # (rows,) the last token
    scores: Tensor              # (rows,) log p so far
    tokens: Tensor              # (rows, t)
    state: Any                  # per-row tensors with index_select
    attn: Tensor | None         # (rows, t, src_len), return_attention
    cov: Tensor | None          # (rows, src_len) Σ_i α_ij, coverage

    def select(self, rows: Tensor) -> _Beams:
        return _Beams(self.prev[rows], self.scores[rows], self.tokens[rows], self.state.index_select(rows),
                      self.attn[rows] if self.attn is not None else None,
                      self.cov[rows] if self.cov is not None else None)


@dataclass
class _Pool:
    """The best k finished hypotheses of every sentence (by original position), merged step by step."""

    scores: Tensor              # (batch, k) normalised, -inf in empty slots
    tokens: Tensor              # (batch, k, steps)
    lengths: Tensor             # (batch, k) EOS included
    logp: Tensor | None         # (batch, k) log p, coverage (else derived from the scores by collect_beams)
    attn: Tensor | None         # (batch, k, steps, src_len)

    def merge(self, active: Tensor, step: BeamStep, beams: _Beams, t: int) -> None:
        """The step's finishing hypotheses into the pool: the best k of old and new (old first among equals).
        beams.attn already holds this (EOS) step's weights."""
        k, steps = self.scores.size(1), self.tokens.size(2)
        new = torch.cat([step.finished, torch.full_like(step.finished, NEG_INF)], dim=1)     # (active, 2k)
        best, pick = torch.cat([self.scores[active], new], dim=1).topk(k, dim=1)          # (active, k)
        from_new, old = pick >= k, pick.clamp(max=k - 1)
        new_idx = (pick - k).clamp(min=0)
        new_rows = step.rows.gather(1, new_idx)                                 # (active, k) alive rows
        ended = torch.cat([beams.tokens, beams.tokens.new_full((beams.tokens.size(0), 1), EOS)], 1)   # (rows, t+1)
        updates = [(self.tokens, ended[new_rows]), (self.lengths, torch.full_like(new_rows, t + 1)),
                   (self.logp, step.scores.gather(1, new_idx)),
                   (self.attn, beams.attn[new_rows] if beams.attn is not None else None)]
        for kept, fresh in updates:     # (batch, k, ...) each; histories padded (PAD = 0, no attention) to `steps`
            if kept is None or fresh is None:
                continue
            shape = (*old.shape, *[1] * (kept.dim() - 2))
            old_kept = kept[active].gather(1, old.view(shape).expand(-1, -1, *kept.shape[2:]))
            if kept.dim() > 2:
                fresh = F.pad(fresh, (0, 0) * (kept.dim() - 3) + (0, steps - t - 1))
            kept[active] = torch.where(from_new.view(shape), fresh, old_kept)
        self.scores[active] = best


@torch.no_grad()
def beam_search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                settings: SearchSettings = SearchSettings(), prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """The n_best hypotheses of every sentence, best first (one beam, α = 0: greedy). prefix as greedy's."""
    model, s, k = search_model(model), settings, settings.beam_size
    batch, src_len, device = src.size(0), src.size(1), src.device
    memory, state = model.encode(src, src_lengths)        # one row per sentence; beams share the memory
    limits = output_limits(s, src_lengths, device, prefix)          # (batch,)
    steps = int(limits.max())
    beams = _Beams(src.new_full((batch,), BOS), torch.zeros(batch, device=device), src.new_full((batch, 0), PAD),
                   state, torch.zeros(batch, 0, src_len, device=device) if s.return_attention else None,
                   torch.zeros(batch, src_len, device=device) if s.coverage else None)
    pool = _Pool(torch.full((batch, k), NEG_INF, device=device), src.new_full((batch, k, steps), PAD),
                 torch.zeros(batch, k, dtype=torch.long, device=device),
                 torch.full((batch, k), NEG_INF, device=device) if s.coverage else None,
                 torch.zeros(batch, k, steps, src_len, device=device) if s.return_attention else None)
    active = torch.arange(batch, device=device)                               # sentences still searching
    top_ended = torch.zeros(batch, dtype=torch.bool, device=device)
    bans: Bans | None = None
    for t in range(steps):
        n_active = active.numel()
        width = beams.prev.size(0) // n_active                                # alive beams per sentence
        logits, beams.state, weights = model.step(beams.prev, beams.state, memory)
        bans = bans or Bans.make(logits.size(1), device)
        logp = _next_logp(logits, t, s, bans, (limits[active] - 1 <= t).repeat_interleave(width),
                          beams.tokens if s.no_repeat_ngram else None,
                          prefix[active, t].repeat_interleave(width)
                          if prefix is not None and t < prefix.size(1) else None)
        bonus = None
        if beams.cov is not None:
            beams.cov = beams.cov + weights.float()                             # this step's α included
            row_mask = (src[active] != PAD).repeat_interleave(width, dim=0)
            bonus = coverage_penalty(beams.cov, row_mask, s.coverage)
        base = (torch.arange(n_active, device=device) * width).unsqueeze(1)    # (active, 1)
        step = beam_step(logp, beams.scores, base, k, length_penalty(float(t + 1), s.alpha), NEG_INF, bonus)
        if beams.attn is not None:
            beams.attn = torch.cat([beams.attn, weights.float().unsqueeze(1)], 1)      # (rows, t+1, src_len)
        pool.merge(active, step, beams, t)
        rows = step.rows.gather(1, step.pick).view(-1)                             # (active*k,) they continue
        prev = step.tokens.gather(1, step.pick).view(-1)
        beams = replace(beams.select(rows), prev=prev, scores=step.alive.view(-1))
        beams.tokens = torch.cat([beams.tokens, prev.unsqueeze(1)], dim=1)
        if s.early_stop:
            top_ended[active] |= step.top_ended()
        done = sentence_done(pool.scores[active, min(s.n_best, k) - 1], step.alive[:, 0],
                             length_penalty(limits[active].float(), s.alpha),
                             top_ended[active] if s.early_stop else None)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            active, memory = active[keep], memory.index_select(keep)
            beams = beams.select((keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1))
    return collect_beams(model.vocab_ids(pool.tokens), pool.lengths, pool.scores, pool.logp, s.alpha, pool.attn,
                         src_lengths, min(s.n_best, k))


class Captured(Protocol):                       # nmt.decode.graphs.SearchGraphs
    def runs(self, model: SearchModel, settings: SearchSettings, prefix: Tensor | None) -> bool: ...

    def search(self, src: Tensor, src_lengths: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]: ...


def search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor, settings: SearchSettings,
           prefix: Tensor | None = None, graphs: Captured | None = None) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses, best first (samples as drawn): the one place that picks the captured
    graphs (given, and able to run these settings) or the eager searches."""
    if graphs is not None and graphs.runs(search_model(model), settings, prefix):
        return graphs.search(src, src_lengths, settings)
    if not settings.greedy:
        return beam_search(model, src, src_lengths, settings, prefix)
    hyps = greedy_search(model, src, src_lengths, settings, prefix)
    n = settings.n_best if settings.sampler is not None else 1
    return [hyps[i : i + n] for i in range(0, len(hyps), n)]


@torch.no_grad()
def force_decode(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                 tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Teacher-forced log p(y | x), as the searches report it. tgt: (batch, tgt_len) ids without BOS/EOS,
    PAD-padded -> log p with EOS (batch,), lengths with EOS (batch,)."""
    batch = tgt.size(0)
    lengths = (tgt != PAD).sum(1)                                        # (batch,) without EOS
    tgt_in = torch.cat([tgt.new_full((batch, 1), BOS), tgt], dim=1)      # (batch, tgt_len+1) BOS y
    tgt_out = torch.cat([tgt, tgt.new_full((batch, 1), PAD)], dim=1)     # (batch, tgt_len+1) y EOS
    tgt_out.scatter_(1, lengths.unsqueeze(1), EOS)
    logp = search_model(model).forced(src, src_lengths, tgt_in, tgt_out)   # (batch, tgt_len+1)
    return logp.masked_fill(tgt_out == PAD, 0.0).sum(1), lengths + 1
