"""Overlapped decoding (the scheduler launches decode step n+1 before taking step n's tokens)
gives exactly the output of one-step-at-a-time decoding: same tokens, text, finish reasons,
logprobs and streamed events, for greedy and seeded sampling, stop tokens and stop strings,
n > 1, ``min_new_tokens`` and penalties (which switch the overlap off for their batch), and
aborts while a step is in flight; the KV accounting holds afterwards. The reference is the same
engine with ``disable_overlap_schedule=True``."""

from __future__ import annotations

import pytest

from lmnb_engine import Engine, SamplingParams

PROMPTS = ["the cat is red and", "a blue bird sat on the", "one two three four", "the dog"]


def _params():
    """Sampling set-ups, each run over every prompt in one batch."""
    return {
        "greedy-long": SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True, return_logprob=True,
                                      top_logprobs_num=3),
        "greedy-eos": SamplingParams(temperature=0, max_new_tokens=40),
        "seeded-sampling": SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=16, seed=7,
                                          ignore_eos=True),
        "stop-strings": SamplingParams(temperature=0.8, max_new_tokens=30, seed=3, stop=[" the", "e"]),
        "two-samples": SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=11, ignore_eos=True),
        "min-new-tokens": SamplingParams(temperature=0, max_new_tokens=10, min_new_tokens=6),
        "penalties": SamplingParams(temperature=0, max_new_tokens=10, repetition_penalty=1.3,
                                    frequency_penalty=0.5, ignore_eos=True),
        "short": SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True),
    }


def _summary(r):
    lps = None if r.logprobs is None else [(lp.token_id, round(lp.logprob, 5), lp.top) for lp in r.logprobs]
    return (r.token_ids, r.text, r.finish_reason.type, r.finish_reason.matched, lps, r.meta.completion_tokens)


@pytest.fixture(scope="module")
def engines(tiny_llama):
    kw = dict(max_total_tokens=4096, attention_backend="torch")
    with Engine(str(tiny_llama), **kw) as overlap, Engine(str(tiny_llama), disable_overlap_schedule=True, **kw) as one:
        yield overlap, one


@pytest.mark.parametrize("name", list(_params()))
def test_overlapped_output_equals_step_by_step(engines, name):
    overlap, one = engines
    params = _params()[name]
    before = overlap.cache_stats()["overlapped_steps"]
    got = [_summary(r) for r in overlap.generate(PROMPTS, params)]
    want = [_summary(r) for r in one.generate(PROMPTS, params)]
    assert got == want
    chained = overlap.cache_stats()["overlapped_steps"] - before
    if name == "penalties":  # penalties read the newest token on the host: never overlapped
        assert chained == 0
    elif name != "short":  # 2 tokens: the second is the last, nothing to launch ahead
        assert chained > 0
    assert one.cache_stats()["overlapped_steps"] == 0
    overlap.check_invariants()


def test_streamed_events_are_the_same(engines):
    overlap, one = engines
    params = SamplingParams(temperature=0, max_new_tokens=20, stop=["ed"], ignore_eos=True)
    streams = [[(e.text_delta, tuple(e.token_ids), e.finished) for e in eng.stream(PROMPTS[1], params)]
               for eng in (overlap, one)]
    assert streams[0] == streams[1] and streams[0][-1][2]


def test_abort_while_a_step_is_in_flight_keeps_the_engine_sound(engines):
    overlap, _ = engines
    params = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    handles = [overlap.submit(p, params) for p in PROMPTS]
    for i, _event in enumerate(handles[0].events()):
        if i == 5:
            break
    for h in handles[1:3]:
        h.abort()
    results = [h.result(timeout=120) for h in handles[1:]]
    assert [r.finish_reason.type for r in results[:2]] == ["abort", "abort"]
    assert results[2].finish_reason.type == "length" and len(results[2].token_ids) == 200
    handles[0].abort()
    overlap.check_invariants()
    stats = overlap.cache_stats()
    assert stats["running_requests"] == 0 and stats["held_tokens"] == 0
    # what ran is cached and gives the same tokens again (the first 200-token request is a hit)
    again = overlap.generate(PROMPTS[3], params)
    assert again.meta.cached_tokens >= len(overlap.encode(PROMPTS[3])) - 1
    assert again.token_ids == results[2].token_ids


