"""Runs `nmt` commands for the tests in forked processes, without paying Python's and torch's start-up
(about 3 s) for each: this process imports nmt once, then forks one child per command.

Each child is still its own process with its own file descriptors, as `python -m nmt ARGS` would be:
it reads stdin from a file, writes stdout and stderr to files, takes the environment and folder of
the request and ends with nmt.cli.main.main's exit code. This process never runs a torch operation, so
no thread pool is forked half-started. One JSON request per line on stdin: {"args": [...],
"cwd": ..., "env": {...}, "stdin": path or null, "stdout": path, "stderr": path, "timeout": s};
one line back: {"returncode": n, "timed_out": bool}.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback

# Imported here, once, so that every child starts with them loaded.
import nmt.cli.main
import nmt.data.preprocess
import nmt.decode.translator
import nmt.evaluate
import nmt.train.trainer


def child(request: dict) -> None:
    """In the forked child: become `nmt ARGS` and exit with its code."""
    code = 1
    try:
        for fd, path, flags in ((0, request["stdin"] or os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, encoding="utf-8", closefd=False)                # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)          # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)          # noqa: SIM115
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = ["nmt", *request["args"]]
        nmt.cli.main.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def run(request: dict) -> dict:
    """Fork a child for `request` and wait for it; kill it after request["timeout"] seconds."""
    pid = os.fork()
    if pid == 0:
        child(request)
    deadline = time.monotonic() + request["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
        if not timed_out and time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.01)


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
