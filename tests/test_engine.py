"""Engine generation against HF transformers: greedy tokens, logprobs, prompt logprobs, seeds,
stop conditions, n > 1, streaming and chunked prefill."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lmnb_engine import Engine, SamplingParams
from tests.helpers_engine import HFReference, assert_idle_accounting, utf8_whole_characters

GREEDY = SamplingParams(max_new_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return HFReference(tiny_llama)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(str(tiny_llama), max_total_tokens=8192) as eng:
        yield eng


@pytest.fixture(scope="module")
def long_context_engine(tiny_llama_long):
    """An engine on ``tiny_llama_long``, its KV pool one request of 16000 new tokens beside a short one."""
    with Engine(str(tiny_llama_long), max_total_tokens=17000) as eng:
        yield eng


def prompts(engine) -> list[list[int]]:
    texts = ["the cat is red", "hello world, what is the capital", "json key value true false 42", "東京 café ok"]
    return [engine.encode(t) for t in texts]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_batch_matches_hf_generate(tiny_checkpoint_factory, arch):
    path = tiny_checkpoint_factory(arch)
    hf = HFReference(path)
    with Engine(str(path), max_total_tokens=4096) as eng:
        ps = prompts(eng)
        results = eng.generate(ps, GREEDY)
        assert [r.token_ids for r in results] == [hf.greedy(p, 32) for p in ps]
        assert_idle_accounting(eng)


def test_output_logprobs_match_hf_forward(engine, hf):
    p = prompts(engine)[1]
    r = engine.generate(p, GREEDY.copy(return_logprob=True, top_logprobs_num=3))
    ref = hf.token_logprobs(p + r.token_ids)[len(p) - 1 :]
    assert [lp.token_id for lp in r.logprobs] == r.token_ids
    assert [lp.logprob for lp in r.logprobs] == pytest.approx(ref, abs=1e-4)
    for lp in r.logprobs:  # greedy: the chosen token is the best alternative
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def test_prompt_logprobs_and_score_match_hf(engine, hf):
    p = prompts(engine)[2]
    ref = hf.token_logprobs(p)
    r = engine.generate(p, SamplingParams(max_new_tokens=2, temperature=0.0, logprob_start_len=0))
    assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(p)
    assert [lp.token_id for lp in r.prompt_logprobs[1:]] == p[1:]
    assert [lp.logprob for lp in r.prompt_logprobs[1:]] == pytest.approx(ref, abs=1e-4)
    assert engine.score(p, 3) == pytest.approx(ref[2:], abs=1e-4)
    with pytest.raises(ValueError, match="start=0"):
        engine.score(p, 0)


def test_chunked_prefill_matches_hf(tiny_llama, hf):
    with Engine(str(tiny_llama), max_total_tokens=4096, chunked_prefill_size=7) as eng:
        p = eng.encode("one two three four five six seven eight nine ten " * 4)
        assert len(p) > 3 * 7
        r = eng.generate(p, GREEDY.copy(max_new_tokens=12, logprob_start_len=1))
        assert r.token_ids == hf.greedy(p, 12)
        assert [lp.logprob for lp in r.prompt_logprobs] == pytest.approx(hf.token_logprobs(p), abs=1e-4)
        assert r.meta.forward_passes >= 4 + 11  # 4+ chunks, then decode steps
        assert_idle_accounting(eng)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(engine):
    p = prompts(engine)[0]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    alone = engine.generate(p, params).token_ids
    assert engine.generate(p, params).token_ids == alone
    batch = engine.generate(prompts(engine), params)
    assert batch[0].token_ids == alone
    assert engine.generate(p, params.copy(seed=99)).token_ids != alone
    # the whole 64-bit seed counts: torch's CPU generator keeps only the low 32 bits, so these
    # drew the same samples (seeds are mixed to 32 bits first)
    outs = [tuple(engine.generate(p, params.copy(seed=s)).token_ids) for s in (1234, 1234 + 2**32, 1234 + 2**40, -1, 2**63 - 1)]
    assert len(set(outs)) == len(outs)


def test_seeds_are_mixed_by_splitmix64():
    from lmnb_engine.request import seed_32

    # SplitMix64 from state 0 (Steele, Lea and Flood 2014; java.util.SplittableRandom): the first
    # output is 0xE220A8397B1DCDAF, the second 0x6E789E6AA1B965F4 (state 2 golden gammas in)
    assert seed_32(0) == 0xE220A839
    assert seed_32(0x9E3779B97F4A7C15) == 0x6E789E6A
    assert seed_32(-1) == seed_32(2**64 - 1)  # seeds are taken mod 2**64, as torch takes them


def test_n_samples_share_one_prefill(engine):
    p = engine.encode("a fresh prompt about the green tree and the river city")
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7, n=3, ignore_eos=True)
    results = engine.generate(p, params)
    assert [r.index for r in results] == [0, 1, 2]
    assert results[0].token_ids == engine.generate(p, params.copy(n=1)).token_ids
    assert len({tuple(r.token_ids) for r in results}) > 1
    # one sample computed the prompt; the other two found all but its last token cached
    assert sorted(r.meta.cached_tokens for r in results) == [0, len(p) - 1, len(p) - 1]
    many = engine.generate([p[:5], p[:6]], params.copy(n=2))
    assert [r.index for r in many] == [0, 1, 0, 1]


def test_a_batch_takes_a_list_of_params_one_per_prompt(engine, hf):
    """SGLang's generate takes a list of sampling params, one per prompt; lmnb refused any list."""
    a, b = prompts(engine)[:2]
    each = [SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True),
            SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True, n=2)]
    out = engine.generate([a, b], each)
    assert [(r.index, r.token_ids) for r in out] == [
        (0, hf.greedy_ignore_eos(a, 3)), (0, hf.greedy_ignore_eos(b, 5)), (1, hf.greedy_ignore_eos(b, 5))]
    assert type(engine.generate([a], each[:1])) is list  # (a batch of one is a list, as with one params)
    with pytest.raises(ValueError, match=r"^2 SamplingParams for 3 prompts: pass one per prompt"):
        engine.generate([a, b, a], each)
    with pytest.raises(TypeError, match="^a list of SamplingParams goes with a list of prompts"):
        engine.generate(a, each[:1])
    with pytest.raises(TypeError, match=r"^prompt 1 of the batch: params must be a lmnb_engine.SamplingParams, got dict"):
        engine.generate([a, b], [each[0], {"max_new_tokens": 3}])
    with pytest.raises(TypeError) as e:  # (a None there said to write SamplingParams(**d) for a dict)
        engine.generate([a, b], [each[0], None])
    assert str(e.value) == ("prompt 1 of the batch: params must be a lmnb_engine.SamplingParams, got NoneType; "
                            "write SamplingParams() for the defaults")
    assert_idle_accounting(engine)


