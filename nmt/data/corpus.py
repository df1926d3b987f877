"""Streaming read of parallel text, and the binary id files of one split and side:
`{split}.{lang}.ids` (ids back to back, uint16 when the vocabulary fits, else int32) and `.offsets` (int64,
n+1 entries: sentence i is ids[offsets[i]:offsets[i+1]]), appended by `IdWriter`, memory-mapped by `IdFile`.
"""

from __future__ import annotations

import errno
import functools
import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from nmt.fs import text


class DataError(ValueError):
    """Bad input data; the message names the file and, where it applies, the line."""


def resolve_text_file(prefix: str, lang: str, key: str) -> Path:
    """`{prefix}.{lang}` or `{prefix}.{lang}.gz`, whichever exists (both: which one is meant is not nmt's guess); it
    must be a regular file, as preprocessing reads it twice and hashes it (a FIFO or folder is named for what it is,
    not reported missing)."""
    plain = Path(f"{prefix}.{lang}")
    problems = {candidate: text.input_problem(candidate) for candidate in (plain, Path(f"{plain}.gz"))}
    present = [candidate for candidate, problem in problems.items() if problem != text.MISSING]
    if not present:
        raise DataError(f"`{key}`: neither {plain} nor {plain}.gz exists")
    if len(present) > 1:
        raise DataError(f"`{key}`: both {plain} and {plain}.gz exist, and they may differ; remove one")
    if problem := problems[present[0]]:
        raise DataError(f"`{key}`: {present[0]} {problem}")
    return present[0]


@contextmanager
def open_lines(path: Path) -> Iterator[Iterator[str]]:
    """The lines of a text file, plain or gzip (`nmt.fs.text`); its errors, in the block too, become `DataError`."""
    try:
        with text.open_text(path) as handle:
            yield text.iter_lines(handle, str(path))
    except text.TextInputError as exc:
        raise DataError(str(exc)) from None


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file (plain or gzip), without line endings."""
    with open_lines(path) as lines:
        return list(lines)


def parallel_chunks(src_path: Path, tgt_path: Path, chunk_pairs: int) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks of at most `chunk_pairs` lines from both sides; their line counts must agree."""
    with open_lines(src_path) as src, open_lines(tgt_path) as tgt:
        pairs = 0
        while True:
            src_chunk, tgt_chunk = list(islice(src, chunk_pairs)), list(islice(tgt, chunk_pairs))
            if len(src_chunk) != len(tgt_chunk):
                n_src = pairs + len(src_chunk) + sum(1 for _ in src)
                n_tgt = pairs + len(tgt_chunk) + sum(1 for _ in tgt)
                raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
                                "parallel files must align line by line")
            if not src_chunk:
                return
            pairs += len(src_chunk)
            yield src_chunk, tgt_chunk


class ReservoirSample:
    """A seeded uniform sample of at most `size` items of a stream in one pass: those of the smallest random keys."""

    def __init__(self, size: int, seed: int | list[int]) -> None:
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.keys = np.zeros(0)
        self.items = np.zeros(0, dtype=object)
        self.threshold = np.inf          # once full: the largest key kept; larger keys cannot win

    def add(self, items: list[str]) -> None:
        keys, chunk = self.rng.random(len(items)), np.array(items, dtype=object)
        candidates = keys < self.threshold
        self.keys = np.concatenate([self.keys, keys[candidates]])
        self.items = np.concatenate([self.items, chunk[candidates]])
        if len(self.keys) >= 2 * self.size:
            self._shrink()

    def _shrink(self) -> None:
        if len(self.keys) > self.size:
            keep = np.argpartition(self.keys, self.size - 1)[: self.size]
            self.keys, self.items = self.keys[keep], self.items[keep]
            self.threshold = float(self.keys.max())

    def sample(self) -> list[str]:
        """The sample, in key order (a random order fixed by the seed)."""
        self._shrink()
        return self.items[np.argsort(self.keys, kind="stable")].tolist()


