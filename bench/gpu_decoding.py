#!/usr/bin/env python
"""GPU decoding speed, in one process per precision: captured graphs against the eager steps.

    python -m bench.gpu_decoding MODEL --source test.de --reference test.en --json-out OUT.json

For each precision (fp32, bf16, fp16) and search (greedy, beam 5): sentences/s of `translate()` over the
whole source after a warm-up on its first 50 lines (decoding alone, median of --runs), with the CUDA graphs
on and off, and BLEU of each output. Also, in a fresh process each: the seconds from the start of Python
to `import torch` done, to the model loaded, and to the first translation of one line (`--first-line`).
`--device cpu` rehearses the same on the CPU (the graphs do not apply there: both runs are eager), so that
a GPU's time is not spent on a broken script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FIRST_LINE = """
import time; t0 = time.perf_counter()
import torch; cuda = {device!r} == "cuda"; cuda and torch.cuda.init(); t1 = time.perf_counter()
from nmt.decode.translator import Translator
translator = Translator.load({model!r}, device={device!r}, precision={precision!r}, beam_size={beam})
cuda and torch.cuda.synchronize(); t2 = time.perf_counter()
text = translator.translate(["Ein Hund läuft durch das Gras."])[0].text
cuda and torch.cuda.synchronize(); t3 = time.perf_counter()
import json; print(json.dumps({{"import_torch_s": t1 - t0, "load_s": t2 - t1, "first_translation_s": t3 - t2,
                               "beyond_import_s": t3 - t1, "text": text}}))
"""


def _capture_costs(translator) -> dict:
    """Shapes captured so far, and the seconds their warm-up runs and captures took (none without graphs)."""
    graphs = translator._graphs
    if graphs is None:
        return {"captured": 0, "warmup_s": 0.0, "capture_s": 0.0}
    return {"captured": graphs.captured, "warmup_s": graphs.warmup_seconds, "capture_s": graphs.capture_seconds}


def decode(model: Path, lines: list[str], refs: list[str], precision: str, beam: int, graphs: bool,
           runs: int, batch_tokens: int | None, device: str = "cuda") -> dict:
    from bench.harness import synchronize
    from nmt.decode.translator import Translator
    from nmt.evaluate import bleu

    overrides = {"batch_tokens": batch_tokens} if batch_tokens else {}
    translator = Translator.load(model, device=device, precision=precision, beam_size=beam, cuda_graphs=graphs,
                                 **overrides)
    start = time.perf_counter()
    translator.translate(lines[:50])                                        # warm-up (and first captures)
    synchronize(device)
    warmup = time.perf_counter() - start
    times, out, captures = [], [], []
    for _ in range(runs):
        before = _capture_costs(translator)
        start = time.perf_counter()
        out = translator.translate(lines)
        synchronize(device)
        times.append(time.perf_counter() - start)
        captures.append({k: v - before[k] for k, v in _capture_costs(translator).items()})
    texts = [t.text for t in out]
    result = {"precision": precision, "beam": beam, "graphs": graphs, "batch_tokens": translator.batch_tokens(),
              "sent_per_s": len(lines) / statistics.median(times), "seconds": times, "warmup_s": warmup,
              "lines": len(lines),
              "graphs_captured": len(translator._graphs.graphs) if translator._graphs else 0,
              "captures_per_run": captures}      # each run's new shapes: how many, warm-up and capture seconds
    if refs:
        result["bleu"] = bleu(texts, refs)
    result["_texts"] = texts
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int)
    parser.add_argument("--no-eager", action="store_true", help="graphs only (large sources)")
    parser.add_argument("--first-line", action="store_true", help="also time start-up to the first translation")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a rehearsal")
    parser.add_argument("--json-out", type=Path, required=True)
    args = parser.parse_args()

    from bench.harness import machine_facts, run_child, write_result

    lines = args.source.read_text(encoding="utf-8").splitlines()
    refs = args.reference.read_text(encoding="utf-8").splitlines() if args.reference else []
    report: dict = {"machine": machine_facts(), "model": str(args.model), "source": str(args.source),
                    "batch_tokens": args.batch_tokens, "decode": []}
    for precision in args.precisions:
        for beam in args.beams:
            pair = {}
            for graphs in ([True] if args.no_eager else [True, False]):
                result = decode(args.model, lines, refs, precision, beam, graphs, args.runs, args.batch_tokens,
                                args.device)
                pair[graphs] = result.pop("_texts")
                report["decode"].append(result)
                print(json.dumps(result), flush=True)
            if len(pair) == 2:
                same = sum(a == b for a, b in zip(pair[True], pair[False], strict=True))
                report["decode"][-1]["same_as_graphed"] = same / len(lines)
    if args.first_line:
        report["first_line"] = []
        for precision in args.precisions:
            for beam in args.beams:
                code = FIRST_LINE.format(model=str(args.model), device=args.device, precision=precision, beam=beam)
                child = run_child([sys.executable, "-c", code], cwd=REPO)
                child.pop("wall_s")
                result = {"precision": precision, "beam": beam, **child}
                report["first_line"].append(result)
                print(json.dumps(result), flush=True)
    write_result(args.json_out, report)


if __name__ == "__main__":
    main()
