"""Scale benchmark: preprocessing and training start-up on corpora of millions of pairs.

Builds corpora of the given sizes from the Multi30k raw training files (every copy shuffled, and
lines lightly varied so they are not all duplicates), then for each size runs, each in a fresh
process under `/usr/bin/time -v`:

* `nmt preprocess` with the reference config: wall time and peak RSS;
* `nmt train` for a few updates: start-up (launch until the training loop starts: imports, data
  folder, model, optimiser) and peak RSS;
* in this process: the time to build one epoch's batches (`BucketBatchSampler.batches`, which the
  training loop runs at the start of every epoch) with the reference batch settings.

The real Multi30k (29k pairs) is measured the same way first, as the baseline.

    python -m bench.scale --work bench/out/scale --sizes 300000,1000000,3000000,10000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "multi30k_de_en_bahdanau.yaml"


def read_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


def build_corpus(multi30k: Path, pairs: int, prefix: Path, seed: int = 0) -> None:
    """`pairs` lines per side: shuffled copies of Multi30k train; in copy c > 0 about half the pairs
    get the copy number appended to both sides, so most lines differ from the original."""
    if all(Path(f"{prefix}.{lang}").is_file() for lang in ("de", "en")):
        return
    de, en = read_gz(multi30k / "train.de.gz"), read_gz(multi30k / "train.en.gz")
    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{prefix}.de.part", "w", encoding="utf-8") as out_de, \
            open(f"{prefix}.en.part", "w", encoding="utf-8") as out_en:
        written, copy = 0, 0
        while written < pairs:
            order = rng.permutation(len(de))[: pairs - written]
            marked = rng.random(len(order)) < 0.5 if copy else np.zeros(len(order), bool)
            suffix = f" {copy}"
            out_de.write("".join(f"{de[i]}{suffix if m else ''}\n" for i, m in zip(order, marked, strict=True)))
            out_en.write("".join(f"{en[i]}{suffix if m else ''}\n" for i, m in zip(order, marked, strict=True)))
            written += len(order)
            copy += 1
    for lang in ("de", "en"):
        os.replace(f"{prefix}.{lang}.part", f"{prefix}.{lang}")


def timed(cmd: list[str], log: Path) -> tuple[float, float, int]:
    """Run `cmd` under /usr/bin/time -v; returns (wall seconds, peak RSS in MB, exit code)."""
    start = time.monotonic()
    with open(log, "w") as handle:
        code = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=handle, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    text = log.read_text(errors="replace")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return wall, int(peak.group(1)) / 1024 if peak else float("nan"), code


def measure(name: str, train_prefix: Path, work: Path, multi30k: Path, updates: int, train_only: bool) -> dict:
    nmt = [sys.executable, "-m", "nmt"]
    data_dir, run_dir = work / f"data_{name}", work / f"run_{name}"
    common = ["--config", str(CONFIG), "--set", f"data.train={train_prefix}",
              "--set", f"data.dev={multi30k / 'val'}", "--set", f"data.test={multi30k / 'test_2016_flickr'}",
              "--set", f"data.out_dir={data_dir}"]
    row: dict = {"corpus": name}
    if not train_only:
        wall, rss, code = timed([*nmt, "preprocess", *common, "--force"], work / f"preprocess_{name}.log")
        row.update(preprocess_s=round(wall, 1), preprocess_rss_mb=round(rss), preprocess_exit=code)
        if code != 0:
            raise SystemExit(f"nmt preprocess failed on {name} (exit {code}); see {work / f'preprocess_{name}.log'}")
    manifest = json.loads((data_dir / "manifest.json").read_text())
    row["pairs"] = manifest["splits"]["train"]["input_pairs"]
    train_cmd = [*nmt, "train", *common, "--overwrite", "--set", f"training.run_dir={run_dir}",
                 "--set", f"training.max_updates={updates}", "--set", "training.log_every=1",
                 "--set", "training.validate_every=1000000", "--set", "training.val_max_sentences=1",
                 "--set", "training.device=cpu"]
    shutil.rmtree(run_dir, ignore_errors=True)                 # this script's own run folder, from an earlier run
    launched = time.time()
    wall, rss, code = timed(train_cmd, work / f"train_{name}.log")
    if code != 0:
        raise SystemExit(f"nmt train failed on {name} (exit {code}); see {work / f'train_{name}.log'}")
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(e for e in events if e.get("event") == "train")
    loop_started = first["time"] - first["wall_time"]           # wall_time counts from the loop's start
    row.update(startup_s=round(loop_started - launched, 1), train_s=round(wall, 1), train_rss_mb=round(rss),
               train_exit=code, epoch_batches_s=round(epoch_batching_seconds(data_dir), 2))
    print(json.dumps(row), flush=True)
    return row


def epoch_batching_seconds(data_dir: Path) -> float:
    """Seconds to build epoch 0's batches of the training split, as the trainer does."""
    from nmt.config import load_config
    from nmt.data.batching import BucketBatchSampler, ParallelIds
    from nmt.data.folder import DataFolder

    t = load_config(CONFIG).training
    folder = DataFolder.open(data_dir)
    train = ParallelIds(folder.ids("train", "src"), folder.ids("train", "tgt"))
    corpora = [(c["start"], c["end"], c["weight"]) for c in folder.manifest["splits"]["train"]["corpora"]]
    sampler = BucketBatchSampler(train.src_lengths, train.tgt_lengths, t.batch_tokens, t.batch_size, t.bucket_pool,
                                 seed=t.seed, corpora=corpora)
    start = time.monotonic()
    sampler.batches(0)
    return time.monotonic() - start


def torch_threads() -> int:
    """The thread count `nmt train` runs with here (training.threads 0: torch's default)."""
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for corpora, data folders, runs, logs")
    parser.add_argument("--multi30k", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--sizes", default="300000,1000000,3000000,10000000", help="comma-separated pair counts")
    parser.add_argument("--updates", type=int, default=5, help="training updates per size")
    parser.add_argument("--json", type=Path, help="write all rows here")
    parser.add_argument("--train-only", action="store_true", help="reuse the data folders of an earlier run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from bench.harness import describe, machine_facts, write_result

    facts = machine_facts(torch_threads())
    print(f"# {describe(facts)}", flush=True)
    rows = [measure("multi30k", args.multi30k / "train", args.work, args.multi30k, args.updates, args.train_only)]
    for size in (int(s) for s in args.sizes.split(",")):
        prefix = args.work / "corpora" / f"train_{size}"
        build_corpus(args.multi30k, size, prefix)
        rows.append(measure(str(size), prefix, args.work, args.multi30k, args.updates, args.train_only))
    if args.json:
        write_result(args.json, {"machine": facts, "rows": rows})
    print("| pairs | preprocess | preprocess peak RSS | train start-up | epoch batches | train peak RSS |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if args.train_only:
            row.update(preprocess_s=float("nan"), preprocess_rss_mb=0)
        print(f"| {row['pairs']:,} | {row['preprocess_s']:.0f} s | {row['preprocess_rss_mb']:,} MB "
              f"| {row['startup_s']:.1f} s | {row['epoch_batches_s']:.2f} s | {row['train_rss_mb']:,} MB |")


if __name__ == "__main__":
    main()
