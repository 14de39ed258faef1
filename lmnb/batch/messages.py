"""``say``: how a batch job writes its own messages (warnings, a bad row's line, the summary, a
fatal error) to stderr, so that a stderr that cannot be written does not stop the work."""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional


def say(text: str, write: Optional[Callable[[str], Any]] = None) -> None:
    """Write ``text`` (one or more lines, without the last line break) and a line break to
    ``sys.stderr`` (``write``: what writes it instead, e.g. ``tqdm.write`` above the progress bar).

    A write that fails with an ``OSError`` (``2> job.log`` on a full disk: ENOSPC; past a file size
    limit: EFBIG; ``2>/dev/full``) is dropped: the rows and their output file are the job's work,
    and its messages only tell of it, where the error stopped the rows, or made a job whose rows
    all ran ok exit 1 ("rows failed") with a traceback it could not print either. Where there is
    no stderr (``sys.stderr`` None: ``2>&-``, pythonw) it is dropped too: ``print(file=None)``
    and ``tqdm.write(file=None)`` write to stdout, into what reads the rows' output there.

    Raises:
        BrokenPipeError: stderr is a pipe whose reader closed (``2>&1 | head``): the job stops with
            exit 141, as a Unix tool stops at SIGPIPE.
    """
    if sys.stderr is None:
        return
    try:
        if write is None:
            print(text, file=sys.stderr)
        else:
            write(text)
    except BrokenPipeError:
        raise
    except OSError:
        pass
