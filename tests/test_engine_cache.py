"""RadixAttention through the Engine: outputs never depend on what the cache holds, on request
order or concurrency, on eviction, retraction or locking (references: HF transformers)."""

from __future__ import annotations

import threading

import pytest

from lmnb_engine import Engine, SamplingParams
from lmnb_engine.scheduler import SchedulerConfig
from tests.helpers_engine import HFReference, assert_idle_accounting, shared_prefix_prompts

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return HFReference(tiny_llama)


def engine(path, **kw) -> Engine:
    kw.setdefault("max_total_tokens", 4096)
    return Engine(str(path), **kw)


def test_cache_hit_gives_the_cold_output(tiny_llama, hf):
    with engine(tiny_llama) as eng:
        p = eng.encode("the blue bird and the red cat went to the city of london")
        params = GREEDY.copy(return_logprob=True)
        cold = eng.generate(p, params)
        hot = eng.generate(p, params)
        assert cold.meta.cached_tokens == 0 and hot.meta.cached_tokens == len(p) - 1
        assert hot.token_ids == cold.token_ids == hf.greedy(p, 12)
        assert [x.logprob for x in hot.logprobs] == pytest.approx([x.logprob for x in cold.logprobs], abs=1e-5)
        # the continuation of a cached generation hits the prompt and the generated tokens
        longer = p + cold.token_ids[:6]
        r = eng.generate(longer, GREEDY)
        assert r.meta.cached_tokens == len(longer) - 1
        assert r.token_ids == hf.greedy(longer, 12)
        assert_idle_accounting(eng)


def test_output_after_a_node_split(tiny_llama, hf):
    with engine(tiny_llama) as eng:
        a = eng.encode("one two three four five six seven eight nine ten alpha beta")
        b = a[:7] + eng.encode(" gamma delta london", add_special_tokens=False)
        eng.generate(a, GREEDY)
        node = eng.tree_snapshot()
        while node.children:  # a chain (prompt, then its output): nothing branches yet
            assert len(node.children) == 1
            node = node.children[0]
        r = eng.generate(b, GREEDY)
        assert r.meta.cached_tokens == 7
        assert r.token_ids == hf.greedy(b, 12)
        node = eng.tree_snapshot().children[0]
        assert node.num_tokens == 7 and len(node.children) == 2  # split at the shared 7 tokens
        assert node.text_preview == eng.decode(a[:7])
        assert eng.generate(a, GREEDY).token_ids == hf.greedy(a, 12)
        assert_idle_accounting(eng)


def test_outputs_survive_forced_eviction_in_a_tiny_pool(tiny_llama, hf):
    with engine(tiny_llama, max_total_tokens=96) as eng:
        ps = shared_prefix_prompts(eng.tokenizer, 8, seed=3, prefix_words=12)
        for p in ps + ps[:2]:
            assert eng.generate(p, GREEDY).token_ids == hf.greedy(p, 12)
            assert_idle_accounting(eng)
        assert eng.cache_stats()["evicted_tokens"] > 0


@pytest.mark.parametrize(
    "options",
    [
        dict(schedule_policy="lpm"),
        dict(schedule_policy="dfs-weight"),
        dict(schedule_policy="fcfs", mixed_batching=True),
        dict(disable_radix_cache=True),
        dict(schedule_policy="lpm", chunked_prefill_size=24, max_total_tokens=400),
    ],
    ids=["lpm", "dfs-weight", "fcfs-mixed", "no-cache", "chunked-small-pool"],
)
def test_concurrent_requests_with_shared_prefixes_equal_each_alone(tiny_llama, hf, options):
    with engine(tiny_llama, **options) as eng:
        ps = shared_prefix_prompts(eng.tokenizer, 18, seed=1, prefix_words=50)
        results = eng.generate(ps, GREEDY)
        assert [r.token_ids for r in results] == [hf.greedy(p, 12) for p in ps]
        stats = eng.cache_stats()
        if options.get("disable_radix_cache"):
            assert stats["cached_tokens"] == 0 and stats["evictable_tokens"] == 0
        else:
            assert stats["cached_tokens"] > 0
        assert_idle_accounting(eng)


def test_concurrent_requests_compute_a_shared_prefix_once(tiny_llama):
    with engine(tiny_llama) as eng:
        prefix = eng.encode("the red cat and the blue dog went to the river city " * 5)
        assert len(prefix) >= 40
        ps = [prefix + eng.encode(f" question {i} what is {i} plus {i}", add_special_tokens=False) for i in range(16)]
        results = eng.generate(ps, SamplingParams(max_new_tokens=1, temperature=0.0))
        cached = sorted(r.meta.cached_tokens for r in results)
        # the first admitted request computes the prefix; the other 15 wait a round and hit it
        assert cached[0] == 0 and all(c >= len(prefix) for c in cached[1:])
        assert_idle_accounting(eng)


def _record_steps(eng) -> list[list[tuple[int, int]]]:
    """Make ``eng``'s scheduler log each step it runs as ``[(sample index, new tokens), ...]``."""
    steps: list[list[tuple[int, int]]] = []
    run = eng.scheduler._run

    def logged(rows):
        steps.append([(req.index, n) for req, n in rows])
        return run(rows)

    eng.scheduler._run = logged
    return steps


