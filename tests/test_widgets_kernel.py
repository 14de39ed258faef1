"""The live views through a real kernel: comm traffic during execution, Stop, saved notebooks.

Kernels are started with ``jupyter_client`` and their IOPub messages read as a frontend would
(research notes, jupyter.md §4.2): a plain ``python3`` kernel driving ``RunView`` directly (where
the test can hold a cell open to prove updates arrive mid-run), and the ``lmnb`` kernel running
``%%lm`` cells on a tiny checkpoint. Notebooks are executed with nbclient, exported with nbconvert.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import nbformat
import pytest
from bs4 import BeautifulSoup
from helpers_kernel_hold import RELEASE_CELL, hold_cell
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from lmnb_kernel.widgets import VIEW_MIME

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
KERNEL = "python3"


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_new_kernel(kernel_name=KERNEL, startup_timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def read_until_idle(kc, msg_id: str, seen: list, stop=lambda m: False, timeout: float = 60):
    """Append IOPub messages of ``msg_id`` to ``seen`` until its idle status (or ``stop(msg)``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return True
        if stop(msg):
            return False
    raise TimeoutError(f"no idle status for {msg_id} within {timeout} s")


def view_comm_ids(msgs: list) -> list[str]:
    return [m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_open"
            and m["content"]["data"]["state"].get("_model_name") == "AnyModel"]


def view_comm_id(msgs: list) -> str:
    [cid] = [m["content"]["comm_id"] for m in msgs if m["msg_type"] == "comm_open"
             and m["content"]["data"]["state"].get("_model_name") == "AnyModel"]
    return cid


FORK_CELL = r"""
import os, time
from lmnb_kernel.widgets import RunView
v = RunView("fork demo")
v.show()
v.on_text("main", "Shared prompt. ")
v.on_prompt("main", prompt_tokens=4, cached_tokens=2, cached_chars=7)
v.on_fork("main", ["a", "b"])
for i in range(3):
    v.on_delta("a", f"alpha{i} ", token_ids=[i])
    v.on_delta("b", f"beta{i} ", token_ids=[i])
    time.sleep(0.06)
    v.tick()
deadline = time.time() + 60
while not os.path.exists(GATE) and time.time() < deadline:  # the test opens the gate
    time.sleep(0.02)
v.on_join("main", ["a", "b"])
v.finish();
"""


def test_comm_updates_arrive_while_the_cell_is_still_running(kernel, tmp_path):
    gate = tmp_path / "gate"
    msg_id = kernel.execute(f"GATE = {str(gate)!r}\n" + FORK_CELL)
    seen: list = []
    streamed = lambda m: m["msg_type"] == "comm_msg" and "alpha2" in str(m["content"]["data"])
    # the cell cannot finish before the gate opens, so this update was sent during execution
    assert read_until_idle(kernel, msg_id, seen, stop=streamed) is False
    assert not any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen)
    gate.touch()
    read_until_idle(kernel, msg_id, seen)

    cid = view_comm_id(seen)
    comm_open = next(m for m in seen if m["msg_type"] == "comm_open" and m["content"]["comm_id"] == cid)
    assert comm_open["content"]["target_name"] == "jupyter.widget"
    frames = [m["content"]["data"] for m in seen if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == cid]
    assert frames and all(f["method"] in ("custom", "update") for f in frames)

    shown = next(m for m in seen if m["msg_type"] == "display_data")
    assert shown["content"]["data"][WIDGET_MIME]["model_id"] == cid
    display_id = shown["content"]["transient"]["display_id"]
    final = [m for m in seen if m["msg_type"] == "update_display_data"][-1]
    assert final["content"]["transient"]["display_id"] == display_id
    data = final["content"]["data"]
    assert WIDGET_MIME not in data and {"text/html", "text/plain", VIEW_MIME} <= set(data)
    soup = BeautifulSoup(data["text/html"], "html.parser")
    assert [s.get_text() for s in soup.select(".lmnb-cached")] == ["Shared "]
    assert [s.get_text() for s in soup.select(".lmnb-computed")] == ["prompt. "]
    lanes = soup.select("td.lmnb-lane")
    assert [td.select_one(".lmnb-lane-body").get_text() for td in lanes] == [
        "alpha0 alpha1 alpha2 ", "beta0 beta1 beta2 "]
    assert [ln["id"] for ln in data[VIEW_MIME]["lanes"]] == ["main", "a", "b"]
    close_at = next(i for i, m in enumerate(seen) if m["msg_type"] == "comm_close" and m["content"]["comm_id"] == cid)
    assert close_at > seen.index(final)  # replaced first, then closed: no "model not found" flash


