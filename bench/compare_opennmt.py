#!/usr/bin/env python
"""Side by side with OpenNMT-py 3.5.1: training and decoding throughput on the same data and pieces.

OpenNMT-py is a comparison, never a dependency: install it into its own virtual environment
first (see ../shared/peers/opennmt-setup.sh: VENV=/path bash opennmt-setup.sh). This script

  1. writes Multi30k train/val/test as pieces of *our* joint SentencePiece model (from the data
     folder of the config), so both systems see the same subwords;
  2. builds OpenNMT's vocabularies and a config equivalent to the reference model
     (brnn GRU 2x256, GRU decoder 512, MLP (Bahdanau) attention, input feeding, dropout 0.3,
     Adam 1e-3, clip 1.0, 2000-token batches; ../shared/peers/opennmt-gru-bahdanau.yaml);
  3. training (--task train): alternates the two systems run by run, each pinned to the same
     core with the same thread count, and reports target tokens/s per run, medians, ours/theirs;
  4. decoding (--task decode, needs --checkpoint and --onmt-checkpoint, both trained models):
     translates test_2016_flickr with beam 5 and greedy, alternating the systems, and reports
     sentences/s of the whole process (start-up and model loading included) and of decoding
     alone (our in-process timer; OpenNMT's own "Total translation time"), with BLEU of both.
     OpenNMT gets our length penalty as `-length_penalty wu -alpha A` and its other defaults.

    python -m bench.compare_opennmt --onmt-venv ONMT --runs 3 --threads 1 --core 1
    python -m bench.compare_opennmt --onmt-venv ONMT --task decode --core 1 \
        --checkpoint runs/m30k_de_en_bahdanau/best.pt --onmt-checkpoint bench/out/opennmt/run/model_step_1700.pt

A model for the decoding comparison: `--task train-model --steps 1700` trains OpenNMT-py for
that many updates (about 30 minutes on one core) into WORK/run.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import yaml

from bench import benchmark
from bench.harness import OUT, REPO, alternate, describe, machine_facts, medians, pin, write_result

ONMT_CONFIG = {
    "overwrite": True, "src_seq_length": 50, "tgt_seq_length": 50, "src_vocab_size": 8000, "tgt_vocab_size": 8000,
    "model_type": "text", "encoder_type": "brnn", "decoder_type": "rnn", "rnn_type": "GRU", "enc_layers": 1,
    "dec_layers": 1, "enc_hid_size": 512, "dec_hid_size": 512, "word_vec_size": 256, "global_attention": "mlp",
    "input_feed": 1, "bridge": False, "dropout": [0.3], "optim": "adam", "learning_rate": 0.001,
    "adam_beta1": 0.9, "adam_beta2": 0.999, "max_grad_norm": 1.0, "decay_method": "none",
    "learning_rate_decay": 1.0, "batch_type": "tokens", "batch_size": 2000, "normalization": "tokens",
    "valid_batch_size": 2000, "accum_count": [1], "param_init": 0.1, "seed": 42, "num_workers": 0,
    "world_size": 1, "valid_steps": 1000000, "save_checkpoint_steps": 1000000, "report_every": 10,
}
REPORT = re.compile(r"Step (\d+)/.*?(\d+)/\s*(\d+) tok/s")


def write_pieces(config_path: Path, work: Path, overrides: list[str]) -> None:
    from nmt.config import load_config
    from nmt.data.corpus import read_lines, resolve_text_file
    from nmt.data.folder import DataFolder

    config = load_config(config_path, overrides)
    folder = DataFolder.open(config.data.out_dir)
    sp = folder.vocab("src").sp
    for split, prefix in (("train", config.data.train), ("val", config.data.dev), ("test", config.data.test)):
        for lang in (config.data.src_lang, config.data.tgt_lang):
            lines = read_lines(resolve_text_file(prefix, lang, f"data.{split}"))
            pieces = sp.encode(lines, out_type=str)
            (work / f"{split}.sp.{lang}").write_text("".join(" ".join(p) + "\n" for p in pieces), encoding="utf-8")


def onmt_config(work: Path, steps: int, src: str, tgt: str, device: str = "cpu") -> Path:
    config = dict(ONMT_CONFIG)
    if device == "cuda":
        config["gpu_ranks"] = [0]                            # OpenNMT-py trains on the first GPU
    config.update(
        save_data=str(work / "run"),
        src_vocab=str(work / "run" / "vocab.src"), tgt_vocab=str(work / "run" / "vocab.tgt"),
        data={"corpus_1": {"path_src": str(work / f"train.sp.{src}"), "path_tgt": str(work / f"train.sp.{tgt}"),
                           "transforms": ["filtertoolong"]},
              "valid": {"path_src": str(work / f"val.sp.{src}"), "path_tgt": str(work / f"val.sp.{tgt}")}},
        train_steps=steps, save_model=str(work / "run" / "model"), log_file=str(work / "run" / "train.log"),
    )
    path = work / "onmt.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def build_vocab(venv: Path, work: Path, config: Path, env: dict | None = None) -> None:
    """OpenNMT's vocabularies of the pieces in `work`, once (WORK/run/vocab.*)."""
    if not (work / "run" / "vocab.src").is_file():
        subprocess.run([str(venv / "bin" / "onmt_build_vocab"), "-config", str(config), "-n_sample", "-1"],
                       check=True, capture_output=True, env=env)


