"""Checks of a model file or checkpoint before anything is built from it.

A file shared by someone else, or damaged on the way, must not reach torch as it is: weights of
another shape or dtype, a tensor view declaring more elements than its bytes hold, NaN weights, a
config describing a model no machine can build, or a section of the wrong type would translate
into garbage, hang, or fail deep inside torch. `load_model` (nmt.modelfile.file) runs these
checks in this order, each raising a one-line `ModelFileError` naming the file and what is wrong,
after the file's checksums (the CRC-32s nmt.modelfile.tensors stores in a format-2 model file; the zip
records' CRC-32s of a format-1 file or checkpoint):

    check_sections   the dictionary's sections have their types (a schema for the metadata)
    check_config     the stored config meets the config's types and bounds (nmt.config)
    expected_weights the weights the config describes (built on the meta device: no memory),
                     refused when their size does not fit this machine's memory
    check_weights    every tensor's name, shape, dtype and storage against them; finite values
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nmt.config import MAX_VOCAB, Config, ConfigError, ModelConfig, memory_bytes, stored_config
from nmt.fs.bounded import file_kind


class ModelFileError(ValueError):
    """A model file or checkpoint that cannot be used: missing, truncated, corrupt or of another format."""


def not_a_file(path: Path, what: str) -> ModelFileError:
    """The error for a `path` that is not a regular file: missing, or named for what it is (a FIFO or a
    device would otherwise be "missing", and reading one waits forever or never ends)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ModelFileError(f"{what} {path} does not exist")
    return ModelFileError(f"{what} {path} is {file_kind(mode)}, not a file; give an nmt model file or checkpoint")


NUMBER = (int, float)
# The card a model file carries (see modelfile.describe): every key optional, but what is there has its type.
CARD_SCHEMA: dict[str, Any] = {
    "languages": {"src": str, "tgt": str},
    "data": {"*": {"pairs": int, "input_pairs": int, "src_tokens": int, "tgt_tokens": int}},
    "data_files": {"*": str},
    "dev": {"bleu": NUMBER, "search": str, "signature": str, "sentences": (int, type(None)), "loss": NUMBER,
            "ppl": NUMBER, "step": int},
    "training": {"step": int, "seconds": NUMBER},
    "averaged_from": [str],
    "exported_from": str,
}
CARD_REQUIRED = {"languages": ("src", "tgt"), "dev": ("bleu", "signature", "step")}
SHORTLIST_SCHEMA: dict[str, Any] = {"targets": Tensor, "frequent": Tensor, "vocab_sha256": str, "score": str,
                                    "pairs": int}
SIDE_SCHEMA: dict[str, Any] = {"spm": (bytes, type(None)), "pieces": [int]}


