"""Moved to bench/machine_facts.py. Kept only for scripts/benchmark.py and scripts/profile_training.py,
which import it from this folder until they use bench.harness; loaded by file, so importing this
changes no search path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_machine_facts",
                                               Path(__file__).resolve().parents[1] / "bench" / "machine_facts.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
machine_facts, describe, SIMD_FLAGS = _module.machine_facts, _module.describe, _module.SIMD_FLAGS

__all__ = ["SIMD_FLAGS", "describe", "machine_facts"]
