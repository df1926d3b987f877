"""Several models decoding as one: at every step, the average of their log-probabilities.

`Ensemble` offers what the searches use of a `Seq2Seq` (`encode`, `decoder.step`,
`decoder.frozen_weights`, and `forward` for teacher-forced scoring), so greedy search, beam
search, sampling and `force_decode` run an ensemble unchanged. The members share the source and
target vocabularies but may differ in everything else (attention, sizes, RNN type): each keeps its
own memory and state, and a step runs each member once on the same rows.

    log p_ens(y_i | y_<i, x) = log softmax( (1/M) Σ_m log p_m(y_i | y_<i, x) )

The average is renormalised (the search's log-softmax), so an ensemble's scores stay
log-probabilities of a distribution (a normalised geometric mean of the members'); its argmax is
the argmax of the plain average. Attention weights are the members' average.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.model.attention import Memory
from nmt.model.decoder import DecoderState
from nmt.model.seq2seq import Seq2Seq


@dataclass
class EnsembleMemory:
    members: list[Memory]

    def index_select(self, index: Tensor) -> EnsembleMemory:
        return EnsembleMemory([memory.index_select(index) for memory in self.members])


@dataclass
class EnsembleState:
    members: list[DecoderState]

    def index_select(self, index: Tensor) -> EnsembleState:
        return EnsembleState([state.index_select(index) for state in self.members])


class EnsembleDecoder:
    """One step of every member; returns the averaged log-probabilities in place of logits."""

    def __init__(self, models: list[Seq2Seq]) -> None:
        self.models = models

    @contextmanager
    def frozen_weights(self) -> Iterator[None]:
        with ExitStack() as stack:
            for model in self.models:
                stack.enter_context(model.decoder.frozen_weights())
            yield

    @contextmanager
    def output_subset(self, keep: Tensor) -> Iterator[None]:
        """Every member scores only the target ids `keep` (see `Decoder.output_subset`)."""
        with ExitStack() as stack:
            for model in self.models:
                stack.enter_context(model.decoder.output_subset(keep))
            yield

    def subset_ids(self, tokens: Tensor) -> Tensor:
        return self.models[0].decoder.subset_ids(tokens)

    def step(self, prev_tokens: Tensor, state: EnsembleState,
             memory: EnsembleMemory) -> tuple[Tensor, EnsembleState, Tensor]:
        """prev_tokens: (rows,) -> mean log-probabilities (rows, vocab), new state, mean attention (rows, src_len)."""
        logps, states, weights = [], [], []
        for model, member_state, member_memory in zip(self.models, state.members, memory.members, strict=True):
            logits, new_state, alpha = model.decoder.step(prev_tokens, member_state, member_memory)
            logps.append(logits.float().log_softmax(-1))
            states.append(new_state)
            weights.append(alpha.float())
        return torch.stack(logps).mean(0), EnsembleState(states), torch.stack(weights).mean(0)


class Ensemble(nn.Module):
    def __init__(self, models: list[Seq2Seq]) -> None:
        super().__init__()
        vocabs = {model.decoder.output.out_features for model in models}
        if len(vocabs) != 1:
            raise ValueError(f"ensemble members have different target vocabulary sizes {sorted(vocabs)}")
        self.members = nn.ModuleList(models)
        self.decoder = EnsembleDecoder(list(models))

    def encode(self, src: Tensor, src_lengths: Tensor,
               fold_context: bool = True) -> tuple[EnsembleMemory, EnsembleState]:
        encoded = [model.encode(src, src_lengths, fold_context) for model in self.members]
        return EnsembleMemory([m for m, _ in encoded]), EnsembleState([s for _, s in encoded])

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced: mean log-probabilities (batch, tgt_len, vocab), mean attention (batch, tgt_len, src_len)."""
        outputs = [model(src, src_lengths, tgt_in) for model in self.members]
        logp = torch.stack([logits.float().log_softmax(-1) for logits, _ in outputs]).mean(0)
        return logp, torch.stack([weights.float() for _, weights in outputs]).mean(0)