def test_stop_string_across_a_token_boundary(engine, hf):
    tok = engine.tokenizer
    p = prompts(engine)[0]
    ref = hf.greedy(p, 32)
    if 1 in ref:
        ref = ref[: ref.index(1)]  # stop before EOS
    pieces = [tok.decode(ref[: i + 1]) for i in range(len(ref))]
    # the 2-character text around the boundary after token k, at its first occurrence, so the
    # stop string straddles two tokens
    def straddle(k):
        a, b = pieces[k], pieces[k + 1]
        if len(a) <= len(pieces[k - 1]) or len(b) <= len(a) or a.endswith("\ufffd") or b.endswith("\ufffd"):
            return None
        stop = b[len(a) - 1 : len(a) + 1]
        return stop if b.index(stop) == len(a) - 1 and "\ufffd" not in stop and stop.isprintable() else None

    k = next(k for k in range(1, len(ref) - 1) if straddle(k))
    stop = straddle(k)
    expected = pieces[k][:-1]
    events = list(engine.stream(p, GREEDY.copy(stop=["never-appears", stop])))
    result = events[-1].result
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == stop
    assert result.text == expected
    assert "".join(e.text_delta for e in events) == expected
    assert result.token_ids == ref[: len(result.token_ids)]


def test_a_listener_hears_past_then_new_events_in_order_and_a_failing_one_is_dropped(caplog):
    from lmnb_engine.engine import RequestHandle
    from lmnb_engine.outputs import FinishReason, GenerateResult, RequestMeta, StreamEvent

    h = RequestHandle(None, "r", 1)
    evs = [StreamEvent("r", c, [i]) for i, c in enumerate("abc")]
    result = GenerateResult("r", "abc", [0, 1, 2], FinishReason("length"), RequestMeta(1, 0, 3))
    evs.append(StreamEvent("r", "", [], True, result))
    heard, failed = [], []

    def failing(ev):
        failed.append(ev)
        if len(failed) == 3:
            raise RuntimeError("its event loop is closed")

    h._put(evs[0])
    h.subscribe(heard.append)
    h._put(evs[1])
    h.subscribe(failing)  # (hears evs[0:2] as it subscribes)
    for ev in evs[2:]:  # its failure on evs[2] is logged, and it hears no more; the others do
        h._put(ev)
    assert heard == evs and failed == evs[:3] and list(h.events()) == evs and h.done
    assert "hears no more events" in caplog.text


def test_a_listener_that_waits_for_a_request_is_refused_and_the_engine_goes_on(engine):
    # the listener runs on the scheduler thread, which would have to run the request it waits for:
    # Engine.generate there waited forever, and every later request with it
    import threading

    h = engine.submit("Hello", GREEDY.copy(max_new_tokens=2))
    raised, heard = [], threading.Event()

    def listener(ev):
        if ev.finished:
            try:
                engine.generate("hi", GREEDY.copy(max_new_tokens=1))
            except RuntimeError as e:
                raised.append(str(e))
            finally:
                heard.set()

    h.subscribe(listener)
    assert len(h.result(timeout=60).token_ids) == 2
    assert heard.wait(60) and len(raised) == 1
    assert "cannot be waited for on the engine's scheduler thread" in raised[0]
    assert len(engine.generate("hi", GREEDY.copy(max_new_tokens=1)).token_ids) == 1  # (not wedged)
    assert_idle_accounting(engine)


def test_a_blocking_call_in_a_listener_is_refused_by_its_own_name_and_queues_nothing(engine):
    """generate, score and pin_prefix in a listener were refused naming "request <rid>", an id the
    engine made up for its own request (pin_prefix's prefill, a generate's prompt), which the
    caller never saw, after that request had been queued (then aborted). Each is now refused by
    the call's name, before anything is queued."""
    import threading

    before = engine.scheduler._arrivals
    h = engine.submit("Hello", GREEDY.copy(max_new_tokens=1))
    raised, heard = [], threading.Event()

    def listener(ev):
        if ev.finished:
            for call in (lambda: engine.generate("hi", GREEDY), lambda: engine.score("hi there", 1),
                         lambda: engine.pin_prefix("hi")):
                try:
                    call()
                except RuntimeError as e:
                    raised.append(str(e))
            heard.set()

    h.subscribe(listener)
    h.result(timeout=60)
    assert heard.wait(60)
    engine.cache_stats()  # (a command: queued after anything the listener queued, so that has arrived)
    assert engine.scheduler._arrivals == before + 1  # h alone: the refused calls queued nothing
    waits = ("cannot be waited for on the engine's scheduler thread (in a subscribe listener?): that thread computes "
             "it, so the wait would never end; ")
    assert raised == [
        "Engine.generate's result " + waits + "call generate on another thread, or submit() the prompt and take its "
        "events in a listener (subscribe)",
        "Engine.score's logprobs " + waits + "call score on another thread",
        "Engine.pin_prefix's prefill of the prefix " + waits + "call pin_prefix on another thread",
    ]
    assert engine.pinned_node_ids() == []
    assert_idle_accounting(engine)


