#!/usr/bin/env python
"""Speed of the decoding modes, and an A/B of the default searches against another checkout.

Each measurement is a fresh process that loads the checkpoint, translates 50 lines to warm up,
then times `Translator.translate` on the source lines (decoding alone, sentences/s). Rounds
alternate the two code versions (A = --baseline checkout, B = this one) so that a machine
shared with other work loads both alike; the table gives medians and B/A ratios.

    python -m bench.decoding --checkpoint runs/a/best.pt --second runs/b/best.pt \\
        --baseline /tmp/nmt-main --source test.de --lines 300 --rounds 3 --threads 1
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from bench.harness import REPO, alternate, run_child, write_result
from bench.harness import medians as harness_medians

# mode -> (decoding overrides, uses the second checkpoint, runs on the baseline too)
MODES = {
    "greedy": ({"beam_size": 1}, False, True),
    "beam5": ({"beam_size": 5}, False, True),
    "sampling": ({"sampling": True, "top_k": 50, "seed": 1}, False, False),
    "sampling_x5": ({"sampling": True, "top_k": 50, "seed": 1}, False, False),
    "beam5_prefix": ({"beam_size": 5}, False, False),
    "beam5_coverage": ({"beam_size": 5, "coverage_penalty": 0.2}, False, False),
    "ensemble2_greedy": ({"beam_size": 1}, True, False),
    "ensemble2_beam5": ({"beam_size": 5}, True, False),
}


def child(args: argparse.Namespace) -> None:
    import torch

    import nmt
    from nmt.decode.translator import Translator

    torch.set_num_threads(args.threads)
    overrides, ensemble, _ = MODES[args.child]
    if args.precision:
        overrides = {**overrides, "precision": args.precision}
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.lines]
    if ensemble:
        translator = Translator.from_checkpoints([args.checkpoint, args.second], "cpu", **overrides)
    else:
        translator = Translator.from_checkpoint(args.checkpoint, "cpu", **overrides)
    kwargs = {"n_best": 5} if args.child == "sampling_x5" else {}
    if args.child == "beam5_prefix":                                    # the first word of each line's own output
        kwargs["prefixes"] = [t.text.split(" ")[0] for t in translator.translate(lines, **kwargs)]
    translator.translate(lines[:50], **{k: v[:50] if k == "prefixes" else v for k, v in kwargs.items()})
    start = time.perf_counter()
    translator.translate(lines, **kwargs)
    seconds = time.perf_counter() - start
    print(json.dumps({"sent_per_s": len(lines) / seconds, "nmt": str(Path(nmt.__file__).parent)}))


def measure(args: argparse.Namespace, mode: str, root: Path) -> float:
    """One mode in a fresh process that imports nmt from `root` (and this package from here)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-m", "bench.decoding", "--child", mode, "--checkpoint", str(args.checkpoint),
           "--source", str(args.source), "--lines", str(args.lines), "--threads", str(args.threads)]
    if args.precision:
        cmd += ["--precision", args.precision]
    if args.second:
        cmd += ["--second", str(args.second)]
    result = run_child(cmd, env=env, cwd=root)
    if Path(result["nmt"]).resolve() != (root / "nmt").resolve():
        raise SystemExit(f"{mode}: imported nmt from {result['nmt']}, not {root}")
    return result["sent_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--second", type=Path, help="a second checkpoint (same vocabularies) for the ensemble modes")
    parser.add_argument("--baseline", type=Path, help="another checkout of nmt to compare greedy and beam with")
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                        help="decoding.precision (default: the model's)")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    versions = {"B": REPO} | ({"A": args.baseline.resolve()} if args.baseline else {})
    systems = {f"{mode}/{name}": functools.partial(measure, args, mode, root)
               for mode in args.modes if args.second or not MODES[mode][1]
               for name, root in versions.items() if name == "B" or MODES[mode][2]}
    runs = alternate(systems, args.rounds, on_run=lambda index, key, value: print(
        f"round {index + 1} {key:19s}: {value:7.1f} sent/s", file=sys.stderr))
    medians = harness_medians(runs)
    print(f"{args.lines} lines, {args.threads} thread(s), median of {args.rounds} alternating rounds")
    for mode in args.modes:
        if f"{mode}/B" not in medians:
            continue
        line = f"  {mode:17s} {medians[f'{mode}/B']:7.1f} sent/s"
        if f"{mode}/A" in medians:
            base = medians[f"{mode}/A"]
            line += f"   baseline {base:7.1f} sent/s   B/A {medians[f'{mode}/B'] / base:.3f}"
        print(line)
    if args.json_out:
        write_result(args.json_out, {"runs": runs, "medians": medians}, threads=args.threads)


if __name__ == "__main__":
    main()
