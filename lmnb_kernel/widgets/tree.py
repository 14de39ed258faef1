"""The radix-tree view's data: flat node records from an engine snapshot, plus evicted "ghosts".

Input is what ``Engine.tree_snapshot()`` returns — a nested ``TreeNodeView`` (``node_id``,
``parent_id``, ``num_tokens``, ``text_preview``, ``lock_ref``, ``last_access_time``, ``children``)
— or any iterable/mapping of records with those fields (attributes or dict keys; ``id``/``parent``/
``text``/``last_access`` are accepted as aliases, ``pinned`` is optional). Node ids must be stable
across snapshots, as in SGLang's radix cache, where a split creates a new parent node and the old
node keeps its id; so a node that disappears between two snapshots was evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Hashable, Iterable, Mapping, Optional

_MISSING = object()


def _get(rec: Any, *names: str, default: Any = _MISSING) -> Any:
    for name in names:
        if isinstance(rec, Mapping):
            if name in rec:
                return rec[name]
        elif hasattr(rec, name):
            return getattr(rec, name)
    if default is _MISSING:
        raise ValueError(f"tree node record {rec!r} has no field {names[0]!r} (expected a TreeNodeView "
                         f"from Engine.tree_snapshot() or a record with node_id, parent_id, num_tokens, ...)")
    return default


@dataclass(frozen=True)
class NodeInfo:
    """One radix-tree node: ``num_tokens`` is its edge length (tokens), ``lock_ref`` the running
    requests and pins through it, ``last_access`` a ``time.time()`` timestamp (s) or None."""

    id: Hashable
    parent: Optional[Hashable]
    num_tokens: int
    text: str
    lock_ref: int
    last_access: Optional[float]
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        """SGLang's rule: only nodes no running request (or pin) holds can be evicted; never the root."""
        return self.parent is not None and self.lock_ref == 0 and not self.pinned


def flatten(snapshot: Any, pinned: Iterable[Hashable] = ()) -> "OrderedDict[Hashable, NodeInfo]":
    """Node id -> ``NodeInfo`` for a nested snapshot (root view) or a flat iterable/mapping of records,
    in depth-first order. ``pinned``: ids of nodes pinned by ``pin_prefix`` when the records do not
    say so themselves. Raises ``ValueError`` on records missing a required field."""
    pinned = set(pinned)
    out: "OrderedDict[Hashable, NodeInfo]" = OrderedDict()
    if snapshot is None:
        return out
    if isinstance(snapshot, Mapping) and not any(k in snapshot for k in ("node_id", "id")):
        records: Iterable = snapshot.values()
    elif isinstance(snapshot, (list, tuple)):
        records = snapshot
    else:
        records = [snapshot]
    # an explicit stack, not recursion: a prompt grown a token at a time makes a path of
    # thousands of nodes
    stack: list[tuple[Any, Optional[Hashable]]] = [(rec, None) for rec in reversed(list(records))]
    while stack:
        rec, parent_hint = stack.pop()
        nid = _get(rec, "node_id", "id")
        out[nid] = NodeInfo(
            id=nid,
            parent=_get(rec, "parent_id", "parent", default=parent_hint),
            num_tokens=int(_get(rec, "num_tokens")),
            text=str(_get(rec, "text_preview", "text", default="")),
            lock_ref=int(_get(rec, "lock_ref", default=0)),
            last_access=_get(rec, "last_access_time", "last_access", default=None),
            pinned=bool(_get(rec, "pinned", default=False)) or nid in pinned,
        )
        children = [c for c in _get(rec, "children", default=()) or () if not isinstance(c, (int, str))]
        stack += [(child, nid) for child in reversed(children)]  # nested views; flat records list ids
    return out


class TreeHistory:
    """The current nodes and the ghosts of evicted ones, kept across refreshes (capped, newest kept)."""

    def __init__(self, max_ghosts: int = 64) -> None:
        self.nodes: "OrderedDict[Hashable, NodeInfo]" = OrderedDict()
        self.ghosts: "OrderedDict[Hashable, NodeInfo]" = OrderedDict()
        self.max_ghosts = max_ghosts

    def update(self, nodes: "OrderedDict[Hashable, NodeInfo]") -> None:
        """Replace the current nodes; those gone since the previous update become ghosts."""
        for nid in [nid for nid in self.nodes if nid not in nodes]:
            self.ghosts[nid] = self.nodes[nid]
            self.ghosts.move_to_end(nid)
        for nid in list(self.ghosts):
            if nid in nodes:  # cached again under the same id
                del self.ghosts[nid]
        while len(self.ghosts) > self.max_ghosts:
            self.ghosts.popitem(last=False)
        self.nodes = nodes

    def to_dict(self) -> dict:
        """The nodes and evicted nodes as JSON-ready dicts."""
        return {"nodes": [asdict(n) for n in self.nodes.values()],
                "evicted": [asdict(n) for n in self.ghosts.values()]}