def test_sibling_samples_are_admitted_together_once_their_prompt_is_cached(tiny_llama):
    # each round admitted one sample of a prompt: n=5 took five steps (four of them computing one
    # token each while sample 0 waited for its second token) where two do
    with engine(tiny_llama) as eng:
        steps = _record_steps(eng)
        p = eng.encode("the red cat and the blue dog went to the river city")
        results = eng.generate(p, SamplingParams(max_new_tokens=3, temperature=1.0, n=5, ignore_eos=True))
        assert steps[:2] == [[(0, len(p))], [(1, 1), (2, 1), (3, 1), (4, 1)]]
        assert sorted(r.meta.cached_tokens for r in results) == [0] + [len(p) - 1] * 4
        assert_idle_accounting(eng)


def test_without_the_cache_no_request_waits_for_a_prefix_computed_beside_it(tiny_llama, hf):
    # with the radix cache disabled a sibling sample, or a prompt sharing a long prefix with one
    # admitted first, still waited a round for a cache hit that never came: one prefill per step
    with engine(tiny_llama, disable_radix_cache=True) as eng:
        steps = _record_steps(eng)
        p = eng.encode("the red cat and the blue dog went to the river city " * 4)
        assert len(p) > 32
        q = p + eng.encode(" and home", add_special_tokens=False)
        params = GREEDY.copy(n=2)
        results = eng.generate([p, q], params)
        assert steps[0] == [(0, len(p)), (1, len(p)), (0, len(q)), (1, len(q))]
        assert [r.token_ids for r in results] == [hf.greedy(p, 12)] * 2 + [hf.greedy(q, 12)] * 2
        assert_idle_accounting(eng)


def test_concurrent_submissions_from_threads(tiny_llama, hf):
    with engine(tiny_llama) as eng:
        ps = shared_prefix_prompts(eng.tokenizer, 16, seed=2)
        out: dict[int, list[int]] = {}

        def worker(i: int) -> None:
            out[i] = eng.generate(ps[i], GREEDY).token_ids

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(ps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [out[i] for i in range(len(ps))] == [hf.greedy(p, 12) for p in ps]
        assert_idle_accounting(eng)


def test_prompt_logprobs_do_not_depend_on_cache_state_or_order(tiny_llama, hf):
    with engine(tiny_llama) as first, engine(tiny_llama, max_total_tokens=64) as second:
        base = first.encode("what is the capital of the country with the red tree and the river")
        cases = [(base, 3), (base[:10] + [400, 401, 402], 5), (base + [17, 18], 0), (base[:6], 1)]
        expected = [hf.token_logprobs(ids) for ids, _ in cases]

        def run(eng, order):
            got = {}
            for i in order:
                ids, start = cases[i]
                r = eng.generate(ids, SamplingParams(max_new_tokens=1, temperature=0.0, logprob_start_len=start))
                got[i] = r.prompt_logprobs
            return got

        for eng, order in ((first, [0, 1, 2, 3]), (second, [3, 2, 1, 0]), (first, [2, 0, 3, 1])):
            got = run(eng, order)
            for i, (ids, start) in enumerate(cases):
                lps = got[i]
                assert len(lps) == len(ids) - start
                values = [lp.logprob for lp in lps if lp is not None]
                assert values == pytest.approx(expected[i][max(start - 1, 0) :], abs=1e-4)
        assert first.cache_stats()["cached_tokens"] > 0
        assert_idle_accounting(first)
        assert_idle_accounting(second)


def test_locked_prefix_is_never_evicted_under_pressure(tiny_llama, hf):
    with engine(tiny_llama, max_total_tokens=160) as eng:
        prefix = eng.encode("the green tree by the river in the city of tokyo is old")
        eng.generate(prefix, SamplingParams(max_new_tokens=0))
        long_req = prefix + eng.encode(" and the answer is", add_special_tokens=False)
        handle = eng.submit(long_req, SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True))
        next(iter(handle.events()))  # admitted and decoding: its matched prefix is locked
        others = shared_prefix_prompts(eng.tokenizer, 10, seed=5, prefix_words=10)
        results = eng.generate(others, GREEDY)
        r = handle.result(timeout=120)
        assert r.meta.cached_tokens == len(prefix)
        assert r.token_ids == hf.greedy_ignore_eos(long_req, 40)
        assert [x.token_ids for x in results] == [hf.greedy(p, 12) for p in others]
        assert eng.cache_stats()["evicted_tokens"] > 0
        assert_idle_accounting(eng)


