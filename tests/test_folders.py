"""Folder markers, locks, leftovers, overlap checks and atomic writes (nmt/fs/folders.py)."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nmt.fs import folders
from nmt.fs.folders import (
    LOCK,
    MARKER,
    FolderError,
    PendingFile,
    atomic_write,
    check_overlap,
    copy_atomically,
    foreign_files,
    read_marker,
    remove_leftovers,
    remove_nmt_files,
    write_marker,
)
from nmt.fs.locks import lock_folder, open_work_folder, release_folder
from nmt.fs.outputs import check_output_path, output_target


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_write_gives_the_umask_mode_and_leaves_no_temporary(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "out.bin", lambda h: h.write(b"data"))
        atomic_write(tmp_path / "out.txt", lambda h: h.write("ä\r\n"), mode="w")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "out.bin") == mode_of(tmp_path / "out.txt") == 0o666 & ~umask
    assert (tmp_path / "out.txt").read_bytes() == "ä\r\n".encode()     # no newline translation
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin", "out.txt"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_atomic_write_without_replace_never_replaces_a_file_that_appeared(tmp_path, monkeypatch, hard_links):
    """Two `nmt export -o same.nmt` at once: the later rename must fail, not replace the other's file."""
    if not hard_links:                                   # FAT, some network file systems
        monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no links")))
    target = tmp_path / "model.nmt"

    def racing(handle):
        handle.write(b"mine")
        target.write_bytes(b"theirs")                  # another process finished first

    with pytest.raises(FileExistsError):
        atomic_write(target, racing, replace=False)
    assert target.read_bytes() == b"theirs" and [p.name for p in tmp_path.iterdir()] == ["model.nmt"]
    target.unlink()
    atomic_write(target, lambda h: h.write(b"mine"), replace=False)
    assert target.read_bytes() == b"mine" and [p.name for p in tmp_path.iterdir()] == ["model.nmt"]


def test_atomic_write_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("old")

    def explode(handle):
        handle.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, explode, mode="w")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "folder", lambda h: h.write(b"x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "keep.txt"]


def test_temporary_names_are_unpredictable_and_never_follow_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    # The old predictable name, planted as a symlink, is not used.
    (tmp_path / f".out.tmp-{os.getpid()}").symlink_to(victim)
    names = set()
    for _ in range(5):
        pending = PendingFile(tmp_path / "out")
        names.add(pending.tmp.name)
        assert not pending.tmp.is_symlink()
        pending.discard()
    assert len(names) == 5
    atomic_write(tmp_path / "out", lambda h: h.write(b"new"))
    assert victim.read_text() == "precious" and (tmp_path / "out").read_bytes() == b"new"


def test_check_output_path(tmp_path):
    check_output_path(tmp_path / "new.txt", "--output")
    with pytest.raises(FolderError, match=f"--output: folder {tmp_path}/missing does not exist"):
        check_output_path(tmp_path / "missing" / "x.txt", "--output")
    with pytest.raises(FolderError, match="is a folder"):
        check_output_path(tmp_path, "--output")


def test_leftovers_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".last.pt.{dead_pid}-abc123{folders.TEMP_SUFFIX}").write_bytes(b"x")
        (tmp_path / f".build.{dead_pid}-q1{folders.TEMP_SUFFIX}").mkdir()
        (tmp_path / f".out.txt.{os.getpid()}-zz{folders.TEMP_SUFFIX}").write_bytes(b"x")   # ours: a leftover too
        (tmp_path / f".last.pt.{live.pid}-abc{folders.TEMP_SUFFIX}").write_bytes(b"x")
        (tmp_path / ".hidden.1-user.txt").write_bytes(b"x")             # not an nmt temporary name
        assert remove_leftovers(tmp_path, "out.txt") == [f".out.txt.{os.getpid()}-zz{folders.TEMP_SUFFIX}"]
        removed = remove_leftovers(tmp_path)
        assert len(removed) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f".last.pt.{live.pid}-abc{folders.TEMP_SUFFIX}", ".hidden.1-user.txt"])
    finally:
        live.kill()
        live.wait()


