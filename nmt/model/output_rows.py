"""The output layer's weight padded to a multiple of 16 rows, for its matrix product.

A float32 product with 3,962 outputs (Multi30k's target vocabulary) runs at ~62 GFLOP/s on one
AVX2 core (MKL, torch 2.13), the same product with 3,968 at ~84: kernels handle a ragged last block
of 8 or 16 columns slowly. Decoding's step (nmt.decode.steps) and the training loss multiply by a
padded W_s; the padded rows' logits never reach a softmax over the vocabulary (cut off, or -inf).
"""

from __future__ import annotations

import torch
from torch import Tensor

ROW_MULTIPLE = 16                   # AVX2 kernels block 8 floats, AVX-512 16; also a tensor-core multiple


def padded_rows(rows: Tensor, fill: float = 0.0) -> Tensor:
    """rows: (vocab, ...) a weight or a bias -> (vocab rounded up to a multiple of 16, ...), `fill` in the
    appended rows; unchanged when vocab is already a multiple."""
    extra = -rows.size(0) % ROW_MULTIPLE
    if extra == 0:
        return rows
    return torch.cat([rows, rows.new_full((extra, *rows.shape[1:]), fill)])
