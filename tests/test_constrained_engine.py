"""Constrained requests through ``Engine``: errors at submission, finish semantics, streaming,
logprobs, several samples, and jump-forward under memory pressure and aborts."""

from __future__ import annotations

import math
import threading
import re

import pytest

from lmnb_engine import Engine, SamplingParams
from lmnb_engine.constrained import INCOMPLETE_MESSAGE, GrammarError
from tests.helpers_engine import assert_idle_accounting

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "city": {"enum": ["paris", "london", "tokyo"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "city", "age"],
}


@pytest.fixture(scope="module")
def engines(tiny_llama):
    with Engine(str(tiny_llama), max_total_tokens=8192) as on, Engine(
        str(tiny_llama), max_total_tokens=8192, disable_jump_forward=True
    ) as off:
        yield on, off


@pytest.mark.parametrize(
    "constraint, named",
    [
        ({"regex": r"(ab)\1"}, "back-reference"),
        ({"regex": r"(?<=a)b"}, "lookbehind"),
        ({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 1}}, '"minProperties"'),
        ({"regex": "a[^\\x00-\\U0010FFFF]"}, "matches no character an output may hold"),
        ({"json_schema": False}, "JSON schema false accepts no value"),
    ],
)
def test_bad_constraints_fail_at_submission_and_queue_nothing(engines, constraint, named):
    on = engines[0]
    with pytest.raises(GrammarError, match=re.escape(named)):
        on.submit("x", SamplingParams(**constraint))
    with pytest.raises(ValueError, match=re.escape(named)):  # GrammarError is a ValueError
        on.generate(["x", "y"], SamplingParams(**constraint))
    assert_idle_accounting(on)


def test_the_schema_true_generates_a_json_value(engines):
    """JSON Schema's ``true`` (any value) was refused; a finished output is one JSON value."""
    import json

    rs = engines[0].generate("x", SamplingParams(n=4, max_new_tokens=24, seed=3, json_schema=True))
    for r in rs:
        # a stop, or a cut by the limit after a whole value (a number that could go on): no message
        if r.finish_reason.type == "stop" or r.finish_reason.message is None:
            json.loads(r.text)
        else:
            assert r.finish_reason.type == "length" and r.finish_reason.message == INCOMPLETE_MESSAGE
            with pytest.raises(json.JSONDecodeError):
                json.loads(r.text)


def test_token_limit_cut_is_length_and_says_incomplete(engines):
    on = engines[0]
    r = on.generate("Person:", SamplingParams(max_new_tokens=4, temperature=0.0, json_schema=PERSON))
    assert r.finish_reason.type == "length" and r.finish_reason.message == INCOMPLETE_MESSAGE
    assert len(r.token_ids) == 4
    # a full match cut by the limit is complete: no message
    r = on.generate("Digits:", SamplingParams(max_new_tokens=3, temperature=0.0, regex="[0-9]+"))
    assert r.finish_reason.type == "length" and re.fullmatch("[0-9]+", r.text)
    assert r.finish_reason.message is None


def test_no_token_budget_says_incomplete_unless_the_empty_text_matches(engines):
    # max_new_tokens=0 returns the empty text: not a match of [0-9]+, a full match of a?
    for engine in engines:
        r = engine.generate("Digits:", SamplingParams(max_new_tokens=0, regex="[0-9]+"))
        assert r.text == "" and r.finish_reason.type == "length"
        assert r.finish_reason.message == INCOMPLETE_MESSAGE
        r = engine.generate("Digits:", SamplingParams(max_new_tokens=0, regex="a?"))
        assert r.text == "" and r.finish_reason.type == "length" and r.finish_reason.message is None


