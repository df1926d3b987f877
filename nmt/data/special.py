"""The special ids, the same in every model nmt trains and every vocabulary it builds.

This module imports nothing, so that the model, decoding and the runtime learn the ids without
SentencePiece or the file system code.
"""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
