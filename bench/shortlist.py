#!/usr/bin/env python
"""Vocabulary shortlist: BLEU, speed and shortlist size of shortlist settings against the full vocabulary.

Counts co-occurrences once on a data folder's training ids (as `nmt preprocess` does), builds the
shortlist of every setting in `--grid` (score:k:frequent) in memory, and translates `--source`
with each, the full vocabulary first, in one process, `--rounds` times alternating (a machine shared
with other work slows all settings alike). Reports sacreBLEU against `--ref`, sentences/s (median
of the rounds, decoding alone after a warm-up) and the mean shortlist size per batch. Tune on the
dev set; quote the test set.

    taskset -c 1 python -m bench.shortlist --checkpoint runs/a/best.pt --data data/m30k \\
        --source val.de --ref val.en --grid dice:50:100,dice:100:100,prob:100:100 --beam-size 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from nmt.data.folder import DataFolder
from nmt.data.shortlist import CooccurrenceCounts
from nmt.decode.shortlist import SPECIALS, Shortlist
from nmt.decode.translator import Translator
from nmt.evaluate import bleu


class RecordingShortlist(Shortlist):
    """A shortlist that remembers the size of every batch's selection."""

    sizes: list[int]

    def select(self, src, extra=None):
        keep = super().select(src, extra)
        self.sizes.append(int(keep.numel()))
        return keep


def build(counts: CooccurrenceCounts, data: DataFolder, setting: str) -> RecordingShortlist | None:
    """score:k:frequent[@batch_tokens] -> its shortlist; "full[@batch_tokens]" -> None."""
    if setting.split("@")[0] == "full":
        return None
    score, k, frequent = setting.split("@")[0].split(":")
    tgt_size = len(data.vocab("tgt"))
    src_size = counts.src_size
    targets, top = counts.table(np.arange(tgt_size), np.arange(src_size), src_size, int(k), int(frequent), score)
    always = torch.cat([torch.arange(SPECIALS), torch.as_tensor(top, dtype=torch.long)]).unique()
    shortlist = RecordingShortlist(torch.as_tensor(targets, dtype=torch.long), always, tgt_size)
    shortlist.sizes = []
    return shortlist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the data folder the model was trained on")
    parser.add_argument("--source", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--grid", default="prob:50:100",
                        help="score:k:frequent[@batch_tokens],... (score dice or prob); full[@batch_tokens] "
                             "adds a full-vocabulary setting")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-pairs", type=int, default=1_000_000)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    data = DataFolder.open(args.data)
    src_ids, tgt_ids = data.ids("train", "src"), data.ids("train", "tgt")
    counts = CooccurrenceCounts(len(data.vocab("src")), len(data.vocab("tgt")), args.max_pairs)
    start = time.perf_counter()
    counts.add(np.asarray(src_ids.ids), src_ids.lengths.astype(np.int64), np.asarray(tgt_ids.ids),
               tgt_ids.lengths.astype(np.int64))
    print(f"counted {counts.pairs} pairs, {len(counts.keys)} distinct (s, t) in {time.perf_counter() - start:.1f} s")

    full = Translator.load(args.checkpoint, "cpu", beam_size=args.beam_size, precision="fp32")
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()
    refs = Path(args.ref).read_text(encoding="utf-8").splitlines()
    settings = {"full": None} | {s: build(counts, data, s) for s in args.grid.split(",")}
    translators = {}
    for name, shortlist in settings.items():
        decoding = replace(full.decoding, shortlist=shortlist is not None)
        if "@" in name:
            decoding = replace(decoding, batch_tokens=int(name.split("@")[1]))
        translators[name] = Translator(full.model, full.src_vocab, full.tgt_vocab, decoding, full.device, shortlist)
    full.translate(lines[:50])                                              # warm-up
    speeds: dict[str, list[float]] = {name: [] for name in settings}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, translator in translators.items():
            if settings[name] is not None:
                settings[name].sizes.clear()
            start = time.perf_counter()
            outputs[name] = [t.text for t in translator.translate(lines)]
            speeds[name].append(len(lines) / (time.perf_counter() - start))
    base = statistics.median(speeds["full"])
    for name, shortlist in settings.items():
        score = bleu(outputs[name], refs)
        record = {"setting": name, "beam": args.beam_size, "bleu": round(score, 2),
                  "sent_per_s": round(statistics.median(speeds[name]), 1),
                  "speedup": round(statistics.median(speeds[name]) / base, 3),
                  "mean_size": round(float(np.mean(shortlist.sizes)), 1) if shortlist is not None else
                  len(full.tgt_vocab),
                  "batches": len(shortlist.sizes) if shortlist is not None else None,
                  "same_as_full": sum(a == b for a, b in zip(outputs[name], outputs["full"], strict=True))}
        print(json.dumps(record))


if __name__ == "__main__":
    main()
