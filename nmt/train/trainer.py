"""The training loop, on one screen: update, log, validate and save, stop (the stop rules: nmt.train.stopping).

Resuming is exact: a checkpoint holds the model, optimiser, schedule, scaler, RNG states and the data cursor
(the sampler regenerates the epoch's batches), so on the CPU a resumed run ends bitwise equal to a straight one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from nmt.config import Config
from nmt.data.batching import Batch
from nmt.device import autocast
from nmt.progress import progress_bar
from nmt.train import validation
from nmt.train.checkpoint import Cursor, rng_state, save_checkpoint, training_state
from nmt.train.loss import output_cross_entropy
from nmt.train.parts import TrainingParts, build_parts
from nmt.train.run_folder import RunDirError
from nmt.train.schedules import teacher_forcing_ratio
from nmt.train.stopping import Budget, StopSignals, after_validation, finished_reason

__all__ = ["RunDirError", "Trainer", "train", "train_step"]


def train(config: Config, resume: bool = False, overwrite: bool = False,
          config_path: str | Path | None = None) -> Trainer:
    """Build a run from its config and train it; the Trainer's `stop_signal` says if a signal ended it."""
    trainer = Trainer(config, resume, overwrite, config_path)
    trainer.train()
    return trainer


def train_step(parts: TrainingParts, batches: list[Batch], teacher_forcing: float = 1.0) -> tuple[float, int]:
    """One optimiser update over `batches`; returns (summed loss, target tokens). The gradient is divided by
    the tokens of all batches: k accumulated batches update as their union would. bench/ times this."""
    t = parts.config.training
    if parts.graphed is not None and len(batches) == 1 and teacher_forcing >= 1.0:
        return float(parts.graphed.update(batches[0])), batches[0].n_tgt_tokens
    parts.train_model.train()
    parts.optimizer.zero_grad(set_to_none=True)
    tokens = sum(b.n_tgt_tokens for b in batches)
    total = torch.zeros((), device=parts.device)
    output = parts.model.decoder.output                 # fused into the cross-entropy: no logits tensor
    for batch in batches:
        batch = batch.to(parts.device)
        with autocast(parts.device, parts.amp_dtype):
            features, _ = parts.train_model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing,
                                            features_only=True)               # (batch, tgt_len, hidden)
            loss = output_cross_entropy(features, output.weight, output.bias, batch.tgt_out, t.label_smoothing)
        parts.scaler.scale(loss / tokens).backward()
        total += loss.detach()
    if t.clip_grad_norm:
        parts.scaler.unscale_(parts.optimizer)
        torch.nn.utils.clip_grad_norm_(parts.model.parameters(), t.clip_grad_norm)
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    return float(total), tokens


class Window:
    """This process's logging window: target tokens per second, and PAD's share of the batch tensors (bucketing
    exists to keep it low)."""

    def __init__(self) -> None:
        self.tokens = self.src_real = self.src_cells = self.tgt_cells = 0
        self.start = time.monotonic()          # validation time does not count: it moves this on

    def add(self, batches: list[Batch], tgt_tokens: int) -> None:
        self.tokens += tgt_tokens
        self.src_real += sum(b.n_src_tokens for b in batches)
        self.src_cells += sum(b.cells[0] for b in batches)
        self.tgt_cells += sum(b.cells[1] for b in batches)

    def stats(self) -> tuple[float, float, float]:
        """(target tokens per second, source padding, target padding)"""
        return (self.tokens / max(time.monotonic() - self.start, 1e-9), 1 - self.src_real / max(self.src_cells, 1),
                1 - self.tokens / max(self.tgt_cells, 1))


