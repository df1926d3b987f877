"""Attention heatmaps and training curves; matplotlib (the optional `nmt[plot]`) is imported only here, on use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nmt.fs.bounded import load_yaml, loads_json
from nmt.fs.folders import atomic_write, refuse_foreign, remove_nmt_files, write_marker
from nmt.fs.outputs import output_target
from nmt.fs.text import input_problem

if TYPE_CHECKING:                  # weights may also be numpy arrays (nmt.runtime): no torch at run time
    from torch import Tensor

DPI = 100


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


class PlotError(ValueError):
    """A plot that cannot be drawn as asked."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("plotting needs matplotlib: pip install 'nmt[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap_size(n_src: int, n_tgt: int) -> tuple[float, float]:
    """Inches: a quarter per piece, from 5 x 4 to 16 x 14."""
    return min(16.0, max(5.0, 2.5 + 0.24 * n_src)), min(14.0, max(4.0, 2.0 + 0.24 * n_tgt))


def label_font_size(n: int) -> float:
    return max(5.0, min(11.0, 340.0 / max(n, 1)))


def attention_figure(src_pieces: Sequence[str], tgt_pieces: Sequence[str], weights: Tensor, title: str = ""):
    """Output pieces down, source pieces across; weights: (len(tgt_pieces), len(src_pieces)), rows the α_i."""
    plt = _pyplot()
    matrix = weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights  # torch or numpy
    if matrix.shape != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(f"weights {matrix.shape} do not match {len(tgt_pieces)} x {len(src_pieces)} pieces")
    fig, ax = plt.subplots(figsize=heatmap_size(len(src_pieces), len(tgt_pieces)), dpi=DPI,
                           layout="constrained")
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(src_pieces)), labels=list(src_pieces), rotation=90,
                  fontsize=label_font_size(len(src_pieces)))
    ax.set_yticks(range(len(tgt_pieces)), labels=list(tgt_pieces), fontsize=label_font_size(len(tgt_pieces)))
    ax.xaxis.tick_top()
    ax.set_xlabel("source pieces")
    ax.set_ylabel("output pieces")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention weight α", shrink=0.8)
    return fig


class AttentionPlotter:
    """One PNG per sentence into a folder nmt marks as its own (one holding files nmt did not write is refused);
    `one_file`: one sentence's heatmap into the file `out` names, in its suffix's format."""

    def __init__(self, out: str | Path, option: str = "--plot-attention", one_file: bool = False) -> None:
        _pyplot()                                           # no matplotlib: refused before any work
        self.option, self.one_file = option, one_file
        self.written: list[Path] = []                       # the heatmaps drawn so far
        if one_file:
            self.out, self.kind = Path(out), image_format(Path(out), option)
            return
        self.out, self.kind = output_target(out, option), "png"     # the folder the user named may be a link
        marker = refuse_foreign(self.out, "attention", option, "empty it")
        if marker is None:
            self.out.mkdir(parents=True, exist_ok=True)
            write_marker(self.out, "attention")
        else:                                               # an earlier run's heatmaps would pass for this run's
            remove_nmt_files(self.out, marker)

    def plot(self, number: int, src_pieces: Sequence[str], tgt_pieces: Sequence[str], weights: Tensor) -> Path:
        if self.one_file and self.written:
            raise PlotError(f"{self.option} {self.out} is one file and holds one heatmap; give a folder for more")
        fig = attention_figure(src_pieces, tgt_pieces, weights, title=f"sentence {number}")
        path = self.out if self.one_file else self.out / f"attention-{number:05d}.png"
        save_figure(fig, output_target(path, self.option) if self.one_file else path, self.kind)
        self.written.append(path)
        return path


def save_figure(fig: Any, path: Path, kind: str) -> None:
    """Write `fig` to `path` atomically in format `kind`, and free it (pyplot keeps every open figure)."""
    try:
        atomic_write(path, lambda handle: fig.savefig(handle, format=kind, dpi=DPI))
    finally:
        _pyplot().close(fig)


