"""Program states and running programs: ``ProgramState``, fork groups, ``run``/``run_batch``.

``ProgramState`` is the object a program body receives as ``s`` (SGLang's ``ProgramState``
facade over a ``StreamExecutor``); ``ProgramStateGroup`` holds fork branches and joins them —
``gather_variable`` and ``concate_and_append`` both work (the latter concatenates the branches'
text and lets the next gen prefill it: correct, unlike SGLang's KV splice route, which does not
exist on its server, ``research/features.md`` §4.4); a failing branch raises at ``join`` with its
index while the other branches stay readable. ``run_program``/``run_program_batch`` are what
``SglFunction.run``/``run_batch`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import multiprocessing
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

from lmnb.backend.base import BaseBackend
from lmnb.executor import (
    ForkError, ProgramAborted, ProgramError, StreamExecutor, UnjoinedForkError, _JoinApply, _listeners,
    derived_seed,
)
from lmnb.interrupt import ReadInterrupts, held_interrupts, item_ranges, shown_by_an_ipython_cell, stopped
from lmnb.ir import (
    Expr, GenParams, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd, added_twice, blank_name, offering_keywords,
    role_message, shown_value,
)
from lmnb.user_site import running_for, user_site


# ------------------------------------------------------------------------------ program states


class ProgramState:
    """The state of a running program: the prompt text, chat messages and variables.

    ``s += x`` appends a string or primitive (asynchronously). ``s["x"]`` waits for variable ``x``.
    Errors of primitives surface where their results are read (``s["x"]``, ``text()``,
    ``messages()``, ``sync()``) as ``ProgramError`` carrying the partial text; ``error()`` returns
    the error without raising. SGLang's ``ProgramState`` API, plus ``abort``.
    """

    def __init__(self, executor: StreamExecutor):
        self.stream_executor = executor
        self.ret_value: Any = None
        self._open_scopes: set[str] = set()  # var_scope names whose block has not ended

    # -- building

    def __iadd__(self, other: Any) -> "ProgramState":
        added_twice(other, self.stream_executor)
        self.stream_executor.submit(other)
        return self

    def _role(self, role: str, expr: Any = None):
        if expr is not None:
            submitted = role_message(role, expr, self.stream_executor)
            self.stream_executor.submit(submitted)
            return submitted

        @contextlib.contextmanager
        def scope():
            self.stream_executor.submit(RoleBegin(role))
            yield self
            self.stream_executor.submit(RoleEnd(role))

        return scope()

    def system(self, expr: Any = None):
        """Append a system message and return the expression submitted (as SGLang
        does; do not add it again), or with no argument a ``with`` block that is one."""
        return self._role("system", expr)

    def user(self, expr: Any = None):
        """Append a user message and return the expression submitted (as SGLang
        does; do not add it again), or with no argument a ``with`` block that is one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        """Append an assistant message and return the expression submitted (as SGLang
        does; do not add it again), or with no argument a ``with`` block that is one."""
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str):
        """Capture the text appended inside the block into variable ``name``.

        Raises:
            TypeError: ``name`` is not a string (None captured nothing, 5 made an int key).
            ValueError: a scope of the same name is open already (the inner one would close it), or
                the name is empty or only whitespace ("", " ": gen's rule, ``lmnb.api._check_name``).
        """
        if not isinstance(name, str):
            raise TypeError(f"var_scope name must be a string (the variable to capture the text into), got "
                            f"{shown_value(name)}")
        if not name.strip():
            raise ValueError(f'var_scope name is {blank_name(name, "text")}; give the variable a name, e.g. '
                             's.var_scope("answer")')
        if name in self._open_scopes:
            raise ValueError(f"var_scope {name!r} is open already; a nested scope needs another name")
        self._open_scopes.add(name)
        self.stream_executor.submit(VarScopeBegin(name))
        try:
            yield self
        finally:
            self._open_scopes.discard(name)
            self.stream_executor.submit(VarScopeEnd(name))

    @offering_keywords
    def fork(self, size: int = 1, position_ids_offset: Any = None) -> "ProgramStateGroup":
        """``size`` branches continuing from this state's current text (waits for queued work;
        Ctrl-C meanwhile aborts the state, as in a read).

        ``position_ids_offset`` is accepted for SGLang compatibility and must be None.
        """
        if position_ids_offset is not None:
            raise NotImplementedError("fork(position_ids_offset=...) is not supported")
        with self._abort_on_interrupt():  # (it waits for the state's queued work)
            children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextlib.contextmanager
    def copy(self, position_ids_offset: Any = None):
        """A ``with`` block on one branch of this state; its new variables join back on exit."""
        group = self.fork(1, position_ids_offset)
        yield group[0]
        group.join()

    # -- reading

    @contextlib.contextmanager
    def _abort_on_interrupt(self):
        """Ctrl-C while waiting for this state aborts its requests, as it does inside ``run()``:
        a stopped notebook cell reading a ``run(stream=True)`` state must not leave the model
        generating for a program no one reads any more."""
        try:
            yield
        except KeyboardInterrupt:
            raise stopped(self._abort_for_interrupt()) from None

    def _abort_for_interrupt(self) -> str:
        """Abort this state for a Ctrl-C that stopped a read of it; returns what to tell the user."""
        ex = self.stream_executor
        finished = ex._finished()
        ex.abort()
        if finished:
            what = "the program had finished, so nothing was aborted"
        else:
            what = ("its requests were aborted and the backend is free for the next call; the text it had "
                    "written is in state.error().partial_text")
        return f"the program was stopped while its state was read: {what}"

    def sync(self) -> None:
        """Wait until every submitted primitive has run (and, called outside the body of a
        ``run(stream=True)`` program, until the body has returned, except on a thread the body may
        be waiting for: docs/language.md); raise the state's error if one failed. Ctrl-C while
        waiting aborts the program (as every wait here does)."""
        self._wait_done()
        self.stream_executor.raise_if_failed()

    def _wait_done(self) -> None:
        """Wait for the streamed body (run elsewhere) to return and every primitive to have run."""
        with self._abort_on_interrupt():
            self.stream_executor.wait_body()
            self.stream_executor.wait_idle()

    def text(self) -> str:
        """The full text (waits for queued primitives; raises ``ProgramError`` on failure)."""
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict]:
        """Completed chat messages in OpenAI format (waits; raises on failure)."""
        self.sync()
        return list(self.stream_executor.messages_)

    def error(self) -> Optional[ProgramError]:
        """The error that stopped this state, or None. Waits for queued primitives and, while
        there is no error yet, also (where ``sync`` does) for a ``run(stream=True)`` program's
        body to return, since an error it is about to raise counts. A state that already failed
        or was aborted answers at once, while its body may still be running (a stopped cell's
        runner reads it so, to stop that body)."""
        ex = self.stream_executor
        with self._abort_on_interrupt():
            ex.wait_idle()
            if ex.error_ is None:
                ex.wait_body()
                ex.wait_idle()
        return ex.read_error()

    def get_var(self, name: str) -> Any:
        """The value of variable ``name``, as ``s[name]``: waits for it; raises the state's error.

        Raises:
            KeyError: nothing set ``name``, nor will; naming the variables there are, or the
                ``var_scope`` block of that name still open.
        """
        with self._abort_on_interrupt(), self._scope_hint(name):
            return self.stream_executor.get_var(name)

    @contextlib.contextmanager
    def _scope_hint(self, name: Optional[str]):
        """A KeyError for a variable whose ``var_scope`` block is still open says so."""
        try:
            yield
        except KeyError:
            if name in self._open_scopes:
                raise KeyError(f"variable {name!r} is set when its var_scope block ends; read it after the "
                               "with block") from None
            raise

    def set_var(self, name: str, value: Any) -> None:
        """Set variable ``name`` to ``value`` now (not queued behind the state's pending work)."""
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """The backend's meta info of variable ``name`` (token counts, cached tokens, finish reason,
        logprobs; select: scores). Waits like ``s[name]``; ``None`` for a name nothing set, as in
        SGLang (whose ``get_meta_info`` looks the name up with ``dict.get``)."""
        try:
            self.get_var(name)
        except KeyError:  # (the state's own error is a ProgramError and still raises)
            return None
        return self.stream_executor.meta_info.get(name)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Yield the text (or variable ``var_name``) piece by piece as it is produced; with
        ``stream=True`` a gen arrives token by token. A variable of ``gen(dtype=...)`` yields the
        text the model wrote (``"42"``), not its parsed value. A variable that ``join`` gathered (a
        list, one value per fork branch) has no text: iterating it raises ``TypeError`` saying so;
        iterate each branch's ``text_iter`` before the join, or read ``s[var_name]``."""
        return self._text_iter(var_name, None)

    def _text_iter(self, var_name: Optional[str], reader: Optional[threading.Thread], with_meta: bool = False,
                   stop: Optional[threading.Event] = None) -> Iterator[Any]:
        with self._abort_on_interrupt(), self._scope_hint(var_name):
            yield from self.stream_executor.iter_text(var_name, reader, with_meta, stop)

    async def text_async_iter(self, var_name: Optional[str] = None, return_meta_data: bool = False):
        """``text_iter`` as an async iterator; with ``return_meta_data`` and a ``var_name`` yields
        ``(chunk, meta_info of var_name)``, the meta info as of that chunk (the whole text has no
        meta info: its chunks come alone, as in SGLang).

        Cancelled while it waits for text (``task.cancel()``), it stops at once, the worker thread
        waiting for it too (else ``asyncio.run``, which waits for those threads on its way out,
        hung until more text came). As a ``break`` out of the loop does, that leaves the program
        running (another reader may want it; ``asyncio.run`` returns meanwhile):
        ``state.abort()``, e.g. in an ``except asyncio.CancelledError``, stops its gens.

        A Ctrl-C while it waits for text stops the program, as in every other wait on a state:
        its requests are aborted and the reading task ends. Under ``asyncio.run`` the cancel it
        makes ends it; in a notebook's cell, which ipykernel cancels, the reader raises the
        ``KeyboardInterrupt`` (saying what was aborted) in place of that cancel, where the cell
        awaits it in the cell's own task (IPython shows it as the cell's error, as a stop of any
        other wait); under ``loop.run_until_complete`` (IPython's autoawait), where Python's
        handler would raise ``KeyboardInterrupt`` out of the loop with the task pending, the task
        is cancelled and the ``KeyboardInterrupt`` raised once it ended
        (``lmnb.interrupt.ReadInterrupts``)."""
        # steps run on worker threads, for this thread: an event loop that a streamed body runs
        # (asyncio.run in the body) reads as the body, which cannot add text while it reads
        # (with meta data, each chunk's own: read with it, under the state's lock)
        stop = threading.Event()
        it = self._text_iter(var_name, threading.current_thread(), return_meta_data and var_name is not None, stop)
        end = object()
        interrupts = ReadInterrupts(asyncio.current_task())
        try:
            while True:
                with interrupts:
                    chunk = await asyncio.to_thread(next, it, end)
                if chunk is end:
                    return
                yield chunk
        except asyncio.CancelledError:
            if interrupts.interrupted:
                interrupts.message = self._abort_for_interrupt()
                # (a notebook cell: ipykernel turns its Ctrl-C into this cancel, and IPython showed
                # a bare CancelledError traceback, where a stop in any other wait says what it did)
                if shown_by_an_ipython_cell(sys._getframe()):
                    raise stopped(interrupts.message) from None
            raise
        finally:  # (a cancel lands in the await while a step runs: that step ends now)
            stop.set()
            self.stream_executor.wake_readers()

    def abort(self) -> None:
        """Abort in-flight requests and skip queued primitives (reads then raise
        ``ProgramAborted``)."""
        self.stream_executor.abort()

    def __str__(self) -> str:
        """``ProgramState(<text>)``, SGLang's form: waits like ``text()`` (programs print
        ``str(state)`` to show a branch's finished text), but shows a failed state's text so far
        instead of raising."""
        self._wait_done()
        return f"ProgramState({self.stream_executor.text_})"

    def __repr__(self) -> str:
        """``str(state)`` once nothing more will come (what ``text()`` would not wait for);
        before, ``<ProgramState running text='<text so far>'>`` at once, as a running future's repr
        is. SGLang's repr waits; reprs are made where no one asked to wait (Python 3.11's
        ``signal.getsignal`` in ``asyncio.run``'s end makes the main task's, its result's with it,
        so a coroutine returning a running state hung ``asyncio.run`` until the program ended;
        debuggers, logs), so lmnb's only ``str`` waits."""
        ex = self.stream_executor
        if ex.settled_for_caller():
            return str(self)
        return f"<ProgramState running text={ex.text_!r}>"


