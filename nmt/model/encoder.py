"""Encoder: embeddings and a (bi-directional) GRU/LSTM, as one packed call; a GRU training on the CPU on a
batch of little padding runs unpacked (`_gru_unpacked`): the packed CPU backward zero-fills and adds a
whole-batch gradient buffer at every step, a fifth of the encoder's time. (An LSTM's final cell needs packing.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.data.special import PAD

# Padded steps cost p / (1 - p) of the real ones, the packed call's overhead ~a fifth: break-even near 17%.
MAX_UNPACKED_PADDING = 0.15  # training batches (length buckets) are ~5% padding


@dataclass
class EncoderOutput:
    outputs: Tensor            # (batch, src_len, enc_out) the annotations h_j
    final: Tensor              # (batch, enc_out) last layer's final state, both directions concatenated
    final_cell: Tensor | None  # (batch, enc_out) the same for the LSTM cell; None for GRU


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """nn.Dropout's behaviour with the mask drawn by `torch.rand`, faster on the CPU than its Bernoulli sampler
    (6 ms vs 10.6 ms for a million values on one thread)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    keep = torch.rand(x.shape, device=x.device) >= p
    return x * keep * (1.0 / (1.0 - p))


class Dropout(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def make_rnn(rnn_type: str, input_size: int, hidden: int, layers: int, dropout: float,
             bidirectional: bool = False) -> nn.RNNBase:
    rnn_class = nn.GRU if rnn_type == "gru" else nn.LSTM
    return rnn_class(input_size, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                     dropout=dropout if layers > 1 else 0.0)


class Encoder(nn.Module):
    """h_j = [→h_j; ←h_j], the forward and backward RNN states at source position j."""

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, bidirectional: bool,
                 rnn_type: str, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding_dim, padding_idx=PAD)
        self.dropout = Dropout(dropout)
        self.rnn = make_rnn(rnn_type, embedding_dim, hidden, layers, dropout, bidirectional)
        self.directions = 2 if bidirectional else 1
        self.output_size = hidden * self.directions

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """src: (batch, src_len); src_lengths: (batch,), on the GPU for a captured step (unpacked: packing reads
        the lengths on the host)."""
        embedded = self.dropout(self.embed(src))                          # (batch, src_len, emb)
        lengths_on_gpu, gru = src_lengths.device.type != "cpu", isinstance(self.rnn, nn.GRU)
        if lengths_on_gpu and not gru:
            raise ValueError("source lengths on the GPU need a GRU encoder (the unpacked path)")
        if lengths_on_gpu or (gru and torch.is_grad_enabled() and src.device.type == "cpu"
                              and int(src_lengths.sum()) >= (1 - MAX_UNPACKED_PADDING) * src.numel()):
            return self._output(*self._gru_unpacked(embedded, src_lengths))
        return self.packed(embedded, src_lengths, self.rnn)

    def packed(self, embedded: Tensor, src_lengths: Tensor, rnn: nn.Module) -> EncoderOutput:
        """`rnn` (this encoder's, or nmt.decode.quantize's int8 stand-in) as one packed call: (batch, src_len, emb)."""
        packed = pack_padded_sequence(embedded, src_lengths, batch_first=True, enforce_sorted=False)
        packed_out, final = rnn(packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=embedded.size(1))
        return self._output(outputs, final)

    def _output(self, outputs: Tensor, final: Tensor | tuple[Tensor, Tensor]) -> EncoderOutput:
        """outputs: (batch, src_len, dirs*hidden); final: (layers*dirs, batch, hidden), or (h, c)."""
        outputs = self.dropout(outputs)                                   # (batch, src_len, dirs*hidden)
        if isinstance(final, tuple):
            return EncoderOutput(outputs, self._last_layer(final[0]), self._last_layer(final[1]))
        return EncoderOutput(outputs, self._last_layer(final), None)

    def _gru_unpacked(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The packed GRU's results from one call per layer and direction: inputs (batch, src_len, emb) -> outputs
        (batch, src_len, dirs*hidden), zero at the padding, and finals (layers*dirs, batch, hidden). The backward
        direction reads each sentence reversed within its length, so no padding reaches a real state."""
        batch, src_len = inputs.shape[:2]
        lengths = lengths.to(inputs.device).unsqueeze(1)                  # (batch, 1)
        positions = torch.arange(src_len, device=inputs.device)
        real = positions < lengths                                        # (batch, src_len)
        reverse = torch.where(real, lengths - 1 - positions, positions)   # (batch, src_len); its own inverse
        last = lengths - 1                                                # (batch, 1) the last real position
        start = inputs.new_zeros(1, batch, self.rnn.hidden_size)          # h_0
        finals, layer_input = [], inputs
        for layer in range(self.rnn.num_layers):
            if layer > 0:                                                 # as nn.GRU: dropout between layers
                layer_input = dropout(layer_input, self.rnn.dropout, self.training)
            outputs = []
            for suffix in ["", "_reverse"][: self.directions]:
                weights = [getattr(self.rnn, f"{name}_l{layer}{suffix}")
                           for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
                along = _positions(layer_input, reverse) if suffix else layer_input
                out, _ = torch.gru(along, start, weights, has_biases=True, num_layers=1, dropout=0.0,
                                   train=self.training, bidirectional=False, batch_first=True)
                out = _positions(out, reverse) if suffix else out       # (batch, src_len, hidden) in source order
                # each direction's final state: at the last real position forwards, at position 0 backwards
                finals.append(out[:, 0] if suffix else _positions(out, last).squeeze(1))
                outputs.append(out)
            layer_input = torch.cat(outputs, dim=-1)                      # (batch, src_len, dirs*hidden)
        return layer_input * real.unsqueeze(-1), torch.stack(finals)

    def _last_layer(self, state: Tensor) -> Tensor:
        """(layers*dirs, batch, hidden) -> (batch, dirs*hidden) of the top layer."""
        top = state[-self.directions :]                                   # (dirs, batch, hidden)
        return torch.cat(list(top), dim=-1)


def _positions(values: Tensor, index: Tensor) -> Tensor:
    """values: (batch, src_len, d); index: (batch, n) -> values[b, index[b, k]]: (batch, n, d)."""
    return values.gather(1, index.unsqueeze(-1).expand(-1, -1, values.size(-1)))
