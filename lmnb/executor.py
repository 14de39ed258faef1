"""The stream executor: runs one program state's primitives in order (paper §2, "Execution").

``s += expr`` submits ``expr`` to the state's executor and returns at once; the executor runs its
primitives on a worker thread, so Python code between primitives, other states and fork branches
all proceed while the model works. Reading ``s["x"]`` blocks until ``x`` is ready. Errors,
``ProgramEvent``s for live views, and the fork/join mechanics live here; the user-facing
``ProgramState`` is in ``lmnb.interpreter``.

Semantics follow SGLang's ``lang/interpreter.py`` ``StreamExecutor`` with its known flaws fixed
(``research/features.md`` §4.3–4.4): forking an empty state works; a fork's shared prefix is
prefilled once (``CommitLazy``) before the branches start; a failing primitive is recorded, never
lost, and surfaces where its result is read; unknown roles raise; a state stays usable after its
program returns (a notebook continues it in the next cell).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import operator
import random
import sys
import threading
import time
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from lmnb import speculative
from lmnb.speculative import Speculation
from lmnb.backend.base import DELTA_TOKENS, BackendError, BaseBackend, Completion, Prompt, finish_reason_dict, reworded
from lmnb.backend.media import check_source
from lmnb.chat_template import ChatTemplate
from lmnb.interrupt import held_interrupts
from lmnb.thread_waits import blocked_in_a_join, runs_pool_work
from lmnb.user_site import running_for, user_site
from lmnb.ir import (
    DTYPE_STOPS,
    RUN_MAX_TOKENS_OPTION,
    CommitLazy,
    ConstantText,
    Expr,
    ExprList,
    Gen,
    GenParams,
    Image,
    RoleBegin,
    RoleEnd,
    RunDefaults,
    Select,
    VarScopeBegin,
    VarScopeEnd,
    Video,
    as_expr,
    dtype_prefix,
    dtype_regex,
    shown_value,
)

if TYPE_CHECKING:
    from lmnb.interpreter import ProgramStateGroup


class ProgramError(RuntimeError):
    """A primitive of a program failed.

    Attributes:
        branch: fork path of the failing state, e.g. ``(2,)`` for branch 2 of a fork of the root.
        expr: repr of the primitive that failed.
        partial_text: the state's text up to the failure (nothing is lost).
        primitive: the primitive (``lmnb.ir.Expr``) that failed, or None.
        site: the user's line that added that primitive (``lmnb.user_site.Site``: file, line
            number), or None: the program body had moved on when it failed, so no frame of the
            error's traceback is that line.
    """

    site = None

    def __init__(self, message: str, branch: tuple = (), expr: str = "", partial_text: str = "",
                 primitive: Optional[Any] = None):
        where = f"in fork branch {'.'.join(map(str, branch))}: " if branch else ""
        super().__init__(where + message)
        self.message = message  # without the branch prefix (ForkError names the branch itself)
        self.branch = branch
        self.expr = expr
        self.partial_text = partial_text
        self.primitive = primitive


ABORTED = ("the program state was aborted; the text it had written is in the error's partial_text "
           "(state.error().partial_text)")
"""The message of a ``ProgramAborted``."""


class ProgramAborted(ProgramError):
    """The state was aborted (``ProgramState.abort`` or Ctrl-C) while it ran.

    Attributes:
        branches: the errors of the fork branches that were running under this state (not yet
            joined) when it was aborted, in fork order, each with its ``branch`` path and its own
            ``partial_text`` (a branch's text is not in this state's text until it is joined).
    """

    def __init__(self, message: str, branch: tuple = (), expr: str = "", partial_text: str = ""):
        super().__init__(message, branch, expr, partial_text)
        self.branches: list[ProgramError] = []


class ForkError(ProgramError):
    """One or more fork branches failed; raised by ``join``.

    Attributes:
        errors: ``{branch index: ProgramError}`` of the failed branches.
        states: the ``ProgramStateGroup``; successful branches' variables remain readable there.
        aborted: indices of the branches that the join aborted, still running, as the others had
            failed (``ProgramStateGroup.join_or_abort``); none for ``join``, which waits for them.
    """

    def __init__(self, errors: dict, states: "ProgramStateGroup", aborted: tuple = ()):
        # the whole path: a nested fork's branch is "0.1"
        failures = _failures([(getattr(e, "branch", ()) or (i,), e) for i, e in sorted(errors.items())])
        stopped = ""
        if aborted:
            paths = [states[i].stream_executor.branch or (i,) for i in aborted]
            one = len(aborted) == 1
            stopped = (f"; the branch{'' if one else 'es'} still running ({_branch_list(paths)}) "
                       f"{'was' if one else 'were'} aborted")
        super().__init__(f"{len(errors)} of {len(states)} fork branches failed: {failures}{stopped}")
        self.errors = errors
        self.states = states
        self.aborted = tuple(aborted)


class UnjoinedForkError(ProgramError):
    """Fork branches that no join took failed, and the program read none of their errors: the
    state's error once its program body returned (a join raises ``ForkError`` instead).

    Attributes:
        branches: those errors, in fork order, each with its ``branch`` path and ``partial_text``.
    """

    def __init__(self, errors: list, branch: tuple, partial_text: str):
        n = len(errors)
        super().__init__(f"{n} fork branch{'es' * (n > 1)} that no join took failed: "
                         f"{_failures([(e.branch, e) for e in errors])}; join the fork (its join raises its branches' "
                         "errors), or read each branch's error() where the program handles them", branch, "",
                         partial_text)
        self.branches = errors


def _failures(errors: list) -> str:
    """``(branch path, error)`` pairs as "branch 0: ...; branches 1-15: ...": branches that failed
    alike are named once (a fork of 16 over a prompt too long for the model listed the same
    message 16 times)."""
    groups: dict[str, list[tuple]] = {}
    for path, e in errors:
        groups.setdefault(str(getattr(e, "message", e)), []).append(path)
    return "; ".join(f"branch{'es' * (len(paths) > 1)} {_branch_list(paths)}: {message}"
                     for message, paths in groups.items())


def _branch_list(paths: list[tuple]) -> str:
    """Branch paths as "0.1, 2", with runs of consecutive branches of one fork as "0-15" (nested:
    "0.0-0.11", both ends in full, since "0.0-11" reads like a range of numbers)."""
    runs: list[list[tuple]] = []
    for path in paths:
        last = runs[-1][-1] if runs else None
        if last is not None and last[:-1] == path[:-1] and last[-1] + 1 == path[-1]:
            runs[-1].append(path)
        else:
            runs.append([path])

    def dotted(path: tuple) -> str:
        return ".".join(map(str, path))

    return ", ".join(dotted(r[0]) + (f"-{dotted(r[-1])}" if len(r) > 1 else "") for r in runs)


# ----------------------------------------------------------------------------------- observers


@dataclasses.dataclass(frozen=True)
class ProgramEvent:
    """Something a program state did, for live views (notebook widgets, logs).

    kind: ``"state"`` (a state was created; ``value`` is its ``StreamExecutor``, whose ``abort()``
    stops it; ``parent`` and ``branch`` set for fork branches),
    ``"text"`` (``text`` appended; ``source`` is ``fill``/``role``/``gen``/``select``/``join``, or
    ``image``/``video`` with the ``lmnb.ir.Image``/``Video`` input as ``value``,
    ``name`` the variable for gen/select; a streamed gen's delta from a backend that reports its
    tokens has ``meta_info={"tokens": [[logprob or None, token_id, text], ...]}`` and may then have
    empty ``text``), ``"var"`` (variable ``name`` set to ``value`` with ``meta_info``; ``name`` is
    None for an unnamed gen or select, which sets no variable but made a request, and for a gen
    whose request was aborted (its ``finish_reason`` says so; ``value`` None); a constrained
    gen's ``constraint`` is ``{"regex": ..., "json_schema": ...}``; ``source`` is ``"join"`` for
    the lists a join gathers from its branches, whose requests the branches' own events reported,
    where a gen with ``n`` > 1 gives a list of its ``n`` requests' meta infos), ``"prefill"`` (a prefix-cache
    hint ran; ``meta_info``), ``"fork"`` (``children`` sids), ``"join"`` (``children`` sids,
    ``mode`` in ``source``), ``"error"``.
    """

    kind: str
    sid: str
    text: str = ""
    source: str = ""
    name: Optional[str] = None
    value: Any = None
    meta_info: Optional[dict] = None
    parent: Optional[str] = None
    branch: tuple = ()
    children: tuple = ()
    error: Optional[BaseException] = None
    constraint: Optional[dict] = None


_listeners: contextvars.ContextVar[tuple] = contextvars.ContextVar("lmnb_listeners", default=())
# ident of a thread in StreamExecutor._wait -> ((ident of the thread the wait is for, the state
# waited on, that state's _Changes.count as the wait began), ...): a streamed body blocked reading a
# state whose own body reads back (StreamExecutor._waits_on_a_body_of). A wait is for another
# thread where text_async_iter steps wait on worker threads for the thread of their event loop;
# several on one thread are a wait nested in another (a signal handler's read). No lock: only its
# own thread changes an entry, and a read nested in its change (a signal handler's, which ran on
# the thread holding a lock for that change and took it again: hung for good) has ended, leaving
# the entry as it found it, before the change goes on (one dict operation each, atomic)
_waiting_on: dict[int, tuple[tuple[int, "StreamExecutor", int], ...]] = {}
# The option that sets a run's max_new_tokens, as run() calls made in this context name it (``RunDefaults``).
_max_tokens_option: contextvars.ContextVar[str] = contextvars.ContextVar(
    "lmnb_max_tokens_option", default=RUN_MAX_TOKENS_OPTION)


@contextlib.contextmanager
def max_tokens_option(option: str):
    """Within this block, ``run()`` and ``run_batch()`` calls (not those their program bodies make)
    name their ``max_new_tokens`` in errors as the front end's ``option``, ``{}`` where the number
    goes: a ``%%lm`` cell runs its program under ``"the cell's --max-tokens {}"``, where the
    Python API says ``run(max_new_tokens={})`` (``RunDefaults.max_tokens_option``)."""
    token = _max_tokens_option.set(option)
    try:
        yield
    finally:
        _max_tokens_option.reset(token)


def current_max_tokens_option() -> str:
    """The option that names a run's ``max_new_tokens`` here (``max_tokens_option``)."""
    return _max_tokens_option.get()