class Trainer:
    """Trains the pieces of one run until a budget, early stopping or a signal ends it."""

    def __init__(self, parts: TrainingParts | Config, resume: bool = False, overwrite: bool = False,
                 config_path: str | Path | None = None) -> None:
        """`parts` as `build_parts` made them; a `Config` builds them here (with resume, overwrite, config_path)."""
        if isinstance(parts, Config):
            parts = build_parts(parts, resume, overwrite, config_path)
        elif resume or overwrite or config_path is not None:
            raise TypeError("resume, overwrite and config_path apply when the Trainer builds its parts from a Config")
        self.parts = p = parts
        self.config, self.data, self.device, self.amp_dtype = p.config, p.data, p.device, p.amp_dtype
        self.model, self.optimizer, self.schedule, self.scaler = p.model, p.optimizer, p.schedule, p.scaler
        self.graphed, self.sampler, self.train_ids, self.dev_ids = p.graphed, p.sampler, p.train_ids, p.dev_ids
        self.src_vocab, self.tgt_vocab = p.vocabs
        self.run, self.ranks, self.run_dir, self.is_main = p.run, p.ranks, p.run.path, p.ranks.is_main
        self.progress, self.tensorboard = p.progress, p.tensorboard
        self.signals = StopSignals()
        dev_seconds = partial(validation.estimate_dev_seconds, p.model, p.dev_ids if self.is_main else None, p.config,
                              p.device, p.amp_dtype)
        self.budget = Budget(self.config.training, self.progress, lambda: self._save("last.pt"), dev_seconds)
        self.last_metrics: dict[str, Any] = {}

    @property
    def stop_signal(self) -> int | None:
        return self.signals.received

    def close(self) -> None:
        self.parts.close()

    def finished_reason(self) -> str | None:
        return finished_reason(self.config.training, self.progress, self.schedule)

    def train(self) -> dict[str, Any]:
        """Train until a stop rule ends it, then let go of the folders; returns the last validation's metrics."""
        t, p = self.config.training, self.progress
        ending: str | None = None       # the stop rule that ended it, "gave up" (a second signal); None: an error
        try:
            finished = self.finished_reason()
            if finished and not p.validation_due:            # a run that owes a validation runs it first
                if self.is_main:
                    tqdm.write(f"{self.run_dir} already finished at update {p.step} ({finished}); nothing to do. "
                               "Raise that limit with --set to train on.", file=sys.stderr)
                return {}
            bar = progress_bar("train", "upd", total=t.max_updates or None, initial=p.step,
                               disable=not self.is_main, dynamic_ncols=True)
            window, self.budget.last_saved = Window(), time.monotonic()
            with self.signals, bar:
                stop = self._validate_and_save(None) if p.validation_due else None     # as the stopped run owed
                for rows in self._stream() if not stop else ():
                    tf_ratio = teacher_forcing_ratio(t, p.step)
                    lr = self.schedule.step(p.step + 1, self.budget.run_seconds() / 60)
                    self._update([self.train_ids.collate(r) for r in rows], tf_ratio, window)
                    bar.update(1)
                    if p.step % t.log_every == 0:
                        window = self._log_window(bar, lr, tf_ratio, window)
                    stop = self._stop_reason()
                    if stop or p.step % t.validate_every == 0:
                        stop = self._validate_and_save(stop)
                        window.start = time.monotonic()
                    elif ((t.save_every and p.step % t.save_every == 0)        # rank 0's clock, asked only if used
                          or (t.save_every_minutes and self.ranks.from_rank0(self.budget.save_due()))):
                        self._save("last.pt")
                        stop = self._stop_reason()     # a signal during the save: last.pt is current, stop now
                    if stop:
                        break
                ending = stop or self._last_epoch_done() or "max_epochs"
        except KeyboardInterrupt:
            ending = "gave up" if self.signals.received is not None else None
            raise
        finally:
            if self.is_main and ending:
                tqdm.write(f"training stopped at update {p.step} ({self._why_stopped(ending)}); checkpoints in "
                           f"{self.run_dir}", file=sys.stderr)
            self.close()
        return self.last_metrics

    def _why_stopped(self, ending: str) -> str:
        """A signal outranks the budget end it came during: it may have left that validation owed."""
        signal = self.signals.reason
        if signal is None:
            return ending
        if ending == "gave up":
            return (f"interrupted: {signal}, then a second signal: gave up at once; --resume continues from the "
                    "last checkpoint written")
        return f"interrupted: {signal}" + ("; the last validation is owed, --resume runs it"
                                           if self.progress.validation_due else "")

    def _stream(self) -> Iterator[list[np.ndarray]]:
        """Each update's `training.accumulate` batches of rows, from the data cursor to the last epoch."""
        t, p = self.config.training, self.progress
        while p.cursor.epoch < t.max_epochs:
            batches = self.sampler.batches(p.cursor.epoch)
            while p.cursor.batch < len(batches):
                yield batches[p.cursor.batch : p.cursor.batch + t.accumulate]
            p.cursor = Cursor(p.cursor.epoch + 1, 0, p.cursor.seed)

    def _update(self, batches: list[Batch], teacher_forcing: float, window: Window) -> None:
        """One update, counted: the step, the data cursor, the logging window."""
        p, start = self.progress, time.monotonic()
        loss, tokens = train_step(self.parts, batches, teacher_forcing)
        self.budget.updated(time.monotonic() - start)
        window.add(batches, tokens)
        if not math.isfinite(loss):
            raise FloatingPointError(f"training loss became {loss} at update {p.step + 1}")
        p.step += 1
        p.cursor.batch += len(batches)
        p.window_loss += loss
        p.window_tokens += tokens

    def _log_window(self, bar: Any, lr: float, tf_ratio: float, window: Window) -> Window:
        """The logging window's train event (metrics.jsonl, TensorBoard) and progress line; a new window."""
        p = self.progress
        mean_loss, (speed, src_pad, tgt_pad) = p.window_loss / p.window_tokens, window.stats()
        bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:.0f}",
                        pad=f"{src_pad:.0%}/{tgt_pad:.0%}")
        event = {"event": "train", "step": p.step, "epoch": p.cursor.epoch, "loss": mean_loss,
                 "ppl": math.exp(min(mean_loss, 50)), "lr": lr, "teacher_forcing": tf_ratio, "tgt_tokens_per_s": speed,
                 "src_padding": src_pad, "tgt_padding": tgt_pad, "wall_time": self.budget.run_seconds()}
        self.run.log(event)
        if self.tensorboard is not None:
            self.tensorboard.scalars("train", event)
        p.window_loss, p.window_tokens = 0.0, 0
        return Window()

    def _stop_reason(self) -> str | None:
        """Under DDP every rank gets rank 0's answer, so all stop together; there every rank asks its budget,
        signal or not, as its first estimate saves last.pt (a collective)."""
        signal = self.signals.reason
        spent = self.budget.spent() if signal is None or self.ranks.world_size > 1 else None
        return self.ranks.from_rank0(signal or spent)

    def _validate_and_save(self, stop: str | None) -> str | None:
        """Validate (on schedule, when a budget ends, or as owed), then save last.pt. A signal skips the
        validation (exit fast) or cuts it short; it then stays due, for --resume to run first."""
        p = self.progress
        if stop and stop.startswith("SIG"):
            p.validation_due = p.step % self.config.training.validate_every == 0 or bool(
                self.ranks.from_rank0(self.budget.spent()))
        else:
            stopping = self._validate_owed()
            stop = stop or stopping
        self._save("last.pt")
        return stop or self._stop_reason()      # no time for another update and validation

    def _last_epoch_done(self) -> str | None:
        """max_epochs ends a budget too: validate once more, unless this update was; save last.pt. Returns
        the signal that leaves that validation owed, if one does."""
        p, signal_stop = self.progress, None
        if p.step % self.config.training.validate_every and p.step != p.validated_step:
            stop = self._stop_reason()
            if stop and stop.startswith("SIG"):
                p.validation_due, signal_stop = True, stop
            else:
                self._validate_owed()
        self._save("last.pt")
        return signal_stop

    def _validate_owed(self) -> str | None:
        """A scheduled or budget-end validation; returns a reason to stop. One a signal abandons stays owed."""
        p = self.progress
        p.validation_due, p.validated_step = False, p.step      # as best.pt, saved inside, must record them
        start = time.monotonic()
        try:
            self.last_metrics = self.validate()
            self.budget.validated(time.monotonic() - start)
        except validation.ValidationAbandoned:
            self.last_metrics, p.validation_due = {}, True
        if self.ranks.world_size > 1:            # only rank 0 validates: its plateau schedule sets every rank's lr
            self.schedule.load_state_dict(self.ranks.from_rank0(self.schedule.state_dict()))
        return self._stop_reason() or self.ranks.from_rank0(after_validation(self.config.training, p, self.schedule))

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Dev loss, perplexity, greedy BLEU and chrF; updates best/best-k checkpoints and early stopping."""
        if self.dev_ids is None or not self.is_main:
            return {}
        t, p = self.config.training, self.progress
        with torch.random.fork_rng(devices=[]):
            self.signals.evaluating = True
            try:
                metrics = validation.evaluate_dev(self.model, self.dev_ids, self.data, self.parts.vocabs, self.config,
                                                  self.device, self.amp_dtype, lambda: self.stop_signal is not None)
                if self.tensorboard is not None:
                    attention = validation.first_sentence_attention(self.model, self.dev_ids, self.parts.vocabs,
                                                                    self.device, self.amp_dtype,
                                                                    self.config.decoding.max_len_ratio)
            finally:
                self.signals.evaluating = False
        metrics.update(step=p.step, epoch=p.cursor.epoch, lr=float(self.optimizer.param_groups[0]["lr"]),
                       wall_time=self.budget.run_seconds(), peak_rss_mb=validation.peak_rss_mb())
        score, higher = metrics[t.early_stopping_metric], t.early_stopping_metric == "bleu"
        improved = p.best_score is None or (score > p.best_score if higher else score < p.best_score)
        p.best_score, p.bad_validations = (score, 0) if improved else (p.best_score, p.bad_validations + 1)
        self.schedule.on_validation(score, higher)
        metrics["best"] = improved
        self.run.log({"event": "validation", **{k: v for k, v in metrics.items() if k != "examples"}})
        if self.tensorboard is not None:
            self.tensorboard.validation(metrics, *attention)
        if improved:
            self._save("best.pt")
        if t.keep_best:                          # the best `keep_best` as (score, file name), best first
            name = f"best-step{p.step}.pt"
            ranked = sorted([*p.best_k, (score, name)], key=lambda x: -x[0] if higher else x[0])
            p.best_k = ranked[: t.keep_best]
            if any(n == name for _, n in p.best_k):
                self._save(name)
            for _, old in ranked[t.keep_best :]:
                (self.run_dir / old).unlink(missing_ok=True)
        tqdm.write(f"validation @ {p.step}: dev loss {metrics['loss']:.3f}  ppl {metrics['ppl']:.2f}  "
                   f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}{'  (best)' if improved else ''}",
                   file=sys.stderr)
        for example in metrics.get("examples", []):
            tqdm.write(validation.example_lines(*example), file=sys.stderr)
        return metrics

    def _save(self, name: str) -> None:
        """Rank 0 writes `name`; every rank saves last.pt (so it gathers each rank's RNG states), only rank 0
        a best checkpoint."""
        start = time.monotonic()
        ranks_rng = self.ranks.gather(rng_state()) if name == "last.pt" else None
        if self.is_main:
            state = training_state(self.config, self.data.manifest["vocab"], self.model, self.optimizer,
                                   self.schedule, self.scaler, self.progress, self.budget.run_seconds(), ranks_rng)
            save_checkpoint(self.run_dir / name, state)
        if name == "last.pt":
            self.budget.saved(start)
