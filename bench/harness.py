"""The one way this project measures speed: each measurement in a fresh child process, warm-up runs
discarded, systems alternated round by round, medians reported, and every JSON result stamped with
the machine, the command and the commit.

Why each part: a fresh process per run keeps one run's caches (allocator, oneDNN kernels, page cache
of the model) out of the next and lets the child be pinned to a core; alternating the systems run by
run makes a drift in the machine's speed (these machines moved by ±10-30% within minutes) hit every
system alike; the median of the runs ignores the one run that met a neighbour's burst; and a figure
without its machine and commit cannot be compared with anything.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.machine_facts import describe, machine_facts

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"          # the default folder for results (ignored by git)

__all__ = ["OUT", "REPO", "alternate", "describe", "git_commit", "machine_facts", "medians", "pin", "run_child",
           "stamp", "write_result"]


def pin(core: int | None) -> list[str]:
    """The command prefix that pins a child to one CPU core (`taskset -c CORE`); empty for None."""
    return ["taskset", "-c", str(core)] if core is not None else []


def synchronize(device: str) -> None:
    """Wait for the device's queued work before reading a clock (a CPU's is done when its call returns)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_child(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
              core: int | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Run `cmd` in a fresh process (pinned to `core` if given) and return the JSON object on the last
    line of its stdout, with `wall_s` (launch to exit, seconds) added. A failed child raises
    SystemExit with the end of its stderr: a benchmark with a failed run has no figure to report."""
    full = [*pin(core), *cmd]
    start = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, text=True, env=None if env is None else dict(env), cwd=cwd,
                          timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: {shlex.join(full)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise SystemExit(f"error: {shlex.join(full)} printed no JSON line:\n{proc.stdout[-2000:]}") from None
    if not isinstance(result, dict):
        raise SystemExit(f"error: {shlex.join(full)} printed {type(result).__name__}, not a JSON object")
    return {**result, "wall_s": wall}


def alternate(systems: Mapping[str, Callable[[], Any]], rounds: int, warmup: int = 0,
              on_run: Callable[[int, str, Any], None] | None = None) -> dict[str, list[Any]]:
    """Call each system once per round, `warmup` discarded rounds first, and return each system's
    results in order. The order within a round flips every round (A B, B A, A B, ...), so neither
    system always runs right after the other's caches or heat. `on_run(round, name, result)` sees
    every kept result as it arrives (for progress lines); warm-up rounds are numbered negative."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    names = list(systems)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for index in range(-warmup, rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            result = systems[name]()
            if on_run is not None:
                on_run(index, name, result)
            if index >= 0:
                results[name].append(result)
    return results


def medians(results: Mapping[str, Sequence[Any]], key: str | None = None) -> dict[str, float]:
    """The median of each system's runs: of the values themselves, or of `run[key]` for dict runs."""
    return {name: statistics.median(run[key] if key is not None else run for run in runs)
            for name, runs in results.items()}


def git_commit(repo: Path = REPO) -> str | None:
    """The short commit of `repo`, with "-dirty" when tracked files differ from it; None outside git."""
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


def _own_command() -> list[str]:
    """This process's command as a user types it in the repository: `python -m bench.X ...` for a
    module, paths inside the repository relative to it (no machine's folders in a result file)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else ["python", sys.argv[0]]
    words = []
    for word in [*head, *sys.argv[1:]]:
        try:
            words.append(str(Path(word).resolve().relative_to(REPO)) if os.sep in word else word)
        except ValueError:
            words.append(word)
    return words


def stamp(threads: int | None = None, precision: str | None = None,
          command: Sequence[str] | None = None) -> dict[str, Any]:
    """What every result file carries: the machine's facts, the command that produced it (by default
    this process's own, as typed), the commit measured and the UTC time."""
    argv = list(command) if command is not None else _own_command()
    return {"machine": machine_facts(threads, precision), "command": shlex.join(argv), "commit": git_commit(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def write_result(path: Path, result: Mapping[str, Any], *, threads: int | None = None,
                 precision: str | None = None, command: Sequence[str] | None = None) -> dict[str, Any]:
    """Write `result` as JSON to `path` with `stamp()`'s fields (a field of `result` wins over the
    stamp's: a script that took the facts itself keeps them), atomically: a half-written result file
    never replaces a finished one. Returns what was written."""
    payload = {**stamp(threads, precision, command), **result}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return payload


if __name__ == "__main__":
    print(describe(machine_facts()))
