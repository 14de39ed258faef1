"""Both HTTP backends against servers that answer wrongly: each answer the protocol does not allow
(a result of another shape, an event that is not JSON, bytes that are not UTF-8, a stream cut
before its end) is a ``BackendError`` of one line naming the request and the problem, where a
``KeyError``/``TypeError`` escaped, or a cut stream's text passed for the whole output."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable

import pytest

import lmnb
from lmnb.backend.base import BackendError, Prompt
from lmnb.ir import GenParams

from helpers_lang import send, serve_http

PARAMS = GenParams(max_new_tokens=4)
# The read timeout of a backend whose stub server answers (or streams a chunk) before it stalls: the
# stub answers at once, but on a loaded machine its thread was seen answering 0.35 s late, so a short
# timeout failed the answer that should come, not the stall. Where the stub stalls it sends no chunk
# until the client leaves (or an Event the test sets as it ends), so this timeout certainly fires there.
PATIENT_S = 5.0


class Scripted:
    """The script of a local HTTP server (``handler``, served by the ``server`` fixture at
    ``url``): POST answers come from ``self.answer(handler, body)``; GET answers
    ``self.model_info`` (SGLang's ``/get_model_info``)."""

    def __init__(self):
        self.answer: Callable = lambda handler, body: None
        self.model_info = json.dumps({"model_path": "stub"}).encode()
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                send(self, 200, scripted.model_info)

            def do_POST(self):
                scripted.answer(self, json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null"))

        self.handler = Handler
        self.url = ""


def events(handler, items, done: bool = True) -> None:
    """A server-sent event stream of ``items`` (JSON values, or raw bytes), ended by ``[DONE]``
    when ``done``; the body ends when the connection closes."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for item in items:
        handler.wfile.write(item if isinstance(item, bytes) else b"data: " + json.dumps(item).encode() + b"\n\n")
    if done:
        handler.wfile.write(b"data: [DONE]\n\n")
    handler.close_connection = True


@pytest.fixture
def server():
    s = Scripted()
    with serve_http(s.handler) as s.url:
        yield s


@pytest.fixture
def endpoint(server):
    backend = lmnb.RuntimeEndpoint(server.url, timeout=5)
    yield backend
    backend.shutdown()


def _stream(backend) -> list:
    return list(backend.generate_stream(Prompt("Hi"), PARAMS, "r1"))


@pytest.mark.parametrize("info", [b"{}", b"[]", b"null", b'{"model_path": 5}'])
def test_model_info_of_another_shape_is_named(server, info, monkeypatch):
    """A KeyError ('model_path') or TypeError escaped, from the constructor or from a later call.
    The constructor that raises closes the client it made: its connection was left open, to the
    garbage collector's "ResourceWarning: unclosed <socket.socket ...>"."""
    import httpx

    made = []
    monkeypatch.setattr(httpx, "Client", lambda *a, _client=httpx.Client, **kw: made.append(_client(*a, **kw)) or made[-1])
    server.model_info = info
    with pytest.raises(BackendError, match=f"^GET {server.url}/get_model_info returned .*, not SGLang's model info "
                                           "\\(an object with a 'model_path' string\\)"):
        lmnb.RuntimeEndpoint(server.url)
    assert len(made) == 1 and made[0].is_closed


def test_an_endpoint_the_garbage_collector_takes_closes_its_connections(server, monkeypatch):
    """An endpoint never shut down (code written for SGLang's RuntimeEndpoint, which holds no
    connection, shuts none down) that went with a cycle (a program's state, an error's traceback)
    left its pooled connection to the collector: "ResourceWarning: unclosed <socket.socket ...>", in
    whatever test ran when it was collected (the last full CI run's, in test_stop_matcher). Its
    client is closed as the endpoint is collected, but for a forked child's copy of the parent's;
    shutdown closes it as before."""
    import gc
    import warnings

    import httpx

    made = []
    monkeypatch.setattr(httpx, "Client", lambda *a, _client=httpx.Client, **kw: made.append(_client(*a, **kw)) or made[-1])
    backend = lmnb.RuntimeEndpoint(server.url)  # (its model info asked on a pooled connection)
    backend.itself = backend
    gc.collect()  # (the earlier tests' garbage, collected before the warnings are recorded: a socket one left)
    del backend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    assert len(made) == 1 and made[0].is_closed
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    lmnb.RuntimeEndpoint(server.url).shutdown()
    assert len(made) == 2 and made[1].is_closed
    # in a forked child (_after_fork, as os.fork calls it there), the parent's client is not closed
    # as the endpoint is collected: a parent thread may have held its pool's lock at the fork
    backend = lmnb.RuntimeEndpoint(server.url)
    backend._after_fork()
    del backend
    gc.collect()
    assert len(made) == 3 and not made[2].is_closed
    made[2].close()


def test_a_chat_template_that_is_not_a_string_falls_back_to_the_model_paths(server):
    """A non-string chat_template failed every program with jinja's TypeError ("Can't compile non
    template nodes"); like a server that sends none, the template comes from the model path."""
    server.model_info = json.dumps({"model_path": "Qwen/Qwen2.5-0.5B-Instruct", "chat_template": 5}).encode()
    backend = lmnb.RuntimeEndpoint(server.url)
    assert backend.get_chat_template() == lmnb.get_chat_template("qwen")
    backend.shutdown()


@pytest.mark.parametrize("body", [b'{"meta_info": {}}', b"null", b'"Hello"', b'{"text": null}', b'{"text": 5}',
                                  b'{"text": "a", "meta_info": []}', b'[{"text": "a"}, {"meta_info": {}}]'])
def test_a_generate_result_of_another_shape_is_named(server, endpoint, body):
    """A KeyError ('text'), a TypeError or an AttributeError escaped; a null or numeric text passed."""
    server.answer = lambda h, b: send(h, 200, body)
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate returned .*, not SGLang's result \\(an "
                                           f"object with a 'text' string and a 'meta_info' object\\); is "
                                           f"{server.url} an SGLang or lmnb server\\?$"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")


def test_a_generate_with_fewer_results_than_samples_is_named(server, endpoint):
    """n=2 answered with one result gave the program one sample where it asked for two (and none
    at all an IndexError)."""
    for body, count in ((b'{"text": "a", "meta_info": {}}', 1), (b"[]", 0)):
        server.answer = lambda h, b: send(h, 200, body)
        with pytest.raises(BackendError, match=f"^POST {server.url}/generate returned {count} results for n=2$"):
            endpoint.generate(Prompt("Hi"), GenParams(max_new_tokens=4, n=2), "r1")


def test_a_stream_cut_before_its_end_is_an_error_not_a_short_output(server, endpoint):
    """A stream whose connection closed after 'Hel' (no finish reason, no [DONE]) returned 'Hel' as
    if it were the whole output."""
    server.answer = lambda h, b: events(h, [{"text": "Hel", "meta_info": {"finish_reason": None}}], done=False)
    got = []
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate stream ended after 3 characters with no "
                                           "finish reason and no \\[DONE\\]: the connection was cut mid-output"):
        for delta, _ in endpoint.generate_stream(Prompt("Hi"), PARAMS, "r1"):
            got.append(delta)
    assert got == ["Hel"]
    # the last event's finish reason, or [DONE], is a whole stream
    server.answer = lambda h, b: events(h, [{"text": "Hel", "meta_info": {}},
                                           {"text": "Hello", "meta_info": {"finish_reason": {"type": "length"}}}],
                                        done=False)
    assert [d for d, _ in _stream(endpoint)] == ["Hel", "lo"]
    server.answer = lambda h, b: events(h, [{"text": "Hel", "meta_info": {}}])
    assert [d for d, _ in _stream(endpoint)] == ["Hel"]


def _drop(handler, body, reset: bool) -> None:
    """Close the request's connection without an answer: with a reset (SO_LINGER 0: a server that
    shut down while the request came, its client's ReadError), or as a plain close (a crash before
    the answer, its client's RemoteProtocolError 'Server disconnected ...')."""
    import socket
    import struct

    if reset:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()  # (now: the server's own close would shut the sending side first)
    handler.close_connection = True


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_connection_the_server_drops_before_answering_says_what_to_do(server, endpoint, reset, stream):
    """A server stopped while a run_batch's requests were in flight failed some rows with only
    "POST URL/generate failed: ReadError: [Errno 104] Connection reset by peer" (no cause, no fix);
    a dropped connection now says the server stopped or crashed, and to check it and run the call
    again, for a whole answer and a stream alike."""
    server.answer = lambda h, b: _drop(h, b, reset)
    kind = "ReadError" if reset else "RemoteProtocolError"
    what = f"POST {server.url}/generate" + (" stream" if stream else "")
    with pytest.raises(BackendError, match=f"^{what}: the server at {server.url} dropped the "
                                           f"connection before its answer was complete \\({kind}: .*\\); it stopped, "
                                           "restarted or crashed \\(see its log\\), or is no HTTP server: check "
                                           "that it runs at that URL, then run the call again$"):
        if stream:
            _stream(endpoint)
        else:
            endpoint.generate(Prompt("Hi"), PARAMS, "r1")


def test_a_stream_of_disjoint_pieces_is_refused_not_garbled(server, endpoint):
    """A server streaming each piece alone (not the whole text so far) lost text: 'He', 'llo' read
    as cumulative gave 'He' and then nothing."""
    server.answer = lambda h, b: events(h, [{"text": "He", "meta_info": {}}, {"text": "llo", "meta_info": {}}])
    with pytest.raises(BackendError, match=r"stream sent 'llo' after 'He', which does not continue it: SGLang's "
                                           r"stream carries the whole text so far"):
        _stream(endpoint)


@pytest.mark.parametrize("event, problem", [(b"data: {oops\n\n", "sent an event that is not JSON: '{oops'"),
                                            (b"data: [1, 2]\n\n", r"returned \[1, 2\], not SGLang's result"),
                                            (b'data: {"meta_info": {}}\n\n', "returned .*, not SGLang's result")])
def test_a_stream_event_of_another_shape_is_named(server, endpoint, event, problem):
    """A JSONDecodeError, TypeError or KeyError escaped."""
    server.answer = lambda h, b: events(h, [event])
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate stream {problem}"):
        _stream(endpoint)


def test_bytes_that_are_not_utf8_are_named_not_replaced(server, endpoint):
    """A streamed event's invalid byte became U+FFFD in the output; a response's was called
    'non-JSON'."""
    server.answer = lambda h, b: events(h, [b'data: {"text": "a\xff", "meta_info": {}}\n\n'])
    with pytest.raises(BackendError, match=r"stream sent a line that is not UTF-8 \(byte 17: b'\\xff'\)"):
        _stream(endpoint)
    server.answer = lambda h, b: send(h, 200, b'{"text": "a\xff", "meta_info": {}}')
    with pytest.raises(BackendError, match=r"returned a body that is not UTF-8 \(byte 11: b'\\xff'\)"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")


def test_a_lone_surrogate_is_named_where_it_comes_in(server, endpoint):
    """'a\\ud800' (valid JSON, no UTF-8 text) was taken as output, and the program's next request
    failed with UnicodeEncodeError, blamed on the gen after it."""
    server.answer = lambda h, b: send(h, 200, b'{"text": "a\\ud800", "meta_info": {}}')
    with pytest.raises(BackendError, match=r"^POST .*/generate returned text with the lone surrogate '\\ud800' "
                                           r"\(a JSON \\u escape that no UTF-8 text holds\) after 'a'$"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")
    server.answer = lambda h, b: events(h, [b'data: {"text": "a\\ud800", "meta_info": {}}\n\n'])
    with pytest.raises(BackendError, match=r"^POST .*/generate stream returned text with the lone surrogate"):
        _stream(endpoint)


def test_a_redirect_is_named_with_where_it_points(server, endpoint):
    """A redirect (http to https behind a proxy) was reported as "returned non-JSON: ''"."""
    def redirect(h, b):
        h.send_response(308)
        h.send_header("Location", "https://models.example/generate")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server.answer = redirect
    for call in (lambda: endpoint.generate(Prompt("Hi"), PARAMS, "r1"), lambda: _stream(endpoint)):
        with pytest.raises(BackendError, match=r"/generate( stream)?: HTTP 308, a redirect to "
                                               r"'https://models.example/generate'; give RuntimeEndpoint the server's "
                                               r"own root URL"):
            call()


def test_flush_cache_takes_sglangs_plain_text_answer(server, endpoint):
    """SGLang answers /flush_cache with plain text ("Cache flushed.\\n..."), which failed as
    "returned non-JSON" though the cache was flushed."""
    flushed = b"Cache flushed.\nPlease check backend logs for more details.\n"
    server.answer = lambda h, b: send(h, 200, flushed, "text/plain") if h.path == "/flush_cache" else None
    assert endpoint.flush_cache() is True
    server.answer = lambda h, b: send(h, 400, b"Flush cache failed.\n", "text/plain")
    with pytest.raises(BackendError, match=f"^POST {server.url}/flush_cache: HTTP 400: Flush cache failed."):
        endpoint.flush_cache()


def test_a_select_without_prompt_logprobs_is_named(server, endpoint):
    """A server that returns no input_token_logprobs failed select() with KeyError('input_token_logprobs')."""
    server.answer = lambda h, b: send(h, 200, json.dumps(
        [{"text": "", "meta_info": {"prompt_tokens": 3}}] * len(b["text"]) if isinstance(b["text"], list)
        else {"text": "", "meta_info": {"prompt_tokens": 3}}).encode())
    with pytest.raises(BackendError, match=r"^the server returned no input_token_logprobs \(\[logprob, token id"):
        endpoint.score_choices(Prompt("Hi"), ["a", "b"], False, "r1")


def test_a_select_scored_with_fewer_results_than_prompts_is_named(server, endpoint):
    """Scoring two choices answered with two results (of three prompts) was misread: the error
    blamed choice 'a' as leaving no token to score (one result fewer: an IndexError)."""
    def answer(h, b):
        scored = {"text": "", "meta_info": {"prompt_tokens": 2, "input_token_logprobs": [[None, 1], [-0.5, 2]]}}
        send(h, 200, json.dumps([scored] * 2 if isinstance(b["text"], list) else scored).encode())

    server.answer = answer
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate returned 2 results for 3 prompts$"):
        endpoint.score_choices(Prompt("Hi"), ["a", "b"], False, "r1")



def test_an_abort_does_not_wait_for_a_wedged_server(server, endpoint):
    """abort() posted /abort_request on the caller's thread and waited up to 5 s for it: aborting a
    state with many requests in flight on a stuck server took 5 s per request."""
    release, calls = threading.Event(), []

    def post(path, **kwargs):
        calls.append((path, kwargs["json"], threading.current_thread() is threading.main_thread()))
        release.wait(10)  # (a server that does not answer)

    endpoint.client.post = post
    for rid in ("r1", "r2"):
        endpoint.abort(rid)
    assert not release.is_set()  # (both returned while their posts wait)
    for _ in range(1000):  # (each went out from a thread of its own)
        if len(calls) == 2:
            break
        threading.Event().wait(0.01)
    release.set()
    assert sorted(calls, key=str) == [("/abort_request", {"rid": "r1"}, False), ("/abort_request", {"rid": "r2"}, False)]


def _record_retry_waits(monkeypatch) -> list[tuple[float, bool]]:
    """The waits between a busy server's 503 and the request sent again, as (seconds asked, woken by
    an abort), filled in as the backend waits: ``_send`` waits on its call's ``aborted`` Event with
    ``lmnb_engine.waits.sliced_wait`` (imported as it runs), whose calls are recorded."""
    from lmnb_engine import waits as waits_module

    waits, real = [], waits_module.sliced_wait

    def recorded(wait, timeout=None):
        woken = real(wait, timeout)
        waits.append((timeout, woken))
        return woken

    monkeypatch.setattr(waits_module, "sliced_wait", recorded)
    return waits


def test_a_busy_server_is_asked_again_a_few_times_then_named(server, endpoint, monkeypatch):
    """SGLang answers HTTP 503 when its queue is full, lmnb serve when its grammar compiler is busy:
    the request failed at once, with no word of what to do; it is now sent again, up to 4 times,
    after each of RETRY_503_DELAYS_S (or the server's Retry-After), streamed or not."""
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (0.01, 0.02, 0.03, 0.04))
    tries = []

    def busy_then(answer, busy: int, **headers):
        def respond(h, b):
            tries.append(b["rid"])
            if len(tries) > busy:
                return answer(h, b)
            full = b'{"error": "The request queue is full."}'
            h.send_response(503)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(full)), **headers}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(full)
        return respond

    result = b'{"text": "Hello", "meta_info": {"finish_reason": {"type": "length"}}}'
    server.answer = busy_then(lambda h, b: send(h, 200, result), busy=4)
    assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["Hello"]
    assert tries == ["r1"] * 5  # (the same request id: the server refused the request, so none is running)
    tries.clear()
    server.answer = busy_then(lambda h, b: events(h, [{"text": "Hel", "meta_info": {}}]), busy=2)
    assert [d for d, _ in _stream(endpoint)] == ["Hel"] and len(tries) == 3
    tries.clear()
    server.answer = busy_then(lambda h, b: send(h, 200, result), busy=5)
    busy = ("HTTP 503: The request queue is full.; the server is overloaded or not ready yet (it answered 503 to 5 "
            "tries in a row): run it again later, or send it fewer requests at once")
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate: {re.escape(busy)}$"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")
    assert len(tries) == 5
    tries.clear()
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate: {re.escape(busy)}$"):
        _stream(endpoint)
    assert len(tries) == 5
    # the server's Retry-After is waited instead of the next delay; other errors are not sent again
    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (30.0,))
    tries.clear()
    waits = _record_retry_waits(monkeypatch)
    server.answer = busy_then(lambda h, b: send(h, 200, result), busy=1, **{"Retry-After": "0"})
    assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["Hello"]
    assert len(tries) == 2 and waits == [(0.0, False)]  # the server's 0 s, not the 30 s delay
    tries.clear()
    server.answer = lambda h, b: (tries.append(b["rid"]), send(h, 500, b'{"error": "boom"}'))
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate: HTTP 500: boom$"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")
    assert tries == ["r1"]


