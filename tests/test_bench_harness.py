"""bench/harness.py: the order systems are measured in, medians, child processes and the result files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import harness

REPO = Path(__file__).resolve().parents[1]


def _recorder(calls: list[str], name: str, values: list[float]):
    queue = iter(values)

    def run() -> float:
        calls.append(name)
        return next(queue)
    return run


def test_rounds_alternate_who_goes_first_and_warm_ups_are_dropped():
    calls: list[str] = []
    seen: list[tuple[int, str, float]] = []
    systems = {"a": _recorder(calls, "a", [100, 1, 2, 3]), "b": _recorder(calls, "b", [200, 10, 20, 30])}
    results = harness.alternate(systems, rounds=3, warmup=1, on_run=lambda *run: seen.append(run))
    assert calls == ["b", "a", "a", "b", "b", "a", "a", "b"]     # warm-up (round -1) reversed, then a b, b a, a b
    assert results == {"a": [1, 2, 3], "b": [10, 20, 30]}        # the warm-up's 100 and 200 are not kept
    assert seen[:2] == [(-1, "b", 200), (-1, "a", 100)] and len(seen) == 8


def test_alternate_refuses_no_rounds():
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        harness.alternate({"a": lambda: 1}, rounds=0)


def test_medians_of_values_and_of_a_key():
    assert harness.medians({"a": [3, 1, 2], "b": [10, 40]}) == {"a": 2, "b": 25}
    runs = {"a": [{"s": 5.0}, {"s": 1.0}, {"s": 9.0}]}
    assert harness.medians(runs, "s") == {"a": 5.0}


def test_a_child_returns_its_last_json_line_and_wall_time(tmp_path):
    code = "import os, json; print('warming up'); print(json.dumps({'x': 1, 'env': os.environ['PROBE']}))"
    result = harness.run_child([sys.executable, "-c", code], env={**os.environ, "PROBE": "p"}, cwd=tmp_path)
    assert result["x"] == 1 and result["env"] == "p" and result["wall_s"] > 0


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_a_child_can_be_pinned_to_one_core():
    core = sorted(os.sched_getaffinity(0))[0]
    code = "import os, json; print(json.dumps({'cores': sorted(os.sched_getaffinity(0))}))"
    assert harness.run_child([sys.executable, "-c", code], core=core)["cores"] == [core]
    assert harness.pin(None) == [] and harness.pin(3) == ["taskset", "-c", "3"]


@pytest.mark.parametrize(("code", "message"), [
    ("import sys; sys.exit(3)", "exited 3"),
    ("print('no figure here')", "printed no JSON line"),
    ("print('[1, 2]')", "printed list, not a JSON object"),
])
def test_a_child_without_a_figure_is_an_error(code, message):
    with pytest.raises(SystemExit, match=message):
        harness.run_child([sys.executable, "-c", code])


def test_a_result_file_carries_machine_command_commit_and_date(tmp_path):
    path = tmp_path / "out" / "r.json"
    harness.write_result(path, {"sent_per_s": 12.5}, threads=1, precision="float32",
                         command=["python", "-m", "bench.decoding", "--rounds", "3"])
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["sent_per_s"] == 12.5
    assert written["command"] == "python -m bench.decoding --rounds 3"
    assert written["machine"]["threads"] == 1 and written["machine"]["precision"] == "float32"
    assert {"cpu", "simd", "cores", "torch"} <= set(written["machine"])
    assert written["commit"] == harness.git_commit() and written["date"].endswith("Z")
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]          # no temporary file left behind


def test_a_field_of_the_result_wins_over_the_stamp(tmp_path):
    path = tmp_path / "r.json"
    harness.write_result(path, {"machine": {"cpu": "given"}}, command=["x"])
    assert json.loads(path.read_text())["machine"] == {"cpu": "given"}


def test_the_commit_is_none_outside_git(tmp_path):
    assert harness.git_commit(tmp_path) is None
    commit = harness.git_commit(REPO)
    if commit is not None:                                   # a source tree without .git has none
        assert commit.removesuffix("-dirty") == subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_the_own_command_is_relative_to_the_repository():
    code = ("import json, sys; from bench.harness import stamp; "
            "print(json.dumps(stamp(command=None)['command']))")
    script = REPO / "bench" / "harness.py"
    result = subprocess.run([sys.executable, "-c", code, str(script), "--x", "1"], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == "python -c bench/harness.py --x 1"


def test_the_onmt_curve_reads_each_checkpoints_minute_from_opennmts_report_lines():
    """OpenNMT-py 3.5.1's report format (a real line of `bench.onmt_curve --device cpu`): update -> seconds."""
    from bench.onmt_curve import elapsed_by_step

    log = ("[2026-11-24 17:57:57,158 INFO] Step 50/  100; acc: 15.5; ppl: 514.9; xent: 6.2; lr: 0.00100; sents:    "
           "6092; bsz: 1697/1807/122; 1422/1514 tok/s;     60 sec;\n[2026-11-24 17:58:01,000 INFO] Saving checkpoint\n"
           "[2026-11-24 17:58:40,939 INFO] Step 100/  100; acc: 28.5; ppl: 177.5; xent: 5.2; lr: 0.00100; sents:    "
           "5853; bsz: 1737/1816/117; 1984/2074 tok/s;    103 sec;\n")
    assert elapsed_by_step(log) == {50: 60, 100: 103}


def test_decode_shapes_counts_the_translators_batches_and_their_padded_shapes():
    import numpy as np

    from bench.decode_shapes import shapes

    lengths = np.array([10] * 20 + [4] * 5)
    small = shapes(lengths, beam=2, batch_tokens=200)        # 100 source tokens: 10 lines of 10, then the rest
    assert (small["batches"], small["shapes"]) == (3, 2)
    assert small["padded"] == [[16, 16], [16, 16], [8, 8]]   # 10 rows and 10 tokens padded to 16; 5 x 4 to 8 x 8
    assert small["longest_source_per_batch_summed"] == 24
    large = shapes(lengths, beam=2, batch_tokens=1000)
    assert (large["batches"], large["shapes"], large["padded"]) == (1, 1, [[32, 16]])


def test_host_side_profiles_the_gpus_searches_on_the_cpu(trained_run):
    """bench.host_side runs the Translator with the static-shape searches a GPU uses, and finds the
    host's share in the functions it names (a renamed one would silently count zero)."""
    from bench.host_side import profile_translate

    from .conftest import read_gz

    lines = read_gz("test_2016_flickr.de", 60)
    for beam, collect in ((1, "collect"), (5, "collect_beams")):
        result = profile_translate(trained_run / "best.pt", lines, beam, 2000)
        parts = {name.split(" ")[0]: seconds for name, seconds in result["host_s_by_part"].items()}
        assert result["lines"] == 60 and result["batch_tokens"] == 2000
        assert parts["encode"] > 0 and parts["decode"] > 0 and parts[collect] > 0
        assert 0 < result["host_s"] < result["wall_s_on_this_cpu"]
