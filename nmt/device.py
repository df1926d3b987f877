"""Device and numeric precision choices shared by training and translation."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from nmt.config import ConfigError

_CAPTURE_LOCK = threading.Lock()          # one CUDA graph capture at a time in a process


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream) -> Iterator[None]:
    """Record the block's GPU work into `graph` on `stream`, a side stream of the work's device (torch's shared
    capture stream belongs to the device that made it first); one capture at a time, other threads' CUDA allowed."""
    with (_CAPTURE_LOCK, torch.cuda.device(stream.device),
          torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local")):
        yield


def resolve_device(name: str) -> torch.device:
    if not isinstance(name, str) or (name not in ("auto", "cpu", "cuda")
                                     and not (name.startswith("cuda:") and name[5:].isdigit())):
        raise ConfigError(f"unknown device {name!r} (training.device or --device); choose auto, cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name} was asked for (training.device or --device) but no CUDA device is available")
    if name.startswith("cuda:") and int(name[5:]) >= (count := torch.cuda.device_count()):
        raise ConfigError(f"device {name} was asked for (--device) but this machine has "
                          f"{count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device, graphed: bool = False) -> torch.dtype | None:
    """The autocast dtype for a `precision` setting, None for float32. auto: bf16 on CUDA with captured graphs and
    on CPUs that compute it natively. On an H200 bf16 was 1.13x (training) and 1.33x (beam) faster with graphs, but
    1.2-1.4x slower without, autocast adding casts to many small kernels (docs/benchmarks.md). fp16: CUDA only."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        if precision == "fp16":
            return torch.float16
        return torch.bfloat16 if (graphed or precision != "auto") and torch.cuda.is_bf16_supported() else None
    try:
        native_bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        native_bf16 = False
    return torch.bfloat16 if native_bf16 or precision != "auto" else None


def active_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast is running with on `device_type` right now, or None when it is off."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def autocast_once(weight: torch.Tensor) -> torch.Tensor:
    """A derived (non-leaf) tensor that every step reads, cast to the autocast dtype once: autocast caches
    the casts of parameters only, and would cast it again in every step's product. The same values."""
    dtype = active_autocast_dtype(weight.device.type)
    return weight if dtype is None else weight.to(dtype)


def use_deterministic_algorithms() -> None:
    """Deterministic kernels (process-wide), so that a resumed CUDA run repeats the uninterrupted one exactly.
    cuBLAS's fixed workspace counts only if set before its first use."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def make_optimizer(optimizer_class: type, parameters: Iterable[torch.nn.Parameter], **kwargs: Any,
                   ) -> torch.optim.Optimizer:
    """The optimiser as one fused kernel where this device supports it."""
    parameters = list(parameters)
    try:
        return optimizer_class(parameters, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return optimizer_class(parameters, **kwargs)


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op context for plain float32 (dtype None)."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def reuse_freed_memory() -> None:
    """Have glibc keep freed blocks of up to 32 MiB for reuse instead of returning them to the kernel.

    Decoding steps allocate tensors of several MiB; returned blocks fault their pages in again, 4 KiB at a
    time, on the next touch. Greedy decoding ran 7-14% faster (docs/benchmarks.md), at the price of keeping
    the peak heap mapped. Process-wide (translate and serve call it); Linux and glibc only, and not where the
    user set glibc's malloc variables.
    """
    if not sys.platform.startswith("linux"):
        return
    if "GLIBC_TUNABLES" in os.environ or any(name.startswith("MALLOC_") for name in os.environ):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3          # glibc's <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)                                 # glibc's largest allowed value
    mallopt(m_trim_threshold, 1 << 30)
    mallopt(m_top_pad, 64 << 20)
