"""The model file (format 2) as safetensors: weights plus nmt.tokenizer.* and nmt.shortlist.* tensors, and
str metadata ("format": "pt" for transformers; nmt.kind, format, version, dtype; nmt.config, card, shortlist as
JSON). Reading it unpickles nothing; nmt.checksums holds CRC-32s of every tensor and the metadata, which
safetensors lacks. `read_state` returns the format-1 dictionary, so nmt.modelfile.check serves both.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt.fs.bounded import loads_json
from nmt.fs.folders import atomic_write
from nmt.modelfile.check import ModelFileError, corrupt, damaged

PREFIX = "nmt."
SIDES = ("src", "tgt")
SHORTLIST_TENSORS = ("targets", "frequent")
META_KEYS = ("nmt.kind", "nmt.format", "nmt.version", "nmt.dtype", "nmt.config", "nmt.card")


def _crc(tensor: Tensor) -> int:
    return zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy().data)


def _metadata_crc(metadata: dict[str, str]) -> int:
    crc = 0
    for key in sorted(metadata):
        if key != "nmt.checksums":
            crc = zlib.crc32(f"{key}\0{metadata[key]}\0".encode(), crc)
    return crc


def encode(payload: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    if clash := next((name for name in payload["model"] if name.startswith(PREFIX)), None):
        raise ModelFileError(f"weight name {clash} clashes with nmt's own tensors ({PREFIX}*)")
    tensors = {name: tensor.contiguous() for name, tensor in payload["model"].items()}
    for side in SIDES:
        entry = payload["tokenizer"][side]
        if entry["spm"] is not None:
            tensors[f"nmt.tokenizer.{side}.spm"] = torch.frombuffer(bytearray(entry["spm"]), dtype=torch.uint8)
        tensors[f"nmt.tokenizer.{side}.pieces"] = torch.tensor(entry["pieces"], dtype=torch.int32)
    metadata = {"format": "pt", "nmt.kind": str(payload["kind"]), "nmt.format": str(payload["format"]),
                "nmt.version": str(payload["nmt_version"]), "nmt.dtype": str(payload["dtype"]),
                "nmt.config": json.dumps(payload["config"]), "nmt.card": json.dumps(payload["card"])}
    shortlist = payload.get("shortlist")
    if shortlist is not None:
        tensors.update({f"nmt.shortlist.{key}": shortlist[key].contiguous() for key in SHORTLIST_TENSORS})
        metadata["nmt.shortlist"] = json.dumps({k: v for k, v in shortlist.items() if k not in SHORTLIST_TENSORS})
    metadata["nmt.checksums"] = json.dumps({"metadata": _metadata_crc(metadata),
                                            "tensors": {name: _crc(t) for name, t in sorted(tensors.items())}})
    return save(tensors, metadata)


def write_model_file(payload: dict[str, Any], path: str | Path, replace: bool = True) -> None:
    data = encode(payload)
    atomic_write(Path(path), lambda handle: handle.write(data), replace=replace)


def is_safetensors(head: bytes) -> bool:
    """A file's first 9 bytes: a header length below 4 GiB, then "{" (text or a web page fails this; safetensors
    checks the rest). A checkpoint (a torch zip) never passes."""
    return len(head) >= 9 and head[4:8] == bytes(4) and head[8:9] == b"{"


def read_state(path: Path, what: str = "model file") -> dict[str, Any]:
    """The model-file dictionary stored in a safetensors file, after its checksums; one-line `ModelFileError`s."""
    from safetensors import safe_open

    with open(path, "rb") as handle:
        head = handle.read(9)
    if len(head) < 9 and head[4:] == bytes(len(head[4:])):
        raise ModelFileError(f"{what} {path} is truncated or corrupt (only {len(head)} bytes)")
    if not is_safetensors(head):
        raise ModelFileError(f"{path} is not an nmt model file (neither safetensors nor a torch checkpoint: "
                             f"it begins with {head[:8]!r})")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
    except Exception as exc:    # safetensors raises SafetensorError (and OSError) for a garbled or truncated file
        raise corrupt(what, path, exc) from None
    if any(key not in metadata for key in (*META_KEYS, "nmt.checksums")):
        raise ModelFileError(f"{path} is not an nmt model file or checkpoint (a safetensors file without "
                             "nmt's metadata)")
    _check_checksums(path, what, metadata, tensors)
    try:
        return _state(metadata, tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{path}: its metadata is unusable ({str(exc)[:200]}); the file is damaged or "
                             "not written by nmt") from None


def _check_checksums(path: Path, what: str, metadata: dict[str, str], tensors: dict[str, Tensor]) -> None:
    try:
        checksums = loads_json(metadata["nmt.checksums"])
        stored, expected = checksums["tensors"], checksums["metadata"]
        if not isinstance(stored, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise damaged(what, path, "its checksums are unreadable") from None
    if _metadata_crc(metadata) != expected:
        raise damaged(what, path, "its metadata fails its checksum")
    if different := sorted(set(stored) ^ set(tensors)):
        raise damaged(what, path, f"tensor {different[0]} is not the file's checksums' (missing or added)")
    if bad := next((name for name, tensor in tensors.items() if _crc(tensor) != stored[name]), None):
        raise damaged(what, path, f"its tensor {bad} fails its checksum")


def _state(metadata: dict[str, str], tensors: dict[str, Tensor]) -> dict[str, Any]:
    tokenizer: dict[str, Any] = {}
    for side in SIDES:
        spm = tensors.get(f"nmt.tokenizer.{side}.spm")
        pieces = tensors.get(f"nmt.tokenizer.{side}.pieces")
        if pieces is None or (spm is None and side == "src"):
            raise KeyError(f"the {side} tokenizer tensors are missing")
        tokenizer[side] = {"spm": None if spm is None else spm.numpy().tobytes(), "pieces": pieces.tolist()}
    file_format = metadata["nmt.format"]
    state = {"kind": metadata["nmt.kind"], "format": int(file_format) if file_format.isdecimal() else file_format,
             "nmt_version": metadata["nmt.version"], "config": loads_json(metadata["nmt.config"]),
             "dtype": metadata["nmt.dtype"], "card": loads_json(metadata["nmt.card"]), "tokenizer": tokenizer,
             "model": {name: t for name, t in tensors.items() if not name.startswith(PREFIX)}}
    if "nmt.shortlist" in metadata:
        shortlist = loads_json(metadata["nmt.shortlist"])
        if not isinstance(shortlist, dict):
            raise TypeError("nmt.shortlist is not a JSON object")
        for key in SHORTLIST_TENSORS:
            shortlist[key] = tensors[f"nmt.shortlist.{key}"]
        state["shortlist"] = shortlist
    return state