def test_a_request_aborted_while_it_waits_for_a_busy_server_is_not_sent_again(server, endpoint, monkeypatch):
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (30.0,))
    tried = threading.Event()

    def busy(h, b):
        if h.path == "/generate":
            tried.set()
        send(h, 503, b'{"error": "The request queue is full."}')

    server.answer, failed, waits = busy, [], _record_retry_waits(monkeypatch)
    worker = threading.Thread(target=lambda: failed.append(pytest.raises(BackendError, endpoint.generate,
                                                                         Prompt("Hi"), PARAMS, "r1")))
    worker.start()
    assert tried.wait(60)
    endpoint.abort("r1")
    worker.join(60)
    assert not worker.is_alive() and waits == [(30.0, True)]  # the abort ended the 30 s wait
    assert str(failed[0].value) == (f"POST {server.url}/generate: aborted while waiting to send it again to a busy "
                                    "server (HTTP 503)")
    assert endpoint._calls == {}


def test_a_ctrl_c_that_lands_as_the_wait_for_a_busy_server_begins_stops_it_at_once(server, endpoint, monkeypatch):
    """A request made on the main thread (flush_cache: %lm flush; the model info of the
    constructor: %lm connect) that the server answered 503 waits, before it is sent again, up to
    the next of RETRY_503_DELAYS_S (or a Retry-After of up to RETRY_AFTER_MAX_S). A Ctrl-C that
    landed as that wait began was only marked, and Python acted on it when the wait ended (here
    60 s later). The wait is now sliced (lmnb_engine.waits): the Ctrl-C stops it at once, and the
    request is not sent again."""
    import signal

    from helpers_lang import called_from, in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (60.0,))
    tries = []
    server.answer = lambda h, b: (tries.append(h.path), send(h, 503, b'{"error": "The request queue is full."}'))
    waits_to_retry = lambda: tries and main_thread_blocked_in(  # noqa: E731
        lambda stack: in_a_threading_wait(stack) and called_from(stack, "_send", runtime_endpoint.__file__))
    half_way = threading.Event()
    timer = threading.Timer(30, half_way.set)  # (half of the wait: set long before an old wait let the Ctrl-C act)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        with interrupt_main_when(waits_to_retry, marked_only=True):
            with pytest.raises(KeyboardInterrupt):
                endpoint.flush_cache()
        assert not half_way.is_set()  # stopped long before the wait's end
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert tries == ["/flush_cache"]  # (not sent again)
    server.answer = lambda h, b: (tries.append(h.path), send(h, 200, b""))
    assert endpoint.flush_cache() is True and tries == ["/flush_cache"] * 2


