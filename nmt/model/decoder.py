"""The decoders' common part; Bahdanau's (attend, then step) is in nmt.model.bahdanau, Luong's (step, then
attend) in nmt.model.luong.

Both expose the same interface: `memory` prepares what the decoder attends over once per batch,
`step` advances every row by one token (used by search and by scheduled sampling), and
`forward` runs a whole teacher-forced target, computing what it can for all steps at once:
embeddings and their RNN input projection, the output layer, and for Luong without input
feeding also the RNN and the attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.attention import Attention, Memory, at_real_positions
from nmt.model.dropout import Dropout
from nmt.model.inference import Inference, active, autocast_once, int8_product
from nmt.model.output_rows import padded_rows
from nmt.model.recurrent import RecurrentStack


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
