"""Greedy and beam search over whole batches as tensors.

Beam search keeps all sentences and all their beams in one tensor of shape (batch×beam, …): there is no Python loop
over sentences or hypotheses, only over output positions. Encoder output and attention keys are computed once per
sentence and shared by its beams (the attention scores a sentence's beams as one block of queries, see
nmt.model.attention). Sentences whose search is over are dropped from the active tensors: the batch shrinks.

Length penalty (GNMT): lp(y) = ((5 + |y|) / 6)^α, and a hypothesis is ranked by log p(y) / lp(y), with |y| counting
the tokens generated, EOS included. A sentence stops once it has `n_best` finished hypotheses and no unfinished one
can still beat the n_best-th of them: an unfinished hypothesis with log-probability s ≤ 0 can at best reach s /
lp(max_len), since its score only falls and lp only grows. The returned n-best list is then final; searching on
until `beam` hypotheses have finished would only add ones ranked below it. Stopping when the top beam reaches EOS
(OpenNMT-py's rule) can miss a longer hypothesis that α > 0 would rank first; it is the opt-in `early_stop`, which
decodes fewer rows (test_2016_flickr, beam 5: about 14% fewer).

Options that cost nothing when off (each is a branch inside the step loop):
  * a target prefix per sentence (`prefix`, PAD-padded): its tokens are forced, search goes on after it;
  * `no_repeat_ngram` in greedy search as in beam search;
  * sampling (`Sampler`: temperature, top-k, top-p, a seeded generator) in the greedy loop, with
    `num_samples` rows per sentence (`sample`);
  * the GNMT coverage penalty cp = β Σ_j log min(Σ_i α_ij, 1) added to finished hypotheses' scores.
Every hypothesis carries its log-probability, so `force_decode` (teacher-forced scoring of given
targets) gives the same number for the same output.

The searches take a `SearchModel` (nmt.decode.steps.Decoding, nmt.decode.ensemble.EnsembleDecoding;
a plain `Seq2Seq` or `Ensemble` gets an inference step for the call). With an output subset (a shortlist) they
run on subset positions, which keep the special ids' numbers, and return vocabulary ids; a `prefix`
must then be given as subset positions, and log-probabilities are normalised over the subset.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.decode.steps import Decoding
from nmt.model.seq2seq import Seq2Seq

NEG_INF = float("-inf")
# No EOS at the first output position, as `decoding.min_len` defaults to (Joey NMT's min_output_length and
# fairseq's min_len do the same): an undertrained model's searches otherwise prefer the empty output, whose
# one EOS step outscores every real sentence, and a short run translates every line to nothing.
MIN_LEN = 1


class Rows(Protocol):
    """A memory or decoder state: per-row tensors that searches reorder and shrink."""
    def index_select(self, index: Tensor) -> Any: ...


class SearchModel(Protocol):
    """What the searches (here and nmt.decode.graphed) need of a model or an ensemble."""

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Rows, Rows]:
        """src: (batch, src_len) -> memory, initial decoder state (`fold_context`: see `Decoding.encode`)."""

    def step(self, prev_tokens: Tensor, state: Rows, memory: Rows) -> tuple[Tensor, Rows, Tensor]:
        """prev_tokens: (rows,) -> scores whose log-softmax is log p (rows, vocab), new state, attention
        (rows, src_len); tokens and scores index the output subset when there is one."""

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        """Tokens `step` chose (subset positions with a shortlist) -> vocabulary ids."""

    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Teacher-forced log p (batch, tgt_len) of each next token tgt_out, given the tokens tgt_in before it."""


def search_model(model: SearchModel | nn.Module) -> SearchModel:
    """A `SearchModel` as it is; a plain Seq2Seq or Ensemble with an inference step for this call."""
    if isinstance(model, Seq2Seq):
        return Decoding(model)
    return model.decoding() if isinstance(model, nn.Module) else model


@dataclass
class Hypothesis:
    tokens: list[int]          # output ids, EOS excluded
    score: float               # log p(y) / lp(y) (+ coverage penalty) in beam search; log p(y) otherwise
    attention: Tensor | None   # (len(tokens) + 1, src_len) weights, the EOS step included; None unless asked
    log_prob: float = 0.0      # log p(y), EOS included


