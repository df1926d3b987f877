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

Decoding options (see nmt.decode.search): several models decode as one `Ensemble`; sampling
draws `n_best` samples per line from one seeded generator; a line may come with a target prefix
(a `(source, prefix)` pair instead of a string), which the search forces; `score` gives the
model's log-probability of given translations; `decoding.replace_unk` copies, for every `<unk>`
output piece, the most attended source text; `decoding.shortlist` scores, per batch, only the
target pieces the batch's source pieces make likely (nmt.decode.shortlist; greedy and beam search).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from torch import Tensor

from nmt.config import MAX_BEAM, ConfigError, DecodingConfig
from nmt.data.batching import cut_by_budget, pad_rows
from nmt.data.tokenizer import EOS, UNK, Vocab
from nmt.decode.ensemble import Ensemble
from nmt.decode.graphed import SearchGraphs, graphable
from nmt.decode.quantize import quantize_int8
from nmt.decode.search import Hypothesis, Sampler, beam_search, force_decode, greedy_search, length_penalty, sample
from nmt.decode.shortlist import Shortlist, shortlist_for, subset_positions
from nmt.device import autocast, autocast_dtype, limit_kernel_cache, resolve_device
from nmt.model.modelfile import ModelFileError, load_model
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
    """A loaded model with its tokenizers and decoding settings; translates lists and streams of lines.

    The Translator owns its model from then on: it moves it, puts it in eval mode, may quantize it,
    and builds the weights derived from its parameters (the decoder's token table, stacked step
    weights) once for its whole life, not once per call: a one-line call would otherwise spend
    about half its time rebuilding them. Do not train the model further under a Translator.

    Threads may share a Translator (and Translators a model): a search sets per-call state on the
    model (a shortlist's output rows), so searches of one model run one batch at a time. On one
    CPU, two searches side by side were no faster than one with two threads (`--threads`).
    """

    def __init__(self, model: Seq2Seq | Ensemble, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 device: torch.device, shortlist: Shortlist | None = None) -> None:
        self.model = model.to(device).eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.decoding, self.device = decoding, device
        self.shortlist = shortlist                                  # used when decoding.shortlist is on
        self.amp_dtype = autocast_dtype(decoding.precision, device,
                                        graphed=decoding.cuda_graphs and isinstance(self.model, Seq2Seq))
        if decoding.quantize == "int8":
            if decoding.precision in ("bf16", "fp16"):
                raise ConfigError(f"--quantize int8 computes in float32 around its int8 products; "
                                  f"drop --precision {decoding.precision} (or decoding.precision)")
            if device.type != "cpu":                     # an ensemble's members loaded on the CPU
                raise ConfigError("--quantize int8 runs on the CPU only (--device cpu)")
            self.amp_dtype = None
            if isinstance(self.model, Seq2Seq):          # an ensemble's members were quantized as they loaded
                quantize_int8(self.model)
        self.generator: torch.Generator | None = None               # sampling: seeded on first use
        self._derived_weights = ExitStack()                         # held open for the Translator's life
        self._derived_weights.enter_context(self.model.decoder.frozen_weights())
        self._locks = _search_locks(self.model)
        self._graphs: SearchGraphs | None = None                    # CUDA: captured search steps, made on first use

    @classmethod
    def load(cls, path: str | Path | Sequence[str | Path], device: str = "auto",
             shortlist_file: str | Path | None = None, **decoding_overrides: Any) -> Translator:
        """Load a model file (`nmt export`) or a training checkpoint, anywhere on disk; several paths
        decode as an ensemble (see `load_ensemble`).

        `decoding_overrides` replace keys of the model's `decoding` config (beam_size,
        length_penalty, batch_tokens, precision, shortlist, ...) and are checked like the YAML file.
        `shortlist=True` uses the vocabulary shortlist the model embeds; `shortlist_file` (a data
        folder's shortlist.npz, for a model that embeds none) and `shortlist_k` imply it, unless
        `shortlist=False` is given.
        Raises `nmt.model.modelfile.ModelFileError` or `nmt.config.ConfigError` with a one-line message.
        Caps ideep's kernel cache (LRU_CACHE_CAPACITY=16, unless set) before the first oneDNN call.
        """
        if shortlist_file is not None:
            decoding_overrides["shortlist"] = True
        if decoding_overrides.get("shortlist_k") is not None and decoding_overrides.get("shortlist") is None:
            decoding_overrides["shortlist"] = True      # asking for k pieces per source piece asks for the shortlist
        if not isinstance(path, (str, Path)):
            if not isinstance(path, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in path):
                raise TypeError(f"path must be a model file or checkpoint path (str or Path), or a list of them "
                                f"for an ensemble; got {type(path).__name__}")
            return cls.load_ensemble(path, device, shortlist_file, **decoding_overrides)
        limit_kernel_cache()
        loaded = load_model(path, decoding_overrides)
        shortlist = shortlist_for(loaded, shortlist_file)
        return cls(loaded.build(), loaded.src_vocab, loaded.tgt_vocab, loaded.config.decoding, resolve_device(device),
                   shortlist)

    from_checkpoint = load                            # the name before model files existed

    @classmethod
    def load_ensemble(cls, paths: Sequence[str | Path], device: str = "auto", shortlist_file: str | Path | None = None,
                      **decoding_overrides: Any) -> Translator:
        """Several models (files or checkpoints) decoding as one: the average of their log-probabilities
        at every step. They must share the source and target vocabularies and may differ in everything
        else; the decoding settings and the shortlist come from the first. One path gives a plain Translator."""
        if not paths:
            raise ValueError("an ensemble needs at least one model path")
        if len(paths) == 1:
            return cls.load(paths[0], device, shortlist_file, **decoding_overrides)
        members = [cls.load(path, "cpu", shortlist_file if i == 0 else None,
                            **(decoding_overrides if i == 0 else {**decoding_overrides, "shortlist": False}))
                   for i, path in enumerate(paths)]
        first = members[0]
        for path, member in zip(paths[1:], members[1:], strict=True):
            for side, mine, theirs in (("source", first.src_vocab, member.src_vocab),
                                       ("target", first.tgt_vocab, member.tgt_vocab)):
                if not _same_vocab(mine, theirs):
                    raise ModelFileError(f"{path} has a different {side} vocabulary from {paths[0]}; "
                                         "the models of an ensemble must share their vocabularies")
        ensemble = Ensemble([member.model for member in members])
        return cls(ensemble, first.src_vocab, first.tgt_vocab, first.decoding, resolve_device(device), first.shortlist)

    from_checkpoints = load_ensemble

    # ------------------------------------------------------------------ public API

    def translate(self, lines: list[str], n_best: int = 1, return_attention: bool = False,
                  first_line: int = 1, beam_size: int | None = None,
                  prefixes: list[str] | None = None) -> list[Translation]:
        """Translate a list of lines; the results are in the same order, one per line.

        n_best: keep the K best hypotheses per line (`Translation.nbest`: (text, score) pairs); with
            decoding.sampling, K samples per line.
        return_attention: keep each hypothesis's attention weights (`Translation.attention`).
        beam_size: this call's beam (1 = greedy); default the model's `decoding.beam_size`.
        first_line: the line number of lines[0], for warnings.
        prefixes: one per line ("" for none), forced as the start of each translation.
        """
        lines = _as_lines("lines", lines)
        if prefixes is not None:
            prefixes = _as_lines("prefixes", prefixes)
        if not (_whole(n_best) and 1 <= n_best <= MAX_BEAM
                and (beam_size is None or (_whole(beam_size) and 1 <= beam_size <= MAX_BEAM))):
            raise ValueError(f"beam_size and n_best must be integers from 1 to {MAX_BEAM}, "
                             f"got {beam_size!r} and {n_best!r}")
        decoding = self.decoding if beam_size is None else replace(self.decoding, beam_size=beam_size)
        self.check_n_best(n_best, decoding)
        if prefixes is not None and len(prefixes) != len(lines):
            raise ValueError(f"{len(prefixes)} prefixes for {len(lines)} lines")
        prefix_ids = self.tgt_vocab.encode(prefixes) if prefixes is not None and any(prefixes) else None
        limit = self.decoding.max_input_len
        encoded, truncated = _truncate(self.src_vocab.encode(lines), limit, lambda i, n: (
            f"warning: input line {first_line + i} has {n} pieces; truncated to {limit}"))
        results: list[list[Hypothesis]] = [[] for _ in lines]
        nonempty = np.array([i for i, line in enumerate(lines) if line.strip()], dtype=np.int64)
        if nonempty.size:
            offsets = np.zeros(len(lines) + 1, dtype=np.int64)             # the chunk as one flat id array
            np.cumsum([len(ids) for ids in encoded], out=offsets[1:])
            flat = np.concatenate(encoded)
            lengths = np.diff(offsets) + 1                                   # with EOS
            order = nonempty[np.argsort(-lengths[nonempty], kind="stable")]  # longest first
            rows_per_line = n_best if decoding.sampling else decoding.beam_size
            budget = max(1, decoding.batch_tokens // max(1, rows_per_line))
            wants_attention = return_attention or decoding.replace_unk
            for rows in cut_by_budget(order, lengths, budget, 0):
                src = pad_rows(flat, offsets, rows, None, EOS)
                prefix = _pad_prefixes(prefix_ids, rows) if prefix_ids is not None else None
                found = self._search(src, n_best, wants_attention, decoding, prefix)
                for row, hyps in zip(rows.tolist(), found, strict=True):
                    results[row] = hyps
        texts = self.tgt_vocab.decode([h[0].tokens if h else [] for h in results])
        if decoding.replace_unk:
            texts = [self._replace_unk(line, h[0]) if h and UNK in h[0].tokens else text
                     for line, text, h in zip(lines, texts, results, strict=True)]
        translations = [Translation(text if line.strip() else "", hyps, ids, bool(cut))
                        for line, text, hyps, ids, cut in zip(lines, texts, results, encoded, truncated, strict=True)]
        if n_best > 1:                                                       # all hypotheses in one decode call
            flat_texts = iter(self.tgt_vocab.decode([h.tokens for hyps in results for h in hyps]))
            for translation in translations:
                translation.nbest_texts = [next(flat_texts) for _ in translation.hypotheses]
        return translations

    def check_n_best(self, n_best: int, decoding: DecodingConfig | None = None,
                     names: tuple[str, str, str] = ("n_best", "beam_size", "sampling")) -> None:
        """n_best hypotheses need at least n_best beams (samples have no such limit). `names`: what the
        caller calls n_best, beam_size and sampling (the command line: --n-best, --beam-size, --sampling)."""
        d = decoding or self.decoding
        if not d.sampling and n_best > d.beam_size:
            n, beam, sampling = names
            raise ConfigError(f"{n} {n_best} is larger than the beam size {d.beam_size}: beam search finds at most "
                              f"{beam} hypotheses; raise {beam} to at least {n_best} or use {sampling}")

    def score(self, sources: list[str], targets: list[str], first_line: int = 1) -> list[tuple[float, float, int]]:
        """The model's score of each (source, target) pair, teacher-forced and batched: log p(target + EOS |
        source), that divided by the length penalty, and the length in pieces with EOS. The searches report
        the same log-probability for the same output.

        As in translation, a source over `decoding.max_input_len` pieces is truncated, and a target over
        the longest output such a source may have (max_len_ratio x max_input_len + 10) too: a warning on
        stderr names the line (`first_line` is the number of the first pair), and memory stays bounded
        whatever the lines."""
        sources, targets = _as_lines("sources", sources), _as_lines("targets", targets)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        limit = self.decoding.max_input_len
        tgt_limit = int(self.decoding.max_len_ratio * limit) + 10
        src_ids, _ = _truncate(self.src_vocab.encode(sources), limit, lambda i, n: (
            f"warning: line {first_line + i}: the source has {n} pieces; scored truncated to {limit}"))
        tgt_ids, _ = _truncate(self.tgt_vocab.encode(targets), tgt_limit, lambda i, n: (
            f"warning: line {first_line + i}: the target has {n} pieces; scored truncated to {tgt_limit}"))
        src_offsets, src_flat = _flatten(src_ids)
        tgt_offsets, tgt_flat = _flatten(tgt_ids)
        src_lengths = np.diff(src_offsets) + 1
        cost = src_lengths + np.diff(tgt_offsets) + 1
        order = np.argsort(-src_lengths, kind="stable")
        results: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * len(sources)
        with self.model.decoder.frozen_weights(), autocast(self.device, self.amp_dtype), self._exclusive():
            for rows in cut_by_budget(order, cost, self.decoding.batch_tokens, 0):
                src = pad_rows(src_flat, src_offsets, rows, None, EOS)
                tgt = pad_rows(tgt_flat, tgt_offsets, rows, None, None)
                log_probs, out_lengths = force_decode(self.model, src.to(self.device), (src != 0).sum(1),
                                                      tgt.to(self.device))
                normalised = log_probs / length_penalty(out_lengths.float(), self.decoding.length_penalty)
                for row, lp, norm, n in zip(rows.tolist(), log_probs.tolist(), normalised.tolist(),
                                            out_lengths.tolist(), strict=True):
                    results[row] = (lp, norm, n)
        return results

    def normalised_score(self, hyp: Hypothesis) -> float:
        """log p / lp(|y|), the GNMT length normalisation with decoding.length_penalty, EOS counted."""
        return hyp.log_prob / length_penalty(float(len(hyp.tokens) + 1), self.decoding.length_penalty)

    def translate_stream(self, lines: Iterable[str | tuple[str, str]], chunk_lines: int = 10000, n_best: int = 1,
                         return_attention: bool = False, progress=None, max_wait: float = 0.05
                         ) -> Iterator[Translation]:
        """Translate a stream of lines in micro-batches, yielding results in input order; an item may be a
        (source, target prefix) pair."""
        for batch in self.translate_batches(lines, chunk_lines, n_best, return_attention, progress, max_wait):
            yield from batch

    def translate_batches(self, lines: Iterable[str | tuple[str, str]], chunk_lines: int = 10000, n_best: int = 1,
                          return_attention: bool = False, progress=None, max_wait: float = 0.05
                          ) -> Iterator[list[Translation]]:
        """Translate a stream of lines, yielding the results of each micro-batch as soon as it is done.

        A thread reads `lines` (already decoded text, a trailing line ending is removed); a batch
        closes at `chunk_lines` lines, or when no line is waiting `max_wait` seconds after the
        batch's first line arrived. If reading raises, the results of every earlier line are
        yielded first, then the exception propagates. A (source, prefix) pair forces that prefix.
        """
        if isinstance(lines, str):
            raise TypeError("lines must be an iterable of lines (a list, a file), not one string")
        first = 1
        for chunk in micro_batches(lines, chunk_lines, max_wait):
            sources, prefixes = _split_prefixes(chunk)
            yield self.translate(sources, n_best, return_attention, first_line=first, prefixes=prefixes)
            first += len(chunk)
            if progress is not None:
                progress.update(len(chunk))

    def write_translations(self, lines: Iterable[str | tuple[str, str]], files: OutputFiles, n_best: int = 1,
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
        if files.scores is not None:
            self._write_scores(result, number, n_best, files)
        if files.wants_attention:
            self._write_attention(result, number, files)

    def _write_scores(self, result: Translation, number: int, n_best: int, files: OutputFiles) -> None:
        """One line per output line (so K per input line with n_best K): log p and the length-normalised
        score, tab-separated or as JSON; padded lines of the n-best output get 0 (empty input) or -inf."""
        hyps: list[Hypothesis | None] = list(result.hypotheses[:n_best])
        hyps += [None] * (n_best - len(hyps))
        missing = 0.0 if not result.hypotheses else float("-inf")
        for rank, hyp in enumerate(hyps):
            log_prob = hyp.log_prob if hyp else missing
            normalised = self.normalised_score(hyp) if hyp else missing
            if files.scores_json:
                record = {"line": number, "rank": rank, "log_prob": round(log_prob, 6),
                          "score": round(normalised, 6), "length": len(hyp.tokens) + 1 if hyp else 0}
                files.scores.write(json.dumps(record) + "\n")
            else:
                files.scores.write(f"{log_prob:.6f}\t{normalised:.6f}\n")

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

    @torch.no_grad()
    def _search(self, src: Tensor, n_best: int, return_attention: bool, decoding: DecodingConfig | None = None,
                prefix: Tensor | None = None) -> list[list[Hypothesis]]:
        d = decoding or self.decoding
        src_lengths = (src != 0).sum(1)
        src = src.to(self.device)
        max_len = d.max_len or None
        if prefix is not None:
            prefix = prefix.to(self.device)
        with autocast(self.device, self.amp_dtype), self._exclusive():
            if d.sampling:
                return sample(self.model, src, src_lengths, self._sampler(), n_best, d.max_len_ratio, d.min_len,
                              return_attention, max_len, d.no_repeat_ngram, prefix)
            if not d.shortlist or self.shortlist is None:
                return self._greedy_or_beam(src, src_lengths, n_best, return_attention, d, max_len, prefix)
            keep = self.shortlist.select(src, prefix).to(self.device)        # (subset,) target ids
            with self.model.decoder.output_subset(keep):                     # the search runs on subset positions
                prefix = subset_positions(keep, prefix) if prefix is not None else None
                return self._greedy_or_beam(src, src_lengths, n_best, return_attention, d, max_len, prefix)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the model's search locks (see `_search_locks`)."""
        with ExitStack() as stack:
            for lock in self._locks:
                stack.enter_context(lock)
            yield

    def _greedy_or_beam(self, src: Tensor, src_lengths: Tensor, n_best: int, return_attention: bool,
                        d: DecodingConfig, max_len: int | None, prefix: Tensor | None) -> list[list[Hypothesis]]:
        greedy = d.beam_size == 1 and n_best == 1 and not d.coverage_penalty
        if d.cuda_graphs and graphable(self.model, self.device, sampling=False, prefix=prefix,
                                       no_repeat_ngram=d.no_repeat_ngram, coverage=d.coverage_penalty,
                                       return_attention=return_attention):
            if self._graphs is None:
                self._graphs = SearchGraphs(self.model)
            if greedy:
                return [[h] for h in self._graphs.greedy(src, src_lengths, d.max_len_ratio, d.min_len, max_len)]
            return self._graphs.beam(src, src_lengths, d.beam_size, d.length_penalty, d.max_len_ratio, d.min_len,
                                     n_best, max_len, d.early_stop)
        if greedy:
            hyps = greedy_search(self.model, src, src_lengths, d.max_len_ratio, d.min_len, return_attention,
                                 max_len, d.no_repeat_ngram, prefix)
            return [[h] for h in hyps]
        return beam_search(self.model, src, src_lengths, d.beam_size, d.length_penalty, d.max_len_ratio,
                           d.min_len, n_best, d.no_repeat_ngram, return_attention, max_len, prefix,
                           d.coverage_penalty, d.early_stop)

    def _sampler(self) -> Sampler:
        d = self.decoding
        if self.generator is None:
            self.generator = torch.Generator(device=self.device).manual_seed(d.seed)
        return Sampler(d.temperature, d.top_k, d.top_p, self.generator)

    def _replace_unk(self, line: str, hyp: Hypothesis) -> str:
        """The hypothesis' text with each <unk> replaced by the source text of its most attended source piece."""
        offsets = self.src_vocab.sp.EncodeAsOffsetMapping(line)["offsets"]   # (start, end) in `line` per piece
        surfaces = [line[start:end].strip() for start, end in offsets]
        attention = hyp.attention[: len(hyp.tokens), : max(1, len(surfaces))]   # (tokens, src pieces), EOS column off
        best = attention.argmax(-1).tolist()
        pieces = self.tgt_vocab.to_pieces(hyp.tokens)
        for t, token in enumerate(hyp.tokens):
            if token == UNK and surfaces:
                pieces[t] = surfaces[best[t]]
        return self.tgt_vocab.sp.decode_pieces(pieces)


_SEARCH_LOCKS: weakref.WeakKeyDictionary[Seq2Seq, threading.Lock] = weakref.WeakKeyDictionary()
_SEARCH_LOCKS_GUARD = threading.Lock()


def _search_locks(model: Seq2Seq | Ensemble) -> list[threading.Lock]:
    """One lock per Seq2Seq (an ensemble's members each), in one order for every caller, so that
    Translators sharing a model, or a member, never search it at once and never deadlock."""
    members = model.decoder.models if isinstance(model, Ensemble) else [model]
    unique = sorted({id(member): member for member in members}.values(), key=id)
    with _SEARCH_LOCKS_GUARD:
        return [_SEARCH_LOCKS.setdefault(member, threading.Lock()) for member in unique]


def _truncate(encoded: list[np.ndarray], limit: int,
              warning: Callable[[int, int], str]) -> tuple[list[np.ndarray], np.ndarray]:
    """Each id sequence cut to `limit` pieces, and which were cut (bool, one per sequence); each cut one
    gets a line on stderr, `warning(index, pieces)`."""
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    cut = lengths > limit
    kept = list(encoded)
    for i in np.flatnonzero(cut).tolist():             # the over-long lines only
        print(warning(i, int(lengths[i])), file=sys.stderr, flush=True)
        kept[i] = encoded[i][:limit]
    return kept, cut


def _as_lines(name: str, lines: object) -> list[str]:
    """`lines` as a list of strings: any iterable of them (a generator is read once), but not one string
    (which would be translated character by character) and no bytes or other items."""
    if isinstance(lines, (str, bytes)):
        raise TypeError(f"{name} must be a list of strings, not one {'string' if isinstance(lines, str) else 'bytes'}"
                        "; for one sentence pass [sentence]")
    try:
        lines = list(lines)                                  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{name} must be a list of strings, not {type(lines).__name__}") from None
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{name}[{i}] is {type(line).__name__}, not a string")
    return lines


def _whole(number: object) -> bool:
    return isinstance(number, int) and not isinstance(number, bool)


def _same_vocab(a: Vocab, b: Vocab) -> bool:
    return np.array_equal(a.pieces, b.pieces) and a.sp.serialized_model_proto() == b.sp.serialized_model_proto()


def _flatten(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Id arrays -> (offsets (n+1,), one flat id array), the layout `pad_rows` reads."""
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids in sequences], out=offsets[1:])
    flat = np.concatenate(sequences) if sequences else np.zeros(0, dtype=np.int64)
    return offsets, flat


def _pad_prefixes(prefix_ids: list[np.ndarray], rows: np.ndarray) -> Tensor | None:
    """The prefixes of `rows` as a PAD-padded (len(rows), longest) tensor; None when all are empty."""
    offsets, flat = _flatten([prefix_ids[row] for row in rows.tolist()])
    if flat.size == 0:
        return None
    return pad_rows(flat, offsets, np.arange(len(rows)), None, None)


def _split_prefixes(chunk: list[str | tuple[str, str]]) -> tuple[list[str], list[str] | None]:
    """A chunk of lines and (source, prefix) pairs -> the sources, and the prefixes ("" where none; None if none)."""
    if not any(isinstance(item, tuple) for item in chunk):
        return chunk, None                                             # type: ignore[return-value]
    pairs = [item if isinstance(item, tuple) else (item, "") for item in chunk]
    return [source for source, _ in pairs], [prefix for _, prefix in pairs]


@dataclass
class OutputFiles:
    """Where `write_translations` puts things; only `text` is required."""

    text: TextIO
    alignments: TextIO | None = None    # Pharaoh "i-j" word alignments, one line per input line
    attention: TextIO | None = None     # JSON lines: source/target pieces and the weight matrix
    plotter: Any = None                 # nmt.plot.AttentionPlotter, writes one heatmap per sentence
    scores: TextIO | None = None        # per output line: log p and length-normalised score
    scores_json: bool = False           # scores as JSON lines instead of tab-separated

    @property
    def wants_attention(self) -> bool:
        return self.alignments is not None or self.attention is not None or self.plotter is not None

    def flush(self) -> None:
        for handle in (self.text, self.alignments, self.attention, self.scores):
            if handle is not None:
                handle.flush()


def _without_line_ending(line: str) -> str:
    """"text\n" or "text\r\n" -> "text"; a line without an ending is kept as it is."""
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    return line


def micro_batches(lines: Iterable[str | tuple[str, str]], max_lines: int,
                  max_wait: float) -> Iterator[list[str | tuple[str, str]]]:
    """Group a (possibly slow) stream of lines into batches, reading it on a thread.

    A batch is yielded when it holds `max_lines` lines, when the input ends, or `max_wait` seconds
    after its first line arrived. Line endings ("\n", or "\r\n") are removed. An exception raised
    by `lines` is re-raised here after the batches of every earlier line. The reader hands lines
    over through a shared buffer of at most `max_lines` lines (memory stays bounded) and wakes the
    consumer only for a batch's first line or a full buffer, so a fast file costs no thread
    hand-off per line.
    """
    buffer: deque[str | tuple[str, str]] = deque()
    cond = threading.Condition()
    shared: dict[str, Any] = {"first_at": 0.0, "done": False, "error": None, "stop": False}

    def read() -> None:
        try:
            for line in lines:
                line = (_without_line_ending(line) if isinstance(line, str)
                        else tuple(_without_line_ending(part) for part in line))
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
