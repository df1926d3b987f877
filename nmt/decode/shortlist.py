"""Vocabulary shortlist in decoding: a batch keeps the union of its source pieces' target lists
(nmt.data.shortlist), the most frequent target pieces, the special ids and any forced prefix, as a sorted
index `keep` into the target vocabulary. The specials come first, so they keep their numbers and the searches
run unchanged on subset positions (`Decoding.with_output_subset`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from nmt.data.shortlist import vocab_fingerprint
from nmt.data.special import EOS
from nmt.data.tokenizer import Vocab
from nmt.modelfile.errors import ModelFileError

SPECIALS = EOS + 1                      # ids 0 .. EOS: always kept, so they keep their numbers


class ShortlistError(ModelFileError):
    """A shortlist that is missing or does not fit the model's vocabularies."""


@dataclass
class Shortlist:
    targets: Tensor             # (src_vocab, k) target ids per source id, best first, -1 where fewer
    always: Tensor              # (n,) target ids every batch keeps: the specials and the most frequent
    tgt_size: int

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], src_vocab: Vocab, tgt_vocab: Vocab, where: str,
                    k: int = 0) -> Shortlist:
        """A data folder's or a model file's shortlist arrays, checked against the vocabularies; `k` > 0 keeps
        the first k target ids of each source id."""
        expected = vocab_fingerprint(src_vocab.sp.serialized_model_proto(), tgt_vocab.sp.serialized_model_proto(),
                                     tgt_vocab.pieces)
        if arrays.get("vocab_sha256") != expected:
            raise ShortlistError(f"the shortlist of {where} was built for other vocabularies than the model's; "
                                 "use the shortlist.npz of the data folder the model was trained on")
        targets = torch.as_tensor(np.asarray(arrays["targets"]), dtype=torch.long)
        frequent = torch.as_tensor(np.asarray(arrays["frequent"]), dtype=torch.long)
        too_large = any(t.numel() > 0 and int(t.max()) >= len(tgt_vocab) for t in (targets, frequent))
        if targets.dim() != 2 or targets.size(0) != len(src_vocab) or too_large:
            raise ShortlistError(f"the shortlist of {where} does not fit the model's vocabularies")
        if k:
            targets = targets[:, :k]
        always = torch.cat([torch.arange(SPECIALS), frequent]).unique()
        return cls(targets.contiguous(), always, len(tgt_vocab))

    def select(self, src: Tensor, extra: Tensor | None = None) -> Tensor:
        """src: (batch, src_len) source ids; extra: target ids to keep too (a prefix) -> keep (subset,)."""
        kept = torch.zeros(self.tgt_size, dtype=torch.bool)
        kept[self.always] = True
        candidates = self.targets[src.reshape(-1).cpu()]                 # (batch*src_len, k)
        kept[candidates[candidates >= 0]] = True
        if extra is not None:
            kept[extra.reshape(-1).cpu()] = True
        return kept.nonzero().squeeze(1)                                # (subset,)
