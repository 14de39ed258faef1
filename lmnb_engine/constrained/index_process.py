"""Build an outlines-core token index in a child process that can be stopped.

Why a process: some patterns have exponentially large DFAs (``[a-z]*a[a-z]{30}`` must remember
which of the last 30 letters were an "a"; outlines-core builds the unanchored half of the DFA too,
which ``grammar.compile_grammar``'s start marker keeps small). A thread running that build cannot
be interrupted, and its memory grows until the machine runs out. A child process is killed when ``timeout_s`` passes and runs under an
address-space limit, so a pattern too big to compile costs one bounded error, never the engine.
The child also dies with its parent (Linux: a parent-death signal; elsewhere a CPU-time limit a
little above ``timeout_s``), and the parent stops its children (``ChildGroup``) when an engine
shuts down or the interpreter exits.

The child runs this file as a script (``python index_process.py``) and imports nothing but the
standard library and outlines-core: starting it takes about 0.1 s, paid once per pattern since
compiled grammars are cached. It reads ``pickle((regex, outlines_core.Vocabulary))`` on stdin and
writes ``pickle(("ok", Index))`` or ``pickle(("error", message))`` on stdout; both outlines-core
types pickle since 0.2. Where no child can be started (``sys.executable`` is not a usable Python,
as in some embedded interpreters) the index is built in this process, without the limits.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings

# Address space a compile may use (bytes); a real 128k-token vocabulary's JSON index needs well
# under 2 GiB, while an exploding automaton reaches it in seconds.
DEFAULT_MEMORY_BYTES = 8 << 30

_lock = threading.Lock()  # guards every ChildGroup: a child is registered, or killed, under it


class ChildGroup:
    """Compile processes started on behalf of one owner (an engine's grammar backend), so that the
    owner can stop them all: ``stop`` kills the running ones, and no new one starts afterwards.

    Attributes:
        procs: the running children (``subprocess.Popen``). stopped: ``stop`` was called.
    """

    def __init__(self) -> None:
        self.procs: set = set()
        self.stopped = False

    def stop(self) -> None:
        """Kill the running children and refuse new ones. Thread-safe, idempotent."""
        with _lock:
            self.stopped = True
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()


_ALL = ChildGroup()  # every child of this process

# Before concurrent.futures joins its worker threads at interpreter exit (it waits for each running
# task, and then runs the queued ones): the children are killed and no new one starts, so exit does
# not wait out a compile's time limit.
getattr(threading, "_register_atexit", lambda f: None)(_ALL.stop)


class IndexBuildError(Exception):
    """The child stopped without an index: ``reason`` is ``"timeout"``, ``"memory"``, ``"stopped"``
    (its group was stopped: a shutdown or interpreter exit) or ``"crash"`` (``detail`` has the exit
    status and the end of its stderr)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def build_index(regex: str, vocabulary, timeout_s: float | None, memory_bytes: int | None = DEFAULT_MEMORY_BYTES,
                owner: ChildGroup | None = None):
    """``outlines_core.Index(regex, vocabulary)``, built in a child process.

    Args:
        regex: the pattern (outlines-core syntax). vocabulary: an ``outlines_core.Vocabulary``.
        timeout_s: seconds the build may run before the child is killed (None: no limit).
        memory_bytes: the child's address-space limit (RLIMIT_AS; None: none, or where the
            platform has no such limit).
        owner: the ``ChildGroup`` the child belongs to, so that its owner can stop it (e.g. when
            an engine shuts down).

    Raises:
        ValueError: outlines-core rejected the pattern (its message), as the in-process call would.
        IndexBuildError: the build ran out of time or memory, or the child died or was killed.
    """
    env = dict(os.environ, PYTHONSAFEPATH="1")  # the script's folder must not shadow stdlib names
    argv = [sys.executable or "", os.path.abspath(__file__), str(memory_bytes or 0), str(timeout_s or 0), str(os.getpid())]
    groups = [_ALL] + ([owner] if owner is not None else [])
    if any(g.stopped for g in groups):
        raise IndexBuildError("stopped")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as e:  # no usable interpreter to start: build here (no limits) rather than fail
        warnings.warn(f"cannot start a grammar compile process ({sys.executable!r}: {e}); building in this "
                      "process, without the time and memory limits", RuntimeWarning, stacklevel=2)
        from outlines_core import Index

        return Index(regex, vocabulary)
    with _lock:  # registered, or killed at once if a stop() came while it started: none escapes a stop
        stopped = any(g.stopped for g in groups)
        if not stopped:
            for g in groups:
                g.procs.add(proc)
    if stopped:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipes
        raise IndexBuildError("stopped")
    try:
        out, err = proc.communicate(pickle.dumps((regex, vocabulary)), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise IndexBuildError("timeout") from None
    except BaseException:  # interpreter shutdown, KeyboardInterrupt: never leave the child running
        proc.kill()
        proc.wait()
        raise
    finally:
        with _lock:
            for g in groups:
                g.procs.discard(proc)
    if proc.returncode == 0 and out:
        status, value = pickle.loads(out)
        if status == "ok":
            return value
        raise ValueError(value)
    tail = err.decode(errors="replace").strip()[-500:]
    # Rust aborts on a failed allocation; Python raises MemoryError. A kill that was not a stop()
    # (e.g. the OOM killer's SIGKILL) is a "crash", which is not cached and may be retried.
    if "memory allocation" in tail or "MemoryError" in tail:
        raise IndexBuildError("memory", tail)
    if any(g.stopped for g in groups):
        raise IndexBuildError("stopped")
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
    raise IndexBuildError("crash", f"{how}; {tail}" if tail else how)


def _die_with_parent(timeout_s: float, parent: int) -> None:
    """An orphaned child must not build on alone: SIGKILL when the parent (pid ``parent``) dies
    (Linux), and a CPU-time limit a little above the parent's timeout (everywhere with RLIMIT_CPU)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        pass  # not Linux
    # the parent died before the signal was armed: the orphan's parent is now init, or a subreaper
    # (systemd --user, tini -s), whose pid is not 1
    if os.getppid() != parent:
        os._exit(1)
    if timeout_s:
        try:
            import resource

            seconds = int(timeout_s) + 10
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds))
        except (ImportError, ValueError, OSError):
            pass


def _main() -> None:
    """The child: limit itself, read the request, write the index or the library's message."""
    limit, timeout_s, parent = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    _die_with_parent(timeout_s, parent)
    if limit:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass  # no RLIMIT_AS here (Windows, some macOS): the timeout still bounds the build
    regex, vocabulary = pickle.load(sys.stdin.buffer)
    from outlines_core import Index

    try:
        result = ("ok", Index(regex, vocabulary))
    except (ValueError, TypeError) as e:
        result = ("error", str(e))
    sys.stdout.buffer.write(pickle.dumps(result))


if __name__ == "__main__":
    _main()
