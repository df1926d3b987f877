"""The training loop: teacher forcing, mixed precision, clipping, schedules, validation, checkpoints.

Resuming is exact: a checkpoint holds the model, optimiser, schedule, scaler, every RNG state
and a data cursor (epoch, batch index, sampler seed); the sampler regenerates the epoch's batch
list from its seed and the loop continues at the cursor, so on the CPU an interrupted-then-
resumed run ends with bitwise the same parameters as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Below ideep's kernel cache (capped by nmt.device.limit_kernel_cache) oneDNN keeps its own primitive cache,
# also one entry per shape of a bf16 matrix product; with training batches of varying shape its
# default of 1024 entries grew a training process past 3 GB. 16 entries keep the hot per-step
# shapes. (Decoding keeps the default: its weights are fixed, and the many row counts of a
# shrinking beam search run 8% faster with it.) Set the variable yourself to choose otherwise;
# it is read when oneDNN first runs.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

import numpy as np
import sacrebleu
import torch
from tqdm import tqdm

from nmt.config import Config, ConfigError, dump_config, stored_config
from nmt.data.batching import Batch, BucketBatchSampler, ParallelIds
from nmt.data.corpus import DataError
from nmt.data.folder import DataFolder, train_corpora
from nmt.data.shortlist import SHORTLIST_FILE
from nmt.decode.search import greedy_search
from nmt.device import (
    autocast,
    autocast_dtype,
    grad_scaler,
    make_optimizer,
    resolve_device,
    use_deterministic_algorithms,
)
from nmt.folders import (
    LOCK,
    MARKER,
    append_text,
    atomic_write,
    check_overlap,
    copy_atomically,
    open_work_folder,
    read_marker,
    refuse_links,
    register_file,
    remove_leftovers,
    remove_nmt_files,
    write_marker,
)
from nmt.locks import lock_folder, release_folder
from nmt.model.filecheck import expected_weights
from nmt.model.seq2seq import Seq2Seq
from nmt.textio import read_lines
from nmt.train.checkpoint import CheckpointError, best_k_files, load_checkpoint, save_checkpoint
from nmt.train.graphed import GraphedUpdates, capturable_optimizer
from nmt.train.graphed import applies as graphs_apply
from nmt.train.loss import output_cross_entropy
from nmt.train.schedules import LrSchedule, teacher_forcing_ratio


class RunDirError(ValueError):
    """The run folder cannot be used as asked (not empty without --resume/--overwrite, nothing to resume)."""


class ValidationAbandoned(Exception):
    """A stop signal arrived during validation: the loop saves last.pt and exits instead of finishing it."""


TRAINING_STATE_KEYS = ("optimizer", "schedule", "scaler", "rng", "cursor", "progress")   # what --resume restores
# Keys whose change would move the data stream that a checkpoint's cursor points into.
DATA_STREAM_KEYS = ("training.seed", "training.batch_tokens", "training.batch_size", "training.bucket_pool")
FIXED_FOR_A_RUN = {
    "training.optimizer": "the checkpoint holds the other optimizer's state",
    "training.early_stopping_metric": "the best score so far and best.pt were chosen by the other metric",
}


@dataclass
class Cursor:
    """Where the data stream stands: the next batch to train on."""

    epoch: int = 0
    batch: int = 0
    seed: int = 0


@dataclass
class Progress:
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


def _higher_is_better(metric: str) -> bool:
    return metric == "bleu"


class Trainer:
    """Owns the model, optimiser and run folder of one training run."""

    def __init__(self, config: Config, resume: bool = False, overwrite: bool = False,
                 config_path: str | Path | None = None) -> None:
        # A shared lock on the data folder for the whole run: `nmt preprocess` cannot rewrite it meanwhile.
        self._data_dir = Path(config.data.out_dir) if config.data.out_dir else None
        self._data_lock = bool(self._data_dir and (self._data_dir / "manifest.json").is_file()
                               and lock_folder(self._data_dir, "train", shared=True))
        try:
            self._setup(config, resume, overwrite, config_path)
        except BaseException:
            self._release_data()
            raise

    def _setup(self, config: Config, resume: bool, overwrite: bool, config_path: str | Path | None) -> None:
        self.config = config
        t = config.training
        if t.run_dir is None:
            raise ConfigError("`training.run_dir` is required: the folder for checkpoints and logs")
        if config.data.out_dir is None:
            raise ConfigError("`data.out_dir` is required: the preprocessed data folder (run `nmt preprocess`)")
        self.run_dir = Path(t.run_dir)
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.is_main = self.rank == 0
        self.device = resolve_device(t.device)
        if t.threads:
            torch.set_num_threads(t.threads)
        self.data = DataFolder.open(config.data.out_dir)
        if not resume:                                  # a resumed run checks its own data (_data_mismatch)
            self.data.check_settings(config.data)
        self.src_vocab, self.tgt_vocab = self.data.vocab("src"), self.data.vocab("tgt")
        self._adopting = False                          # resuming a run folder from before markers
        self._lock_created = False                      # ... whose lock file this process made

        expected_weights(config.model, len(self.src_vocab), len(self.tgt_vocab), "the config", copies=4,
                         error=ConfigError)             # a model this machine cannot train: before allocating
        torch.manual_seed(t.seed)
        random.seed(t.seed)
        self.model = Seq2Seq.from_config(config.model, len(self.src_vocab), len(self.tgt_vocab)).to(self.device)
        self.train_model: torch.nn.Module = self.model
        if self.world_size > 1:
            self._setup_distributed()
            torch.manual_seed(t.seed + self.rank)      # same initial parameters, different dropout per rank
        optim_class = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
        graphed = t.cuda_graphs and graphs_apply(self.model, self.device, self.world_size,
                                                 autocast_dtype(t.precision, self.device, graphed=True),
                                                 config.model.rnn_type, t.accumulate)
        self.amp_dtype = autocast_dtype(t.precision, self.device, graphed)
        self.graphed: GraphedUpdates | None = None     # CUDA: updates replayed as captured graphs
        if graphed:
            self.optimizer = capturable_optimizer(optim_class, self.model.parameters(), t.lr, self.device,
                                                  betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
            self.graphed = GraphedUpdates(self.model, self.optimizer, self.amp_dtype, t.clip_grad_norm,
                                          t.label_smoothing)
        else:
            self.optimizer = make_optimizer(optim_class, self.model.parameters(), lr=t.lr,
                                            betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
        self.schedule = LrSchedule(self.optimizer, t)
        self.scaler = grad_scaler(enabled=self.amp_dtype == torch.float16)
        self.progress = Progress(cursor=Cursor(seed=t.seed))

        train = ParallelIds(self.data.ids("train", "src"), self.data.ids("train", "tgt"))
        self.train_ids = train
        corpora = [(c["start"], c["end"], c["weight"]) for c in self.data.manifest["splits"]["train"]["corpora"]]
        self.sampler = BucketBatchSampler(train.src_lengths, train.tgt_lengths, t.batch_tokens, t.batch_size,
                                          t.bucket_pool, seed=t.seed, rank=self.rank, world_size=self.world_size,
                                          corpora=corpora)
        self.dev_ids = (ParallelIds(self.data.ids("dev", "src"), self.data.ids("dev", "tgt"))
                        if self.data.has_split("dev") else None)
        self.stop_signal: int | None = None
        self.evaluating_dev = False                    # a signal now abandons validation at once
        # The run folder is touched only now, once the config has built a model and the data have loaded.
        self._prepare_run_dir(resume, overwrite, config_path)
        if t.deterministic:                             # process-wide, so only once the run is certain
            use_deterministic_algorithms()
        if resume:
            try:
                self._restore(load_checkpoint(self.run_dir / "last.pt"))
            except BaseException:
                self.close()
                if self._adopting and self._lock_created:   # not a run folder after all: leave it as it was
                    (self.run_dir / LOCK).unlink(missing_ok=True)
                raise
            if self._adopting:                         # a run folder from before markers: adopt it (rank 0)
                write_marker(self.run_dir, "run")
            if self.rank > 0:                          # last.pt holds rank 0's RNG state
                torch.manual_seed(t.seed + self.rank * 1_000_003 + self.progress.step)
            if self.is_main:
                self._trim_metrics()

    def close(self) -> None:
        """Let go of the run folder's and data folder's locks (a process that ends lets go anyway)."""
        if self.is_main:
            release_folder(self.run_dir)
        self._release_data()

    def _release_data(self) -> None:
        if self._data_lock:
            release_folder(self._data_dir)
            self._data_lock = False

    # ------------------------------------------------------------------ run folder

    def _prepare_run_dir(self, resume: bool, overwrite: bool, config_path: str | Path | None) -> None:
        """Check, lock and (for a new run) fill the run folder; only rank 0 touches it."""
        if not self.is_main:
            return
        d = self.config.data
        inputs = [Path(prefix) for _, prefix, _ in train_corpora(d)] if d.train else []
        inputs += [Path(p) for p in (d.dev, d.test, d.src_spm_model, d.tgt_spm_model) if p]
        check_overlap(self.run_dir, "training.run_dir", inputs, config_path)
        data_root = self.data.root.resolve()
        run = self.run_dir.resolve()
        if run == data_root or data_root in run.parents or run in data_root.parents:
            raise RunDirError(f"`training.run_dir` {self.run_dir} overlaps the data folder {self.data.root}; "
                              "choose a folder outside it")
        if resume:
            if not (self.run_dir / "last.pt").is_file():
                raise RunDirError(f"cannot resume: {self.run_dir / 'last.pt'} does not exist")
            marker = read_marker(self.run_dir)
            if marker is not None and marker.get("kind") != "run":
                raise RunDirError(f"cannot resume: {self.run_dir} is an nmt {marker.get('kind')} folder")
            self._adopting, self._lock_created = marker is None, not (self.run_dir / LOCK).exists()
            lock_folder(self.run_dir, "train")
            refuse_links(self.run_dir, "training.run_dir")     # its files are rewritten, never through a link
            remove_leftovers(self.run_dir)
            return
        ours = {MARKER, LOCK}
        exists = self.run_dir.is_dir() and any(p.name not in ours for p in self.run_dir.iterdir())
        if exists and not overwrite:
            marker = read_marker(self.run_dir)
            if marker is not None and marker.get("kind") == "run" and not (self.run_dir / "last.pt").is_file():
                raise RunDirError(f"run folder {self.run_dir} holds no last.pt to resume (a run that stopped "
                                  "before its first checkpoint?); pass --overwrite to start over")
            raise RunDirError(f"run folder {self.run_dir} is not empty; pass --resume to continue it or "
                              "--overwrite to start over")
        _, marker = open_work_folder(self.run_dir, "run", "training.run_dir", "train", "remove them yourself")
        if marker is not None:
            remove_nmt_files(self.run_dir, marker)
        atomic_write(self.run_dir / "config.yaml", lambda h: h.write(dump_config(self.config)), mode="w")
        for side in ("src", "tgt"):
            entry = self.data.manifest["vocab"][side]
            for name in (entry["model"], entry.get("pieces")):
                if name and not (self.run_dir / name).exists():
                    register_file(self.run_dir / name)     # whatever the data folder calls its models
                    copy_atomically(self.data.root / name, self.run_dir / name)
        if self.data.manifest.get("shortlist"):         # checkpoints embed it (nmt.train.checkpoint)
            register_file(self.run_dir / SHORTLIST_FILE)
            copy_atomically(self.data.root / SHORTLIST_FILE, self.run_dir / SHORTLIST_FILE)
        copy_atomically(self.data.root / "manifest.json", self.run_dir / "data_manifest.json")

    def _check_resume_config(self, saved: Config) -> dict[str, tuple[Any, Any]]:
        """Refuse changes that move the data stream; return the others as {key: (before, after)}."""
        old, new = _flatten(saved.to_dict()), _flatten(self.config.to_dict())
        changed = {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
                   if old.get(k) != new.get(k) and k not in ("training.run_dir", "data.out_dir")}
        for key, (before, after) in changed.items():
            if key.startswith("data.") or key in DATA_STREAM_KEYS:
                raise RunDirError(f"--resume cannot change `{key}` ({before!r} -> {after!r}): it changes the data "
                                  f"stream the checkpoint continues; keep it or start a new run")
            if key in FIXED_FOR_A_RUN:
                raise RunDirError(f"--resume cannot change `{key}` ({before!r} -> {after!r}): {FIXED_FOR_A_RUN[key]}; "
                                  "keep it or start a new run")
        return changed

    def _record_resume_changes(self, changed: dict[str, tuple[Any, Any]]) -> None:
        """Log the accepted changes and store the config they give in the run folder."""
        if not self.is_main:
            return
        for key, (before, after) in changed.items():
            tqdm.write(f"resume: {key} {before!r} -> {after!r}", file=sys.stderr)
        if changed:
            atomic_write(self.run_dir / "config.yaml", lambda h: h.write(dump_config(self.config)), mode="w")

    def _data_mismatch(self) -> str | None:
        """Why the data folder is not the one this run was trained on, if it is not."""
        recorded = self.run_dir / "data_manifest.json"
        if not recorded.is_file():
            return None
        try:
            fingerprint = json.loads(recorded.read_text(encoding="utf-8")).get("fingerprint")
        except (ValueError, AttributeError):
            return None
        if fingerprint and fingerprint != self.data.manifest.get("fingerprint"):
            return (f"--resume: the data folder {self.data.root} holds other data than this run was "
                    f"trained on ({recorded}); keep the data or start a new run")
        return None

    def _trim_metrics(self) -> None:
        """Drop events after the restored step (logged, then lost to a kill) and any torn last line."""
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        kept, dropped = [], 0
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict) or event.get("step", 0) > self.progress.step:
                dropped += 1
                continue
            kept.append(line + "\n")
        if dropped:
            atomic_write(path, lambda h: h.write("".join(kept)), mode="w")

    def _setup_distributed(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend)
        if self.device.type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            self.model.to(self.device)
        self.train_model = torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # ------------------------------------------------------------------ checkpoints

    def _state(self) -> dict[str, Any]:
        p = self.progress
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "config": self.config.to_dict(),
            "vocab": self.data.manifest["vocab"],
            "model": self.model.state_dict(),
            "optimizer": _portable(self.optimizer.state_dict()),
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng,
            "step": p.step,
            "cursor": vars(p.cursor).copy(),
            "progress": {"best_score": p.best_score, "bad_validations": p.bad_validations,
                         "best_k": [list(x) for x in p.best_k], "elapsed": p.elapsed + self._session_time(),
                         "validation_due": p.validation_due, "validated_step": p.validated_step,
                         "window_loss": p.window_loss,
                         "window_tokens": p.window_tokens},
        }

    def _restore(self, state: dict[str, Any]) -> None:
        saved = stored_config(state["config"])
        if saved.model != self.config.model:
            raise CheckpointError(f"{self.run_dir / 'last.pt'} was trained with a different `model` section")
        changed = self._check_resume_config(saved)
        best_k_files(self.run_dir / "last.pt", state.get("progress"))   # names checked before any is deleted
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise CheckpointError(f"{self.run_dir / 'last.pt'} does not fit the model: {str(exc)[:200]}") from None
        missing = [key for key in TRAINING_STATE_KEYS if key not in state]
        if missing:
            raise CheckpointError(f"{self.run_dir / 'last.pt'} lacks the training state `{missing[0]}` that --resume "
                                  "needs (an averaged checkpoint?); start a new run instead")
        try:
            self._restore_training_state(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{self.run_dir / 'last.pt'}: its training state cannot be restored "
                                  f"({type(exc).__name__}: {str(exc)[:200]})") from None
        mismatch = self._data_mismatch()
        if mismatch and (self.progress.validation_due or not self.finished_reason()):
            # a finished run reads no data (let it say it is done), unless it owes a validation
            raise RunDirError(mismatch)
        self._record_resume_changes(changed)

    def _restore_training_state(self, state: dict[str, Any]) -> None:
        """Optimiser, schedule, scaler, RNGs and progress, as `_state` saved them."""
        if not isinstance(state["step"], int) or isinstance(state["step"], bool) or state["step"] < 0:
            raise ValueError(f"step {state['step']!r} is not a count of updates")
        lr_tensors = [g["lr"] for g in self.optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]
        self.optimizer.load_state_dict(state["optimizer"])
        t = self.config.training
        for group in self.optimizer.param_groups:      # the state brings back the saved ones; the config wins
            group["betas"], group["weight_decay"] = tuple(t.adam_betas), t.weight_decay
        for group, lr in zip(self.optimizer.param_groups, lr_tensors, strict=False):   # a capturable optimiser
            group["lr"] = lr.fill_(float(group["lr"]))                               # keeps its lr tensor
        self.schedule.load_state_dict(state["schedule"])
        self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        prog = state["progress"]
        self.progress = Progress(step=state["step"], cursor=Cursor(**state["cursor"]), best_score=prog["best_score"],
                                 bad_validations=prog["bad_validations"],
                                 best_k=best_k_files(self.run_dir / "last.pt", prog), elapsed=prog["elapsed"],
                                 validation_due=bool(prog.get("validation_due", False)),   # older checkpoints:
                                 validated_step=int(prog.get("validated_step", -1)),       # none due, none known,
                                 window_loss=float(prog.get("window_loss", 0.0)),          # window empty
                                 window_tokens=int(prog.get("window_tokens", 0)))

    def _save(self, name: str) -> None:
        if self.is_main:
            save_checkpoint(self.run_dir / name, self._state())
        if name == "last.pt":
            self.last_saved = time.monotonic()

    def _save_due(self) -> bool:
        """`training.save_every_minutes` of training have passed since last.pt was written."""
        minutes = self.config.training.save_every_minutes
        return bool(minutes) and time.monotonic() - self.last_saved >= minutes * 60

    def _session_time(self) -> float:
        return time.monotonic() - self.started if hasattr(self, "started") else 0.0

    # ------------------------------------------------------------------ logging

    def _log(self, event: dict[str, Any]) -> None:
        if not self.is_main:
            return
        line = json.dumps({"time": round(time.time(), 3), **event}) + "\n"
        append_text(self.run_dir / "metrics.jsonl", line)

    # ------------------------------------------------------------------ training

    def _forward_loss(self, batch: Batch, teacher_forcing: float) -> torch.Tensor:
        """Summed loss of one batch (the output layer fused into the cross-entropy)."""
        batch = batch.to(self.device)
        with autocast(self.device, self.amp_dtype):
            features, _ = self.train_model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing,
                                           features_only=True)
            output = self.model.decoder.output
            loss = output_cross_entropy(features, output.weight, output.bias, batch.tgt_out,
                                        self.config.training.label_smoothing)
        return loss

    def _update(self, batches: list[Batch], teacher_forcing: float) -> tuple[float, int]:
        """One optimiser update over `batches` (gradient accumulation); returns (summed loss, target tokens)."""
        t = self.config.training
        if self.graphed is not None and len(batches) == 1 and teacher_forcing >= 1.0:
            return float(self.graphed.update(batches[0])), batches[0].n_tgt_tokens
        self.train_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = sum(b.n_tgt_tokens for b in batches)
        total = torch.zeros((), device=self.device)
        for batch in batches:
            loss = self._forward_loss(batch, teacher_forcing)
            self.scaler.scale(loss / tokens).backward()
            total += loss.detach()
        if t.clip_grad_norm:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return float(total), tokens

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGINT/SIGTERM ask the loop to stop after this update; a second one gives up at once."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, frame: Any) -> None:
            if self.stop_signal is not None:       # second signal: give up at once (temporaries are removed)
                before = previous.get(signum)
                if callable(before):
                    before(signum, frame)
                raise KeyboardInterrupt
            self.stop_signal = signum
            if self.evaluating_dev:                # pure computation: nothing to leave half-done
                raise ValidationAbandoned
        for sig in previous:
            signal.signal(sig, handler)
        return previous

    def finished_reason(self) -> str | None:
        """Why a resumed run has nothing left to do (its budget is spent or it stopped early), if it has not."""
        t, p = self.config.training, self.progress
        if t.max_updates and p.step >= t.max_updates:
            return f"max_updates {t.max_updates}"
        if p.cursor.epoch >= t.max_epochs:
            return f"max_epochs {t.max_epochs}"
        if t.max_minutes and p.elapsed / 60 >= t.max_minutes:
            return f"max_minutes {t.max_minutes}"
        if t.patience and p.bad_validations >= t.patience:
            return f"early stopping after {p.bad_validations} validations without improvement (patience {t.patience})"
        if self.schedule.floor_reached:
            return f"the plateau schedule took the learning rate below min_lr {t.min_lr}"
        return None

    def train(self) -> dict[str, Any]:
        """Run until max_updates / max_epochs / max_minutes / early stopping / a signal; returns the last metrics.

        The run folder's lock is released at the end.
        """
        try:
            return self._train()
        finally:
            self.close()

    def _train(self) -> dict[str, Any]:
        t = self.config.training
        p = self.progress
        finished = self.finished_reason()
        if finished and not p.validation_due:
            if self.is_main:
                tqdm.write(f"{self.run_dir} already finished at update {p.step} ({finished}); nothing to do. "
                           "Raise that limit with --set to train on.", file=sys.stderr)
            return {}
        self.started = self.last_saved = time.monotonic()
        previous_handlers = self._install_signal_handlers()
        bar = tqdm(total=t.max_updates or None, initial=p.step, desc="train", unit="upd", file=sys.stderr,
                   disable=not self.is_main, dynamic_ncols=True)
        session_tokens, window_start = 0, time.monotonic()     # for tokens/s: this process's share of the window
        last_metrics: dict[str, Any] = {}
        reason = "max_epochs"
        try:
            if p.validation_due:                       # the stopped run owes this step's validation
                last_metrics, stop = self._validate_owed()
                self._save("last.pt")
                if stop:
                    reason = stop
                    return last_metrics
            while p.cursor.epoch < t.max_epochs:
                batches = self.sampler.batches(p.cursor.epoch)
                while p.cursor.batch < len(batches):
                    group = batches[p.cursor.batch : p.cursor.batch + t.accumulate]
                    tf_ratio = teacher_forcing_ratio(t, p.step)
                    lr = self.schedule.step(p.step + 1, (p.elapsed + self._session_time()) / 60)
                    loss, tokens = self._update([self.train_ids.collate(rows) for rows in group], tf_ratio)
                    if not math.isfinite(loss):
                        raise FloatingPointError(f"training loss became {loss} at update {p.step + 1}")
                    p.step += 1
                    p.cursor.batch += len(group)
                    p.window_loss += loss
                    p.window_tokens += tokens
                    session_tokens += tokens
                    bar.update(1)
                    if p.step % t.log_every == 0:
                        speed = session_tokens / max(time.monotonic() - window_start, 1e-9)
                        mean_loss = p.window_loss / p.window_tokens
                        bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:.0f}")
                        self._log({"event": "train", "step": p.step, "epoch": p.cursor.epoch,
                                   "loss": mean_loss, "ppl": math.exp(min(mean_loss, 50)),
                                   "lr": lr, "teacher_forcing": tf_ratio, "tgt_tokens_per_s": speed,
                                   "wall_time": p.elapsed + self._session_time()})
                        p.window_loss, p.window_tokens = 0.0, 0
                        session_tokens, window_start = 0, time.monotonic()
                    stop = self._stop_reason()
                    on_schedule = p.step % t.validate_every == 0
                    if on_schedule or stop:
                        # Validate on schedule, and once more when a budget ends. A signal skips it (exit
                        # fast) or cuts it short; it then stays due, for --resume to run first.
                        if stop and stop.startswith("SIG"):
                            p.validation_due = on_schedule or bool(self._from_rank0(self._budget_spent()))
                        else:
                            last_metrics, stopping = self._validate_owed()
                            stop = stop or stopping
                        self._save("last.pt")
                        window_start = time.monotonic()
                    elif (t.save_every and p.step % t.save_every == 0) or self._from_rank0(self._save_due()):
                        self._save("last.pt")
                        stop = self._stop_reason()     # a signal during the save: last.pt is current, stop now
                    if stop:
                        reason = stop
                        return last_metrics
                p.cursor = Cursor(p.cursor.epoch + 1, 0, p.cursor.seed)
            if p.step % t.validate_every and p.step != p.validated_step:   # max_epochs ends a budget too
                stop = self._stop_reason()                                 # (all ranks agree)
                if stop and stop.startswith("SIG"):                        # a signal leaves it owed
                    p.validation_due, reason = True, stop
                else:
                    last_metrics, _ = self._validate_owed()
            self._save("last.pt")
            return last_metrics
        finally:
            bar.close()
            for sig, before in previous_handlers.items():
                signal.signal(sig, before)
            if self.is_main:
                tqdm.write(f"training stopped at update {p.step} ({reason}); checkpoints in {self.run_dir}",
                           file=sys.stderr)

    def _validate_owed(self) -> tuple[dict[str, Any], str | None]:
        """Run a scheduled or budget-end validation; returns the metrics ({} if a signal abandoned it) and a
        reason to stop, if any. An abandoned one stays owed (`Progress.validation_due`) for --resume."""
        t, p = self.config.training, self.progress
        metrics: dict[str, Any] = {}
        p.validation_due, p.validated_step = False, p.step      # as best.pt, saved inside, must record them
        try:
            metrics = self.validate()
        except ValidationAbandoned:
            p.validation_due = True
        if self.world_size > 1:                  # only rank 0 validates: its plateau schedule sets every rank's lr
            self.schedule.load_state_dict(self._from_rank0(self.schedule.state_dict()))
        stop = self._stop_reason()
        if t.patience and self._from_rank0(p.bad_validations >= t.patience):
            stop = stop or "early_stopping"
        if self._from_rank0(self.schedule.floor_reached):
            stop = stop or "lr_below_min_lr"
        return metrics, stop

    def _stop_reason(self) -> str | None:
        """Why to stop now, if at all; under DDP every rank gets rank 0's answer, so all stop together."""
        return self._from_rank0(self._local_stop_reason())

    def _from_rank0(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (only rank 0 validates, and ranks' clocks differ)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _local_stop_reason(self) -> str | None:
        if self.stop_signal is not None:
            return signal.Signals(self.stop_signal).name
        return self._budget_spent()

    def _budget_spent(self) -> str | None:
        """"max_updates" or "max_minutes" once that budget is spent (this process's view)."""
        t, p = self.config.training, self.progress
        if t.max_updates and p.step >= t.max_updates:
            return "max_updates"
        if t.max_minutes and (p.elapsed + self._session_time()) / 60 >= t.max_minutes:
            return "max_minutes"
        return None

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Dev loss, perplexity and greedy BLEU; updates best/best-k checkpoints and early stopping."""
        if self.dev_ids is None or not self.is_main:
            return {}
        t, p = self.config.training, self.progress
        with torch.random.fork_rng(devices=[]), self.model.decoder.frozen_weights():
            self.evaluating_dev = True
            try:
                metrics = self._evaluate_dev()
            finally:
                self.evaluating_dev = False
        metrics.update(step=p.step, epoch=p.cursor.epoch, lr=float(self.optimizer.param_groups[0]["lr"]),
                       wall_time=p.elapsed + self._session_time(), peak_rss_mb=peak_rss_mb())
        score = metrics[t.early_stopping_metric]
        higher = _higher_is_better(t.early_stopping_metric)
        improved = p.best_score is None or (score > p.best_score if higher else score < p.best_score)
        if improved:
            p.best_score, p.bad_validations = score, 0
        else:
            p.bad_validations += 1
        self.schedule.on_validation(score, higher)
        metrics["best"] = improved
        self._log({"event": "validation", **{k: v for k, v in metrics.items() if k != "examples"}})
        if improved:
            self._save("best.pt")
        self._keep_best_k(score, higher)
        tqdm.write(
            f"validation @ {p.step}: dev loss {metrics['loss']:.3f}  ppl {metrics['ppl']:.2f}  "
            f"BLEU {metrics['bleu']:.2f}{'  (best)' if improved else ''}", file=sys.stderr)
        for src, hyp, ref in metrics.get("examples", []):
            tqdm.write(f"  src: {src}\n  hyp: {hyp}\n  ref: {ref}", file=sys.stderr)
        return metrics

    def _keep_best_k(self, score: float, higher: bool) -> None:
        t, p = self.config.training, self.progress
        if not t.keep_best:
            return
        name = f"best-step{p.step}.pt"
        ranked = sorted([*p.best_k, (score, name)], key=lambda x: -x[0] if higher else x[0])
        kept, dropped = ranked[: t.keep_best], ranked[t.keep_best :]
        p.best_k = kept
        if any(n == name for _, n in kept):
            self._save(name)
        for _, old in dropped:
            (self.run_dir / old).unlink(missing_ok=True)

    def _evaluate_dev(self) -> dict[str, Any]:
        t = self.config.training
        self.model.eval()
        dev = self.dev_ids
        rows = np.arange(len(dev) if not t.val_max_sentences else min(t.val_max_sentences, len(dev)))
        sampler = BucketBatchSampler(dev.src_lengths[rows], dev.tgt_lengths[rows], t.val_batch_tokens, shuffle=False)
        loss_sum, tokens = 0.0, 0
        hyps: dict[int, list[int]] = {}
        for batch_rows in sampler.batches(0):
            if self.stop_signal is not None:
                raise ValidationAbandoned
            batch = dev.collate(rows[batch_rows]).to(self.device)
            with autocast(self.device, self.amp_dtype):
                features, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in, features_only=True)
                output = self.model.decoder.output              # in 1024-token chunks: no tokens x vocab peak
                loss_sum += float(output_cross_entropy(features, output.weight, output.bias, batch.tgt_out,
                                                       chunk_rows=1024))
                tokens += batch.n_tgt_tokens
                results = greedy_search(self.model, batch.src, batch.src_lengths,
                                        self.config.decoding.max_len_ratio)
            for index, hyp in zip(batch.indices.tolist(), results, strict=True):
                hyps[index] = hyp.tokens
        ordered = [hyps[i] for i in rows.tolist()]
        hypotheses = self.tgt_vocab.decode(ordered)
        references = read_lines(self.data.reference_path("dev"))[: len(rows)]   # only "\n" ends a line
        if len(references) != len(hypotheses):      # sacreBLEU would score the common prefix without a word
            raise DataError(f"{self.data.reference_path('dev')} has {len(references)} lines for {len(hypotheses)} "
                            "dev pairs; preprocess the data folder again")
        bleu = sacrebleu.corpus_bleu(hypotheses, [references])
        loss = loss_sum / max(tokens, 1)
        examples = []
        if t.log_examples:
            sources = self.src_vocab.decode([dev.src[i] for i in range(min(t.log_examples, len(rows)))])
            examples = list(zip(sources, hypotheses, references, strict=False))[: t.log_examples]
        return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": bleu.score, "examples": examples}


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux and macOS report it in different units)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def _portable(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimiser's state with plain-number learning rates (a capturable one keeps its lr in a GPU tensor),
    so that a checkpoint resumes on any device, with or without CUDA graphs."""
    groups = [{**g, "lr": float(g["lr"])} if isinstance(g["lr"], torch.Tensor) else g
              for g in optimizer_state["param_groups"]]
    return {**optimizer_state, "param_groups": groups}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"training": {"lr": 1}} -> {"training.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _as_tuple(value: Any) -> Any:
    """RNG states come back from torch.load with lists where tuples were saved."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value
