"""What `nmt score` adds to a process's peak memory, per batch size and precision, on the CPU.

    python -m bench.score_memory MODEL --src train.de --tgt train.en [--pairs 10000] \
        [--batch-tokens 8000 32000] [--precisions fp32 bf16] [--runs 2] [--json-out F]

Each measurement is a fresh process (peak RSS only grows): it loads the Translator, reads its peak RSS,
scores the first --pairs pairs and reads it again. The difference is what scoring's batches cost, the
model's logits and whatever the allocator keeps; the runs alternate between the settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.harness import REPO, run_child, write_result

CHILD = """
import json, resource
from nmt.decode.translator import Translator
translator = Translator.load({model!r}, device="cpu", precision={precision!r}, batch_tokens={batch_tokens})
src = open({src!r}, encoding="utf-8").read().splitlines()[:{pairs}]
tgt = open({tgt!r}, encoding="utf-8").read().splitlines()[:{pairs}]
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
translator.score(src, tgt)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"loaded_mb": loaded / 1024, "peak_mb": peak / 1024, "scoring_added_mb": (peak - loaded) / 1024}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--tgt", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=10000)
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[8000, 32000])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    settings = [(b, p) for b in args.batch_tokens for p in args.precisions]
    added: dict[tuple[int, str], list[float]] = {setting: [] for setting in settings}
    for _ in range(args.runs):
        for batch_tokens, precision in settings:
            code = CHILD.format(model=str(args.model.resolve()), precision=precision, batch_tokens=batch_tokens,
                                src=str(args.src.resolve()), tgt=str(args.tgt.resolve()), pairs=args.pairs)
            child = run_child([sys.executable, "-c", code], cwd=REPO)
            added[(batch_tokens, precision)].append(child["scoring_added_mb"])
    rows = [{"batch_tokens": b, "precision": p, "scoring_added_mb": values,
             "median_mb": statistics.median(values)} for (b, p), values in added.items()]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json_out:
        write_result(args.json_out, {"model": args.model.name, "pairs": args.pairs, "rows": rows}, threads=None)


if __name__ == "__main__":
    main()
