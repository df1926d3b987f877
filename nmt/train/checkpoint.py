"""Training checkpoints: a model file's contents (nmt.modelfile.file) plus the training state; averaging.

Written atomically, so a crash never leaves a half-written checkpoint under a real name; it embeds its
tokenizer, so it translates outside its run folder too.
"""

from __future__ import annotations

import fnmatch
import io
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from nmt import __version__
from nmt.config import Config, stored_config
from nmt.data.shortlist import SHORTLIST_FILE, load_shortlist
from nmt.data.tokenizer import Vocab
from nmt.fs.folders import atomic_write, plain_name
from nmt.modelfile import file as model_file
from nmt.modelfile.file import ModelFileError
from nmt.modelfile.tensors import is_safetensors

BEST_K_FILES = "best-step*.pt"
TRAINING_STATE_KEYS = ("optimizer", "schedule", "scaler", "rng", "cursor", "progress")   # what --resume restores
OPTIMIZER_KIND = ("capturable", "fused", "foreach", "differentiable")   # how this run's optimiser steps
ADAM_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class CheckpointError(ModelFileError):
    """A checkpoint that is missing, truncated, corrupt or of an incompatible format."""


@dataclass
class Cursor:
    """The next batch to train on."""

    epoch: int = 0
    batch: int = 0
    seed: int = 0


@dataclass
class Progress:
    """What a resumed run continues from besides the model and optimiser."""

    step: int = 0
    cursor: Cursor = field(default_factory=Cursor)
    best_score: float | None = None
    bad_validations: int = 0
    best_k: list[tuple[float, str]] = field(default_factory=list)   # (score, file name), best first
    elapsed: float = 0.0                                              # training seconds before this process
    validation_due: bool = False      # a signal skipped or cut short this step's scheduled or final validation
    validated_step: int = -1          # the update last validated (or being validated)
    window_loss: float = 0.0          # summed loss and target tokens since the last logged train event
    window_tokens: int = 0


def rng_state() -> dict[str, Any]:
    """This process's RNG states."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def own_rng(rng: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
    """The RNG states this rank resumes: its own from a run of as many processes (each draws its own dropout
    masks), else rank 0's for rank 0 and none for the others (they are reseeded)."""
    ranks = rng.get("ranks") if isinstance(rng, dict) else None       # not a mapping: refused by the caller
    if isinstance(ranks, list) and len(ranks) == world_size:
        return ranks[rank]
    return rng if rank == 0 else None


