"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq).

    from nmt import Translator
    translator = Translator.load("model.nmt")           # or a folder `nmt export --format onnx` wrote
    print(translator.translate(["Ein Hund läuft."], beam_size=5)[0].text)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelFileError", "Translator", "__version__"]
_LAZY = {"Translator": "nmt.api", "ModelFileError": "nmt.modelfile.errors", "ConfigError": "nmt.config_check"}


def __getattr__(name: str) -> Any:
    """`nmt.Translator` and the API's errors on first use (PEP 562): importing nmt for __version__ imports
    no torch."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
