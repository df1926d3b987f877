"""bench/profile_training.py on the tiny test model: its phase split and products' count are real measurements."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def test_profile_training_script_small(prepared):
    result = subprocess.run([sys.executable, "-m", "bench.profile_training", "--config", str(prepared),
                             "--updates", "2", "--warmup", "1", "--threads", "1", "--shapes", "3"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.startswith("# ") and "float32" in out.splitlines()[0]            # the machine and precision
    shares = [float(share) for share in re.findall(r" s +([0-9.]+)%$", out, re.MULTILINE)]
    assert len(shares) == 5 and all(share > 0 for share in shares)                # five phases, each timed
    flop = re.search(r"matrix products: ([0-9.]+) MFLOP per target token, ([0-9]+)% of", out)
    assert flop and float(flop.group(1)) > 0 and 0 < int(flop.group(2)) <= 100
    ceiling = re.search(r"ceiling ([0-9]+) target tokens/s .* measured ([0-9]+) \(([0-9]+)%\)", out)
    assert ceiling and int(ceiling.group(1)) > 0 and int(ceiling.group(2)) > 0
    listed = re.findall(r"^ +[0-9.]+ s +([0-9.]+)% +([0-9.]+) GFLOP/s +([0-9]+) calls +aten::(mm|addmm|bmm) ", out,
                        re.MULTILINE)
    assert len(listed) == 3 and all(float(gflops) > 0 and int(calls) > 0 for _, gflops, calls, _ in listed)
    assert [float(share) for share, *_ in listed] == sorted((float(share) for share, *_ in listed), reverse=True)


def test_profile_training_says_when_an_epoch_is_too_short(prepared):
    result = subprocess.run([sys.executable, "-m", "bench.profile_training", "--config", str(prepared),
                             "--updates", "100000"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0 and "batches per epoch" in result.stderr and "Traceback" not in result.stderr


def test_profile_training_refuses_mixed_precision(prepared):
    result = subprocess.run([sys.executable, "-m", "bench.profile_training", "--config", str(prepared),
                             "--updates", "1", "--warmup", "1", "--precision", "bf16"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode != 0 and "pass --precision fp32" in result.stderr


def test_shapes_group_each_product_by_the_size_that_varies():
    """Step products differ in their rows, weight gradients in the tokens they sum over, attention sums in
    the source length: each kind becomes one entry, labelled with that size as '.'."""
    spec = importlib.util.spec_from_file_location("profile_training", REPO / "bench" / "profile_training.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    event = lambda key, *shapes: SimpleNamespace(key=key, input_shapes=list(shapes))  # noqa: E731
    events = [
        *(event("aten::mm", [rows, 512], [512, 2048]) for rows in (97, 100, 88)),         # a decoder step
        *(event("aten::mm", [2048, tokens], [tokens, 512]) for tokens in (1989, 1522)),  # its weight gradient
        event("aten::addmm", [2048], [1400, 512], [512, 2048]),                          # addmm: bias first
        *(event("aten::bmm", [batch, 1, src], [batch, src, 1536]) for batch, src in ((80, 21), (64, 30))),
        event("aten::mm", [7, 3], [3, 5]),                                                # once: rows left out
    ]
    assert script.shape_keys(events) == [
        *["aten::mm (., 512) x (512, 2048)"] * 3,
        *["aten::mm (2048, .) x (., 512)"] * 2,
        "aten::addmm (., 512) x (512, 2048)",
        *["aten::bmm (1, .) x (., 1536)"] * 2,
        "aten::mm (., 3) x (3, 5)",
    ]
