"""RadixCache and NoPrefixCache: matching, splitting, insertion, locking, LRU eviction, accounting.

Expected values come from a hand-worked tree or from a brute-force reference (a dict from every
inserted prefix to the slot its last item got on first insertion).
"""

from __future__ import annotations

import random

import pytest
import torch

from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool
from lmnb_engine.params import SamplingParams
from lmnb_engine.prefix_cache import NoPrefixCache
from lmnb_engine.radix_cache import RadixCache
from lmnb_engine.request import Req


def make(pool_size: int = 64, cache_cls=RadixCache):
    pool = TokenToKVPool(pool_size, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32, device="cpu")
    rows = ReqToTokenPool(4, 128, "cpu")
    return pool, rows, cache_cls(rows, pool)


def assert_accounting(pool, cache, held: int = 0) -> None:
    """free + evictable + protected (+ slots held by requests) == pool size."""
    cache.check_invariants()
    total = pool.available_size() + cache.evictable_size() + cache.protected_size() + held
    assert total == pool.size, (pool.available_size(), cache.evictable_size(), cache.protected_size(), held)


def put(pool, cache, key) -> torch.Tensor:
    """Allocate slots for key, insert, free duplicates (what a finishing request does)."""
    slots = pool.alloc(len(key))
    already = cache.insert(key, slots)
    pool.free(slots[:already])
    return slots


def count_nodes(view) -> int:
    return 1 + sum(count_nodes(c) for c in view.children)


def test_match_insert_and_split():
    pool, _, cache = make()
    a = put(pool, cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.length == 3 and m.indices.tolist() == a[:3].tolist()
    # the match ended inside the edge [1..5]: it was split into [1,2,3] -> [4,5]
    view = cache.snapshot(lambda k: "")
    assert count_nodes(view) == 3
    assert [c.num_tokens for c in view.children] == [3]
    assert [c.num_tokens for c in view.children[0].children] == [2]
    assert m.node is cache.root.children[1]
    # inserting a sibling reuses the split node and reports 3 cached items
    slots = pool.alloc(5)
    assert cache.insert([1, 2, 3, 7, 8], slots) == 3
    pool.free(slots[:3])
    assert cache.match_prefix([1, 2, 3, 7, 8]).indices.tolist() == a[:3].tolist() + slots[3:].tolist()
    assert cache.match_prefix([9]).length == 0
    assert_accounting(pool, cache)
    assert cache.evictable_size() == 7 and cache.protected_size() == 0


def test_insert_of_cached_key_returns_full_length():
    pool, _, cache = make()
    put(pool, cache, [5, 6, 7])
    free_before = pool.available_size()
    assert len(put(pool, cache, [5, 6, 7])) == 3  # duplicate: all 3 slots freed again by put()
    assert pool.available_size() == free_before
    assert_accounting(pool, cache)


def test_lock_ref_moves_tokens_between_evictable_and_protected():
    pool, _, cache = make()
    put(pool, cache, [1, 2, 3, 4])
    put(pool, cache, [1, 2, 5, 6, 7])  # splits into [1,2] -> {[3,4], [5,6,7]}
    m = cache.match_prefix([1, 2, 5, 6, 7])
    assert cache.inc_lock_ref(m.node) == -5
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    m2 = cache.match_prefix([1, 2, 3, 4])
    assert cache.inc_lock_ref(m2.node) == -2  # [1,2] is already protected
    assert (cache.evictable_size(), cache.protected_size()) == (0, 7)
    assert cache.evict(100) == 0  # everything is locked
    assert cache.dec_lock_ref(m.node) == 3
    assert cache.evict(100) == 3  # only [5,6,7] can go; [1,2] is still on a locked path
    assert cache.match_prefix([1, 2, 5]).length == 2
    assert cache.dec_lock_ref(m2.node) == 4
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)
    assert_accounting(pool, cache)


def edges(cache) -> set[tuple]:
    """Every edge of the tree as a tuple of items (reading it does not touch access times)."""
    out, stack = set(), list(cache.root.children.values())
    while stack:
        node = stack.pop()
        out.add(node.key)
        stack.extend(node.children.values())
    return out


