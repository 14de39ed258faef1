"""A streamed gen's read timeout counts the server's time, not the consumer's: a reader that holds
an event longer than the timeout (a slow listener) must not fail a healthy stream whose next
events have come already."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

import lmnb
from lmnb.backend.base import Prompt
from lmnb.ir import GenParams

from helpers_lang import serve_http


@pytest.fixture
def fast_url():
    """A server whose stream sends its first event, then the rest once the consumer holds that one
    (``held``, set by the test): the rest comes while the consumer holds the stream, read after it
    as bytes of their own, where the backend checks the time since the last event."""
    held = threading.Event()

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
            for text, fin in (("Hel", None), ("Hello", None), ("Hello!", {"type": "stop"})):
                event = {"text": text, "meta_info": {"finish_reason": fin}}
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
                held.wait(60)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    with serve_http(Handler) as url:
        yield url, held


def test_slow_consumer_does_not_time_out_a_healthy_stream(fast_url):
    # (the server's answers must come within the timeout: 0.3 s was tight for a loaded machine, 1 s
    # left 0.7 s more; 5 s leaves any plausible pause)
    url, held = fast_url
    backend = lmnb.RuntimeEndpoint(url, timeout=5.0)
    try:
        out = []
        for delta, _ in backend.generate_stream(Prompt("Hi"), GenParams(max_new_tokens=8), "r1"):
            out.append(delta)
            if len(out) == 1:
                held.set()
                time.sleep(5.1)  # the consumer, not the server, holds the stream, longer than the timeout
        assert "".join(out) == "Hello!"
    finally:
        backend.shutdown()
