"""The Python API: load a model (or an ensemble), translate lists and streams of lines, score translations.

    Translator.load("model.nmt").translate(["Ein Hund läuft."], beam_size=5)[0].text

Every input line gives one result (an empty line an empty one, an over-long one a truncated one and a warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from nmt.config import DECODING_BATCH_TOKENS, EXTRA_OUTPUT_PIECES, ConfigError, DecodingConfig, with_implied_shortlist
from nmt.data.rows import cut_by_budget, flatten, padded_ids, truncated
from nmt.data.shortlist import load_shortlist
from nmt.data.special import EOS
from nmt.data.tokenizer import Vocab
from nmt.decode.ensemble import Ensemble
from nmt.decode.graphs import SearchGraphs
from nmt.decode.outputs import Translation
from nmt.decode.quantize import quantize_int8
from nmt.decode.search import Hypothesis, Sampler, SearchSettings, force_decode, length_penalty, search
from nmt.decode.shortlist import Shortlist, ShortlistError
from nmt.decode.steps import Decoding
from nmt.decode.streaming import Translates, check_first_line
from nmt.device import autocast, autocast_dtype, resolve_device
from nmt.fs.text import as_lines as _as_lines
from nmt.model.seq2seq import Seq2Seq
from nmt.modelfile.file import LoadedModel, ModelFileError, load_model
from nmt.process import configure_process

__all__ = ["Translation", "Translator"]


class Translator(Translates):
    """A loaded model with its tokenizers and decoding settings. It owns its model (moved, in eval mode) and
    keeps its inference steps (nmt.decode.steps) for life: rebuilding them would cost a one-line call half
    its time. Threads may share it: a shortlist is a per-call view; only the CUDA graphs are taken in turn.
    """

    def __init__(self, model: Seq2Seq | Ensemble, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 device: torch.device, shortlist: Shortlist | None = None,
                 contexts: list[Decoding] | None = None, languages: dict[str, str] | None = None) -> None:
        """`contexts`: the members' inference steps when they exist already; `languages`: {"src", "tgt"} codes."""
        self.model = model.to(device).eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.decoding, self.device = decoding, device
        self.languages = languages or {}
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
        if contexts is None:
            members = [cast(Seq2Seq, m) for m in
                       (self.model.members if isinstance(self.model, Ensemble) else [self.model])]
            contexts = [Decoding(member, quantize_int8(member) if decoding.quantize == "int8" else None)
                        for member in members]
        self.search_model: Any = self.model.decoding(contexts) if isinstance(self.model, Ensemble) else contexts[0]
        self.generator: torch.Generator | None = None               # sampling: seeded on first use
        self._graphs = (SearchGraphs.of(self.search_model)          # CUDA: captured search steps
                        if decoding.cuda_graphs and device.type == "cuda" else None)

    @classmethod
    def load(cls, path: str | Path | Sequence[str | Path], device: str = "auto",
             shortlist_file: str | Path | None = None, **decoding_overrides: Any) -> Translator:
        """A model file or a training checkpoint; several paths decode as an ensemble. `decoding_overrides`
        replace keys of the model's `decoding` config; `shortlist_file` (a data folder's shortlist.npz) and
        `shortlist_k` imply shortlist=True unless it is False. Raises ModelFileError or ConfigError (one line)."""
        if not isinstance(path, (str, Path)):
            if not isinstance(path, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in path):
                raise TypeError(f"path must be a model file or checkpoint path (str or Path), or a list of them "
                                f"for an ensemble; got {type(path).__name__}")
            return cls.load_ensemble(path, device, shortlist_file, **decoding_overrides)
        decoding_overrides = _checked(device, shortlist_file, decoding_overrides)
        return cls._load_one(path, device, shortlist_file, decoding_overrides)

    @classmethod
    def _load_one(cls, path: str | Path, device: str, shortlist_file: str | Path | None,
                  decoding_overrides: dict[str, Any]) -> Translator:
        configure_process()                  # ideep's kernel cache capped before the first oneDNN call
        loaded = load_model(path, decoding_overrides)
        check_applicable(loaded.config.decoding, decoding_overrides)
        target = resolve_device(device)
        if shortlist_by_default(loaded, target, decoding_overrides):
            loaded.config.decoding.shortlist = True
        return cls(loaded.build(), loaded.src_vocab, loaded.tgt_vocab, loaded.config.decoding, target,
                   shortlist_for(loaded, shortlist_file), languages=loaded.languages)

    from_checkpoint = load                            # the name before model files existed

    @classmethod
    def load_ensemble(cls, paths: Sequence[str | Path], device: str = "auto", shortlist_file: str | Path | None = None,
                      **decoding_overrides: Any) -> Translator:
        """Models averaging their log-probabilities at every step; settings and shortlist from the first."""
        if not paths:
            raise ValueError("an ensemble needs at least one model path")
        if len(paths) == 1:
            return cls.load(paths[0], device, shortlist_file, **decoding_overrides)
        decoding_overrides = _checked(device, shortlist_file, decoding_overrides)
        members = [cls._load_one(path, "cpu", shortlist_file if i == 0 else None,   # moved to `device` as one
                                 decoding_overrides if i == 0 else {**decoding_overrides, "shortlist": False})
                   for i, path in enumerate(paths)]
        first = members[0]
        for path, member in zip(paths[1:], members[1:], strict=True):
            for side, mine, theirs in (("source", first.src_vocab, member.src_vocab),
                                       ("target", first.tgt_vocab, member.tgt_vocab)):
                if mine.digest() != theirs.digest():
                    raise ModelFileError(f"{path} has a different {side} vocabulary from {paths[0]}; "
                                         "the models of an ensemble must share their vocabularies")
        ensemble = Ensemble([cast(Seq2Seq, member.model) for member in members])     # each loaded alone
        contexts = [cast(Decoding, member.search_model) for member in members]   # with their int8 products, if any
        return cls(ensemble, first.src_vocab, first.tgt_vocab, first.decoding, resolve_device(device), first.shortlist,
                   contexts, first.languages)

    from_checkpoints = load_ensemble

    def batch_tokens(self, scoring: bool = False) -> int:
        """decoding.batch_tokens, or (0) the device's; scoring keeps the CPU's: it holds (target x vocabulary)."""
        device = "cpu" if scoring else self.device.type
        return self.decoding.batch_tokens or DECODING_BATCH_TOKENS.get(device, DECODING_BATCH_TOKENS["cpu"])

    def score(self, sources: list[str], targets: list[str], first_line: int = 1) -> list[tuple[float, float, int]]:
        """Each pair's teacher-forced log p(target + EOS | source), as the searches score it, that normalised,
        and the length with EOS. Over-long sources and targets are truncated with a warning naming the line."""
        check_first_line(first_line)
        sources, targets = _as_lines("sources", sources), _as_lines("targets", targets)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        limit = self.decoding.max_input_len
        tgt_limit = int(self.decoding.max_len_ratio * limit) + EXTRA_OUTPUT_PIECES
        src_ids, _ = truncated(self.src_vocab.encode(sources), limit, lambda i, n: (
            f"warning: line {first_line + i}: the source has {n} pieces; scored truncated to {limit}"))
        tgt_ids, _ = truncated(self.tgt_vocab.encode(targets), tgt_limit, lambda i, n: (
            f"warning: line {first_line + i}: the target has {n} pieces; scored truncated to {tgt_limit}"))
        src_offsets, src_flat = flatten(src_ids)
        tgt_offsets, tgt_flat = flatten(tgt_ids)
        src_lengths = np.diff(src_offsets) + 1
        cost = src_lengths + np.diff(tgt_offsets) + 1
        order = np.argsort(-src_lengths, kind="stable")
        results: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * len(sources)
        with autocast(self.device, self.amp_dtype):
            for rows in cut_by_budget(order, cost, self.batch_tokens(scoring=True), 0):
                src = torch.from_numpy(padded_ids(src_flat, src_offsets, rows, None, EOS))
                tgt = torch.from_numpy(padded_ids(tgt_flat, tgt_offsets, rows, None, None))
                log_probs, out_lengths = force_decode(self.search_model, src.to(self.device), (src != 0).sum(1),
                                                      tgt.to(self.device))
                normalised = log_probs / length_penalty(out_lengths.float(), self.decoding.length_penalty)
                for row, lp, norm, n in zip(rows.tolist(), log_probs.tolist(), normalised.tolist(),
                                            out_lengths.tolist(), strict=True):
                    results[row] = (lp, norm, n)
        return results

    @torch.no_grad()
    def _search(self, src_ids: np.ndarray, n_best: int, return_attention: bool, d: DecodingConfig,
                prefix_ids: np.ndarray | None) -> list[list[Hypothesis]]:
        src = torch.from_numpy(src_ids)
        prefix = None if prefix_ids is None else torch.from_numpy(prefix_ids)
        if d.sampling and self.generator is None:
            self.generator = torch.Generator(device=self.device).manual_seed(d.seed)
        sampler = Sampler(d.temperature, d.top_k, d.top_p, self.generator) if d.sampling else None
        settings = SearchSettings.of(d, n_best, return_attention, sampler)
        src_lengths = (src != 0).sum(1)
        src = src.to(self.device)
        if prefix is not None:
            prefix = prefix.to(self.device)
        with autocast(self.device, self.amp_dtype):
            model = self.search_model
            if d.shortlist and self.shortlist is not None and not d.sampling:
                keep = self.shortlist.select(src, prefix).to(self.device)    # (subset,) target ids
                model = model.with_output_subset(keep)                       # the search runs on subset positions
                prefix = torch.searchsorted(keep, prefix) if prefix is not None else None   # ids -> positions
            return search(model, src, src_lengths, settings, prefix, self._graphs)


