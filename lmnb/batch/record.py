"""What one row's run leaves behind: its captured variables, finish reasons and token counts.

``RowRecorder`` is an ``lmnb.observe`` callback (the same events the notebook's live view reads),
so the job records exactly what the ``%%lm`` cells captured — also when a later cell of the row
fails — without the exported code having to collect anything.
"""

from __future__ import annotations

import threading
from typing import Any

from lmnb.backend.base import finish_reason_dict


class RowRecorder:
    """Collects the events of the program states one row creates (and their fork branches).

    variables: name → value set on a top-level state (a ``%%lm`` cell's captures; fork results
    arrive as gathered lists), in order, later cells overwriting earlier ones. meta: name → the
    backend's meta info for it. tokens: prompt / cached / completion token counts summed over the
    row's requests (gen, select scoring and fork-prefix prefills).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: set[str] = set()
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.tokens = {"prompt": 0, "cached": 0, "completion": 0}

    def __call__(self, event) -> None:
        with self._lock:
            if event.kind == "state" and event.parent is None:
                self._roots.add(event.sid)
            elif event.kind == "var":
                if event.sid in self._roots and event.name is not None:
                    self.variables[event.name] = event.value
                    self.meta[event.name] = event.meta_info
                if isinstance(event.meta_info, list) and event.source != "join":  # gen(n=k): k requests
                    for meta in event.meta_info:
                        self._count(meta)
                else:
                    self._count(event.meta_info)
            elif event.kind == "prefill":
                self._count(event.meta_info)

    def _count(self, meta: Any) -> None:
        # (a join's lists of meta are not counted: each branch's requests were, as they finished)
        if not isinstance(meta, dict):
            return
        if "prompt_tokens" in meta:  # a generation request (or a prefill)
            self.tokens["prompt"] += int(meta.get("prompt_tokens") or 0)
            self.tokens["cached"] += int(meta.get("cached_tokens") or 0)
            # (a gen that made an API speculative call has its share; the call generated its total)
            self.tokens["completion"] += int(meta.get("speculative_call", meta).get("completion_tokens") or 0)
        elif "scores" in meta and "prefix_len" in meta:  # select: one scoring request per choice
            self._count(meta.get("prompt_prefill"))  # and the prompt's own prefill before them
            for prefix, scored, cached in zip(meta["prefix_len"], meta.get("input_token_logprobs", []),
                                              meta.get("cached_tokens", [])):
                self.tokens["prompt"] += int(prefix) + len(scored)
                self.tokens["cached"] += int(cached or 0)

    def finish_reasons(self) -> dict[str, Any]:
        """name → finish reason type (``"stop"``, ``"length"``, ...) of each captured gen; a list for
        a gen's ``n`` samples and for gathered fork results (a list of lists for a gen with ``n`` > 1
        in fork branches, as its variable is). Variables without one (select, var_scope) are left out."""
        out = {}
        for name, meta in self.meta.items():
            reason = _reason(meta)
            if reason is not None:
                out[name] = reason
        return out


def _reason(meta: Any) -> Any:
    """The finish reason type of a meta info, or the list of those of a list of them (nested as
    the variable is); None where there is none at any depth."""
    if isinstance(meta, dict):
        return finish_reason_dict(meta).get("type") if "finish_reason" in meta else None
    if isinstance(meta, list):
        reasons = [_reason(m) for m in meta]
        return reasons if any(r is not None for r in reasons) else None
    return None