def test_stop_strings_and_stop_ids_end_constrained_text_as_on_unconstrained_requests(engines):
    # SGLang and OpenAI apply stops to constrained output too; the reference is the full match
    # (no stops) cut where the stop occurs, and the stop text itself is not returned.
    pattern = r"Name: [a-z]{3}, done\. Bye, [a-z]{2}"
    for engine in engines:  # jump-forward on and off
        full = engine.generate("Go:", SamplingParams(max_new_tokens=64, temperature=0.0, regex=pattern))
        assert re.fullmatch(pattern, full.text) and full.finish_reason.type == "stop"
        stops = SamplingParams(max_new_tokens=64, temperature=0.0, regex=pattern, stop=[", ", "done"])
        r = engine.generate("Go:", stops)
        assert r.text == full.text[: full.text.index(", ")]
        assert r.finish_reason.type == "stop" and r.finish_reason.matched == ", "
        assert r.meta.jumped_tokens == 0  # stops are checked token by token: no forced strings
        comma = next(t for t in full.token_ids if "," in engine.decode([t]))
        r = engine.generate("Go:", stops.copy(stop=None, stop_token_ids=[comma]))
        k = full.token_ids.index(comma)
        assert r.token_ids == full.token_ids[: k + 1]  # the stop token is an output id, not text
        assert r.text == engine.decode(full.token_ids[:k])
        assert r.finish_reason.type == "stop" and r.finish_reason.matched == comma
    assert full.meta.jumped_tokens == 0 and engines[0].generate(
        "Go:", SamplingParams(max_new_tokens=64, temperature=0.0, regex=pattern)).meta.jumped_tokens > 0


def test_stream_never_shows_unverified_draft_text(engines):
    on, off = engines
    p = SamplingParams(max_new_tokens=128, temperature=0.0, json_schema=PERSON)
    events = list(on.stream("Person:", p))
    final = events[-1].result
    assert "".join(e.text_delta for e in events) == final.text
    assert [t for e in events for t in e.token_ids] == final.token_ids
    assert final.text == off.generate("Person:", p).text and final.meta.jumped_tokens > 0


def test_logprobs_with_jump_forward_match_plain_decoding(engines):
    on, off = engines
    p = SamplingParams(max_new_tokens=128, temperature=0.0, json_schema=PERSON, return_logprob=True)
    a, b = on.generate("Person:", p), off.generate("Person:", p)
    assert a.token_ids == b.token_ids and a.meta.jumped_tokens > 0
    assert all(not math.isnan(lp.logprob) for lp in a.logprobs)
    assert [lp.logprob for lp in a.logprobs] == pytest.approx([lp.logprob for lp in b.logprobs], abs=1e-4)


def test_seeded_sampling_gives_the_same_output_with_jump_forward_on_and_off(engines):
    """The Engine promises the same output either way. Sampled tokens used to come from a stream
    of draws, one per sampled row: jump-forward's certain tokens take no draw and a rejected draft
    position takes one, so every later token got another draw than in one-token decoding and the
    JSON differed from its first free-text field on."""
    on, off = engines
    p = SamplingParams(n=2, max_new_tokens=128, temperature=1.0, seed=3, json_schema=PERSON)
    a, b = on.generate("Person:", p), off.generate("Person:", p)
    assert [r.text for r in a] == [r.text for r in b]
    assert all(r.meta.jumped_tokens > 0 for r in a) and all(r.meta.jumped_tokens == 0 for r in b)


def test_several_samples_each_validate(engines):
    import json

    import jsonschema

    on = engines[0]
    results = on.generate("Person:", SamplingParams(n=3, max_new_tokens=128, temperature=1.0, seed=7, json_schema=PERSON))
    assert len(results) == 3
    for r in results:
        assert r.finish_reason.type == "stop"
        jsonschema.validate(json.loads(r.text), PERSON)


def test_retraction_chunking_and_aborts_keep_outputs_exact_and_memory_accounted(tiny_llama, engines, monkeypatch):
    """A pool too small for all requests forces retractions and a small prefill budget chunks
    prompts: either way a pending jump-forward draft is dropped (and its KV given back) and
    output stays exact. Aborted requests keep only verified text."""
    import threading

    from lmnb_engine.scheduler import Scheduler

    dropped = []
    drop = Scheduler._drop_draft

    def spy(self, req):
        dropped.append(req.num_speculative)
        drop(self, req)

    monkeypatch.setattr(Scheduler, "_drop_draft", spy)
    off = engines[1]
    prompts = [f"Person number {i}:" for i in range(16)]
    p = SamplingParams(max_new_tokens=56, temperature=0.0, regex=r"( item=[a-z]){14}")
    expected = [r.text for r in off.generate(prompts, p)]
    with Engine(str(tiny_llama), max_total_tokens=100, max_running_requests=16, chunked_prefill_size=24) as small:
        gate = threading.Event()
        small.scheduler.call(gate.wait)  # hold the scheduler so the whole batch arrives at once
        handles = [small.submit(q, p) for q in prompts]
        gate.set()
        assert [h.result().text for h in handles] == expected
        assert small.cache_stats()["retracted_requests"] > 0 and any(dropped)
        assert_idle_accounting(small)
        handles = [small.submit(q, p) for q in prompts]
        aborted = handles[1::4]
        for h in aborted:
            h.abort()
        for i, h in enumerate(handles):
            r = h.result()
            if h in aborted and r.finish_reason.type == "abort":
                assert expected[i].startswith(r.text)
            else:
                assert r.text == expected[i]
        assert_idle_accounting(small)


