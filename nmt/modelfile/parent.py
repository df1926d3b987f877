"""Fine-tuning from a trained model (`training.init_from`): the parent fixes the architecture (every `model.*`
key but TRAINING_ONLY) and both vocabularies, so the new data is encoded with the parent's; the rest starts
afresh (update 0, the schedule, a fresh optimiser unless `training.init_optimizer` carries Adam's moments over).
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
    loaded: LoadedModel
    optimizer: dict[str, Any] | None


def load_parent(config: Config) -> Parent:
    """The parent `training.init_from` names, checked against the config, and its optimiser state if asked for."""
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
    loaded = _load(path)
    return loaded.src_vocab, loaded.tgt_vocab


def vocabulary_digest(src: Vocab, tgt: Vocab) -> str:
    return hashlib.sha256(f"{src.digest()} {tgt.digest()}".encode()).hexdigest()


def check_data_vocabularies(parent: Parent, data_src: Vocab, data_tgt: Vocab, data_dir: str | Path) -> None:
    """The data folder's ids must mean the parent's pieces."""
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
    """The parent's SentencePiece model(s) in `out`, named as `nmt preprocess` names its own; (source, target)."""
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
