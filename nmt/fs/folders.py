"""What nmt may delete and when: folder markers, locks, leftovers, path overlaps, atomic writes.

A run folder or data folder carries a marker file, `.nmt-folder.json`, that nmt writes when it creates or adopts the
folder. Only a marked folder is ever cleared, and only of the files nmt writes there; anything else in it is foreign
and makes nmt refuse. One process writes in a folder at a time: it holds an exclusive `flock` on the folder's
`.nmt.lock` (see nmt.fs.locks; the kernel lets go when it dies). Every file is written atomically: to an unpredictable
temporary name beside it (`.NAME.PID-RANDOM.nmt-tmp`, created with O_EXCL), fsynced, then renamed into place with
the mode the umask gives a new file; temporaries of dead processes are removed the next time a command opens the
folder.

Nothing in a folder of nmt's is ever written through a symbolic link, and every name a marker
lists is a plain file name inside its folder: a link there, a marker that is a link, or a marker
naming `../x` or `/x` makes the folder foreign. (An output the user names may be a link: see
nmt.fs.outputs, which decides where such a write lands before it reaches `PendingFile`.)
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from nmt.fs.bounded import loads_json

MARKER = ".nmt-folder.json"
LOCK = ".nmt.lock"
TEMP_SUFFIX = ".nmt-tmp"
MAX_MARKER_BYTES = 1 << 20          # a marker lists file names: a few KB
_TEMP_NAME = re.compile(r"^\..*\.(\d+)-[^./]+" + re.escape(TEMP_SUFFIX) + "$")

# The files nmt writes into a run folder and an attention-plot folder (a data folder lists its own
# files in its marker).
RUN_FILES = ("config.yaml", "metrics.jsonl", "last.pt", "best.pt", "best-step*.pt", "spm.model", "src.model",
             "tgt.model", "tgt.pieces", "data_manifest.json")
NMT_FILES = {"run": RUN_FILES, "attention": ("attention-*.png",)}
# What nmt writes inside the folders it writes into a folder of its own (`training.tensorboard`'s event
# files); anything else there is foreign, and a folder nmt's marker names that is not one of these is
# nmt's only while it is empty.
SUBFOLDER_FILES = {"tensorboard": ("events.out.tfevents.*",)}


class FolderError(ValueError):
    """A folder nmt may not use as asked: foreign files, locked by another process, overlapping inputs."""


def plain_name(name: object) -> bool:
    """A file name inside a folder: a non-empty string with no separator that is not `.` or `..`
    (so no absolute path either). Every name read from a marker, manifest or checkpoint must be one."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- files


def new_file_mode() -> int:
    """The mode `open()` would give a new file under the current umask (0o644 under umask 022)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _naming(exc: OSError, path: Path) -> OSError:
    """`exc` with `path` as its file name if it has none (a full disk reports none)."""
    return exc if exc.filename is not None else OSError(exc.errno, exc.strerror or str(exc), str(path))


class _NamedErrors:
    """A file handle whose write errors name the file asked for, not nothing (or the temporary file)."""

    def __init__(self, handle: IO[Any], path: Path) -> None:
        self._handle, self._path = handle, path
        self.error: OSError | None = None     # the first write error, for callers that lose it (torch.save)

    def write(self, data: Any) -> int:
        try:
            return self._handle.write(data)
        except OSError as exc:
            raise self._named(exc) from None

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as exc:
            raise self._named(exc) from None

    def _named(self, exc: OSError) -> OSError:
        self.error = self.error or _naming(exc, self._path)
        return self.error

    def __getattr__(self, name: str) -> Any:          # everything else as the file object has it
        return getattr(self._handle, name)


class PendingFile:
    """A file being written under a temporary name beside `path`; `commit` renames it into place.
    Errors while writing or committing name `path`."""

    def __init__(self, path: str | Path, mode: str = "wb") -> None:
        self.path = Path(path)
        if _is_link(self.path):      # a user's output is resolved first (nmt.fs.outputs.output_target)
            raise FolderError(f"{self.path} is a symbolic link; nmt never writes through a link here "
                              "(remove the link, or name the file it points to)")
        if self.path.exists() and not self.path.is_file() and not self.path.is_dir():   # the rename would replace it
            raise OSError(errno.EINVAL, "not a regular file (a pipe or a device); give a file name", str(self.path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.{os.getpid()}-", suffix=TEMP_SUFFIX,
                                       dir=self.path.parent)
        except OSError as exc:        # name the file asked for, not the temporary one
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self.tmp = Path(tmp)
        try:
            os.fchmod(fd, new_file_mode())
            text: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}
            self._writer = _NamedErrors(os.fdopen(fd, mode, **text), self.path)
            self.handle: IO[Any] = self._writer  # type: ignore[assignment]
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise

    @property
    def write_error(self) -> OSError | None:
        """The first error writing to `handle`, named: for a writer that reports it its own way."""
        return self._writer.error

    def commit(self) -> None:
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.discard()
            raise _naming(exc, self.path) from None
        except BaseException:
            self.discard()
            raise
        fsync_folder(self.path.parent)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.handle.close()
        self.tmp.unlink(missing_ok=True)


def atomic_write(path: str | Path, write: Callable[[IO], object], mode: str = "wb") -> None:
    """Call `write(handle)` on an unpredictably named temporary file beside `path`, fsync, rename over `path`."""
    pending = PendingFile(path, mode)
    try:
        write(pending.handle)
        pending.commit()
    except OSError as exc:            # name the file (a full disk reports no file name)
        pending.discard()
        raise _naming(exc, Path(path)) from None
    except RuntimeError:              # torch.save turns a failed write into an opaque RuntimeError
        pending.discard()
        if pending.write_error is not None:
            raise pending.write_error from None
        raise
    except BaseException:
        pending.discard()
        raise


def append_text(path: str | Path, text: str) -> None:
    """Append `text` to a file of nmt's (metrics.jsonl), created if missing; never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, new_file_mode())
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(text)