def test_json_extraction_program_through_the_language(engines):
    """issue 5: a program with json_schema, a regex field, choices and dtype=int, on the engine."""
    import json

    import jsonschema

    import lmnb

    @lmnb.function
    def extract(s, text):
        s += "Text: " + text + "\nRecord: "
        s += lmnb.gen("record", max_tokens=96, temperature=0.0, json_schema=PERSON)
        s += "\nCode: " + lmnb.gen("code", max_tokens=16, temperature=0.0, regex=r"[A-Z]{2}-[0-9]{3}")
        s += "\nMood: " + lmnb.gen("mood", choices=["happy", "sad", "neutral"])
        s += "\nCount: " + lmnb.gen("count", max_tokens=8, temperature=0.0, dtype=int)

    state = extract.run(text="Arvel, a baker from Paris, is 41.", backend=lmnb.Engine(engine=engines[0]))
    jsonschema.validate(json.loads(state["record"]), PERSON)
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", state["code"])
    assert state["mood"] in ("happy", "sad", "neutral")
    assert isinstance(state["count"], int)


@pytest.mark.parametrize("chunk", [2, 3, 5])
def test_a_draft_after_the_last_prompt_chunk_is_verified_in_one_piece(tiny_llama, engines, chunk):
    """The draft jump-forward appends when a chunked prompt's last chunk samples is output, not
    prompt: it runs as a running request's draft does. (It was chunked like more prompt, split,
    and the request failed on the scheduler's assertion that a draft is never served unverified.)"""
    _, off = engines
    params = SamplingParams(max_new_tokens=30, temperature=0.0, regex=r'\{"name": "[a-z]+", "age": [0-9]+\}')
    prompts = ["the red cat and the blue dog", "one two three four five six"]
    with Engine(str(tiny_llama), max_total_tokens=1024, chunked_prefill_size=chunk) as eng:
        for prompt in prompts:
            r, ref = eng.generate(prompt, params), off.generate(prompt, params)
            assert r.meta.jumped_tokens > 0
            assert (r.token_ids, r.finish_reason.type) == (ref.token_ids, ref.finish_reason.type)
        assert_idle_accounting(eng)