def test_a_failure_while_taking_a_step_keeps_the_cache_and_pins(tiny_llama):
    """An exception while step n's tokens are processed, with step n+1 already launched: the
    step's requests end with the error, but the computed KV of their known tokens goes to the
    cache as usual (no memory rebuild): pins and cached prefixes survive."""
    import logging

    with Engine(str(tiny_llama), max_total_tokens=4096, attention_backend="torch") as eng:
        pin = eng.pin_prefix(eng.encode("the cat is red and a blue bird sat on the"))
        before = eng.cache_stats()
        params = SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True)
        made = [eng._make_reqs(eng._to_ids(f"request {i} says"), params) for i in range(4)]
        bad = made[1][1][0]
        add = bad.detokenizer.add

        def failing_add(token):
            if len(bad.output_ids) == 10:
                raise RuntimeError("injected detokenizer failure")
            return add(token)

        bad.detokenizer.add = failing_add
        logging.disable(logging.CRITICAL)  # the scheduler logs the failure with its traceback
        try:
            eng.scheduler.submit([r for _, reqs in made for r in reqs])
            results = [h.result(timeout=60) for h, _ in made]
        finally:
            logging.disable(logging.NOTSET)
        assert all("injected detokenizer failure" in r.finish_reason.message for r in results)
        assert eng.cache_stats()["overlapped_steps"] > before["overlapped_steps"]  # it failed in overlap
        eng.check_invariants()
        after = eng.cache_stats()
        assert after["pinned_prefixes"] == 1 and after["protected_tokens"] == before["protected_tokens"]
        assert after["evictable_tokens"] > before["evictable_tokens"]  # the aborted requests' KV is cached
        eng.unpin(pin)


def test_polling_stats_does_not_switch_the_overlap_off(engines):
    """Widgets and servers poll ``cache_stats`` while decoding; those commands run between steps
    and leave the decode steps overlapped."""
    import threading

    overlap, _ = engines
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            overlap.cache_stats()

    poller = threading.Thread(target=poll)
    before = overlap.cache_stats()["overlapped_steps"]
    poller.start()
    try:
        overlap.generate(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True))
    finally:
        stop.set()
        poller.join()
    assert overlap.cache_stats()["overlapped_steps"] - before >= 90  # of 99 decode steps


def test_scheduler_thread_runs_on_the_model_gpu(monkeypatch):
    """Triton launches its kernels, and a CUDA event records, on the calling thread's current
    device, which is cuda:0 in a new thread: the scheduler thread of a model on cuda:1 must make
    that device current before its first step."""
    import threading
    from types import SimpleNamespace

    import torch

    from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool
    from lmnb_engine.scheduler import Scheduler, SchedulerConfig

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: calls.append((torch.device(d), threading.current_thread().name)))
    for asked in ("cuda:1", "cuda"):  # "cuda" alone: the current device when the model was loaded
        runner = SimpleNamespace(device=torch.device(asked), req_to_token_pool=ReqToTokenPool(2, 8, "cpu"),
                                 kv_pool=TokenToKVPool(16, 1, 1, 4, torch.float32, "cpu"))
        sched = Scheduler(runner, None, frozenset(), 8, SchedulerConfig())
        # the table on the GPU the model was loaded on (stands in for a CUDA tensor's device)
        runner.req_to_token_pool = SimpleNamespace(req_to_token=SimpleNamespace(device=torch.device("cuda", 1)))
        sched.start()
        sched.call(lambda: None).result(timeout=10)
        sched.stop()
    # an index each time: torch.cuda.set_device refuses a bare "cuda"
    assert calls == [(torch.device("cuda", 1), "lmnb-scheduler")] * 2
