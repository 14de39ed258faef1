"""Render the radix tree (``TreeHistory``) as sanitizer-safe HTML and as plain text.

Each row shows a node's edge text preview, token count, lock_ref, pinned flag, LRU age and
evictable bytes; the named states / cells whose paths end at a node are badges on it (and listed in
the tooltip of every node on the path); evicted nodes stay as faded, struck-through ghosts under
their last parent. A chain of single-child nodes alike in all of that is one row, as a radix tree
is drawn (``chain``). Nested ``<details open>`` make the tree collapsible without a script.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Optional

from .html import BAD, MONO, MUTED, OK, ROOT_STYLE, badge, esc, human_bytes, tag
from .tree import NodeInfo, TreeHistory

MAX_NODES = 400  # rows rendered; the rest is summarised
PREVIEW_CHARS = 60
# Levels indented; deeper rows stay at this indentation and show their depth as a number (a path
# hundreds of nodes deep was a staircase thousands of pixels wide).
MAX_INDENT = 12


def _depth_mark(depth: int) -> str:
    """The depth shown on a row deeper than ``MAX_INDENT`` ("" above it: the indentation says it)."""
    return f"depth {depth}" if depth > MAX_INDENT else ""


def _preview(text: str) -> str:
    t = text.replace("\n", "⏎")
    return t if len(t) <= PREVIEW_CHARS else t[:PREVIEW_CHARS - 1] + "…"


def _age(now: float, last: Optional[float]) -> str:
    if last is None:
        return "–"
    s = max(now - last, 0.0)
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def subtree_size(kids: Mapping[Optional[Hashable], list[NodeInfo]], node: NodeInfo) -> int:
    """Nodes in the subtree under ``node``, itself included (``kids``: parent id -> children).
    An explicit stack, not recursion: a path can be thousands of nodes deep."""
    count, seen, stack = 0, set(), [node]
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        count += 1
        stack += kids.get(n.id, [])
    return count


def children(kids: Mapping[Optional[Hashable], list[NodeInfo]], n: NodeInfo) -> list[NodeInfo]:
    """The rows under ``n``, in id order (a node listed as its own parent is not its child)."""
    return [c for c in sorted(kids.get(n.id, []), key=lambda c: str(c.id)) if c.id != n.id]


def chain(kids: Mapping[Optional[Hashable], list[NodeInfo]], n: NodeInfo, ghosts: Mapping,
          ends: Mapping[Hashable, list[str]]) -> list[NodeInfo]:
    """``n`` and the nodes one row shows with it: while the last has exactly one child, the child
    joins if the row's figures hold for it too (evicted or not, lock_ref, pin). A chain stops at a
    node where a path ends (its badge marks that point), and the root has its own row."""
    run = [n]
    while run[-1].parent is not None and run[-1].id not in ends:
        below = children(kids, run[-1])
        if len(below) != 1:
            break
        last, c = run[-1], below[0]
        if (c.id in ghosts) != (last.id in ghosts) or (c.lock_ref, c.pinned) != (last.lock_ref, last.pinned):
            break
        run.append(c)
    return run


def _chain_text(run: list[NodeInfo]) -> str:
    """The edge texts of a chain joined; a text cut short ("…", as the engine's previews of long
    edges are) ends it, since what follows would not continue it."""
    text = ""
    for m in run:
        text += m.text
        if m.text.endswith("…"):
            break
    return text


def path_labels(history: TreeHistory, paths: Mapping[str, Hashable]) -> dict[Hashable, list[str]]:
    """Node id -> labels of the paths passing through it (a path is root → its end node)."""
    everything = {**history.ghosts, **history.nodes}
    through: dict[Hashable, list[str]] = {}
    for label, end in paths.items():
        nid, seen = end, set()
        while nid is not None and nid in everything and nid not in seen:
            seen.add(nid)
            through.setdefault(nid, []).append(label)
            nid = everything[nid].parent
    return through


def render_tree_html(history: TreeHistory, *, paths: Optional[Mapping[str, Hashable]] = None,
                     kv_bytes_per_token: Optional[int] = None, now: float, stats: Optional[Mapping] = None,
                     title: str = "radix tree") -> str:
    """The whole tree view as ``<div class="lmnb-tree">``; ``now`` in ``time.time()`` seconds."""
    paths, stats = paths or {}, stats or {}
    nodes, ghosts = history.nodes, history.ghosts
    through = path_labels(history, paths)
    ends: dict[Hashable, list[str]] = {}
    for label, end in paths.items():
        ends.setdefault(end, []).append(label)
    kids: dict[Optional[Hashable], list[NodeInfo]] = {}
    for n in list(nodes.values()) + list(ghosts.values()):
        kids.setdefault(n.parent if (n.parent in nodes or n.parent in ghosts) else None, []).append(n)
    budget = [MAX_NODES]

    def row(run: list[NodeInfo], evicted: bool, depth: int) -> str:
        n = run[-1]  # (a chain's figures are those of each of its nodes, but text, tokens and age)
        is_root = n.parent is None and not evicted
        bits = [tag("span", esc("root" if is_root else repr(_preview(_chain_text(run)))),
                    cls="lmnb-node-text", style=MONO)]
        if _depth_mark(depth):
            bits.insert(0, tag("span", esc(_depth_mark(depth)), cls="lmnb-depth", style=f"color:{MUTED}"))
        tokens = sum(m.num_tokens for m in run)
        bits.append(esc(f"{tokens} tok"))
        if len(run) > 1:
            bits.append(tag("span", esc(f"{len(run)} nodes"), cls="lmnb-chain", style=f"color:{MUTED}"))
        if evicted:
            bits.append(badge("evicted", color=BAD, cls="lmnb-badge lmnb-evicted-badge"))
        else:
            if n.lock_ref > 0:
                bits.append(badge(f"lock {n.lock_ref}", color="#9a6700", cls="lmnb-badge lmnb-locked"))
            if n.pinned:
                bits.append(badge("pinned", color="#8250df", cls="lmnb-badge lmnb-pinned"))
            if not is_root:
                accessed = [m.last_access for m in run if m.last_access is not None]
                bits.append(esc(f"age {_age(now, max(accessed) if accessed else None)}"))
                if n.evictable:
                    ev = human_bytes(tokens * kv_bytes_per_token) if kv_bytes_per_token else f"{tokens} tok"
                    bits.append(tag("span", esc(f"evictable {ev}"), cls="lmnb-evictable", style=f"color:{OK}"))
        for label in ends.get(n.id, []):
            bits.append(badge(label, color="#0a7b83", cls="lmnb-badge lmnb-path"))
        tip = f"node {n.id}" if len(run) == 1 else f"nodes {', '.join(str(m.id) for m in run)}"
        if through.get(n.id):
            tip += " · on paths: " + ", ".join(through[n.id])
        style = "opacity:0.45;text-decoration:line-through" if evicted else ""
        cls = "lmnb-node lmnb-evicted" if evicted else "lmnb-node"
        return tag("span", " · ".join(bits), cls=cls, style=style, title=tip)

    def subtree(n: NodeInfo, depth: int) -> str:
        budget[0] -= 1
        evicted = n.id in ghosts
        run = chain(kids, n, ghosts, ends)
        below = children(kids, run[-1])
        if not below:
            return tag("li", row(run, evicted, depth), style="list-style-type:none")
        shown = []
        for c in below:
            if budget[0] <= 0:
                # the hidden siblings' whole subtrees, not just the siblings: each node the budget
                # leaves out is counted in exactly one such note
                hidden = sum(subtree_size(kids, h) for h in below[len(shown):])
                shown.append(tag("li", esc(f"… {hidden} more nodes not shown"),
                                 style=f"list-style-type:none;color:{MUTED}"))
                break
            shown.append(subtree(c, depth + 1))
        indent = 18 if depth < MAX_INDENT else 0
        inner = tag("summary", row(run, evicted, depth)) + tag("ul", "".join(shown), style=f"margin:0;padding-left:{indent}px")
        return tag("li", tag("details", inner, extra="open"), style="list-style-type:none")

    roots = sorted(kids.get(None, []), key=lambda n: (n.parent is not None, str(n.id)))
    body = tag("ul", "".join(subtree(r, 0) for r in roots), style="margin:0;padding-left:4px")

    live = [n for n in nodes.values() if n.parent is not None]
    total = sum(n.num_tokens for n in live)
    evictable = sum(n.num_tokens for n in live if n.evictable)
    locked = sum(n.num_tokens for n in live if n.lock_ref > 0)
    head = [tag("b", esc(title)), esc(f"{len(live)} nodes"), esc(f"{total} tokens"),
            esc(f"locked {locked} tok"),
            tag("span", esc(f"evictable {evictable} tok"
                            + (f" ({human_bytes(evictable * kv_bytes_per_token)})" if kv_bytes_per_token else "")),
                cls="lmnb-evictable-total")]
    if ghosts:
        head.append(esc(f"{len(ghosts)} evicted shown faded"))
    stats_line = ""
    if stats:
        stats_line = tag("div", " · ".join(esc(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}")
                                           for k, v in stats.items()),
                         cls="lmnb-tree-stats", style=f"color:{MUTED};font-size:11px")
    missing = [label for label, end in paths.items() if end not in nodes and end not in ghosts]
    foot = ""
    if missing:
        foot = tag("div", esc("not in the cache: " + ", ".join(missing)), cls="lmnb-evicted",
                   style=f"opacity:0.45;color:{MUTED};font-size:12px")
    return tag("div", tag("div", " · ".join(head), cls="lmnb-tree-header") + stats_line + body + foot,
               cls="lmnb-tree", style=ROOT_STYLE)


def render_tree_text(history: TreeHistory, *, paths: Optional[Mapping[str, Hashable]] = None) -> str:
    """Indented plain-text tree: ``text (n tok, lock k)``, evicted nodes marked."""
    paths = paths or {}
    ends: dict[Hashable, list[str]] = {}
    for label, end in paths.items():
        ends.setdefault(end, []).append(label)
    kids: dict[Optional[Hashable], list[NodeInfo]] = {}
    allnodes = {**history.ghosts, **history.nodes}
    for n in allnodes.values():
        kids.setdefault(n.parent if n.parent in allnodes else None, []).append(n)
    lines = [f"radix tree: {sum(1 for n in history.nodes.values() if n.parent is not None)} nodes"]

    hidden = [0]

    def walk(n: NodeInfo, depth: int) -> None:
        if len(lines) > MAX_NODES:
            hidden[0] += subtree_size(kids, n)  # said in a last line: a cut tree must not read as whole
            return
        run = chain(kids, n, history.ghosts, ends)
        n = run[-1]
        mark = " [evicted]" if n.id in history.ghosts else ""
        label = f" <{', '.join(ends[n.id])}>" if n.id in ends else ""
        text = "root" if n.parent is None else repr(_preview(_chain_text(run)))
        depth_mark = _depth_mark(depth) and f"[{_depth_mark(depth)}] "
        size = f"{sum(m.num_tokens for m in run)} tok" + (f" in {len(run)} nodes" if len(run) > 1 else "")
        lines.append(f"{'  ' * min(depth, MAX_INDENT)}{depth_mark}{text} ({size}, lock {n.lock_ref}){mark}{label}")
        for c in children(kids, n):
            walk(c, depth + 1)

    for r in sorted(kids.get(None, []), key=lambda n: (n.parent is not None, str(n.id))):
        walk(r, 0)
    if hidden[0]:
        lines.append(f"… {hidden[0]} more nodes not shown")
    return "\n".join(lines)
