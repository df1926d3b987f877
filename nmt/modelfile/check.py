"""Checks of a model file or checkpoint before anything is built from it: a shared or damaged file must not
reach torch (weights of another shape or dtype, views larger than their bytes, NaN, a config no machine can build).
After the checksums, `load_model` runs check_sections, check_config, expected_weights (on the meta device: no
memory) and check_weights, each raising a one-line `ModelFileError` naming the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nmt.config import MAX_VOCAB, Config, ConfigError, ModelConfig, memory_bytes, stored_config
from nmt.modelfile.errors import ModelFileError


def corrupt(what: str, path: Path, exc: Exception) -> ModelFileError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ModelFileError(f"{what} {path} is truncated or corrupt ({reason[:200]})")


def damaged(what: str, path: Path, problem: str) -> ModelFileError:
    return ModelFileError(f"{what} {path} is damaged: {problem}; copy or export it again")


NUMBER = (int, float)
# The card (modelfile.card.describe): every key optional, but what is there has its type.
CARD_SCHEMA: dict[str, Any] = {
    "languages": {"src": str, "tgt": str}, "data_files": {"*": str},
    "data": {"*": {"pairs": int, "input_pairs": int, "src_tokens": int, "tgt_tokens": int}},
    "dev": {"bleu": NUMBER, "search": str, "signature": str, "sentences": (int, type(None)), "loss": NUMBER,
            "ppl": NUMBER, "step": int},
    "training": {"step": int, "seconds": NUMBER}, "averaged_from": [str], "exported_from": str}
CARD_REQUIRED = {"languages": ("src", "tgt"), "dev": ("bleu", "signature", "step")}
SHORTLIST_SCHEMA: dict[str, Any] = {"targets": Tensor, "frequent": Tensor, "vocab_sha256": str, "score": str,
                                    "pairs": int}
SIDE_SCHEMA: dict[str, Any] = {"spm": (bytes, type(None)), "pieces": [int]}


def _schema_error(value: Any, schema: Any, where: str) -> str | None:
    """Where `value` departs from `schema` (types, {key: schema} with "*" for any key, [schema]), or None."""
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
    if problem is None and state.get("card") is not None:
        problem = _card_error(state["card"])
    if problem is None and state.get("shortlist") is not None:
        problem = _schema_error(state["shortlist"], SHORTLIST_SCHEMA, "shortlist") or _shortlist_error(
            state["shortlist"])
    if problem is not None:
        raise ModelFileError(f"{path}: {problem}; the file is damaged or not written by nmt")


def _card_error(card: Any) -> str | None:
    if problem := _schema_error(card, CARD_SCHEMA, "card"):
        return problem
    for key, names in CARD_REQUIRED.items():
        if missing := [name for name in names if key in card and name not in card[key]]:
            return f"card.{key} lacks {', '.join(missing)}"
    return None


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
    """The stored config with the (already checked) decoding `overrides`, held to the config's bounds."""
    decoding = raw.get("decoding")
    raw = {**raw, "decoding": {**(decoding if isinstance(decoding, dict) else {}), **overrides}} if overrides else raw
    try:
        return stored_config(raw)
    except ConfigError as exc:
        raise ModelFileError(f"{path}: its config is unusable: {exc}") from None


class _NoNormalInit(TorchFunctionMode):
    """Skips `normal_` (nn.Embedding's init): on the meta device it imports torch._dynamo, 0.7 s of a translate."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.init.normal_, Tensor.normal_):
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def expected_weights(model: ModelConfig, src_vocab: int, tgt_vocab: int, what: str, copies: int = 2,
                     error: type[ValueError] = ModelFileError) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Name -> (shape, float32) of every weight the config describes. Raises `error` (naming `what`) when `copies`
    float32 copies (2 to load; ~4 to train) exceed this machine's memory: an error, not minutes of swapping."""
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
    """Names, shapes, `dtype` and storage as `expected`; finite values unless `allow_nonfinite` (`nmt info`)."""
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
    for name, tensor in [] if allow_nonfinite else weights.items():
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ModelFileError(f"{path}: weight {name} holds {bad} non-finite values (NaN or inf) of "
                                 f"{tensor.numel()}; the model is broken (`nmt info --allow-nonfinite` shows it)")


def _storage_error(tensor: Tensor, what: str) -> str | None:
    """A view declaring more elements than its bytes hold (10^12 of stride 0 would allocate terabytes), or None."""
    elements = tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)
    reach = tensor.storage_offset() + sum((size - 1) * stride for size, stride in
                                          zip(tensor.shape, tensor.stride(), strict=True)) + 1
    if tensor.numel() and (tensor.numel() > elements or reach > elements or min(tensor.stride(), default=1) < 0):
        return f"{what} declares {tensor.numel():,} elements but its file record holds {elements:,}"
    return None
