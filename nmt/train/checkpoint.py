"""Training checkpoints: the model file's contents plus the training state, best-k averaging.

A checkpoint is one `torch.save` dictionary: what a model file holds (config, weights, the
tokenizer as bytes, a card with the data and dev scores; see nmt.model.modelfile) plus the
optimiser, schedule, scaler, RNG states and data cursor. It is written to a temporary file in
the same folder, fsynced, then renamed over the target, so a crash never leaves a half-written
checkpoint under a real name. Because it embeds its tokenizer, a checkpoint moved out of its run
folder still translates; `nmt export` drops the training state.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt import __version__
from nmt.config import stored_config
from nmt.data.shortlist import SHORTLIST_FILE, load_shortlist
from nmt.data.tokenizer import Vocab
from nmt.folders import atomic_write, plain_name
from nmt.model.modelfile import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_KEYS,
    MODEL_KIND,
    ModelFileError,
    check_checksums,
    check_keys,
    embed_shortlist,
    embed_tokenizer,
    load_model,
    read_file,
    run_folder_card,
)

FORMAT_VERSION = CHECKPOINT_FORMAT
REQUIRED_KEYS = CHECKPOINT_KEYS
__all__ = ["CheckpointError", "atomic_write", "average_checkpoints", "best_k_files", "load_checkpoint",
           "save_checkpoint"]
BEST_K_FILES = "best-step*.pt"


class CheckpointError(ModelFileError):
    """A checkpoint that cannot be used: missing, truncated, corrupt or from an incompatible format."""


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` with the format number, the nmt version, and (unless given) the tokenizer and card
    that the run folder of `path` holds."""
    path = Path(path)
    payload = {"format": FORMAT_VERSION, "nmt_version": __version__, **state}
    if "tokenizer" not in payload:
        payload["tokenizer"] = embedded_tokenizer(path.parent, state["vocab"])
    if "card" not in payload:
        payload["card"] = run_folder_card(path.parent, state["step"], state["config"]["training"]["val_max_sentences"])
    if "shortlist" not in payload and (path.parent / SHORTLIST_FILE).is_file():
        payload["shortlist"] = embed_shortlist(load_shortlist(path.parent / SHORTLIST_FILE))
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except RuntimeError as exc:         # torch's zip writer reports a failed write (e.g. a full disk) this way
        reason = " ".join(str(exc).split())[:200]
        raise CheckpointError(f"cannot write checkpoint {path} ({reason}); the previous one is unchanged") from None
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path} ({exc.strerror or exc}); "
                              "the previous one is unchanged") from None


def best_k_files(path: Path, progress: Any) -> list[tuple[float, str]]:
    """The checkpoint's kept best checkpoints as (score, file name); --resume deletes the ones that drop
    out, so each must be a best-step*.pt file inside the run folder, or the checkpoint is refused."""
    entries = progress.get("best_k", []) if isinstance(progress, dict) else []   # no progress: refused elsewhere
    if not isinstance(entries, list) or not all(isinstance(e, list | tuple) and len(e) == 2 for e in entries):
        raise CheckpointError(f"{path}: progress.best_k is not a list of (score, file) pairs; the checkpoint is "
                              "damaged or not nmt's")
    for _, name in entries:
        if not plain_name(name) or not fnmatch.fnmatchcase(name, BEST_K_FILES):
            raise CheckpointError(f"{path}: progress.best_k names {name!r}, not a {BEST_K_FILES} file of its "
                                  "run folder; the checkpoint is damaged or not nmt's (nothing was deleted)")
    return [(float(score), name) for score, name in entries]


def embedded_tokenizer(run_dir: Path, vocab_entries: dict[str, Any]) -> dict[str, Any]:
    """The SentencePiece models and piece lists of a run folder, as a checkpoint embeds them."""
    try:
        return embed_tokenizer(*(Vocab.from_entry(run_dir, vocab_entries[side]) for side in ("src", "tgt")))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{exc}; a checkpoint embeds the tokenizer of its run folder") from None
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load and check a checkpoint (its records' checksums too: a damaged one is never resumed from or
    averaged); any problem is a `CheckpointError` naming the file."""
    path = Path(path)
    try:
        state = read_file(path, "checkpoint", mmap=mmap)
        if state.get("kind") == MODEL_KIND:
            raise ModelFileError(f"{path} is a model file (nmt export), not a training checkpoint")
        check_keys(path, state, "checkpoint", REQUIRED_KEYS, FORMAT_VERSION)
        check_checksums(path, "checkpoint")
    except ModelFileError as exc:
        raise CheckpointError(str(exc)) from None
    return state


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Any]:
    """Average the model parameters of several checkpoints of the same model; the rest comes from the last."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    for path in paths:                  # each one's weights fit its config and are finite (nmt.model.filecheck)
        try:
            load_model(path)
        except ModelFileError as exc:
            raise CheckpointError(str(exc)) from None
    first = states[0]
    keys, model_section = first["model"].keys(), stored_config(first["config"]).model
    for path, state in zip(paths, states, strict=True):
        if (state["model"].keys() != keys or any(state["model"][k].shape != first["model"][k].shape for k in keys)
                or stored_config(state["config"]).model != model_section):
            raise CheckpointError(f"checkpoint {path} holds a different model than {paths[0]}; cannot average")
        same_vocab = (state["tokenizer"] == first["tokenizer"] if "tokenizer" in state and "tokenizer" in first
                      else state["vocab"] == first["vocab"])
        if not same_vocab:
            raise CheckpointError(f"checkpoint {path} has another vocabulary than {paths[0]}; "
                                  "only checkpoints of one model (one run, or runs on one data folder) average")
    averaged = {}
    for key in keys:
        tensors = [s["model"][key] for s in states]
        if tensors[0].is_floating_point():
            averaged[key] = torch.stack([t.float() for t in tensors]).mean(0).to(tensors[0].dtype)
        else:
            averaged[key] = tensors[-1]
    last = states[-1]
    result = {k: v for k, v in last.items() if k in REQUIRED_KEYS or k in ("metrics",)}
    result["model"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    result["tokenizer"] = last.get("tokenizer") or embedded_tokenizer(Path(paths[-1]).parent, last["vocab"])
    card = {k: v for k, v in (last.get("card") or {}).items() if k != "dev"}   # dev scores were of one checkpoint
    result["card"] = {**card, "averaged_from": [Path(p).name for p in paths]}
    if last.get("shortlist") is not None:
        result["shortlist"] = last["shortlist"]
    return result