STOP_CELL = r"""
import time
from lmnb_kernel.widgets import RunView
aborted = []
v = RunView("stop demo", on_stop=lambda: aborted.append(True))
v.show()
deadline, i = time.time() + 30, 0
while not v.stop_requested.is_set() and time.time() < deadline:
    v.on_delta("main", f"t{i} ")
    i += 1
    time.sleep(0.05)
    v.tick()
v.finish("interrupted" if v.stop_requested.is_set() else "done");
"""


def test_stop_button_message_on_a_subshell_aborts_the_running_cell(kernel):
    # JupyterLab >= 4.4 sends widget messages on a subshell so they run while a cell executes
    req = kernel.session.msg("create_subshell_request", {})
    kernel.control_channel.send(req)
    reply = kernel.control_channel.get_msg(timeout=30)
    assert reply["content"]["status"] == "ok", reply["content"]
    subshell = reply["content"]["subshell_id"]

    msg_id = kernel.execute(STOP_CELL)
    seen: list = []
    assert read_until_idle(kernel, msg_id, seen, stop=lambda m: m["msg_type"] == "comm_msg") is False
    click = kernel.session.msg("comm_msg", {"comm_id": view_comm_id(seen),
                                            "data": {"method": "custom", "content": {"action": "stop"}}})
    click["header"]["subshell_id"] = subshell
    kernel.shell_channel.send(click)
    read_until_idle(kernel, msg_id, seen)
    final = [m for m in seen if m["msg_type"] == "update_display_data"][-1]["content"]["data"]
    assert final[VIEW_MIME]["status"] == "interrupted"
    assert "lmnb-interrupted" in final["text/html"]
    check = kernel.execute("assert aborted == [True], aborted")
    reply = kernel.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != check:
        reply = kernel.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "ok", reply["content"]


