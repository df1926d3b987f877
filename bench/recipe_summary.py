#!/usr/bin/env python
"""One recipe run (scripts/best_recipe.sh or scripts/quickstart.sh) as one JSON record with the machine's
facts: updates, training minutes, dev BLEU by update and by minute, the setting chosen on dev (the
quickstart's: best.pt, beam 5) and its test_2016_flickr BLEU.

    python -m bench.recipe_summary RUN CONFIG --json-out recipe.json [--threads 1 --precision bf16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.harness import write_result


def summary(run: Path, config: str) -> dict:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    validations = [e for e in events if e.get("event") == "validation"]
    last = max((e for e in events if "wall_time" in e), key=lambda e: e["wall_time"])
    if (run / "eval" / "tune.json").is_file():                        # best_recipe.sh chose on dev
        choice = json.loads((run / "eval" / "tune.json").read_text(encoding="utf-8"))["rows"][0]
        test = json.loads((run / "eval" / "test_2016_flickr.json").read_text(encoding="utf-8"))
    else:                                                              # quickstart.sh: best.pt, beam 5
        choice = {"model": "best.pt", "beam_size": 5, "length_penalty": 1.0, "bleu": None}
        test = json.loads((run / "eval" / "scores.json").read_text(encoding="utf-8"))
    return {
        "config": config,
        "updates": max(e.get("step", 0) for e in events),
        "train_minutes": last["wall_time"] / 60,
        "best_dev_bleu": max(e["bleu"] for e in validations),
        "dev_bleu_curve": [{"step": e["step"], "minutes": round(e["wall_time"] / 60, 3), "bleu": e["bleu"]}
                           for e in validations],
        "choice": f"{Path(choice['model']).name}, beam {choice['beam_size']}, α {choice['length_penalty']}",
        "choice_dev_bleu": choice["bleu"],
        "test_bleu": test["bleu"]["score"],
        "test_chrf": test.get("chrf", {}).get("score"),
        "test_bleu_signature": test["bleu"]["signature"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("config")
    parser.add_argument("--json-out", type=Path, required=True)
    parser.add_argument("--threads", type=int, help="the run's threads, for the machine facts")
    parser.add_argument("--precision", help="the run's precision, for the machine facts")
    args = parser.parse_args()
    record = write_result(args.json_out, summary(args.run, args.config), threads=args.threads,
                          precision=args.precision)
    print(json.dumps({k: v for k, v in record.items() if k not in ("dev_bleu_curve", "machine")}))


if __name__ == "__main__":
    main()