def test_the_grammar_compile_limits_are_engine_options(tiny_llama):
    from lmnb_engine.constrained import GrammarCompileStopped

    for bad, words in [(dict(grammar_compile_timeout_s=0), "grammar_compile_timeout_s=0 must be a number of seconds > 0"),
                       (dict(grammar_compile_timeout_s="60"), "grammar_compile_timeout_s='60'"),
                       (dict(grammar_compile_memory_bytes=-1), "grammar_compile_memory_bytes=-1 must be >= 0")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            Engine(str(tiny_llama), device="cpu", **bad)
    with pytest.raises(TypeError, match="grammar_compile_memory_bytes must be an int"):
        Engine(str(tiny_llama), device="cpu", grammar_compile_memory_bytes=1.5)
    # (past what the platform takes: each compile failed in its own words, the child's setrlimit
    # "Python int too large to convert to C long" with "retry the request", or a wait's "timestamp
    # out of range for platform time_t", each at the first constrained request)
    for bad, said in [(dict(grammar_compile_memory_bytes=2**63), "grammar_compile_memory_bytes=9223372036854775808 is "
                       "more than an address-space limit can be (at most 9223372036854775807 bytes, 2**63 - 1); give "
                       "less, or 0 for no limit"),
                      (dict(grammar_compile_memory_bytes=-10**5000), "grammar_compile_memory_bytes=-1.000e+5000 (an "
                       "integer of 5001 digits) must be >= 0 (0 = no limit, None = 8 GiB)"),
                      (dict(grammar_compile_timeout_s=1e300), "grammar_compile_timeout_s=1e+300 is longer than this "
                       f"platform's waits take (at most {threading.TIMEOUT_MAX:.0f} s, threading.TIMEOUT_MAX); give at "
                       "most that")]:
        with pytest.raises(ValueError) as e:
            Engine(str(tiny_llama), device="cpu", **bad)
        assert str(e.value) == said
    eng = Engine(str(tiny_llama), device="cpu", max_total_tokens=512, grammar_compile_timeout_s=1.5,
                 grammar_compile_memory_bytes=0)
    try:
        # 2**26 DFA states (which of the last 26 letters were an "a"): stopped at 1.5 s, not 60
        with pytest.raises(GrammarCompileStopped, match="1.5 s"):
            eng.generate("x", SamplingParams(max_new_tokens=4, regex="[a-z]*a[a-z]{26}"))
        assert eng._grammar_backend.compile_memory_bytes is None  # 0: no address-space limit
    finally:
        eng.shutdown()


def test_sampled_dates_and_date_times_pass_the_format_checker(engines):
    """Sampled on a random model, 8 of 8 failed the check before (Unicode digits, 15-digit years)."""
    import json

    import jsonschema

    checker = jsonschema.FormatChecker()
    on, _ = engines
    for fmt in ("date", "date-time"):
        rs = on.generate([5, 6, 7], SamplingParams(max_new_tokens=80, seed=0, n=8, json_schema={"type": "string", "format": fmt}))
        values = [json.loads(r.text) for r in rs if r.finish_reason.type == "stop"]
        assert len(values) >= 6, [r.text for r in rs]  # most finish within 80 tokens
        assert all(checker.conforms(v, fmt) for v in values), values


def test_sampled_formats_lengths_and_decimal_bounds_validate(engines):
    """Formats, a pattern with a length and fractional bounds, sampled on a random model and
    checked by jsonschema's draft 2020-12 format checker (lmnb refused all of them before)."""
    import json

    import jsonschema

    schema = {"type": "object", "required": ["code", "score", "at", "site"], "properties": {
        "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4},
        "score": {"type": "number", "exclusiveMinimum": 0.25, "maximum": 0.75},
        "at": {"type": "string", "format": "time"},
        "site": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083}}}
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    on, _ = engines
    rs = on.generate([5, 6, 7], SamplingParams(max_new_tokens=400, seed=1, n=6, json_schema=schema))
    values = [json.loads(r.text) for r in rs if r.finish_reason.type == "stop"]
    assert len(values) >= 3, [r.text for r in rs]
    assert all(validator.is_valid(v) for v in values), values


def test_a_schema_pattern_with_ecma_named_groups_is_taken_and_its_outputs_match_it(engines, tiny_llama):
    """JSON Schema's patterns are ECMA 262's, where (?<year>...) names a group; the engine, reading
    a pattern with Python's re (which has no such syntax), refused it and offered the pattern
    with a plain group. A name changes no string the pattern matches: the engine takes it, in a
    dict, in a pydantic class (whose Rust regex reads it too) and over HTTP, and every output is
    a JSON string that fully matches the pattern with plain groups (the reference, Python's re)."""
    import json

    from pydantic import BaseModel, Field

    from helpers_lang import live_server

    pattern, python = r"(?<year>\d{4})-(?<m>\d{2})|x(?<m>[a-c])", r"(\d{4})-(\d{2})|x([a-c])"  # (a name twice: ES2025)
    schema = {"type": "string", "pattern": pattern}

    class Dated(BaseModel):
        d: str = Field(pattern=r"^(?<year>\d{4})-\d{2}$")

    on = engines[0]
    rs = on.generate("x", SamplingParams(n=6, seed=2, max_new_tokens=16, json_schema=schema))
    dated = on.generate("x", SamplingParams(n=4, seed=2, max_new_tokens=24, json_schema=Dated))
    with live_server(on, served_model_name="x") as url:
        import httpx

        served = httpx.post(f"{url}/generate", json={"text": "x", "sampling_params": {
            "max_new_tokens": 16, "temperature": 0, "json_schema": json.dumps(schema)}}, timeout=60)
    assert served.status_code == 200, served.text
    texts = [r.text for r in rs if r.finish_reason.type == "stop"] + [served.json()["text"]]
    assert len(texts) >= 4, [r.text for r in rs]
    assert all(re.fullmatch(python, json.loads(t)) for t in texts), texts
    values = [Dated.model_validate_json(r.text).d for r in dated if r.finish_reason.type == "stop"]
    assert values and all(re.fullmatch(r"\d{4}-\d{2}", v) for v in values), [r.text for r in dated]


