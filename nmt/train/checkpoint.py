"""Checkpoints: atomic save, checked load, best-k bookkeeping, parameter averaging.

A checkpoint is one `torch.save` file with a format number and the nmt version; it is written
to a temporary file in the same folder, fsynced, then renamed over the target, so a crash never
leaves a half-written checkpoint under a real name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt import __version__
from nmt.data.tokenizer import Vocab
from nmt.folders import atomic_write

FORMAT_VERSION = 1
REQUIRED_KEYS = ("format", "nmt_version", "config", "vocab", "model", "step")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated, corrupt or from an incompatible format."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    payload = {"format": FORMAT_VERSION, "nmt_version": __version__, **state}
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except RuntimeError as exc:         # torch's zip writer reports a failed write (e.g. a full disk) this way
        reason = " ".join(str(exc).split())[:200]
        raise CheckpointError(f"cannot write checkpoint {path} ({reason}); the previous one is unchanged") from None
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path} ({exc.strerror or exc}); "
                              "the previous one is unchanged") from None


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load and check a checkpoint; any problem is a `CheckpointError` naming the file.

    With `mmap`, tensors are read from the file only when used: translation never touches the
    optimizer state, two thirds of a checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for truncated or garbled zip archives
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({reason[:200]})") from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        raise CheckpointError(f"checkpoint {path} is not an nmt checkpoint (missing keys)")
    if state["format"] != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format {state['format']} (written by nmt {state['nmt_version']}); "
            f"this nmt {__version__} reads format {FORMAT_VERSION}"
        )
    return state


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Any]:
    """Average the model parameters of several checkpoints of the same model; the rest comes from the last."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    keys = states[0]["model"].keys()
    for path, state in zip(paths, states, strict=True):
        if state["model"].keys() != keys or any(state["model"][k].shape != states[0]["model"][k].shape for k in keys):
            raise CheckpointError(f"checkpoint {path} holds a different model than {paths[0]}; cannot average")
    averaged = {}
    for key in keys:
        tensors = [s["model"][key] for s in states]
        if tensors[0].is_floating_point():
            averaged[key] = torch.stack([t.float() for t in tensors]).mean(0).to(tensors[0].dtype)
        else:
            averaged[key] = tensors[-1]
    result = {k: v for k, v in states[-1].items() if k in REQUIRED_KEYS or k in ("metrics",)}
    result["model"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    return result


def load_vocabs(run_dir: Path, vocab_entries: dict[str, Any]) -> tuple[Vocab, Vocab]:
    """The source and target vocabularies a checkpoint's run folder holds."""
    try:
        return Vocab.from_entry(run_dir, vocab_entries["src"]), Vocab.from_entry(run_dir, vocab_entries["tgt"])
    except FileNotFoundError as exc:
        raise CheckpointError(f"{exc}; a checkpoint needs the files of its run folder") from None
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise CheckpointError(f"the SentencePiece model(s) in {run_dir} cannot be loaded ({reason})") from None
