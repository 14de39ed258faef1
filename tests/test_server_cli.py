"""``lmnb serve`` as a user starts it: a subprocess on 127.0.0.1 that answers SGLang's native
protocol, and a clear exit for a bad model path."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

import lmnb as sgl
from helpers_lang import served_url


def test_lmnb_serve_subprocess_serves_a_program(tiny_llama):
    # --port 0: the system picks a free port, which the "serving" line names (a port found free by
    # the test and bound by the server later could be taken meanwhile)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tiny_llama), "--port", "0",
         "--max-total-tokens", "4096", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = served_url(proc)
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0

        @sgl.function
        def prog(s):
            s += "The river" + sgl.gen("x", max_tokens=4)

        backend = sgl.RuntimeEndpoint(url)
        st = prog.run(backend=backend, temperature=0)
        assert st.get_meta_info("x")["completion_tokens"] == 4
        assert st.text() == "The river" + st["x"]
        backend.shutdown()
    finally:
        proc.terminate()
        proc.wait(30)
        # (the pipe and the backend's pooled connection were left to the garbage collector: ResourceWarning)
        proc.stdout.close()


def test_a_sigterm_as_lmnb_serve_exits_after_a_ctrl_c_keeps_the_ctrl_cs_status_and_line():
    """A SIGTERM that came once the Ctrl-C's stop had been said, while the interpreter exited (it
    takes a moment after torch), ended the process with 143 and no line of its own. Now it is
    ignored: the process ends with the Ctrl-C's status and line, as the server's own handlers keep
    the first signal. Here the SIGTERM is sent by an atexit hook, run as the interpreter exits
    (after ``main`` returned); the server is a stand-in that stops by SIGINT."""
    code = ("import atexit, os, signal, sys, types\n"
            "import lmnb_engine.engine\n"
            "import lmnb_engine.http_server as http_server\n"
            "import lmnb_engine.http_server.app as http_app\n"
            "from lmnb_kernel import cli\n"
            "class Engine:\n"
            "    def __init__(self, **kwargs): pass\n"
            "    def shutdown(self): pass\n"
            "lmnb_engine.engine.Engine = Engine\n"
            "http_server.create_app = lambda engine, **kwargs: object()\n"
            "http_app.Server = lambda app, **config: types.SimpleNamespace(run=lambda sockets: None,\n"
            "                                                              stop_signal=signal.SIGINT)\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
            "sys.argv = ['lmnb', 'serve', '--model', 'm', '--port', '0']\n"
            "sys.exit(cli.main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    said = proc.stderr.splitlines()
    assert (proc.returncode, said[-1], len(said)) == (130, "lmnb serve: stopped (SIGINT)", 2)
    assert said[0].startswith("lmnb serve: serving m on http://127.0.0.1:")


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_lmnb_serve_stopped_by_a_signal_says_so_and_exits_with_its_status(tiny_llama, sig, status):
    """SIGTERM ended the server with no word (uvicorn raised it again once stopped), and SIGINT
    said "lmnb: interrupted"; each says now that the server stopped and why, with the status of
    a process the signal ended (128 + its number), which systemd and docker take for a stop."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tiny_llama), "--port", "0",
         "--max-total-tokens", "4096", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        served_url(proc)
        proc.send_signal(sig)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert (proc.returncode, rest) == (status, f"lmnb serve: stopped ({sig.name})\n")


