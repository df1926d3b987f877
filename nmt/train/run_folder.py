"""The run folder (rank 0's): its lock, what may be written there, resume checks, metrics.jsonl.

A new run takes an empty folder (with --overwrite, one nmt marked) and writes the config, tokenizer and data
manifest; --resume refuses config changes that move the data stream its cursor points into.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from nmt.config import Config, dump_config
from nmt.data.folder import DataFolder, train_corpora
from nmt.data.shortlist import SHORTLIST_FILE
from nmt.fs import folders
from nmt.fs.bounded import loads_json, read_json
from nmt.fs.locks import lock_folder, open_work_folder, release_folder

DATA_STREAM_KEYS = ("training.seed", "training.batch_tokens", "training.batch_size", "training.bucket_pool")
# what the dev scores of validation depend on (its greedy outputs, the sentences, how BLEU and chrF count)
SCORING_KEYS = ("training.bleu_tokenize", "training.bleu_lowercase", "training.val_max_sentences",
                "decoding.max_len_ratio", "decoding.min_len")
FIXED_FOR_A_RUN = {
    "training.optimizer": "the checkpoint holds the other optimizer's state",
    **dict.fromkeys(SCORING_KEYS, "best.pt, the kept best checkpoints, patience and the plateau schedule compare "
                                  "the dev scores of all validations on one scale"),
    "training.early_stopping_metric": "the best score so far and best.pt were chosen by the other metric",
    "training.init_from": "the weights came from the first parent",
    "training.init_optimizer": "the optimiser state came from the first parent, or was fresh",
}


class RunDirError(ValueError):
    """The run folder cannot be used as asked."""


class RunFolder:
    """`training.run_dir`: rank 0 checks, locks and writes it; other ranks do nothing."""

    def __init__(self, path: Path, is_main: bool) -> None:
        self.path = Path(path)
        self.is_main = is_main
        self.locked = False            # this object took the folder's lock (and so lets go of it)

    def prepare(self, config: Config, data: DataFolder, resume: bool, overwrite: bool,
                config_path: str | Path | None) -> None:
        if not self.is_main:
            return
        d = config.data
        inputs = [Path(prefix) for _, prefix, _ in train_corpora(d)] if d.train else []
        inputs += [Path(p) for p in (d.dev, d.test, d.src_spm_model, d.tgt_spm_model) if p]
        folders.check_overlap(self.path, "training.run_dir", inputs, config_path)
        data_root, run = data.root.resolve(), self.path.resolve()
        if run == data_root or data_root in run.parents or run in data_root.parents:
            raise RunDirError(f"`training.run_dir` {self.path} overlaps the data folder {data.root}; "
                              "choose a folder outside it")
        if resume:
            self._open_for_resume()
            return
        folders.refuse_inputs_inside(self.path, "training.run_dir", [("training.init_from", config.training.init_from)],
                                     "a new run replaces (--overwrite clears it)")
        exists = self.path.is_dir() and any(p.name not in (folders.MARKER, folders.LOCK) for p in self.path.iterdir())
        if exists and not overwrite:
            marker = folders.read_marker(self.path)
            if marker is not None and marker.get("kind") == "run" and not (self.path / "last.pt").is_file():
                raise RunDirError(f"run folder {self.path} holds no last.pt to resume (a run that stopped "
                                  "before its first checkpoint?); pass --overwrite to start over")
            raise RunDirError(f"run folder {self.path} is not empty; pass --resume to continue it or "
                              "--overwrite to start over")
        _, marker = open_work_folder(self.path, "run", "training.run_dir", "train", "remove them yourself")
        self.locked = True
        if marker is not None:
            folders.remove_nmt_files(self.path, marker)
        self.write_config(config)
        entries = [data.manifest["vocab"][side] for side in ("src", "tgt")]
        names = [name for entry in entries for name in (entry["model"], entry.get("pieces"))]
        names += [SHORTLIST_FILE] if data.manifest.get("shortlist") else []     # checkpoints embed it
        for name in names:
            if name and not (self.path / name).exists():     # the two sides may share a model
                folders.register_file(self.path / name)
                folders.copy_atomically(data.root / name, self.path / name)
        folders.copy_atomically(data.root / "manifest.json", self.path / "data_manifest.json")

    def _open_for_resume(self) -> None:
        if not (self.path / "last.pt").is_file():
            raise RunDirError(f"cannot resume: {self.path / 'last.pt'} does not exist")
        marker = folders.read_marker(self.path)
        if marker is None or marker.get("kind") != "run":
            what = f"an nmt {marker.get('kind')} folder" if marker else f"not an nmt run folder (no {folders.MARKER})"
            raise RunDirError(f"cannot resume: {self.path} is {what}")
        lock_folder(self.path, "train")
        self.locked = True
        folders.refuse_links(self.path, "training.run_dir")     # its files are rewritten, never through a link
        folders.remove_leftovers(self.path)

    def release(self) -> None:
        if self.locked:
            release_folder(self.path)
            self.locked = False

    def write_config(self, config: Config) -> None:
        folders.atomic_write(self.path / "config.yaml", lambda h: h.writelines([dump_config(config)]), mode="w")

    def record_resume_changes(self, changed: dict[str, tuple[Any, Any]], config: Config) -> None:
        """Log the accepted changes and store the resulting config."""
        if not self.is_main:
            return
        for key, (before, after) in changed.items():
            tqdm.write(f"resume: {key} {before!r} -> {after!r}", file=sys.stderr)
        if changed:
            self.write_config(config)

    def data_mismatch(self, data: DataFolder) -> str | None:
        """Why the data folder is not the one this run was trained on, if it is not."""
        recorded = self.path / "data_manifest.json"
        try:
            fingerprint = read_json(recorded).get("fingerprint") if recorded.is_file() else None
        except (OSError, ValueError, AttributeError):
            return None
        if fingerprint and fingerprint != data.manifest.get("fingerprint"):
            return (f"--resume: the data folder {data.root} holds other data than this run was "
                    f"trained on ({recorded}); keep the data or start a new run")
        return None

    def trim_metrics(self, step: int) -> None:
        """Drop events after the restored step (lost to a kill) and a torn last line."""
        path = self.path / "metrics.jsonl"
        if not self.is_main or not path.is_file():
            return

        def kept(line: str) -> bool:
            try:
                event = loads_json(line)
            except ValueError:
                return False
            return isinstance(event, dict) and event.get("step", 0) <= step

        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").split("\n") if line]
        keep = [line + "\n" for line in lines if kept(line)]
        if len(keep) < len(lines):
            folders.atomic_write(path, lambda h: h.writelines(keep), mode="w")

    def log(self, event: dict[str, Any]) -> None:
        if self.is_main:
            line = json.dumps({"time": round(time.time(), 3), **event})
            folders.append_text(self.path / "metrics.jsonl", line + "\n")


def resume_changes(saved: Config, config: Config) -> dict[str, tuple[Any, Any]]:
    """Refuse changes that move the data stream; return the others as {key: (before, after)}."""
    old, new = ({f"{section}.{key}": value for section, values in c.to_dict().items() for key, value in values.items()}
                for c in (saved, config))
    changed = {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
               if old.get(k) != new.get(k) and k not in ("training.run_dir", "data.out_dir")}
    for key, (before, after) in changed.items():
        if key.startswith("data.") or key in DATA_STREAM_KEYS or key in FIXED_FOR_A_RUN:
            why = FIXED_FOR_A_RUN.get(key, "it changes the data stream the checkpoint continues")
            raise RunDirError(f"--resume cannot change `{key}` ({before!r} -> {after!r}): {why}; keep it or "
                              "start a new run")
    return changed