SEARCH_ONLY = ("beam_size", "length_penalty", "coverage_penalty", "early_stop")   # what sampling has not
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed")


def check_applicable(decoding: DecodingConfig, given: dict[str, Any]) -> None:
    """A setting given for this run that it would ignore (search ones when sampling, sampling ones when
    searching) is a ConfigError naming it; a model's own defaults are not checked."""
    unused, reason = ((SEARCH_ONLY, "does not apply to sampling (`decoding.sampling`): samples are drawn, "
                                    "not searched; drop one of them") if decoding.sampling else
                      (SAMPLING_ONLY, "applies only to sampling; add `decoding.sampling` (this model does not "
                                      "sample by default)"))
    for key in unused:
        if given.get(key) is not None:
            raise ConfigError(f"`decoding.{key}` {reason}")


def _checked(device: str, shortlist_file: str | Path | None, given: dict[str, Any]) -> dict[str, Any]:
    """The overrides with what they imply (`with_implied_shortlist`); fp16 on the CPU is an error (it would run
    as bf16), and so is the ONNX translator's `threads`, which PyTorch's process-wide pool cannot honour per model."""
    if "threads" in given:
        raise TypeError("threads applies to an ONNX folder, whose onnxruntime session has threads of its own; a "
                        "model file runs on PyTorch, whose threads are the process's: torch.set_num_threads(N)")
    if given.get("precision") == "fp16" and resolve_device(device).type != "cuda":
        raise ConfigError("`decoding.precision` fp16 runs on CUDA only; on the CPU use bf16 or fp32")
    return with_implied_shortlist(given, shortlist_file)


