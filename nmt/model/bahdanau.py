"""Bahdanau's decoder: attend with the previous state, then step the RNN (see `BahdanauDecoder`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import autocast_once
from nmt.model.attention import AdditiveAttention, Memory, masked_softmax
from nmt.model.decoder import Decoder, DecoderState
from nmt.model.shared_grads import SharedGrads


def shares_grads(device: torch.device) -> bool:
    """Teacher forcing forms the gradients of [W_h; W_a] and W_ctx h_j once (SharedGrads) on the CPU, where
    per-step products with `batch` rows are slow; a CUDA step is bound by launches, which the nodes add."""
    return device.type == "cpu"


class BahdanauDecoder(Decoder):
    """Bahdanau et al. (2015): attention from the previous state, context fed into the RNN.

        e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j),   α_i = softmax_j(e_ij),   c_i = Σ_j α_ij h_j
        s_i = RNN([E y_{i-1}; c_i], s_{i-1})
        h̃_i = tanh(W_c [s_i; c_i; E y_{i-1}] + b_c)     (pre-output layer)
        p(y_i) = softmax(W_s h̃_i)

    `step_features` computes these as written. Teacher forcing folds products with c_i into the attention,
    W c_i = Σ_j α_ij (W h_j), with [W_ctx; W_cc] h_j once per batch (`Memory.context_terms`); the terms of
    E y_{i-1} are one product for all steps (`token_terms`); with one layer, [W_h; W_a] s_{i-1} is one product.
    """

    attention: AdditiveAttention

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: AdditiveAttention, context_size: int, dropout: float) -> None:
        super().__init__(vocab_size, embedding_dim, hidden, layers, rnn_type, attention, context_size, dropout,
                         rnn_input_size=embedding_dim + context_size)
        self.pre_output = nn.Linear(hidden + context_size + embedding_dim, hidden)   # W_c = [W_cs, W_cc, W_ce]

    def pre_output_weight(self, part: str) -> Tensor:
        """W_cs, W_cc or W_ce: the columns of W_c that multiply s_i, c_i or E y_{i-1}."""
        start = {"state": 0, "context": self.hidden_size, "embedding": self.hidden_size + self.context_size}[part]
        size = {"state": self.hidden_size, "context": self.context_size, "embedding": self.embedding_dim}[part]
        return self.pre_output.weight[:, start : start + size]

    def token_projection(self) -> tuple[Tensor, Tensor]:
        """[W_e; W_ce] (gates*dec_hidden + dec_hidden, emb) and [b_i; b_c]."""
        weight, bias = super().token_projection()
        return (torch.cat([weight, self.pre_output_weight("embedding")]),
                torch.cat([bias, self.pre_output.bias]))

    def context_weight(self) -> Tensor:
        """[W_ctx; W_cc] (gates*dec_hidden + dec_hidden, enc_out): the RNN input's and pre-output's c_i columns."""
        return torch.cat([self.rnn.input_weight(self.embedding_dim, self.embedding_dim + self.context_size),
                          self.pre_output_weight("context")])

    def hidden_and_query(self) -> Tensor:
        """[W_h; W_a] (gates*dec_hidden + attn_dim, dec_hidden): the RNN's and attention's s_{i-1} products."""
        return torch.cat([self.rnn.hidden_weight(0), self.attention.query_proj.weight])

    def hidden_and_query_bias(self) -> Tensor:
        """[b_h; 0]: the RNN's hidden bias, none for W_a s_{i-1}."""
        bias = self.rnn.hidden_bias(0)
        return torch.cat([bias, bias.new_zeros(self.attention.query_proj.out_features)])

    def split_terms(self, terms: Tensor) -> tuple[Tensor, Tensor]:
        """(..., gates*dec_hidden + dec_hidden) -> the RNN input's terms and the pre-output's."""
        return terms.split([terms.size(-1) - self.hidden_size, self.hidden_size], dim=-1)

    def memory(self, values: Tensor, mask: Tensor) -> Memory:
        """Keys 2·U_a h_j and the folded context terms [W_ctx; W_cc] h_j for every position."""
        context_terms = F.linear(values, autocast_once(self.context_weight()))   # (batch, src_len, terms)
        return Memory(values, self.attention.project_keys(values), mask, context_terms)

    def step_features(self, prev_tokens: Tensor, state: DecoderState,
                      memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        embedded = self.dropout(self.embed(prev_tokens))                 # (rows, emb) E y_{i-1}
        s_prev = state.top                                               # (rows, dec_hidden) s_{i-1}
        energies = self.attention.score(memory.group(s_prev), memory.keys)   # (batch, rows/batch, src_len) e_ij
        alpha = masked_softmax(energies, memory.pad_bias)                # α_i, zero at the padding
        context = memory.weighted_sum(alpha, memory.values, s_prev.shape)   # (rows, enc_out) c_i
        rnn_in = torch.cat([embedded, context], dim=-1)                  # (rows, emb + enc_out)
        gi0 = F.linear(rnn_in, self.rnn.input_weight(0, rnn_in.size(-1)), self.rnn.input_bias())
        s, hidden, cell = self.rnn.step(gi0, state.hidden, state.cell)   # (rows, dec_hidden) s_i
        attn_hidden = torch.tanh(self.pre_output(torch.cat([s, context, embedded], dim=-1)))   # h̃_i
        return attn_hidden, DecoderState(hidden, cell), alpha.view(s_prev.size(0), -1)

    def _attend(self, s_prev: Tensor, memory: Memory, fused: Tensor | None, shared: SharedGrads | None,
                cast: tuple[Tensor, Tensor] | None) -> tuple[Tensor | None, Tensor]:
        """s_{i-1} (rows, dec_hidden) -> with one layer W_h s_{i-1} + b_h (rows, gates*dec_hidden), else None;
        α_i (batch, rows/batch, src_len)."""
        if fused is None or cast is None:
            return None, self.attention.projected_weights(memory.group(self.attention.query_proj(s_prev)), memory)
        gates = self.rnn.hidden_weight(0).size(0)
        projected = shared.linear(s_prev) if shared is not None else F.linear(s_prev, fused)
        hidden_bias, v = cast
        gh0 = projected[:, :gates] + hidden_bias
        return gh0, self.attention.projected_weights(memory.group(projected[:, gates:]), memory, v)

    def recurrence(self, token_in: Tensor, state: DecoderState, attend: Callable[[Tensor], tuple[Tensor | None,
                                                                                                 Tensor]],
                   context_in: Callable[[Tensor, torch.Size], Tensor]) -> tuple[Tensor, Tensor]:
        """s_i for every step: `attend(s_{i-1})` as `_attend`; RNN input token_in (batch, tgt_len, gates*dec_hidden)
        + `context_in(α_i, shape)` = Σ_j α_ij W_ctx h_j. Returns s (batch, tgt_len, dec_hidden), α (batch, tgt_len,
        src_len)."""
        states, weights = [], []
        for input_t in token_in.unbind(1):                              # the recurrence needs s_{i-1}
            s_prev = state.top                                          # (rows, dec_hidden)
            gh0, alpha = attend(s_prev)
            _, hidden, cell = self.rnn.step(input_t + context_in(alpha, s_prev.shape), state.hidden, state.cell, gh0)
            state = DecoderState(hidden, cell)
            states.append(state.top)
            weights.append(alpha.view(s_prev.size(0), -1))
        return torch.stack(states, 1), torch.stack(weights, 1)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """Attend with s_{i-1}, then step the RNN, for every step; W_cc c_i and the pre-output for all at once."""
        if memory.context_terms is None:
            raise ValueError("teacher forcing needs the folded memory (BahdanauDecoder.memory)")
        token_in, token_out = self.split_terms(self.token_terms(tgt_in))   # (batch, tgt_len, ...), all steps
        values_in, values_out = self.split_terms(memory.context_terms)   # W_ctx h_j, W_cc h_j
        fused = autocast_once(self.hidden_and_query()) if self.rnn.layers == 1 else None
        shared = None
        if fused is not None and torch.is_grad_enabled() and shares_grads(tgt_in.device):
            shared = SharedGrads(fused, values_in)
            state = replace(state, hidden=shared.attach(state.hidden))
        # b_h (gates*dec_hidden,) and v_a (1, attn_dim), cast once per batch: as float32 parameters, b_h would
        # make the state float32 (every step casting it back), and v_a would be cast at every step, both ways
        cast = None if fused is None else (autocast_once(self.rnn.hidden_bias(0)),
                                           autocast_once(self.attention.v.weight))
        context_in = shared.weighted_sum if shared is not None else (
            lambda alpha, shape: memory.weighted_sum(alpha, values_in, shape))
        s_all, alphas = self.recurrence(token_in, state, lambda s: self._attend(s, memory, fused, shared, cast),
                                        context_in)
        terms = torch.baddbmm(token_out, alphas, values_out)              # W_ce E y + b_c + W_cc c_i, all steps
        state_weight = autocast_once(self.pre_output_weight("state"))
        return torch.tanh(F.linear(s_all, state_weight) + terms), alphas
