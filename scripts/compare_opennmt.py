#!/usr/bin/env python
"""Side by side with OpenNMT-py 3.5.1: training throughput on the same data, pieces and model.

OpenNMT-py is a comparison, never a dependency: install it into its own virtual environment
first (see ../shared/peers/opennmt-setup.sh: VENV=/path bash opennmt-setup.sh). This script

  1. writes Multi30k train/val as pieces of *our* joint SentencePiece model (from the data
     folder of the config), so both systems see the same subwords;
  2. builds OpenNMT's vocabularies and a config equivalent to the reference model
     (brnn GRU 2x256, GRU decoder 512, MLP (Bahdanau) attention, input feeding, dropout 0.3,
     Adam 1e-3, clip 1.0, 2000-token batches; ../shared/peers/opennmt-gru-bahdanau.yaml);
  3. alternates the two systems run by run, each pinned to the same core with the same thread
     count, and reports target tokens/s per run, the medians, and ours/theirs.

    python scripts/compare_opennmt.py --onmt-venv /work/peer_onmt --runs 3 --threads 1 --core 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

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


def write_pieces(config_path: Path, work: Path) -> None:
    from nmt.config import load_config
    from nmt.data.corpus import read_lines, resolve_text_file
    from nmt.data.preprocess import DataFolder

    config = load_config(config_path)
    folder = DataFolder.open(config.data.out_dir)
    sp = folder.vocab("src").sp
    for split, prefix in (("train", config.data.train), ("val", config.data.dev)):
        for lang in (config.data.src_lang, config.data.tgt_lang):
            lines = read_lines(resolve_text_file(prefix, lang, f"data.{split}"))
            pieces = sp.encode(lines, out_type=str)
            (work / f"{split}.sp.{lang}").write_text("".join(" ".join(p) + "\n" for p in pieces), encoding="utf-8")


def onmt_config(work: Path, steps: int, src: str, tgt: str) -> Path:
    config = dict(ONMT_CONFIG)
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


def run_ours(args: argparse.Namespace, env: dict, pin: list[str]) -> float:
    cmd = [*pin, sys.executable, str(REPO / "scripts" / "benchmark.py"), "--child", "train", "--config",
           str(args.config), "--threads", str(args.threads), "--device", "cpu", "--precision", args.precision,
           "--updates", str(args.steps - args.warmup), "--warmup", str(args.warmup), "--source", "/dev/null"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"nmt benchmark failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["tgt_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onmt-venv", type=Path, required=True, help="virtual environment with OpenNMT-py 3.5.1")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_de_en_bahdanau.yaml")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "opennmt")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--core", type=int, help="pin both systems to this CPU core (taskset)")
    parser.add_argument("--steps", type=int, default=60, help="updates per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--precision", default="auto", help="our training.precision")
    parser.add_argument("--json-out", type=Path, default=REPO / "bench" / "compare_opennmt.json")
    args = parser.parse_args()

    from nmt.config import load_config

    data = load_config(args.config).data
    args.work.mkdir(parents=True, exist_ok=True)
    write_pieces(args.config, args.work)
    config = onmt_config(args.work, args.steps, data.src_lang, data.tgt_lang)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    subprocess.run([str(args.onmt_venv / "bin" / "onmt_build_vocab"), "-config", str(config), "-n_sample", "-1"],
                   check=True, capture_output=True, env=env)
    pin = ["taskset", "-c", str(args.core)] if args.core is not None else []

    ours, theirs = [], []
    for run in range(args.runs):                 # alternate, so drifts in machine load hit both
        ours.append(run_ours(args, env, pin))
        theirs.append(run_onmt(args.onmt_venv, config, args.warmup, env, pin))
        print(f"run {run + 1}: nmt {ours[-1]:.0f} tok/s, OpenNMT-py {theirs[-1]:.0f} tok/s", flush=True)
    result = {"nmt_tgt_tokens_per_s": ours, "onmt_tgt_tokens_per_s": theirs,
              "nmt_median": statistics.median(ours), "onmt_median": statistics.median(theirs),
              "threads": args.threads, "steps": args.steps, "warmup": args.warmup}
    result["ratio"] = result["nmt_median"] / result["onmt_median"]
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"training, target tokens/s, median of {args.runs}: nmt {result['nmt_median']:.0f}, "
          f"OpenNMT-py {result['onmt_median']:.0f}, ratio {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
