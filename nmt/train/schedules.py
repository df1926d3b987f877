"""Learning-rate and teacher-forcing schedules, with state that checkpoints can save."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor
from torch.optim import Optimizer

from nmt.config import ConfigError, TrainingConfig


class LrSchedule:
    """constant | plateau (times `plateau_factor` after `plateau_patience` validations without improvement;
    below `min_lr`, training ends) | inverse_sqrt (lr * sqrt(warmup / step)) | budget (cosine from lr to
    `min_lr` over the larger spent fraction of `max_updates` and `max_minutes`: a run whose time is up stops
    at the bottom). `warmup_updates` ramps the lr up linearly under every schedule."""

    def __init__(self, optimizer: Optimizer, config: TrainingConfig) -> None:
        if config.lr_schedule == "budget" and not (config.max_updates or config.max_minutes):
            raise ConfigError("`training.lr_schedule: budget` decays over the training budget; set "
                              "training.max_minutes or training.max_updates")
        self.optimizer, self.config = optimizer, config
        self.plateau_scale = 1.0
        self.bad_validations = 0
        self.best: float | None = None

    def lr_at(self, step: int, minutes: float = 0.0) -> float:
        """The lr of update `step` (1-based), `minutes` of training into the run."""
        c = self.config
        warmup = c.warmup_updates
        if c.lr_schedule == "inverse_sqrt":
            ramp = step / warmup if warmup and step < warmup else math.sqrt(max(warmup, 1) / max(step, 1))
            lr = c.lr * ramp
        else:
            lr = c.lr * (min(1.0, step / warmup) if warmup else 1.0)
        if c.lr_schedule == "budget":
            spent = min(1.0, max(step / c.max_updates if c.max_updates else 0.0,
                                 minutes / c.max_minutes if c.max_minutes else 0.0))
            return c.min_lr + (lr - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * spent))
        return max(lr * self.plateau_scale, c.min_lr) if c.lr_schedule == "plateau" else lr

    @property
    def floor_reached(self) -> bool:
        return self.config.lr_schedule == "plateau" and self.config.lr * self.plateau_scale < self.config.min_lr

    def step(self, step: int, minutes: float = 0.0) -> float:
        """Set (and return) the lr of update `step`; a capturable optimiser's captured step reads its tensor."""
        lr = self.lr_at(step, minutes)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        return lr

    def on_validation(self, score: float, higher_is_better: bool) -> None:
        if self.config.lr_schedule != "plateau":
            return
        if self.best is None or (score > self.best if higher_is_better else score < self.best):
            self.best, self.bad_validations = score, 0
            return
        self.bad_validations += 1
        if self.bad_validations > self.config.plateau_patience:
            self.plateau_scale *= self.config.plateau_factor
            self.bad_validations = 0

    def state_dict(self) -> dict[str, Any]:
        return {"plateau_scale": self.plateau_scale, "bad_validations": self.bad_validations, "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plateau_scale, self.bad_validations, self.best = (
            state["plateau_scale"], state["bad_validations"], state["best"])


def teacher_forcing_ratio(config: TrainingConfig, step: int) -> float:
    """The probability of feeding the reference token at update `step` (scheduled sampling)."""
    start, floor = config.teacher_forcing, min(config.teacher_forcing_min, config.teacher_forcing)
    if config.teacher_forcing_schedule == "linear":
        return max(floor, start - (start - floor) * step / config.teacher_forcing_decay_updates)
    if config.teacher_forcing_schedule == "exponential":
        return max(floor, start * config.teacher_forcing_decay_rate**step)
    return start