def test_pinned_prefix_survives_pressure_until_unpinned(tiny_llama, hf):
    with engine(tiny_llama, max_total_tokens=128) as eng:
        prefix = eng.encode("json key value true false null list item first second third")
        handle = eng.pin_prefix(prefix)
        assert eng.cache_stats()["protected_tokens"] == len(prefix)
        for p in shared_prefix_prompts(eng.tokenizer, 8, seed=7, prefix_words=14):
            eng.generate(p, GREEDY)
        assert eng.cache_stats()["evicted_tokens"] > 0
        assert_idle_accounting(eng, pinned_tokens=len(prefix))
        assert eng.flush_cache()
        assert eng.cache_stats()["evictable_tokens"] == 0
        q = prefix + eng.encode(" yes", add_special_tokens=False)
        r = eng.generate(q, GREEDY)
        assert r.meta.cached_tokens == len(prefix) and r.token_ids == hf.greedy(q, 12)
        eng.unpin(handle)
        assert_idle_accounting(eng)
        with pytest.raises(ValueError, match="unknown pin handle"):
            eng.unpin(handle)
        # a text pins the ids generate() encodes it to
        text = "json key value true false null list item first second third"
        handle = eng.pin_prefix(text)
        assert eng.cache_stats()["protected_tokens"] == len(eng.encode(text))
        eng.unpin(handle)
        with pytest.raises(TypeError, match=r"a list of token ids \(ints\); item 1 is 'x'"):
            eng.pin_prefix([1, "x"])


@pytest.mark.parametrize("bad, shown", [(True, "True"), (1.0, "1.0")])
def test_unpin_of_a_bool_or_a_float_releases_no_pin(tiny_llama, bad, shown):
    """unpin(True), and unpin(1.0), released the pin whose handle is 1 (both equal 1 as a dict key)."""
    with engine(tiny_llama, max_total_tokens=128) as eng:
        prefix = eng.encode("json key value true")
        handle = eng.pin_prefix(prefix)
        assert handle == 1
        with pytest.raises(ValueError) as e:
            eng.unpin(bad)
        assert str(e.value) == f"unknown pin handle {shown}"
        assert eng.cache_stats()["protected_tokens"] == len(prefix)
        eng.unpin(handle)
        assert_idle_accounting(eng)


def test_retraction_requeues_requests_and_keeps_outputs(tiny_llama, hf):
    with engine(tiny_llama, max_total_tokens=200) as eng:
        ps = shared_prefix_prompts(eng.tokenizer, 6, seed=11, prefix_words=8)
        params = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
        results = eng.generate(ps, params)
        assert eng.cache_stats()["retracted_requests"] > 0
        assert [r.token_ids for r in results] == [hf.greedy_ignore_eos(p, 60) for p in ps]
        assert all(r.finish_reason.type == "length" for r in results)
        assert_idle_accounting(eng)


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_a_retracted_request_goes_back_to_its_place_by_arrival_and_the_order_is_the_sorted_ones(tiny_llama, policy):
    # The policy sorted the whole waiting queue by arrival once per step; it now reads the queue as
    # the scheduler keeps it, in arrival order, where a retracted request was appended at the end.
    # Each step's admission order must be what the sort gave: that of the queue sorted by arrival.
    with engine(tiny_llama, max_total_tokens=200, schedule_policy=policy) as eng:
        order = eng.scheduler.policy.order
        queues, same = [], []

        def checked(waiting):
            got = order(waiting)
            queues.append([r.arrival for r in waiting])
            same.append([id(r) for r in got] == [id(r) for r in order(sorted(waiting, key=lambda r: r.arrival))])
            return got

        eng.scheduler.policy.order = checked
        ps = shared_prefix_prompts(eng.tokenizer, 8, seed=11, prefix_words=8)
        eng.generate(ps, SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True))
        assert eng.cache_stats()["retracted_requests"] > 0
        assert any(len(q) > 1 for q in queues) and all(same)
        assert [q for q in queues if q != sorted(q)] == []


def test_the_decode_reserve_starts_over_when_the_engine_is_idle(tiny_llama, hf):
    # SGLang resets new_token_ratio to its initial value whenever the scheduler idles: a burst is
    # admitted (and retracted) the same way on a used engine as on a fresh one.
    with engine(tiny_llama, max_total_tokens=200) as eng:
        ps = shared_prefix_prompts(eng.tokenizer, 6, seed=11, prefix_words=8)
        params = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
        assert eng.cache_stats()["new_token_ratio"] == SchedulerConfig().init_new_token_ratio
        eng.generate(ps, params)
        first = eng.cache_stats()["retracted_requests"]
        assert first > 0
        assert eng.cache_stats()["new_token_ratio"] == SchedulerConfig().init_new_token_ratio
        assert eng.flush_cache()  # the same cold cache as the first burst had
        results = eng.generate(ps, params)
        assert eng.cache_stats()["retracted_requests"] == first
        assert [r.token_ids for r in results] == [hf.greedy_ignore_eos(p, 60) for p in ps]
        assert_idle_accounting(eng)


def test_seeded_sampling_survives_retraction(tiny_llama):
    params = SamplingParams(max_new_tokens=60, temperature=1.0, seed=5, ignore_eos=True)
    with engine(tiny_llama, max_total_tokens=200) as small, engine(tiny_llama) as big:
        ps = shared_prefix_prompts(small.tokenizer, 6, seed=11, prefix_words=8)
        squeezed = small.generate(ps, params)
        assert small.cache_stats()["retracted_requests"] > 0
        alone = [big.generate(p, params).token_ids for p in ps]
        assert [r.token_ids for r in squeezed] == alone


