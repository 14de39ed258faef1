"""Run one cell's program: body on a worker thread, events pumped on the cell's main thread.

Why this shape (research/jupyter.md §1.5, §3.1): only the main thread receives Ctrl-C (as
``KeyboardInterrupt``) and only it may touch the cell's display, so the program body and the engine
work elsewhere and every view update happens here, at most ``max_hz`` times a second. On Ctrl-C the
cell's requests — the state's and every fork branch's — are aborted (and a body still running
Python is stopped: ``stop_body``), the partial text stays on screen and the ``KeyboardInterrupt``
propagates so a Run-All stops.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from lmnb import ProgramAborted, ProgramError
from lmnb.interrupt import held_interrupts
from lmnb_engine.waits import sliced_wait, thread_join

_DONE = object()


@dataclass
class CellOutcome:
    """What a cell run left behind.

    status: ``"done"``, ``"error"`` or ``"interrupted"``; error: the exception for ``"error"``;
    captured: variables the program set on its root state during this cell (name → value, in order);
    interrupt_s: seconds from Ctrl-C to the worker having stopped (None without Ctrl-C).
    """

    state: Any
    status: str
    error: Optional[BaseException] = None
    captured: dict = field(default_factory=dict)
    interrupt_s: Optional[float] = None


class Listener:
    """An ``lmnb.observe`` callback that queues events for one cell only.

    Executors keep their listeners after the cell ends; ``close`` makes this one drop later events.
    ``roots`` holds (weakly) every program state started while the cell ran, ``run()`` calls in a
    ``--python`` body too (they inherit the cell's observers): stopping the cell stops them all.
    """

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.active = True
        self.roots: "weakref.WeakSet" = weakref.WeakSet()

    def __call__(self, event) -> None:
        if event.kind == "state" and event.parent is None and event.value is not None:
            self.roots.add(event.value)  # (synchronously: the abort must not wait for the queue)
        if self.active:
            self.queue.put(event)

    def close(self) -> None:
        """Stop delivering events to the view."""
        self.active = False


# How a cell's errors name its default max_tokens (``executor.max_tokens_option``): the option it is set by.
CELL_MAX_TOKENS = "the cell's --max-tokens {}"


def start_run(program, params: dict, backend, defaults: dict, listener: Listener, previous=None):
    """Start ``program`` streaming, on a new state or on a copy of ``previous`` (a ``ProgramState``).

    ``params`` are the program's arguments, ``defaults`` ``run`` keyword arguments (temperature,
    max_new_tokens, seed). Continuing works on a copy (``StreamExecutor.continuation``) so that a
    failed or interrupted cell leaves the named state as it was. Returns the running state at once.
    Errors name the run's max_new_tokens as the cell's ``--max-tokens`` option (``CELL_MAX_TOKENS``).
    """
    import lmnb
    from lmnb.executor import max_tokens_option
    from lmnb.interpreter import ProgramState

    state = ProgramState(previous.stream_executor.continuation()) if previous is not None else None
    with lmnb.observe(listener), max_tokens_option(CELL_MAX_TOKENS):
        return program.run(stream=True, backend=None if state is not None else backend, state=state,
                           **defaults, **params)


def abort_tree(state, listener: Optional[Listener] = None) -> None:
    """Abort ``state`` and every fork branch it created (in-flight requests end, queued work is
    skipped): ``ProgramState.abort`` aborts the branches itself; with ``listener``, also every
    other program the cell started (``Listener.roots``: a ``run()`` nested in a ``--python`` body
    would otherwise run to its end before the body can be stopped). Thread-safe. A second Ctrl-C
    meanwhile waits until every request was sent its abort (``lmnb.interrupt.held_interrupts``)."""
    with held_interrupts():
        state.abort()
        for executor in list(listener.roots) if listener is not None else ():
            executor.abort()


def settle_tree(state, listener: Listener, timeout_s: float) -> None:
    """Wait, at most ``timeout_s`` seconds, until the states ``abort_tree`` stopped have no
    primitive running. Each stopped request reports its prompt and cached tokens from its state's
    worker thread once the backend has ended it, after the abort, and a fork branch's worker may
    still be at it when the cell's own text has ended: a listener closed then drops those reports,
    and the cell's summary said "unknown" for the branches' prompts (the Stop button's path)."""
    deadline = time.monotonic() + timeout_s
    for executor in [state.stream_executor, *list(listener.roots)]:
        executor.settle(deadline)


class BodyStopped(BaseException):
    """Raised into a program body still running after Ctrl-C aborted its state (a ``--python``
    body in a loop that never touches ``s``); a ``BaseException``, so ``except Exception`` in the
    body does not keep it running. The body's runner records it quietly: the state is aborted."""


def stop_body(state, grace_s: float = 0.5) -> bool:
    """Stop the thread of ``state``'s program body if it has not returned ``grace_s`` seconds
    after the abort: an aborted state's reads and writes end the body, but plain Python (a loop,
    a computation) would run on, with the GIL, for as long as the kernel lives. True if it was
    asked to stop. The exception is raised while the state's lock is held, so the body has not
    passed ``end_body`` (which takes the lock and clears ``body_thread``) and the id is its thread's.
    The grace is waited for in slices (``sliced_wait``): a Ctrl-C (a second press, which is to cut
    the grace short) that landed as the wait began is acted on within one, not once the grace ended."""
    import ctypes

    ex = state.stream_executor
    with ex._cv:
        sliced_wait(lambda seconds: ex._cv.wait_for(lambda: ex.body_thread is None, seconds), grace_s)
        ident = ex.body_thread
        if ident is None or ident == -1 or ident == threading.get_ident():
            return False
        _wait_while_a_thread_starts()
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(BodyStopped))
        return True