# --- the OpenAI-compatible backend ------------------------------------------------------------

CHAT = Prompt("Hi", messages=[{"role": "user", "content": "Hi"}], role="assistant")


def _chunk(content=None, finish=None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}]}


@pytest.fixture
def chat(server):
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)
    yield backend
    backend.shutdown()


USAGE = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


@pytest.mark.parametrize("finish_apart", [False, True], ids=["with the last text", "in a chunk of its own"])
def test_text_async_iter_with_meta_data_says_the_finish_reason_once(server, chat, finish_apart):
    """The OpenAI API's usage comes in a chunk after the last text: where that text carried the
    finish reason, the stream ended with an extra ("", meta) carrying it again, so a consumer
    that acts on the finish reason acted twice. It ends the stream once, with the gen's final
    meta info (the usage too): the last text, held for it, or an extra chunk where the finish
    reason came with no text. (The server sends the usage once the text with the finish
    reason was read, or 2 s on: that text is held.)"""
    import asyncio

    read = [threading.Event(), threading.Event()]  # the consumer has read chunk 1, 2

    def answer(h, b):  # each of the first two chunks read before the next is sent: none run together
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        second = _chunk("llo") if finish_apart else _chunk("llo", finish="stop")
        rest = [_chunk(finish="stop"), USAGE] if finish_apart else [USAGE]
        for items, wait in (([_chunk("He")], read[0]), ([second], read[1]), (rest, None)):
            h.wfile.write(b"".join(b"data: " + json.dumps(item).encode() + b"\n\n" for item in items))
            h.wfile.flush()
            if wait is not None:  # (the text that came with the finish reason is held for the usage)
                wait.wait(10 if finish_apart or wait is read[0] else 2)
        h.wfile.write(b"data: [DONE]\n\n")

    server.answer = answer

    @lmnb.function
    def prog(s):
        s += lmnb.user("Hi")
        s += lmnb.assistant(lmnb.gen("x", max_tokens=4))

    async def pairs(st):
        got = []
        async for c, m in st.text_async_iter("x", return_meta_data=True):
            got.append((c, m))
            if len(got) <= 2:
                read[len(got) - 1].set()
        return got

    st = prog.run(backend=chat, stream=True)
    ends = [("llo", None), ("", {"type": "stop"})] if finish_apart else [("llo", {"type": "stop"})]
    got = asyncio.run(pairs(st))
    assert [(c, m["finish_reason"]) for c, m in got] == [("He", None), *ends]
    assert got[-1][1] == st.get_meta_info("x") and got[-1][1]["completion_tokens"] == 2  # (the usage too)
    meta = st.get_meta_info("x")
    assert (meta["finish_reason"], meta["completion_tokens"]) == ({"type": "stop"}, 2)


@pytest.mark.parametrize("body", [b"{}", b'{"id": "x", "choices": null}', b"null", b'"Hello"',
                                  b'{"id": "x", "choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}',
                                  b'{"id": "x", "choices": [{"index": 0, "message": {"content": 5}}]}'])
def test_an_openai_response_of_another_shape_is_named(server, chat, body):
    """A TypeError ('NoneType' object is not iterable) or AttributeError escaped; a numeric content passed."""
    server.answer = lambda h, b: send(h, 200, body)
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions returned .*, not an OpenAI response \\(a 'choices' "
                                           "list, each with a 'message.content' string\\); is it an OpenAI-compatible"):
        chat.generate(CHAT, PARAMS, "r1")


def test_an_openai_response_with_too_few_choices_is_named(server, chat):
    """No choice at all returned an empty list, and the program failed with an IndexError."""
    server.answer = lambda h, b: send(h, 200, b'{"id": "x", "choices": []}')
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions returned 0 choices for n=1$"):
        chat.generate(CHAT, PARAMS, "r1")


def test_openai_backends_run_their_calls_that_are_not_streamed_on_one_shared_thread(server):
    """Each lmnb.OpenAI backend that made a call that was not streamed kept an event-loop thread
    of its own until its shutdown(): a notebook that made many backends had as many threads."""
    reply = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "Hello"}}]}
    server.answer = lambda h, b: send(h, 200, json.dumps(reply).encode())
    backends = [lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5) for _ in range(3)]
    for backend in backends:
        assert [c.text for c in backend.generate(CHAT, PARAMS, "r1")] == ["Hello"]
    assert len([t for t in threading.enumerate() if t.name == "lmnb-openai"]) == 1
    backends[0].shutdown()  # (the loop runs on for the others)
    assert [c.text for c in backends[1].generate(CHAT, PARAMS, "r2")] == ["Hello"]
    for backend in backends[1:]:
        backend.shutdown()


def test_an_openai_backend_dropped_without_shutdown_closes_its_connection(server):
    """A backend dropped without shutdown() left its keep-alive connection to the garbage
    collector, which warned "unclosed transport" and "unclosed socket" (ResourceWarning), and the
    server kept the connection open; its finalizer closes it now. The server's side of the
    connection ends once the client closes it."""
    import gc
    import warnings

    reply = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "Hello"}}]}
    server.answer = lambda h, b: send(h, 200, json.dumps(reply).encode())
    closed = threading.Event()
    finish = server.handler.finish

    def finished(handler):  # (the handler's connection ended: the client closed it)
        closed.set()
        finish(handler)

    server.handler.finish = finished
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)
    assert [c.text for c in backend.generate(CHAT, PARAMS, "r1")] == ["Hello"]  # (on a kept-alive connection)
    assert not closed.is_set()
    gc.collect()  # (the earlier tests' garbage, collected before the warnings are recorded: a socket one left)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del backend
        gc.collect()
        assert closed.wait(30)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def _runs_in_a_forked_child(call) -> None:
    """Run ``call`` in a process made by os.fork (multiprocessing's "fork" start method), which
    must end with exit status 0 (an assertion failing there ends it with 1)."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=call)
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0


def test_the_shared_openai_event_loop_starts_again_in_a_forked_process(server):
    """A process made by os.fork has no thread running its parent's loop: a call there waited forever."""
    reply = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "Hello"}}]}
    server.answer = lambda h, b: send(h, 200, json.dumps(reply).encode())

    def call():
        backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)
        assert [c.text for c in backend.generate(CHAT, PARAMS, "r1")] == ["Hello"]
        backend.shutdown()

    call()  # (the parent's loop runs)
    _runs_in_a_forked_child(call)


def test_openai_backends_count_token_usage_as_sglangs_do(server):
    # SGLang's examples (openai_chat_speculative.py) call backend.token_usage.reset() and read its
    # prompt_tokens / completion_tokens: an AttributeError on lmnb.OpenAI
    def answer(handler, body):
        usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
        if body.get("stream"):
            events(handler, [_chunk("He"), _chunk("llo", "stop"),
                             {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                              "choices": [], "usage": {**usage, "prompt_tokens": 5}}])
        elif body["messages"][-1]["content"] == "no usage":
            send(handler, 200, json.dumps({"id": "x", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}]}).encode())
        else:
            send(handler, 200, json.dumps({"id": "x", "usage": usage, "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}]}).encode())

    server.answer = answer
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)

    @lmnb.function
    def prog(s, question):
        s += lmnb.user(question)
        s += lmnb.assistant(lmnb.gen("a", max_tokens=4))
        s += lmnb.user(question)
        s += lmnb.assistant(lmnb.gen("b", max_tokens=4))

    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (0, 0)
    prog.run("Q", backend=backend)
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (14, 4)
    prog.run("no usage", backend=backend)  # (an answer without usage adds nothing)
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (14, 4)
    backend.token_usage.reset()
    assert "".join(prog.run("Q", backend=backend, stream=True).text_iter("b")) == "Hello"
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (10, 4)
    backend.shutdown()
    # select's scoring request (a completion model's echoed prompts) counts too
    completion = lmnb.OpenAI("m", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    rows = [{"index": i, "text": t, "finish_reason": "length", "logprobs": {
        "tokens": list(t), "token_logprobs": [None] + [-1.0] * (len(t) - 1), "top_logprobs": None, "text_offset": []}}
        for i, t in enumerate(("Hi", "Hia", "Hib"))]
    server.answer = lambda h, b: send(h, 200, json.dumps({
        "id": "x", "choices": rows, "usage": {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8}}).encode())
    completion.score_choices(Prompt("Hi"), ["a", "b"], False, "r1")
    assert (completion.token_usage.prompt_tokens, completion.token_usage.completion_tokens) == (8, 0)
    completion.shutdown()


def test_an_openai_backend_made_before_a_fork_works_in_the_child_and_still_in_the_parent(server):
    """A backend made before os.fork (multiprocessing's "fork" start method) failed in the child:
    its async client's pooled connection was bound to the parent's event loop ("bound to a
    different event loop"), and its pooled sockets were the parent's."""
    reply = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "Hello"}}]}

    def answer(handler, body):
        if body.get("stream"):
            events(handler, [_chunk("He"), _chunk("llo", "stop")])
        else:
            send(handler, 200, json.dumps(reply).encode())

    server.answer = answer
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)

    def call():
        assert [c.text for c in backend.generate(CHAT, PARAMS, "r1")] == ["Hello"]
        assert "".join(d for d, _ in backend.generate_stream(CHAT, PARAMS, "r2")) == "Hello"

    call()  # (the parent's clients now hold a pooled connection)
    _runs_in_a_forked_child(call)
    call()
    backend.shutdown()


