"""bench.benchmark's decoding-alone measurement of an exported ONNX folder: onnxruntime's translator
under the same timer as the PyTorch one, without torch, and the exact search where asked."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import read_gz
from .serve_process import REPO
from .test_runtime import BLOCK_TORCH, export_onnx

pytest.importorskip("onnxruntime", reason="an ONNX folder needs onnxruntime (pip install 'nmt[onnx]')")


@pytest.fixture(scope="module")
def folder(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(model_file, tmp_path_factory.mktemp("onnx") / "model-onnx")


def child_args(checkpoint: Path, **changes: object) -> argparse.Namespace:
    """What `python -m bench.benchmark --child decode-N` parses, with the decoding settings left to the model."""
    args = argparse.Namespace(checkpoint=checkpoint, threads=1, device="cpu", precision="auto", length_penalty=None,
                              batch_tokens=None, quantize=None, shortlist_k=None, no_shortlist=False, early_stop=False)
    return argparse.Namespace(**{**vars(args), **changes})


@pytest.mark.parametrize("beam", [1, 5])
def test_decoding_alone_with_no_shortlist_gives_pytorchs_exact_translations_on_onnxruntime(model_file, folder, beam):
    from bench.benchmark import measure_decode_only

    lines = read_gz("test_2016_flickr.de", 30)
    onnx = measure_decode_only(child_args(folder, no_shortlist=True), beam, lines)
    torch = measure_decode_only(child_args(model_file, no_shortlist=True), beam, lines)
    assert onnx["outputs"] == torch["outputs"] and len(onnx["outputs"]) == 30
    assert onnx["precision"] == torch["precision"] == "float32"
    assert onnx["sent_per_s"] == pytest.approx(30 / onnx["seconds"])


def test_the_decoding_alone_child_of_an_onnx_folder_never_imports_torch(folder, tmp_path):
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK_TORCH)
    source = tmp_path / "src.de"
    source.write_text("\n".join(read_gz("test_2016_flickr.de", 12)) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(REPO)]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "bench.benchmark", "--child", "decode-5", "--checkpoint",
                             str(folder), "--source", str(source), "--threads", "1", "--no-shortlist"],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["precision"] == "float32" and report["sent_per_s"] > 0


def test_no_shortlist_and_a_shortlist_size_are_one_choice():
    result = subprocess.run([sys.executable, "-m", "bench.benchmark", "--no-shortlist", "--shortlist-k", "20"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def test_onnx_time_splits_the_decoding_time_into_parts_that_add_up(folder, tmp_path):
    source = tmp_path / "src.de"
    source.write_text("\n".join(read_gz("test_2016_flickr.de", 12)) + "\n", encoding="utf-8")
    out = tmp_path / "time.json"
    result = subprocess.run([sys.executable, "-m", "bench.onnx_time", "--model", str(folder), "--source", str(source),
                             "--beam-size", "5", "--no-shortlist", "--ops", "--json-out", str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    parts = report["parts"]
    assert sum(part["seconds"] for part in parts.values()) == pytest.approx(report["seconds"])
    assert parts["onnxruntime step (beam)"]["calls"] > 0 and parts["onnxruntime encoder (beam)"]["calls"] == 1
    assert parts["tokenize (SentencePiece encode)"]["calls"] == 1
    step = report["operator_shares"]["step (beam)"]
    assert 0 < sum(step.values()) <= 1 and {"Gemm", "MatMul"} & set(step)


def test_the_cpu_table_shows_the_onnx_folder_beside_the_model_file(tmp_path):
    from bench.cpu_table import table

    machine = json.loads((REPO / "docs" / "results" / "cpu-avx2" / "figures.json").read_text())["machine"]
    row = {"measure": "beam 5, decoding alone, sent/s", "threads": 1, "options": "--no-shortlist", "nmt": 40.0,
           "onnx": 50.0, "onmt": 20.0, "commit": "abc1234", "command": "python -m bench.compare_opennmt --onnx M"}
    (tmp_path / "figures.json").write_text(json.dumps({"machine": machine, "side_by_side": [row]}))
    assert "| `--no-shortlist` | 40.0 / 50.0 | 20.0 | **2.00x** / **2.50x** | abc1234 | [1] |" in table(tmp_path)
