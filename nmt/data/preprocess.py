"""`nmt preprocess`: raw parallel text -> SentencePiece models + binary id files + manifest.

Everything streams (memory does not grow with the corpus): one pass draws the SentencePiece sample, a
second encodes, filters and appends `CHUNK_PAIRS` pairs at a time, gathering the target pieces in use and
the shortlist's co-occurrence counts; training target ids are then mapped to the target vocabulary in
place. The files are built in a temporary folder inside the locked, marked output folder and moved into
place at the end, the manifest last: an interrupted run never leaves a half-written data folder. Re-runs
with unchanged inputs are a no-op (nmt.data.fingerprint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from nmt import __version__
from nmt.config import Config, ConfigError, DataConfig, dump_config
from nmt.data.corpus import (
    DataError,
    FilterStats,
    IdWriter,
    ReservoirSample,
    id_dtype,
    length_filter,
    map_ids_in_place,
    parallel_chunks,
    select_rows,
    write_error,
)
from nmt.data.fingerprint import Inputs, current_for_readers, inputs_of, recorded_fingerprint
from nmt.data.folder import FORMAT_VERSION, SPLITS, input_prefixes, text_files, train_corpora
from nmt.data.shortlist import SHORTLIST_FILE, CooccurrenceCounts, save_shortlist, vocab_fingerprint
from nmt.data.special import BOS, EOS, PAD, UNK
from nmt.data.tokenizer import Vocab, train_sentencepiece
from nmt.fs.folders import (
    LOCK,
    MARKER,
    TEMP_SUFFIX,
    check_overlap,
    copy_atomically,
    fsync_folder,
    read_marker,
    refuse_inputs_inside,
    remove_leftovers,
    write_marker,
)
from nmt.fs.locks import holds_lock, open_work_folder, release_folder
from nmt.fs.text import printable
from nmt.progress import progress_bar

CHUNK_PAIRS = 50_000    # pairs read, encoded and written at a time: memory does not grow with the corpus


def log(message: str) -> None:
    """A progress line on stderr, its file names escaped (nmt.fs.text.printable)."""
    print(printable(message), file=sys.stderr, flush=True)


def _input_files(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    """(source, target) file of every input: the training corpora, dev, test."""
    files = {name: text_files(data, name, prefix) for name, prefix in input_prefixes(data)}
    for key in ("src_spm_model", "tgt_spm_model"):
        path = getattr(data, key)
        if path is not None:
            _check_given_model(Path(path), f"data.{key}")
    if data.joint_vocab and data.tgt_spm_model and data.tgt_spm_model != data.src_spm_model:
        raise ConfigError("`data.tgt_spm_model` differs from `data.src_spm_model` but `data.joint_vocab` is true")
    return files


def _sample_for_sentencepiece(data: DataConfig, train_files: list[tuple[Path, Path]],
                              sides: tuple[str, ...]) -> dict[str, list[str]]:
    """A seeded uniform sample of at most `data.spm_sample_sentences` non-blank sentences per model to train
    ("joint", or "src"/"tgt"), in one pass."""
    samples = {side: ReservoirSample(data.spm_sample_sentences, [data.spm_sample_seed, i])
               for i, side in enumerate(sides)}
    with progress_bar("sampling", "pairs", unit_scale=True, leave=False) as bar:
        for src_path, tgt_path in train_files:
            for src, tgt in parallel_chunks(src_path, tgt_path, CHUNK_PAIRS):
                if "joint" in samples:
                    samples["joint"].add(src + tgt)
                for side, lines in (("src", src), ("tgt", tgt)):
                    if side in samples:
                        samples[side].add(lines)
                bar.update(len(src))
    return {side: [line for line in sample.sample() if line.strip()] for side, sample in samples.items()}


def _build_vocabs(data: DataConfig, train_files: list[tuple[Path, Path]], out: Path) -> tuple[Path, Path]:
    """Train (or copy) the SentencePiece model(s) into `out`; returns (src model, tgt model)."""
    if data.joint_vocab:
        target = out / "spm.model"
        if data.src_spm_model:
            copy_atomically(data.src_spm_model, target)
            return target, target
        sample = _sample_for_sentencepiece(data, train_files, ("joint",))["joint"]
        model = _train_model(data, sample, out / "spm", "joint")
        return model, model
    given = {"src": data.src_spm_model, "tgt": data.tgt_spm_model}
    to_train = tuple(side for side, path in given.items() if not path)
    samples = _sample_for_sentencepiece(data, train_files, to_train) if to_train else {}
    models = []
    for side, path in given.items():
        target = out / f"{side}.model"
        if path:
            copy_atomically(path, target)
        else:
            _train_model(data, samples.pop(side), out / side, side)
        models.append(target)
    return models[0], models[1]


def _check_given_model(path: Path, key: str) -> None:
    if not path.is_file():
        raise ConfigError(f"`{key}`: {path} does not exist")
    try:
        vocab = Vocab(path)
    except (RuntimeError, OSError, ValueError) as exc:
        raise ConfigError(f"`{key}`: {path} is not a SentencePiece model ({exc})") from None
    _check_specials(vocab, f"`{key}`: {path}")


def _check_specials(vocab: Vocab, name: str) -> None:
    expected = (PAD, UNK, BOS, EOS)
    got = (vocab.sp.pad_id(), vocab.sp.unk_id(), vocab.sp.bos_id(), vocab.sp.eos_id())
    if got != expected:
        raise DataError(f"{name}: special ids pad/unk/bos/eos are {got}, expected {expected}")


def _train_model(data: DataConfig, sample: list[str], prefix: Path, which: str) -> Path:
    side = {"src": "source", "tgt": "target"}.get(which)       # None for the joint model
    if not sample:
        raise DataError(f"`data.train`: the training corpora hold no non-blank {f'{side} ' if side else ''}"
                        "sentences to train SentencePiece on")
    log(f"training {which} SentencePiece {data.spm_model_type} model, vocab {data.vocab_size}, "
        f"on {len(sample)} sampled sentences")
    try:
        return train_sentencepiece(sample, prefix, data.vocab_size, data.spm_model_type, data.character_coverage)
    except RuntimeError as exc:
        reason = str(exc).split("] ", 1)[-1].strip()
        if "smaller than required_chars" in reason:
            needed = reason.split(" vs ")[-1].rstrip(".").split(".")[0]
            raise DataError(f"`data.vocab_size` {data.vocab_size} is too small: the {side or 'joint'} training text "
                            f"needs {needed} pieces for its characters and specials alone; raise it or lower "
                            "`data.character_coverage`") from None
        raise DataError(f"SentencePiece cannot train the {which} model ({reason}); check `data.vocab_size` and "
                        "`data.spm_model_type`") from None


def preprocess(config: Config, force: bool = False, config_path: str | Path | None = None) -> Path:
    """Run the whole preprocessing stage; returns the output folder."""
    data = config.data
    if data.out_dir is None:
        raise ConfigError("`data.out_dir` is required: the folder to write the preprocessed data to")
    out_dir = Path(data.out_dir)
    if config.training.init_from and (data.src_spm_model or data.tgt_spm_model):
        raise ConfigError("`data.src_spm_model` / `tgt_spm_model` conflict with `training.init_from`: fine-tuning "
                          "data is encoded with the parent's SentencePiece models and vocabularies")
    files = _input_files(data)
    inputs = [path for pair in files.values() for path in pair]
    inputs += [Path(p) for p in (data.src_spm_model, data.tgt_spm_model) if p]
    check_overlap(out_dir, "data.out_dir", inputs, config_path)
    refuse_inputs_inside(out_dir, "data.out_dir", [("training.init_from", config.training.init_from)],
                         "preprocess rewrites")
    built_from = inputs_of(config, files)
    held = holds_lock(out_dir)
    if not force and not held and current_for_readers(out_dir, built_from.fingerprint):
        return _up_to_date(out_dir)
    created, _ = open_work_folder(out_dir, "data", "data.out_dir", "preprocess", "remove them yourself")
    try:
        return _preprocess_locked(config, files, out_dir, force, built_from)
    except BaseException:
        if created:                     # our marker, lock and temporaries go; a file someone put there stays
            remove_leftovers(out_dir)
            for name in (MARKER, LOCK):
                (out_dir / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    finally:
        if not held:                    # done: training may read the folder now
            release_folder(out_dir)


def _up_to_date(out_dir: Path) -> Path:
    log(f"{out_dir} is up to date with its inputs and settings; nothing to do")
    return out_dir


def _preprocess_locked(config: Config, files: dict[str, tuple[Path, Path]], out_dir: Path, force: bool,
                       built_from: Inputs) -> Path:
    # again under the exclusive lock: a caller that held it skipped the shared check, or another just finished
    if not force and recorded_fingerprint(out_dir) == built_from.fingerprint:
        return _up_to_date(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".build.{os.getpid()}-", suffix=TEMP_SUFFIX, dir=out_dir))
    try:
        manifest = _write_folder(config, files, built_from.digests, built_from.fingerprint, tmp, built_from.parent)
        _replace_folder(tmp, out_dir)
    except OSError as exc:              # a full disk: Python and numpy name no file
        raise write_error(exc.filename or out_dir, exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_summary(manifest, out_dir)
    return out_dir


@dataclass
class _Writers:
    """The id files of one split, both sides, and the reference text of a dev/test split."""

    src: IdWriter
    tgt: IdWriter
    tgt_table: np.ndarray | None = None   # SentencePiece id -> target side id; None: write SentencePiece ids
    reference: TextIO | None = None


def _stream_corpus(data: DataConfig, paths: tuple[Path, Path], src_vocab: Vocab, tgt_vocab: Vocab,
                   writers: _Writers, filter_lengths: bool, seen_tgt: np.ndarray | None,
                   cooccurrence: CooccurrenceCounts | None = None) -> dict[str, Any]:
    """Read, check, encode, (filter) and append one parallel corpus chunk by chunk; returns its counts.
    `seen_tgt` (per target SentencePiece id) flags the pieces written; `cooccurrence` counts the pairs."""
    counts: dict[str, Any] = {"input_pairs": 0, "pairs": 0, "src_tokens": 0, "tgt_tokens": 0,
                              "src_unk": 0, "tgt_unk": 0, "empty_lines": 0}
    stats, first_empty = FilterStats(), list[int]()
    with progress_bar(f"encoding {paths[0].name}", "pairs", unit_scale=True, leave=False) as bar:
        for src_lines, tgt_lines in parallel_chunks(*paths, CHUNK_PAIRS):
            src, src_lens = src_vocab.encode_flat(src_lines)             # (tokens,), (pairs,)
            tgt, tgt_lens = tgt_vocab.encode_flat(tgt_lines)
            empty = np.flatnonzero((src_lens == 0) | (tgt_lens == 0))    # blank or whitespace-only sides
            first_empty.extend((counts["input_pairs"] + empty[: 5 - len(first_empty)] + 1).tolist())
            counts["empty_lines"] += len(empty)
            counts["input_pairs"] += len(src_lens)
            if writers.reference is not None:
                writers.reference.write("\n".join(tgt_lines) + "\n")
            if filter_lengths:
                keep, chunk_stats = length_filter(src_lens, tgt_lens, data.min_len, data.max_len, data.max_len_ratio)
                stats.add(chunk_stats)
                (src, src_lens), (tgt, tgt_lens) = select_rows(src, src_lens, keep), select_rows(tgt, tgt_lens, keep)
            if seen_tgt is not None:
                seen_tgt[tgt] = True
            if cooccurrence is not None and not cooccurrence.full:
                cooccurrence.add(src, src_lens, tgt, tgt_lens)
            if writers.tgt_table is not None:
                tgt = writers.tgt_table[tgt]
            writers.src.append(src, src_lens)
            writers.tgt.append(tgt, tgt_lens)
            counts["pairs"] += len(src_lens)
            counts["src_tokens"] += len(src)
            counts["tgt_tokens"] += len(tgt)
            counts["src_unk"] += int(np.count_nonzero(src == UNK))
            counts["tgt_unk"] += int(np.count_nonzero(tgt == UNK))
            bar.update(len(src_lines))
    if filter_lengths:
        counts["dropped"] = stats.dropped
    if first_empty:
        shown = ", ".join(map(str, first_empty)) + (" ..." if counts["empty_lines"] > 5 else "")
        log(f"warning: {paths[0]} / {paths[1]}: {counts['empty_lines']} empty line(s), lines {shown}")
    return counts


def _write_train(data: DataConfig, files: dict[str, tuple[Path, Path]], src_vocab: Vocab, tgt_vocab: Vocab,
                 dtypes: dict[str, np.dtype], seen_tgt: np.ndarray, out: Path,
                 cooccurrence: CooccurrenceCounts | None) -> dict[str, Any]:
    """All training corpora, one after the other, into one split; the entry lists each corpus's rows."""
    entry: dict[str, Any] = {"pairs": 0, "input_pairs": 0, "src_tokens": 0, "tgt_tokens": 0, "src_unk": 0,
                             "tgt_unk": 0, "empty_lines": 0, "dropped": dict.fromkeys(FilterStats().dropped, 0),
                             "corpora": []}
    with (IdWriter(out / f"train.{data.src_lang}", dtypes["src"]) as src_writer,
          IdWriter(out / f"train.{data.tgt_lang}", dtypes["tgt"]) as tgt_writer):
        for name, prefix, weight in train_corpora(data):
            start = src_writer.sentences
            counts = _stream_corpus(data, files[name], src_vocab, tgt_vocab, _Writers(src_writer, tgt_writer),
                                    filter_lengths=True, seen_tgt=seen_tgt, cooccurrence=cooccurrence)
            for key, value in counts.items():
                if key == "dropped":
                    for reason, n in value.items():
                        entry["dropped"][reason] += n
                else:
                    entry[key] += value
            entry["corpora"].append({"name": name, "prefix": prefix, "weight": weight, "start": start,
                                     "end": src_writer.sentences, "pairs": counts["pairs"],
                                     "input_pairs": counts["input_pairs"], "dropped": counts["dropped"]})
    return entry