def test_lmnb_serve_stopped_by_sigterm_while_the_model_loads_says_so(tiny_llama):
    """SIGTERM while the model loaded, before the server's own handlers: the process ended with
    143 and no word. (The model's load sends it: the subprocess's Engine is one that does.)"""
    code = ("import os, signal, sys\n"
            "import lmnb_engine\n"
            "from lmnb_kernel import cli\n"
            "class Engine(lmnb_engine.Engine):\n"
            "    def __init__(self, *args, **kwargs):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        super().__init__(*args, **kwargs)\n"
            "lmnb_engine.Engine = Engine\n"
            "sys.exit(cli.main(['serve', '--model', sys.argv[1], '--port', '0']))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_llama)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (143, "lmnb serve: stopped (SIGTERM) before it started serving\n")


# A hold of the start of `lmnb serve`, run as its own process is (``cli.main()``): the import of the
# module named by argv[1] prints "holding" and waits for a line on stdin, catching a Ctrl-C or a
# SIGTERM meanwhile as a library's import may (transformers' lazy imports turn it into another error
# and go on), as a long import (torch's) holds the command where no Python code runs.
_HELD_START = ("import sys\n"
               "held = sys.argv[1]\n"
               "class Hold:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == held:\n"
               "            shown = False\n"
               "            while True:\n"
               "                try:  # (the line too: the signal, sent once it is read, is caught right after it)\n"
               "                    if not shown:\n"
               "                        shown = True\n"
               "                        print('holding', flush=True)\n"
               "                    sys.stdin.readline()\n"
               "                    break\n"
               "                except KeyboardInterrupt:\n"
               "                    pass\n"
               "            print('released', flush=True)\n"
               "        return None\n"
               "sys.meta_path.insert(0, Hold())\n"
               "sys.argv = ['lmnb', 'serve', '--model', 'm', '--port', '0']\n"
               "from lmnb_kernel.cli import main\n"
               "sys.exit(main())\n")


@pytest.mark.parametrize("held", ["lmnb_engine.cli_options", "lmnb_engine.engine"])
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_lmnb_serve_stopped_as_it_starts_exits_at_once_with_its_line(held, sig, status):
    """Ctrl-C a second after `lmnb serve` started took 8.5 s to end it: the KeyboardInterrupt waited
    for the imports (or the load) to finish where a library caught it, then for the interpreter's
    exit after torch; and one during the import of the command's own module, before its handlers,
    ended in a KeyboardInterrupt traceback. Now the process ends at once, with the stop's line and
    status, before the held import is let go (a line on stdin), which the process never sees. Held:
    the command's first import of the engine package, and the engine's (torch's) in serve."""
    proc = subprocess.Popen([sys.executable, "-c", _HELD_START, held], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "holding\n"
        proc.send_signal(sig)
        proc.wait(timeout=60)  # (a guard: a process still held fails here, and is let go below)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate("\n", timeout=60)
    assert (proc.returncode, out, err) == (status, "", f"lmnb serve: stopped ({sig.name}) before it started serving\n")


@pytest.mark.parametrize("phase", ["loading", "serving", "shutting down"])
@pytest.mark.parametrize("name, other, code", [("SIGTERM", "SIGINT", 143), ("SIGINT", "SIGTERM", 130)])
def test_lmnb_serve_stopped_outside_its_server_says_what_it_was_doing(monkeypatch, capsys, phase, name, other, code):
    """A SIGTERM outside the server's own handlers said "before it started serving" however far
    the command had gone: also once the server had stopped (here by the other signal) and the
    engine was shutting down, or between the "serving" line and uvicorn's start; Ctrl-C there
    said "lmnb: interrupted". The signal is sent from the step of that phase (the load, the
    server's making, the engine's shutdown); the exit code is 128 + its number. The engine, once
    loaded, is shut down: one stopped before the server's start was left running."""
    import os
    import types

    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    import lmnb_engine.http_server.app as http_app
    from lmnb_kernel import cli

    monkeypatch.setattr(http_server, "phase", http_server.phase)  # (restored for later tests)

    shut_down = []

    def at(step):
        if step == phase:
            os.kill(os.getpid(), getattr(signal, name))

    class Engine:
        def __init__(self, **kwargs):
            at("loading")

        def shutdown(self):
            shut_down.append(self)
            at("shutting down")

    def make_server(app, stopped, **config):
        at("serving")  # (stopped: the phase's end, which a server calls as it stops, app.Server.run)
        return types.SimpleNamespace(run=lambda sockets: stopped(), stop_signal=getattr(signal, other))

    monkeypatch.setattr(lmnb_engine.engine, "Engine", Engine)
    monkeypatch.setattr(http_server, "create_app", lambda engine, **kwargs: object())
    monkeypatch.setattr(http_app, "Server", make_server)
    assert cli.main(["serve", "--model", "m", "--port", "0"]) == code
    lines = capsys.readouterr().err.splitlines()
    said = {"loading": " before it started serving", "serving": "", "shutting down": " while shutting down"}[phase]
    assert lines[-1] == f"lmnb serve: stopped ({name}){said}"
    served = lines[:-1]  # the "serving" line, once the model has loaded
    assert len(served) == (phase != "loading") and all(s.startswith("lmnb serve: serving m on http://127.0.0.1:")
                                                       for s in served)
    assert len(shut_down) == (phase != "loading")


@pytest.mark.parametrize("name, other, code", [("SIGTERM", "SIGINT", 143), ("SIGINT", "SIGTERM", 130)])
def test_lmnb_serve_signal_as_its_server_gives_the_handlers_back_says_it_came_while_shutting_down(
        monkeypatch, capsys, name, other, code):
    """The server (app.Server), stopped by one signal, gives the handlers from before back as its run
    ends; ``serve`` said "shutting down" only after that run had returned, so a second signal in
    between (main's handler) was said as the one that stopped the server: "lmnb serve: stopped
    (SIGTERM)", where it came while the engine was to shut down. The server now ends the phase
    before it gives the handlers back. The real app.Server runs, its uvicorn run a stand-in that
    stops by the other signal (``handle_exit``, as uvicorn's handler calls it); the second signal
    is sent as the last handler from before is put back."""
    import os
    import types

    import uvicorn

    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    import lmnb_engine.http_server.app as http_app
    from lmnb_kernel import cli

    monkeypatch.setattr(http_server, "phase", http_server.phase)  # (restored for later tests)
    shut_down = []

    class Engine:
        def __init__(self, **kwargs):
            pass

        def shutdown(self):
            shut_down.append(self)

    def stopped_by_the_other(self, sockets=None):
        self.handle_exit(getattr(signal, other), None)

    calls = []

    def set_handler(number, handler):  # Server.run's signal.signal: its 4th call puts back SIGTERM's handler
        previous = signal.signal(number, handler)
        calls.append(number)
        if len(calls) == 4:
            os.kill(os.getpid(), getattr(signal, name))
        return previous

    monkeypatch.setattr(lmnb_engine.engine, "Engine", Engine)
    monkeypatch.setattr(http_server, "create_app", lambda engine, **kwargs: types.SimpleNamespace(
        state=types.SimpleNamespace(ctx=types.SimpleNamespace(engine=engine))))
    monkeypatch.setattr(uvicorn.Server, "run", stopped_by_the_other)
    monkeypatch.setattr(http_app, "signal", types.SimpleNamespace(SIGINT=signal.SIGINT, SIGTERM=signal.SIGTERM,
                                                                  signal=set_handler))
    assert cli.main(["serve", "--model", "m", "--port", "0"]) == code
    assert calls == [signal.SIGINT, signal.SIGTERM] * 2
    assert capsys.readouterr().err.splitlines()[-1] == f"lmnb serve: stopped ({name}) while shutting down"
    assert len(shut_down) == 1


def test_lmnb_serve_stopped_by_sigterm_as_it_starts_after_another_in_process_serve_says_before_serving(
        monkeypatch, capsys):
    """One in-process ``serve`` that returned left its phase "shutting down", and the next one set
    "loading" only after importing the engine and the server: a SIGTERM there (the import of
    torch, on a first call) said "while shutting down". The SIGTERM is sent from that import."""
    import os
    import types

    import lmnb_engine
    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    import lmnb_engine.http_server.app as http_app
    from lmnb_kernel import cli

    monkeypatch.setattr(http_server, "phase", http_server.phase)  # (restored for later tests)

    class Engine:
        def __init__(self, **kwargs):
            pass

        def shutdown(self):
            pass

    monkeypatch.setattr(lmnb_engine.engine, "Engine", Engine)
    monkeypatch.setattr(http_server, "create_app", lambda engine, **kwargs: object())
    monkeypatch.setattr(http_app, "Server", lambda app, stopped, **config: types.SimpleNamespace(
        run=lambda sockets: stopped(), stop_signal=None))
    assert cli.main(["serve", "--model", "m", "--port", "0"]) == 0
    assert http_server.phase == "shutting down"
    lazy = lmnb_engine.__getattr__

    def terminated_while_importing(name):
        if name == "Engine":
            os.kill(os.getpid(), signal.SIGTERM)
        return lazy(name)

    monkeypatch.setattr(lmnb_engine, "__getattr__", terminated_while_importing)
    capsys.readouterr()
    assert cli.main(["serve", "--model", "m", "--port", "0"]) == 143
    assert capsys.readouterr().err == "lmnb serve: stopped (SIGTERM) before it started serving\n"


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_lmnb_serve_signal_that_the_model_load_swallows_still_stops_it(monkeypatch, capsys, sig, status):
    """A SIGTERM or Ctrl-C during the load whose exception a library turns into another
    (transformers' lazy import, cut short, raised ModuleNotFoundError, which the loader reports as
    a config.json it cannot parse) was reported as that load error, exit 2. The fake engine's load
    swallows the signal's KeyboardInterrupt as transformers did and raises the loader's ValueError."""
    import os

    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    from lmnb_kernel import cli

    monkeypatch.setattr(http_server, "phase", http_server.phase)  # (restored for later tests)

    class Engine:
        def __init__(self, **kwargs):
            try:
                os.kill(os.getpid(), sig)
            except KeyboardInterrupt:
                raise ValueError("transformers could not parse config.json") from None

    monkeypatch.setattr(lmnb_engine.engine, "Engine", Engine)
    assert cli.main(["serve", "--model", "m", "--port", "0"]) == status
    assert capsys.readouterr().err == f"lmnb serve: stopped ({sig.name}) before it started serving\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (the caller's handler back)


def test_lmnb_serve_with_a_missing_model_exits_with_a_message(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tmp_path / "nope"), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2 and "lmnb serve:" in out.stderr and "nope" in out.stderr
    out = subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--port", "99999"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == "lmnb serve: --port 99999 is not a TCP port; give 0-65535"


def test_lmnb_serve_refuses_an_unknown_log_level_before_loading():
    # uvicorn knows critical, error, warning, info, debug, trace; any other name used to load the
    # model and then end in uvicorn's KeyError traceback.
    out = subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--log-level", "loud"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "argument --log-level: invalid choice: 'loud'" in out.stderr and "'debug'" in out.stderr


@pytest.mark.parametrize("argv, said", [
    (["rnu"], "lmnb: error: argument COMMAND: invalid choice: 'rnu' (choose from 'run', 'install-kernel', 'serve', "
              "'export'); did you mean 'run'?"),
    (["serve", "--log-level", "debg"], "lmnb serve: error: argument --log-level: invalid choice: 'debg' (choose from "
                                       "'critical', 'error', 'warning', 'info', 'debug', 'trace'); did you mean 'debug'?"),
    (["xyz"], "lmnb: error: argument COMMAND: invalid choice: 'xyz' (choose from 'run', 'install-kernel', 'serve', "
              "'export')"),  # (no close name: none offered)
    # in another case: offered as Run was (difflib, which compares case, found RUN no closer than xyz)
    (["RUN"], "lmnb: error: argument COMMAND: invalid choice: 'RUN' (choose from 'run', 'install-kernel', 'serve', "
              "'export'); did you mean 'run'?"),
    (["Run"], "lmnb: error: argument COMMAND: invalid choice: 'Run' (choose from 'run', 'install-kernel', 'serve', "
              "'export'); did you mean 'run'?"),
])
def test_a_misspelt_subcommand_or_choice_is_offered_the_closest(capsys, argv, said):
    """``lmnb rnu`` got argparse's "invalid choice" alone, where a misspelt option (``--temprature``)
    is offered its closest: the closest choice is offered too, in the words of the Python API's
    offers (suggest.did_you_mean). The reference: the choices are the subcommands and uvicorn's
    log levels, the closest picked by hand."""
    from lmnb_kernel.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(said)


@pytest.mark.parametrize("words, option", [(["--port", "30000", "--port", "99999"], "--port"),
                                           (["--log-level", "info", "--log-level", "debug"], "--log-level"),
                                           (["--model", "a", "--device", "cpu", "--model", "b"], "--model")])
def test_lmnb_serve_refuses_an_option_given_twice_before_loading(capsys, words, option):
    """``--port 30000 --port 0`` served on a free port, silently: argparse kept the last."""
    from lmnb_kernel.cli import main

    with pytest.raises(SystemExit) as e:  # (--port 99999, a bad port, stops a serve that took the repeat)
        main(["serve", "--port", "99999", *words] if option != "--port" else ["serve", *words])
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"lmnb serve: error: {option} is given twice; give it once")


def test_lmnb_serve_names_a_pool_size_that_is_no_whole_number_in_words(capsys):
    """argparse said "argument --max-total-tokens: invalid int value: 'abc'"."""
    from lmnb_kernel.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--max-total-tokens", "4k"])
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(
        "lmnb serve: error: argument --max-total-tokens: must be the KV pool's size as a whole number of tokens "
        "(e.g. 4096), got '4k'")


def test_lmnb_serve_names_a_port_that_is_no_whole_number_in_words(capsys):
    """argparse said "argument --port: invalid int value: 'abc'", where lmnb run --timeout abc
    says what it expects."""
    from lmnb_kernel.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", "abc"])
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(
        "lmnb serve: error: argument --port: must be a TCP port number, 0-65535 (0: a free one), got 'abc'")


@pytest.mark.parametrize("option, text, said", [
    # int() took these as 8080 and 4096 (U+FF18 U+FF10 are fullwidth 8 and 0)
    ("--port", "\uff18\uff10\uff18\uff10", "must be a TCP port number, 0-65535 (0: a free one), got "
                                           "'\uff18\uff10\uff18\uff10'; write it with the digits 0-9 alone (no _, no "
                                           "other script's digits): 8080"),
    ("--max-total-tokens", "4_096", "must be the KV pool's size as a whole number of tokens (e.g. 4096), got '4_096'; "
                                    "write it with the digits 0-9 alone (no _, no other script's digits): 4096"),
])
def test_lmnb_serve_takes_a_number_in_the_digits_0_to_9_alone(capsys, option, text, said):
    """int() read "4_096" (Python's digit separator) and fullwidth or other scripts' digits, so
    lmnb serve took them; they are refused, naming the number to write. (An unknown option follows:
    were the number taken, serve refuses that instead of starting a server that never returns.)"""
    from lmnb_kernel.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", option, text, "--no-such-option"])
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"lmnb serve: error: argument {option}: {said}")


