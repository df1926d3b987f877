"""Files the user names for nmt to write (`-o`, `--json`, `--alignments`, `export -o`, plots...): where such a
write lands, and what it may not land on (an input, stdin, another output, a file of an nmt folder).

A user's output may be a link: `output_target` follows it only as the kernel's `fs.protected_symlinks` would
(whether that is on or not), so a link someone else planted in /tmp never redirects a write; a link inside an nmt
folder is never followed. "Is the same file" compares real paths and (device, inode), catching hard links too.
A character device (`-o /dev/null`, a terminal) or a pipe (`mkfifo`, `--alignments >(gzip >a.gz)`) is a stream:
written directly, as stdout is, not renamed into place. So is an open descriptor (`-o /dev/stdout`, /dev/fd/N),
through a copy of it: reopening it would truncate what the shell appended there, and renaming would replace it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from nmt.fs.bounded import file_kind
from nmt.fs.folders import FolderError, PendingFile, is_nmt_file, own_marker, remove_leftovers, text_options

MAX_LINKS = 40          # the kernel's limit on links followed in one path (ELOOP beyond it)
_DESCRIPTORS = re.compile(r"/proc/(\d+)(/task/\d+)?/fd")      # where /dev/stdout and /dev/fd/N lead
_STICKY_WORLD_WRITABLE = stat.S_ISVTX | stat.S_IWOTH


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
        try:
            owner = f"{pwd.getpwuid(info.st_uid).pw_name} (uid {info.st_uid})"
        except KeyError:
            owner = f"uid {info.st_uid}"
        raise FolderError(f"{where} is a symbolic link owned by {owner} in the sticky world-writable "
                          f"folder {folder}; nmt follows such a link only when you or the folder's owner made it "
                          "(the kernel's fs.protected_symlinks rule): remove it or write elsewhere")


def output_target(path: str | Path, option: str | None = None) -> Path:
    """The file a write to the user-named `path` replaces: `path` as given, or where its links lead. Every link on
    the way (in the folders too) must pass `_may_follow`; one that does not is a `FolderError` naming it."""
    named = f"{option} {path}" if option else str(path)
    given = Path(path)
    rest = list(given.parts)
    here = Path(rest.pop(0)) if given.is_absolute() else Path.cwd()
    links = 0
    while rest:
        part = rest.pop(0)                # a Path's parts hold no "" or "."
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
        fds = _DESCRIPTORS.fullmatch(str(here))
        if fds and int(fds.group(1)) == os.getpid() and part.isdigit() and not rest:
            return Path("/proc/self/fd", part)     # an open descriptor of this process (`descriptor`)
        links += 1
        if links > MAX_LINKS:
            raise FolderError(f"{named}: too many levels of symbolic links")
        _may_follow(step, info, named if os.path.abspath(given) == str(step) else f"{named}: {step}")
        target = Path(os.readlink(step))
        rest = [*target.parts, *rest]
        if target.is_absolute():
            here = Path(rest.pop(0))
    return given if not links else here


def _mode(path: str | Path) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def descriptor(path: str | Path) -> int | None:
    """N for the /proc/self/fd/N that `output_target` makes of /dev/stdout, /dev/fd/N and the like."""
    match = re.fullmatch(r"/proc/self/fd/(\d+)", str(path))
    return int(match.group(1)) if match else None


def _open_for_writing(number: int) -> bool:
    try:
        return fcntl.fcntl(number, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
    except OSError:
        return False


def is_device(path: str | Path) -> bool:
    """A character device (/dev/null, a terminal), a pipe or an open descriptor: written directly, never replaced."""
    mode = _mode(path)
    return descriptor(path) is not None or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_output_path(path: str | Path, option: str) -> Path:
    """The file (or device) a write to `path` replaces, if it may: not a folder, in a writable folder."""
    path = Path(path)
    target = output_target(path, option)
    if target.is_dir():
        raise FolderError(f"{option}: {path} is a folder; give a file name")
    number = descriptor(target)
    if number is not None and not _open_for_writing(number):
        raise FolderError(f"{option} {path}: descriptor {number} is not open for writing (closed, or opened for "
                          "reading as `3<file` does; `3>>file` opens one for appending)")
    if is_device(target):
        return target
    if target.exists() and not target.is_file():      # a block device or a socket: the rename would replace it
        raise FolderError(f"{option}: {path} is {file_kind(_mode(target))}, not a regular file, a pipe or a "
                          "character device; give a file name (or leave the option out for stdout)")
    if not target.parent.is_dir():
        raise FolderError(f"{option}: folder {target.parent} does not exist; create it first")
    if not os.access(target.parent, os.W_OK):
        raise FolderError(f"{option}: folder {target.parent} is not writable")
    return target


Identity = frozenset[tuple[int, int] | str]


def file_identity(path: Path) -> Identity:
    """Its real path and, for an existing file, (device, inode): two paths are the same file when these share
    an element (a hard link has another real path)."""
    keys: set[tuple[int, int] | str] = {os.path.realpath(path)}
    with contextlib.suppress(OSError):
        info = os.stat(path)
        keys.add((info.st_dev, info.st_ino))
    return frozenset(keys)


def check_outputs(outputs: Mapping[str, Path | None], inputs: Iterable[tuple[str, Path | None]],
                  stdin: bool = False, stdout: str | None = None) -> dict[str, Path]:
    """{option: the file to write} after `check_output_path`; none may be an input ((what, path) pairs, and
    stdin if the command reads it), another output (but a device may be several), what the command writes to
    stdout (`stdout` names it: the two would interleave, or a rename would unlink stdout's file), or a file of an
    nmt folder."""
    sources = [(what, file_identity(Path(path))) for what, path in inputs if path is not None]
    for stream, number, what in ((sys.stdin, 0, "stdin" if stdin else None), (sys.stdout, 1, stdout)):
        with contextlib.suppress(OSError, ValueError):      # a file, a pipe, a terminal
            info = os.fstat(stream.fileno() if stream is not None else number)
            if what is not None and (number == 0 or not stat.S_ISCHR(info.st_mode)):   # a terminal takes more
                sources.append((what, frozenset({(info.st_dev, info.st_ino)})))
    targets: dict[str, Path] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        target = check_output_path(path, option)
        marker = own_marker(target.parent)          # a planted marker in /tmp does not block outputs there
        if marker is not None and target.exists() and is_nmt_file(target.name, marker):
            raise FolderError(f"{option} {path} is a file of the nmt {marker['kind']} folder {target.parent}; "
                              "write the output to another file")
        identity = file_identity(target)
        for other, known in sources:
            if known & identity:
                raise FolderError(f"{option} {path} is also {other}; write the output to another file")
        if not stat.S_ISCHR(_mode(target)):         # /dev/null may take several outputs, a pipe one
            sources.append((option, identity))
        targets[option] = target
    return targets


class DeviceFile:
    """A character device or a pipe opened for writing, with PendingFile's interface: nothing to rename or
    discard."""

    def __init__(self, path: Path, mode: str) -> None:
        number = descriptor(path)
        self.handle: IO[Any] = (os.fdopen(os.dup(number), mode, **text_options(mode)) if number is not None
                                else open(path, mode, **text_options(mode)))  # noqa: SIM115 (closed by commit)

    def commit(self) -> None:
        self.handle.close()

    discard = commit


def open_output(target: Path, mode: str = "w") -> PendingFile | DeviceFile:
    """The writer for a checked output `target`: a stream directly, a file as a `PendingFile` (after removing
    leftovers of killed runs beside it)."""
    if is_device(target):
        return DeviceFile(target, mode)
    remove_leftovers(target.parent, target.name)
    return PendingFile(target, mode)
