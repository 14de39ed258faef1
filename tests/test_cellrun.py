"""``lmnb_kernel.cellrun``: what Ctrl-C leaves behind when a cell's program body is plain Python.

The cell is run as the ``%%lm`` magic runs it (``start_run`` then ``run_cell``), on a scripted
backend, with a feeder that raises ``KeyboardInterrupt`` as Ctrl-C does on the cell's main thread.
"""

from __future__ import annotations

import queue
import threading

import pytest
from helpers_lang import ScriptedBackend

import lmnb
from lmnb_kernel.cellrun import Listener, run_cell, start_run


class _View:
    def __init__(self):
        self.stop_requested = threading.Event()

    def tick(self):
        pass


class _CtrlC:
    """A feeder whose first event is met by Ctrl-C."""

    def __init__(self):
        self.captured, self.pressed = {}, False

    def apply(self, event):
        if not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt


class _Feeder:
    def __init__(self):
        self.captured = {}

    def apply(self, event):
        pass


@pytest.mark.parametrize("how", ["ctrl-c", "stop button"])
def test_a_stop_ends_a_python_body_that_never_touches_the_state_again(how):
    # %%lm --python with a loop over plain Python: the abort ended the state, but the body's
    # thread ran on for the kernel's life, taking the GIL from the engine and every later cell.
    release, ended = threading.Event(), threading.Event()

    @lmnb.function
    def body(s):
        try:
            s += "start"
            while not release.is_set():  # the test's way out if the body is not stopped
                pass
        finally:
            ended.set()

    listener = Listener()
    state = start_run(body, {}, ScriptedBackend(), {}, listener)
    view = _View()
    try:
        if how == "ctrl-c":
            with pytest.raises(KeyboardInterrupt) as e:
                run_cell(state, listener, _CtrlC(), view)
            outcome = e.value.lmnb_outcome
        else:
            view.stop_requested.set()
            outcome = run_cell(state, listener, _Feeder(), view)
        assert outcome.status == "interrupted"
        assert ended.wait(20), "the body's thread is still running after Ctrl-C"
        assert isinstance(state.error(), lmnb.ProgramAborted)  # the abort is the state's error, not the stop
    finally:
        release.set()


@pytest.mark.parametrize("how", ["ctrl-c", "stop button"])
def test_a_stop_also_aborts_a_program_run_inside_the_body(how):
    # a run() called in a --python body was no part of the cell's state: its request ran to its end
    # (here 60 s) before the body could be stopped
    import time

    backend = ScriptedBackend(lambda p, params: "never", delay=60)

    @lmnb.function
    def inner(s):
        s += "Q:" + lmnb.gen("a")

    @lmnb.function
    def body(s):
        s += "start"
        s["nested"] = inner.run(backend=backend)

    listener = Listener()
    state = start_run(body, {}, backend, {}, listener)
    deadline = time.monotonic() + 20
    while "generate" not in backend.kinds():  # the nested gen's request is in flight
        assert time.monotonic() < deadline
        time.sleep(0.01)
    view = _View()
    if how == "ctrl-c":
        with pytest.raises(KeyboardInterrupt):
            run_cell(state, listener, _CtrlC(), view)
    else:
        view.stop_requested.set()
        run_cell(state, listener, _Feeder(), view)
    assert isinstance(state.error(), lmnb.ProgramAborted)
    assert len(backend.aborted) == 1  # the nested gen's request


