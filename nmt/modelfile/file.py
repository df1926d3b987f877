"""Model files: one self-contained file with a trained model and everything needed to use it.

One dictionary: kind "nmt-model", format, nmt_version, config, model (the state dict in `dtype`), dtype,
tokenizer {"src"|"tgt": {"spm": SentencePiece bytes (None for a joint tgt), "pieces": side id -> piece id}},
card (languages, data, dev BLEU with its signature: see `describe`) and an optional vocabulary shortlist.
Format 2 stores it as safetensors (nmt.modelfile.tensors); format 1 `torch.save`d it and still loads. A training
checkpoint (nmt.train.checkpoint) is format 1 without `kind`, plus the training state; `load_model` reads both.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from nmt import __version__
from nmt.config import Config, check_decoding, check_decoding_overrides
from nmt.data.tokenizer import Vocab
from nmt.fs.bounded import loads_json, read_json
from nmt.model.seq2seq import Seq2Seq
from nmt.modelfile.check import (
    check_config,
    check_sections,
    check_weights,
    corrupt,
    damaged,
    expected_weights,
)
from nmt.modelfile.errors import ModelFileError, not_a_file
from nmt.modelfile.hub import hub_name, is_hub_name, locate_model
from nmt.modelfile.tensors import write_model_file

MODEL_KIND = "nmt-model"
MODEL_FORMAT = 2                # safetensors (nmt.modelfile.tensors)
LEGACY_MODEL_FORMAT = 1         # the torch.save dictionary; still read
CHECKPOINT_FORMAT = 1           # the model part of a training checkpoint (nmt.train.checkpoint)
CHECKPOINT_KEYS = ("format", "nmt_version", "config", "vocab", "model", "step")
MODEL_KEYS = ("kind", "format", "nmt_version", "config", "model", "dtype", "tokenizer", "card")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class LoadedModel:
    """A model file or checkpoint, read and checked: config, weights, vocabularies and card."""

    path: Path
    kind: Literal["model", "checkpoint"]
    config: Config
    weights: dict[str, Tensor]
    src_vocab: Vocab
    tgt_vocab: Vocab
    card: dict[str, Any]
    dtype: str = "fp32"
    shortlist: dict[str, Any] | None = None     # embedded vocabulary shortlist, if the data folder had one

    def build(self) -> Seq2Seq:
        """The model with these weights (float32 parameters whatever the stored dtype), in eval mode."""
        model = Seq2Seq.from_config(self.config.model, len(self.src_vocab), len(self.tgt_vocab), initialize=False)
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as exc:
            raise ModelFileError(f"{self.path}: the weights do not fit its model config ({str(exc)[:200]})") from None
        return model.eval()

    @property
    def shortlist_on_cpu(self) -> bool:
        """CPU decoding uses an embedded shortlist by default, unless the model samples (full vocabulary)."""
        return self.shortlist is not None and not self.config.decoding.sampling

    @property
    def languages(self) -> dict[str, str]:
        return self.card.get("languages") or {"src": self.config.data.src_lang, "tgt": self.config.data.tgt_lang}


def read_file(path: str | Path, what: str, mmap: bool = False) -> dict[str, Any]:
    """`torch.load(weights_only=True)`, failures a `ModelFileError`; `mmap` leaves unused tensors (a checkpoint's
    optimiser state, two thirds of it) unread."""
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, what)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for truncated or garbled zip archives
        raise corrupt(what, path, exc) from None
    if not isinstance(state, dict):
        raise ModelFileError(f"{path} is not an nmt model file or checkpoint")
    return state


def load_model(path: str | Path, decoding_overrides: dict[str, Any] | None = None,
               allow_nonfinite: bool = False) -> LoadedModel:
    """A model file or training checkpoint, checked (nmt.modelfile.check) before anything is built from it;
    `decoding_overrides` are checked like the YAML file. Raises a one-line `ModelFileError` (`ConfigError`)."""
    path = locate_model(path)
    state, pickled = read_state(path)
    kind: Literal["model", "checkpoint"] = "model" if state.get("kind") == MODEL_KIND else "checkpoint"
    if kind == "model":
        check_keys(path, state, kind, MODEL_KEYS, LEGACY_MODEL_FORMAT if pickled else MODEL_FORMAT)
    else:
        check_keys(path, state, kind, CHECKPOINT_KEYS, CHECKPOINT_FORMAT)
    if pickled:                                   # a safetensors file's checksums were checked as it was read
        check_checksums(path, "model file" if kind == "model" else "checkpoint")
    return checked_model(path, state, kind, decoding_overrides, allow_nonfinite)


def checked_model(path: Path, state: dict[str, Any], kind: Literal["model", "checkpoint"] = "checkpoint",
                  decoding_overrides: dict[str, Any] | None = None, allow_nonfinite: bool = False) -> LoadedModel:
    """`load_model` of a dictionary already read, its keys and checksums checked (checkpoints to average)."""
    check_sections(path, state, kind)
    overrides = {k: v for k, v in (decoding_overrides or {}).items() if v is not None}
    check_decoding_overrides(overrides)
    config = check_config(path, state["config"], overrides)
    if overrides.keys() & {"min_len", "max_len"}:     # a stored conflict alone: the cap wins (nmt.decode.search)
        check_decoding(config.decoding)
    if "tokenizer" not in state:
        raise ModelFileError(f"checkpoint {path} embeds no tokenizer: nmt wrote such checkpoints only before "
                             "model files existed, and no longer reads them")
    src_vocab, tgt_vocab = vocabs_from_tokenizer(path, state["tokenizer"])
    dtype = state.get("dtype", "fp32")
    weights = expected_weights(config.model, len(src_vocab), len(tgt_vocab), str(path))
    order = {name: i for i, name in enumerate(weights)}   # the model's order, not the file's (safetensors sorts)
    state["model"] = dict(sorted(state["model"].items(), key=lambda item: order.get(item[0], len(order))))
    check_weights(path, state["model"], weights, DTYPES[dtype], allow_nonfinite)
    card = dict(state.get("card") or {})
    return LoadedModel(path, kind, config, state["model"], src_vocab, tgt_vocab, card, dtype, state.get("shortlist"))


def read_state(path: str | Path) -> tuple[dict[str, Any], bool]:
    """The dictionary of a model file or checkpoint, and whether it was pickled (a torch.save zip: format 1 or a
    checkpoint, whose zip checksums are still to check)."""
    path = Path(path)
    what = "checkpoint" if path.suffix == ".pt" else "model file"
    if not path.is_file():
        raise not_a_file(path, what)
    try:
        with open(path, "rb") as handle:
            pickled = handle.read(4) == b"PK\x03\x04"
    except OSError as exc:
        raise ModelFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if pickled:
        return read_file(path, what, mmap=True), True
    from nmt.modelfile.tensors import read_state as read_safetensors

    return read_safetensors(path, what), False


def check_checksums(path: Path, what: str = "model file") -> None:
    """Refuse a file damaged since it was written: torch.load skips the CRC-32 torch.save stores for every
    record, so damaged weights would translate into garbage. ~25 ms per 40 MB."""
    try:
        with zipfile.ZipFile(path) as archive:
            record = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error) as exc:
        raise ModelFileError(f"{what} {path} is truncated or corrupt ({exc})") from None
    if record is not None:
        raise damaged(what, path, f"its record {record} fails its checksum")


def check_keys(path: Path, state: dict[str, Any], kind: str, keys: tuple[str, ...], expected: int) -> None:
    name = "model file" if kind == "model" else "checkpoint"
    if any(key not in state for key in keys):
        raise ModelFileError(f"{path} is not an nmt model file or checkpoint (missing keys)")
    if state["format"] != expected:
        raise ModelFileError(f"{name} {path} has format {state['format']} (written by nmt {state['nmt_version']}); "
                             f"this nmt {__version__} reads format {expected}")


def embed_tokenizer(src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, Any]:
    src_proto, tgt_proto = src_vocab.sp.serialized_model_proto(), tgt_vocab.sp.serialized_model_proto()
    return {"src": {"spm": src_proto, "pieces": src_vocab.pieces.tolist()},
            "tgt": {"spm": None if tgt_proto == src_proto else tgt_proto, "pieces": tgt_vocab.pieces.tolist()}}


def embed_shortlist(arrays: dict[str, Any]) -> dict[str, Any]:
    """A shortlist's arrays as tensors, which `torch.load(weights_only=True)` reads back."""
    return {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value for key, value in arrays.items()}