def test_an_openai_backend_unused_in_a_forked_child_makes_no_client_there_to_shut_down(server, monkeypatch):
    """shutdown() in a process made by os.fork, where the backend had made no client of its own,
    made both (the blocking one and its async twin) only to close the first."""
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)

    def call():
        opened = []
        real_open = backend._open_clients
        monkeypatch.setattr(backend, "_open_clients", lambda: opened.append(1) or real_open())
        backend.shutdown()
        assert opened == []

    _runs_in_a_forked_child(call)
    backend.shutdown()  # (the parent's clients, made with the backend, are closed as before)
    assert backend.client.is_closed()


def test_a_runtime_endpoint_made_before_a_fork_has_connections_of_its_own_in_the_child(server):
    """A RuntimeEndpoint made before os.fork sent the child's requests on the parent's pooled
    connection: one socket shared by two processes, whose requests and answers could interleave."""
    ports = []  # the client port of each /generate request: one per connection

    def answer(handler, body):
        ports.append(handler.client_address[1])
        send(handler, 200, b'{"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}')

    server.answer = answer
    endpoint = lmnb.RuntimeEndpoint(server.url, timeout=5)

    def call():
        assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["ok"]

    call()
    _runs_in_a_forked_child(call)
    call()
    endpoint.shutdown()
    assert len(ports) == 3 and ports[0] == ports[2] != ports[1]


def test_a_schema_above_the_engines_regex_limit_reaches_an_openai_api_and_an_sglang_server(server):
    """Arrays nested 20 deep: the in-process engine's regex of them would write the innermost
    schema 2**21 - 1 times, above its limit of 2**18 (its own refusal: test_constrained_compile),
    but their JSON text is 61 values, legal JSON Schema that an OpenAI-compatible API or an SGLang
    server compiles with its own library. gen() refused it by the engine's limit whatever the
    backend; it is sent as written."""
    schema = {"type": "integer"}
    for _ in range(20):
        schema = {"type": "array", "items": schema}
    bodies = []

    def answer(handler, body):
        bodies.append(body)
        if "messages" in body:
            send(handler, 200, json.dumps({"id": "x", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "[]"}}]}).encode())
        else:
            send(handler, 200, json.dumps({"text": "[]", "meta_info": {"finish_reason": {"type": "stop"}}}).encode())

    server.answer = answer
    from lmnb.template import parse  # a %%lm cell, which may run on such a backend, takes it too

    assert parse("{gen a json_schema=" + json.dumps(schema) + "}")

    @lmnb.function
    def prog(s):
        s += lmnb.user("A list?")
        s += lmnb.assistant(lmnb.gen("a", max_tokens=8, json_schema=schema))

    chat = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=5)
    endpoint = lmnb.RuntimeEndpoint(server.url, timeout=5)
    try:
        assert prog.run(backend=chat)["a"] == "[]"
        assert bodies[-1]["response_format"]["json_schema"]["schema"] == schema
        assert prog.run(backend=endpoint)["a"] == "[]"
        sent = bodies[-1]["sampling_params"]["json_schema"]  # (SGLang's json_schema is a string)
        assert isinstance(sent, str) and json.loads(sent) == schema
    finally:
        chat.shutdown()
        endpoint.shutdown()


@pytest.mark.parametrize("body, problem", [(b'{"id": "x", "choi', "JSONDecodeError"),
                                           (b'{"id": "x\xff", "choices": []}', "UnicodeDecodeError")])
def test_an_openai_body_that_is_not_utf8_json_is_named(server, chat, body, problem):
    """The client's JSONDecodeError / UnicodeDecodeError escaped bare."""
    server.answer = lambda h, b: send(h, 200, body)
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions returned a body that is not UTF-8 JSON \\({problem}: "):
        chat.generate(CHAT, PARAMS, "r1")


def test_an_openai_error_page_is_quoted(server, chat):
    """An HTTP 500 with an HTML body said only 'Error code: 500'."""
    server.answer = lambda h, b: send(h, 500, b"<html>Proxy: upstream down</html>", "text/html")
    with pytest.raises(BackendError, match=r"HTTP 500: Error code: 500: <html>Proxy: upstream down</html>$"):
        chat.generate(CHAT, PARAMS, "r1")


def test_an_openai_stream_cut_before_its_finish_reason_is_an_error(server, chat):
    """A stream whose connection closed after 'He' returned 'He' as the whole output."""
    server.answer = lambda h, b: events(h, [_chunk("He")], done=False)
    got = []
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions stream ended after 2 characters with no finish "
                                           "reason: the connection was cut mid-output"):
        for delta, _ in chat.generate_stream(CHAT, PARAMS, "r1"):
            got.append(delta)
    assert got == ["He"]
    server.answer = lambda h, b: events(h, [_chunk("He"), _chunk("llo", "length")], done=False)
    assert [d for d, _ in chat.generate_stream(CHAT, PARAMS, "r1")] == ["He", "llo", ""]


@pytest.mark.parametrize("event, problem", [
    (b"data: {oops\n\n", "sent an event that is not UTF-8 JSON \\(JSONDecodeError: "),
    (b'data: {"id": "c\xff", "choices": []}\n\n', "sent an event that is not UTF-8 JSON \\(UnicodeDecodeError: "),
    (b"data: [1, 2]\n\n", "sent \\[1, 2\\], not an OpenAI stream chunk")])
def test_an_openai_stream_event_of_another_shape_is_named(server, chat, event, problem):
    """A JSONDecodeError, UnicodeDecodeError or AttributeError escaped."""
    server.answer = lambda h, b: events(h, [event])
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions stream {problem}"):
        list(chat.generate_stream(CHAT, PARAMS, "r1"))


def test_an_openai_lone_surrogate_is_named_where_it_comes_in(server, chat):
    """As for RuntimeEndpoint: the next request failed with UnicodeEncodeError."""
    body = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "a\ud800"},
                                    "finish_reason": "stop"}]}
    server.answer = lambda h, b: send(h, 200, json.dumps(body).encode())
    with pytest.raises(BackendError, match=r"/v1/chat/completions returned text with the lone surrogate '\\ud800'"):
        chat.generate(CHAT, PARAMS, "r1")
    server.answer = lambda h, b: events(h, [_chunk("a\ud800", "stop")])
    with pytest.raises(BackendError, match=r"/v1/chat/completions stream returned text with the lone surrogate '\\ud800'"):
        list(chat.generate_stream(CHAT, PARAMS, "r1"))


def test_an_aborted_openai_stream_is_closed_so_the_server_stops(server, chat):
    """abort() did nothing for the OpenAI backend: an aborted streamed gen's connection stayed open
    and the server generated (a hosted API billed) every token to the end. Closing the stream makes
    the server's next write fail, and the stream ends with an abort."""
    outcome, first = {}, threading.Event()

    def stream(h, b):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            for i in range(200):
                h.wfile.write(b"data: " + json.dumps(_chunk("x")).encode() + b"\n\n")
                h.wfile.flush()
                first.set()
                threading.Event().wait(0.02)
            outcome["server"] = "wrote every token"
        except OSError:
            outcome["server"] = "saw its client leave"

    server.answer = stream
    events_seen = []

    def consume():
        for delta, meta in chat.generate_stream(CHAT, PARAMS, "r1"):
            events_seen.append((delta, meta.get("finish_reason")))

    reader = threading.Thread(target=consume)
    reader.start()
    assert first.wait(10)
    chat.abort("r1")
    reader.join(30)
    assert events_seen[-1] == ("", {"type": "abort", "message": "the request was aborted"})
    for _ in range(1000):  # (the server notices at its next writes)
        if outcome:
            break
        threading.Event().wait(0.01)
    assert outcome == {"server": "saw its client leave"}


def test_openai_select_logprobs_that_do_not_match_their_tokens_are_named(server):
    """token_logprobs shorter than tokens were cut to fit (the choice scored on fewer tokens than it
    has); none at all raised a bare TypeError."""
    backend = lmnb.OpenAI("m", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    for logprobs in ([None, -1.0], None):
        rows = [{"index": i, "text": t, "finish_reason": "length",
                 "logprobs": {"tokens": list(t), "token_logprobs": logprobs, "top_logprobs": None, "text_offset": []}}
                for i, t in enumerate(("Hi", "Hia", "Hib"))]
        server.answer = lambda h, b: send(h, 200, json.dumps({"id": "x", "choices": rows}).encode())
        with pytest.raises(BackendError, match=r"/v1/completions returned no echoed prompt logprobs \(a token_logprobs entry per "
                                               r"token\); it cannot run select\(\)$"):
            backend.score_choices(Prompt("Hi"), ["a", "b"], False, "r1")
    backend.shutdown()


def test_an_openai_timeout_says_how_long_it_waited_and_how_often(server):
    """A stalled server failed with the client's "Request timed out.", after 3 tries of 600 s by
    default (half an hour), naming neither."""
    release = threading.Event()

    def stall(h, b):
        if b.get("stream"):
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.end_headers()
            h.wfile.write(b"data: " + json.dumps(_chunk("He")).encode() + b"\n\n")
            h.wfile.flush()
        release.wait(60)

    server.answer = stall
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=1, timeout=0.3)
    fix = "; check that the server is not stuck or overloaded, or change the limits with OpenAI\\(\\.\\.\\., timeout=SECONDS"
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions: no answer within the read timeout of 0.3 s, in 2 tries{fix}"):
        backend.generate(CHAT, PARAMS, "r1")
    backend.shutdown()
    # (the stream's first chunk must come within the timeout: where it was 0.3 s, the stub on a loaded
    # machine answered 0.35 s late, and the stream failed as one that never began)
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=1, timeout=PATIENT_S)
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions stream: no chunk \\(keep-alive comments and empty "
                                           f"lines do not count\\) within the read timeout of {PATIENT_S} s{fix}"):
        list(backend.generate_stream(CHAT, PARAMS, "r2"))  # (a stream that began is not tried again)
    release.set()
    backend.shutdown()


