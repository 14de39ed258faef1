"""The ``KeyboardInterrupt`` of a Ctrl-C (a notebook's stop button) that landed in a wait of the
Python API (``run_batch``, ``text_iter``), raised again once what it stopped is cleaned up.

Python's own shows where the signal happened to land: a dozen frames of lmnb, ``concurrent.futures``
and ``threading`` ending in a bare ``KeyboardInterrupt:``. This one says what became of the work
(which items finished, that the requests were aborted), and IPython shows it with the user's frames
only, ending at the call that was stopped, as a ``%%lm`` cell's stop is shown as one line.
``held_interrupts`` keeps a second Ctrl-C from cutting that clean-up short.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import types
from typing import Callable, Iterator, Optional, Sequence

_PACKAGES = ("lmnb", "lmnb_engine")


def stopped(message: str) -> KeyboardInterrupt:
    """``KeyboardInterrupt(message)``, to be raised ``from None`` (the interrupt it replaces says
    nothing more), which IPython shows through its ``_render_traceback_`` hook with the frames up to
    the first of lmnb's (``callers_traceback``): the user's call is the last frame shown. A plain
    Python traceback shows the frame that raised it too. Its type stays ``KeyboardInterrupt``, the
    name a kernel reports and a Run-All stops on."""
    interrupt = KeyboardInterrupt(message)
    interrupt._render_traceback_ = lambda: _structured(interrupt)
    return interrupt


def _structured(interrupt: KeyboardInterrupt) -> list[str]:
    """IPython's traceback lines of ``interrupt`` with the user's frames only (called by IPython's
    ``showtraceback``, so IPython is loaded)."""
    from IPython import get_ipython

    shell = get_ipython()
    tb = callers_traceback(interrupt.__traceback__)
    if shell is None or tb is None:
        return [f"KeyboardInterrupt: {interrupt}"]
    return shell.InteractiveTB.structured_traceback(KeyboardInterrupt, interrupt, tb)


@contextlib.contextmanager
def held_interrupts(on_first: Optional[Callable[[], None]] = None) -> Iterator[list[int]]:
    """Hold SIGINT (Ctrl-C, a notebook's stop button) while the block runs; yields the list of the
    signals held, filled as they come, for a caller to raise for them after; ``on_first()`` is
    called when the first arrives (to say when it will take effect). For the clean-up of a
    stop (aborting requests), which a second press would cut short, leaving requests generating for
    no one: that press is part of the stop being raised, and nothing more is raised for it. The
    block must not wait for long (sending aborts does not: a remote backend posts them from threads
    of its own), or must say so in ``on_first`` (the kernel's model load), as the process cannot be
    interrupted meanwhile. Off the main thread, where Python never delivers a signal, a no-op."""
    held: list[int] = []
    # (a handler set outside Python, which getsignal reads as None, could not be put back)
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield held
        return

    def hold(signum, frame) -> None:
        if not held and on_first is not None:
            on_first()
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


def callers_traceback(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """A copy of ``tb`` cut before its first frame in lmnb or lmnb_engine (``tb`` is left as it is),
    None where it has no frame before one."""
    kept: list[types.TracebackType] = []
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").partition(".")[0] not in _PACKAGES:
        kept.append(tb)
        tb = tb.tb_next
    cut = None
    for entry in reversed(kept):
        cut = types.TracebackType(cut, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return cut


def item_ranges(indices: Sequence[int]) -> str:
    """Sorted ``indices`` as runs: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
