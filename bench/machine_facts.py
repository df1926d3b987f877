"""What a speed figure was measured on: CPU model and SIMD flags, cores, torch, threads, and the GPU if any.

A figure means nothing without its machine (the same code is 2x apart on an AVX512-BF16 CPU and an
AVX2-only one), so every benchmark script records `machine_facts()` in its JSON and prints
`describe()` above its table.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The flags that decide which kernels run: AVX2/FMA (float32 on every x86 of the last decade),
# AVX-512, native bfloat16 (AVX512-BF16) and Intel AMX tiles.
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi (torch does not report it); None without it."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def machine_facts(threads: int | None = None, precision: str | None = None) -> dict:
    """CPU model, SIMD flags present, usable cores, torch version and its CPU kernel level,
    the thread count and the precision a measurement ran with."""
    import torch

    model, flags = _cpuinfo()
    try:
        kernel_level = torch.backends.cpu.get_cpu_capability()
    except AttributeError:                      # torch < 2.1
        kernel_level = "unknown"
    facts = {
        "cpu": model,
        "simd": {flag: flag in flags for flag in SIMD_FLAGS},
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "torch_cpu_kernels": kernel_level,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                        "capability": f"{props.major}.{props.minor}", "count": torch.cuda.device_count(),
                        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                        "driver": _nvidia_driver()}
    if threads is not None:
        facts["threads"] = threads
    if precision is not None:
        facts["precision"] = precision
    return facts


def describe(facts: dict) -> str:
    """One line: 'AMD EPYC (avx2, fma; no avx512f, avx512_bf16, ...), 2 cores, torch 2.13.0 (AVX2 kernels), ...'."""
    have = [flag for flag, present in facts["simd"].items() if present]
    lack = [flag for flag, present in facts["simd"].items() if not present]
    simd = ", ".join(have) + (f"; no {', '.join(lack)}" if lack else "")
    line = (f"{facts['cpu']} ({simd}), {facts['cores']} cores, torch {facts['torch']} "
            f"({facts['torch_cpu_kernels']} kernels)")
    if "gpu" in facts:
        gpu = facts["gpu"]
        line += f"; {gpu['count']}x {gpu['name']} ({gpu['memory_gib']} GiB, CUDA {gpu['cuda']}, cuDNN {gpu['cudnn']})"
    if "threads" in facts:
        line += f", {facts['threads']} thread(s)"
    if "precision" in facts:
        line += f", {facts['precision']}"
    return line


if __name__ == "__main__":
    print(describe(machine_facts()))
