"""The settings of one search as one object, which every search takes: the eager and the captured ones on PyTorch
(nmt.decode.search, nmt.decode.graphs) and the numpy one on onnxruntime (nmt.runtime.search). Torch-free, for
the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nmt.config import DecodingConfig


class Draws(Protocol):
    """Draws a token per row instead of searching: nmt.decode.rule.Sampler, PyTorch only."""

    def __call__(self, logp: Any) -> Any: ...


@dataclass(frozen=True)
class SearchSettings:
    beam_size: int = DecodingConfig.beam_size
    alpha: float = DecodingConfig.length_penalty
    max_len_ratio: float = DecodingConfig.max_len_ratio
    min_len: int = DecodingConfig.min_len
    max_len: int | None = None                   # output cap, EOS included
    n_best: int = 1                              # hypotheses (beam) or samples (sampling) per sentence
    no_repeat_ngram: int = 0
    coverage: float = 0.0                        # the GNMT β
    early_stop: bool = False
    return_attention: bool = False
    sampler: Draws | None = None

    @classmethod
    def of(cls, d: DecodingConfig, n_best: int = 1, return_attention: bool = False,
           sampler: Draws | None = None) -> SearchSettings:
        return cls(d.beam_size, d.length_penalty, d.max_len_ratio, d.min_len, d.max_len or None, n_best,
                   d.no_repeat_ngram, d.coverage_penalty, d.early_stop, return_attention, sampler)

    @property
    def greedy(self) -> bool:                    # sampling, or one beam, one hypothesis, no coverage
        return self.sampler is not None or (self.beam_size == 1 and self.n_best == 1 and not self.coverage)
