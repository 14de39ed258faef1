"""``RuntimeEndpoint.abort`` of a request that has not reached the server yet. The executor names a
request id before its call reaches the backend, and the abort's own post may overtake the request:
an abort then was lost, and the request ran to its end. The abort is now kept for a call that has
not begun, posted again while its request is being sent, and a stream it reaches first is closed."""

from __future__ import annotations

import json
import threading
import time

import pytest

from lmnb.backend.base import BackendError, Prompt

from test_lang_server_responses import PARAMS, endpoint, send, server  # noqa: F401 - fixtures

RESULT = b'{"text": "Hello", "meta_info": {"finish_reason": {"type": "length"}}}'


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_call_whose_id_was_aborted_before_it_began_sends_nothing(server, endpoint):  # noqa: F811
    sent = []

    def answer(h, b):
        sent.append((h.path, b.get("rid")))
        send(h, 200, b'{"success": false}' if h.path == "/abort_request" else RESULT)

    server.answer = answer
    calls = {
        "r1": lambda: endpoint.generate(Prompt("Hi"), PARAMS, "r1"),
        "r2": lambda: list(endpoint.generate_stream(Prompt("Hi"), PARAMS, "r2")),
        "r3": lambda: endpoint.cache_prefix("Hi", "r3"),
        "r4": lambda: endpoint.score_choices(Prompt("Hi"), ["a", "b"], False, "r4"),
    }
    for rid, run in calls.items():
        endpoint.abort(rid)
        with pytest.raises(BackendError) as e:
            run()
        assert str(e.value) == f"POST {server.url}/generate: aborted before it was sent; it was not sent"
    _wait_for(lambda: len(sent) == 4)  # (the abort posts, each from a thread of its own)
    assert sorted(sent) == [("/abort_request", rid) for rid in calls]  # and no /generate
    assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r5")] == ["Hello"]  # another id runs
    assert endpoint._calls == {}


def test_an_abort_stops_every_call_under_its_id(server, endpoint, monkeypatch):  # noqa: F811
    """Two calls sharing a request id, both waiting to send again to a busy server: the second one's
    registration replaced the first's, so the abort reached only the second, and the first went on
    sending for as long as the server was busy."""
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (30.0,))
    tries = []

    def busy(h, b):
        if h.path == "/generate":
            tries.append(b["rid"])
        send(h, 503, b'{"error": "The request queue is full."}')

    server.answer, failed = busy, []
    workers = [threading.Thread(target=lambda: failed.append(pytest.raises(
        BackendError, endpoint.generate, Prompt("Hi"), PARAMS, "r1"))) for _ in range(2)]
    for w in workers:
        w.start()
    _wait_for(lambda: len(tries) == 2)
    endpoint.abort("r1")
    for w in workers:
        w.join(10)
    assert not any(w.is_alive() for w in workers)
    assert [str(f.value) for f in failed] == [f"POST {server.url}/generate: aborted while waiting to send it again "
                                              "to a busy server (HTTP 503)"] * 2
    assert tries == ["r1", "r1"] and endpoint._calls == {}


class LateServer:
    """``/generate`` is received, then held until ``release``, then registered: an abort posted
    before ``release`` is ignored, one posted after it waits for the registration (``honour_aborts``:
    then ends the request at once; else every abort is ignored, as by a server that starts a stream
    before it registers its request). ``release_at_first_abort``: the first abort's post (ignored)
    sets ``release`` itself, so that no thread of the test has to be quick between the posts."""

    def __init__(self, scripted, honour_aborts: bool, release_at_first_abort: bool = False):
        self.received, self.release, self.aborted = threading.Event(), threading.Event(), threading.Event()
        self.registered, self.abort_posts, self.client_left = threading.Event(), 0, threading.Event()
        self.honour_aborts, self.release_at_first_abort = honour_aborts, release_at_first_abort
        scripted.answer = self.answer

    def answer(self, h, b):
        if h.path == "/abort_request":
            self.abort_posts += 1
            if self.release.is_set():
                self.registered.wait(10)  # (released: the request registers at once)
            if self.registered.is_set() and self.honour_aborts:
                self.aborted.set()
            answer = json.dumps({"success": self.registered.is_set()}).encode()
            if self.release_at_first_abort:  # (before the answer: a post after it finds the request released)
                self.release.set()
            send(h, 200, answer)
            return
        self.received.set()
        self.release.wait(10)
        self.registered.set()
        if not b.get("stream"):
            reason = "abort" if self.aborted.wait(10) else "length"
            return send(h, 200, json.dumps({"text": "", "meta_info": {"finish_reason": {"type": reason}}}).encode())
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            for i in range(1, 101):  # 5 s of tokens
                h.wfile.write(b"data: " + json.dumps({"text": "a" * i, "meta_info": {
                    "prompt_tokens": 2, "completion_tokens": i, "finish_reason": None}}).encode() + b"\n\n")
                h.wfile.flush()
                time.sleep(0.05)
            h.wfile.write(b'data: {"text": "", "meta_info": {"finish_reason": {"type": "length"}}}\n\ndata: [DONE]\n\n')
        except OSError:
            self.client_left.set()


