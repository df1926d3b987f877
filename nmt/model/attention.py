"""Attention: Bahdanau (additive) and Luong (dot, general, concat) scores.

Every variant computes the same three things, in the textbook's symbols:

    e_ij  = score(s, h_j)              energies, one per source position j
    α_ij  = softmax_j(e_ij)            weights; padded positions get exactly zero
    c_i   = Σ_j α_ij h_j               the context vector

and splits `score` in two so that the part that depends only on the source (the "keys",
e.g. U_a h_j) is computed once per batch by `project_keys`, not once per decoder step.
A query may be one step (batch, dec_hidden) or all steps at once (batch, tgt_len, dec_hidden).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn


def masked_softmax(scores: Tensor, src_mask: Tensor) -> Tensor:
    """scores: (batch, [tgt_len,] src_len); src_mask: (batch, src_len), True at real tokens."""
    mask = src_mask if scores.dim() == 2 else src_mask.unsqueeze(1)
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


@dataclass
class Memory:
    """What the decoder attends over, computed once per batch."""

    values: Tensor                    # (batch, src_len, enc_out) the annotations h_j
    keys: Tensor                      # (batch, src_len, key_dim) project_keys(h_j)
    mask: Tensor                      # (batch, src_len) True at real tokens
    values_in: Tensor | None = None   # (batch, src_len, gates*dec_hidden) W_ctx h_j, for Bahdanau's RNN input

    def index_select(self, index: Tensor) -> Memory:
        """Rows `index` of the batch, e.g. to repeat every sentence once per beam."""
        pick = lambda t: None if t is None else t.index_select(0, index)  # noqa: E731
        return Memory(pick(self.values), pick(self.keys), pick(self.mask), pick(self.values_in))


class Attention(nn.Module):
    """Base class: α = masked_softmax(score(s, keys)), c = α · h."""

    def project_keys(self, values: Tensor) -> Tensor:
        """(batch, src_len, enc_out) -> (batch, src_len, key_dim); the identity unless overridden."""
        return values

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, query: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """query: (batch, dec_hidden) or (batch, tgt_len, dec_hidden).

        returns context (batch, [tgt_len,] enc_out) and weights (batch, [tgt_len,] src_len)
        """
        weights = masked_softmax(self.score(query, memory.keys), memory.mask)
        if weights.dim() == 2:
            context = weights.unsqueeze(1).bmm(memory.values).squeeze(1)   # (batch, enc_out)
        else:
            context = weights.bmm(memory.values)                           # (batch, tgt_len, enc_out)
        return context, weights


def _dot(query: Tensor, keys: Tensor) -> Tensor:
    """query: (batch, [tgt_len,] d); keys: (batch, src_len, d) -> (batch, [tgt_len,] src_len)."""
    if query.dim() == 2:
        return keys.bmm(query.unsqueeze(2)).squeeze(2)
    return query.bmm(keys.transpose(1, 2))


class AdditiveAttention(Attention):
    """e_ij = v_aᵀ tanh(W_a s + U_a h_j); the keys are U_a h_j."""

    def __init__(self, query_size: int, value_size: int, attention_dim: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_size, attention_dim, bias=False)   # W_a
        self.key_proj = nn.Linear(value_size, attention_dim)                 # U_a
        self.v = nn.Linear(attention_dim, 1, bias=False)                     # v_a

    def project_keys(self, values: Tensor) -> Tensor:
        return self.key_proj(values)                                         # (batch, src_len, attn_dim)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """query: (batch, [tgt_len,] dec_hidden); keys: (batch, src_len, attn_dim), already U-projected."""
        return self.energies(self.query_proj(query), keys)

    def energies(self, projected: Tensor, keys: Tensor) -> Tensor:
        """v_aᵀ tanh(q + k_j) for a query already W-projected: (batch, [tgt_len,] attn_dim)."""
        if projected.dim() == 2:
            energy = (projected.unsqueeze(1) + keys).tanh()                  # (batch, src_len, attn_dim)
        else:
            energy = (projected.unsqueeze(2) + keys.unsqueeze(1)).tanh()     # (batch, tgt_len, src_len, attn_dim)
        return self.v(energy).squeeze(-1)                                    # (batch, [tgt_len,] src_len)


class BahdanauAttention(AdditiveAttention):
    """Bahdanau et al. (2015): e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j), on the previous decoder state."""


class LuongConcatAttention(AdditiveAttention):
    """Luong et al. (2015) concat: e_ij = v_aᵀ tanh(W_a [s_i; h_j]) = v_aᵀ tanh(W_s s_i + W_h h_j).

    W_a split into its query and key halves, so the key half is projected once per batch.
    """


class LuongDotAttention(Attention):
    """Luong dot: e_ij = s_iᵀ h_j (needs dec_hidden == enc_out)."""

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return _dot(query, keys)


class LuongGeneralAttention(Attention):
    """Luong general: e_ij = s_iᵀ W_a h_j; the keys are W_a h_j."""

    def __init__(self, query_size: int, value_size: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(value_size, query_size, bias=False)        # W_a

    def project_keys(self, values: Tensor) -> Tensor:
        return self.key_proj(values)                                         # (batch, src_len, dec_hidden)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return _dot(query, keys)


def build_attention(kind: str, query_size: int, value_size: int, attention_dim: int) -> Attention:
    if kind == "bahdanau":
        return BahdanauAttention(query_size, value_size, attention_dim)
    if kind == "luong_concat":
        return LuongConcatAttention(query_size, value_size, attention_dim)
    if kind == "luong_general":
        return LuongGeneralAttention(query_size, value_size)
    if kind == "luong_dot":
        if query_size != value_size:
            raise ValueError(
                f"luong_dot needs model.decoder_hidden ({query_size}) equal to the encoder output size "
                f"({value_size} = encoder_hidden x directions)"
            )
        return LuongDotAttention()
    raise ValueError(f"unknown attention {kind!r}")
