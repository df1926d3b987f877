"""Luong's decoder: step the RNN, then attend with the new state (see `LuongDecoder`)."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.attention import Attention, Memory
from nmt.model.decoder import Decoder, DecoderState
from nmt.model.inference import Inference, int8_product


class LuongDecoder(Decoder):
    """Luong et al. (2015): attention from the current state, then the attentional hidden state.

        s_i = RNN([E y_{i-1}; h̃_{i-1}], s_{i-1})      (h̃_{i-1} only with input feeding)
        α_i = softmax_j(score(s_i, h_j)),   c_i = Σ_j α_ij h_j
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
        """W_f: (gates*dec_hidden, dec_hidden), the columns of the RNN's layer-0 input weights that
        multiply h̃_{i-1} (a view; only with input feeding)."""
        return self.rnn.input_weight(self.embedding_dim, self.embedding_dim + self.hidden_size)

    def zero_feed_weights(self) -> None:
        """Start input feeding's weights W_f at zero (called once, after initialisation).

        With U(-0.1, 0.1) weights, h̃ (mean |h̃| per element ≈ 0.4) feeds back into the RNN through W_f
        and drowns the target embedding: at initialisation the feed term W_f h̃_{i-1} is about 12 times
        larger than W_e E y_{i-1}, so the untrained decoder barely sees its previous word. Starting W_f
        at zero lets the RNN learn from the embeddings first and the feed as it becomes useful: on
        Multi30k dev perplexity at update 500 fell from 12.4 to 10.5 (BLEU 25.4 -> 27.1; see
        docs/benchmarks.md, "Converged quality"). Measured with `init: uniform`; `init: default`
        starts W_f at zero too, unmeasured.
        """
        if self.input_feeding:
            with torch.no_grad():
                self.feed_weight().zero_()

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        feed = hidden.new_zeros(hidden.shape[1:]) if self.input_feeding else None   # h̃_0 = 0
        return DecoderState(hidden, cell, feed)

    def int8_weights(self) -> dict[str, tuple[Tensor, Tensor | None]]:
        weights = super().int8_weights()
        weights["combine"] = (self.combine.weight, None)
        if self.input_feeding:
            weights["feed_input"] = (self.feed_weight(), None)
        return weights

    def _attentional(self, s: Tensor, memory: Memory, ctx: Inference | None) -> tuple[Tensor, Tensor]:
        context, weights = self.attention(s, memory)                    # (batch, [tgt_len,] enc_out)
        return torch.tanh(self._combine(torch.cat([context, s], dim=-1), ctx)), weights   # h̃ (batch, [tgt_len,] dec)

    def _combine(self, both: Tensor, ctx: Inference | None) -> Tensor:
        """W_c [c_i; s_i]: the context's int8 product, or W_c cast for autocast once per context (a CUDA
        graph's capture would cast a parameter at every step), or, in training, the layer."""
        int8 = int8_product("combine", ctx)
        if int8 or ctx is None:
            return (int8 or self.combine)(both)
        return F.linear(both, self.derived_weight("combine", lambda: self.combine.weight, ctx))

    def _hidden_terms(self, hidden: Tensor, ctx: Inference | None) -> Tensor | None:
        """Layer 0's W_h s_{i-1} + b_h with W_h, b_h cast once per context, as W_c; None in training, where
        the RNN step makes it. hidden: (layers, batch, dec_hidden) -> (batch, gates*dec_hidden)."""
        if ctx is None:
            return None
        weight = self.derived_weight("hidden_step", lambda: self.rnn.hidden_weight(0), ctx)
        return F.linear(hidden[0], weight, self.derived_weight("hidden_step_bias", self.rnn.hidden_bias, ctx))

    def _step_weights(self, ctx: Inference | None) -> Tensor | None:
        """W_f, the RNN input weights that multiply h̃_{i-1} (input feeding)."""
        if not self.input_feeding:
            return None
        return self.derived_weight("feed_input", self.feed_weight, ctx)

    def _recurrence(self, input_proj: Tensor, state: DecoderState, memory: Memory,
                    feed_weight: Tensor | None, ctx: Inference | None) -> tuple[DecoderState, Tensor]:
        """Step the RNN, then attend with s_i; returns the new state (h̃_i in `feed`) and α_i."""
        gi0 = input_proj
        if feed_weight is not None:                                     # + W_f h̃_{i-1}
            int8 = int8_product("feed_input", ctx)
            gi0 = gi0 + (int8(state.feed) if int8 else F.linear(state.feed, feed_weight))
        s, hidden, cell = self.rnn.step(gi0, state.hidden, state.cell, self._hidden_terms(state.hidden, ctx))
        attn_hidden, weights = self._attentional(s, memory, ctx)
        return DecoderState(hidden, cell, attn_hidden), weights

    def step_features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory,
                      ctx: Inference | None = None) -> tuple[Tensor, DecoderState, Tensor]:
        state, weights = self._recurrence(self.token_terms(prev_tokens, ctx), state, memory, self._step_weights(ctx),
                                          ctx)
        attn_hidden = state.feed
        if not self.input_feeding:
            state = replace(state, feed=None)
        return attn_hidden, state, weights

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory,
                       ctx: Inference | None = None) -> tuple[Tensor, Tensor]:
        if not self.input_feeding:                                      # fast path: no recurrence through h̃
            embedded = self.dropout(self.embed(tgt_in))                 # (batch, tgt_len, emb)
            s_all, _, _ = self.rnn(embedded, state.hidden, state.cell)  # one RNN call over all steps
            return self._attentional(s_all, memory, ctx)                # one batched attention
        feed_weight = self._step_weights(ctx)
        hiddens, weights = [], []
        for input_t in self.token_terms(tgt_in, ctx).unbind(1):         # W_e E y + b_i for all steps at once
            state, alpha = self._recurrence(input_t, state, memory, feed_weight, ctx)
            hiddens.append(state.feed)
            weights.append(alpha)
        return torch.stack(hiddens, 1), torch.stack(weights, 1)
