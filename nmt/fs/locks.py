"""Who may work in a folder: `flock` on its `.nmt.lock`, exclusive for a writer, shared for readers (training
shares its data folder, so preprocessing cannot rewrite it underneath). The kernel lets go when a holder dies.
Holders write "PID nmt COMMAND" into the file, but it may be stale, so an error names the holders /proc/locks lists.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from nmt.fs.folders import (
    LOCK,
    FolderError,
    new_file_mode,
    process_alive,
    refuse_foreign,
    remove_leftovers,
    write_marker,
)

_held_locks: dict[Path, int] = {}      # folder -> fd of its lock file, held until released or the process ends
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_READER_WAIT = 2.0                     # s a reader waits for another reader that holds the lock alone for a moment


def lock_folder(folder: str | Path, command: str, shared: bool = False) -> bool:
    """Hold a lock on `folder` until this process ends or `release_folder`; a holder in the way is a `FolderError`
    naming it. False (and nothing done) when this process holds one already, or for a `shared` lock where the lock
    file cannot be created (a read-only folder no one rewrites)."""
    folder = Path(folder).resolve()
    if folder in _held_locks:
        return False
    path = folder / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, new_file_mode())
    except OSError as exc:
        if not shared or exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise FolderError(f"cannot lock {folder}: {exc.strerror}") from None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
    try:
        alone = _try_lock(fd, fcntl.LOCK_EX)
        if not alone and not (shared and _lock_shared_soon(fd)):
            raise FolderError(f"{folder} is in use by {_holders(fd)}; wait for it or stop it first")
        with contextlib.suppress(OSError):   # "PID nmt COMMAND"; a read-only lock file: the kernel still names us
            if alone:                        # in place of earlier holders' records, else beside other readers'
                os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} nmt {command}\n".encode(), 0 if alone else os.fstat(fd).st_size)
        if shared and alone and not _try_lock(fd, fcntl.LOCK_SH):   # keep it, shared (a writer may come between)
            raise FolderError(f"{folder} is in use by {_holders(fd)}; wait for it or stop it first")
    except BaseException:
        os.close(fd)
        raise
    _held_locks[folder] = fd
    return True


def _lock_shared_soon(fd: int) -> bool:
    """A shared lock within _READER_WAIT: a reader holds the lock alone while it writes its record, so readers that
    start together (DDP ranks) must not take that moment for a writer."""
    deadline = time.monotonic() + _READER_WAIT
    while not _try_lock(fd, fcntl.LOCK_SH):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in _BUSY:
            raise FolderError(f"cannot lock: {exc.strerror}") from None
        return False
    return True


def holds_lock(folder: str | Path) -> bool:
    return Path(folder).resolve() in _held_locks


def release_folder(folder: str | Path) -> None:
    fd = _held_locks.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)


def open_work_folder(folder: str | Path, kind: str, key: str, command: str, what: str) -> tuple[bool, dict | None]:
    """Refuse a foreign folder, create it if missing, lock it, clean leftovers, re-check under the lock, and
    mark it if unmarked. Returns (created, the marker before this call)."""
    folder = Path(folder)
    refuse_foreign(folder, kind, key, what)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock_folder(folder, command)
    remove_leftovers(folder)
    marker = refuse_foreign(folder, kind, key, what)   # again, now that no other nmt process can change it
    if marker is None:
        write_marker(folder, kind, [] if kind == "data" else None)
    return created, marker


def _holders(fd: int) -> str:
    """The processes holding the lock on the file `fd`, as the kernel lists them: "process 123 (nmt train)"."""
    info = os.fstat(fd)
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    lines = os.pread(fd, 1 << 16, 0).decode("utf-8", "replace").splitlines()
    records = {int(fields[0]): " ".join(fields[1:]) for fields in map(str.split, lines)
               if len(fields) >= 2 and fields[0].isdigit()}
    # without /proc/locks (or if it names no one): the records of living processes
    pids = _kernel_holders(key) or [pid for pid in records if process_alive(pid)]
    if not pids:
        return "another process"
    return " and ".join(f"process {pid} ({records.get(pid) or _command(pid)})" for pid in pids)


def _kernel_holders(key: str) -> list[int]:
    """PIDs holding flock locks on the file `key` (MAJOR:MINOR:INODE as /proc/locks writes it)."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return []
    pids = []
    for fields in map(str.split, lines):     # "1: FLOCK  ADVISORY  WRITE 4884 fe:00:2146451 0 EOF"; waiters: "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key and fields[4].lstrip("-").isdigit():
            pids.append(int(fields[4]))
    return [pid for pid in dict.fromkeys(pids) if pid > 0]


def _command(pid: int) -> str:
    """A process's command line, shortened ("sleep 60"), or "not nmt" when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read().split(b"\0")
    except OSError:
        return "not nmt"
    words = [Path(raw[0].decode(errors="replace")).name, *(w.decode(errors="replace") for w in raw[1:] if w)]
    text = " ".join(words).strip()
    return (text[:60] + "...") if len(text) > 60 else text or "not nmt"
