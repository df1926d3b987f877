"""The model-file error and the missing-file message without torch: the runtime (an ONNX folder, no PyTorch)
raises them too, so that one `except ModelFileError` covers every kind of model."""

from __future__ import annotations

import os
from pathlib import Path

from nmt.fs.bounded import file_kind


class ModelFileError(ValueError):
    """A model file or checkpoint that cannot be used: missing, truncated, corrupt or of another format."""


def not_a_file(path: Path, what: str) -> ModelFileError:
    """Missing, or named for what it is: reading a FIFO or a device would wait forever or never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ModelFileError(f"{what} {path} does not exist")
    return ModelFileError(f"{what} {path} is {file_kind(mode)}, not a file; give an nmt model file or checkpoint")