def onmt_translate_cmd(venv: Path, model: Path, source: Path, out: Path, beam: int, device: str,
                       alpha: float) -> list[str]:
    """onmt_translate of the pieces in `source` into `out`, with our length penalty as GNMT's `wu`."""
    return [str(venv / "bin" / "onmt_translate"), "-model", str(model), "-src", str(source), "-output", str(out),
            "-beam_size", str(beam), "-gpu", "0" if device == "cuda" else "-1", "-length_penalty", "wu",
            "-alpha", str(alpha)]


def run_onmt(venv: Path, config: Path, warmup: int, env: dict, pin: list[str]) -> float:
    """Mean of OpenNMT's reported target tokens/s over the reports after warm-up."""
    proc = subprocess.run([*pin, str(venv / "bin" / "onmt_train"), "-config", str(config)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"onmt_train failed:\n{proc.stderr[-3000:]}")
    speeds = [int(m.group(3)) for m in REPORT.finditer(proc.stdout + proc.stderr) if int(m.group(1)) > warmup]
    if not speeds:
        raise SystemExit("no 'tok/s' reports found in OpenNMT's log")
    return statistics.mean(speeds)


def benchmark_args(args: argparse.Namespace, source: Path, checkpoint: Path | None = None) -> argparse.Namespace:
    """The options benchmark.py's measurements take, from ours (`checkpoint`: another of our models)."""
    return argparse.Namespace(config=args.config, checkpoint=checkpoint or args.checkpoint, threads=args.threads,
                              device=args.device, precision=args.precision, updates=args.steps - args.warmup,
                              warmup=args.warmup, source=source, set=args.set, length_penalty=args.alpha,
                              batch_tokens=args.batch_tokens, quantize=args.quantize, shortlist_k=args.shortlist_k,
                              no_shortlist=args.no_shortlist, early_stop=args.early_stop, matmul_precision="highest")


def run_ours(args: argparse.Namespace, env: dict, pin: list[str]) -> dict:
    """benchmark.py's training measurement, in its own process: target tokens/s and the precision used."""
    return benchmark.run_child("train", benchmark_args(args, Path("/dev/null")), env, pin)


ONMT_TIME = re.compile(r"Total translation time \(s\): ([0-9.]+)")


def decode_onmt(args: argparse.Namespace, beam: int, env: dict, pin: list[str], refs: list[str]) -> dict:
    """Whole-process wall time of onmt_translate on the test pieces, its own decoding time, and BLEU."""
    from nmt.data.folder import DataFolder
    from nmt.evaluate import bleu

    out = args.work / f"onmt_hyp.b{beam}.sp"
    cmd = [*pin, *onmt_translate_cmd(args.onmt_venv, args.onmt_checkpoint, args.onmt_source, out,
                                     beam, args.device, args.alpha), "-report_time"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"onmt_translate failed:\n{proc.stderr[-3000:]}")
    decode_seconds = float(ONMT_TIME.search(proc.stdout + proc.stderr).group(1))
    sp = DataFolder.open(args.data_dir).vocab("tgt").sp
    hyps = [sp.decode_pieces(line.split()) for line in out.read_text(encoding="utf-8").splitlines()]
    return {"sent_per_s": len(hyps) / seconds, "decode_only_sent_per_s": len(hyps) / decode_seconds,
            "seconds": seconds, "bleu": bleu(hyps, refs), "output_words": sum(len(h.split()) for h in hyps),
            "outputs": hyps}


def decode_ours(args: argparse.Namespace, model: Path, beam: int, env: dict, pin: list[str],
                refs: list[str]) -> dict:
    """benchmark.py's two measurements of `model` (a checkpoint, model file or ONNX folder): `nmt translate`
    as a whole process, and decoding alone (the same in-process timer for PyTorch and onnxruntime)."""
    bench_args = benchmark_args(args, args.work / "test.raw", model)
    whole = benchmark.whole_process(bench_args, beam, env, refs, pin, outputs=True)
    alone = benchmark.run_child(f"decode-{beam}", bench_args, env, pin)
    return {**whole, "decode_only_sent_per_s": alone["sent_per_s"], "precision": alone["precision"],
            "output_words": sum(len(h.split()) for h in whole["outputs"])}


NAMES = {"nmt": "nmt (PyTorch)", "onnx": "nmt (onnxruntime)", "onmt": "OpenNMT-py"}


def compare_decoding(args: argparse.Namespace, env: dict, pin: list[str]) -> dict:
    """Each system's runs, medians and ratios to OpenNMT-py, for beam 5 and greedy, on the first
    `--lines` lines of the test set; with --onnx also how many lines the two nmt paths translate differently."""
    from nmt.config import load_config
    from nmt.data.corpus import read_lines, resolve_text_file

    data = load_config(args.config, args.set).data
    args.src, args.data_dir = data.src_lang, data.out_dir
    source = read_lines(resolve_text_file(data.test, data.src_lang, "data.test"))[: args.lines]
    refs = read_lines(resolve_text_file(data.test, data.tgt_lang, "data.test"))[: args.lines]
    (args.work / "test.raw").write_text("\n".join(source) + "\n", encoding="utf-8")
    pieces = (args.work / f"test.sp.{args.src}").read_text(encoding="utf-8").splitlines(keepends=True)
    args.onmt_source = args.work / f"test.head.sp.{args.src}"
    args.onmt_source.write_text("".join(pieces[: len(source)]), encoding="utf-8")
    report: dict = {"lines": len(source)}
    for name, beam in (("beam5", 5), ("greedy", 1)):
        systems = {"nmt": functools.partial(decode_ours, args, args.checkpoint, beam, env, pin, refs),
                   **({"onnx": functools.partial(decode_ours, args, args.onnx, beam, env, pin, refs)}
                      if args.onnx else {}),
                   "onmt": functools.partial(decode_onmt, args, beam, env, pin, refs)}
        runs = alternate(systems, args.runs, on_run=lambda index, system, r, name=name: print(
            f"{name} run {index + 1}: {NAMES[system]} {r['sent_per_s']:.1f} sent/s "
            f"({r['decode_only_sent_per_s']:.1f} decode only, BLEU {r['bleu']:.2f}, {r['output_words']} words out)",
            flush=True))
        outputs = {system: results[0].pop("outputs") for system, results in runs.items()}
        for results in runs.values():
            for result in results:
                result.pop("outputs", None)
        entry: dict = {"runs": dict(runs)}
        if args.onnx:
            entry["lines_onnx_differs_from_pytorch"] = sum(a != b for a, b in zip(outputs["nmt"], outputs["onnx"],
                                                                                   strict=True))
        for key in ("sent_per_s", "decode_only_sent_per_s"):
            middle = medians(runs, key)
            entry[f"median_{key}"] = middle
            entry[f"over_onmt_{key}"] = {system: value / middle["onmt"] for system, value in middle.items()}
        report[name] = entry
        for key, label in (("sent_per_s", "whole process"), ("decode_only_sent_per_s", "decoding alone")):
            print(f"{name}, {label}, median of {args.runs}: " + ", ".join(
                f"{NAMES[system]} {entry[f'median_{key}'][system]:.1f} sent/s "
                f"({entry[f'over_onmt_{key}'][system]:.2f}x)" for system in systems), flush=True)
        if args.onnx:
            print(f"{name}: {entry['lines_onnx_differs_from_pytorch']} of {len(source)} lines differ between "
                  "the onnxruntime and PyTorch paths", flush=True)
    return report


def compare_training(args: argparse.Namespace, config: Path, env: dict, pin: list[str]) -> dict:
    def ours() -> tuple[float, str]:
        measured = run_ours(args, env, pin)
        return measured["tgt_tokens_per_s"], measured["precision"]

    systems = {"nmt": ours,          # alternate, so drifts in machine load hit both
               "onmt": lambda: (run_onmt(args.onmt_venv, config, args.warmup, env, pin), "float32")}
    runs = alternate(systems, args.runs, on_run=lambda index, name, value: print(
        f"run {index + 1}: {'OpenNMT-py' if name == 'onmt' else 'nmt'} {value[0]:.0f} tok/s ({value[1]})", flush=True))
    ours, theirs = [r[0] for r in runs["nmt"]], [r[0] for r in runs["onmt"]]
    middle = medians({"nmt": ours, "onmt": theirs})
    result = {"nmt_tgt_tokens_per_s": ours, "onmt_tgt_tokens_per_s": theirs,
              "nmt_precision": ", ".join(sorted({r[1] for r in runs["nmt"]})), "onmt_precision": "float32",
              "nmt_median": middle["nmt"], "onmt_median": middle["onmt"],
              "threads": args.threads, "steps": args.steps, "warmup": args.warmup}
    result["ratio"] = result["nmt_median"] / result["onmt_median"]
    print(f"training, target tokens/s, median of {args.runs}: nmt {result['nmt_median']:.0f}, "
          f"OpenNMT-py {result['onmt_median']:.0f}, ratio {result['ratio']:.2f}x")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onmt-venv", type=Path, required=True, help="virtual environment with OpenNMT-py 3.5.1")
    parser.add_argument("--task", choices=["train", "decode", "all", "train-model"], default="train")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--work", type=Path, default=OUT / "opennmt")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="both systems train and decode here")
    parser.add_argument("--core", type=int, help="pin both systems to this CPU core (taskset)")
    parser.add_argument("--steps", type=int, default=60, help="updates per training run, warm-up included")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--precision", default="auto", help="our training.precision")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override in --config (as `nmt train --set`), e.g. data.out_dir of the model's data")
    parser.add_argument("--bridge", action="store_true",
                        help="--task train-model: OpenNMT's bridge layer on the encoder's final state, as our "
                             "`model.bridge: bridge` (OpenNMT's ReLU where ours has tanh)")
    parser.add_argument("--checkpoint", type=Path, help="our trained checkpoint, for --task decode")
    parser.add_argument("--onmt-checkpoint", type=Path, help="OpenNMT-py's trained model, for --task decode")
    parser.add_argument("--onnx", type=Path, help="--task decode: also our --checkpoint's ONNX folder (nmt export "
                                                  "--format onnx) on onnxruntime, a third system")
    parser.add_argument("--lines", type=int, help="--task decode: only the first LINES lines of the test set")
    parser.add_argument("--alpha", type=float, default=1.0, help="GNMT length penalty for both systems")
    benchmark.add_decoding_arguments(parser, whose="our ")
    parser.add_argument("--json-out", type=Path, default=OUT / "compare_opennmt.json")
    args = parser.parse_args()
    if args.task in ("decode", "all") and not (args.checkpoint and args.onmt_checkpoint):
        parser.error("--task decode needs --checkpoint and --onmt-checkpoint")

    from nmt.config import load_config

    data = load_config(args.config, args.set).data
    args.work.mkdir(parents=True, exist_ok=True)
    write_pieces(args.config, args.work, args.set)
    config = onmt_config(args.work, args.steps, data.src_lang, data.tgt_lang, args.device)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    prefix = pin(args.core)
    build_vocab(args.onmt_venv, args.work, config, env)
    if args.task == "train-model":
        subprocess.run([*prefix, str(args.onmt_venv / "bin" / "onmt_train"), "-config", str(config),
                        "-save_checkpoint_steps", str(args.steps), *(["-bridge"] if args.bridge else [])],
                       check=True, env=env)
        return

    facts = machine_facts(args.threads)
    print(f"# {describe(facts)}; our training.precision: {args.precision}", flush=True)
    result: dict = {"machine": facts, "device": args.device, "threads": args.threads, "core": args.core,
                    "precision": args.precision,
                    "our_decoding": {"length_penalty": args.alpha, "batch_tokens": args.batch_tokens,
                                     "quantize": args.quantize, "shortlist_k": args.shortlist_k,
                                     "no_shortlist": args.no_shortlist, "early_stop": args.early_stop}}
    if args.task in ("train", "all"):
        result["train"] = compare_training(args, config, env, prefix)
    if args.task in ("decode", "all"):
        result["decode"] = compare_decoding(args, env, prefix)
    write_result(args.json_out, result)


if __name__ == "__main__":
    main()