def test_a_second_ctrl_c_while_the_first_stops_the_cell_still_stops_the_body(monkeypatch):
    # Ctrl-C pressed twice: the second one landed while the first waited for the cell to stop and
    # cut the clean-up short, so a --python body in a loop ran on (a core busy for the kernel's
    # life) and the cell ended with no outcome (its view said "running" for good)
    release, ended = threading.Event(), threading.Event()

    @lmnb.function
    def body(s):
        try:
            s += "start"
            while not release.is_set():
                pass
        finally:
            ended.set()

    class _PressedAgainWhileWaiting(threading.Thread):
        def join(self, timeout=None):
            if self.name == "lmnb-cell":  # the cell's waiter, joined after the first Ctrl-C
                raise KeyboardInterrupt
            return super().join(timeout)

    listener = Listener()
    state = start_run(body, {}, ScriptedBackend(), {}, listener)
    monkeypatch.setattr(threading, "Thread", _PressedAgainWhileWaiting)
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            run_cell(state, listener, _CtrlC(), _View())
        monkeypatch.undo()
        assert e.value.lmnb_outcome.status == "interrupted"
        assert ended.wait(20), "the body's thread is still running after Ctrl-C twice"
    finally:
        release.set()


def test_a_cell_whose_gen_failed_ends_once_its_body_returned():
    # a failed state's text_iter and error() end at once: the cell ended as "error" while a
    # --python body ran on after the gen that failed (its prints then landed in the next cell)
    import time

    after = []

    def reply(p, params):
        raise RuntimeError("model exploded")

    @lmnb.function
    def body(s):
        s += "Q:" + lmnb.gen("a")
        time.sleep(0.3)  # plain Python after the gen, which has failed meanwhile
        after.append("returned")

    listener = Listener()
    state = start_run(body, {}, ScriptedBackend(reply), {}, listener)
    outcome = run_cell(state, listener, _Feeder(), _View())
    assert outcome.status == "error" and "model exploded" in str(outcome.error)
    assert after == ["returned"], "the cell ended while its body still ran"


def test_a_stop_pressed_after_a_gen_failed_still_reports_the_failure():
    # the cell's gen failed while its --python body ran on (plain Python); Stop ended the body, and
    # the cell said only "interrupted", the gen's error lost
    release, ended = threading.Event(), threading.Event()

    def reply(p, params):
        raise RuntimeError("model exploded")

    @lmnb.function
    def body(s):
        try:
            s += "Q:" + lmnb.gen("a")
            while not release.is_set():  # the test's way out if the body is not stopped
                pass
        finally:
            ended.set()

    class StopOnError(_Feeder):  # the user presses Stop once the view shows the error
        def apply(self, event):
            if event.kind == "error":
                view.stop_requested.set()

    listener = Listener()
    state = start_run(body, {}, ScriptedBackend(reply), {}, listener)
    view = _View()
    try:
        outcome = run_cell(state, listener, StopOnError(), view)
        assert outcome.status == "error" and "model exploded" in str(outcome.error)
        assert ended.wait(20), "the body's thread is still running after the Stop"
    finally:
        release.set()


def test_a_fork_cell_that_ends_done_has_every_branch_event_in_its_final_view():
    # A user once saw a fork cell's saved view with branch 1 cut short and no join while the cell
    # said "done" and its variables were complete. Here branch 1's events and the join are held as
    # they reach the cell's queue until its pump has gone idle (the moment a run counted finished
    # without them would be frozen): the view still gets them all, because the executor threads
    # queue each event before their state can count as finished. (Delivered from a thread of their
    # own instead, the view lacked exactly those, as the user saw.)
    from lmnb.template import parse
    from lmnb_kernel.feed import ViewFeeder
    from lmnb_kernel.widgets import RunView
    from lmnb_kernel.widgets.render_run import render_run_text

    idle = threading.Event()

    class IdleView(RunView):
        def tick(self):
            super().tick()
            idle.set()

    held, branch1 = [], set()

    class HeldQueue(queue.SimpleQueue):  # where an event reaches the cell, on whichever thread puts it
        def put(self, item, block=True, timeout=None):
            if getattr(item, "kind", None) == "state" and item.branch == (1,):
                branch1.add(item.sid)
            if getattr(item, "sid", None) in branch1 or getattr(item, "kind", None) == "join":
                idle.clear()
                held.append(idle.wait(20))  # (the pump ticks once its queue is empty)
            super().put(item, block, timeout)

    template = parse("Pick:{fork c in colors}\nThe {c} one is{gen why}{join}\nEnd.")
    backend = ScriptedBackend(lambda prompt, params: " bright" if "blue" in prompt.text else " dark")
    listener = Listener()
    listener.queue = HeldQueue()
    state = start_run(template.program(), template.bind({"colors": ["red", "blue"]}), backend, {}, listener)
    view = IdleView("fork", live=False)
    outcome = run_cell(state, listener, ViewFeeder(view, state.stream_executor.sid), view)
    view.finish(outcome.status)
    assert outcome.status == "done", outcome.error
    assert outcome.captured == {"why": [" dark", " bright"]}
    text = render_run_text(view.model)
    assert "  ── branch 1 (fork of main) ──\n  \n  The blue one is bright\n" in text
    assert text.endswith("[joined branch 0, branch 1]\n\nEnd.")
    assert held and all(held), "a held event was never followed by an idle pump"


