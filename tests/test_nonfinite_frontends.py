"""A model whose logits turn NaN, as each front end reports it: ``select`` (both scoring methods, in
process and through ``RuntimeEndpoint``), SGLang's ``/generate`` (valid JSON, the abort and its
message) and the OpenAI routes (a 500 JSON error that leaves the connection usable).

One embedding row is set to NaN, so exactly the prompts holding that token fail: the engine's own
failure path, with no stand-in for the model."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest

import lmnb as sgl
from helpers_engine import nan_embedding
from helpers_lang import live_server
from lmnb.backend.engine import UNCONDITIONAL_CONTEXT

PROMPT = "Is it true? Yes or no:"
CHOICES = [" yes", " no"]


@pytest.fixture(scope="module")
def url(tiny_engine):
    with live_server(tiny_engine, served_model_name="m") as u:
        yield u


@pytest.fixture()
def endpoint(url):
    """A ``RuntimeEndpoint`` on the server, shut down after the test: left to the garbage collector
    (a failed program's error holds the test's frame in a cycle), its connection warned
    "ResourceWarning: unclosed <socket.socket ...>" in whichever later test collected it."""
    backend = sgl.RuntimeEndpoint(url)
    yield backend
    backend.shutdown()


@pytest.fixture()
def poison(tiny_engine):
    """``poison(token_id)`` sets that embedding row to NaN until the test ends."""
    with contextlib.ExitStack() as stack:

        def set_nan(token_id: int) -> None:
            stack.enter_context(nan_embedding(tiny_engine, token_id))
            tiny_engine.flush_cache()

        yield set_nan
    tiny_engine.flush_cache()


@sgl.function
def pick(s, method):
    s += PROMPT + sgl.select("c", choices=CHOICES, choices_method=method)


def only_in(engine, text: str, *others: str) -> int:
    """A token of ``text`` that none of ``others`` holds."""
    taken = set().union(*(engine.encode(o) for o in others))
    return next(t for t in engine.encode(text) if t not in taken)


@pytest.mark.parametrize("where", ["in-process", "RuntimeEndpoint"])
def test_select_fails_when_the_unconditional_scores_are_nan(tiny_engine, request, poison, where):
    backend = sgl.Engine(engine=tiny_engine) if where == "in-process" else request.getfixturevalue("endpoint")
    assert pick.run(method=sgl.unconditional_likelihood_normalized, backend=backend)["c"] in CHOICES
    poison(only_in(tiny_engine, UNCONDITIONAL_CONTEXT, PROMPT, *CHOICES))
    st = pick.run(method=sgl.token_length_normalized, backend=backend)  # conditional scores are fine
    assert st["c"] in CHOICES
    st = pick.run(method=sgl.unconditional_likelihood_normalized, backend=backend)
    with pytest.raises(sgl.ProgramError, match="aborted: the model produced NaN or infinite logits"):
        st["c"]


def test_select_fails_when_the_prompt_scores_are_nan_through_the_server(tiny_engine, endpoint, poison):
    poison(only_in(tiny_engine, PROMPT, *CHOICES))
    st = pick.run(method=sgl.token_length_normalized, backend=endpoint)
    with pytest.raises(sgl.ProgramError, match="scoring on the server was aborted: the model produced NaN"):
        st["c"]


@pytest.mark.parametrize("stream", [False, True])
def test_generate_route_reports_the_abort_in_valid_json(tiny_engine, url, poison, stream):
    poison(only_in(tiny_engine, "the cat sat on the mat", ""))
    body = {"text": "the cat sat on the mat", "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "stream": stream}
    r = httpx.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200
    if stream:  # every event is strict JSON (no NaN): json.loads with NaN refused
        events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        out = [json.loads(e, parse_constant=lambda c: pytest.fail(f"{c} in the stream")) for e in events[:-1]][-1]
    else:
        out = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in the response"))
    fr = out["meta_info"]["finish_reason"]
    assert fr["type"] == "abort" and "NaN or infinite logits while scoring the prompt" in fr["message"]
    assert None in [e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]  # the NaN ones, as null


def test_openai_abort_is_a_json_error_and_the_connection_stays_usable(tiny_engine, url, poison):
    poison(only_in(tiny_engine, "the cat sat on the mat", "a dog ran"))
    with httpx.Client(base_url=url, timeout=60) as client:  # one keep-alive connection
        for _ in range(2):
            r = client.post("/v1/completions", json={"model": "m", "prompt": "the cat sat on the mat", "max_tokens": 3})
            assert r.status_code == 500
            assert "aborted: the model produced NaN or infinite logits" in r.json()["error"]["message"]
        clean = {"model": "m", "prompt": "a dog ran", "max_tokens": 3, "temperature": 0}
        r = client.post("/v1/completions", json=clean)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
