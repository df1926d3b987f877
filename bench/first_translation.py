#!/usr/bin/env python
"""Whole-process time to the first translation: the PyTorch model file against its ONNX folder, side by side.

Each round starts `python -m nmt translate -m MODEL --beam-size 5 --threads T -q` once per model, feeds it
one line and times the process from start to exit (imports, loading, one search, output), alternating the
two; the medians and their ratio are printed and written as JSON.

    python -m bench.first_translation --model model.nmt --onnx model-onnx --rounds 7 --json-out first.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import harness

LINE = "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.\n"


def translate_once(model: Path, threads: int, core: int | None) -> dict[str, float | str]:
    """Seconds from starting the process to its exit, and the translation it wrote."""
    cmd = [*harness.pin(core), sys.executable, "-m", "nmt", "translate", "-m", str(model), "--beam-size", "5",
           "--threads", str(threads), "-q"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(harness.REPO)}
    start = time.perf_counter()
    result = subprocess.run(cmd, input=LINE, capture_output=True, text=True, env=env, cwd=harness.REPO, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed: {result.stderr.strip()}")
    return {"seconds": seconds, "text": result.stdout.strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="A model file (nmt export) or checkpoint.")
    parser.add_argument("--onnx", type=Path, required=True, help="The folder nmt export --format onnx wrote.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--core", type=int, default=None, help="Pin the processes to this CPU core.")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    systems = {"pytorch": lambda: translate_once(args.model, args.threads, args.core),
               "onnx": lambda: translate_once(args.onnx, args.threads, args.core)}
    runs = harness.alternate(systems, args.rounds, warmup=1)
    seconds = harness.medians(runs, "seconds")
    result = {"task": "first translation, whole process", "line": LINE.strip(), "rounds": args.rounds,
              "seconds": seconds, "onnx_over_pytorch": seconds["onnx"] / seconds["pytorch"],
              "same_text": runs["pytorch"][0]["text"] == runs["onnx"][0]["text"]}
    print(f"pytorch {seconds['pytorch']:.2f} s, onnx {seconds['onnx']:.2f} s "
          f"({result['onnx_over_pytorch']:.0%} of the PyTorch path's time), same translation: {result['same_text']}")
    if args.json_out is not None:
        harness.write_result(args.json_out, result, threads=args.threads)


if __name__ == "__main__":
    main()
