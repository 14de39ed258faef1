"""A 503's Retry-After that str.isdigit() takes but float() does not (a superscript digit, which
the header's latin-1 holds) escaped from RuntimeEndpoint as a bare ValueError; it is ignored as
any Retry-After that is not whole seconds is, and the request is sent again after the delay."""

from __future__ import annotations

from lmnb.backend.base import Prompt

from test_lang_server_responses import PARAMS, endpoint, send, server  # noqa: F401 - fixtures


def test_a_retry_after_that_is_not_ascii_digits_is_ignored(server, endpoint, monkeypatch):  # noqa: F811
    from lmnb.backend import runtime_endpoint

    monkeypatch.setattr(runtime_endpoint, "RETRY_503_DELAYS_S", (0.01,))
    tries = []

    def respond(h, b):
        tries.append(b["rid"])
        if len(tries) > 1:
            return send(h, 200, b'{"text": "Hello", "meta_info": {"finish_reason": {"type": "length"}}}')
        full = b'{"error": "busy"}'
        h.send_response(503)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(full)))
        h.send_header("Retry-After", "\u00b2")
        h.end_headers()
        h.wfile.write(full)

    server.answer = respond
    assert [c.text for c in endpoint.generate(Prompt("Hi"), PARAMS, "r1")] == ["Hello"]
    assert len(tries) == 2