def test_an_openai_timeout_given_as_an_httpx_timeout_is_the_clients_read_timeout(server):
    """The openai client takes ``float | Timeout``, its transport's Timeout: openai 3 is on httpx2,
    and refused an ``httpx.Timeout`` in its internals' words. lmnb.OpenAI makes it openai.Timeout,
    each part checked, and the read part is the wait its errors name (a stream's, for each chunk)."""
    import httpx

    release = threading.Event()

    def stall(h, b):
        if b.get("stream"):
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.end_headers()
            h.wfile.write(b"data: " + json.dumps(_chunk("He")).encode() + b"\n\n")
            h.wfile.flush()
        release.wait(60)

    server.answer = stall
    fix = "; check that the server is not stuck or overloaded, or change the limits with OpenAI\\(\\.\\.\\., timeout=SECONDS"
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=httpx.Timeout(0.3, connect=5.0))
    assert backend.client.timeout == backend._openai.Timeout(connect=5.0, read=0.3, write=0.3, pool=0.3)
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions: no answer within the read timeout of 0.3 s{fix}"):
        backend.generate(CHAT, PARAMS, "r1")
    backend.shutdown()
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0,
                          timeout=httpx.Timeout(None, read=PATIENT_S))  # (no limit on the others)
    with pytest.raises(BackendError, match=f"^{server.url}/v1/chat/completions stream: no chunk \\(keep-alive comments and empty "
                                           f"lines do not count\\) within the read timeout of {PATIENT_S} s{fix}"):
        list(backend.generate_stream(CHAT, PARAMS, "r2"))
    release.set()
    backend.shutdown()


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_connect_timeout_is_named_unreachable_not_a_read_timeout(monkeypatch, stream):
    """A host that never answers the connection (a firewall that drops it) was reported as "no
    answer within the read timeout of 600 s", and a batch job blamed the rows' input. Its requests
    here time out on connect at once: every transport of httpx (and httpx2, which newer openai
    clients use) raises ConnectTimeout."""
    import importlib

    import openai

    from lmnb.backend.base import BackendUnreachable

    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue

        def refuse(self, request, *, module=module):
            raise module.ConnectTimeout("timed out", request=request)

        async def refuse_async(self, request, *, module=module):
            raise module.ConnectTimeout("timed out", request=request)

        monkeypatch.setattr(module.HTTPTransport, "handle_request", refuse)
        monkeypatch.setattr(module.AsyncHTTPTransport, "handle_async_request", refuse_async)
    url = "http://10.0.0.1:8000/v1"  # (never reached: the transports fail first)
    backend = lmnb.OpenAI("m", base_url=url, max_retries=1, timeout=openai.Timeout(60, connect=4))
    with pytest.raises(BackendUnreachable) as e:
        if stream:
            list(backend.generate_stream(CHAT, PARAMS, "r1"))
        else:
            backend.generate(CHAT, PARAMS, "r1")
    assert str(e.value) == (f"{url}/chat/completions: no connection within the connect timeout of 4 s, in 2 tries; is the server "
                            "running at that URL, and are the host and port right (a firewall that drops the "
                            "connection looks the same)?")
    backend.shutdown()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind, said", [
    ("ConnectError", "nothing answers there (ConnectError: [Errno 111] Connection refused; 2 tries); is the server "
                     "running, and are the host and port right?"),
    # a connection the server took, then dropped: something answers there
    ("RemoteProtocolError", "the server dropped the connection before its answer was complete (RemoteProtocolError: "
                            "[Errno 111] Connection refused; 2 tries); it stopped, restarted or crashed (see its log), "
                            "or is no HTTP server: check that it runs at that URL, then run the call again"),
])
def test_an_openai_connection_that_fails_says_nothing_answers_and_why(monkeypatch, stream, kind, said):
    """lmnb.OpenAI at a port nothing listens on said only "APIConnectionError: Connection error.",
    where RuntimeEndpoint says "nothing answers at ...; is the server running" and why; a connection
    the server dropped is no unreachable server (BackendError), and says what to do, as
    RuntimeEndpoint's does. Either names the route it failed on."""
    import importlib

    from lmnb.backend.base import BackendUnreachable

    for name in ("httpx", "httpx2"):  # (as in the connect-timeout test above: the same on both transports)
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue

        def refuse(self, request, *, module=module):
            raise getattr(module, kind)("[Errno 111] Connection refused", request=request)

        async def refuse_async(self, request, *, module=module):
            raise getattr(module, kind)("[Errno 111] Connection refused", request=request)

        monkeypatch.setattr(module.HTTPTransport, "handle_request", refuse)
        monkeypatch.setattr(module.AsyncHTTPTransport, "handle_async_request", refuse_async)
    url = "http://127.0.0.1:9/v1"  # (never reached: the transports fail first)
    backend = lmnb.OpenAI("m", base_url=url, max_retries=1)
    with pytest.raises(BackendError) as e:
        if stream:
            list(backend.generate_stream(CHAT, PARAMS, "r1"))
        else:
            backend.generate(CHAT, PARAMS, "r1")
    assert str(e.value) == f"{url}/chat/completions: {said}"
    assert isinstance(e.value, BackendUnreachable) == (kind == "ConnectError")
    backend.shutdown()


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_openai_connection_the_server_drops_says_so_after_its_tries(server, reset, stream):
    """A server that took each try's connection and dropped it (a crash while it read the request)
    was "URL/v1/: APIConnectionError: Connection error. (RemoteProtocolError: ...; 2 tries)": neither
    the route nor what happened nor what to do. It says so now, as RuntimeEndpoint does."""
    tries = []
    server.answer = lambda h, b: tries.append(b) or _drop(h, b, reset)
    kind = "ReadError" if reset else "RemoteProtocolError"
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=1, timeout=PATIENT_S)
    with pytest.raises(BackendError) as e:
        if stream:
            list(backend.generate_stream(CHAT, PARAMS, "r1"))
        else:
            backend.generate(CHAT, PARAMS, "r1")
    assert re.fullmatch(re.escape(f"{server.url}/v1/chat/completions: the server dropped the connection before its "
                                  f"answer was complete ({kind}: ") + ".*" + re.escape(
        "; 2 tries); it stopped, restarted or crashed (see its log), or is no HTTP server: check that it runs at that "
        "URL, then run the call again"), str(e.value)), str(e.value)
    assert len(tries) == 2 and type(e.value) is BackendError  # (it was reached: not BackendUnreachable)
    backend.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_openai_server_that_crashes_mid_request_is_not_said_to_be_at_the_wrong_address(stream):
    """A server that dropped the request's connection as it went down (a crash), so that the
    client's try again found nothing listening, was "URL/v1/: nothing answers there (ConnectError:
    ...; 2 tries); is the server running, and are the host and port right?": the drop was not said,
    and the fix blamed an address that was right. It says the server dropped the connection and
    that nothing answers since, and to start it again, naming the route."""
    from lmnb.backend.base import BackendUnreachable

    def crash(handler):  # (stop listening, then drop the request: the try again is refused)
        handler.server.shutdown()
        handler.server.server_close()
        _drop(handler, None, reset=False)

    server = Scripted()
    server.answer = lambda h, b: crash(h)
    with serve_http(server.handler) as url:
        backend = lmnb.OpenAI("m", base_url=url + "/v1", max_retries=1, timeout=PATIENT_S)
        with pytest.raises(BackendUnreachable) as e:
            if stream:
                list(backend.generate_stream(CHAT, PARAMS, "r1"))
            else:
                backend.generate(CHAT, PARAMS, "r1")
        backend.shutdown()
    assert re.fullmatch(re.escape(f"{url}/v1/chat/completions: the server dropped the connection before its answer "
                                  "was complete (RemoteProtocolError: Server disconnected without sending a response.), "
                                  "and nothing answers there since (ConnectError: ") + ".*" + re.escape(
        "; 2 tries); it stopped or crashed (see its log): start it again, then run the call again"),
        str(e.value)), str(e.value)


def test_an_openai_backend_at_a_port_nothing_listens_on_says_so():
    import socket

    from lmnb.backend.base import BackendUnreachable

    with socket.socket() as sock:  # a port nothing listens on (bound, never listening: no one else takes it)
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        backend = lmnb.OpenAI("m", base_url=gone, max_retries=0)
        for call in (lambda: backend.generate(CHAT, PARAMS, "r1"),
                     lambda: list(backend.generate_stream(CHAT, PARAMS, "r2"))):
            with pytest.raises(BackendUnreachable, match=re.escape(f"{gone}/chat/completions: nothing answers there (ConnectError: ")):
                call()
    backend.shutdown()


def test_an_openai_stream_aborted_while_it_starts_is_closed_at_once(server, chat):
    """An abort() between the request and its first chunk found no stream to close (the stream was
    registered once the request returned): the stream then ran to its end."""
    started, release = threading.Event(), threading.Event()

    def slow_start(h, b):
        started.set()
        release.wait(10)  # (the response headers wait: the client is still inside the request)
        events(h, [_chunk("x"), _chunk("y", "stop")])

    server.answer = slow_start
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(chat.generate_stream(CHAT, PARAMS, "r1")))
    reader.start()
    assert started.wait(10)
    chat.abort("r1")
    release.set()
    reader.join(30)
    assert seen == [("", {"finish_reason": {"type": "abort", "message": "the request was aborted"}})]


