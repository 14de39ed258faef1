"""``RuntimeEndpoint`` gives up on a server that takes the connection and never answers: it had no
read timeout, so one wedged server hung a batch job forever. The limit is set by
``RuntimeEndpoint(timeout=)``, ``%lm connect --timeout`` and an exported job's ``--timeout``."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

import lmnb
from lmnb.backend.base import BackendError, BackendUnreachable, Prompt
from lmnb.ir import GenParams

from helpers_lang import serve_http

# The read timeout of a backend whose server answers some requests before it stalls: the stub answers
# at once, but on a loaded machine its thread was seen answering 0.35 s late, so a short timeout failed
# the answer that should come, not the stall. Where the stub stalls it waits on an Event set only as
# the test ends, so this timeout certainly fires there (after these seconds).
PATIENT_S = 5.0


@pytest.fixture
def silent_url():
    """A server that accepts connections (the listen backlog does) and never sends a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def stalling_url():
    """Answers ``/get_model_info``; ``/generate`` stalls (a stream after its first event) until
    the test ends (``release``, set then)."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self._send("application/json", json.dumps({"model_path": "stub"}).encode())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b'data: {"text": "Hel", "meta_info": {}}\n\n')
                self.wfile.flush()
            release.wait(60)

        def _send(self, kind: str, data: bytes):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with serve_http(Handler) as url:
        try:
            yield url
        finally:
            release.set()  # the stalled handlers end before the server shuts down


@pytest.fixture
def read_timeouts(monkeypatch) -> list[tuple[str, float | None]]:
    """The requests sent through httpx, as (path, read timeout in seconds), filled in as they are
    sent: the limit httpx enforces on each (the client's, or the request's own)."""
    sent, real_send = [], httpx.Client.send

    def send(self, request, **kwargs):
        sent.append((request.url.path, request.extensions["timeout"]["read"]))
        return real_send(self, request, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", send)
    return sent


def _read_timeout_error(url: str, seconds: str) -> str:
    return f"the server at {url} sent nothing for {seconds} s (the read timeout); check that it is not stuck"


def test_a_server_that_never_answers_is_a_clear_error_within_the_timeout(silent_url, read_timeouts):
    with pytest.raises(BackendError) as e:
        lmnb.RuntimeEndpoint(silent_url, timeout=0.5)
    assert read_timeouts == [("/get_model_info", 0.5)]  # (the wait httpx gave up, raising the error below)
    message = str(e.value)
    assert message.startswith(f"GET {silent_url}/get_model_info: ")
    assert _read_timeout_error(silent_url, "0.5") in message and "raise the timeout" in message


def test_a_generate_or_a_stream_that_stalls_ends_with_the_same_error(stalling_url):
    backend = lmnb.RuntimeEndpoint(stalling_url, timeout=PATIENT_S)
    params = GenParams(max_new_tokens=4)
    with pytest.raises(BackendError, match="^POST " + stalling_url + "/generate: ") as e:
        backend.generate(Prompt("Hi"), params, "r1")
    assert _read_timeout_error(stalling_url, f"{PATIENT_S:g}") in str(e.value)
    got = []
    with pytest.raises(BackendError, match="^POST " + stalling_url + "/generate stream: ") as e:
        for delta, _ in backend.generate_stream(Prompt("Hi"), params, "r2"):
            got.append(delta)
    assert got == ["Hel"]  # the timeout is per event: the first one came, the second never did
    assert _read_timeout_error(stalling_url, f"{PATIENT_S:g}") in str(e.value)
    backend.shutdown()


def test_a_server_that_went_away_is_named_with_the_fix(stalling_url):
    # a stopped `lmnb serve` failed the next cell with only "ConnectError: [Errno 111] Connection refused"
    backend = lmnb.RuntimeEndpoint(stalling_url)
    # a port nothing listens on, held by this socket (bound, never listening) so that no other process
    # takes it meanwhile
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
        backend.base_url = backend.client.base_url = gone  # (as if the server had stopped)
        # a BackendUnreachable: a batch job's summary then blames the server, not the rows' input
        with pytest.raises(BackendUnreachable, match="^POST " + gone + "/generate stream: nothing answers at ") as e:
            list(backend.generate_stream(Prompt("Hi"), GenParams(max_new_tokens=4), "r1"))
        assert "is the server running, and are the host and port right?" in str(e.value)
        with pytest.raises(BackendUnreachable, match="^GET " + gone + "/get_model_info: nothing answers at "):
            lmnb.RuntimeEndpoint(gone)
    backend.shutdown()


def test_the_default_is_ten_seconds_to_connect_and_ten_minutes_to_answer(stalling_url):
    backend = lmnb.RuntimeEndpoint(stalling_url)
    assert backend.client.timeout == httpx.Timeout(600.0, connect=10.0)
    backend.shutdown()
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="give a positive number of seconds, or None"):
            lmnb.RuntimeEndpoint(stalling_url, timeout=bad)


@pytest.mark.parametrize("url, error, message", [
    ("127.0.0.1:30000", ValueError, "takes the server's http(s) URL, e.g. http://127.0.0.1:30000; got '127.0.0.1:30000'"),
    ("ftp://host:1", ValueError, "takes the server's http(s) URL, e.g. http://HOST:PORT; got 'ftp://host:1'"),
    (30000, TypeError, "takes the server's URL as a string, e.g. 'http://127.0.0.1:30000'; got int"),
    # an empty URL's example was "http://"; a query was kept, the routes' paths put after it
    # ("GET http://127.0.0.1:30000?x=1/get_model_info": a 404 naming the route /)
    ("", ValueError, "takes the server's http(s) URL, e.g. http://HOST:PORT; got ''"),
    ("http://127.0.0.1:30000?x=1", ValueError, "takes the server's root URL, without a query or fragment, e.g. "
                                               "http://127.0.0.1:30000; got 'http://127.0.0.1:30000?x=1'"),
    ("https://h:1/sg/#top", ValueError, "takes the server's root URL, without a query or fragment, e.g. https://h:1; "
                                        "got 'https://h:1/sg/#top'"),
])
def test_a_base_url_that_is_no_http_url_is_refused_naming_the_fix(url, error, message):
    # it came as httpx's UnsupportedProtocol, a failed GET of the model info (an AttributeError for a number)
    with pytest.raises(error) as caught:
        lmnb.RuntimeEndpoint(url)
    assert str(caught.value).endswith(message)


def test_the_jobs_and_the_magics_timeout_option_reach_the_backend(silent_url):
    from lmnb.batch.options import job_parser, make_backend
    from lmnb.template.cell_options import CellLineError, parse_backend_line
    from lmnb_kernel import commands
    from lmnb_kernel.errors import CellError

    parser = job_parser(per_row=False)
    with pytest.raises(BackendError, match="sent nothing for 0.25 s"):
        make_backend(parser.parse_args(["--backend", silent_url, "--timeout", "0.25"]))
    with pytest.raises(ValueError, match="--timeout is for a server backend"):
        make_backend(parser.parse_args(["--timeout", "5"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", silent_url, "--timeout", "0"])

    args = parse_backend_line("connect", [silent_url, "--timeout", "0.25"])
    with pytest.raises(CellError, match=f"could not connect to {silent_url}: .*sent nothing for 0.25 s"):
        commands.connect(args, session=None)  # (it fails before the session is touched)
    with pytest.raises(CellLineError, match="must be a positive number of seconds, got '-2'"):
        parse_backend_line("connect", [silent_url, "--timeout", "-2"])
    with pytest.raises(CellLineError, match="^argument --timeout: must be a positive number of seconds, got 'ten'$"):
        parse_backend_line("connect", [silent_url, "--timeout", "ten"])  # not "invalid positive_seconds value"
    with pytest.raises(CellLineError, match="^argument --timeout: must be a positive number of seconds, got '1_0'; "
                       "write it with the digits 0-9 alone \\(no _, no other script's digits\\): 10.0$"):
        parse_backend_line("connect", [silent_url, "--timeout", "1_0"])  # (float() reads it as 10)


@pytest.fixture
def scripted_stream_url():
    """Answers ``/get_model_info``; ``/generate`` streams ``script[0]``, (seconds to wait, bytes to
    send) pairs, until it ends or the client leaves (``script`` is the list the test fills)."""
    script: list = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            data = json.dumps({"model_path": "stub"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for wait, data in script[0]:
                    time.sleep(wait)
                    self.wfile.write(data)
                    self.wfile.flush()
            except OSError:  # (the client left)
                pass

    with serve_http(Handler) as url:
        yield url, script


def _event(text: str, finish: bool = False) -> bytes:
    meta = {"finish_reason": {"type": "length"} if finish else None}
    return b"data: " + json.dumps({"text": text, "meta_info": meta}).encode() + b"\n\n"


@pytest.mark.parametrize("filler", [b": keep-alive\n\n", b"\n", b"event: ping\n\n", b"x"],
                         ids=["comment", "empty event", "event without data", "a line that never ends"])
def test_a_stream_that_sends_only_keep_alives_times_out_as_a_silent_one(scripted_stream_url, filler):
    """Any byte reset httpx's read timeout: a stalled stream whose server (or a proxy before it)
    sent a keep-alive comment every few seconds never failed; the timeout is now per event."""
    url, script = scripted_stream_url
    backend = lmnb.RuntimeEndpoint(url, timeout=PATIENT_S)
    script.append([(0, _event("Hel"))] + [(0.05, filler)] * 400)  # 20 s of filler, 20 a second
    got, t0 = [], time.monotonic()
    with pytest.raises(BackendError) as e:
        for delta, _ in backend.generate_stream(Prompt("Hi"), GenParams(max_new_tokens=4), "r1"):
            got.append(delta)
    assert time.monotonic() - t0 > PATIENT_S and got == ["Hel"]
    assert str(e.value) == (
        f"POST {url}/generate stream: the server at {url} sent no event for {PATIENT_S:g} s (the read timeout), only "
        "keep-alive comments, empty events or part of a line; check that it is not stuck or overloaded, or raise "
        "the timeout (RuntimeEndpoint(..., timeout=SECONDS); --timeout SECONDS for %lm connect and for an "
        "exported job)")
    backend.shutdown()


def test_a_stream_whose_events_keep_coming_runs_past_the_timeout_all_told(scripted_stream_url):
    # events that keep coming, keep-alives between them, run past the timeout: each event resets it
    # (0.3 s between events, a timeout of PATIENT_S: 0.5 s left a loaded machine 0.2 s to spare)
    url, script = scripted_stream_url
    backend = lmnb.RuntimeEndpoint(url, timeout=PATIENT_S)
    script.append([(0, _event("a"))] + [(0.1, b": keep-alive\n\n"), (0.1, b": keep-alive\n\n"), (0.1, _event("ab"))] * 18)
    script[0] += [(0.1, _event("abc", finish=True))]
    t0 = time.monotonic()
    assert "".join(d for d, _ in backend.generate_stream(Prompt("Hi"), GenParams(max_new_tokens=4), "r1")) == "abc"
    assert time.monotonic() - t0 > PATIENT_S  # (5.5 s of waits in the script: longer than the timeout, all told)
    backend.shutdown()


def test_connecting_to_a_host_that_never_answers_fails_fast_without_a_timeout_given(silent_url, monkeypatch,
                                                                                     read_timeouts):
    """Connecting waited the whole read timeout (600 s by default) for the model info of a host that
    took the connection and never answered: ``%lm connect`` hung the notebook for ten minutes. The
    model info now waits at most MODEL_INFO_TIMEOUT_S (here made short), whatever the read timeout."""
    from lmnb.backend import runtime_endpoint
    from lmnb.template.cell_options import parse_backend_line
    from lmnb_kernel import commands
    from lmnb_kernel.errors import CellError

    monkeypatch.setattr(runtime_endpoint, "MODEL_INFO_TIMEOUT_S", 0.3)
    expected = (f"GET {silent_url}/get_model_info: {silent_url} took the connection but sent no answer within "
                "0.3 s, where an SGLang or lmnb server answers at once; check that the URL is the server's")
    for timeout in ({}, {"timeout": None}, {"timeout": 600.0}):
        with pytest.raises(BackendError) as e:
            lmnb.RuntimeEndpoint(silent_url, **timeout)
        assert str(e.value).startswith(expected) and "MODEL_INFO_TIMEOUT_S" in str(e.value)
    with pytest.raises(CellError) as e:  # %lm connect URL, no --timeout
        commands.connect(parse_backend_line("connect", [silent_url]), session=None)
    assert str(e.value).startswith(f"could not connect to {silent_url}: {expected}")
    # a read timeout shorter than that limit is the one waited, and named as the read timeout
    with pytest.raises(BackendError, match="sent nothing for 0.1 s \\(the read timeout\\)"):
        lmnb.RuntimeEndpoint(silent_url, timeout=0.1)
    # what httpx waited (and gave up, raising the errors above): 0.3 s each, not the read timeout
    assert read_timeouts == [("/get_model_info", 0.3)] * 4 + [("/get_model_info", 0.1)]


def test_generate_keeps_the_long_read_timeout(stalling_url, monkeypatch):
    """Only the model info is asked with the short limit: a gen slower than it is waited for."""
    from lmnb.backend import runtime_endpoint

    backend = lmnb.RuntimeEndpoint(stalling_url, timeout=PATIENT_S)
    # (shortened once connected: the stub's answer to the model info, given 0.2 s, could come late
    # on a loaded machine; the gen below reads the limit as it runs)
    monkeypatch.setattr(runtime_endpoint, "MODEL_INFO_TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=f"sent nothing for {PATIENT_S:g} s \\(the read timeout\\)"):
        backend.generate(Prompt("Hi"), GenParams(max_new_tokens=4), "r1")
    assert time.monotonic() - t0 >= PATIENT_S
    backend.shutdown()


def test_the_backend_docs_give_the_model_info_limit_of_connecting():
    """docs/language.md said a RuntimeEndpoint's connecting takes 10 s and every response waits
    ``timeout``; the model info asked when connecting waits at most MODEL_INFO_TIMEOUT_S (or
    ``timeout``, if less), which it did not say."""
    from pathlib import Path

    from lmnb.backend import runtime_endpoint

    docs = (Path(__file__).resolve().parent.parent / "docs" / "language.md").read_text(encoding="utf-8")
    row = next(line for line in docs.splitlines() if line.startswith("| `RuntimeEndpoint("))
    assert f"model info it asks for: at most {runtime_endpoint.MODEL_INFO_TIMEOUT_S:g} s" in row
