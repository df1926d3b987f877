"""Whether a data folder is current: a SHA-256 over the preprocessing settings, the input files' hashes and a
fine-tuned parent's vocabularies, against its manifest's. Checked under a shared lock, as trainings hold it:
preprocessing an up-to-date folder succeeds while trainings read it; only a rebuild waits."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from nmt.config import Config
from nmt.data.folder import FORMAT_VERSION
from nmt.fs.bounded import read_json
from nmt.fs.folders import FolderError, read_marker, refuse_foreign
from nmt.fs.locks import lock_folder, release_folder


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a data folder is built from; `parent`: the fine-tuned model's vocabularies, or None."""

    fingerprint: str
    digests: dict[str, Any]
    parent: tuple | None


def file_digest(path: Path) -> dict[str, int | str]:
    with open(path, "rb") as handle:
        digest = hashlib.sha256()
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def inputs_of(config: Config, files: dict[str, tuple[Path, Path]]) -> Inputs:
    data = config.data
    digests = {f"{split}.{side}": file_digest(path) | {"path": str(path)}
               for split, pair in files.items() for side, path in zip(("src", "tgt"), pair, strict=True)}
    for key in ("src_spm_model", "tgt_spm_model"):
        if getattr(data, key):
            digests[key] = file_digest(Path(getattr(data, key)))
    parent = None
    if config.training.init_from:                   # fine-tuning: the parent's vocabularies, not new ones
        from nmt.modelfile.parent import parent_vocabularies, vocabulary_digest

        parent = parent_vocabularies(config.training.init_from)
        digests["init_from"] = {"vocabularies": vocabulary_digest(*parent)}
    settings = {k: v for k, v in dataclasses.asdict(data).items() if k != "out_dir"}
    blob = json.dumps({"format": FORMAT_VERSION, "settings": settings, "inputs": digests}, sort_keys=True)
    return Inputs(hashlib.sha256(blob.encode()).hexdigest(), digests, parent)


def recorded_fingerprint(out_dir: Path) -> str | None:
    try:
        manifest = read_json(out_dir / "manifest.json")
    except (OSError, ValueError):           # not JSON, not UTF-8, past a bound (nmt.fs.bounded)
        return None
    return manifest.get("fingerprint") if isinstance(manifest, dict) else None


def current_for_readers(out_dir: Path, fingerprint: str) -> bool:
    """Whether nmt's data folder `out_dir` holds the data of `fingerprint`, under a shared lock; False when
    there is none or a writer holds it (the exclusive path then builds it or names the writer)."""
    marker = read_marker(out_dir) if (out_dir / "manifest.json").is_file() else None
    if marker is None or marker.get("kind") != "data":
        return False
    refuse_foreign(out_dir, "data", "data.out_dir", "remove them yourself")
    try:
        took = lock_folder(out_dir, "preprocess", shared=True)
    except FolderError:
        return False
    try:
        return recorded_fingerprint(out_dir) == fingerprint
    finally:
        if took:
            release_folder(out_dir)
