"""scripts/gpu_benchmarks.sh rehearsed on the CPU (DEVICE=cpu) with the smoke model: every stage that a GPU
lease spends its minutes on runs its real code and writes the JSON that bench/gpu_table.py reads, so a
broken stage shows here rather than on the GPU. The figures themselves mean nothing on a CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_benchmarks.sh"


def _env(**extra: str) -> dict[str, str]:
    """The suite's Python and `nmt` first on PATH, as an activated virtual environment puts them."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, **extra}


def test_every_decoding_and_profile_stage_writes_its_figures_on_the_cpu(tmp_path, prepared, trained_run):
    from bench.gpu_table import table

    out, lines = tmp_path / "out", 300
    result = subprocess.run(["bash", str(SCRIPT), "out", str(trained_run / "best.pt")], cwd=tmp_path,
                            env=_env(DEVICE="cpu", DATA_CONFIG=str(prepared), SENTENCES=str(lines), RUNS="1",
                                     STAGES="facts decode whole profile"),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout[-3000:] + result.stderr[-3000:]          # the stages' errors are kept going past: shown here

    assert (out / "machine.json").is_file() and not (out / "gpu.csv").exists(), log   # OUT from the caller's folder
    test = json.loads((out / "decode-test2016.json").read_text())
    assert sorted((r["precision"], r["beam"], r["graphs"]) for r in test["decode"]) == sorted(
        (p, b, g) for p in ("fp32", "bf16") for b in (1, 5) for g in (True, False)), log
    for entry in test["decode"]:
        assert entry["lines"] == 100 and entry["sent_per_s"] > 0 and entry["batch_tokens"] == 8000
        assert 0 <= entry["bleu"] <= 100 and len(entry["seconds"]) == 1
    assert {r["same_as_graphed"] for r in test["decode"] if "same_as_graphed" in r} == {1.0}   # both eager here
    assert len(test["first_line"]) == 4 and all(r["text"] and r["beyond_import_s"] > 0 for r in test["first_line"])

    small = json.loads((out / "decode-test2016-8000.json").read_text())
    assert {(r["precision"], r["batch_tokens"]) for r in small["decode"]} == {("bf16", 8000)}
    big = json.loads((out / "decode-100k.json").read_text())
    assert {(r["lines"], r["batch_tokens"]) for r in big["decode"]} == {(lines, 64000)}

    whole = json.loads((out / "whole-100k.json").read_text())
    assert whole["sentences"] == lines and "cuda_init_s" not in whole["startup_median_s"]
    assert [(r["beam"], r["rc"], r["lines_out"]) for r in whole["runs"]] == [(1, 0, lines)] * 2 + [(5, 0, lines)] * 2

    profile = json.loads((out / "profile.json").read_text())
    assert profile["train"]["units"] == 2 and len(profile["decode"]) == 4
    assert (out / "step-kernels.json").is_file()

    text = table(out)
    assert text.startswith("Measured on: no GPU: a rehearsal on ")
    assert text.count("| test_2016_flickr in 8,000-token batches, beam 5,") == 1    # the CPU's size once
    assert f"| {lines} sentences in 64,000-token batches, beam 5, sent/s decoding alone |" in text
    assert f"Whole process: `nmt translate` of {lines} sentences in 64,000-token batches" in text


def test_a_device_other_than_cuda_or_cpu_is_refused_before_anything_runs(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "out"], cwd=tmp_path, env=_env(DEVICE="gpu"),
                            capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (
        2, "error: gpu_benchmarks.sh takes DEVICE=cuda or DEVICE=cpu, got DEVICE=gpu; see --help\n")
    assert not (tmp_path / "out").exists()


def _decoding_report(folder: Path, name: str, batch_tokens: int) -> None:
    entries = [{"precision": "bf16", "beam": beam, "graphs": True, "sent_per_s": 1000.0 * beam, "lines": 1000,
                "batch_tokens": batch_tokens} for beam in (1, 5)]
    (folder / name).write_text(json.dumps({"decode": entries}))


def test_the_table_shows_the_cpus_batch_size_beside_the_gpus_and_not_twice(tmp_path):
    from bench.gpu_table import table

    _decoding_report(tmp_path, "decode-test2016.json", 32000)
    _decoding_report(tmp_path, "decode-test2016-8000.json", 8000)
    text = table(tmp_path)
    assert "| test_2016_flickr in 32,000-token batches, beam 5, sent/s decoding alone | " in text
    assert "| test_2016_flickr in 8,000-token batches, beam 5, sent/s decoding alone | " in text
    _decoding_report(tmp_path, "decode-test2016.json", 8000)              # a model that keeps 8000
    assert table(tmp_path).count("| test_2016_flickr in 8,000-token batches, beam 5,") == 1
