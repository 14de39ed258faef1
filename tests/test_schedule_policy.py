"""Waiting-queue order of the cache-aware policies (paper §3), on a hand-built tree."""

from __future__ import annotations

import pytest
import torch

from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool
from lmnb_engine.params import SamplingParams
from lmnb_engine.prefix_cache import NoPrefixCache
from lmnb_engine.radix_cache import RadixCache
from lmnb_engine.request import Req
from lmnb_engine.schedule_policy import SchedulePolicy


def tree() -> RadixCache:
    pool = TokenToKVPool(64, 1, 1, 1, torch.float32, "cpu")
    cache = RadixCache(ReqToTokenPool(2, 64, "cpu"), pool)
    for key in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [7, 8]):  # A=[1..4] -> A1=[5,6]; B=[7,8]
        slots = pool.alloc(len(key))
        pool.free(slots[: cache.insert(key, slots)])
    return cache


def reqs(*prompts) -> list[Req]:
    out = []
    for i, p in enumerate(prompts):
        r = Req(f"r{i}", 0, p, SamplingParams(), tokenizer=None, emit=lambda e: None, seed=0)
        r.arrival = i
        out.append(r)
    return out


PROMPTS = (
    [7, 8, 9],  # r0: B, 2 cached
    [1, 2, 3, 4, 9],  # r1: A, 4 cached
    [1, 2, 3, 4, 5, 6, 9],  # r2: A1, 6 cached
    [1, 2, 3, 4, 5, 6, 8],  # r3: A1, 6 cached
    [9, 9],  # r4: nothing cached
)


def names(order) -> list[str]:
    return [r.rid for r in order]


def test_lpm_orders_by_cached_prefix_then_arrival():
    assert names(SchedulePolicy("lpm", tree()).order(reqs(*PROMPTS))) == ["r2", "r3", "r1", "r0", "r4"]


def test_dfs_weight_visits_heavier_subtrees_first_children_before_the_node():
    # weights: A subtree 3 (r1 at A, r2 and r3 at A1), B 1, root's own 1 (r4)
    order = SchedulePolicy("dfs-weight", tree()).order(reqs(*PROMPTS))
    assert names(order) == ["r2", "r3", "r1", "r0", "r4"]
    # make B heavier: three more requests end at B
    more = PROMPTS + ([7, 8, 1], [7, 8, 2], [7, 8, 3])
    order = SchedulePolicy("dfs-weight", tree()).order(reqs(*more))
    assert names(order) == ["r0", "r5", "r6", "r7", "r2", "r3", "r1", "r4"]


def test_fcfs_and_cache_disabled_keep_arrival_order():
    # (the queue in arrival order, as the scheduler keeps it: lpm would take r2 first)
    waiting = reqs(*PROMPTS)
    assert names(SchedulePolicy("fcfs", tree()).order(waiting)) == ["r0", "r1", "r2", "r3", "r4"]
    pool = TokenToKVPool(8, 1, 1, 1, torch.float32, "cpu")
    no_cache = NoPrefixCache(ReqToTokenPool(1, 8, "cpu"), pool)
    assert names(SchedulePolicy("lpm", no_cache).order(waiting)) == ["r0", "r1", "r2", "r3", "r4"]


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="choose one of lpm, fcfs, dfs-weight"):
        SchedulePolicy("random", tree())


@pytest.mark.parametrize("seed", range(5))
def test_lpm_and_fcfs_on_random_queues_are_the_sorts_by_cached_length_then_arrival(seed):
    # the reference: sort by (longest cached prefix first, then arrival), and by arrival for fcfs,
    # over a queue in arrival order (as the scheduler keeps it); the matches worked out from the tree's keys
    import random

    rng = random.Random(seed)
    cached = ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [7, 8])  # tree()'s keys
    prompts = [[rng.choice([1, 7, 9])] + [rng.randint(1, 9) for _ in range(rng.randint(1, 7))] for _ in range(60)]
    queue = reqs(*prompts)
    arrivals = sorted(rng.sample(range(1000), len(queue)))
    for r, a in zip(queue, arrivals):
        r.arrival = a

    def cached_len(p):
        # SchedulePolicy matches max_prefix_len() tokens: the prompt less its last token
        key = p[:-1]
        best = 0
        for k in cached:
            n = 0
            while n < min(len(key), len(k)) and key[n] == k[n]:
                n += 1
            best = max(best, n)
        return best

    want = sorted(queue, key=lambda r: (-cached_len(list(r.origin_input_ids)), r.arrival))
    assert names(SchedulePolicy("lpm", tree()).order(queue)) == names(want)
    assert names(SchedulePolicy("fcfs", tree()).order(queue)) == names(queue)
