"""Waits of a caller's thread that a Ctrl-C stops at once, even one that landed as the wait began.

Python runs a signal's handler on the main thread between bytecodes. A SIGINT that lands while the
main thread is on its way into a lock's wait (a Condition's, an Event's, a Future's) finds no wait
to interrupt yet: Python only marks it, and acts on it when the wait ends, which for a wait on a
long generation was minutes later, once the requests the press was to abort had run to their end.
So these waits block for at most ``MARKED_STOP_POLL_S`` at a time, and a marked press takes effect
within one. Standard library only: lmnb's waits are built on these too, and ``import lmnb`` loads
no torch.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Optional

# The longest a wait here blocks before it looks again (and so before a marked Ctrl-C takes effect).
MARKED_STOP_POLL_S = 0.25


def sliced_wait(wait: Callable[[float], bool], timeout: Optional[float] = None) -> bool:
    """``wait(timeout)`` made of calls ``wait(s)`` of at most ``MARKED_STOP_POLL_S`` seconds each,
    until one returns true or ``timeout`` seconds (None: no limit) have passed; returns whether one
    did. ``wait(s)`` blocks at most ``s`` seconds and says whether what it waits for has come:
    ``threading.Event.wait``, or a ``Condition.wait_for`` of a predicate (its lock held). A timeout
    of 0 or less makes one call, ``wait(0)``."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = MARKED_STOP_POLL_S if end is None else min(MARKED_STOP_POLL_S, max(0.0, end - time.monotonic()))
        if wait(left):
            return True
        if end is not None and time.monotonic() >= end:
            return False


def future_result(future: concurrent.futures.Future, timeout: Optional[float] = None) -> Any:
    """``future.result(timeout)``, waited for with ``sliced_wait``. Raises what ``result`` raises
    (``TimeoutError`` once ``timeout`` seconds have passed, ``CancelledError``, the call's error)."""

    def done_within(seconds: float) -> bool:
        # (result's own wait: concurrent.futures.wait never counts as done a future that an executor's
        # shutdown cancelled, and waited for it to its timeout)
        try:
            future.exception(seconds)
        except concurrent.futures.TimeoutError:
            return False
        except concurrent.futures.CancelledError:
            pass
        return True

    sliced_wait(done_within, timeout)
    return future.result(timeout=0)


def thread_join(thread: threading.Thread, timeout: Optional[float] = None) -> bool:
    """``thread.join(timeout)``, waited for with ``sliced_wait``; returns whether ``thread`` has
    ended (``Thread.join`` itself says not)."""

    def ended_within(seconds: float) -> bool:
        thread.join(seconds)
        return not thread.is_alive()

    return sliced_wait(ended_within, timeout)
