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

from nmt.config import ConfigError, DecodingConfig, config_from_dict
from nmt.data.batching import cut_by_budget, pad_rows
from nmt.data.tokenizer import EOS, UNK, Vocab
from nmt.decode.ensemble import Ensemble
from nmt.decode.search import Hypothesis, Sampler, beam_search, force_decode, greedy_search, length_penalty, sample
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
    def __init__(self, model: Seq2Seq | Ensemble, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.decoding, self.device = decoding, device
        self.amp_dtype = autocast_dtype(decoding.precision, device)
        self.generator: torch.Generator | None = None               # sampling: seeded on first use

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, device: str = "auto", **decoding_overrides) -> Translator:
        """Load a checkpoint; its run folder provides the config and the SentencePiece models."""
        checkpoint = Path(checkpoint)
        state = load_checkpoint(checkpoint, mmap=True)
        raw = state["config"]
        raw["decoding"].update({k: v for k, v in decoding_overrides.items() if v is not None})
        config = config_from_dict(raw)                  # overrides are checked like the YAML file
        src_vocab, tgt_vocab = load_vocabs(checkpoint.parent, state["vocab"])
        model = Seq2Seq.from_config(config.model, len(src_vocab), len(tgt_vocab))
        model.load_state_dict(state["model"])
        return cls(model, src_vocab, tgt_vocab, config.decoding, resolve_device(device))

    @classmethod
    def from_checkpoints(cls, checkpoints: list[str | Path], device: str = "auto",
                         **decoding_overrides) -> Translator:
        """An ensemble of one or more checkpoints (a single one gives a plain Translator). They must share
        the source and target vocabularies; the decoding settings come from the first one."""
        if len(checkpoints) == 1:
            return cls.from_checkpoint(checkpoints[0], device, **decoding_overrides)
        members = [cls.from_checkpoint(path, "cpu", **decoding_overrides) for path in checkpoints]
        first = members[0]
        for path, member in zip(checkpoints[1:], members[1:], strict=True):
            for side, mine, theirs in (("source", first.src_vocab, member.src_vocab),
                                       ("target", first.tgt_vocab, member.tgt_vocab)):
                if not _same_vocab(mine, theirs):
                    raise CheckpointError(f"{path} has a different {side} vocabulary from {checkpoints[0]}; "
                                          "the models of an ensemble must share their vocabularies")
        ensemble = Ensemble([member.model for member in members])
        return cls(ensemble, first.src_vocab, first.tgt_vocab, first.decoding, resolve_device(device))

    # ------------------------------------------------------------------ public API

    def translate(self, lines: list[str], n_best: int = 1, return_attention: bool = False,
                  first_line: int = 1, prefixes: list[str] | None = None) -> list[Translation]:
        """Translate a list of lines; the results are in the same order.

        `prefixes`, one per line ("" for none), are forced as the start of each translation.
        With decoding.sampling, `n_best` is the number of samples per line."""
        self.check_n_best(n_best)
        if prefixes is not None and len(prefixes) != len(lines):
            raise ValueError(f"{len(prefixes)} prefixes for {len(lines)} lines")
        prefix_ids = self.tgt_vocab.encode(prefixes) if prefixes is not None else None
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
            rows_per_line = n_best if self.decoding.sampling else self.decoding.beam_size
            budget = max(1, self.decoding.batch_tokens // max(1, rows_per_line))
            wants_attention = return_attention or self.decoding.replace_unk
            with self.model.decoder.frozen_weights():                        # derived weights once per chunk
                for rows in cut_by_budget(order, lengths, budget, 0):
                    src = pad_rows(flat, offsets, rows, None, EOS)
                    prefix = _pad_prefixes(prefix_ids, rows) if prefix_ids is not None else None
                    searched = self._search(src, n_best, wants_attention, prefix)
                    for row, hyps in zip(rows.tolist(), searched, strict=True):
                        results[row] = hyps
        texts = self.tgt_vocab.decode([h[0].tokens if h else [] for h in results])
        if self.decoding.replace_unk:
            texts = [self._replace_unk(line, h[0]) if h and UNK in h[0].tokens else text
                     for line, text, h in zip(lines, texts, results, strict=True)]
        return [Translation(text if line.strip() else "", hyps, ids, bool(cut))
                for line, text, hyps, ids, cut in zip(lines, texts, results, encoded, truncated, strict=True)]

    def check_n_best(self, n_best: int) -> None:
        """n_best hypotheses need at least n_best beams (samples have no such limit)."""
        if not self.decoding.sampling and n_best > self.decoding.beam_size:
            raise ConfigError(f"--n-best {n_best} is greater than --beam-size {self.decoding.beam_size}: "
                              "beam search finds at most beam-size hypotheses; raise the beam size or use --sampling")

    def score(self, sources: list[str], targets: list[str]) -> list[tuple[float, float, int]]:
        """The model's score of each (source, target) pair, teacher-forced and batched: log p(target + EOS |
        source), that divided by the length penalty, and the length in pieces with EOS. The searches report
        the same log-probability for the same output."""
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        limit = self.decoding.max_input_len
        src_ids = [ids[:limit] for ids in self.src_vocab.encode(sources)]
        tgt_ids = self.tgt_vocab.encode(targets)
        src_offsets, src_flat = _flatten(src_ids)
        tgt_offsets, tgt_flat = _flatten(tgt_ids)
        src_lengths = np.diff(src_offsets) + 1
        cost = src_lengths + np.diff(tgt_offsets) + 1
        order = np.argsort(-src_lengths, kind="stable")
        results: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * len(sources)
        with self.model.decoder.frozen_weights(), autocast(self.device, self.amp_dtype):
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

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 10000, n_best: int = 1,
                         return_attention: bool = False, progress=None,
                         prefixes: Iterable[str] | None = None) -> Iterator[Translation]:
        """Translate a stream of lines chunk by chunk, yielding results in input order; `prefixes`, a
        stream of as many lines, are forced as the start of each translation."""
        iterator = (line.rstrip("\r\n") for line in lines)
        prefix_iter = (line.rstrip("\r\n") for line in prefixes) if prefixes is not None else None
        first = 1
        while chunk := list(islice(iterator, chunk_lines)):
            chunk_prefixes = None
            if prefix_iter is not None:
                chunk_prefixes = list(islice(prefix_iter, len(chunk)))
                if len(chunk_prefixes) < len(chunk):
                    raise ValueError(f"the prefixes end at line {first + len(chunk_prefixes)} of the input")
            yield from self.translate(chunk, n_best, return_attention, first_line=first, prefixes=chunk_prefixes)
            first += len(chunk)
            if progress is not None:
                progress.update(len(chunk))

    def write_translations(self, lines: Iterable[str], files: OutputFiles, n_best: int = 1,
                           progress=None, prefixes: Iterable[str] | None = None) -> None:
        """Translate `lines` into `files`: one line per input line, or `n_best` lines 'i ||| text ||| score'."""
        results = self.translate_stream(lines, n_best=n_best, return_attention=files.wants_attention,
                                        progress=progress, prefixes=prefixes)
        for number, result in enumerate(results):
            if n_best > 1:
                texts = self.tgt_vocab.decode([h.tokens for h in result.hypotheses])
                for hyp, text in zip(result.hypotheses, texts, strict=True):
                    files.text.write(f"{number} ||| {text} ||| {hyp.score:.4f}\n")
            else:
                files.text.write(result.text + "\n")
            if files.scores is not None:
                self._write_scores(result, number, n_best, files)
            if files.wants_attention:
                self._write_attention(result, number, files)

    def _write_scores(self, result: Translation, number: int, n_best: int, files: OutputFiles) -> None:
        """One line per output line: log p and the length-normalised score, tab-separated or as JSON."""
        hyps: list[Hypothesis | None] = list(result.hypotheses) or [None] * (1 if n_best == 1 else 0)
        for rank, hyp in enumerate(hyps[: max(n_best, 1)]):
            log_prob = hyp.log_prob if hyp else 0.0
            normalised = self.normalised_score(hyp) if hyp else 0.0
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

    def _search(self, src: Tensor, n_best: int, return_attention: bool,
                prefix: Tensor | None = None) -> list[list[Hypothesis]]:
        d = self.decoding
        src_lengths = (src != 0).sum(1)
        src = src.to(self.device)
        max_len = d.max_len or None
        if prefix is not None:
            prefix = prefix.to(self.device)
        with autocast(self.device, self.amp_dtype):
            if d.sampling:
                return sample(self.model, src, src_lengths, self._sampler(), n_best, d.max_len_ratio, d.min_len,
                              return_attention, max_len, d.no_repeat_ngram, prefix)
            if d.beam_size == 1 and n_best == 1 and not d.coverage_penalty:
                hyps = greedy_search(self.model, src, src_lengths, d.max_len_ratio, d.min_len, return_attention,
                                     max_len, d.no_repeat_ngram, prefix)
                return [[h] for h in hyps]
            return beam_search(self.model, src, src_lengths, d.beam_size, d.length_penalty, d.max_len_ratio,
                               d.min_len, n_best, d.no_repeat_ngram, return_attention, max_len, prefix,
                               d.coverage_penalty)

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