def test_eviction_is_lru_over_leaves_and_climbs_to_parents():
    pool, _, cache = make()
    put(pool, cache, [1, 2, 3])  # A
    put(pool, cache, [4, 5])  # B
    put(pool, cache, [1, 2, 9, 9])  # C, splits A into [1,2] -> {[3], [9,9]}
    cache.match_prefix([4, 5])  # B is now the most recently used
    # leaves by last access: [3] (when C split A, [3] kept A's old time), [9,9], [4,5]
    assert cache.evict(1) == 1
    assert edges(cache) == {(1, 2), (9, 9), (4, 5)}
    # after [9,9] goes, its parent [1,2] becomes a leaf older than B and goes next
    assert cache.evict(3) == 4
    assert edges(cache) == {(4, 5)}
    assert cache.evicted_tokens == 5
    assert_accounting(pool, cache)
    # a match refreshes the path: now [4,5] is older than the new [7]
    put(pool, cache, [7])
    cache.match_prefix([7])
    assert cache.evict(1) == 2
    assert edges(cache) == {(7,)}
    assert_accounting(pool, cache)


def test_keys_can_hold_any_hashable_items():
    pool, _, cache = make()
    image = ("image", "sha256:ab12")
    key = [1, 2, image, image, image, 3]
    slots = put(pool, cache, key)
    assert cache.match_prefix([1, 2, image, image, image, 3, 4]).indices.tolist() == slots.tolist()
    other = ("image", "sha256:ffff")
    assert cache.match_prefix([1, 2, other, other, other, 3]).length == 2
    assert_accounting(pool, cache)


def test_random_operations_against_brute_force_reference():
    rng = random.Random(0)
    pool, _, cache = make(pool_size=400)
    first_slot: dict[tuple, int] = {}  # every inserted prefix -> slot of its last item
    locked: list = []
    for step in range(400):
        op = rng.random()
        key = [rng.randint(0, 3) for _ in range(rng.randint(1, 12))]
        if op < 0.5:
            if pool.available_size() < len(key):
                cache.evict(len(key) - pool.available_size())
            if pool.available_size() < len(key):
                continue
            slots = pool.alloc(len(key))
            already = cache.insert(key, slots)
            pool.free(slots[:already])
            for i in range(already, len(key)):
                first_slot[tuple(key[: i + 1])] = int(slots[i])
        elif op < 0.65:
            m = cache.match_prefix(key)
            cache.inc_lock_ref(m.node)
            locked.append(m.node)
        elif op < 0.8 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        else:
            protected_before = cache.protected_size()
            cache.evict(rng.randint(1, 30))
            assert cache.protected_size() == protected_before
        m = cache.match_prefix(key)
        assert m.indices.tolist() == [first_slot[tuple(key[: i + 1])] for i in range(m.length)], step
        assert_accounting(pool, cache)
    for node in locked:
        cache.dec_lock_ref(node)
    assert cache.protected_size() == 0
    cache.evict(10**6)
    assert pool.available_size() == pool.size
    assert_accounting(pool, cache)


def _reference_evict(cache, num_tokens: int) -> tuple[list[int], int]:
    """LRU eviction worked out afresh at every pop: walk the tree, take the unlocked childless
    node (not the root) of least (last_access, id), delete it; (the ids deleted, in order, and
    the tokens freed)."""
    gone: list[int] = []
    freed = 0
    while freed < num_tokens:
        nodes, stack = [], [cache.root]
        while stack:
            nodes.append(stack.pop())
            stack.extend(nodes[-1].children.values())
        leaves = [n for n in nodes if n is not cache.root and n.lock_ref == 0 and not n.children]
        if not leaves:
            break
        node = min(leaves, key=lambda n: (n.last_access, n.id))
        gone.append(node.id)
        freed += cache._delete_leaf(node)
    return gone, freed


