"""Gradients of what every teacher-forced Bahdanau step reads, W = [W_h; W_a] (y_i = W s_{i-1}) and V = W_ctx h_j
(x_i = Σ_j α_ij V_j), formed once after the loop (dW = Gᵀ S, dV = Aᵀ G) instead of per step with `batch` rows:
faster on the CPU. `attach` routes the initial state through a node whose gradient arrives last; it sums only
its own backward pass's records, so a pass that never reached it leaves nothing behind.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class SharedGrads:
    """One loop's records: `attach` the initial state, then `linear` and `weighted_sum` at every step (with grad)."""

    def __init__(self, weight: Tensor, values: Tensor) -> None:
        self.weight, self.values = weight, values          # (out, in) W; (batch, src_len, d) V
        # One record per step and backward pass: (pass id, the step's input, its output's gradient).
        self.linear_records: list[tuple[int, Tensor, Tensor]] = []   # s_{i-1} (rows, in), dL/dy_i (rows, out)
        self.sum_records: list[tuple[int, Tensor, Tensor]] = []     # α_i (batch, q, src_len), dL/dx_i (batch, q, d)

    def attach(self, state: Tensor) -> Tensor:
        return _SumRecords.apply(state, self.weight, self.values, self)

    def linear(self, x: Tensor) -> Tensor:
        """W x: (rows, in) -> (rows, out)."""
        return _Step.apply(x, self.weight, self.linear_records, True)

    def weighted_sum(self, weights: Tensor, query_shape: torch.Size) -> Tensor:
        """Σ_j α_ij V_j for one step, like `Memory.weighted_sum`: (batch, q, src_len) -> (*query_shape[:-1], d)."""
        return _Step.apply(weights, self.values, self.sum_records, False).view(*query_shape[:-1], self.values.size(-1))


class _Step(torch.autograd.Function):
    """A step's product with the shared tensor, W x (`linear`) or α V; its backward records (x, gradient)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shared: Tensor, records: list, linear: bool) -> Tensor:
        ctx.save_for_backward(x, shared)
        ctx.records, ctx.linear = records, linear
        return F.linear(x, shared) if linear else x.bmm(shared)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        x, shared = ctx.saved_tensors
        ctx.records.append((_backward_pass(), x.detach(), grad))
        shared = shared.to(grad.dtype)
        return (grad.mm(shared) if ctx.linear else grad.bmm(shared.transpose(1, 2))), None, None, None


class _SumRecords(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, state: Tensor, weight: Tensor, values: Tensor, records: SharedGrads) -> Tensor:
        ctx.records = records
        ctx.weight_dtype, ctx.values_dtype = weight.dtype, values.dtype
        return state.clone()

    @staticmethod
    def backward(ctx: Any, grad_state: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, None]:
        records, this_pass = ctx.records, _backward_pass()
        linear = [(x, g) for task, x, g in records.linear_records if task == this_pass]
        sums = [(a, g) for task, a, g in records.sum_records if task == this_pass]
        records.linear_records.clear()
        records.sum_records.clear()
        grad_weight = grad_values = None
        if linear:
            outputs = torch.cat([g for _, g in linear])                               # (steps*rows, out)
            inputs = torch.cat([x for x, _ in linear]).to(outputs.dtype)             # (steps*rows, in)
            grad_weight = outputs.t().mm(inputs).to(ctx.weight_dtype)                # (out, in)
        if sums:
            outputs = torch.cat([g for _, g in sums], 1)                               # (batch, steps*q, d)
            weights = torch.cat([a for a, _ in sums], 1).to(outputs.dtype)            # (batch, steps*q, src_len)
            grad_values = weights.transpose(1, 2).bmm(outputs).to(ctx.values_dtype)  # (batch, src_len, d)
        return grad_state, grad_weight, grad_values, None


def _backward_pass() -> int:
    return torch._C._current_graph_task_id()
