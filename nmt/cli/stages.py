"""`nmt preprocess` and `nmt train`: load the config and run the stage."""

from __future__ import annotations

from pathlib import Path

import typer

from nmt.cli.common import ConfigOption, SetOption, app, fail
from nmt.config import load_config
from nmt.process import configure_process

InitFromOption = typer.Option(
    None, "--init-from", metavar="MODEL",
    help="Fine-tune: start from this model file or checkpoint (training.init_from); its vocabularies encode the data.")


def _with_init(overrides: list[str] | None, init_from: Path | None, init_optimizer: bool = False) -> list[str]:
    """The --set overrides plus the fine-tuning options' (resolved: --set paths are relative to the config)."""
    extra = [f"training.init_from={init_from.resolve()}"] if init_from is not None else []
    return [*(overrides or []), *extra, *(["training.init_optimizer=true"] if init_optimizer else [])]


@app.command()
def preprocess(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the output is up to date."),
    init_from: Path | None = InitFromOption,
) -> None:
    """Train SentencePiece and encode train/dev/test into id files with a manifest."""
    from nmt.data.preprocess import preprocess as run_preprocess

    run_preprocess(load_config(config, _with_init(overrides, init_from)), force=force, config_path=config)


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: list[str] | None = SetOption,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Delete what nmt wrote in the run folder and start over (never other files)."),
    init_from: Path | None = InitFromOption,
    init_optimizer: bool = typer.Option(False, "--init-optimizer",
                                        help="Fine-tune: also carry over --init-from's optimiser state (a training "
                                             "checkpoint's Adam moments) instead of a fresh optimiser."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir.

    SIGINT/SIGTERM save last.pt at the current update and exit 130/143; --resume continues.
    """
    configure_process(training=True)             # before torch's first oneDNN call
    from nmt.train.trainer import train as run_training

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    if resume and (init_from is not None or init_optimizer):
        fail(f"{'--init-from' if init_from is not None else '--init-optimizer'} starts a new run from a trained "
             "model; --resume continues this one from its last.pt")
    try:
        loaded = load_config(config, _with_init(overrides, init_from, init_optimizer))
        trainer = run_training(loaded, resume=resume, overwrite=overwrite, config_path=config)
    except FloatingPointError as exc:
        fail(f"{exc}; lower training.lr or raise training.clip_grad_norm, then --resume from last.pt")
    if trainer.stop_signal is not None:
        raise typer.Exit(code=128 + trainer.stop_signal)
