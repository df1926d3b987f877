"""Greedy and beam search over whole batches as tensors.

Beam search keeps all sentences and all their beams in one tensor of shape (batch×beam, …):
there is no Python loop over sentences or hypotheses, only over output positions. Encoder
output and attention keys are computed once per sentence and shared by its beams (the
attention scores a sentence's beams as one block of queries, see nmt.model.attention).
Sentences whose search is over are dropped from the active tensors, so the batch shrinks as
it goes.

Length penalty (GNMT): lp(y) = ((5 + |y|) / 6)^α, and a hypothesis is ranked by log p(y) / lp(y),
with |y| counting the tokens generated, EOS included. A sentence stops once it has `n_best`
finished hypotheses and no unfinished one can still beat the n_best-th of them: an unfinished
hypothesis with log-probability s ≤ 0 can at best reach s / lp(max_len), since its score only
falls and lp only grows. The returned n-best list is then final; searching on until `beam`
hypotheses have finished would only add ones ranked below it. (Stopping when the top beam
reaches EOS is wrong under α > 0.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.model.seq2seq import Seq2Seq

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]          # output ids, EOS excluded
    score: float               # log p(y) / lp(y) (log p(y) for greedy)
    attention: Tensor | None   # (len(tokens) + 1, src_len) weights, the EOS step included; None unless asked


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + |y|) / 6)^α."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, ratio: float, min_len: int = 0, cap: int | None = None) -> Tensor:
    """Per sentence: ratio * source length + 10 output tokens, EOS included (src_lengths count EOS),
    at most `cap` when given."""
    real = (src_lengths - 1).clamp(min=0).float()
    limits = (ratio * real + 10).long()
    if cap is not None:
        limits = limits.clamp(max=cap)
    return limits.clamp(min=min_len + 1)


def _constrain(logp: Tensor, t: int, min_len: int, at_limit: Tensor) -> None:
    """In place: never PAD or BOS; no EOS before `min_len` tokens; only EOS on a row's last allowed step.

    logp: (rows, vocab) log-probabilities of output position t; at_limit: (rows,) bool.
    """
    logp[:, PAD] = NEG_INF
    logp[:, BOS] = NEG_INF
    if t < min_len:
        logp[:, EOS] = NEG_INF
    logp[at_limit] = logp[at_limit].masked_fill(torch.arange(logp.size(1), device=logp.device) != EOS, NEG_INF)


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


def _with_frozen_weights(search: Callable) -> Callable:
    """Run a search with the decoder's derived weights built once for all of its steps."""
    @functools.wraps(search)
    def run(model: Seq2Seq, *args, **kwargs):
        with model.decoder.frozen_weights():
            return search(model, *args, **kwargs)
    return run


@torch.no_grad()
@_with_frozen_weights
def greedy_search(model: Seq2Seq, src: Tensor, src_lengths: Tensor, max_len_ratio: float = 2.0,
                  min_len: int = 0, return_attention: bool = False, max_len: int | None = None) -> list[Hypothesis]:
    """The most probable token at each step, for every sentence of the batch at once."""
    batch = src.size(0)
    memory, state = model.encode(src, src_lengths)
    limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(src.device)
    steps = int(limits.max())
    tokens = src.new_full((batch, steps), PAD)                          # (batch, steps)
    scores = torch.zeros(batch, device=src.device)                        # log p, in fp32 under autocast too
    lengths = torch.zeros(batch, dtype=torch.long, device=src.device)
    attention = torch.zeros(batch, steps, src.size(1), device=src.device) if return_attention else None
    active = torch.arange(batch, device=src.device)                     # rows still generating
    prev = src.new_full((batch,), BOS)
    for t in range(steps):
        logits, state, weights = model.decoder.step(prev, state, memory)
        logp = logits.float().log_softmax(-1)                           # (active, vocab)
        _constrain(logp, t, min_len, limits[active] - 1 <= t)
        best, prev = logp.max(-1)                                        # (active,)
        tokens[active, t] = prev
        scores[active] += best
        lengths[active] += 1
        if attention is not None:
            attention[active, t] = weights.float()
        going = prev != EOS
        if not bool(going.all()):
            keep = going.nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            active, prev = active[keep], prev[keep]
            state, memory = state.index_select(keep), memory.index_select(keep)
    return _collect(tokens, lengths, scores, attention, src_lengths)


