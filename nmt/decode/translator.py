"""Input stream -> length-sorted token-budget batches -> output in input order.

Input is read in chunks, so files larger than memory work. Inside a chunk, sentences are sorted
by length and cut into batches by a token budget; results are put back in input order before
they are yielded. Every input line gives exactly one result: an empty line gives an empty
translation without running the model, and an over-long line is truncated with a warning.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from torch import Tensor

from nmt.config import DecodingConfig, config_from_dict
from nmt.data.batching import cut_by_budget, pad_rows
from nmt.data.tokenizer import EOS, Vocab
from nmt.decode.search import Hypothesis, beam_search, greedy_search
from nmt.device import autocast, autocast_dtype, resolve_device
from nmt.model.seq2seq import Seq2Seq
from nmt.train.checkpoint import CheckpointError, load_checkpoint, load_vocabs


@dataclass
class Translation:
    """The result for one input line."""

    text: str                              # the best hypothesis, detokenised ("" for an empty line)
    hypotheses: list[Hypothesis]           # n-best, best first; empty for an empty line
    src_ids: np.ndarray                    # source side ids as encoded (after truncation), EOS excluded
    truncated: bool = False


class Translator:
    def __init__(self, model: Seq2Seq, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.decoding, self.device = decoding, device
        self.amp_dtype = autocast_dtype(decoding.precision, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "auto", **decoding_overrides) -> Translator:
        """Load a checkpoint; its run folder provides the config and the SentencePiece models."""
        checkpoint = Path(checkpoint)
        state = load_checkpoint(checkpoint, mmap=True)
        raw = state["config"]
        if not isinstance(raw, dict) or not isinstance(raw.get("decoding", {}), dict):
            raise CheckpointError(f"checkpoint {checkpoint} holds no valid config")
        raw.setdefault("decoding", {}).update({k: v for k, v in decoding_overrides.items() if v is not None})
        config = config_from_dict(raw)                  # overrides are checked like the YAML file
        src_vocab, tgt_vocab = load_vocabs(checkpoint.parent, state["vocab"])
        model = Seq2Seq.from_config(config.model, len(src_vocab), len(tgt_vocab))
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, TypeError, AttributeError) as exc:
            reason = " ".join(str(exc).split())[:200]
            raise CheckpointError(f"checkpoint {checkpoint}: its weights do not fit its config ({reason})") from None
        return cls(model, src_vocab, tgt_vocab, config.decoding, resolve_device(device))

    # ------------------------------------------------------------------ public API

    def translate(self, lines: list[str], n_best: int = 1, return_attention: bool = False,
                  first_line: int = 1) -> list[Translation]:
        """Translate a list of lines; the results are in the same order."""
        encoded = self.src_vocab.encode(lines)
        limit = self.decoding.max_input_len
        truncated = np.array([len(ids) > limit for ids in encoded], dtype=bool)
        for i in np.flatnonzero(truncated):
            print(f"warning: input line {first_line + i} has {len(encoded[i])} pieces; truncated to {limit}",
                  file=sys.stderr)
        encoded = [ids[:limit] for ids in encoded]
        results: list[list[Hypothesis]] = [[] for _ in lines]
        nonempty = np.array([i for i, line in enumerate(lines) if line.strip()], dtype=np.int64)
        if nonempty.size:
            offsets = np.zeros(len(lines) + 1, dtype=np.int64)             # the chunk as one flat id array
            np.cumsum([len(ids) for ids in encoded], out=offsets[1:])
            flat = np.concatenate(encoded)
            lengths = np.diff(offsets) + 1                                   # with EOS
            order = nonempty[np.argsort(-lengths[nonempty], kind="stable")]  # longest first
            budget = max(1, self.decoding.batch_tokens // max(1, self.decoding.beam_size))
            with self.model.decoder.frozen_weights():                        # derived weights once per chunk
                for rows in cut_by_budget(order, lengths, budget, 0):
                    src = pad_rows(flat, offsets, rows, None, EOS)
                    for row, hyps in zip(rows.tolist(), self._search(src, n_best, return_attention), strict=True):
                        results[row] = hyps
        texts = self.tgt_vocab.decode([h[0].tokens if h else [] for h in results])
        return [Translation(text if line.strip() else "", hyps, ids, bool(cut))
                for line, text, hyps, ids, cut in zip(lines, texts, results, encoded, truncated, strict=True)]

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 10000, n_best: int = 1,
                         return_attention: bool = False, progress=None) -> Iterator[Translation]:
        """Translate a stream of lines chunk by chunk, yielding results in input order."""
        iterator = (line.rstrip("\r\n") for line in lines)
        first = 1
        while chunk := list(islice(iterator, chunk_lines)):
            yield from self.translate(chunk, n_best, return_attention, first_line=first)
            first += len(chunk)
            if progress is not None:
                progress.update(len(chunk))

    def write_translations(self, lines: Iterable[str], files: OutputFiles, n_best: int = 1,
                           progress=None) -> None:
        """Translate `lines` into `files`: one line per input line, or exactly `n_best` lines 'i ||| text ||| score'
        (i 0-based; an empty input line, or a beam with fewer distinct hypotheses, is padded with empty text)."""
        results = self.translate_stream(lines, n_best=n_best, return_attention=files.wants_attention,
                                        progress=progress)
        for number, result in enumerate(results):
            if n_best > 1:
                hyps = result.hypotheses[:n_best]
                texts = self.tgt_vocab.decode([h.tokens for h in hyps])
                rows = [f"{number} ||| {text} ||| {hyp.score:.4f}\n" for hyp, text in zip(hyps, texts, strict=True)]
                padding = f"{number} |||  ||| {0.0 if not hyps else float('-inf'):.4f}\n"
                files.text.write("".join(rows) + padding * (n_best - len(rows)))
            else:
                files.text.write(result.text + "\n")
            if files.wants_attention:
                self._write_attention(result, number, files)

    def _write_attention(self, result: Translation, number: int, files: OutputFiles) -> None:
        hyp = result.hypotheses[0] if result.hypotheses else None
        src_pieces = self.src_vocab.to_pieces(result.src_ids)
        tgt_pieces = self.tgt_vocab.to_pieces(hyp.tokens) if hyp else []
        if files.alignments is not None:
            files.alignments.write((word_alignments(src_pieces, tgt_pieces, hyp.attention) if hyp else "") + "\n")
        if files.attention is not None:
            weights = [[round(w, 4) for w in row] for row in hyp.attention.tolist()] if hyp else []
            record = {"line": number, "src": [*src_pieces, "</s>"], "tgt": [*tgt_pieces, "</s>"], "attention": weights}
            files.attention.write(json.dumps(record, ensure_ascii=False) + "\n")
        if files.plotter is not None and hyp:
            files.plotter.plot(number, [*src_pieces, "</s>"], [*tgt_pieces, "</s>"], hyp.attention)

    # ------------------------------------------------------------------ internals

    def _search(self, src: Tensor, n_best: int, return_attention: bool) -> list[list[Hypothesis]]:
        d = self.decoding
        src_lengths = (src != 0).sum(1)
        src = src.to(self.device)
        with autocast(self.device, self.amp_dtype):
            if d.beam_size == 1 and n_best == 1:
                hyps = greedy_search(self.model, src, src_lengths, d.max_len_ratio, d.min_len, return_attention)
                return [[h] for h in hyps]
            return beam_search(self.model, src, src_lengths, d.beam_size, d.length_penalty, d.max_len_ratio,
                               d.min_len, n_best, d.no_repeat_ngram, return_attention)


@dataclass
class OutputFiles:
    """Where `write_translations` puts things; only `text` is required."""

    text: TextIO
    alignments: TextIO | None = None    # Pharaoh "i-j" word alignments, one line per input line
    attention: TextIO | None = None     # JSON lines: source/target pieces and the weight matrix
    plotter: Any = None                 # nmt.plot.AttentionPlotter, writes one heatmap per sentence

    @property
    def wants_attention(self) -> bool:
        return self.alignments is not None or self.attention is not None or self.plotter is not None


def word_alignments(src_pieces: list[str], tgt_pieces: list[str], attention: Tensor) -> str:
    """Hard alignments in Pharaoh format ("i-j" = source word i, target word j, 0-based).

    attention: (tgt_pieces [+ EOS], src_pieces [+ EOS]). Each target piece is aligned to its
    most attended source piece; pieces map to whitespace words by their "▁" word starts.
    """
    def word_index(pieces: list[str]) -> list[int]:
        index, words = [], -1
        for i, piece in enumerate(pieces):
            if piece.startswith("▁") or i == 0:
                words += 1
            index.append(max(words, 0))
        return index

    if not tgt_pieces or not src_pieces:
        return ""
    src_word, tgt_word = word_index(src_pieces), word_index(tgt_pieces)
    best = attention[: len(tgt_pieces), : len(src_pieces)].argmax(-1).tolist()
    pairs = sorted({(src_word[s], tgt_word[t]) for t, s in enumerate(best)})
    return " ".join(f"{s}-{t}" for s, t in pairs)
