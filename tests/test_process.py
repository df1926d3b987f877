"""Importing nmt changes no process state; the entry points make the process settings (nmt.process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Every nmt module is imported in a fresh interpreter, and the process state compared before and after.
PROBE = r"""
import importlib, json, os, pkgutil, signal, sys, warnings
import torch
import nmt

def state():
    return {
        "environ": dict(os.environ),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)},
        "warning_filters": len(warnings.filters),
        "recursion_limit": sys.getrecursionlimit(),
    }

before = state()
imported, skipped = [], []
for info in pkgutil.walk_packages(nmt.__path__, "nmt."):
    if info.name in ("nmt.__main__",):        # runs the command line
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except ImportError as exc:                 # an optional extra (serve: fastapi) not installed
        skipped.append(f"{info.name}: {exc}")
print(json.dumps({"before": before, "after": state(), "imported": imported, "skipped": skipped}))
"""

CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def run_python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_every_nmt_module_changes_no_process_state():
    report = json.loads(run_python(PROBE).splitlines()[-1])
    assert {"nmt.train.trainer", "nmt.decode.translator", "nmt.cli.main", "nmt.device"} <= set(report["imported"])
    before, after = report["before"], report["after"]
    assert set(after["environ"].items()) ^ set(before["environ"].items()) == set()
    assert after == before


def test_configure_process_caps_the_kernel_caches_it_is_asked_for_and_keeps_the_users_values():
    code = ("import os; from nmt.process import configure_process; configure_process(); "
            "print(os.environ.get('LRU_CACHE_CAPACITY'), os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY')); "
            "configure_process(training=True); "
            "print(os.environ.get('LRU_CACHE_CAPACITY'), os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY')); "
            "os.environ['LRU_CACHE_CAPACITY'] = '1024'; configure_process(training=True); "
            "print(os.environ['LRU_CACHE_CAPACITY'], 'torch' in __import__('sys').modules)")
    assert run_python(code).split("\n")[:3] == ["16 None", "16 16", "1024 False"]


def test_loading_a_model_leaves_the_compiler_stack_unimported(model_file: Path) -> None:
    """torch._dynamo costs 0.7 s of start-up; checking a file's weights on the meta device must not pull it in."""
    probe = ("import sys; from nmt.modelfile.file import load_model; load_model(sys.argv[1]); "
             "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe, str(model_file)], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_a_loaded_triton_has_its_objects_freed_at_exit() -> None:
    """torch._dynamo loads triton in CUDA builds; triton 3.9's nanobind bindings print "leaked instance" lines
    for its objects still alive at exit, which the command's last line (its `error:` line) must not drown in."""
    probe = ("import sys, types\n"
             "class Bound:\n"
             "    def __del__(self): sys.stderr.write('freed\\n')\n"
             "triton = types.ModuleType('triton'); triton.bound = Bound(); triton.bound.cycle = triton.bound\n"
             "sys.modules['triton'] = triton; del triton\n"
             "from nmt.cli.main import main\n"
             "sys.argv = ['nmt', '--version']; main()\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0 and result.stderr.splitlines() == ["freed"], result.stderr
