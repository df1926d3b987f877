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