def _check_join_mode(mode: str) -> None:
    """Raise ValueError unless ``mode`` is a mode of ``ProgramStateGroup.join``."""
    if mode not in ("gather_variable", "concate_and_append"):
        raise ValueError(f"unknown join mode {shown_value(mode)}; use 'gather_variable' or 'concate_and_append'")


class ProgramStateGroup:
    """The branches of ``ProgramState.fork``: index them, add to all of them, ``join`` them."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState):
        self.states = states
        self.src_state = src_state
        self._join_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self):
        return iter(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        # `forks[i] += x` ends with this assignment of the same state
        if value is not self.states[i]:
            raise TypeError("fork branches cannot be replaced; use forks[i] += ... to extend one")

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        """``forks += f`` with ``f`` a callable ``f(i)`` per branch, a list with one item per
        branch, or one string/primitive for every branch."""
        if callable(other) and not isinstance(other, Expr):
            items = [other(i) for i in range(len(self.states))]
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"got {len(other)} items for {len(self.states)} fork branches")
            items = list(other)
        else:
            items = [other] * len(self.states)
        for state, item in zip(self.states, items):
            state += item
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch and merge them into the source state (after its queued work).

        ``gather_variable``: each variable a branch set becomes, in the source state, a list with
        one entry per branch (None for a branch that did not set it); meta info likewise.
        ``concate_and_append``: additionally appends each branch's new text (and chat messages)
        to the source state in branch order, with the images/videos added in the branches; the next
        gen prefills the joined text. A join of one of the branches' own forks that another
        thread has begun is waited for, so its merge is part of what this join takes; so is a
        program body running on a branch (``run(state=branch)``), until it returns.

        Raises:
            ValueError: unknown mode; with ``concate_and_append``, a branch that ends in another chat
                role than it was forked in (it began a role and did not end it, or ended the
                parent's), whose text would break the parent's roles.
            RuntimeError: the group was joined already (a second join would merge it twice), the
                state it was forked from is a fork branch joined already (nothing can merge into it),
                a body running on a branch is the caller, or the caller is an ``lmnb.observe``
                callback on a branch's worker (either would wait for itself). A body on a branch
                that waits for the caller (joins its thread) hangs with it, as two threads joining
                each other do.
            ForkError: a branch failed; nothing is merged and every branch stays readable.
            KeyboardInterrupt: Ctrl-C while it waited: the branches were aborted first (the message
                says so); nothing is merged.
        """
        _check_join_mode(mode)
        # (an lmnb.observe callback on a branch's worker: the join waits for that branch, so it is
        # refused before it waits for the lock, which a join begun on another thread holds while it
        # waits for that same branch: both hung)
        for st in self.states:
            st.stream_executor.refuse_if_running_here()
        # a second thread joining this group meanwhile waits, then is refused; but not a body running
        # on a branch: the join holding the lock waits for that body to return, so both would hang;
        # it is refused as join_ready refuses it
        try:
            self._refuse_to_wait_for_bodies()
            from lmnb_engine.waits import sliced_wait  # torch-free (not at the top: import lmnb loads no engine)

            sliced_wait(lambda seconds: self._join_lock.acquire(timeout=seconds))
            try:
                self._join(mode)
            finally:
                self._join_lock.release()
        except KeyboardInterrupt:  # no branch is left generating for a join no one waits for
            with held_interrupts():
                for st in self.states:
                    st.stream_executor.abort()
                raise stopped("join was stopped: the fork branches' requests were aborted and the backend is free for "
                              "the next call; nothing was joined, and a branch that had not finished keeps its text "
                              "in its error().partial_text") from None

    def join_or_abort(self, mode: str = "gather_variable") -> None:
        """``join``, unless a branch fails before all have run what was submitted to them: then
        the branches still running are aborted at once (their in-flight requests end, their queued
        primitives are skipped), nothing is merged, and a ``ForkError`` names the branches that
        had failed by then and, apart, those aborted here (``ForkError.aborted``), which may have
        failed alike had they run on. A ``%%lm`` cell's ``{join}`` joins so
        (``lmnb.template``): its program cannot go on past a failed branch, so waiting for the
        others would only delay the error, as a failed program body aborts the branches it left
        unjoined (``_run_body``).

        Raises:
            ForkError: a branch failed, as above.
            ValueError, RuntimeError: as ``join``.
        """
        _check_join_mode(mode)
        failed = self._first_failures()
        if not failed:
            self.join(mode)
            return
        aborted = []
        for i, st in enumerate(self.states):
            ex = st.stream_executor
            # (a branch that ran all it was given is left whole and readable: its state is not
            # finished for abort(), which waits for the join that closes it)
            if i in failed or (ex.idle() and ex.error_ is None):
                continue
            st.abort()
            if isinstance(ex.error_, ProgramAborted):
                aborted.append(i)
            elif ex.error_ is not None:  # it failed on its own before the abort reached it
                failed[i] = ex.read_error()
        raise ForkError(failed, self, tuple(aborted))

    def _first_failures(self) -> dict[int, ProgramError]:
        """Wait until every branch has run what was submitted to it, or until one has failed;
        ``{branch index: error}`` of those failed then (each counted as told, ``read_error``),
        empty where none failed."""
        from lmnb_engine.waits import MARKED_STOP_POLL_S  # torch-free (not at the top: import lmnb loads no engine)

        exes = [st.stream_executor for st in self.states]
        for ex in exes:  # (an lmnb.observe callback on a branch's worker: it would wait for itself)
            ex.refuse_if_running_here()
        wake = threading.Event()
        for ex in exes:
            ex.watch(wake)
        try:
            while True:
                wake.clear()  # (before looking: a change from here on sets it again)
                failed = {i: ex.read_error() for i, ex in enumerate(exes) if ex.error_ is not None}
                if failed or all(ex.idle() for ex in exes):
                    return failed
                wake.wait(MARKED_STOP_POLL_S)  # (woken or not, it looks again: a Ctrl-C marked meanwhile takes effect)
        finally:
            for ex in exes:
                ex.unwatch(wake)

    def _refuse_to_wait_for_bodies(self) -> None:
        """Raise if a program body running on a branch is the caller or waits for it."""
        for st in self.states:
            ex = st.stream_executor
            with ex._cv:
                body = ex.body_thread if ex.body_thread is not None else ex.plain_body
                if body is not None:
                    ex._refuse_to_wait_for(body)

    def _join(self, mode: str) -> None:
        if any(st.stream_executor.joined for st in self.states):
            raise RuntimeError("this fork group was joined already; fork the state again for new branches")
        parent = self.src_state.stream_executor
        with parent.merging():  # (refused if the parent is a branch joined already: nothing is merged)
            exes = [st.stream_executor for st in self.states]
            for ex in exes:  # (first without refusing anything: a branch may take long)
                ex.wait_idle()
            try:
                for ex in exes:  # what they hold now is final: joins of their own forks are merged first
                    ex.join_ready()
                self._check(exes, mode)
            except BaseException:  # (a failed branch, Ctrl-C) nothing was joined: the branches stay usable
                for ex in exes:
                    ex.joined = False
                raise
            self._merge(parent, exes, mode)

    def _check(self, exes: list, mode: str) -> None:
        """Raise if the branches cannot be joined (see ``join``)."""
        errors = {i: ex.read_error() for i, ex in enumerate(exes) if ex.error_ is not None}
        if errors:
            raise ForkError(errors, self)
        if mode == "concate_and_append":
            for i, ex in enumerate(exes):
                if ex.cur_role != ex.fork_start_role:  # its text would open or close the parent's role
                    def where(role):
                        return f"inside role {role!r}" if role else "outside any role"

                    raise ValueError(
                        f"join('concate_and_append'): fork branch {i} was forked {where(ex.fork_start_role)} but "
                        f"ends {where(ex.cur_role)}, so its text would break the parent's chat roles; begin and end "
                        "a role within the branch, or around the whole fork (nothing was joined)")

    @staticmethod
    def _merge(parent: StreamExecutor, exes: list, mode: str) -> None:
        """Submit the branches' variables (and text) to ``parent``; close the branches."""
        names: list[str] = []
        for ex in exes:
            names += [n for n in ex.vars_set if n not in names]
        variables = {n: [ex.variables.get(n) if n in ex.vars_set else None for ex in exes] for n in names}
        meta = {n: [ex.meta_info.get(n) if n in ex.vars_set else None for ex in exes] for n in names}
        text, messages, images = "", [], []
        if mode == "concate_and_append":
            for ex in exes:
                text += ex.text_[ex.fork_start_text_pos:]
                messages += ex.messages_[ex.fork_start_messages:]
                images += ex.images_[ex.fork_start_images:]
        unjoined = []  # the branches' own forks that no join took: the parent keeps them (their errors, abort)
        for ex in exes:
            ex.close()
            with ex._cv:
                unjoined += ex._children
        joined = set(map(id, exes))  # (a set: fork(n)'s join read the list of n branches once per child, n**2 in all)
        with parent._cv:  # (a thread of the body may be forking the parent meanwhile)
            parent._children = [c for c in parent._children if id(c) not in joined] + unjoined
        parent.submit(
            _JoinApply(variables, meta, text, messages, tuple(ex.sid for ex in exes), mode, tuple(images))
        )


