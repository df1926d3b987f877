"""`nmt preprocess`: raw parallel text -> SentencePiece models + binary id files + manifest, streamed (one pass
samples for SentencePiece, one encodes), built in a temporary folder inside the locked output folder and moved
into place, the manifest last: an interrupted run never leaves a half-written data folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from nmt import __version__
from nmt.config import Config, ConfigError, DataConfig, dump_config
from nmt.data.corpus import DataError, IdWriter, ReservoirSample, map_ids_in_place, parallel_chunks, write_error
from nmt.data.fingerprint import Inputs, current_for_readers, inputs_of, recorded_fingerprint
from nmt.data.folder import FORMAT_VERSION, SPLITS, check_epoch_rows, input_prefixes, text_files, train_corpora
from nmt.data.shortlist import SHORTLIST_FILE, CooccurrenceCounts, save_shortlist, vocab_fingerprint
from nmt.data.special import BOS, EOS, PAD, UNK
from nmt.data.tokenizer import Vocab, train_sentencepiece
from nmt.fs import folders
from nmt.fs.locks import holds_lock, open_work_folder, release_folder
from nmt.fs.text import input_problem, printable
from nmt.progress import progress_bar

CHUNK_PAIRS = 50_000    # pairs read, encoded and written at a time: memory does not grow with the corpus
COUNTS = ("input_pairs", "pairs", "src_tokens", "tgt_tokens", "src_unk", "tgt_unk", "empty_lines")


def log(message: str) -> None:
    print(printable(message), file=sys.stderr, flush=True)


def _build_vocabs(data: DataConfig, train_files: list[tuple[Path, Path]], out: Path) -> tuple[Path, Path]:
    """Train (or copy) the SentencePiece model(s) into `out`, each on a seeded sample, all drawn in one pass."""
    sides = ("joint",) if data.joint_vocab else ("src", "tgt")
    given = {"joint": data.src_spm_model, "src": data.src_spm_model, "tgt": data.tgt_spm_model}
    samples = {side: ReservoirSample(data.spm_sample_sentences, [data.spm_sample_seed, i])
               for i, side in enumerate(side for side in sides if not given[side])}
    if samples:
        with progress_bar("sampling", "pairs", unit_scale=True, leave=False) as bar:
            for src_path, tgt_path in train_files:
                for src, tgt in parallel_chunks(src_path, tgt_path, CHUNK_PAIRS):
                    for side, lines in (("joint", src + tgt), ("src", src), ("tgt", tgt)):
                        if side in samples:
                            samples[side].add(lines)
                    bar.update(len(src))
    models = []
    for side in sides:
        models.append(out / f"{'spm' if side == 'joint' else side}.model")
        if path := given[side]:
            folders.copy_atomically(path, models[-1])
            continue
        sample = [line for line in samples.pop(side).sample() if line.strip()]
        text = {"src": "source", "tgt": "target"}.get(side)       # None for the joint model
        if not sample:
            raise DataError(f"`data.train`: the training corpora hold no non-blank {f'{text} ' if text else ''}"
                            "sentences to train SentencePiece on")
        log(f"training {side} SentencePiece {data.spm_model_type} model, vocab {data.vocab_size}, "
            f"on {len(sample)} sampled sentences")
        try:
            train_sentencepiece(sample, models[-1], data.vocab_size, data.spm_model_type, data.character_coverage)
        except RuntimeError as exc:
            reason = str(exc).split("] ", 1)[-1].strip()
            if "smaller than required_chars" in reason:
                needed = reason.split(" vs ")[-1].rstrip(".").split(".")[0]
                raise DataError(f"`data.vocab_size` {data.vocab_size} is too small: the {text or 'joint'} training "
                                f"text needs {needed} pieces for its characters and specials alone; raise it or "
                                "lower `data.character_coverage`") from None
            raise DataError(f"SentencePiece cannot train the {side} model ({reason}); check `data.vocab_size` and "
                            "`data.spm_model_type`") from None
    return models[0], models[-1]


def _check_specials(vocab: Vocab, name: str) -> None:
    expected = (PAD, UNK, BOS, EOS)
    got = (vocab.sp.pad_id(), vocab.sp.unk_id(), vocab.sp.bos_id(), vocab.sp.eos_id())
    if got != expected:
        raise DataError(f"{name}: special ids pad/unk/bos/eos are {got}, expected {expected}")


def preprocess(config: Config, force: bool = False, config_path: str | Path | None = None) -> Path:
    """Run the whole preprocessing stage; returns the output folder."""
    data = config.data
    if data.out_dir is None:
        raise ConfigError("`data.out_dir` is required: the folder to write the preprocessed data to")
    out_dir = Path(data.out_dir)
    if config.training.init_from and (data.src_spm_model or data.tgt_spm_model):
        raise ConfigError("`data.src_spm_model` / `tgt_spm_model` conflict with `training.init_from`: fine-tuning "
                          "data is encoded with the parent's SentencePiece models and vocabularies")
    files = {name: text_files(data, name, prefix) for name, prefix in input_prefixes(data)}
    models = {key: Path(path) for key in ("src_spm_model", "tgt_spm_model") if (path := getattr(data, key))}
    given_vocabs = []
    for key, path in models.items():
        if problem := input_problem(path):
            raise ConfigError(f"`data.{key}`: {path} {problem}")
        try:
            given_vocabs.append(Vocab(path))
        except (RuntimeError, OSError, ValueError) as exc:
            raise ConfigError(f"`data.{key}`: {path} is not a SentencePiece model ({exc})") from None
        _check_specials(given_vocabs[-1], f"`data.{key}`: {path}")
    if data.joint_vocab and data.tgt_spm_model and data.tgt_spm_model != data.src_spm_model:
        raise ConfigError("`data.tgt_spm_model` differs from `data.src_spm_model` but `data.joint_vocab` is true")
    inputs = [path for pair in files.values() for path in pair] + list(models.values())
    folders.check_overlap(out_dir, "data.out_dir", inputs, config_path)
    folders.refuse_inputs_inside(out_dir, "data.out_dir", [("training.init_from", config.training.init_from)],
                                 "preprocess rewrites")
    built_from = inputs_of(config, files)
    _check_untrained_vocab(config, given_vocabs, built_from.parent)
    held = holds_lock(out_dir)
    if not force and not held and current_for_readers(out_dir, built_from.fingerprint):
        return _up_to_date(out_dir)
    created, _ = open_work_folder(out_dir, "data", "data.out_dir", "preprocess", "remove them yourself")
    try:
        return _preprocess_locked(config, files, out_dir, force, built_from)
    except BaseException:
        if created:                     # our marker, lock and temporaries go; a file someone put there stays
            folders.remove_leftovers(out_dir)
            for name in (folders.MARKER, folders.LOCK):
                (out_dir / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    finally:
        if not held:                    # done: training may read the folder now
            release_folder(out_dir)


def _check_untrained_vocab(config: Config, given: list[Vocab], parent: tuple[Vocab, Vocab] | None) -> None:
    """`data.vocab_size` and `data.spm_model_type` set up the SentencePiece training that models given for every
    side replace (the parent's, or `data.src_spm_model` and, unless joint, `tgt_spm_model`): set there, the
    first must be the models' own size (as in the config that made them) and the second is refused."""
    data = config.data
    if parent is not None:
        vocabs, source = list(parent), "the SentencePiece models of `training.init_from`"
    elif data.src_spm_model and (data.joint_vocab or data.tgt_spm_model):
        vocabs, source = given, "the given SentencePiece models (`data.src_spm_model`)"
    else:
        return
    sizes = sorted({vocab.sp.get_piece_size() for vocab in vocabs})
    if config.set_away_from_default("data.vocab_size") and sizes != [data.vocab_size]:
        raise ConfigError(f"`data.vocab_size` {data.vocab_size} does not apply: {source} are used, of "
                          f"{' and '.join(map(str, sizes))} pieces, and none is trained; remove it")
    if config.set_away_from_default("data.spm_model_type"):
        raise ConfigError(f"`data.spm_model_type` {data.spm_model_type} does not apply: {source} are used and none "
                          "is trained; remove it")


def _up_to_date(out_dir: Path) -> Path:
    log(f"{out_dir} is up to date with its inputs and settings; nothing to do")
    return out_dir


def _preprocess_locked(config: Config, files: dict[str, tuple[Path, Path]], out_dir: Path, force: bool,
                       built_from: Inputs) -> Path:
    # again under the exclusive lock: a caller that held it skipped the shared check, or another just finished
    if not force and recorded_fingerprint(out_dir) == built_from.fingerprint:
        return _up_to_date(out_dir)
    tmp = folders.temp_folder(out_dir, "build")
    try:
        manifest = _write_folder(config, files, built_from.digests, built_from.fingerprint, tmp, built_from.parent)
        _replace_folder(tmp, out_dir)
    except OSError as exc:              # a full disk: Python and numpy name no file
        raise write_error(exc.filename or out_dir, exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    vocab = manifest["vocab"]
    log(f"wrote {out_dir}: vocab src {vocab['src']['size']}, tgt {vocab['tgt']['size']}")
    for split, entry in manifest["splits"].items():
        line = f"  {split}: {entry['pairs']} pairs, {entry['src_tokens']} src / {entry['tgt_tokens']} tgt tokens"
        if "dropped" in entry:
            line += f"; dropped {sum(entry['dropped'].values())} of {entry['input_pairs']} ({_reasons(entry)})"
        log(line)
        corpora = entry.get("corpora", [])
        for corpus in corpora if len(corpora) > 1 else []:
            log(f"    {corpus['prefix']}: {corpus['pairs']} of {corpus['input_pairs']} pairs, "
                f"weight {corpus['weight']:g}")
    return out_dir


def _reasons(entry: dict[str, Any]) -> str:
    dropped = entry["dropped"]
    return f"too short {dropped['too_short']}, too long {dropped['too_long']}, ratio {dropped['ratio']}"


def length_filter(src_lens: np.ndarray, tgt_lens: np.ndarray, min_len: int, max_len: int,
                  max_ratio: float) -> tuple[np.ndarray, dict[str, int]]:
    """Boolean keep-mask over pairs, and counts of dropped pairs by reason (first reason wins)."""
    short = (src_lens < min_len) | (tgt_lens < min_len)
    long = ~short & ((src_lens > max_len) | (tgt_lens > max_len))
    longer = np.maximum(src_lens, tgt_lens)
    shorter = np.maximum(np.minimum(src_lens, tgt_lens), 1)
    ratio = ~short & ~long & (longer / shorter > max_ratio)
    return ~(short | long | ratio), {"too_short": int(short.sum()), "too_long": int(long.sum()),
                                     "ratio": int(ratio.sum())}


def _stream_corpus(data: DataConfig, paths: tuple[Path, Path], src_vocab: Vocab, tgt_vocab: Vocab,
                   writers: tuple[IdWriter, IdWriter], reference: TextIO | None = None,
                   seen_tgt: np.ndarray | None = None,
                   cooccurrence: CooccurrenceCounts | None = None) -> dict[str, Any]:
    """Read, check, encode and append one parallel corpus chunk by chunk; returns its counts. A training corpus
    (`seen_tgt` given: flags per target SentencePiece id) is length-filtered and counted for the shortlist."""
    counts, dropped = Counter(dict.fromkeys(COUNTS, 0)), Counter(too_short=0, too_long=0, ratio=0)
    first_empty: list[int] = []
    with progress_bar(f"encoding {paths[0].name}", "pairs", unit_scale=True, leave=False) as bar:
        for src_lines, tgt_lines in parallel_chunks(*paths, CHUNK_PAIRS):
            src, src_lens = src_vocab.encode_flat(src_lines)             # (tokens,), (pairs,)
            tgt, tgt_lens = tgt_vocab.encode_flat(tgt_lines)
            empty = np.flatnonzero((src_lens == 0) | (tgt_lens == 0))    # blank or whitespace-only sides
            first_empty.extend((counts["input_pairs"] + empty[: 5 - len(first_empty)] + 1).tolist())
            counts.update(input_pairs=len(src_lens), empty_lines=len(empty))
            if reference is not None:
                reference.write("\n".join(tgt_lines) + "\n")
            if seen_tgt is not None:
                keep, chunk_dropped = length_filter(src_lens, tgt_lens, data.min_len, data.max_len, data.max_len_ratio)
                dropped.update(chunk_dropped)
                src, tgt = src[np.repeat(keep, src_lens)], tgt[np.repeat(keep, tgt_lens)]
                src_lens, tgt_lens = src_lens[keep], tgt_lens[keep]
                seen_tgt[tgt] = True
            if cooccurrence is not None and not cooccurrence.full:
                cooccurrence.add(src, src_lens, tgt, tgt_lens)
            tgt = tgt_vocab.to_side[tgt]             # the identity while training ids are still SentencePiece ids
            writers[0].append(src, src_lens)
            writers[1].append(tgt, tgt_lens)
            counts.update(pairs=len(src_lens), src_tokens=len(src), tgt_tokens=len(tgt),
                          src_unk=int(np.count_nonzero(src == UNK)), tgt_unk=int(np.count_nonzero(tgt == UNK)))
            bar.update(len(src_lines))
    if first_empty:
        shown = ", ".join(map(str, first_empty)) + (" ..." if counts["empty_lines"] > 5 else "")
        log(f"warning: {paths[0]} / {paths[1]}: {counts['empty_lines']} empty line(s), lines {shown}")
    return {**counts, "dropped": dict(dropped)} if seen_tgt is not None else dict(counts)


def _write_train(data: DataConfig, files: dict[str, tuple[Path, Path]], src_vocab: Vocab, tgt_vocab: Vocab,
                 dtypes: dict[str, np.dtype], seen_tgt: np.ndarray, out: Path,
                 cooccurrence: CooccurrenceCounts | None) -> dict[str, Any]:
    """All training corpora, one after the other, into one split; the entry lists each corpus's rows."""
    totals, corpora = Counter(dict.fromkeys(COUNTS, 0)), []
    dropped: Counter[str] = Counter()
    with (IdWriter(out / f"train.{data.src_lang}", dtypes["src"]) as src_writer,
          IdWriter(out / f"train.{data.tgt_lang}", dtypes["tgt"]) as tgt_writer):
        for name, prefix, weight in train_corpora(data):
            start = src_writer.sentences
            counts = _stream_corpus(data, files[name], src_vocab, tgt_vocab, (src_writer, tgt_writer),
                                    seen_tgt=seen_tgt, cooccurrence=cooccurrence)
            totals.update({key: counts[key] for key in COUNTS})
            dropped.update(counts["dropped"])
            corpora.append({"name": name, "prefix": prefix, "weight": weight, "start": start,
                            "end": src_writer.sentences, "pairs": counts["pairs"],
                            "input_pairs": counts["input_pairs"], "dropped": counts["dropped"]})
    entry = {**totals, "dropped": dict(dropped), "corpora": corpora}
    if not entry["pairs"]:          # empty corpora, or a length filter that drops every pair
        if not entry["input_pairs"]:
            raise DataError("`data.train`: the training corpora are empty")
        raise DataError(f"`data.train`: the length filter drops all {entry['input_pairs']} training pairs "
                        f"({_reasons(entry)}); check `data.min_len` {data.min_len}, "
                        f"`data.max_len` {data.max_len} and `data.max_len_ratio` {data.max_len_ratio}")
    check_epoch_rows([(corpus["name"], corpus["weight"], corpus["pairs"]) for corpus in corpora])
    return entry


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
    dtypes = {side: np.dtype(np.uint16 if len(vocab) <= 1 << 16 else np.int32)
              for side, vocab in (("src", src_vocab), ("tgt", tgt_vocab))}
    # Training ids are written as SentencePiece ids while the target pieces in use are gathered ...
    seen_tgt = np.zeros(len(tgt_vocab), dtype=bool)
    cooccurrence = (CooccurrenceCounts(len(src_vocab), len(tgt_vocab), data.shortlist_pairs)
                    if data.shortlist_k else None)
    splits = {"train": _write_train(data, files, src_vocab, tgt_vocab, dtypes, seen_tgt, out, cooccurrence)}
    vocab_entries: dict[str, Any] = {"src": {"model": src_model.name, "pieces": None},
                                     "tgt": {"model": tgt_model.name, "pieces": None}}
    if data.target_vocab_from_train or parent is not None:
        # ... then the target side's vocabulary is those pieces (or the parent's), and its ids are mapped in place.
        seen_tgt[[PAD, UNK, BOS, EOS]] = True
        tgt_vocab = Vocab(tgt_model, (np.flatnonzero(seen_tgt) if parent is None else parent[1].pieces).tolist())
        tgt_vocab.save_pieces(out / "tgt.pieces")
        vocab_entries["tgt"]["pieces"] = "tgt.pieces"
        map_ids_in_place(out / f"train.{data.tgt_lang}", dtypes["tgt"], tgt_vocab.to_side)
    for split in [split for split in SPLITS[1:] if split in files]:
        with (IdWriter(out / f"{split}.{data.src_lang}", dtypes["src"]) as src_writer,
              IdWriter(out / f"{split}.{data.tgt_lang}", dtypes["tgt"]) as tgt_writer,
              open(out / f"{split}.ref.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as reference):
            splits[split] = _stream_corpus(data, files[split], src_vocab, tgt_vocab, (src_writer, tgt_writer),
                                           reference)
        del splits[split]["input_pairs"]
        if not splits[split]["pairs"]:
            raise DataError(f"`data.{split}`: {files[split][0]} and {files[split][1]} are empty")
    vocab_entries["src"]["size"], vocab_entries["tgt"]["size"] = len(src_vocab), len(tgt_vocab)
    manifest = {"format": FORMAT_VERSION, "nmt_version": __version__, "fingerprint": fingerprint,
                "langs": {"src": data.src_lang, "tgt": data.tgt_lang},
                "special_ids": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
                "dtype": {side: dt.name for side, dt in dtypes.items()}, "vocab": vocab_entries, "splits": splits,
                "inputs": digests, "settings": dataclasses.asdict(data)}
    if cooccurrence:
        targets, frequent = cooccurrence.table(tgt_vocab.to_side, src_vocab.to_side, len(src_vocab),
                                               data.shortlist_k, data.shortlist_frequent, data.shortlist_score)
        manifest["shortlist"] = info = {"file": SHORTLIST_FILE, "k": data.shortlist_k, "frequent": len(frequent),
                                        "score": data.shortlist_score, "pairs": cooccurrence.pairs}
        ids = vocab_fingerprint(src_vocab.sp.serialized_model_proto(), tgt_vocab.sp.serialized_model_proto(),
                                tgt_vocab.pieces)
        save_shortlist(out / SHORTLIST_FILE, targets, frequent, ids, info)
    (out / "config.yaml").write_text(dump_config(config), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _replace_folder(tmp: Path, out_dir: Path) -> None:
    """Move the finished files from `tmp` into the locked `out_dir`, replacing nmt's old ones, the old manifest
    first and the new one last: a crash between leaves no manifest (a rebuild), never a mix that looks complete.
    The marker lists every file nmt may later delete, old and new, at each moment."""
    new = sorted(entry.name for entry in tmp.iterdir())
    old = (folders.read_marker(out_dir) or {}).get("files", [])
    for name in new:                    # data on disk before the names point at it
        if (tmp / name).is_file():
            with open(tmp / name, "rb+") as handle:
                os.fsync(handle.fileno())
    (out_dir / "manifest.json").unlink(missing_ok=True)
    folders.write_marker(out_dir, "data", [*old, *new])
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
    folders.write_marker(out_dir, "data", new)
    os.replace(tmp / "manifest.json", out_dir / "manifest.json")
    folders.fsync_folder(out_dir)
