#!/usr/bin/env python
"""The GPU section's tables of docs/benchmarks.md, from a folder that bench/gpu_benchmarks.sh wrote.

    python -m bench.gpu_table docs/results/h200-2026-11-24 > table.md

Reads the JSON files there (whichever exist) and prints Markdown: the machine, training and decoding
with the CUDA graphs on and off per precision, start-up to the first translation, the side-by-side ratios
with OpenNMT-py and the GPU recipe's result. tests/test_docs.py checks that docs/benchmarks.md holds this
output for the folder it names, so the page cannot drift from its data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _machine(folder: Path) -> str:
    """The GPU and its host; a folder without a GPU is a rehearsal on the CPU (DEVICE=cpu)."""
    host = None
    for path in sorted(folder.glob("*.json")):
        facts = json.loads(path.read_text(encoding="utf-8")).get("machine")
        if facts and "gpu" in facts:
            gpu = facts["gpu"]
            return (f"{gpu['count']}x {gpu['name']} ({gpu['memory_gib']} GiB), driver {gpu.get('driver') or '?'}, "
                    f"CUDA {gpu['cuda']}, cuDNN {gpu['cudnn']}, torch {facts['torch']}, Python {facts['python']}; "
                    f"host {facts['cpu']} with {facts['cores']} cores")
        if facts and host is None:
            host = (f"no GPU: a rehearsal on {facts['cpu']} with {facts['cores']} cores, torch {facts['torch']}, "
                    f"Python {facts['python']}")
    return host or "unknown machine"


def training_rows(folder: Path) -> list[str]:
    rows = []
    for model in ("bahdanau", "luong"):
        cells = []
        for precision in ("fp32", "bf16"):
            for graphs in ("false", "true"):
                report = _load(folder, f"train-{model}-{precision}-graphs_{graphs}.json")
                cells.append(f"{report['train']['tgt_tokens_per_s']:,.0f}" if report else "")
        if any(cells):
            rows.append(f"| training, reference {model.capitalize()}, target tokens/s | " + " | ".join(cells) + " |")
    return rows


def decoding_rows(folder: Path, name: str, label: str | None = None) -> list[str]:
    """Sent/s per search, precision and graphs on or off; `label` names the source (default: its line count),
    followed by the batch size where every entry records the same one."""
    report = _load(folder, name)
    if report is None or not report["decode"]:
        return []
    found = {(r["precision"], r["beam"], r["graphs"]): r for r in report["decode"]}
    label = label or f"{report['decode'][0]['lines']:,} sentences"
    if batch_tokens := _batch_tokens(report):
        label += f" in {batch_tokens:,}-token batches"
    rows = []
    for beam, search in ((1, "greedy"), (5, "beam 5")):
        cells = []
        for precision in ("fp32", "bf16"):
            for graphs in (False, True):
                r = found.get((precision, beam, graphs))
                bleu = f" ({r['bleu']:.2f})" if r and r.get("bleu") is not None else ""
                cells.append(f"{r['sent_per_s']:,.0f}{bleu}" if r else "")
        with_bleu = " (BLEU)" if any(r.get("bleu") is not None for r in found.values()) else ""
        rows.append(f"| {label}, {search}, sent/s decoding alone{with_bleu} | " + " | ".join(cells) + " |")
    return rows


def _batch_tokens(report: dict | None) -> int | None:
    """The batch size every decoding entry of a report ran with; None if they differ or do not say."""
    sizes = {r.get("batch_tokens") for r in (report or {}).get("decode", [])}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def test_set_rows(folder: Path) -> list[str]:
    """test_2016_flickr at the model's batch size, and at the CPU's where that is another one."""
    rows = decoding_rows(folder, "decode-test2016.json", "test_2016_flickr")
    main, cpu_size = (_load(folder, f"decode-test2016{suffix}.json") for suffix in ("", "-8000"))
    if cpu_size is not None and (main is None or _batch_tokens(main) != _batch_tokens(cpu_size)):
        rows += decoding_rows(folder, "decode-test2016-8000.json", "test_2016_flickr")
    return rows


def first_line_rows(folder: Path) -> list[str]:
    report = _load(folder, "decode-test2016.json")
    if not report or "first_line" not in report:
        return []
    worst = max(report["first_line"], key=lambda r: r["beyond_import_s"])
    imports = [r["import_torch_s"] for r in report["first_line"]]
    return [f"Start-up: the first translation of one line came at most {worst['beyond_import_s']:.2f} s after "
            f"`import torch` ({worst['precision']}, beam {worst['beam']}: model loaded in {worst['load_s']:.2f} s, "
            f"translated in {worst['first_translation_s']:.2f} s); `import torch` itself took "
            f"{min(imports):.1f}-{max(imports):.1f} s on this host."]


def whole_process_rows(folder: Path) -> list[str]:
    """`nmt translate` as a user runs it, start-up included: the median run per search."""
    report = _load(folder, "whole-100k.json")
    if not report:
        return []
    parts = []
    for beam, search in ((1, "greedy"), (5, "beam 5")):
        runs = [r for r in report["runs"] if r["beam"] == beam]
        failed = [r for r in runs if r["rc"] or r["lines_out"] != report["sentences"]]
        speeds = sorted(r["sent_per_s"] for r in runs)
        if failed:
            parts.append(f"{search} failed in {len(failed)} of {len(runs)} runs (see whole-100k.json)")
        elif speeds:                                      # the median; of two runs, the slower
            which = "the slower of 2 runs" if len(speeds) == 2 else f"median of {len(speeds)} runs"
            parts.append(f"{search} {speeds[(len(speeds) - 1) // 2]:,.0f} sent/s ({which})")
    startup = report.get("startup_median_s", {})
    costs = [f"`import torch` {startup['import_torch_s']:.1f} s"] if "import_torch_s" in startup else []
    if "cuda_init_s" in startup:
        costs.append(f"starting CUDA {startup['cuda_init_s']:.1f} s (with the import)")
    return [f"Whole process: `nmt translate` of {report['sentences']:,} sentences in {report['batch_tokens']:,}-token "
            f"batches, start-up included: {', '.join(parts)}" + (f"; of which {', '.join(costs)}." if costs else ".")]


def comparison_rows(folder: Path) -> list[str]:
    rows = []
    train = (_load(folder, "compare-train.json") or {}).get("train")
    if train:
        rows.append(f"| training, target tokens/s ({train['nmt_precision']}) | {train['nmt_median']:,.0f} | "
                    f"{train['onmt_median']:,.0f} | **{train['ratio']:.2f}x** | 3x |")
    decode = _load(folder, "compare-decode.json")
    for search, goals in (("beam5", ("5x", "3x")), ("greedy", ("", ""))):
        entry = (decode or {}).get("decode", {}).get(search)
        if not entry:
            continue
        label = "beam 5" if search == "beam5" else "greedy"
        rows.append(f"| {label}, decoding alone, sent/s | {entry['nmt_median_decode_only_sent_per_s']:,.0f} | "
                    f"{entry['onmt_median_decode_only_sent_per_s']:,.0f} | "
                    f"**{entry['ratio_decode_only_sent_per_s']:.2f}x** | {goals[0]} |")
        rows.append(f"| {label}, whole process, sent/s | {entry['nmt_median_sent_per_s']:,.0f} | "
                    f"{entry['onmt_median_sent_per_s']:,.0f} | **{entry['ratio_sent_per_s']:.2f}x** | {goals[1]} |")
    return rows


def recipe_rows(folder: Path) -> list[str]:
    recipe = _load(folder, "recipe.json")
    if not recipe:
        return []
    return [f"| {recipe['config']} | {recipe['updates']:,} | {recipe['train_minutes']:.2f} | "
            f"{recipe['best_dev_bleu']:.2f} | {recipe['choice']} | **{recipe['test_bleu']:.2f}** |"]


def table(folder: Path) -> str:
    out = [f"Measured on: {_machine(folder)} (`{folder.as_posix()}`).", ""]
    rows = training_rows(folder) + test_set_rows(folder) + decoding_rows(folder, "decode-100k.json")
    if rows:
        out += ["| | fp32 eager | fp32 graphs | bf16 eager | bf16 graphs |", "|---|---|---|---|---|", *rows, ""]
    out += first_line_rows(folder) + whole_process_rows(folder)
    rows = comparison_rows(folder)
    if rows:
        out += ["", "| side by side, median of 3 alternating runs | nmt | OpenNMT-py 3.5.1 | ratio | goal |",
                "|---|---|---|---|---|", *rows]
    rows = recipe_rows(folder)
    if rows:
        out += ["", "| GPU recipe | updates | training minutes (validation included) | best dev BLEU | "
                    "chosen on dev | test_2016_flickr BLEU |", "|---|---|---|---|---|---|", *rows]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python -m bench.gpu_table RESULTS_FOLDER")
    sys.stdout.write(table(Path(sys.argv[1])))
