"""Build an outlines-core token index in a child process that can be stopped.

Why a process: outlines-core builds a dense DFA with both anchored and unanchored start states
(regex-automata's default), and the unanchored one can be exponential in a counted repeat whose
first byte recurs inside it (``a[a-z]{25}``, a top-level JSON string with ``maxLength``: 0.35 s at
12, minutes at 20). A thread running that build cannot be interrupted, and its memory grows until
the machine runs out. A child process is killed when ``timeout_s`` passes and runs under an
address-space limit, so a pattern too big to compile costs one bounded error, never the engine.

The child runs this file as a script (``python index_process.py``) and imports nothing but the
standard library and outlines-core: starting it takes about 0.1 s, paid once per pattern since
compiled grammars are cached. It reads ``pickle((regex, outlines_core.Vocabulary))`` on stdin and
writes ``pickle(("ok", Index))`` or ``pickle(("error", message))`` on stdout; both outlines-core
types pickle since 0.2.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys

# Address space a compile may use (bytes); a real 128k-token vocabulary's JSON index needs well
# under 2 GiB, while an exploding automaton reaches it in seconds.
DEFAULT_MEMORY_BYTES = 8 << 30


class IndexBuildError(Exception):
    """The child stopped without an index: ``reason`` is ``"timeout"``, ``"memory"`` or
    ``"crash"`` (``detail`` has the exit status and the end of its stderr)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def build_index(regex: str, vocabulary, timeout_s: float | None, memory_bytes: int | None = DEFAULT_MEMORY_BYTES):
    """``outlines_core.Index(regex, vocabulary)``, built in a child process.

    Args:
        regex: the pattern (outlines-core syntax). vocabulary: an ``outlines_core.Vocabulary``.
        timeout_s: seconds the build may run before the child is killed (None: no limit).
        memory_bytes: the child's address-space limit (RLIMIT_AS; None: none, or where the
            platform has no such limit).

    Raises:
        ValueError: outlines-core rejected the pattern (its message), as the in-process call would.
        IndexBuildError: the build ran out of time or memory, or the child died.
    """
    env = dict(os.environ, PYTHONSAFEPATH="1")  # the script's folder must not shadow stdlib names
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(memory_bytes or 0)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
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
    if proc.returncode == 0 and out:
        status, value = pickle.loads(out)
        if status == "ok":
            return value
        raise ValueError(value)
    tail = err.decode(errors="replace").strip()[-500:]
    # Rust aborts on a failed allocation; Python raises MemoryError; the kernel's OOM killer sends SIGKILL.
    if "memory allocation" in tail or "MemoryError" in tail or proc.returncode == -signal.SIGKILL:
        raise IndexBuildError("memory", tail)
    raise IndexBuildError("crash", f"exit status {proc.returncode}; {tail}")


def _main() -> None:
    """The child: limit memory, read the request, write the index or the library's message."""
    limit = int(sys.argv[1])
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