def test_a_grammar_allowing_only_tokens_min_new_tokens_bans_is_refused_or_aborted_by_name(engines, caplog):
    """A grammar whose every allowed token is a stop token id (or EOS) that min_new_tokens still
    bans left no token: the argmax of all -inf logits, token 0, failed the grammar, and the request
    aborted as an "internal error" with a "scheduler step failed" traceback at ERROR. A conflict at
    the first token is refused at submission; a later one aborts that request, naming it."""
    import logging

    from lmnb_engine.params import SamplingParamsError

    on = engines[0]
    a = on.encode("a", add_special_tokens=False)[-1]
    digits = [on.encode(str(d), add_special_tokens=False)[-1] for d in range(10)]
    for regex, stops in (("a+", [a]), ("[0-9]", digits)):
        with pytest.raises(SamplingParamsError, match=re.escape(
                "min_new_tokens=2 conflicts with the regex: at output token 1 the regex allows only tokens that "
                "min_new_tokens=2 bans until 2 tokens are out: the stop token ids / EOS; set min_new_tokens=0 or "
                "remove those stop_token_ids")) as e:
            on.submit("x", SamplingParams(max_new_tokens=5, min_new_tokens=2, regex=regex, stop_token_ids=stops))
        assert e.value.field == "min_new_tokens"
    with pytest.raises(SamplingParamsError, match="min_new_tokens=1 bans until 1 token is out: "):  # ("1 tokens are")
        on.submit("x", SamplingParams(max_new_tokens=5, min_new_tokens=1, regex="a+", stop_token_ids=[a]))
    # each digit is one token of the tiny vocabulary, and none is part of a longer one with "a":
    # after the digit only "a" may follow, and min_new_tokens bans it
    assert not any(re.fullmatch("[0-9]a.*", on.decode([t])) for t in range(on.loaded.config.vocab_size))
    plain = SamplingParams(temperature=0.0, max_new_tokens=5)
    alone = on.generate("Go:", plain)
    bad = SamplingParams(temperature=0.0, max_new_tokens=5, min_new_tokens=2, regex="[0-9]a", stop_token_ids=[a])
    with caplog.at_level(logging.ERROR):
        h_bad, h_plain = on.submit("Digits:", bad), on.submit("Go:", plain)
        r, other = h_bad.result(), h_plain.result()
    assert r.finish_reason.type == "abort" and len(r.token_ids) == 1 and r.token_ids[0] in digits
    assert r.finish_reason.field == "min_new_tokens"  # (the caller's settings, not a failure: front ends say so)
    assert r.finish_reason.message == (
        "no token was allowed at output token 2: the regex allows only tokens that min_new_tokens=2 bans until 2 "
        "tokens are out: the stop token ids / EOS; lower min_new_tokens to at most 1 or remove those stop_token_ids")
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert other.token_ids == alone.token_ids and other.finish_reason == alone.finish_reason
    ok = on.generate("Digits:", bad.copy(min_new_tokens=1))  # and the engine goes on: "a" may now stop it
    assert ok.token_ids == [r.token_ids[0], a] and ok.finish_reason.type == "stop" and ok.finish_reason.matched == a
    assert_idle_accounting(on)


