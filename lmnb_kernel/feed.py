"""Translate lmnb ``ProgramEvent``s into calls on a cell's ``RunView``.

Runs on the cell's main thread (the pump in ``cellrun``); events were queued by executor threads.
Lanes: the cell's root state is ``"main"``; fork branch ``(i, j)`` is lane ``"b{i}.{j}"``, and a
later fork that reuses a branch path (a second ``{fork}`` in the cell) gets ``"b{i}.{j}~2"``.
"""

from __future__ import annotations

from typing import Any, Optional


class ViewFeeder:
    """Feeds one view from the events of one root state (by ``root_sid``) and its branches."""

    def __init__(self, view, root_sid: str) -> None:
        self.view = view
        self.lanes: dict[str, str] = {root_sid: "main"}
        self.branch: dict[str, tuple] = {root_sid: ()}
        self.pending: dict[str, str] = {}  # lane -> "gen"/"select": the kind of the open primitive
        self.captured: dict[str, Any] = {}  # variables set on the root state, in order

    def lane(self, sid: str) -> Optional[str]:
        """The view lane of program state ``sid``; None for a state outside this cell."""
        return self.lanes.get(sid)

    def apply(self, ev) -> None:
        """Hand a ``ProgramEvent`` to its ``on_<kind>`` handler, if there is one."""
        handler = getattr(self, f"on_{ev.kind}", None)
        if handler is not None:
            handler(ev)

    def on_state(self, ev) -> None:
        """A new state: a fork branch of a known lane gets a lane of its own."""
        if ev.parent in self.lanes:
            base = lane = "b" + ".".join(map(str, ev.branch))
            taken, k = set(self.lanes.values()), 1
            while lane in taken:  # a view lane exists once: a second fork's branch 0 is a new lane
                k += 1
                lane = f"{base}~{k}"
            self.lanes[ev.sid] = lane
            self.branch[ev.sid] = ev.branch

    def on_fork(self, ev) -> None:
        """Mark the fork point in the parent lane."""
        lane = self.lane(ev.sid)
        children = [c for c in ev.children if c in self.lanes]
        if lane is not None and children:
            labels = [f"branch {'.'.join(map(str, self.branch[c]))}" for c in children]
            self.view.on_fork(lane, [self.lanes[c] for c in children], labels)

    def on_join(self, ev) -> None:
        """Mark the join in the parent lane."""
        lane = self.lane(ev.sid)
        children = [self.lanes[c] for c in ev.children if c in self.lanes]
        if lane is not None and children:
            self.view.on_join(lane, children)

    def on_text(self, ev) -> None:
        """Add program text (prompt, generated, or an image/video thumbnail) to the lane."""
        lane = self.lane(ev.sid)
        if lane is None:
            return
        if ev.source == "gen":
            self.pending[lane] = "gen"
            ids, texts, logprobs = _delta_tokens(ev.meta_info)
            self.view.on_delta(lane, ev.text, token_ids=ids, token_texts=texts, logprobs=logprobs, name=ev.name)
        elif ev.source == "select":
            self.pending[lane] = "select"  # the view appends the chosen text in on_select
        elif ev.source in ("image", "video") and ev.value is not None:  # [issue 10] a thumbnail
            from lmnb_kernel.widgets.media import thumbnail

            self.view.on_media(lane, ev.text, kind=ev.source, thumb=thumbnail(ev.value),
                               frames=getattr(ev.value, "num_frames", None))
        else:
            self.view.on_text(lane, ev.text)

    def on_var(self, ev) -> None:
        """A variable was set: capture it (main lane) and close its gen/select segment with its meta info."""
        lane = self.lane(ev.sid)
        if lane is None:
            return
        if lane == "main" and ev.name is not None:
            self.captured[ev.name] = ev.value
        meta = ev.meta_info
        kind = self.pending.pop(lane, None)
        if kind == "select" and isinstance(meta, dict) and "scores" in meta:
            prefill = meta.get("prompt_prefill")
            if isinstance(prefill, dict) and "prompt_tokens" in prefill:
                # The prompt alone was prefilled first: that request decides how the prompt got its
                # KV (shading) and counts like any other; the chosen text is not in the lane yet.
                self.view.on_prompt(lane, prompt_tokens=int(prefill["prompt_tokens"]),
                                    cached_tokens=int(prefill.get("cached_tokens", 0)), name="(select prompt)",
                                    cached_chars=prefill.get("cached_chars"))  # [issue 10] set after images
                self.view.on_gen_end(lane, meta=prefill)
                self._media(lane, prefill)  # [issue 10] the images went out with the prompt's prefill
            choices = meta["choices"]
            chosen = choices.index(ev.value) if ev.value in choices else None
            self.view.on_select(lane, name=ev.name if ev.name is not None else "(unnamed)", choices=choices,
                                scores=meta["scores"], chosen=chosen, meta=_select_requests(meta))
        elif (ev.source != "join" and isinstance(meta, list)
              and all(isinstance(m, dict) and "prompt_tokens" in m for m in meta)):
            # gen(n=k): k requests, the first one's text shown (also where that text is empty, so no
            # gen text came before). Unnamed: also k requests stopped by an abort, reported before
            # any of their text reached the lane.
            for m in meta:
                self.view.on_gen_end(lane, meta=m, finish_reason=m.get("finish_reason"), name=ev.name)
            self._media(lane, meta[0] if meta else {})
        elif isinstance(meta, dict) and "prompt_tokens" in meta:  # a gen (possibly with no text, or unnamed)
            constraint = ev.constraint or {}
            # a gen that made an API speculative call has its share of it; the request row is the call's
            meta = {**meta, **meta.get("speculative_call", {})}
            self.view.on_gen_end(lane, meta=meta, finish_reason=meta.get("finish_reason"), name=ev.name,
                                 regex=constraint.get("regex"), json_schema=constraint.get("json_schema"))
            self._media(lane, meta)  # [issue 10] how much of each image's KV came from the cache
        # other vars (lists gathered by a join, var_scope captures) change no text

    def _media(self, lane: str, meta: dict) -> None:
        """[issue 10] Mark the images in ``lane``'s prompt after a request: how much of each one's
        KV was cached (``meta["images"]``), or "sent" where the backend does not say (an
        OpenAI-compatible API, an SGLang server)."""
        if meta.get("images"):
            self.view.on_media_cache(lane, meta["images"])
        else:
            self.view.on_media_sent(lane)

    def on_prefill(self, ev) -> None:
        # The fork's shared-prefix prefill: a request of its own, closed at once.
        """Record a fork's shared-prefix prefill as a request of its own."""
        lane, meta = self.lane(ev.sid), ev.meta_info or {}
        if lane is not None and "prompt_tokens" in meta:
            self.view.on_prompt(lane, prompt_tokens=int(meta["prompt_tokens"]),
                                cached_tokens=int(meta.get("cached_tokens", 0)), name="(fork prefix)",
                                cached_chars=meta.get("cached_chars"))  # [issue 10] set when images fill the prompt
            self.view.on_gen_end(lane, meta=meta)
            self._media(lane, meta)  # [issue 10]


def _delta_tokens(meta: Optional[dict]) -> tuple[list, Optional[list], Optional[list]]:
    """(token ids, token texts, logprobs or None) of a gen delta's ``text`` event; its meta_info
    holds ``{"tokens": [[logprob or None, id, text], ...]}`` when the backend streams tokens (the
    in-process engine does; servers give text only). Logprobs only when the gen asked for them."""
    tokens = (meta or {}).get("tokens") or []
    if not tokens:
        return [], None, None
    logprobs = [t[0] for t in tokens]
    return [t[1] for t in tokens], [t[2] for t in tokens], logprobs if any(lp is not None for lp in logprobs) else None


def _select_requests(meta: dict) -> dict | None:
    """Token counts of a select's scoring requests (one per choice: the prompt up to the scored
    tokens plus those tokens), summed; None if the backend did not report them."""
    try:
        prompt = sum(int(p) + len(lps) for p, lps in zip(meta["prefix_len"], meta["input_token_logprobs"]))
        cached = sum(int(c) for c in meta["cached_tokens"])
    except (KeyError, TypeError, ValueError):
        return None
    return {"prompt_tokens": prompt, "cached_tokens": min(cached, prompt), "completion_tokens": 0}
