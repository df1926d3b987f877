"""The stop rules beside the training loop (nmt.train.stopping), each on its own: no model is trained."""

import os
import signal
import time

import pytest

from nmt.config import TrainingConfig
from nmt.train.checkpoint import Cursor, Progress
from nmt.train.stopping import EXIT_SECONDS, Budget, StopSignals, after_validation, finished_reason
from nmt.train.validation import ValidationAbandoned


class Schedule:
    def __init__(self, floor_reached: bool = False) -> None:
        self.floor_reached = floor_reached


def budget(progress: Progress, dev_seconds: float = 0.0, save_seconds: float = 0.0, **training) -> Budget:
    calls = {"saves": 0, "estimates": 0}

    def save_last() -> None:
        calls["saves"] += 1
        made.saved(time.monotonic() - save_seconds)

    def dev() -> float:
        calls["estimates"] += 1
        return dev_seconds

    made = Budget(TrainingConfig(**training), progress, save_last, dev)
    made.calls = calls
    return made


def test_max_updates_is_spent_at_that_step():
    progress = Progress(step=4)
    spent = budget(progress, max_updates=5)
    assert spent.spent() is None
    progress.step = 5
    assert spent.spent() == "max_updates"


def test_max_minutes_keeps_time_for_the_last_validation_and_its_checkpoints():
    # 60 s budget, 20 s of it spent in earlier sessions; the dev set takes 20 s and a save 2 s: the estimate
    # is 20 + 3 x 2 = 26 s, with a margin of 1.25 (32.5 s), plus one update and the exit.
    progress = Progress(elapsed=20.0)
    clock = budget(progress, dev_seconds=20.0, save_seconds=2.0, max_minutes=1.0)
    clock.updated(1.0)
    assert clock.spent() is None                                  # 20 + 32.5 + 1 + 0.5 < 60
    assert clock.calls == {"saves": 1, "estimates": 1}            # last.pt saved once to time it
    assert clock.final_seconds == pytest.approx(26.0, abs=0.05)
    progress.elapsed = 60 - 32.5 - 1.0 - EXIT_SECONDS
    assert clock.spent() == "max_minutes"
    assert clock.calls == {"saves": 1, "estimates": 1}            # not again before its interval


def test_a_measured_validation_replaces_the_estimate_with_a_smaller_margin():
    progress = Progress(elapsed=0.0)
    clock = budget(progress, dev_seconds=100.0, max_minutes=1.0)
    assert clock.spent() == "max_minutes"                         # 1.25 x 100 s does not fit in 60 s
    clock.validated(10.0)
    assert clock.spent() is None
    assert clock.final_estimated is None


def test_a_validation_ends_the_run_on_patience_or_the_lr_floor():
    training = TrainingConfig(patience=2)
    assert after_validation(training, Progress(bad_validations=1), Schedule()) is None
    assert after_validation(training, Progress(bad_validations=2), Schedule()) == "early_stopping"
    assert after_validation(TrainingConfig(), Progress(bad_validations=9), Schedule()) is None   # patience 0
    assert after_validation(training, Progress(), Schedule(floor_reached=True)) == "lr_below_min_lr"


def test_a_resumed_run_says_which_limit_it_already_reached():
    assert finished_reason(TrainingConfig(max_epochs=2), Progress(cursor=Cursor(epoch=2)), Schedule()) \
        == "max_epochs 2"
    assert finished_reason(TrainingConfig(max_minutes=1.0), Progress(elapsed=61.0), Schedule()) == "max_minutes 1.0"
    assert finished_reason(TrainingConfig(), Progress(step=7), Schedule()) is None


def test_signals_stop_after_the_update_abandon_a_validation_and_give_up_on_the_second():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        assert signal.getsignal(signal.SIGTERM) != before
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM and signals.reason == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == before             # the handlers are restored
    signals = StopSignals()
    with signals, pytest.raises(ValidationAbandoned):
        signals.evaluating = True
        os.kill(os.getpid(), signal.SIGINT)
    assert signals.reason == "SIGINT"