def test_markers_and_foreign_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert read_marker(run) is None
    write_marker(run, "run")
    for name in ("last.pt", "best.pt", "best-step40.pt", "config.yaml", "metrics.jsonl", "notes.txt", "best.pt.bak"):
        (run / name).write_text("x")
    (run / "mine").mkdir()
    marker = read_marker(run)
    assert marker["kind"] == "run"
    assert foreign_files(run, marker) == ["best.pt.bak", "mine", "notes.txt"]
    remove_nmt_files(run, marker)
    assert sorted(p.name for p in run.iterdir()) == [MARKER, "best.pt.bak", "mine", "notes.txt"]

    data = tmp_path / "data"
    data.mkdir()
    write_marker(data, "data", ["manifest.json", "train.de.ids"])
    (data / "manifest.json").write_text("{}")
    (data / "train.de.ids").write_text("")
    (data / "train.de.ids.orig").write_text("")
    assert foreign_files(data, read_marker(data)) == ["train.de.ids.orig"]
    (data / MARKER).write_text("not json")
    assert read_marker(data) is None


def test_open_work_folder_refuses_foreign_folders_and_other_kinds(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    with pytest.raises(FolderError, match=r"holds files nmt did not write \(thesis.tex\)"):
        open_work_folder(user, "run", "training.run_dir", "train", "remove them yourself")
    assert [p.name for p in user.iterdir()] == ["thesis.tex"]          # no lock or marker left in it
    data = tmp_path / "data"
    created, marker = open_work_folder(data, "data", "data.out_dir", "preprocess", "remove them yourself")
    assert created and marker is None and read_marker(data)["kind"] == "data"
    release_folder(data)
    with pytest.raises(FolderError, match="is an nmt data folder, not a run folder"):
        open_work_folder(data, "run", "training.run_dir", "train", "remove them yourself")
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(FolderError, match="is a file, not a folder"):
        open_work_folder(plain, "run", "training.run_dir", "train", "remove them yourself")


def test_lock_is_exclusive_across_processes_and_names_the_holder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from nmt.fs.locks import lock_folder
            lock_folder({str(folder)!r}, "train")
            print("locked", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderError, match=rf"is in use by process {holder.pid} \(nmt train\)"):
            lock_folder(folder, "train")
    finally:
        holder.kill()
        holder.wait()
    lock_folder(folder, "train")           # the kernel released the dead holder's lock
    lock_folder(folder, "train")           # re-entrant within one process
    assert (folder / LOCK).read_text().split()[0] == str(os.getpid())
    release_folder(folder)


@pytest.mark.parametrize(("relative", "ok"), [
    ("corpus", False),            # is the raw-input folder
    ("corpus/out", False),        # lies inside it
    (".", False),                 # contains it (and the config)
    ("conf", False),              # is the config file's folder
    ("elsewhere/out", True),
    ("conf/run", True),           # beside the config file is allowed
])
def test_overlaps_with_inputs_and_config(tmp_path, relative, ok):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "conf").mkdir()
    inputs = [tmp_path / "corpus" / "train.de", tmp_path / "corpus" / "train.en"]
    target = tmp_path / relative
    if ok:
        check_overlap(target, "data.out_dir", inputs, tmp_path / "conf" / "c.yaml")
    else:
        with pytest.raises(FolderError, match="`data.out_dir`"):
            check_overlap(target, "data.out_dir", inputs, tmp_path / "conf" / "c.yaml")


def test_registered_files_count_as_nmts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "run")
    (run / "avg.pt").write_bytes(b"x")
    (run / "mine.pt").write_bytes(b"x")
    folders.register_file(run / "avg.pt")          # what `nmt average -o RUN/avg.pt` does
    folders.register_file(tmp_path / "elsewhere.pt")   # not in a run folder: nothing to record
    assert foreign_files(run, read_marker(run)) == ["mine.pt"]
    assert not (tmp_path / MARKER).exists()


def test_a_file_that_cannot_be_created_is_named_not_its_temporary(tmp_path):
    folder = tmp_path / "gone"
    with pytest.raises(OSError) as failed:
        PendingFile(folder / "out.txt")
    assert failed.value.filename == str(folder / "out.txt") and folders.TEMP_SUFFIX not in str(failed.value)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs /proc/self/mem (Linux)")