def is_folder_target(out: str) -> bool:
    """`-o` of `nmt plot attention` is a folder when it is one, ends with '/' or has no suffix, else a file."""
    return out.endswith(("/", os.sep)) or Path(out).is_dir() or not Path(out).suffix


def attention_output(out: str, sentences: int, option: str = "--out") -> AttentionPlotter:
    if is_folder_target(out):
        return AttentionPlotter(out, option)
    if sentences != 1:
        raise PlotError(f"{option} {out} names one file, but {sentences} sentences were given; "
                        f"give one --src, or a folder ({out.rsplit('.', 1)[0]}/) for one PNG per sentence")
    return AttentionPlotter(out, option, one_file=True)


def image_format(out: Path, option: str = "--out") -> str:
    """The image format `out`'s suffix names; a PlotError lists those matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    kind = out.suffix.lstrip(".").lower()
    if kind not in kinds:
        raise PlotError(f"{option} {out}: cannot write {out.suffix or 'a file without a suffix'}; "
                        f"name a .{' / .'.join(sorted(kinds))} file")
    return kind


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Events of metrics.jsonl; lines that are not JSON objects are skipped."""
    events = []
    path = Path(run_dir) / "metrics.jsonl"
    if problem := input_problem(path):
        raise PlotError(f"{path} {problem}")
    for line in path.read_bytes().split(b"\n"):
        with contextlib.suppress(ValueError):            # not JSON, or not UTF-8 (a line cut by a crash)
            events.append(loads_json(line))
    return [event for event in events if isinstance(event, dict)]


def run_label(run_dir: Path) -> str:
    try:
        config = load_yaml((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
        attention = config["model"]["attention"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        attention = "attention unknown"
    return f"{Path(run_dir).name} ({attention})"


CURVES = (("train", "loss", "train loss"), ("validation", "ppl", "dev perplexity"), ("validation", "bleu", "dev BLEU"))
CURVES_SIZE = (15.0, 8.0)
CURVES_X = (("step", "updates", 1.0), ("wall_time", "minutes", 60.0))     # top row, bottom row


def curve_points(run_dir: Path) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """(row, column) of each chart -> its (x, y) points from the run's metrics.jsonl; a file without one point in
    any chart is a PlotError naming it (an empty chart would pass for a run that logged nothing)."""
    events = read_metrics(run_dir)
    points = {(row, column): [(e[x_key] / scale, e[key]) for e in events if e.get("event") == kind
                              and isinstance(e.get(key), (int, float)) and isinstance(e.get(x_key), (int, float))]
              for column, (kind, key, _) in enumerate(CURVES) for row, (x_key, _, scale) in enumerate(CURVES_X)}
    if not any(points.values()):
        raise PlotError(f"{Path(run_dir) / 'metrics.jsonl'}: no line holds a training loss or a validation score with "
                        "its step or time (nmt writes them as training runs); nothing to plot")
    return points


def curves_figure(run_dirs: Sequence[Path]):
    """Train loss, dev perplexity and dev BLEU against updates (top row) and wall-clock minutes (bottom row)."""
    plt = _pyplot()
    runs = [(run_label(run_dir), curve_points(run_dir)) for run_dir in run_dirs]     # refused before drawing
    fig, axes = plt.subplots(2, 3, figsize=CURVES_SIZE, dpi=DPI, layout="constrained")
    for label, run_points in runs:
        for column, (kind, key, title) in enumerate(CURVES):
            for row, (_, x_label, _) in enumerate(CURVES_X):
                points = run_points[row, column]
                ax = axes[row][column]
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o" if kind == "validation" else None,
                        markersize=3, label=label)
                ax.set_title(title)
                ax.set_xlabel(x_label)
                if key == "ppl":
                    ax.set_yscale("log")
                ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return fig


def plot_curves(run_dirs: Sequence[Path], out: Path) -> Path:
    """Draw the runs' curves into `out`, atomically, in the format its suffix names."""
    _pyplot()                                  # no matplotlib: PlotUnavailable, before image_format needs it
    kind, target = image_format(out), output_target(out, "--out")
    save_figure(curves_figure(run_dirs), target, kind)
    return out
