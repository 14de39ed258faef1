"""The prefix-cache contract shared by the radix cache and the "cache disabled" mode.

The scheduler only talks to a ``PrefixCache``: it matches a request's key against cached prefixes,
locks what it uses, hands finished (or partly computed) sequences back, and evicts to make room.
``RadixCache`` (``lmnb_engine.radix_cache``) is the real one (paper §3); ``NoPrefixCache`` below
caches nothing, so "radix cache off" is a plain implementation rather than branches in the
scheduler. The split follows mini-sglang's ``kvcache/base.py`` and SGLang's
``mem_cache/base_prefix_cache.py``.

KV-slot ownership (no refcounts, as in SGLang): a slot is free, owned by the cache (evictable when
no request locks its path, protected otherwise) or owned by exactly one running request. Hence the
accounting invariant ``free + evictable + protected + request-owned == pool size``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Optional, Sequence

import torch

from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool

if TYPE_CHECKING:
    from lmnb_engine.request import Req

Key = Sequence[Hashable]
"""A cache key: one hashable item per sequence position (token ids today; an image's content hash
at its placeholder positions later). Items are only compared with ``==`` and hashed."""

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(frozen=True)
class MatchResult:
    """A matched prefix: ``indices`` (int64 [n], CPU) are the KV slots of the first n key items;
    ``node`` is the handle to pass to ``inc_lock_ref``/``dec_lock_ref`` (None when nothing matched
    in a cache without nodes)."""

    indices: torch.Tensor
    node: Any

    @property
    def length(self) -> int:
        """Number of matched (cached) tokens."""
        return int(self.indices.numel())


@dataclass(frozen=True)
class TreeNodeView:
    """Read-only view of one radix-tree node, for widgets (``Engine.tree_snapshot``).

    num_tokens: length of the node's edge (key items); text_preview: the edge decoded (shortened);
    lock_ref: running requests (and pins) whose path passes through the node; last_access_time:
    ``time.time()`` seconds of the last match or insert touching it; children: child views (left
    out of ``repr``, which would recurse as deep as the tree: a prompt grown a token at a time
    makes a path of thousands of nodes).
    """

    node_id: int
    parent_id: Optional[int]
    num_tokens: int
    text_preview: str
    lock_ref: int
    last_access_time: float
    children: tuple["TreeNodeView", ...] = field(repr=False)


class PrefixCache(ABC):
    """Maps key prefixes to KV slots of ``kv_pool``; see the module docstring for ownership rules.

    Subclasses implement the tree operations; ``cache_finished_req`` / ``cache_unfinished_req``
    are written once here in terms of them (SGLang's ``RadixCache.cache_*_req``).
    """

    def __init__(self, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.kv_pool = kv_pool
        self.evicted_tokens = 0  # cumulative, for cache_stats

    # --- tree operations -------------------------------------------------------------------
    @abstractmethod
    def match_prefix(self, key: Key) -> MatchResult:
        """Longest cached prefix of ``key``. The result is only safe to use once its node is
        locked (``inc_lock_ref``): unlocked slots may be evicted by the next allocation."""

    @abstractmethod
    def insert(self, key: Key, indices: torch.Tensor) -> int:
        """Cache ``indices`` (int64 [len(key)]) as the KV of ``key``; return how many leading items
        were already cached. The caller frees its own slots for that span (they are duplicates),
        except the part it had matched and locked itself (those are the cache's slots)."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> int:
        """Protect the path root→node from eviction; returns the change in evictable size (<= 0)."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> int:
        """Undo one ``inc_lock_ref``; returns the change in evictable size (>= 0)."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` cached slots (fewer if not enough are evictable), least
        recently used unlocked leaves first; returns the number freed."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Cached tokens no running request locks."""

    @abstractmethod
    def protected_size(self) -> int:
        """Cached tokens on a locked path."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every node (caller guarantees nothing is locked and frees no slots twice)."""

    def snapshot(self, preview: Callable[[Sequence[Hashable]], str]) -> TreeNodeView:
        """Read-only view of the tree; caches without one show a bare root."""
        return TreeNodeView(0, None, 0, "", 0, 0.0, ())

    def peek_prefix(self, key: Key) -> tuple[Optional[int], int]:
        """Read-only ``match_prefix``: ``(node id, n)`` where ``n`` is the length of the longest
        cached prefix of ``key`` and the node is the deepest one it reaches (the prefix may end
        inside that node's edge); ``(None, 0)`` when nothing is cached. Caches without nodes
        always answer ``(None, 0)``."""
        return None, 0

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the cache's internal bookkeeping is inconsistent."""

    def drop_nonfinite(self, key: Key) -> int:
        """Remove the cached KV along ``key``'s path from its first slot holding a NaN or inf on,
        with everything cached below it, unless a request still holds it; return the tokens freed.
        Caches without a tree hold nothing to drop."""
        return 0

    # --- request hand-back ---------------------------------------------------------------
    def cache_finished_req(self, req: "Req") -> None:
        """Give a leaving request's KV to the cache and unlock its path.

        The computed part ``key[:kv_committed_len]`` is inserted; slots that duplicate cached ones
        and slots allocated but never computed are freed. Afterwards the request owns no slots.
        """
        committed = req.kv_committed_len
        slots = self.req_to_token_pool.host[req.req_pool_idx, : req.kv_allocated_len].to(torch.int64)
        already = self.insert(req.cache_key(committed), slots[:committed])
        assert already >= req.cache_protected_len, "a locked prefix vanished from the cache"
        self.kv_pool.free(slots[req.cache_protected_len : already])
        self.kv_pool.free(slots[committed:])
        self.dec_lock_ref(req.last_node)
        req.last_node = None
        req.cache_protected_len = 0

    def cache_unfinished_req(self, req: "Req") -> None:
        """Insert a still-running request's computed KV (after an extend step) so other requests
        can share it at once, then lock the new path and point the request's table row at the
        cache's canonical slots (duplicates were freed)."""
        committed = req.kv_committed_len
        key = req.cache_key(committed)
        slots = self.req_to_token_pool.host[req.req_pool_idx, :committed].to(torch.int64)
        already = self.insert(key, slots)
        assert already >= req.cache_protected_len, "a locked prefix vanished from the cache"
        self.kv_pool.free(slots[req.cache_protected_len : already])
        match = self.match_prefix(key)
        assert match.length == committed, "a just-inserted prefix is not fully cached"
        self.req_to_token_pool.write(req.req_pool_idx, 0, match.indices)
        self.inc_lock_ref(match.node)
        self.dec_lock_ref(req.last_node)
        req.last_node = match.node
        req.cache_protected_len = committed


class NoPrefixCache(PrefixCache):
    """Caches nothing: every request computes its whole prompt (``disable_radix_cache=True``).

    ``insert`` reports the whole key as "already cached" so ``cache_finished_req`` frees every
    slot; ``cache_unfinished_req`` keeps the slots with the request.
    """

    def match_prefix(self, key: Key) -> MatchResult:
        return MatchResult(_EMPTY, None)

    def insert(self, key: Key, indices: torch.Tensor) -> int:
        return len(key)

    def inc_lock_ref(self, node: Any) -> int:
        return 0

    def dec_lock_ref(self, node: Any) -> int:
        return 0

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def cache_unfinished_req(self, req: "Req") -> None:
        pass
