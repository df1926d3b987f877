"""The manifest (nmt-onnx.json) of a folder nmt.decode.onnx_export wrote, checked before any graph loads:
the runtime's side of that contract (graphs, tensor names and batch axes, special ids, tokenizers, settings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.data.special import BOS, EOS, PAD, UNK
from nmt.fs.bounded import read_json
from nmt.modelfile.errors import ModelFileError
from nmt.modelfile.onnx_folder import FORMAT, MANIFEST, VERSION, WEIGHTS, file_sha256
from nmt.runtime.external import external_locations

PRECISIONS = ("float32", "int8", "float16")
KINDS = ("beam", "greedy")
ROLES = ("encoder", "step", "step_features")


class OnnxFolderError(ModelFileError):
    """An exported folder that cannot be used; the message names the folder and what is wrong."""


@dataclass
class Manifest:
    folder: Path
    precision: str
    vocab_size: int
    src_spm: str
    tgt_spm: str
    decoding: dict[str, Any]
    card: dict[str, Any]
    languages: dict[str, str]
    memory: dict[str, list[str]]          # "greedy"/"beam" -> names of its encoder's per-sentence tensors (axis 0)
    state: list[tuple[str, int]]          # (name, batch axis) of the decoder's per-row tensors
    graphs: dict[str, dict[str, str]]     # "greedy"/"beam" -> {"encoder", "step"[, "step_features"]}: files
    shortlist: dict[str, Any] | None      # {"file", "output", "k", "frequent", "default"} or None
    pieces: dict[str, list[int] | None]   # "src"/"tgt" ("vocabulary"): side id -> SentencePiece id; None: all
    sha256: dict[str, str]                # file name -> its digest at export: every file the runtime reads
    checked: set[str] = field(default_factory=set)

    def path(self, name: str) -> Path:
        """A file the manifest names, which may not be a path out of the folder."""
        if not name or Path(name).name != name:
            raise OnnxFolderError(f"{self.folder / MANIFEST}: {name!r} is not a file name in the folder")
        path = self.folder / name
        if not path.is_file():
            raise OnnxFolderError(f"{self.folder} has no {name} (its {MANIFEST} names it); export the model again")
        if name not in self.checked:
            if self.sha256.get(name) != file_sha256(path):
                raise OnnxFolderError(f"{path} is damaged: its SHA-256 differs from the one {MANIFEST} holds; "
                                      "copy or export the model again")
            self.checked.add(name)
        return path

    def graph(self, name: str) -> Path:
        """A graph file the manifest names, refused (unread) if it makes onnxruntime read another file than the
        folder's weights file: a folder may come from someone else."""
        path = self.path(name)
        try:
            locations = external_locations(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise OnnxFolderError(f"{path}: not a readable ONNX graph ({exc}); export the model again") from None
        others = sorted(locations - {WEIGHTS})
        if others:
            raise OnnxFolderError(f"{path}: its external data is {others[0]!r}, not the folder's {WEIGHTS}; "
                                  "nmt reads no other file: export the model again")
        if locations and self.path(WEIGHTS).resolve().parent != self.folder.resolve():
            raise OnnxFolderError(f"{self.folder / WEIGHTS}: a link out of the folder; nmt reads no other file")
        return path


def read_manifest(folder: str | Path) -> Manifest:
    """The folder's manifest, checked: format, version, special ids, tensor names and graph files."""
    folder = Path(folder)
    where = folder / MANIFEST
    try:                                    # bounded: a folder may come from someone else
        raw = read_json(where)
    except (OSError, ValueError) as exc:    # UnicodeDecodeError, JSONDecodeError and BoundError are ValueErrors
        raise OnnxFolderError(f"{where}: not readable ({' '.join(str(exc).split())})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise OnnxFolderError(f"{where}: not an nmt ONNX manifest (\"format\" is not {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise OnnxFolderError(f"{where}: version {raw.get('version')!r}; this nmt reads version {VERSION}: "
                              "export the model again with this nmt")
    try:
        special = raw["special"]
        ids = (special["pad"], special["unk"], special["bos"], special["eos"])
        vocabulary = raw.get("vocabulary") or {}
        pieces = {side: None if vocabulary.get(side) is None else [int(i) for i in vocabulary[side]]
                  for side in ("src", "tgt")}
        manifest = Manifest(
            folder, str(raw["precision"]), int(raw["vocab_size"]), str(raw["src_spm"]), str(raw["tgt_spm"]),
            dict(raw.get("decoding") or {}), dict(raw.get("card") or {}), dict(raw.get("languages") or {}),
            {kind: [str(name) for name in raw["graphs"][kind].get("memory", raw["memory"])] for kind in KINDS},
            [(str(s["name"]), int(s["batch_axis"])) for s in raw["state"]],
            {kind: {role: str(raw["graphs"][kind][role]) for role in ROLES if role in raw["graphs"][kind]}
             for kind in KINDS}, raw.get("shortlist"),
            pieces, {str(name): str(digest) for name, digest in raw["sha256"].items()})
    except KeyError as exc:
        raise OnnxFolderError(f"{where}: missing key {exc}; export the model again") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise OnnxFolderError(f"{where}: a malformed value ({exc}); export the model again") from None
    if ids != (PAD, UNK, BOS, EOS):
        raise OnnxFolderError(f"{where}: special ids {special} differ from nmt's (pad 0, unk 1, bos 2, eos 3)")
    if manifest.precision not in PRECISIONS:
        raise OnnxFolderError(f"{where}: precision {manifest.precision!r} is not one of {', '.join(PRECISIONS)}")
    for kind, graphs in manifest.graphs.items():
        for role in ("encoder", "step", *(("step_features",) if manifest.shortlist else ())):
            if role not in graphs:
                raise OnnxFolderError(f"{where}: graphs.{kind} names no {role} graph; export the model again")
            manifest.path(graphs[role])
    return manifest
