"""Decoders: Bahdanau-style (attend, then step) and Luong-style (step, then attend).

Both expose the same interface: `memory` prepares what the decoder attends over once per batch,
`step` advances every row by one token (used by search and by scheduled sampling), and
`forward` runs a whole teacher-forced target, computing what it can for all steps at once:
embeddings and their RNN input projection, the output layer, and for Luong without input
feeding also the RNN and the attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.attention import AdditiveAttention, Attention, Memory, at_real_positions
from nmt.model.dropout import Dropout
from nmt.model.inference import Inference, active, autocast_once, int8_product
from nmt.model.output_rows import padded_rows
from nmt.model.recurrent import RecurrentStack
from nmt.model.shared_grads import SharedGrads


@dataclass
class DecoderState:
    hidden: Tensor              # (layers, batch, dec_hidden) s; the GRU state or the LSTM h
    cell: Tensor | None = None  # (layers, batch, dec_hidden) LSTM cell; None for GRU
    feed: Tensor | None = None  # (batch, dec_hidden) h̃_{i-1} for Luong input feeding

    def index_select(self, index: Tensor) -> DecoderState:
        pick = lambda t, dim: None if t is None else t.index_select(dim, index)  # noqa: E731
        return DecoderState(pick(self.hidden, 1), pick(self.cell, 1), pick(self.feed, 0))

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
        self._block: Inference | None = None          # the context of an open `frozen_weights` block

    @contextmanager
    def frozen_weights(self) -> Iterator[Inference]:
        """A block whose calls that pass no `Inference` (`forward`, `memory`, `step`) use one made for it:
        for nmt.train's validation, which runs the model in inference while it trains. Blocks nest (the
        outermost's context serves); one thread only. Decoding passes its own `Inference` instead."""
        outer = self._block
        if outer is None:
            self._block = Inference()
        try:
            yield self._block
        finally:
            if outer is None:
                self._block = None

    def context(self, ctx: Inference | None) -> Inference | None:
        """The context a call uses: its own, else a `frozen_weights` block's; None in training (gradients on)."""
        return active(ctx if ctx is not None else self._block)

    def with_output_subset(self, ctx: Inference, keep: Tensor) -> Inference:
        """`ctx` for a batch whose `step` scores only the target ids `keep` (see `Inference.with_output_rows`)."""
        return ctx.with_output_rows(self.output, keep)

    def derived_weight(self, name: str, build: Callable[[], Tensor], ctx: Inference | None) -> Tensor:
        """A weight built from parameters (a slice, a stack, a product), cast for autocast; kept in the
        context's cache in inference, rebuilt at every call without one (training)."""
        if ctx is None:
            return autocast_once(build())
        return ctx.derived(name, self.output.weight.device.type, build)

    def int8_weights(self) -> dict[str, tuple[Tensor, Tensor | None]]:
        """The weight (out, in) and bias of every matrix product a decoding step makes, by name, for
        `nmt.decode.quantize` to replace with int8 ones; subclasses add theirs."""
        weights = {"output": (self.output.weight, self.output.bias)}
        keys = self.attention.key_weights()
        if keys is not None:
            weights["keys"] = keys
        return weights

    def memory(self, values: Tensor, mask: Tensor, fold_context: bool = True,
               ctx: Inference | None = None) -> Memory:
        """What every step attends over, with the attention keys projected once per batch.

        `fold_context`: whether products with the context c_i may be folded into the memory (W c_i =
        Σ_j α_ij W h_j, W h_j once per batch; Bahdanau's decoder does). That pays when a sentence's memory
        serves several rows per step (beam search) or all steps at once (training: `teacher_forced` needs
        it). Greedy search passes False: with one row per sentence, W c_i per step costs about as many
        products as W h_j per batch, and a step reads a 4x narrower memory.
        Under autocast the annotations are cast here, once: every step's products would cast them again."""
        values = autocast_once(values)                                   # (batch, src_len, enc_out)
        if not self.attention.projects_keys:
            return Memory(values, values, mask)
        keys, = at_real_positions(values, mask, self._keys_product(self.context(ctx)))
        return Memory(values, keys, mask)

    def _keys_product(self, ctx: Inference | None) -> Callable[[Tensor], Tensor]:
        """h_j -> the attention keys: the int8 product when decoding in int8, else `attention.project_keys`."""
        return int8_product("keys", ctx) or self.attention.project_keys

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        return DecoderState(hidden, cell, None)

    def token_projection(self) -> tuple[Tensor, Tensor]:
        """Weight (terms, emb) and bias (terms,) of the step's terms that depend on the input token
        alone; here the RNN's W_e and b_i (layer 0), subclasses append their own."""
        return self.rnn.input_weight(0, self.embedding_dim), self.rnn.input_bias()

    def token_terms(self, tokens: Tensor, ctx: Inference | None = None) -> Tensor:
        """tokens: (batch, [steps]) -> W dropout(E y) + b: (batch, [steps], terms), from `token_projection`.

        In inference with a context (eval mode, no gradients, so no dropout) this is a lookup in a
        table with one row per vocabulary entry, built once, instead of a matrix product per step.
        """
        if ctx is None or self.training:
            return F.linear(self.dropout(self.embed(tokens)), *self.token_projection())
        table = self.derived_weight("token_table", lambda: F.linear(self.embed.weight, *self.token_projection()),
                                    ctx)
        return F.embedding(tokens, table)

    def step_features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory,
                      ctx: Inference | None = None) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (batch,) -> h̃ (batch, dec_hidden), new state, attention weights (batch, src_len).
        `ctx`: an active context (see `context`) or None."""
        raise NotImplementedError

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory,
                       ctx: Inference | None = None) -> tuple[Tensor, Tensor]:
        """All steps with the reference as input: h̃ (batch, tgt_len, dec_hidden), weights (batch, tgt_len, src_len)."""
        raise NotImplementedError

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory,
             ctx: Inference | None = None) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (batch,) -> logits (batch, vocab), new state, attention weights (batch, src_len).

        In a context with an output subset (`with_output_subset`), tokens and logits index the subset:
        logits (batch, subset)."""
        ctx = self.context(ctx)
        if ctx is not None and ctx.subset is not None:
            keep, product = ctx.subset
            attn_hidden, state, weights = self.step_features(keep[prev_tokens], state, memory, ctx)
            return product(self.dropout(attn_hidden)), state, weights
        attn_hidden, state, weights = self.step_features(prev_tokens, state, memory, ctx)
        return self._logits(self.dropout(attn_hidden), ctx), state, weights

    def _logits(self, features: Tensor, ctx: Inference | None) -> Tensor:
        """W_s h̃ + b_s: (rows, dec_hidden) -> (rows, vocab). In inference with a context, the int8 product
        or W_s padded to a multiple of 16 rows (built once; see nmt.model.output_rows), its logits cut
        back to the vocabulary (a view: every search takes a log-softmax of it first)."""
        if int8 := int8_product("output", ctx):
            return int8(features)
        if ctx is None:
            return self.output(features)
        weight = self.derived_weight("padded_output", lambda: padded_rows(self.output.weight), ctx)
        bias = None if self.output.bias is None else self.derived_weight(
            "padded_output_bias", lambda: padded_rows(self.output.bias), ctx)
        return F.linear(features, weight, bias)[:, : self.output.out_features]

    def forward(self, tgt_in: Tensor, state: DecoderState, memory: Memory, teacher_forcing: float = 1.0,
                features_only: bool = False, ctx: Inference | None = None) -> tuple[Tensor, Tensor]:
        """tgt_in: (batch, tgt_len) BOS y_1 .. y_{n}.

        returns logits (batch, tgt_len, vocab) and attention weights (batch, tgt_len, src_len);
        with `features_only`, the output layer's input (dropout applied) instead of the logits,
        for a loss that fuses the output layer (nmt.train.loss).
        With teacher_forcing < 1 each row's next input is, with probability 1 - ratio, the
        model's own previous prediction instead of the reference token (scheduled sampling).
        """
        ctx = self.context(ctx)
        if teacher_forcing >= 1.0:
            attn_hidden, weights = self.teacher_forced(tgt_in, state, memory, ctx)
            features = self.dropout(attn_hidden)
            return (features if features_only else self.output(features)), weights
        outputs, weight_steps = [], []
        tokens = tgt_in[:, 0]
        for i in range(tgt_in.size(1)):
            attn_hidden, state, weights = self.step_features(tokens, state, memory, ctx)
            features = self.dropout(attn_hidden)
            logits = self.output(features)
            outputs.append(features if features_only else logits)
            weight_steps.append(weights)
            if i + 1 < tgt_in.size(1):
                use_gold = torch.rand(tokens.shape, device=tokens.device) < teacher_forcing
                tokens = torch.where(use_gold, tgt_in[:, i + 1], logits.argmax(-1))
        return torch.stack(outputs, 1), torch.stack(weight_steps, 1)


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
                shared: SharedGrads | None) -> tuple[Tensor | None, Tensor]:
        """α_i from s_{i-1} (rows, dec_hidden): the weights (batch, rows per sentence, src_len) and, with one
        layer, the RNN's W_h s_{i-1} + b_h (rows, gates*dec_hidden) from the same product (else None)."""
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
            gh0 = projected[:, :gates] + self.rnn.hidden_bias(0)
        return gh0, self.attention.projected_weights(memory.group(projected[:, gates:]), memory)

    def _recurrence(self, input_proj: Tensor, state: DecoderState, memory: Memory, fused: Tensor | None,
                    ctx: Inference | None, shared: SharedGrads | None = None) -> tuple[DecoderState, Tensor]:
        """Teacher forcing's step: attend with s_{i-1}, then step the RNN. input_proj: (rows, gates*dec_hidden) =
        W_e E y_{i-1} + b_i. `shared`: in training on the CPU, the products with [W_h; W_a] and W_ctx h_j go
        through it. Returns the new state and the weights (rows, src_len); W_cc c_i is left to the caller."""
        s_prev = state.top                                              # (rows, dec_hidden)
        gh0, weights = self._attend(s_prev, memory, fused, ctx, shared)
        if shared is not None:
            context_in = shared.weighted_sum(weights, s_prev.shape)
        else:                                                           # Σ_j α_ij W_ctx h_j
            context_in = memory.weighted_sum(weights, self._split_terms(memory.context_terms)[0], s_prev.shape)
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
        fused = self._step_weights(ctx)
        shared = None
        # Their gradients once, after the loop: on the CPU, where per-step products with `batch` rows are slow.
        # A CUDA step is bound by kernel launches instead, and the extra autograd nodes cost more than they save.
        if fused is not None and torch.is_grad_enabled() and tgt_in.device.type == "cpu":
            shared = SharedGrads(fused, self._split_terms(memory.context_terms)[0])
            state = replace(state, hidden=shared.attach(state.hidden))
        states, weights = [], []
        for input_t in token_in.unbind(1):                              # the recurrence needs s_{i-1}
            state, alpha = self._recurrence(input_t, state, memory, fused, ctx, shared)
            states.append(state.top)
            weights.append(alpha)
        s_all, alphas = torch.stack(states, 1), torch.stack(weights, 1)  # (batch, tgt_len, dec_hidden / src_len)
        # W_ce E y + b_c + W_cc c_i for all steps, one product
        terms = torch.baddbmm(token_out, alphas, self._split_terms(memory.context_terms)[1])
        return self._pre_output(s_all, terms, ctx), alphas


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
        combine = int8_product("combine", ctx) or self.combine
        return torch.tanh(combine(torch.cat([context, s], dim=-1))), weights   # h̃ (batch, [tgt_len,] hidden)

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
        s, hidden, cell = self.rnn.step(gi0, state.hidden, state.cell)
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
