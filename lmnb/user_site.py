"""Where a warning about the user's program points: the user's own line, not lmnb's.

``warnings.warn(stacklevel=...)`` can name only a frame of the warning thread's own stack. A
program's primitives run on a worker thread of their own (``.run()``'s default, ``use_thread=True``),
whose stack holds lmnb's frames and ``threading``'s bootstrap only: a warning there named lmnb's
file and line. So the executor keeps, with each primitive it queues, the line outside lmnb that
queued it (``outside_lmnb``: the program's ``s += gen(...)``), and the worker runs the primitive
with that line as its thread's ``running_for`` site, at which ``warn_at_user`` points the warning
(``warnings.warn_explicit``). A ``%%lm`` cell's program is run by lmnb_kernel from IPython's
``run_cell_magic``, and its body is a function lmnb makes by ``exec``: those frames are passed
over too, so the warning names the cell's line. Importing it loads nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from typing import Iterator, NamedTuple, Optional

_LMNB_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# (lmnb_kernel, beside lmnb, runs a %%lm cell's program: named by its path, so nothing imports it)
_KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lmnb_kernel") + os.sep
_worker = threading.local()  # .site: the Site of the primitive this thread runs, if any


class Site(NamedTuple):
    """A line of the user's code: its file, its line number and its module's globals (for the
    warning registry and the source line, as ``warnings.warn`` takes them from the frame)."""

    filename: str
    lineno: int
    module_globals: dict


def _ours(frame) -> bool:
    """Whether ``frame`` runs lmnb's code rather than the user's: a file of lmnb or lmnb_kernel,
    code ``exec``'d in a namespace with no ``__name__`` (a ``%%lm`` cell's program function, which
    lmnb makes; its "<string>" line says nothing), or IPython's machinery that runs a cell magic."""
    name = frame.f_globals.get("__name__")
    return (frame.f_code.co_filename.startswith((_LMNB_DIR, _KERNEL_DIR)) or name is None
            or name.startswith("IPython."))


def outside_lmnb() -> Optional[Site]:
    """The first frame of the calling thread's stack outside the lmnb package (``_ours``), or None
    where there is none but ``threading``'s bootstrap (a worker thread's stack)."""
    frame = sys._getframe(1)
    while frame is not None and _ours(frame):
        frame = frame.f_back
    if frame is None or frame.f_globals.get("__name__") == "threading":
        return None
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


def user_site() -> Optional[Site]:
    """``outside_lmnb``, else the site this thread runs for (``running_for``: a streamed program's
    body thread, whose stack holds only lmnb's frames where the body is a ``%%lm`` cell's)."""
    return outside_lmnb() or getattr(_worker, "site", None)


@contextlib.contextmanager
def running_for(site: Optional[Site]) -> Iterator[None]:
    """Within it, ``warn_at_user`` on this thread points at ``site`` (the line that queued the
    primitive this worker thread runs) where its own stack has no frame outside lmnb."""
    before = getattr(_worker, "site", None)
    _worker.site = site
    try:
        yield
    finally:
        _worker.site = before


def warn_at_user(message: str, category: type = UserWarning) -> None:
    """``warnings.warn(message, category)`` pointing at the user's line: the first frame outside
    lmnb on this thread's stack (``backend.generate(...)``, a program run with ``use_thread=False``),
    else the line that queued the primitive this worker thread runs (``running_for``), else the
    line that calls this function (a worker with no such line: ``threading.py`` would say less).
    Filters and the "once per location" registry see the module of that line, as for ``warn``."""
    site = user_site()
    if site is None:
        warnings.warn(message, category, stacklevel=2)
        return
    registry = site.module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, site.filename, site.lineno,
                           module=site.module_globals.get("__name__", "<string>"), registry=registry,
                           module_globals=site.module_globals)
