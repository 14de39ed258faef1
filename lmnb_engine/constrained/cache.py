"""Compile grammars off the scheduler thread, once per (pattern, tokenizer), shared by all requests.

The paper measured 2.4x lower throughput when every request rebuilt its FSM (§6.3); SGLang keys
its compiled grammars by (kind, pattern). Here the key is (regex, vocabulary fingerprint) so two
engines over the same tokenizer share entries, and the value is a ``Future``: requests that
arrive while a pattern compiles wait on the same future, and the scheduler never blocks on a
compile. Each compile runs in a child process (``index_process``) with a time and memory limit, so
a pattern whose automaton explodes fails with an error instead of taking the machine with it.
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_first
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from lmnb_engine.constrained.errors import GrammarCompileStopped, GrammarError
from lmnb_engine.constrained.grammar import CompiledGrammar, compile_grammar, too_slow_message
from lmnb_engine.constrained.index_process import DEFAULT_MEMORY_BYTES, ChildGroup
from lmnb_engine.constrained.regex_check import check_regex
from lmnb_engine.constrained.regex_syntax import automaton_syntax
from lmnb_engine.constrained.schema import schema_to_regex
from lmnb_engine.constrained.vocab import TokenVocabulary
from lmnb_engine.json_schema import copies_problem
from lmnb_engine.regex_empty_class import empty_class_problem
from lmnb_engine.regex_edges import empty_pattern_problem, without_edge_anchors
from lmnb_engine.regex_errors import long_count_problem, regex_problem
from lmnb_engine.regex_parts import classes_held
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import parser as _p
from lmnb_engine.waits import future_result, sliced_wait


class GrammarCache:
    """LRU map (regex, vocab fingerprint) → ``Future[CompiledGrammar]``.

    A compile that failed with ``GrammarError`` (an invalid or unsatisfiable pattern) stays
    cached: the same pattern over the same vocabulary fails the same way. A compile stopped at a
    limit or killed (``GrammarCompileStopped``), a cancelled one and any other exception are
    dropped, so the next request compiles again.

    Attributes:
        hits, misses: lookup counts (int).
    """

    def __init__(self, max_entries: int = 256):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_submit(self, regex: str, vocab: TokenVocabulary, executor: ThreadPoolExecutor, **limits: Any) -> Future:
        """The cached future for ``(regex, vocab)``, or a new compile submitted to ``executor``
        (``limits``: ``compile_grammar``'s ``timeout_s``, ``memory_bytes`` and ``owner``). An entry
        that is not to be kept (cancelled, stopped) is replaced here, when it is next asked for: a
        done-callback that took this lock could deadlock with the executor's shutdown, which runs
        the callbacks of the futures it cancels under a lock of its own.

        Raises:
            GrammarCompileStopped: ``executor`` was shut down (its engine is shutting down).
        """
        key = (regex, vocab.fingerprint)
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None and _keep(fut):
                self._entries.move_to_end(key)
                self.hits += 1
                return fut
            self.misses += 1
            try:
                fut = executor.submit(compile_grammar, regex, vocab, **limits)
            except RuntimeError:  # "cannot schedule new futures after shutdown"
                raise GrammarCompileStopped.for_shutdown(regex) from None
            self._entries[key] = fut
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return fut

    def clear(self) -> None:
        """Drop every entry (the next request for each pattern compiles cold)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _keep(fut: Future) -> bool:
    """Whether a cached compile serves later requests: running or queued, compiled, or failed on
    the pattern itself (``GrammarError``); not when cancelled, stopped or failed otherwise."""
    if not fut.done():
        return True
    if fut.cancelled():
        return False
    exc = fut.exception()
    return exc is None or (isinstance(exc, GrammarError) and not isinstance(exc, GrammarCompileStopped))


_SHARED_CACHE = GrammarCache()

# A compile is killed after this long, and a request waits at most this long for its compile.
COMPILE_TIMEOUT_S = 60.0


class GrammarBackend:
    """Constrained decoding for one tokenizer: validates requests, compiles off-thread, caches.

    Args:
        tokenizer: a Hugging Face fast tokenizer (byte-level BPE or SentencePiece byte-fallback).
        eos_token_ids: ids allowed in accepting states (default: the tokenizer's EOS).
        vocab_size: logits width (default ``len(tokenizer)``); masks have this many tokens.
        max_workers: compile threads (default: up to 4), so that one slow compile does not hold
            up every other pattern.
        cache: the ``GrammarCache`` (default: one shared by every backend in the process).
        compile_timeout_s: how long a compile may run before it is killed, and how long ``wait``
            waits for one (seconds).
        compile_memory_bytes: address space one compile may use (None: no limit).

    Raises:
        GrammarError: the tokenizer's token bytes cannot be read.
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: frozenset[int] | set[int] | None = None,
        vocab_size: int | None = None,
        max_workers: int | None = None,
        cache: GrammarCache | None = None,
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
        compile_memory_bytes: int | None = DEFAULT_MEMORY_BYTES,
    ):
        self.vocab = TokenVocabulary(tokenizer, eos_token_ids, vocab_size)
        self.compile_timeout_s = compile_timeout_s
        self.compile_memory_bytes = compile_memory_bytes
        self._timed_out: set[str] = set()  # patterns still compiling after a wait timed out
        self.max_workers = max_workers or min(4, os.cpu_count() or 1)
        self.cache = cache if cache is not None else _SHARED_CACHE
        self._regex_of: OrderedDict[tuple, str] = OrderedDict()  # validated constraint -> regex (LRU)
        self._regex_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="lmnb-grammar")
        self._children = ChildGroup()  # the compile processes this backend starts

    def to_regex(self, regex: str | None = None, json_schema: Any = None, whitespace_pattern: str | None = None) -> str:
        """Validate a request's constraint and return its regex (fast; call at submission).

        Exactly one of ``regex`` / ``json_schema`` (dict, JSON string or pydantic class). Results
        are remembered, so a batch of requests with one schema converts it once.

        Raises:
            GrammarError: unsupported regex feature or schema keyword, named.
            ValueError: both or neither given.
        """
        if (regex is None) == (json_schema is None):
            raise ValueError("give exactly one of regex and json_schema")
        if regex is not None:
            key: tuple | None = ("regex", regex)
        elif isinstance(json_schema, dict):
            try:  # first: json.dumps visits each path, 2**30 of a Python-built schema sharing objects
                copies_problem(json_schema)
            except ValueError as e:
                raise GrammarError(str(e)) from None
            try:
                key = ("schema", json.dumps(json_schema, sort_keys=True, default=repr), whitespace_pattern)
            except ValueError:  # (an int of over 4300 digits, a schema holding itself: schema_to_regex names it)
                key = None
        elif isinstance(json_schema, (str, type)):
            key = ("schema", json_schema, whitespace_pattern)
        else:
            key = None  # not a schema at all: schema_to_regex names the problem
        with self._regex_lock:
            if key in self._regex_of:
                self._regex_of.move_to_end(key)
                return self._regex_of[key]
        if regex is not None:
            regex = _automaton_regex(regex)
        else:
            regex = schema_to_regex(json_schema, whitespace_pattern)
        if key is not None:
            with self._regex_lock:
                self._regex_of[key] = regex
                while len(self._regex_of) > self.cache.max_entries:
                    self._regex_of.popitem(last=False)
        return regex

    def submit(self, regex: str) -> Future:
        """``Future[CompiledGrammar]`` for ``regex`` (cached; compiled by a worker thread's child process).

        The future raises ``GrammarError`` if the index cannot be built, can never match, or is
        over the time or memory limit.
        """
        return self.cache.get_or_submit(regex, self.vocab, self._executor, timeout_s=self.compile_timeout_s,
                                        memory_bytes=self.compile_memory_bytes, owner=self._children)

    def wait(self, regex: str, source: str | None = None, abandoned: Future | None = None) -> CompiledGrammar | None:
        """``submit(regex)``'s grammar, waiting at most ``compile_timeout_s``. ``source``: the
        user's own spelling of a regex that ``to_regex`` rewrote into ``regex``, named in errors
        instead of the rewritten pattern (whose classes run to kilobytes: ``\\s`` written out).
        ``abandoned``: a future whose completion ends the wait at once (the request was aborted
        meanwhile); then None is returned and the compile goes on for the cache (its grammar is
        kept for the next request of the pattern), the wait's caller no longer held by it.

        A pattern whose compile already outlasted a wait fails at once until the compile ends (it
        goes on in the background, at most ``compile_timeout_s`` from its start; its grammar is
        cached then), rather than holding each request that asks. A
        pattern still queued when the wait ends is cancelled, and the error says the compiler is
        busy, not that this pattern is slow.

        Raises:
            GrammarError: the pattern cannot be compiled (cached: it fails the same way again).
            GrammarCompileStopped: the compile took longer than ``compile_timeout_s``, ran out of
                memory, was killed, or did not start within the wait.
        """
        try:
            return self._wait(regex, abandoned)
        except GrammarError as e:
            if source is None or source == regex or isinstance(e, GrammarCompileStopped):
                raise
            # (the message names the pattern first; an example after it may be spelt the same)
            named = str(e).replace(shown_regex(regex), shown_regex(source), 1)
            if str(e) == regex_problem(regex):  # Python's words on the pattern trimmed of its edge anchors: its
                named = regex_problem(source) or named  # positions are the trimmed one's, not the user's
            raise GrammarError(named) from None

    def _wait(self, regex: str, abandoned: Future | None) -> CompiledGrammar | None:
        fut = self.submit(regex)
        if abandoned is not None and abandoned.done():  # (the request ended: its caller hears of no compile)
            return None
        if not fut.done() and regex in self._timed_out:
            raise GrammarCompileStopped(self._too_slow(regex))
        busy = (f"the grammar compiler is busy: its {self.max_workers} workers have spent over "
                f"{self.compile_timeout_s:g} s on other patterns, and this one did not start; retry later")
        try:
            try:
                return self._result(fut, abandoned)
            except (CancelledError, GrammarCompileStopped) as e:
                # Another engine sharing the cache shut down (cancelling or killing the compile this
                # request waited on), or another request's wait cancelled it: compile it here, once,
                # with a time limit of its own.
                if self._children.stopped or not (isinstance(e, CancelledError) or e.by_shutdown):
                    raise
                fut = self.submit(regex)
                return self._result(fut, abandoned)
        except CancelledError:
            if self._children.stopped:
                raise GrammarCompileStopped.for_shutdown(regex) from None
            raise GrammarCompileStopped(busy, transient=True) from None
        except FutureTimeout:
            if fut.cancel():  # never started: every worker is busy with other, slow patterns
                raise GrammarCompileStopped(busy, transient=True) from None
            self._timed_out.add(regex)
            fut.add_done_callback(lambda _: self._timed_out.discard(regex))
            raise GrammarCompileStopped(self._too_slow(regex)) from None

    def _result(self, fut: Future, abandoned: Future | None) -> CompiledGrammar | None:
        """``fut``'s grammar within ``compile_timeout_s`` (``FutureTimeout`` past it), or None as soon
        as ``abandoned`` completes (a compile still running then is left to finish for the cache).
        An abandoned wait returns None whatever the compile came to by then, its failure too: the
        request it was for has ended, and its caller is answered by that end. Waited for in slices
        (``lmnb_engine.waits``): a Ctrl-C that landed as the wait began stops it within one."""
        if abandoned is None:
            return future_result(fut, self.compile_timeout_s)

        def either_done(seconds: float) -> bool:
            wait_first([fut, abandoned], timeout=seconds, return_when=FIRST_COMPLETED)
            return fut.done() or abandoned.done()  # (wait never sees a compile cancelled by a shutdown as done)

        sliced_wait(either_done, self.compile_timeout_s)
        if abandoned.done():
            return None
        return fut.result(timeout=0)  # (done, or FutureTimeout: the limit passed with neither done)

    def _too_slow(self, regex: str) -> str:
        return too_slow_message(regex, self.compile_timeout_s)

    def compile(self, regex: str | None = None, json_schema: Any = None, whitespace_pattern: str | None = None) -> CompiledGrammar:
        """Validate, compile (or fetch from the cache) and wait: the blocking convenience form."""
        return self.wait(self.to_regex(regex, json_schema, whitespace_pattern), source=regex)

    def shutdown(self) -> None:
        """Stop compiling: queued compiles are cancelled and running ones killed (their waiting
        requests get ``GrammarCompileStopped``), then the threads end."""
        self._children.stop()  # first: a request woken by the cancels below must see it, and not retry
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor.shutdown(wait=True)


def _unread_problem(regex: str) -> str | None:
    """``gen()``'s words on ``regex`` (``regex_problem``) where Python's parser refuses it (its
    Unicode classes held: ``classes_held``), else None. The engine reads a ``regex`` as Python's
    ``re`` does, as ``gen()`` does; the automaton library would take some such patterns in Rust's
    own syntax (a named group ``(?<n>a)``), so a server's client got a constraint ``gen()``
    refuses. (A pattern too deep or with too large a count is left to the engine's own limits,
    which name them.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _p.parse(classes_held(regex))
    except re.error:
        return regex_problem(regex)
    except (RecursionError, OverflowError):
        pass
    return None


def _refused_by_gen(regex: str) -> str | None:
    """``gen()``'s words on ``regex`` (``regex_problem``), which Python's parser reads, or None where
    ``gen()`` takes it, or where that parser cannot read it for its counts or depth, which the
    engine's own limits name (``check_regex``: "above the limit of 1000")."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _p.parse(classes_held(regex))
    except (RecursionError, OverflowError):
        return None
    return regex_problem(regex)


def _automaton_regex(regex: str) -> str:
    """The user's ``regex`` without its edge anchors (``without_edge_anchors``), checked
    (``check_regex``, and ``gen()``'s checks, ``regex_problem``, which, where ``gen()`` refuses the
    pattern, come before ``check_regex``'s refusals, as in ``gen()``; then for a class that matches
    no character: ``empty_class_problem``) and in the automaton library's syntax
    (``automaton_syntax``).

    Raises:
        GrammarError: from those checks, naming the pattern as the user wrote it (with its anchors)
            and worded as ``gen()`` words it where ``gen()`` refuses it too, so that positions and
            fixes are the user's pattern's, not the trimmed one's.
    """
    trimmed = without_edge_anchors(regex)
    # (a count Python's int() refuses for its digits first: every check below parses the pattern)
    problem = long_count_problem(regex) or empty_pattern_problem(regex) or _unread_problem(regex)
    if problem:
        raise GrammarError(problem)
    try:
        check_regex(trimmed)
        spelled = automaton_syntax(trimmed)
    except GrammarError as e:
        # (gen()'s words where gen() refuses the pattern too, a class that matches no character or one the
        # library cannot build beside a lookbehind: it asks before the engine's refusals, and offers no fix
        # the engine refuses, regex_errors.offer_taken)
        said = _refused_by_gen(regex)
        if said:
            raise GrammarError(said) from None
        if trimmed == regex:
            raise
        raise GrammarError(str(e).replace(shown_regex(trimmed), shown_regex(regex), 1)) from None
    problem = empty_class_problem(regex)  # (which the library refuses only compiling, in its own words)
    if problem:
        raise GrammarError(problem)
    return spelled