def test_a_copy_whose_source_cannot_be_read_names_the_source_and_keeps_the_target(tmp_path):
    target = tmp_path / "copy.bin"
    target.write_bytes(b"old")
    with pytest.raises(OSError) as failed:     # opens, then every read fails with EIO and no file name
        copy_atomically("/proc/self/mem", target)
    assert failed.value.filename == "/proc/self/mem"
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["copy.bin"]
    copy_atomically(__file__, target)
    assert target.read_bytes() == Path(__file__).read_bytes()


def test_outputs_are_written_through_symlinks_and_pipes_are_streams(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target.name)
    with pytest.raises(FolderError, match="is a symbolic link"):   # an atomic write never follows a link itself
        atomic_write(link, lambda h: h.write("new"), mode="w")
    assert target.read_text() == "old"
    atomic_write(output_target(link, "--output"), lambda h: h.write("new"), mode="w")   # a user's output may
    assert link.is_symlink() and os.readlink(link) == "real.txt" and target.read_text() == "new"
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert check_output_path(pipe, "--output") == pipe                 # written directly (open_output)
    with pytest.raises(OSError, match="not a regular file"):       # an atomic write never replaces one
        atomic_write(pipe, lambda h: h.write(b"x"))
    assert pipe.is_fifo()
    (tmp_path / "to_pipe").symlink_to(pipe)
    assert check_output_path(tmp_path / "to_pipe", "--output") == pipe
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    with pytest.raises(FolderError, match="sock is a socket, not a regular file, a pipe or a character device"):
        check_output_path(tmp_path / "sock", "--output")
    server.close()


