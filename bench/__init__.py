"""The project's benchmarks: `python -m bench.X` from the repository root.

`bench.harness` is the one measuring method (child processes, warm-up, alternating rounds, medians,
machine facts, JSON results stamped with machine, command and commit); the other modules measure
one thing each with it. Results are written under bench/out/ by default (ignored by git); the
figures the documentation quotes live under docs/results/.
"""
