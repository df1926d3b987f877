"""What every command shares: the Typer app, the one-line `error:` exit, the checks of paths and the
escaping of what a command prints from a file."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import typer

from nmt.config_check import ConfigError
from nmt.fs.folders import FolderError
from nmt.fs.outputs import check_outputs
from nmt.fs.text import printable

app = typer.Typer(
    help="RNN-attention neural machine translation: preprocess, train, translate, evaluate.",
    no_args_is_help=True,
    add_completion=True,             # --install-completion, --show-completion (nmt.cli.main names the program)
    rich_markup_mode=None,           # plain help: rich tables cut option names at 80 columns
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(..., "--config", "-c", help="YAML config file.", exists=False)
MODEL_HELP = ("A model file (nmt export), a training checkpoint, an exported Hugging Face folder or "
              "hf://org/name[@revision] (nmt[hub]), e.g. model.nmt or RUN/best.pt.")
SetOption = typer.Option(None, "--set", help="Override a config key: --set training.lr=3e-4 (repeatable).")


_JSON_RAW = re.compile(r"[\x7f-\x9f]")                  # what json.dumps(ensure_ascii=False) leaves raw


def printable_data(value: Any) -> Any:
    """Every string (keys too) of a JSON-like value through `printable`, for printing it as text."""
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(v) for v in value]
    return printable(value) if isinstance(value, str) else value


def printable_json(text: str) -> str:
    """The same JSON with the controls json.dumps(ensure_ascii=False) keeps raw as \\u escapes: safe on a terminal."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def error_line(message: object) -> str:
    """The `error:` line for `message`: its whitespace folded into one line, its control characters escaped."""
    return f"error: {printable(one_line(str(message)))}"


def fail(message: str) -> NoReturn:
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code=2)


def as_options(message: str) -> str:
    """A decoding key in a message as the option that sets it: `decoding.beam_size` -> `--beam-size`."""
    return re.sub(r"`decoding\.(\w+)`", lambda m: f"`--{m.group(1).replace('_', '-')}`", message)


def model_inputs(models: Iterable[Path], option: str = "--model") -> list[tuple[str, Path]]:
    """Every file each model is made of, named for `check_outputs`'s message."""
    found: list[tuple[str, Path]] = []
    for model in models:
        from nmt.modelfile.hub import hub_name, is_hub_name, model_files  # torch: only for a command with a model

        named = hub_name(model) if is_hub_name(model) else str(model)
        found += [(option if str(file) == named else f"a file of {option} {named} ({file})", file)
                  for file in model_files(model)]
    return found


def check_paths(outputs: dict[str, Path | None], inputs: Iterable[tuple[str, Path | None]] = (),
                models: Sequence[Path] = ()) -> dict[str, Path]:
    """`check_outputs` (nmt.fs.outputs) with the files of the models as inputs; a problem is one `error:` line."""
    try:
        return check_outputs(outputs, [*inputs, *model_inputs(models)])
    except FolderError as exc:
        fail(str(exc))


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """nmt's own errors as one `error:` line, the decoding keys of a ConfigError (the run's settings) named as
    their options, a file's own keys left as they are; what went to stdout before stays complete."""
    try:
        yield
    except Exception as exc:
        if not is_user_error(exc):
            raise
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        fail(as_options(str(exc)) if isinstance(exc, ConfigError) else str(exc))


def is_user_error(exc: BaseException) -> bool:
    """nmt's own ValueErrors (ConfigError, DataError, ...) and PlotUnavailable (no matplotlib) are the user's to fix:
    nmt.cli.main turns them into one `error:` line, so a command catches them only to name options."""
    own = type(exc).__module__.startswith("nmt.")
    return own and (isinstance(exc, ValueError) or type(exc).__name__ == "PlotUnavailable")