# ------------------------------------------------------------------------------------- running


def _run_body(state: ProgramState, func: Callable, args: tuple, kwargs: dict, raise_errors: bool) -> None:
    # IPython leaves frames that set __tracebackhide__ out of a traceback (all but the last; %xmode
    # --show shows them): an exception of a program's body showed five frames of lmnb's between the
    # call and the body's own line; so do run_program, _start and SglFunction.run/__call__
    __tracebackhide__ = True
    ex = state.stream_executor
    if ex.body_thread is not None:  # a streamed body: its caller's reads wait for this one
        ex.body_thread = threading.get_ident()
    else:
        ex.plain_body = threading.get_ident()
    try:
        state.ret_value = func(state, *args, **kwargs)
        ex.wait_idle()
        if ex.error_ is None:
            # A branch no join took, that failed where the program never read it, would fail
            # unseen (SGLang warns of every executor's error as it happens; lmnb raises errors
            # where the state is read, so the state carries it).
            unread = ex.take_unread_branch_errors()
            if unread:
                ex.fail("", UnjoinedForkError(unread, ex.branch, ex.text_))
    except KeyboardInterrupt:
        ex.abort()
        raise
    except BaseException as e:  # noqa: BLE001
        if raise_errors:
            raise
        ex.wait_idle()  # what the body submitted before it raised still runs
        ex.fail(f"the body of program {getattr(func, '__name__', '?')!r}", e)
        ex.close()  # (first, as a plain run's body ends before run() aborts: a branch that had finished stays readable)
        ex.abort()  # (the error is set: this stops only the unjoined fork branches, which nothing can join now)
    finally:
        ex.end_body()