def shortlist_by_default(loaded: LoadedModel, device: torch.device, given: dict[str, Any]) -> bool:
    """A model that embeds a shortlist uses it on the CPU unless `shortlist` is given: BLEU within 0.1 of the
    full vocabulary's (docs/benchmarks.md); on a GPU the full output costs less than leaving the CUDA graphs."""
    return given.get("shortlist") is None and device.type == "cpu" and loaded.shortlist_on_cpu


def shortlist_for(loaded: LoadedModel, shortlist_file: str | Path | None = None) -> Shortlist | None:
    """With `decoding.shortlist` on, the one in `shortlist_file` if given, else the one the model embeds."""
    decoding = loaded.config.decoding
    if not decoding.shortlist:
        return None
    if decoding.sampling:
        raise ConfigError("--shortlist does not apply to --sampling: samples must come from the full "
                          "distribution; drop one of them")
    if shortlist_file is not None:
        try:
            arrays = load_shortlist(Path(shortlist_file))
        except (OSError, ValueError, KeyError) as exc:
            raise ShortlistError(f"--shortlist-file {shortlist_file}: not a readable shortlist "
                                 f"({' '.join(str(exc).split())[:200]})") from None
    elif loaded.shortlist is None:
        raise ShortlistError(f"{loaded.path} holds no vocabulary shortlist (its data folder was preprocessed "
                             "without one: by an older nmt, or with data.shortlist_k 0); rerun `nmt preprocess` "
                             "with the same settings and pass its shortlist.npz with --shortlist-file")
    else:
        arrays = loaded.shortlist
    where = str(loaded.path if shortlist_file is None else shortlist_file)
    return Shortlist.from_arrays(arrays, loaded.src_vocab, loaded.tgt_vocab, where, decoding.shortlist_k)
