#!/usr/bin/env python
"""Choose the checkpoint, beam size and length penalty on the dev set: a grid, scored with sacreBLEU.

Translates `--src` with every model of `--models` (say best.pt and an `nmt average` of the best
k) at every beam size and length penalty of the grid, scores each against `--ref` and prints a
table, best first. Select on dev only; then score the chosen setting on test once:

    python scripts/tune_decoding.py --models runs/r/best.pt runs/r/averaged.pt \\
        --src data/multi30k/val.de.gz --ref data/multi30k/val.en.gz \\
        --beam-sizes 1,5,10 --length-penalties 0.6,1.0,1.4 --json tune.json

The best setting is the highest BLEU; a tie goes to the smaller beam, then to the penalty closer
to 1, then to the model named first. Greedy search (beam 1) ignores the length penalty, so it is
run once per model.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from nmt.cli.main import one_line
from nmt.decode.translator import Translator
from nmt.evaluate import check_lengths, read_text, score
from nmt.fs.folders import atomic_write
from nmt.fs.outputs import check_outputs


def parse_list(text: str, option: str, kind: type, minimum: float) -> list:
    """'1,5,10' -> [1, 5, 10]; ValueError naming the option when empty, malformed or below `minimum`."""
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a comma-separated list of {kind.__name__}s") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{option}: give one or more values >= {minimum}, got {text!r}")
    return values


def grid(beam_sizes: list[int], length_penalties: list[float]) -> list[tuple[int, float]]:
    """Every (beam, length penalty) pair, with greedy search once (its penalty does not matter)."""
    settings = [(1, 1.0)] if 1 in beam_sizes else []
    return settings + [(beam, alpha) for beam in beam_sizes if beam > 1 for alpha in length_penalties]


def tune(models: list[Path], sources: list[str], refs: list[str], beam_sizes: list[int],
         length_penalties: list[float], device: str = "cpu") -> list[dict[str, Any]]:
    """Rows {model, beam_size, length_penalty, bleu, chrf, bleu_signature}, best first: the highest
    BLEU, a tie going to the smaller beam, then the penalty closer to 1, then the model named first."""
    rows = []
    for model in models:
        translator = Translator.load(model, device=device)
        for beam, alpha in grid(beam_sizes, length_penalties):      # both checked by parse_list
            translator.decoding = replace(translator.decoding, beam_size=beam, length_penalty=alpha)
            hyps = [str(t) for t in translator.translate(sources)]
            scores = score(hyps, refs)
            rows.append({"model": str(model), "beam_size": beam, "length_penalty": alpha,
                         "bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"],
                         "bleu_signature": scores["bleu"]["signature"]})
            print(f"{model}  beam {beam:>2}  length penalty {alpha:.2f}  BLEU {rows[-1]['bleu']:6.2f}  "
                  f"chrF2 {rows[-1]['chrf']:6.2f}", file=sys.stderr, flush=True)
    return sorted(rows, key=lambda r: (-r["bleu"], r["beam_size"], abs(r["length_penalty"] - 1.0)))   # stable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, nargs="+", required=True, help="checkpoints or model files")
    parser.add_argument("--src", type=Path, required=True, help="dev source text (never the test set)")
    parser.add_argument("--ref", type=Path, required=True, help="dev references")
    parser.add_argument("--beam-sizes", default="1,5,10")
    parser.add_argument("--length-penalties", default="0.6,1.0,1.4")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = torch's default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="write the rows here, best first")
    args = parser.parse_args()
    try:
        if args.threads < 0:
            raise ValueError(f"--threads: must be 0 or more, got {args.threads}")
        beam_sizes = parse_list(args.beam_sizes, "--beam-sizes", int, 1)
        length_penalties = parse_list(args.length_penalties, "--length-penalties", float, 0.0)
        inputs = [("--src", args.src), ("--ref", args.ref), *(("--models", model) for model in args.models)]
        target = check_outputs({"--json": args.json}, inputs).get("--json")     # not a dev file, no planted link
        if args.threads:
            torch.set_num_threads(args.threads)
        sources, refs = read_text(args.src), read_text(args.ref)
        check_lengths(sources, refs, str(args.src), str(args.ref))
        rows = tune(args.models, sources, refs, beam_sizes, length_penalties, args.device)
        if target is not None:
            report = json.dumps({"src": str(args.src), "ref": str(args.ref), "rows": rows}, indent=1) + "\n"
            atomic_write(target, lambda handle: handle.write(report), mode="w")
    except (ValueError, OSError) as exc:      # EvaluationError, ModelFileError, ConfigError, FolderError
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
    print("| model | beam | length penalty | dev BLEU | dev chrF2 |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['beam_size']} | {row['length_penalty']} | {row['bleu']:.2f} "
              f"| {row['chrf']:.2f} |")
    print(f"best on {args.src}: {rows[0]['model']} beam {rows[0]['beam_size']} "
          f"length penalty {rows[0]['length_penalty']} ({rows[0]['bleu_signature']})")


if __name__ == "__main__":
    main()