def test_flush_and_tree_snapshot(tiny_llama):
    with engine(tiny_llama) as eng:
        eng.generate(["the cat", "the dog"], GREEDY)
        root = eng.tree_snapshot()
        assert root.parent_id is None and root.num_tokens == 0 and root.lock_ref == 0
        kids = root.children
        assert all(c.parent_id == root.node_id for c in kids)
        total = 0
        stack = list(kids)
        while stack:
            n = stack.pop()
            total += n.num_tokens
            stack.extend(n.children)
        assert total == eng.cache_stats()["evictable_tokens"] > 0
        assert eng.flush_cache()
        s = eng.cache_stats()
        assert s["evictable_tokens"] == 0 and s["hit_rate"] == 0 and not eng.tree_snapshot().children
        assert_idle_accounting(eng)



def test_a_chunked_prompt_waits_for_room_instead_of_failing_the_step(tiny_llama):
    """Decode rows take their slots first; a chunked prompt that then finds the pool full waits
    for the running requests (or their retraction) instead of failing the step with
    KVPoolExhausted. A 300-token pool, 16-token chunks and three rounds of 48 mixed requests (a
    helper's reproduction: the third round hit the full pool mid-chunk before the fix)."""
    import random

    from lmnb_engine import Engine, SamplingParams

    words = "the cat is red and a blue bird sat on the one two three four dog".split()
    rng = random.Random(1)
    kinds = [dict(max_new_tokens=1), dict(max_new_tokens=3, temperature=0.9, seed=4),
             dict(max_new_tokens=60, ignore_eos=True), dict(max_new_tokens=60),
             dict(max_new_tokens=50, temperature=1.0, top_p=0.9, seed=9, n=3, ignore_eos=True),
             dict(max_new_tokens=40, temperature=0.8, seed=3, stop=[" the", "e"]),
             dict(max_new_tokens=40, stop_token_ids=[5, 6, 7, 8, 9, 10, 11, 12]),
             dict(max_new_tokens=25, return_logprob=True, logprob_start_len=0), dict(max_new_tokens=0)]
    with Engine(str(tiny_llama), max_total_tokens=300, chunked_prefill_size=16, attention_backend="torch") as eng:
        for _ in range(3):
            items = [(" ".join(rng.choice(words) for _ in range(rng.randint(4, 60))), SamplingParams(**kw))
                     for kw in kinds for _ in range(5)]
            rng.shuffle(items)
            made = [eng._make_reqs(eng._to_ids(text), params) for text, params in items]
            eng.scheduler.submit([r for _, reqs in made for r in reqs])
            for h, _ in made:
                r = h.result(timeout=120)
                for one in r if isinstance(r, list) else [r]:
                    assert one.finish_reason.type != "abort", one.finish_reason.message
            eng.check_invariants()


def _pinned_after_it_came(eng, prefix: list[int], prompt: list[int], params: SamplingParams):
    """Submit ``prompt``, then pin ``prefix`` (cached already), the scheduler held meanwhile so
    that both come before its next step: a pin taken after the request arrived, which its
    arrival's check could not see. (handle, pin handle)."""
    s = eng.scheduler
    held, go = threading.Event(), threading.Event()
    s.call(lambda: (held.set(), go.wait(60)))
    assert held.wait(60)
    handle = eng.submit(prompt, params)
    pin = s.call(lambda: s.pin(prefix))
    go.set()
    return handle, pin.result(60)


def test_a_prompt_that_cannot_fit_beside_pinned_prefixes_says_how_many_tokens_are_pinned(tiny_llama):
    """The count was the cache's protected size, which also holds the request's own locked chunks
    (it said 320 of a 320-slot pool were pinned, with 200 pinned). The pin comes after the request:
    one before it is refused as the request arrives
    (test_a_request_that_cannot_finish_beside_pinned_prefixes_is_aborted_as_it_arrives)."""
    import random

    with engine(tiny_llama, max_total_tokens=320, chunked_prefill_size=16) as eng:
        rng = random.Random(0)
        prefix = [rng.randrange(10, 500) for _ in range(200)]
        eng.generate(prefix, SamplingParams(max_new_tokens=0))
        h, pin = _pinned_after_it_came(eng, prefix, [rng.randrange(10, 500) for _ in range(150)],
                                       SamplingParams(max_new_tokens=5))
        r = h.result(timeout=60)
        assert r.finish_reason.type == "abort"
        assert r.finish_reason.message == ("a chunked prompt needs more KV slots but none of 320 can be freed (200 are "
                                           "pinned); unpin prefixes, or raise max_total_tokens")
        eng.unpin(pin)
        assert_idle_accounting(eng)


