"""`nmt export --format onnx DIR`: a trained model as a folder that translates without PyTorch (README).

Graphs from nmt.decode.onnx_graphs (int8: onnxruntime's dynamic quantization of them), nmt-onnx.json for the
runtime. Built under a temporary name beside DIR, checked, marked as nmt's and renamed into place, so DIR is
never half-written; an existing DIR is replaced only with --force and only when nmt wrote it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt import __version__
from nmt.data.shortlist import save_shortlist
from nmt.data.special import BOS, EOS, PAD, UNK
from nmt.decode.onnx_graphs import (
    ANY_VALUE,
    TOLERANCE,
    Layout,
    OnnxExportError,
    check_graphs,
    export_pair,
    layout_of,
    quantize_int8,
)
from nmt.decode.onnx_weights import share_weights
from nmt.decode.steps import Decoding
from nmt.fs.folders import build_folder, new_file_mode, refuse_foreign, write_marker
from nmt.model.seq2seq import Seq2Seq
from nmt.modelfile.card import describe
from nmt.modelfile.file import LoadedModel, load_model
from nmt.modelfile.onnx_folder import FORMAT, MANIFEST, VERSION, file_sha256

KIND = "onnx"
PRECISIONS = {"none": "float32", "int8": "int8"}


def check_folder(folder: Path, force: bool) -> None:
    """DIR may be absent, an empty folder, or (with `force`) a folder nmt wrote by this command."""
    if folder.exists() and not folder.is_dir():
        raise OnnxExportError(f"--output {folder} is a file; --format onnx writes a folder: give a new folder name")
    if not folder.parent.is_dir():
        raise OnnxExportError(f"--output {folder}: folder {folder.parent} does not exist")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    marker = refuse_foreign(folder, KIND, "--output", "remove them yourself")
    if marker is None:
        raise OnnxExportError(f"--output {folder} holds files nmt did not write; choose another folder")
    if not force:
        raise OnnxExportError(f"--output {folder} exists; choose a new name, or pass --force to replace "
                              "this ONNX export")


def export_onnx(source: str | Path, folder: str | Path, quantize: str = "none", force: bool = False) -> dict[str, Any]:
    """A checkpoint's or model file's model into `folder`; returns nmt-onnx.json's content."""
    folder = Path(folder)
    if quantize not in PRECISIONS:
        raise OnnxExportError(f"--quantize must be none or int8 for --format onnx, got {quantize!r}")
    check_folder(folder, force)
    loaded = load_model(source)

    def build(tmp: Path) -> dict[str, Any]:
        info = write_folder(loaded, tmp, quantize, source)
        mode = new_file_mode()
        for path in tmp.iterdir():                          # each file as atomic_write leaves one
            os.chmod(path, mode)
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        write_marker(tmp, KIND, [path.name for path in tmp.iterdir()])
        return info

    return build_folder(folder, build, lambda: check_folder(folder, force))


def write_folder(loaded: LoadedModel, folder: Path, quantize: str, source: str | Path) -> dict[str, Any]:
    model = loaded.build().requires_grad_(False)
    shortlist = loaded.shortlist is not None
    decoding = Decoding(model)
    src_vocab = len(loaded.src_vocab)
    graphs: dict[str, dict[str, Any]] = {}
    checks: list[tuple[bool, dict[str, str], Layout]] = []
    for search, fold_context in (("beam", True), ("greedy", False)):
        layout = layout_of(decoding, fold_context, src_vocab)
        if checks and layout == checks[0][2]:               # the same memory, the same graphs
            graphs["greedy"] = dict(graphs["beam"])
            break
        suffix = "" if fold_context else "_greedy"
        roles = ("encoder", "step", "step_features") if shortlist else ("encoder", "step")
        files = {role: f"{role}{suffix}.onnx" for role in roles}
        export_pair(decoding, folder, fold_context, files, src_vocab)
        checks.append((fold_context, files, layout))
        graphs[search] = {**files, "memory": list(layout.memory)}
    for fold_context, files, layout in checks:
        if quantize == "int8":          # the float32 graphs must agree before they are quantized
            check_graphs(decoding, folder, fold_context, files, layout, src_vocab)
            for name in files.values():
                quantize_int8(folder / name)
    share_weights(folder, [name for _, files, _ in checks for name in files.values()])
    for fold_context, files, layout in checks:      # the graphs as written; int8: the same shapes and -inf
        check_graphs(decoding, folder, fold_context, files, layout, src_vocab,
                     tolerance=ANY_VALUE if quantize == "int8" else TOLERANCE)
    info = describe_export(loaded, checks[0][2], graphs, quantize, source)
    (folder / info["src_spm"]).write_bytes(loaded.src_vocab.sp.serialized_model_proto())
    (folder / info["tgt_spm"]).write_bytes(loaded.tgt_vocab.sp.serialized_model_proto())
    if shortlist:
        _write_shortlist(loaded, model, folder)
    info["sha256"] = {path.name: file_sha256(path) for path in sorted(folder.iterdir())}
    (folder / MANIFEST).write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return info


def describe_export(loaded: LoadedModel, layout: Layout, graphs: dict[str, dict[str, Any]], quantize: str,
                    source: str | Path) -> dict[str, Any]:
    joint = loaded.src_vocab.sp.serialized_model_proto() == loaded.tgt_vocab.sp.serialized_model_proto()
    card = describe(loaded)
    card["file"] = Path(source).name                        # where it came from, not a path of this machine
    info: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "nmt_version": __version__, "precision": PRECISIONS[quantize],
        "special": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS}, "vocab_size": len(loaded.tgt_vocab),
        "src_spm": "sentencepiece.model" if joint else "source.model",
        "tgt_spm": "sentencepiece.model" if joint else "target.model",
        "vocabulary": {"src": loaded.src_vocab.pieces.tolist(), "tgt": loaded.tgt_vocab.pieces.tolist()},
        "decoding": dataclasses.asdict(loaded.config.decoding), "card": card, "languages": loaded.languages,
        "memory": list(layout.memory), "state": [{"name": name, "batch_axis": axis} for name, axis in layout.state],
        "graphs": graphs, "shortlist": None,
    }
    if loaded.shortlist is not None:
        stored = int(loaded.shortlist["targets"].shape[1])
        info["shortlist"] = {"file": "shortlist.npz", "output": "output.npz",
                             "k": min(loaded.config.decoding.shortlist_k or stored, stored),
                             "frequent": len(loaded.shortlist["frequent"]),
                             "default": loaded.shortlist_on_cpu}
    return info


def _write_shortlist(loaded: LoadedModel, model: Seq2Seq, folder: Path) -> None:
    """shortlist.npz as a data folder writes it, and output.npz: W_s (vocab, dec_hidden), b_s (vocab,) float32."""
    arrays = loaded.shortlist or {}
    plain = {key: value.numpy() if isinstance(value, torch.Tensor) else value for key, value in arrays.items()}
    save_shortlist(folder / "shortlist.npz", plain["targets"], plain["frequent"], str(plain["vocab_sha256"]),
                   {"score": str(plain.get("score", "")), "pairs": int(plain.get("pairs", 0))})
    output = model.decoder.output
    bias = output.bias if output.bias is not None else torch.zeros(output.out_features)
    np.savez(folder / "output.npz", W_s=output.weight.float().numpy(), b_s=bias.float().numpy())
