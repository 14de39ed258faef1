"""The ``KeyboardInterrupt`` of a Ctrl-C (a notebook's stop button) that landed in a wait of the
Python API (``run_batch``, ``text_iter``), raised again once what it stopped is cleaned up.

Python's own shows where the signal happened to land: a dozen frames of lmnb, ``concurrent.futures``
and ``threading`` ending in a bare ``KeyboardInterrupt:``. This one says what became of the work
(which items finished, that the requests were aborted), and IPython shows it with the user's frames
only, ending at the call that was stopped, as a ``%%lm`` cell's stop is shown as one line.
``held_interrupts`` keeps a second Ctrl-C from cutting that clean-up short; ``ReadInterrupts``
gets a Ctrl-C to a read that awaits (``text_async_iter``) on an event loop, where Python's lands in
the loop, not in the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import _signal  # (signal.signal and getsignal unwrapped: their IntEnum step formats the repr of a handler, per read step)
import signal
import sys
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


class ReadInterrupts:
    """Whether a Ctrl-C landed while an ``async`` reader awaited its state's text on the main
    thread's event loop (``with watch:`` around each such await; the watch is the reader's, for its
    whole reading). There Python's own SIGINT handler raises ``KeyboardInterrupt`` wherever the
    main thread is, in the loop itself mostly: ``loop.run_until_complete`` (IPython's autoawait)
    gave it up with the reading task left pending, and the program it read went on generating. So
    while a watch is on, Ctrl-C first marks it ``interrupted``, then does what ``asyncio.run``'s
    handler does for its main task where the loop runs in ``run_until_complete`` (found on the
    main thread's stack: ``asyncio.run``'s, IPython's): cancels the task it runs and the reading
    tasks, and once that task has ended cancelled, raises ``KeyboardInterrupt`` out of the loop,
    with the ``message`` the readers left. A loop run for ever (ipykernel's, a server's) has the
    handler there before called (ipykernel's cancels the cell's task), and is woken to act on it
    (ipykernel's waited for the loop's next event: a cell awaiting a 20 s read was cancelled after
    20 s); where that handler is Python's default, the reading tasks are cancelled instead and the
    ``KeyboardInterrupt`` raised once the loop ran the cancels. A second Ctrl-C before the cancels
    ran goes to the handler there before at once. Off the main thread, or where SIGINT is ignored,
    a no-op."""

    def __init__(self, task: asyncio.Task):
        self.task = task
        self.interrupted = False
        self.message: Optional[str] = None  # what the reader did for the stop, said by the KeyboardInterrupt
        self._cancelled = False

    def __enter__(self) -> "ReadInterrupts":
        global _previous
        if threading.current_thread() is not threading.main_thread():
            return self
        current = _signal.getsignal(signal.SIGINT)
        if current is not _on_sigint:  # (not set yet, or replaced since: a kernel's, at its cell's end)
            if not callable(current):  # SIG_IGN, SIG_DFL, or set outside Python (None): left alone
                return self
            _previous = current
            _signal.signal(signal.SIGINT, _on_sigint)
        _watches.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self not in _watches:
            return
        _watches.remove(self)
        # (a handler that replaced ours meanwhile stays: whoever set it puts back what it found)
        if not _watches and _signal.getsignal(signal.SIGINT) is _on_sigint:
            _signal.signal(signal.SIGINT, _previous)


_watches: list[ReadInterrupts] = []  # the readers awaiting text on the main thread's loop now
_previous: Callable = signal.default_int_handler  # the SIGINT handler _on_sigint replaced


def _on_sigint(signum: int, frame: Optional[types.FrameType]) -> None:
    """SIGINT while ``ReadInterrupts`` watches are on (see there)."""
    watches = list(_watches)
    for watch in watches:
        watch.interrupted = True
    if not watches or any(w._cancelled for w in watches):
        _previous(signum, frame)
        return
    loops = {w.task.get_loop() for w in watches}
    main = _run_until_complete_future(frame, loops)
    if main is None and _previous is not signal.default_int_handler:
        _previous(signum, frame)  # (a loop run for ever, a kernel's: its handler cancels what it runs)
        for loop in loops:  # (ipykernel's schedules the cancel with no wake-up: it waited for the next event)
            loop.call_soon_threadsafe(lambda: None)
        return
    for watch in watches:
        watch._cancelled = True
        watch.task.cancel()
    if main is None:  # (its callback runs after those of the cancels, scheduled first)
        for loop in loops:
            loop.call_soon_threadsafe(_raise_stopped, watches)
        return
    # raised from main's done callbacks, after run_until_complete's own: raised before it ran, that
    # callback, which stops the loop, stayed scheduled and stopped the loop's next run at once
    main.cancel()
    main.add_done_callback(functools.partial(_raise_if_cancelled, watches=watches))
    main.get_loop().call_soon_threadsafe(lambda: None)  # (wakes the loop's select)


def shown_by_an_ipython_cell(frame: Optional[types.FrameType]) -> bool:
    """Whether IPython's ``InteractiveShell.run_code`` is ``frame`` or a caller of it: the code
    runs in an IPython cell (one that awaits: in its task, ipykernel's or autoawait's), whose
    ``run_code`` catches every exception of the cell and shows it as the cell's error. There a
    reader's ``KeyboardInterrupt`` ends the cell; in a task of its own (one the cell awaits, a
    server's) it would end the event loop's run instead. False where IPython is not loaded."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    code = getattr(getattr(shell, "InteractiveShell", None), "run_code", None)
    code = getattr(code, "__code__", None)
    while frame is not None and code is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _run_until_complete_future(frame: Optional[types.FrameType], loops: set) -> Optional[asyncio.Future]:
    """The future that ``run_until_complete`` of one of ``loops`` runs, ``frame`` or a caller of
    it being that call; None where there is none (``run_forever``, a loop written in C)."""
    from asyncio.base_events import BaseEventLoop

    while frame is not None:
        if frame.f_code is BaseEventLoop.run_until_complete.__code__ and frame.f_locals.get("self") in loops:
            future = frame.f_locals.get("future")
            return future if isinstance(future, asyncio.Future) and not future.done() else None
        frame = frame.f_back
    return None


def _raise_if_cancelled(future: asyncio.Future, watches: list[ReadInterrupts]) -> None:
    """``_raise_stopped`` once the cancelled ``future`` ended so (not where it caught the cancel)."""
    if future.cancelled():
        _raise_stopped(watches)


def _raise_stopped(watches: list[ReadInterrupts]) -> None:
    """Raise the ``KeyboardInterrupt`` of a Ctrl-C that cancelled ``watches``' readers."""
    messages = [w.message for w in watches if w.message]
    if messages:
        raise stopped("; ".join(dict.fromkeys(messages))) from None
    raise KeyboardInterrupt