def test_lmnb_serve_on_a_public_host_without_a_key_warns_in_one_line(tmp_path):
    # the warning came from warnings.warn, with the server module's path and its source line
    out = subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--host", "0.0.0.0", "--port", "0",
                          "--model", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2  # (the missing model ends it before it serves)
    assert out.stderr.splitlines()[0] == ("lmnb serve: warning: serving on 0.0.0.0 without --api-key: anyone who "
                                          "can reach it can use the model; add --api-key KEY or set $LMNB_API_KEY")
    assert "UserWarning" not in out.stderr and "http_server" not in out.stderr


def test_lmnb_serve_on_a_port_in_use_says_so_before_loading_the_model():
    # uvicorn found it only after the model had loaded, and exited 3 after its own log lines
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "lmnb_kernel.cli", "serve", "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr == (f"lmnb serve: cannot listen on 127.0.0.1:{port}: the port is in use (another server?); "
                          "choose another --port\n")


def test_lmnb_serve_without_model_loads_lmnb_model_as_load_and_batch_jobs_do(monkeypatch, capsys):
    """`%lm load` and batch jobs read $LMNB_MODEL; `lmnb serve` without --model loaded the demo model."""
    import argparse

    import lmnb_engine.engine
    from lmnb_engine.http_server import serve, serve_arguments

    loaded = []

    def engine(model=None, **kwargs):
        loaded.append(model)
        raise FileNotFoundError(f"no checkpoint at {model}")

    monkeypatch.setattr(lmnb_engine.engine, "Engine", engine)
    monkeypatch.setenv("LMNB_MODEL", "/models/from-env")
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert serve(parser.parse_args(["--port", "0"])) == 2
    assert capsys.readouterr().err == ("lmnb serve: no checkpoint at /models/from-env (the model /models/from-env "
                                       "came from $LMNB_MODEL; --model names another)\n")
    assert serve(parser.parse_args(["--port", "0", "--model", "/models/given"])) == 2
    assert loaded == ["/models/from-env", "/models/given"]
    assert capsys.readouterr().err == "lmnb serve: no checkpoint at /models/given\n"


