"""Greedy, beam and sampling search over whole batches as tensors, and the one beam rule that the captured
search (nmt.decode.graphed) shares: the two differ only in how they keep their books.

Beam search keeps all sentences and their beams in one tensor of shape (batch×beam, …): the only Python loop
is over output positions. Encoder output and attention keys are computed once per sentence and shared by its
beams. Here, sentences whose search is over are dropped from the active tensors.

The rule (`constrain`, `beam_step`, `sentence_done`): an EOS candidate finishes a hypothesis when it ranks
among its sentence's best `beam` candidates; the best `beam` others continue. A hypothesis ranks by log p(y) /
lp(y), lp(y) = ((5 + |y|) / 6)^α (GNMT; |y| counts EOS), plus the coverage penalty cp = β Σ_j log min(Σ_i α_ij,
1). A sentence stops once its n_best-th finished hypothesis scores at least what its best alive beam could
still reach: log p ≤ 0 only falls and lp only grows, so that is s / lp(max_len). The n-best list is then
final. Stopping when the top beam ends (OpenNMT-py's rule, `early_stop`) decodes about 14% fewer rows but can
miss a longer hypothesis that α > 0 would rank first.

Every hypothesis carries its log p, so `force_decode` gives the same number for the same output. With an
output subset (a shortlist) the searches run on subset positions (special ids keep their numbers) and return
vocabulary ids; a `prefix` is then given as subset positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from nmt.config import DecodingConfig
from nmt.data.tokenizer import BOS, EOS, PAD

NEG_INF = float("-inf")


class Rows(Protocol):
    """A memory or decoder state: per-row tensors that searches reorder and shrink."""
    def index_select(self, index: Tensor) -> Any: ...


class SearchModel(Protocol):
    """What the searches need of a model or an ensemble (nmt.model.inference.Decoding, EnsembleDecoding)."""

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Rows, Rows]:
        """src: (batch, src_len) -> memory, initial decoder state."""

    def step(self, prev_tokens: Tensor, state: Rows, memory: Rows) -> tuple[Tensor, Rows, Tensor]:
        """prev_tokens: (rows,) -> scores whose log-softmax is log p (rows, vocab), state, attention (rows, src_len)."""

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        """Tokens `step` chose (subset positions with a shortlist) -> vocabulary ids."""

    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Teacher-forced log p (batch, tgt_len) of each next token tgt_out, given the tokens tgt_in before it."""


def search_model(model: SearchModel | nn.Module) -> SearchModel:
    """A `SearchModel` as it is; a plain Seq2Seq or Ensemble with a context for this call (`.decoding()`)."""
    return model.decoding() if isinstance(model, nn.Module) else model  # type: ignore[operator]


@dataclass
class Hypothesis:
    tokens: list[int]          # output ids, EOS excluded
    score: float               # log p(y) / lp(y) (+ coverage penalty) in beam search; log p(y) otherwise
    attention: Tensor | None   # (len(tokens) + 1, src_len) weights, the EOS step included; None unless asked
    log_prob: float = 0.0      # log p(y), EOS included


@dataclass
class Sampler:
    """Draws the next token from p(y)^(1/temperature), cut to the `top_k` most probable pieces and to the
    smallest set holding `top_p` of the probability. One generator for a run: same seed and batches, same
    samples."""

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
    """Per sentence: ratio * source length + 10 output tokens, EOS included (src_lengths count EOS), at least
    room for `min_len` pieces and EOS, and at most `cap` when given: the cap wins."""
    real = (src_lengths - 1).clamp(min=0).float()
    limits = (ratio * real + 10).long().clamp(min=min_len + 1)
    return limits.clamp(max=cap) if cap is not None else limits


