#!/usr/bin/env python
"""Where a GPU's time goes: kernels per training update and per decoded batch, launch calls, busy time.

    python -m bench.profile_gpu_step --config configs/multi30k_de_en_bahdanau.yaml [--model MODEL] --json-out F

Training: the reference model's updates (after warm-up) under torch.profiler: GPU kernels per update, the
kernels' summed time against the update's wall time (how much of it the GPU computes rather than waits),
and the launch calls the host made. Decoding (with --model): the same for translating --lines test lines with
the CUDA graphs on and off, greedy and beam 5. `--device cpu` rehearses it on the CPU, where no kernel is counted.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.harness import synchronize

REPO = Path(__file__).resolve().parents[1]


def _activities(device: str) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


def summarize(prof, wall: float, units: int) -> dict:
    """Kernel count and time, host launch calls, per unit (update or batch of lines)."""
    kernels = kernel_us = launches = graph_launches = 0
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels += event.count
            kernel_us += event.self_device_time_total if hasattr(event, "self_device_time_total") \
                else event.self_cuda_time_total
        elif event.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"):
            launches += event.count
        elif event.key in ("cudaGraphLaunch", "cuGraphLaunch"):
            graph_launches += event.count
    return {"units": units, "wall_ms_per_unit": 1e3 * wall / units, "kernels_per_unit": kernels / units,
            "kernel_ms_per_unit": kernel_us / 1e3 / units, "gpu_busy_share": kernel_us / 1e6 / wall,
            "launch_calls_per_unit": launches / units, "graph_launches_per_unit": graph_launches / units}


def profile_training(args: argparse.Namespace) -> dict:
    from nmt.config import load_config
    from nmt.train.parts import build_parts
    from nmt.train.trainer import train_step

    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config(args.config, [f"training.run_dir={run_dir}/run", f"training.device={args.device}",
                                           f"training.precision={args.precision}", *args.set])
        parts = build_parts(config)
        batches = [parts.train_ids.collate(rows) for rows in parts.sampler.batches(0)[: args.updates + 10]]
        for batch in batches[:10]:
            train_step(parts, [batch])
        synchronize(args.device)
        with profile(activities=_activities(args.device)) as prof:
            start = time.perf_counter()
            for batch in batches[10:]:
                train_step(parts, [batch])
            synchronize(args.device)
            wall = time.perf_counter() - start
        result = summarize(prof, wall, args.updates)
        result["tgt_tokens_per_unit"] = sum(b.n_tgt_tokens for b in batches[10:]) / args.updates
        parts.close()
    return result


def profile_decoding(args: argparse.Namespace, lines: list[str], beam: int, graphs: bool) -> dict:
    from nmt.decode.translator import Translator

    translator = Translator.load(args.model, device=args.device, precision=args.precision, beam_size=beam,
                                 cuda_graphs=graphs)
    translator.translate(lines)                                             # captures, warm-up
    synchronize(args.device)
    with profile(activities=_activities(args.device)) as prof:
        start = time.perf_counter()
        translator.translate(lines)
        synchronize(args.device)
        wall = time.perf_counter() - start
    return {"beam": beam, "graphs": graphs, **summarize(prof, wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--model", type=Path, help="a trained model, for the decoding profile")
    parser.add_argument("--source", type=Path, help="lines to decode (the first --lines are used)")
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], help="config override for training")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a rehearsal")
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args()
    from bench.harness import machine_facts, write_result

    report = {"machine": machine_facts(precision=args.precision), "train": profile_training(args)}
    print(json.dumps(report["train"]), flush=True)
    if args.model and args.source:
        lines = args.source.read_text(encoding="utf-8").splitlines()[: args.lines]
        report["decode"] = []
        for beam in (1, 5):
            for graphs in (True, False):
                report["decode"].append(profile_decoding(args, lines, beam, graphs))
                print(json.dumps(report["decode"][-1]), flush=True)
    write_result(args.json_out, report)


if __name__ == "__main__":
    main()