@dataclass
class Sampler:
    """Draws the next token from p(y)^(1/temperature), cut to the `top_k` most probable pieces and
    to the smallest set holding `top_p` of the probability. One generator for a whole run: the
    same seed and batches give the same samples."""

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


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + |y|) / 6)^α."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, ratio: float, min_len: int = 0, cap: int | None = None) -> Tensor:
    """Per sentence: ratio * source length + 10 output tokens, EOS included (src_lengths count EOS),
    at least room for `min_len` pieces and EOS, and at most `cap` when given: the cap wins."""
    real = (src_lengths - 1).clamp(min=0).float()
    limits = (ratio * real + 10).long().clamp(min=min_len + 1)
    return limits.clamp(max=cap) if cap is not None else limits


def _constrain(logp: Tensor, t: int, min_len: int, at_limit: Tensor) -> None:
    """In place: never PAD or BOS; no EOS before `min_len` tokens; only EOS on a row's last allowed step
    (that wins over `min_len`: a length cap below it ends the row there).
    logp: (rows, vocab) log-probabilities of output position t; at_limit: (rows,) bool."""
    logp[:, PAD] = NEG_INF
    logp[:, BOS] = NEG_INF
    if t < min_len:
        logp[:, EOS] = logp[:, EOS].masked_fill(~at_limit, NEG_INF)
    logp[at_limit] = logp[at_limit].masked_fill(torch.arange(logp.size(1), device=logp.device) != EOS, NEG_INF)


def _force_tokens(logp: Tensor, forced: Tensor) -> None:
    """In place: a row with a forced token (not PAD) may produce only that token, at its own log-probability.
    logp: (rows, vocab); forced: (rows,) token ids, PAD where nothing is forced."""
    column = forced.unsqueeze(1)                                        # (rows, 1)
    kept = logp.gather(1, column)
    logp.masked_fill_((forced != PAD).unsqueeze(1), NEG_INF)
    logp.scatter_(1, column, kept)


def _prefix_lengths(prefix: Tensor | None, limits: Tensor) -> Tensor:
    """Output limits raised so that every sentence can finish after its prefix (+ EOS)."""
    if prefix is None:
        return limits
    return torch.maximum(limits, (prefix != PAD).sum(1).to(limits.device) + 1)


def coverage_penalty(coverage: Tensor, src_mask: Tensor, beta: float) -> Tensor:
    """GNMT cp = β Σ_j log min(Σ_i α_ij, 1) over real source positions j.

    coverage: (rows, src_len) attention summed over the output steps; src_mask: (rows, src_len)."""
    covered = coverage.clamp(min=1e-10, max=1.0).log().masked_fill(~src_mask, 0.0)
    return beta * covered.sum(1)                                        # (rows,)


def _block_repeated_ngrams(logp: Tensor, history: Tensor, n: int) -> None:
    """Forbid tokens that would repeat an n-gram already in `history` (rows, t). In place, vectorised."""
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


def _on_search_model(search: Callable) -> Callable:
    """Run a search on `search_model(model)`: derived weights built once for all of its steps."""
    @functools.wraps(search)
    def run(model: SearchModel | nn.Module, *args, **kwargs):
        return search(search_model(model), *args, **kwargs)
    return run


# Greedy search drops ended rows from the batch once they are this fraction of it: dropping copies the
# memory (keys and values) of every row kept, which costs more than decoding a few ended rows a few more
# steps (1,000 test sentences, 1 thread: 4% faster than dropping at every step; again with the 4x narrower
# unfolded memory, int8 + shortlist, sent/s over two rounds: every step 436, 0.1 485, 0.25 493, 0.5 462).
DROP_ENDED_FRACTION = 0.25