def test_a_slow_listener_does_not_hold_up_the_requests_readers(engine):
    # listeners were called under the handle's lock, so result(timeout) and events(timeout) waited
    # for a slow one past their timeouts
    import threading

    release, read = threading.Event(), []
    h = engine.submit("Hello", GREEDY.copy(max_new_tokens=3))
    h.subscribe(lambda ev: release.wait(60))
    reader = threading.Thread(target=lambda: read.append(next(h.events(timeout=30))))
    reader.start()
    reader.join(20)
    try:
        assert read and read[0].rid == h.rid, "the reader waited for the listener"
    finally:
        release.set()
    assert len(h.result(timeout=60).token_ids) == 3


def test_events_that_come_while_a_listener_replays_are_delivered_after_the_replay_once_each():
    # subscribe replayed the events so far under the handle's lock: a new event (the scheduler's
    # _put) waited for the whole replay, so a listener that waited for it there waited forever
    import threading

    from lmnb_engine.engine import RequestHandle
    from lmnb_engine.outputs import FinishReason, GenerateResult, RequestMeta, StreamEvent

    h = RequestHandle(None, "r", 1)
    evs = [StreamEvent("r", c, [i]) for i, c in enumerate("abc")]
    result = GenerateResult("r", "abc", [0, 1, 2], FinishReason("length"), RequestMeta(1, 0, 3))
    evs.append(StreamEvent("r", "", [], True, result))
    heard, put_during_replay = [], []

    def listener(ev):
        heard.append((ev, threading.current_thread().name))
        if ev is evs[0]:  # the scheduler thread puts the next event while the replay runs
            putter = threading.Thread(target=h._put, args=(evs[1],), name="scheduler")
            putter.start()
            putter.join(10)
            put_during_replay.append(not putter.is_alive())

    h._put(evs[0])
    h.subscribe(listener)
    assert put_during_replay == [True], "the new event waited for the replay to end"
    for ev in evs[2:]:
        h._put(ev)
    me = threading.current_thread().name
    # evs[1] came during the replay: the subscriber delivers it, after evs[0]; later ones go as they come
    assert heard == [(evs[0], me), (evs[1], me), (evs[2], me), (evs[3], me)]
    assert h.done and h._subs == []


@pytest.mark.timeout(180)
def test_a_listener_that_waits_for_another_request_while_it_replays_does_not_freeze_the_engine(long_context_engine):
    # the replay held the handle's lock, so the scheduler, delivering the running request's next
    # event, waited for that lock, and the other request the listener waited for never ran. The
    # long request must still run at its abort below (300 tokens left 1.5-2.4 s on a loaded machine)
    import threading

    engine = long_context_engine
    long = engine.submit("the cat", SamplingParams(max_new_tokens=16000, temperature=0.0, ignore_eos=True))
    next(long.events(timeout=60))
    other = engine.submit("a dog", SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True))
    heard, waited = [], []

    def listener(ev):
        if not heard:
            try:
                waited.append(len(other.result(timeout=30).token_ids))
            except TimeoutError as e:
                waited.append(e)
        heard.append(ev)

    subscriber = threading.Thread(target=long.subscribe, args=(listener,), daemon=True)
    subscriber.start()
    subscriber.join(90)
    assert not subscriber.is_alive() and waited == [40]
    long.abort()
    assert long.result(timeout=60).finish_reason.type == "abort"
    assert heard == list(long.events(timeout=10))  # every event, once each, in order
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
def test_listeners_subscribing_while_a_request_runs_hear_every_event_once_in_order(engine):
    import threading

    h = engine.submit("the cat", SamplingParams(max_new_tokens=150, temperature=0.0, ignore_eos=True))
    lists: list[list] = []

    def subscribe_one():
        heard: list = []
        lists.append(heard)

        def listener(ev):
            heard.append(ev)
            if len(heard) % 7 == 0:
                threading.Event().wait(0.001)  # a slower replay: new events come meanwhile

        h.subscribe(listener)

    subscribers = []
    for _ in h.events(timeout=60):  # a new listener at every event, two of them from other threads
        subscribe_one()
        for _ in range(2):
            t = threading.Thread(target=subscribe_one, daemon=True)
            t.start()
            subscribers.append(t)
    for t in subscribers:
        t.join(60)
    events = list(h.events(timeout=10))
    assert len(lists) > 100 and all(heard == events for heard in lists)
    assert h.result(timeout=10).token_ids == [t for ev in events for t in ev.token_ids]


@pytest.mark.timeout(180)
def test_a_listener_raising_a_base_exception_is_dropped_and_the_engine_goes_on(engine, hf, caplog):
    # only an Exception was caught: asyncio's CancelledError (or SystemExit) from a listener ended
    # the scheduler thread, and every request, this one and the others, waited forever
    import asyncio
    import threading

    p, q = engine.encode("the cat"), engine.encode("a dog")
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: every event comes after subscribe
    other = engine.submit(q, GREEDY.copy(max_new_tokens=8))
    h = engine.submit(p, GREEDY.copy(max_new_tokens=8))
    calls = []

    def listener(ev):
        calls.append(ev)
        raise asyncio.CancelledError()

    h.subscribe(listener)
    gate.set()
    assert h.result(timeout=30).token_ids == hf.greedy(p, 8)
    assert other.result(timeout=30).token_ids == hf.greedy(q, 8)
    assert len(calls) == 1 and "hears no more events" in caplog.text
    assert engine.generate(p, GREEDY.copy(max_new_tokens=8)).token_ids == hf.greedy(p, 8)


def _assert_ids_in_step_with_text(engine, events) -> None:
    """Each event's ids are the tokens whose text the stream has sent: after every event but the
    last, the ids so far decode to the text so far; the last sends the rest."""
    ids, text = [], ""
    for ev in events[:-1]:
        ids += ev.token_ids
        text += ev.text_delta
        assert engine.decode(ids) == text
        assert len(ev.logprobs) == len(ev.token_ids)
    assert ids + events[-1].token_ids == events[-1].result.token_ids


