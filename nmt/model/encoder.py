"""Encoder: embeddings and a (bi-directional) GRU/LSTM.

The RNN runs as one packed-sequence call, which skips the padded positions, except for a GRU on
the CPU with gradients on (training) and a batch that is mostly real tokens: there each layer and
direction runs as one call over the padded batch (`_gru_unpacked`). The backward pass of PyTorch's
packed CPU RNN zero-fills and adds a gradient buffer the size of the whole batch's input
projections at every step, about a fifth of the encoder's training time, while training batches
are only ~5% padding (length buckets). An LSTM keeps the packed call: its final cell state is not
among the unpacked call's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.data.special import PAD
from nmt.model.dropout import Dropout, dropout

# Padded steps cost p / (1 - p) of the real ones, the packed call's overhead ~a fifth: break-even near 17%.
MAX_UNPACKED_PADDING = 0.15  # training batches (length buckets) are ~5% padding


@dataclass
class EncoderOutput:
    outputs: Tensor            # (batch, src_len, enc_out) the annotations h_j
    final: Tensor              # (batch, enc_out) last layer's final state, both directions concatenated
    final_cell: Tensor | None  # (batch, enc_out) the same for the LSTM cell; None for GRU


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
        """src: (batch, src_len) padded ids; src_lengths: (batch,) on the CPU, or on the GPU for a captured
        training step (nmt.train.graphed), which packing cannot serve (it reads the lengths on the host)."""
        embedded = self.dropout(self.embed(src))                          # (batch, src_len, emb)
        if src_lengths.device.type != "cpu":
            if not isinstance(self.rnn, nn.GRU):
                raise ValueError("source lengths on the GPU need a GRU encoder (the unpacked path)")
            return self._output(*self._gru_unpacked(embedded, src_lengths))
        if torch.is_grad_enabled() and self._unpacked_pays(src, src_lengths):
            return self._output(*self._gru_unpacked(embedded, src_lengths))
        return self.packed(embedded, src_lengths, self.rnn)

    def packed(self, embedded: Tensor, src_lengths: Tensor, rnn: nn.Module) -> EncoderOutput:
        """The RNN as one packed call over embedded (batch, src_len, emb): `rnn` is this encoder's, or a
        stand-in computing it from the same parameters (nmt.decode.quantize's int8 one)."""
        packed = pack_padded_sequence(embedded, src_lengths, batch_first=True, enforce_sorted=False)
        packed_out, final = rnn(packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=embedded.size(1))
        return self._output(outputs, final)

    def _output(self, outputs: Tensor, final: Tensor | tuple[Tensor, Tensor]) -> EncoderOutput:
        """outputs: (batch, src_len, dirs*hidden), zero at the padding; final: (layers*dirs, batch, hidden),
        for the LSTM (h, c)."""
        outputs = self.dropout(outputs)                                   # (batch, src_len, dirs*hidden)
        if isinstance(final, tuple):
            return EncoderOutput(outputs, self._last_layer(final[0]), self._last_layer(final[1]))
        return EncoderOutput(outputs, self._last_layer(final), None)

    def _unpacked_pays(self, src: Tensor, src_lengths: Tensor) -> bool:
        """Whether `_gru_unpacked` beats the packed call: a GRU on the CPU, and at most
        MAX_UNPACKED_PADDING of the batch padding (its padded steps are computed too)."""
        if src.device.type != "cpu" or not isinstance(self.rnn, nn.GRU):
            return False
        return int(src_lengths.sum()) >= (1 - MAX_UNPACKED_PADDING) * src.numel()

    def _gru_unpacked(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The packed GRU call's results from one unpacked call per layer and direction over the padded batch.

        inputs: (batch, src_len, emb); lengths: (batch,). The backward direction reads each sentence reversed
        within its own length, the padding staying at the end, so both directions start at a real token and
        no padding reaches a real position's state. Returns the outputs (batch, src_len, dirs*hidden), zero at
        the padding, and the final states (layers*dirs, batch, hidden), as nn.GRU orders them.
        """
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
