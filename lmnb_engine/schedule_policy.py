"""Order of the waiting queue: cache-aware scheduling (paper §3).

- ``lpm`` (default): longest cached prefix first. A greedy stand-in for the DFS order that
  Theorem 3.1 shows optimal for an offline batch; like SGLang's ``schedule_policy.py`` it falls back
  to FCFS when the queue is too long to match every request.
- ``dfs-weight``: group requests by the tree node their match ends at, weigh each subtree by the
  number of requests below it, and emit a DFS order visiting heavier subtrees first (children
  before the node's own requests, as SGLang's ``get_dfs_priority``).
- ``fcfs``: arrival order.
With the cache disabled every policy is FCFS (there is nothing to match).
"""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter
from typing import Any

from lmnb_engine.prefix_cache import PrefixCache
from lmnb_engine.radix_cache import RadixCache
from lmnb_engine.request import Req

POLICIES = ("lpm", "fcfs", "dfs-weight")

# Matching costs O(prompt length) per waiting request; beyond this queue length, fall back to FCFS
# (SGLang uses the same cut-off).
LPM_MAX_QUEUE = 128
ARRIVAL = attrgetter("arrival")  # the key the scheduler keeps its waiting queue sorted by


class SchedulePolicy:
    """Sorts waiting requests for admission.

    Args:
        policy: one of ``POLICIES``.
        cache: the prefix cache whose matches drive the order.
    Raises:
        ValueError: unknown policy name.
    """

    def __init__(self, policy: str, cache: PrefixCache) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule_policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy if isinstance(cache, RadixCache) else "fcfs"
        self.cache = cache

    def order(self, waiting: list[Req]) -> list[Req]:
        """Return ``waiting`` in admission order. ``waiting`` must be in arrival order (``ARRIVAL``),
        as the scheduler keeps its queue: new requests are appended, and a retracted one goes back
        to its place (``Scheduler._retract``). So the FCFS order is ``waiting`` itself, not a copy
        (the caller reads it before it changes the queue), where sorting it again, once per step,
        went over a queue of hundreds of thousands each time; the other orders are new lists."""
        if self.policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE:
            return waiting
        matches = [self.cache.match_prefix(r.cache_key(r.max_prefix_len())) for r in waiting]
        if self.policy == "lpm":
            lengths = {id(r): m.length for r, m in zip(waiting, matches)}
            return sorted(waiting, key=lambda r: -lengths[id(r)])  # stable: ties stay in arrival order
        return self._dfs_weight(waiting, [m.node for m in matches])

    def _dfs_weight(self, reqs: list[Req], nodes: list[Any]) -> list[Req]:
        at_node: dict[Any, list[Req]] = defaultdict(list)
        for r, node in zip(reqs, nodes):
            at_node[node].append(r)
        weight: dict[Any, int] = defaultdict(int)
        for node, group in at_node.items():
            while node is not None:
                weight[node] += len(group)
                node = node.parent
        assert isinstance(self.cache, RadixCache)
        order: list[Req] = []
        # iterative post-order: heavier child subtrees first, then the node's own requests
        stack: list[tuple[Any, bool]] = [(self.cache.root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.extend(at_node.get(node, ()))
                continue
            stack.append((node, True))
            kids = [c for c in node.children.values() if weight.get(c)]
            kids.sort(key=lambda c: -weight[c])
            stack.extend((c, False) for c in reversed(kids))
        return order
