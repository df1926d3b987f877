#!/usr/bin/env python
"""Speed and memory of nmt on the reference model (Multi30k de->en).

Measures, each in its own process so peak memory and start-up are counted per task:
  * training: target tokens/s over a fixed number of updates after warm-up (no validation),
    and the process's peak RSS (or torch.cuda.max_memory_allocated on a GPU);
  * decoding test_2016_flickr (1000 sentences), greedy and beam 5: sentences/s for the whole
    `nmt translate` process (start-up and model loading included) and for decoding alone.

    python -m bench.benchmark --threads 1 --checkpoint runs/m30k_de_en_bahdanau/best.pt

Prints a table and writes JSON (--json-out). The data folder of the config must exist
(`nmt preprocess --config ...`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness

REPO = harness.REPO


def measure_training(args: argparse.Namespace) -> dict:
    import torch

    from nmt.config import load_config
    from nmt.process import configure_process
    from nmt.train.parts import build_parts
    from nmt.train.trainer import train_step
    from nmt.train.validation import peak_rss_mb

    configure_process(training=True)          # as `nmt train` does
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision(args.matmul_precision)
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"training.run_dir={run_dir}/run", f"training.device={args.device}",
                     f"training.precision={args.precision}", *args.set]
        parts = build_parts(load_config(args.config, overrides))
        warmup, updates = args.warmup, args.updates
        batches, epoch = [], 0                  # as many epochs as the updates need (CUDA graphs: warm-up
        while len(batches) < warmup + updates:  # over a whole epoch captures every batch shape)
            batches += parts.sampler.batches(epoch)
            epoch += 1
        cuda = parts.device.type == "cuda"
        tokens, start = 0, 0.0
        for i, rows in enumerate(batches[: warmup + updates]):
            if i == warmup:
                if cuda:
                    torch.cuda.synchronize()
                start, tokens = time.perf_counter(), 0
            _, n = train_step(parts, [parts.train_ids.collate(rows)])
            tokens += n
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        result = {"tgt_tokens_per_s": tokens / seconds, "updates": updates, "seconds": seconds,
                  "cuda_graphs": parts.graphed is not None,
                  "precision": str(parts.amp_dtype or torch.float32).replace("torch.", ""),
                  "peak_rss_mb": peak_rss_mb()}
        if cuda:
            result["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return result


def load_translator(args: argparse.Namespace, beam: int) -> Any:
    """The translator `nmt translate -m CHECKPOINT` would use: PyTorch's for a model file or checkpoint,
    onnxruntime's (nmt.runtime, torch never imported) for a folder `nmt export --format onnx` wrote."""
    from nmt.modelfile.onnx_folder import is_onnx_folder

    settings = {"beam_size": beam, "precision": args.precision, "length_penalty": args.length_penalty,
                "batch_tokens": args.batch_tokens, "quantize": args.quantize, "early_stop": args.early_stop,
                **shortlist_overrides(args)}
    if is_onnx_folder(args.checkpoint):
        from nmt.runtime.translator import Translator as OnnxTranslator

        return OnnxTranslator.load(args.checkpoint, args.device, threads=args.threads, **settings)
    import torch

    from nmt.decode.translator import Translator
    from nmt.device import reuse_freed_memory

    torch.set_num_threads(args.threads)
    reuse_freed_memory()                                               # as `nmt translate` does
    return Translator.load(args.checkpoint, args.device, **settings)


def measure_decode_only(args: argparse.Namespace, beam: int, lines: list[str]) -> dict:
    """Sentences/s of translator.translate over `lines` after a warm-up on 50 of them: the same timer
    for both translators, loading and start-up excluded."""
    translator = load_translator(args, beam)
    translator.translate(lines[:50])                                   # warm-up
    start = time.perf_counter()
    out = translator.translate(lines)
    if getattr(getattr(translator, "device", None), "type", "cpu") == "cuda":    # ONNX folders run on a CPU
        import torch

        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if hasattr(translator, "amp_dtype"):                               # PyTorch: its autocast type, if any
        precision = str(translator.amp_dtype or "float32").replace("torch.", "")
    else:                                                              # ONNX: chosen at export
        precision = translator.model.manifest.precision
    return {"sent_per_s": len(lines) / seconds, "seconds": seconds, "outputs": [t.text for t in out],
            "precision": precision}


