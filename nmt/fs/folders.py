"""What nmt may delete and when: folder markers, locks, leftovers, path overlaps, atomic writes.

nmt clears only a folder carrying its marker (`.nmt-folder.json`), and there only the files nmt writes; anything
else is foreign and makes nmt refuse, as do a link in the folder, a marker that is a link, or a marker naming
`../x` or `/x`. Files are written atomically: to an unpredictable temporary name beside them (O_EXCL), fsynced,
renamed into place with the umask's mode; dead processes' temporaries go the next time a command opens the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, TypeVar

from nmt.fs.bounded import loads_json, read_bytes

MARKER = ".nmt-folder.json"
LOCK = ".nmt.lock"
TEMP_SUFFIX = ".nmt-tmp"
MAX_MARKER_BYTES = 1 << 20          # a marker lists file names: a few KB
_TEMP_NAME = re.compile(r"^\..*\.(\d+)-[^./]+" + re.escape(TEMP_SUFFIX) + "$")
T = TypeVar("T")

# The files nmt writes into a run folder and an attention-plot folder (a data folder's marker lists its own).
RUN_FILES = ("config.yaml", "metrics.jsonl", "last.pt", "best.pt", "best-step*.pt", "spm.model", "src.model",
             "tgt.model", "tgt.pieces", "data_manifest.json")
NMT_FILES = {"run": RUN_FILES, "attention": ("attention-*.png",)}
# What nmt writes inside its subfolders (tensorboard's event files); a subfolder not listed here is nmt's only
# while it is empty.
SUBFOLDER_FILES = {"tensorboard": ("events.out.tfevents.*",)}


class FolderError(ValueError):
    """A folder nmt may not use as asked: foreign files, locked by another process, overlapping inputs."""


def plain_name(name: object) -> bool:
    """A file name inside a folder (no separator, not `.` or `..`), as every name read from a file must be."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def new_file_mode() -> int:
    """The mode `open()` gives a new file under the umask (read from /proc: setting it to read it races threads)."""
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
        return self._named(self._handle.write, data)

    def flush(self) -> None:
        self._named(self._handle.flush)

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as exc:
            self.error = self.error or _naming(exc, self._path)
            raise self.error from None

    def __getattr__(self, name: str) -> Any:          # everything else as the file object has it
        return getattr(self._handle, name)


class PendingFile:
    """A file written under a temporary name beside `path` that `commit` renames into place; errors name `path`."""

    def __init__(self, path: str | Path, mode: str = "wb") -> None:
        self.path = Path(path)
        if self.path.is_symlink():   # a user's output is resolved first (nmt.fs.outputs.output_target)
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
            self._writer = _NamedErrors(os.fdopen(fd, mode, **text_options(mode)), self.path)
            self.handle: IO[Any] = self._writer  # type: ignore[assignment]
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise

    def commit(self, replace: bool = True) -> None:
        """Rename into place; `replace=False`: a FileExistsError if `path` has appeared meanwhile (another process)."""
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            if replace:
                os.replace(self.tmp, self.path)
            else:
                _link_new(self.tmp, self.path)
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise _naming(exc, self.path) from None
            raise
        fsync_folder(self.path.parent)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.handle.close()
        self.tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, path: Path) -> None:
    """`tmp` renamed to `path` only if `path` does not exist: a hard link never replaces a file (checked first where
    the file system has no hard links)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.replace(tmp, path)
        return
    tmp.unlink()


def text_options(mode: str) -> dict[str, Any]:
    """`open()`'s arguments for nmt's text files: UTF-8, lines written as given (no "\\r\\n" translation)."""
    return {} if "b" in mode else {"encoding": "utf-8", "newline": ""}


def atomic_write(path: str | Path, write: Callable[[IO], object], mode: str = "wb", replace: bool = True) -> None:
    """Call `write(handle)` on an unpredictably named temporary file beside `path`, fsync, rename over `path`
    (`replace=False`: a FileExistsError if `path` exists by then)."""
    pending = PendingFile(path, mode)
    try:
        write(pending.handle)
        pending.commit(replace)
    except BaseException as exc:
        pending.discard()
        if isinstance(exc, OSError):      # name the file (a full disk reports no file name)
            raise _naming(exc, Path(path)) from None
        if isinstance(exc, RuntimeError) and pending._writer.error is not None:   # torch.save's opaque error
            raise pending._writer.error from None
        raise


def append_text(path: str | Path, text: str) -> None:
    """Append `text` to a file of nmt's (metrics.jsonl), created if missing; never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, new_file_mode())
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(text)


def copy_atomically(source: str | Path, target: str | Path) -> None:
    """Copy a file's bytes to `target` the way atomic_write writes (the umask's mode, not the source's)."""
    with open(source, "rb") as handle:
        def copy(out: IO[bytes]) -> None:
            try:
                shutil.copyfileobj(handle, out, 1 << 20)
            except OSError as exc:    # a read error names no file: name `source` (a write error names `target`)
                raise _naming(exc, Path(source)) from None

        atomic_write(target, copy)


def fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def temp_folder(parent: Path, name: str) -> Path:
    """A new folder in `parent` with an unpredictable temporary name for `name` (`remove_leftovers` knows it)."""
    return Path(tempfile.mkdtemp(prefix=f".{name}.{os.getpid()}-", suffix=TEMP_SUFFIX, dir=parent))


def build_folder(folder: Path, build: Callable[[Path], T], check: Callable[[], object]) -> T:
    """`build(tmp)` in a temporary folder beside `folder`, then `check()` (someone may have written there
    meanwhile) and rename it into place: `folder` is absent, as it was, or complete. An existing `folder` that
    `check` let through and nmt marked goes aside first, and back if the rename fails; `tmp` goes on any failure."""
    remove_leftovers(folder.parent, folder.name)
    tmp, old = temp_folder(folder.parent, folder.name), None
    try:
        mode = new_file_mode()
        os.chmod(tmp, mode | (mode & 0o444) >> 2)           # a folder as mkdir makes it: searchable where readable
        result = build(tmp)
        check()
        if folder.is_dir() and read_marker(folder) is not None:
            old = temp_folder(folder.parent, folder.name)
            os.rename(folder, old)                          # onto the empty temporary folder
        os.rename(tmp, folder)                              # replaces an empty folder, never a full one
    except BaseException:
        if old is not None:                                 # the old one back (fails harmlessly if it never left)
            with contextlib.suppress(OSError):
                os.rename(old, folder)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_folder(folder.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return result


def _temp_owner(name: str) -> int | None:
    match = _TEMP_NAME.match(name)
    return int(match.group(1)) if match else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # another user's
        return True
    return True


def remove_leftovers(folder: str | Path, target: str | None = None) -> list[str]:
    """Remove temporaries of dead processes in `folder` (only `target`'s if given), and this process's own: call
    it before writing anything (a container's PID 1 finds its previous life's)."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return []
    removed: list[str] = []
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


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The folder's marker; None when it has none (or none nmt can read). A marker that is a symbolic
    link, or that lists a name which is not a plain file name in the folder, is a `FolderError`."""
    path = Path(folder) / MARKER
    try:                          # never through a link; never waiting on a pipe
        marker = loads_json(read_bytes(path, MAX_MARKER_BYTES, follow=False).decode("utf-8"), MAX_MARKER_BYTES)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FolderError(f"{path} is a symbolic link, which nmt's marker never is: {folder} is not a folder "
                              "nmt may use; remove the link yourself or choose another folder") from None
        return None
    except ValueError:            # not JSON, or past a bound (nmt.fs.bounded)
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
    """`read_marker`, but None for a marker that is not nmt's: such a marker must not block a user's output."""
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
    return _matches(name, NMT_FILES.get(str(marker.get("kind")), ()))


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def foreign_files(folder: str | Path, marker: dict[str, Any] | None) -> list[str]:
    """Paths in `folder`, relative to it and at any depth, that nmt did not write (all, when it has no marker)."""
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
    """Names in one of nmt's subfolders that nmt does not write there: links, folders, other names."""
    try:
        entries = sorted(subfolder.iterdir())
    except OSError:
        return ["(unreadable)"]
    return [entry.name for entry in entries if entry.is_symlink() or not entry.is_file()
            or not _matches(entry.name, SUBFOLDER_FILES.get(subfolder.name, ()))]


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def refuse_links(folder: Path, key: str) -> None:
    """A `FolderError` when `folder` holds a symbolic link: nmt never writes through one in its folders."""
    links = sorted(entry.name for entry in folder.iterdir() if entry.is_symlink()) if folder.is_dir() else []
    if links:
        raise FolderError(f"{folder} holds symbolic links ({_some(links)}); nmt never writes through a link in "
                          f"its folders: choose another {key} or remove them yourself")


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
        raise FolderError(f"{folder} holds files nmt did not write ({_some(foreign)}); choose another {key} "
                          f"or {what}")
    return marker


def remove_nmt_files(folder: str | Path, marker: dict[str, Any]) -> None:
    """Delete what nmt wrote in `folder` (not the marker, not the lock), at any depth; a subfolder goes only
    once nothing else is left in it."""
    for entry in sorted(Path(folder).iterdir()):
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
    """A `FolderError` naming the first input (`(key, path)` pairs) inside `folder`, which this command clears
    (`clears` says how): checked before anything is deleted, so a run never destroys what it reads."""
    target = Path(folder).resolve()
    for name, path in inputs:
        if path and _inside(Path(path).resolve(), target):
            raise FolderError(f"`{name}` {path} lies inside `{key}` {folder}, which {clears}; move or copy it "
                              f"out first, or choose another {key}")