def test_a_request_that_cannot_finish_beside_pinned_prefixes_says_what_it_needs_to_finish(tiny_llama):
    """It said its length at the abort ("needs 51 KV slots") where it needs a slot for each of its
    prompt + max_new_tokens tokens but the last, never fed back, to finish (54), which is what
    raising max_total_tokens or unpinning must give. The pin comes after the request: it then
    generates until the pool runs out (a slot for each of 45 + 6 tokens but the last), and is told
    the max_new_tokens that finishes in the 50 unpinned slots (45 + 6 - 1 = 50)."""
    import random

    with engine(tiny_llama, max_total_tokens=100) as eng:
        rng = random.Random(1)
        prefix = [rng.randrange(10, 500) for _ in range(50)]
        eng.generate(prefix, SamplingParams(max_new_tokens=0))
        h, pin = _pinned_after_it_came(eng, prefix, [rng.randrange(10, 500) for _ in range(45)],
                                       SamplingParams(max_new_tokens=10, ignore_eos=True))
        r = h.result(timeout=60)
        assert r.finish_reason.type == "abort"
        assert r.finish_reason.message == ("request needs 54 KV slots to finish (51 for its tokens so far) but only 50 "
                                           "of 100 can be freed (50 are pinned); unpin prefixes, or raise max_total_tokens, "
                                           "or lower max_new_tokens to 6")
        assert len(r.token_ids) == 6
        eng.unpin(pin)
        assert_idle_accounting(eng)


def test_an_abort_where_the_pool_runs_out_beside_pins_offers_the_max_new_tokens_that_finishes(tiny_llama):
    """The abort of a request that a pin taken after it came keeps out (``_unblock_head``) told it to
    unpin or raise the pool only, where the arrival's refusal also offers the max_new_tokens that
    finishes. A prompt of 30 pinned + 45 fresh tokens beside 50 pinned of 100: 45 + M - 1 = 50
    unpinned slots, M = 6 (the tokens it wrote); a prompt of 60 fresh tokens does not fit the 50 at
    all, so no length is offered."""
    import random

    with engine(tiny_llama, max_total_tokens=100) as eng:
        rng = random.Random(5)
        prefix = [rng.randrange(10, 500) for _ in range(50)]
        eng.generate(prefix, SamplingParams(max_new_tokens=0))
        h, pin = _pinned_after_it_came(eng, prefix, prefix[:30] + [rng.randrange(10, 500) for _ in range(45)],
                                       SamplingParams(max_new_tokens=10, ignore_eos=True))
        r = h.result(timeout=60)
        assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
            "request needs 84 KV slots to finish (81 for its tokens so far, 30 of them pinned already) but only 50 of "
            "100 can be freed (50 are pinned); unpin prefixes, or raise max_total_tokens, or lower max_new_tokens to 6"))
        assert len(r.token_ids) == 6
        eng.unpin(pin)
        h, pin = _pinned_after_it_came(eng, prefix, [rng.randrange(10, 500) for _ in range(60)],
                                       SamplingParams(max_new_tokens=10, ignore_eos=True))
        r = h.result(timeout=60)
        assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
            "request needs 69 KV slots to finish (60 for its tokens so far) but only 50 of 100 can be freed (50 are "
            "pinned); unpin prefixes, or raise max_total_tokens"))
        assert r.token_ids == []
        eng.unpin(pin)
        assert_idle_accounting(eng)


def _pin_50_and_30(eng, rng) -> tuple[list[int], list[int], list]:
    """Pin two prefixes of random ids (10 to 499, from ``rng``) of 50 and 30 tokens in ``eng`` (a
    150-token pool: 70 slots left free); the prefixes and their pins."""
    a, b = ([rng.randrange(10, 500) for _ in range(k)] for k in (50, 30))
    return a, b, [eng.pin_prefix(a), eng.pin_prefix(b)]


# how an arrival beside those pins that does not fit is refused, before its fix
_REFUSED_BESIDE_50_AND_30 = "but only 70 of 150 can be freed (80 are pinned); unpin prefixes, or raise max_total_tokens"


