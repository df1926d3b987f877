"""W_s padded to a multiple of 16 rows: a float32 product with 3,962 outputs runs at ~62 GFLOP/s on one AVX2
core, with 3,968 at ~84 (ragged blocks are slow). The padded logits never reach a softmax (cut off, or -inf).
"""

from __future__ import annotations

import torch
from torch import Tensor

ROW_MULTIPLE = 16                   # AVX2 kernels block 8 floats, AVX-512 16; also a tensor-core multiple


def padded_rows(rows: Tensor, fill: float = 0.0) -> Tensor:
    """rows: (vocab, ...) -> (vocab rounded up to a multiple of 16, ...), `fill` in the appended rows."""
    extra = -rows.size(0) % ROW_MULTIPLE
    return torch.cat([rows, rows.new_full((extra, *rows.shape[1:]), fill)]) if extra else rows