def vocabs_from_tokenizer(path: Path, tokenizer: dict[str, Any]) -> tuple[Vocab, Vocab]:
    vocabs = []
    for side in ("src", "tgt"):
        try:
            entry = tokenizer[side]
            proto = entry["spm"] if entry["spm"] is not None else tokenizer["src"]["spm"]
            vocabs.append(Vocab(bytes(proto), entry["pieces"]))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, RuntimeError, OSError) as exc:
            raise ModelFileError(f"{path}: the embedded {side} tokenizer is unusable ({str(exc)[:200]})") from None
    return vocabs[0], vocabs[1]


def export_model(source: str | Path, output: str | Path, dtype: str = "fp32",
                 quantize: str | None = None, replace: bool = True) -> dict[str, Any]:
    """Write the weights (no optimiser state) of a checkpoint or model file as a format-2 model file in `dtype`;
    `quantize` becomes its `decoding.quantize` default (int8 weights are built at load); `replace=False`: a
    FileExistsError if `output` exists by the end. Returns what was written."""
    if dtype not in DTYPES:
        raise ModelFileError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    loaded = load_model(source, {"quantize": quantize})
    weights = {name: (t.to(DTYPES[dtype]) if t.is_floating_point() else t).contiguous().clone()
               for name, t in loaded.weights.items()}
    loaded.build()                            # refuse weights that do not fit the config before writing
    card = {**loaded.card, "exported_from": hub_name(source) if is_hub_name(source) else Path(source).name}
    payload = {"kind": MODEL_KIND, "format": MODEL_FORMAT, "nmt_version": __version__,
               "config": loaded.config.to_dict(), "model": weights, "dtype": dtype,
               "tokenizer": embed_tokenizer(loaded.src_vocab, loaded.tgt_vocab), "card": card}
    if loaded.shortlist is not None:
        payload["shortlist"] = embed_shortlist(loaded.shortlist)
    write_model_file(payload, output, replace)
    return payload


