#!/usr/bin/env python
"""Where a training update's time goes, and how far it is from the machine's matrix-product speed.

Times the phases of each update on the reference model (the encoder with the attention memory,
the teacher-forced decoder loop, the fused output layer and loss, the backward pass, clipping and
the optimiser step), then counts the floating-point work of every matrix product under
torch.profiler and measures this core's float32 GEMM speed, which together give the ceiling: the
target tokens/s if nothing but the products took time, at that speed.

    taskset -c 1 python -m bench.profile_training --threads 1 --precision fp32 [--shapes 12]

The phases are timed in the script's own loop (the trainer's update without batch collation), and
the products' share of the time comes from updates under the profiler, whose overhead on the many
small operations makes that share a little low. `--shapes N` lists the N products that took the
most time, grouped by their shapes without the size that varies by batch (a decoder step's product
is one entry at any batch size, a weight gradient one entry at any token count), each with its
share of the time and its GFLOP/s. The data folder
of the config must exist (`nmt preprocess --config ...`).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")
UNCOUNTED = ("aten::baddbmm", "aten::addbmm", "aten::addmv", "aten::mv", "aten::_addmm_activation")
PHASES = ("encoder and memory, forward", "decoder loop, forward", "output layer and loss (its gradients too)",
          "backward", "clipping and optimiser")


def product_flops(event) -> float:
    """Floating-point operations of one profiled mm / addmm / bmm call, from its recorded shapes."""
    m, k, n = product_dims(event)
    batch = event.input_shapes[0][0] if event.key == "aten::bmm" else 1
    return 2.0 * batch * m * k * n


def product_dims(event) -> tuple[int, int, int]:
    """(M, K, N) of one profiled (M x K) @ (K x N) product; a bmm's batch size is left out."""
    shapes = event.input_shapes
    a, b = (shapes[1], shapes[2]) if event.key == "aten::addmm" else (shapes[0], shapes[1])
    return (a[1], a[2], b[2]) if event.key == "aten::bmm" else (a[0], a[1], b[1])


def shape_keys(events) -> list[str]:
    """A label per product with its size that varies by batch written '.': the rows of a step's product,
    the tokens a weight gradient sums over, a source length. Of the three ways to leave one of M, K, N
    out, each product takes the one that the most products share; ties leave out M (the rows)."""
    def candidates(event) -> list[str]:
        m, k, n = product_dims(event)
        return [f"{event.key} (., {k}) x ({k}, {n})", f"{event.key} ({m}, .) x (., {n})",
                f"{event.key} ({m}, {k}) x ({k}, .)"]
    shared = collections.Counter(key for event in events for key in set(candidates(event)))
    return [max(candidates(event), key=lambda key: shared[key]) for event in events]