def _wait_while_a_thread_starts(timeout_s: float = 2.0) -> None:
    """Wait (at most ``timeout_s``) until no thread is starting. CPython gives a starting thread's
    state the id of the thread that starts it until the new thread runs, and
    ``PyThreadState_SetAsyncExc`` raises into the first state with the id: the stop meant for the
    body went to a thread the body was starting (the state's worker, on its first ``s +=``), which
    died of it, and the body ran on. ``threading.enumerate`` lists a starting thread without an ident."""
    deadline = time.monotonic() + timeout_s
    while any(t.ident is None for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.001)


def run_cell(state, listener: Listener, feeder, view, poll_s: float = 0.05,
             interrupt_wait_s: float = 5.0) -> CellOutcome:
    """Pump the events of the running ``state`` into ``feeder`` until its program finishes.

    Returns a ``CellOutcome``; re-raises ``KeyboardInterrupt`` after aborting (the outcome is then
    attached to the exception as ``lmnb_outcome``); the view's Stop button (``view.stop_requested``)
    aborts alike and returns the outcome, ``"interrupted"``, unless its click came once the program
    had ended by itself with nothing left running (``"done"``); a click as the pump takes the end
    still stops what runs on (fork branches a ``--python`` body left unjoined). A program that
    failed (``"error"``) with such branches, or programs its body started, still running has
    them aborted as a Stop would. Stopped either way, the cell waits at most ``interrupt_wait_s``
    seconds for its stopped requests to report (``settle_tree``); a Ctrl-C in that wait, or as the
    body is stopped, after a Stop, is met as one in the pump: the body is stopped and the outcome
    attached to the ``KeyboardInterrupt``.
    ``view.tick()`` runs whenever no event arrived for ``poll_s`` seconds, so throttled updates
    are never held back.
    """
    failure: list[BaseException] = []
    stopping = threading.Event()  # Ctrl-C or Stop: stop_body ends the body, the waiter does not wait for it
    settled = threading.Event()  # the waiter waited for the stopped requests' reports
    ended = threading.Event()  # the program ended by itself, nothing left running: a Stop now stops nothing
    verdict = threading.Lock()  # (a Stop and the waiter's look at the ended program, one after the other)

    # the waiter reads for the thread that started the run, which always waits for the body (the
    # waiter's own thread would not while the body joins a thread); a body ended by now has none,
    # and then there is nothing to wait for
    caller = state.stream_executor.body_caller

    def wait() -> None:
        try:
            try:
                for _ in state._text_iter(None, caller):  # ends when the program body returned and all ran
                    pass
            except ProgramError:  # (error() below gets it, once the body returned too)
                pass
            _wait_for_the_body(state, stopping, caller)
            err = state.error()
            if err is not None:
                failure.append(err)
            if failure and not stopping.is_set() and not _all_finished(state, listener):
                # (a failed body does not wait for the fork branches it left unjoined, nor for the
                # programs it started: they would generate on after the cell, its listener closed)
                abort_tree(state, listener)
                settle_tree(state, listener, interrupt_wait_s)
            with verdict:
                if not stopping.is_set() and _all_finished(state, listener):
                    ended.set()
            if stopping.is_set():  # (before _DONE: the pump and Ctrl-C's drain then get their reports)
                settle_tree(state, listener, interrupt_wait_s)
                settled.set()
        finally:
            listener.queue.put(_DONE)

    waiter = threading.Thread(target=wait, name="lmnb-cell", daemon=True)
    waiter.start()

    def stop() -> None:
        with verdict:
            if ended.is_set():  # (a Stop clicked as the cell ended by itself: it ends as it ended)
                return
            stopping.set()
        abort_tree(state, listener)

    try:
        _pump(listener, feeder, view, poll_s, on_stop=stop)
        if view.stop_requested.is_set():  # (a click as the pump took the end: fork branches left unjoined may run on)
            stop()
        if stopping.is_set() and not settled.is_set():  # stopped after the waiter looked: wait for the reports here
            settle_tree(state, listener, interrupt_wait_s)  # (sliced: a Ctrl-C there is met as one in the pump)
            _drain(listener, feeder)
        listener.close()
        if stopping.is_set():
            stop_body(state)
    except KeyboardInterrupt as interrupt:
        t0 = time.monotonic()
        stop()
        try:
            thread_join(waiter, interrupt_wait_s)  # (sliced: a second press that lands as it begins stops it)
            stop_body(state)
        except KeyboardInterrupt:  # Ctrl-C again (a double press): wait no longer, but still stop the
            stop_body(state, grace_s=0)  # body and report the outcome (the body ran on for the kernel's life)
        interrupt_s = time.monotonic() - t0
        _drain(listener, feeder)
        listener.close()
        interrupt.lmnb_outcome = CellOutcome(state, "interrupted", None, dict(feeder.captured), interrupt_s)
        raise
    if stopping.is_set():  # the view's Stop button: like Ctrl-C (the magic raises its interrupt)
        if failure and not isinstance(failure[0], ProgramAborted):  # it had failed before the Stop (its
            return CellOutcome(state, "error", failure[0], dict(feeder.captured))  # body ran on): say why
        return CellOutcome(state, "interrupted", None, dict(feeder.captured))
    if failure:
        return CellOutcome(state, "error", failure[0], dict(feeder.captured))
    return CellOutcome(state, "done", None, dict(feeder.captured))