@contextlib.contextmanager
def observe(callback: Callable[[ProgramEvent], None]):
    """Within this block, program states created in this context (and their fork branches) call
    ``callback(event)`` for every ``ProgramEvent``. Callbacks run on executor threads and must be
    quick; their exceptions are turned into warnings. A callback that reads its state in a way that
    waits (``text()``, ``s[name]`` of a variable not set yet) gets a ``RuntimeError``: the thread
    it runs on is the one the wait would be for."""
    token = _listeners.set(_listeners.get() + (callback,))
    try:
        yield
    finally:
        _listeners.reset(token)


# ------------------------------------------------------------------------------------ executor


class _JoinApply(Expr):
    """Internal: apply the result of ``ProgramStateGroup.join`` to the parent, in program order."""

    def __init__(self, variables: dict, meta_info: dict, text: str, messages: list, children: tuple, mode: str,
                 images: tuple = ()):
        self.variables = variables
        self.images = images  # [issue 10] image()/video() inputs in the appended text, in order
        self.meta_info = meta_info
        self.text = text
        self.messages = messages
        self.children = children
        self.mode = mode


def _var_names(expr: Expr) -> list[str]:
    """Variables ``expr`` will set (so readers can wait for them from submission on)."""
    if isinstance(expr, (Gen, Select)) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, VarScopeEnd):
        return [expr.name]
    if isinstance(expr, _JoinApply):
        return list(expr.variables)
    if isinstance(expr, ExprList):
        return [n for e in expr.exprs for n in _var_names(e)]
    return []


def derived_seed(seed: int, path: tuple) -> int:
    """The seed, in [0, 2**62), of the sample at ``path`` (a tuple of ints) under the run's ``seed``:
    a fork branch's gens (``path``: its ``seed_path``) and ``run_batch``'s item i (``path``: ``(i,)``)
    use ``random.Random(f"{seed}:{path}").randrange(2**62)``, so samples differ from one another and
    from the seed's own, and the same seed gives them again."""
    return random.Random(f"{seed}:{path}").randrange(2**62)


def _select_requests(meta: dict) -> list[dict]:
    """The requests a select's decision ``meta`` (``choices._meta``'s keys) tells of, as a gen's
    meta_info: the prompt's own prefill (``prompt_prefill``), where the backend made one, then one
    scoring request per choice of ``prefix_len`` + its scored tokens (``cached_tokens`` of them
    from the cache), the prompt tokens a decided select's ``var`` event is counted by."""
    prefill = meta.get("prompt_prefill")
    requests = [dict(prefill)] if isinstance(prefill, dict) else []
    for prefix, scored, cached in zip(meta.get("prefix_len", []), meta.get("input_token_logprobs", []),
                                      meta.get("cached_tokens", [])):
        requests.append({"prompt_tokens": int(prefix) + len(scored), "cached_tokens": int(cached or 0)})
    return requests


def _constraint(params: GenParams) -> Optional[dict]:
    """The output constraint of a resolved gen (a dtype's regex included), for ``var`` events."""
    if params.regex is None and params.json_schema is None:
        return None
    return {"regex": params.regex, "json_schema": params.json_schema}


def named(expr: Any) -> str:
    """How an error names the primitive ``expr`` that failed: the ``%%lm`` hole that wrote it, else
    its repr. A repr that raises (a user's object in ``image(obj)`` or a select's choices) is named by
    the primitive's type, ``Image(<repr failed: RuntimeError: ...>)``: reporting a failure must not
    fail itself, or the state's worker thread died with the state still running."""
    hole = getattr(expr, "cell_hole", None)
    if hole:
        return hole
    try:
        return repr(expr)
    except Exception as e:  # noqa: BLE001 - a user's __repr__ may raise anything
        return f"{type(expr).__name__}(<repr failed: {exception_text(e)}>)"


