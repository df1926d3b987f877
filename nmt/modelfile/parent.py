"""Fine-tuning: the trained model a new run starts from (`training.init_from`).

The parent fixes what its weights depend on: the architecture (every `model.*` key but dropout,
a training setting, and the initialisation, which its weights replace) and both vocabularies, so
the new data must be encoded with the parent's SentencePiece model and pieces (`nmt preprocess`
does that when the config names the parent). Everything else starts afresh in the new run: update
0, the learning-rate schedule from its start, and a fresh optimiser unless `training.init_optimizer`
carries a training checkpoint's Adam moments over.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.config import Config, ConfigError
from nmt.data.tokenizer import Vocab
from nmt.modelfile.check import ModelFileError
from nmt.modelfile.file import LoadedModel, load_model, read_state

TRAINING_ONLY = {"dropout", "init", "init_scale"}   # model keys a fine-tuned run may change


@dataclass
class Parent:
    """A checked parent: its model file or checkpoint, and its optimiser state when one is carried over."""

    loaded: LoadedModel
    optimizer: dict[str, Any] | None


def load_parent(config: Config) -> Parent:
    """The parent `config.training.init_from` names, checked against the config's architecture; with
    `training.init_optimizer`, also its optimiser state (a training checkpoint's). Errors are `ConfigError`s."""
    t = config.training
    if not t.init_from:
        raise ConfigError("`training.init_optimizer` applies only with `training.init_from`")
    loaded = _load(t.init_from)
    _check_architecture(config, loaded)
    optimizer = None
    if t.init_optimizer:
        state = read_state(loaded.path)[0] if loaded.kind == "checkpoint" else {}
        optimizer = state.get("optimizer")
        if not isinstance(optimizer, dict):
            raise ConfigError(f"`training.init_optimizer` carries over a training checkpoint's optimiser state; "
                              f"{loaded.path} has none (a model file or an averaged checkpoint): give a run's "
                              "last.pt or best.pt, or start with a fresh optimiser")
    return Parent(loaded, optimizer)


def parent_vocabularies(path: str) -> tuple[Vocab, Vocab]:
    """The (source, target) vocabularies of the parent at `path`, for encoding a fine-tuning run's data."""
    loaded = _load(path)
    return loaded.src_vocab, loaded.tgt_vocab


def vocabulary_digest(src: Vocab, tgt: Vocab) -> str:
    """One digest of both vocabularies, for a data folder's fingerprint."""
    return hashlib.sha256(f"{src.digest()} {tgt.digest()}".encode()).hexdigest()


def check_data_vocabularies(parent: Parent, data_src: Vocab, data_tgt: Vocab, data_dir: str | Path) -> None:
    """The data folder was encoded with the parent's vocabularies, or its ids would mean other pieces."""
    if (data_src.digest(), data_tgt.digest()) != (parent.loaded.src_vocab.digest(), parent.loaded.tgt_vocab.digest()):
        raise ConfigError(f"`data.out_dir` {data_dir} was not encoded with the vocabularies of `training.init_from` "
                          f"{parent.loaded.path}; run `nmt preprocess` with this config (it takes them from the "
                          "parent) into a data folder of its own")


def _load(path: str) -> LoadedModel:
    try:
        return load_model(path)
    except ModelFileError as exc:
        raise ConfigError(f"`training.init_from`: {exc}") from None


def _check_architecture(config: Config, loaded: LoadedModel) -> None:
    mine, theirs = dataclasses.asdict(config.model), dataclasses.asdict(loaded.config.model)
    for key, value in mine.items():                  # the same dataclass: the same keys
        if key not in TRAINING_ONLY and theirs[key] != value:
            raise ConfigError(f"`model.{key}` is {value!r} but `training.init_from` {loaded.path} has "
                              f"{theirs[key]!r}: a fine-tuned model keeps its parent's architecture "
                              f"(`nmt info {loaded.path}` shows it)")


def write_vocabularies(src: Vocab, tgt: Vocab, out: Path) -> tuple[Path, Path]:
    """The parent's SentencePiece model(s) written into `out` as `nmt preprocess` names its own (spm.model
    when joint, else src.model and tgt.model); returns the (source, target) paths."""
    if len(src) != src.sp.get_piece_size():
        raise ConfigError("`training.init_from`: its source vocabulary is a subset of its SentencePiece model; "
                          "nmt preprocess encodes sources with whole models only")
    protos = {"src": src.sp.serialized_model_proto(), "tgt": tgt.sp.serialized_model_proto()}
    if protos["src"] == protos["tgt"]:
        (out / "spm.model").write_bytes(protos["src"])
        return out / "spm.model", out / "spm.model"
    for side, proto in protos.items():
        (out / f"{side}.model").write_bytes(proto)
    return out / "src.model", out / "tgt.model"