def _new_state(program, backend: BaseBackend, kwargs: dict, default_params: GenParams, stream: bool,
               use_thread: bool, listeners: tuple) -> ProgramState:
    """A new, empty state for one run of ``program``."""
    return ProgramState(StreamExecutor(
        backend, kwargs, default_params, stream=stream, num_api_spec_tokens=program.num_api_spec_tokens,
        use_thread=use_thread, listeners=listeners,
    ))


def run_program(
    program,
    backend: BaseBackend,
    args: tuple,
    kwargs: dict,
    default_params: GenParams,
    stream: bool,
    use_thread: bool = True,
    listeners: Optional[tuple] = None,
    raise_errors: bool = True,
    state: Optional[ProgramState] = None,
) -> ProgramState:
    """Run ``program`` (an ``SglFunction``) once and return its state.

    Without ``stream`` this returns when the program body returned and every primitive ran; an
    exception of the body itself propagates (``raise_errors``), after aborting what the body
    started in a new state (its gens and fork branches), which no one could read. With ``stream`` the body runs on a
    thread and the state is returned at once (read it with ``text_iter``). With ``state`` the body
    continues that existing state (``StreamExecutor.reopen``) instead of a new one.
    """
    __tracebackhide__ = True  # see _run_body
    listeners = _listeners.get() if listeners is None else listeners
    continued = state is not None
    if not continued:
        state = _new_state(program, backend, kwargs, default_params, stream, use_thread, listeners)
    try:
        if continued:  # (it waits for the work queued on the state: Ctrl-C there stops this run too)
            state.stream_executor.reopen(default_params, stream, listeners)
        return _start(state, program, args, kwargs, stream, raise_errors)
    except KeyboardInterrupt:  # (also one that a read of the state in the body worded: this run is what stopped)
        with held_interrupts():
            state.abort()
            raise _run_stopped(continued) from None
    except BaseException:
        if not continued:
            state.abort()  # the caller gets the body's exception, not the state: nothing still running can be read
        raise


