"""Model files: one self-contained file with a trained model and everything needed to use it.

A model file (`nmt export RUN/best.pt -o model.nmt`) holds one dictionary:

    kind         "nmt-model"
    format       MODEL_FORMAT; a reader refuses any other number (LEGACY_MODEL_FORMAT: see below)
    nmt_version  the nmt that wrote it
    config       the full config the model was trained with (model, decoding, data languages, ...)
    model        the state dict, without optimiser state, in `dtype`
    dtype        "fp32", "fp16" or "bf16" (weights are stored in it; translation computes in fp32
                 or the decoding precision, as with a checkpoint)
    tokenizer    {"src"|"tgt": {"spm": SentencePiece model bytes, "pieces": side id -> piece id}};
                 "spm" of tgt is None when it is the same (joint) model as src
    card         what a user of a shared model needs: languages, data, dev BLEU with its sacreBLEU
                 signature, training steps (see `describe`)
    shortlist    (optional) the vocabulary shortlist of the data folder (nmt.data.shortlist):
                 {"targets", "frequent": int tensors, "vocab_sha256", "score": str, "pairs": int}

Format 2 stores it as safetensors with JSON metadata (nmt.modelfile.tensors): nothing is unpickled to
read it, and it is the `model.safetensors` of a Hugging Face folder (nmt.modelfile.hf). Format 1,
written by nmt before, is the dictionary `torch.save`d, read with `torch.load(weights_only=True)`;
such files still load. Where a model lives (a file, a folder, hf://org/name): nmt.modelfile.hub.

A training checkpoint (nmt.train.checkpoint) is the format-1 dictionary without `kind`, with the
training state on top (optimiser, schedule, RNG, data cursor), and embeds the tokenizer and card
too. `load_model` reads either, so every command that takes a checkpoint takes a model file.
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
    ModelFileError,
    check_config,
    check_sections,
    check_weights,
    expected_weights,
    not_a_file,
)
from nmt.modelfile.hub import hub_name, is_hub_name, locate_model
from nmt.modelfile.tensors import is_pickled, write_model_file

MODEL_KIND = "nmt-model"
MODEL_FORMAT = 2                # safetensors (nmt.modelfile.tensors)
LEGACY_MODEL_FORMAT = 1         # the torch.save dictionary nmt wrote before; still read
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
        """Whether CPU decoding uses the embedded shortlist unless told otherwise: a model that embeds one
        and searches (sampling keeps the full vocabulary)."""
        return self.shortlist is not None and not self.config.decoding.sampling

    @property
    def languages(self) -> dict[str, str]:
        """{"src": code, "tgt": code}: the card's, else the config's."""
        return self.card.get("languages") or {"src": self.config.data.src_lang, "tgt": self.config.data.tgt_lang}


def read_file(path: str | Path, what: str, mmap: bool = False) -> dict[str, Any]:
    """`torch.load(weights_only=True)` with every failure a `ModelFileError` naming the file.

    With `mmap`, tensors are read from the file only when used: translation never touches the
    optimiser state of a checkpoint, two thirds of it.
    """
    path = Path(path)
    if not path.is_file():
        raise not_a_file(path, what)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for truncated or garbled zip archives
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFileError(f"{what} {path} is truncated or corrupt ({reason[:200]})") from None
    if not isinstance(state, dict):
        raise ModelFileError(f"{path} is not an nmt model file or checkpoint")
    return state


def load_model(path: str | Path, decoding_overrides: dict[str, Any] | None = None,
               allow_nonfinite: bool = False) -> LoadedModel:
    """Read a model file or a training checkpoint; `decoding_overrides` are checked like the YAML file.

    The file is checked before anything is built from it (nmt.modelfile.check): checksums, the types
    of its sections, its config's bounds, every weight's name, shape and dtype, finite values (unless
    `allow_nonfinite`, for inspecting a broken file). Raises `ModelFileError` (or `ConfigError` for a
    bad override) with a one-line message.
    """
    path = locate_model(path)
    state, pickled = read_state(path)
    kind: Literal["model", "checkpoint"]
    keys: tuple[str, ...]
    if state.get("kind") == MODEL_KIND:
        kind, keys, expected = "model", MODEL_KEYS, LEGACY_MODEL_FORMAT if pickled else MODEL_FORMAT
    else:
        kind, keys, expected = "checkpoint", CHECKPOINT_KEYS, CHECKPOINT_FORMAT
    check_keys(path, state, kind, keys, expected)
    if pickled:                                   # a safetensors file's checksums were checked as it was read
        check_checksums(path, "model file" if kind == "model" else "checkpoint")
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
    """The dictionary of a model file of either format or of a checkpoint, and whether it was pickled
    (format 1 or a checkpoint: its zip checksums are still to check). Nothing is checked beyond reading."""
    path = Path(path)
    what = "checkpoint" if path.suffix == ".pt" else "model file"
    if not path.is_file():
        raise not_a_file(path, what)
    try:
        pickled = is_pickled(path)
    except OSError as exc:
        raise ModelFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if pickled:
        return read_file(path, what, mmap=True), True
    from nmt.modelfile.tensors import read_state as read_safetensors

    return read_safetensors(path, what), False


def check_checksums(path: Path, what: str = "model file") -> None:
    """Refuse a model file or checkpoint whose bytes changed since it was written (a bad copy, a failing
    disk): torch.load does not check the CRC-32 that torch.save stores for every record, so damaged
    weights would translate into garbage (or be exported into a file with valid checksums). Reading the
    whole file costs ~25 ms per 40 MB."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error) as exc:
        raise ModelFileError(f"{what} {path} is truncated or corrupt ({exc})") from None
    if damaged is not None:
        raise ModelFileError(f"{what} {path} is damaged: its record {damaged} fails its checksum; "
                             "copy or export it again")


