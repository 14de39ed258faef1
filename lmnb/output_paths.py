"""Where a command's output file goes: the folders it needs, made, and why it cannot be written,
named with the path at fault; and the lock that keeps two runs from writing one file. Shared by
``lmnb export -o``, ``lmnb run -o`` and the batch job's ``--output`` (``lmnb.batch.store``), each
adding its own fix."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional

try:  # POSIX; elsewhere runs are not protected against each other
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


class OutputInUse(Exception):
    """Another run holds the lock on the output file ``path`` (``lock_output``); the message names
    the file and the fix."""

    def __init__(self, path: Path):
        super().__init__(f"another run is writing {path}; wait for it to finish (or stop it) before running again")


def lock_output(path: Path) -> int:
    """Open ``path`` for appending (made where it is not there, its content kept) and take an
    exclusive ``flock`` on it, held until the returned descriptor is closed; the descriptor is not
    inherited by a child process (a kernel), which would hold the lock past this run. A run that
    renames a new file over ``path`` (the batch job's --retry-errors) drops its lock on the old
    one: a lock taken on that old file, opened just before, guards a file no one reads, so the file
    at ``path`` is opened again. A path that is no regular file (``/dev/null``, a FIFO,
    ``/dev/stdout``) is not locked: a lock on a device is one lock for every process that opens
    it, so two runs writing their output to ``/dev/null`` would be refused each other's.

    Raises:
        OutputInUse: another run holds the lock (the first writer wins; the second, which would
            overwrite or interleave with it, is told to wait).
        OSError: ``path`` cannot be opened.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if fcntl is None or not stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OutputInUse(path) from None
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        opened = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino):
            return fd
        os.close(fd)


def remove_if_unwritten(fd: int, path: Path) -> None:
    """Remove the file at ``path`` where it is the one ``fd`` (``lock_output``'s descriptor) holds
    and nothing was written to it: a run that made its output and stopped before writing leaves no
    empty file behind. Call before closing ``fd`` (its lock keeps another run from taking the file
    meanwhile), and only where this run made the file. Where ``path`` is a link to a file not there
    before, the file made at its end goes and the link stays."""
    held = os.fstat(fd)
    made = path.resolve()  # (lock_output made the link's target, not the link)
    try:
        same = os.path.samestat(os.stat(made), held)
    except OSError:  # (gone already)
        return
    if same and held.st_size == 0 and stat.S_ISREG(held.st_mode):
        os.unlink(made)


def held_by_another(path: Path) -> bool:
    """Whether another run holds ``lock_output``'s lock on ``path`` now, looked at without taking
    it (a shared lock, tried and let go); False where ``path`` cannot be opened for reading, and
    where there are no locks (not POSIX)."""
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (which lets go of the shared lock)
    return False


def file_in_the_way(path: Path) -> Optional[Path]:
    """The nearest existing folder of ``path`` when it is no folder but a file, else None. Making
    the folders fails on it with "File exists" or "Not a directory", naming another path."""
    existing = next((parent for parent in path.parents if parent.exists()), None)
    return existing if existing is not None and not existing.is_dir() else None


def why_unwritable(path: Path, e: OSError) -> str:
    """Why the output ``path`` cannot be written, ``e`` being the error of making its folders or
    opening it, naming the path at fault: a file where a folder goes, a folder that cannot be made,
    or the error's own words (not "[Errno 1] Operation not permitted: '/sys/a'", which named
    another path than the output, or "No such file or directory" of a path under /proc, whose
    folder is there). Shared by lmnb run, lmnb export and the batch job, each adding its fix."""
    blocker = file_in_the_way(path)
    if blocker is not None:  # (mkdir's "File exists" / "Not a directory" name another path)
        return f"{blocker} is a file, not a folder"
    why = e.strerror or str(e)
    if e.filename is not None and Path(e.filename) in path.parents:
        return f"its folder {e.filename} cannot be made: {why}"
    if e.errno == errno.ENOENT and path.parent.is_dir():  # (/proc, /sys take no new files)
        why += f" (its folder {path.parent} is there, but takes no new files)"
    return why


def make_folders(path: Path) -> Optional[Path]:
    """Make the folders ``path`` goes in that do not exist yet; returns the folder it goes in if
    any was made (None if none was), for the command to say so: a mistyped ``-o jbos/job.py`` made
    a folder without a word, and the file seemed lost. Made, not refused: a new folder for the
    output is the common case, and saying so shows a typo at once.

    Raises:
        OSError: a folder cannot be made (``file_in_the_way`` names a file in its place).
    """
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.parent if made else None