@pytest.mark.parametrize("held_for", ["stop", "character"])
def test_stream_events_carry_whole_tokens_with_their_text(engine, hf, held_for):
    # text that may begin a stop string, or a character's first bytes, is held back from the
    # stream; the tokens that wrote it went out ahead of it (and their logprobs in OpenAI chunks)
    p = prompts(engine)[0]
    if held_for == "stop":
        full = engine.decode(hf.greedy_ignore_eos(p, 32))
        # each 2 characters from every third begin a stop string that never comes
        stops = [full[j : j + 2] + "\x07" for j in range(0, len(full) - 2, 3)]
        params = GREEDY.copy(stop=stops, ignore_eos=True, return_logprob=True)
    else:  # the tiny vocabulary spells these in byte tokens, sampled one by one
        params = GREEDY.copy(regex="(é|🙂)+", max_new_tokens=12, return_logprob=True)
    events = list(engine.stream(p, params))
    _assert_ids_in_step_with_text(engine, events)
    # some tokens were held back: an event carried none, a later one several
    assert any(not e.token_ids for e in events[:-1]) and any(len(e.token_ids) > 1 for e in events)
    if held_for == "stop":
        assert events[-1].result.finish_reason.type == "length" and events[-1].result.text == full


def test_stop_regex_ends_at_its_first_match_and_streams_nothing_of_it(engine, hf):
    # SGLang's stop_regex; the match straddles a token boundary, so its first character was
    # streamable text until the next token came
    import re

    tok = engine.tokenizer
    p = prompts(engine)[0]
    ref = hf.greedy(p, 32)
    if 1 in ref:
        ref = ref[: ref.index(1)]
    pieces = [tok.decode(ref[: i + 1]) for i in range(len(ref))]
    full = pieces[-1]
    k = next(k for k in range(1, len(ref) - 1) if len(pieces[k]) > len(pieces[k - 1])
             and len(pieces[k + 1]) > len(pieces[k]) and "\ufffd" not in pieces[k + 1][len(pieces[k]) - 1:][:2])
    a, b = pieces[k + 1][len(pieces[k]) - 1], pieces[k + 1][len(pieces[k])]  # the characters at the boundary
    pattern = "[" + re.escape(a) + "](?:" + re.escape(b) + "|@never@)"
    first = re.search(pattern, full)  # Python's re on the whole greedy text: the reference
    events = list(engine.stream(p, GREEDY.copy(stop_regex=["@never@", pattern])))
    result = events[-1].result
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == first.group() == a + b
    assert result.text == full[: first.start()]
    assert "".join(e.text_delta for e in events) == full[: first.start()]
    assert result.token_ids == ref[: len(result.token_ids)]


def test_a_stop_regex_match_that_reads_the_end_is_met_once_what_follows_settles_it_or_the_output_ends(engine, hf):
    # r"a(?!b)" (a, b: characters of the greedy text, "a" followed by "b" before it stands alone):
    # the check after each character read the end of the text so far as the end, and stopped at
    # the first "a" whatever came next; now it stops where Python's re over the whole greedy text
    # finds the match. r"XY\Z" (the output's last two characters) holds only where the output
    # ends, here where max_new_tokens cut it: an end the cut made, so no stop (it was one, its
    # text cut before "XY"): the finish reason stays length, the text whole. The streamed text is
    # the result's text
    import re

    tok = engine.tokenizer
    p = prompts(engine)[0]
    ref = hf.greedy_ignore_eos(p, 32)
    full = tok.decode(ref)
    a, b = next((full[i], full[i + 1]) for i in range(len(full) - 1)
                if full[i].isascii() and full[i].isalnum() and full[i] != full[i + 1]
                and re.search(re.escape(full[i]) + "(?!" + re.escape(full[i + 1]) + ")", full[:-2][i + 1:]))
    for pattern in [re.escape(a) + "(?!" + re.escape(b) + ")", re.escape(full[-2:]) + r"\Z"]:
        first = re.search(pattern, full)  # the reference: Python's re on the whole output
        assert first.start() > full.index(a) or pattern.endswith("Z")
        events = list(engine.stream(p, GREEDY.copy(stop_regex=pattern, ignore_eos=True)))
        result = events[-1].result
        if pattern.endswith("Z"):
            assert result.finish_reason.to_dict() == {"type": "length", "length": 32}
            assert result.text == full == "".join(e.text_delta for e in events)
            continue
        assert result.finish_reason.type == "stop" and result.finish_reason.matched == first.group(), pattern
        assert result.text == full[: first.start()] == "".join(e.text_delta for e in events), pattern


def test_stop_token_ids_eos_min_and_max_new_tokens(engine, hf):
    p = prompts(engine)[1]
    ref = hf.greedy(p, 32)
    r = engine.generate(p, GREEDY.copy(stop_token_ids=[ref[4]]))
    first = ref.index(ref[4])
    assert r.token_ids == ref[: first + 1]
    assert r.finish_reason.type == "stop" and r.finish_reason.matched == ref[4]
    assert r.text == engine.tokenizer.decode(ref[:first], skip_special_tokens=True)
    r = engine.generate(p, GREEDY.copy(max_new_tokens=5))
    assert r.token_ids == ref[:5] and r.finish_reason.to_dict() == {"type": "length", "length": 5}  # SGLang's form
    r = engine.generate(p, GREEDY.copy(max_new_tokens=0))
    assert r.token_ids == [] and r.text == "" and r.finish_reason.to_dict() == {"type": "length", "length": 0}
    # min_new_tokens masks the stop token id: generation runs past it
    r = engine.generate(p, GREEDY.copy(stop_token_ids=[ref[0]], min_new_tokens=3, max_new_tokens=6))
    assert r.token_ids[0] != ref[0] and len(r.token_ids) >= 3


