"""What a GPU's `nmt translate` spends on the host per sentence, measured without a GPU.

    python -m bench.host_side MODEL --source FILE [--lines 100000] [--beams 1 5] [--batch-tokens 64000] \
        [--json-out F]

On a GPU the searches' steps are captured graphs and the host's share is the text around them:
SentencePiece in and out, one Hypothesis and one Translation per line, and each batch's set-up. Here the
same static-shape searches run eagerly on the CPU (nmt.decode.graphs, capture=False) under cProfile,
and the time of everything that is not the model's or the search's tensor work is summed per function.
Those seconds add to a GPU's whole-process time unless they overlap its decoding: with `import torch`
and CUDA's start, they bound what a whole process can reach (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch

# the host-side functions: (file suffix, function name) -> what they do
HOST = {("nmt/data/tokenizer.py", "encode"): "SentencePiece in, side ids",
        ("nmt/data/tokenizer.py", "decode"): "side ids to SentencePiece out",
        ("nmt/decode/rule.py", "collect"): "greedy: one Hypothesis per line",
        ("nmt/decode/rule.py", "collect_beams"): "beam: the n best Hypotheses per line",
        ("nmt/decode/graphs.py", "_backtrack"): "beam: tokens from the recorded parents",
        ("nmt/decode/translator.py", "_truncate"): "over-long lines cut",
        ("nmt/data/rows.py", "cut_by_budget"): "batches cut",
        ("nmt/data/rows.py", "padded_ids"): "batches padded"}


def profile_translate(model: Path, lines: list[str], beam: int, batch_tokens: int) -> dict:
    """One `Translator.translate` of `lines` with the GPU's searches run on the CPU, profiled."""
    from nmt.decode import translator as translation
    from nmt.decode.graphs import SearchGraphs

    translator = translation.Translator.load(model, "cpu", beam_size=beam, batch_tokens=batch_tokens,
                                             precision="fp32", shortlist=False)
    # the GPU's path on the CPU: every plain search through the static-shape searches
    translator._graphs = SearchGraphs(translator.search_model, capture=False)
    translator.translate(lines[:50])
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    translator.translate(lines)
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats                                # (file, line, name) -> (.., cumtime, ..)
    host = {f"{name} ({what})": 0.0 for (_, name), what in HOST.items()}
    for (file, _, name), (_, _, _, cumulative, _) in stats.items():
        for (suffix, function), what in HOST.items():
            if file.endswith(suffix) and name == function:
                host[f"{name} ({what})"] += cumulative
    per_line = [stats[key] for key in stats if key[0].endswith("nmt/decode/translator.py") and key[2] == "<listcomp>"]
    host["Translation objects and the rest of translate's per-line lists"] = sum(s[3] for s in per_line)
    total = sum(host.values())
    return {"beam": beam, "batch_tokens": translator.batch_tokens(), "lines": len(lines),
            "wall_s_on_this_cpu": wall, "host_s": total, "host_us_per_line": 1e6 * total / len(lines),
            "host_s_by_part": host}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="a model file or checkpoint (a small one is quicker: the "
                                                 "host's share does not depend on the model's size)")
    parser.add_argument("--source", type=Path, required=True, help="text, one sentence per line (repeated to --lines)")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--batch-tokens", type=int, default=64000)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    from bench.harness import write_result
    from nmt.data.corpus import read_lines

    torch.set_num_threads(1)
    source = read_lines(args.source)
    lines = [source[i % len(source)] for i in range(args.lines)]
    rows = []
    for beam in args.beams:
        rows.append(profile_translate(args.model, lines, beam, args.batch_tokens))
        print(f"beam {beam}: host {rows[-1]['host_s']:.2f} s for {len(lines)} lines "
              f"({rows[-1]['host_us_per_line']:.1f} us a line): "
              + ", ".join(f"{k.split(' ')[0]} {v:.2f}" for k, v in rows[-1]["host_s_by_part"].items() if v), flush=True)
    if args.json_out:
        write_result(args.json_out, {"model": args.model.name, "source": args.source.name, "runs": rows}, threads=1)


if __name__ == "__main__":
    main()
