"""The names that make a folder an ONNX export: the writer (nmt.decode.onnx_export) and the torch-free reader
(nmt.runtime.folder) sit in different layers and agree on them here, where model-file code can ask too."""

from __future__ import annotations

from pathlib import Path

MANIFEST = "nmt-onnx.json"
FORMAT, VERSION = "nmt-onnx", 1
WEIGHTS = "weights.bin"         # the graphs' external data, the only file besides them that onnxruntime may read


def is_onnx_folder(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()