def copy_atomically(source: str | Path, target: str | Path) -> None:
    """Copy a file's bytes to `target` the way atomic_write writes (the umask's mode, not the source's).
    A read error names `source` (reads report no file name; atomic_write would name `target`)."""
    with open(source, "rb") as handle:
        def copy(out: IO[bytes]) -> None:
            while True:
                try:
                    block = handle.read(1 << 20)
                except OSError as exc:
                    raise _naming(exc, Path(source)) from None
                if not block:
                    return
                out.write(block)

        atomic_write(target, copy)


def fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _temp_owner(name: str) -> int | None:
    match = _TEMP_NAME.match(name)
    return int(match.group(1)) if match else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(folder: str | Path, target: str | None = None) -> list[str]:
    """Remove temporaries that killed nmt processes left in `folder` (only for `target` if given).

    A temporary is a leftover when its process is gone, or when it carries this process's id
    (call this before writing anything: under a lock, a container's PID 1 is its own leftover).
    """
    folder = Path(folder)
    removed: list[str] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        owner = _temp_owner(entry.name)
        if owner is None or (target is not None and not entry.name.startswith(f".{target}.")):
            continue
        if owner == os.getpid() or not process_alive(owner):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


# ---------------------------------------------------------------------------------------------- markers


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The folder's marker; None when it has none (or none nmt can read). A marker that is a symbolic
    link, or that lists a name which is not a plain file name in the folder, is a `FolderError`."""
    path = Path(folder) / MARKER
    try:             # never through a link; never waiting on a pipe
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FolderError(f"{path} is a symbolic link, which nmt's marker never is: {folder} is not a folder "
                              "nmt may use; remove the link yourself or choose another folder") from None
        return None
    try:
        with os.fdopen(fd, "rb") as handle:      # a marker nmt wrote is a small regular file
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            marker = loads_json(handle.read(MAX_MARKER_BYTES + 1).decode("utf-8"), MAX_MARKER_BYTES)
    except (OSError, ValueError):                # past a bound too (nmt.fs.bounded)
        return None
    if not isinstance(marker, dict) or "kind" not in marker:
        return None
    files = marker.get("files", [])
    bad = [files] if not isinstance(files, list) else [name for name in files if not plain_name(name)]
    if bad:
        raise FolderError(f"{path} lists {bad[0]!r}, which is not a plain file name inside {folder}: the folder is "
                          "not one nmt may use; remove the marker yourself or choose another folder")
    return marker


def own_marker(folder: str | Path) -> dict[str, Any] | None:
    """The folder's marker, or None also when the marker is not nmt's (a link, names outside the folder):
    for a user's output written into a folder, which such a marker must not block."""
    try:
        return read_marker(folder)
    except FolderError:
        return None


def write_marker(folder: str | Path, kind: str, files: Iterable[str] | None = None) -> None:
    from nmt import __version__

    marker: dict[str, Any] = {"kind": kind, "nmt_version": __version__}
    if files is not None:
        marker["files"] = sorted(set(files))
    atomic_write(Path(folder) / MARKER, lambda h: h.write(json.dumps(marker, indent=1) + "\n"), mode="w")


def register_file(path: str | Path) -> None:
    """Record in a run folder's marker that nmt wrote `path` there (e.g. `nmt average -o RUN/avg.pt`)."""
    path = Path(path)
    marker = own_marker(path.parent)
    if marker is not None and marker.get("kind") == "run" and not is_nmt_file(path.name, marker):
        write_marker(path.parent, "run", [*marker.get("files", []), path.name])


