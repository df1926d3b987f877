"""Several models decoding as one: every search and `force_decode` run an ensemble unchanged. The members share
the vocabularies, keep their own memory and state, and step on the same rows; attention is their average.

    log p_ens(y_i | y_<i, x) = log softmax( (1/M) Σ_m log p_m(y_i | y_<i, x) )

renormalised by the search's log-softmax: a normalised geometric mean, its argmax the plain average's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from nmt.decode.steps import Decoding, picked_log_probs
from nmt.model.seq2seq import Seq2Seq


@dataclass
class Members:
    """The members' memories or decoder states, reordered together."""

    members: list[Any]          # Memory or DecoderState each

    def index_select(self, index: Tensor) -> Members:
        return Members([member.index_select(index) for member in self.members])


@dataclass
class EnsembleDecoding:
    """The members' steps as one: averaged log-probabilities in place of logits."""

    members: list[Decoding]

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Members, Members]:
        encoded = [member.encode(src, src_lengths, fold_context) for member in self.members]
        return Members([m for m, _ in encoded]), Members([s for _, s in encoded])

    def step(self, prev_tokens: Tensor, state: Members, memory: Members) -> tuple[Tensor, Members, Tensor]:
        """prev_tokens: (rows,) -> mean log-probabilities (rows, vocab), new state, mean attention (rows, src_len)."""
        steps = [member.step(prev_tokens, member_state, member_memory) for member, member_state, member_memory
                 in zip(self.members, state.members, memory.members, strict=True)]
        logp = torch.stack([logits.log_softmax(-1, dtype=torch.float32) for logits, _, _ in steps]).mean(0)
        return logp, Members([s for _, s, _ in steps]), torch.stack([alpha.float() for _, _, alpha in steps]).mean(0)

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        return self.members[0].vocab_ids(tokens)

    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Teacher-forced log p (batch, tgt_len) of each tgt_out token under the renormalised mean."""
        logits = [member.forced_logits(src, src_lengths, tgt_in) for member in self.members]

        def log_probs(rows: slice) -> Tensor:
            return torch.stack([m[rows].log_softmax(-1, dtype=torch.float32) for m in logits]).mean(0).log_softmax(-1)

        return picked_log_probs(log_probs, tgt_out, logits[0].size(-1))

    def with_output_subset(self, keep: Tensor) -> EnsembleDecoding:
        """Every member scores only the target ids `keep` (see `Decoding.with_output_subset`)."""
        return EnsembleDecoding([member.with_output_subset(keep) for member in self.members])


class Ensemble(nn.Module):
    """The members as one module (moved, put in eval mode together); `decoding` gives what searches take."""

    def __init__(self, models: list[Seq2Seq]) -> None:
        super().__init__()
        vocabs = {model.decoder.output.out_features for model in models}
        if len(vocabs) != 1:
            raise ValueError(f"ensemble members have different target vocabulary sizes {sorted(vocabs)}")
        self.members = nn.ModuleList(models)

    def decoding(self, members: list[Decoding] | None = None) -> EnsembleDecoding:
        """The members' `Decoding`s (one each, e.g. with int8 products), else a new one each."""
        return EnsembleDecoding(members or [Decoding(cast(Seq2Seq, model)) for model in self.members])
