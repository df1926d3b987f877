"""Vocabulary shortlist in decoding: per batch, the target pieces the output layer scores. It takes the
arrays a data folder or a model file holds; which ones a model decodes with is `Translator.load`'s choice.

A batch keeps the union of its source pieces' shortlists (nmt.data.shortlist), the most frequent
target pieces, the special ids and any forced prefix pieces: a sorted index `keep` into the target
vocabulary. Its first entries are the special ids 0-3 (PAD, UNK, BOS, EOS), so inside the subset
they keep their numbers and the searches run unchanged on subset positions (see
`Decoding.with_output_subset`); chosen positions map back to vocabulary ids as `keep[position]`.
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
from nmt.modelfile.file import ModelFileError

SPECIALS = EOS + 1                      # ids 0 .. EOS: always kept, so they keep their numbers


class ShortlistError(ModelFileError):
    """A shortlist that is missing or does not fit the model's vocabularies; the message says what to do."""


@dataclass
class Shortlist:
    targets: Tensor             # (src_vocab, k) target ids per source id, best first, -1 where fewer
    always: Tensor              # (n,) target ids every batch keeps: the specials and the most frequent
    tgt_size: int

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], src_vocab: Vocab, tgt_vocab: Vocab, where: str,
                    k: int = 0) -> Shortlist:
        """The shortlist a data folder wrote (`load_shortlist`) or a model file embeds, checked against
        the vocabularies; `k` > 0 keeps the first k target ids of each source id."""
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
        """src: (batch, src_len) source ids, PAD-padded; extra: target ids to keep too (a prefix), PAD allowed.

        returns keep (subset,): ascending target ids, starting with the specials 0 .. EOS."""
        kept = torch.zeros(self.tgt_size, dtype=torch.bool)
        kept[self.always] = True
        candidates = self.targets[src.reshape(-1).cpu()]                 # (batch*src_len, k)
        kept[candidates[candidates >= 0]] = True
        if extra is not None:
            kept[extra.reshape(-1).cpu()] = True
        return kept.nonzero().squeeze(1)                                # (subset,)


def subset_positions(keep: Tensor, ids: Tensor) -> Tensor:
    """Target ids (all in `keep`) -> their positions in the subset; ids and keep on one device."""
    return torch.searchsorted(keep, ids)
