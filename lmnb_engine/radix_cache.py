"""RadixAttention's radix tree: key prefixes → KV-pool slots, shared across requests (paper §3).

Behaviour follows SGLang's ``mem_cache/radix_cache.py`` with page size 1: children are keyed by
the first item of their edge; a match that ends inside an edge splits the node so the match ends on
a node boundary (that node is what a request locks); ``insert`` returns the already-cached length
so the caller frees its duplicate slots; ``lock_ref`` is counted on every node from a locked node
up to the root and moves tokens between the evictable and protected totals; eviction is LRU over
unlocked leaves, popped from a heap, and a parent whose last child goes becomes a candidate. The
heap is kept between evictions (SGLang builds it from every leaf on each call, which made a select
of 10,000 choices, a leaf each, quadratic): an entry is pushed when a node becomes an evictable
leaf, and one gone out of date (the node locked, a parent again, or touched since) is skipped or
pushed again with its new access time when it comes up, so the order is the same LRU.

Keys are sequences of hashable items compared with ``==`` only — nothing here assumes tokenizer
ids, so an image's content hash can occupy its placeholder positions later.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Hashable, Optional, Sequence

import torch

from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool
from lmnb_engine.prefix_cache import Key, MatchResult, PrefixCache, TreeNodeView

_EMPTY = torch.empty(0, dtype=torch.int64)


class TreeNode:
    """One edge of the tree: ``key`` (tuple of items) and ``value`` (int64 [len(key)] KV slots)."""

    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access", "last_access_time")

    def __init__(self, node_id: int, key: tuple, value: torch.Tensor, parent: Optional["TreeNode"]) -> None:
        self.id = node_id
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0  # logical clock: orders LRU eviction deterministically
        self.last_access_time = time.time()  # wall clock, for display only


def _common_prefix_len(edge: tuple, key: Sequence[Hashable], start: int) -> int:
    """Number of leading items of ``edge`` equal to ``key[start:]``."""
    n = min(len(edge), len(key) - start)
    if tuple(key[start : start + n]) == edge[:n]:  # fast path: the whole overlap matches
        return n
    i = 0
    while i < n and edge[i] == key[start + i]:
        i += 1
    return i


class RadixCache(PrefixCache):
    """Radix tree over keys whose values are KV slot indices (page size 1).

    Args:
        req_to_token_pool, kv_pool: the pools; evicted slots go back to ``kv_pool``.
            ``kv_pool=None`` makes a *simulated* tree (no slots are ever freed), which the
            scheduler uses to find prefixes shared inside the waiting queue.
    """

    def __init__(self, req_to_token_pool: Optional[ReqToTokenPool], kv_pool: Optional[TokenToKVPool]) -> None:
        super().__init__(req_to_token_pool, kv_pool)  # type: ignore[arg-type]
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        self.reset()

    # --- bookkeeping helpers ---------------------------------------------------------------
    def reset(self) -> None:
        self.root = TreeNode(next(self._ids), (), _EMPTY, None)
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0
        self._leaves: set[TreeNode] = set()  # evictable leaves: unlocked, childless, not root
        # (last_access, id, node), min first: every node of _leaves has an entry whose last_access
        # is at most its own (a touch only raises it); entries of other nodes are out of date
        self._heap: list[tuple[int, int, TreeNode]] = []

    def _touch(self, node: TreeNode) -> None:
        node.last_access = next(self._clock)
        node.last_access_time = time.time()

    def _update_leaf(self, node: TreeNode) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            if node not in self._leaves:
                self._leaves.add(node)
                self._push_leaf(node)
        else:
            self._leaves.discard(node)

    def _push_leaf(self, node: TreeNode) -> None:
        """Give evictable leaf ``node`` a heap entry at its access time. When at least half the
        heap is out of date, it is built again from the leaves, so its size stays within twice
        theirs and the rebuilds cost O(1) per push amortized."""
        heapq.heappush(self._heap, (node.last_access, node.id, node))
        if len(self._heap) > 2 * len(self._leaves) + 64:
            self._heap = [(n.last_access, n.id, n) for n in self._leaves]
            heapq.heapify(self._heap)

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    # --- match / insert ----------------------------------------------------------------------
    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child``'s edge after ``split_len`` items; return the new upper node.

        No KV is copied; the slot tensor is sliced. The new node inherits the lock count, since
        whatever locked ``child`` also locked its prefix.
        """
        parent = child.parent
        assert parent is not None
        upper = TreeNode(next(self._ids), child.key[:split_len], child.value[:split_len], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access, upper.last_access_time = child.last_access, child.last_access_time
        upper.children[child.key[split_len]] = child
        parent.children[child.key[0]] = upper
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = upper
        return upper

    def _descend(self, key: Key) -> tuple[TreeNode, int, list[TreeNode]]:
        """Walk down the longest cached prefix of ``key``, splitting the last edge where the match
        ends inside it and refreshing the access time of every node passed (the root included).

        Returns (deepest matched node, matched length, the matched nodes below the root in order).
        """
        node, pos, path = self.root, 0, []
        self._touch(node)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_prefix_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            self._touch(child)
            path.append(child)
            node, pos = child, pos + n
        return node, pos, path

    def match_prefix(self, key: Key) -> MatchResult:
        """Longest cached prefix of ``key`` (splitting the last edge if the match ends inside it).

        Returns the matched slots (int64 [n], CPU) and the deepest matched node; every node on the
        path gets its access time refreshed.
        """
        node, _, path = self._descend(key)
        indices = torch.cat([child.value for child in path]) if path else _EMPTY
        return MatchResult(indices, node)

    def peek_path(self, key: Key) -> tuple[list[TreeNode], int]:
        """(the nodes below the root that ``key`` enters, in order; matched length), changing
        nothing: no edge is split (the last node may match only part of its edge) and no access
        time is refreshed."""
        node, pos, path = self.root, 0, []
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_prefix_len(child.key, key, pos)
            path.append(child)
            node, pos = child, pos + n
            if n < len(child.key):
                break
        return path, pos

    def peek_prefix(self, key: Key) -> tuple[Optional[int], int]:
        """Like ``match_prefix`` but changes nothing: no edge is split and no access time is
        refreshed, so looking (e.g. to label a widget's paths) never alters LRU eviction order."""
        path, pos = self.peek_path(key)
        return (path[-1].id, pos) if pos else (None, 0)

    def insert(self, key: Key, indices: torch.Tensor) -> int:
        """Insert ``key`` → ``indices`` (int64 [len(key)]); return the already-cached length.

        Only the new remainder becomes a leaf (and evictable); the caller still owns its slots for
        the already-cached span and must free the ones that are not the cache's own.
        """
        assert len(key) == int(indices.numel()), "insert needs one slot per key item"
        node, pos, _ = self._descend(key)
        if pos < len(key):
            leaf = TreeNode(next(self._ids), tuple(key[pos:]), indices[pos:].clone(), node)
            self._touch(leaf)
            node.children[leaf.key[0]] = leaf
            self._evictable += len(leaf.key)
            self._update_leaf(node)
            self._update_leaf(leaf)
        return pos

    # --- locking ---------------------------------------------------------------------------
    def inc_lock_ref(self, node: Optional[TreeNode]) -> int:
        delta = 0
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node: Optional[TreeNode]) -> int:
        delta = 0
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, f"dec_lock_ref on unlocked node {node.id}"
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            node = node.parent
        return delta

    # --- eviction ----------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free >= ``num_tokens`` slots if that many are evictable (LRU leaves first: the least
        ``last_access``, then the least id; a parent whose last child goes is a leaf then too)."""
        freed = 0
        while freed < num_tokens and self._heap:
            access, _, node = heapq.heappop(self._heap)
            if node not in self._leaves:  # out of date: locked, a parent again, or evicted
                continue
            if access != node.last_access:  # touched since: its place is later
                self._push_leaf(node)
                continue
            freed += self._delete_leaf(node)  # (its parent, a leaf now, is pushed there)
        self.evicted_tokens += freed
        return freed

    def _delete_leaf(self, node: TreeNode) -> int:
        """Unlink an unlocked childless ``node`` and free its slots; returns their number."""
        assert node.lock_ref == 0 and not node.children and node.parent is not None
        if self.kv_pool is not None:
            self.kv_pool.free(node.value)
        self._evictable -= len(node.key)
        del node.parent.children[node.key[0]]
        self._leaves.discard(node)
        self._update_leaf(node.parent)
        return len(node.key)

    def drop_nonfinite(self, key: Key) -> int:
        """Remove the cached KV along ``key``'s path from its first non-finite slot on (splitting
        the edge there), with the subtree below it; return the tokens freed.

        Called when a request failed on NaN logits: its KV (and, through attention, everything
        computed after it) is noise that would fail every request sharing the prefix. A node a
        request still holds is left: that request reads the same KV, fails in turn, and drops it.
        """
        if self.kv_pool is None:
            return 0
        path, _ = self.peek_path(key)  # dropping is not a use, for LRU's sake
        if not path:
            return 0
        bad = self.kv_pool.nonfinite_slots(torch.cat([c.value for c in path]))
        if not bool(bad.any()):
            return 0
        first, start = int(bad.nonzero()[0]), 0
        for node in path:
            if first < start + len(node.key):
                break
            start += len(node.key)
        if first > start:
            self._split(node, first - start)  # ``node`` keeps the lower part, from ``first`` on
        if node.lock_ref > 0:
            return 0
        subtree, stack = [], [node]  # unlocked throughout: a lock counts on every ancestor
        while stack:
            subtree.append(stack.pop())
            stack.extend(subtree[-1].children.values())
        return sum(self._delete_leaf(n) for n in reversed(subtree))  # children before parents

    # --- observability -----------------------------------------------------------------------
    def snapshot(self, preview: Callable[[Sequence[Hashable]], str]) -> TreeNodeView:
        """Frozen copy of the tree; ``preview(edge_key) -> str`` renders each edge's text. Built
        children first without recursion: a path can hold a node per token of the context."""
        order, stack = [], [self.root]
        while stack:  # every node after its parent
            order.append(stack.pop())
            stack.extend(order[-1].children.values())
        views: dict[TreeNode, TreeNodeView] = {}
        for node in reversed(order):  # every node after its children
            kids = sorted(node.children.values(), key=lambda c: c.id)
            views[node] = TreeNodeView(
                node_id=node.id,
                parent_id=node.parent.id if node.parent is not None else None,
                num_tokens=len(node.key),
                text_preview=preview(node.key) if node.key else "",
                lock_ref=node.lock_ref - (1 if node is self.root else 0),
                last_access_time=node.last_access_time,
                children=tuple(views.pop(c) for c in kids),
            )
        return views[self.root]

    def check_invariants(self) -> None:
        """Walk the tree and compare with the running totals and the leaf set."""
        evictable = protected = 0
        leaves = set()
        stack = [self.root]
        while stack:
            node = stack.pop()
            kids = list(node.children.values())
            if node is not self.root:  # the root's count is a constant 1, not a sum
                assert node.lock_ref >= sum(c.lock_ref for c in kids), f"node {node.id}: lock_ref below its children's"
            for first, c in node.children.items():
                assert c.parent is node and c.key and c.key[0] == first, f"node {c.id}: broken link"
                assert len(c.key) == int(c.value.numel()), f"node {c.id}: key and value lengths differ"
            if node is not self.root:
                if node.lock_ref == 0:
                    evictable += len(node.key)
                    if not kids:
                        leaves.add(node)
                else:
                    protected += len(node.key)
            stack.extend(kids)
        assert evictable == self._evictable, f"evictable size {self._evictable} != tree walk {evictable}"
        assert protected == self._protected, f"protected size {self._protected} != tree walk {protected}"
        assert leaves == self._leaves, "evictable-leaf set out of date"
        entered = {n for access, _, n in self._heap if n in leaves and access <= n.last_access}
        assert entered == leaves, f"evictable leaves without a heap entry: {sorted(n.id for n in leaves - entered)}"
