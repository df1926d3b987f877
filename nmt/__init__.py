"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq)."""

import os

# bfloat16 matrix products on the CPU keep a compiled kernel, with its buffers, for every new
# shape in ideep's LRU cache (PyTorch's oneDNN wrapper; 1024 entries by default). Training and
# beam search meet a new row count every few batches: 16 entries keep the hot shapes at the same
# speed, with training's peak RSS 1.35 -> 0.75 GB over 200 updates and beam search's 0.87 ->
# 0.73 GB (docs/benchmarks.md). Read when oneDNN first runs; a value already set is kept.
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")

__version__ = "0.1.0"
