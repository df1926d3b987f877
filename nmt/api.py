"""`nmt.Translator`: the translator a model's format needs, the PyTorch one (nmt.decode.translator) for a
model file or checkpoint, the onnxruntime one (nmt.runtime.translator, no torch) for an exported folder."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from nmt.runtime.folder import is_onnx_folder


def _torch_translator() -> Any:
    """nmt.decode.translator.Translator, imported by name when first needed: `nmt` is imported by modules
    of every layer (for __version__), so it imports none of them itself, torch's least of all."""
    return importlib.import_module("nmt.decode.translator").Translator


class Translator:
    """Loads a model as the translator its format needs; constructing one from a model object (the
    PyTorch constructor's arguments) gives nmt.decode.translator.Translator."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _torch_translator()(*args, **kwargs)

    @classmethod
    def load(cls, path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, (str, Path)) and is_onnx_folder(path):
            from nmt.runtime.translator import Translator as OnnxTranslator

            return OnnxTranslator.load(path, *args, **kwargs)
        return _torch_translator().load(path, *args, **kwargs)

    from_checkpoint = load

    @classmethod
    def load_ensemble(cls, paths: Any, *args: Any, **kwargs: Any) -> Any:
        return cls.load(paths[0], *args, **kwargs) if len(paths) == 1 else \
            _torch_translator().load_ensemble(paths, *args, **kwargs)

    from_checkpoints = load_ensemble
