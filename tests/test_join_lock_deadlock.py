"""A body running on a fork branch (run(state=branch)) that joins its own branch's group while
another thread's join of that group waits for the body: the second join waited for the group's
join lock, held by the first join, which waited for the body to return, so both hung. It is
refused as when the body joins alone: the join would wait for itself."""

from __future__ import annotations

import threading
import time

import pytest

import lmnb as sgl

from helpers_lang import ScriptedBackend


@pytest.mark.timeout(60)
def test_a_body_joining_its_own_group_while_another_join_waits_is_refused():
    be = ScriptedBackend()
    groups, errors = [], []
    started = threading.Event()

    @sgl.function
    def outer(s):
        s += "Q"
        groups.append(s.fork(1))

    @sgl.function
    def body(s):
        s += "A"
        started.set()
        deadline = time.monotonic() + 10
        while not groups[0]._join_lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)  # (until the other thread's join holds the group)
        try:
            groups[0].join("concate_and_append")
        except RuntimeError as e:
            errors.append(str(e))
        s += "B"

    st = outer.run(backend=be)
    done = []
    runner = threading.Thread(target=lambda: done.append(body.run(backend=be, state=groups[0][0])), daemon=True)
    runner.start()
    assert started.wait(10)
    joiner = threading.Thread(target=groups[0].join, args=("concate_and_append",), daemon=True)
    joiner.start()
    joiner.join(20)
    runner.join(20)
    assert not joiner.is_alive() and not runner.is_alive(), "the two joins hung"
    assert len(errors) == 1 and "so it would wait for itself" in errors[0]
    assert st.text() == "QAB"