def exception_text(exc: BaseException) -> str:
    """``"TypeName: message"`` of ``exc`` as an error message quotes it; the message is
    ``<str() failed>`` where the exception's ``__str__`` raises (a user's exception class)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a user's __str__ may raise anything
        text = "<str() failed>"
    return f"{type(exc).__name__}: {text}"


# Bytes a fork branch takes at least: a program state of its own (a StreamExecutor with its lock,
# condition and copies of the parent's lists and dicts). tracemalloc counted 5.9 KB a branch for
# fork(20000) after one short fill, and benches/results/2026-12-06-cpu-wide-programs.md 6.3 GB of
# max RSS for fork(1,000,000): this bound is under both, so a fork it refuses could not have fit.
BRANCH_BYTES_AT_LEAST = 4096
# Forks whose branches need at most this are not weighed: asking psutil reads /proc/meminfo, about
# 0.15 ms, a tenth to a half of a fork(2) and its join (0.8-1.7 ms) on a loaded machine; no machine
# that runs lmnb at all has less RAM available than this.
UNWEIGHED_FORK_BYTES = 16 << 20


def _available_ram_bytes() -> int:
    """RAM that new objects can take without swapping (psutil's ``available``)."""
    import psutil  # (lazily: import lmnb stays light)

    return int(psutil.virtual_memory().available)


def _fork_size(size: Any) -> int:
    """``fork``'s size as an int. SGLang takes ``int(size)``, so a NumPy integer (a count computed
    with NumPy) works there; any integer type does here (``__index__``), but not a bool, a float
    or a string, which would fork a number the program did not say.

    There is no fixed cap (fork(1,000,000) is in benches/bench_wide_programs' results): a size is
    refused where its branches, ``BRANCH_BYTES_AT_LEAST`` each, need more than the RAM available,
    as ``s.fork(10**5000)`` made branches one by one until the process was killed for memory (those
    of ``UNWEIGHED_FORK_BYTES`` at most, 4096 branches, are taken without asking).

    Raises:
        ValueError: not an integer, below 1, or more branches than the available RAM holds.
    """
    try:
        n = operator.index(size)
    except TypeError:
        n = None
    if n is None or isinstance(size, bool) or n < 1:
        raise ValueError(f"fork size must be an integer >= 1, got {shown_value(size)}")
    if n * BRANCH_BYTES_AT_LEAST <= UNWEIGHED_FORK_BYTES:
        return n
    available = _available_ram_bytes()
    if n * BRANCH_BYTES_AT_LEAST > available:
        raise ValueError(
            f"fork size {shown_value(n)} is more branches than memory holds: each is a program state of at least "
            f"{BRANCH_BYTES_AT_LEAST} bytes, so they need {shown_value(n * BRANCH_BYTES_AT_LEAST)} bytes, and "
            f"{available} bytes of RAM are available; fork at most {available // BRANCH_BYTES_AT_LEAST} branches, "
            "or run one program per input with run_batch")
    return n


def _fresh(error: BaseException) -> BaseException:
    """``error``, a state's stored error, cleared of its traceback to be raised again by a read
    (``text()``, ``s[name]``). Raised as it is, it kept the frames of every earlier raise of it
    (another reader's, the kernel's waiter thread's) below the new ones, so a read's traceback grew
    with each read and pointed at code that had not failed; where it really failed is in its
    ``__cause__``. ``iter_text`` and the worker's own raises keep the frames: the kernel's waiter
    reads through ``iter_text`` while a ``--python`` body may raise the same error, and the cell's
    error message takes the body's line from the frames that raise left (``magics._describe``)."""
    return error.with_traceback(None)


class _Changes(threading.Condition):
    """A state's condition variable, counting its ``notify_all`` calls (``count``): a thread that
    began waiting on the state when the count was what it is now has not been woken since, so
    the state is as it was when that thread last looked and decided to wait."""

    def __init__(self, lock: Any = None) -> None:
        super().__init__(lock)
        self.count = 0

    def notify_all(self) -> None:
        self.count += 1
        super().notify_all()


def _waits_on_a_body_of(body: int, reader: threading.Thread) -> bool:
    """Whether thread ``body`` is blocked reading a state (``StreamExecutor._wait``) whose streamed
    body runs on thread ``reader``, or on a thread blocked so in turn: a body that ran a program
    with ``run(stream=True)`` and reads its result, whose body reads the first one's state
    (``critic.run(parent=s, stream=True)``, then ``parent.text()`` there). The two waited for
    each other for good; the later body, not one of the first body's bystanders, reads the first
    state as it stands. (A wait just begun or ended is seen at the reader's next look,
    ``MARKED_STOP_POLL_S`` later; so is one on a state whose lock another thread holds: it is
    not waited for, as the reader holds another state's lock.)

    Only a wait that nothing but that body can end counts: the state is idle, and unchanged (not
    woken) since the thread began to wait. A thread waiting for work queued on it (``child["c"]``
    while that gen runs) goes on once the work ran, whatever the body does meanwhile; taken as
    blocked for good, a read of the first state by the later body (``parent["y"]``, set just
    after) failed at once where it would have waited a moment. A thread may have several waits
    recorded (``_waiting_on``: the reads of ``text_async_iter`` tasks of the event loop a body
    runs): any one of them blocked so counts.

    The reader may also be a thread such a later body waits for, as the last rule of
    ``_body_elsewhere`` has it, when it was started since that later body began: a helper it
    joins, or a pool worker running the future it waits on (the critic reading the parent's text
    through ``pool.submit(parent.text).result()``). While that body is blocked in ``Thread.join``
    or ``Future.result`` (or cannot be seen there), the first body's state is read as it stands
    there: waiting for it hung the three threads. (An older thread waits: a consumer of the first
    state, a pool worker that called the first ``run(stream=True)``, which read the first body's
    text without its end.)"""
    todo, seen = [(body, None)], set()
    while todo:
        body, owner = todo.pop()
        if body in seen:
            continue
        seen.add(body)
        waits = [(state, count) for entries in _waiting_on.copy().values()
                 for waiter, state, count in entries if waiter == body]
        if not waits:  # a later body blocked in a join may wait for the reader, a helper of its
            if (owner is not None and reader not in owner.body_bystanders
                    and blocked_in_a_join(body) is not False):
                return True
            continue
        for state, count in waits:
            if not state._cv.acquire(blocking=False):
                continue
            try:
                if state._queue or state._draining or state._cv.count != count:
                    continue
                later = state._body_owner()
            finally:
                state._cv.release()
            if later.body_thread == reader.ident:
                return True
            if later.body_thread not in (None, -1):
                todo.append((later.body_thread, later))
    return False


def _running(thread: threading.Thread) -> bool:
    """``thread.is_alive()``; False where that raises (Python 3.13 raises for a thread that
    threading did not start, a ``_DummyThread``, once it ended)."""
    try:
        return thread.is_alive()
    except RuntimeError:
        return False


class StreamExecutor:
    """Runs the primitives of one program state in order on a worker thread.

    The worker thread exists only while there is work; a state whose program has returned can be
    continued (``s += ...``) later. All mutable state is guarded by one condition variable.
    """

    def __init__(
        self,
        backend: BaseBackend,
        arguments: dict,
        default_params: GenParams,
        chat_template: Optional[ChatTemplate] = None,
        stream: bool = False,
        num_api_spec_tokens: Optional[int] = None,
        use_thread: bool = True,
        listeners: tuple = (),
        branch: tuple = (),
        parent_sid: Optional[str] = None,
    ):
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.chat_template = chat_template or backend.get_chat_template()
        self.stream = stream
        self.num_api_spec_tokens = num_api_spec_tokens
        self.use_thread = use_thread
        self.listeners = listeners
        self.branch = branch

        self.text_ = ""
        self.messages_: list[dict] = []
        self.images_: list = []  # [issue 10] image()/video() inputs, in prompt order
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos: Optional[int] = None
        self.fork_start_text_pos: Optional[int] = None
        self.fork_start_messages: int = 0
        self.fork_start_images: int = 0  # [issue 10] images_ inherited at the fork
        self.fork_start_role: Optional[str] = None  # the chat role open at the fork
        self.vars_set: list[str] = []  # names this executor set itself (what join gathers)
        # all text written to each variable, in order (a gen in a loop writes one name again and again),
        # and its writes, each (start, end, meta_info at its end) in var_log, end None while a
        # streamed gen writes it: what iter_text(name) reads, so that a reader yields each write's
        # end with that write's own final meta info (its finish reason), not the next one's; and the
        # write where its current value began (a reader that starts reads from there)
        self.var_log: dict[str, str] = {}
        self.var_writes: dict[str, list[tuple[int, Optional[int], Any]]] = {}
        self.var_start: dict[str, int] = {}
        # variables whose value a join gathered (a list, one entry per branch): no text of this
        # state's is theirs, so iter_text(name) says so rather than end with nothing
        self.gathered: set[str] = set()
        # where in text_ the text of the last gen that sampled tokens ends (named or not), None before
        # one: a state ending there ends in a sampled token no forward pass has run yet (%lm tree)
        self.sampled_end: Optional[int] = None
        self.error_: Optional[ProgramError] = None
        # the program was told of error_ (it raised to a reader, error() returned it, a join named
        # it): an unjoined fork branch's error it never was told of surfaces on the root instead
        self.error_read = False
        self.closed = False  # the program body returned (or the branch was joined)
        # the thread running a streamed program's body (-1 until it starts), None when none runs:
        # the thread that started it (body_caller) and the others running then wait for it, as it
        # may still submit what they read (_body_elsewhere)
        self.body_thread: Optional[int] = None
        self.body_caller: Optional[threading.Thread] = None
        # the threads that ran as it started: none of them is one it started, so none but a pool
        # worker can be the thread it waits for (_body_elsewhere)
        self.body_bystanders: frozenset = frozenset()
        # the thread running a program body that is not streamed, None when none runs: a second
        # body on this state (run(state=s)) is refused meanwhile, as while body_thread is set
        self.plain_body: Optional[int] = None
        # the state whose program body adds to this one: a fork branch's is its parent's root, or
        # its parent when a body of the parent's own ran there (run(state=branch))
        self.root = self
        self.joined = False  # a fork branch merged into its parent: it takes no more primitives
        # joins of this state's fork groups whose merge is not submitted yet: this state's own join
        # into its parent waits for them (``join_ready``), or it would read this state without them
        self._merging = 0
        self.speculation = Speculation()  # completion-model API speculation left over
        self._spec_terms: list[tuple] = []  # chat-model API speculation inside an assistant role

        self._cv = _Changes()
        self._queue: collections.deque = collections.deque()
        self._draining = False
        self._drainer: Optional[int] = None  # the thread running the queue (an event listener's too)
        self._pending: collections.Counter = collections.Counter()  # var name -> writes queued
        self._version = 0  # bumped on every text/variable change (streaming readers wait on it)
        self._inflight: set[str] = set()
        # (in-flight requests sent their abort already: Ctrl-C's abort, then run()'s, sends one, not two)
        self._abort_sent: set[str] = set()
        self._lost: set[str] = set()  # variables whose pending write was cancelled by an error
        self._scopes: dict[str, int] = {}
        # its fork branches no join took, and theirs that were left when their join took them
        # (a join hands a branch's unjoined forks to the state it joins into)
        self._children: list[StreamExecutor] = []
        # events set each time this state fails or has run all it was given (``watch``): a wait on
        # several states at once, which one condition variable per state cannot serve
        self._watchers: list[threading.Event] = []
        # which child of which fork this is, on the way from the root (each element: the child's
        # place among all its parent's fork children), so a second fork of one state gets seeds
        # of its own; ``branch`` repeats (0, 1, ...) for every fork
        self.seed_path: tuple = ()
        self._forked = 0  # fork children made so far, joined ones too (join drops them from _children)
        self._emit("state", parent=parent_sid, branch=branch, value=self)

    # -- events

    def _emit(self, kind: str, **kw) -> None:
        if not self.listeners:
            return
        event = ProgramEvent(kind=kind, sid=self.sid, **kw)
        for cb in self.listeners:
            try:
                cb(event)
            except Exception as e:  # a broken view must not break the program
                warnings.warn(f"lmnb event listener {named(cb)} raised {exception_text(e)}", stacklevel=2)

    # -- submission and waiting

    def submit(self, expr: Any) -> None:
        """Queue ``expr`` (an ``Expr`` or str) to run after everything submitted before it. Where
        the worker thread cannot be started, the state fails with that error (``ProgramError``
        at its reads) and what was queued is skipped."""
        expr = as_expr(expr)
        with self._cv:  # (a join of this branch marks it joined under this lock: nothing slips in after)
            self._refuse_if_joined()
            for name in _var_names(expr):
                if self.error_ is not None:
                    self._lost.add(name)  # it will be skipped
                else:
                    self._pending[name] += 1
            self._queue.append((expr, user_site()))  # (the user's line, for a warning: user_site)
            if self._draining:
                return
            self._draining = True
        if self.use_thread:
            try:
                threading.Thread(target=self._drain, daemon=True, name=f"lmnb-state-{self.sid[:8]}").start()
            except RuntimeError as e:  # ("can't start new thread"; not a Ctrl-C or the kernel's BodyStopped
                # raised in Thread.start's wait for a thread that did start.) The state fails with it
                # and the queue is settled here, each primitive skipped: it would wait for a worker
                # that never started, and every read of it hung
                self.fail("starting the thread that runs this state's primitives", e)
                self._drain()
        else:
            self._drain()

    def _refuse_if_joined(self) -> None:
        """Raise if this is a fork branch joined into its parent already: it takes nothing more."""
        if self.joined:
            raise RuntimeError(f"fork branch {'.'.join(map(str, self.branch))} was joined into its parent; "
                               "extend the parent state, or fork it again")

    def _drain(self) -> None:
        interrupted = None
        with self._cv:
            self._drainer = threading.get_ident()
        while True:
            with self._cv:
                if not self._queue:
                    self._draining = False
                    self._drainer = None
                    self._version += 1
                    self._cv.notify_all()
                    self._wake_watchers()
                    break
                expr, site = self._queue.popleft()
                failed = self.error_ is not None
            if failed:
                self._release(_var_names(expr))
                continue
            try:
                with running_for(site):
                    self._execute(expr)
            except KeyboardInterrupt as e:  # (use_thread=False drains on the caller's thread, the main one)
                self.abort()  # as Ctrl-C in run() does; the rest of the queue is skipped
                interrupted = e
            except BaseException as e:  # noqa: BLE001 - every failure is recorded, none is lost
                self.fail(named(expr), e, expr, site)
        if interrupted is not None:  # raised once the queue is settled, so waiting for it cannot hang
            raise interrupted

    def _release(self, names: list[str]) -> None:
        with self._cv:
            for n in names:
                self._pending[n] = max(0, self._pending[n] - 1)
            self._version += 1
            self._cv.notify_all()

    def fail(self, what: str, exc: BaseException, primitive: Optional[Expr] = None, site=None) -> None:
        """Record ``exc`` (raised by ``what``, e.g. a primitive's repr; by ``primitive``, where one
        raised it, added at the user's ``site``) as this state's error."""
        if isinstance(exc, ProgramError):
            err = exc
        else:
            shown = what if len(what) <= 160 else f"{what[:100]} ... {what[-50:]}"  # a prompt can be long
            err = ProgramError(f"{shown} failed: {exception_text(exc)}", self.branch, what, self.text_, primitive)
            err.__cause__ = exc
            err.site = site
        with self._cv:
            if self.error_ is None:
                self.error_ = err
            self._cancel_pending()
            self._wake_watchers()
        self._emit("error", error=err)

    def _cancel_pending(self) -> None:
        """(Lock held.) Queued writes will not happen: readers of those variables get the error."""
        self._lost.update(n for n, k in self._pending.items() if k > 0)
        self._pending.clear()
        self._version += 1
        self._cv.notify_all()

    def watch(self, event: threading.Event) -> None:
        """Set ``event`` whenever this state fails (or is aborted) or has run every primitive
        submitted to it, until ``unwatch``: a waiter clears it, checks the states it watches, and
        waits on it, so that it wakes at the first change of any of them."""
        with self._cv:
            self._watchers.append(event)

    def unwatch(self, event: threading.Event) -> None:
        """Stop setting ``event`` (given to ``watch``)."""
        with self._cv:
            self._watchers.remove(event)

    def _wake_watchers(self) -> None:
        """(Lock held.) Set the events of ``watch``."""
        for event in self._watchers:
            event.set()

    def idle(self) -> bool:
        """Whether no primitive is queued or running."""
        with self._cv:
            return not self._queue and not self._draining

    def _wait(self, timeout: Optional[float] = None, reader: Optional[threading.Thread] = None) -> None:
        """(Lock held.) Wait for a change of this state, or ``timeout`` seconds, at most
        ``lmnb_engine.waits.MARKED_STOP_POLL_S`` (callers look again and wait on), so that a Ctrl-C
        that landed as the wait began takes effect (``settle``'s wait for the reports of a Stop's
        aborted requests, up to 5 s on the cell's main thread, held a press for all of it).
        ``reader``: the thread the wait is for (the calling thread by default), recorded as
        waiting on this state (``_waiting_on``): ``text_async_iter`` steps wait on worker threads
        for the thread of the event loop, a streamed body running ``asyncio.run``.

        Raises:
            RuntimeError: called on the thread that runs this state's primitives (in an
                ``lmnb.observe`` callback): that thread makes the changes, so the wait never ended.
        """
        self.refuse_if_running_here()
        from lmnb_engine.waits import MARKED_STOP_POLL_S  # torch-free (not at the top: import lmnb loads no engine)

        here = threading.get_ident()
        wait = (here if reader is None else reader.ident, self, self._cv.count)
        try:  # (the store inside: a Ctrl-C landing right after it must not leave it behind)
            _waiting_on[here] = (*_waiting_on.get(here, ()), wait)
            self._cv.wait(MARKED_STOP_POLL_S if timeout is None else min(timeout, MARKED_STOP_POLL_S))
        finally:
            waits = tuple(w for w in _waiting_on.get(here, ()) if w is not wait)
            if waits:
                _waiting_on[here] = waits
            else:
                _waiting_on.pop(here, None)

    def refuse_if_running_here(self) -> None:
        """Raise if the caller is the thread that runs this state's primitives (an
        ``lmnb.observe`` callback's): a wait for this state, or for anything that waits for it,
        would wait for itself forever.

        Raises:
            RuntimeError: as above.
        """
        if self._drainer == threading.get_ident():
            raise RuntimeError("this program state was read (text(), s[name], sync(), ...) on the thread that runs its "
                               "primitives, from an lmnb.observe callback: it would wait for itself forever; use the "
                               "event's fields, or read the state on another thread")

    def wait_idle(self) -> None:
        """Block until every submitted primitive has run (or was skipped after an error)."""
        with self._cv:
            while self._queue or self._draining:
                self._wait()

    def settle(self, deadline: float) -> bool:
        """Wait until no primitive is queued or running on this state and on the fork branches it
        holds, or until ``deadline`` (``time.monotonic()`` seconds). After an abort: the branches'
        workers have reported the requests it stopped (their prompt and cached tokens, as ``var``
        events) by then, so a listener that stops listening after it loses none of them. Returns
        whether they all settled; a backend that ignores aborts may hold a request past the deadline."""
        with self._cv:
            while self._queue or self._draining:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait(left)
            children = list(self._children)
        return all([c.settle(deadline) for c in children])

    @contextlib.contextmanager
    def merging(self):
        """Held by a join of one of this state's fork groups until it has submitted its merge, so
        that a join of this state (itself a fork branch) into its parent, on another thread, waits
        for that merge instead of reading this state without it.

        Raises:
            RuntimeError: this state is a fork branch joined into its parent already, so nothing
                can merge into it.
        """
        with self._cv:
            if self.joined:
                raise RuntimeError(
                    f"these branches were forked from fork branch {'.'.join(map(str, self.branch))}, which was "
                    "joined into its parent already; join the inner fork before the outer one")
            self._merging += 1
        try:
            yield
        finally:
            with self._cv:
                self._merging -= 1
                self._version += 1
                self._cv.notify_all()

    def join_ready(self) -> None:
        """Wait until this fork branch has run everything submitted to it, the merges of joins of
        its own forks included (``merging``), and a program body running on it
        (``run(state=branch)``, streamed or not) has returned, then mark it joined: from then on it
        refuses new primitives (``submit``), so what its join reads is all it will ever hold.
        ``joined`` is set back to False by a join that then fails.

        Raises:
            RuntimeError: the body running on this branch is the caller: it would wait for itself.
                (A body that waits for the caller, joining its thread, hangs with it, as two
                threads joining each other do: Python records no such link that can be read safely.)
        """
        with self._cv:
            while True:
                body = self.body_thread if self.body_thread is not None else self.plain_body
                if not (self._queue or self._draining or self._merging or body is not None):
                    break
                if body is not None:
                    self._refuse_to_wait_for(body)
                self._wait()
            self.joined = True

    def _refuse_to_wait_for(self, body: int) -> None:
        """(Lock held.) Raise if the join of this branch, on the caller's thread, cannot wait for
        the program body running on the branch (thread ``body``; -1 until it starts): the body is
        that thread."""
        if body == threading.get_ident():
            where = f"fork branch {'.'.join(map(str, self.branch))}"
            raise RuntimeError(f"the program body running on {where} (run(state=branch)) joined that branch's fork "
                               "group: the join waits for the body to return, so it would wait for itself; join "
                               "the group after that run returns, from the parent's program")

    def mark_streamed_body(self) -> None:
        """(Lock held, or before the body's thread starts.) A streamed program body is about to
        start on a thread of its own (``body_thread`` -1 until it does), by the calling thread."""
        self.body_thread, self.body_caller = -1, threading.current_thread()
        self.body_bystanders = frozenset(threading.enumerate())

    def _body_owner(self) -> "StreamExecutor":
        """The state whose streamed body (``body_thread``) extends this one: a fork branch is
        extended by its root's body, or by one of its own (``run(state=branch)``)."""
        return self if self.body_thread is not None else self.root

    def _body_elsewhere(self, reader: Optional[threading.Thread] = None) -> bool:
        """(Lock held.) Whether thread ``reader`` (the calling thread by default) is to wait for a
        streamed program body that runs on another thread, as it may still submit what the reader
        reads. The main thread and every thread that ran as the body started (``body_bystanders``:
        the caller of ``run(stream=True)`` among them), but a pool worker, always wait: the body did
        not start them, and no pool runs them (a pool worker that called ``run`` may later run a
        future the body waits for; a body that waits for the main thread, an event loop there
        running what it waits for, hangs with it). Another thread does unless the body is blocked in
        ``Thread.join`` or ``Future.result`` (``lmnb.thread_waits``), or cannot be seen there (more
        than 100 threads run): that thread may be the one the body waits for (a helper it joins, a
        pool worker whose future it waits for, or one such a thread waits for), and waiting for the
        body there would hang both; it reads the state as it stands, as the body would. Which thread
        the body waits for is not known (see ``lmnb.thread_waits``).

        Threads are told apart as objects, not by ident: the OS reuses an ended thread's ident at
        once (Linux's next thread gets it), so a helper the body started after its caller ended was
        taken for the caller, and waited for the body that waited for it (a caller that threading
        did not start, a ``_DummyThread``, counts as running for good on Python 3.11)."""
        owner = self._body_owner()
        body = owner.body_thread
        reader = threading.current_thread() if reader is None else reader
        if body is None or body == reader.ident:
            return False
        if body == -1 or reader is threading.main_thread():
            return True
        # (a thread that ran before the body began and runs on, the caller among them: a consumer
        # streaming text_iter; not a pool worker, which may run the future the body waits for, the
        # caller too once its task ended. Asked first: it needs no stack dump unless it is one)
        if reader in owner.body_bystanders and _running(reader) and not runs_pool_work(reader.ident):
            return True
        if _waits_on_a_body_of(body, reader):
            return False
        return blocked_in_a_join(body) is False

    def settled_for_caller(self) -> bool:
        """Whether ``wait_body`` and then ``wait_idle`` would return at once on this thread."""
        with self._cv:  # (an RLock's condition: idle() takes it again)
            return self.idle() and not self._body_elsewhere()

    def wait_body(self) -> None:
        """Block until a streamed program body running on another thread has returned."""
        with self._cv:
            while self._body_elsewhere():
                self._wait()

    def raise_if_failed(self) -> None:
        """Raise the state's error (``ProgramError``) if a primitive failed."""
        error = self.read_error()
        if error is not None:
            raise _fresh(error)

    def read_error(self) -> Optional[ProgramError]:
        """The state's error (None if none), counted as told to the program (``error_read``)."""
        error = self.error_
        if error is not None:
            self.error_read = True
        return error

    def take_unread_branch_errors(self) -> list[ProgramError]:
        """The errors of this state's unjoined fork branches (and of theirs, and of the forks of
        joined branches that no join took) that the program was never told of, once the branches
        have run what was submitted to them; each is counted as told now."""
        with self._cv:
            children = list(self._children)
        out = []
        for c in children:
            c.wait_idle()
            if c.error_ is not None and not c.error_read:
                out.append(c.read_error())
            out += c.take_unread_branch_errors()
        return out

    def get_var(self, name: str) -> Any:
        """The value of variable ``name``, waiting for queued writes to it.

        Raises:
            KeyError: no such variable was set or submitted.
            ProgramError: the primitive that should set it failed (or an earlier one did).
        """
        with self._cv:
            while self.error_ is None:
                if self._pending[name] > 0:
                    if not self._queue and not self._draining and not self._body_elsewhere():
                        raise RuntimeError(
                            f"variable {name!r} is set only when its assistant role ends (API speculative "
                            "execution defers the gen calls to the role end); read it after the role"
                        )
                elif name in self.variables:
                    break
                elif not self._body_elsewhere() and (self._drainer == threading.get_ident()
                                                     or not (self._queue or self._draining)):
                    break  # (what was submitted ran first: the KeyError lists the variables it set)
                self._wait()
            if self.error_ is not None and (name in self._lost or name not in self.variables):
                raise _fresh(self.read_error())
            if name not in self.variables:
                raise self._no_such_variable(name)
            return self.variables[name]

    def _no_such_variable(self, name: str, reader: Optional[threading.Thread] = None) -> KeyError:
        """(Lock held.) The error for thread ``reader`` (the calling thread by default) reading
        variable ``name`` that nothing set or will set as far as it can wait: with the variables set
        so far. A streamed body still running elsewhere may set it yet (the reader, one the body may
        be waiting for, does not wait: ``_body_elsewhere``)."""
        body = self._body_owner().body_thread
        reader = threading.current_thread() if reader is None else reader
        later = ("" if body is None or body == reader.ident else
                 " so far; its streamed program body still runs, and may set it later: this thread, which the body "
                 "may be waiting for, reads the state as it stands")
        return KeyError(f"no variable {shown_value(name)} in this program state; it has {sorted(self.variables)}{later}")

    def set_var(self, name: str, value: Any, meta_info: Any = None, record: bool = True,
                text: Optional[str] = None, streamed: bool = False, gathered: bool = False) -> None:
        """Set variable ``name``; ``text``: what the gen wrote, when ``value`` is parsed from it
        (``gen(dtype=int)``), so that ``iter_text(name)`` yields that text; ``streamed``: that text
        is in ``var_log`` already, delta by delta (``_log_delta``); ``gathered``: ``value`` is a
        join's list of the branches' values."""
        with self._cv:
            self.variables[name] = value
            if gathered:
                self.gathered.add(name)
            else:
                self.gathered.discard(name)
            written = text if text is not None else value if isinstance(value, str) else None
            if not streamed:  # (a value set with no text, s["n"] = 7, has none to yield)
                self._begin_write(name)
                self.var_log[name] = self.var_log.get(name, "") + (written or "")
            elif self.var_writes[name][-1][1] is not None:  # (the gen's end after a value set meanwhile: _log_delta)
                self._begin_write(name, continued=True)
            if meta_info is not None:
                self.meta_info[name] = meta_info
            # (a join's list of the branches' meta info is no meta info of a text to yield)
            start = self.var_writes[name][-1][0]
            self.var_writes[name][-1] = (start, len(self.var_log[name]), None if gathered else self.meta_info.get(name))
            if record and name not in self.vars_set:
                self.vars_set.append(name)
            self._version += 1
            self._cv.notify_all()

    def _begin_write(self, name: str, continued: bool = False) -> None:
        """(Lock held.) A new value of variable ``name`` begins at the end of its ``var_log``; or,
        ``continued``, the rest of a streamed gen's write that a value set meanwhile closed (its
        value began before that). A write left open (a streamed gen the state's error cut off, or
        that a value set now interrupts) ends where its text did."""
        log = self.var_log.setdefault(name, "")
        writes = self.var_writes.setdefault(name, [])
        if writes and writes[-1][1] is None:
            writes[-1] = (writes[-1][0], len(log), self.meta_info.get(name))
        writes.append((len(log), None, None))
        if not continued:
            self.var_start[name] = len(writes) - 1

    def _log_delta(self, name: str, delta: str, first: bool) -> None:
        """Append a streamed gen's non-empty ``delta`` to ``var_log`` (call holding ``_cv``);
        ``first``: the gen's first such delta, where the variable's new value begins."""
        if first:
            self._begin_write(name)
        elif self.var_writes[name][-1][1] is not None:
            # s[name] = ... runs at once, so it may land while the gen streams: it closed the gen's
            # write, and the gen's later text and end are a write of their own, after the value's
            self._begin_write(name, continued=True)
        self.var_log[name] += delta

    def _finish_var(self, name: Optional[str], value: Any, meta_info: Any, constraint: Optional[dict] = None,
                    text: Optional[str] = None, streamed: bool = False, gathered: bool = False) -> None:
        if name is not None:
            self.set_var(name, value, meta_info, text=text, streamed=streamed, gathered=gathered)
            with self._cv:
                self._pending[name] = max(0, self._pending[name] - 1)
                self._cv.notify_all()
        # Unnamed gens/selects set nothing, but views still need their request's token counts. A
        # join's list of meta infos is told apart from a gen(n=k)'s (k requests to count) by its source.
        self._emit("var", name=name, value=value, meta_info=meta_info, constraint=constraint,
                   source="join" if gathered else "")

    def _append(self, text: str, source: str, name: Optional[str] = None, tokens: Optional[list] = None,
                value: Any = None) -> None:
        """Add ``text`` to the state's text and tell the listeners, unless the state failed or
        was aborted before it: then the text is dropped, as a streamed delta after an abort is,
        so an abort's partial_text is the text the state and its listeners got.

        Raises:
            ProgramError: the state's error (``ProgramAborted`` once aborted), when it has one.
        """
        if not text and not tokens:
            return
        with self._cv:  # (the check and the add under one lock: an abort lands before both or after both)
            error = self.error_
            if error is None:
                self._add_text(text)
        if error is not None:
            raise error
        self._emit_text(text, source, name, tokens, value)

    def _append_made(self, text: str, source: str, name: Optional[str], metas: list) -> None:
        """``_append`` the text of requests already made (``metas``: the meta_info of those no
        ``var`` event has reported yet); where an abort drops the text, they were made all the
        same: they are reported as stopped (``_record_stopped``), as a streamed gen's are.

        Raises:
            ProgramError: as ``_append``.
        """
        try:
            self._append(text, source, name)
        except ProgramError:
            for meta in metas:
                self._record_stopped({}, meta)
            raise

    def _add_text(self, text: str) -> None:
        """(Lock held.) Append ``text`` to the state's text and wake its readers."""
        if text:
            self.text_ += text
            self._version += 1
            self._cv.notify_all()

    def _emit_text(self, text: str, source: str, name: Optional[str] = None, tokens: Optional[list] = None,
                   value: Any = None) -> None:
        """Tell the listeners of text (and the ``tokens`` behind it) added by ``_add_text``."""
        if text or tokens:
            self._emit("text", text=text, source=source, name=name, meta_info={"tokens": tokens} if tokens else None,
                       value=value)

    # -- abort

    def _finished(self) -> bool:
        """Whether nothing runs or will run on this state and its branches: its body returned and
        no primitive is queued or in flight."""
        with self._cv:
            done = (self.closed and self.body_thread is None and self.plain_body is None and not self._queue
                    and not self._draining and not self._inflight)
            children = list(self._children)
        return done and all(c._finished() for c in children)

    def abort(self) -> None:
        """Stop this state: in-flight requests are aborted, queued primitives skipped. A finished
        state is left as it is, its text readable (an abort of a finished request does nothing
        in SGLang either). A second Ctrl-C meanwhile waits until every request was sent its abort
        (``held_interrupts``)."""
        with held_interrupts():
            self._abort()

    def _abort(self) -> None:
        if self._finished():
            return
        aborted = None
        with self._cv:
            self.error_read = True  # (whoever aborts a state is done with it, whatever error it had)
            if self.error_ is None:
                # (reads of the state raise this error: say where what it wrote went)
                self.error_ = aborted = ProgramAborted(ABORTED, self.branch, "", self.text_)
            rids = [r for r in self._inflight if r not in self._abort_sent]
            self._abort_sent.update(rids)
            self._cancel_pending()
            self._wake_watchers()
            children = list(self._children)
        for rid in rids:
            self.backend.abort(rid)
        for c in children:
            c._abort()
        if aborted is not None:  # what the running branches wrote stays reachable from the root
            aborted.branches = [c.error_ for c in children if c.error_ is not None]

    def reopen(self, default_params: GenParams, stream: bool, listeners: tuple) -> None:
        """Prepare this state for another program run on it (a notebook's next cell): new
        sampling defaults, stream flag and listeners; a previous error is forgotten (the text is
        kept as it was when it happened). The run's body is marked as running from here on.

        Raises:
            RuntimeError: this is a fork branch joined into its parent already; a program body
                is still running on this state (streamed or not, on
                this thread or another): the two bodies' text would interleave, the second would
                replace the first's sampling defaults and close the state under it, and the first
                reader would stop waiting when the second body returned.
        """
        with self._cv:
            self._refuse_if_joined()  # (its body's first s += ... would fail so)
            self._refuse_a_second_body()
        self.wait_idle()
        with self._cv:
            self._refuse_a_second_body()  # (again: another run may have begun it while this one waited)
            if stream:
                self.mark_streamed_body()
            else:
                self.plain_body = threading.get_ident()
            self.default_params = default_params
            self.stream = stream
            self.listeners = listeners
            self.error_ = None
            self.error_read = False
            self._lost.clear()
            self.closed = False
            self._spec_terms = []

    def _refuse_a_second_body(self) -> None:
        """(Lock held.) Raise if a program body runs on this state (``reopen``)."""
        if threading.get_ident() in (self.body_thread, self.plain_body):
            raise RuntimeError("a program body cannot continue its own state with run(state=s); call the "
                               "other program's function on it instead: other.func(s, ...)")
        if self.body_thread is not None and self._body_elsewhere():
            raise RuntimeError("this state is still running the body of a run(stream=True) program; wait for "
                               "it (state.sync()) before continuing it with run(state=...)")
        if self.body_thread is not None:  # (sync() here would return at once: _body_elsewhere)
            raise RuntimeError("this state is still running the body of a run(stream=True) program, which may "
                               "be waiting for this thread (it is blocked in a join, on a future, or reading a "
                               "state whose program this thread runs); continue the state "
                               "with run(state=...) after that body returned, on the thread that called "
                               "run(stream=True) or on one the body does not wait for")
        if self.plain_body is not None:
            raise RuntimeError("this state is still running the body of a program on another thread; wait for its "
                               "run() to return before continuing it with run(state=...)")

    # -- execution

    def _prompt(self) -> Prompt:
        role_text = self.text_[self.cur_role_begin_pos:] if self.cur_role is not None else ""
        return Prompt(text=self.text_, messages=list(self.messages_), role=self.cur_role, role_text=role_text,
                      images=tuple(self.images_))

    def _call(self, fn: Callable, *args):
        """Run a backend call with a fresh request id registered for abort."""
        rid = uuid.uuid4().hex
        with self._cv:
            if self.error_ is not None:
                raise self.error_
            self._inflight.add(rid)
        try:
            return fn(*args, rid)
        except KeyboardInterrupt:  # (a call on the main thread, use_thread=False) its request would run on
            self.abort()
            raise
        finally:
            with self._cv:
                self._inflight.discard(rid)
                self._abort_sent.discard(rid)

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, ConstantText):
            self._execute_fill(expr.value)
        elif isinstance(expr, ExprList):
            for e in expr.exprs:
                try:
                    self._execute(e)
                except ProgramError:
                    raise
                except Exception as exc:  # named by the part that failed, not the whole list
                    self.fail(named(e), exc, e)
                if self.error_ is not None:  # failed (or aborted): the rest of the list is skipped
                    return
        elif isinstance(expr, Gen):
            self._execute_gen(expr)
        elif isinstance(expr, Select):
            self._execute_select(expr)
        elif isinstance(expr, RoleBegin):
            self._execute_role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._execute_role_end(expr.role)
        elif isinstance(expr, (VarScopeBegin, VarScopeEnd)) and self._spec_chat_active():
            # the role's fills and gens are held for one call at its end: the scope would capture none
            raise ValueError(
                f"var_scope {expr.name!r} begins or ends inside an assistant role under API speculative execution "
                "(num_api_spec_tokens) of a chat model, whose text is written only at the role's end; put the "
                "scope around the whole role"
            )
        elif isinstance(expr, VarScopeBegin):
            self._scopes[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            if expr.name not in self._scopes:
                raise ValueError(f"var_scope {expr.name!r} ended without beginning")
            self._finish_var(expr.name, self.text_[self._scopes.pop(expr.name):], None)
        elif isinstance(expr, CommitLazy):
            if self.text_:
                # [issue 10] after image()/video() the prefix is prefilled with its images
                meta = self._call(self.backend.cache_prefix, self._prompt() if self.images_ else self.text_)
                self._emit("prefill", meta_info=meta)
        elif isinstance(expr, _JoinApply):
            self._execute_join(expr)
        elif isinstance(expr, (Image, Video)):  # [issue 10]
            self.backend.check_images()  # here, not at the next gen: a cell of images alone reports it too
            check_source(expr)  # (a missing file failed the next gen, which a cell then pointed at)
            if self._spec_chat_active():  # the role's fills are held for its end: the image would precede them
                raise ValueError(
                    f"{type(expr).__name__.lower()}() inside an assistant role under API speculative execution "
                    "(num_api_spec_tokens) of a chat model, whose text is written only at the role's end, after it; "
                    "put images in a user message"
                )
            # (its placeholder first: where an abort drops it, the image is not kept either)
            self._append(self.chat_template.image_token, type(expr).__name__.lower(), value=expr)
            self.images_.append(expr)
        else:
            raise TypeError(f"unknown primitive {expr!r}")

    def _spec_chat_active(self) -> bool:
        return self.num_api_spec_tokens is not None and self.backend.is_chat_model and self.cur_role == "assistant"

    def _execute_fill(self, value: str, source: str = "fill") -> None:
        if source == "fill" and self._spec_chat_active():
            self._spec_terms.append(("text", value))
            return
        if self.speculation.text.startswith(value):
            self.speculation = self.speculation.drop(len(value))
        else:
            self.speculation = Speculation()
        self._append(value, source)

    def message_end_stops(self, params: GenParams) -> tuple[str, ...]:
        """The chat template's end-of-message stops for an unconstrained gen of ``params``; none
        under ``ignore_eos``, which asks to generate past the end of the message. A template's end of
        message is the text of the model's end-of-turn token, and a stop that is a special token's
        text ends the gen at that token (``lmnb_engine.stop_special``; an SGLang server reads stops
        in text holding special tokens), so the stop would end an ``ignore_eos`` gen at the end of
        its message, as if it did not ignore EOS, and beside pinned prefixes keep the engine from
        refusing at once a gen whose length cannot fit (a stop counts as a way to end early).
        SGLang adds it all the same and stops there; a gen's own stops still apply under
        ``ignore_eos``, the EOS token's text too."""
        return () if params.ignore_eos else self.chat_template.stop_str

    def _resolve_params(self, params: GenParams) -> tuple[GenParams, Optional[Callable[[str], Any]]]:
        """Program defaults under the gen's own values, plus the chat template's stops for an
        unconstrained gen (SGLang adds them to every gen, and one inside a JSON value would cut
        it); dtype becomes a regex (and stops for numbers) and a parser for the value. In a fork
        branch the program's seed (``run(seed=...)``, a cell's ``--seed``) is made the branch's own
        (from its ``seed_path``), so branches, of one fork or of several, are distinct samples,
        reproducibly; a gen's own ``seed`` is kept as given.

        ``run()``'s ``top_logprobs_num`` is a default for the gens that ask for logprobs (SGLang's
        ``run(top_logprobs_num=N)`` with ``return_logprob`` on some gens), so a gen that asks for
        none is sent without it.

        Raises ``ValueError`` for a gen's own ``top_logprobs_num`` above 0 without ``return_logprob``
        (the gen's or ``run()``'s, so only here are both known), in the engine's words, on every
        backend: the engine and ``lmnb serve`` refuse it, and an OpenAI API and an SGLang server
        dropped it without a word."""
        p = params.merged_over(self.default_params)
        if p.top_logprobs_num and not p.return_logprob:
            if not params.top_logprobs_num:  # (run()'s count: no gen asked for top alternatives it cannot get)
                p = dataclasses.replace(p, top_logprobs_num=None)
            else:
                from lmnb_engine.params import TOP_LOGPROBS_RULE  # torch-free (import lmnb loads no engine)

                raise ValueError(f"top_logprobs_num={p.top_logprobs_num} is invalid: {TOP_LOGPROBS_RULE}")
        if params.seed is None and p.seed is not None and self.seed_path:
            p = dataclasses.replace(p, seed=derived_seed(p.seed, self.seed_path))
        if p.regex is None and p.json_schema is None and p.dtype is None:
            p = p.with_stops(self.message_end_stops(p))
        parse = None
        if p.dtype is not None:  # gen() refused dtype with regex or json_schema
            regex, parse = dtype_regex(p.dtype)
            name = p.dtype if isinstance(p.dtype, str) else getattr(p.dtype, "__name__", "")
            p = dataclasses.replace(p, regex=regex, dtype=None)
            if name in ("int", "float"):
                p = p.with_stops(DTYPE_STOPS)
        return p, parse

    def _check_finish(self, metas: list) -> None:
        """Raise if one of a gen's requests (``metas``: their meta_info) was aborted. Its prompt
        and tokens still reach views and batch records first, as an unnamed gen's do."""
        for m in metas:
            fr = finish_reason_dict(m)
            if fr.get("type") == "abort":
                self._emit("var", meta_info=metas[0] if len(metas) == 1 else metas)
                raise RuntimeError(f"the request was aborted: {fr.get('message') or 'no reason given'}")

    def _record_stopped(self, shown: Any, latest: Any) -> None:
        """A streamed gen stopped by an abort still made a request: report it as an unnamed gen's
        ``var`` event, with the tokens of the text it had appended (``shown``, its last meta_info)
        and the prompt counts of the ``latest`` meta_info (backends report them on every chunk)."""
        if not isinstance(latest, dict) or "prompt_tokens" not in latest:
            return  # (a backend that reports counts only at the end: there is nothing to count)
        meta = {k: latest[k] for k in ("id", "prompt_tokens", "cached_tokens", "images", "cached_chars")
                if k in latest}
        meta["completion_tokens"] = shown.get("completion_tokens", 0) if isinstance(shown, dict) else 0
        meta["finish_reason"] = {"type": "abort", "message": "the program state was aborted"}
        self._emit("var", meta_info=meta)

    def _parsed_all(self, expr: Gen, parse, outputs: list) -> list:
        """The values of a gen's ``outputs`` (``(text, meta_info)``, one per request), as ``_parsed``
        gives them. An output it refuses (a pydantic validator, a ``dtype`` that does not parse)
        fails the gen, but its requests ran to the end: their prompt and tokens still reach views
        and batch records first, as an aborted request's do (``_check_finish``); the cell's summary
        said the gen was stopped before the backend reported its prompt."""
        try:
            return [self._parsed(expr, text, parse, meta) for text, meta in outputs]
        except Exception:
            metas = [meta for _, meta in outputs]
            self._emit("var", meta_info=metas[0] if len(metas) == 1 else metas)
            raise

    def _parsed(self, expr: Gen, text: str, parse, meta_info: Any = None) -> Any:
        if expr.model is not None:
            self._validate(expr, text, meta_info)
        if parse is None:
            return text
        shown = getattr(expr.params.dtype, "__name__", expr.params.dtype)
        finish = finish_reason_dict(meta_info if isinstance(meta_info, dict) else {})
        cut_short = finish.get("type") == "length"
        # (no max_tokens could make "Carol" an int; a str's value is its text, unchecked, as at an EOS)
        if cut_short and shown in ("int", "float", "bool") and not dtype_prefix(expr.params.dtype, text):
            raise ValueError(self._unheld_dtype(expr, shown, text, f" before its max_tokens ran out, which is not the "
                                                                 f"start of any {shown}"))
        if shown in ("int", "float") and cut_short:  # "15" cut to "1" parses, wrongly
            raise ValueError(f"gen {expr.name!r} with dtype={shown} ran out of tokens after {text!r}, before its "
                             "value was known to be complete; raise max_tokens")
        try:
            return parse(text)
        except (ValueError, KeyError):
            from lmnb_engine.params import digits_over_limit  # torch-free

            digits = text.strip().lstrip("+-")
            if shown == "int" and digits.isdigit() and digits_over_limit(len(digits)):  # the model did write an int
                raise ValueError(
                    f"gen {expr.name!r} with dtype=int wrote a {len(digits)}-digit number, more than the "
                    f"{sys.get_int_max_str_digits()} digits Python's int() reads; raise that limit with "
                    f"sys.set_int_max_str_digits({len(digits)}) (0 lifts it), or keep the text with "
                    "gen(regex=r'[-+]?[0-9]+')"
                ) from None
            if finish.get("type") == "length":
                raise ValueError(
                    f"gen {expr.name!r} with dtype={shown} ran out of tokens after {text!r}, before its value "
                    "was complete; raise max_tokens"
                ) from None
            if finish.get("type") == "stop" and isinstance(finish.get("matched"), str):
                if dtype_prefix(expr.params.dtype, text):  # (no stop could make "Carol" an int)
                    raise ValueError(
                        f"gen {expr.name!r} with dtype={shown} was cut by the stop string {finish['matched']!r} after "
                        f"{text!r}, before its value was complete; drop that stop for this gen"
                    ) from None
                said = f" before the stop string {finish['matched']!r}, which is not the start of any {shown}"
                raise ValueError(self._unheld_dtype(expr, shown, text, said)) from None
            raise ValueError(self._unheld_dtype(expr, shown, text, f", which is no {shown}, as its output ended")
                             ) from None

    @staticmethod
    def _unheld_dtype(expr: Gen, shown: str, text: str, said: str) -> str:
        """The refusal of a dtype gen's ``text``, what is wrong with it ``said``: no start of a value
        (``dtype_prefix``) where a stop or ``max_tokens`` cut it, or no value where the output ended by
        itself (an EOS, a stop token): neither cut explains it, the backend wrote past the regex."""
        return (f"gen {expr.name!r} with dtype={shown} wrote {text!r}{said}: "
                "the backend did not hold the output to the dtype's regex; run the gen on one that does (the engine, "
                "lmnb serve or SGLang), or leave dtype out and read the value from its text")

    def _validate(self, expr: Gen, text: str, meta_info: Any) -> None:
        """Raise a one-line error if the pydantic class of ``gen(json_schema=Model)`` refuses the
        output: the decoder wrote the class's schema, which its custom validators can still fail.
        An output cut by ``max_tokens`` or a stop string is not checked: as in SGLang it is kept,
        and its finish reason says it was cut (notebooks/05-json-extraction.ipynb reads it)."""
        import pydantic  # (loaded: expr.model is a pydantic class)

        finish = finish_reason_dict(meta_info if isinstance(meta_info, dict) else {})
        if finish.get("type") == "length" or (finish.get("type") == "stop" and isinstance(finish.get("matched"), str)):
            return
        try:
            expr.model.model_validate_json(text)
            return
        except pydantic.ValidationError as e:
            errors = e.errors()
        what = f"gen {expr.name!r} with json_schema={expr.model.__name__}"
        where = ".".join(map(str, errors[0]["loc"]))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(
            f"{what} wrote JSON the class refuses: {f'field {where!r}' if where else 'the model'}: "
            f"{errors[0]['msg']}{more}; constrained decoding follows the schema, not custom validators: "
            f"loosen the validator, or skip this check with json_schema={expr.model.__name__}.model_json_schema()"
        )

    def _execute_gen(self, expr: Gen) -> None:
        params, parse = self._resolve_params(expr.params)
        try:
            self._run_gen(expr, params, parse)
        except (ValueError, BackendError) as e:  # (the in-process engine's refusal; a server's)
            from lmnb_engine.params import DOES_NOT_FIT  # torch-free (not at the top: import lmnb loads no engine)

            defaults = self.default_params
            # (a speculative call asks for num_api_spec_tokens where that is more: not the default refused)
            spec_asked_more = (self.num_api_spec_tokens or 0) > (params.max_new_tokens or 0)
            if (getattr(e, "reason", None) != DOES_NOT_FIT or expr.params.max_new_tokens is not None
                    or not isinstance(defaults, RunDefaults) or spec_asked_more):
                raise
            # the gen never wrote the max_tokens that did not fit: say where it came from
            raise reworded(e, f"{e} ({defaults.max_tokens_note()})") from None

    def _run_gen(self, expr: Gen, params: GenParams, parse: Optional[Callable[[str], Any]]) -> None:
        """Run a gen with its resolved ``params`` (``_resolve_params``) and record its value."""
        if self.num_api_spec_tokens is not None:
            if self.stream:
                raise ValueError(
                    "API speculative execution (num_api_spec_tokens) does not work with stream=True, as in SGLang: a "
                    "speculated gen's text is cut from a call made for several gens (a chat model's at its assistant "
                    "role's end), not streamed as it is written; run the program without stream=True, or stream it "
                    "from a program without num_api_spec_tokens")
            if self._spec_chat_active():  # (one call answers the role's gens: they must share its parameters)
                speculative.spec_role_check(self._spec_terms, expr, params, self.backend,
                                            self.text_[self.cur_role_begin_pos:])
                self._spec_terms.append(("gen", expr, params, parse))
                return
            # every unconstrained gen of a completion model (SGLang); leftover text was not
            # generated under a regex, schema or dtype, nor with EOS and stops held off for this
            # gen's min_tokens (SGLang passes those on and cuts at the first stop regardless), so
            # those gens make their own call
            unconstrained = params.regex is None and params.json_schema is None and not params.min_new_tokens
            if not self.backend.is_chat_model and (params.n or 1) == 1 and unconstrained:
                text, meta = speculative.spec_gen(self, params, expr)
                # (a gen served from an earlier call's leftover made none: that call was reported)
                self._append_made(text, "gen", expr.name, [meta] if "speculative_call" in meta else [])
                self._note_sampled_end(text, meta)  # (its tokens were sampled, by this call or an earlier one)
                [value] = self._parsed_all(expr, parse, [(text, meta)])
                self._finish_var(expr.name, value, meta, text=text)
                return
            self.speculation = Speculation()  # this gen's own call makes the leftover stale
        if self.stream and (params.n or 1) == 1:
            self._execute_gen_stream(expr, params, parse)
            return
        comps: list[Completion] = self._call(self.backend.generate, self._prompt(), params)
        self._check_finish([c.meta_info for c in comps])
        self._append_made(comps[0].text, "gen", expr.name, [c.meta_info for c in comps])
        self._note_sampled_end(comps[0].text, comps[0].meta_info)
        values = self._parsed_all(expr, parse, [(c.text, c.meta_info) for c in comps])
        if len(comps) == 1:
            self._finish_var(expr.name, values[0], comps[0].meta_info, _constraint(params), comps[0].text)
        else:
            # the variable holds every sample; iter_text(name) yields the text appended, the first's
            self._finish_var(expr.name, values, [c.meta_info for c in comps], text=comps[0].text)

    def _execute_gen_stream(self, expr: Gen, params: GenParams, parse) -> None:
        name = expr.name
        text, meta = "", {}

        def run(rid):
            nonlocal text, meta
            shown: dict = {}  # the meta_info of the text appended so far
            for delta, meta in self.backend.generate_stream(self._prompt(), params, rid):
                tokens = meta.pop(DELTA_TOKENS, None) if isinstance(meta, dict) else None
                with self._cv:
                    error = self.error_
                    if error is None:
                        if name is not None:
                            if delta:  # (a write begins with text: an empty first event begins none)
                                self._log_delta(name, delta, first=not text)
                            self.variables[name] = text + delta
                            self.meta_info[name] = meta
                        # under the same lock as the check: an abort's partial_text holds this delta
                        # or the delta is dropped. Added after it, the text had a delta the abort's
                        # partial_text lacked, and the cell's token count (its text event) counted it.
                        self._add_text(delta)
                if error is not None:  # aborted: this delta came after it and is dropped
                    self._record_stopped(shown, meta)
                    raise error
                shown = meta
                text += delta
                self._emit_text(delta, "gen", name, tokens)
            return None

        self._call(run)
        self._check_finish([meta])
        self._note_sampled_end(text, meta)
        [value] = self._parsed_all(expr, parse, [(text, meta)])
        self._finish_var(name, value, meta, _constraint(params), text, streamed=text != "")

    def _note_sampled_end(self, text: str, meta_info: Any) -> None:
        """Keep where the text of a gen just appended ends (``sampled_end``), where the gen wrote
        ``text`` and sampled tokens (``meta_info``'s ``completion_tokens``; a speculated gen's own
        share of its call's, ``speculative``)."""
        if text and isinstance(meta_info, dict) and meta_info.get("completion_tokens"):
            with self._cv:
                self.sampled_end = len(self.text_)

    def _execute_select(self, expr: Select) -> None:
        if self._spec_chat_active() and self._spec_terms:  # (scored now, it would precede what the role holds)
            self.backend.check_picks()  # (first: a backend that scores no pick anywhere has fixes of its own)
            named = "" if expr.name is None else f" {expr.name!r}"
            raise ValueError(
                f"the pick{named} (select or gen(choices=...)) follows text or gens of its assistant role that "
                "API speculative execution (num_api_spec_tokens) of a chat model holds for one call at the role's end: "
                "it would be scored without them and written before them; put the pick in an assistant role of its "
                "own, or run without num_api_spec_tokens"
            )
        self.speculation = Speculation()  # the chosen text follows, not the speculated one
        method = expr.choices_method
        scored = self._call(
            self.backend.score_choices, self._prompt(), expr.choices, method.requires_unconditional_logprobs
        )
        seed = self.default_params.seed  # run(seed=...) makes a sampled select reproducible too
        # seed_path, as a gen's seed: a second fork's branch k samples anew, not as the first fork's did
        rng = None if seed is None else random.Random(f"{seed}:{self.seed_path}:{len(self.text_)}:{expr.choices}")
        decision = method.decide(expr.choices, scored, expr.temperature, rng)
        self._append_made(decision.decision, "select", expr.name, _select_requests(decision.meta_info))
        self._finish_var(expr.name, decision.decision, decision.meta_info)

    def _execute_role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.cur_role!r}; roles cannot nest: end "
                             f"{self.cur_role!r} first ({self.cur_role}_end())")
        self.backend.note_role(self.chat_template)  # (a guessed template warns at the first role)
        last = self.messages_[-1]["role"] if self.messages_ else None
        begin, implicit = self.chat_template.role_begin(role, len(self.messages_), not self.text_, last)
        # (as a fill: text the API speculation did not write voids it.) The role begins once its text
        # is added: where an abort drops the text, the role does not begin either.
        self._execute_fill(begin, "role")
        if implicit is not None:
            self.messages_.append(implicit)
        self.cur_role = role
        self.cur_role_begin_pos = len(self.text_)

    def _execute_role_end(self, role: str) -> None:
        if self.cur_role is None:
            raise ValueError(f"role {role!r} ends, but no role is open: begin it first ({role}_begin()), or "
                             f"write s += {role}(...) or with s.{role}(): ..., which begin and end it")
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends, but role {self.cur_role!r} is open: end that one "
                             f"({self.cur_role}_end()) and begin {role!r} ({role}_begin()) first")
        if self._spec_terms or self._spec_chat_active():
            speculative.spec_role_end(self)
        content = self.text_[self.cur_role_begin_pos:]
        _, suffix = self.chat_template.get_prefix_and_suffix(role)
        self._execute_fill(suffix, "role")  # (first: where an abort drops its text, the role stays open)
        self.cur_role = None
        self.messages_.append({"role": role, "content": content.lstrip()})

    def _execute_join(self, j: _JoinApply) -> None:
        if j.text:  # (first: where an abort drops the text, its images and messages are not kept either)
            self._execute_fill(j.text, "join")
        self.images_ += j.images  # [issue 10] the joined text's image placeholders need their images
        self.messages_.extend(j.messages)
        for name, value in j.variables.items():
            self._finish_var(name, value, j.meta_info.get(name), gathered=True)
        self._emit("join", children=j.children, source=j.mode)

    # -- fork

    def fork(self, size: int) -> list["StreamExecutor"]:
        """``size`` new executors sharing this state's text so far (after every queued primitive).

        With ``size > 1`` and a non-empty prompt, the prompt is first prefilled once
        (``CommitLazy``) so the branches' requests all hit the prefix cache.

        Raises:
            ValueError: a bad size, or a fork inside an assistant role under chat-model API
                speculation (the branches' gens would wait for a role end that never comes).
        """
        size = _fork_size(size)
        self._refuse_if_joined()  # (fork(1) submits nothing that would refuse it)
        if size > 1:
            self.submit(CommitLazy())
        self.wait_idle()
        self.raise_if_failed()
        if self._spec_chat_active():  # the role's fills and gens are held for one call at its end
            raise ValueError(
                "fork() inside an assistant role under API speculative execution (num_api_spec_tokens) of a chat "
                "model: the role's gens run as one call at its end, which a branch never reaches, so they would "
                "never run; fork before the role begins or after it ends"
            )
        with self._cv:  # several threads of one body may fork this state at once: each takes its own places
            first = self._forked
            self._forked += size
        children = []
        for i in range(size):
            c = self._copy(self.branch + (i,), self.sid)
            c.root = self if self.runs_a_body() else self.root  # (a branch running a body of its own)
            c.seed_path = self.seed_path + (first + i,)
            # the API speculation left over is one sample of the parent's: branches sharing it wrote
            # the same text (no call made), where a fork asks for a sample each
            c.speculation = Speculation()
            c.fork_start_text_pos = len(self.text_)
            c.fork_start_messages = len(self.messages_)
            c.fork_start_images = len(self.images_)
            c.fork_start_role = self.cur_role
            children.append(c)
        with self._cv:
            self._children += children
            stopped = self.error_
        if stopped is not None:  # aborted while the branches were made (after the check above): none may run
            for c in children:
                c.abort()
            raise stopped
        self._emit("fork", children=tuple(c.sid for c in children))
        return children

    def continuation(self) -> "StreamExecutor":
        """A new root executor with this state's text, messages and variables (after every queued
        primitive), not a fork branch: nothing joins it, this state does not abort or close it,
        and its errors name no branch. The kernel runs a cell on a named state this way, so that
        a failed or interrupted cell leaves the named state as it was."""
        self.wait_idle()
        self.raise_if_failed()
        return self._copy(self.branch, None)

    def _copy(self, branch: tuple, parent_sid: Optional[str]) -> "StreamExecutor":
        c = StreamExecutor(
            self.backend, self.arguments, self.default_params, self.chat_template, self.stream,
            self.num_api_spec_tokens, self.use_thread, self.listeners, branch, parent_sid,
        )
        c.text_ = self.text_
        c.messages_ = list(self.messages_)
        c.variables = dict(self.variables)
        c.var_log = dict(self.var_log)
        c.var_writes = {n: list(w) for n, w in self.var_writes.items()}
        c.var_start = dict(self.var_start)
        c.gathered = set(self.gathered)
        c.sampled_end = self.sampled_end
        c.meta_info = dict(self.meta_info)
        c.cur_role = self.cur_role
        c.cur_role_begin_pos = self.cur_role_begin_pos
        c.speculation = self.speculation
        c.images_ = list(self.images_)  # [issue 10]
        return c

    def close(self) -> None:
        """Mark the program (or branch) finished: streaming readers end once it is idle. Its fork
        branches are closed with it, but for one running a program body of its own
        (``run(state=branch)``): that body's ``end_body`` closes it."""
        with self._cv:
            self.closed = True
            self._version += 1
            self._cv.notify_all()
            children = list(self._children)
        for c in children:
            if not c.runs_a_body():
                c.close()

    def runs_a_body(self) -> bool:
        """Whether a program body (streamed or not) runs on this state now."""
        with self._cv:
            return self.body_thread is not None or self.plain_body is not None

    def end_body(self) -> None:
        """The program body running on this state returned: readers waiting for it stop waiting,
        another body may continue the state (``reopen``), and the state is closed. Only the
        body's runner calls this: the end of another body (its parent's, a join) leaves the
        flags of this one alone, or a second body could start beside this one."""
        with self._cv:
            self.body_thread = self.body_caller = self.plain_body = None
            self.body_bystanders = frozenset()
        self.close()

    # -- streaming

    def wake_readers(self) -> None:
        """Wake the readers waiting in ``iter_text`` (one whose ``stop`` was set then ends)."""
        with self._cv:
            self._cv.notify_all()

    def iter_text(self, var_name: Optional[str] = None, reader: Optional[threading.Thread] = None,
                  with_meta: bool = False, stop: Optional[threading.Event] = None) -> Iterator[Any]:
        """Yield text as it is appended (of the whole state, or of variable ``var_name``) until the
        state is closed and idle (or the variable is complete); read by the program body itself
        (or with no streamed body running), until the work queued so far has run. A variable holding a parsed value
        (``gen(dtype=int)``) yields the text its gen wrote; one holding a gen's ``n`` > 1 samples
        yields the first sample's text, the one appended to the state's text. A variable written again (a gen in a
        loop) yields from its value when the iteration begins, then every later write of it; the
        variable is whole, and the iteration ends, once no write of it is queued and none can be
        queued any more: the streamed body returned (or the state was joined), or the reader is the
        body itself (or a thread it waits for), which queues nothing while it reads. SGLang's ends
        when the variable's last queued gen ends, so what it yields hangs on whether the body had
        queued its next gen by then: a body that reads ``s[var]`` between the gens, or does other
        Python work there, queues the next one only after that, and the reading stopped after one
        gen. The price: a reader of a variable the body is done with ends only when the body
        returns (``text_async_iter(var, return_meta_data=True)`` marks each gen's end by its
        ``finish_reason``).

        Raises:
            ProgramError: once the text that arrived is yielded, when the state failed (or was
                aborted) before the text, or the variable, was complete. SGLang's ends silently
                there, so a loop printing a stream could not tell a cut-off answer from a whole one.
            KeyError: ``var_name`` was never set and nothing left can set it (the program body
                returned, or this is the body asking): a misspelt name, named with the variables
                there are. SGLang's yields ``""`` once there.
            TypeError: ``var_name``'s value is a list a ``join`` gathered from fork branches
                (once any text an earlier write of it left is yielded): no text of this state is
                that value's; iterate the branches' own ``text_iter`` before the join.

        ``reader``: the thread the text is for, when another one runs this iterator for it
        (``text_async_iter`` steps it on worker threads for the thread of the event loop).
        ``stop``: once set (and the readers woken, ``wake_readers``), the iteration ends at its next
        wait, yielding nothing more: a step of ``text_async_iter`` whose reader was cancelled.
        ``with_meta``: yield ``(chunk, meta_info of var_name)``, the meta info read with the chunk
        (read after it, it could be ahead: a later chunk's token count and logprobs). Each gen's
        last pair holds its final meta info, its ``finish_reason`` once, as soon as the gen is done
        (a gen in a loop: before the next gen of the variable streams, and not with that gen's
        meta info): a text that came with the finish reason is held until the gen is done (the
        OpenAI API's usage comes after it), and a finish reason that came with no new text comes
        as an extra ``("", meta_info)`` (SGLang's kept such meta info for a next chunk that never came).
        """
        pos, k, seen, sent = None, 0, -1, None  # k: the write of var_name read now; sent: the meta info last yielded
        while True:
            pieces = []  # (chunk, meta info, whether a write ends there) to yield
            with self._cv:
                if self._version == seen:
                    self._wait(reader=reader)
                if stop is not None and stop.is_set():
                    return
                seen = self._version
                if var_name is None:
                    current = self.text_
                    # idle, and no body left that this reader waits for: nothing more comes
                    idle = not self._queue and not self._draining
                    done = (idle and (self.closed or not self._body_elsewhere(reader))) or self.error_ is not None
                    pos = pos or 0
                    pieces.append((current[pos:], None, False))
                    pos = len(current)
                else:
                    current = self.var_log.get(var_name, "")
                    writes = self.var_writes.get(var_name, [])
                    started = var_name in self.variables or self._pending[var_name] > 0
                    # nothing set it, nothing queued will, and no body is left to queue it: a
                    # misspelt name (SGLang's yields "" then, indistinguishable from an empty gen)
                    if not started and self.error_ is None and not self._body_elsewhere(reader):
                        raise self._no_such_variable(var_name, reader)
                    done = self.error_ is not None or (self._pending[var_name] == 0 and started and (
                        self.closed or not self._body_elsewhere(reader)))
                    if pos is None:  # from the current value on
                        k = self.var_start.get(var_name, 0)
                        pos = writes[k][0] if writes else 0
                    # each write that ended: its text up to its end, with its own final meta info
                    # (a gen in a loop: its last text and finish reason at once, not with the next gen's);
                    # the meta info of the gen's end (its finish reason) often comes with no new
                    # text (a last event holding back a stop string, or only the finish): an empty
                    # chunk carries it, where it would never have arrived
                    while k < len(writes) and writes[k][1] is not None:
                        _, end, meta = writes[k]
                        pieces.append((current[pos:end], meta, True))
                        pos, k = end, k + 1
                    meta = self.meta_info.get(var_name)
                    # the text of a write in progress; its text that came with the finish reason is
                    # held until the gen is done, to go with its final meta info (the OpenAI API's
                    # usage comes after it), so that no ("", meta) follows with the finish reason again
                    held = (with_meta and self.error_ is None and meta is not None
                            and meta.get("finish_reason") is not None)
                    if k < len(writes) and not held:
                        pieces.append((current[pos:], meta, False))
                        pos = len(current)
                failed = self.error_ is not None and (
                    var_name is None or var_name in self._lost or var_name not in self.variables)
                gathered = var_name in self.gathered
            for chunk, meta, ends in pieces:
                if not with_meta:
                    if chunk:
                        yield chunk
                elif chunk or (ends and meta is not None and meta != sent):
                    yield chunk, meta
                    sent = meta
            if failed:  # (kept on the frames of earlier raises: see _fresh)
                raise self.read_error()
            if done and gathered:
                raise TypeError(f"variable {var_name!r} was gathered by join(): it holds a list with one value per "
                                "fork branch, not text of this state's, so there is no text to iterate; read "
                                f"s[{var_name!r}], or iterate each branch's text_iter({var_name!r}) before the join")
            if done:
                return
