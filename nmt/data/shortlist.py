"""Vocabulary shortlist (Marian-style): the target pieces likely for each source piece. c(s, t) counts the
training pairs where source piece s and target piece t occur together, c(s) and c(t) those with each; per source
piece the `data.shortlist_k` best targets by dice 2 c(s,t) / (c(s) + c(t)) (favours translation pairs) or prob
c(s,t) / c(s) (frequent targets) are kept, the `data.shortlist_frequent` most frequent targets, which decoding
always keeps, aside. `shortlist.npz`: `targets` (src_vocab, k), -1 padded, `frequent` (n,), the vocabularies' id.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

SHORTLIST_FILE = "shortlist.npz"   # in a data folder, and copied into the run folders trained on it
PAIRS_PER_BLOCK = 1 << 22       # (s, t) pairs expanded at a time: about 100 MB of temporaries at most


def distinct_per_sentence(flat: np.ndarray, lengths: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """flat (tokens,), lengths (sentences,) -> each sentence's distinct ids, ascending (ids,), and counts."""
    sentence = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)        # (tokens,)
    keys = np.unique(sentence * vocab_size + flat)                                 # (ids,) sorted
    owner, ids = np.divmod(keys, vocab_size)
    return ids, np.bincount(owner, minlength=len(lengths))


def cross_keys(src_ids: np.ndarray, src_counts: np.ndarray, tgt_ids: np.ndarray, tgt_counts: np.ndarray,
               tgt_size: int) -> np.ndarray:
    """s * tgt_size + t for every (s, t) of each sentence pair's distinct ids: (pairs,)."""
    owner = np.repeat(np.arange(len(src_counts)), src_counts)      # (src ids,) sentence of each source id
    reps = tgt_counts[owner]                                       # (src ids,) pairs each one makes
    pair_start = np.cumsum(reps) - reps                            # first pair of each source id
    tgt_start = np.cumsum(tgt_counts) - tgt_counts                 # first target id of each sentence
    within = np.arange(int(reps.sum())) - np.repeat(pair_start, reps)   # (pairs,) position in its target list
    return np.repeat(src_ids, reps) * tgt_size + tgt_ids[np.repeat(tgt_start[owner], reps) + within]