# --- the lmnb kernel: %%lm cells ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def lmnb_env(tmp_path_factory, tiny_checkpoint_factory):
    """Environment for ``lmnb`` kernels: the kernelspec installed to a temp prefix (JUPYTER_PATH) and
    a tiny checkpoint (LMNB_MODEL) whose long context lets a generation run until stopped."""
    from lmnb_kernel.install import install

    ckpt = tiny_checkpoint_factory("llama", max_position_embeddings=4096)
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install(argparse.Namespace(prefix=str(prefix), sys_prefix=False, user=False, name="lmnb", display_name=None))
    env = {"JUPYTER_PATH": str(prefix / "share" / "jupyter"), "LMNB_MODEL": str(ckpt), "OMP_NUM_THREADS": "1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield env


@pytest.fixture(scope="module")
def lm_kernel(lmnb_env):
    km, kc = start_new_kernel(kernel_name="lmnb", startup_timeout=120, env=dict(os.environ))
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def run(kc, code: str, timeout: float = 120) -> list:
    msg_id = kc.execute(code)
    seen: list = []
    read_until_idle(kc, msg_id, seen, timeout=timeout)
    return seen


def final_view(msgs: list) -> dict:
    """The data of the last update of the run view's display (its static bundle)."""
    shown = next(m for m in msgs if m["msg_type"] == "display_data" and WIDGET_MIME in m["content"]["data"])
    did = shown["content"]["transient"]["display_id"]
    updates = [m for m in msgs if m["msg_type"] == "update_display_data"
               and m["content"]["transient"]["display_id"] == did]
    return updates[-1]


def kernel_json(kc, expr: str):
    msgs = run(kc, f"import json as _j; print(_j.dumps({expr}))")
    out = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    return json.loads(out)


def test_lm_fork_cell_streams_lanes_and_a_continued_state_shows_its_cached_prefix(lm_kernel, tmp_path):
    """The view's frames show the branches' tokens while they generate: the engine's streams are
    held after 5 tokens until the test has seen a frame of the view with generated tokens (the
    gate). Without the hold, frames sent only as the cell ended passed too (their timestamps still
    before the static bundle's; only a machine that stamped both alike could fail it)."""
    gate = tmp_path / "gate"
    run(lm_kernel, hold_cell(gate, after=5))
    msg_id = lm_kernel.execute("%%lm --state s --out first --temperature 0\n"
                               "Name two facts about water.{fork 2} Fact:{gen fact max_tokens=300}{join}")
    msgs: list = []
    try:
        tokens_shown = lambda m: m["msg_type"] == "comm_msg" and "lmnb-tok" in json.dumps(m["content"]["data"])
        # (the cell cannot end while the engine is held: a frame with tokens now was sent as it ran)
        assert read_until_idle(lm_kernel, msg_id, msgs, stop=tokens_shown, timeout=180) is False
        held = list(msgs)
        gate.touch()
        read_until_idle(lm_kernel, msg_id, msgs)
    finally:
        run(lm_kernel, RELEASE_CELL)
    assert [m for m in msgs if m["msg_type"] == "error"] == []
    [cid] = view_comm_ids(msgs)
    final = final_view(msgs)
    assert held[-1]["content"]["comm_id"] == cid and final not in held  # (the live view's frame, before the bundle)
    data = final["content"]["data"]
    assert WIDGET_MIME not in data and data[VIEW_MIME]["status"] == "done"
    soup = BeautifulSoup(data["text/html"], "html.parser")
    facts = kernel_json(lm_kernel, "fact")  # the program's own captured branch outputs
    assert [td.select_one(".lmnb-lane-body").get_text() for td in soup.select("td.lmnb-lane")] == [
        " Fact:" + f for f in facts]
    assert len(facts) == 2 and soup.select_one(".lmnb-join") is not None

    msgs = run(lm_kernel, "%%lm --state s --temperature 0\n More:{gen more max_tokens=8}")
    data = final_view(msgs)["content"]["data"]
    soup = BeautifulSoup(data["text/html"], "html.parser")
    cached = "".join(s.get_text() for s in soup.select(".lmnb-cached"))
    computed = "".join(s.get_text() for s in soup.select(".lmnb-computed"))
    # the prompt is the named state's text plus this cell's text, split into cached then computed;
    # cell 1's fork prefilled the state's text up to the fork, so at least that part is cached
    assert cached + computed == kernel_json(lm_kernel, "first.text()") + " More:"
    assert cached.startswith("Name two facts about water.")
    [req] = data[VIEW_MIME]["requests"]
    assert 0 < req["cached_tokens"] < req["prompt_tokens"]


def test_lm_stop_click_aborts_every_branch_and_the_kernel_stays_usable(lm_kernel):
    req = lm_kernel.session.msg("create_subshell_request", {})
    lm_kernel.control_channel.send(req)
    subshell = lm_kernel.control_channel.get_msg(timeout=30)["content"]["subshell_id"]
    msg_id = lm_kernel.execute("%%lm --temperature 0\nGo.{fork 2}{gen x max_tokens=4000 ignore_eos=True}{join}")
    queued = lm_kernel.execute("ran_after_the_stop = True")  # the next cell of a Run All
    seen: list = []
    # (a generous bound: once, on a machine loaded well past its 2 cores, the first token took over 60 s)
    assert read_until_idle(lm_kernel, msg_id, seen, stop=lambda m: m["msg_type"] == "comm_msg"
                           and "lmnb-tok" in json.dumps(m["content"]["data"]), timeout=180) is False
    click = lm_kernel.session.msg("comm_msg", {"comm_id": view_comm_ids(seen)[-1],
                                               "data": {"method": "custom", "content": {"action": "stop"}}})
    click["header"]["subshell_id"] = subshell
    lm_kernel.shell_channel.send(click)
    read_until_idle(lm_kernel, msg_id, seen)
    # an error, as Ctrl-C's, so Jupyter drops the cells queued after it (a Run All stops there)
    [error] = [m["content"] for m in seen if m["msg_type"] == "error"]
    assert (error["ename"], error["evalue"]) == ("KeyboardInterrupt", "the cell was stopped by its Stop button; its "
                                                 "output so far and the variables it finished are kept")
    replies = {}
    while queued not in replies:
        reply = lm_kernel.get_shell_msg(timeout=30)
        replies[reply["parent_header"].get("msg_id")] = reply["content"]["status"]
    assert (replies[msg_id], replies[queued]) == ("error", "aborted")
    data = final_view(seen)["content"]["data"]
    assert data[VIEW_MIME]["status"] == "interrupted"
    lanes = {ln["id"]: ln for ln in data[VIEW_MIME]["lanes"]}
    generated = [sum(s["n_tokens"] for s in ln["segments"] if s["kind"] == "gen")
                 for lid, ln in lanes.items() if lid != "main"]
    assert len(generated) == 2 and all(n < 4000 for n in generated)  # both branches were cut short
    after = run(lm_kernel, "%%lm --temperature 0\nHi{gen y max_tokens=3}")
    assert final_view(after)["content"]["data"][VIEW_MIME]["status"] == "done"


NOTEBOOK_CELLS = [
    "%%lm --state s --temperature 0\nName two facts about water.{fork 2} Fact:{gen fact max_tokens=12}{join}",
    "%%lm --state s --temperature 0\n More:{gen more max_tokens=6}",
    "%lm tree",
]


def test_nbconvert_html_of_an_executed_lm_notebook_contains_the_static_views(lmnb_env, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    NotebookClient(nb, kernel_name="lmnb", timeout=120, startup_timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.validate(nb)  # GitHub refuses invalid notebooks
    outputs = [o for c in nb.cells for o in c.outputs]
    assert all(WIDGET_MIME not in o.get("data", {}) for o in outputs)  # live widgets were replaced
    assert [o["data"][VIEW_MIME]["kind"] for o in outputs if VIEW_MIME in o.get("data", {})] == [
        "run", "run", "tree"]
    path = tmp_path / "views.ipynb"
    nbformat.write(nb, path)
    html, _ = HTMLExporter().from_filename(str(path))
    soup = BeautifulSoup(html, "html.parser")
    assert len(soup.select(".lmnb-run.lmnb-done")) == 2
    assert [td.select_one(".lmnb-lane-body").get_text()[:6] for td in soup.select("td.lmnb-lane")] == [
        " Fact:", " Fact:"]
    runs = soup.select(".lmnb-run.lmnb-done")
    assert "".join(s.get_text() for s in runs[1].select(".lmnb-cached")).startswith("Name two facts about water.")
    assert len(soup.select(".lmnb-tree .lmnb-node")) >= 3  # root, the shared prefix, the branches


def test_a_notebook_executed_by_nbclient_keeps_no_copy_of_the_run_in_the_closed_views_widget_state(tmp_path):
    """nbclient (papermill, nbconvert --execute; lmnb run saves none of a closed widget) saves the last
    state of every widget in the notebook's metadata, closed ones too: the live view's last snapshot
    held the run's text a second time as HTML (14.8 KB for a 400-token gen), beside the output
    that replaced it. Now the view empties its snapshot before it closes."""
    cell = ("from lmnb_kernel.widgets import RunView\nv = RunView('saved')\nv.show()\n"
            "for i in range(200):\n    v.on_delta('main', 'zebra ', token_ids=[i])\n    v.tick()\nv.finish();")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(cell)]
    NotebookClient(nb, kernel_name=KERNEL, timeout=120, startup_timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    [shown] = nb.cells[0].outputs
    assert shown["data"][VIEW_MIME]["lanes"][0]["segments"][0]["text"] == "zebra " * 200  # the run, once
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    [snapshot] = [m["state"]["snapshot"] for m in states.values() if m["model_name"] == "AnyModel"]
    assert snapshot["html"] == ""
    assert "zebra" not in json.dumps(nb.metadata)
