"""bf16 matrix products on the CPU cache a compiled kernel per new shape; nmt caps the caches."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.device import autocast_dtype

pytestmark = [
    pytest.mark.skipif(autocast_dtype("auto", torch.device("cpu")) is None, reason="no native bfloat16 on this CPU"),
    pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33 for mallinfo2"),
]

CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def heap_growth_mb(module: str, **env: str) -> float:
    """Heap growth over 200 bf16 products of new shapes in a process that imported `module`."""
    probe = Path(__file__).with_name("kernel_cache_probe.py")
    inherited = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}   # this process's nmt set them
    result = subprocess.run([sys.executable, str(probe), module], capture_output=True, text=True, timeout=120,
                            env={**inherited, "OMP_NUM_THREADS": "1", **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.split()[-1])


def test_training_caps_both_kernel_caches():
    # Training batches vary in shape: with the default caches (1024 entries each) the heap grows
    # by hundreds of MB; nmt caps ideep's and oneDNN's caches at 16 entries.
    capped = heap_growth_mb("nmt.train.trainer")
    uncapped = heap_growth_mb("nmt.train.trainer", LRU_CACHE_CAPACITY="1024", ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024")
    assert capped < 40 < uncapped, (capped, uncapped)


def test_translation_caps_ideeps_kernel_cache_only():
    # Decoding keeps oneDNN's primitive cache (faster beam search) but caps ideep's above it.
    capped = heap_growth_mb("nmt.decode.translator")
    uncapped = heap_growth_mb("nmt.decode.translator", LRU_CACHE_CAPACITY="1024")
    training = heap_growth_mb("nmt.train.trainer")
    assert training < capped < 0.75 * uncapped, (training, capped, uncapped)