def test_a_request_that_cannot_finish_beside_pinned_prefixes_is_aborted_as_it_arrives(tiny_llama):
    """It was admitted and generated until the pool ran out, then aborted: the work was wasted.
    Pinned: 50 + 30 of a 150-token pool, 70 free. A request needs a slot for each token but its
    last sampled one (prompt + max_new_tokens - 1), less the part of its prompt a pinned prefix
    holds (at most all but its last token, which is computed again for its logits)."""
    import random

    with engine(tiny_llama, max_total_tokens=150) as eng:
        rng = random.Random(2)
        a, b, pins = _pin_50_and_30(eng, rng)
        fresh = [rng.randrange(10, 500) for _ in range(45)]
        refusal = _REFUSED_BESIDE_50_AND_30
        for prompt, max_new, message in [  # (the refusal names the largest max_new_tokens that finishes)
            (fresh, 26, None),  # 45 + 26 - 1 = 70
            (fresh, 27, f"request needs 71 KV slots to finish {refusal}, or lower max_new_tokens to 26"),
            (a[:30] + fresh[:20], 51, None),  # 50 + 51 - 1 - 30 = 70
            (a[:30] + fresh[:20], 52, f"request needs 101 KV slots to finish (30 of them pinned already) {refusal}, "
                                      "or lower max_new_tokens to 51"),
            (a, 70, None),  # 50 + 70 - 1 - 49 = 70
            (a, 71, f"request needs 120 KV slots to finish (49 of them pinned already) {refusal}, "
                    "or lower max_new_tokens to 70"),
        ]:
            r = eng.generate(prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            if message is None:
                assert (r.finish_reason.type, len(r.token_ids)) == ("length", max_new), r.finish_reason
            else:
                assert (r.finish_reason.type, r.finish_reason.message) == ("abort", message)
                assert r.token_ids == [] and r.meta.forward_passes == 0
        for pin in pins:
            eng.unpin(pin)
        assert_idle_accounting(eng)


def test_a_request_of_a_model_with_no_eos_ids_is_refused_beside_pins_as_one_that_runs_to_its_length(
        tiny_llama, tmp_path):
    """A model whose config.json names no EOS id (null), with no generation_config.json and a
    tokenizer with no eos_token, has no EOS ids: with no stop settings only its length ends a
    request, as with ignore_eos, but the arrival check counted its min_new_tokens + 1, so one that
    could not finish was admitted and aborted where the pool ran out, its tokens wasted. Pinned:
    50 + 30 of a 150-token pool, 70 free, beside a 45-token prompt: max_new_tokens=26 fits
    (45 + 26 - 1 = 70), 27 is one over and refused as it arrives."""
    import json
    import random
    import shutil

    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    (ck / "generation_config.json").unlink()
    for name, key in (("config.json", "eos_token_id"), ("tokenizer_config.json", "eos_token")):
        cfg = json.loads((ck / name).read_text())
        (ck / name).write_text(json.dumps({**cfg, key: None}))  # (a missing eos_token_id is LlamaConfig's 2)
    with pytest.warns(UserWarning, match="no EOS token id is known"), engine(ck, max_total_tokens=150) as eng:
        assert eng.eos_token_ids == frozenset()
        rng = random.Random(2)
        a, b, pins = _pin_50_and_30(eng, rng)
        prompt = [rng.randrange(10, 500) for _ in range(45)]
        r = eng.generate(prompt, SamplingParams(max_new_tokens=26))
        assert (r.finish_reason.type, len(r.token_ids)) == ("length", 26), r.finish_reason
        r = eng.generate(prompt, SamplingParams(max_new_tokens=27))
        assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
            "request needs 71 KV slots to finish but only 70 of 150 can be freed (80 are pinned); unpin prefixes, "
            "or raise max_total_tokens, or lower max_new_tokens to 26"))
        assert r.token_ids == [] and r.meta.forward_passes == 0
        for pin in pins:
            eng.unpin(pin)
        assert_idle_accounting(eng)


@pytest.mark.parametrize("template", ["default", None])
def test_a_programs_gen_kept_out_by_pinned_prefixes_is_told_the_max_tokens_that_finishes(tiny_llama, template):
    """The arrival's refusal names the largest max_new_tokens that finishes; a program's gen is told
    it as gen()'s max_tokens (the engine's name, max_new_tokens, is no argument of gen()). Only its
    length ends an ignore_eos gen: 45 prompt tokens beside 80 pinned of 150, 45 + 27 - 1 = 71 > 70,
    45 + 26 - 1 = 70. The "default" chat template has no end of message; the model's own (None)
    has "<|end|>", a special token the output text leaves out, which was added as a stop, so the
    engine took the gen for one that may stop sooner: it generated until the pool ran out and then
    aborted, 26 tokens in, where the raw engine's request is refused before any forward pass. Under
    ignore_eos no end-of-message stop is added, so it is refused as it arrives, the same counts."""
    import random

    import lmnb as sgl

    @sgl.function
    def prog(s):
        s += "x" * 45
        s += sgl.gen("y", max_tokens=27, ignore_eos=True)

    with engine(tiny_llama, max_total_tokens=150) as eng:
        backend = sgl.Engine(engine=eng)
        if template:
            backend.chat_template = sgl.get_chat_template(template)
        else:
            assert backend.chat_template.stop_str == ("<|end|>",)
        rng = random.Random(4)
        pin = eng.pin_prefix([rng.randrange(10, 500) for _ in range(80)])
        assert len(eng.encode("x" * 45)) == 45
        state = prog.run(backend=backend)
        assert str(state.error()).endswith(
            "the request was aborted: request needs 71 KV slots to finish but only 70 of 150 can be freed (80 are "
            "pinned); unpin prefixes, or raise max_total_tokens, or lower max_tokens to 26"), state.error()
        eng.unpin(pin)
        assert_idle_accounting(eng)


