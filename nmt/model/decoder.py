"""The decoders' common part (Bahdanau's in nmt.model.bahdanau, Luong's in nmt.model.luong): `memory` once per
batch, `step_features` one token as the equations read (scheduled sampling), `teacher_forced` a whole reference
with what it can for all steps at once. Decoding's faster step (nmt.decode.steps) uses these parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import autocast_once
from nmt.model.attention import Attention, Memory
from nmt.model.encoder import Dropout
from nmt.model.recurrent import RecurrentStack


@dataclass
class DecoderState:
    hidden: Tensor              # (layers, batch, dec_hidden) s; the GRU state or the LSTM h
    cell: Tensor | None = None  # (layers, batch, dec_hidden) LSTM cell; None for GRU
    feed: Tensor | None = None  # (batch, dec_hidden) h̃_{i-1} for Luong input feeding

    def index_select(self, index: Tensor) -> DecoderState:
        return DecoderState(self.hidden.index_select(1, index),
                            None if self.cell is None else self.cell.index_select(1, index),
                            None if self.feed is None else self.feed.index_select(0, index))

    @property
    def top(self) -> Tensor:
        """(batch, dec_hidden) the top layer's state."""
        return self.hidden[-1]


class Decoder(nn.Module):
    """Shared parts: target embeddings E, the RNN, the output layer W_s and its dropout."""

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: Attention, context_size: int, dropout: float, rnn_input_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding_dim)
        self.dropout = Dropout(dropout)
        self.rnn = RecurrentStack(rnn_type, rnn_input_size, hidden, layers, dropout)
        self.attention = attention
        self.embedding_dim, self.hidden_size, self.context_size = embedding_dim, hidden, context_size
        self.output = nn.Linear(hidden, vocab_size)                    # W_s: h̃ -> logits

    def memory(self, values: Tensor, mask: Tensor) -> Memory:
        """The annotations h_j (batch, src_len, enc_out), cast once, and the keys, projected once per batch."""
        values = autocast_once(values)
        return Memory(values, self.attention.project_keys(values), mask)

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        return DecoderState(hidden, cell, None)

    def token_projection(self) -> tuple[Tensor, Tensor]:
        """Weight (terms, emb) and bias (terms,) of the terms of the input token alone: W_e, b_i, and subclasses'."""
        return self.rnn.input_weight(0, self.embedding_dim), self.rnn.input_bias()

    def token_terms(self, tokens: Tensor) -> Tensor:
        """tokens: (batch, [steps]) -> W dropout(E y) + b: (batch, [steps], terms), from `token_projection`."""
        return F.linear(self.dropout(self.embed(tokens)), *self.token_projection())

    def step_features(self, prev_tokens: Tensor, state: DecoderState,
                      memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (batch,) -> h̃ (batch, dec_hidden), new state, attention weights (batch, src_len)."""
        raise NotImplementedError

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """All steps with the reference as input: h̃ (batch, tgt_len, dec_hidden), weights (batch, tgt_len, src_len)."""
        raise NotImplementedError

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (batch,) -> logits W_s dropout(h̃) + b_s (batch, vocab), new state, weights (batch, src_len)."""
        attn_hidden, state, weights = self.step_features(prev_tokens, state, memory)
        return self.output(self.dropout(attn_hidden)), state, weights

    def forward(self, tgt_in: Tensor, state: DecoderState, memory: Memory, teacher_forcing: float = 1.0,
                features_only: bool = False) -> tuple[Tensor, Tensor]:
        """tgt_in: (batch, tgt_len) BOS y_1 .. y_{n} -> logits (batch, tgt_len, vocab) (`features_only`: the output
        layer's input, for nmt.train.loss) and weights (batch, tgt_len, src_len). teacher_forcing < 1: scheduled
        sampling, each row's next input its own prediction with probability 1 - ratio."""
        if teacher_forcing >= 1.0:
            attn_hidden, weights = self.teacher_forced(tgt_in, state, memory)
            features = self.dropout(attn_hidden)
            return (features if features_only else self.output(features)), weights
        outputs, weight_steps = [], []
        tokens = tgt_in[:, 0]
        for i in range(tgt_in.size(1)):
            attn_hidden, state, weights = self.step_features(tokens, state, memory)
            features = self.dropout(attn_hidden)
            logits = self.output(features)
            outputs.append(features if features_only else logits)
            weight_steps.append(weights)
            if i + 1 < tgt_in.size(1):
                use_gold = torch.rand(tokens.shape, device=tokens.device) < teacher_forcing
                tokens = torch.where(use_gold, tgt_in[:, i + 1], logits.argmax(-1))
        return torch.stack(outputs, 1), torch.stack(weight_steps, 1)