@dataclass(frozen=True)
class SearchSettings:
    """One search's settings, one object from the translator to whichever search runs them."""

    beam_size: int = DecodingConfig.beam_size
    alpha: float = DecodingConfig.length_penalty
    max_len_ratio: float = DecodingConfig.max_len_ratio
    min_len: int = DecodingConfig.min_len
    max_len: int | None = None                   # output cap, EOS included
    n_best: int = 1                              # hypotheses (beam) or samples (sampling) per sentence
    no_repeat_ngram: int = 0
    coverage: float = 0.0                        # the GNMT β
    early_stop: bool = False
    return_attention: bool = False
    sampler: Sampler | None = None

    @classmethod
    def of(cls, d: DecodingConfig, n_best: int = 1, return_attention: bool = False,
           sampler: Sampler | None = None) -> SearchSettings:
        return cls(d.beam_size, d.length_penalty, d.max_len_ratio, d.min_len, d.max_len or None, n_best,
                   d.no_repeat_ngram, d.coverage_penalty, d.early_stop, return_attention, sampler)

    @property
    def greedy(self) -> bool:
        """Whether the greedy loop runs these settings (sampling, or one beam, one hypothesis, no coverage)."""
        return self.sampler is not None or (self.beam_size == 1 and self.n_best == 1 and not self.coverage)

    def limits(self, src_lengths: Tensor, device: torch.device, prefix: Tensor | None = None) -> Tensor:
        """(batch,) output lengths, EOS included; raised so that every sentence can finish after its prefix."""
        limits = max_output_lengths(src_lengths, self.max_len_ratio, self.min_len, self.max_len).to(device)
        return limits if prefix is None else torch.maximum(limits, (prefix != PAD).sum(1).to(device) + 1)


# ------------------------------------------------------------------ the rule


@dataclass
class Bans:
    """The constants of `constrain`, made once per search (in a graph, once per chunk: a tensor from outside
    would have to outlive it)."""

    banned: Tensor      # (2,) PAD and BOS, never produced
    not_eos: Tensor     # (vocab,) True but at EOS

    @classmethod
    def make(cls, vocab: int, device: torch.device) -> Bans:
        banned = torch.full((2,), PAD, device=device)
        banned[1:].fill_(BOS)           # a kernel: `banned[1] = BOS` copies a host scalar, which a capture refuses
        return cls(banned, torch.arange(vocab, device=device) != EOS)


def constrain(logp: Tensor, bans: Bans, eos_banned: Tensor | None, at_limit: Tensor, masked: bool) -> None:
    """In place: never PAD or BOS; no EOS where `eos_banned` (before min_len tokens); only EOS on a row's last
    allowed step (that wins over min_len: a cap below it ends the row there).

    logp: (rows, vocab); eos_banned, at_limit: (rows,) bool. `masked`: mask every row (static shapes) rather
    than index the few at their limit."""
    logp.index_fill_(1, bans.banned, NEG_INF)
    if eos_banned is not None:
        logp[:, EOS].masked_fill_(eos_banned, NEG_INF)
    if masked:
        logp.masked_fill_(at_limit.unsqueeze(1) & bans.not_eos, NEG_INF)
    else:
        logp[at_limit] = logp[at_limit].masked_fill(bans.not_eos, NEG_INF)


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


def beam_step(logp: Tensor, alive: Tensor, base: Tensor, k: int, penalty: Tensor | float, fill: Tensor | float,
              bonus: Tensor | None = None, out_rows: Tensor | None = None,
              out_finished: Tensor | None = None) -> BeamStep:
    """The rule for one output position. logp: (sentences*width, vocab) constrained log p of the next token,
    turned in place into candidates; alive: (sentences*width,) log p so far; base: (sentences, 1) each
    sentence's first row; penalty: lp(t + 1); fill: -inf (a tensor in a graph); bonus: the coverage penalty
    per alive row; out_*: where a graph records rows and finished scores."""
    vocab = logp.size(1)
    candidates = logp.add_(alive.unsqueeze(1)).view(base.size(0), -1)   # (sentences, width*vocab)
    scores, ids = _top_candidates(candidates, 2 * k)                      # (sentences, 2k), best first
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
    """(sentences,) the stop test: the n_best-th finished score (last_kept) is at least what the best alive
    beam can still reach (none alive: -inf, done); with early_stop, also once a best candidate has ended."""
    done = last_kept >= best_alive / lp_limit
    return done if top_ended is None else done | (top_ended & (last_kept > NEG_INF))


