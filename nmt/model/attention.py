"""Attention: Bahdanau (additive) and Luong (dot, general, concat) scores. Every variant computes

    e_ij  = score(s, h_j)              energies, one per source position j
    α_ij  = softmax_j(e_ij)            weights; padded positions get exactly zero
    c_i   = Σ_j α_ij h_j               the context vector

with the part of `score` that depends only on the source (the keys, e.g. U_a h_j) in `project_keys`,
once per batch. Queries: (rows, d) for one step (rows may be batch*beam) or (batch, tgt_len, d).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_bias(src_mask: Tensor) -> Tensor:
    """(batch, src_len) True at real tokens -> float32 0 there, -inf at the padding: one addition per step
    where a mask takes a negation and a fill (each a kernel launch on a GPU)."""
    bias = torch.zeros(src_mask.shape, dtype=torch.float32, device=src_mask.device)
    return bias.masked_fill_(~src_mask, float("-inf"))


def masked_softmax(scores: Tensor, pad_bias: Tensor, scale: float = 1.0) -> Tensor:
    """softmax_j(scale · scores_j), exactly zero at the padding: scores (batch, [queries,] src_len)."""
    if not pad_bias.is_floating_point():               # a mask would add 1s and 0s and mask nothing
        raise TypeError(f"masked_softmax takes padding_bias(mask), not a {pad_bias.dtype} mask")
    bias = pad_bias if scores.dim() == 2 else pad_bias.unsqueeze(1)
    if scores.device.type == "cpu":
        # bf16 scores stay bf16 as the CPU's autocast leaves them; CUDA's runs the softmax in float32 anyway
        bias = bias.to(scores.dtype)
    return torch.add(bias, scores, alpha=scale).softmax(dim=-1)


@dataclass
class Memory:
    values: Tensor                    # (batch, src_len, enc_out) the annotations h_j
    keys: Tensor                      # (batch, src_len, key_dim) project_keys(h_j)
    mask: Tensor                      # (batch, src_len) True at real tokens
    # (batch, src_len, gates*dec_hidden + dec_hidden) [W_ctx; W_cc] h_j, Bahdanau's folded context (nmt.model.bahdanau)
    context_terms: Tensor | None = None
    pad_bias: Tensor = None  # type: ignore[assignment]  # (batch, src_len) padding_bias(mask), made when not given

    def __post_init__(self) -> None:
        if self.pad_bias is None:
            self.pad_bias = padding_bias(self.mask)

    def index_select(self, index: Tensor) -> Memory:
        terms = None if self.context_terms is None else self.context_terms.index_select(0, index)
        return Memory(self.values.index_select(0, index), self.keys.index_select(0, index),
                      self.mask.index_select(0, index), terms, self.pad_bias.index_select(0, index))

    def group(self, queries: Tensor) -> Tensor:
        """(rows, d) with rows = batch*beam -> (batch, beam, d); (batch, tgt_len, d) stays as it is."""
        return queries.view(self.values.size(0), -1, queries.size(-1))

    def weighted_sum(self, weights: Tensor, values: Tensor, query_shape: torch.Size) -> Tensor:
        """Σ_j α_ij values_j: weights (batch, queries, src_len), values (batch, src_len, d) -> (*query[:-1], d)."""
        return weights.bmm(values).view(*query_shape[:-1], values.size(-1))


class Attention(nn.Module):
    """Base class: α = masked_softmax(score(s, keys)), c = α · h."""

    projects_keys = False              # whether `project_keys` is more than the identity

    def project_keys(self, values: Tensor) -> Tensor:
        return values                  # (batch, src_len, enc_out) -> (batch, src_len, key_dim)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """query: (batch, queries, d); keys: (batch, src_len, key_dim) -> energies (batch, queries, src_len)."""
        raise NotImplementedError

    def weights(self, queries: Tensor, memory: Memory) -> Tensor:
        """α: queries (batch, queries, d) -> (batch, queries, src_len), exactly zero at the padding."""
        return masked_softmax(self.score(queries, memory.keys), memory.pad_bias)

    def forward(self, query: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """query: (rows, dec_hidden) or (batch, tgt_len, dec_hidden) -> context (rows | batch, [tgt_len,] enc_out),
        weights (rows | batch, [tgt_len,] src_len)."""
        weights = self.weights(memory.group(query), memory)                # (batch, queries, src_len)
        context = memory.weighted_sum(weights, memory.values, query.shape)
        return context, weights.view(*query.shape[:-1], weights.size(-1))


class AdditiveAttention(Attention):
    """e_ij = v_aᵀ tanh(W_a s + U_a h_j); the keys are 2·U_a h_j (see `energies`)."""

    projects_keys = True

    def __init__(self, query_size: int, value_size: int, attention_dim: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_size, attention_dim, bias=False)   # W_a
        self.key_proj = nn.Linear(value_size, attention_dim)                 # U_a
        self.v = nn.Linear(attention_dim, 1, bias=False)                     # v_a

    def project_keys(self, values: Tensor) -> Tensor:
        return 2 * self.key_proj(values)                                     # (batch, src_len, attn_dim) 2·U_a h_j

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return self.energies(self.query_proj(query), keys)

    def weights(self, queries: Tensor, memory: Memory) -> Tensor:
        return self.projected_weights(self.query_proj(queries), memory)

    def energies(self, projected: Tensor, keys: Tensor) -> Tensor:
        """v_aᵀ tanh(q + k_j), W-projected q (batch, queries, attn_dim) -> (batch, queries, src_len), as
        2 v_aᵀ σ(2q + 2k_j) − Σ v_a (tanh(x) = 2σ(2x) − 1): the step's largest pass, and PyTorch's CPU sigmoid
        is ~5x faster than its tanh. The keys already hold 2k_j."""
        return 2 * self._v_sigmoid(projected, keys) - self.v.weight.sum()

    def projected_weights(self, projected: Tensor, memory: Memory, v: Tensor | None = None) -> Tensor:
        """α for W-projected queries (batch, queries, attn_dim) -> (batch, queries, src_len); `v`: v_a cast once.
        A softmax ignores the constant − Σ v_a, and the 2 rides on the bias addition: five operations, not eight."""
        return masked_softmax(self._v_sigmoid(projected, memory.keys, v), memory.pad_bias, scale=2.0)

    def _v_sigmoid(self, projected: Tensor, keys: Tensor, v: Tensor | None = None) -> Tensor:
        """v_aᵀ σ(2q + 2k_j): (batch, queries, src_len), in the keys' dtype (training's autocast one halves the
        saved activations; decoding keeps float32 keys: CPU elementwise kernels are slower in bf16)."""
        with torch.autocast(keys.device.type, enabled=False):
            # float32 keys promote a bf16 query inside the addition (on CUDA without a cast kernel of its own)
            query = projected if keys.dtype == torch.float32 else projected.to(keys.dtype)
            sums = torch.add(keys.unsqueeze(1), query.unsqueeze(2), alpha=2)
            gates = sums.sigmoid_()                                          # (batch, queries, src_len, attn_dim)
            return F.linear(gates, (self.v.weight if v is None else v).to(gates.dtype)).squeeze(-1)


class BahdanauAttention(AdditiveAttention):
    """Bahdanau et al. (2015): e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j), on the previous decoder state."""


class LuongConcatAttention(AdditiveAttention):
    """Luong et al. (2015) concat: e_ij = v_aᵀ tanh(W_a [s_i; h_j]) = v_aᵀ tanh(W_s s_i + W_h h_j)."""


class LuongDotAttention(Attention):
    """Luong dot: e_ij = s_iᵀ h_j (needs dec_hidden == enc_out)."""

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return query.bmm(keys.transpose(1, 2))                               # (batch, queries, src_len)


class LuongGeneralAttention(LuongDotAttention):
    """Luong general: e_ij = s_iᵀ W_a h_j; the keys are W_a h_j."""

    projects_keys = True

    def __init__(self, query_size: int, value_size: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(value_size, query_size, bias=False)        # W_a

    def project_keys(self, values: Tensor) -> Tensor:
        return self.key_proj(values)                                         # (batch, src_len, dec_hidden)


def build_attention(kind: str, query_size: int, value_size: int, attention_dim: int) -> Attention:
    if kind == "bahdanau":
        return BahdanauAttention(query_size, value_size, attention_dim)
    if kind == "luong_concat":
        return LuongConcatAttention(query_size, value_size, attention_dim)
    if kind == "luong_general":
        return LuongGeneralAttention(query_size, value_size)
    if kind == "luong_dot":
        if query_size != value_size:
            raise ValueError(f"luong_dot needs model.decoder_hidden ({query_size}) equal to the encoder output size "
                             f"({value_size} = encoder_hidden x directions)")
        return LuongDotAttention()
    raise ValueError(f"unknown attention {kind!r}")