def test_a_request_that_may_stop_sooner_is_refused_beside_pinned_prefixes_only_for_its_prompt(tiny_llama):
    """A request that a grammar, a stop or EOS may end before its max_new_tokens was refused as it
    arrived for max_new_tokens it would never reach: regex "abc" with max_new_tokens=60 beside pins
    that leave 70 of 150 slots (45 + 60 - 1 = 104 > 70), though it ends after "abc" (it ran before
    the arrival check). Only its prompt surely needs slots: 71 fresh tokens are refused, 70 run, and
    a prompt sharing 30 pinned tokens needs 41 of its 71. Pinned: 50 + 30 of a 150-token pool."""
    import random

    with engine(tiny_llama, max_total_tokens=150) as eng:
        rng = random.Random(3)
        a, b, pins = _pin_50_and_30(eng, rng)
        fresh = [rng.randrange(10, 500) for _ in range(71)]
        refusal = _REFUSED_BESIDE_50_AND_30
        for prompt, params, message in [
            (fresh[:45], SamplingParams(max_new_tokens=60, regex="abc"), None),
            (fresh[:45], SamplingParams(max_new_tokens=60, stop_token_ids=[7], ignore_eos=True), None),
            (fresh[:70], SamplingParams(max_new_tokens=60, regex="abc"), None),
            (fresh, SamplingParams(max_new_tokens=60, regex="abc"), f"request needs 71 KV slots for its prompt {refusal}"),
            (a[:30] + fresh[:41], SamplingParams(max_new_tokens=60, regex="abc"), None),
            (a[:30] + fresh[:41], SamplingParams(max_new_tokens=60, ignore_eos=True),
             f"request needs 130 KV slots to finish (30 of them pinned already) {refusal}, or lower max_new_tokens "
             "to 30"),  # (71 + 30 - 1 - 30 = 70)
        ]:
            r = eng.generate(prompt, params)
            if message is not None:
                assert (r.finish_reason.type, r.finish_reason.message) == ("abort", message)
                assert r.token_ids == [] and r.meta.forward_passes == 0
            elif params.regex is not None:
                assert (r.finish_reason.type, r.text) == ("stop", "abc"), r.finish_reason
            else:  # (it ran: it stopped at token 7, or aborted where the pool ran out, 70 - 45 + 1 tokens in)
                assert r.meta.forward_passes > 0
                assert r.finish_reason.type == "stop" or r.finish_reason.message == (
                    f"request needs 104 KV slots to finish (71 for its tokens so far) {refusal}, or lower "
                    "max_new_tokens to 26"), r.finish_reason  # (45 + 26 - 1 = 70)
        for pin in pins:
            eng.unpin(pin)
        assert_idle_accounting(eng)


def test_a_request_that_min_new_tokens_keeps_from_stopping_is_refused_beside_pinned_prefixes_as_it_arrives(tiny_llama):
    """A request with stops, or EOS, and a min_new_tokens that cannot fit beside the pins was
    admitted (only its prompt was counted: it may stop sooner) and generated until the pool ran out,
    then aborted, though min_new_tokens holds off EOS, stop tokens and stops until that many tokens
    exist. It surely needs a slot for each of prompt + min_new_tokens tokens but the last (a stop is
    checked from the min_new_tokens-th token on), or for each where EOS alone can end it (the token
    after them), less what a pinned prefix holds, and is refused as it arrives, told the
    min_new_tokens that fits (a program its min_tokens). Pinned: 50 + 30 of a 150-token pool, 70 free."""
    import random

    import lmnb as sgl

    with engine(tiny_llama, max_total_tokens=150) as eng:
        rng = random.Random(6)
        a, b, pins = _pin_50_and_30(eng, rng)
        fresh = [rng.randrange(10, 500) for _ in range(71)]
        refusal = _REFUSED_BESIDE_50_AND_30
        stops = dict(max_new_tokens=60, stop_token_ids=[7], stop=["x"])
        for prompt, params, message in [
            (fresh[:45], SamplingParams(min_new_tokens=26, **stops), None),  # 45 + 26 - 1 = 70
            (fresh[:45], SamplingParams(min_new_tokens=27, **stops),
             f"request needs 71 KV slots for its prompt + min_new_tokens=27 {refusal}, or lower min_new_tokens to 26"),
            (fresh[:45], SamplingParams(max_new_tokens=60, min_new_tokens=27),  # (EOS alone: 45 + 27 = 72)
             f"request needs 72 KV slots for its prompt + min_new_tokens=27 {refusal}, or lower min_new_tokens to 25"),
            (a[:30] + fresh[:41], SamplingParams(min_new_tokens=31, **stops),  # 71 + 31 - 1 - 30 = 71
             f"request needs 101 KV slots for its prompt + min_new_tokens=31 (30 of them pinned already) {refusal}, "
             "or lower min_new_tokens to 30"),
            (fresh, SamplingParams(min_new_tokens=5, **stops), f"request needs 71 KV slots for its prompt {refusal}"),
        ]:
            r = eng.generate(prompt, params)
            if message is not None:
                assert (r.finish_reason.type, r.finish_reason.message) == ("abort", message)
                assert r.token_ids == [] and r.meta.forward_passes == 0
            else:  # (it ran: it stopped, or aborted where the pool ran out, 26 tokens in)
                assert r.meta.forward_passes > 0 and len(r.token_ids) >= 26
                assert r.finish_reason.type == "stop" or r.finish_reason.message == (
                    f"request needs 104 KV slots to finish (71 for its tokens so far) {refusal}, or lower "
                    "max_new_tokens to 26"), r.finish_reason

        @sgl.function
        def prog(s):
            s += "x" * 45
            s += sgl.gen("y", max_tokens=60, min_tokens=27, stop=".")

        backend = sgl.Engine(engine=eng)
        backend.chat_template = sgl.get_chat_template("default")
        assert len(eng.encode("x" * 45)) == 45
        state = prog.run(backend=backend)
        assert (f"request needs 71 KV slots for its prompt + min_tokens=27 {refusal}, or lower min_tokens to 26"
                in str(state.error())), state.error()
        for pin in pins:
            eng.unpin(pin)
        assert_idle_accounting(eng)


