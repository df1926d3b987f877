"""Progress on stderr: a tqdm bar on a terminal, else a plain line every `every_seconds` (a log file would keep
every one of tqdm's carriage-return redraws: 1,200 in a 30-minute training log).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

EVERY_SECONDS = 30.0


def progress_bar(desc: str, unit: str, total: int | None = None, initial: int = 0, disable: bool = False,
                 leave: bool = True, stream: TextIO | None = None, every_seconds: float = EVERY_SECONDS,
                 **tqdm_options: Any) -> Any:
    """A tqdm bar on a terminal, else `LogLines`; `leave=False` leaves no last line; `tqdm_options` go to tqdm."""
    stream = stream if stream is not None else sys.stderr
    common: dict[str, Any] = {"total": total, "initial": initial, "disable": disable, "leave": leave}
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):          # a replaced or closed stream
        terminal = False
    if terminal:
        return tqdm(desc=desc, unit=unit, file=stream, **common, **tqdm_options)
    return LogLines(desc, unit, stream=stream, every_seconds=every_seconds, **common)


class LogLines:
    """tqdm's update/set_postfix/close as lines: `train: 1200/5000 upd, 4.1 upd/s, 4:52 elapsed, loss=3.215`."""

    def __init__(self, desc: str, unit: str, total: int | None = None, initial: int = 0, disable: bool = False,
                 leave: bool = True, stream: TextIO | None = None, every_seconds: float = EVERY_SECONDS) -> None:
        self.desc, self.unit, self.total, self.disable, self.leave = desc, unit, total, disable, leave
        self.stream = stream if stream is not None else sys.stderr
        self.every_seconds = every_seconds
        self.n = self._shown = self._start_n = initial
        self._start = self._last = time.monotonic()
        self._postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.every_seconds:
            self._line()

    def set_postfix(self, **values: Any) -> None:
        self._postfix = " ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        if self.leave and self.n != self._shown:      # the count the last line left out
            self._line()
        self.disable = True

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self) -> None:
        now = time.monotonic()
        self._last, self._shown = now, self.n
        if self.disable:
            return
        elapsed = now - self._start
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        minutes, seconds = divmod(int(elapsed), 60)
        line = f"{self.desc}: {count} {self.unit}, {rate:.3g} {self.unit}/s, {minutes}:{seconds:02d} elapsed"
        print(f"{line}, {self._postfix}" if self._postfix else line, file=self.stream, flush=True)