def check_keys(path: Path, state: dict[str, Any], kind: str, keys: tuple[str, ...], expected: int) -> None:
    """Refuse a dictionary without the keys of its kind, or with another format number."""
    name = "model file" if kind == "model" else "checkpoint"
    if any(key not in state for key in keys):
        raise ModelFileError(f"{path} is not an nmt model file or checkpoint (missing keys)")
    if state["format"] != expected:
        raise ModelFileError(f"{name} {path} has format {state['format']} (written by nmt {state['nmt_version']}); "
                             f"this nmt {__version__} reads format {expected}")


# ---------------------------------------------------------------------------------------------
# Tokenizers inside the file


def embed_tokenizer(src_vocab: Vocab, tgt_vocab: Vocab) -> dict[str, Any]:
    """Both vocabularies as a model file embeds them: SentencePiece model bytes (a joint model once)
    and each side's pieces."""
    src_proto, tgt_proto = src_vocab.sp.serialized_model_proto(), tgt_vocab.sp.serialized_model_proto()
    return {"src": {"spm": src_proto, "pieces": src_vocab.pieces.tolist()},
            "tgt": {"spm": None if tgt_proto == src_proto else tgt_proto, "pieces": tgt_vocab.pieces.tolist()}}


def embed_shortlist(arrays: dict[str, Any]) -> dict[str, Any]:
    """A shortlist (`nmt.data.shortlist.load_shortlist`) as a file embeds it: arrays become tensors,
    which `torch.load(weights_only=True)` reads back."""
    return {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value for key, value in arrays.items()}


def vocabs_from_tokenizer(path: Path, tokenizer: dict[str, Any]) -> tuple[Vocab, Vocab]:
    """The (source, target) vocabularies of an embedded tokenizer."""
    vocabs = []
    for side in ("src", "tgt"):
        try:
            entry = tokenizer[side]
            proto = entry["spm"] if entry["spm"] is not None else tokenizer["src"]["spm"]
            vocabs.append(Vocab(bytes(proto), entry["pieces"]))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, RuntimeError, OSError) as exc:
            raise ModelFileError(f"{path}: the embedded {side} tokenizer is unusable ({str(exc)[:200]})") from None
    return vocabs[0], vocabs[1]


# ---------------------------------------------------------------------------------------------
# Writing a model file


def export_model(source: str | Path, output: str | Path, dtype: str = "fp32",
                 quantize: str | None = None) -> dict[str, Any]:
    """Write the model of a checkpoint (or another model file) as a model file (format 2, safetensors);
    returns what was written.

    Only the weights travel: no optimiser state. Floating-point weights are stored in `dtype`.
    `quantize` ("none" or "int8") becomes the file's `decoding.quantize` default: int8 weights are
    built from the stored ones when the file loads (in milliseconds), so the file stays one format.
    """
    if dtype not in DTYPES:
        raise ModelFileError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    loaded = load_model(source, {"quantize": quantize})
    weights = {name: (t.to(DTYPES[dtype]) if t.is_floating_point() else t).contiguous().clone()
               for name, t in loaded.weights.items()}
    loaded.build()                            # refuse weights that do not fit the config before writing
    card = {**loaded.card, "exported_from": hub_name(source) if is_hub_name(source) else Path(source).name}
    payload = {
        "kind": MODEL_KIND,
        "format": MODEL_FORMAT,
        "nmt_version": __version__,
        "config": loaded.config.to_dict(),
        "model": weights,
        "dtype": dtype,
        "tokenizer": embed_tokenizer(loaded.src_vocab, loaded.tgt_vocab),
        "card": card,
    }
    if loaded.shortlist is not None:
        payload["shortlist"] = embed_shortlist(loaded.shortlist)
    write_model_file(payload, output)
    return payload


def run_folder_card(folder: Path, step: int, val_max_sentences: int = 0) -> dict[str, Any]:
    """What a run folder says about the model at `step`: its data and, if validated there, its dev scores.

    val_max_sentences: training.val_max_sentences, how many dev sentences validation scored (0 = all).
    """
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
    """The last validation event logged at `step` in a run's metrics.jsonl, if any."""
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