def _hf_biased_greedy(hf, ids: list[int], bias: dict[int, float], steps: int) -> list[int]:
    """Argmax decoding with the HF model, ``bias`` added by hand to each step's logits (EOS ignored)."""
    import torch

    seq = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = hf.model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            for t, b in bias.items():
                logits[t] += b
            seq.append(int(logits.argmax()))
    return seq[len(ids):]


def test_logit_bias_steers_greedy_decoding_as_the_hf_logits_say(engine, hf):
    """lmnb had no logit_bias. +100 on a token makes it every greedy output (the tiny model's
    logits are a few units wide); -100 on the greedy first token makes the first token the second
    best of HF's logits there, and the rest HF's argmax with that bias added by hand. In one batch
    with an unbiased request, which keeps HF's plain greedy output."""
    import torch

    p = prompts(engine)[0]
    plain = hf.greedy_ignore_eos(p, 6)
    forced = engine.encode("cat")[-1]
    assert forced != plain[0]
    with torch.no_grad():
        second_best = int(hf.model(torch.tensor([p])).logits[0, -1].topk(2).indices[1])
    params = GREEDY.copy(max_new_tokens=6, ignore_eos=True)
    banned, up, free = engine.generate(
        [p, p, p], [params.copy(logit_bias={plain[0]: -100}), params.copy(logit_bias={str(forced): 100}), params])
    assert banned.token_ids[0] == second_best
    assert banned.token_ids == _hf_biased_greedy(hf, p, {plain[0]: -100.0}, 6)
    assert up.token_ids == [forced] * 6
    assert free.token_ids == plain


def test_a_stop_string_inside_the_min_new_tokens_is_passed_over(engine, hf):
    # a short stop string written within min_new_tokens was matched once they were done when a
    # longer stop string was also given, and the cut dropped tokens already streamed
    p = prompts(engine)[1]
    ref = hf.greedy(p, 6)
    text = engine.tokenizer.decode(ref, skip_special_tokens=True)
    early = engine.tokenizer.decode(ref[:2], skip_special_tokens=True)[-1]  # a character of token 1 or 2
    longer = early + "@never@"
    assert longer not in text
    for stops in ([early], [early, longer]):
        r = engine.generate(p, GREEDY.copy(stop=stops, min_new_tokens=5, max_new_tokens=6))
        late = text.find(early, len(engine.tokenizer.decode(ref[:4], skip_special_tokens=True)) - len(early) + 1)
        if late == -1:
            assert r.token_ids == ref and r.text == text and r.finish_reason.type == "length", stops
        else:
            assert r.text == text[:late] and r.finish_reason.type == "stop", stops


def _sampled_with(engine, token: int, prompt: list[int], max_new_tokens: int = 40) -> tuple[dict, list[int]]:
    """Sampling params (a seed) under which ``engine`` samples ``token`` after some text and before
    EOS, at most 3 tokens before its ``max_new_tokens``, and the ids it samples (run ignoring EOS, with
    special tokens kept, no stop)."""
    for seed in range(200):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
        ids = engine.generate(prompt, params.copy(ignore_eos=True, skip_special_tokens=False)).token_ids
        if (token in ids[1:-3] and set(engine.eos_token_ids).isdisjoint(ids[: ids.index(token)])
                and engine.tokenizer.decode(ids[: ids.index(token)], skip_special_tokens=True)):
            return params, ids
    raise AssertionError(f"no seed below 200 samples token {token}")



def test_an_ignore_eos_output_keeps_the_special_tokens_it_runs_through_only_without_skip_special_tokens(engine):
    """Under ``ignore_eos`` the output runs on through the EOS "</s>" (and any chat marker such as
    "<|user|>" after it). Its text leaves those special tokens out by default, as SGLang's and vLLM's
    (``skip_special_tokens`` defaults to True there too, whatever ``ignore_eos``); with
    ``skip_special_tokens=False`` the text holds them, the tokenizer's own decoding of the ids."""
    tok = engine.tokenizer
    eos = tok.convert_tokens_to_ids("</s>")
    assert eos in engine.eos_token_ids
    p = prompts(engine)[0]
    params, ids = _sampled_with(engine, eos, p)
    kept = engine.generate(p, params.copy(ignore_eos=True, skip_special_tokens=False))
    assert kept.token_ids == ids and kept.finish_reason.type == "length"
    assert kept.text == tok.decode(ids, skip_special_tokens=False) and "</s>" in kept.text
    skipped = engine.generate(p, params.copy(ignore_eos=True))
    assert skipped.token_ids == ids
    assert skipped.text == tok.decode(ids, skip_special_tokens=True) and "</s>" not in skipped.text
    assert skipped.text == tok.decode([i for i in ids if i not in tok.all_special_ids])


def test_a_stop_string_that_is_a_special_tokens_text_ends_at_that_token(engine):
    """The chat template's end of message "<|end|>" is a special token of the tiny model, not its EOS;
    the output text leaves it out, so stop="<|end|>" was never found in the text and the request
    ran on past the token (to its max_new_tokens). Sampling the token is now the stop: its ids end
    with it, its text is the text before it, and the finish reason names the stop string (as
    SGLang's, which reads its stops in text holding special tokens)."""
    tok = engine.tokenizer
    end = tok.convert_tokens_to_ids("<|end|>")
    assert end not in engine.eos_token_ids and tok.decode([end], skip_special_tokens=True) == ""
    p = prompts(engine)[1]
    params, ref = _sampled_with(engine, end, p)
    k = ref.index(end)
    expected = tok.decode(ref[:k], skip_special_tokens=True)
    events = list(engine.stream(p, params.copy(stop="<|end|>", return_logprob=True)))
    r = events[-1].result
    assert r.token_ids == ref[: k + 1]
    assert r.text == expected and "".join(e.text_delta for e in events) == expected
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "<|end|>"}
    assert [lp.token_id for lp in r.logprobs] == ref[: k + 1]
    assert [t for e in events for t in e.token_ids] == ref[: k + 1]
    # among other stops; and with special tokens kept in the text, where the text shows the stop
    r = engine.generate(p, params.copy(stop=["@never@", "<|end|>"]))
    assert r.token_ids == ref[: k + 1] and r.text == expected and r.finish_reason.matched == "<|end|>"
    r = engine.generate(p, params.copy(stop="<|end|>", skip_special_tokens=False))
    assert r.token_ids == ref[: k + 1] and r.text == tok.decode(ref[:k], skip_special_tokens=False)
    assert r.finish_reason.matched == "<|end|>"
    # a stop string holding the token's text among other text is read in the text with the token's
    # text put back: it stops there too, its text cut where the stop begins (it ran on before)
    stop = expected[-1] + "<|end|>"
    r = engine.generate(p, params.copy(stop=stop, max_new_tokens=k + 3, ignore_eos=True))
    assert r.token_ids == ref[: k + 1] and r.text == expected[:-1]
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": stop}


