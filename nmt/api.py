"""`nmt.Translator` and `load_translator`: the PyTorch translator (nmt.decode.translator) for a model file or
checkpoint, the onnxruntime one (nmt.runtime.translator, no torch) for an exported folder."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.config import ConfigError
from nmt.modelfile.onnx_folder import is_onnx_folder


def _torch_translator(model: Any = None) -> Any:
    """Imported when first needed: every layer imports `nmt` (for __version__), which must not import torch.
    Without torch (nmt-runtime), a `model` that is no ONNX folder is a ModelFileError naming it."""
    try:
        return importlib.import_module("nmt.decode.translator").Translator
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
    from nmt.modelfile.errors import ModelFileError, not_a_file

    if isinstance(model, (str, Path)) and not Path(model).exists():
        raise not_a_file(Path(model), "model file")
    raise ModelFileError(f"{model if isinstance(model, (str, Path)) else 'a model object'} is not an ONNX model "
                         "folder (nmt export --format onnx), and this install has no PyTorch to read anything else")


def _paths(paths: Any) -> list[Any]:
    if isinstance(paths, (str, Path)):
        raise TypeError("paths must be a list of model paths, not one path; Translator.load takes one")
    paths = list(paths)
    if not paths:
        raise ValueError("an ensemble needs at least one model path")
    if len(paths) > 1 and any(isinstance(p, (str, Path)) and is_onnx_folder(p) for p in paths):
        raise ConfigError(f"--model {paths[0]}: an ONNX model folder decodes alone, not in an ensemble")
    return paths


class _AnyTranslator(type):
    def __instancecheck__(cls, instance: object) -> bool:
        from nmt.decode.streaming import Translates  # torch-free: the base of both translators

        return isinstance(instance, Translates)


class Translator(metaclass=_AnyTranslator):
    """Loads a model as the translator its format needs; constructed from a model object, the PyTorch one.
    `isinstance(t, nmt.Translator)` holds for either translator."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _torch_translator()(*args, **kwargs)

    @classmethod
    def load(cls, path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, (list, tuple)):
            return cls.load_ensemble(path, *args, **kwargs)
        if isinstance(path, (str, Path)) and is_onnx_folder(path):
            from nmt.runtime.translator import Translator as OnnxTranslator

            return OnnxTranslator.load(path, *args, **kwargs)
        return _torch_translator(path).load(path, *args, **kwargs)

    from_checkpoint = load

    @classmethod
    def load_ensemble(cls, paths: Any, *args: Any, **kwargs: Any) -> Any:
        paths = _paths(paths)
        return cls.load(paths[0], *args, **kwargs) if len(paths) == 1 else \
            _torch_translator(paths[0]).load_ensemble(paths, *args, **kwargs)

    from_checkpoints = load_ensemble


def load_translator(model: str | Path | Sequence[str | Path], device: str = "auto",
                    shortlist_file: str | Path | None = None, threads: int = 0, **decoding_overrides: Any) -> Any:
    """The translator of `nmt translate` and `nmt serve`, which own their process: onnxruntime's for an exported
    folder (no torch), else PyTorch's with `threads` (0: torch's default) and freed memory kept for reuse."""
    paths = _paths([model] if isinstance(model, (str, Path)) else model)
    if is_onnx_folder(paths[0]):
        return Translator.load(paths[0], device, shortlist_file, threads, **decoding_overrides)
    translator = _torch_translator(paths[0])
    import torch

    from nmt.device import reuse_freed_memory

    if threads:
        torch.set_num_threads(threads)
    reuse_freed_memory()
    return translator.load(model, device, shortlist_file=shortlist_file, **decoding_overrides)
