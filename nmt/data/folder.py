"""A preprocessed data folder as training reads it (nmt.data.preprocess writes it): manifest, vocabularies,
id files, and whether it was built from the settings and input files a config names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import MAX_EPOCH_ROWS, ConfigError, DataConfig
from nmt.data.corpus import DataError, IdFile, resolve_text_file
from nmt.data.tokenizer import Vocab
from nmt.fs.bounded import read_json

FORMAT_VERSION = 2      # 2: the train split lists its corpora (rows, weights) for the batch sampler
SPLITS = ("train", "dev", "test")
PATH_SETTINGS = ("dev", "test", "src_spm_model", "tgt_spm_model")


@dataclasses.dataclass
class DataFolder:
    root: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, root: str | Path) -> DataFolder:
        root = Path(root)
        path = root / "manifest.json"
        if not path.is_file():
            raise DataError(f"{path} does not exist; run `nmt preprocess` first")
        try:
            manifest = read_json(path)
        except (ValueError, OSError) as exc:        # ValueError covers bad JSON and bad UTF-8
            raise DataError(f"{path} cannot be read as a manifest ({exc}); rerun `nmt preprocess`") from None
        if not isinstance(manifest, dict):
            raise DataError(f"{path} is not an nmt manifest; rerun `nmt preprocess`")
        if manifest.get("format") != FORMAT_VERSION:
            raise DataError(f"{path}: data format {manifest.get('format')} is not {FORMAT_VERSION}; "
                            "rerun `nmt preprocess`")
        missing = [key for key in ("langs", "dtype", "vocab", "splits") if not isinstance(manifest.get(key), dict)]
        if missing:
            raise DataError(f"{path} lacks `{missing[0]}`: not a complete nmt manifest; rerun `nmt preprocess`")
        try:                                        # a missing or mistyped entry that training reads raises
            for side in ("src", "tgt"):
                lang, model = manifest["langs"][side], manifest["vocab"][side]["model"]
                if not isinstance(lang, str) or not isinstance(model, str):
                    raise TypeError(f"langs.{side} and vocab.{side}.model must be strings")
                np.dtype(manifest["dtype"][side])
            for corpus in manifest["splits"]["train"]["corpora"]:
                if not all(isinstance(corpus[key], (int, float)) for key in ("start", "end", "weight")):
                    raise TypeError("splits.train.corpora: start, end and weight must be numbers")
            corpora = [(c.get("name", "train"), c["weight"], c["end"] - c["start"])
                       for c in manifest["splits"]["train"]["corpora"]]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{path} is not a complete nmt manifest ({type(exc).__name__}: {exc}); "
                            "rerun `nmt preprocess`") from None
        check_epoch_rows(corpora, f" ({path} records it)")
        return cls(root, manifest)

    def check_settings(self, data: DataConfig) -> None:
        """Refuse a folder preprocessed from other settings or inputs than `data` (without `data.train`: any).
        Paths are not compared (a project may move), but existing inputs must keep their sizes."""
        recorded = self.manifest.get("settings")
        if data.train is None or not isinstance(recorded, dict):
            return
        where = f"`data.out_dir` {self.root}"
        mine, theirs = _comparable_settings(dataclasses.asdict(data)), _comparable_settings(recorded)
        differ = [key for key in mine if key in theirs and mine[key] != theirs[key]]
        if differ:
            key = differ[0]
            more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
            raise DataError(f"{where} was preprocessed with {_describe_setting(key, theirs[key])}, this config has "
                            f"{_describe_setting(key, mine[key])}{more}; rerun `nmt preprocess` with this config")
        inputs = self.manifest.get("inputs")
        inputs = inputs if isinstance(inputs, dict) else {}
        for name, prefix in input_prefixes(data):
            try:
                files = text_files(data, name, prefix)
            except DataError:           # gone or moved: only existing inputs are compared
                continue
            for side, path in zip(("src", "tgt"), files, strict=True):
                entry = inputs.get(f"{name}.{side}")
                if isinstance(entry, dict) and entry.get("size") != path.stat().st_size:
                    raise DataError(f"{path} has changed since {where} was preprocessed from it; "
                                    "rerun `nmt preprocess` with this config")

    def vocab(self, side: str) -> Vocab:
        try:
            return Vocab.from_entry(self.root, self.manifest["vocab"][side])
        except (FileNotFoundError, ValueError) as exc:          # missing, or named outside the folder
            raise DataError(f"{exc}; rerun `nmt preprocess`") from None

    def ids(self, split: str, side: str) -> IdFile:
        lang = self.manifest["langs"][side]
        return IdFile(self.root / f"{split}.{lang}", np.dtype(self.manifest["dtype"][side]))

    def has_split(self, split: str) -> bool:
        return split in self.manifest["splits"]

    def reference_path(self, split: str) -> Path:
        """The raw target text of a dev/test split (BLEU's references)."""
        return self.root / f"{split}.ref.{self.manifest['langs']['tgt']}"


def train_corpora(data: DataConfig) -> list[tuple[str, str, float]]:
    """(name, prefix, weight) of each training corpus: `train` for one prefix, `train[i]` in a list."""
    if data.train is None:
        raise ConfigError("`data.train` is required: the prefix of the training files")
    if isinstance(data.train, str):
        return [("train", data.train, 1.0)]
    if not data.train:
        raise ConfigError("`data.train` is an empty list; give at least one corpus prefix")
    corpora = []
    for i, corpus in enumerate(data.train):
        prefix, weight = (corpus, 1.0) if isinstance(corpus, str) else (corpus.prefix, corpus.weight)
        if prefix is None:
            raise ConfigError(f"`data.train[{i}].prefix` is required: the prefix of that corpus's files")
        corpora.append((f"train[{i}]", prefix, weight))
    return corpora


def check_epoch_rows(corpora: list[tuple[str, float, int]], where: str = "") -> None:
    """(name, weight, pairs) of each training corpus: an epoch takes round(weight x pairs) rows of it (the batch
    sampler's rule), which must be at least one (else the weight trains nothing on it, and with one corpus, nothing
    at all) and, over all corpora, at most MAX_EPOCH_ROWS (an epoch's rows are held in memory)."""
    total = 0
    for name, weight, pairs in corpora:
        key = f"`data.{name}.weight` {weight:g}{where}"
        if not 0 < weight <= MAX_EPOCH_ROWS:        # NaN too
            raise DataError(f"{key} must be > 0 and <= {MAX_EPOCH_ROWS}, the rows an epoch may hold")
        rows = round(weight * pairs)
        if pairs and not rows:
            raise DataError(f"{key} takes 0 of its {pairs} pairs per epoch (round(weight x pairs)); raise it above "
                            f"{0.5 / pairs:.3g} or drop the corpus")
        total += rows
        if total > MAX_EPOCH_ROWS:
            raise DataError(f"{key} makes an epoch of more than {MAX_EPOCH_ROWS} rows ({weight:g} x {pairs} pairs), "
                            "more than an epoch may hold in memory; lower it")


def _comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The data settings a config and a folder must agree on: paths only as given or not, corpora as weights."""
    comparable = {}
    for key, value in settings.items():
        if key == "out_dir":
            continue
        if key in PATH_SETTINGS:
            value = value is not None
        elif key == "train":
            corpora = value if isinstance(value, list) else [value] if value is not None else []
            value = [corpus.get("weight", 1.0) if isinstance(corpus, dict) else 1.0 for corpus in corpora]
        comparable[key] = value
    return comparable


def _describe_setting(key: str, value: Any) -> str:
    if key in PATH_SETTINGS:
        return f"a `data.{key}`" if value else f"no `data.{key}`"
    if key == "train":
        return f"{len(value)} training corpora of weights {value}" if len(value) != 1 else \
            f"1 training corpus of weight {value[0]}"
    return f"`data.{key}` {value!r}"


def input_prefixes(data: DataConfig) -> list[tuple[str, str]]:
    return ([(name, prefix) for name, prefix, _ in train_corpora(data)]
            + [(split, getattr(data, split)) for split in SPLITS[1:] if getattr(data, split) is not None])


def text_files(data: DataConfig, name: str, prefix: str) -> tuple[Path, Path]:
    """(source, target) file of one input; a missing one is a `DataError` naming `data.{name}`."""
    return (resolve_text_file(prefix, data.src_lang, f"data.{name}"),
            resolve_text_file(prefix, data.tgt_lang, f"data.{name}"))
