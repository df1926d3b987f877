"""The training loop: updates, logging, scheduled validation, checkpoints, budgets and stop signals.

`train(config)` builds a run's pieces (nmt.train.parts) and hands them to a `Trainer`, which only
trains; `train_step` is the one update (bench/benchmark.py and bench/profile_training.py time it).

Resuming is exact: a checkpoint holds the model, optimiser, schedule, scaler, every RNG state
and a data cursor (epoch, batch index, sampler seed); the sampler regenerates the epoch's batch
list from its seed and the loop continues at the cursor, so on the CPU an interrupted-then-
resumed run ends with bitwise the same parameters as an uninterrupted one.

`training.max_minutes` bounds the wall time of the whole run, the last validation and checkpoint
included: of `nmt train`, from the process's start (Python's and torch's start-up count); through the
API, from the Trainer's making. Updates stop while one more, the last validation, the last save and the
process's exit still fit; their durations are measured (before the first validation, a few dev
sentences are decoded and last.pt saved once to time them, and the sentences are timed again before an
old estimate stops the run). A resumed run spends what its earlier sessions left.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from nmt.config import Config
from nmt.data.batching import Batch
from nmt.device import autocast
from nmt.process import command_started
from nmt.progress import progress_bar
from nmt.train.checkpoint import Cursor, save_checkpoint, training_state
from nmt.train.loss import output_cross_entropy
from nmt.train.parts import TrainingParts, build_parts, finished_reason
from nmt.train.run_folder import RunDirError
from nmt.train.schedules import teacher_forcing_ratio
from nmt.train.validation import (
    ValidationAbandoned,
    estimate_dev_seconds,
    evaluate_dev,
    example_lines,
    first_sentence_attention,
    higher_is_better,
    peak_rss_mb,
    rank_best_k,
)

__all__ = ["RunDirError", "Trainer", "train", "train_step"]

# What a budget keeps for the process to end once the last checkpoint is written (the progress bar,
# the folders' locks, the interpreter's exit with torch loaded): measured at 0.2 to 0.4 s on 2 CPU cores.
EXIT_SECONDS = 0.5


def train(config: Config, resume: bool = False, overwrite: bool = False,
          config_path: str | Path | None = None) -> Trainer:
    """Build a run from its config, train it, let go of its folders; returns the trainer
    (`stop_signal` tells whether a signal ended it)."""
    trainer = Trainer(build_parts(config, resume, overwrite, config_path))
    trainer.train()
    return trainer


def train_step(parts: TrainingParts, batches: list[Batch], teacher_forcing: float = 1.0) -> tuple[float, int]:
    """One optimiser update over `batches` (gradient accumulation); returns (summed loss, target tokens).

    The loss is summed over target tokens and the gradient divided by their count, so accumulating
    k batches is the update one batch of their union would give. On CUDA with graphs the whole
    update replays a captured graph (nmt.train.graphed).
    """
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


class Padding:
    """PAD's share of the source and target batch tensors over a logging window (PAD positions / all
    positions), counted from each batch's shapes and lengths: bucketing exists to keep it low."""

    def __init__(self) -> None:
        self.src_real = self.src_cells = self.tgt_real = self.tgt_cells = 0

    def add(self, batches: list[Batch], tgt_tokens: int) -> None:
        """An update's batches (several with gradient accumulation), with the target tokens it counted."""
        for batch in batches:
            src_cells, tgt_cells = batch.cells
            self.src_cells += src_cells
            self.tgt_cells += tgt_cells
            self.src_real += batch.n_src_tokens
        self.tgt_real += tgt_tokens

    def fractions(self) -> tuple[float, float]:
        """(source, target) padding fractions of the window so far."""
        return (1 - self.src_real / max(self.src_cells, 1), 1 - self.tgt_real / max(self.tgt_cells, 1))