@torch.no_grad()
@_on_search_model
def greedy_search(model: SearchModel, src: Tensor, src_lengths: Tensor, max_len_ratio: float = 2.0,
                  min_len: int = MIN_LEN, return_attention: bool = False, max_len: int | None = None,
                  no_repeat_ngram: int = 0, prefix: Tensor | None = None, sampler: Sampler | None = None,
                  num_samples: int = 1) -> list[Hypothesis]:
    """The most probable token at each step, for every sentence of the batch at once.

    With a `sampler`, a token drawn from the distribution instead, `num_samples` rows per sentence
    (sentence-major: rows i*num_samples .. (i+1)*num_samples-1 belong to sentence i).
    prefix: (batch, prefix_len) tokens to force first, PAD-padded; None for none."""
    memory, state = model.encode(src, src_lengths, fold_context=False)   # one row per sentence: see Decoding.encode
    if num_samples > 1:                                                 # one row per sample
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(num_samples)
        memory, state, src = memory.index_select(rows), state.index_select(rows), src[rows]
        src_lengths = src_lengths[rows.to(src_lengths.device)]
        prefix = prefix[rows.to(prefix.device)] if prefix is not None else None
    batch = src.size(0)
    limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(src.device)
    limits = _prefix_lengths(prefix, limits)
    steps = int(limits.max())
    tokens = src.new_full((batch, steps), PAD)                          # (batch, steps)
    scores = torch.zeros(batch, device=src.device)                        # log p, in fp32 under autocast too
    lengths = torch.zeros(batch, dtype=torch.long, device=src.device)
    attention = torch.zeros(batch, steps, src.size(1), device=src.device) if return_attention else None
    rows = torch.arange(batch, device=src.device)                       # the sentence of each row decoded
    going = torch.ones(batch, dtype=torch.bool, device=src.device)       # rows that have not ended
    ended = 0                                                            # rows decoded on although ended
    prev = src.new_full((batch,), BOS)
    for t in range(steps):
        logits, state, weights = model.step(prev, state, memory)
        logp = logits.log_softmax(-1, dtype=torch.float32)              # (rows, vocab)
        _constrain(logp, t, min_len, limits[rows] - 1 <= t)
        if no_repeat_ngram:
            _block_repeated_ngrams(logp, tokens[rows, :t], no_repeat_ngram)
        if prefix is not None and t < prefix.size(1):
            _force_tokens(logp, prefix[rows, t])
        if sampler is None:
            best, prev = logp.max(-1)                                    # (rows,)
        else:                                    # ended rows draw nothing: their logp may be all -inf, and
            prev = torch.full_like(going, EOS, dtype=torch.long)        # the generator's stream stays the live rows'
            prev[going] = sampler(logp[going])
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


def sample(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor, sampler: Sampler, num_samples: int = 1,
           max_len_ratio: float = 2.0, min_len: int = MIN_LEN, return_attention: bool = False,
           max_len: int | None = None, no_repeat_ngram: int = 0, prefix: Tensor | None = None
           ) -> list[list[Hypothesis]]:
    """`num_samples` sampled outputs per sentence (for back-translation), in the order drawn."""
    hyps = greedy_search(model, src, src_lengths, max_len_ratio, min_len, return_attention, max_len,
                         no_repeat_ngram, prefix, sampler, num_samples)
    return [hyps[i : i + num_samples] for i in range(0, len(hyps), num_samples)]