def _all_finished(state, listener: Listener) -> bool:
    """Nothing of the cell runs or will run: its state and fork branches (one a ``--python`` body left
    unjoined may run on after the body returned) and the programs its body started."""
    return all(ex._finished() for ex in [state.stream_executor, *list(listener.roots)])


def _wait_for_the_body(state, stopping: threading.Event, caller: Optional[threading.Thread]) -> None:
    """Wait until the program body, started by thread ``caller``, has returned. A failed state's
    ``text_iter`` and ``error()`` end at once while its body may run on (plain Python after a gen
    that failed): the cell ended under it, its later events dropped and its prints landing in the
    next cell. Not once the cell is stopped (``stopping``): an aborted body may never return by
    itself, and ``stop_body`` ends it."""
    ex = state.stream_executor
    with ex._cv:
        while ex._body_elsewhere(caller) and not stopping.is_set():
            ex._wait()  # (at most MARKED_STOP_POLL_S: stopping has no notify)


def _pump(listener: Listener, feeder, view, poll_s: float, on_stop: Callable[[], None]) -> None:
    stopped = False
    while True:
        if not stopped and view.stop_requested.is_set():  # set by the Stop click's comm thread
            stopped = True
            on_stop()
        try:
            event = listener.queue.get(timeout=poll_s)
        except queue.Empty:
            _safely(view.tick)
            continue
        if event is _DONE:
            return
        _safely(feeder.apply, event)


def _drain(listener: Listener, feeder) -> None:
    """Apply events already queued (the partial text produced before an abort)."""
    while True:
        try:
            event = listener.queue.get_nowait()
        except queue.Empty:
            return
        if event is not _DONE:
            _safely(feeder.apply, event)


def _safely(fn, *args) -> None:
    """A failing view must not stop the pump: the program would run on unwatched and its results
    would never reach the kernel. Failures are reported as warnings (shown once per place)."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"lmnb: the cell's view failed ({type(e).__name__}: {e}); the program goes on", stacklevel=2)