def _run_stopped(continued: bool) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` of a ``run()`` stopped by Ctrl-C, once its state is aborted;
    ``continued``: the run continued the caller's state (``run(state=...)``), which keeps the text."""
    kept = ("the state's text up to the stop is in state.error().partial_text" if continued else
            "it returned no state (run(stream=True) returns the state at once, and a stopped one keeps its text "
            "in state.error().partial_text)")
    return stopped(f"run was stopped: its requests were aborted and the backend is free for the next call; {kept}")


def _start(state: ProgramState, program, args: tuple, kwargs: dict, stream: bool, raise_errors: bool) -> ProgramState:
    """Run ``program``'s body on ``state``: here, or with ``stream`` on a thread of its own.

    Raises:
        RuntimeError: with ``stream``, the body's thread could not be started; the state runs no
            body then, so it can be read and continued.
        KeyboardInterrupt: with ``stream``, Ctrl-C while the body's thread was starting: the state
            is aborted, as by Ctrl-C while reading it, so a body that had begun stops at its next
            primitive (and marks the state when it returns); one that had not begun never runs.
    """
    __tracebackhide__ = True  # see _run_body
    kwargs = {**program.bind_arguments, **kwargs}
    if stream:
        ex = state.stream_executor
        ex.mark_streamed_body()  # started below; the caller waits for it
        ctx = contextvars.copy_context()
        # taken by the body as it begins, or by a start that Ctrl-C cut short: then the body never runs
        claim = threading.Lock()

        site = user_site()  # (a warning of the body's thread names the caller's line: lmnb.user_site)

        def body() -> None:
            if claim.acquire(blocking=False):
                with running_for(site):
                    _run_body(state, program.func, args, kwargs, False)

        try:
            threading.Thread(target=ctx.run, args=(body,), daemon=True).start()
        except RuntimeError as e:  # ("can't start new thread": too many threads)
            ex.end_body()  # no body runs: the state is not left "still running" one forever
            raise RuntimeError(f"run(stream=True) could not start the thread for the program body: "
                               f"{type(e).__name__}: {e}; nothing of the body ran; retry once fewer threads "
                               "run, or run without stream=True") from e
        except KeyboardInterrupt:  # the thread may have started, and its body begun: no one would own it
            state.abort()
            if claim.acquire(blocking=False):  # the body had not begun, and now never will
                ex.end_body()
            raise
        return state
    _run_body(state, program.func, args, kwargs, raise_errors)
    return state


def prefill_prefix(backend: BaseBackend, prefix: str, caller: str, kept: str = "") -> dict:
    """``backend.cache_prefix(prefix)`` (a program's constant prefix, ``lmnb.tracer``) under a request
    id of its own; returns its meta_info.

    Raises:
        KeyboardInterrupt: Ctrl-C meanwhile: the request was sent its abort (the in-process engine
            withdraws it itself; a server's would prefill on), and the message says so, as
            ``"{caller} was stopped: ..."`` followed by ``kept``.
        BackendError, ValueError: as ``cache_prefix`` raises them.
    """
    rid = uuid.uuid4().hex
    try:
        return backend.cache_prefix(prefix, rid)
    except KeyboardInterrupt:
        with held_interrupts():
            backend.abort(rid)
            raise stopped(f"{caller} was stopped while it prefilled the program's constant prefix: that request was "
                          f"aborted and the backend is free for the next call{kept}") from None


def _batch_stopped(size: int, finished: list[int], yielded: Optional[int]) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` of a batch of ``size`` items stopped by Ctrl-C, the items
    ``finished`` by then (indices), the others aborted or never started; ``yielded``: the states a
    ``generator_style`` batch had handed on (None for a list, which returns none)."""
    plural = "s" if len(finished) != 1 else ""
    done = f"item{plural} {item_ranges(finished)} had finished" if finished else "no item had finished"
    left = size - len(finished)
    rest = ("" if not left else "; the request of the other item was aborted or never sent" if left == 1 else
            f"; the requests of the other {left} were aborted or never sent")
    kept = (f"; it had yielded {yielded} state{'s' if yielded != 1 else ''}" if yielded is not None else
            "; it returned no states: run it again (generator_style=True hands on each state as it comes)")
    return stopped(f"run_batch was stopped: {done} ({len(finished)} of {size}){rest}, and the backend is free "
                   f"for the next call{kept}")


def run_program_batch(
    program,
    backend: BaseBackend,
    batch_kwargs: list[dict],
    default_params: GenParams,
    num_threads: Any = "auto",
    progress_bar: bool = False,
    generator_style: bool = False,
):
    """Run ``program`` once per kwargs dict, concurrently; returns the states in input order
    (a generator of them with ``generator_style``).

    Before the batch, the program's constant prefix (found by tracing, ``lmnb.tracer``) is
    prefilled once so every item's request hits the prefix cache (paper §3); a prefill that fails
    (a prefix too long for the model) is skipped, and each item reports the error. An item whose body
    raises does not stop the batch: its state's ``error()`` holds the exception and reading it
    raises. A consumer of the generator that stops early (``break``) or a Ctrl-C while waiting
    cancels the items not started yet and aborts those running (their bodies still return first).
    """
    from lmnb.tracer import extract_prefix

    if num_threads == "auto":
        num_threads = max(96, multiprocessing.cpu_count() * 16)
    if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:  # (True is an int)
        raise ValueError(f"num_threads must be 'auto' or an integer >= 1, got {shown_value(num_threads)}")
    if len(batch_kwargs) > 1:  # (after the checks: a refused batch runs nothing, not even its trace)
        prefix = extract_prefix(program, backend.get_chat_template())
        if prefix:
            try:
                prefill_prefix(backend, prefix, "run_batch", "; no item had started, and it returned no states")
            except Exception:  # noqa: BLE001 - only a hint: every item begins with this text and reports the error itself
                pass
    num_threads = max(1, min(num_threads, len(batch_kwargs)))
    listeners = _listeners.get()
    running: set[ProgramState] = set()  # the items' states while their bodies run
    lock = threading.Lock()
    stopping = False  # the consumer left early: items still running are aborted
    pbar = None  # the progress bar, made when the batch starts

    def one(i: int, kwargs: dict) -> ProgramState:
        params = default_params  # a seeded batch: item i runs as run(seed=derived_seed(seed, (i,))), a sample of its own
        if params.seed is not None:
            params = dataclasses.replace(params, seed=derived_seed(params.seed, (i,)))
        state = _new_state(program, backend, kwargs, params, False, True, listeners)
        with lock:
            running.add(state)
            if stopping:  # (it started as the batch stopped)
                state.abort()
        try:
            return _start(state, program, (), kwargs, False, raise_errors=False)
        finally:
            with lock:
                running.discard(state)
                # (here, so an item is counted before its result is handed on; one that the
                # consumer's break or Ctrl-C aborted is not: they filled the bar, as if all had run)
                if pbar is not None and not stopping:
                    try:
                        pbar.update()
                    except Exception:  # noqa: BLE001 - a bar that cannot draw (stderr a closed pipe) loses no item's result
                        pass

    def results():
        nonlocal stopping, pbar
        if progress_bar:  # (here: a generator_style batch starts when first iterated, and its bar with it)
            # (plain tqdm, as SGLang's: text on stderr, which a notebook shows in place as it
            # updates and saves whole; tqdm.auto's widget was saved by `lmnb run`, nbclient, as
            # its first text, "0%| 0/2", however far the batch got)
            from lmnb import bar_stream

            # (a stderr that is a closed pipe: the batch runs on and the bar's draws are dropped;
            # a draw that raised kept tqdm's lock, and the next item's update waited for it for good;
            # a log file gets lines, a terminal and a notebook the bar drawn in place)
            pbar = bar_stream.progress_bar(len(batch_kwargs), bar_stream.is_live(sys.stderr))
        finished = None  # on a Ctrl-C: the items that had finished by then
        yielded = 0
        try:
            with ThreadPoolExecutor(num_threads) as pool:
                futures = []
                try:
                    # (a Ctrl-C inside a submit's Thread.start left a started worker out of the pool's
                    # threads, so nothing waited for its item's body: each submit, which does not wait,
                    # holds it, and it is raised before the next; all of them held it, and a batch of
                    # 200,000 items took 3.5 s to submit, every press meanwhile unanswered)
                    for i, kw in enumerate(batch_kwargs):
                        with held_interrupts() as held:
                            futures.append(pool.submit(one, i, kw))
                        if held:
                            raise KeyboardInterrupt
                    from lmnb_engine.waits import future_result  # torch-free (import lmnb loads no engine)

                    for f in futures:
                        yield future_result(f)
                        yielded += 1
                except KeyboardInterrupt:  # raised again below, saying what it stopped, once the items have ended
                    finished = [i for i, f in enumerate(futures) if f.done() and not f.cancelled()]
                finally:  # a consumer that stops early (break, Ctrl-C): no item is left running for no one
                    with held_interrupts():  # (a second Ctrl-C between two aborts would skip the rest)
                        pool.shutdown(wait=False, cancel_futures=True)
                        with lock:
                            stopping = True
                            for state in running:
                                state.abort()
        except KeyboardInterrupt:  # a second Ctrl-C while the pool waits for the aborted items' bodies to return
            if finished is None:
                raise
        finally:
            if pbar is not None:
                pbar.close()
        if finished is not None:
            raise _batch_stopped(len(batch_kwargs), finished, yielded if generator_style else None) from None

    return results() if generator_style else list(results())