def test_a_grammar_that_completes_before_min_new_tokens_aborts_by_name_and_no_sooner(engines):
    """A finite grammar that can produce fewer tokens than min_new_tokens ended quietly with
    finish reason stop after its last token: the engine ends a complete grammar itself (no EOS is
    sampled), so min_new_tokens, which bans that EOS, was never checked. It now aborts as the
    other grammar / min_new_tokens conflicts do (field min_new_tokens, the message naming both and
    the fix), with the tokens up to the match; min_new_tokens up to the grammar's length stops."""
    on, off = engines
    vocab = range(on.loaded.config.vocab_size)
    # every token the regex can take is one character (no "aa" or "12" token): always 3 tokens
    assert [on.decode([t]) for t in vocab if re.fullmatch("a+", on.decode([t]))] in (["a"], ["a", "a"])
    assert all(len(on.decode([t])) == 1 for t in vocab if re.fullmatch("[0-9]+", on.decode([t])))
    for eng in (on, off):
        for regex, text in (("a{3}", "aaa"), ("[0-9]{3}", None)):
            done = SamplingParams(temperature=0.0, max_new_tokens=10, min_new_tokens=3, regex=regex)
            ok = eng.generate("Digits:", done)
            assert ok.finish_reason.type == "stop" and ok.finish_reason.field is None and len(ok.token_ids) == 3
            assert ok.text == (text or ok.text) and re.fullmatch(regex, ok.text)
            assert eng.generate("Digits:", done.copy(min_new_tokens=0)).token_ids == ok.token_ids
            for m in (4, 8):
                r = eng.generate("Digits:", done.copy(min_new_tokens=m))
                assert (r.token_ids, r.text) == (ok.token_ids, ok.text)  # the output up to the match, kept
                assert r.finish_reason.type == "abort" and r.finish_reason.field == "min_new_tokens"
                assert r.finish_reason.message == (
                    f"output token 3 completed the match: the regex allows only tokens that min_new_tokens={m} bans "
                    f"until {m} tokens are out: EOS, as nothing can follow the match; lower min_new_tokens to at "
                    "most 3 or let the regex match longer output")
    # a JSON schema's: its one token, then nothing but EOS
    five = on.encode("5", add_special_tokens=False)[-1]
    r = on.generate("x", SamplingParams(temperature=0.0, max_new_tokens=5, min_new_tokens=2, json_schema={"const": 5}))
    assert r.token_ids == [five] and (r.finish_reason.type, r.finish_reason.field) == ("abort", "min_new_tokens")
    assert r.finish_reason.message == (
        "output token 1 completed the match: the JSON schema allows only tokens that min_new_tokens=2 bans until 2 "
        "tokens are out: EOS, as nothing can follow the match; lower min_new_tokens to at most 1 or let the JSON "
        "schema match longer output")
    assert on.generate("x", SamplingParams(temperature=0.0, max_new_tokens=5, min_new_tokens=1,
                                           json_schema={"const": 5})).finish_reason.type == "stop"
    assert_idle_accounting(on)
    assert_idle_accounting(off)


def test_a_grammar_completed_by_a_jump_counts_the_output_then_not_its_unverified_draft():
    """Jump-forward appends a draft and ends a request whose certain tokens complete the grammar:
    the count against min_new_tokens is of output tokens then, not of a draft still unverified."""
    from types import SimpleNamespace

    from lmnb_engine.sampler import grammar_end_reason

    def req(n, speculative, m):
        return SimpleNamespace(params=SamplingParams(regex="a{3}", max_new_tokens=10, min_new_tokens=m),
                               grammar=object(), output_ids=[1] * n, num_speculative=speculative)

    assert grammar_end_reason(req(5, 2, 3)).type == "stop"
    r = grammar_end_reason(req(5, 2, 4))
    assert (r.type, r.field) == ("abort", "min_new_tokens") and r.message.startswith("output token 3 completed")
    assert grammar_end_reason(req(1, 0, 1)).type == "stop"
    assert grammar_end_reason(req(1, 0, 0)).type == "stop"


def test_ignore_eos_does_not_keep_a_constrained_output_going_past_an_eos_its_grammar_allows(engines):
    """By design (``lmnb_engine.constrained``, ``SamplingParams.ignore_eos``' docstring): EOS is a
    constrained output's end where its text fully matches, ignore_eos or not. "a( a)*" matches
    after each "a", so a sample may end at any of them before max_new_tokens=20; with ignore_eos
    it ends where it ends without, at the model's EOS, named in matched."""
    on, _ = engines
    eos = on.tokenizer.eos_token_id
    early = 0
    for seed in range(10):
        params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=seed, regex="a( a)*")
        kept_going, plain = (on.generate("the cat", params.copy(ignore_eos=ignore)) for ignore in (True, False))
        assert (kept_going.token_ids, kept_going.finish_reason) == (plain.token_ids, plain.finish_reason)
        assert re.fullmatch("a( a)*", kept_going.text) and kept_going.finish_reason.matched == eos, kept_going
        early += len(kept_going.token_ids) < 20
    assert early, "no sample ended before max_new_tokens: the test shows nothing"


