"""`nmt.Translator` and `load_translator`: the PyTorch translator (nmt.decode.translator) for a model file or
checkpoint, the onnxruntime one (nmt.runtime.translator, no torch) for an exported folder."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.config import ConfigError
from nmt.modelfile.onnx_folder import is_onnx_folder


def _torch_translator() -> Any:
    """Imported when first needed: every layer imports `nmt` (for __version__), which must not import torch."""
    return importlib.import_module("nmt.decode.translator").Translator


class Translator:
    """Loads a model as the translator its format needs; constructed from a model object, the PyTorch one."""

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


def load_translator(model: str | Path | Sequence[str | Path], device: str = "auto",
                    shortlist_file: str | Path | None = None, threads: int = 0, **decoding_overrides: Any) -> Any:
    """The translator of `nmt translate` and `nmt serve`, which own their process: onnxruntime's for an exported
    folder (no torch), else PyTorch's with `threads` (0: torch's default) and freed memory kept for reuse."""
    paths = [model] if isinstance(model, (str, Path)) else list(model)
    if any(map(is_onnx_folder, paths)):
        if len(paths) > 1:
            raise ConfigError(f"--model {paths[0]}: an ONNX model folder decodes alone, not in an ensemble")
        return Translator.load(paths[0], device, shortlist_file, threads, **decoding_overrides)
    import torch

    from nmt.device import reuse_freed_memory

    if threads:
        torch.set_num_threads(threads)
    reuse_freed_memory()
    return _torch_translator().load(model, device, shortlist_file=shortlist_file, **decoding_overrides)
