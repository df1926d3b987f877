"""The decoder's speed machinery in inference, as an explicit context instead of state on the model.

A decoder step in inference can reuse what training must rebuild: weights derived from the
parameters (the token table, stacked step weights, W_s padded to 16s rows), int8 versions of the
step products (nmt.decode.quantize), and, per batch, the rows of W_s a vocabulary shortlist keeps.
An `Inference` holds them and is passed to the decoder's methods; the model itself stays a plain
function of its parameters, so any number of threads and Translators may decode one model at once,
each with its own context, and no lock is needed: a context's cache entries are each set once, to
the same value whoever sets them first.

`Decoding` binds a model to a context and offers what the searches need (`nmt.decode.search.
SearchModel`): encode, step, and the vocabulary ids of the positions a step chose.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.device import active_autocast_dtype
from nmt.model.output_rows import padded_rows

if TYPE_CHECKING:
    from nmt.model.attention import Memory
    from nmt.model.decoder import DecoderState
    from nmt.model.seq2seq import Seq2Seq


def autocast_once(weight: Tensor) -> Tensor:
    """Cast a derived (non-leaf) weight to the autocast dtype once, so ops inside a loop over
    steps do not cast it again at every step (autocast caches casts of parameters only)."""
    dtype = active_autocast_dtype(weight.device.type)
    return weight if dtype is None else weight.to(dtype)


@dataclass
class Inference:
    """What one model decodes with besides its parameters. The parameters must not change while it
    lives (derived weights are built once: parameter versions cannot tell when to rebuild, since fused
    optimizers update in place without counting it).

    cache: derived weights by (name, autocast dtype), built on first use;
    int8: int8 products by name (nmt.decode.quantize), "encoder_rnn" for the encoder's RNN;
    subset: (keep, product) in a `with_output_rows` view: `step` scores only the target ids `keep`
        through `product`, h̃ -> (rows, subset) logits.
    """

    cache: dict[tuple, Tensor] = field(default_factory=dict)
    int8: dict[str, nn.Module] = field(default_factory=dict)
    subset: tuple[Tensor, Callable[[Tensor], Tensor]] | None = None

    def derived(self, name: str, device_type: str, build: Callable[[], Tensor]) -> Tensor:
        """The weight `build()` makes from parameters, cast for autocast, kept under `name`."""
        key = (name, active_autocast_dtype(device_type))
        weight = self.cache.get(key)
        if weight is None:
            weight = self.cache[key] = autocast_once(build())
        return weight

    def product(self, name: str) -> nn.Module | None:
        """The int8 replacement of product `name` (float in, float out), or None."""
        return self.int8.get(name)

    def with_output_rows(self, output: nn.Linear, keep: Tensor) -> Inference:
        """A view for one batch's vocabulary shortlist: the same cache and int8 products, and a subset.

        output: the decoder's output layer W_s; keep: (subset,) ascending target ids beginning with the
        special ids, so that these keep their numbers. In the view, `Decoder.step` takes and returns
        subset positions: its input tokens are positions in `keep`, its logits are (batch, subset) from
        the rows W_s[keep], b_s[keep], sliced once here (int8 ones cut by `Int8Linear.rows`, see
        nmt.decode.quantize). `vocab_ids` maps positions back to vocabulary ids.
        """
        int8 = self.product("output")
        if int8 is not None:                                            # an Int8Linear, which cuts its rows
            product = int8.rows(keep)
        else:
            bias = output.bias[keep] if output.bias is not None else None
            weight = autocast_once(padded_rows(output.weight[keep]))    # (subset padded to 16s, dec_hidden)
            bias = autocast_once(padded_rows(bias)) if bias is not None else None
            product = lambda features: F.linear(features, weight, bias)[:, : keep.numel()]  # noqa: E731
        view = copy.copy(self)
        view.subset = (keep, product)
        return view

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        """Positions `step` chose -> vocabulary ids: keep[tokens] inside a subset, else unchanged."""
        return tokens if self.subset is None else self.subset[0][tokens]


def int8_product(name: str, ctx: Inference | None) -> nn.Module | None:
    """The int8 replacement of product `name` in a context that has one, else None. (Such modules define
    no __len__, so `or` works.)"""
    return None if ctx is None else ctx.product(name)


def active(ctx: Inference | None) -> Inference | None:
    """`ctx` when its speed machinery applies: in inference (no gradients); None while training."""
    return None if ctx is None or torch.is_grad_enabled() else ctx


@dataclass
class Decoding:
    """One model with its inference context: the searches' model (nmt.decode.search.SearchModel)."""

    model: Seq2Seq
    ctx: Inference

    @property
    def device(self) -> torch.device:
        return self.model.decoder.output.weight.device

    @property
    def vocab_size(self) -> int:
        """How many target ids a step scores: the whole vocabulary, or an output subset's size."""
        return self.model.decoder.output.out_features if self.ctx.subset is None else self.ctx.subset[0].numel()

    def encode(self, src: Tensor, src_lengths: Tensor, fold_context: bool = True) -> tuple[Memory, DecoderState]:
        return self.model.encode(src, src_lengths, fold_context, self.ctx)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        return self.model.decoder.step(prev_tokens, state, memory, self.ctx)

    def vocab_ids(self, tokens: Tensor) -> Tensor:
        return self.ctx.vocab_ids(tokens)

    def forced_logits(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, vocab), in the compute dtype."""
        logits, _ = self.model(src, src_lengths, tgt_in, ctx=self.ctx)
        return logits

    def forced(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        """Teacher-forced log p (batch, tgt_len) of each next token tgt_out, normalised in float32 as a step's."""
        logits = self.forced_logits(src, src_lengths, tgt_in)
        return picked_log_probs(lambda rows: logits[rows].log_softmax(-1, dtype=torch.float32), tgt_out,
                                logits.size(-1))

    def with_output_subset(self, keep: Tensor) -> Decoding:
        """This model scoring only the target ids `keep` (see `Decoder.with_output_subset`)."""
        return Decoding(self.model, self.model.decoder.with_output_subset(self.ctx, keep))

    @property
    def plain(self) -> bool:
        """One model on its full vocabulary (what nmt.decode.graphed can capture)."""
        return self.ctx.subset is None


FORCED_CHUNK_ELEMENTS = 2**24     # scoring: float32 log-probabilities made at once (64 MiB), whatever the batch


def picked_log_probs(log_probs: Callable[[slice], Tensor], tokens: Tensor, vocab: int) -> Tensor:
    """log p of `tokens` (batch, tgt_len), where `log_probs(rows)` gives the float32 log-probabilities
    (rows, tgt_len, vocab) of a slice of the batch's rows. Made a few rows at a time (a slice of rows of
    the logits is contiguous: no copy), so scoring never holds the whole batch's in float32 beside them."""
    batch, length = tokens.shape
    span = max(1, FORCED_CHUNK_ELEMENTS // max(1, length * vocab))
    picked = [log_probs(slice(start, start + span)).gather(2, tokens[start : start + span, :, None]).squeeze(2)
              for start in range(0, batch, span)]
    return torch.cat(picked) if picked else tokens.new_zeros(0, length, dtype=torch.float32)
