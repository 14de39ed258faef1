"""``CellError``: a problem in a ``%%lm`` / ``%lm`` cell, shown as one clear message, no traceback."""

from __future__ import annotations

import os
import traceback

from lmnb.interrupt import held_interrupts


class CellError(Exception):
    """What went wrong in the cell and how to fix it; IPython shows only ``CellError: message``.

    The internals of the magic are not the user's concern, so the extension registers
    ``show_cell_error`` as IPython's handler for this type (``shell.set_custom_exc``). The
    original exception, if any, is kept as ``__cause__``.
    """


def cell_interrupt(message: str) -> KeyboardInterrupt:
    """A ``KeyboardInterrupt`` for a stopped ``%%lm`` cell that IPython shows as one line,
    ``KeyboardInterrupt: message``, through its ``_render_traceback_`` hook: the frames would be
    the magic's and its live view's, wherever the interrupt happened to land. Its type stays
    ``KeyboardInterrupt``, the name the kernel reports and a Run-All stops on."""
    interrupt = KeyboardInterrupt(message)
    interrupt._render_traceback_ = lambda: [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {message}"]
    return interrupt


def show_cell_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler: show ``CellError: message`` as the cell's error
    (``shell._showtraceback``: an ``error`` message in a kernel, stdout in a terminal) without the
    magic's frames, after the frames of the code the cell called into, if any (``called_frames``).

    A Stop (Ctrl-C) that lands while the error is shown (IPython formatting those frames, or the
    print) ends it with the message's first line and "(stopped while showing the error)", printed
    with Ctrl-C held. Raised out of here, the ``KeyboardInterrupt`` went to IPython's guard of a
    custom handler, which printed its traceback through IPython's and lmnb's frames and the
    CellError's whole one, and unregistered the handler: every later CellError showed them too."""
    try:
        stb = [*called_frames(shell, value), f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"]
        shell._showtraceback(etype, value, stb)
    except KeyboardInterrupt:
        first = str(value).partition("\n")[0]
        stb = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {first} (stopped while showing the error)"]
        with held_interrupts():  # (a second press is part of this stop)
            shell._showtraceback(etype, value, stb)
    return stb


_PACKAGES = ("lmnb", "lmnb_kernel", "lmnb_engine")
_OURS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), package, "")
              for package in _PACKAGES)


def _is_ours(frame) -> bool:
    filename = frame.f_code.co_filename
    if filename.startswith("<") and not filename.startswith("<%%lm cell"):
        # code made at run time has no file: a dataclass's generated __init__ (GenParams', whose
        # check of gen()'s options raises) runs in the globals of the module that defines the class
        return frame.f_globals.get("__name__", "").partition(".")[0] in _PACKAGES
    return os.path.abspath(filename).startswith(_OURS)


def called_frames(shell, error: BaseException) -> list[str]:
    """IPython's traceback of the frames that the cell's code (a hole, an ``--python`` body, both
    compiled as ``<%%lm cell N>``) called into when the failure was raised: a helper function
    defined in another cell, a library. It is that of the innermost exception in ``error``'s
    ``__cause__`` chain raised through the cell's code into frames not all lmnb's own (lmnb's
    checks of a gen's arguments say all in their message); a helper's ``raise ... from e`` is
    shown with its cause, as IPython shows chains. The message names the cell's own line
    already; [] when the cell's code raised itself (``{1/0}``). Without them a helper's failure
    showed as one line, though a plain cell calling it shows where in the helper it failed."""
    called, exc, seen = None, error, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb, after = exc.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.startswith("<%%lm cell"):
                after = tb.tb_next
            tb = tb.tb_next
        if after is not None and not all(_is_ours(frame) for frame, _ in traceback.walk_tb(after)):
            called = (exc, after)
        exc = exc.__cause__
    if called is None:
        return []
    inner, frames = called
    try:
        return shell.InteractiveTB.structured_traceback(type(inner), inner, frames)
    except Exception:  # (IPython's formatter on an odd frame: the one-line message still stands)
        return []