def test_stream_lines_are_split_across_chunks_and_decoded_whole():
    """The SSE line splitter of RuntimeEndpoint: a line spanning chunks (a long event arrives in
    many), a multi-byte character split between chunks, a last line without its newline."""
    from lmnb.backend.runtime_endpoint import _utf8_lines

    chunks = [b"data: {\"text\": \"caf", b"\xc3", b"\xa9\"}\r\n", b"\n: ping\ndata: [DO", b"NE]"]
    assert list(_utf8_lines(iter(chunks), "s")) == ['data: {"text": "café"}', "", ": ping", "data: [DONE]"]


def test_a_line_longer_than_the_limit_fails_as_soon_as_that_much_has_come(server, endpoint, monkeypatch):
    """A server sending a line that never ends filled the memory: the splitter kept every byte of
    it, waiting for its newline."""
    from lmnb.backend import runtime_endpoint
    from lmnb.backend.runtime_endpoint import _utf8_lines

    monkeypatch.setattr(runtime_endpoint, "MAX_LINE_BYTES", 100)
    sent = []

    def endless():
        for i in itertools.count():
            sent.append(i)
            yield b"data: " if i == 0 else b"x" * 30

    with pytest.raises(BackendError, match=r"^s sent a line longer than 100 bytes, starting b'data: xxx.*': no event "
                                           r"is that long \(is the server, or a proxy before it, sending a line that "
                                           r"never ends\?\); if its events are, raise lmnb\.backend\.runtime_endpoint"
                                           r"\.MAX_LINE_BYTES$"):
        list(_utf8_lines(endless(), "s"))
    assert len(sent) == 5  # 6 + 3 * 30 = 96 bytes were within the limit, the fourth 30 were not
    # a line of the limit, whole in a chunk or across chunks, passes; a byte more fails either way
    assert list(_utf8_lines(iter([b"a" * 100 + b"\nb"]), "s")) == ["a" * 100, "b"]
    assert list(_utf8_lines(iter([b"a" * 60, b"a" * 40 + b"\nb"]), "s")) == ["a" * 100, "b"]
    for chunks in ([b"a" * 101 + b"\n"], [b"a" * 60, b"a" * 41 + b"\n"], [b"a" * 60, b"a" * 41]):
        with pytest.raises(BackendError, match="^s sent a line longer than 100 bytes, starting b'aaa"):
            list(_utf8_lines(iter(chunks), "s"))
    server.answer = lambda h, b: events(h, [b"data: " + b"x" * 5000])
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate stream sent a line longer than 100 bytes"):
        _stream(endpoint)


def test_a_body_longer_than_the_limit_fails_as_soon_as_that_much_has_come(server, endpoint, monkeypatch):
    """A response that is not streamed (or a stream's error page) was read whole, however long: a
    server sending an endless body filled the memory."""
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "MAX_BODY_BYTES", 1000)
    result = b'{"text": "Hello", "meta_info": {}}'
    server.answer = lambda h, b: send(h, 200, result + b" " * (1000 - len(result)))  # the limit passes
    assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["Hello"]

    def endless(status):
        def respond(h, b):
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            try:
                for i in range(10_000):  # 3 MB (unless the client leaves first)
                    piece = b'{"text": "' + b"x" * 290 if i == 0 else b"x" * 300
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    h.wfile.flush()
            except OSError:
                pass
        return respond

    limit = (r"returned a body longer than 1000 bytes, starting b'\{\"text\": \"xxx.*': no answer is that long \(is "
             r"the server, or a proxy before it, sending an endless body\?\); if its answers are, raise "
             r"lmnb\.backend\.runtime_endpoint\.MAX_BODY_BYTES$")
    server.answer = endless(200)
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate {limit}"):
        endpoint.generate(Prompt("Hi"), PARAMS, "r1")
    server.answer = endless(400)  # a stream's error page
    with pytest.raises(BackendError, match=f"^POST {server.url}/generate {limit}"):
        _stream(endpoint)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("filler", [b": keep-alive\n\n", b"\n"], ids=["comment", "empty line"])
def test_an_openai_stream_that_sends_only_keep_alives_times_out_as_a_silent_one(server, filler):
    """Any byte reset httpx's read timeout and the openai client drops comments, so a stalled
    stream sending a keep-alive every few seconds never failed; the timeout now counts from the
    last chunk, and the server sees its client leave."""
    outcome, told = {}, threading.Event()

    def stalled(h, b):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            h.wfile.write(b"data: " + json.dumps(_chunk("He")).encode() + b"\n\n")
            for _ in range(400):  # 20 s of filler, 20 a second
                h.wfile.flush()
                time.sleep(0.05)
                h.wfile.write(filler)
            outcome["server"] = "wrote all the filler"
        except OSError:
            outcome["server"] = "saw its client leave"
        told.set()

    server.answer = stalled
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=PATIENT_S)
    got, t0 = [], time.monotonic()
    with pytest.raises(BackendError) as e:
        for delta, _ in backend.generate_stream(CHAT, PARAMS, "r1"):
            got.append(delta)
    assert time.monotonic() - t0 > PATIENT_S and got == ["He"]
    assert str(e.value) == (
        f"{server.url}/v1/chat/completions stream: no chunk (keep-alive comments and empty lines do not count) within the read "
        f"timeout of {PATIENT_S} s; check that the server is not stuck or overloaded, or change the limits with "
        "OpenAI(..., timeout=SECONDS, max_retries=N)")
    told.wait(60)  # (the server notices at its next writes)
    assert outcome == {"server": "saw its client leave"}
    backend.shutdown()


def test_an_openai_stream_whose_chunks_keep_coming_runs_past_the_timeout_all_told(server):
    """Chunks that keep coming, keep-alives (comments, empty lines) between them, run past the
    timeout all told; a consumer slow between chunks does not count against the server."""
    def slow_but_alive(h, b):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        for piece in pieces:
            for filler in (b": keep-alive\n\n", b"\n"):
                time.sleep(0.1)
                h.wfile.write(filler)
                h.wfile.flush()
            h.wfile.write(b"data: " + json.dumps(_chunk(piece)).encode() + b"\n\n")
            h.wfile.flush()
        h.wfile.write(b"data: " + json.dumps(_chunk(None, "stop")).encode() + b"\n\ndata: [DONE]\n\n")

    # (0.2 s between chunks, a timeout of PATIENT_S: 0.5 s left a loaded machine 0.3 s to spare; 5.2 s
    # of chunks in all)
    pieces = "abcdefghijklmnopqrstuvwxyz"
    server.answer = slow_but_alive
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", max_retries=0, timeout=PATIENT_S)
    t0, text = time.monotonic(), ""
    for delta, _ in backend.generate_stream(CHAT, PARAMS, "r1"):
        text += delta
        if delta == pieces[-1]:
            assert time.monotonic() - t0 > PATIENT_S  # (the server's chunks took longer than the timeout, all told)
            time.sleep(PATIENT_S + 0.1)  # (the consumer holds the last chunk longer than the timeout)
    assert text == pieces
    backend.shutdown()


def test_an_html_error_page_is_shown_as_its_text_not_its_markup():
    """Connecting to a server that is not SGLang's (``python -m http.server``) quoted its whole
    404 HTML page, 13 lines of markup, and said RuntimeEndpoint takes the root URL, which it was
    given."""
    page = (b'<!DOCTYPE HTML>\n<html lang="en">\n    <head>\n        <meta charset="utf-8">\n'
            b"        <title>Error response</title>\n    </head>\n    <body>\n        <h1>Error response</h1>\n"
            b"        <p>Error code: 404</p>\n        <p>Message: File not found.</p>\n    </body>\n</html>\n")
    import http.server as hs

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            send(self, 404, page, "text/html")

    with serve_http(Handler) as url, pytest.raises(BackendError) as e:
        lmnb.RuntimeEndpoint(url)
    message = str(e.value)
    assert "<" not in message and "\n" not in message, message
    assert message.startswith(f"GET {url}/get_model_info: HTTP 404: an HTML page (Error response Error response "
                              "Error code: 404 Message: File not found.)"), message
    assert f"is {url} an SGLang or lmnb server?" in message
    assert "takes the server's root URL" not in message


@pytest.mark.parametrize("key, env, fix", [
    (None, None, "; the server asks for an API key: lmnb.RuntimeEndpoint(URL, api_key=KEY), or set $LMNB_API_KEY"),
    (None, "old", "; the server refused the key in $LMNB_API_KEY: check it"),
    ("old", None, "; the server refused the api_key given: check it")])
def test_a_401_on_generate_is_an_auth_error_streamed_or_not(server, monkeypatch, key, env, fix):
    """A key refused by /generate (revoked after the connect, or a proxy guarding that route
    only) came out as a plain BackendError: BackendAuthError is the 401 of every call. It said the
    server's bare words, where the same refusal at connect says how to give the key; a gen's says
    it too, as its key_fix (which front ends replace with their own words)."""
    from lmnb.backend.base import BackendAuthError

    monkeypatch.delenv("LMNB_API_KEY", raising=False)
    if env:
        monkeypatch.setenv("LMNB_API_KEY", env)
    endpoint = lmnb.RuntimeEndpoint(server.url, api_key=key, timeout=5)  # (its model info needs no key here)
    server.answer = lambda handler, body: send(handler, 401, b'{"detail": "Invalid token"}')
    try:
        for call in (lambda: endpoint.generate(Prompt("Hi"), PARAMS, "r1"), lambda: _stream(endpoint)):
            with pytest.raises(BackendAuthError) as e:
                call()
            assert str(e.value) == f"POST {server.url}/generate: HTTP 401: Invalid token{fix}"
            assert e.value.key_fix == fix
        server.answer = lambda handler, body: send(handler, 403, b'{"detail": "Forbidden"}')
        with pytest.raises(BackendError) as e:  # (another refusal is no auth error)
            endpoint.generate(Prompt("Hi"), PARAMS, "r1")
        assert type(e.value) is BackendError and str(e.value) == f"POST {server.url}/generate: HTTP 403: Forbidden"
    finally:
        endpoint.shutdown()


