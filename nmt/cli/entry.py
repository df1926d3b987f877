"""The `nmt` console script: own SIGINT and SIGTERM from the first moment, then run the command line.

A signal while the command line is imported (a few tenths of a second) exits at once with 128 + its number and
one `interrupted` line, not Python's traceback: there is nothing to clean up yet.
"""

from __future__ import annotations

import os
import signal


def _exit_at_once(signum: int, _frame: object) -> None:
    os.write(2, f"interrupted ({signal.Signals(signum).name})\n".encode())
    os._exit(128 + signum)


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_at_once)
    from nmt.process import mark_command_start

    mark_command_start()                 # `training.max_minutes` counts from the process's start
    from nmt.cli.main import main as run_command_line

    run_command_line()