def test_eviction_order_is_lru_as_a_fresh_walk_of_the_tree_finds_it(monkeypatch):
    """The heap of evictable leaves is kept between evictions (it was built from every leaf on each
    call: quadratic for a select of thousands of choices); entries go out of date as nodes are
    locked, split, touched by a match or an insert, or become parents. Every eviction must still
    delete what a fresh LRU walk of the same tree deletes, in the same order."""
    import copy

    rng = random.Random(1)
    pool, _, cache = make(pool_size=300)
    locked: list = []
    deleted: list[int] = []
    real_delete = RadixCache._delete_leaf

    def recording_delete(self, node):
        if self is cache:
            deleted.append(node.id)
        return real_delete(self, node)

    monkeypatch.setattr(RadixCache, "_delete_leaf", recording_delete)

    def evict_as_the_reference_does(want: int) -> bool:
        expected, expected_freed = _reference_evict(copy.deepcopy((pool, cache))[1], want)
        deleted.clear()
        assert cache.evict(want) == expected_freed
        assert deleted == expected
        return bool(expected)

    evictions = 0
    for step in range(3000):
        op = rng.random()
        key = [rng.randint(0, 4) for _ in range(rng.randint(1, 10))]
        if op < 0.4:
            if pool.available_size() < len(key):
                continue
            put(pool, cache, key)  # (a cached key's insert touches its path, leaves included)
        elif op < 0.55:
            cache.match_prefix(key)  # touches (and may split) without locking
        elif op < 0.7:
            m = cache.match_prefix(key)
            cache.inc_lock_ref(m.node)
            locked.append(m.node)
        elif op < 0.8 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        elif op < 0.9:  # a request that came and went: its leaf is pushed again (the heap is rebuilt at times)
            m = cache.match_prefix(key)
            cache.inc_lock_ref(m.node)
            cache.dec_lock_ref(m.node)
        else:
            evictions += evict_as_the_reference_does(rng.randint(1, 40))
        assert_accounting(pool, cache)
    assert evictions > 100  # (the walk above reached many evictions, not a few)
    # requests that come and go with no eviction between: out-of-date entries pile up until the
    # heap is built again from the leaves
    nodes, stack = [], [cache.root]
    while stack:
        nodes.append(stack.pop())
        stack.extend(nodes[-1].children.values())
    leaves = [n for n in nodes if not n.children]
    for _ in range(20):
        for node in rng.sample(leaves, len(leaves)):
            cache.inc_lock_ref(node)
            cache.dec_lock_ref(node)
            assert_accounting(pool, cache)  # (every evictable leaf has a heap entry, after a rebuild too)
    assert evict_as_the_reference_does(pool.size)
    for node in locked:
        cache.dec_lock_ref(node)
    cache.evict(10**6)
    assert pool.available_size() == pool.size
    assert_accounting(pool, cache)


def _request(ids, rows, pool, cache) -> Req:
    """A request whose prompt is matched, locked and given fresh slots for the rest."""
    req = Req("r", 0, ids, SamplingParams(max_new_tokens=4), tokenizer=None, emit=lambda e: None, seed=0)
    m = cache.match_prefix(req.cache_key(len(ids)))
    cache.inc_lock_ref(m.node)
    req.req_pool_idx = rows.alloc()
    req.last_node, req.cache_protected_len = m.node, m.length
    new = pool.alloc(len(ids) - m.length)
    rows.req_to_token[req.req_pool_idx, : len(ids)] = torch.cat([m.indices, new]).to(torch.int32)
    req.kv_committed_len = req.kv_allocated_len = len(ids)
    return req


def test_finished_and_unfinished_requests_hand_back_their_slots():
    pool, rows, cache = make()
    a = _request([1, 2, 3, 4], rows, pool, cache)
    b = _request([1, 2, 3, 9, 9], rows, pool, cache)  # computed [1,2,3] itself: nothing was cached
    assert_accounting(pool, cache, held=9)
    cache.cache_unfinished_req(a)  # a's prompt enters the tree and stays locked by a
    assert (cache.evictable_size(), cache.protected_size()) == (0, 4)
    assert_accounting(pool, cache, held=5)
    # b finishes: its [1,2,3] duplicates a's cached slots and is freed; [9,9] becomes evictable
    cache.cache_finished_req(b)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 4)
    assert_accounting(pool, cache, held=0)
    # a decodes 2 more tokens into its own slots, then finishes with one slot allocated unused
    a.output_ids = [5, 6]
    rows.req_to_token[a.req_pool_idx, 4:7] = pool.alloc(3).to(torch.int32)
    a.kv_committed_len, a.kv_allocated_len = 6, 7
    assert_accounting(pool, cache, held=3)
    cache.cache_finished_req(a)
    assert cache.protected_size() == 0 and cache.evictable_size() == 8
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).length == 6
    assert_accounting(pool, cache)


def test_no_prefix_cache_frees_everything_on_finish():
    pool, rows, cache = make(cache_cls=NoPrefixCache)
    req = _request([1, 2, 3], rows, pool, cache)
    assert req.cache_protected_len == 0
    cache.cache_unfinished_req(req)  # keeps its slots
    assert pool.available_size() == pool.size - 3
    cache.cache_finished_req(req)
    assert pool.available_size() == pool.size
    assert cache.match_prefix([1, 2, 3]).length == 0
    root = cache.snapshot(lambda k: "")
    assert root.num_tokens == 0 and root.children == ()


