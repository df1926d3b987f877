"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq).

    from nmt import Translator
    translator = Translator.load("model.nmt")
    print(translator.translate(["Ein Hund läuft."], beam_size=5)[0].text)

Importing nmt changes no process state and imports no torch: `Translator.load` picks the translator for
the path, the PyTorch one (nmt.decode.translator) for a model file or checkpoint, the onnxruntime one
(nmt.runtime.translator, no torch) for a folder `nmt export --format onnx` wrote.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]


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
        from nmt.runtime.folder import is_onnx_folder

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
