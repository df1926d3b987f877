#!/usr/bin/env python
"""Where an ONNX folder's decoding time goes: onnxruntime's session runs (encoder, step), tokenization
(SentencePiece both ways), and the rest (the numpy search: top-k, reordering the beams, bookkeeping).

One process, one translator, `translate` over the lines timed after a warm-up on 50 of them, as
bench.benchmark's decoding-alone figure; each session's `run` and each tokenizer call is wrapped in a
timer, so the parts add up to the total. With --ops, a second translator with onnxruntime's profiler on
translates the lines again and each graph's kernel time is split by operator type (GEMMs against the rest).

    python -m bench.onnx_time --model model-onnx --source test.de --beam-size 5 --threads 1 --no-shortlist --ops
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness


class Timed:
    """`target` with its method `name` timed into `totals[label]` (seconds) and counted in `calls[label]`."""

    def __init__(self, target: Any, name: str, label: str, totals: dict[str, float], calls: dict[str, int]) -> None:
        self.target, self.label, self.totals, self.calls = target, label, totals, calls
        self.method: Callable[..., Any] = getattr(target, name)
        setattr(self, name, self.timed)

    def timed(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.method(*args, **kwargs)
        finally:
            self.totals[self.label] += time.perf_counter() - start
            self.calls[self.label] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def load(args: argparse.Namespace, profile_into: str | None = None) -> Any:
    """The folder's translator; with `profile_into`, its sessions write onnxruntime profiles there."""
    import nmt.runtime.session as session
    from nmt.runtime.translator import Translator

    plain = session.session_options

    def profiling(threads: int) -> Any:
        options = plain(threads)
        options.enable_profiling, options.profile_file_prefix = True, f"{profile_into}/ort"
        return options

    if profile_into is not None:
        session.session_options = profiling                          # read by OnnxModel when it opens sessions
    try:
        return Translator.load(args.model, "cpu", threads=args.threads, beam_size=args.beam_size,
                               **({"shortlist": False} if args.no_shortlist else {}))
    finally:
        session.session_options = plain


def operator_shares(args: argparse.Namespace, lines: list[str]) -> dict[str, dict[str, float]]:
    """Per graph ("step (beam)"): the share of its kernel time each operator type took, largest first."""
    shares = {}
    with tempfile.TemporaryDirectory() as folder:
        translator = load(args, folder)
        translator.translate(lines)
        for kind, roles in translator.model.graph.items():
            for role, run in roles.items():
                times: dict[str, float] = defaultdict(float)
                for event in json.loads(Path(run.end_profiling()).read_text(encoding="utf-8")):
                    if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                        times[event["args"]["op_name"]] += event["dur"]
                total = sum(times.values())
                if total:
                    shares[f"{role} ({kind})"] = {op: round(t / total, 3) for op, t in
                                                  sorted(times.items(), key=lambda item: -item[1])[:8]}
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a folder nmt export --format onnx wrote")
    parser.add_argument("--source", type=Path, required=True, help="text to translate, one sentence a line")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-shortlist", action="store_true", help="the exact search over the whole vocabulary")
    parser.add_argument("--ops", action="store_true", help="also each graph's time by operator type (profiled)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    translator = load(args)
    lines = args.source.read_text(encoding="utf-8").splitlines()
    translator.translate(lines[:50])                                     # warm-up, as bench.benchmark
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for kind, roles in translator.model.graph.items():
        for role, session in roles.items():
            roles[role] = Timed(session, "run", f"onnxruntime {role} ({kind})", totals, calls)
    translator.src_vocab = Timed(translator.src_vocab, "encode", "tokenize (SentencePiece encode)", totals, calls)
    translator.tgt_vocab = Timed(translator.tgt_vocab, "decode", "detokenize (SentencePiece decode)", totals, calls)
    start = time.perf_counter()
    translator.translate(lines)
    total = time.perf_counter() - start
    parts = {label: {"seconds": seconds, "calls": calls[label], "share": seconds / total}
             for label, seconds in sorted(totals.items(), key=lambda item: -item[1])}
    rest = total - sum(totals.values())
    parts["numpy search and the rest"] = {"seconds": rest, "calls": None, "share": rest / total}
    print(f"{len(lines)} lines, beam {args.beam_size}: {total:.2f} s ({len(lines) / total:.1f} sent/s)")
    for label, part in parts.items():
        print(f"  {label:40s} {part['seconds']:7.2f} s  {part['share']:6.1%}  ({part['calls']} calls)")
    result = {"task": "ONNX decoding time by part", "lines": len(lines), "beam_size": args.beam_size,
              "no_shortlist": args.no_shortlist, "seconds": total, "sent_per_s": len(lines) / total, "parts": parts}
    if args.ops:
        result["operator_shares"] = operator_shares(args, lines)
        for graph, ops in result["operator_shares"].items():
            print(f"  {graph}: " + ", ".join(f"{op} {share:.0%}" for op, share in ops.items()))
    if args.json_out is not None:
        harness.write_result(args.json_out, result, threads=args.threads)


if __name__ == "__main__":
    main()