def _top_candidates(candidates: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The best `n` of each row, best first; padded with -inf when a row has fewer (a tiny vocabulary)."""
    scores, ids = candidates.topk(min(n, candidates.size(1)), dim=1)
    if scores.size(1) < n:
        missing = n - scores.size(1)
        scores = torch.cat([scores, scores.new_full((scores.size(0), missing), NEG_INF)], dim=1)
        ids = torch.cat([ids, ids.new_zeros(ids.size(0), missing)], dim=1)
    return scores, ids


def coverage_penalty(coverage: Tensor, src_mask: Tensor, beta: float) -> Tensor:
    """GNMT cp = β Σ_j log min(Σ_i α_ij, 1) over real source positions. coverage, src_mask: (rows, src_len)."""
    covered = coverage.clamp(min=1e-10, max=1.0).log().masked_fill(~src_mask, 0.0)
    return beta * covered.sum(1)                                        # (rows,)


def _block_repeated_ngrams(logp: Tensor, history: Tensor, n: int) -> None:
    """Forbid tokens that would repeat an n-gram already in `history` (rows, t). In place."""
    t = history.size(1)
    if n < 1 or t < n:                                                  # no complete n-gram yet
        return
    if n == 1:
        logp.scatter_(1, history, NEG_INF)
        return
    ngrams = history.unfold(1, n, 1)                                    # (rows, t-n+1, n)
    current = history[:, t - n + 1 :]                                   # (rows, n-1) the last n-1 tokens
    matches = (ngrams[:, :, :-1] == current.unsqueeze(1)).all(-1)      # (rows, t-n+1)
    banned = ngrams[:, :, -1].masked_fill(~matches, PAD)                # PAD is banned anyway
    logp.scatter_(1, banned, NEG_INF)


def _next_logp(logits: Tensor, t: int, s: SearchSettings, bans: Bans, at_limit: Tensor, history: Tensor | None,
               forced: Tensor | None) -> Tensor:
    """The eager searches' log p of output position t (rows, vocab): constrained, n-grams blocked, and where
    a prefix forces a token (`forced`, PAD for none), only that token at its own log p."""
    logp = logits.log_softmax(-1, dtype=torch.float32)
    constrain(logp, bans, ~at_limit if t < s.min_len else None, at_limit, masked=False)
    if history is not None:
        _block_repeated_ngrams(logp, history, s.no_repeat_ngram)
    if forced is not None:
        column = forced.unsqueeze(1)                                    # (rows, 1)
        kept = logp.gather(1, column)
        logp.masked_fill_((forced != PAD).unsqueeze(1), NEG_INF)
        logp.scatter_(1, column, kept)
    return logp


# ------------------------------------------------------------------ greedy and sampling

# Greedy search drops ended rows once they are this fraction of the batch: dropping copies every kept row's
# memory, which costs more than a few ended rows' steps (1 thread, sent/s: every step 436, 0.25 493, 0.5 462).
DROP_ENDED_FRACTION = 0.25


@torch.no_grad()
def greedy_search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                  settings: SearchSettings = SearchSettings(), prefix: Tensor | None = None) -> list[Hypothesis]:
    """The most probable token at each step, for every sentence at once; with a sampler, a drawn one,
    n_best rows per sentence (rows i*n .. (i+1)*n-1 are sentence i's). prefix: (batch, len), PAD-padded."""
    model, s = search_model(model), settings
    memory, state = model.encode(src, src_lengths, fold_context=False)   # one row per sentence
    if s.sampler is not None and s.n_best > 1:                         # one row per sample
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(s.n_best)
        memory, state, src = memory.index_select(rows), state.index_select(rows), src[rows]
        src_lengths = src_lengths[rows.to(src_lengths.device)]
        prefix = prefix[rows.to(prefix.device)] if prefix is not None else None
    batch, device = src.size(0), src.device
    limits = s.limits(src_lengths, device, prefix)
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
    return _collect(model.vocab_ids(tokens), lengths, scores, attention, src_lengths)


def _collect(tokens: Tensor, lengths: Tensor, scores: Tensor, attention: Tensor | None,
             src_lengths: Tensor) -> list[Hypothesis]:
    """Tensors -> one Hypothesis per row (EOS stripped from tokens, kept in the attention)."""
    tokens_list, lengths_list, scores_list = tokens.tolist(), lengths.tolist(), scores.tolist()
    out = []
    for i, (row, n, score) in enumerate(zip(tokens_list, lengths_list, scores_list, strict=True)):
        ended = n > 0 and row[n - 1] == EOS
        weights = attention[i, :n, : int(src_lengths[i])].cpu() if attention is not None else None
        out.append(Hypothesis(row[: n - 1] if ended else row[:n], score, weights, score))
    return out


# ------------------------------------------------------------------ beam


@dataclass
class _Beams:
    """The alive beams of the active sentences, (active*width, ...): one beam per sentence at the first step
    (all would be the same), k from the second on."""

    prev: Tensor                # (rows,) the last token
    scores: Tensor              # (rows,) log p so far
    tokens: Tensor              # (rows, t)
    state: Rows
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
    logp: Tensor | None         # (batch, k) log p, coverage (else derived from the scores)
    attn: Tensor | None         # (batch, k, steps, src_len)

    def merge(self, active: Tensor, step: BeamStep, beams: _Beams, weights: Tensor, t: int) -> None:
        """The step's finishing hypotheses into the pool: the best k of old and new (old first among equals)."""
        n, k, steps = active.numel(), self.scores.size(1), self.tokens.size(2)
        new = torch.cat([step.finished, torch.full_like(step.finished, NEG_INF)], dim=1)     # (active, 2k)
        best, pick = torch.cat([self.scores[active], new], dim=1).topk(k, dim=1)          # (active, k)
        from_new, old = pick >= k, pick.clamp(max=k - 1)
        new_idx = (pick - k).clamp(min=0)
        if self.logp is not None:
            self.logp[active] = torch.where(from_new, step.scores.gather(1, new_idx), self.logp[active].gather(1, old))
        new_rows = step.rows.gather(1, new_idx)                                 # (active, k) alive rows
        ended = torch.cat([beams.tokens, beams.tokens.new_full((beams.tokens.size(0), 1), EOS)], 1)
        fresh = ended.new_full((n, k, steps), PAD)
        fresh[:, :, : t + 1] = ended[new_rows]
        old_tokens = self.tokens[active].gather(1, old.unsqueeze(2).expand(-1, -1, steps))
        self.tokens[active] = torch.where(from_new.unsqueeze(2), fresh, old_tokens)
        old_len = self.lengths[active].gather(1, old)
        self.lengths[active] = torch.where(from_new, torch.full_like(old_len, t + 1), old_len)
        if self.attn is not None and beams.attn is not None:
            src_len = self.attn.size(3)
            with_eos = torch.cat([beams.attn, weights.float().unsqueeze(1)], 1)      # (active*width, t+1, src_len)
            old_attn = self.attn[active].gather(1, old.view(n, k, 1, 1).expand(-1, -1, steps, src_len))
            fresh_attn = old_attn.new_zeros(n, k, steps, src_len)
            fresh_attn[:, :, : t + 1] = with_eos[new_rows]
            self.attn[active] = torch.where(from_new.view(n, k, 1, 1), fresh_attn, old_attn)
        self.scores[active] = best

    def hypotheses(self, model: SearchModel, alpha: float, src_lengths: Tensor, n_best: int
                   ) -> list[list[Hypothesis]]:
        logp = self.logp if self.logp is not None else self.scores * length_penalty(self.lengths.float(), alpha)
        return _collect_beams(model.vocab_ids(self.tokens), self.lengths, self.scores, logp, self.attn,
                              src_lengths, n_best)


@torch.no_grad()
def beam_search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                settings: SearchSettings = SearchSettings(), prefix: Tensor | None = None) -> list[list[Hypothesis]]:
    """The n_best hypotheses of every sentence, best first. With one beam and α = 0 this is greedy search;
    with α > 0 one beam may search on after greedy would stop. prefix: (batch, len), PAD-padded."""
    model, s, k = search_model(model), settings, settings.beam_size
    batch, src_len, device = src.size(0), src.size(1), src.device
    memory, state = model.encode(src, src_lengths)        # one row per sentence; beams share the memory
    limits = s.limits(src_lengths, device, prefix)          # (batch,)
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
        pool.merge(active, step, beams, weights, t)
        beams = _continue(beams, step, weights)
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
    return pool.hypotheses(model, s.alpha, src_lengths, min(s.n_best, k))


def _continue(beams: _Beams, step: BeamStep, weights: Tensor) -> _Beams:
    """The best k candidates that do not end, as the new alive beams."""
    rows = step.rows.gather(1, step.pick).view(-1)                           # (active*k,)
    prev = step.tokens.gather(1, step.pick).view(-1)
    attn = torch.cat([beams.attn, weights.float().unsqueeze(1)], 1)[rows] if beams.attn is not None else None
    return _Beams(prev, step.alive.view(-1), torch.cat([beams.tokens[rows], prev.unsqueeze(1)], dim=1),
                  beams.state.index_select(rows), attn, beams.cov[rows] if beams.cov is not None else None)


def _collect_beams(tokens: Tensor, lengths: Tensor, scores: Tensor, log_probs: Tensor, attention: Tensor | None,
                   src_lengths: Tensor, n_best: int) -> list[list[Hypothesis]]:
    """(batch, k, ...) tensors -> each sentence's first n_best hypotheses, the empty slots (-inf) left out."""
    tokens_l, lengths_l = tokens[:, :n_best].tolist(), lengths[:, :n_best].tolist()
    scores_l, log_probs_l = scores[:, :n_best].tolist(), log_probs[:, :n_best].tolist()
    out = []
    for i in range(len(tokens_l)):
        hyps = []
        for j in range(n_best):
            n = lengths_l[i][j]
            if scores_l[i][j] == NEG_INF:
                continue
            weights = attention[i, j, :n, : int(src_lengths[i])].cpu() if attention is not None else None
            hyps.append(Hypothesis(tokens_l[i][j][: n - 1], scores_l[i][j], weights, log_probs_l[i][j]))
        out.append(hyps)
    return out


class Captured(Protocol):
    """Searches replayed as captured graphs (nmt.decode.graphed.SearchGraphs)."""

    def runs(self, model: SearchModel, settings: SearchSettings, prefix: Tensor | None) -> bool: ...

    def search(self, src: Tensor, src_lengths: Tensor, settings: SearchSettings) -> list[list[Hypothesis]]: ...


def search(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor, settings: SearchSettings,
           prefix: Tensor | None = None, graphs: Captured | None = None) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses, best first (samples in the order drawn): the one place that picks the
    captured graphs (when given and able to run these settings) or the eager searches."""
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
    """The model's log p(y | x) of given outputs, teacher-forced: the searches' log p for the same output.

    tgt: (batch, tgt_len) ids without BOS/EOS, PAD-padded -> log p with EOS (batch,), lengths with EOS (batch,).
    """
    batch = tgt.size(0)
    lengths = (tgt != PAD).sum(1)                                        # (batch,) without EOS
    tgt_in = torch.cat([tgt.new_full((batch, 1), BOS), tgt], dim=1)      # (batch, tgt_len+1) BOS y
    tgt_out = torch.cat([tgt, tgt.new_full((batch, 1), PAD)], dim=1)     # (batch, tgt_len+1) y EOS
    tgt_out.scatter_(1, lengths.unsqueeze(1), EOS)
    logp = search_model(model).forced(src, src_lengths, tgt_in, tgt_out)   # (batch, tgt_len+1)
    return logp.masked_fill(tgt_out == PAD, 0.0).sum(1), lengths + 1