def test_a_stop_string_that_is_the_eos_text_ends_an_ignore_eos_request(tiny_llama):
    """ignore_eos ignores the model's EOS ids, not the stops a request names: a stop string that is
    the EOS token's text ends the request at that token, as stop strings do under ignore_eos (and as
    SGLang's check of a tail decoded with special tokens stops it)."""
    with Engine(str(tiny_llama), max_total_tokens=2048) as eng:
        end = eng.tokenizer.convert_tokens_to_ids("<|end|>")
        p = prompts(eng)[1]
        params, ref = _sampled_with(eng, end, p)
        k = ref.index(end)
        eng.scheduler.eos_token_ids = frozenset({end})  # (the random model rarely samples its real EOS)
        r = eng.generate(p, params.copy(ignore_eos=True, stop="<|end|>"))
        assert r.token_ids == ref[: k + 1] and r.finish_reason.to_dict() == {"type": "stop", "matched": "<|end|>"}
        r = eng.generate(p, params.copy(ignore_eos=True))
        assert r.token_ids == ref and r.finish_reason.type == "length"
        r = eng.generate(p, params.copy(stop="<|end|>"))  # EOS first, by its id (SGLang's order)
        assert r.token_ids == ref[: k + 1] and r.finish_reason.to_dict() == {"type": "stop", "matched": end}


def test_eos_ends_generation_unless_ignored(tiny_llama, hf):
    with Engine(str(tiny_llama), max_total_tokens=2048) as eng:
        p = prompts(eng)[3]
        ref = hf.greedy(p, 16)
        # the random model rarely samples its real EOS; declare a token greedy decoding reaches EOS
        eos = ref[5]
        eng.scheduler.eos_token_ids = frozenset({eos})
        r = eng.generate(p, SamplingParams(max_new_tokens=16, temperature=0.0))
        assert r.token_ids == ref[: ref.index(eos) + 1]
        assert r.finish_reason.type == "stop" and r.finish_reason.matched == eos
        r = eng.generate(p, SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True))
        assert r.token_ids == ref and r.finish_reason.type == "length"


@pytest.mark.parametrize("seed", range(6))
def test_stream_events_add_up_to_the_result(engine, seed):
    events = list(engine.stream("東京 café 😀 the", SamplingParams(max_new_tokens=20, temperature=0.9, seed=seed)))
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    result = events[-1].result
    assert "".join(e.text_delta for e in events) == result.text
    assert [t for e in events for t in e.token_ids] == result.token_ids
    # the random model also emits bytes that are invalid UTF-8 for good (U+FFFD), and may end
    # inside a character (left out): the text is the UTF-8 of the output's own bytes, special
    # tokens (a stop's EOS) skipped, whatever the seed
    special = set(engine.tokenizer.added_tokens_decoder)
    assert result.text == utf8_whole_characters(engine.tokenizer, [t for t in result.token_ids if t not in special])


def test_a_max_tokens_cut_inside_a_character_leaves_it_out_of_the_text_and_the_stream(engine):
    # greedy output of the random model holds byte tokens; a cut after one that leaves a character
    # incomplete keeps the text of the whole characters (vLLM's result), streamed and returned
    ids = engine.generate("the cat", SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)).token_ids
    cuts = [k for k in range(1, 13) if engine.tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert cuts  # (the greedy output does hold such a cut)
    for k in cuts:
        events = list(engine.stream("the cat", SamplingParams(max_new_tokens=k, temperature=0, ignore_eos=True)))
        result = events[-1].result
        assert result.token_ids == ids[:k] and result.finish_reason.type == "length"
        assert "".join(e.text_delta for e in events) == result.text == utf8_whole_characters(engine.tokenizer, ids[:k])


def test_submit_handle_and_model_facts(engine):
    h = engine.submit("the dog", SamplingParams(max_new_tokens=4, temperature=0.0), rid="my-rid")
    assert h.rid == "my-rid"
    r = h.result(timeout=60)
    assert r.rid == "my-rid" and len(list(h.events())) >= 1
    info = engine.model_info()
    assert info["architecture"] == "LlamaForCausalLM" and info["context_len"] == engine.context_len == 512
    assert engine.decode(engine.encode("red cat")) == "red cat"
    chat = engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat.endswith("<|assistant|>") and "<|user|>hi<|end|>" in chat


@pytest.mark.parametrize("messages, said", [
    ([{"role": "user"}], 'messages[0] has no content: give its text as "content": "..." (a string, or a list of '
                         "text parts)"),
    ([{"role": "system", "content": "a"}, {"role": "user", "contents": "hi"}],
     'messages[1] has no content (it has "contents"): give its text as "content"'),
    ([{"role": "user", "content": None, "name": "ann"}], "messages[0] has no content: give"),
    ([{"role": "user", "content": []}], 'messages[0].content is an empty list: give its text as "content"'),
    ([{"rol": "user", "content": "hi"}], 'messages[0] has no role (it has "rol"; did you mean "role"?): give it'),
    ([{"role": "user", "content": "hi", "nmae": "ann"}],
     'messages[0] has the unknown field "nmae" (did you mean "name"?); a message of role "user" takes ["role", '
     '"content", "name"]'),
])
def test_apply_chat_template_refuses_a_message_without_content_as_the_server_does(engine, messages, said):
    # it was rendered as an empty message ("<|user|><|end|>"): what was meant was lost without a word
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template(messages)
    assert str(e.value).startswith(said)
    # an assistant turn that calls a tool may leave its content out, as OpenAI's API allows
    engine.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": []}])
    # and a tool message's "tool_name" (Ollama's) is no misspelt "tool_calls", an assistant's key
    engine.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "tool", "content": "4", "tool_name": "f"}])


