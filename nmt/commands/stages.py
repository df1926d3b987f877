"""`nmt preprocess` and `nmt train`: load the config and run the stage."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt.commands.common import ConfigOption, SetOption, app, fail
from nmt.config import ConfigError, load_config
from nmt.data.corpus import DataError
from nmt.folders import FolderError
from nmt.process import configure_process


@app.command()
def preprocess(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the output is up to date."),
) -> None:
    """Train SentencePiece and encode train/dev/test into id files with a manifest."""
    from nmt.data.preprocess import preprocess as run_preprocess

    try:
        run_preprocess(load_config(config, overrides or []), force=force, config_path=config)
    except (ConfigError, DataError, FolderError) as exc:
        fail(str(exc))


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Delete what nmt wrote in the run folder and start over (never other files)."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir.

    SIGINT/SIGTERM save last.pt at the current update and exit 130/143; --resume continues.
    """
    configure_process(training=True)             # before torch's first oneDNN call
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.trainer import RunDirError
    from nmt.train.trainer import train as run_training

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    try:
        trainer = run_training(load_config(config, overrides or []), resume=resume, overwrite=overwrite,
                               config_path=config)
    except (ConfigError, DataError, CheckpointError, RunDirError, FolderError) as exc:
        fail(str(exc))
    except FloatingPointError as exc:
        fail(f"{exc}; lower training.lr or raise training.clip_grad_norm, then --resume from last.pt")
    if trainer.stop_signal is not None:
        raise typer.Exit(code=128 + trainer.stop_signal)
