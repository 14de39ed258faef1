"""Helpers for the language and server tests: a scripted backend, a recording engine, a live server.

``ScriptedBackend`` is a ``BaseBackend`` whose replies come from a function of the prompt, so
interpreter behaviour (ordering, forks, errors, speculation) can be checked exactly.
``RecordingEngine`` stands in for ``lmnb_engine.Engine`` behind the HTTP server and the
in-process backend: it records every request it receives and answers from a script.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from typing import Callable, Optional

from lmnb.backend.base import BaseBackend, Completion, Prompt
from lmnb.chat_template import ChatTemplate, get_chat_template
from lmnb.choices import ChoiceLogprobs
from lmnb.thread_waits import as_dumped, stacks


class ScriptedBackend(BaseBackend):
    """Replies ``reply(prompt, params) -> str``; records ``(kind, payload)`` calls in order. A
    reply ends with finish reason "stop", or ``stream_finish`` (default "length") when streamed."""

    def __init__(
        self,
        reply: Optional[Callable] = None,
        chat_template: Optional[ChatTemplate] = None,
        is_chat_model: bool = False,
        choice_scores: Optional[Callable] = None,
        delay: float = 0.0,
        stream_finish: str = "length",
    ):
        self.reply = reply or (lambda prompt, params: "ok")
        self.stream_finish = stream_finish
        self.template = chat_template or get_chat_template("default")
        self.is_chat_model = is_chat_model
        self.choice_scores = choice_scores
        self.delay = delay
        self.calls: list[tuple[str, object]] = []
        self.aborted: list[str] = []
        self._lock = threading.Lock()
        self._abort_events: dict[str, threading.Event] = {}

    def _record(self, kind, payload):
        with self._lock:
            self.calls.append((kind, payload))

    def get_chat_template(self):
        return self.template

    def cache_prefix(self, text, rid):
        self._record("prefill", text)
        return {"prompt_tokens": len(text), "cached_tokens": 0}

    def _wait(self, rid):
        if self.delay:
            ev = self._abort_events.setdefault(rid, threading.Event())
            if ev.wait(self.delay):
                return True
        return False

    def generate(self, prompt: Prompt, params, rid):
        self._record("generate", (prompt, params))
        if self._wait(rid):
            return [Completion("", {"finish_reason": {"type": "abort", "message": "aborted"}})]
        n = params.n or 1
        return [
            Completion(self.reply(prompt, params), {"id": rid, "finish_reason": {"type": "stop"}, "cached_tokens": 0})
            for _ in range(n)
        ]

    def generate_stream(self, prompt, params, rid):
        self._record("stream", (prompt, params))
        if self._wait(rid):
            yield "", {"id": rid, "finish_reason": {"type": "abort", "message": "aborted"}}
            return
        text = self.reply(prompt, params)
        for i, ch in enumerate(text):
            time.sleep(0.002)
            yield ch, {"id": rid, "completion_tokens": i + 1}
        yield "", {"id": rid, "completion_tokens": len(text), "finish_reason": {"type": self.stream_finish}}

    def score_choices(self, prompt, choices, unconditional, rid):
        self._record("score", (prompt, list(choices), unconditional))
        out = []
        for c in choices:
            lps, unc = self.choice_scores(prompt, c)
            out.append(ChoiceLogprobs(list(range(len(lps))), lps, len(prompt.text), 0, unc if unconditional else None))
        return out

    def abort(self, rid):
        self.aborted.append(rid)
        self._abort_events.setdefault(rid, threading.Event()).set()

    def kinds(self):
        return [k for k, _ in self.calls]


class InterruptingBackend(ScriptedBackend):
    """A ScriptedBackend that sends SIGINT to the main thread from the request whose prompt ends
    with ``at`` (a known point, no timing: a Ctrl-C while the caller waits for that request), then
    waits until that request is aborted; the others reply "done"."""

    def __init__(self, at: str, ready: Optional[Callable[[], bool]] = None, **kwargs):
        """``ready``: polled before the SIGINT is sent (up to 10 s), for a test whose outcome depends
        on where the main thread is when the signal lands; by default, once the main thread is
        blocked in a wait (``main_thread_blocked_in``): sent as the request starts, it could come
        while the main thread was on its way into its wait, and then took effect only when the
        request ended on its own, 30 s later, as if it had never been aborted."""
        super().__init__(lambda p, params: "done", delay=30, **kwargs)
        self.at = at
        self.ready = ready if ready is not None else (lambda: main_thread_blocked_in(in_a_threading_wait))
        self._marked: set[str] = set()

    def generate(self, prompt: Prompt, params, rid):
        if str(getattr(prompt, "text", prompt)).endswith(self.at):
            self._marked.add(rid)
        return super().generate(prompt, params, rid)

    def _wait(self, rid):
        import signal

        if rid not in self._marked:
            return False
        deadline = time.monotonic() + 10
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(0.001)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return super()._wait(rid)


@contextlib.contextmanager
def interrupt_main_when(ready: Callable[[], bool], timeout: float = 30.0, marked_only: bool = False):
    """While the with-block runs, send SIGINT to the main thread once ``ready()`` holds (polled by a
    thread every 10 ms), not after a fixed delay: a loaded machine may not have made the requests
    to abort by then. Where the main thread is to be stopped in a wait, ``ready`` must check that
    it is blocked there (``main_thread_blocked_in``), not only that the requests were made. Never after the block: its end stops the thread, so a signal that was not
    needed (the block ended otherwise) or never ready within ``timeout`` cannot land in a later test
    of the same process, where pytest's own handler ends the whole run. With ``marked_only`` the
    SIGINT is only marked for Python to act on, as one is that lands while the main thread is on
    its way into a wait (``_thread.interrupt_main``): a wait that has blocked meanwhile goes on."""
    import _thread
    import signal

    done = threading.Event()
    sending = threading.Lock()  # (the check of ``done`` and the send are one step for the block's end)

    def run():
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            if ready():
                with sending:
                    if done.is_set():
                        pass
                    elif marked_only:
                        _thread.interrupt_main(signal.SIGINT)
                    else:
                        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with sending:
            done.set()
        thread.join()


def main_thread_blocked_in(where: Callable[[list], bool]) -> bool:
    """Whether the main thread is blocked now in a wait that ``where(stack)`` finds in its stack
    (``lmnb.thread_waits.stacks``: ``(file, function, line)`` per frame, innermost first; walking
    another running thread's frame objects crashes CPython 3.11). Blocked, not only inside it: a
    SIGINT sent while the main thread is still on its way to the lock's wait only marks the signal,
    and Python acts on it when the wait ends (the request finished, the release done), not at once;
    and the frames alone cannot tell the two apart, the innermost one being the same call. So the
    thread must also be asleep in the kernel (state S in /proc/self/task/TID/stat, where its way to
    the wait is R), and its innermost frame must stand still over 50 ms while this thread sleeps
    (leaving it the GIL), so that it is not merely between two waits. Where /proc is missing (not
    Linux), the stillness alone is the test."""

    def innermost():
        stack = stacks().get(threading.main_thread().ident, [])
        return stack[0] if stack and where(stack) else None

    first = innermost()
    if first is None:
        return False
    for _ in range(5):
        time.sleep(0.01)
        if innermost() != first:
            return False
    stat = f"/proc/self/task/{threading.main_thread().native_id}/stat"
    if os.path.exists(stat):
        with open(stat) as f:  # (the state follows the name in parentheses, which may hold spaces)
            if f.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
    return innermost() == first


def called_from(stack: list, name: str, filename: str) -> bool:
    """Whether a frame of ``stack`` (``lmnb.thread_waits.stacks``'s) runs function ``name`` of file ``filename``."""
    return any(function == name and file == as_dumped(filename) for file, function, _ in stack)


def in_a_threading_wait(stack: list) -> bool:
    """For ``main_thread_blocked_in``: a wait of the threading module (a Condition's, an Event's,
    so a Future's result and a Thread's join too)."""
    return called_from(stack, "wait", threading.__file__) or called_from(stack, "join", threading.__file__)


def main_thread_waits_on_a_future() -> bool:
    """Whether the main thread is blocked in ``concurrent.futures.Future.result`` or ``exception``,
    or ``concurrent.futures.wait``, now (``main_thread_blocked_in``), e.g. a run_batch waiting for
    its next item (``lmnb_engine.waits.future_result`` waits in ``exception``)."""
    import concurrent.futures._base as futures

    return main_thread_blocked_in(
        lambda stack: any(called_from(stack, name, futures.__file__) for name in ("result", "exception", "wait")))


def pace_stream(backend, monkeypatch) -> threading.Event:
    """Make ``backend.generate_stream`` send each delta after a non-empty one only once the reader
    has set the returned event (on taking a chunk), at most 10 s later: a test counting the chunks
    of a short stream got it as one chunk when a loaded machine held the reader up meanwhile."""
    taken = threading.Event()
    real = backend.generate_stream

    def generate_stream(*args, **kwargs):
        sent_text = False
        for delta, meta in real(*args, **kwargs):
            if sent_text:
                taken.wait(10)
                taken.clear()
            sent_text = bool(delta)
            yield delta, meta

    monkeypatch.setattr(backend, "generate_stream", generate_stream)
    return taken


class _FakeTokenizer:
    bos_token, eos_token, pad_token, unk_token = "<s>", "</s>", None, None
    bos_token_id = None


class RecordingHandle:
    def __init__(self, rid, events):
        self.rid, self.n, self._events = rid, 1, events
        self.done = True

    def events(self):
        yield from self._events

    def subscribe(self, listener):
        for ev in self._events:
            listener(ev)

    def result(self):
        return self._events[-1].result

    def abort(self):
        return False


class RecordingEngine:
    """The ``lmnb_engine.Engine`` surface the server and the in-process backend use, with a
    character-level tokenizer and replies from ``reply(prompt_text, params) -> str``, ending with
    finish reason ``finish`` ("length" unless set). Every ``SamplingParams`` received is kept in
    ``received``."""

    chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    model_path = "recording-engine"
    context_len = 4096
    tokenizer = _FakeTokenizer()

    def __init__(self, reply: Optional[Callable] = None):
        self.reply = reply or (lambda text, params: "x" * params.max_new_tokens)
        self.finish = "length"
        self.received: list = []
        self.prompts: list = []
        self._lock = threading.Lock()

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def prompt_ids(self, text):  # (Engine's: this tokenizer adds no BOS, so the text's own ids)
        return self.encode(text)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def model_info(self):
        return {"model_path": self.model_path, "context_len": self.context_len}

    def apply_chat_template(self, messages, add_generation_prompt=True, chat_template_kwargs=None,
                            continue_final_message=False):
        text = "".join(f"[{m['role']}]{m['content']}\n" for m in messages)
        if continue_final_message:  # (transformers' render: the text ends with the last content)
            return text[:-1]
        return text + ("[assistant]" if add_generation_prompt else "")

    def submit(self, prompt, params, rid=None):
        from lmnb_engine.outputs import FinishReason, GenerateResult, RequestMeta, StreamEvent

        params.validate()
        text = prompt if isinstance(prompt, str) else self.decode(prompt)
        with self._lock:
            self.received.append(params)
            self.prompts.append(text)
        out = self.reply(text, params)[: params.max_new_tokens]
        rid = rid or uuid.uuid4().hex
        ids = self.encode(out)
        result = GenerateResult(
            rid=rid, text=out, token_ids=ids, finish_reason=FinishReason(self.finish),
            meta=RequestMeta(prompt_tokens=len(text), cached_tokens=0, completion_tokens=len(ids)),
        )
        events = [StreamEvent(rid, ch, [i]) for ch, i in zip(out, ids)]
        events.append(StreamEvent(rid, "", [], finished=True, result=result))
        return RecordingHandle(rid, events)

    def generate(self, prompt, params):
        return self.submit(prompt, params).result()

    def abort(self, rid):
        return False

    def flush_cache(self):
        return True

    def cache_stats(self):
        return {}

    def shutdown(self):
        pass


@contextlib.contextmanager
def live_server(engine, api_key=None, served_model_name=None, **app_options):
    """``lmnb serve``'s app for ``engine`` on a free 127.0.0.1 port in a thread; yields the URL.
    ``app_options`` go to ``create_app`` (``max_body_mb``)."""
    import uvicorn

    from lmnb_engine.http_server import create_app

    app = create_app(engine, api_key=api_key, served_model_name=served_model_name, **app_options)
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        yield url


@contextlib.contextmanager
def serving(server):
    """Run the uvicorn ``server`` on a free 127.0.0.1 port in a thread; yields its URL and the
    thread, which ends when the server has stopped. Stops it on leaving."""
    import socket

    # the server listens on this very socket: a port found free, closed and bound again by uvicorn
    # could be taken meanwhile (another test process, an outgoing connection's ephemeral port)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    try:
        while not server.started:
            if time.time() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", thread
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def send(handler, status: int, data: bytes, kind: str = "application/json") -> None:
    """Answer ``handler``'s request (a ``BaseHTTPRequestHandler``) with ``status`` and body ``data``."""
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def keyed_server():
    """A server on a free 127.0.0.1 port that answers every GET as ``lmnb serve --api-key K``
    does to a client without the key (HTTP 401, "missing or wrong API key"); yields its URL."""
    import http.server as hs

    class Handler(hs.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            send(self, 401, b'{"error": {"message": "missing or wrong API key (send Authorization: Bearer <key>)", '
                            b'"code": 401}}')

    with serve_http(Handler) as url:
        yield url


@contextlib.contextmanager
def serve_http(handler):
    """``handler`` (an ``http.server.BaseHTTPRequestHandler`` class, or a factory of one) served by
    a ``ThreadingHTTPServer`` on a free 127.0.0.1 port in a thread; yields the base URL
    (``http://127.0.0.1:PORT``) and shuts the server down after."""
    import http.server as hs

    server = hs.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a handler still blocked (a stalled stream) does not hold the exit
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def served_url(proc) -> str:
    """The URL in the "serving ... on URL" line of ``lmnb serve`` running as ``proc`` (a Popen with
    its output merged into a text stdout), once /health answers there (``--port 0`` servers: the
    line names the port the system picked)."""
    import httpx

    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("lmnb serve: serving "):
            url = line.rsplit(" on ", 1)[1].strip()
            break
    else:
        raise AssertionError("lmnb serve ended without serving:\n" + "".join(lines))
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.time() < deadline, "lmnb serve did not answer /health"
        time.sleep(0.2)