@pytest.mark.parametrize("how", ["ctrl-c", "stop button"])
def test_a_stopped_fork_cell_counts_the_prompt_of_every_branch_request(how, monkeypatch):
    # The Stop button on a {fork} cell: the summary said "prompt 7 + unknown (4 gens stopped before
    # the backend reported their prompt)" where Ctrl-C said "prompt 35". Each branch's stopped
    # request is reported (prompt and cached tokens) by the branch's worker once the backend ends
    # it, which may come after the cell's own text has ended; the cell stopped listening then.
    # Here each branch's backend stream ends only once the cell has closed its listener (the old
    # code's next step) or has begun waiting for the stopped states to settle.
    from lmnb.executor import StreamExecutor
    from lmnb.template import parse
    from lmnb_kernel.feed import ViewFeeder
    from lmnb_kernel.widgets import RunView

    late = threading.Event()  # the cell stopped listening, or waits for the branches' reports

    class StopsOnlyWhenLate(ScriptedBackend):
        def generate_stream(self, prompt, params, rid):
            self._record("stream", (prompt, params))
            counts = {"id": rid, "prompt_tokens": 7, "cached_tokens": 5}
            yield "x", {**counts, "completion_tokens": 1}
            assert self._abort_events.setdefault(rid, threading.Event()).wait(20), "the request was not aborted"
            assert late.wait(20), "the cell neither stopped listening nor waited for the branches"
            yield "", {**counts, "completion_tokens": 1, "finish_reason": {"type": "abort", "message": "aborted"}}

    class ClosingListener(Listener):
        def close(self):
            late.set()
            super().close()

    settle = getattr(StreamExecutor, "settle", None)

    def settle_and_release(self, deadline):
        late.set()
        return settle(self, deadline)

    monkeypatch.setattr(StreamExecutor, "settle", settle_and_release, raising=False)

    class StopOnceBothBranchesStream(ViewFeeder):
        streamed = 0

        def apply(self, event):
            super().apply(event)
            if event.kind == "text" and event.source == "gen":
                self.streamed += 1
                if self.streamed == 2:  # one token in each branch
                    if how == "ctrl-c":
                        raise KeyboardInterrupt
                    view.stop_requested.set()

    template = parse("Q:{fork 2}{gen x max_tokens=50}{join}")
    listener = ClosingListener()
    state = start_run(template.program(), template.bind({}), StopsOnlyWhenLate(), {}, listener)
    view = RunView("fork", live=False)
    feeder = StopOnceBothBranchesStream(view, state.stream_executor.sid)
    if how == "ctrl-c":
        with pytest.raises(KeyboardInterrupt) as e:
            run_cell(state, listener, feeder, view)
        outcome = e.value.lmnb_outcome
    else:
        outcome = run_cell(state, listener, feeder, view)
    assert outcome.status == "interrupted"
    # the fork's prefill of "Q:" (ScriptedBackend counts a character a token, none cached), then two
    # requests of 7 prompt tokens, 5 of them cached, each stopped after 1 token
    assert (view.model.cell.prompt_tokens, view.model.cell.cached_tokens) == (2 + 2 * 7, 2 * 5)
    assert view.model.unfinished_gens == 0
    assert sum(r.completion_tokens or 0 for r in view.model.requests) == 2