def _top_candidates(candidates: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The best `n` of each row of (sentences, candidates), best first; rows with fewer than `n`
    candidates (a tiny vocabulary at the first step) are padded with -inf scores."""
    scores, ids = candidates.topk(min(n, candidates.size(1)), dim=1)
    if scores.size(1) < n:
        missing = n - scores.size(1)
        scores = torch.cat([scores, scores.new_full((scores.size(0), missing), NEG_INF)], dim=1)
        ids = torch.cat([ids, ids.new_zeros(ids.size(0), missing)], dim=1)
    return scores, ids


@torch.no_grad()
@_on_search_model
def beam_search(model: SearchModel, src: Tensor, src_lengths: Tensor, beam_size: int = 5, alpha: float = 1.0,
                max_len_ratio: float = 2.0, min_len: int = MIN_LEN, n_best: int = 1, no_repeat_ngram: int = 0,
                return_attention: bool = False, max_len: int | None = None, prefix: Tensor | None = None,
                coverage: float = 0.0, early_stop: bool = False) -> list[list[Hypothesis]]:
    """Beam search for a whole batch; returns the `n_best` hypotheses of every sentence, best first.

    An EOS candidate finishes a hypothesis when it ranks among the best `beam_size` candidates
    of its sentence. With one beam and alpha = 0 this is exactly greedy search; with alpha > 0
    one beam may search on after greedy would stop, because a longer hypothesis can still win.

    `max_len` caps the output length (EOS included) below the ratio-based limit; `prefix` (batch,
    prefix_len), PAD-padded, forces each sentence's first tokens; `coverage` is the GNMT β;
    `early_stop` ends a sentence once the best candidate of one of its steps was EOS and it has `n_best`
    finished (OpenNMT-py's rule)."""
    batch, k, device = src.size(0), beam_size, src.device
    n_best = min(n_best, k)
    memory, state = model.encode(src, src_lengths)        # one row per sentence; beams share the memory
    limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(device)   # (batch,)
    limits = _prefix_lengths(prefix, limits)
    steps = int(limits.max())
    src_len = src.size(1)
    if coverage:
        src_mask = src != PAD                                                 # (batch, src_len)
        alive_cov = torch.zeros(batch, src_len, device=device)                # (active*width, src_len) Σ_i α_ij
        fin_logp = torch.full((batch, k), NEG_INF, device=device)               # log p of the finished

    # Alive beams of the active sentences, flattened (active*width, ...): one beam per sentence
    # at the first step (all beams would be the same), `k` from the second on.
    alive_scores = torch.zeros(batch, device=device)                          # (active*width,) log p so far
    alive_tokens = src.new_full((batch, 0), PAD)                              # (active*width, t)
    alive_attn = torch.zeros(batch, 0, src_len, device=device) if return_attention else None
    prev = src.new_full((batch,), BOS)

    # Finished hypotheses per sentence (all sentences, indexed by original position).
    fin_scores = torch.full((batch, k), NEG_INF, device=device)                 # normalised scores
    fin_tokens = src.new_full((batch, k, steps), PAD)
    fin_lengths = torch.zeros(batch, k, dtype=torch.long, device=device)
    fin_attn = torch.zeros(batch, k, steps, src_len, device=device) if return_attention else None
    active = torch.arange(batch, device=device)                               # sentences still searching
    top_ended = torch.zeros(batch, dtype=torch.bool, device=device)           # early_stop: a best candidate ended

    for t in range(steps):
        n_active = active.numel()
        width = prev.size(0) // n_active                                      # alive beams per sentence
        logits, state, weights = model.step(prev, state, memory)
        logp = logits.log_softmax(-1, dtype=torch.float32)                    # (active*width, vocab)
        vocab = logp.size(1)
        _constrain(logp, t, min_len, (limits[active] - 1 <= t).repeat_interleave(width))
        if no_repeat_ngram:
            _block_repeated_ngrams(logp, alive_tokens, no_repeat_ngram)
        if prefix is not None and t < prefix.size(1):
            _force_tokens(logp, prefix[active, t].repeat_interleave(width))

        candidates = logp.add_(alive_scores.unsqueeze(1)).view(n_active, width * vocab)  # (active, width*vocab)
        top_scores, top_ids = _top_candidates(candidates, 2 * k)                 # (active, 2k), best first
        top_beam, top_token = top_ids // vocab, top_ids % vocab
        is_eos = (top_token == EOS) & (top_scores > NEG_INF)
        base = (torch.arange(n_active, device=device) * width).unsqueeze(1)      # (active, 1)
        source_rows = base + top_beam                                            # (active, 2k) rows of alive

        # 1. EOS candidates ranked within the top k finish; merge them with the finished pool.
        rank = torch.arange(top_scores.size(1), device=device).unsqueeze(0)
        finishing = is_eos & (rank < k)
        norm = top_scores / length_penalty(float(t + 1), alpha)
        if coverage:
            alive_cov = alive_cov + weights.float()                               # this step's α included
            row_mask = src_mask[active].repeat_interleave(width, dim=0)
            norm = norm + coverage_penalty(alive_cov, row_mask, coverage)[source_rows]
        new_fin = norm.masked_fill(~finishing, NEG_INF)                           # (active, 2k)
        pool_scores = torch.cat([fin_scores[active], new_fin], dim=1)            # (active, 3k)
        fin_best, fin_pick = pool_scores.topk(k, dim=1)                           # (active, k)
        from_new = fin_pick >= k
        new_idx = (fin_pick - k).clamp(min=0)
        if coverage:
            old_logp = fin_logp[active].gather(1, fin_pick.clamp(max=k - 1))
            fin_logp[active] = torch.where(from_new, top_scores.gather(1, new_idx), old_logp)
        new_rows = source_rows.gather(1, new_idx)                                 # (active, k) alive rows
        old_tokens = fin_tokens[active].gather(1, fin_pick.clamp(max=k - 1).unsqueeze(2).expand(-1, -1, steps))
        cand_tokens = torch.cat([alive_tokens, alive_tokens.new_full((alive_tokens.size(0), 1), EOS)], 1)
        fresh = cand_tokens.new_full((n_active, k, steps), PAD)
        fresh[:, :, : t + 1] = cand_tokens[new_rows]
        fin_tokens[active] = torch.where(from_new.unsqueeze(2), fresh, old_tokens)
        old_len = fin_lengths[active].gather(1, fin_pick.clamp(max=k - 1))
        fin_lengths[active] = torch.where(from_new, torch.full_like(old_len, t + 1), old_len)
        if return_attention:
            cand_attn = torch.cat([alive_attn, weights.float().unsqueeze(1)], 1)  # (active*k, t+1, src_len)
            old_attn = fin_attn[active].gather(
                1, fin_pick.clamp(max=k - 1).view(n_active, k, 1, 1).expand(-1, -1, steps, src_len))
            fresh_attn = old_attn.new_zeros(n_active, k, steps, src_len)
            fresh_attn[:, :, : t + 1] = cand_attn[new_rows]
            fin_attn[active] = torch.where(from_new.view(n_active, k, 1, 1), fresh_attn, old_attn)
        fin_scores[active] = fin_best

        # 2. The best k candidates that do not end continue as the alive beams.
        cont_scores = top_scores.masked_fill(top_token == EOS, NEG_INF)
        alive_best, alive_pick = cont_scores.topk(k, dim=1)                      # (active, k)
        rows = source_rows.gather(1, alive_pick).view(-1)                         # (active*k,)
        prev = top_token.gather(1, alive_pick).view(-1)
        alive_scores = alive_best.view(-1)
        alive_tokens = torch.cat([alive_tokens[rows], prev.unsqueeze(1)], dim=1)
        if return_attention:
            alive_attn = torch.cat([alive_attn, weights.float().unsqueeze(1)], 1)[rows]
        if coverage:
            alive_cov = alive_cov[rows]
        state = state.index_select(rows)

        # 3. A sentence is done when it has n_best finished and no alive beam can still beat the n_best-th.
        best_alive = alive_best[:, 0]                                             # (active,)
        bound = best_alive / length_penalty(limits[active].float(), alpha)       # best reachable normalised
        last_kept = fin_best[:, n_best - 1]                                       # (active,) the n_best-th finished
        done = (last_kept > NEG_INF) & (last_kept >= bound)
        done |= best_alive == NEG_INF                                             # nothing left to extend
        if early_stop:                                       # a step's best candidate ended, now or before
            top_ended[active] |= is_eos[:, 0]
            done |= top_ended[active] & (last_kept > NEG_INF)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            keep_rows = (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            active = active[keep]
            prev, alive_scores, alive_tokens = prev[keep_rows], alive_scores[keep_rows], alive_tokens[keep_rows]
            if return_attention:
                alive_attn = alive_attn[keep_rows]
            if coverage:
                alive_cov = alive_cov[keep_rows]
            state, memory = state.index_select(keep_rows), memory.index_select(keep)

    if not coverage:                                                               # log p = score * lp(|y|)
        fin_logp = fin_scores * length_penalty(fin_lengths.float(), alpha)
    return _collect_beams(model.vocab_ids(fin_tokens), fin_lengths, fin_scores, fin_logp, fin_attn,
                          src_lengths, n_best)


def _collect_beams(tokens: Tensor, lengths: Tensor, scores: Tensor, log_probs: Tensor, attention: Tensor | None,
                   src_lengths: Tensor, n_best: int) -> list[list[Hypothesis]]:
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


@torch.no_grad()
def force_decode(model: SearchModel | nn.Module, src: Tensor, src_lengths: Tensor,
                 tgt: Tensor) -> tuple[Tensor, Tensor]:
    """The model's log p(y | x) of given outputs, teacher-forced, for a whole batch.

    tgt: (batch, tgt_len) output ids without BOS/EOS, PAD-padded.
    returns log p of each row with its EOS (batch,) and the lengths with EOS (batch,);
    the same log-probability the searches report for the same output.
    """
    batch = tgt.size(0)
    lengths = (tgt != PAD).sum(1)                                        # (batch,) without EOS
    tgt_in = torch.cat([tgt.new_full((batch, 1), BOS), tgt], dim=1)      # (batch, tgt_len+1) BOS y
    tgt_out = torch.cat([tgt, tgt.new_full((batch, 1), PAD)], dim=1)     # (batch, tgt_len+1) y EOS
    tgt_out.scatter_(1, lengths.unsqueeze(1), EOS)
    logp = search_model(model).forced(src, src_lengths, tgt_in, tgt_out)   # (batch, tgt_len+1)
    return logp.masked_fill(tgt_out == PAD, 0.0).sum(1), lengths + 1