def test_apply_chat_template_renders_messages_as_the_server_does(engine):
    """Text parts were written as the Python list itself ("<|user|>[{'type': 'text', ...}]"), and
    "developer" was kept, which templates do not know; the server joins the parts and reads
    "developer" as "system". Expected: the same messages written with string content."""
    parts = [{"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
             {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert engine.apply_chat_template(parts) == engine.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert "[{" not in engine.apply_chat_template(parts)


def test_apply_chat_template_reads_a_tool_calls_arguments_text_into_its_object(engine, monkeypatch):
    """A tool call's arguments, OpenAI's JSON text, went to the template as text, which Llama 3.1's
    and Qwen2.5's templates write with tojson: one escaped JSON string ("{\\"city\\": ..."), not the
    call's object as SGLang and vLLM hand it over. Expected, by hand: the object's JSON."""
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}"
                "[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}{% endfor %}")
    monkeypatch.setattr(engine, "loaded", dataclasses.replace(engine.loaded, chat_template=template))
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "tool_calls": [call]}]
    assert engine.apply_chat_template(messages, add_generation_prompt=False) == (
        '<user>weather?<assistant>[weather {"city": "Paris"}]')
    assert call["function"]["arguments"] == '{"city": "Paris"}'  # (the caller's message is left as it is)
    blank = {**call, "function": {"name": "now", "arguments": " "}}  # (no arguments: {}, as SGLang reads it)
    assert engine.apply_chat_template([{"role": "assistant", "tool_calls": [blank]}], False) == "<assistant>[now {}]"
    bad = {**call, "function": {"name": "w", "arguments": "{city"}}
    with pytest.raises(ValueError, match=r"^messages\[0\]\.tool_calls\[0\]\.function\.arguments is not JSON "):
        engine.apply_chat_template([{"role": "assistant", "tool_calls": [bad]}])