def gemm_speed(seconds: float = 1.5) -> float:
    """Float32 GFLOP/s of a 2048^3 matrix product on the threads set."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        a @ b
        runs += 1
    return 2 * 2048**3 * runs / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="fp32", help="training.precision")
    parser.add_argument("--updates", type=int, default=20, help="timed updates (the profiled ones come after)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--shapes", type=int, default=0, metavar="N",
                        help="also list the N products that took the most time, by shape")
    args = parser.parse_args()

    from bench.machine_facts import describe, machine_facts
    from nmt.config import load_config
    from nmt.process import configure_process
    from nmt.train.parts import build_parts

    configure_process(training=True)          # as `nmt train` does
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"training.run_dir={run_dir}/run", "training.device=cpu", f"training.precision={args.precision}"]
        parts = build_parts(load_config(args.config, overrides))
        print("#", describe(machine_facts(args.threads, str(parts.amp_dtype or torch.float32).replace("torch.", ""))))
        if parts.amp_dtype is not None:
            raise SystemExit("the phase split times float32 training only; pass --precision fp32")
        profile(parts, args)


def profile(parts, args: argparse.Namespace) -> None:
    """Print the phase split of `args.updates` updates, then the products' share and the ceiling."""
    from nmt.train.loss import output_cross_entropy
    from nmt.train.trainer import train_step

    model, optimizer = parts.model, parts.optimizer
    clip = parts.config.training.clip_grad_norm
    epoch = parts.sampler.batches(0)
    if len(epoch) < args.warmup + 2 * args.updates:
        raise SystemExit(f"only {len(epoch)} batches per epoch: lower --updates or --warmup "
                         f"(it takes warmup + 2 * updates = {args.warmup + 2 * args.updates})")
    batches = [parts.train_ids.collate(rows) for rows in epoch[: args.warmup + 2 * args.updates]]
    phases: collections.Counter[str] = collections.Counter()
    tokens = 0
    model.train()
    for i, batch in enumerate(batches[: args.warmup + args.updates]):
        if i == args.warmup:
            phases.clear()
            tokens = 0
        optimizer.zero_grad(set_to_none=True)
        marks = [time.perf_counter()]
        memory, state = model.encode(batch.src, batch.src_lengths)
        marks.append(time.perf_counter())
        features, _ = model.decoder(batch.tgt_in, state, memory, features_only=True)   # h̃ after dropout
        marks.append(time.perf_counter())
        output = model.decoder.output
        loss = output_cross_entropy(features, output.weight, output.bias, batch.tgt_out,
                                    parts.config.training.label_smoothing)
        marks.append(time.perf_counter())
        (loss / batch.n_tgt_tokens).backward()
        marks.append(time.perf_counter())
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        marks.append(time.perf_counter())
        for name, (start, end) in zip(PHASES, itertools.pairwise(marks), strict=True):
            phases[name] += end - start
        tokens += batch.n_tgt_tokens
    total = sum(phases.values())
    print(f"{args.updates} updates, {tokens / total:.0f} target tokens/s")
    for name, seconds in phases.items():
        print(f"  {name:45s} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        start, profiled_tokens = time.perf_counter(), 0
        for batch in batches[args.warmup + args.updates :]:
            profiled_tokens += train_step(parts, [batch])[1]
        profiled_seconds = time.perf_counter() - start
    flops = seconds = 0.0
    by_shape: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    uncounted = sorted({event.key for event in prof.key_averages() if event.key in UNCOUNTED})
    if uncounted:
        print(f"warning: products not counted below: {', '.join(uncounted)}")
    products = [event for event in prof.key_averages(group_by_input_shape=True)
                if event.key in PRODUCTS and event.input_shapes]
    for event, shape in zip(products, shape_keys(products), strict=True):
        spent, work = event.self_cpu_time_total / 1e6, product_flops(event) * event.count
        seconds += spent
        flops += work
        entry = by_shape[shape]                              # seconds, FLOP, calls
        entry[0] += spent
        entry[1] += work
        entry[2] += event.count
    per_token = flops / profiled_tokens
    speed = gemm_speed()
    print(f"matrix products: {per_token / 1e6:.1f} MFLOP per target token, {100 * seconds / profiled_seconds:.0f}% of "
          f"the profiled updates' time, at {flops / seconds / 1e9:.1f} GFLOP/s")
    print(f"this core's float32 GEMM (2048^3): {speed:.1f} GFLOP/s -> ceiling {speed * 1e9 / per_token:.0f} target "
          f"tokens/s with nothing but the products, at that speed; measured {tokens / total:.0f} "
          f"({100 * tokens / total / (speed * 1e9 / per_token):.0f}%)")
    if args.shapes:
        print(f"the {args.shapes} products that took the most time (sizes that vary by batch as '.'):")
        for shape, (spent, work, calls) in sorted(by_shape.items(), key=lambda item: -item[1][0])[: args.shapes]:
            speed_here = work / max(spent, 1e-9) / 1e9
            print(f"  {spent:6.2f} s {100 * spent / profiled_seconds:5.1f}%  {speed_here:6.1f} GFLOP/s  "
                  f"{calls:6d} calls  {shape}")


if __name__ == "__main__":
    main()
