"""What every command shares: the Typer app, the one-line `error:` exit and the checks of paths."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import typer

from nmt.folders import FolderError
from nmt.output_files import check_outputs

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=True,             # --install-completion, --show-completion (nmt.cli names the program)
    rich_markup_mode=None,           # plain help: rich tables cut option names at 80 columns
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
MODEL_HELP = ("A model file (nmt export), a training checkpoint, an exported Hugging Face folder or "
              "hf://org/name[@revision] (nmt[hub]), e.g. model.nmt or RUN/best.pt.")
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def fail(message: str) -> None:
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(code=2)


def as_options(message: str) -> str:
    """A decoding key in a message as the option that sets it: `decoding.beam_size` -> `--beam-size`."""
    return re.sub(r"`decoding\.(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`", message)


def check_paths(outputs: dict[str, Path | None], inputs: Iterable[tuple[str, Path | None]] = (),
                models: Sequence[Path] = ()) -> dict[str, Path]:
    """`check_outputs` (nmt.output_files) with the models as inputs; a problem is one `error:` line."""
    try:
        return check_outputs(outputs, [*inputs, *(("--model", model) for model in models)])
    except FolderError as exc:
        fail(str(exc))
        return {}


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """nmt's own errors (ConfigError, ModelFileError, TextInputError, FolderError, ...) as one `error:` line,
    decoding keys named as their options; what went to stdout before stays complete."""
    try:
        yield
    except Exception as exc:
        if not is_user_error(exc) and type(exc).__name__ != "PlotUnavailable":
            raise
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        fail(as_options(str(exc)))


def set_threads(threads: int) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def is_user_error(exc: BaseException) -> bool:
    """nmt's own exception classes (ConfigError, DataError, CheckpointError, ...) describe user errors."""
    return isinstance(exc, ValueError) and type(exc).__module__.startswith("nmt.")