def _collect(tokens: Tensor, lengths: Tensor, scores: Tensor, attention: Tensor | None,
             src_lengths: Tensor) -> list[Hypothesis]:
    """Tensors -> one Hypothesis per row (EOS stripped from tokens, kept in the attention)."""
    tokens_list, lengths_list, scores_list = tokens.tolist(), lengths.tolist(), scores.tolist()
    out = []
    for i, (row, n, score) in enumerate(zip(tokens_list, lengths_list, scores_list, strict=True)):
        ended = n > 0 and row[n - 1] == EOS
        weights = attention[i, :n, : int(src_lengths[i])].cpu() if attention is not None else None
        out.append(Hypothesis(row[: n - 1] if ended else row[:n], score, weights))
    return out


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
@_with_frozen_weights
def beam_search(model: Seq2Seq, src: Tensor, src_lengths: Tensor, beam_size: int = 5, alpha: float = 1.0,
                max_len_ratio: float = 2.0, min_len: int = 0, n_best: int = 1, no_repeat_ngram: int = 0,
                return_attention: bool = False, max_len: int | None = None) -> list[list[Hypothesis]]:
    """Beam search for a whole batch; returns the `n_best` hypotheses of every sentence, best first.

    An EOS candidate finishes a hypothesis when it ranks among the best `beam_size` candidates
    of its sentence. With one beam and alpha = 0 this is exactly greedy search; with alpha > 0
    one beam may search on after greedy would stop, because a longer hypothesis can still win.

    `max_len` caps the output length (EOS included) below the ratio-based limit."""
    batch, k, device = src.size(0), beam_size, src.device
    n_best = min(n_best, k)
    memory, state = model.encode(src, src_lengths)        # one row per sentence; beams share the memory
    limits = max_output_lengths(src_lengths, max_len_ratio, min_len, max_len).to(device)   # (batch,)
    steps = int(limits.max())
    src_len = src.size(1)

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

    for t in range(steps):
        n_active = active.numel()
        width = prev.size(0) // n_active                                      # alive beams per sentence
        logits, state, weights = model.decoder.step(prev, state, memory)
        logp = logits.float().log_softmax(-1)                                 # (active*width, vocab)
        vocab = logp.size(1)
        _constrain(logp, t, min_len, (limits[active] - 1 <= t).repeat_interleave(width))
        if no_repeat_ngram:
            _block_repeated_ngrams(logp, alive_tokens, no_repeat_ngram)

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
        new_fin = norm.masked_fill(~finishing, NEG_INF)                           # (active, 2k)
        pool_scores = torch.cat([fin_scores[active], new_fin], dim=1)            # (active, 3k)
        fin_best, fin_pick = pool_scores.topk(k, dim=1)                           # (active, k)
        from_new = fin_pick >= k
        new_idx = (fin_pick - k).clamp(min=0)
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
        state = state.index_select(rows)

        # 3. A sentence is done when it has n_best finished and no alive beam can still beat the n_best-th.
        best_alive = alive_best[:, 0]                                             # (active,)
        bound = best_alive / length_penalty(limits[active].float(), alpha)       # best reachable normalised
        last_kept = fin_best[:, n_best - 1]                                       # (active,) the n_best-th finished
        done = (last_kept > NEG_INF) & (last_kept >= bound)
        done |= best_alive == NEG_INF                                             # nothing left to extend
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            keep_rows = (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            active = active[keep]
            prev, alive_scores, alive_tokens = prev[keep_rows], alive_scores[keep_rows], alive_tokens[keep_rows]
            if return_attention:
                alive_attn = alive_attn[keep_rows]
            state, memory = state.index_select(keep_rows), memory.index_select(keep)

    return _collect_beams(fin_tokens, fin_lengths, fin_scores, fin_attn, src_lengths, n_best)


def _collect_beams(tokens: Tensor, lengths: Tensor, scores: Tensor, attention: Tensor | None,
                   src_lengths: Tensor, n_best: int) -> list[list[Hypothesis]]:
    tokens_l, lengths_l = tokens[:, :n_best].tolist(), lengths[:, :n_best].tolist()
    scores_l = scores[:, :n_best].tolist()
    out = []
    for i in range(len(tokens_l)):
        hyps = []
        for j in range(n_best):
            n = lengths_l[i][j]
            if scores_l[i][j] == NEG_INF:
                continue
            weights = attention[i, j, :n, : int(src_lengths[i])].cpu() if attention is not None else None
            hyps.append(Hypothesis(tokens_l[i][j][: n - 1], scores_l[i][j], weights))
        out.append(hyps)
    return out