def test_unlock_of_unlocked_node_is_an_error():
    pool, _, cache = make()
    put(pool, cache, [1, 2])
    with pytest.raises(AssertionError, match="unlocked"):
        cache.dec_lock_ref(cache.match_prefix([1, 2]).node)


def test_drop_nonfinite_cuts_the_path_at_the_first_bad_slot():
    pool, _, cache = make()
    a = put(pool, cache, [1, 2, 3, 4, 5, 6])
    put(pool, cache, [1, 2, 3, 4, 7])          # below the split at [1, 2, 3, 4]
    put(pool, cache, [1, 2, 9])                # a sibling branch that shares only [1, 2]
    pool.k_buffer[0][a[3]] = float("nan")      # slot of item 4: [1, 2, 3] stays, 4 and below go
    assert cache.drop_nonfinite([1, 2, 3, 4, 5, 6]) == 4  # items 4, 5, 6 and the 7 below 4
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).indices.tolist() == a[:3].tolist()
    assert cache.match_prefix([1, 2, 9]).length == 3
    assert cache.match_prefix([1, 2, 3, 4, 7]).length == 3
    assert_accounting(pool, cache)
    assert cache.drop_nonfinite([1, 2, 3]) == 0  # nothing non-finite is left on the path
    pool.k_buffer[0][a[3]] = 0.0                 # (slot a[3] is free again: reset it for reuse)
    # a path a request still holds is left to that request, which reads the same KV and fails too
    c = put(pool, cache, [5, 6, 7])
    m = cache.match_prefix([5, 6, 7])
    cache.inc_lock_ref(m.node)
    pool.v_buffer[0][c[1]] = float("inf")
    assert cache.drop_nonfinite([5, 6, 7]) == 0
    assert cache.match_prefix([5, 6, 7]).length == 3
    cache.dec_lock_ref(m.node)
    assert cache.drop_nonfinite([5, 6, 7]) == 2
    assert cache.match_prefix([5, 6, 7]).length == 1
    assert_accounting(pool, cache)


def test_snapshot_of_a_path_deeper_than_the_recursion_limit():
    # snapshot recursed once per node (twice per level with its generator): a path of 500 nodes,
    # which prompts growing one token at a time each with their own next token build, raised
    # RecursionError in Engine.tree_snapshot()
    depth = 1500
    pool, _, cache = make(pool_size=3 * depth + 1)  # 2 * depth cached, depth + 1 taken by the last put
    for k in range(1, depth + 1):
        put(pool, cache, [5] * k + [7])
    view = cache.snapshot(lambda k: "")
    # a chain of depth - 1 one-token [5] nodes, each with a [7] leaf, ending in the leaf [5, 7]
    nodes, tokens, deepest, stack = 0, 0, 0, [(view, 0)]
    while stack:
        v, d = stack.pop()
        nodes, tokens, deepest = nodes + 1, tokens + v.num_tokens, max(deepest, d)
        stack.extend((c, d + 1) for c in v.children)
    assert (nodes, tokens, deepest) == (2 * depth, 2 * depth, depth)
    assert_accounting(pool, cache)


@pytest.mark.parametrize("spans", [[(3, 5, 2), (1, 0, 3), (0, 9, 1)], [(2, 7, 1), (0, 0, 1), (3, 127, 1)],
                                   [(0, 40, 1), (2, 0, 0), (1, 10, 1), (3, 0, 6), (2, 33, 1)]],
                         ids=["prefill-spans", "decode-spans", "decodes-beside-a-chunk-and-an-empty-span"])
def test_req_to_token_spans_write_and_read_back_position_by_position(spans):
    """``write_spans`` fills each (row, start, n) span with the next n slots in turn; the same
    index (``span_index``) reads them back: checked against a table filled entry by entry."""
    from lmnb_engine.kv_pool import span_index

    rows = ReqToTokenPool(4, 128, "cpu")
    total = sum(n for _, _, n in spans)
    slots = torch.arange(100, 100 + total)
    rows.write_spans(spans, slots)
    expected = torch.zeros_like(rows.host)
    i = 0
    for r, p, n in spans:
        for j in range(n):
            expected[r, p + j] = 100 + i
            i += 1
    assert torch.equal(rows.host, expected) and rows.req_to_token is rows.host
    assert rows.host[tuple(span_index(spans))].tolist() == list(range(100, 100 + total))