def _schema_error(value: Any, schema: Any, where: str) -> str | None:
    """Where `value` departs from `schema` (a type or tuple of types, a {key: schema} mapping with "*"
    for any key, or a one-item list for a list of such values), or None."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where} is {type(value).__name__}, not a mapping"
        for key, item in value.items():
            inner = schema.get(key, schema.get("*"))
            if inner is not None and (problem := _schema_error(item, inner, f"{where}.{key}")):
                return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{where} is {type(value).__name__}, not a list"
        if len(value) > MAX_VOCAB:
            return f"{where} has {len(value)} entries, over the bound of {MAX_VOCAB}"
        bad = next((i for i, item in enumerate(value) if _schema_error(item, schema[0], "") is not None), None)
        return None if bad is None else f"{where}[{bad}] is {type(value[bad]).__name__}, not {_names(schema[0])}"
    types = schema if isinstance(schema, tuple) else (schema,)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        return f"{where} is {type(value).__name__}, not {_names(schema)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}, not a finite number"
    return None


def _names(schema: Any) -> str:
    types = schema if isinstance(schema, tuple) else (schema,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def check_sections(path: Path, state: dict[str, Any], kind: str) -> None:
    """The sections of a model file or checkpoint have their types: config, model, tokenizer, card, shortlist,
    dtype (and a checkpoint's vocab entries and step)."""
    problem = None
    if not isinstance(state["config"], dict):
        problem = f"its config is {type(state['config']).__name__}, not a mapping"
    elif not isinstance(state["model"], dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                         for k, v in state["model"].items()):
        problem = "its weights are not a mapping of names to tensors"
    elif state.get("dtype", "fp32") not in ("fp32", "fp16", "bf16"):
        problem = f"its dtype {state.get('dtype')!r} is not one of fp32, fp16, bf16"
    elif "tokenizer" in state:
        problem = _schema_error(state["tokenizer"], {"src": SIDE_SCHEMA, "tgt": SIDE_SCHEMA}, "tokenizer")
    if problem is None and kind == "checkpoint":
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            problem = f"its step {step!r} is not a count of updates"
        elif "tokenizer" not in state:
            problem = _schema_error(state["vocab"], {"*": {"model": str, "pieces": (str, type(None))}}, "vocab")
    if problem is None and state.get("card") is not None:
        problem = _card_error(state["card"])
    if problem is None and state.get("shortlist") is not None:
        problem = _schema_error(state["shortlist"], SHORTLIST_SCHEMA, "shortlist") or _shortlist_error(
            state["shortlist"])
    if problem is not None:
        raise ModelFileError(f"{path}: {problem}; the file is damaged or not written by nmt")


def _card_error(card: Any) -> str | None:
    problem = _schema_error(card, CARD_SCHEMA, "card")
    if problem is None:
        for key, required in CARD_REQUIRED.items():
            missing = [name for name in required if key in card and name not in card[key]]
            if missing:
                return f"card.{key} lacks {', '.join(missing)}"
    return problem


def _shortlist_error(shortlist: dict[str, Any]) -> str | None:
    for key, dims in (("targets", 2), ("frequent", 1)):
        if key not in shortlist:
            return f"shortlist lacks {key}"
        tensor = shortlist[key]
        if tensor.dim() != dims or tensor.dtype.is_floating_point or tensor.dtype.is_complex \
                or tensor.dtype == torch.bool:
            return f"shortlist.{key} is a {tensor.dim()}-D {tensor.dtype} tensor, not {dims}-D integers"
        if problem := _storage_error(tensor, f"shortlist.{key}"):
            return problem
    return None


def check_config(path: Path, raw: dict[str, Any], overrides: dict[str, Any]) -> Config:
    """The stored config with the (already checked) decoding `overrides` applied, held to the config's
    types and bounds."""
    decoding = raw.get("decoding")
    raw = {**raw, "decoding": {**(decoding if isinstance(decoding, dict) else {}), **overrides}} if overrides else raw
    try:
        return stored_config(raw)
    except ConfigError as exc:
        reason = str(exc).replace("`", "")         # a key of the file, not an option the CLI would name for it
        raise ModelFileError(f"{path}: its config is unusable: {reason}") from None


class _NoNormalInit(TorchFunctionMode):
    """Skips `normal_` (nn.Embedding's default init): on the meta device it goes through torch's
    reference implementations, whose first use imports torch._dynamo, 0.7 s of every `nmt translate`."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.init.normal_, Tensor.normal_):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def expected_weights(model: ModelConfig, src_vocab: int, tgt_vocab: int, what: str, copies: int = 2,
                     error: type[ValueError] = ModelFileError) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Name -> (shape, float32) of every weight the model config describes with these vocabulary sizes.

    Raises `error` (naming `what`) when `copies` float32 copies of the parameters (2 to load a
    file; ~4 to train: weights, gradients, Adam's two moments) exceed this machine's memory: checked
    before anything is allocated, so such a model is an error, not minutes of swapping."""
    from nmt.model.seq2seq import Seq2Seq

    try:
        with torch.device("meta"), _NoNormalInit():
            built = Seq2Seq.from_config(model, src_vocab, tgt_vocab, initialize=False)
    except ConfigError as exc:
        raise error(f"{what}: {exc}") from None
    weights = {name: (t.shape, t.dtype) for name, t in built.state_dict().items()}
    parameters = sum(p.numel() for p in built.parameters())
    need, have = parameters * 4 * copies, memory_bytes()
    if need > have:
        raise error(f"{what} describes a model of {parameters:,} parameters ({need / 2**30:.1f} GiB to "
                             f"{'train' if copies > 2 else 'load'}), more than this machine's "
                             f"{have / 2**30:.1f} GiB of memory; check model.* and the vocabulary size")
    return weights


def check_weights(path: Path, weights: dict[str, Tensor], expected: dict[str, tuple[torch.Size, torch.dtype]],
                  dtype: torch.dtype, allow_nonfinite: bool = False) -> None:
    """Every tensor has the name, shape and `dtype` the config describes, a storage that holds its declared
    elements, and (unless `allow_nonfinite`, for inspecting a broken file) only finite values."""
    missing = [name for name in expected if name not in weights]
    extra = [name for name in weights if name not in expected]
    if missing or extra:
        parts = ([f"lacks weight {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")]
                 if missing else []) + ([f"has unknown weight {extra[0]}"] if extra else [])
        raise ModelFileError(f"{path}: {' and '.join(parts)} for the model its config describes")
    for name, (shape, _) in expected.items():
        tensor = weights[name]
        if tensor.shape != shape:
            raise ModelFileError(f"{path}: weight {name} has shape {tuple(tensor.shape)}, but its config "
                                 f"describes {tuple(shape)}")
        if tensor.dtype != dtype:
            raise ModelFileError(f"{path}: weight {name} is {tensor.dtype}, but the file declares "
                                 f"{str(dtype).removeprefix('torch.')} weights")
        if problem := _storage_error(tensor, f"weight {name}"):
            raise ModelFileError(f"{path}: {problem}; the file is damaged or not written by nmt")
    if allow_nonfinite:
        return
    for name, tensor in weights.items():
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ModelFileError(f"{path}: weight {name} holds {bad} non-finite values (NaN or inf) of "
                                 f"{tensor.numel()}; the model is broken (`nmt info --allow-nonfinite` shows it)")


def _storage_error(tensor: Tensor, what: str) -> str | None:
    """What is wrong with a view that declares more elements than its stored bytes hold (e.g. 10^12 elements of stride 0
    over a few bytes: every use of it would allocate terabytes)."""
    elements = tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)
    reach = tensor.storage_offset() + sum((size - 1) * stride for size, stride in
                                          zip(tensor.shape, tensor.stride(), strict=True)) + 1
    if tensor.numel() and (tensor.numel() > elements or reach > elements or min(tensor.stride(), default=1) < 0):
        return f"{what} declares {tensor.numel():,} elements but its file record holds {elements:,}"
    return None