def is_nmt_file(name: str, marker: dict[str, Any]) -> bool:
    """Data folders list their files in the marker; run folders have fixed names plus registered ones."""
    if name in (MARKER, LOCK) or _temp_owner(name) is not None or name in marker.get("files", ()):
        return True
    patterns = NMT_FILES.get(str(marker.get("kind")), ())
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def foreign_files(folder: str | Path, marker: dict[str, Any] | None) -> list[str]:
    """Paths in `folder`, relative to it, that nmt did not write (everything, when the folder has no marker),
    looked for at every depth: a file of the user's inside RUN/tensorboard is as foreign as one beside it."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    foreign = []
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() or not is_nmt_file(entry.name, marker or {"kind": None, "files": []}):
            foreign.append(entry.name)
        elif entry.is_dir():
            foreign += [f"{entry.name}/{name}" for name in _foreign_inside(entry)]
    return foreign


def _foreign_inside(subfolder: Path) -> list[str]:
    """Names in a folder nmt wrote inside one of its folders that nmt does not write there: links, folders,
    files of other names (SUBFOLDER_FILES)."""
    patterns = SUBFOLDER_FILES.get(subfolder.name, ())
    try:
        entries = sorted(subfolder.iterdir())
    except OSError:
        return ["(unreadable)"]
    return [entry.name for entry in entries if entry.is_symlink() or not entry.is_file()
            or not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in patterns)]


def refuse_links(folder: Path, key: str) -> None:
    """A `FolderError` when `folder` holds a symbolic link: nmt never writes through one in its folders."""
    links = sorted(entry.name for entry in folder.iterdir() if entry.is_symlink()) if folder.is_dir() else []
    if links:
        shown = ", ".join(links[:3]) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
        raise FolderError(f"{folder} holds symbolic links ({shown}); nmt never writes through a link in its "
                          f"folders: choose another {key} or remove them yourself")


def refuse_foreign(folder: Path, kind: str, key: str, what: str) -> dict[str, Any] | None:
    """The folder's marker; a `FolderError` when it holds files nmt did not write or is another kind."""
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"`{key}`: {folder} is a file, not a folder")
    marker = read_marker(folder)
    if marker is not None and marker.get("kind") != kind:
        raise FolderError(f"`{key}`: {folder} is an nmt {marker.get('kind')} folder, not a {kind} folder; "
                          f"choose another {key}")
    refuse_links(folder, key)
    foreign = foreign_files(folder, marker)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise FolderError(f"{folder} holds files nmt did not write ({shown}); choose another {key} "
                          f"or {what}")
    return marker


def remove_nmt_files(folder: str | Path, marker: dict[str, Any]) -> None:
    """Delete what nmt wrote in `folder` (not the marker, not the lock); nothing else is touched, at any
    depth: a folder of nmt's is emptied of nmt's files and removed only if nothing else is left in it."""
    folder = Path(folder)
    for entry in sorted(folder.iterdir()):
        if entry.name in (MARKER, LOCK) or not is_nmt_file(entry.name, marker):
            continue
        if entry.is_dir() and not entry.is_symlink():
            foreign = set(_foreign_inside(entry))
            for inner in entry.iterdir():
                if inner.name not in foreign:
                    inner.unlink()
            with contextlib.suppress(OSError):      # not empty: the user's files stay
                entry.rmdir()
        else:
            entry.unlink()


# ---------------------------------------------------------------------------------------------- overlaps


def _inside(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_overlap(folder: str | Path, key: str, inputs: Iterable[Path], config_path: str | Path | None) -> None:
    """`folder` may not be, contain, or lie inside a folder of the raw inputs; nor be or contain the config's folder."""
    target = Path(folder).resolve()
    for path in inputs:
        source = Path(path).resolve().parent
        if _inside(target, source) or _inside(source, target):
            raise FolderError(f"`{key}`: {target} overlaps {source}, the folder of the input {path}; "
                              f"choose a folder outside the raw data")
    if config_path is not None:
        home = Path(config_path).resolve().parent
        if _inside(home, target):
            raise FolderError(f"`{key}`: {target} is or contains {home}, the folder of the config file; "
                              f"choose another folder")


def refuse_inputs_inside(folder: str | Path, key: str, inputs: Iterable[tuple[str, str | Path | None]],
                         clears: str) -> None:
    """A `FolderError` naming the first input (`(key, path)` pairs: a fine-tuning parent, a given tokenizer)
    that lies inside `folder`, which this command clears or replaces (`clears` says how): checked before
    anything is deleted, so a run never destroys what it reads."""
    target = Path(folder).resolve()
    for name, path in inputs:
        if path and _inside(Path(path).resolve(), target):
            raise FolderError(f"`{name}` {path} lies inside `{key}` {folder}, which {clears}; move or copy it "
                              f"out first, or choose another {key}")