def training_state(config: Config, vocab: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   schedule: Any, scaler: Any, progress: Progress, elapsed: float,
                   ranks_rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The model and all that --resume needs to continue exactly; `elapsed`: the run's training seconds so far;
    `ranks_rng`: every rank's `rng_state()` under DDP (rank 0's is also the checkpoint's own)."""
    rng = rng_state()
    if ranks_rng is not None and len(ranks_rng) > 1:
        rng["ranks"] = ranks_rng
    return {"config": config.to_dict(), "vocab": vocab, "model": model.state_dict(),
            "optimizer": _portable(optimizer.state_dict()), "schedule": schedule.state_dict(),
            "scaler": scaler.state_dict(), "rng": rng, "step": progress.step, "cursor": vars(progress.cursor).copy(),
            "progress": {**{k: v for k, v in asdict(progress).items() if k not in ("step", "cursor")},
                         "best_k": [list(x) for x in progress.best_k], "elapsed": elapsed}}


def restore_training_state(path: Path, state: dict[str, Any], config: Config, optimizer: torch.optim.Optimizer,
                           schedule: Any, scaler: Any, rank: int = 0, world_size: int = 1) -> Progress:
    """Load what `training_state` saved (the RNG states `own_rng` picks for this rank; a rank without any, of a run
    with another number of processes, is reseeded); returns the progress. A bad part is a `CheckpointError`
    naming `path`."""
    missing = [key for key in TRAINING_STATE_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path} lacks the training state `{missing[0]}` that --resume "
                              "needs (an averaged checkpoint?); start a new run instead")
    try:
        if not isinstance(state["step"], int) or isinstance(state["step"], bool) or state["step"] < 0:
            raise ValueError(f"step {state['step']!r} is not a count of updates")
        load_optimizer_state(optimizer, state["optimizer"], config)
        schedule.load_state_dict(state["schedule"])
        scaler.load_state_dict(state["scaler"])
        rng = own_rng(state["rng"], rank, world_size)
        if rng is not None:
            torch.set_rng_state(rng["torch"])
            version, internal, gauss = rng["python"]        # torch.load gives lists where tuples were saved
            random.setstate((version, tuple(internal), gauss))
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        else:
            torch.manual_seed(config.training.seed + rank * 1_000_003 + int(state["step"]))
        prog = state["progress"]
        names = [f.name for f in fields(Progress) if f.name not in ("step", "cursor", "best_k")]
        if absent := [name for name in names if name not in prog]:
            raise CheckpointError(f"{path} lacks the progress field `{absent[0]}`: an earlier development "
                                  "version of nmt wrote it; start a new run instead")
        blank = Progress()          # each field's type, from its default: another value is converted or refused
        restored = {name: prog[name] if getattr(blank, name) is None else type(getattr(blank, name))(prog[name])
                    for name in names}
        return Progress(step=state["step"], cursor=Cursor(**state["cursor"]), best_k=best_k_files(path, prog),
                        **restored)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: its training state cannot be restored "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any], config: Config) -> None:
    """Adam's moments and step counts from `saved`; the config's betas and weight decay, a capturable optimiser's
    lr tensor and this optimiser's OPTIMIZER_KIND flags stay (or a graphed run's would turn non-capturable)."""
    check_optimizer_state(optimizer, saved)
    lr_tensors = [g["lr"] for g in optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]
    groups = [{**group, **{key: mine[key] for key in OPTIMIZER_KIND if key in mine}}
              for group, mine in zip(saved["param_groups"], optimizer.param_groups, strict=False)]
    optimizer.load_state_dict({**saved, "param_groups": groups})
    for group in optimizer.param_groups:
        group["betas"], group["weight_decay"] = tuple(config.training.adam_betas), config.training.weight_decay
    for group, lr in zip(optimizer.param_groups, lr_tensors, strict=False):
        group["lr"] = lr.fill_(float(group["lr"]))


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """A ValueError unless `saved` holds finite Adam moments of each parameter's shape and finite step counts:
    torch checks only their number, and bad moments surface later as "loss became nan; lower training.lr"."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise ValueError("it is not an optimiser state (no state and param_groups)")
    ids = [i for group in saved["param_groups"] for i in (group.get("params", []) if isinstance(group, dict) else [])]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(ids) != len(params):
        raise ValueError(f"it holds {len(ids)} parameters, the model {len(params)}")
    for number, (index, param) in enumerate(zip(ids, params, strict=True)):
        entry = saved["state"].get(index, {})
        if not isinstance(entry, dict):
            raise ValueError(f"the state of parameter {number} is not a mapping")
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                if key == "step" and isinstance(value, int | float) and math.isfinite(value) and value >= 0:
                    continue
                raise ValueError(f"{key} of parameter {number} is {type(value).__name__}, not a tensor")
            if key in ADAM_MOMENTS and value.shape != param.shape:
                raise ValueError(f"{key} of parameter {number} has shape {tuple(value.shape)}, but the parameter "
                                 f"has {tuple(param.shape)}")
            if key == "step" and value.numel() != 1:
                raise ValueError(f"the step count of parameter {number} has {value.numel()} elements, not 1")
            if not value.dtype.is_floating_point:
                raise ValueError(f"{key} of parameter {number} is {value.dtype}, not a floating-point tensor")
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"{key} of parameter {number} holds non-finite values (NaN or inf)")


def _portable(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """Plain-number learning rates (a capturable optimiser's is a GPU tensor): resumable on any device."""
    groups = [{**g, "lr": float(g["lr"])} if isinstance(g["lr"], torch.Tensor) else g
              for g in optimizer_state["param_groups"]]
    return {**optimizer_state, "param_groups": groups}


def save_checkpoint(path: Path, state: dict[str, Any], replace: bool = True) -> None:
    """Write `state` with the format and nmt version, and (unless given) its run folder's tokenizer and card;
    `replace=False`: a FileExistsError if `path` exists by the end (another process wrote it)."""
    path = Path(path)
    payload = {"format": model_file.CHECKPOINT_FORMAT, "nmt_version": __version__, **state}
    if "tokenizer" not in payload:
        try:
            vocabs = (Vocab.from_entry(path.parent, state["vocab"][side]) for side in ("src", "tgt"))
            payload["tokenizer"] = model_file.embed_tokenizer(*vocabs)
        except FileNotFoundError as exc:
            raise CheckpointError(f"{exc}; a checkpoint embeds the tokenizer of its run folder") from None
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    if "card" not in payload:
        payload["card"] = model_file.run_folder_card(path.parent, state["step"],
                                                     state["config"]["training"]["val_max_sentences"])
    if "shortlist" not in payload and (path.parent / SHORTLIST_FILE).is_file():
        payload["shortlist"] = model_file.embed_shortlist(load_shortlist(path.parent / SHORTLIST_FILE))
    previous = path.exists()
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle), replace=replace)
    except FileExistsError:
        raise
    except (RuntimeError, OSError) as exc:  # torch's zip writer reports a failed write (a full disk) as RuntimeError
        reason = (isinstance(exc, OSError) and exc.strerror) or " ".join(str(exc).split())[:200]
        kept = "the previous one is unchanged" if previous else "nothing was written"
        raise CheckpointError(f"cannot write checkpoint {path} ({reason}); {kept}") from None


