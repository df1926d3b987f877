"""Process-wide settings, made by the entry points and never on import (tests/test_process.py checks it):
only environment variables the user has not set, and no torch import, so `nmt --help` stays fast.
"""

from __future__ import annotations

import os
import time

KERNEL_CACHE_ENTRIES = "16"


def configure_process(training: bool = False) -> None:
    """Cap the CPU kernel caches before torch's first oneDNN call (the variables are read then).

    ideep keeps a compiled bf16 kernel for every new shape (1024 by default); training and beam search meet a new
    row count every few batches. 16 entries keep the speed and cut peak RSS 1.35 -> 0.75 GB (training) and 0.87 ->
    0.73 GB (beam; docs/benchmarks.md). Training also caps oneDNN's primitive cache, which grew it past 3 GB;
    decoding keeps that default, 8% faster on a shrinking beam's many row counts.
    """
    os.environ.setdefault("LRU_CACHE_CAPACITY", KERNEL_CACHE_ENTRIES)
    if training:
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", KERNEL_CACHE_ENTRIES)


_command_started: float | None = None     # time.monotonic() when the `nmt` process started, set by nmt.cli.entry


def mark_command_start() -> None:
    """Record when this process started, from /proc (10 ms resolution), so that Python's start-up and the imports
    count toward `training.max_minutes`; elsewhere: now."""
    global _command_started
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()      # after the command name, which may hold spaces
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
        age = max(0.0, since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))   # field 22: starttime
    except (OSError, ValueError, IndexError):
        age = 0.0
    _command_started = time.monotonic() - age


def command_started() -> float | None:
    """time.monotonic() at the start of the `nmt` command; None inside another program (the Python API)."""
    return _command_started
