"""A multi-layer GRU/LSTM (one nn.GRU/nn.LSTM) that runs whole sequences in one call, or `step`s given layer 0's
input projection `gi0` (so the embedding part is one product for all steps, and Bahdanau's context part folds
into the attention). PyTorch's gate equations, with gi = W_i x + b_i and gh = W_h s + b_h split into gates:

    GRU:   r = σ(gi_r + gh_r),  z = σ(gi_z + gh_z),  n = tanh(gi_n + r ⊙ gh_n),  s' = (1 - z) ⊙ n + z ⊙ s
    LSTM:  i, f, g, o = σ, σ, tanh, σ of (gi + gh);  c' = f ⊙ c + i ⊙ g;  s' = o ⊙ tanh(c')
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.encoder import dropout, make_rnn


def gru_gates(gi: Tensor, gh: Tensor, hidden: Tensor) -> Tensor:
    """gi, gh: (batch, 3*hidden); hidden: (batch, hidden) -> (batch, hidden). Six operations (GPU launches), not
    ten: one sigmoid for r and z; addcmul, unlike lerp, promotes mixed dtypes under autocast."""
    sizes = [2 * hidden.size(-1), hidden.size(-1)]              # r and z, then n
    (i_rz, i_n), (h_rz, h_n) = gi.split(sizes, dim=-1), gh.split(sizes, dim=-1)
    reset, update = torch.sigmoid(i_rz + h_rz).chunk(2, dim=-1)
    candidate = torch.tanh(torch.addcmul(i_n, reset, h_n))
    return torch.addcmul(candidate, update, hidden - candidate)


def lstm_gates(gi: Tensor, gh: Tensor, hidden: Tensor, cell: Tensor) -> tuple[Tensor, Tensor]:
    """gi, gh: (batch, 4*hidden) -> (hidden, cell), each (batch, hidden); one sigmoid for all four gates."""
    gates = gi + gh
    i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
    cell = torch.addcmul(f * cell, i, torch.tanh(gates[..., 2 * hidden.size(-1) : 3 * hidden.size(-1)]))
    return o * torch.tanh(cell), cell


def _layers(states: list[Tensor]) -> Tensor:
    """Per-layer states (batch, hidden) -> (layers, batch, hidden); one layer as a view, not a copy."""
    return states[0].unsqueeze(0) if len(states) == 1 else torch.stack(states)


class RecurrentStack(nn.Module):
    def __init__(self, rnn_type: str, input_size: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.rnn = make_rnn(rnn_type, input_size, hidden, layers, dropout)
        self.is_lstm = rnn_type == "lstm"
        self.layers, self.hidden_size, self.dropout = layers, hidden, dropout

    def forward(self, inputs: Tensor, hidden: Tensor, cell: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Whole sequence: inputs (batch, steps, in) -> outputs (batch, steps, hidden), final hidden, cell."""
        if self.is_lstm:
            outputs, (hidden, cell) = self.rnn(inputs, (hidden, cell))
            return outputs, hidden, cell
        outputs, hidden = self.rnn(inputs, hidden)
        return outputs, hidden, None

    def input_weight(self, start: int, end: int) -> Tensor:
        return self.parameter("weight_ih_l0")[:, start:end]

    def input_bias(self) -> Tensor:
        return self.parameter("bias_ih_l0")

    def hidden_weight(self, layer: int = 0) -> Tensor:
        return self.parameter(f"weight_hh_l{layer}")

    def hidden_bias(self, layer: int = 0) -> Tensor:
        return self.parameter(f"bias_hh_l{layer}")

    def parameter(self, name: str) -> Tensor:
        return cast(Tensor, getattr(self.rnn, name))

    def step(self, gi0: Tensor, hidden: Tensor, cell: Tensor | None,
             gh0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """gi0: (batch, gates*hidden) with b_i; gh0: layer 0's W_h s + b_h if computed; hidden, cell: (layers,
        batch, hidden) -> top output (batch, hidden), hidden, cell."""
        new_hidden: list[Tensor] = []
        new_cell: list[Tensor] = []
        gi = gi0
        for layer in range(self.layers):
            h = hidden[layer]
            if layer > 0:
                x = dropout(new_hidden[-1], self.dropout, self.training)
                gi = F.linear(x, self.parameter(f"weight_ih_l{layer}"), self.parameter(f"bias_ih_l{layer}"))
            gh = gh0 if layer == 0 and gh0 is not None else F.linear(h, self.hidden_weight(layer),
                                                                     self.hidden_bias(layer))
            if cell is not None:                                        # LSTM
                h, c = lstm_gates(gi, gh, h, cell[layer])
                new_cell.append(c)
            else:
                h = gru_gates(gi, gh, h)
            new_hidden.append(h)
        return new_hidden[-1], _layers(new_hidden), _layers(new_cell) if self.is_lstm else None
