#!/usr/bin/env python
"""One recipe run (scripts/best_recipe.sh) as one JSON record: updates, training minutes, dev BLEU by
update and by minute, the setting chosen on dev and its test_2016_flickr BLEU.

    python -m bench.recipe_summary RUN CONFIG --json-out recipe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary(run: Path, config: str) -> dict:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    validations = [e for e in events if e.get("event") == "validation"]
    last = max((e for e in events if "wall_time" in e), key=lambda e: e["wall_time"])
    choice = json.loads((run / "eval" / "tune.json").read_text(encoding="utf-8"))["rows"][0]
    test = json.loads((run / "eval" / "test_2016_flickr.json").read_text(encoding="utf-8"))
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
        "test_bleu_signature": test["bleu"]["signature"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("config")
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args()
    record = summary(args.run, args.config)
    args.json_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in record.items() if k != "dev_bleu_curve"}))


if __name__ == "__main__":
    main()
