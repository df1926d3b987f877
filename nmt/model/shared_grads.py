"""Gradients of the tensors every step of a recurrence reads, formed once after the loop.

A teacher-forced Bahdanau decoder reads, at every step i, the same weight W = [W_h; W_a]
(y_i = W s_{i-1}) and the same per-batch values V = W_ctx h_j (x_i = Σ_j α_ij V_j). Autograd
forms their gradients step by step and adds each into an accumulator:

    dW += g_iᵀ s_{i-1}        a product with only `batch` rows, at a fraction of the GEMM speed
    dV += α_iᵀ g_i            an outer product over (batch, src_len, d), written and re-read

`SharedGrads` records the (input, gradient) pairs of the steps instead and forms both sums
once, as two large products over all steps: dW = Gᵀ S and dV = Aᵀ G. The sums are the same up
to float rounding.

How the sums find their place in the backward pass: `attach` passes the loop's initial state
through a node that also takes W and V. The state's gradient reaches that node only after the
backward pass of step 0, which comes after every later step's, so by then every step has
recorded its pair; the node returns dW and dV as its inputs' gradients.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class SharedGrads:
    """One training loop's records. Use `attach` on the initial state first, then `linear` and
    `weighted_sum` at every step; outside autograd (no_grad) use the plain operations instead."""

    def __init__(self, weight: Tensor, values: Tensor) -> None:
        self.weight, self.values = weight, values          # (out, in) W; (batch, src_len, d) V
        self.linear_inputs: list[Tensor] = []       # per step s_{i-1}: (rows, in)
        self.linear_grads: list[Tensor] = []        # per step dL/dy_i: (rows, out)
        self.sum_weights: list[Tensor] = []         # per step α_i: (batch, q, src_len)
        self.sum_grads: list[Tensor] = []           # per step dL/dx_i: (batch, q, d)

    def attach(self, state: Tensor) -> Tensor:
        """The initial state, passed through the node that returns dW and dV (see the module doc)."""
        return _Sums.apply(state, self.weight, self.values, self)

    def linear(self, x: Tensor) -> Tensor:
        """W x for one step: (rows, in) -> (rows, out)."""
        return _StepLinear.apply(x, self.weight, self)

    def weighted_sum(self, weights: Tensor) -> Tensor:
        """Σ_j α_ij V_j for one step: weights (batch, q, src_len) -> (batch, q, d)."""
        return _StepWeightedSum.apply(weights, self.values, self)


class _StepLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, grads: SharedGrads) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.grads = grads
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        x, weight = ctx.saved_tensors
        ctx.grads.linear_inputs.append(x)
        ctx.grads.linear_grads.append(grad)
        return grad.mm(weight.to(grad.dtype)), None, None


class _StepWeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weights: Tensor, values: Tensor, grads: SharedGrads) -> Tensor:
        ctx.save_for_backward(weights, values)
        ctx.grads = grads
        return weights.bmm(values)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        weights, values = ctx.saved_tensors
        ctx.grads.sum_weights.append(weights)
        ctx.grads.sum_grads.append(grad)
        return grad.bmm(values.transpose(1, 2).to(grad.dtype)), None, None


class _Sums(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, state: Tensor, weight: Tensor, values: Tensor, grads: SharedGrads) -> Tensor:
        ctx.grads = grads
        ctx.weight_dtype, ctx.values_dtype = weight.dtype, values.dtype
        return state.clone()

    @staticmethod
    def backward(ctx: Any, grad_state: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        grads = ctx.grads
        grad_weight = grad_values = None
        if grads.linear_grads:
            outputs = torch.cat(grads.linear_grads)                               # (steps*rows, out)
            inputs = torch.cat(grads.linear_inputs).to(outputs.dtype)             # (steps*rows, in)
            grad_weight = outputs.t().mm(inputs).to(ctx.weight_dtype)          # (out, in)
        if grads.sum_grads:
            outputs = torch.cat(grads.sum_grads, 1)                               # (batch, steps*q, d)
            weights = torch.cat(grads.sum_weights, 1).to(outputs.dtype)           # (batch, steps*q, src_len)
            grad_values = weights.transpose(1, 2).bmm(outputs).to(ctx.values_dtype)   # (batch, src_len, d)
        for records in (grads.linear_inputs, grads.linear_grads, grads.sum_weights, grads.sum_grads):
            records.clear()
        return grad_state, grad_weight, grad_values, None