def _check_some_left(data: DataConfig, train: dict[str, Any]) -> None:
    """Refuse a training split with no pairs: empty corpora, or a length filter that drops them all."""
    if train["pairs"]:
        return
    if not train["input_pairs"]:
        raise DataError("`data.train`: the training corpora are empty")
    dropped = train["dropped"]
    raise DataError(f"`data.train`: the length filter drops all {train['input_pairs']} training pairs "
                    f"(too short {dropped['too_short']}, too long {dropped['too_long']}, ratio {dropped['ratio']}); "
                    f"check `data.min_len` {data.min_len}, `data.max_len` {data.max_len} and "
                    f"`data.max_len_ratio` {data.max_len_ratio}")


def _write_folder(config: Config, files: dict[str, tuple[Path, Path]], digests: dict[str, Any], fingerprint: str,
                  out: Path, parent: tuple[Vocab, Vocab] | None) -> dict[str, Any]:
    data = config.data
    train_files = [files[name] for name, _, _ in train_corpora(data)]
    if parent is None:
        src_model, tgt_model = _build_vocabs(data, train_files, out)
    else:
        from nmt.modelfile.parent import write_vocabularies
        src_model, tgt_model = write_vocabularies(*parent, out)
    src_vocab, tgt_vocab = Vocab(src_model), Vocab(tgt_model)
    for vocab in (src_vocab, tgt_vocab):
        _check_specials(vocab, str(vocab.model_path))
    dtypes = {"src": id_dtype(len(src_vocab)), "tgt": id_dtype(len(tgt_vocab))}
    # Training ids are written as SentencePiece ids while the target pieces in use are gathered ...
    seen_tgt = np.zeros(len(tgt_vocab), dtype=bool)
    cooccurrence = (CooccurrenceCounts(len(src_vocab), len(tgt_vocab), data.shortlist_pairs)
                    if data.shortlist_k else None)
    splits: dict[str, Any] = {"train": _write_train(data, files, src_vocab, tgt_vocab, dtypes, seen_tgt, out,
                                                    cooccurrence)}
    _check_some_left(data, splits["train"])
    vocab_entries: dict[str, Any] = {"src": {"model": src_model.name, "pieces": None},
                                     "tgt": {"model": tgt_model.name, "pieces": None}}
    if data.target_vocab_from_train or parent is not None:
        # ... then the target side's vocabulary is those pieces (or the parent's), and its ids are mapped in place.
        seen_tgt[[PAD, UNK, BOS, EOS]] = True
        tgt_vocab = Vocab(tgt_model, (np.flatnonzero(seen_tgt) if parent is None else parent[1].pieces).tolist())
        tgt_vocab.save_pieces(out / "tgt.pieces")
        vocab_entries["tgt"]["pieces"] = "tgt.pieces"
        map_ids_in_place(out / f"train.{data.tgt_lang}", dtypes["tgt"], tgt_vocab.to_side)
    shortlist_entry = _write_shortlist(data, cooccurrence, src_vocab, tgt_vocab, out) if cooccurrence else None
    for split in SPLITS[1:]:
        if split not in files:
            continue
        with (IdWriter(out / f"{split}.{data.src_lang}", dtypes["src"]) as src_writer,
              IdWriter(out / f"{split}.{data.tgt_lang}", dtypes["tgt"]) as tgt_writer,
              open(out / f"{split}.ref.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as reference):
            writers = _Writers(src_writer, tgt_writer, tgt_vocab.to_side, reference)
            splits[split] = _stream_corpus(data, files[split], src_vocab, tgt_vocab, writers,
                                           filter_lengths=False, seen_tgt=None)
            del splits[split]["input_pairs"]
            if not splits[split]["pairs"]:
                raise DataError(f"`data.{split}`: {files[split][0]} and {files[split][1]} are empty")
    vocab_entries["src"]["size"], vocab_entries["tgt"]["size"] = len(src_vocab), len(tgt_vocab)
    manifest = {"format": FORMAT_VERSION, "nmt_version": __version__, "fingerprint": fingerprint,
                "langs": {"src": data.src_lang, "tgt": data.tgt_lang},
                "special_ids": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
                "dtype": {side: dt.name for side, dt in dtypes.items()}, "vocab": vocab_entries, "splits": splits,
                "inputs": digests, "settings": dataclasses.asdict(data)}
    if shortlist_entry is not None:
        manifest["shortlist"] = shortlist_entry
    (out / "config.yaml").write_text(dump_config(config), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _write_shortlist(data: DataConfig, counts: CooccurrenceCounts, src_vocab: Vocab, tgt_vocab: Vocab,
                     out: Path) -> dict[str, Any]:
    """The vocabulary shortlist from the training pairs' co-occurrence counts; returns its manifest entry."""
    targets, frequent = counts.table(tgt_vocab.to_side, src_vocab.to_side, len(src_vocab), data.shortlist_k,
                                     data.shortlist_frequent, data.shortlist_score)
    fingerprint = vocab_fingerprint(src_vocab.sp.serialized_model_proto(), tgt_vocab.sp.serialized_model_proto(),
                                    tgt_vocab.pieces)
    info = {"file": SHORTLIST_FILE, "k": data.shortlist_k, "frequent": len(frequent), "score": data.shortlist_score,
            "pairs": counts.pairs}
    save_shortlist(out / SHORTLIST_FILE, targets, frequent, fingerprint, info)
    return info


def _replace_folder(tmp: Path, out_dir: Path) -> None:
    """Move the finished files from `tmp` into the locked `out_dir`, replacing nmt's old ones. The old manifest
    goes first and the new one last: a crash between leaves no manifest (a rebuild), never a mix that looks
    complete. The marker lists every file nmt may later delete, old and new, at each moment."""
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
        corpora = entry.get("corpora", [])
        for corpus in corpora if len(corpora) > 1 else []:
            log(f"    {corpus['prefix']}: {corpus['pairs']} of {corpus['input_pairs']} pairs, "
                f"weight {corpus['weight']:g}")