def write_error(path: str | Path, exc: OSError) -> DataError:
    """A failed write as one line naming the file, saying so when the disk is full (numpy's short write, with
    no errno, is a full disk on a regular file)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, None):
        detail = exc.strerror if exc.errno is not None else str(exc)
        return DataError(f"cannot write {path}: the disk is full ({detail}); free some space and run it again")
    return DataError(f"cannot write {path}: {exc.strerror or exc}")


class IdWriter:
    """Appends chunks of sentences to `stem.ids` and `stem.offsets`."""

    def __init__(self, stem: Path, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.ids = open(f"{stem}.ids", "wb")            # noqa: SIM115 (closed by close / the with block)
        self.offsets = open(f"{stem}.offsets", "wb")    # noqa: SIM115
        self.tokens = self.sentences = 0
        self._write(np.zeros(1, dtype=np.int64), self.offsets)

    def append(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """flat: (tokens,) ids of the sentences back to back; lengths: (sentences,)."""
        self._write(flat.astype(self.dtype, copy=False), self.ids)
        self._write(self.tokens + np.cumsum(lengths, dtype=np.int64), self.offsets)
        self.tokens += len(flat)
        self.sentences += len(lengths)

    @staticmethod
    def _write(array: np.ndarray, handle: Any) -> None:
        try:
            array.tofile(handle)
        except OSError as exc:
            raise write_error(handle.name, exc) from None

    def close(self) -> None:
        errors = []
        for handle in (self.ids, self.offsets):
            try:
                handle.close()                  # flushes; the file is closed even when that fails
            except OSError as exc:
                errors.append(write_error(handle.name, exc))
        if errors:
            raise errors[0]

    def __enter__(self) -> IdWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_ids_in_place(stem: Path, dtype: np.dtype, table: np.ndarray, chunk_tokens: int = 1 << 24) -> None:
    path = Path(f"{stem}.ids")
    if path.stat().st_size == 0:
        return
    ids = np.memmap(path, dtype=dtype, mode="r+")
    for start in range(0, len(ids), chunk_tokens):
        ids[start : start + chunk_tokens] = table[ids[start : start + chunk_tokens]]
    ids.flush()
    del ids


def _map(path: Path, dtype: np.dtype, maps: list[mmap.mmap]) -> np.ndarray:
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, dtype)
    if size % dtype.itemsize:
        raise DataError(f"{path}: size {size} is not a whole number of {dtype} entries; rerun `nmt preprocess`")
    with open(path, "rb") as handle:
        maps.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
    return np.frombuffer(maps[-1], dtype=dtype)


class IdFile:
    """Read-only, memory-mapped view of one split and side: `ids[offsets[i]:offsets[i+1]]` is sentence i.
    Random reads map in whole runs of pages (750 MB at 10M pairs after a few hundred batches): `release`."""

    def __init__(self, stem: Path, dtype: np.dtype) -> None:
        offsets_path, ids_path = Path(f"{stem}.offsets"), Path(f"{stem}.ids")
        self._maps: list[mmap.mmap] = []
        self.offsets = _map(offsets_path, np.dtype(np.int64), self._maps)
        self.ids = _map(ids_path, np.dtype(dtype), self._maps)
        if len(self.offsets) == 0 or self.offsets[-1] != len(self.ids):
            raise DataError(f"{ids_path}: size does not match {offsets_path}; rerun `nmt preprocess`")
        self._offsets_path = offsets_path

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        return self.read_lengths()

    def read_lengths(self, plus_one: bool = False, chunk: int = 1 << 20) -> np.ndarray:
        """(sentences,) sentence lengths (+ 1 for an EOS or BOS) in the smallest integer type, read in chunks,
        not through the memory map (which would keep every page resident)."""
        count = len(self)
        lengths = np.empty(count, dtype=np.int32 if count < 2**31 else np.int64)
        with open(self._offsets_path, "rb") as handle:
            previous = np.fromfile(handle, dtype=np.int64, count=1)
            for start in range(0, count, chunk):
                block = np.fromfile(handle, dtype=np.int64, count=min(chunk, count - start))
                lengths[start : start + len(block)] = np.diff(np.concatenate([previous, block]))
                previous = block[-1:]
        compact = lengths.astype(np.uint16 if lengths.max(initial=0) < np.iinfo(np.uint16).max else np.int32)
        return compact + 1 if plus_one else compact

    def release(self) -> None:
        """Drop the pages reads mapped in (MADV_DONTNEED; they stay in the page cache)."""
        if hasattr(mmap, "MADV_DONTNEED"):
            for mapping in self._maps:
                mapping.madvise(mmap.MADV_DONTNEED)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]
