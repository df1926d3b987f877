"""The output layer's weight padded to a multiple of 16 rows, for its matrix product.

A float32 product with 3,962 outputs (Multi30k's target vocabulary) runs at ~62 GFLOP/s on one
AVX2 core (MKL, torch 2.13), the same product with 3,968 at ~84: kernels work in blocks of 8 or 16
columns and handle a ragged last block slowly. So inference multiplies by a padded copy of W_s
(made once per inference context, nmt.model.inference, i.e. once for a Translator's life; W_s[keep] once per
shortlist batch) and cuts the logits back to the vocabulary, and the training loss pads
inside its fused product; the padded rows are zeros and their logits never reach a softmax over
the real vocabulary (cut off, or pushed to -inf).
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
