"""Input stream -> length-sorted token-budget batches -> output in input order; the Python API.

    from nmt import Translator
    translator = Translator.load("model.nmt")          # a model file, or a training checkpoint
    translator.translate(["Ein Hund läuft."], beam_size=5)[0].text

Streams are read by a thread and translated in micro-batches: a batch closes when it holds
`chunk_lines` lines, or `max_wait` seconds after its first line arrived while no further line is
waiting. A file therefore goes through in large chunks (full speed), and a slow pipe gets each
line's translation shortly after the line (streaming). Memory stays bounded either way. Inside a
chunk, sentences are sorted by length and cut into batches by a token budget; results are put
back in input order before they are yielded. Every input line gives exactly one result: an empty
line gives an empty translation without running the model, and an over-long line is truncated
with a warning.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from torch import Tensor

from nmt.config import DecodingConfig
from nmt.data.batching import cut_by_budget, pad_rows
from nmt.data.tokenizer import EOS, Vocab
from nmt.decode.search import Hypothesis, beam_search, greedy_search
from nmt.device import autocast, autocast_dtype, limit_kernel_cache, resolve_device
from nmt.model.modelfile import load_model
from nmt.model.seq2seq import Seq2Seq


@dataclass
class Translation:
    """The result for one input line.

    `text` is the translation; `nbest` the n-best list as (text, score) pairs, best first, when
    `translate(..., n_best=K)` asked for K > 1; each hypothesis carries its attention weights
    (target pieces + EOS, source pieces + EOS) when `return_attention=True`.
    """

    text: str                              # the best hypothesis, detokenised ("" for an empty line)
    hypotheses: list[Hypothesis]           # n-best, best first; empty for an empty line
    src_ids: np.ndarray                    # source side ids as encoded (after truncation), EOS excluded
    truncated: bool = False
    nbest_texts: list[str] = field(default_factory=list)   # detokenised hypotheses when n_best > 1

    def __str__(self) -> str:
        return self.text

    @property
    def score(self) -> float | None:
        """The best hypothesis's score (log-probability / length penalty); None for an empty line."""
        return self.hypotheses[0].score if self.hypotheses else None

    @property
    def nbest(self) -> list[tuple[str, float]]:
        """(text, score) pairs, best first: n_best of them when asked for, else just the best."""
        texts = self.nbest_texts or [self.text]
        return [(text, hyp.score) for text, hyp in zip(texts, self.hypotheses, strict=False)]

    @property
    def attention(self) -> Tensor | None:
        """The best hypothesis's attention, (target pieces + EOS, source pieces + EOS), if asked for."""
        return self.hypotheses[0].attention if self.hypotheses else None