def child(task: str, args: argparse.Namespace) -> None:
    """Run one measurement in this process and print its JSON on the last line."""
    if task == "train":
        result = measure_training(args)
    else:
        lines = Path(args.source).read_text(encoding="utf-8").splitlines()
        result = measure_decode_only(args, int(task.split("-")[1]), lines)
        result.pop("outputs")
    print(json.dumps(result))


def decoding_options(args: argparse.Namespace) -> list[str]:
    """The decoding overrides given to this script, as options for `nmt translate` and the children."""
    options = []
    for name in ("length_penalty", "batch_tokens", "quantize", "shortlist_k"):
        if getattr(args, name) is not None:
            options += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return options + (["--early-stop"] if args.early_stop else []) + \
        (["--no-shortlist"] if getattr(args, "no_shortlist", False) else [])


def shortlist_overrides(args: argparse.Namespace) -> dict:
    """`--shortlist-k K`: decode with the vocabulary shortlist the checkpoint embeds, K pieces per source piece."""
    if getattr(args, "no_shortlist", False):
        return {"shortlist": False}
    return {} if args.shortlist_k is None else {"shortlist": True, "shortlist_k": args.shortlist_k}


def add_decoding_arguments(parser: argparse.ArgumentParser, whose: str = "") -> None:
    """The decoding settings these measurements pass on to `nmt translate` and to the child (see
    `decoding_options`); `whose` prefixes their help ("our " where another system is measured too)."""
    parser.add_argument("--batch-tokens", type=int, help=f"{whose}decoding.batch_tokens (default: the checkpoint's)")
    parser.add_argument("--quantize", choices=["none", "int8"],
                        help=f"{whose}decoding.quantize (default: the checkpoint's)")
    shortlist = parser.add_mutually_exclusive_group()
    shortlist.add_argument("--shortlist-k", type=int, help=f"{whose}decoding with the checkpoint's vocabulary "
                           "shortlist, K target pieces per source piece (default: off)")
    shortlist.add_argument("--no-shortlist", action="store_true",
                           help=f"{whose}decoding over the whole vocabulary where the model would use its shortlist "
                                "on a CPU by default (the exact search)")
    parser.add_argument("--early-stop", action="store_true",
                        help=f"{whose}beam search with decoding.early_stop (OpenNMT-py's stopping rule)")


def run_child(task: str, args: argparse.Namespace, env: dict, pin: list[str] = ()) -> dict:
    """`pin`: a command prefix such as taskset -c 1."""
    cmd = [*pin, sys.executable, "-m", "bench.benchmark", "--child", task, "--config", str(args.config),
           "--threads", str(args.threads), "--device", args.device, "--precision", args.precision,
           "--matmul-precision", args.matmul_precision,
           "--updates", str(args.updates), "--warmup", str(args.warmup), "--source", str(args.source)]
    if args.checkpoint:
        cmd += ["--checkpoint", str(args.checkpoint)]
    cmd += decoding_options(args)
    for item in args.set:
        cmd += ["--set", item]
    result = harness.run_child(cmd, env=env, cwd=REPO)
    result.pop("wall_s")                     # the child times itself; start-up is not part of its figure
    return result


