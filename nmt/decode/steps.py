"""The inference step a trained decoder builds once from its parameters, beside the model's equations:
the token table W E y + b, Bahdanau's fused [W_h; W_a] and folded [W_ctx; W_cc] h_j, W_s padded to 16s
rows, int8 products (nmt.decode.quantize) and shortlist views. Training rebuilds them at every update; a
`Decoding` builds them once per autocast dtype, so its model's parameters must not change while it lives
(validation builds one per validation: fused optimizers update in place without bumping versions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.special import PAD
from nmt.decode.quantize import Int8Linear, Int8Products, step_products
from nmt.device import active_autocast_dtype, autocast_once
from nmt.model.attention import AdditiveAttention, Memory
from nmt.model.bahdanau import BahdanauDecoder
from nmt.model.decoder import Decoder, DecoderState
from nmt.model.encoder import EncoderOutput
from nmt.model.luong import LuongDecoder
from nmt.model.output_rows import padded_rows
from nmt.model.seq2seq import Seq2Seq

Product = Callable[[Tensor], Tensor]
FORCED_CHUNK_ELEMENTS = 2**24     # scoring: float32 log-probabilities made at once (64 MiB), whatever the batch


def at_real_positions(values: Tensor, mask: Tensor, *projections: Product) -> list[Tensor]:
    """(batch, src_len, d) -> (batch, src_len, d') with zeros at the padding, which attention masks: a greedy
    batch is about a quarter padding. A trace (ONNX) projects everything: the same where attention looks."""
    if torch.is_grad_enabled() or torch.jit.is_tracing() or bool(mask.all()):
        return [project(values) for project in projections]
    real = values[mask]                                                  # (real positions, d)
    outputs = []
    for project in projections:
        projected = project(real)                                        # (real positions, d')
        padded = projected.new_zeros(*mask.shape, projected.size(-1))
        padded[mask] = projected
        outputs.append(padded)
    return outputs


@dataclass
class FloatLinear:
    weight: Tensor              # (out, in), cast once under autocast
    bias: Tensor | None = None  # (out,)

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def add(self, terms: Tensor, x: Tensor) -> Tensor:
        """terms + x Wᵀ for 2-D x, in the same kernel (as Int8Linear.add)."""
        return torch.addmm(terms, x, self.weight.t())


Linear = FloatLinear | Int8Linear     # a product a step makes


def _float(weight: Tensor, bias: Tensor | None = None) -> FloatLinear:
    return FloatLinear(autocast_once(weight), None if bias is None else autocast_once(bias))


def padded_output(weight: Tensor, bias: Tensor | None) -> FloatLinear:
    """W_s (or a shortlist's rows) padded to 16s rows (nmt.model.output_rows); callers cut the logits back."""
    return _float(padded_rows(weight), None if bias is None else padded_rows(bias))


@dataclass
class _Step:
    token_table: Tensor        # (tgt_vocab, terms) the step's terms of each input token, W E y + b
    output: Linear             # h̃ -> logits: W_s padded to 16s rows, or int8
    keys: Product | None       # h_j -> attention keys; None where the annotations are the keys (Luong dot)

    @staticmethod
    def products(decoder: Decoder, int8: Int8Products | None) -> dict[str, Any]:
        """The token table, output, keys and the products `step_products` names: int8 where there are, else
        float from the same weights."""
        attention, layer = decoder.attention, decoder.output
        keys: Product | None = int8.keys if int8 is not None else None
        if keys is None and isinstance(attention, AdditiveAttention):   # float32 keys: see AdditiveAttention
            keys = lambda h: attention.project_keys(h).float()  # noqa: E731
        products = {name: getattr(int8, name) if int8 is not None else _float(weight, bias)
                    for name, (weight, bias) in step_products(decoder).items()}
        return {"token_table": autocast_once(F.linear(decoder.embed.weight, *decoder.token_projection())),
                "output": int8.output if int8 is not None else padded_output(layer.weight, layer.bias),
                "keys": keys or (attention.project_keys if attention.projects_keys else None), **products}

    def memory(self, values: Tensor, mask: Tensor, fold_context: bool) -> Memory:
        """The annotations (batch, src_len, enc_out), cast once under autocast, and their keys."""
        values = autocast_once(values)
        if self.keys is None:
            return Memory(values, values, mask)
        keys, = at_real_positions(values, mask, self.keys)
        return Memory(values, keys, mask)


@dataclass
class BahdanauStep(_Step):
    decoder: BahdanauDecoder
    context: Linear                        # [W_ctx; W_cc] (gates*dec_hidden + dec_hidden, enc_out)
    pre_output_state: Linear               # W_cs (dec_hidden, dec_hidden)
    hidden_and_query: Linear | None = None  # [W_h; W_a] (gates*dec_hidden + attn_dim, dec_hidden), [b_h; 0]; 1 layer

    @classmethod
    def build(cls, decoder: BahdanauDecoder, int8: Int8Products | None) -> BahdanauStep:
        return cls(**cls.products(decoder, int8), decoder=decoder)

    def memory(self, values: Tensor, mask: Tensor, fold_context: bool) -> Memory:
        """Folded: keys 2·U_a h_j and [W_ctx; W_cc] h_j for every position. Unfolded (greedy: one row per
        sentence, where folding saves no products and makes every step read 4x more): c_i per step."""
        if not fold_context:
            return super().memory(values, mask, fold_context)
        assert self.keys is not None
        keys, context_terms = at_real_positions(values, mask, self.keys, self.context)
        return Memory(values, keys, mask, context_terms)

    def _attend(self, s_prev: Tensor, memory: Memory) -> tuple[Tensor | None, Tensor]:
        """α_i (batch, rows per sentence, src_len) from s_{i-1} (rows, dec_hidden) and, with one layer, the
        RNN's W_h s_{i-1} + b_h (rows, gates*dec_hidden) from the same product (else None)."""
        attention = self.decoder.attention
        if self.hidden_and_query is None:
            return None, attention.projected_weights(memory.group(attention.query_proj(s_prev)), memory)
        projected = self.hidden_and_query(s_prev)                        # (rows, gates*dec_hidden + attn_dim)
        gates = self.decoder.rnn.hidden_weight(0).size(0)
        return projected[:, :gates], attention.projected_weights(memory.group(projected[:, gates:]), memory)

    def _pre_output(self, s: Tensor, terms: Tensor) -> Tensor:
        """h̃ = tanh(W_cs s + terms), terms = W_cc c + W_ce E y + b_c; s: (rows, [steps,] dec_hidden)."""
        return torch.tanh(self.pre_output_state.add(terms, s) if s.dim() == 2 else self.pre_output_state(s) + terms)

    def features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState,
                                                                                           Tensor]:
        """prev_tokens: (rows,) -> h̃ (rows, dec_hidden), new state, α (rows, src_len). The token terms are added
        inside the context's product: over a folded memory Σ_j α_ij [W_ctx; W_cc] h_j, else [W_ctx; W_cc] c_i."""
        s_prev = state.top                                              # (rows, dec_hidden)
        token_terms = F.embedding(prev_tokens, self.token_table)        # (rows, gates*dec_hidden + dec_hidden)
        gh0, weights = self._attend(s_prev, memory)
        if memory.context_terms is not None:
            terms = torch.baddbmm(memory.group(token_terms), weights, memory.context_terms).view(token_terms.shape)
        else:
            context = memory.weighted_sum(weights, memory.values, s_prev.shape)      # (rows, enc_out) c_i
            terms = self.context.add(token_terms, context)
        rnn_in, pre_output_terms = self.decoder.split_terms(terms)      # (rows, gates*dec_hidden | dec_hidden)
        _, hidden, cell = self.decoder.rnn.step(rnn_in, state.hidden, state.cell, gh0)
        state = DecoderState(hidden, cell)
        return self._pre_output(state.top, pre_output_terms), state, weights.view(s_prev.size(0), -1)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """h̃ (batch, tgt_len, dec_hidden) and α (batch, tgt_len, src_len) over a folded memory."""
        if memory.context_terms is None:
            raise ValueError("teacher forcing needs a folded memory (encode with fold_context=True)")
        token_in, token_out = self.decoder.split_terms(F.embedding(tgt_in, self.token_table))
        values_in, values_out = self.decoder.split_terms(memory.context_terms)   # W_ctx h_j, W_cc h_j
        s_all, alphas = self.decoder.recurrence(token_in, state, lambda s: self._attend(s, memory),
                                                lambda alpha, shape: memory.weighted_sum(alpha, values_in, shape))
        return self._pre_output(s_all, torch.baddbmm(token_out, alphas, values_out)), alphas


@dataclass
class LuongStep(_Step):
    decoder: LuongDecoder
    hidden: Linear                 # layer 0's W_h, b_h (gates*dec_hidden, dec_hidden), float, cast once
    combine: Linear                # W_c (dec_hidden, enc_out + dec_hidden)
    feed_input: Linear | None = None    # W_f (gates*dec_hidden, dec_hidden), with input feeding

    @classmethod
    def build(cls, decoder: LuongDecoder, int8: Int8Products | None) -> LuongStep:
        return cls(**cls.products(decoder, int8), decoder=decoder,
                   hidden=_float(decoder.rnn.hidden_weight(), decoder.rnn.hidden_bias()))

    def _attentional(self, s: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """h̃ = tanh(W_c [c; s]) and α for states s: (batch, [tgt_len,] dec_hidden)."""
        context, weights = self.decoder.attention(s, memory)
        return torch.tanh(self.combine(torch.cat([context, s], dim=-1))), weights

    def features_from(self, gi0: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """From gi0 = W_e E y + b_i (rows, gates*dec_hidden): h̃_i (fed back with input feeding), state, α_i."""
        if state.feed is not None and self.feed_input is not None:      # + W_f h̃_{i-1}
            gi0 = gi0 + self.feed_input(state.feed)
        s, hidden, cell = self.decoder.rnn.step(gi0, state.hidden, state.cell, self.hidden(state.hidden[0]))
        attn_hidden, weights = self._attentional(s, memory)
        return attn_hidden, DecoderState(hidden, cell, attn_hidden if self.feed_input is not None else None), weights

    def features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState,
                                                                                           Tensor]:
        return self.features_from(F.embedding(prev_tokens, self.token_table), state, memory)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        if self.feed_input is None:                                     # the RNN over all steps at once
            embedded = self.decoder.dropout(self.decoder.embed(tgt_in))
            s_all, _, _ = self.decoder.rnn(embedded, state.hidden, state.cell)
            return self._attentional(s_all, memory)
        hiddens, weights = [], []
        for input_t in F.embedding(tgt_in, self.token_table).unbind(1):
            attn_hidden, state, alpha = self.features_from(input_t, state, memory)
            hiddens.append(attn_hidden)
            weights.append(alpha)
        return torch.stack(hiddens, 1), torch.stack(weights, 1)


@dataclass
class OutputSubset:
    keep: Tensor          # (subset,) ascending target ids, the special ids first (so they keep their numbers)
    output: Linear        # h̃ (rows, dec_hidden) -> logits through W_s[keep], b_s[keep] (padded, or int8)


@dataclass
class Decoding:
    """A model (in eval mode) with its inference step: the searches' model (nmt.decode.search.SearchModel).
    Threads may share one: each weight is set once, to the same value whichever thread builds it first."""

    model: Seq2Seq
    int8: Int8Products | None = None       # nmt.decode.quantize.quantize_int8(model), or None for float
    subset: OutputSubset | None = None     # a shortlist view's output rows
    built: dict[torch.dtype | None, BahdanauStep | LuongStep] = field(default_factory=dict)   # per autocast dtype

    @property
    def device(self) -> torch.device:
        return self.model.decoder.output.weight.device

    @property
    def vocab_size(self) -> int:
        """How many target ids a step scores: the whole vocabulary, or an output subset's size."""
        return self.model.decoder.output.out_features if self.subset is None else self.subset.keep.numel()

    @property
    def plain(self) -> bool:
        """One model on its full vocabulary (what nmt.decode.graphs can capture)."""
        return self.subset is None

    def steps(self) -> BahdanauStep | LuongStep:
        """The step's weights for the autocast dtype active now, built at first use."""
        dtype = active_autocast_dtype(self.device.type)
        if dtype not in self.built:
            decoder = self.model.decoder
            with torch.no_grad():
                self.built[dtype] = (BahdanauStep.build(decoder, self.int8) if isinstance(decoder, BahdanauDecoder)
                                     else LuongStep.build(cast(LuongDecoder, decoder), self.int8))
        return self.built[dtype]

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Memory, DecoderState]:
        """src: (batch, src_len) -> memory, initial state. `fold_context`: Bahdanau's context terms once per
        batch (beam search, scoring), or c_i multiplied at each step (greedy search; see BahdanauStep.memory)."""
        encoder = self.model.encoder
        encoded: EncoderOutput
        if self.int8 is None or encoder.training or torch.is_grad_enabled() or src_lengths.device.type != "cpu":
            encoded = encoder(src, src_lengths)
        else:
            encoded = encoder.packed(encoder.dropout(encoder.embed(src)), src_lengths, self.int8.encoder_rnn)
        memory = self.steps().memory(encoded.outputs, src != PAD, fold_context)
        return memory, self.model.decoder.initial_state(*self.model.bridge(encoded))

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (rows,) -> logits (rows, vocab or subset), new state, attention weights (rows, src_len)."""
        steps = self.steps()
        output = steps.output if self.subset is None else self.subset.output
        if self.subset is not None:
            prev_tokens = self.subset.keep[prev_tokens]
        attn_hidden, state, weights = steps.features(prev_tokens, state, memory)
        return output(self.model.decoder.dropout(attn_hidden))[:, : self.vocab_size], state, weights

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        """Positions `step` chose -> vocabulary ids: keep[tokens] inside a subset, else unchanged."""
        return tokens if self.subset is None else self.subset.keep[tokens]

    def forced_features(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced dropout(h̃) (batch, tgt_len, dec_hidden), the output layer's input."""
        memory, state = self.encode(src, src_lengths)
        attn_hidden, _ = self.steps().teacher_forced(tgt_in, state, memory)
        return self.model.decoder.dropout(attn_hidden)

    def forced_logits(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, vocab), in the compute dtype."""
        return self.model.decoder.output(self.forced_features(src, src_lengths, tgt_in))

    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Teacher-forced log p (batch, tgt_len) of each next token tgt_out, normalised in float32 as a step's."""
        logits = self.forced_logits(src, src_lengths, tgt_in)
        return picked_log_probs(lambda rows: logits[rows].log_softmax(-1, dtype=torch.float32), tgt_out,
                                logits.size(-1))

    def with_output_subset(self, keep: Tensor) -> Decoding:
        """A view for one batch's shortlist `keep` (subset,), sharing the built weights: `step` takes and
        returns positions in `keep`, its logits from the rows W_s[keep], b_s[keep], sliced once here."""
        layer = self.model.decoder.output
        output: Linear = (self.int8.output.rows(keep) if self.int8 is not None else
                          padded_output(layer.weight[keep], None if layer.bias is None else layer.bias[keep]))
        return replace(self, subset=OutputSubset(keep, output))


def picked_log_probs(log_probs: Callable[[slice], Tensor], tokens: Tensor, vocab: int) -> Tensor:
    """log p of `tokens` (batch, tgt_len), `log_probs(rows)` giving (rows, tgt_len, vocab) in float32 for a
    slice of rows (contiguous: no copy): scoring never holds the whole batch's in float32 beside the logits."""
    batch, length = tokens.shape
    span = max(1, FORCED_CHUNK_ELEMENTS // max(1, length * vocab))
    picked = [log_probs(slice(start, start + span)).gather(2, tokens[start : start + span, :, None]).squeeze(2)
              for start in range(0, batch, span)]
    return torch.cat(picked) if picked else tokens.new_zeros(0, length, dtype=torch.float32)
