"""A real browser: JupyterLab 4 + Debian chromium driven by playwright-core (``lab_driver.js``).

The test starts JupyterLab on 127.0.0.1 with its own token and config/data/runtime dirs, opens a
notebook, runs a fork cell (live lanes while it streams, then the static view), a cell continuing a
named state (cached span shaded apart from the computed one), a cell whose Stop button is clicked,
and a radix-tree cell, then opens a saved notebook untrusted (JupyterLab's sanitizer in the path).
Screenshots go to tests/artifacts/. Needs ``tests/browser/setup.sh`` (chromium, playwright-core).
Recipe: research notes jupyter.md §4.5.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

HERE = Path(__file__).resolve().parent
ARTIFACTS = HERE.parent / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# The notebook: %%lm cells on the lmnb kernel (a tiny checkpoint with a long context).
CELLS = {
    "fork": "%%lm --state s --temperature 0\n"
            "Name two facts about water.{fork 2} Fact:{gen fact max_tokens=24}{join}",
    "cont": "%%lm --state s --temperature 0\n More:{gen more max_tokens=8}",
    "tree": "%lm tree",
    # long branches: watched live, then stopped with the view's button
    "stop": "%%lm --temperature 0\nGo.{fork 2}{gen x max_tokens=4000 ignore_eos=True}{join}",
    "flush": "%lm flush",
    # ends within milliseconds: its widget is replaced by the static view before it was built
    "fast": "%%lm --temperature 0\nQ:{gen q max_tokens=1}",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# JupyterLab binds the port it is given (a free one a moment before): another process may take it
# in between, and the server then exits saying so; it is started again on another port, this often.
LAUNCHES = 3


def _start_lab(env: dict, token: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """JupyterLab (``env``: its dirs and config) serving /api/status with ``token`` on a free port:
    (its process, its base URL). Fails the test, with the log's end, where it exits for another
    reason than its port being taken, ``LAUNCHES`` times over that, or does not answer in 90 s."""
    taken = []
    for _ in range(LAUNCHES):
        port = _free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", f"--ServerApp.port={port}"], env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                return proc, base
            except OSError:  # (not listening yet, or another server there: not ours until ours answers)
                time.sleep(0.3)
        text = log_path.read_text(errors="replace")
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pytest.fail("JupyterLab did not answer within 90 s:\n" + text[-3000:])
        if f"port {port} is already in use" not in text.lower():
            pytest.fail("JupyterLab did not start:\n" + text[-3000:])
        taken.append(port)
    pytest.fail(f"JupyterLab found its port taken at each of {LAUNCHES} launches ({taken}):\n" + text[-3000:])


def _untrusted_notebook(path: Path) -> None:
    """A notebook as nbclient would save it: static outputs only, no signature (so untrusted)."""
    from lmnb_kernel.widgets import RunView, Tally

    v = RunView("saved fork", live=False, session=Tally())
    v.on_text("main", "Shared prefix. ")
    v.on_prompt("main", prompt_tokens=6, cached_tokens=3, cached_chars=7)
    v.on_fork("main", ["a", "b"])
    v.on_delta("a", "left")
    v.on_delta("b", "right")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("# saved run")
    cell.outputs = [nbformat.v4.new_output("display_data", data=v.finish())]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def lab(tmp_path, tiny_checkpoint_factory):
    """JupyterLab on 127.0.0.1 with a fresh token, isolated Jupyter dirs and the lmnb kernelspec;
    yields (base, token, root)."""
    import argparse

    from lmnb_kernel.install import install

    for need, fix in ((Path(CHROMIUM), "apt-get install -y chromium"),
                      (HERE / "node_modules" / "playwright-core", "npm install (in tests/browser)")):
        if not need.exists():
            pytest.fail(f"{need} is missing: run tests/browser/setup.sh ({fix})")
    ckpt = tiny_checkpoint_factory("llama", max_position_embeddings=4096)
    install(argparse.Namespace(prefix=str(tmp_path / "jp"), sys_prefix=False, user=False, name="lmnb", display_name=None))
    root, cfg = tmp_path / "root", tmp_path / "cfg"
    (cfg / "labconfig").mkdir(parents=True)
    root.mkdir()
    token = secrets.token_hex(16)
    (cfg / "jupyter_server_config.py").write_text(f"""
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port_retries = 0
c.ServerApp.open_browser = False
c.ServerApp.allow_root = True
c.ServerApp.root_dir = {str(root)!r}
c.IdentityProvider.token = {token!r}
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
c.LabApp.expose_app_in_browser = True
c.LabApp.workspaces_dir = {str(tmp_path / 'ws')!r}
""")
    # no announcement toast over the outputs
    (cfg / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(cfg), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "IPYTHONDIR": str(tmp_path / "ipython"),
           "JUPYTER_PLATFORM_DIRS": "1", "OMP_NUM_THREADS": "1",
           "JUPYTER_PATH": str(tmp_path / "jp" / "share" / "jupyter"), "LMNB_MODEL": str(ckpt)}
    proc, base = _start_lab(env, token, tmp_path / "lab.log")
    try:
        yield base, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


DRIVER_TIMEOUT_S = 170
STEP = "lab_driver step: "  # (lab_driver.js writes one such line to stderr as it begins each step)


def test_lanes_cached_span_stop_and_tree_in_jupyterlab(lab, tmp_path):
    base, token, root = lab
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS.values()]
    nb.metadata["kernelspec"] = {"name": "lmnb", "display_name": "lmnb (Python 3)", "language": "python"}
    nbformat.write(nb, root / "demo.ipynb")
    _untrusted_notebook(root / "saved.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    config = {"base": base, "token": token, "notebook": "demo.ipynb", "untrusted": "saved.ipynb",
              "artifacts": str(ARTIFACTS), "chromium": CHROMIUM, "cells": {k: i for i, k in enumerate(CELLS)}}
    (tmp_path / "driver.json").write_text(json.dumps(config))
    try:
        proc = subprocess.run(["node", str(HERE / "lab_driver.js"), str(tmp_path / "driver.json")],
                              capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, cwd=HERE)
    except subprocess.TimeoutExpired as e:  # (its output so far: bytes, text=True or not)
        said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        steps = [line for line in said.splitlines() if line.startswith(STEP)]
        pytest.fail(f"lab_driver.js ran past {DRIVER_TIMEOUT_S} s, "
                    f"{'in ' + steps[-1][len(STEP):] if steps else 'before its first step'}:\n{said[-3000:]}\n"
                    + (tmp_path / "lab.log").read_text(errors="replace")[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["errors"] == [], seen["errors"][0] + "\n" + (tmp_path / "lab.log").read_text()[-3000:]

    # the fork cell: its output is now the static view, two lanes side by side and the join
    assert seen["fork_live_left"] == 0 and seen["fork_static_lanes"] == 2
    assert [t[:6] for t in seen["fork_lane_texts"]] == [" Fact:", " Fact:"]
    assert len(seen["fork_join"]) == 1 and seen["fork_join"][0].startswith("⤶ joined")
    # the cell continuing state s: its prefix came from the radix cache, shaded #c8ecd0, and this
    # cell's own text was computed, shaded #ffe1bd
    cached, computed = "".join(seen["cont_cached"]), "".join(seen["cont_computed"])
    assert cached.startswith("Name two facts about water.") and computed.endswith("More:")
    # the prompt: state s's text (the kernel may end a cell's text with its newline), then this cell's
    assert re.fullmatch(r"Name two facts about water\.\n? More:", cached + computed)
    assert seen["cont_cached_bg"] == "rgb(200, 236, 208)" and seen["cont_computed_bg"] == "rgb(255, 225, 189)"
    # live: both branches streaming into their lanes at once, then the Stop button aborted them
    assert seen["live_lanes"] == 2 and seen["live_status"] == "running"
    assert seen["live_tokens_mid_run"] >= 6  # the driver waited for >= 3 tokens in each lane
    assert "lmnb-interrupted" in seen["stop_final"]
    # the radix tree (root, shared prefix, branches), refreshed in place by later cells: after
    # %lm flush the evicted nodes stay, faded
    assert seen["tree_nodes"] >= 3
    assert seen["tree_evicted"] >= 1 and float(seen["tree_evicted_opacity"]) == pytest.approx(0.45)
    assert seen["widget_errors"] == 0
    # a saved notebook opened untrusted: the sanitizer kept the lanes and the inline shading
    assert seen["untrusted_trusted_flag"] is False
    assert seen["untrusted_lanes"] == 2 and seen["untrusted_cached_bg"] == "rgb(200, 236, 208)"
    for name in ("fork-live.png", "fork-static.png", "continue-state.png", "stop.png", "tree.png", "lab.png",
                 "untrusted.png"):
        assert (ARTIFACTS / name).stat().st_size > 1000
