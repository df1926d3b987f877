"""The textbook equations and nothing else: the oracle every path of nmt's model and searches is held to.

It reads a Seq2Seq's parameters and computes one sentence at a time, one position at a time, at the
sentence's own length (no padding, so no mask), with no folding, fusing, caching or casting:

    encoder    h_j = [→h_j; ←h_j]                         (each layer over the one below)
    bridge     s_0 = tanh(W_b [→h_n; ←h_1] + b_b), or 0
    Bahdanau   e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j + b_a),  α_ij = softmax_j(e_ij),  c_i = Σ_j α_ij h_j
               s_i = RNN([E y_{i-1}; c_i], s_{i-1}),   h̃_i = tanh(W_c [s_i; c_i; E y_{i-1}] + b_c)
    Luong      s_i = RNN([E y_{i-1}; h̃_{i-1}], s_{i-1})   (h̃_{i-1} with input feeding, h̃_0 = 0)
               e_ij = s_iᵀ h_j | s_iᵀ W_a h_j | v_aᵀ tanh(W_a s_i + U_a h_j + b_a),  α, c_i as above
               h̃_i = tanh(W_c [c_i; s_i])
    output     p(y_i) = softmax(W_s h̃_i + b_s)

The RNN cells are PyTorch's (nn.GRU / nn.LSTM gate order), written out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.special import BOS, EOS, PAD


def gru_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
    """r = σ(W_ir x + b_ir + W_hr h + b_hr), z likewise, n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),
    h' = (1 − z) ⊙ n + z ⊙ h. x: (in,), h: (hidden,)."""
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    (i_r, i_z, i_n), (h_r, h_z, h_n) = gi.chunk(3), gh.chunk(3)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
              b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """i, f, g, o = σ, σ, tanh, σ of (W_i x + b_i + W_h h + b_h); c' = f ⊙ c + i ⊙ g; h' = o ⊙ tanh(c')."""
    i, f, g, o = (w_ih @ x + b_ih + w_hh @ h + b_hh).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _weights(rnn: torch.nn.RNNBase, layer: int, suffix: str = "") -> list[Tensor]:
    return [getattr(rnn, f"{name}_l{layer}{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]


def _cell(rnn: torch.nn.RNNBase, layer: int, x: Tensor, h: Tensor, c: Tensor | None,
          suffix: str = "") -> tuple[Tensor, Tensor | None]:
    if isinstance(rnn, torch.nn.LSTM):
        return lstm_cell(x, h, c, *_weights(rnn, layer, suffix))
    return gru_cell(x, h, *_weights(rnn, layer, suffix)), None


def encode(model, src: list[int]) -> tuple[Tensor, Tensor, Tensor | None]:
    """src: ids, EOS included, no padding -> annotations h_j (src_len, enc_out) and the top layer's final
    states [→h_n; ←h_1] (enc_out,), and the LSTM's final cells likewise (else None)."""
    encoder = model.encoder
    rnn = encoder.rnn
    inputs = [encoder.embed.weight[token] for token in src]             # E x_j, each (emb,)
    is_lstm = isinstance(rnn, torch.nn.LSTM)
    for layer in range(rnn.num_layers):
        directions = []
        finals, final_cells = [], []
        for suffix in ["", "_reverse"][: encoder.directions]:
            h = inputs[0].new_zeros(rnn.hidden_size)
            c = h.clone() if is_lstm else None
            order = range(len(src)) if not suffix else reversed(range(len(src)))
            out: list[Tensor | None] = [None] * len(src)
            for j in order:
                h, c = _cell(rnn, layer, inputs[j], h, c, suffix)
                out[j] = h
            directions.append(out)
            finals.append(h)
            final_cells.append(c)
        inputs = [torch.cat([d[j] for d in directions]) for j in range(len(src))]
    return torch.stack(inputs), torch.cat(finals), torch.cat(final_cells) if is_lstm else None


def initial_state(model, final: Tensor, final_cell: Tensor | None) -> tuple[list[Tensor], list[Tensor] | None]:
    """s_0 per decoder layer: tanh(W_b [→h_n; ←h_1] + b_b) split by layer, or zeros."""
    bridge = model.bridge
    layers, hidden = bridge.dec_layers, bridge.dec_hidden

    def project(linear: torch.nn.Linear | None, value: Tensor) -> list[Tensor]:
        if bridge.kind == "zero":
            return [value.new_zeros(hidden) for _ in range(layers)]
        return list(torch.tanh(linear.weight @ value + linear.bias).view(layers, hidden))

    cells = project(getattr(bridge, "cell", None), final_cell) if bridge.is_lstm else None
    return project(getattr(bridge, "hidden", None), final), cells


def energies(attention, query: Tensor, h: Tensor) -> Tensor:
    """e_j for every source position: query (dec_hidden,), h (src_len, enc_out) -> (src_len,)."""
    kind = type(attention).__name__
    if kind == "LuongDotAttention":
        return h @ query                                                 # s_iᵀ h_j
    if kind == "LuongGeneralAttention":
        return (h @ attention.key_proj.weight.T) @ query                 # s_iᵀ W_a h_j
    w_q = attention.query_proj.weight @ query                            # W_a s
    u_h = h @ attention.key_proj.weight.T + attention.key_proj.bias      # U_a h_j + b_a
    return torch.tanh(w_q + u_h) @ attention.v.weight[0]                 # v_aᵀ tanh(·)


@dataclass
class Step:
    logits: Tensor          # (vocab,) W_s h̃_i + b_s
    alpha: Tensor           # (src_len,)
    state: list[Tensor]     # s_i per layer
    cells: list[Tensor] | None
    attn_hidden: Tensor     # h̃_i


def _rnn_stack(decoder, x: Tensor, state: list[Tensor], cells: list[Tensor] | None):
    rnn = decoder.rnn.rnn
    new_state, new_cells = [], []
    for layer in range(len(state)):
        h, c = _cell(rnn, layer, x, state[layer], None if cells is None else cells[layer])
        new_state.append(h)
        new_cells.append(c)
        x = h
    return new_state, (new_cells if cells is not None else None)


def step(model, h: Tensor, prev: int, state: list[Tensor], cells: list[Tensor] | None, feed: Tensor) -> Step:
    """One decoder step i from y_{i-1} = prev, the states s_{i-1} and (Luong) h̃_{i-1} = feed."""
    decoder = model.decoder
    e_y = decoder.embed.weight[prev]                                     # E y_{i-1}
    if type(decoder).__name__ == "BahdanauDecoder":
        alpha = torch.softmax(energies(decoder.attention, state[-1], h), 0)       # from s_{i-1}
        c = alpha @ h                                                    # c_i = Σ_j α_ij h_j
        state, cells = _rnn_stack(decoder, torch.cat([e_y, c]), state, cells)
        pre = decoder.pre_output
        attn_hidden = torch.tanh(pre.weight @ torch.cat([state[-1], c, e_y]) + pre.bias)
    else:
        x = torch.cat([e_y, feed]) if decoder.input_feeding else e_y
        state, cells = _rnn_stack(decoder, x, state, cells)
        alpha = torch.softmax(energies(decoder.attention, state[-1], h), 0)       # from s_i
        c = alpha @ h
        attn_hidden = torch.tanh(decoder.combine.weight @ torch.cat([c, state[-1]]))
    logits = decoder.output.weight @ attn_hidden + decoder.output.bias
    return Step(logits, alpha, state, cells, attn_hidden)


class Reference:
    """One source sentence, encoded once, decoded step by step (without gradients)."""

    @torch.no_grad()
    def __init__(self, model, src: list[int]) -> None:
        self.model = model
        self.h, final, final_cell = encode(model, src)
        self.state0, self.cells0 = initial_state(model, final, final_cell)

    @torch.no_grad()
    def run(self, inputs: list[int]) -> list[Step]:
        """Teacher forcing over `inputs` = BOS y_1 .. y_n: one Step per input."""
        state, cells = self.state0, self.cells0
        feed = self.h.new_zeros(self.model.decoder.hidden_size)          # h̃_0 = 0
        steps = []
        for token in inputs:
            out = step(self.model, self.h, token, state, cells, feed)
            state, cells, feed = out.state, out.cells, out.attn_hidden
            steps.append(out)
        return steps

    def log_prob(self, tokens: list[int]) -> float:
        """log p(y_1 .. y_n EOS | x)."""
        steps = self.run([BOS, *tokens])
        return sum(float(torch.log_softmax(s.logits, 0)[y]) for s, y in zip(steps, [*tokens, EOS], strict=True))

    @torch.no_grad()
    def greedy(self, max_len: int, min_len: int = 0) -> tuple[list[int], float]:
        """The argmax at each step, never PAD or BOS, no EOS before `min_len` pieces, only EOS at the
        `max_len`-th position (EOS included). Returns the pieces without EOS and log p."""
        tokens: list[int] = []
        total = 0.0
        state, cells = self.state0, self.cells0
        feed = self.h.new_zeros(self.model.decoder.hidden_size)
        prev = BOS
        while True:
            out = step(self.model, self.h, prev, state, cells, feed)
            state, cells, feed = out.state, out.cells, out.attn_hidden
            logp = torch.log_softmax(out.logits, 0)
            if len(tokens) + 1 >= max_len:                            # the last position: EOS, whatever min_len says
                return tokens, total + float(logp[EOS])
            logp[PAD] = logp[BOS] = float("-inf")
            if len(tokens) < min_len:
                logp[EOS] = float("-inf")
            prev = int(logp.argmax())
            total += float(logp[prev])
            if prev == EOS:
                return tokens, total
            tokens.append(prev)
