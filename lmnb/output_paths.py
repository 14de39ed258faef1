"""Where a command's output file goes: the folders it needs, made, and why it cannot be written,
named with the path at fault. Shared by ``lmnb export -o``, ``lmnb run -o`` and the batch job's
``--output`` (``lmnb.batch.store``), each adding its own fix."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Optional


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
