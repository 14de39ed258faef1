"""A second Ctrl-C held until the clean-up of the first one's stop is posted.

A call that waits on the engine (``Engine.generate``, a stream's next event) or may have queued
a request (``Engine.submit``) meets a Ctrl-C by posting the end of its requests, then raising. A
second press that came before that post (a double press: microseconds apart) found Python's
handler armed as ever, and raised out of the clean-up before the post: the requests, queued
already, ran to their end for no one. So while such a call runs, SIGINT goes
through ``LaterInterruptsHeld``: the first press to the handler there before (Python's raises
``KeyboardInterrupt``), the later ones held until the caller's clean-up is posted
(``release``).
"""

from __future__ import annotations

import _signal  # (signal.signal unwrapped: its IntEnum step costs more than the rest, per call)
import signal
import threading
import types
from typing import Optional


class LaterInterruptsHeld:
    """``with LaterInterruptsHeld() as hold:`` around a blocking call whose ``except`` clean-up
    must not be cut short before it posts what ends the call's work: SIGINT goes to the handler
    there before until that handler has raised (a ``KeyboardInterrupt``: the stop the clean-up
    follows); later ones are held. ``hold.release()``, once the clean-up is posted, puts that
    handler back and raises ``KeyboardInterrupt`` if one was held (a second press skips the wait
    that may follow); the block's end puts it back too, raising nothing (a press held to the end
    is part of the stop being raised). Off the main thread, where Python never delivers a signal,
    or where the handler there is no Python callable (SIG_IGN, SIG_DFL, one set outside Python), a no-op.
    """

    def __init__(self) -> None:
        self._previous = None  # the handler put back by release(); None: nothing to put back
        self._raised = False  # the handler there before raised: the stop is on its way
        self._held = False

    def __enter__(self) -> "LaterInterruptsHeld":
        if threading.current_thread() is threading.main_thread():
            current = _signal.getsignal(signal.SIGINT)
            if callable(current):
                self._previous = current
                _signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        self._put_back()

    def _on_sigint(self, signum: int, frame: Optional[types.FrameType]) -> None:
        if self._raised:
            self._held = True
            return
        previous = self._previous
        if self._putting_back(frame):  # (the block has not begun or has ended: no clean-up follows to put it back)
            self._put_back()
        else:
            self._raised = True  # (first: a press that lands while that handler runs is held)
        previous(signum, frame)
        self._raised = False  # (it returned: a handler that records the press; the next one goes to it too)

    def _putting_back(self, frame: Optional[types.FrameType]) -> bool:
        """Whether ``frame`` (where a press landed) or a caller of it is this hold's ``__enter__``
        (once it set this handler) or ``__exit__``: a press that raises there leaves it before it
        puts the handler back (Python runs a pending handler as a function starts, between two
        lines, and ``signal.signal`` runs one first), and a with statement whose ``__enter__``
        raised runs no ``__exit__``, so this handler, armed to hold presses, would stay and swallow
        every later Ctrl-C of the process."""
        while frame is not None:
            if frame.f_code in _ENDS and frame.f_locals.get("self") is self:
                return True
            frame = frame.f_back
        return False

    def release(self) -> None:
        """Put the handler there before back; raise ``KeyboardInterrupt`` for a press held."""
        self._put_back()
        if self._held:
            self._held = False
            raise KeyboardInterrupt

    def _put_back(self) -> None:
        previous = self._previous  # (a press that lands in here may put it back first: _on_sigint)
        if previous is None:
            return
        # (a handler that replaced this one meanwhile stays: whoever set it puts back what it found)
        if _signal.getsignal(signal.SIGINT) == self._on_sigint:
            _signal.signal(signal.SIGINT, previous)
        self._previous = None


_ENDS = (LaterInterruptsHeld.__enter__.__code__, LaterInterruptsHeld.__exit__.__code__)