class _StopAsItEnds(queue.SimpleQueue):
    """The cell's queue, where the Stop click lands as the program's end reaches the cell (after the
    waiter looked at the ended program, before the pump took the end)."""

    def __init__(self, view):
        super().__init__()
        self.view = view

    def put(self, item, block=True, timeout=None):
        from lmnb_kernel.cellrun import _DONE

        if item is _DONE:
            self.view.stop_requested.set()
        super().put(item, block, timeout)


def test_a_stop_clicked_as_the_cell_ends_by_itself_leaves_it_done():
    # A Stop click in the moment after the program had finished on its own ended the cell with the
    # Stop button's error (a Run-All stopped there) though every gen had run and set its variable.
    from lmnb.template import parse

    template = parse("Q:{gen a max_tokens=2}")
    listener, view = Listener(), _View()
    listener.queue = _StopAsItEnds(view)
    state = start_run(template.program(), template.bind({}), ScriptedBackend(lambda p, params: "ok"), {}, listener)
    outcome = run_cell(state, listener, _Feeder(), view)
    assert view.stop_requested.is_set()
    assert (outcome.status, outcome.error, state["a"], state.text()) == ("done", None, "ok", "Q:ok")


def _failing_root_with_unjoined_branches():
    """A --python body that forks 2 branches and ends without joining, its root's gen failing
    once both branches' requests run; each branch reports one token, then waits (up to 20 s) to
    be aborted. Returns (backend, cell)."""
    from lmnb.template import parse_python

    entered = threading.Semaphore(0)

    class Backend(ScriptedBackend):
        def generate_stream(self, prompt, params, rid):
            self._record("stream", (prompt, params))
            if params.max_new_tokens == 3:  # the root's gen: fails once both branches' requests run
                assert entered.acquire(timeout=20) and entered.acquire(timeout=20)
                raise RuntimeError("model exploded")
            counts = {"id": rid, "prompt_tokens": 7, "cached_tokens": 5}
            entered.release()
            yield "x", {**counts, "completion_tokens": 1}
            aborted = self._abort_events.setdefault(rid, threading.Event()).wait(20)
            reason = {"type": "abort", "message": "aborted"} if aborted else {"type": "length", "length": 1}
            yield "", {**counts, "completion_tokens": 1, "finish_reason": reason}

    cell = parse_python('s += "Q:"\nforks = s.fork(2)\nfor f in forks:\n    f += lmnb.gen("x", max_tokens=50)\n'
                        's += lmnb.gen("a", max_tokens=3)', first_line=2)
    return Backend(), cell


def test_a_stop_as_a_python_body_ends_with_its_fork_unjoined_stops_the_branches_and_counts_them():
    # A --python body forked and ended without joining, its root's gen failed, so the body did not
    # wait for the branches, which were still generating. A Stop clicked as the body's end reached
    # the cell came after the waiter's wait for the stopped requests' reports, and after the pump's
    # last look at the button: the branches ran on unaborted, and what they reported came after the
    # cell had stopped listening (the summary's prompt lacked them).
    from lmnb_kernel.feed import ViewFeeder
    from lmnb_kernel.widgets import RunView

    backend, cell = _failing_root_with_unjoined_branches()
    view = RunView("python", live=False)
    listener = Listener()
    listener.queue = _StopAsItEnds(view)
    state = start_run(cell.program({"lmnb": lmnb}), {}, backend, {}, listener)
    outcome = run_cell(state, listener, ViewFeeder(view, state.stream_executor.sid), view)
    assert outcome.status == "error" and "model exploded" in str(outcome.error)  # (what happened before the Stop)
    assert len(set(backend.aborted)) == 2  # both branches' requests, stopped
    # the fork's prefill of "Q:" (a character a token, none cached), then each branch's stopped request
    assert (view.model.cell.prompt_tokens, view.model.cell.cached_tokens) == (2 + 2 * 7, 2 * 5)


