"""Device and numeric precision choices shared by training and translation."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

from nmt.config import ConfigError

_CAPTURE_LOCK = threading.Lock()          # one CUDA graph capture at a time in a process


@contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: tuple | None, stream: torch.cuda.Stream) -> Iterator[None]:
    """Record the block's GPU work into `graph` instead of running it, on `stream`, a side stream of the
    device the work runs on: torch's shared default capture stream belongs to whichever device made it
    first, and a capture there would record nothing of cuda:N's work. One capture at a time (torch allows
    no two at once); other threads' CUDA calls meanwhile, an eager search or scoring, stay allowed
    (thread_local: only this thread's calls that would break a capture raise)."""
    with (_CAPTURE_LOCK, torch.cuda.device(stream.device),
          torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local")):
        yield


def resolve_device(name: str) -> torch.device:
    if name not in ("auto", "cpu", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
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
    """The autocast dtype for `training.precision` / `decoding.precision`, or None for plain float32.

    auto: on CUDA, bfloat16 where the work runs as captured CUDA graphs (`graphed`: nmt.train.graphed,
    nmt.decode.graphs), else float32; on the CPU, bfloat16 where it computes it natively
    (AVX512-BF16/AMX), else float32. Measured on an H200 (docs/benchmarks.md, GPU section): with graphs,
    bf16 trained the reference model 1.13x faster than float32 and beam-searched 100,000 sentences 1.33x
    faster; without them these models spend their time in many small per-step kernels, to which autocast
    only adds casts, and float32 was 1.2-1.4x faster. fp16 runs on CUDA only (with a gradient scaler):
    training and `nmt translate` refuse it on the CPU; a model's stored fp16 decodes there in bfloat16.
    """
    if precision == "fp32":
        return None
    if precision == "auto" and device.type == "cuda":
        return torch.bfloat16 if graphed and torch.cuda.is_bf16_supported() else None
    if device.type == "cuda":
        if precision == "fp16":
            return torch.float16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:
        native_bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        native_bf16 = False
    return torch.bfloat16 if native_bf16 or precision != "auto" else None


def active_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast is running with on `device_type` right now, or None when it is off."""
    try:                                               # torch >= 2.4
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    except TypeError:                                  # torch 2.1 - 2.3
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def use_deterministic_algorithms() -> None:
    """Make every kernel deterministic, so that a resumed CUDA run repeats the uninterrupted one exactly.

    Process-wide and not undone: meant for a process that runs one training (`nmt train`). cuBLAS needs a
    fixed workspace for it; the variable only counts before cuBLAS's first use in the process.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def grad_scaler(enabled: bool):
    """A CUDA gradient scaler (used for float16 only)."""
    try:
        return torch.amp.GradScaler("cuda", enabled=enabled)
    except (AttributeError, TypeError):                # torch < 2.3
        return torch.cuda.amp.GradScaler(enabled=enabled)


def make_optimizer(optimizer_class: type, parameters, **kwargs) -> torch.optim.Optimizer:
    """The optimiser as one fused kernel where this torch and device support it (torch >= 2.4 on CPU)."""
    parameters = list(parameters)
    try:
        return optimizer_class(parameters, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return optimizer_class(parameters, **kwargs)


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """torch.autocast for `dtype`, or a no-op context for plain float32 (dtype None)."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def reuse_freed_memory() -> None:
    """Have glibc keep freed blocks of up to 32 MiB for reuse instead of handing them back to the kernel.

    Every decoding step allocates tensors of several MiB (the additive attention's (rows, src_len,
    attn_dim) pass, a batch's projected memory). By default glibc returns such blocks to the kernel
    when they are freed (mmap'ed blocks, and the top of the heap beyond its trim threshold), so the
    next step's first touch of a fresh block faults its pages in again, 4 KiB at a time. With these
    settings greedy decoding ran 7-14% faster on an AVX2 EPYC (docs/benchmarks.md); the price is that
    the process keeps its peak heap mapped (a long-running `nmt serve` stays at its busiest size).
    A process-wide setting: `nmt translate` and `nmt serve` call it, importing nmt does not. Linux
    only; skipped where the user set glibc's malloc variables; a no-op without `mallopt` (musl).
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