def run_folder_card(folder: Path, step: int, val_max_sentences: int = 0) -> dict[str, Any]:
    """A run folder's card for the model at `step`: its data and, if validated there, its dev scores
    (`val_max_sentences`: how many dev sentences validation scored, 0 = all)."""
    card: dict[str, Any] = {"training": {"step": step}}
    manifest_path = folder / "data_manifest.json"
    if manifest_path.is_file():
        try:
            manifest = read_json(manifest_path)
            card["languages"] = dict(manifest["langs"])
            card["data"] = {split: {k: entry[k] for k in ("pairs", "input_pairs", "src_tokens", "tgt_tokens")
                                    if k in entry}
                            for split, entry in manifest["splits"].items()}
            settings = manifest.get("settings", {})
            card["data_files"] = {split: Path(settings[split]).name for split in ("train", "dev", "test")
                                  if settings.get(split)}
        except (ValueError, KeyError, TypeError, AttributeError):
            pass                              # a damaged manifest only costs the card its data section
    validation = _validation_at(folder / "metrics.jsonl", step)
    if validation is not None:
        dev_pairs = card.get("data", {}).get("dev", {}).get("pairs")
        sentences = min(val_max_sentences, dev_pairs or val_max_sentences) if val_max_sentences else dev_pairs
        card["dev"] = {"bleu": round(validation["bleu"], 2), "search": "greedy",
                       "signature": validation["bleu_signature"], "sentences": sentences,
                       **{k: round(validation[k], 4) for k in ("loss", "ppl") if k in validation},
                       "step": step}
        if "wall_time" in validation:
            card["training"]["seconds"] = round(validation["wall_time"], 1)
    return card


def _validation_at(metrics: Path, step: int) -> dict[str, Any] | None:
    if not metrics.is_file():
        return None
    found = None
    with open(metrics, encoding="utf-8") as handle:
        for line in handle:
            try:
                event = loads_json(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "validation" and event.get("step") == step \
                    and isinstance(event.get("bleu"), (int, float)) and isinstance(event.get("bleu_signature"), str):
                found = event
    return found
