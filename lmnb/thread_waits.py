"""What other threads run now, read safely: whether one is blocked joining a thread or waiting
for a future.

A streamed program body may wait for a helper thread (``Thread.join``, ``Future.result``) that
reads the body's state; that reader must not wait for the body in turn (``StreamExecutor``'s
readers). Python records no link from a waiting thread to what it waits for, and the one way to
follow it, walking the thread's frames from ``sys._current_frames()`` (``f_back``, ``f_locals``),
crashes CPython 3.11 while the thread runs (python/cpython#99110 and its later reports: the
profilers of sentry-python and ddtrace segfault so; a CI run of this project died of it). So only
each frame's file, function and line are read, with ``faulthandler.dump_traceback``: C code that
reads every thread's frames in one call while this thread holds the GIL, so the other threads
are parked and their frames stay put, and that makes no frame objects. What a thread waits for
(which thread, which future) is not known. faulthandler writes at most the 100 newest threads; a
thread past them is not seen (``blocked_in_a_join`` says so).
"""

from __future__ import annotations

import concurrent.futures._base
import concurrent.futures.thread
import faulthandler
import os
import tempfile
import threading
from typing import Optional

# (file, function) of the standard library's waits that count; the files' other functions may lie
# above them (Condition.wait, Thread._wait_for_tstate_lock)
_WAITS = {(threading.__file__, "join"), (concurrent.futures._base.__file__, "result"),
          (concurrent.futures._base.__file__, "exception")}
_WAIT_FILES = {threading.__file__, concurrent.futures._base.__file__}
# a ThreadPoolExecutor worker's loop, at the bottom of its stack (threading's bootstrap below it)
_POOL_WORKER = (concurrent.futures.thread.__file__, "_worker")

_DUMP_LOCK = threading.Lock()  # one dump at a time into the one file
_dump_file = None  # opened at the first call (import lmnb opens no file)


def _forget_the_parents_dump() -> None:
    """(In a child just forked.) A lock and file of its own: the parent's lock may have been held
    by a thread dumping (none of which runs in the child), and its file, shared with the parent,
    has one offset for both processes' dumps."""
    global _DUMP_LOCK, _dump_file
    _DUMP_LOCK, _dump_file = threading.Lock(), None


if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(after_in_child=_forget_the_parents_dump)


def stacks() -> dict[int, list[tuple[str, str, str]]]:
    """Every thread's stack now, by thread ident: its frames' ``(file, function, line)``,
    innermost first (the line as faulthandler writes it, ``"???"`` where unknown). Read with
    ``faulthandler.dump_traceback``, so at most its 100 innermost frames per thread and the 100
    newest threads; the names as faulthandler writes them (``as_dumped``)."""
    return _dump()[0]


def as_dumped(name: str) -> str:
    """``name`` (a file or function name) as faulthandler writes it: ASCII, other characters
    escaped as ``\\xe9``, ``\\u20ac``, ``\\U0001f600`` (as Python's ``backslashreplace`` does).
    Compared unescaped, a standard library installed under a non-ASCII path (a user's home
    folder) never matched, and a helper the body joins waited for the body for good."""
    return name.encode("ascii", "backslashreplace").decode("ascii")


def _dump() -> tuple[dict[int, list[tuple[str, str, str]]], bool]:
    """``stacks()``, and whether faulthandler left threads out (more than 100)."""
    global _dump_file
    with _DUMP_LOCK:
        if _dump_file is None:
            _dump_file = tempfile.TemporaryFile()
        _dump_file.seek(0)
        _dump_file.truncate()
        faulthandler.dump_traceback(_dump_file, all_threads=True)
        _dump_file.seek(0)
        dump = _dump_file.read().decode("utf-8", "replace")
    # per thread a line "Thread 0x<ident> (most recent call first):" ("Current thread ..." for the
    # caller's), then one '  File "<file>", line <n> in <function>' per frame
    found: dict[int, list[tuple[str, str, str]]] = {}
    frames: list[tuple[str, str, str]] = []
    lines = dump.splitlines()
    for line in lines:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            frames = found.setdefault(int(line.split("0x", 1)[1].split()[0], 16), [])
        elif line.startswith('  File "'):
            file, _, rest = line[len('  File "'):].rpartition('", line ')
            number, _, function = rest.partition(" in ")
            frames.append((file, function, number))
    # (after the 100th thread faulthandler writes a line "..." and stops)
    return found, "..." in lines


def blocked_in_a_join(ident: int) -> Optional[bool]:
    """Whether thread ``ident`` is now in ``threading.Thread.join`` or in ``Future.result`` or
    ``Future.exception`` (``concurrent.futures``), a timed one included: those are the frames on
    top of its stack, above any other code. False for a thread that is not running, or in any
    other wait (an ``Event``, a queue, ``concurrent.futures.wait``); None where it cannot be
    told: more than 100 threads run and ``ident`` is not among the 100 newest."""
    waits = {(as_dumped(file), function) for file, function in _WAITS}
    files = {as_dumped(file) for file in _WAIT_FILES}
    found, cut = _dump()
    if ident not in found:
        return None if cut else False
    for file, function, _ in found[ident]:
        if (file, function) in waits:
            return True
        if file not in files:
            return False
    return False


def runs_pool_work(ident: int) -> bool:
    """Whether thread ``ident`` is a ``concurrent.futures.ThreadPoolExecutor`` worker (its loop
    ``_worker`` is on its stack): a future it runs may be one another thread waits for. False
    for a thread the dump left out (more than 100 threads)."""
    file, function = _POOL_WORKER
    return any((f, fn) == (as_dumped(file), function) for f, fn, _ in stacks().get(ident, []))
