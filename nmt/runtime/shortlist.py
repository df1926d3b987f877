"""The vocabulary shortlist in numpy, with the rule of nmt.decode.shortlist: per batch, the union of its source
pieces' target lists, the most frequent target pieces, the specials 0-3 (first: they keep their numbers) and
any forced prefix pieces."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nmt.data.special import EOS
from nmt.runtime.folder import Manifest, OnnxFolderError


@dataclass
class Shortlist:
    targets: np.ndarray                     # (src_vocab, k) target ids per source id, best first, -1 where fewer
    always: np.ndarray                      # (n,) target ids every batch keeps
    tgt_size: int
    output: tuple[np.ndarray, np.ndarray]   # the output layer W_s (vocab, dec_hidden), b_s (vocab,), float32

    @classmethod
    def load(cls, manifest: Manifest, k: int = 0) -> Shortlist:
        """The folder's shortlist and output layer; `k` > 0 keeps the first k targets of each source id."""
        info = manifest.shortlist or {}
        try:
            with np.load(manifest.path(str(info["file"])), allow_pickle=False) as arrays:
                targets, frequent = arrays["targets"].astype(np.int64), arrays["frequent"].astype(np.int64)
            with np.load(manifest.path(str(info.get("output", "output.npz"))), allow_pickle=False) as arrays:
                weight, bias = arrays["W_s"].astype(np.float32), arrays["b_s"].astype(np.float32)
        except (OSError, KeyError, ValueError) as exc:
            raise OnnxFolderError(f"{manifest.folder}: the shortlist cannot be read ({exc}); export it again") from None
        v = manifest.vocab_size
        if targets.ndim != 2 or weight.shape[0] != v or bias.shape != (v,) or max(
                int(targets.max(initial=0)), int(frequent.max(initial=0))) >= v:
            raise OnnxFolderError(f"{manifest.folder}: the shortlist does not fit the vocabulary; export it again")
        if k:
            targets = targets[:, :k]
        return cls(targets, np.union1d(np.arange(EOS + 1), frequent), v, (weight, bias))

    def select(self, src: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
        """src: (batch, src_len); extra: a prefix's ids (PAD allowed) -> keep (subset,) ascending target ids."""
        kept = np.zeros(self.tgt_size, bool)
        kept[self.always] = True
        candidates = self.targets[src.reshape(-1)]             # (batch*src_len, k)
        kept[candidates[candidates >= 0]] = True
        if extra is not None:
            kept[extra.reshape(-1)] = True
        return np.flatnonzero(kept)
