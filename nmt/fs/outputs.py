"""Files the user names for nmt to write (`-o`, `--json`, `--alignments`, `export -o`, plots...):
where such a write lands, and what it may not land on.

nmt writes a file whole under a temporary name and renames it into place (nmt.fs.folders.PendingFile),
which never writes through a symbolic link. A user's output may be a link, and then
`output_target` follows it, but only as the kernel follows a link on open under
`fs.protected_symlinks` (whether that setting is on or not): a link in a sticky world-writable
folder such as /tmp is followed only when it belongs to the caller or to the folder's owner, so a
link someone else planted there never redirects a write. A link inside one of nmt's own folders is
never followed. `check_outputs` applies this to every output of a command before any work, and
refuses an output that is one of the command's inputs (stdin too), another output, or a file of
an nmt folder. "Is one of" compares what the paths lead to, links resolved, by real path and by
(device, inode), so a hard link or a link to a folder is caught as well; for a model the inputs
are all the files it is made of (nmt.modelfile.hub.model_files).

A character device (`-o /dev/null`, a terminal) is the one output that is not a file: nothing
to replace, so it is written directly (`open_output`) instead of renamed into place.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from nmt.fs.folders import FolderError, PendingFile, is_nmt_file, own_marker, remove_leftovers

MAX_LINKS = 40          # the kernel's limit on links followed in one path (ELOOP beyond it)
_STICKY_WORLD_WRITABLE = stat.S_ISVTX | stat.S_IWOTH


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _may_follow(link: Path, info: os.stat_result, where: str) -> None:
    """The kernel's rule for following `link` (fs.protected_symlinks), and never a link in an nmt folder."""
    folder = link.parent
    if own_marker(folder) is not None:
        raise FolderError(f"{where} is a symbolic link inside the nmt folder {folder}; nmt never writes through "
                          "a link in its own folders")
    try:
        home = os.stat(folder)
    except OSError:
        return
    if (home.st_mode & _STICKY_WORLD_WRITABLE == _STICKY_WORLD_WRITABLE
            and info.st_uid not in (os.geteuid(), home.st_uid)):
        raise FolderError(f"{where} is a symbolic link owned by {_owner(info.st_uid)} in the sticky world-writable "
                          f"folder {folder}; nmt follows such a link only when you or the folder's owner made it "
                          "(the kernel's fs.protected_symlinks rule): remove it or write elsewhere")


def output_target(path: str | Path, option: str | None = None) -> Path:
    """The file a write to the user-named `path` replaces: `path` itself, or where its links lead.

    Every link on the way (in the folders too, as the kernel walks them) must pass the kernel's rule
    for sticky world-writable folders; one that does not is a `FolderError` naming it and its owner.
    A path without links comes back as given.
    """
    named = f"{option} {path}" if option else str(path)
    given = Path(path)
    rest = list(given.parts)
    here = Path(rest.pop(0)) if given.is_absolute() else Path.cwd()
    links = 0
    while rest:
        part = rest.pop(0)
        if part in ("", "."):
            continue
        if part == "..":                 # `here` holds no links, so its parent is the real one
            here = here.parent
            continue
        step = here / part
        try:
            info = os.lstat(step)
        except OSError:                  # missing (the write creates it, or reports the missing folder)
            return given if not links else Path(step, *rest)
        if not stat.S_ISLNK(info.st_mode):
            here = step
            continue
        links += 1
        if links > MAX_LINKS:
            raise FolderError(f"{named}: too many levels of symbolic links")
        _may_follow(step, info, named if os.path.abspath(given) == str(step) else f"{named}: {step}")
        target = Path(os.readlink(step))
        rest = [*target.parts, *rest]
        if target.is_absolute():
            here = Path(rest.pop(0))
    return given if not links else here


def is_device(path: str | Path) -> bool:
    """A character device (/dev/null, a terminal): written directly, never replaced."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def check_output_path(path: str | Path, option: str) -> Path:
    """A file nmt is about to write: links only as `output_target` allows, its folder must exist and it
    must not be a folder itself. Returns the file the write replaces (or the device it writes to)."""
    path = Path(path)
    target = output_target(path, option)
    if target.is_dir():
        raise FolderError(f"{option}: {path} is a folder; give a file name")
    if is_device(target):
        return target
    if target.exists() and not target.is_file():      # a pipe or a block device: the rename would replace it
        raise FolderError(f"{option}: {path} is not a regular file (a pipe or a device); nmt writes an output "
                          "whole and renames it into place, so give a file name (or leave the option out for stdout)")
    if not target.parent.is_dir():
        raise FolderError(f"{option}: folder {target.parent} does not exist; create it first")
    if not os.access(target.parent, os.W_OK):
        raise FolderError(f"{option}: folder {target.parent} is not writable")
    return target


Identity = frozenset[tuple[int, int] | str]


def _identity(path: Path) -> Identity:
    """What `path` leads to, links resolved: its real path and, for an existing file, (device, inode).
    Two paths are the same file when these share an element (a hard link has another real path)."""
    keys: set[tuple[int, int] | str] = {os.path.realpath(path)}
    try:
        info = os.stat(path)
        keys.add((info.st_dev, info.st_ino))
    except OSError:
        pass
    return frozenset(keys)


def stdin_identity() -> Identity | None:
    """(device, inode) of what stdin reads (a file redirected with `<`, a pipe, a terminal)."""
    try:
        info = os.fstat(sys.stdin.fileno() if sys.stdin is not None else 0)
    except (OSError, ValueError):
        return None
    return frozenset({(info.st_dev, info.st_ino)})


def check_outputs(outputs: Mapping[str, Path | None], inputs: Iterable[tuple[str, Path | None]],
                  stdin: bool = False) -> dict[str, Path]:
    """Check every output file (`check_output_path`); none may be an input ((what, path) pairs; `stdin`:
    the command reads stdin), another output (a device may be several), or a file of an nmt run or data
    folder. Returns {option: the file to write}."""
    sources: list[tuple[str, Identity]] = [(what, _identity(Path(path))) for what, path in inputs if path is not None]
    if stdin and (identity := stdin_identity()) is not None:
        sources.append(("stdin", identity))
    targets: dict[str, Path] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        target = check_output_path(path, option)
        marker = own_marker(target.parent)          # a planted marker in /tmp does not block outputs there
        if marker is not None and target.exists() and is_nmt_file(target.name, marker):
            raise FolderError(f"{option} {path} is a file of the nmt {marker['kind']} folder {target.parent}; "
                              "write the output to another file")
        identity = _identity(target)
        for other, known in sources:
            if known & identity:
                raise FolderError(f"{option} {path} is also {other}; write the output to another file")
        if not is_device(target):                   # /dev/null may take several outputs
            sources.append((option, identity))
        targets[option] = target
    return targets


class DeviceFile:
    """A character device opened for writing, with PendingFile's interface: nothing to rename or discard."""

    def __init__(self, path: Path, mode: str) -> None:
        text: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}
        self.handle: IO[Any] = open(path, mode, **text)  # noqa: SIM115 (closed by commit or discard)

    def commit(self) -> None:
        self.handle.close()

    def discard(self) -> None:
        self.handle.close()


def open_output(target: Path, mode: str = "w") -> PendingFile | DeviceFile:
    """The writer for a checked output `target` (`check_outputs`): a device directly, a file under a
    temporary name that `commit` renames into place (leftovers of killed runs beside it removed first)."""
    if is_device(target):
        return DeviceFile(target, mode)
    remove_leftovers(target.parent, target.name)
    return PendingFile(target, mode)
