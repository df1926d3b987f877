#!/usr/bin/env python
"""The CPU tables of docs/benchmarks.md, from a folder's figures.json under docs/results/.

    python -m bench.cpu_table docs/results/cpu-avx2 > table.md

figures.json holds the machine (bench.machine_facts' fields), the models the decoding figures used,
`side_by_side` (one entry per measure: nmt's and OpenNMT-py's medians, threads, our options, the
commit and the command; optional `onnx`, the same model's ONNX folder on onnxruntime in the same
runs) and `figures` (nmt's own figures: quality, memory). tests/test_docs.py checks that
docs/benchmarks.md holds this script's output for every `cpu-table` block, so a figure is changed
in the JSON file and the page regenerated, never edited by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.machine_facts import describe


def _number(value: float) -> str:
    return f"{value:,.0f}" if isinstance(value, int) or value >= 1000 else f"{value:.1f}"


def table(folder: Path) -> str:
    """Markdown: the machine line, the side-by-side table, nmt's own figures, the numbered commands."""
    data = json.loads((folder / "figures.json").read_text(encoding="utf-8"))
    commands: list[str] = []

    def ref(command: str) -> str:
        if command not in commands:
            commands.append(command)
        return f"[{commands.index(command) + 1}]"

    out = [f"Measured on: {describe(data['machine'])} (`{folder.as_posix()}`).", ""]
    if data.get("side_by_side"):
        out += ["| side by side, median of 3 alternating runs | threads | our options | nmt | OpenNMT-py 3.5.1 "
                "| ratio | commit | command |", "|---|---|---|---|---|---|---|---|"]
        for row in data["side_by_side"]:
            options = f"`{row['options']}`" if row["options"] else "none"
            nmt, ratio = _number(row["nmt"]), f"**{row['nmt'] / row['onmt']:.2f}x**"
            if "onnx" in row:                         # "PyTorch / onnxruntime" in one cell
                nmt, ratio = f"{nmt} / {_number(row['onnx'])}", f"{ratio} / **{row['onnx'] / row['onmt']:.2f}x**"
            out.append(f"| {row['measure']} | {row['threads']} | {options} | {nmt} | {_number(row['onmt'])} | "
                       f"{ratio} | {row['commit']} | {ref(row['command'])} |")
        notes = [f"{row['measure']}, {row['threads']} thread{'s' if row['threads'] > 1 else ''}: {row['note']}."
                 for row in data["side_by_side"]
                 if row.get("note")]
        out += ["", *notes] if notes else []
        out.append("")
    if data.get("figures"):
        out += ["| nmt | value | commit | command |", "|---|---|---|---|"]
        out += [f"| {row['measure']} | {row['value']} | {row['commit']} | {ref(row['command'])} |"
                for row in data["figures"]]
        out.append("")
    models = data.get("models")
    if models:
        out += [f"Models of the decoding figures: {models['decoding']}:", "",
                "```bash", *models["commands"], "```", ""]
    out += ["Commands:", ""] + [f"{i}. `{command}`" for i, command in enumerate(commands, 1)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.cpu_table RESULTS_FOLDER")
    print(table(Path(sys.argv[1])), end="")