class CooccurrenceCounts:
    """c(s, t), c(s), c(t) over SentencePiece ids (the target vocabulary is only known at the end)."""

    def __init__(self, src_size: int, tgt_size: int, max_pairs: int) -> None:
        self.src_size, self.tgt_size, self.max_pairs = src_size, tgt_size, max_pairs
        self.pairs = 0                                        # sentence pairs counted
        self.keys = np.zeros(0, dtype=np.int64)               # (distinct,) s * tgt_size + t, ascending
        self.joint = np.zeros(0, dtype=np.int64)              # (distinct,) c(s, t)
        self.src = np.zeros(src_size, dtype=np.int64)         # (src_size,) c(s)
        self.tgt = np.zeros(tgt_size, dtype=np.int64)         # (tgt_size,) c(t)

    @property
    def full(self) -> bool:
        return self.pairs >= self.max_pairs

    def add(self, src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray, tgt_lens: np.ndarray) -> None:
        """A chunk of pairs as flat ids and lengths (`Vocab.encode_flat`), up to `max_pairs` in all."""
        take = min(len(src_lens), self.max_pairs - self.pairs)
        src, src_lens = src[: int(src_lens[:take].sum())], src_lens[:take]
        tgt, tgt_lens = tgt[: int(tgt_lens[:take].sum())], tgt_lens[:take]
        src_ids, src_counts = distinct_per_sentence(src.astype(np.int64), src_lens, self.src_size)
        tgt_ids, tgt_counts = distinct_per_sentence(tgt.astype(np.int64), tgt_lens, self.tgt_size)
        self.src += np.bincount(src_ids, minlength=self.src_size)
        self.tgt += np.bincount(tgt_ids, minlength=self.tgt_size)
        self.pairs += take
        # Blocks of sentences whose cross products hold about PAIRS_PER_BLOCK pairs, to bound memory.
        cost = np.cumsum(src_counts * tgt_counts)
        cuts = np.searchsorted(cost, np.arange(PAIRS_PER_BLOCK, int(cost[-1]) if len(cost) else 0,
                                               PAIRS_PER_BLOCK), side="right")
        src_offsets = np.concatenate([[0], np.cumsum(src_counts)])
        tgt_offsets = np.concatenate([[0], np.cumsum(tgt_counts)])
        for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), take], strict=True):
            if end <= start:
                continue
            keys, counts = np.unique(cross_keys(src_ids[src_offsets[start] : src_offsets[end]], src_counts[start:end],
                                                tgt_ids[tgt_offsets[start] : tgt_offsets[end]], tgt_counts[start:end],
                                                self.tgt_size), return_counts=True)
            at = np.searchsorted(self.keys, keys)                  # (new,) merged into the running sorted counts
            known = at < len(self.keys)
            known[known] = self.keys[at[known]] == keys[known]
            self.joint[at[known]] += counts[known]
            self.keys = np.insert(self.keys, at[~known], keys[~known])
            self.joint = np.insert(self.joint, at[~known], counts[~known])

    def table(self, tgt_to_side: np.ndarray, src_to_side: np.ndarray, src_side_size: int, k: int,
              n_frequent: int, score: str) -> tuple[np.ndarray, np.ndarray]:
        """targets (src_side_size, k), -1 padded, best first, and frequent (n,), in side ids (`*_to_side`:
        SentencePiece id -> side id)."""
        tgt_count = np.zeros(int(tgt_to_side.max(initial=0)) + 1, dtype=np.int64)
        np.add.at(tgt_count, tgt_to_side, self.tgt)                         # (tgt side,) c(t)
        tgt_count[:4] = 0                                                   # specials: decoding adds them
        ranked = np.argsort(-tgt_count, kind="stable")
        frequent = ranked[: min(n_frequent, int(np.count_nonzero(tgt_count)))]
        s, t = np.divmod(self.keys, self.tgt_size)                          # (distinct,) SentencePiece ids
        s_side, t_side = src_to_side[s], tgt_to_side[t]
        joint = self.joint.astype(np.float64)
        value = 2 * joint / (self.src[s] + self.tgt[t]) if score == "dice" else joint / self.src[s]
        drop = np.isin(t_side, frequent) | (t_side < 4)
        s_side, t_side, value = s_side[~drop], t_side[~drop], value[~drop]
        order = np.lexsort((t_side, -value, s_side))                        # by source, best score first
        s_side, t_side = s_side[order], t_side[order]
        starts = np.searchsorted(s_side, s_side, side="left")               # first entry of each source id
        rank = np.arange(len(s_side)) - starts
        kept = rank < k
        dtype = np.int16 if len(tgt_count) <= np.iinfo(np.int16).max else np.int32
        targets = np.full((src_side_size, k), -1, dtype=dtype)
        targets[s_side[kept], rank[kept]] = t_side[kept]
        return targets, frequent.astype(dtype)


def vocab_fingerprint(src_proto: bytes, tgt_proto: bytes, tgt_pieces: np.ndarray) -> str:
    """What identifies the id spaces a shortlist indexes: both SentencePiece models and the target pieces."""
    digest = hashlib.sha256(src_proto)
    digest.update(tgt_proto)
    digest.update(np.asarray(tgt_pieces, dtype=np.int64).tobytes())
    return digest.hexdigest()


def save_shortlist(path: Path, targets: np.ndarray, frequent: np.ndarray, fingerprint: str,
                   info: dict[str, Any]) -> None:
    """Write `shortlist.npz`, byte for byte the same for the same arrays (`np.savez` stamps the time)."""
    arrays = {"targets": targets, "frequent": frequent, "vocab_sha256": np.array(fingerprint),
              "score": np.array(info["score"]), "pairs": np.array(info["pairs"], dtype=np.int64)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, value in arrays.items():
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(entry, "w") as handle:
                np.lib.format.write_array(handle, np.asarray(value), allow_pickle=False)


def load_shortlist(path: Path) -> dict[str, Any]:
    """`shortlist.npz` as checkpoints and model files embed it; ValueError (or OSError) for another file."""
    with np.load(path, allow_pickle=False) as arrays:
        missing = {"targets", "frequent", "vocab_sha256"} - set(arrays.files)
        if missing:
            raise ValueError(f"{path} is not an nmt shortlist (missing {', '.join(sorted(missing))})")
        return {"targets": arrays["targets"], "frequent": arrays["frequent"],
                "vocab_sha256": str(arrays["vocab_sha256"]), "score": str(arrays.get("score", "")),
                "pairs": int(arrays["pairs"]) if "pairs" in arrays.files else 0}