def test_a_complete_grammar_names_the_models_eos_in_matched(engines):
    """A regex / JSON schema that is complete (nothing but EOS can follow) ends without sampling
    EOS, and its finish reason's matched was None (the OpenAI routes' matched_stop null), where
    SGLang's names the EOS its grammar took. It is now the model's EOS id, with jump-forward on and
    off; the EOS is still not part of the output."""
    from lmnb_engine.outputs import FinishReason

    on, _ = engines
    eos = on.tokenizer.eos_token_id
    assert set(on.eos_token_ids) == {eos}  # (the tiny model has one EOS: the one to name)
    for eng in engines:
        for constraint in ({"regex": "a{3}"}, {"json_schema": {"const": 5}}):
            r = eng.generate("x", SamplingParams(temperature=0.0, max_new_tokens=10, **constraint))
            assert r.finish_reason == FinishReason("stop", matched=eos) and eos not in r.token_ids, r
            assert r.finish_reason.to_dict() == {"type": "stop", "matched": eos}
    # a model with several EOS ids: its tokenizer's own, where it is one of them, else the smallest
    from types import SimpleNamespace

    from lmnb_engine.sampler import grammar_eos

    assert grammar_eos(SimpleNamespace(eos_token_id=128009), frozenset({128001, 128008, 128009})) == 128009
    assert grammar_eos(SimpleNamespace(eos_token_id=2), frozenset({128001, 128008})) == 128001
    assert grammar_eos(SimpleNamespace(eos_token_id=None), frozenset({7, 5})) == 5
    assert grammar_eos(SimpleNamespace(eos_token_id=2), frozenset()) is None


def test_a_min_new_tokens_conflict_with_only_eos_banned_says_to_let_the_grammar_go_on(engines):
    """The min_new_tokens conflict messages (the engine's refusal at the first token, the sampler's
    abort midway) both told the caller to "remove those stop_token_ids", and worded the rest
    differently; where only EOS is banned (no stop token ids), removing them fixes nothing. Both now
    come from one helper and say to lower min_new_tokens or let the grammar match longer output."""
    from types import SimpleNamespace

    from lmnb_engine.sampler import blocked_reason, min_new_tokens_conflict

    on = engines[0]
    # a regex matching only the empty text, which allows only EOS first, is refused as empty before
    # min_new_tokens is weighed (regex_edges.empty_pattern_problem); the words for that conflict:
    with pytest.raises(GrammarError, match=r'regex "a\{0\}" matches only the empty string'):
        on.submit("x", SamplingParams(max_new_tokens=5, min_new_tokens=2, regex="a{0}"))
    assert min_new_tokens_conflict("the regex", 2, 0, stop_ids=False) == (
        "the regex allows only tokens that min_new_tokens=2 bans until 2 tokens are out: EOS; set min_new_tokens=0 "
        "or let the regex match longer output")
    params = SamplingParams(max_new_tokens=5, min_new_tokens=3, json_schema={"type": "string"})
    r = blocked_reason(SimpleNamespace(params=params, grammar=object(), output_ids=[7, 8]))
    assert (r.type, r.field) == ("abort", "min_new_tokens")
    assert r.message == (
        "no token was allowed at output token 3: the JSON schema allows only tokens that min_new_tokens=3 bans until "
        "3 tokens are out: EOS; lower min_new_tokens to at most 2 or let the JSON schema match longer output")


