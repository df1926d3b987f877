"""The `nmt` command line: thin wrappers that parse options, load the config and call a stage."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from nmt import __version__
from nmt.config import ConfigError, load_config
from nmt.data.corpus import DataError

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """RNN-attention NMT toolkit."""


@app.command()
def preprocess(
    config: Path = ConfigOption,
    overrides: Optional[list[str]] = SetOption,  # noqa: UP045
    force: bool = typer.Option(False, "--force", help="Rebuild even if the output is up to date."),
) -> None:
    """Train SentencePiece and encode train/dev/test into id files with a manifest."""
    from nmt.data.preprocess import preprocess as run_preprocess

    try:
        run_preprocess(load_config(config, overrides or []), force=force)
    except (ConfigError, DataError) as exc:
        fail(str(exc))


@app.command()
def train(
    config: Path = ConfigOption,
    overrides: Optional[list[str]] = SetOption,  # noqa: UP045
    resume: bool = typer.Option(False, "--resume", help="Continue the run in training.run_dir from last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete a non-empty run folder and start over."),
) -> None:
    """Train a seq2seq model; checkpoints and metrics go to training.run_dir."""
    from nmt.train.checkpoint import CheckpointError
    from nmt.train.trainer import RunDirError, Trainer

    if resume and overwrite:
        fail("--resume and --overwrite exclude each other")
    try:
        trainer = Trainer(load_config(config, overrides or []), resume=resume, overwrite=overwrite)
        trainer.train()
    except (ConfigError, DataError, CheckpointError, RunDirError) as exc:
        fail(str(exc))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
