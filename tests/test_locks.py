"""Folder locks (nmt/fs/locks.py): exclusive writers, shared readers, the holder named as the kernel sees it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nmt.fs.folders import LOCK, FolderError
from nmt.fs.locks import holds_lock, lock_folder, release_folder

from .conftest import nmt_server


def hold(folder: Path, code: str) -> subprocess.Popen:
    """A process that runs `code` (which locks `folder`), says "locked", and waits."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code) + "\nprint('locked', flush=True)\n"
                               "import time; time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def nmt_holder(folder: Path, command: str, shared: bool) -> subprocess.Popen:
    return hold(folder, f"from nmt.fs.locks import lock_folder; lock_folder({str(folder)!r}, {command!r}, {shared})")


def stop(holder: subprocess.Popen) -> None:
    holder.kill()
    holder.wait()


def test_a_holder_that_is_not_nmt_is_named_not_the_stale_pid_in_the_file(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / LOCK).write_text("999999 nmt train\n")            # left by a dead process
    holder = hold(folder, f"""
        import fcntl, os
        fd = os.open({str(folder / LOCK)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)""")
    try:
        with pytest.raises(FolderError) as refused:
            lock_folder(folder, "preprocess")
    finally:
        stop(holder)
    message = str(refused.value)
    assert f"in use by process {holder.pid} (python" in message and "999999" not in message
    assert lock_folder(folder, "preprocess") and (folder / LOCK).read_text() == f"{os.getpid()} nmt preprocess\n"
    release_folder(folder)


def test_a_reader_waits_out_the_moment_another_reader_holds_the_lock_alone(tmp_path):
    """A reader that finds the folder free holds it exclusively while it writes its record, then shares it: a
    reader starting at that moment (the other DDP rank) waits for the share instead of naming it a writer."""
    folder = tmp_path / "data"
    folder.mkdir()
    first = hold(folder, f"""
        import fcntl, os, threading, time
        fd = os.open({str(folder / LOCK)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        threading.Timer(0.5, fcntl.flock, (fd, fcntl.LOCK_SH)).start()""")
    try:
        assert lock_folder(folder, "train", shared=True)
        release_folder(folder)
    finally:
        stop(first)


def test_readers_share_a_folder_and_a_writer_is_told_who_reads(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    reader = nmt_holder(folder, "train", shared=True)
    try:
        assert lock_folder(folder, "train", shared=True)           # a second training on the same data
        release_folder(folder)
        with pytest.raises(FolderError, match=rf"in use by process {reader.pid} \(nmt train\); wait for it"):
            lock_folder(folder, "preprocess")
    finally:
        stop(reader)
    writer = nmt_holder(folder, "preprocess", shared=False)
    try:
        with pytest.raises(FolderError, match=rf"in use by process {writer.pid} \(nmt preprocess\)"):
            lock_folder(folder, "train", shared=True)
    finally:
        stop(writer)
    assert not holds_lock(folder)


def test_preprocess_waits_for_no_training_and_training_for_no_preprocess(prepared, tmp_path):
    from nmt.config import load_config
    from nmt.train.trainer import Trainer

    data = tmp_path / "data"           # a copy: other tests' trainers in this process may read the shared one
    shutil.copytree(load_config(prepared).data.out_dir, data)
    here = [f"data.out_dir={data}"]
    reader = nmt_holder(data, "train", shared=True)
    try:
        result = nmt_server().run("preprocess", "--config", str(prepared), "--set", here[0], "--force", text=True)
    finally:
        stop(reader)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1] == (f"error: {data.resolve()} is in use by process {reader.pid} "
                                                    "(nmt train); wait for it or stop it first")
    run = tmp_path / "run"
    writer = nmt_holder(data, "preprocess", shared=False)
    try:
        with pytest.raises(FolderError, match=rf"in use by process {writer.pid} \(nmt preprocess\)"):
            Trainer(load_config(prepared, [*here, f"training.run_dir={run}", "training.max_updates=1"]))
    finally:
        stop(writer)
    assert not run.exists() and not holds_lock(data)
    trainer = Trainer(load_config(prepared, [*here, f"training.run_dir={run}", "training.max_updates=1",
                                             "training.validate_every=1", "training.val_max_sentences=2"]))
    assert holds_lock(data)
    trainer.train()
    assert not holds_lock(data)                                  # let go when training ends


def test_preprocess_of_a_current_folder_runs_beside_trainings_and_a_rebuild_waits(tmp_path, capsys):
    """A data folder that trainings read (shared lock) and that is up to date: `nmt preprocess` says so instead
    of naming the readers, as the quickstart of a second config needs; new settings still wait for them."""
    from nmt.config import load_config
    from nmt.data.preprocess import preprocess

    from .conftest import make_config, write_slice

    corpus = tmp_path / "corpus"
    write_slice(corpus, "train", 200)
    config = load_config(make_config(tmp_path, corpus, data={"dev": None, "test": None, "vocab_size": 150}))
    out = preprocess(config)
    manifest = (out / "manifest.json").read_bytes()
    reader = nmt_holder(out, "train", shared=True)
    try:
        capsys.readouterr()
        assert preprocess(config) == out
        assert "up to date" in capsys.readouterr().err and not holds_lock(out)
        changed = load_config(make_config(tmp_path, corpus, data={"dev": None, "test": None, "vocab_size": 160}))
        with pytest.raises(FolderError, match=rf"in use by process {reader.pid} \(nmt train\)"):
            preprocess(changed)
        assert (out / "manifest.json").read_bytes() == manifest           # nothing rewritten under the reader
    finally:
        stop(reader)
    preprocess(changed)                                                   # free again: rebuilt
    assert (out / "manifest.json").read_bytes() != manifest
