"""`nmt preprocess`: raw parallel text -> SentencePiece models + binary id files + manifest.

The output folder carries nmt's marker and is locked while a run works in it; the files are
built in a temporary folder and moved into place at the end, the manifest last, so an
interrupted run never leaves a half-written data folder. A fingerprint of the settings and the
input files' hashes makes re-runs with unchanged inputs a no-op.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from nmt import __version__
from nmt.config import Config, ConfigError, DataConfig, dump_config
from nmt.data.corpus import (
    DataError,
    IdFile,
    empty_lines,
    file_digest,
    id_dtype,
    length_filter,
    read_parallel,
    resolve_text_file,
    write_ids,
)
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Vocab, train_sentencepiece
from nmt.folders import TEMP_SUFFIX, check_overlap, fsync_folder, open_work_folder, read_marker, write_marker

FORMAT_VERSION = 1
SPLITS = ("train", "dev", "test")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class DataFolder:
    """A finished preprocessing output: manifest plus the paths inside it."""

    root: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, root: str | Path) -> DataFolder:
        root = Path(root)
        path = root / "manifest.json"
        if not path.is_file():
            raise DataError(f"{path} does not exist; run `nmt preprocess` first")
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT_VERSION:
            raise DataError(
                f"{path}: data format {manifest.get('format')} is not {FORMAT_VERSION}; rerun `nmt preprocess`"
            )
        return cls(root, manifest)

    def vocab(self, side: str) -> Vocab:
        try:
            return Vocab.from_entry(self.root, self.manifest["vocab"][side])
        except FileNotFoundError as exc:
            raise DataError(f"{exc}; rerun `nmt preprocess`") from None

    def ids(self, split: str, side: str) -> IdFile:
        lang = self.manifest["langs"][side]
        return IdFile(self.root / f"{split}.{lang}", np.dtype(self.manifest["dtype"][side]))

    def has_split(self, split: str) -> bool:
        return split in self.manifest["splits"]

    def reference_path(self, split: str) -> Path:
        """The raw target text of a dev/test split, for BLEU against the untokenised references."""
        return self.root / f"{split}.ref.{self.manifest['langs']['tgt']}"


def _input_files(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    files = {}
    for split in SPLITS:
        prefix = getattr(data, split)
        if prefix is None:
            if split == "train":
                raise ConfigError("`data.train` is required: the prefix of the training files")
            continue
        files[split] = (
            resolve_text_file(prefix, data.src_lang, f"data.{split}"),
            resolve_text_file(prefix, data.tgt_lang, f"data.{split}"),
        )
    for key in ("src_spm_model", "tgt_spm_model"):
        path = getattr(data, key)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"`data.{key}`: {path} does not exist")
    if data.joint_vocab and data.tgt_spm_model and data.tgt_spm_model != data.src_spm_model:
        raise ConfigError("`data.tgt_spm_model` differs from `data.src_spm_model` but `data.joint_vocab` is true")
    return files


def _fingerprint(data: DataConfig, digests: dict[str, Any]) -> str:
    settings = {k: v for k, v in dataclasses.asdict(data).items() if k != "out_dir"}
    blob = json.dumps({"format": FORMAT_VERSION, "settings": settings, "inputs": digests}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _build_vocabs(
    data: DataConfig, texts: dict[str, tuple[list[str], list[str]]], out: Path
) -> tuple[Path, Path]:
    """Train (or copy) the SentencePiece model(s) into `out`; returns (src model, tgt model)."""
    train_src, train_tgt = texts["train"]
    if data.joint_vocab:
        target = out / "spm.model"
        if data.src_spm_model:
            shutil.copyfile(data.src_spm_model, target)
            return target, target
        log(f"training joint SentencePiece {data.spm_model_type} model, vocab {data.vocab_size}")
        model = train_sentencepiece(
            (line for line in train_src + train_tgt if line.strip()), out / "spm", data.vocab_size,
            data.spm_model_type, data.character_coverage, data.spm_train_sentences,
        )
        return model, model
    models = []
    for side, given, lines in (("src", data.src_spm_model, train_src), ("tgt", data.tgt_spm_model, train_tgt)):
        target = out / f"{side}.model"
        if given:
            shutil.copyfile(given, target)
        else:
            log(f"training {side} SentencePiece {data.spm_model_type} model, vocab {data.vocab_size}")
            train_sentencepiece((line for line in lines if line.strip()), out / side, data.vocab_size,
                                data.spm_model_type, data.character_coverage, data.spm_train_sentences)
        models.append(target)
    return models[0], models[1]


def _check_specials(model: Path) -> None:
    vocab = Vocab(model)
    expected = (PAD, UNK, BOS, EOS)
    got = (vocab.sp.pad_id(), vocab.sp.unk_id(), vocab.sp.bos_id(), vocab.sp.eos_id())
    if got != expected:
        raise DataError(f"{model}: special ids pad/unk/bos/eos are {got}, expected {expected}")


def preprocess(config: Config, force: bool = False, config_path: str | Path | None = None) -> Path:
    """Run the whole preprocessing stage; returns the output folder.

    The output folder is nmt's (marked) and locked for the whole run; new files are built in a
    temporary folder inside it and moved in at the end, the manifest last.
    """
    data = config.data
    if data.out_dir is None:
        raise ConfigError("`data.out_dir` is required: the folder to write the preprocessed data to")
    out_dir = Path(data.out_dir)
    files = _input_files(data)
    inputs = [path for pair in files.values() for path in pair]
    inputs += [Path(p) for p in (data.src_spm_model, data.tgt_spm_model) if p]
    check_overlap(out_dir, "data.out_dir", inputs, config_path)
    created, _ = open_work_folder(out_dir, "data", "data.out_dir", "preprocess", "remove them yourself")
    try:
        return _preprocess_locked(config, files, out_dir, force)
    except BaseException:
        if created:                     # holds only our marker, lock and temporary folder
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _preprocess_locked(config: Config, files: dict[str, tuple[Path, Path]], out_dir: Path, force: bool) -> Path:
    data = config.data
    digests = {f"{split}.{side}": file_digest(path) | {"path": str(path)}
               for split, pair in files.items() for side, path in zip(("src", "tgt"), pair, strict=True)}
    for model_key in ("src_spm_model", "tgt_spm_model"):
        if getattr(data, model_key):
            digests[model_key] = file_digest(Path(getattr(data, model_key)))
    fingerprint = _fingerprint(data, digests)

    manifest_path = out_dir / "manifest.json"
    if not force and manifest_path.is_file():
        try:
            previous = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            previous = {}
        if isinstance(previous, dict) and previous.get("fingerprint") == fingerprint:
            log(f"{out_dir} is up to date with its inputs and settings; nothing to do")
            return out_dir

    texts = {}
    for split, (src_path, tgt_path) in tqdm(files.items(), desc="reading", file=sys.stderr, leave=False):
        texts[split] = read_parallel(src_path, tgt_path)

    tmp = Path(tempfile.mkdtemp(prefix=f".build.{os.getpid()}-", suffix=TEMP_SUFFIX, dir=out_dir))
    try:
        manifest = _write_folder(config, files, texts, digests, fingerprint, tmp)
        _replace_folder(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_summary(manifest, out_dir)
    return out_dir


def _write_folder(config: Config, files: dict[str, tuple[Path, Path]], texts: dict[str, tuple[list[str], list[str]]],
                  digests: dict[str, Any], fingerprint: str, out: Path) -> dict[str, Any]:
    data = config.data
    src_model, tgt_model = _build_vocabs(data, texts, out)
    for model in {src_model, tgt_model}:
        _check_specials(model)
    src_vocab, tgt_vocab = Vocab(src_model), Vocab(tgt_model)

    # Encode everything with the full models first (SentencePiece ids), then pick the target vocabulary.
    encoded: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for split, (src, tgt) in tqdm(texts.items(), desc="encoding", file=sys.stderr, leave=False):
        encoded[split] = (src_vocab.encode(src), tgt_vocab.encode(tgt))

    splits: dict[str, Any] = {}
    train_src, train_tgt = encoded["train"]
    src_lens = np.array([len(s) for s in train_src])
    tgt_lens = np.array([len(t) for t in train_tgt])
    keep, stats = length_filter(src_lens, tgt_lens, data.min_len, data.max_len, data.max_len_ratio)
    kept_idx = np.flatnonzero(keep)
    encoded["train"] = ([train_src[i] for i in kept_idx], [train_tgt[i] for i in kept_idx])

    vocab_entries: dict[str, Any] = {"src": {"model": src_model.name, "pieces": None},
                                     "tgt": {"model": tgt_model.name, "pieces": None}}
    if data.target_vocab_from_train:
        seen = np.unique(np.concatenate(encoded["train"][1])) if kept_idx.size else np.zeros(0, np.int64)
        pieces = np.union1d(np.array([PAD, UNK, BOS, EOS]), seen)
        tgt_vocab = Vocab(tgt_model, pieces)
        tgt_vocab.save_pieces(out / "tgt.pieces")
        vocab_entries["tgt"]["pieces"] = "tgt.pieces"
        # Target ids so far are SentencePiece ids; map them to the side's vocabulary.
        for split, (src, tgt) in encoded.items():
            encoded[split] = (src, [tgt_vocab.to_side[t] for t in tgt])

    dtypes = {"src": id_dtype(len(src_vocab)), "tgt": id_dtype(len(tgt_vocab))}
    for split, (src, tgt) in encoded.items():
        src_tokens = write_ids(out / f"{split}.{data.src_lang}", src, dtypes["src"])
        tgt_tokens = write_ids(out / f"{split}.{data.tgt_lang}", tgt, dtypes["tgt"])
        raw_src, raw_tgt = texts[split]
        empties = empty_lines(raw_src, raw_tgt)
        entry: dict[str, Any] = {
            "pairs": len(src), "src_tokens": src_tokens, "tgt_tokens": tgt_tokens,
            "src_unk": int(sum((s == UNK).sum() for s in src)), "tgt_unk": int(sum((t == UNK).sum() for t in tgt)),
            "empty_lines": len(empties),
        }
        if split == "train":
            entry["input_pairs"] = len(raw_src)
            entry["dropped"] = stats.dropped
        else:
            (out / f"{split}.ref.{data.tgt_lang}").write_text("".join(f"{t}\n" for t in raw_tgt), encoding="utf-8")
        splits[split] = entry
        if empties:
            shown = ", ".join(map(str, empties[:5])) + (" ..." if len(empties) > 5 else "")
            log(f"warning: {files[split][0]} / {files[split][1]}: {len(empties)} empty line(s), lines {shown}")

    vocab_entries["src"]["size"] = len(src_vocab)
    vocab_entries["tgt"]["size"] = len(tgt_vocab)
    manifest = {
        "format": FORMAT_VERSION,
        "nmt_version": __version__,
        "fingerprint": fingerprint,
        "langs": {"src": data.src_lang, "tgt": data.tgt_lang},
        "special_ids": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
        "dtype": {side: dt.name for side, dt in dtypes.items()},
        "vocab": vocab_entries,
        "splits": splits,
        "inputs": digests,
        "settings": {k: v for k, v in dataclasses.asdict(data).items()},
    }
    (out / "config.yaml").write_text(dump_config(config), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _replace_folder(tmp: Path, out_dir: Path) -> None:
    """Move the finished files from `tmp` into the locked `out_dir`, replacing nmt's old ones.

    The old manifest goes first and the new one last, so a crash in between leaves a folder
    without a manifest (rebuilt by the next run), never a mix that looks complete. The marker
    lists every file nmt may later delete, old and new, at each moment.
    """
    new = sorted(entry.name for entry in tmp.iterdir())
    old = (read_marker(out_dir) or {}).get("files", [])
    for name in new:                    # data on disk before the names point at it
        if (tmp / name).is_file():
            with open(tmp / name, "rb+") as handle:
                os.fsync(handle.fileno())
    (out_dir / "manifest.json").unlink(missing_ok=True)
    write_marker(out_dir, "data", [*old, *new])
    for name in old:
        target = out_dir / name
        if name not in new or target.is_dir():
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    for name in new:
        if name != "manifest.json":
            os.replace(tmp / name, out_dir / name)
    write_marker(out_dir, "data", new)
    os.replace(tmp / "manifest.json", out_dir / "manifest.json")
    fsync_folder(out_dir)


def _print_summary(manifest: dict[str, Any], out_dir: Path) -> None:
    vocab = manifest["vocab"]
    log(f"wrote {out_dir}: vocab src {vocab['src']['size']}, tgt {vocab['tgt']['size']}")
    for split, entry in manifest["splits"].items():
        line = (f"  {split}: {entry['pairs']} pairs, {entry['src_tokens']} src / {entry['tgt_tokens']} tgt tokens")
        if "dropped" in entry:
            dropped = entry["dropped"]
            line += (f"; dropped {sum(dropped.values())} of {entry['input_pairs']} "
                     f"(too short {dropped['too_short']}, too long {dropped['too_long']}, ratio {dropped['ratio']})")
        log(line)