def test_an_abort_that_overtakes_its_request_is_posted_again_until_the_request_is_answered(
        server, endpoint, monkeypatch):  # noqa: F811
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "ABORT_REPEAT_S", 0.1)
    # (the first post, which overtook the request, is ignored and lets the request go on: where the
    # test let it go once it saw that post, a loaded machine could hold the test until the other
    # four posts, 0.1 s apart, had all come and been ignored too)
    late, got = LateServer(server, honour_aborts=True, release_at_first_abort=True), []
    worker = threading.Thread(target=lambda: got.extend(endpoint.generate(Prompt("Hi"), PARAMS, "r1")))
    worker.start()
    assert late.received.wait(10)
    endpoint.abort("r1")
    worker.join(10)
    assert not worker.is_alive()
    assert got[0].meta_info["finish_reason"] == {"type": "abort"}  # the server's own abort
    assert 2 <= late.abort_posts <= runtime_endpoint.ABORT_POSTS


@pytest.mark.parametrize("when", ["while it is sent", "after its first event"])
def test_a_stream_an_abort_reaches_before_the_server_does_is_closed_as_aborted(server, endpoint, when):  # noqa: F811
    late, events = LateServer(server, honour_aborts=False), []

    def consume():
        for delta, meta in endpoint.generate_stream(Prompt("Hi"), PARAMS, "r1"):
            events.append((delta, meta))
            if when == "after its first event" and len(events) == 1:
                endpoint.abort("r1")

    worker = threading.Thread(target=consume)
    worker.start()
    assert late.received.wait(10)
    if when == "while it is sent":
        endpoint.abort("r1")
    late.release.set()
    worker.join(10)
    assert not worker.is_alive()
    aborted = {"type": "abort", "message": "the request was aborted"}
    if when == "while it is sent":
        assert events == [("", {"finish_reason": aborted})]
    else:  # the second event's text is dropped; its counts are kept
        assert events == [("a", {"prompt_tokens": 2, "completion_tokens": 1, "finish_reason": None}),
                          ("", {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": aborted})]
    assert late.client_left.wait(5)  # the stream was closed, so that the server stops it


def _scored(texts) -> bytes:
    """Scoring results with a token per character of each text (token i + 1 for its i-th)."""
    def one(text):
        entries = [[None if i == 0 else -0.5, i + 1] for i in range(len(text))]
        return {"text": "", "meta_info": {"prompt_tokens": len(text), "input_token_logprobs": entries}}
    return json.dumps([one(t) for t in texts] if isinstance(texts, list) else one(texts)).encode()


@pytest.mark.parametrize("unconditional", [False, True])
def test_an_abort_stops_a_select_waiting_to_send_its_scoring_again(server, endpoint, monkeypatch,  # noqa: F811
                                                                   unconditional):
    """A select's scoring requests (one batch with a request id per prompt; with unconditional
    likelihood, another with none) went on being sent to a busy server for all of
    RETRY_503_DELAYS_S after the select was aborted: only a request with a single id was stopped."""
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (30.0,))
    busy, batches = threading.Event(), []

    def answer(h, b):
        if h.path == "/abort_request":
            return send(h, 200, b'{"success": false}')
        batches.append(b.get("rid"))
        if "input_ids" in b or (not unconditional and isinstance(b["text"], list)):
            busy.set()
            return send(h, 503, b'{"error": "The request queue is full."}')
        send(h, 200, _scored(b.get("text")))

    server.answer, failed = answer, []
    worker = threading.Thread(target=lambda: failed.append(pytest.raises(
        BackendError, endpoint.score_choices, Prompt("Hi"), ["a", "b"], unconditional, "r1")))
    worker.start()
    assert busy.wait(10)
    endpoint.abort("r1")
    worker.join(10)
    assert not worker.is_alive()
    assert str(failed[0].value) == (f"POST {server.url}/generate: aborted while waiting to send it again to a busy "
                                    "server (HTTP 503)")
    window = ["r1-0", "r1-1", "r1-2"]
    assert batches == (["r1", window, ["r1-0"], ["r1-u0", "r1-u1"]] if unconditional else ["r1", window])
    assert endpoint._calls == {}


def test_an_abort_of_a_select_reaches_its_scoring_requests_on_the_server(server, endpoint):  # noqa: F811
    """Each scoring request has an id of its own ("{rid}-{i}"), which SGLang's /abort_request of
    the select's id does not stop: a long scoring batch ran to its end."""
    scoring, stopped, posted = threading.Event(), threading.Event(), []

    def answer(h, b):
        if h.path == "/abort_request":
            posted.append(b["rid"])
            if b["rid"] == "r1-2":  # (the last one posted)
                stopped.set()
            return send(h, 200, b'{"success": true}')
        if not isinstance(b["text"], list):
            return send(h, 200, _scored(b["text"]))
        scoring.set()
        reason = {"type": "abort", "message": "aborted by the client"} if stopped.wait(10) else None
        send(h, 200, json.dumps([{"text": "", "meta_info": {"finish_reason": reason}}] * 3).encode())

    server.answer, failed = answer, []
    worker = threading.Thread(target=lambda: failed.append(pytest.raises(
        BackendError, endpoint.score_choices, Prompt("Hi"), ["a", "b"], False, "r1")))
    worker.start()
    assert scoring.wait(10)
    endpoint.abort("r1")
    worker.join(10)
    assert not worker.is_alive()
    assert str(failed[0].value) == "scoring on the server was aborted: aborted by the client"
    assert posted[:4] == ["r1", "r1-0", "r1-1", "r1-2"]


def _answer_unless_the_client_leaves(received: threading.Event, outcome: list, wait_s: float, choice: dict,
                                     posts: list | None = None):
    """A stub server's answer to an OpenAI call: set ``received``, then wait up to ``wait_s`` for the
    client to leave (it sends nothing more, so only its leaving ends the wait early); note in
    ``outcome`` which came, and answer with one choice holding ``choice`` if the client stayed.
    With ``posts``, each request's path is noted there."""
    import socket

    def answer(h, b):
        if posts is not None:
            posts.append(h.path)
        received.set()
        h.connection.settimeout(wait_s)
        try:
            left = h.connection.recv(1, socket.MSG_PEEK) == b""
        except socket.timeout:
            left = False
        outcome.append("saw its client leave" if left else "answered")
        if not left:
            send(h, 200, json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop", **choice}]}).encode())

    return answer


@pytest.mark.parametrize("call", ["generate", "select"])
def test_an_aborted_openai_call_that_is_not_streamed_closes_its_connection(server, call):  # noqa: F811
    """lmnb.OpenAI's abort() stopped only streamed calls: a gen or select that was not streamed
    waited for the whole answer, which the server generated (a hosted API billed) to its end."""

    import lmnb

    received, posts, outcome = threading.Event(), [], []
    text = {"text": "Hello"} if call == "select" else {"message": {"role": "assistant", "content": "Hello"}}
    server.answer = _answer_unless_the_client_leaves(received, outcome, 10, text, posts)
    # (max_retries: a call stopped so is not tried again; timeout: longer than the server waits)
    backend = lmnb.OpenAI("m", is_chat_model=call == "generate", base_url=server.url + "/v1", max_retries=2,
                          timeout=30)
    run = {"generate": lambda: backend.generate(Prompt("Hi", messages=[{"role": "user", "content": "Hi"}],
                                                       role="assistant"), PARAMS, "r1"),
           "select": lambda: backend.score_choices(Prompt("Hi"), ["a", "b"], False, "r1")}[call]
    got = []

    def worker_run():
        try:
            got.append(run())
        except BackendError as e:
            got.append(str(e))

    worker = threading.Thread(target=worker_run)
    worker.start()
    assert received.wait(10)
    backend.abort("r1")
    worker.join(30)
    assert not worker.is_alive()
    if call == "generate":
        (completion,) = got[0]
        assert (completion.text, completion.meta_info) == (
            "", {"finish_reason": {"type": "abort", "message": "the request was aborted"}})
    else:
        assert got == [f"{server.url}/v1/completions: the scoring request of select() was aborted"]
    _wait_for(lambda: outcome)
    assert outcome == ["saw its client leave"] and posts == [f"/v1/{'chat/' * (call == 'generate')}completions"]
    backend.shutdown()


def test_a_ctrl_c_that_lands_as_an_openai_call_begins_to_wait_closes_its_connection(server):  # noqa: F811
    """A gen on the main thread (run(use_thread=False), a direct backend.generate) waits for the
    async client's answer; a SIGINT that landed as that wait began was only marked, and Python acted
    on it when the wait ended: once the server had answered, the whole generation billed. The wait
    now wakes every lmnb_engine.waits.MARKED_STOP_POLL_S, and the stop closes the connection."""
    import signal

    import lmnb
    from helpers_lang import interrupt_main_when, main_thread_waits_on_a_future

    received, outcome = threading.Event(), []
    server.answer = _answer_unless_the_client_leaves(received, outcome, 30, {"text": "Hello"})
    backend = lmnb.OpenAI("m", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=60)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupt_main_when(lambda: received.is_set() and main_thread_waits_on_a_future(), marked_only=True):
            with pytest.raises(KeyboardInterrupt):
                backend.generate(Prompt("Hi"), PARAMS, "r1")
    finally:
        signal.signal(signal.SIGINT, previous)
    _wait_for(lambda: outcome, 60)
    assert outcome == ["saw its client leave"] and backend._requests == {}
    backend.shutdown()


@pytest.mark.parametrize("http_client", [False, True], ids=["async", "own-http-client"])
def test_an_openai_call_whose_id_was_aborted_before_it_began_sends_nothing(server, http_client):  # noqa: F811
    """As RuntimeEndpoint's: the executor names a request id before its call reaches the backend,
    and lmnb.OpenAI forgot an abort that came in between, so the call ran to its end."""
    import httpx

    import lmnb

    posts = []

    def answer(h, b):
        posts.append(h.path)
        send(h, 200, json.dumps({"id": "x", "choices": [{"index": 0, "finish_reason": "stop", "text": "Hello"}]}
                                ).encode())

    server.answer = answer
    kw = {"http_client": httpx.Client()} if http_client else {}
    backend = lmnb.OpenAI("m", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, **kw)
    aborted = {"type": "abort", "message": "the request was aborted"}
    backend.abort("r1")
    assert [(c.text, c.meta_info) for c in backend.generate(Prompt("Hi"), PARAMS, "r1")] == [("", {"finish_reason": aborted})]
    backend.abort("r2")
    assert list(backend.generate_stream(Prompt("Hi"), PARAMS, "r2")) == [("", {"finish_reason": aborted})]
    backend.abort("r3")
    with pytest.raises(BackendError, match="the scoring request of select\\(\\) was aborted"):
        backend.score_choices(Prompt("Hi"), ["a", "b"], False, "r3")
    assert posts == []
    assert [c.text for c in backend.generate(Prompt("Hi"), PARAMS, "r4")] == ["Hello"]  # another id runs
    assert posts == ["/v1/completions"] and backend._requests == {}
    backend.shutdown()


def test_an_endpoint_shut_down_while_its_abort_is_being_posted_leaves_no_socket_open(server, monkeypatch):  # noqa: F811
    """The abort's post, from a thread of its own on the endpoint's client, could still be
    connecting when shutdown() closed that client: httpcore's pool, closed, no longer held the
    connection it then made, and its socket was left to the garbage collector ("ResourceWarning:
    unclosed <socket.socket ...>", seen after test_an_abort_stops_every_call_under_its_id).
    shutdown() now waits for an abort post in flight, and no abort is posted after it."""
    import gc
    import warnings

    import httpcore._backends.sync as sync

    import lmnb

    def answer(h, b):
        if h.path == "/generate":  # (and closes its connection: the abort's post needs a new one)
            h.close_connection = True
            h.send_response(200)
            h.send_header("Content-Length", str(len(RESULT)))
            h.send_header("Connection", "close")
            h.end_headers()
            return h.wfile.write(RESULT)
        send(h, 200, b'{"success": true}')

    server.answer = answer
    backend = lmnb.RuntimeEndpoint(server.url, timeout=5)
    assert [c.text for c in backend.generate(Prompt("Hi"), PARAMS, "r0")] == ["Hello"]
    connecting, closed, connect = threading.Event(), threading.Event(), sync.SyncBackend.connect_tcp

    def connect_once_closed(self, *args, **kwargs):  # (the abort's connection is made after close(), if it ran)
        connecting.set()
        closed.wait(1)
        return connect(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncBackend, "connect_tcp", connect_once_closed)
    close = backend.client.close
    monkeypatch.setattr(backend.client, "close", lambda: (close(), closed.set()))
    gc.collect()  # (the earlier tests' garbage, collected before the warnings are recorded: a socket one left)
    backend.abort("r1")
    assert connecting.wait(10)
    (poster,) = [t for t in threading.enumerate() if t.name == "lmnb-abort-r1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        backend.shutdown()
        poster.join(10)
        gc.collect()
    assert not poster.is_alive()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
