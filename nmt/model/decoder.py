"""Decoders: Bahdanau-style (attend, then step) and Luong-style (step, then attend).

Both expose the same interface: `step` for one token of every row (used by search and by
scheduled sampling), and `forward` for a whole teacher-forced target, which computes what it
can for all steps at once (embeddings, output layer; for Luong without input feeding also the
RNN and the attention).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from nmt.model.attention import Attention, Memory
from nmt.model.encoder import make_rnn


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
        """(batch, dec_hidden) the top layer's state, the query of Bahdanau attention."""
        return self.hidden[-1]


class Decoder(nn.Module):
    """Shared parts: target embeddings, the RNN, the output layer W_s and its dropout."""

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: Attention, context_size: int, dropout: float, rnn_input_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.rnn = make_rnn(rnn_type, rnn_input_size, hidden, layers, dropout)
        self.attention = attention
        self.hidden_size, self.context_size = hidden, context_size
        self.output = nn.Linear(hidden, vocab_size)                    # W_s: h̃ -> logits
        self.is_lstm = rnn_type == "lstm"

    def _run_rnn(self, inputs: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """inputs: (batch, steps, in) -> outputs (batch, steps, hidden), new state (feed unchanged)."""
        if self.is_lstm:
            outputs, (hidden, cell) = self.rnn(inputs, (state.hidden, state.cell))
            return outputs, replace(state, hidden=hidden, cell=cell)
        outputs, hidden = self.rnn(inputs, state.hidden)
        return outputs, replace(state, hidden=hidden)

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        return DecoderState(hidden, cell, None)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens: (batch,) -> logits (batch, vocab), new state, attention weights (batch, src_len)."""
        raise NotImplementedError

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, tgt_in: Tensor, state: DecoderState, memory: Memory,
                teacher_forcing: float = 1.0) -> tuple[Tensor, Tensor]:
        """tgt_in: (batch, tgt_len) BOS y_1 .. y_{n}.

        returns logits (batch, tgt_len, vocab) and attention weights (batch, tgt_len, src_len).
        With teacher_forcing < 1 each row's next input is, with probability 1 - ratio, the
        model's own previous prediction instead of the reference token (scheduled sampling).
        """
        if teacher_forcing >= 1.0:
            return self.teacher_forced(tgt_in, state, memory)
        logits_steps, weight_steps = [], []
        tokens = tgt_in[:, 0]
        for i in range(tgt_in.size(1)):
            logits, state, weights = self.step(tokens, state, memory)
            logits_steps.append(logits)
            weight_steps.append(weights)
            if i + 1 < tgt_in.size(1):
                use_gold = torch.rand(tokens.shape, device=tokens.device) < teacher_forcing
                tokens = torch.where(use_gold, tgt_in[:, i + 1], logits.argmax(-1))
        return torch.stack(logits_steps, 1), torch.stack(weight_steps, 1)


class BahdanauDecoder(Decoder):
    """Bahdanau et al. (2015): attention from the previous state, context fed into the RNN.

        c_i = Σ_j α_ij h_j,  α_i = softmax(v_aᵀ tanh(W_a s_{i-1} + U_a h_j))
        s_i = RNN([E y_{i-1}; c_i], s_{i-1})
        h̃_i = tanh(W_c [s_i; c_i; E y_{i-1}])          (pre-output layer)
        p(y_i) = softmax(W_s h̃_i)
    """

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: Attention, context_size: int, dropout: float) -> None:
        super().__init__(vocab_size, embedding_dim, hidden, layers, rnn_type, attention, context_size, dropout,
                         rnn_input_size=embedding_dim + context_size)
        self.pre_output = nn.Linear(hidden + context_size + embedding_dim, hidden)   # W_c

    def _attend_and_step(self, embedded: Tensor, state: DecoderState, memory: Memory):
        context, weights = self.attention(state.top, memory)           # (batch, enc_out), (batch, src_len)
        rnn_in = torch.cat([embedded, context], dim=-1).unsqueeze(1)   # (batch, 1, emb + enc_out)
        outputs, state = self._run_rnn(rnn_in, state)                  # (batch, 1, dec_hidden)
        return outputs.squeeze(1), context, state, weights

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        embedded = self.dropout(self.embed(prev_tokens))                # (batch, emb)
        s, context, state, weights = self._attend_and_step(embedded, state, memory)
        attn_hidden = torch.tanh(self.pre_output(torch.cat([s, context, embedded], dim=-1)))   # (batch, dec_hidden)
        return self.output(self.dropout(attn_hidden)), state, weights

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        embedded = self.dropout(self.embed(tgt_in))                     # (batch, tgt_len, emb)
        states, contexts, weights = [], [], []
        for i in range(tgt_in.size(1)):                                 # the recurrence needs s_{i-1}
            s, context, state, alpha = self._attend_and_step(embedded[:, i], state, memory)
            states.append(s)
            contexts.append(context)
            weights.append(alpha)
        s_all, c_all = torch.stack(states, 1), torch.stack(contexts, 1)  # (batch, tgt_len, dec_hidden / enc_out)
        attn_hidden = torch.tanh(self.pre_output(torch.cat([s_all, c_all, embedded], dim=-1)))
        return self.output(self.dropout(attn_hidden)), torch.stack(weights, 1)


class LuongDecoder(Decoder):
    """Luong et al. (2015): attention from the current state, then the attentional hidden state.

        s_i = RNN([E y_{i-1}; h̃_{i-1}], s_{i-1})      (h̃_{i-1} only with input feeding)
        c_i = Σ_j α_ij h_j,  α_i = softmax(score(s_i, h_j))
        h̃_i = tanh(W_c [c_i; s_i])
        p(y_i) = softmax(W_s h̃_i)
    """

    def __init__(self, vocab_size: int, embedding_dim: int, hidden: int, layers: int, rnn_type: str,
                 attention: Attention, context_size: int, dropout: float, input_feeding: bool) -> None:
        super().__init__(vocab_size, embedding_dim, hidden, layers, rnn_type, attention, context_size, dropout,
                         rnn_input_size=embedding_dim + (hidden if input_feeding else 0))
        self.input_feeding = input_feeding
        self.combine = nn.Linear(context_size + hidden, hidden, bias=False)   # W_c

    def initial_state(self, hidden: Tensor, cell: Tensor | None) -> DecoderState:
        feed = hidden.new_zeros(hidden.shape[1:]) if self.input_feeding else None   # h̃_0 = 0
        return DecoderState(hidden, cell, feed)

    def _attentional(self, s: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        context, weights = self.attention(s, memory)                    # (batch, [tgt_len,] enc_out)
        return torch.tanh(self.combine(torch.cat([context, s], dim=-1))), weights   # h̃ (batch, [tgt_len,] hidden)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, DecoderState, Tensor]:
        embedded = self.dropout(self.embed(prev_tokens))                # (batch, emb)
        rnn_in = torch.cat([embedded, state.feed], dim=-1) if self.input_feeding else embedded
        outputs, state = self._run_rnn(rnn_in.unsqueeze(1), state)
        attn_hidden, weights = self._attentional(outputs.squeeze(1), memory)
        if self.input_feeding:
            state = replace(state, feed=attn_hidden)
        return self.output(self.dropout(attn_hidden)), state, weights

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        embedded = self.dropout(self.embed(tgt_in))                     # (batch, tgt_len, emb)
        if not self.input_feeding:                                      # fast path: no recurrence through h̃
            s_all, _ = self._run_rnn(embedded, state)                   # one RNN call over all steps
            attn_hidden, weights = self._attentional(s_all, memory)     # one batched attention
            return self.output(self.dropout(attn_hidden)), weights
        hiddens, weights = [], []
        for i in range(tgt_in.size(1)):
            rnn_in = torch.cat([embedded[:, i], state.feed], dim=-1).unsqueeze(1)
            outputs, state = self._run_rnn(rnn_in, state)
            attn_hidden, alpha = self._attentional(outputs.squeeze(1), memory)
            state = replace(state, feed=attn_hidden)
            hiddens.append(attn_hidden)
            weights.append(alpha)
        return self.output(self.dropout(torch.stack(hiddens, 1))), torch.stack(weights, 1)
