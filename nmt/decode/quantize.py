"""Dynamic int8 decoding: the products of a decoding step (nmt.decode.steps) and the encoder's RNN through
torch.ao's dynamic quantization (FBGEMM on x86): weights quantized once per output channel, inputs on the fly,
float32 out, so attention, softmax and search run unchanged in float32.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.config import ConfigError
from nmt.model.attention import AdditiveAttention, LuongGeneralAttention
from nmt.model.bahdanau import BahdanauDecoder
from nmt.model.decoder import Decoder
from nmt.model.luong import LuongDecoder
from nmt.model.seq2seq import Seq2Seq


def _dynamic_modules():
    """torch.ao's dynamic quantized modules and qconfigs, or a one-line error."""
    try:
        from torch.ao.nn.quantized import dynamic
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig
    except ImportError:
        raise ConfigError(f"--quantize int8 needs torch.ao dynamic quantization, which torch {torch.__version__} "
                          "does not have; decode in float32 (--quantize none)") from None
    return dynamic, default_dynamic_qconfig, per_channel_dynamic_qconfig


class Int8Linear(nn.Module):
    """x Wᵀ + b, W (out, in) in int8 with one scale per output row: the ops torch.ao's dynamic Linear calls,
    so that a shortlist can cut it to its rows (`rows`) without building a module each time."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.packed = torch.ops.quantized.linear_prepack(weight, bias)
        self._float_weight: Tensor | None = None         # the dequantized rows, once, for `rows`

    def forward(self, inputs: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(inputs, self.packed, reduce_range=True)

    def add(self, terms: Tensor, inputs: Tensor) -> Tensor:
        """terms + x Wᵀ (+ b), as FloatLinear.add."""
        return self(inputs) + terms

    def rows(self, index: Tensor) -> Int8Linear:
        """Output rows `index` (n,) only: their very int8 values and scales, repacked (~13 ms per batch)."""
        if self._float_weight is None:
            self._float_weight = self.weight.dequantize()   # exact: requantized with the same scales below
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")              # torch announces the move of quantized tensors to torchao
            picked = torch.quantize_per_channel(self._float_weight[index], self.weight.q_per_channel_scales()[index],
                                                self.weight.q_per_channel_zero_points()[index], 0, torch.qint8)
        return Int8Linear(picked, None if self.bias is None else self.bias[index])


def _int8_linear(weight: Tensor, bias: Tensor | None) -> Int8Linear:
    """W quantized per output channel by torch.ao's observer, as its dynamic `Linear.from_float` does."""
    _, _, per_channel = _dynamic_modules()
    observer = per_channel.weight()
    observer(weight)
    scales, zero_points = observer.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # torch announces the move of quantized tensors to torchao
        quantized = torch.quantize_per_channel(weight.float(), scales.double(), zero_points.long(),
                                               observer.ch_axis, torch.qint8)
    return Int8Linear(quantized, None if bias is None else bias.float())


@dataclass
class Int8Products:
    """The int8 replacements (float in, float out) of a decoding step's products."""

    encoder_rnn: nn.Module                         # the encoder's GRU/LSTM
    output: Int8Linear                             # W_s, b_s
    keys: Int8Linear | None = None                 # the attention keys (2·U_a, or Luong general's W_a)
    context: Int8Linear | None = None              # Bahdanau: [W_ctx; W_cc]
    pre_output_state: Int8Linear | None = None     # Bahdanau: W_cs
    hidden_and_query: Int8Linear | None = None     # Bahdanau, one layer: [W_h; W_a] with [b_h; 0]
    combine: Int8Linear | None = None              # Luong: W_c
    feed_input: Int8Linear | None = None           # Luong with input feeding: W_f


def step_products(decoder: Decoder) -> dict[str, tuple[Tensor, Tensor | None]]:
    """The weight (out, in) and bias of each product of a step but the keys and the output, by field name
    (of `Int8Products` and of nmt.decode.steps' steps, which build their float products from them)."""
    weights: dict[str, tuple[Tensor, Tensor | None]] = {}
    if isinstance(decoder, BahdanauDecoder):
        weights["context"] = (decoder.context_weight(), None)
        weights["pre_output_state"] = (decoder.pre_output_weight("state"), None)
        if decoder.rnn.layers == 1:
            weights["hidden_and_query"] = (decoder.hidden_and_query(), decoder.hidden_and_query_bias())
    elif isinstance(decoder, LuongDecoder):
        weights["combine"] = (decoder.combine.weight, None)
        if decoder.input_feeding:
            weights["feed_input"] = (decoder.feed_weight(), None)
    return weights


def quantize_int8(model: Seq2Seq) -> Int8Products:
    """int8 versions of `model`'s step products and encoder RNN (on the CPU, in eval mode) for a `Decoding`;
    the model itself stays float32 (it still trains, exports and scores in float32)."""
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("--quantize int8 runs on the CPU only (--device cpu)")
    dynamic, per_tensor, _ = _dynamic_modules()
    decoder, attention = model.decoder, model.decoder.attention
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")                  # torch.ao announces its move to torchao on every call
        weights = {"output": (decoder.output.weight, decoder.output.bias), **step_products(decoder)}
        if isinstance(attention, AdditiveAttention):                # keys 2·U_a h_j (see AdditiveAttention)
            weights["keys"] = (2 * attention.key_proj.weight, 2 * attention.key_proj.bias)
        elif isinstance(attention, LuongGeneralAttention):
            weights["keys"] = (attention.key_proj.weight, None)
        products = {name: _int8_linear(weight.detach(), None if bias is None else bias.detach())
                    for name, (weight, bias) in weights.items()}
        rnn = copy.copy(model.encoder.rnn)               # a shallow copy carries the qconfig, not the model
        rnn.qconfig = per_tensor                         # the only qconfig torch.ao's quantized RNNs take
        encoder_rnn = (dynamic.LSTM if isinstance(rnn, nn.LSTM) else dynamic.GRU).from_float(rnn)
    return Int8Products(encoder_rnn=encoder_rnn, **products)
