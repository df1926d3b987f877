"""The names that make a folder an ONNX export: the writer (nmt.decode.onnx_export) and the torch-free reader
(nmt.runtime.folder) sit in different layers and agree on them here, where model-file code can ask too."""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST = "nmt-onnx.json"
FORMAT, VERSION = "nmt-onnx", 2       # 2: every file's SHA-256 in the manifest
WEIGHTS = "weights.bin"         # the graphs' external data, the only file besides them that onnxruntime may read


def is_onnx_folder(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def file_sha256(path: Path) -> str:
    """The manifest holds each file's digest, so that a damaged copy is refused rather than translating wrongly."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