class Trainer:
    """Trains the pieces of one run until a budget, early stopping or a signal ends it."""

    def __init__(self, parts: TrainingParts | Config, resume: bool = False, overwrite: bool = False,
                 config_path: str | Path | None = None) -> None:
        """`parts` as `build_parts` made them; a `Config` builds them here (with resume, overwrite, config_path)."""
        if isinstance(parts, Config):
            parts = build_parts(parts, resume, overwrite, config_path)
        elif resume or overwrite or config_path is not None:
            raise TypeError("resume, overwrite and config_path apply when the Trainer builds its parts from a Config")
        self.parts = parts
        self.config, self.data, self.device, self.amp_dtype = parts.config, parts.data, parts.device, parts.amp_dtype
        self.model, self.optimizer, self.schedule, self.scaler = (parts.model, parts.optimizer, parts.schedule,
                                                                  parts.scaler)
        self.graphed, self.sampler, self.train_ids, self.dev_ids = (parts.graphed, parts.sampler, parts.train_ids,
                                                                    parts.dev_ids)
        self.src_vocab, self.tgt_vocab = parts.vocabs
        self.run, self.ranks, self.run_dir = parts.run, parts.ranks, parts.run.path
        self.is_main, self.world_size = parts.ranks.is_main, parts.ranks.world_size
        self.progress, self.tensorboard = parts.progress, parts.tensorboard
        self.stop_signal: int | None = None
        self.evaluating_dev = False                    # a signal now abandons validation at once
        self.started = command_started() or time.monotonic()   # when this session began: max_minutes counts
        self.last_saved = time.monotonic()
        # measured durations (seconds) that the budget keeps time for: an update (moving average), the
        # last validation with its checkpoints (a scheduled one's, or an estimate), a save of last.pt
        self.update_seconds: float | None = None
        self.final_seconds: float | None = None
        self.final_estimated: float | None = None   # when final_seconds was last estimated; None: measured
        self.estimate_interval = 0.0                  # how often to estimate again
        self.save_seconds: float | None = None

    def close(self) -> None:
        """Let go of the run folder's and data folder's locks (a process that ends lets go anyway)."""
        self.parts.close()

    def finished_reason(self) -> str | None:
        """Why a resumed run has nothing left to do (its budget is spent or it stopped early), if it has not."""
        return finished_reason(self.config, self.progress, self.schedule)

    def train(self) -> dict[str, Any]:
        """Run until max_updates / max_epochs / max_minutes / early stopping / a signal; returns the last metrics.

        The run folder's lock is released at the end.
        """
        try:
            return self._train()
        finally:
            self.close()

    def _update(self, batches: list[Batch], teacher_forcing: float) -> tuple[float, int]:
        start = time.monotonic()
        result = train_step(self.parts, batches, teacher_forcing)
        self._measured_update(time.monotonic() - start)
        return result

    def _train(self) -> dict[str, Any]:
        t, p = self.config.training, self.progress
        finished = self.finished_reason()
        if finished and not p.validation_due:
            if self.is_main:
                tqdm.write(f"{self.run_dir} already finished at update {p.step} ({finished}); nothing to do. "
                           "Raise that limit with --set to train on.", file=sys.stderr)
            return {}
        self.last_saved = time.monotonic()
        previous_handlers = self._install_signal_handlers()
        bar = progress_bar("train", "upd", total=t.max_updates or None, initial=p.step, disable=not self.is_main,
                           dynamic_ncols=True)
        session_tokens, window_start = 0, time.monotonic()     # for tokens/s: this process's share of the window
        padding = Padding()                                    # this process's share of the window, too
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
                    collated = [self.train_ids.collate(rows) for rows in group]
                    loss, tokens = self._update(collated, tf_ratio)
                    padding.add(collated, tokens)
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
                        self._log_window(bar, lr, tf_ratio, speed, padding)
                        session_tokens, window_start, padding = 0, time.monotonic(), Padding()
                    stop = self._stop_reason()
                    on_schedule = p.step % t.validate_every == 0
                    if on_schedule or stop:
                        # Validate on schedule, and once more when a budget ends. A signal skips it (exit
                        # fast) or cuts it short; it then stays due, for --resume to run first.
                        if stop and stop.startswith("SIG"):
                            p.validation_due = on_schedule or bool(self.ranks.from_rank0(self._budget_spent()))
                        else:
                            last_metrics, stopping = self._validate_owed()
                            stop = stop or stopping
                        self._save("last.pt")
                        stop = stop or self._stop_reason()   # no time for another update and validation
                        window_start = time.monotonic()
                    elif (t.save_every and p.step % t.save_every == 0) or self.ranks.from_rank0(self._save_due()):
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

    def _log_window(self, bar: Any, lr: float, tf_ratio: float, speed: float, padding: Padding) -> None:
        """The logging window's train event (metrics.jsonl, TensorBoard) and progress line; starts a new window."""
        p = self.progress
        mean_loss = p.window_loss / p.window_tokens
        src_pad, tgt_pad = padding.fractions()
        bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:.0f}",
                        pad=f"{src_pad:.0%}/{tgt_pad:.0%}")
        event = {"event": "train", "step": p.step, "epoch": p.cursor.epoch,
                 "loss": mean_loss, "ppl": math.exp(min(mean_loss, 50)),
                 "lr": lr, "teacher_forcing": tf_ratio, "tgt_tokens_per_s": speed,
                 "src_padding": src_pad, "tgt_padding": tgt_pad,
                 "wall_time": p.elapsed + self._session_time()}
        self.run.log(event)
        if self.tensorboard is not None:
            self.tensorboard.train(event)
        p.window_loss, p.window_tokens = 0.0, 0

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

    # ------------------------------------------------------------------ when to stop

    def _stop_reason(self) -> str | None:
        """Why to stop now, if at all; under DDP every rank gets rank 0's answer, so all stop together."""
        return self.ranks.from_rank0(self._local_stop_reason())

    def _local_stop_reason(self) -> str | None:
        if self.stop_signal is not None:
            return signal.Signals(self.stop_signal).name
        return self._budget_spent()

    def _budget_spent(self) -> str | None:
        """"max_updates" once that many are done; "max_minutes" once one more update, the last validation and
        checkpoint and the exit no longer fit in the budget (this process's view)."""
        t, p = self.config.training, self.progress
        if t.max_updates and p.step >= t.max_updates:
            return "max_updates"
        if not t.max_minutes:
            return None
        if self.final_estimated is not None and time.monotonic() - self.final_estimated > self.estimate_interval:
            self._estimate_final()            # the model's greedy outputs change length as it learns
        if p.elapsed + self._session_time() + self._time_to_finish() >= t.max_minutes * 60:
            return "max_minutes"
        return None

    def _measured_update(self, seconds: float) -> None:
        """An update's duration into the moving average (the first, with its warm-up, starts it high)."""
        self.update_seconds = seconds if self.update_seconds is None else 0.9 * self.update_seconds + 0.1 * seconds

    def _time_to_finish(self) -> float:
        """Seconds that one more update, then the last validation, last.pt and the exit take; an estimate of the
        validation gets a larger margin than a measured one."""
        if self.final_seconds is None:
            self._estimate_final()
        margin = 1.1 if self.final_estimated is None else 1.25
        return (self.update_seconds or 0.0) + margin * (self.final_seconds or 0.0) + EXIT_SECONDS

    def _estimate_final(self) -> None:
        """Before a scheduled validation has been measured: a few dev sentences decoded, timed and scaled to
        the dev set, and last.pt saved once, to time it."""
        start = time.monotonic()
        if self.save_seconds is None:
            self._save("last.pt")                                   # times itself
        dev = 0.0
        if self.dev_ids is not None and self.is_main:
            with torch.random.fork_rng(devices=[]):
                dev = estimate_dev_seconds(self.model, self.dev_ids, self.config, self.device, self.amp_dtype)
        # validation writes best.pt and a best-step file besides last.pt
        self.final_seconds, self.final_estimated = dev + 3 * (self.save_seconds or 0.0), time.monotonic()
        # again after 5% of the budget, or 10 times what this took: estimating costs at most a tenth of it
        self.estimate_interval = max(0.05 * self.config.training.max_minutes * 60, 10 * (time.monotonic() - start))

    # ------------------------------------------------------------------ validation

    def _validate_owed(self) -> tuple[dict[str, Any], str | None]:
        """Run a scheduled or budget-end validation; returns the metrics ({} if a signal abandoned it) and a
        reason to stop, if any. An abandoned one stays owed (`Progress.validation_due`) for --resume."""
        t, p = self.config.training, self.progress
        metrics: dict[str, Any] = {}
        p.validation_due, p.validated_step = False, p.step      # as best.pt, saved inside, must record them
        start = time.monotonic()
        try:
            metrics = self.validate()
            # what the last validation will take, with its checkpoints and last.pt after it (for max_minutes)
            self.final_seconds = time.monotonic() - start + (self.save_seconds or 0.0)
            self.final_estimated = None
        except ValidationAbandoned:
            p.validation_due = True
        if self.world_size > 1:                  # only rank 0 validates: its plateau schedule sets every rank's lr
            self.schedule.load_state_dict(self.ranks.from_rank0(self.schedule.state_dict()))
        stop = self._stop_reason()
        if t.patience and self.ranks.from_rank0(p.bad_validations >= t.patience):
            stop = stop or "early_stopping"
        if self.ranks.from_rank0(self.schedule.floor_reached):
            stop = stop or "lr_below_min_lr"
        return metrics, stop

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Dev loss, perplexity, greedy BLEU and chrF; updates best/best-k checkpoints and early stopping."""
        if self.dev_ids is None or not self.is_main:
            return {}
        t, p = self.config.training, self.progress
        vocabs = (self.src_vocab, self.tgt_vocab)
        with torch.random.fork_rng(devices=[]):
            self.evaluating_dev = True
            try:
                metrics = evaluate_dev(self.model, self.dev_ids, self.data, vocabs, self.config, self.device,
                                       self.amp_dtype, lambda: self.stop_signal is not None)
                if self.tensorboard is not None:
                    attention = first_sentence_attention(self.model, self.dev_ids, vocabs, self.device,
                                                         self.amp_dtype, self.config.decoding.max_len_ratio)
            finally:
                self.evaluating_dev = False
        metrics.update(step=p.step, epoch=p.cursor.epoch, lr=float(self.optimizer.param_groups[0]["lr"]),
                       wall_time=p.elapsed + self._session_time(), peak_rss_mb=peak_rss_mb())
        score = metrics[t.early_stopping_metric]
        higher = higher_is_better(t.early_stopping_metric)
        improved = p.best_score is None or (score > p.best_score if higher else score < p.best_score)
        if improved:
            p.best_score, p.bad_validations = score, 0
        else:
            p.bad_validations += 1
        self.schedule.on_validation(score, higher)
        metrics["best"] = improved
        self.run.log({"event": "validation", **{k: v for k, v in metrics.items() if k != "examples"}})
        if self.tensorboard is not None:
            self.tensorboard.validation(metrics)
            self.tensorboard.attention(p.step, *attention)
        if improved:
            self._save("best.pt")
        if t.keep_best:
            name = f"best-step{p.step}.pt"
            p.best_k, dropped = rank_best_k(p.best_k, score, name, t.keep_best, higher)
            if any(n == name for _, n in p.best_k):
                self._save(name)
            for old in dropped:
                (self.run_dir / old).unlink(missing_ok=True)
        tqdm.write(
            f"validation @ {p.step}: dev loss {metrics['loss']:.3f}  ppl {metrics['ppl']:.2f}  "
            f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.2f}{'  (best)' if improved else ''}",
            file=sys.stderr)
        for example in metrics.get("examples", []):
            tqdm.write(example_lines(*example), file=sys.stderr)
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def _save(self, name: str) -> None:
        start = time.monotonic()
        if self.is_main:
            state = training_state(self.config, self.data.manifest["vocab"], self.model, self.optimizer,
                                   self.schedule, self.scaler, self.progress,
                                   self.progress.elapsed + self._session_time())
            save_checkpoint(self.run_dir / name, state)
        if name == "last.pt":
            self.last_saved = time.monotonic()
            self.save_seconds = self.last_saved - start

    def _save_due(self) -> bool:
        """`training.save_every_minutes` of training have passed since last.pt was written."""
        minutes = self.config.training.save_every_minutes
        return bool(minutes) and time.monotonic() - self.last_saved >= minutes * 60

    def _session_time(self) -> float:
        """Seconds this session has run: since the `nmt` process started (see the module's docstring)."""
        return time.monotonic() - self.started
