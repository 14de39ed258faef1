"""``TreeView``: the radix-tree view of ``%lm tree``, refreshed in place after each cell.

The tree changes only between cells, so the view is a static bundle (``text/html`` + ``text/plain``
+ ``VIEW_MIME``) displayed under a display_id and replaced with ``update_display_data`` on
``refresh``: no comm is needed, it works in every frontend and in nbclient, and a saved notebook
keeps the last picture. Output that is captured (``%%capture``) keeps every display and update as
an output of its own, so there the refresh replaces the tree's captured output instead. It remembers nodes it has seen, so nodes evicted since the previous
snapshot stay visible as faded ghosts.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional

from .render_tree import render_tree_html, render_tree_text
from .tree import TreeHistory, flatten
from .view import VIEW_MIME


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "int8": 1}


def kv_bytes_per_token(model_info: Mapping) -> int:
    """KV-cache bytes of one token: K and V for every layer, ``2 × num_layers × num_kv_heads ×
    head_dim × dtype bytes`` (``model_info`` as ``Engine.model_info()`` returns it).

    Raises ``ValueError`` for a dtype whose size is unknown."""
    dtype = str(model_info["dtype"]).replace("torch.", "")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}")
    return 2 * int(model_info["num_layers"]) * int(model_info["num_kv_heads"]) * int(model_info["head_dim"]) \
        * _DTYPE_BYTES[dtype]


class TreeView:
    """Radix-tree view. Typical use: ``tv = TreeView(kv_bytes_per_token=...)``;
    ``tv.show(engine.tree_snapshot(), paths={"s (cell [3])": node_id})`` in ``%lm tree``, then
    ``tv.refresh(engine.tree_snapshot(), paths=...)`` from a post-run-cell hook.

    Args:
        kv_bytes_per_token: KV-cache bytes one token occupies (2 × layers × kv_heads × head_dim ×
            dtype bytes), to show evictable bytes; None shows token counts only.
        title: header text.
        clock: ``time.time``-compatible clock for LRU ages (the snapshot's ``last_access_time`` is
            ``time.time()`` seconds).
        max_ghosts: evicted nodes kept visible (newest first to survive).
    """

    def __init__(self, *, kv_bytes_per_token: Optional[int] = None, title: str = "radix tree",
                 clock: Callable[[], float] = time.time, max_ghosts: int = 64) -> None:
        self.kv_bytes_per_token = kv_bytes_per_token
        self.title = title
        self.history = TreeHistory(max_ghosts=max_ghosts)
        self._clock = clock
        self._handle = None
        self._paths: dict[str, Hashable] = {}
        self._stats: dict = {}

    @property
    def display_id(self) -> Optional[str]:
        """The display id of the shown tree; None before it is shown."""
        return self._handle.display_id if self._handle is not None else None

    def update(self, snapshot: Any, *, paths: Optional[Mapping[str, Hashable]] = None,
               pinned: Iterable[Hashable] = (), stats: Optional[Mapping] = None) -> dict:
        """Take a new snapshot and return the bundle (does not display).

        Args:
            snapshot: ``Engine.tree_snapshot()`` (nested ``TreeNodeView``) or flat node records.
            paths: label -> node id where that path ends, e.g. ``{"s (cell [3])": 17}`` for each named
                state / cell whose tokens end at node 17; kept from the previous call when None.
            pinned: ids of nodes pinned by ``pin_prefix`` (when the records lack a ``pinned`` field).
            stats: extra header figures, e.g. ``engine.cache_stats()`` as a dict; kept when None.
        Raises ``ValueError`` on records that lack a required field.
        """
        self.history.update(flatten(snapshot, pinned))
        if paths is not None:
            self._paths = dict(paths)
        if stats is not None:
            self._stats = dict(stats)
        return self.bundle()

    def bundle(self) -> dict:
        """The current static bundle: ``{"text/html", "text/plain", VIEW_MIME}``."""
        html = render_tree_html(self.history, paths=self._paths, kv_bytes_per_token=self.kv_bytes_per_token,
                                now=self._clock(), stats=self._stats, title=self.title)
        data = {"kind": "tree", "version": 1, **self.history.to_dict(),
                "paths": {k: v for k, v in self._paths.items()}, "stats": self._stats,
                "kv_bytes_per_token": self.kv_bytes_per_token}
        return {"text/html": html, "text/plain": render_tree_text(self.history, paths=self._paths), VIEW_MIME: data}

    def show(self, snapshot: Any, **kwargs: Any) -> dict:
        """Update from ``snapshot`` (``update``'s arguments) and display under a new display_id."""
        from IPython.display import display

        bundle = self.update(snapshot, **kwargs)
        self._handle = display(bundle, raw=True, metadata={"lmnb": {"view": "tree"}}, display_id=True)
        return bundle

    def refresh(self, snapshot: Any, **kwargs: Any) -> dict:
        """Update from ``snapshot`` and replace the displayed tree in place (if shown).

        Where output is captured (``%%capture``, ``capture_output``), an update would be kept as
        one more output (``captured.show()`` replayed every draw), and the refresh that follows each
        cell put the tree into the outputs of any captured cell: there the tree's own captured
        output, if any, is replaced, and a capture it was not shown in is left alone (the refresh
        after the capturing cell, uncaptured, updates the tree where it is shown)."""
        bundle = self.update(snapshot, **kwargs)
        if self._handle is None:
            return bundle
        from IPython import get_ipython

        metadata = {"lmnb": {"view": "tree"}}
        captured = captured_outputs(get_ipython())
        if captured is None:
            self._handle.update(bundle, raw=True, metadata=metadata)
            return bundle
        for i, output in enumerate(captured):
            if (output.get("transient") or {}).get("display_id") == self.display_id:
                captured[i] = {**output, "data": bundle, "metadata": metadata}
        return bundle


def captured_outputs(shell) -> Optional[list]:
    """The outputs list of ``shell``'s ``CapturingDisplayPublisher`` (one dict per display: data,
    metadata, transient, update) while its output is captured (``%%capture``,
    ``capture_output``); None otherwise, and for no shell (None)."""
    from IPython.core.displaypub import CapturingDisplayPublisher

    publisher = getattr(shell, "display_pub", None)
    return publisher.outputs if isinstance(publisher, CapturingDisplayPublisher) else None
