"""Process-wide settings, made by the entry points and never on import.

Importing any nmt module leaves the environment, torch's threads and flags and the signal
handlers as they were (tests/test_process.py checks it); the `nmt` command, `Translator.load` and
`nmt serve` call `configure_process` first. It only sets environment variables that the user has
not set, and imports no torch, so `nmt --help` stays fast.
"""

from __future__ import annotations

import os
import time

KERNEL_CACHE_ENTRIES = "16"


def configure_process(training: bool = False) -> None:
    """Cap the CPU kernel caches before torch's first oneDNN call (the variables are read then).

    bfloat16 matrix products on the CPU keep a compiled kernel, with its buffers, for every new
    shape in ideep's LRU cache (PyTorch's oneDNN wrapper; 1024 entries by default). Training and
    beam search meet a new row count every few batches: 16 entries keep the hot shapes at the same
    speed, with training's peak RSS 1.35 -> 0.75 GB over 200 updates and beam search's 0.87 ->
    0.73 GB (docs/benchmarks.md). `training` also caps oneDNN's own primitive cache below it, also
    one entry per shape of a bf16 product: with training batches of varying shape its default of
    1024 entries grew a training process past 3 GB. Decoding keeps that default: its weights are
    fixed, and the many row counts of a shrinking beam search run 8% faster with it.
    """
    os.environ.setdefault("LRU_CACHE_CAPACITY", KERNEL_CACHE_ENTRIES)
    if training:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", KERNEL_CACHE_ENTRIES)


_command_started: float | None = None     # time.monotonic() when the `nmt` process started, set by nmt.cli.entry


def mark_command_start() -> None:
    """Record when this `nmt` process started (Linux: its start time in /proc, so Python's and the imports'
    start-up count; elsewhere: now). `training.max_minutes` bounds the command from then on."""
    global _command_started
    _command_started = time.monotonic() - (process_age() or 0.0)


def command_started() -> float | None:
    """time.monotonic() at the start of the `nmt` command; None inside another program (the Python API)."""
    return _command_started


def process_age() -> float | None:
    """Seconds since this process started, from /proc (Linux, 10 ms resolution); None where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()      # after the command name, which may hold spaces
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
        return max(0.0, since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))   # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