def test_a_python_body_whose_gen_failed_stops_its_unjoined_fork_branches_and_counts_them():
    # A --python body forked and ended without joining, its root's gen failed, so the body did not
    # wait for the branches: the cell ended "error" while they generated on, on the engine, after
    # the cell, and what they reported came after the cell had stopped listening. A failed cell now
    # aborts what it started and left running, as a Stop does, and waits for their reports.
    from lmnb_kernel.feed import ViewFeeder
    from lmnb_kernel.widgets import RunView

    backend, cell = _failing_root_with_unjoined_branches()
    view = RunView("python", live=False)
    listener = Listener()
    state = start_run(cell.program({"lmnb": lmnb}), {}, backend, {}, listener)
    outcome = run_cell(state, listener, ViewFeeder(view, state.stream_executor.sid), view)
    assert outcome.status == "error" and "model exploded" in str(outcome.error)  # the body's own failure
    assert not view.stop_requested.is_set()
    assert len(set(backend.aborted)) == 2  # both branches' requests, stopped with the cell
    assert state.stream_executor._finished()  # nothing of the cell runs on after it
    # the fork's prefill of "Q:" (a character a token, none cached), then each branch's stopped request
    assert (view.model.cell.prompt_tokens, view.model.cell.cached_tokens) == (2 + 2 * 7, 2 * 5)
    assert view.model.unfinished_gens == 0


def test_a_second_ctrl_c_that_lands_as_the_cell_waits_for_its_stop_takes_effect_at_once():
    """After a Ctrl-C the cell waits (up to ``interrupt_wait_s``) for its stopped requests to
    report; a second Ctrl-C stops that wait (a double press). One that landed as the wait began
    was only marked, and Python acted on it when the wait ended: here once a backend that takes
    30 s to end an aborted request had ended it, the double press dead meanwhile. The wait is now
    sliced (lmnb_engine.waits), and the second press still reports the cell's outcome."""
    import signal
    import time

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb_kernel import cellrun

    started, gate, ended = threading.Event(), threading.Event(), threading.Event()

    class SlowToAbort(ScriptedBackend):  # (a server still in a long step when its abort came)
        def _wait(self, rid):
            started.set()
            gate.wait(30)
            ended.set()
            return True  # (answered as aborted)

    class CtrlCOnceGenerating(_CtrlC):
        def apply(self, event):
            started.wait(20)  # (the gen is in flight: the stop has a request to wait for)
            super().apply(event)

    @lmnb.function
    def body(s):
        s += "Q:" + lmnb.gen("a")

    backend = SlowToAbort()
    listener = Listener()
    state = start_run(body, {}, backend, {}, listener)
    waits_for_the_stop = lambda: main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "run_cell", cellrun.__file__))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt_main_when(waits_for_the_stop, marked_only=True):
            with pytest.raises(KeyboardInterrupt) as e:
                run_cell(state, listener, CtrlCOnceGenerating(), _View(), interrupt_wait_s=60)
        assert not ended.is_set()  # stopped while the request was still being aborted
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()
    assert e.value.lmnb_outcome.status == "interrupted"
    assert len(backend.aborted) == 1  # the gen's request, aborted by the first press
    assert state.stream_executor.settle(time.monotonic() + 30)  # (it ends once the backend answers)
    assert isinstance(state.error(), lmnb.ProgramAborted)


