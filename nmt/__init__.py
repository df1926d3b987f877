"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq).

    from nmt import Translator
    translator = Translator.load("model.nmt")
    print(translator.translate(["Ein Hund läuft."], beam_size=5)[0].text)

Importing nmt changes no process state and imports no torch: `Translator` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]

if TYPE_CHECKING:
    from nmt.decode.translator import Translator


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from nmt.decode.translator import Translator

        return Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