def test_lmnb_serve_on_a_device_that_is_not_there_names_the_option_to_give(tiny_llama, monkeypatch, capsys):
    """lmnb serve --device cuda without CUDA said "use device='cpu'", the Python API's words."""
    import argparse

    from helpers_model import no_gpu
    from lmnb_engine.http_server import serve, serve_arguments

    no_gpu(monkeypatch)
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert serve(parser.parse_args(["--port", "0", "--model", str(tiny_llama), "--device", "cuda"])) == 2
    assert capsys.readouterr().err == ("lmnb serve: device 'cuda' asked for, but torch sees no CUDA device; "
                                       "use --device cpu, or run on a machine with an NVIDIA GPU\n")


def _serve_failure(capsys, *options) -> str:
    """What ``lmnb serve --port 0 OPTIONS`` says on stderr when its model fails to load (exit 2)."""
    import argparse

    from lmnb_engine.http_server import serve, serve_arguments

    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert serve(parser.parse_args(["--port", "0", "--device", "cpu", *map(str, options)])) == 2
    return capsys.readouterr().err


def test_lmnb_serve_load_errors_name_its_options_not_the_python_apis(tiny_llama, tmp_path, monkeypatch, capsys):
    """They said 'pass max_total_tokens=2 or more', 'pass random_weights=True', 'raise mem_fraction
    or pass max_total_tokens': keyword arguments, and options (--random-weights, --mem-fraction)
    lmnb serve does not have. A pool that cannot hold one gen of lmnb's default max_tokens is
    refused as %lm load refuses it (the server started without a word, and every such request
    failed)."""
    import shutil

    import lmnb_engine.model_runner as model_runner

    from lmnb.ir import DEFAULT_MAX_NEW_TOKENS
    from lmnb_engine import SamplingParams

    assert SamplingParams.max_new_tokens == DEFAULT_MAX_NEW_TOKENS  # (the server's floor, worded as lmnb's)
    # (the least as %lm load names it: the tiny tokenizer's one token of "a" (no BOS), then lmnb's 128
    # but the last sampled, which takes no KV slot)
    for pool in (1, 50, 127):
        assert _serve_failure(capsys, "--model", tiny_llama, "--max-total-tokens", pool) == (
            f"lmnb serve: a KV pool of {pool} token{'s' * (pool > 1)} cannot hold one gen of lmnb's default max_tokens "
            "(128) after a one-character prompt (1 token); pass --max-total-tokens 128 or more\n")
    assert _serve_failure(capsys, "--model", "llama-3-8b") == (
        "lmnb serve: 'llama-3-8b' is a shape preset without weights; give a checkpoint directory or hub id\n")
    pt_only = shutil.copytree(tiny_llama, tmp_path / "pt_only", ignore=shutil.ignore_patterns("*.safetensors"))
    assert _serve_failure(capsys, "--model", pt_only) == (
        f"lmnb serve: no *.safetensors weights in {pt_only} (PyTorch .bin checkpoints are not supported); "
        "re-save it with save_pretrained(safe_serialization=True)\n")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**6)  # (1953 slots of 512 bytes)
    assert _serve_failure(capsys, "--model", tiny_llama, "--max-total-tokens", 10**10) == (
        "lmnb serve: a KV pool of 10000000000 tokens needs 5120000000512 bytes (4768.4 GiB): 512 bytes a token (2 layers x 2 KV "
        "heads x 16 dims x 4-byte float32, K and V), one padding token included; cpu has 1000000 bytes (976.6 KiB) "
        "free; pass --max-total-tokens 1952 or less, or leave --max-total-tokens unset to size the pool from free "
        "memory\n")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    assert _serve_failure(capsys, "--model", tiny_llama) == (
        "lmnb serve: the KV pool's share of free memory on cpu (0.1) leaves room for only 0 KV tokens (512 bytes "
        "each); pass --max-total-tokens, or free some memory\n")