def test_a_marker_that_is_a_link_or_names_outside_its_folder_makes_the_folder_foreign(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    data = tmp_path / "data"
    data.mkdir()
    for names in (["../victim.txt"], [str(victim)], ["sub/x"], [".."], "train.ids", [7]):
        (data / MARKER).write_text(json.dumps({"kind": "data", "files": names}))
        with pytest.raises(FolderError, match="not a plain file name inside"):
            open_work_folder(data, "data", "data.out_dir", "preprocess", "remove them yourself")
    real = tmp_path / "marker.json"
    real.write_text(json.dumps({"kind": "data", "files": []}))
    (data / MARKER).unlink()
    (data / MARKER).symlink_to(real)
    with pytest.raises(FolderError, match="is a symbolic link"):
        open_work_folder(data, "data", "data.out_dir", "preprocess", "remove them yourself")
    assert sorted(p.name for p in data.iterdir()) == [MARKER] and victim.read_text() == "mine"
    assert real.read_text() == json.dumps({"kind": "data", "files": []})


def test_a_link_in_an_nmt_folder_makes_it_foreign_and_is_never_written_through(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (run / "metrics.jsonl").symlink_to(victim)
    assert foreign_files(run, read_marker(run)) == ["metrics.jsonl"]
    with pytest.raises(FolderError, match=r"holds symbolic links \(metrics.jsonl\)"):
        open_work_folder(run, "run", "training.run_dir", "train", "remove them yourself")
    with pytest.raises(FolderError, match="is a symbolic link"):
        atomic_write(run / "metrics.jsonl", lambda h: h.write("x"), mode="w")
    with pytest.raises(OSError):
        folders.append_text(run / "metrics.jsonl", "x\n")
    assert victim.read_text() == "mine"
    assert folders.plain_name("best-step4.pt") and not any(
        folders.plain_name(n) for n in ("", ".", "..", "../x", "/x", "a/b", None, 3))


def _tensorboard_run(run: Path) -> Path:
    """A marked run folder with nmt's files and a tensorboard folder of event files, registered as
    `training.tensorboard` registers it."""
    if not run.exists():
        run.mkdir(parents=True)
        write_marker(run, "run")
        (run / "last.pt").write_text("x")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host.1.0").write_text("events")
    folders.register_file(run / "tensorboard")
    return run


def test_foreign_files_are_found_inside_nmts_subfolders_and_kept_by_removal(tmp_path):
    run = _tensorboard_run(tmp_path / "run")
    assert foreign_files(run, read_marker(run)) == []
    (run / "tensorboard" / "notes.txt").write_text("mine")
    (run / "tensorboard" / "plots").mkdir()
    (run / "tensorboard" / "events.link").symlink_to(run / "last.pt")
    assert foreign_files(run, read_marker(run)) == ["tensorboard/events.link", "tensorboard/notes.txt",
                                                    "tensorboard/plots"]
    with pytest.raises(FolderError, match=r"holds files nmt did not write \(tensorboard/events.link, "
                                          r"tensorboard/notes.txt, tensorboard/plots\)"):
        open_work_folder(run, "run", "training.run_dir", "train", "remove them yourself")
    remove_nmt_files(run, read_marker(run))      # even when asked directly: only nmt's files go
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == ["events.link", "notes.txt", "plots"]
    assert not (run / "last.pt").exists() and (run / "last.pt").is_symlink() is False
    (run / "tensorboard" / "events.link").unlink()
    (run / "tensorboard" / "notes.txt").unlink()
    (run / "tensorboard" / "plots").rmdir()
    (run / "tensorboard" / "events.out.tfevents.2.host.1.0").write_text("events")
    remove_nmt_files(run, read_marker(run))      # nothing but nmt's left: the folder goes too
    assert sorted(p.name for p in run.iterdir()) == [MARKER]


def test_a_folder_the_marker_names_holds_only_what_nmt_writes_there(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_marker(data, "data", ["manifest.json", "notes"])       # a marker naming a folder of the user's
    (data / "notes").mkdir()
    (data / "notes" / "todo.txt").write_text("mine")
    assert foreign_files(data, read_marker(data)) == ["notes/todo.txt"]
    remove_nmt_files(data, read_marker(data))
    assert (data / "notes" / "todo.txt").read_text() == "mine"


def test_inputs_inside_a_folder_to_clear_are_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_text("x")
    (tmp_path / "parent.pt").write_text("x")
    folders.refuse_inputs_inside(run, "training.run_dir", [("training.init_from", tmp_path / "parent.pt"),
                                                           ("training.init_from", None)], "a new run replaces")
    (tmp_path / "link.pt").symlink_to(run / "best.pt")
    for given in (run / "best.pt", tmp_path / "link.pt", tmp_path / "run" / ".." / "run" / "best.pt"):
        with pytest.raises(FolderError, match=f"`training.init_from` {given} lies inside `training.run_dir` {run}"):
            folders.refuse_inputs_inside(run, "training.run_dir", [("training.init_from", given)], "a new run replaces")


def _cli(*args: str):
    from tests.conftest import nmt_server

    return nmt_server().run(*args, text=True, timeout=120)


def _one_error(result, message: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert message in lines[0] and "Traceback" not in result.stderr, lines[0]


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_train_overwrite_keeps_a_users_file_inside_the_tensorboard_folder(trained_run, prepared, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns(LOCK))
    _tensorboard_run(run)
    (run / "tensorboard" / "notes.txt").write_text("my notes")
    before = _listing(run)
    result = _cli("train", "--config", str(prepared), "--set", f"training.run_dir={run}", "--overwrite")
    _one_error(result, f"{run} holds files nmt did not write (tensorboard/notes.txt)")
    assert _listing(run) == before


def test_train_overwrite_refuses_to_clear_the_parent_it_fine_tunes_from(trained_run, prepared, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns(LOCK))
    before = _listing(run)
    result = _cli("train", "--config", str(prepared), "--init-from", str(run / "best.pt"),
                  "--set", f"training.run_dir={run}", "--overwrite")
    _one_error(result, f"`training.init_from` {run / 'best.pt'} lies inside `training.run_dir` {run}")
    assert _listing(run) == before


def test_preprocess_refuses_inputs_inside_the_data_folder_it_rewrites(trained_run, prepared, tmp_path):
    import shutil

    import yaml

    data = tmp_path / "data"
    shutil.copytree(yaml.safe_load(prepared.read_text())["data"]["out_dir"], data, ignore=shutil.ignore_patterns(LOCK))
    folders.register_file(data / "spm.model")
    shutil.copy(trained_run / "best.pt", data / "parent.pt")
    for lang in ("de", "en"):
        (data / f"raw.{lang}").write_text("ein Hund .\n" if lang == "de" else "a dog .\n")
    before = _listing(data)
    for args, message in (
            (["--init-from", str(data / "parent.pt")],
             f"`training.init_from` {data / 'parent.pt'} lies inside `data.out_dir` {data}, which preprocess rewrites"),
            (["--set", f"data.src_spm_model={data / 'spm.model'}"],
             f"`data.out_dir`: {data} overlaps {data}, the folder of the input {data / 'spm.model'}"),
            (["--set", f"data.dev={data / 'raw'}"], f"the folder of the input {data / 'raw.de'}")):
        result = _cli("preprocess", "--config", str(prepared), "--set", f"data.out_dir={data}", "--force", *args)
        _one_error(result, message)
        assert _listing(data) == before


def test_a_failed_first_preprocess_leaves_a_file_someone_put_in_its_new_folder(tmp_path, corpus_dir, monkeypatch):
    """A preprocess that created its data folder and then failed removes its marker, lock and temporaries, and
    the folder only if nothing else is in it: never a file that appeared there meanwhile."""
    from nmt.config import load_config
    from nmt.data import preprocess as module

    from .conftest import make_config

    config = load_config(make_config(tmp_path, corpus_dir))
    out_dir = Path(config.data.out_dir)

    def fail_midway(_config, _files, folder, *_args):
        (folder / "notes.txt").write_text("mine")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(module, "_preprocess_locked", fail_midway)
    with pytest.raises(RuntimeError, match="disk on fire"):
        module.preprocess(config)
    assert sorted(p.name for p in out_dir.iterdir()) == ["notes.txt"]
    assert (out_dir / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------- a folder built beside its target


def build_files(names: list[str]):
    def build(tmp: Path) -> str:
        for name in names:
            (tmp / name).write_text(name)
        write_marker(tmp, "onnx", names)
        return "built"
    return build


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_build_folder_renames_a_complete_folder_with_the_umask_mode(tmp_path, umask):
    target = tmp_path / "out"
    old = os.umask(umask)
    try:
        assert folders.build_folder(target, build_files(["a.onnx"]), lambda: None) == "built"
    finally:
        os.umask(old)
    assert mode_of(target) == 0o777 & ~umask and sorted(p.name for p in target.iterdir()) == [MARKER, "a.onnx"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]              # no temporary folder left beside it


@pytest.mark.parametrize("failure", [KeyboardInterrupt, ValueError])
def test_build_folder_that_fails_leaves_the_target_as_it_was(tmp_path, failure):
    """A build or a final check that fails (a signal included): the old folder stays, nothing is left beside it."""
    target = tmp_path / "out"
    folders.build_folder(target, build_files(["old.onnx"]), lambda: None)

    def broken(tmp: Path) -> None:
        (tmp / "half.onnx").write_text("x")
        raise failure()

    def refuse() -> None:
        raise failure()

    for build, check in ((broken, lambda: None), (build_files(["new.onnx"]), refuse)):
        with pytest.raises(failure):
            folders.build_folder(target, build, check)
        assert [p.name for p in tmp_path.iterdir()] == ["out"] and (target / "old.onnx").read_text() == "old.onnx"


def test_build_folder_replaces_a_marked_folder_and_restores_it_when_the_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "out"
    folders.build_folder(target, build_files(["old.onnx"]), lambda: None)
    rename, calls = os.rename, []

    def failing(source, destination):
        calls.append(source)
        if len(calls) == 2:                     # the new folder's rename, after the old one went aside
            raise OSError(28, "No space left on device")
        rename(source, destination)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError):
        folders.build_folder(target, build_files(["new.onnx"]), lambda: None)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (target / "old.onnx").is_file()
    folders.build_folder(target, build_files(["new.onnx"]), lambda: None)
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "new.onnx"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
