"""TensorBoard event files in RUN/tensorboard (`training.tensorboard: true`, `pip install 'nmt[tensorboard]'`):
metrics.jsonl's numbers and, at each validation, the first dev sentence's attention heatmap (as Joey NMT and
OpenNMT-py log them). A resumed run drops events after its checkpoint's step, as metrics.jsonl does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from torch import Tensor

from nmt.config import ConfigError
from nmt.fs.folders import register_file

FOLDER = "tensorboard"
SCALARS = {"train": ("loss", "ppl", "lr", "tgt_tokens_per_s"), "dev": ("loss", "ppl", "bleu", "chrf")}


def check_available() -> type:
    """SummaryWriter; without the package the option is refused before the run folder is touched."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("`training.tensorboard: true` needs the tensorboard package: "
                          "pip install 'nmt[tensorboard]'") from None
    return SummaryWriter


class TensorBoardLog:
    """Scalars and attention images of one run, written by rank 0."""

    def __init__(self, run_dir: Path, step: int) -> None:
        register_file(Path(run_dir) / FOLDER)           # in the marker: --overwrite removes it
        self.writer = check_available()(log_dir=str(Path(run_dir) / FOLDER), purge_step=step + 1 if step else None)
        self._no_images = False

    def scalars(self, section: str, values: dict[str, Any]) -> None:
        for key in SCALARS[section]:
            self.writer.add_scalar(f"{section}/{key}", values[key], values["step"])

    def validation(self, metrics: dict[str, Any], src_pieces: list[str], tgt_pieces: list[str],
                   weights: Tensor) -> None:
        """The dev scalars and attention heatmap; weights: (len(tgt_pieces), len(src_pieces)). Without
        matplotlib, one warning and no images."""
        from nmt.plot import PlotUnavailable, attention_figure

        self.scalars("dev", metrics)
        if not self._no_images:
            try:
                figure = attention_figure(src_pieces, tgt_pieces, weights,
                                          title=f"dev sentence 1, update {metrics['step']}")
                self.writer.add_figure("dev/attention", figure, global_step=metrics["step"])   # closes the figure
            except PlotUnavailable as exc:
                print(f"warning: no attention images in TensorBoard: {exc}", file=sys.stderr)
                self._no_images = True
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