@pytest.mark.timeout(300)
def test_a_listeners_submit_of_a_grammar_not_compiled_yet_does_not_hold_the_scheduler(engines, monkeypatch):
    """A listener (on the scheduler thread) that submitted a regex not compiled yet waited there for
    the compile, and every request waited with it. Its submit now returns at once and the request
    is queued once the compile ends; a failure found then ends that request with an abort naming
    it (its field: the constraint, or min_new_tokens), where a submit elsewhere raises it; an abort
    while it compiles ends it as it arrives."""
    import threading

    from lmnb_engine.constrained import cache
    from lmnb_engine.params import SamplingParamsError

    on = engines[0]
    release, real = threading.Event(), cache.compile_grammar

    refused = "the automaton library refused zq[rs]{2} (as this test makes it)"

    def held(regex, *args, **kwargs):  # every compile waits until the test lets it go on
        assert release.wait(240)
        if "zq[rs]{2}" in regex:  # (a failure only the compile finds: what submit checks passes)
            raise GrammarError(refused)
        return real(regex, *args, **kwargs)

    monkeypatch.setattr(cache, "compile_grammar", held)
    digits = [on.encode(str(d), add_special_tokens=False)[-1] for d in range(10)]
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    constraints = [  # patterns no other test compiles: the grammar cache is the process's
        greedy.copy(regex="q[rs]{3}"),
        greedy.copy(regex="zq[rs]{2}"),  # refused by the compile
        greedy.copy(regex="[0-9]wq", min_new_tokens=2, stop_token_ids=digits),  # its every first token banned
        greedy.copy(regex="v[uw]{2}"),  # aborted while it compiles
    ]
    first = on.submit("x", greedy.copy(max_new_tokens=2))
    submitted, done = [], threading.Event()

    def listener(ev):
        if not submitted:
            submitted.extend(on.submit("Go:", p) for p in constraints)
            done.set()

    try:
        first.subscribe(listener)
        assert done.wait(30)  # (it waited for the compiles, which wait for the release)
        # meanwhile the engine serves other requests, and the constrained ones wait for their compile
        assert len(on.generate("a dog", greedy.copy(max_new_tokens=3)).token_ids) == 3
        assert first.done and not any(h.done for h in submitted)
        assert submitted[3].abort() is True
    finally:
        release.set()
    ok, bad, conflict, aborted = (h.result(timeout=120) for h in submitted)
    assert (aborted.finish_reason.type, aborted.finish_reason.message, aborted.token_ids) == (
        "abort", "aborted by Engine.abort", [])
    assert ok.finish_reason.type == "stop" and re.fullmatch("q[rs]{3}", ok.text), ok
    assert ok.token_ids == on.generate("Go:", constraints[0]).token_ids
    with pytest.raises(GrammarError) as e:
        on.submit("Go:", constraints[1])
    assert (bad.finish_reason.type, bad.finish_reason.field, bad.token_ids) == ("abort", "regex", [])
    assert bad.finish_reason.message == str(e.value) == refused
    with pytest.raises(SamplingParamsError) as e:
        on.submit("Go:", constraints[2])
    assert (conflict.finish_reason.type, conflict.finish_reason.field, conflict.token_ids) == (
        "abort", "min_new_tokens", [])
    assert conflict.finish_reason.message == str(e.value) and str(e.value).startswith(
        "SamplingParams.min_new_tokens=2 conflicts with the regex: at output token 1 ")
    assert_idle_accounting(on)


@pytest.mark.timeout(300)
def test_a_listeners_submit_still_compiling_at_the_shutdown_ends_with_the_shutdown(tiny_llama, monkeypatch):
    """A listener's constrained submit whose compile outlasts the engine ends as every request the
    engine had accepted does at a shutdown: aborted with ABORT_SHUTDOWN (it never reached the
    scheduler, so the thread waiting for its compile answers it)."""
    import threading

    from lmnb_engine.constrained import cache
    from lmnb_engine.outputs import ABORT_SHUTDOWN

    release, real = threading.Event(), cache.compile_grammar

    def held(*args, **kwargs):
        assert release.wait(240)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "compile_grammar", held)
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    first = eng.submit("x", SamplingParams(max_new_tokens=2, temperature=0.0))
    late = []
    first.subscribe(lambda ev: late.append(eng.submit("Go:", SamplingParams(regex="k[lm]{4}"))) if not late else None)
    first.result(timeout=60)
    stopper = threading.Thread(target=eng.shutdown, daemon=True)
    try:
        stopper.start()
        eng.scheduler._thread.join(60)  # the loop has stopped: the compile ends after it
        assert not eng.scheduler._thread.is_alive() and not late[0].done
    finally:
        release.set()
    stopper.join(60)
    r = late[0].result(timeout=60)
    assert (r.finish_reason.type, r.finish_reason.message, r.token_ids) == ("abort", ABORT_SHUTDOWN, [])