class Translator:
    """A loaded model with its tokenizers and decoding settings; translates lists and streams of lines."""

    def __init__(self, model: Seq2Seq, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.decoding, self.device = decoding, device
        self.amp_dtype = autocast_dtype(decoding.precision, device)

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", **decoding_overrides: Any) -> Translator:
        """Load a model file (`nmt export`) or a training checkpoint, anywhere on disk.

        `decoding_overrides` replace keys of the model's `decoding` config (beam_size,
        length_penalty, batch_tokens, precision, ...) and are checked like the YAML file.
        Raises `nmt.model.modelfile.ModelFileError` or `nmt.config.ConfigError` with a one-line message.
        Caps ideep's kernel cache (LRU_CACHE_CAPACITY=16, unless set) before the first oneDNN call.
        """
        limit_kernel_cache()
        loaded = load_model(path, decoding_overrides)
        return cls(loaded.build(), loaded.src_vocab, loaded.tgt_vocab, loaded.config.decoding, resolve_device(device))

    from_checkpoint = load                            # the name before model files existed

    # ------------------------------------------------------------------ public API

    def translate(self, lines: list[str], n_best: int = 1, return_attention: bool = False,
                  first_line: int = 1, beam_size: int | None = None) -> list[Translation]:
        """Translate a list of lines; the results are in the same order, one per line.

        n_best: keep the K best hypotheses per line (`Translation.nbest`: (text, score) pairs).
        return_attention: keep each hypothesis's attention weights (`Translation.attention`).
        beam_size: this call's beam (1 = greedy); default the model's `decoding.beam_size`.
        first_line: the line number of lines[0], for warnings.
        """
        if (beam_size is not None and beam_size < 1) or n_best < 1:
            raise ValueError(f"beam_size and n_best must be at least 1, got {beam_size} and {n_best}")
        decoding = self.decoding if beam_size is None else replace(self.decoding, beam_size=beam_size)
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
            budget = max(1, decoding.batch_tokens // max(1, decoding.beam_size))
            with self.model.decoder.frozen_weights():                        # derived weights once per chunk
                for rows in cut_by_budget(order, lengths, budget, 0):
                    src = pad_rows(flat, offsets, rows, None, EOS)
                    found = self._search(src, n_best, return_attention, decoding)
                    for row, hyps in zip(rows.tolist(), found, strict=True):
                        results[row] = hyps
        texts = self.tgt_vocab.decode([h[0].tokens if h else [] for h in results])
        translations = [Translation(text if line.strip() else "", hyps, ids, bool(cut))
                        for line, text, hyps, ids, cut in zip(lines, texts, results, encoded, truncated, strict=True)]
        if n_best > 1:                                                       # all hypotheses in one decode call
            flat_texts = iter(self.tgt_vocab.decode([h.tokens for hyps in results for h in hyps]))
            for translation in translations:
                translation.nbest_texts = [next(flat_texts) for _ in translation.hypotheses]
        return translations

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 10000, n_best: int = 1,
                         return_attention: bool = False, progress=None, max_wait: float = 0.05
                         ) -> Iterator[Translation]:
        """Translate a stream of lines in micro-batches, yielding results in input order."""
        for batch in self.translate_batches(lines, chunk_lines, n_best, return_attention, progress, max_wait):
            yield from batch

    def translate_batches(self, lines: Iterable[str], chunk_lines: int = 10000, n_best: int = 1,
                          return_attention: bool = False, progress=None, max_wait: float = 0.05
                          ) -> Iterator[list[Translation]]:
        """Translate a stream of lines, yielding the results of each micro-batch as soon as it is done.

        A thread reads `lines` (already decoded text, a trailing line ending is removed); a batch
        closes at `chunk_lines` lines, or when no line is waiting `max_wait` seconds after the
        batch's first line arrived. If reading raises, the results of every earlier line are
        yielded first, then the exception propagates.
        """
        first = 1
        for chunk in micro_batches(lines, chunk_lines, max_wait):
            yield self.translate(chunk, n_best, return_attention, first_line=first)
            first += len(chunk)
            if progress is not None:
                progress.update(len(chunk))

    def write_translations(self, lines: Iterable[str], files: OutputFiles, n_best: int = 1,
                           progress=None) -> None:
        """Translate `lines` into `files`: one line per input line, or exactly `n_best` lines 'i ||| text ||| score'
        (i 0-based; an empty input line, or a beam with fewer distinct hypotheses, is padded with empty text)."""
        batches = self.translate_batches(lines, n_best=n_best, return_attention=files.wants_attention,
                                         progress=progress)
        number = 0
        for batch in batches:
            for result in batch:
                self._write_result(result, number, files, n_best)
                number += 1
            files.flush()                   # a slow pipe sees each batch as soon as it is translated

    def _write_result(self, result: Translation, number: int, files: OutputFiles, n_best: int) -> None:
        if n_best > 1:
            rows = [f"{number} ||| {text} ||| {score:.4f}\n" for text, score in result.nbest[:n_best]]
            padding = f"{number} |||  ||| {0.0 if not rows else float('-inf'):.4f}\n"
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

    def _search(self, src: Tensor, n_best: int, return_attention: bool,
                decoding: DecodingConfig | None = None) -> list[list[Hypothesis]]:
        d = decoding or self.decoding
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

    def flush(self) -> None:
        for handle in (self.text, self.alignments, self.attention):
            if handle is not None:
                handle.flush()


def _without_line_ending(line: str) -> str:
    """"text\n" or "text\r\n" -> "text"; a line without an ending is kept as it is."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def micro_batches(lines: Iterable[str], max_lines: int, max_wait: float) -> Iterator[list[str]]:
    """Group a (possibly slow) stream of lines into batches, reading it on a thread.

    A batch is yielded when it holds `max_lines` lines, when the input ends, or `max_wait` seconds
    after its first line arrived. Line endings ("\n", or "\r\n") are removed. An exception raised
    by `lines` is re-raised here after the batches of every earlier line. The reader hands lines
    over through a shared buffer of at most `max_lines` lines (memory stays bounded) and wakes the
    consumer only for a batch's first line or a full buffer, so a fast file costs no thread
    hand-off per line.
    """
    buffer: deque[str] = deque()
    cond = threading.Condition()
    shared: dict[str, Any] = {"first_at": 0.0, "done": False, "error": None, "stop": False}

    def read() -> None:
        try:
            for line in lines:
                line = _without_line_ending(line)
                with cond:
                    while len(buffer) >= max_lines and not shared["stop"]:
                        cond.wait()
                    if shared["stop"]:
                        return
                    if not buffer:
                        shared["first_at"] = time.monotonic()
                    buffer.append(line)
                    if len(buffer) == 1 or len(buffer) >= max_lines:
                        cond.notify_all()
        except BaseException as exc:   # handed to the consumer, which raises it after the earlier lines
            shared["error"] = exc
        finally:
            with cond:
                shared["done"] = True
                cond.notify_all()

    max_lines = max(1, max_lines)
    reader = threading.Thread(target=read, name="nmt-line-reader", daemon=True)
    reader.start()
    try:
        while True:
            with cond:
                while not buffer and not shared["done"]:
                    cond.wait()
                if not buffer:
                    break
                deadline = shared["first_at"] + max_wait
                while len(buffer) < max_lines and not shared["done"]:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    cond.wait(remaining)
                batch = [buffer.popleft() for _ in range(min(len(buffer), max_lines))]
                shared["first_at"] = time.monotonic()
                cond.notify_all()                       # a reader waiting on a full buffer goes on
            yield batch
        if shared["error"] is not None:
            raise shared["error"]
    finally:
        with cond:
            shared["stop"] = True
            cond.notify_all()


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
