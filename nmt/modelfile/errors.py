"""The model-file error and the missing-file message without torch: the runtime (an ONNX folder, no PyTorch)
raises them too, so that one `except ModelFileError` covers every kind of model."""

from __future__ import annotations

from pathlib import Path

from nmt.fs.text import MISSING, input_problem


class ModelFileError(ValueError):
    """A model file or checkpoint that cannot be used: missing, truncated, corrupt or of another format."""


def not_a_file(path: Path, what: str) -> ModelFileError:
    """Missing, or named for what it is: reading a FIFO or a device would wait forever or never end."""
    problem = input_problem(path) or "is not a file"
    hint = "" if problem == MISSING else "; give an nmt model file or checkpoint"
    return ModelFileError(f"{what} {path} {problem}{hint}")
