"""Bahdanau's decoder: attend with the previous state, then step the RNN (see `BahdanauDecoder`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import active_autocast_dtype
from nmt.model.attention import AdditiveAttention, Memory, at_real_positions
from nmt.model.decoder import Decoder, DecoderState
from nmt.model.inference import Inference, int8_product
from nmt.model.shared_grads import SharedGrads


def shares_grads(device: torch.device) -> bool:
    """Whether teacher forcing takes the gradients of its per-step products with [W_h; W_a] and W_ctx h_j
    once, after the loop (SharedGrads): on the CPU, where per-step products with `batch` rows are slow. A
    CUDA step is bound by kernel launches instead, and the extra autograd nodes cost more than they save."""
    return device.type == "cpu"


@dataclass
class _CastOnce:
    """Parameters every teacher-forced step reads, cast once per batch to the products' dtype under autocast.
    As float32 parameters, b_h would make the state float32 (and every step would cast it back for its
    products), and v_a would be cast at every step; each cast again in the backward pass."""

    hidden_bias: Tensor     # (gates*dec_hidden,) b_h
    v: Tensor               # (1, attn_dim) v_a

    @classmethod
    def make(cls, decoder: BahdanauDecoder, device: torch.device) -> _CastOnce:
        dtype = active_autocast_dtype(device.type)
        bias, v = decoder.rnn.hidden_bias(0), decoder.attention.v.weight
        return cls(bias, v) if dtype is None else cls(bias.to(dtype), v.to(dtype))


class BahdanauDecoder(Decoder):
    """Bahdanau et al. (2015): attention from the previous state, context fed into the RNN.

        α_i = softmax_j(v_aᵀ tanh(W_a s_{i-1} + U_a h_j)),   c_i = Σ_j α_ij h_j
        s_i = RNN([E y_{i-1}; c_i], s_{i-1})
        h̃_i = tanh(W_c [s_i; c_i; E y_{i-1}] + b_c)     (pre-output layer)
        p(y_i) = softmax(W_s h̃_i)

    Products with c_i are folded into the attention: W c_i = Σ_j α_ij (W h_j), and W h_j is
    computed once per batch (`Memory.context_terms`: the RNN input's W_ctx and the pre-output's
    W_cc, side by side), so a step costs one weighted sum instead of matrix products and c_i
    itself is never formed. Greedy search asks for an unfolded memory (`memory(fold_context=False)`):
    with one row per sentence the folding saves no products and makes every step read 4x more.
    The terms of E y_{i-1} (W_e E y + b_i, W_ce E y + b_c) come from `token_terms`: all steps at
    once in training, a table lookup in inference; a search step adds them inside the context's
    product. With one layer, W_a s_{i-1} and the RNN's W_h s_{i-1} are one matrix product.
    """

    attention: AdditiveAttention

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: AdditiveAttention, context_size: int, dropout: float) -> None:
        super().__init__(vocab_size, embedding_dim, hidden, layers, rnn_type, attention, context_size, dropout,
                         rnn_input_size=embedding_dim + context_size)
        self.pre_output = nn.Linear(hidden + context_size + embedding_dim, hidden)   # W_c = [W_cs, W_cc, W_ce]

    def _pre_output_weight(self, part: str) -> Tensor:
        """W_cs, W_cc or W_ce: the columns of W_c that multiply s_i, c_i or E y_{i-1}."""
        start = {"state": 0, "context": self.hidden_size, "embedding": self.hidden_size + self.context_size}[part]
        size = {"state": self.hidden_size, "context": self.context_size, "embedding": self.embedding_dim}[part]
        return self.pre_output.weight[:, start : start + size]

    def token_projection(self) -> tuple[Tensor, Tensor]:
        """[W_e; W_ce] and [b_i; b_c]: (gates*dec_hidden + dec_hidden, emb) and its bias."""
        weight, bias = super().token_projection()
        return (torch.cat([weight, self._pre_output_weight("embedding")]),
                torch.cat([bias, self.pre_output.bias]))

    def _context_weight(self) -> Tensor:
        """[W_ctx; W_cc] (gates*dec_hidden + dec_hidden, enc_out): the RNN input's columns for c_i and the
        pre-output's, one product for both."""
        return torch.cat([self.rnn.input_weight(self.embedding_dim, self.embedding_dim + self.context_size),
                          self._pre_output_weight("context")])

    def _context_product(self, inputs: Tensor, ctx: Inference | None, add: Tensor | None = None) -> Tensor:
        """[W_ctx; W_cc] x (+ add, for 2-D x): (..., enc_out) -> (..., gates*dec_hidden + dec_hidden), int8 when
        decoding in int8."""
        if int8 := int8_product("context", ctx):
            return int8(inputs) if add is None else int8(inputs) + add
        weight = self.derived_weight("context", self._context_weight, ctx)
        return F.linear(inputs, weight) if add is None else torch.addmm(add, inputs, weight.t())

    def memory(self, values: Tensor, mask: Tensor, fold_context: bool = True,
               ctx: Inference | None = None) -> Memory:
        """Keys 2·U_a h_j and, folded, [W_ctx; W_cc] h_j (`context_terms`) for every position; unfolded, a step
        forms c_i and multiplies it by [W_ctx; W_cc] instead."""
        if not fold_context:
            return super().memory(values, mask, ctx=ctx)
        ctx = self.context(ctx)
        # 2·U_a h_j and [W_ctx; W_cc] h_j over the real positions, one gather for both
        keys, context_terms = at_real_positions(values, mask, self._keys_product(ctx),
                                                lambda h: self._context_product(h, ctx))
        return Memory(values, keys, mask, context_terms)

    def _step_weights(self, ctx: Inference | None) -> Tensor | None:
        """[W_h; W_a], so that one product gives the RNN's W_h s_{i-1} and attention's W_a s_{i-1}."""
        if self.rnn.layers > 1:
            return None
        return self.derived_weight("hidden_and_query", self._hidden_and_query, ctx)

    def _hidden_and_query(self) -> Tensor:
        return torch.cat([self.rnn.hidden_weight(0), self.attention.query_proj.weight])

    def _hidden_and_query_bias(self) -> Tensor:
        """[b_h; 0]: the RNN's hidden bias and none for W_a s_{i-1}, added inside the product in inference."""
        bias = self.rnn.hidden_bias(0)
        return torch.cat([bias, bias.new_zeros(self.attention.query_proj.out_features)])

    def int8_weights(self) -> dict[str, tuple[Tensor, Tensor | None]]:
        weights = super().int8_weights()
        weights["context"] = (self._context_weight(), None)
        weights["pre_output_state"] = (self._pre_output_weight("state"), None)
        if self.rnn.layers == 1:
            weights["hidden_and_query"] = (self._hidden_and_query(), self._hidden_and_query_bias())
        return weights

    def _attend(self, s_prev: Tensor, memory: Memory, fused: Tensor | None, ctx: Inference | None,
                shared: SharedGrads | None, cast: _CastOnce | None = None) -> tuple[Tensor | None, Tensor]:
        """α_i from s_{i-1} (rows, dec_hidden): the weights (batch, rows per sentence, src_len) and, with one
        layer, the RNN's W_h s_{i-1} + b_h (rows, gates*dec_hidden) from the same product (else None).
        `cast`: teacher forcing's b_h and v_a in the products' dtype; else the float32 parameters."""
        if fused is None:
            return None, self.attention.projected_weights(memory.group(self.attention.query_proj(s_prev)), memory)
        gates = self.rnn.hidden_weight(0).size(0)
        if ctx is not None:                                             # inference: b_h inside the product
            int8 = int8_product("hidden_and_query", ctx)
            projected = int8(s_prev) if int8 else F.linear(s_prev, fused, self.derived_weight(
                "hidden_and_query_bias", self._hidden_and_query_bias, ctx))   # (rows, gates*dec_hidden + attn_dim)
            gh0 = projected[:, :gates]
        else:
            projected = shared.linear(s_prev) if shared is not None else F.linear(s_prev, fused)
            gh0 = projected[:, :gates] + (self.rnn.hidden_bias(0) if cast is None else cast.hidden_bias)
        return gh0, self.attention.projected_weights(memory.group(projected[:, gates:]), memory,
                                                     None if cast is None else cast.v)

    def _recurrence(self, input_proj: Tensor, state: DecoderState, memory: Memory, values_in: Tensor,
                    fused: Tensor | None, ctx: Inference | None, shared: SharedGrads | None = None,
                    cast: _CastOnce | None = None) -> tuple[DecoderState, Tensor]:
        """Teacher forcing's step: attend with s_{i-1}, then step the RNN. input_proj: (rows, gates*dec_hidden) =
        W_e E y_{i-1} + b_i; values_in: (batch, src_len, gates*dec_hidden) W_ctx h_j. `shared`: in training on
        the CPU, the products with [W_h; W_a] and W_ctx h_j go through it. Returns the new state and the
        weights (rows, src_len); W_cc c_i is left to the caller."""
        s_prev = state.top                                              # (rows, dec_hidden)
        gh0, weights = self._attend(s_prev, memory, fused, ctx, shared, cast)
        if shared is not None:
            context_in = shared.weighted_sum(weights, s_prev.shape)
        else:                                                           # Σ_j α_ij W_ctx h_j
            context_in = memory.weighted_sum(weights, values_in, s_prev.shape)
        _, hidden, cell = self.rnn.step(input_proj + context_in, state.hidden, state.cell, gh0)
        return DecoderState(hidden, cell), weights.view(s_prev.size(0), -1)

    def _pre_output(self, s: Tensor, terms: Tensor, ctx: Inference | None) -> Tensor:
        """h̃ = tanh(W_cs s + terms), terms = W_cc c + W_ce E y + b_c already summed; s: (rows, [steps,] dec_hidden)."""
        int8 = int8_product("pre_output_state", ctx)
        if int8:
            return torch.tanh(int8(s) + terms)
        state_weight = self.derived_weight("pre_output_state", lambda: self._pre_output_weight("state"), ctx)
        if s.dim() == 2:                                                # a step: the terms added in the product
            return torch.tanh(torch.addmm(terms, s, state_weight.t()))
        return torch.tanh(F.linear(s, state_weight) + terms)

    def _split_terms(self, terms: Tensor) -> tuple[Tensor, Tensor]:
        """Terms for the RNN input (gates*dec_hidden) and for the pre-output (dec_hidden) -> the two: token_terms
        into W_e E y + b_i and W_ce E y + b_c, context products into W_ctx c (or h_j) and W_cc c (or h_j)."""
        return terms.split([terms.size(-1) - self.hidden_size, self.hidden_size], dim=-1)

    def step_features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory,
                      ctx: Inference | None = None) -> tuple[Tensor, DecoderState, Tensor]:
        """The token terms [W_e E y + b_i; W_ce E y + b_c] are added inside the context's product: over a folded
        memory one batched product Σ_j α_ij [W_ctx; W_cc] h_j, over an unfolded one [W_ctx; W_cc] c_i."""
        s_prev = state.top                                              # (rows, dec_hidden)
        token_terms = self.token_terms(prev_tokens, ctx)                # (rows, gates*dec_hidden + dec_hidden)
        gh0, weights = self._attend(s_prev, memory, self._step_weights(ctx), ctx, None)
        if memory.context_terms is not None:
            terms = torch.baddbmm(memory.group(token_terms), weights, memory.context_terms).view(token_terms.shape)
        else:
            context = memory.weighted_sum(weights, memory.values, s_prev.shape)      # (rows, enc_out) c_i
            terms = self._context_product(context, ctx, add=token_terms)
        rnn_in, pre_output_terms = self._split_terms(terms)             # (rows, gates*dec_hidden | dec_hidden)
        _, hidden, cell = self.rnn.step(rnn_in, state.hidden, state.cell, gh0)
        state = DecoderState(hidden, cell)
        return self._pre_output(state.top, pre_output_terms, ctx), state, weights.view(s_prev.size(0), -1)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory,
                       ctx: Inference | None = None) -> tuple[Tensor, Tensor]:
        if memory.context_terms is None:
            raise ValueError("teacher-forced decoding needs a folded memory (Decoder.memory(fold_context=True))")
        token_in, token_out = self._split_terms(self.token_terms(tgt_in, ctx))   # (batch, tgt_len, ...), all steps
        values_in, values_out = self._split_terms(memory.context_terms)   # W_ctx h_j, W_cc h_j
        fused = self._step_weights(ctx)
        shared = None
        if fused is not None and torch.is_grad_enabled() and shares_grads(tgt_in.device):
            shared = SharedGrads(fused, values_in)
            state = replace(state, hidden=shared.attach(state.hidden))
        cast = _CastOnce.make(self, tgt_in.device) if fused is not None and ctx is None else None
        states, weights = [], []
        for input_t in token_in.unbind(1):                              # the recurrence needs s_{i-1}
            state, alpha = self._recurrence(input_t, state, memory, values_in, fused, ctx, shared, cast)
            states.append(state.top)
            weights.append(alpha)
        s_all, alphas = torch.stack(states, 1), torch.stack(weights, 1)  # (batch, tgt_len, dec_hidden / src_len)
        # W_ce E y + b_c + W_cc c_i for all steps, one product
        terms = torch.baddbmm(token_out, alphas, values_out)
        return self._pre_output(s_all, terms, ctx), alphas