def test_lmnb_serve_without_a_model_or_the_demo_checkpoint_names_its_model_option(tmp_path, monkeypatch, capsys):
    """It said to pass a checkpoint "as `model`", the Python API's argument: lmnb serve's is --model."""
    import lmnb_engine.model_loader as model_loader

    monkeypatch.delenv("LMNB_MODEL", raising=False)
    monkeypatch.setattr(model_loader, "DEMO_MODEL_PATH", tmp_path / "demo_model")
    assert _serve_failure(capsys) == (f"lmnb serve: the demo checkpoint is not built yet ({tmp_path / 'demo_model'} "
                                      "has no config.json); pass a checkpoint directory or hub id as `--model`\n")


def test_the_port_is_bound_before_the_model_loads_and_refuses_connections_until_it_is_served():
    """``lmnb serve`` binds first, so that a bad address is named before the model loads, and
    listens only once it is loaded: meanwhile a client is refused at once (it waited, with no
    answer, for its whole timeout), as by a server not yet started."""
    from lmnb_engine.http_server import bind

    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port > 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
        sock.listen()
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    finally:
        sock.close()


def test_a_server_that_takes_the_port_while_the_model_loads_is_a_clear_exit(monkeypatch, capsys):
    """The port is bound before the load and listened on after it; another server (binding with
    SO_REUSEADDR, as uvicorn does) may begin listening there meanwhile: a one-line exit 2, the
    engine shut down, not a traceback from inside uvicorn."""
    import argparse

    import lmnb_engine.engine
    from lmnb_engine.http_server import serve, serve_arguments

    with socket.socket() as probe:  # a free port, for this test only (the serve under test binds it)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    other, stopped = [], []

    class Engine:
        def __init__(self, model=None, **kwargs):  # the "load": another server takes the port
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            other.append(s)

        def shutdown(self):
            stopped.append(True)

    monkeypatch.setattr(lmnb_engine.engine, "Engine", Engine)
    monkeypatch.setattr("lmnb_engine.http_server.create_app", lambda engine, **kw: object())
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    try:
        assert serve(parser.parse_args(["--port", str(port)])) == 2
    finally:
        for s in other:
            s.close()
    assert stopped == [True]
    assert capsys.readouterr().err == f"lmnb serve: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_lmnb_serve_incremental_streaming_output_reaches_the_app_and_is_off_by_default(monkeypatch):
    import argparse
    import types

    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    import lmnb_engine.http_server.app as http_app
    from helpers_lang import RecordingEngine

    made = []
    monkeypatch.setattr(lmnb_engine.engine, "Engine", lambda **kwargs: RecordingEngine())
    monkeypatch.setattr(http_server, "create_app", lambda engine, **kwargs: made.append(kwargs))
    server = types.SimpleNamespace(run=lambda sockets: None, stop_signal=None)  # (one no signal stopped)
    monkeypatch.setattr(http_app, "Server", lambda app, **config: server)
    parser = argparse.ArgumentParser()
    http_server.serve_arguments(parser)
    for argv, incremental in (([], False), (["--incremental-streaming-output"], True)):
        assert http_server.serve(parser.parse_args(["--port", "0", *argv])) == 0
        assert made[-1]["incremental_streaming_output"] is incremental


