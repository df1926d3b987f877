"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq).

    from nmt import Translator
    translator = Translator.load("model.nmt")           # or a folder `nmt export --format onnx` wrote
    print(translator.translate(["Ein Hund läuft."], beam_size=5)[0].text)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]


def __getattr__(name: str) -> Any:
    """`nmt.Translator` on first use (PEP 562), so that importing nmt for __version__ imports no torch."""
    if name == "Translator":
        return importlib.import_module("nmt.api").Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
