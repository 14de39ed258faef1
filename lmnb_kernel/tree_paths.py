"""How much of a state's prompt the radix cache holds, as its badge in ``%lm tree`` says it.

A state's path is matched with the ids its text encodes to (``Session.prompt_ids``), since those are
the ids the next request continuing it runs as. Short of all of them is not always eviction:
- a state ending in a gen's text ends in the token sampled last, which no forward pass has run yet
  (a finished request caches its prompt and output less that token, as SGLang's
  ``cache_finished_req`` does), so it has no KV until a request continuing the state runs it;
- generated text need not encode back to the ids the model generated (bytes that are no valid
  UTF-8 decode to U+FFFD): the cache then goes on with the generated ids where the state's own
  ids leave it, inside a node's edge (an eviction removes whole nodes, so it leaves a path at a
  node's end).
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Optional, Sequence

from lmnb_kernel.widgets.tree import NodeInfo


def node_ends(nodes: Mapping[Hashable, NodeInfo]) -> dict[Hashable, int]:
    """Node id -> the tokens from the root to the end of that node's edge (``nodes``:
    ``widgets.tree.flatten`` of a snapshot, parents before children)."""
    ends: dict[Hashable, int] = {}
    for n in nodes.values():
        ends[n.id] = n.num_tokens + (ends.get(n.parent, 0) if n.parent is not None else 0)
    return ends


def ends_in_sampled_token(state: Any) -> bool:
    """Whether ``state`` (a ``ProgramState``) ends in the text a gen wrote, named or not, whose last
    token was sampled and not yet run through the model (``StreamExecutor.sampled_end``)."""
    ex = state.stream_executor
    return ex.sampled_end is not None and ex.sampled_end == len(ex.text_)


def cached_note(state: Any, ids: Sequence[int], match: Optional[tuple[Hashable, int]],
                ends: Mapping[Hashable, int]) -> str:
    """The note on a path's badge when the cache holds only part of the state's ``ids``: "" when it
    holds them all or none (a path not in the cache is listed as such under the tree).

    ``match``: ``Engine.match_node(ids)``; ``ends``: ``node_ends`` of the snapshot shown."""
    if match is None or match[1] >= len(ids):
        return ""
    node, cached = match
    note = f" · {cached}/{len(ids)} tok cached"
    if cached == len(ids) - 1 and ends_in_sampled_token(state):
        return note + " (last token not run yet)"
    if node in ends and cached < ends[node]:
        return note + " (the rest encodes to other tokens than the cache holds)"
    return note
