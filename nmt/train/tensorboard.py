"""TensorBoard event files in RUN/tensorboard (`training.tensorboard: true`, `pip install 'nmt[tensorboard]'`).

metrics.jsonl's numbers, and the first dev sentence's attention heatmap at each validation (as Joey NMT and
OpenNMT-py log them). The marker records the folder (--overwrite removes it); a resumed run drops events
after its checkpoint's step, as metrics.jsonl does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from torch import Tensor

from nmt.config import ConfigError
from nmt.fs.folders import register_file

FOLDER = "tensorboard"
TRAIN_SCALARS = ("loss", "ppl", "lr", "tgt_tokens_per_s")
DEV_SCALARS = ("loss", "ppl", "bleu", "chrf")


def check_available() -> type:
    """SummaryWriter; without the package, `training.tensorboard: true` is refused before the run folder is touched."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("`training.tensorboard: true` needs the tensorboard package: "
                          "pip install 'nmt[tensorboard]'") from None
    return SummaryWriter


class TensorBoardLog:
    """Scalars and attention images of one run, written by rank 0."""

    def __init__(self, run_dir: Path, step: int) -> None:
        register_file(Path(run_dir) / FOLDER)
        self.writer = check_available()(log_dir=str(Path(run_dir) / FOLDER), purge_step=step + 1 if step else None)
        self._no_images = False

    def train(self, event: dict[str, Any]) -> None:
        for key in TRAIN_SCALARS:
            self.writer.add_scalar(f"train/{key}", event[key], event["step"])

    def validation(self, metrics: dict[str, Any]) -> None:
        for key in DEV_SCALARS:
            self.writer.add_scalar(f"dev/{key}", metrics[key], metrics["step"])
        self.writer.flush()

    def attention(self, step: int, src_pieces: list[str], tgt_pieces: list[str], weights: Tensor) -> None:
        """weights: (len(tgt_pieces), len(src_pieces)); without matplotlib, one warning and no images."""
        from nmt.plot import PlotUnavailable, attention_figure

        if self._no_images:
            return
        try:
            figure = attention_figure(src_pieces, tgt_pieces, weights, title=f"dev sentence 1, update {step}")
        except PlotUnavailable as exc:
            print(f"warning: no attention images in TensorBoard: {exc}", file=sys.stderr)
            self._no_images = True
            return
        self.writer.add_figure("dev/attention", figure, global_step=step)   # closes the figure
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
