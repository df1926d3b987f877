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
from typing import Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]


def __getattr__(name: str) -> Any:
    """`nmt.Translator` on first use (PEP 562): nmt.api imports the translators' packages, which every
    module that imports `nmt` for `__version__` must not."""
    if name == "Translator":
        return importlib.import_module("nmt.api").Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
