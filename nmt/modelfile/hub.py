"""Where a model the user names lives: a file, a folder in the Hugging Face layout (its model.safetensors is the
model file: nmt.modelfile.hf), or `hf://org/name[@revision]`, fetched with huggingface_hub's `snapshot_download`
(the `hub` extra) into its cache, which alone serves when HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import re
from pathlib import Path

from nmt import __version__
from nmt.modelfile.errors import ModelFileError
from nmt.modelfile.onnx_folder import is_onnx_folder

MODEL_FILE = "model.safetensors"          # the weights file name the Hub's tools expect
SCHEME = "hf:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def is_hub_name(path: str | Path) -> bool:
    """`hf://org/name` (a Path made of it reads `hf:/org/name`)."""
    return str(path).startswith(SCHEME + "/")


def hub_name(path: str | Path) -> str:
    """`hf://org/name[@revision]` as the user wrote it, also when it went through a Path."""
    return "hf://" + str(path)[len(SCHEME):].lstrip("/")


def locate_model(path: str | Path) -> Path:
    """The file to read for `path`: itself, the `model.safetensors` of a folder, or that of a Hub snapshot."""
    if is_hub_name(path):
        return download(hub_name(path)[len("hf://"):])
    path = Path(path)
    if is_onnx_folder(path):
        raise ModelFileError(f"{path} is an ONNX folder (nmt export --format onnx), which only translates and "
                             "serves; give the model file it was exported from")
    if path.is_dir() and not (path / MODEL_FILE).is_file():
        raise ModelFileError(f"{path} is a folder without {MODEL_FILE}; give a model file, a checkpoint, or a "
                             "folder written by `nmt export --format hf`")
    return path / MODEL_FILE if path.is_dir() else path


def parse_hub_name(spec: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of `org/name[@revision]`."""
    repo, _, revision = spec.partition("@")
    if not _REPO_ID.match(repo) or ".." in repo or (revision == "" and "@" in spec):
        raise ModelFileError(f"hf://{spec} is not a Hub model name; write hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return repo, revision or None


def download(spec: str) -> Path:
    """The local `model.safetensors` of the Hub repository `spec` (`org/name[@revision]`), cached or downloaded."""
    repo, revision = parse_hub_name(spec)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelFileError("hf:// models need the hub extra: pip install 'nmt[hub]'") from None
    try:
        folder = snapshot_download(repo, revision=revision, allow_patterns=[MODEL_FILE], library_name="nmt",
                                   library_version=__version__)
    except Exception as exc:    # huggingface_hub: offline without a cached copy, no such repository, HTTP errors
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ModelFileError(f"hf://{spec}: {type(exc).__name__}: {reason[:300]}") from None
    file = Path(folder) / MODEL_FILE
    if not file.is_file():
        raise ModelFileError(f"hf://{spec} has no {MODEL_FILE}; it is not a model `nmt export --format hf` wrote")
    return file


def model_files(path: str | Path) -> list[Path]:
    """The files the model `path` is made of, which no output may replace (nmt.fs.outputs): the file; every file
    of a folder (the card and SentencePiece models are the model too); for hf://, its files in the Hub cache
    (snapshot links and blobs). Nothing is downloaded; a name that does not resolve gives what it would read once
    it does (its load reports the problem)."""
    if is_hub_name(path):
        try:
            repo, _ = parse_hub_name(hub_name(path)[len("hf://"):])
            from huggingface_hub import constants
            from huggingface_hub.file_download import repo_folder_name
        except (ModelFileError, ImportError):
            return []
        folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
        return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    path = Path(path)
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
