"""Encoder: embeddings and a (bi-directional) GRU/LSTM run as one packed-sequence call."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.data.tokenizer import PAD
from nmt.model.dropout import Dropout


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
        self.int8_products: dict[str, nn.Module] = {}      # an int8 "rnn" (nmt.decode.quantize); not parameters

    def forward(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """src: (batch, src_len) padded ids; src_lengths: (batch,) on the CPU."""
        embedded = self.dropout(self.embed(src))                          # (batch, src_len, emb)
        packed = pack_padded_sequence(embedded, src_lengths, batch_first=True, enforce_sorted=False)
        int8 = self.int8_products.get("rnn") if not (self.training or torch.is_grad_enabled()) else None
        packed_out, final = (int8 or self.rnn)(packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=src.size(1))
        outputs = self.dropout(outputs)                                   # (batch, src_len, dirs*hidden)
        if isinstance(final, tuple):
            return EncoderOutput(outputs, self._last_layer(final[0]), self._last_layer(final[1]))
        return EncoderOutput(outputs, self._last_layer(final), None)

    def _last_layer(self, state: Tensor) -> Tensor:
        """(layers*dirs, batch, hidden) -> (batch, dirs*hidden) of the top layer."""
        top = state[-self.directions :]                                   # (dirs, batch, hidden)
        return torch.cat(list(top), dim=-1)
