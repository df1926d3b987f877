"""nmt: RNN-attention neural machine translation (Bahdanau and Luong seq2seq)."""

__version__ = "0.1.0"