def whole_process(args: argparse.Namespace, beam: int, env: dict, refs: list[str], pin: list[str] = (),
                  outputs: bool = False) -> dict:
    """Wall time of `nmt translate < test > hyp`, start-up and model loading included (and the
    translations themselves under "outputs" if asked)."""
    from nmt.evaluate import bleu as corpus_bleu

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hyp.txt"
        cmd = [*pin, sys.executable, "-m", "nmt", "translate", "--checkpoint", str(args.checkpoint), "--beam-size",
               str(beam), "--threads", str(args.threads), "--device", args.device, "--precision", args.precision,
               "-q", "-i", str(args.source),
               "-o", str(out)]
        cmd += [option for option in decoding_options(args) if beam > 1 or option != "--early-stop"]
        cmd += ["--shortlist"] if args.shortlist_k is not None else []
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        seconds = time.perf_counter() - start
        hyps = out.read_text(encoding="utf-8").splitlines()
    bleu = corpus_bleu(hyps, refs) if refs else None
    return {"sent_per_s": len(hyps) / seconds, "seconds": seconds, "bleu": bleu,
            **({"outputs": hyps} if outputs else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--checkpoint", type=Path, help="trained checkpoint for the decoding measurements")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto", help="training.precision (auto, fp32, bf16, fp16)")
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="training: torch.set_float32_matmul_precision (high: TF32 products on a GPU)")
    parser.add_argument("--updates", type=int, default=40, help="timed training updates")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1, help="repeat each measurement; the median is reported")
    parser.add_argument("--source", type=Path, help="text to translate (default: the config's test source)")
    parser.add_argument("--reference", type=Path, help="its reference, for a BLEU sanity check")
    parser.add_argument("--length-penalty", type=float, help="decoding.length_penalty (default: the checkpoint's)")
    add_decoding_arguments(parser)
    parser.add_argument("--skip", nargs="*", default=[], choices=["train", "greedy", "beam"])
    parser.add_argument("--set", action="append", default=[], help="config override for training")
    parser.add_argument("--json-out", type=Path, default=harness.OUT / "benchmark.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return

    from nmt.config import load_config
    from nmt.data.corpus import read_lines, resolve_text_file

    config = load_config(args.config)
    if args.source is None and config.data.test:
        args.source = Path(tempfile.mkstemp(suffix=".src")[1])
        args.source.write_text("\n".join(read_lines(resolve_text_file(config.data.test, config.data.src_lang,
                                                                      "data.test"))) + "\n", encoding="utf-8")
        args.reference = resolve_text_file(config.data.test, config.data.tgt_lang, "data.test")
    refs = read_lines(args.reference) if args.reference else []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}

    def median_of(fn) -> dict:
        results = [fn() for _ in range(args.runs)]
        results.sort(key=lambda r: next(v for k, v in r.items() if k in ("tgt_tokens_per_s", "sent_per_s")))
        return results[len(results) // 2]

    report: dict = {"config": str(args.config), "threads": args.threads, "device": args.device,
                    "precision": args.precision, "matmul_precision": args.matmul_precision}
    if "train" not in args.skip:
        report["train"] = median_of(lambda: run_child("train", args, env))
    if args.checkpoint:
        for name, beam in (("greedy", 1), ("beam", 5)):
            if name in args.skip:
                continue
            report[f"{name}_whole_process"] = median_of(lambda beam=beam: whole_process(args, beam, env, refs))
            report[f"{name}_decode_only"] = median_of(lambda beam=beam: run_child(f"decode-{beam}", args, env))
    print_table(harness.write_result(args.json_out, report, threads=args.threads))   # with the machine's facts


def print_table(report: dict) -> None:
    print(f"nmt benchmark on {harness.describe(report['machine'])}, device {report['device']}, "
          f"precision asked: {report['precision']}")
    if "train" in report:
        t = report["train"]
        print(f"  training        {t['tgt_tokens_per_s']:9.0f} tgt tokens/s   peak RSS {t['peak_rss_mb']:.0f} MB"
              f"   ({t['precision']}, {t['updates']} updates)")
    for name in ("greedy", "beam"):
        if f"{name}_whole_process" in report:
            whole, only = report[f"{name}_whole_process"], report[f"{name}_decode_only"]
            bleu = f"   BLEU {whole['bleu']:.2f}" if whole.get("bleu") is not None else ""
            label = "greedy" if name == "greedy" else "beam 5"
            print(f"  decode {label:8s} {whole['sent_per_s']:9.1f} sent/s whole process, "
                  f"{only['sent_per_s']:.1f} sent/s decode only{bleu}   ({only['precision']})")


if __name__ == "__main__":
    main()
