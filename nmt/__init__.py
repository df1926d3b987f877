"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq)."""

__version__ = "0.1.0"

# oneDNN (bfloat16 matrix products on the CPU) caches a compiled kernel, with its own reordered
# weights, for every new shape; with batches of varying shape its default of 1024 entries grew
# a training process past 3 GB. 16 entries keep the hot per-step shapes; set the variable
# yourself to choose otherwise. It is read when oneDNN first runs, after this import.
import os as _os

_os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