@pytest.mark.parametrize("env, argv, key, said", [
    ("s3cret-env", [], "s3cret-env",
     "lmnb serve: asking every request but GET /health for the API key in $LMNB_API_KEY\n"),
    ("s3cret-env", ["--api-key", "s3cret-arg"], "s3cret-arg", ""),
    ("", [], None, ""),  # (an empty variable counts as unset)
    (None, [], None, ""),
])
def test_lmnb_serve_reads_its_api_key_from_lmnb_api_key_when_none_is_given(monkeypatch, capsys, env, argv, key, said):
    """A key given as --api-key shows in ps and the shell's history: serve reads $LMNB_API_KEY, as the
    clients (batch jobs, %lm connect) do, and names the variable, never the key."""
    import argparse
    import types

    import lmnb_engine.engine
    import lmnb_engine.http_server as http_server
    import lmnb_engine.http_server.app as http_app
    from helpers_lang import RecordingEngine

    made = []
    monkeypatch.setattr(lmnb_engine.engine, "Engine", lambda **kwargs: RecordingEngine())
    monkeypatch.setattr(http_server, "create_app", lambda engine, **kwargs: made.append(kwargs))
    server = types.SimpleNamespace(run=lambda sockets: None, stop_signal=None)
    monkeypatch.setattr(http_app, "Server", lambda app, **config: server)
    if env is None:
        monkeypatch.delenv("LMNB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("LMNB_API_KEY", env)
    parser = argparse.ArgumentParser()
    http_server.serve_arguments(parser)
    assert http_server.serve(parser.parse_args(["--port", "0", "--model", "m", *argv])) == 0
    assert made[-1]["api_key"] == key
    err = capsys.readouterr().err
    assert err.startswith(said) and err[len(said):].startswith("lmnb serve: serving m on http://127.0.0.1:")
    assert "s3cret" not in err


def test_lmnb_serve_on_a_public_host_with_the_key_in_lmnb_api_key_does_not_warn(monkeypatch, capsys):
    import argparse

    import lmnb_engine.engine
    from lmnb_engine.http_server import serve, serve_arguments

    def engine(model=None, **kwargs):
        raise FileNotFoundError(f"no checkpoint at {model}")

    monkeypatch.setattr(lmnb_engine.engine, "Engine", engine)
    monkeypatch.setenv("LMNB_API_KEY", "k")
    parser = argparse.ArgumentParser()
    serve_arguments(parser)
    assert serve(parser.parse_args(["--host", "0.0.0.0", "--port", "0", "--model", "/nope"])) == 2
    assert capsys.readouterr().err == ("lmnb serve: asking every request but GET /health for the API key in "
                                       "$LMNB_API_KEY\nlmnb serve: no checkpoint at /nope\n")


def test_lmnb_serve_stopped_by_sigterm_with_requests_in_flight_exits_with_no_traceback(tiny_llama):
    """SIGTERM while a stream ran and another client was halfway through sending its body: the
    stream ends with [DONE] and the process exits 143 (well within 60 s: the body's connection is
    cut off 5 s after the shutdown), saying only that. The cut-off body had been logged as
    "unexpected error serving /generate" with starlette's ClientDisconnect traceback. The body's
    request asks for 100-continue, which uvicorn answers once the route reads the body: then the
    request is surely in the server's hands when the signal comes."""
    import threading

    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "lmnb_kernel.cli", "serve", "--model", str(tiny_llama), "--port", "0",
         "--max-total-tokens", "4096", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list = []
    try:
        url = served_url(proc)
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as half, httpx.stream(
                "POST", url + "/v1/chat/completions", timeout=60,
                json={"model": str(tiny_llama), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,
                      "ignore_eos": True, "stream": True}) as stream:
            half.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n")
            assert half.recv(100).startswith(b"HTTP/1.1 100 Continue")
            half.sendall(b'{"text": "a", ')
            events = stream.iter_lines()
            lines.append(next(events))  # (the stream is running)
            reading = threading.Thread(target=lambda: lines.extend(events))
            reading.start()
            proc.send_signal(signal.SIGTERM)
            rest = proc.communicate(timeout=60)[0]
            reading.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert (proc.returncode, rest) == (143, "cutting off 1 response(s) still open 5 s after the shutdown\n"
                                            "lmnb serve: stopped (SIGTERM)\n")