def test_a_ctrl_c_as_the_cell_waits_for_what_its_stop_button_stopped_still_reports_the_outcome():
    """A Stop clicked as the program's end reached the cell (a ``--python`` body that returned
    with a program it started still generating) has the cell's main thread wait, up to
    ``interrupt_wait_s``, for the stopped request to report. That wait was one lock wait: a Ctrl-C
    that landed as it began was acted on only when it ended (here once a backend that takes 30 s
    to end an aborted request had ended it), and then raised with no outcome, the listener never
    closed and the body never stopped. The wait is now sliced, and a Ctrl-C there is met as one
    in the pump: at once, with the outcome, and the listener closed."""
    import signal
    import time

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb_kernel import cellrun

    streaming, gate, ended = threading.Event(), threading.Event(), threading.Event()

    class SlowToAbort(ScriptedBackend):  # (a server still in a long step when its abort came)
        def generate_stream(self, prompt, params, rid):
            self._record("stream", (prompt, params))
            counts = {"id": rid, "prompt_tokens": 7, "cached_tokens": 5}
            yield "x", {**counts, "completion_tokens": 1}
            streaming.set()
            assert self._abort_events.setdefault(rid, threading.Event()).wait(20), "the request was not aborted"
            gate.wait(30)
            ended.set()
            yield "", {**counts, "completion_tokens": 1, "finish_reason": {"type": "abort", "message": "aborted"}}

    class StopAsItEndsWithTheRequestInFlight(_StopAsItEnds):
        def put(self, item, block=True, timeout=None):
            if item is cellrun._DONE:  # (the nested request in flight: the stop has it to wait for)
                assert streaming.wait(20)
            super().put(item, block, timeout)

    backend, view, listener, started = SlowToAbort(), _View(), Listener(), []

    @lmnb.function
    def inner(s):
        s += "Q:" + lmnb.gen("a", max_tokens=50)

    @lmnb.function
    def body(s):
        s += "start"
        started.append(inner.run(stream=True, backend=backend))  # returns at once; not read, so not waited for

    listener.queue = StopAsItEndsWithTheRequestInFlight(view)
    state = start_run(body, {}, backend, {}, listener)
    waits_for_the_stopped = lambda: main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "settle_tree", cellrun.__file__))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt_main_when(waits_for_the_stopped, marked_only=True):
            with pytest.raises(KeyboardInterrupt) as e:
                run_cell(state, listener, _Feeder(), view, interrupt_wait_s=60)
        assert not ended.is_set()  # stopped while the request was still being aborted
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()
    assert view.stop_requested.is_set()
    assert e.value.lmnb_outcome.status == "interrupted"
    assert len(backend.aborted) == 1  # the nested run's request, aborted by the Stop
    assert started[0].stream_executor.settle(time.monotonic() + 30)  # (it ends once the backend answers)
    assert isinstance(started[0].error(), lmnb.ProgramAborted)
    assert listener.queue.empty()  # its report, after the cell, is not queued for it: the listener is closed


def test_a_ctrl_c_that_lands_as_stop_body_waits_out_its_grace_takes_effect_at_once():
    """``stop_body`` gives an aborted body ``grace_s`` seconds to return before it stops it; a
    Ctrl-C meanwhile (a second press, which cuts the grace short) that landed as that wait began
    was only marked, and Python acted on it once the wait ended: when the body returned (here 10 s
    later) or the grace ran out. The wait is now sliced (``lmnb_engine.waits.sliced_wait``)."""
    import signal
    from types import SimpleNamespace

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb_kernel import cellrun

    ex = SimpleNamespace(_cv=threading.Condition(), body_thread=-1)  # (a body that has not returned)
    gate, returned = threading.Event(), threading.Event()

    def body_returns_late():
        gate.wait(10)
        with ex._cv:
            ex.body_thread = None
            ex._cv.notify_all()
        returned.set()

    threading.Thread(target=body_returns_late, daemon=True).start()
    in_the_grace = lambda: main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "stop_body", cellrun.__file__))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt_main_when(in_the_grace, marked_only=True):
            with pytest.raises(KeyboardInterrupt):
                cellrun.stop_body(SimpleNamespace(stream_executor=ex), grace_s=60)
        assert not returned.is_set()  # stopped in the grace, not once the body returned
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()