def test_a_request_only_a_stop_token_ends_is_refused_beside_pins_where_its_min_new_tokens_leave_no_slot_for_the_last(
        tiny_llama, hf):
    """min_new_tokens=m masks EOS and stop token ids until m tokens exist, so a request that nothing
    else ends stops at token m + 1 at the earliest, holding a slot for its prompt and each of its m
    tokens (the stop token is not fed back). The arrival check counted prompt + m - 1 slots, as for
    a stop string (checked from token m on): one a slot short was admitted, and aborted where the
    pool ran out m tokens in; its offer "lower min_new_tokens to N" was itself one such. Pinned:
    50 + 30 of a 150-token pool, 70 free, beside a 45-token prompt: m = 25 fits (45 + 25 = 70) and
    stops at the stop token it samples 26th (greedy: the reference's 26th token, not among its first
    25, so masking it leaves those as they are); m = 26 is one over, and refused as it arrives; with
    max_new_tokens = m = 26 its length ends it at token 26 (45 + 25 = 70) and it fits; with a stop
    string or a regex (checked at token m) m = 26 fits (45 + 26 - 1 = 70) and m = 27 is one over."""
    import random

    with engine(tiny_llama, max_total_tokens=150) as eng:
        rng = random.Random(9)
        a, b, pins = _pin_50_and_30(eng, rng)
        prompt = [rng.randrange(10, 500) for _ in range(45)]
        ahead = hf.greedy_ignore_eos(prompt, 26)
        stop = ahead[25]
        assert stop not in ahead[:25]  # (the premise of the stop at token 26)
        ids = dict(max_new_tokens=60, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
        refusal = _REFUSED_BESIDE_50_AND_30
        r = eng.generate(prompt, SamplingParams(min_new_tokens=25, **ids))
        assert (r.finish_reason.type, r.finish_reason.matched, r.token_ids[:25]) == ("stop", stop, ahead[:25])
        r = eng.generate(prompt, SamplingParams(min_new_tokens=26, **ids))
        assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
            f"request needs 71 KV slots for its prompt + min_new_tokens=26 {refusal}, or lower min_new_tokens to 25"))
        assert r.token_ids == [] and r.meta.forward_passes == 0
        r = eng.generate(prompt, SamplingParams(**{**ids, "max_new_tokens": 26}, min_new_tokens=26))
        # (its stop token masked to the end: the 26th is another)
        assert (r.finish_reason.type, r.token_ids[:25], len(r.token_ids)) == ("length", ahead[:25], 26)
        assert r.token_ids[25] != stop
        text = dict(max_new_tokens=60, stop_token_ids=[7])
        for ends in (dict(stop=["x"]), dict(stop_regex=["x+y"]), dict(regex="[a-z ]+")):
            r = eng.generate(prompt, SamplingParams(min_new_tokens=26, **text, **ends))
            assert r.meta.forward_passes > 0 and len(r.token_ids) >= 26, (ends, r.finish_reason)
            r = eng.generate(prompt, SamplingParams(min_new_tokens=27, **text, **ends))
            assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
                f"request needs 71 KV slots for its prompt + min_new_tokens=27 {refusal}, or lower min_new_tokens "
                "to 26")), ends
        for pin in pins:
            eng.unpin(pin)
        assert_idle_accounting(eng)


def test_an_abort_where_the_pool_runs_out_beside_pins_offers_a_max_new_tokens_its_min_new_tokens_allows(tiny_llama):
    """The abort of a request that a pin taken after it came keeps out offered "lower max_new_tokens
    to 6" to one with min_new_tokens=8, a max_new_tokens that is refused (it must not be below
    min_new_tokens); it offers both lowered. 45 fresh prompt tokens beside 50 pinned of 100:
    45 + M - 1 = 50, M = 6 (the tokens it wrote; min_new_tokens holds its stop token off)."""
    import random

    with engine(tiny_llama, max_total_tokens=100) as eng:
        rng = random.Random(7)
        prefix = [rng.randrange(10, 500) for _ in range(50)]
        eng.generate(prefix, SamplingParams(max_new_tokens=0))
        h, pin = _pinned_after_it_came(eng, prefix, [rng.randrange(10, 500) for _ in range(45)],
                                       SamplingParams(max_new_tokens=10, min_new_tokens=8, stop_token_ids=[7]))
        r = h.result(timeout=60)
        assert (r.finish_reason.type, r.finish_reason.message) == ("abort", (
            "request needs 54 KV slots to finish (51 for its tokens so far) but only 50 of 100 can be freed (50 are "
            "pinned); unpin prefixes, or raise max_total_tokens, or lower max_new_tokens and min_new_tokens to 6"))
        assert len(r.token_ids) == 6
        SamplingParams(max_new_tokens=6, min_new_tokens=6).validate()  # (the offer is one it takes)
        eng.unpin(pin)
        assert_idle_accounting(eng)
