"""Training loss: the output layer and softmax cross-entropy fused, in row chunks.

    loss = Σ_i [(1 - ε) (-log p(y_i)) + ε mean_v(-log p(v))],   p = softmax(W_s h̃_i + b)

equal to `F.cross_entropy(F.linear(h̃, W_s, b), y, label_smoothing=ε, reduction="sum")`, without its tokens x
vocabulary tensors (32 MB at 2000 x 4000) streamed through memory again and again: the forward pass walks row
chunks that stay in cache and computes the gradients (softmax - target) with the loss; backward only scales them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.special import PAD
from nmt.device import active_autocast_dtype
from nmt.model.output_rows import padded_rows


class _FusedOutputCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                label_smoothing: float, chunk_rows: int, compute_dtype: torch.dtype, masked: bool) -> Tensor:
        """features: (tokens, hidden); weight: (vocab, hidden); targets: (tokens,) -> summed loss ().
        `masked`: rows whose target is PAD count for nothing (their loss and gradients are zero)."""
        vocab = weight.size(0)
        w = padded_rows(weight.to(compute_dtype))                               # (vocab padded to 16s, hidden)
        padded_bias = padded_rows(bias if bias is not None else weight.new_zeros(vocab, dtype=torch.float32),
                                  float("-inf"))                                  # -inf at the padding
        grad_features = torch.empty_like(features)
        grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=weight.device)
        grad_bias = torch.zeros(w.size(0), dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=features.device)
        for start in range(0, features.size(0), chunk_rows):
            f = features[start : start + chunk_rows].to(compute_dtype)            # (chunk, hidden)
            y = targets[start : start + chunk_rows]                               # (chunk,)
            logits = F.linear(f, w).float()                                       # (chunk, padded vocab)
            logits += padded_bias
            log_probs = logits.log_softmax(-1)
            nll = -log_probs.gather(1, y.unsqueeze(1)).squeeze(1)
            if label_smoothing:
                nll = (1 - label_smoothing) * nll - label_smoothing * log_probs[:, :vocab].mean(-1)
            padding = (y == PAD).unsqueeze(1) if masked else None              # (chunk, 1)
            if padding is not None:
                nll = nll.masked_fill(padding.squeeze(1), 0.0)
            total += nll.sum()
            grad = log_probs.exp_()                                              # softmax, in place; 0 at the padding
            grad.scatter_add_(1, y.unsqueeze(1), grad.new_full((len(y), 1), -(1 - label_smoothing)))
            if label_smoothing:
                grad[:, :vocab] -= label_smoothing / vocab
            if padding is not None:
                grad.masked_fill_(padding, 0.0)
            grad_bias += grad.sum(0)
            grad = grad.to(compute_dtype)
            grad_features[start : start + chunk_rows] = grad @ w                  # (chunk, hidden)
            grad_weight += (grad.t() @ f).float()                                 # (vocab, hidden)
        ctx.save_for_backward(grad_features, grad_weight[:vocab], grad_bias[:vocab])
        ctx.weight_dtype, ctx.has_bias = weight.dtype, bias is not None
        return total

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_features, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_features * grad_output, (grad_weight * grad_output).to(ctx.weight_dtype),
                grad_bias * grad_output if ctx.has_bias else None, None, None, None, None, None)


def output_cross_entropy(features: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                         label_smoothing: float = 0.0, chunk_rows: int = 4096, all_rows: bool = False) -> Tensor:
    """Summed cross-entropy of softmax(features W_sᵀ + b) over the non-PAD targets; products in the autocast
    dtype, softmax in float32. features: (batch, tgt_len, hidden); targets: (batch, tgt_len). `all_rows`
    masks PAD instead of gathering the real rows: static shapes, no host sync (a captured CUDA graph).
    """
    picked, picked_targets = features.reshape(-1, features.size(-1)), targets.reshape(-1)   # (positions, hidden)
    if not all_rows:
        rows = (picked_targets != PAD).nonzero().squeeze(1)
        picked, picked_targets = picked.index_select(0, rows), picked_targets.index_select(0, rows)
    device = features.device.type
    compute_dtype = active_autocast_dtype(device) or picked.dtype      # read before autocast is turned off
    with torch.autocast(device, enabled=False):
        return _FusedOutputCrossEntropy.apply(picked, weight, bias, picked_targets, label_smoothing, chunk_rows,
                                              compute_dtype, all_rows)