def _completion_ok(handler, body):
    """A /v1/completions answer of "ok"."""
    send(handler, 200, json.dumps({"id": "x", "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}).encode())


@lmnb.function
def _chat_roles(s):
    s += lmnb.user("Hi")
    s += lmnb.assistant(lmnb.gen("a", max_tokens=2))


def test_a_completion_model_with_no_known_template_warns_once_when_roles_are_used(server):
    """A completion model whose name matched no template got the generic 'default' format
    ('USER:...') for chat roles without a word; now one warning names the model, the format and
    the fixes. A program without roles, or a template given, warns nothing."""
    import warnings

    server.answer = _completion_ok
    chat = _chat_roles

    @lmnb.function
    def plain(s):
        s += "Hi" + lmnb.gen("a", max_tokens=2)

    backend = lmnb.OpenAI("my-model", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
        plain.run(backend=backend)
        assert seen == []
        chat.run(backend=backend)
        chat.run(backend=backend)
    assert len(seen) == 1, [str(w.message) for w in seen]
    text = str(seen[0].message)
    assert "lmnb.OpenAI('my-model', is_chat_model=False)" in text and "'default' format ('USER:...\\nASSISTANT:')" in text
    assert "chat_template=lmnb.get_chat_template('chatml')" in text and "lmnb.RuntimeEndpoint(URL)" in text
    backend.shutdown()
    given = lmnb.OpenAI("my-model", is_chat_model=False, chat_template=lmnb.get_chat_template("default"),
                        base_url=server.url + "/v1", max_retries=0, timeout=5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
        chat.run(backend=given)
    assert seen == []
    given.shutdown()


def test_the_guessed_template_warning_points_at_the_users_code(server):
    """The guessed-template warning named lmnb's own file and line (lmnb/backend/openai.py), which
    says nothing of where the program was run; it names the caller outside lmnb: this file, for a
    program run on the caller's thread and for a direct backend.generate. Run by .run()'s default,
    on a worker thread whose stack holds lmnb and threading only, it named lmnb's line still; it
    names the program's line that queued the gen, _chat_roles' `s += lmnb.assistant(...)`."""
    import warnings

    server.answer = _completion_ok
    chat = _chat_roles
    source = Path(__file__).read_text().splitlines()  # (open(...).read() left the file to the garbage collector)
    gen_line = source.index("def _chat_roles(s):") + 3  # (1-based: the second line of its body)
    assert source[gen_line - 1].strip().startswith("s += lmnb.assistant(lmnb.gen(")

    backend = lmnb.OpenAI("my-model", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
        chat.run(backend=backend)
    backend.shutdown()
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, gen_line)], [str(w.message) for w in seen]

    backend = lmnb.OpenAI("my-model", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
        chat.run(backend=backend, use_thread=False)
    backend.shutdown()
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert seen[0].filename == __file__
    backend = lmnb.OpenAI("my-model", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test, collected here)
        backend.generate(Prompt("Hi", role="user"), PARAMS, "r1")
    backend.shutdown()
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert seen[0].filename == __file__


def test_the_guessed_template_warning_of_a_lm_cell_points_at_the_cell(server):
    """A %%lm cell run through lmnb_kernel: the warning named lmnb_kernel/cellrun.py (the first
    frame outside lmnb, where the main thread asked for the template) or "<string>", line 2 (the
    program function lmnb makes for the cell, on the streamed body's thread); it names the cell's
    line, as IPython compiled it (`run_cell_magic('lm', ...)`)."""
    import linecache
    import warnings

    from helpers_shell import process_shell
    from lmnb_kernel.session import get_session

    shell = process_shell()
    default_backend = lmnb.api._default_backend  # loading the extension replaces it
    shell.extension_manager.load_extension("lmnb_kernel")
    # (a cell streams: a /v1/completions stream of "ok")
    server.answer = lambda h, body: events(h, [{"id": "x", "choices": [{"index": 0, "text": "ok", "finish_reason": None}]},
                                               {"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}])
    try:
        # (a --python body's line is its own, under the name its tracebacks give: the cell's line 3)
        for cell, where in [("%%lm --max-tokens 2\n{user}Hi{/user}{assistant}{gen a}{/assistant}", 1),
                            ("%%lm --python --max-tokens 2\ns += lmnb.user('Hi')\ns += lmnb.assistant(lmnb.gen('a'))",
                             3)]:
            backend = lmnb.OpenAI("my-model", is_chat_model=False, base_url=server.url + "/v1", max_retries=0,
                                  timeout=5)
            get_session().connect(backend, "the test's server")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                warnings.simplefilter("ignore", ResourceWarning)  # (an unclosed socket of another test)
                assert shell.run_cell(cell).success
            assert len(seen) == 1, [(w.filename, str(w.message)) for w in seen]
            assert seen[0].lineno == where and "is_chat_model=False" in str(seen[0].message)
            if where == 1:
                assert linecache.getline(seen[0].filename, 1).startswith("get_ipython().run_cell_magic('lm'")
            else:
                assert seen[0].filename.startswith("<%%lm cell ")
    finally:
        get_session().close()
        shell.extension_manager.unload_extension("lmnb_kernel")
        lmnb.api._default_backend = default_backend


@pytest.mark.parametrize("key, env, refusal", [
    (None, "sekrit", None),  # the key lmnb serve reads, as %lm connect and an exported job read it
    ("sekrit", "wrong", None),  # api_key= wins
    (None, "", "; the server asks for an API key: lmnb.RuntimeEndpoint(URL, api_key=KEY), or set $LMNB_API_KEY"),
    (None, "wrong", "; the server refused the key in $LMNB_API_KEY: check it"),
    ("wrong", "sekrit", "; the server refused the api_key given: check it"),
])
def test_the_key_comes_from_lmnb_api_key_and_a_refusal_says_how_to_give_it(monkeypatch, key, env, refusal):
    """RuntimeEndpoint(url) sent no key where $LMNB_API_KEY held it (lmnb serve reads it "as the
    clients read it"), and a 401 said only the server's words, "send Authorization: Bearer <key>"."""
    from lmnb.backend.base import BackendAuthError

    seen = []

    class Handler(BaseHTTPRequestHandler):  # lmnb serve --api-key sekrit
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            if seen[-1] == "Bearer sekrit":
                send(self, 200, json.dumps({"model_path": "stub"}).encode())
            else:
                send(self, 401, b'{"error": {"message": "missing or wrong API key (send Authorization: Bearer <key>)"}}')

    monkeypatch.setenv("LMNB_API_KEY", env)
    with serve_http(Handler) as url:
        if refusal is None:
            lmnb.RuntimeEndpoint(url, api_key=key).shutdown()
        else:
            with pytest.raises(BackendAuthError) as e:
                lmnb.RuntimeEndpoint(url, api_key=key)
            assert str(e.value) == (f"GET {url}/get_model_info: HTTP 401: missing or wrong API key (send "
                                    f"Authorization: Bearer <key>){refusal}")
    assert seen == [None if key is None and not env else f"Bearer {key or env}"]


@pytest.mark.parametrize("key, env, refusal", [
    ("sekrit", "wrong", None),  # api_key= wins
    (None, "sekrit", None),  # the openai client's variable
    (None, "", "; the server asks for an API key: lmnb.OpenAI(..., api_key=KEY), or set $OPENAI_API_KEY"),
    (None, "wrong", "; the server refused the key in $OPENAI_API_KEY: check it"),
    ("wrong", "sekrit", "; the server refused the api_key given: check it"),
])
@pytest.mark.parametrize("chat, stream", [(False, False), (True, False), (True, True)])
def test_an_openai_server_that_refuses_the_key_says_how_to_give_it(server, monkeypatch, key, env, refusal, chat,
                                                                   stream):
    """lmnb.OpenAI against ``lmnb serve --api-key sekrit`` without the key failed the gen with a plain
    BackendError in the server's words for an HTTP client, "send Authorization: Bearer <key>", where
    RuntimeEndpoint's BackendAuthError says how to give the key."""
    from lmnb.backend.base import BackendAuthError

    seen = []

    def answer(h, body):  # lmnb serve's check_api_key
        seen.append(h.headers.get("Authorization"))
        if seen[-1] != "Bearer sekrit":
            send(h, 401, b'{"error": {"message": "missing or wrong API key (send Authorization: Bearer <key>)", '
                         b'"code": 401}}')
        elif stream:
            events(h, [{"id": "x", "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}])
        else:
            out = {"message": {"role": "assistant", "content": "ok"}} if chat else {"text": "ok"}
            send(h, 200, json.dumps({"id": "x", "choices": [{"index": 0, **out, "finish_reason": "stop"}]}).encode())

    server.answer = answer
    monkeypatch.setenv("OPENAI_API_KEY", env)
    backend = lmnb.OpenAI("m", base_url=server.url + "/v1", api_key=key, is_chat_model=chat, max_retries=0, timeout=5)
    prompt = Prompt("Hi", messages=[{"role": "user", "content": "Hi"}], role="assistant") if chat else Prompt("Hi")
    try:
        run = (lambda: list(backend.generate_stream(prompt, PARAMS, "r"))) if stream else (
            lambda: backend.generate(prompt, PARAMS, "r"))
        if refusal is None:
            run()
        else:
            with pytest.raises(BackendAuthError) as e:
                run()
            assert str(e.value) == (f"{server.url}/v1/{'chat/' * chat}completions: HTTP 401: missing or wrong API key (send Authorization: "
                                    f"Bearer <key>){refusal}")
            assert e.value.key_fix == refusal
    finally:
        backend.shutdown()
    assert seen == [f"Bearer {key or env or 'EMPTY'}"]


@pytest.mark.parametrize("openai_env", [None, "oa-key"])
def test_an_azure_backend_sends_the_key_in_its_own_variable_and_a_401_names_that_variable(monkeypatch, openai_env):
    """lmnb.OpenAI(is_azure=True, base_url=...) with its key only in $AZURE_OPENAI_API_KEY (where
    openai.AzureOpenAI reads it) sent api-key: EMPTY, or the key of $OPENAI_API_KEY where that was
    set, and the 401 said "the server asks for an API key: ... or set $OPENAI_API_KEY" (or that the
    server refused the key in $OPENAI_API_KEY): the Azure key was never sent. It is sent, and a
    401 names its variable."""
    import httpx

    from lmnb.backend.base import BackendAuthError

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:  # (Azure's refusal of a key)
        seen.append(request.headers.get("api-key"))
        return httpx.Response(401, json={"error": {"code": "401", "message": "Access denied due to invalid "
                                                   "subscription key."}})

    if openai_env is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", openai_env)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "az-key")
    url = "https://x.openai.azure.com/openai/deployments/d"
    backend = lmnb.OpenAI("gpt-4o", is_azure=True, base_url=url, api_version="2024-02-01", max_retries=0,
                          http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    prompt = Prompt("Hi", messages=[{"role": "user", "content": "Hi"}], role="assistant")
    try:
        with pytest.raises(BackendAuthError) as e:
            backend.generate(prompt, PARAMS, "r")
    finally:
        backend.shutdown()
    assert str(e.value) == (f"{url}/chat/completions: HTTP 401: Access denied due to invalid subscription key.; the server refused "
                            "the key in $AZURE_OPENAI_API_KEY: check it")
    assert seen == ["az-key"]
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")  # (no key at all: the client says so, naming the variable)
    with pytest.raises(ValueError, match=r"^the openai client did not start: .*Give the API key: api_key= \(an "
                                         r"exported job's --api-key KEY, %lm connect --api-key KEY\) or "
                                         r"\$AZURE_OPENAI_API_KEY\.$"):
        lmnb.OpenAI("gpt-4o", is_azure=True, base_url=url, api_version="2024-02-01")


def test_a_logit_bias_id_longer_than_python_reads_is_refused_as_the_engine_and_its_text_are(server, endpoint):
    """An int logit_bias key of 5001 digits was refused by a server backend as too long to send
    ("logit_bias holds 1.000e+5000 (...), which has more digits than Python writes ..."), by the
    in-process engine as outside its vocabulary, and as text as past every vocabulary: it is now
    refused by gen() in the text's words on every backend, before any request. By hand: 10**5000
    is 1 and 5000 zeros, 5001 digits, 1.000e+5000."""
    posts = []
    server.answer = lambda h, b: (posts.append(b), send(h, 500, b"{}"))
    openai = lmnb.OpenAI("m", base_url=server.url + "/v1", is_chat_model=False, max_retries=0, timeout=5)
    said = ("logit_bias is invalid: the key 1.000e+5000 (an integer of 5001 digits) is a token id past every "
            "model's vocabulary; remove it, or take the ids from the model's tokenizer")
    for key in (10**5000, "1" + "0" * 5000):
        @lmnb.function
        def prog(s):
            s += "Hi" + lmnb.gen("x", max_tokens=2, logit_bias={key: 1})

        for backend in (endpoint, openai):
            with pytest.raises(ValueError) as e:
                prog.run(backend=backend)
            assert str(e.value) == said
    assert posts == []


def test_an_integer_too_long_to_write_is_refused_before_any_request(server, endpoint):
    """gen(max_tokens=10**5000) on RuntimeEndpoint or OpenAI failed as the client wrote its request,
    in Python's words ("ValueError: Exceeds the limit (4300 digits) for integer string conversion;
    use sys.set_int_max_str_digits()"); it is refused before any request, max_tokens as the
    in-process engine refuses it (past the context, DOES_NOT_FIT) and the others as too long to
    send. By hand: 10**5000 has 5001 digits, 25 * 10**4300 4302 (2.500e+4301), 10**4300 4301;
    10**4300 - 1 (4300 nines) is still written."""
    from lmnb.backend.base import check_sendable
    from lmnb_engine.params import DOES_NOT_FIT

    posts = []
    server.answer = lambda h, b: (posts.append(b), send(h, 500, b"{}"))
    openai = lmnb.OpenAI("m", base_url=server.url + "/v1", is_chat_model=False, max_retries=0, timeout=5)
    too_long = "has more digits than Python writes as an integer (at most 4300), so no request to the server can " \
               "carry it; give a smaller number"
    cases = [(GenParams(max_new_tokens=10**5000), "max_tokens=1.000e+5000 (an integer of 5001 digits) exceeds the "
              "model's context length; lower max_tokens to at most the model's context length"),
             (GenParams(max_new_tokens=4, top_k=25 * 10**4300), f"top_k=2.500e+4301 (an integer of 4302 digits) {too_long}"),
             # (it said "stop_token_ids holds 1.000e+4300 (...) has more digits")
             (GenParams(max_new_tokens=4, stop_token_ids=[1, 10**4300]),
              f"stop_token_ids holds 1.000e+4300 (an integer of 4301 digits), which {too_long}")]
    for backend in (endpoint, openai):
        for call in (backend.generate, lambda *a: list(backend.generate_stream(*a))):
            for params, said in cases:
                with pytest.raises(ValueError) as e:
                    call(Prompt("Hi"), params, "r1")
                assert str(e.value) == said
                assert getattr(e.value, "reason", None) == (DOES_NOT_FIT if params.max_new_tokens != 4 else None)
    assert posts == []
    check_sendable(GenParams(max_new_tokens=10**4300 - 1, logprob_start_len=10**4300 - 1))  # (4300 digits: sent)

    @lmnb.function
    def prog(s):
        s += "Hi" + lmnb.gen("x")

    assert str(prog.run(backend=endpoint, max_new_tokens=10**5000).error()) == (
        "Gen('x') failed: ValueError: max_tokens=1.000e+5000 (an integer of 5001 digits) exceeds the model's context "
        "length; lower max_tokens to at most the model's context length (the gen has no max_tokens of its own and "
        "took run(max_new_tokens=1.000e+5000 (an integer of 5001 digits)): give it its own max_tokens=N, or lower "
        "that)")
    assert posts == []


def test_a_timeout_past_the_platforms_waits_is_refused_and_inf_means_no_limit(server):
    """RuntimeEndpoint(URL, timeout=10**5000) or timeout=float('inf'), and the same given to
    lmnb.OpenAI, were taken, and then every gen failed with OverflowError ("timestamp too large to
    convert to C _PyTime_t"). A finite timeout past threading.TIMEOUT_MAX (the longest wait the
    platform's socket and thread waits take) is refused where it is given, naming that bound;
    math.inf is no limit, as None is for both (httpx's and the openai client's); TIMEOUT_MAX itself
    works."""
    import math

    bound = f"{threading.TIMEOUT_MAX:.0f}"  # (9223372036 on 64-bit Linux)
    for big, shown in [(10**5000, "1.000e+5000 (an integer of 5001 digits)"),
                       (threading.TIMEOUT_MAX * 2, repr(threading.TIMEOUT_MAX * 2))]:
        for make, name in [(lambda t: lmnb.RuntimeEndpoint(server.url, timeout=t), "RuntimeEndpoint"),
                           (lambda t: lmnb.OpenAI("m", base_url=server.url + "/v1", api_key="k", timeout=t),
                            "lmnb.OpenAI")]:
            with pytest.raises(ValueError) as e:
                make(big)
            assert str(e.value) == (f"{name} timeout={shown} is longer than this platform's waits take (at most "
                                    f"{bound} s, threading.TIMEOUT_MAX): give at most that, or None (or math.inf) "
                                    "for no limit")

    def answer(handler, body):
        if handler.path == "/generate":
            send(handler, 200, json.dumps({"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}).encode())
        else:
            _completion_ok(handler, body)

    server.answer = answer
    for timeout in (math.inf, threading.TIMEOUT_MAX):
        endpoint = lmnb.RuntimeEndpoint(server.url, timeout=timeout)
        assert endpoint.timeout == (None if timeout == math.inf else timeout)
        assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["ok"]
        endpoint.shutdown()
        backend = lmnb.OpenAI("m", is_chat_model=False, base_url=server.url + "/v1", max_retries=0, timeout=timeout)
        assert [c.text for c in backend.generate(Prompt("Hi"), PARAMS, "r1")] == ["ok"]
        assert backend._read_timeout() == (None if timeout == math.inf else timeout)
        backend.shutdown()


def test_an_endpoint_is_named_by_its_url(server):
    """set_default_backend's warning and %lm stats showed <lmnb.backend.runtime_endpoint.RuntimeEndpoint
    object at 0x...>; the endpoint is named as it was made (its URL without a trailing slash)."""
    endpoint = lmnb.RuntimeEndpoint(server.url + "/")
    assert repr(endpoint) == f"lmnb.RuntimeEndpoint('{server.url}')"
    endpoint.shutdown()


def test_an_openai_error_names_the_route_of_a_base_url_with_no_path():
    """A base_url with no path (http://HOST:PORT, no /v1) was named glued to the route,
    'http://127.0.0.1:PORTcompletions', in every error of that backend (found by a new user)."""
    import socket

    import lmnb
    from lmnb.backend.base import BackendUnreachable, Prompt

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # (nothing listens there now)
    chat = lmnb.OpenAI("m", base_url=f"http://127.0.0.1:{port}", is_chat_model=True, api_key="k")
    assert chat._route == f"http://127.0.0.1:{port}/chat/completions"
    backend = lmnb.OpenAI("m", base_url=f"http://127.0.0.1:{port}", is_chat_model=False, max_retries=0, api_key="k")
    try:
        with pytest.raises(BackendUnreachable, match=re.escape(f"http://127.0.0.1:{port}/completions: nothing answers")):
            backend.generate(Prompt("Hi"), PARAMS, None)
    finally:
        backend.shutdown()
        chat.shutdown()