def best_k_files(path: Path, progress: Any) -> list[tuple[float, str]]:
    """The kept best checkpoints as (score, file name): each must be a best-step*.pt file of the run folder, as
    those that drop out are deleted."""
    entries = progress.get("best_k", []) if isinstance(progress, dict) else []   # no progress: refused elsewhere
    if not isinstance(entries, list) or not all(isinstance(e, list | tuple) and len(e) == 2 for e in entries):
        raise CheckpointError(f"{path}: progress.best_k is not a list of (score, file) pairs; the checkpoint is "
                              "damaged or not nmt's")
    for _, name in entries:
        if not plain_name(name) or not fnmatch.fnmatchcase(name, BEST_K_FILES):
            raise CheckpointError(f"{path}: progress.best_k names {name!r}, not a {BEST_K_FILES} file of its "
                                  "run folder; the checkpoint is damaged or not nmt's (nothing was deleted)")
    return [(float(score), name) for score, name in entries]


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load and check a checkpoint, checksums too; any problem is a `CheckpointError` naming the file."""
    path = Path(path)
    with open(path, "rb") if path.is_file() else io.BytesIO() as handle:
        if is_safetensors(handle.read(9)):
            raise CheckpointError(f"{path} is a model file (nmt export or a Hugging Face folder's), not a training "
                                  "checkpoint; give the checkpoints it came from (e.g. RUN/best-step*.pt)")
    try:
        state = model_file.read_file(path, "checkpoint", mmap=mmap)
        if state.get("kind") == model_file.MODEL_KIND:
            raise ModelFileError(f"{path} is a model file (nmt export), not a training checkpoint")
        model_file.check_keys(path, state, "checkpoint", model_file.CHECKPOINT_KEYS, model_file.CHECKPOINT_FORMAT)
        model_file.check_checksums(path, "checkpoint")
    except ModelFileError as exc:
        raise CheckpointError(str(exc)) from None
    return state


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Any]:
    """The mean parameters of checkpoints of one model; the rest comes from the last."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p, mmap=True) for p in paths]     # mmap: optimiser states read (CRC) but not loaded
    for path, state in zip(paths, states, strict=True):
        try:            # each one's weights fit its config, are finite and it embeds its tokenizer: read once
            model_file.checked_model(Path(path), {**state})
        except ModelFileError as exc:
            raise CheckpointError(str(exc)) from None
    first = states[0]
    keys, model_section = first["model"].keys(), stored_config(first["config"]).model
    for path, state in zip(paths, states, strict=True):
        if (state["model"].keys() != keys or any(state["model"][k].shape != first["model"][k].shape for k in keys)
                or stored_config(state["config"]).model != model_section):
            raise CheckpointError(f"checkpoint {path} holds a different model than {paths[0]}; cannot average")
        if state["tokenizer"] != first["tokenizer"]:
            raise CheckpointError(f"checkpoint {path} has another vocabulary than {paths[0]}; "
                                  "only checkpoints of one model (one run, or runs on one data folder) average")
    averaged = {k: torch.stack([s["model"][k].float() for s in states]).mean(0).to(first["model"][k].dtype)
                if first["model"][k].is_floating_point() else states[-1]["model"][k] for k in keys}
    last = states[-1]
    card = {k: v for k, v in (last.get("card") or {}).items() if k != "dev"}   # dev scores were of one checkpoint
    kept = (*model_file.CHECKPOINT_KEYS, "tokenizer", "shortlist")
    return {**{k: v for k, v in last.items() if k in kept and v is not None}, "model": averaged,
            "averaged_from": [str(p) for p in paths], "card": {**card, "averaged_from": [Path(p).name for p in paths]}}