def test_apply_chat_template_reads_the_openai_sdks_message_objects_and_dataclasses_as_dicts(engine):
    """A reply's ``choices[0].message`` (the OpenAI SDK's pydantic ``ChatCompletionMessage``), which
    the SDK takes back in ``messages``, and a dataclass went to the template as they were, past the
    checks and the server's rendering a dict gets (jinja reads their fields): "developer" was kept, a
    list of text parts written as a Python list, a reply without content rendered empty. Expected:
    the rendering of the same messages written as dicts (None fields left out, as the SDK sends them)."""
    from openai.types.chat import ChatCompletionMessage

    @dataclasses.dataclass
    class Message:
        role: str
        content: object

    reply = ChatCompletionMessage(role="assistant", content="4", refusal=None, tool_calls=None)
    got = engine.apply_chat_template([Message("developer", [{"type": "text", "text": "be brief"}]),
                                      Message("user", "2+2?"), reply, {"role": "user", "content": "and 3+3?"}])
    assert got == engine.apply_chat_template([{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                                              {"role": "user", "content": "and 3+3?"}])
    with pytest.raises(ValueError, match=r"^messages\[1\] has no content \(it has \"refusal\"\): give its text"):
        engine.apply_chat_template([Message("user", "hi"),
                                    ChatCompletionMessage(role="assistant", content=None, refusal="no")])


@pytest.mark.parametrize("messages, said", [
    ("hi", 'messages is the string "hi", not a list of messages: give [{"role": "user", "content": "..."}, ...]'),
    ({"role": "user", "content": "hi"}, "messages is a dict, not a list of messages: give [{"),
    ([("user", "hi")], 'messages[0] is a tuple: give each message as a dict, {"role": "user", "content": "..."}'),
    (["hi"], 'messages[0] is the string "hi": give each message as a dict'),
])
def test_apply_chat_template_refuses_what_is_not_a_list_of_messages(engine, messages, said):
    # a string was read as a list of one-letter messages, a tuple handed to the template as it was
    with pytest.raises(TypeError) as e:
        engine.apply_chat_template(messages)
    assert str(e.value).startswith(said), str(e.value)


@pytest.mark.parametrize("messages, said", [
    ([{"content": "hi"}], 'messages[0] has no role: give it as "role": "user"'),  # (was rendered "<||>hi")
    # (not "the unknown field "tool_name" (did you mean "tool_calls"?)": a role-less message takes no key yet)
    ([{"content": "hi", "tool_name": "w"}], 'messages[0] has no role: give it as "role": "user"'),
    ([{"role": None, "content": "hi"}], "messages[0] has no role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
     'messages[0].content[0] is a "image_url" part: only text parts are rendered here'),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text is missing"),
    ([{"role": "user", "content": 5}], "messages[0].content is 5: give a string, or a list of text parts"),
])
def test_apply_chat_template_refuses_a_message_the_server_refuses(engine, messages, said):
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template(messages)
    assert str(e.value).startswith(said), str(e.value)


def test_apply_chat_template_refuses_no_messages_a_refused_conversation_and_a_non_bool_flag(engine, monkeypatch):
    """An empty list failed inside transformers' render, in its words; the template's own
    raise_exception (the demo model's, for an unknown role) came as jinja2's TemplateError from
    inside its sandbox; add_generation_prompt="no" (truthy) added the assistant's header. Expected:
    a ValueError naming the empty list, the template's words after the server's own start, and a
    TypeError for the flag."""
    refusing = ("{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('unknown chat role ' ~ m['role']) }}{% endif %}<|{{ m['role'] }}|>"
                "{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    monkeypatch.setattr(engine, "loaded", dataclasses.replace(engine.loaded, chat_template=refusing))
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template([])
    assert str(e.value) == 'messages is empty: give at least one message, [{"role": "user", "content": "..."}]'
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template([{"role": "wizard", "content": "hi"}])
    assert str(e.value) == "the chat template rejected the messages: unknown chat role wizard"
    hi = [{"role": "user", "content": "hi"}]
    for bad in ("no", 1, None):
        with pytest.raises(TypeError) as e:
            engine.apply_chat_template(hi, add_generation_prompt=bad)
        assert str(e.value) == f"add_generation_prompt={bad!r} must be True or False"
    assert engine.apply_chat_template(hi, add_generation_prompt=np.bool_(False)) == "<|user|>hi"
    assert engine.apply_chat_template(hi, add_generation_prompt=True) == "<|user|>hi<|assistant|>"


def test_apply_chat_template_continues_the_final_message_as_transformers_renders_it(engine, tiny_llama, monkeypatch):
    """continue_final_message (transformers', vLLM's and SGLang's name) had no parameter here: a
    partial assistant reply could not be rendered for the model to continue. The prompt now ends
    with the last message's content, without the turn's end (the tiny template writes
    ``<|role|>content<|end|>\n``, by hand), as transformers renders it; with add_generation_prompt,
    a flag that is no bool and a template that cuts the content are refused in words of their own."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    got = engine.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    assert got == "<s><|user|>hi<|end|>\n<|assistant|>Once upon"
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    assert got == hf_tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert engine.apply_chat_template(messages, False) == "<s><|user|>hi<|end|>\n<|assistant|>Once upon<|end|>\n"
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template(messages, continue_final_message=True)
    assert str(e.value) == ("continue_final_message=True continues the last message, and add_generation_prompt=True "
                            "starts a new assistant turn after it: pass add_generation_prompt=False with it")
    with pytest.raises(TypeError) as e:
        engine.apply_chat_template(messages, False, continue_final_message="yes")
    assert str(e.value) == "continue_final_message='yes' must be True or False"
    # a template that writes a content's first 3 characters loses the rest: no prompt ends with it
    cutting = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'][:3] }}{% endfor %}"
    monkeypatch.setattr(engine, "loaded", dataclasses.replace(engine.loaded, chat_template=cutting))
    with pytest.raises(ValueError) as e:
        engine.apply_chat_template(messages, False, continue_final_message=True)
    assert str(e.value) == ("the chat template rejected the messages: continue_final_message needs the prompt to end "
                            "with the last message's content, and this chat template does not write that content as "
                            "it is; format the prompt yourself")


def test_changing_params_after_submit_changes_no_queued_request(engine, hf):
    # One SamplingParams reused in a loop: each request runs with the values it was submitted with.
    p = engine.encode("the red cat")
    params = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    first = engine.submit(p, params)
    params.max_new_tokens = 40
    second = engine.submit(p, params)
    params.frequency_penalty = "unchecked"  # would fail the scheduler's step, and its batch with it
    assert first.result(timeout=60).token_ids == hf.greedy_ignore_eos(p, 5)
    assert second.result(timeout=60).token_ids == hf.greedy_ignore_eos(p, 40)
    assert_idle_accounting(engine)


def test_a_text_that_writes_its_own_bos_gets_no_second_one():
    """generate(apply_chat_template(messages)) with a tokenizer that adds BOS (the demo model's,
    Llama-2/3's) encoded two BOS tokens, which the model never saw in training."""
    from lmnb_engine import Engine, SamplingParams

    eng = Engine()
    try:
        tok = eng.tokenizer
        body = eng.encode("Q: Where does Arvel live?\nA:", add_special_tokens=False)
        assert eng.encode("x")[0] == tok.bos_token_id  # this tokenizer adds BOS
        params = SamplingParams(max_new_tokens=4, temperature=0)
        with_bos = eng.generate(tok.bos_token + "Q: Where does Arvel live?\nA:", params)
        plain = eng.generate("Q: Where does Arvel live?\nA:", params)
        by_ids = eng.generate([tok.bos_token_id] + body, params)
        assert with_bos.meta.prompt_tokens == plain.meta.prompt_tokens == len(body) + 1
        assert with_bos.token_ids == plain.token_ids == by_ids.token_ids
        doubled = eng.generate([tok.bos_token_id] * 2 + body, params)  # ids are taken as given
        assert doubled.meta.prompt_tokens == len(body) + 2
    finally:
        eng.shutdown()


def test_release_memory_frees_the_weights_and_pools_while_the_engine_is_still_referred_to(tiny_llama):
    """shutdown() left the weights and the KV pool to the garbage collector, which freed nothing
    while anything (a notebook's ProgramState) still referred to the engine: on a GPU the next model
    loaded in the process was refused for memory the idle engine held (lmnb_kernel's %lm load)."""
    eng = Engine(str(tiny_llama), device="cpu", max_total_tokens=256)
    assert eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0)).token_ids
    runner = eng.runner
    tensors = list(runner.model.parameters()) + list(runner.model.buffers())
    assert len(runner.kv_pool.k_buffer) == len(runner.kv_pool.v_buffer) == runner.config.num_layers
    eng.release_memory()
    assert all(t.numel() == 0 for t in tensors) and runner.graph_runner is None
    assert runner.kv_pool.k_buffer == runner.kv_pool.v_buffer == []
    assert runner.req_to_token_pool.req_to_token.numel() == runner.req_to_token_pool.host.numel() == 0
    with pytest.raises(RuntimeError):  # shut down: it takes no more requests
        eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0))
    eng.release_memory()  # again: nothing more to do
