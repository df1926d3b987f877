"""The inference step a trained decoder builds once from its parameters, beside the model's equations.

Training must rebuild every weight it derives, since its parameters change at each update. A trained
model's step reuses, for as long as it decodes (per autocast dtype, built at first use under it):
  * the token table: the step's terms of the input token (W E y + b) for every target id, a lookup
    instead of a product per step;
  * Bahdanau: [W_h; W_a] with b_h inside the product (W_h s_{i-1} + b_h and W_a s_{i-1} at once), the
    folded context terms [W_ctx; W_cc] h_j once per batch (or [W_ctx; W_cc] c_i per step over an unfolded
    memory, greedy search's), W_cs;  Luong: W_c, W_f and layer 0's W_h, b_h, cast once under autocast;
  * W_s padded to 16s rows (nmt.model.output_rows), its logits cut back to the vocabulary;
  * int8 products (nmt.decode.quantize) in place of any of these;
  * a shortlist view (`Decoding.with_output_subset`): the rows of W_s one batch keeps.
The per-batch projections of the memory skip the padded positions (`at_real_positions`).

`Decoding` is a model with its step: what the searches take (nmt.decode.search.SearchModel). The model's
parameters must not change while it lives (validation builds one per validation: fused optimizers update
in place without bumping versions). Threads may share one: its weights are each set once, to the same
value whoever builds them first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.tokenizer import PAD
from nmt.decode.quantize import Int8Products
from nmt.device import active_autocast_dtype
from nmt.model.attention import AdditiveAttention, Memory
from nmt.model.bahdanau import BahdanauDecoder
from nmt.model.decoder import Decoder, DecoderState, autocast_once
from nmt.model.encoder import EncoderOutput
from nmt.model.luong import LuongDecoder
from nmt.model.output_rows import padded_rows
from nmt.model.seq2seq import Seq2Seq

Product = Callable[[Tensor], Tensor]
FORCED_CHUNK_ELEMENTS = 2**24     # scoring: float32 log-probabilities made at once (64 MiB), whatever the batch


def at_real_positions(values: Tensor, mask: Tensor, *projections: Product) -> list[Tensor]:
    """Each projection over the real source positions only, zeros at the padded ones (which attention
    masks): (batch, src_len, d) -> (batch, src_len, d'). Decoding sorts its input by length and cuts it by
    a token budget, so a greedy batch is about a quarter padding (test_2016_flickr). A trace (the ONNX
    export) takes the full projections: the same results where attention looks."""
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
class _Step:
    """What every decoder's step shares: the token table, the output rows and the int8 products."""

    int8: Int8Products | None
    token_table: Tensor            # (tgt_vocab, terms) the step's terms of each input token, W E y + b
    output: Tensor | None          # (vocab padded to 16s, dec_hidden) W_s; None with int8
    output_bias: Tensor | None     # (vocab padded to 16s,) b_s

    @staticmethod
    def common(decoder: Decoder, int8: Int8Products | None) -> dict:
        """The shared fields' values, built from `decoder` under the current autocast."""
        output = None if int8 is not None else autocast_once(padded_rows(decoder.output.weight))
        bias = decoder.output.bias
        return {"int8": int8, "token_table": autocast_once(F.linear(decoder.embed.weight, *decoder.token_projection())),
                "output": output,
                "output_bias": None if int8 is not None or bias is None else autocast_once(padded_rows(bias))}

    def logits(self, features: Tensor, vocab: int) -> Tensor:
        """W_s h̃ + b_s: (rows, dec_hidden) -> (rows, vocab), a view cut from the padded rows' product."""
        if self.int8 is not None:
            return self.int8.output(features)
        assert self.output is not None
        return F.linear(features, self.output, self.output_bias)[:, :vocab]

    def memory(self, decoder: Decoder, values: Tensor, mask: Tensor, fold_context: bool) -> Memory:
        """The annotations, cast once under autocast, and their keys (the int8 product with int8)."""
        values = autocast_once(values)                                   # (batch, src_len, enc_out)
        if not decoder.attention.projects_keys:
            return Memory(values, values, mask)
        keys, = at_real_positions(values, mask, self.keys_product(decoder))
        return Memory(values, keys, mask)

    def keys_product(self, decoder: Decoder) -> Product:
        if self.int8 is not None and self.int8.keys is not None:
            return self.int8.keys
        if isinstance(decoder.attention, AdditiveAttention):             # float32 keys: see AdditiveAttention
            return lambda h: decoder.attention.project_keys(h).float()
        return decoder.attention.project_keys


@dataclass
class BahdanauStep(_Step):
    decoder: BahdanauDecoder
    context: Tensor | None                 # (gates*dec_hidden + dec_hidden, enc_out) [W_ctx; W_cc]; None with int8
    hidden_and_query: Tensor | None        # (gates*dec_hidden + attn_dim, dec_hidden) [W_h; W_a], one layer only
    hidden_and_query_bias: Tensor | None   # [b_h; 0]
    pre_output_state: Tensor | None        # (dec_hidden, dec_hidden) W_cs; None with int8

    @classmethod
    def build(cls, decoder: BahdanauDecoder, int8: Int8Products | None) -> BahdanauStep:
        exact, fused = int8 is None, int8 is None and decoder.rnn.layers == 1
        return cls(**cls.common(decoder, int8), decoder=decoder,
                   context=autocast_once(decoder.context_weight()) if exact else None,
                   hidden_and_query=autocast_once(decoder.hidden_and_query()) if fused else None,
                   hidden_and_query_bias=autocast_once(decoder.hidden_and_query_bias()) if fused else None,
                   pre_output_state=autocast_once(decoder.pre_output_weight("state")) if exact else None)

    def memory(self, decoder: Decoder, values: Tensor, mask: Tensor, fold_context: bool) -> Memory:
        """Folded: keys 2·U_a h_j and [W_ctx; W_cc] h_j (`context_terms`) for every position; unfolded (greedy
        search: with one row per sentence the folding saves no products and makes every step read 4x more),
        a step forms c_i and multiplies it by [W_ctx; W_cc] instead."""
        if not fold_context:
            return super().memory(decoder, values, mask, fold_context)
        keys, context_terms = at_real_positions(values, mask, self.keys_product(decoder), self._context_product)
        return Memory(values, keys, mask, context_terms)

    def _context_product(self, inputs: Tensor, add: Tensor | None = None) -> Tensor:
        """[W_ctx; W_cc] x (+ add, for 2-D x): (..., enc_out) -> (..., gates*dec_hidden + dec_hidden)."""
        if self.int8 is not None:
            assert self.int8.context is not None
            return self.int8.context(inputs) if add is None else self.int8.context(inputs) + add
        assert self.context is not None
        return F.linear(inputs, self.context) if add is None else torch.addmm(add, inputs, self.context.t())

    def _attend(self, s_prev: Tensor, memory: Memory) -> tuple[Tensor | None, Tensor]:
        """α_i from s_{i-1} (rows, dec_hidden): the weights (batch, rows per sentence, src_len) and, with one
        layer, the RNN's W_h s_{i-1} + b_h (rows, gates*dec_hidden) from the same product (else None)."""
        attention = self.decoder.attention
        if self.decoder.rnn.layers > 1:
            return None, attention.projected_weights(memory.group(attention.query_proj(s_prev)), memory)
        if self.int8 is not None:
            assert self.int8.hidden_and_query is not None
            projected = self.int8.hidden_and_query(s_prev)
        else:
            assert self.hidden_and_query is not None
            projected = F.linear(s_prev, self.hidden_and_query, self.hidden_and_query_bias)
        gates = self.decoder.rnn.hidden_weight(0).size(0)               # projected: (rows, gates*dec_hidden + attn)
        return projected[:, :gates], attention.projected_weights(memory.group(projected[:, gates:]), memory)

    def _pre_output(self, s: Tensor, terms: Tensor) -> Tensor:
        """h̃ = tanh(W_cs s + terms), terms = W_cc c + W_ce E y + b_c already summed; s: (rows, [steps,] dec_hidden)."""
        if self.int8 is not None:
            assert self.int8.pre_output_state is not None
            return torch.tanh(self.int8.pre_output_state(s) + terms)
        assert self.pre_output_state is not None
        if s.dim() == 2:                                                # a step: the terms added in the product
            return torch.tanh(torch.addmm(terms, s, self.pre_output_state.t()))
        return torch.tanh(F.linear(s, self.pre_output_state) + terms)

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
            terms = self._context_product(context, add=token_terms)
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
        states, weights = [], []
        for input_t in token_in.unbind(1):
            s_prev = state.top
            gh0, alpha = self._attend(s_prev, memory)
            context_in = memory.weighted_sum(alpha, values_in, s_prev.shape)     # Σ_j α_ij W_ctx h_j
            _, hidden, cell = self.decoder.rnn.step(input_t + context_in, state.hidden, state.cell, gh0)
            state = DecoderState(hidden, cell)
            states.append(state.top)
            weights.append(alpha.view(s_prev.size(0), -1))
        s_all, alphas = torch.stack(states, 1), torch.stack(weights, 1)
        return self._pre_output(s_all, torch.baddbmm(token_out, alphas, values_out)), alphas


@dataclass
class LuongStep(_Step):
    decoder: LuongDecoder
    combine: Tensor | None         # (dec_hidden, enc_out + dec_hidden) W_c; None with int8
    feed: Tensor | None            # (gates*dec_hidden, dec_hidden) W_f; None without input feeding or with int8
    hidden: Tensor                 # (gates*dec_hidden, dec_hidden) layer 0's W_h
    hidden_bias: Tensor            # (gates*dec_hidden,) b_h

    @classmethod
    def build(cls, decoder: LuongDecoder, int8: Int8Products | None) -> LuongStep:
        exact = int8 is None
        return cls(**cls.common(decoder, int8), decoder=decoder,
                   combine=autocast_once(decoder.combine.weight) if exact else None,
                   feed=autocast_once(decoder.feed_weight()) if exact and decoder.input_feeding else None,
                   hidden=autocast_once(decoder.rnn.hidden_weight(0)),
                   hidden_bias=autocast_once(decoder.rnn.hidden_bias(0)))

    def _attentional(self, s: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """h̃ = tanh(W_c [c; s]) and α for states s: (batch, [tgt_len,] dec_hidden)."""
        context, weights = self.decoder.attention(s, memory)
        both = torch.cat([context, s], dim=-1)
        if self.int8 is not None:
            assert self.int8.combine is not None
            return torch.tanh(self.int8.combine(both)), weights
        assert self.combine is not None
        return torch.tanh(F.linear(both, self.combine)), weights

    def features_from(self, gi0: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """Step the RNN from gi0 = W_e E y + b_i (rows, gates*dec_hidden), then attend with s_i: h̃_i, the new
        state (h̃_i in `feed` with input feeding) and α_i."""
        if state.feed is not None:                                      # + W_f h̃_{i-1}
            if self.int8 is not None:
                assert self.int8.feed_input is not None
                gi0 = gi0 + self.int8.feed_input(state.feed)
            else:
                assert self.feed is not None
                gi0 = gi0 + F.linear(state.feed, self.feed)
        gh0 = F.linear(state.hidden[0], self.hidden, self.hidden_bias)
        s, hidden, cell = self.decoder.rnn.step(gi0, state.hidden, state.cell, gh0)
        attn_hidden, weights = self._attentional(s, memory)
        return attn_hidden, DecoderState(hidden, cell, attn_hidden if self.decoder.input_feeding else None), weights

    def features(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState,
                                                                                           Tensor]:
        return self.features_from(F.embedding(prev_tokens, self.token_table), state, memory)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        if not self.decoder.input_feeding:                              # the RNN over all steps at once
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
    """A shortlist view's output: `step` takes and returns positions in `keep`."""

    keep: Tensor          # (subset,) ascending target ids, the special ids first (so they keep their numbers)
    product: Product      # h̃ (rows, dec_hidden) -> logits (rows, subset) through W_s[keep], b_s[keep]


@dataclass
class Decoding:
    """A model (in eval mode) with its inference step: the searches' model (nmt.decode.search.SearchModel)."""

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
        """One model on its full vocabulary (what nmt.decode.graphed can capture)."""
        return self.subset is None

    def steps(self) -> BahdanauStep | LuongStep:
        """The step's weights for the autocast dtype active now, built at first use."""
        dtype = active_autocast_dtype(self.device.type)
        step = self.built.get(dtype)
        if step is None:
            decoder = self.model.decoder
            with torch.no_grad():
                if isinstance(decoder, BahdanauDecoder):
                    step = BahdanauStep.build(decoder, self.int8)
                else:
                    assert isinstance(decoder, LuongDecoder)
                    step = LuongStep.build(decoder, self.int8)
            self.built[dtype] = step
        return step

    def _encoded(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        encoder = self.model.encoder
        if self.int8 is None or encoder.training or torch.is_grad_enabled() or src_lengths.device.type != "cpu":
            return encoder(src, src_lengths)
        return encoder.packed(encoder.dropout(encoder.embed(src)), src_lengths, self.int8.encoder_rnn)

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Memory, DecoderState]:
        """src: (batch, src_len) -> memory, initial state. `fold_context`: Bahdanau's context terms once per
        batch (beam search, scoring), or c_i multiplied at each step (greedy search; see BahdanauStep.memory)."""
        encoded = self._encoded(src, src_lengths)
        memory = self.steps().memory(self.model.decoder, encoded.outputs, src != PAD, fold_context)
        hidden, cell = self.model.bridge(encoded)
        return memory, self.model.decoder.initial_state(hidden, cell)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (rows,) -> logits (rows, vocab or subset), new state, attention weights (rows, src_len)."""
        steps, dropout = self.steps(), self.model.decoder.dropout
        if self.subset is not None:
            attn_hidden, state, weights = steps.features(self.subset.keep[prev_tokens], state, memory)
            return self.subset.product(dropout(attn_hidden)), state, weights
        attn_hidden, state, weights = steps.features(prev_tokens, state, memory)
        return steps.logits(dropout(attn_hidden), self.model.decoder.output.out_features), state, weights

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
        """A view for one batch's vocabulary shortlist, sharing the built weights: `step` takes and returns
        positions in `keep` (subset,), ascending target ids beginning with the special ids, its logits
        (rows, subset) from the rows W_s[keep], b_s[keep] (int8 ones cut by `Int8Linear.rows`), sliced once here."""
        if self.int8 is not None:
            product: Product = self.int8.output.rows(keep)
        else:
            output = self.model.decoder.output
            bias = output.bias[keep] if output.bias is not None else None
            weight = autocast_once(padded_rows(output.weight[keep]))    # (subset padded to 16s, dec_hidden)
            bias = autocast_once(padded_rows(bias)) if bias is not None else None
            product = lambda features: F.linear(features, weight, bias)[:, : keep.numel()]  # noqa: E731
        return replace(self, subset=OutputSubset(keep, product))


def picked_log_probs(log_probs: Callable[[slice], Tensor], tokens: Tensor, vocab: int) -> Tensor:
    """log p of `tokens` (batch, tgt_len), where `log_probs(rows)` gives the float32 log-probabilities
    (rows, tgt_len, vocab) of a slice of the batch's rows. Made a few rows at a time (a slice of rows of
    the logits is contiguous: no copy), so scoring never holds the whole batch's in float32 beside them."""
    batch, length = tokens.shape
    span = max(1, FORCED_CHUNK_ELEMENTS // max(1, length * vocab))
    picked = [log_probs(slice(start, start + span)).gather(2, tokens[start : start + span, :, None]).squeeze(2)
              for start in range(0, batch, span)]
    return torch.cat(picked) if picked else tokens.new_zeros(0, length, dtype=torch.float32)
