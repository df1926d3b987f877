"""Run by test_kernel_caches.py: heap growth (MB) over bfloat16 matrix products of 200 new shapes,
with the oneDNN cache sizes as importing module argv[1] sets them (or as the environment says)."""

import ctypes
import importlib
import sys

import torch

importlib.import_module(sys.argv[1])   # nmt.train.trainer or nmt.decode.translator: importing sets nothing
from nmt.process import configure_process  # noqa: E402

configure_process(training=sys.argv[1].startswith("nmt.train"))   # as `nmt train`, Translator.load, nmt serve do


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2


def heap_in_use() -> int:
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def forward_backward(rows: int, weight: torch.Tensor) -> None:
    x = torch.randn(rows, weight.size(1), requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, weight)                      # (rows, 1024)
    y.float().sum().backward()


torch.set_num_threads(1)
weight = torch.randn(1024, 256, requires_grad=True)
forward_backward(8, weight)
before = heap_in_use()
for rows in range(9, 209):
    forward_backward(rows, weight)
print((heap_in_use() - before) / 2**20)
