"""Luong's decoder: step the RNN, then attend with the new state (see `LuongDecoder`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import autocast_once
from nmt.model.attention import Attention, Memory, masked_softmax
from nmt.model.decoder import Decoder, DecoderState


class LuongDecoder(Decoder):
    """Luong et al. (2015): attention from the current state, then the attentional hidden state.

        s_i = RNN([E y_{i-1}; h̃_{i-1}], s_{i-1})      (h̃_{i-1} only with input feeding)
        e_ij = score(s_i, h_j),   α_i = softmax_j(e_ij),   c_i = Σ_j α_ij h_j
        h̃_i = tanh(W_c [c_i; s_i])
        p(y_i) = softmax(W_s h̃_i)
    """

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: Attention, context_size: int, dropout: float, input_feeding: bool) -> None:
        super().__init__(vocab_size, embedding_dim, hidden, layers, rnn_type, attention, context_size, dropout,
                         rnn_input_size=embedding_dim + (hidden if input_feeding else 0))
        self.input_feeding = input_feeding
        self.combine = nn.Linear(context_size + hidden, hidden, bias=False)   # W_c

    def feed_weight(self) -> Tensor:
        """W_f (gates*dec_hidden, dec_hidden): the view of layer 0's input weights that multiplies h̃_{i-1}."""
        return self.rnn.input_weight(self.embedding_dim, self.embedding_dim + self.hidden_size)

    def zero_feed_weights(self) -> None:
        """W_f = 0 at initialisation: with U(-0.1, 0.1) weights W_f h̃_{i-1} is ~12x W_e E y_{i-1} and drowns the
        previous word; zero, Multi30k dev perplexity at update 500 fell from 12.4 to 10.5 (docs/benchmarks.md)."""
        if self.input_feeding:
            with torch.no_grad():
                self.feed_weight().zero_()

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        feed = hidden.new_zeros(hidden.shape[1:]) if self.input_feeding else None   # h̃_0 = 0
        return DecoderState(hidden, cell, feed)

    def _attentional(self, s: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """h̃ = tanh(W_c [c; s]) and α for states s: (batch, [tgt_len,] dec_hidden)."""
        context, weights = self.attention(s, memory)                    # (batch, [tgt_len,] enc_out) c
        return torch.tanh(self.combine(torch.cat([context, s], dim=-1))), weights

    def step_features(self, prev_tokens: Tensor, state: DecoderState,
                      memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        embedded = self.dropout(self.embed(prev_tokens))                 # (rows, emb) E y_{i-1}
        rnn_in = embedded if state.feed is None else torch.cat([embedded, state.feed], dim=-1)   # h̃_{i-1} fed
        gi0 = F.linear(rnn_in, self.rnn.input_weight(0, rnn_in.size(-1)), self.rnn.input_bias())
        s, hidden, cell = self.rnn.step(gi0, state.hidden, state.cell)   # (rows, dec_hidden) s_i
        energies = self.attention.score(memory.group(s), memory.keys)     # (batch, rows/batch, src_len) e_ij
        alpha = masked_softmax(energies, memory.pad_bias)                # α_i, zero at the padding
        context = memory.weighted_sum(alpha, memory.values, s.shape)     # (rows, enc_out) c_i
        attn_hidden = torch.tanh(self.combine(torch.cat([context, s], dim=-1)))   # (rows, dec_hidden) h̃_i
        feed = attn_hidden if self.input_feeding else None
        return attn_hidden, DecoderState(hidden, cell, feed), alpha.view(s.size(0), -1)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """Without input feeding, one RNN call and one attention for all steps; with it, step by step."""
        if not self.input_feeding:
            embedded = self.dropout(self.embed(tgt_in))                 # (batch, tgt_len, emb)
            s_all, _, _ = self.rnn(embedded, state.hidden, state.cell)  # (batch, tgt_len, dec_hidden)
            return self._attentional(s_all, memory)
        feed_weight = autocast_once(self.feed_weight())
        hiddens, weights = [], []
        hidden, cell, attn_hidden = state.hidden, state.cell, state.feed
        assert attn_hidden is not None                                  # h̃_0
        for input_t in self.token_terms(tgt_in).unbind(1):
            gi0 = input_t + F.linear(attn_hidden, feed_weight)          # + W_f h̃_{i-1}
            s, hidden, cell = self.rnn.step(gi0, hidden, cell)
            attn_hidden, alpha = self._attentional(s, memory)
            hiddens.append(attn_hidden)
            weights.append(alpha)
        return torch.stack(hiddens, 1), torch.stack(weights, 1)
