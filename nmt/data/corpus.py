"""Reading parallel text with checks, the length filter, and the binary id files.

Id files: one split and side is two files, `{split}.{lang}.ids` (every sentence's ids back to
back, uint16 when the vocabulary fits, else int32) and `{split}.{lang}.offsets` (int64, n+1
entries; sentence i is ids[offsets[i]:offsets[i+1]]). Both are memory-mappable with numpy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmt import textio


class DataError(ValueError):
    """Bad input data; the message names the file and, where it applies, the line."""


def resolve_text_file(prefix: str, lang: str, key: str) -> Path:
    """`{prefix}.{lang}` or `{prefix}.{lang}.gz`, whichever exists."""
    plain = Path(f"{prefix}.{lang}")
    for candidate in (plain, Path(f"{plain}.gz")):
        if candidate.is_file():
            return candidate
    raise DataError(f"`{key}`: neither {plain} nor {plain}.gz exists")


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file (plain or gzip), without line endings (see `nmt.textio`).

    Invalid UTF-8 raises `DataError` naming the file and the line number.
    """
    try:
        return textio.read_lines(path)
    except textio.TextInputError as exc:
        raise DataError(str(exc)) from None


def read_parallel(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    """Both sides of a parallel corpus; their line counts must agree."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; parallel files must align line by line"
        )
    return src, tgt


def empty_lines(src: Sequence[str], tgt: Sequence[str]) -> list[int]:
    """1-based numbers of the lines where either side is empty or whitespace."""
    return [i + 1 for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if not s.strip() or not t.strip()]


def file_digest(path: Path) -> dict[str, int | str]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


@dataclass
class FilterStats:
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"too_short": 0, "too_long": 0, "ratio": 0})


def length_filter(
    src_lens: np.ndarray, tgt_lens: np.ndarray, min_len: int, max_len: int, max_ratio: float
) -> tuple[np.ndarray, FilterStats]:
    """Boolean keep-mask over pairs, and counts of dropped pairs by reason (first reason wins)."""
    short = (src_lens < min_len) | (tgt_lens < min_len)
    long = ~short & ((src_lens > max_len) | (tgt_lens > max_len))
    longer = np.maximum(src_lens, tgt_lens)
    shorter = np.maximum(np.minimum(src_lens, tgt_lens), 1)
    ratio = ~short & ~long & (longer / shorter > max_ratio)
    keep = ~(short | long | ratio)
    stats = FilterStats(kept=int(keep.sum()))
    stats.dropped = {"too_short": int(short.sum()), "too_long": int(long.sum()), "ratio": int(ratio.sum())}
    return keep, stats


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def write_ids(stem: Path, sequences: Sequence[np.ndarray], dtype: np.dtype) -> int:
    """Write `stem.ids` and `stem.offsets`; returns the number of tokens written."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(sequences).astype(dtype) if len(sequences) else np.zeros(0, dtype=dtype)
    flat.tofile(Path(f"{stem}.ids"))
    offsets.tofile(Path(f"{stem}.offsets"))
    return int(offsets[-1])


class IdFile:
    """Read-only view of one split and side: `ids[offsets[i]:offsets[i+1]]` is sentence i."""

    def __init__(self, stem: Path, dtype: np.dtype) -> None:
        offsets_path, ids_path = Path(f"{stem}.offsets"), Path(f"{stem}.ids")
        self.offsets = np.fromfile(offsets_path, dtype=np.int64)
        size = ids_path.stat().st_size
        self.ids = np.memmap(ids_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)
        if len(self.offsets) == 0 or self.offsets[-1] * dtype.itemsize != size:
            raise DataError(f"{ids_path}: size does not match {offsets_path}; rerun `nmt preprocess`")
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]
