"""When training stops, and why; the loop (nmt.train.trainer) asks these rules.

After every update: SIGINT/SIGTERM (exit 130/143; a second gives up at once, one during validation abandons it),
max_updates, max_minutes (`Budget`). After a validation: early_stopping, lr_below_min_lr. At the end of the data:
max_epochs. A budget's end validates the last update too; a signal leaves that validation owed to --resume.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from nmt.config import TrainingConfig
from nmt.process import command_started
from nmt.train.checkpoint import Progress
from nmt.train.schedules import LrSchedule
from nmt.train.validation import ValidationAbandoned

# Kept for the process to end after the last checkpoint (progress bar, locks, interpreter exit with torch):
# measured at 0.2 to 0.4 s on 2 CPU cores.
EXIT_SECONDS = 0.5


class StopSignals:
    """The first SIGINT/SIGTERM stops after this update or abandons a validation (pure computation) at once; a
    second gives up at once (temporaries are removed)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.evaluating = False
        self._previous: dict[int, Any] = {}

    @property
    def reason(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, before in self._previous.items():
            signal.signal(sig, before)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            before = self._previous.get(signum)
            if callable(before):
                before(signum, frame)
            raise KeyboardInterrupt
        self.received = signum
        if self.evaluating:
            raise ValidationAbandoned


class Budget:
    """`training.max_updates` and `training.max_minutes`: the wall time of the whole run (from `nmt train`'s
    start, or the Trainer's making; a resumed run spends what its earlier sessions left), keeping time for one
    more update, the last validation with its checkpoints (measured; until then estimated from a few dev
    sentences and one save of last.pt, again as the model learns) and the exit."""

    def __init__(self, training: TrainingConfig, progress: Progress, save_last: Callable[[], None],
                 dev_seconds: Callable[[], float]) -> None:
        self.training, self.progress = training, progress
        self.save_last, self.dev_seconds = save_last, dev_seconds     # save_last's `saved` call times it
        self.started = command_started() or time.monotonic()
        self.last_saved = time.monotonic()
        self.update_seconds: float | None = None    # moving average
        self.save_seconds: float | None = None
        self.final_seconds: float | None = None
        self.final_estimated: float | None = None   # when final_seconds was last estimated; None: measured
        self.estimate_interval = 0.0

    def run_seconds(self) -> float:
        return self.progress.elapsed + time.monotonic() - self.started

    def updated(self, seconds: float) -> None:
        """The first update, with its warm-up, starts the average high."""
        self.update_seconds = seconds if self.update_seconds is None else 0.9 * self.update_seconds + 0.1 * seconds

    def saved(self, start: float) -> None:
        """last.pt was written from `start` (time.monotonic()) until now."""
        self.last_saved = time.monotonic()
        self.save_seconds = self.last_saved - start

    def validated(self, seconds: float) -> None:
        """The last validation will take as long, with its checkpoints and last.pt."""
        self.final_seconds, self.final_estimated = seconds + (self.save_seconds or 0.0), None

    def save_due(self) -> bool:
        minutes = self.training.save_every_minutes
        return bool(minutes) and time.monotonic() - self.last_saved >= minutes * 60

    def spent(self) -> str | None:
        """This process's view of "max_updates" or "max_minutes"."""
        t = self.training
        if t.max_updates and self.progress.step >= t.max_updates:
            return "max_updates"
        if not t.max_minutes:
            return None
        if self.final_estimated is not None and time.monotonic() - self.final_estimated > self.estimate_interval:
            self._estimate()                  # the model's greedy outputs change length as it learns
        used = self.run_seconds()
        if self.final_seconds is None:
            self._estimate()
        margin = 1.1 if self.final_estimated is None else 1.25     # an estimate gets the larger one
        finish = (self.update_seconds or 0.0) + margin * (self.final_seconds or 0.0) + EXIT_SECONDS
        return "max_minutes" if used + finish >= t.max_minutes * 60 else None

    def _estimate(self) -> None:
        start = time.monotonic()
        if self.save_seconds is None:
            self.save_last()
        # validation writes best.pt and a best-step file besides last.pt
        self.final_seconds = self.dev_seconds() + 3 * (self.save_seconds or 0.0)
        self.final_estimated = time.monotonic()
        # again after 5% of the budget, or 10 times what this took: estimating costs at most a tenth of it
        self.estimate_interval = max(0.05 * self.training.max_minutes * 60, 10 * (self.final_estimated - start))


def after_validation(training: TrainingConfig, progress: Progress, schedule: LrSchedule) -> str | None:
    """"early_stopping" or "lr_below_min_lr" when a validation ends the run (rank 0's view)."""
    if training.patience and progress.bad_validations >= training.patience:
        return "early_stopping"
    return "lr_below_min_lr" if schedule.floor_reached else None


def finished_reason(training: TrainingConfig, progress: Progress, schedule: LrSchedule) -> str | None:
    """Why a resumed run has nothing left to do (its budget is spent or it stopped early), if it has not."""
    t, p = training, progress
    reasons = [
        (t.max_updates and p.step >= t.max_updates, f"max_updates {t.max_updates}"),
        (p.cursor.epoch >= t.max_epochs, f"max_epochs {t.max_epochs}"),
        (t.max_minutes and p.elapsed / 60 >= t.max_minutes, f"max_minutes {t.max_minutes}"),
        (t.patience and p.bad_validations >= t.patience,
         f"early stopping after {p.bad_validations} validations without improvement (patience {t.patience})"),
        (schedule.floor_reached, f"the plateau schedule took the learning rate below min_lr {t.min_lr}"),
    ]
    return next((reason for hit, reason in reasons if hit), None)
