"""The PyTorch Translator's API (nmt.decode.translator) over an exported ONNX folder, no torch, with the same
rules: one result per line, empty lines untranslated, long ones truncated with a warning, token-budget batches,
n-best lists, attention, prefixes, the shortlist. Sampling, `score` and ensembles need the PyTorch model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import (
    DECODING_BATCH_TOKENS,
    ConfigError,
    DecodingConfig,
    check_decoding,
    check_decoding_overrides,
    with_implied_shortlist,
)
from nmt.config_check import build
from nmt.data.special import PAD
from nmt.data.tokenizer import Vocab
from nmt.decode.settings import SearchSettings
from nmt.decode.streaming import Translates
from nmt.modelfile.onnx_folder import MANIFEST
from nmt.runtime.folder import OnnxFolderError, read_manifest
from nmt.runtime.search import Hypothesis, beam_search, greedy_search
from nmt.runtime.session import OnnxModel, Shortlist

__all__ = ["Translator"]
NOT_HERE = ("sampling", "temperature", "top_k", "top_p", "seed", "cuda_graphs")   # PyTorch-only keys
MAX_THREADS = 1024            # as --threads


class Translator(Translates):
    """An exported model's sessions, tokenizers and decoding settings."""

    samples = False                                     # sampling needs the PyTorch model file

    def __init__(self, model: OnnxModel, src_vocab: Vocab, tgt_vocab: Vocab, decoding: DecodingConfig,
                 shortlist: Shortlist | None = None, languages: dict[str, str] | None = None) -> None:
        self.model, self.src_vocab, self.tgt_vocab, self.decoding = model, src_vocab, tgt_vocab, decoding
        self.shortlist, self.languages = shortlist, languages or {}
        self.card = model.manifest.card

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", shortlist_file: str | Path | None = None,
             threads: int = 0, **decoding_overrides: Any) -> Translator:
        """As the PyTorch Translator.load on a CPU (the shortlist on by default where it embeds one).
        Raises OnnxFolderError or ConfigError with a one-line message."""
        if device not in ("auto", "cpu"):
            raise ConfigError(f"--device {device}: an ONNX model folder runs on the CPU (onnxruntime); "
                              "use the PyTorch model file for a GPU")
        if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= MAX_THREADS:
            raise ValueError(f"threads must be an integer from 0 (onnxruntime's default) to {MAX_THREADS}, "
                             f"got {threads!r}")
        given = {k: v for k, v in decoding_overrides.items() if v is not None}
        check_decoding_overrides(given)
        for key in NOT_HERE:
            if given.get(key) not in (None, False, "none", "fp32"):
                raise ConfigError(f"`decoding.{key}` does not apply to an ONNX model folder; "
                                  "use the PyTorch model file for it")
        if given.get("precision") not in (None, "auto", "fp32"):
            raise ConfigError(f"`decoding.precision` {given['precision']} does not apply to an ONNX model folder: "
                              "its precision was chosen by `nmt export --quantize`")
        manifest = read_manifest(path)
        own = "int8" if manifest.precision == "int8" else "none"     # the --quantize that exported it
        if given.get("quantize", own) != own:
            raise ConfigError(f"`decoding.quantize` {given['quantize']} does not apply to this {manifest.precision} "
                              "ONNX model folder: its precision was chosen by `nmt export --quantize`")
        stored = {k: v for k, v in manifest.decoding.items() if k in DecodingConfig.__dataclass_fields__}
        try:                                # the overrides are checked: a problem is the folder's
            decoding = build(DecodingConfig, {**stored, **given}, "decoding.", None, stored=True)
        except ConfigError as exc:
            raise OnnxFolderError(f"{Path(path) / MANIFEST}: {exc}; "
                                  "export the model again") from None
        check_decoding(decoding)
        if decoding.sampling:
            raise ConfigError(f"{path}: the model samples by default (`decoding.sampling`), which needs the PyTorch "
                              "model file; an ONNX folder searches (greedy or beam)")
        if shortlist_file is not None:
            raise ConfigError("--shortlist-file does not apply to an ONNX model folder: it holds the shortlist "
                              "of the model it was exported from")
        given = with_implied_shortlist(given)
        default = bool(decoding.shortlist or (manifest.shortlist or {}).get("default"))   # as the PyTorch CPU path
        decoding.shortlist = bool(given.get("shortlist", default))
        if decoding.shortlist and manifest.shortlist is None:
            if given.get("shortlist"):
                raise OnnxFolderError(f"{path} holds no vocabulary shortlist: the model it was exported from "
                                      "embeds none; drop --shortlist")
            decoding.shortlist = False
        shortlist = Shortlist.load(manifest, decoding.shortlist_k) if decoding.shortlist else None
        try:                                                  # each side with its pieces (side id -> SentencePiece id)
            src_vocab = Vocab(manifest.path(manifest.src_spm), manifest.pieces.get("src"))
            tgt_vocab = Vocab(manifest.path(manifest.tgt_spm), manifest.pieces.get("tgt"))
        except (OSError, RuntimeError, ValueError) as exc:
            raise OnnxFolderError(f"{manifest.folder}: a SentencePiece model cannot be read ({exc})") from None
        if len(tgt_vocab) != manifest.vocab_size:
            raise OnnxFolderError(f"{manifest.folder}: {manifest.tgt_spm} has {len(tgt_vocab)} pieces, the graphs "
                                  f"{manifest.vocab_size}; export the model again")
        return cls(OnnxModel(manifest, threads), src_vocab, tgt_vocab, decoding, shortlist, manifest.languages)

    def _search(self, src: np.ndarray, n_best: int, return_attention: bool,  # type: ignore[override]
                d: DecodingConfig, prefix: np.ndarray | None) -> list[list[Hypothesis]]:   # numpy attention
        src_lengths = (src != PAD).sum(1)
        model: Any = self.model                              # an OnnxModel: a StepModel over its Tensors
        if d.shortlist and self.shortlist is not None:
            keep = self.shortlist.select(src, prefix)                           # (subset,) target ids
            model = self.model.with_output_subset(keep, *self.shortlist.output)
            prefix = np.searchsorted(keep, prefix) if prefix is not None else None
        settings = SearchSettings.of(d, n_best, return_attention)
        if settings.greedy:
            return [[h] for h in greedy_search(model, src, src_lengths, settings, prefix)]
        return beam_search(model, src, src_lengths, settings, prefix)

    def batch_tokens(self, scoring: bool = False) -> int:
        return self.decoding.batch_tokens or DECODING_BATCH_TOKENS["cpu"]

    def score(self, sources: list[str], targets: list[str], first_line: int = 1) -> list[tuple[float, float, int]]:
        raise ConfigError("scoring given translations needs the PyTorch model file; an ONNX folder only translates")



def folder_inputs(folder: str | Path, option: str = "--model") -> list[tuple[str, Path]]:
    """The files of an exported folder as inputs, for the output checks (no output may overwrite one)."""
    files = sorted(file for file in Path(folder).iterdir() if file.is_file())
    return [(f"a file of {option} {folder} ({file})", file) for file in files]

