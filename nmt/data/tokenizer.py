"""SentencePiece training, encoding and decoding, with the special ids of nmt.data.special. A side may keep only
the pieces it saw in training (`Vocab.pieces`): a joint model's target output layer then holds only the pieces
it can emit.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt.data.special import BOS, EOS, PAD, UNK
from nmt.fs.folders import plain_name


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def train_sentencepiece(sentences: Iterable[str], path: Path, vocab_size: int, model_type: str,
                        character_coverage: float) -> None:
    """Train a SentencePiece model file on all of `sentences` (pass a sample). It trains in a worker thread: in
    C++ for many seconds, it would keep SIGINT/SIGTERM from the main thread till the end."""
    model, failure = io.BytesIO(), list[BaseException]()

    def work() -> None:
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage, pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
                hard_vocab_limit=False,       # small corpora may not support the full size
                num_threads=cpu_count(), minloglevel=2)
        except BaseException as exc:      # handed to the main thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="sentencepiece", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if failure:
        raise failure[0]
    path.write_bytes(model.getvalue())


class Vocab:
    """A SentencePiece model (a file, or its bytes as a model file embeds them) plus the pieces this side uses:
    side ids are positions in `pieces` (SentencePiece ids, specials first); None: every piece, side id = spm id."""

    def __init__(self, model: str | Path | bytes, pieces: Sequence[int] | None = None) -> None:
        if isinstance(model, bytes):
            self.model_path = Path("<embedded SentencePiece model>")
            self.sp = spm.SentencePieceProcessor(model_proto=model)
        else:
            self.model_path = Path(model)
            self.sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
        n = self.sp.get_piece_size()
        self.pieces = np.asarray(range(n) if pieces is None else pieces, dtype=np.int64)     # side id -> spm id
        if self.pieces.ndim != 1 or (len(self.pieces) and not (self.pieces.min() >= 0 and self.pieces.max() < n)):
            raise ValueError(f"{self.model_path}: vocabulary piece ids must lie in 0..{n - 1}")
        if list(self.pieces[:4]) != [PAD, UNK, BOS, EOS]:
            raise ValueError(f"{self.model_path}: vocabulary must start with the special ids 0-3")
        self.to_side = np.full(n, UNK, dtype=np.int64)                 # spm id -> side id
        self.to_side[self.pieces] = np.arange(len(self.pieces))

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(self, lines: Sequence[str]) -> list[np.ndarray]:
        """Sentences -> side ids (no BOS/EOS); pieces outside this side's vocabulary become UNK."""
        encoded = self.sp.encode(list(lines), out_type=int, num_threads=cpu_count())
        return [self.to_side[np.asarray(ids, dtype=np.int64)] for ids in encoded]

    def encode_flat(self, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Sentences -> (SentencePiece ids back to back (tokens,) int32, lengths (sentences,) int64), not side ids."""
        encoded = self.sp.encode(lines, out_type=int, num_threads=cpu_count())
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
        return flat, lengths

    def decode(self, sequences: Iterable[Sequence[int]]) -> list[str]:
        """Side ids -> detokenised sentences; stops at nothing, so strip EOS/PAD before calling."""
        return self.sp.decode([self.pieces[np.asarray(ids, dtype=np.int64)].tolist() for ids in sequences])

    def to_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in self.pieces[np.asarray(ids, dtype=np.int64)]]

    def digest(self) -> str:
        """SHA-256 of the SentencePiece model and the pieces kept: equal digests, equal ids for every text."""
        return hashlib.sha256(self.sp.serialized_model_proto() + self.pieces.astype("<i8").tobytes()).hexdigest()

    def save_pieces(self, path: Path) -> None:
        path.write_text("".join(f"{i}\n" for i in self.pieces.tolist()), encoding="utf-8")

    @classmethod
    def from_entry(cls, folder: Path, entry: dict) -> Vocab:
        """The vocabulary a manifest entry {"model": file, "pieces": file or None} describes in `folder`; plain
        file names only: an entry from a shared checkpoint never opens a file elsewhere (ValueError)."""
        for key in ("model", "pieces"):
            name = entry.get(key)
            if name is not None and (not plain_name(name) or "\\" in name):      # no Windows separator either
                raise ValueError(f"vocabulary entry {key} {name!r} is not a plain file name inside {folder}")
        model_path = folder / entry["model"]
        if not model_path.is_file():
            raise FileNotFoundError(f"{model_path} is missing: the SentencePiece model of {folder}")
        pieces_file = folder / entry["pieces"] if entry.get("pieces") else None
        return cls(model_path, pieces_file and [int(x) for x in pieces_file.read_text(encoding="utf-8").split()])
