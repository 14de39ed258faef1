"""``RunView``: the live view of one ``%%lm`` cell run, fed by a small event API.

Typical use from the magic (everything on the cell's main thread)::

    view = RunView("cell 3", prefix_chars=prefix_chars_from(engine))
    view.show()                                    # displays the live widget (a display_id)
    view.on_text("main", previous_state_text, source="state s (cell 2)")
    view.on_text("main", "Q: why is the sky blue?\\nA:")
    view.on_prompt("main", prompt_tokens=40, cached_tokens=32)   # shades the cached span
    while True:                                    # the pump: events queued by engine threads
        try:
            ev = events.get(timeout=0.05)
        except queue.Empty:
            view.tick()                            # lets held-back changes out
            if view.stop_requested.is_set():       # the Stop button was clicked
                engine.abort(rid)
            continue
        view.on_delta("main", ev.text_delta, token_ids=ev.token_ids, name="answer")
        if ev.finished:
            break
    view.on_gen_end("main", meta=ev.result.meta, finish_reason=ev.result.finish_reason)
    bundle = view.finish()                         # same display_id now shows the static bundle

Lanes are program states: ``"main"`` exists; ``view.on_fork("main", ["a", "b"])`` opens lanes ``a``
and ``b`` (their events then name their lane) and ``view.on_join("main", ["a", "b"])`` shows the
join. ``view.on_select(lane, name=..., choices=[...], scores=[...])`` appends the chosen text and
draws the scores. Constrained gens: pass ``regex=`` or ``json_schema=`` to ``on_gen_end`` and the
view checks the output (``structured.check_structured``). A request may be reported when it starts
(``on_prompt``) or only when it ends (``on_gen_end(meta=...)`` with prompt/cached token counts).

Rate: event methods only change the data model; a frame (one comm message) goes out when at least
``1 / max_hz`` seconds have passed since the previous one, so the kernel never sends more than
``max_hz`` (20) updates a second however fast tokens arrive. Call ``tick()`` whenever the pump's
queue wait times out so the last changes are not held back; ``finish()`` flushes everything.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Optional, Sequence

from .live import LiveRunWidget
from .model import Lane, RequestRecord, RunModel, SelectRecord, Segment, Tally, Token, classify_prefix
from .render_run import (render_lane_body, render_run_html, render_run_text, render_segment, render_tokens,
                         top_parts)
from .structured import check_structured

VIEW_MIME = "application/vnd.lmnb.view+json"
"""Vendor mimetype of the static bundle's data (``RunModel.to_dict()`` / ``TreeView`` data). Not
``application/json``: JupyterLab's JSON renderer would outrank ``text/html``."""

SESSION = Tally()
"""Prompt / cached token totals of every run in this kernel process (the "cumulative" figures)."""

log = logging.getLogger(__name__)

LIVE_PLACEHOLDER = (
    '<div class="lmnb-run lmnb-running" style="color:#57606a;font-size:12px">lmnb run in progress: the '
    "live view needs Jupyter widgets; the result replaces this note when the cell finishes.</div>"
)
LIVE_PLACEHOLDER_TEXT = ("lmnb run in progress: the live view needs Jupyter widgets; the result replaces this note "
                         "when the cell finishes.")


def prefix_chars_from(engine: Any) -> Callable[[str, int], int]:
    """``RunView(prefix_chars=...)`` for an engine with ``encode(text) -> ids`` and
    ``decode(ids, skip_special_tokens=True) -> str`` (``lmnb_engine.Engine``):
    ``lmnb_engine.tokenizer.covered_chars`` with that engine."""
    from lmnb_engine.tokenizer import covered_chars

    return lambda text, n_tokens: covered_chars(engine, text, n_tokens)


def _meta_dict(meta: Any) -> dict:
    if meta is None:
        return {}
    if isinstance(meta, dict):
        return meta
    if hasattr(meta, "to_dict"):
        return meta.to_dict()
    return dict(vars(meta))


_CUT_BY_MAX_TOKENS = ("cut off: the gen reached its max_tokens (finish reason length) before the output was "
                      "complete; give it a larger max_tokens")


def _cut_by_stop(matched: str) -> str:
    """The reason shown first for constrained output that the gen's own stop string or stop_regex
    match (``matched``) ended before it was complete."""
    return (f"cut off: its stop {matched!r} ended the gen (finish reason stop) before the output was complete; "
            "leave that stop out of a gen with a regex or json_schema")


def _stop_matched(reason: Any) -> Optional[str]:
    """The text a stop finish reason (a ``FinishReason`` or its dict) matched: a stop string or a
    stop_regex match; None for other reasons and for a stop token (an int: EOS, which the
    constraint allows only once the output is complete, or one of stop_token_ids)."""
    if isinstance(reason, dict):
        kind, matched = reason.get("type"), reason.get("matched")
    else:
        kind, matched = getattr(reason, "type", None), getattr(reason, "matched", None)
    return matched if kind == "stop" and isinstance(matched, str) else None


def _finish_str(reason: Any) -> Optional[str]:
    if reason is None or isinstance(reason, str):
        return reason
    if isinstance(reason, dict):
        return reason.get("type")
    return getattr(reason, "type", str(reason))


def _logprob(x: Any) -> Optional[float]:
    if x is None:
        return None
    return float(getattr(x, "logprob", x))


class RunView:
    """The view of one cell run. Create and feed it on the cell's main thread.

    Args:
        title: shown in the header (e.g. ``"cell 3"`` or the program name).
        live: True: an anywidget updated over its comm while the run lasts (needs a kernel with
            comms); False: no widget, the display is refreshed with the static bundle through
            ``update_display_data`` (``%%lm --static``, CI, frontends without widgets).
        updates: False (with ``live=False`` only): ``show()`` displays the view as it is then and
            only ``finish()`` replaces it, no frames between, for output that is captured
            (``%%capture``), where every update would be kept and replayed by ``show()``.
        max_hz: upper bound on frames per second (default 20 live, 5 static: a static frame resends
            the whole view).
        snapshot_s: live mode sends the full state at most this often (s) instead of an op frame,
            so a frontend that joined late catches up.
        on_stop: called (no arguments) when the user clicks Stop; it runs on the thread the kernel
            delivers the comm message on (a subshell thread while the cell runs in JupyterLab ≥ 4.4,
            otherwise the main thread after the cell), so it must be thread-safe — e.g.
            ``engine.abort(rid)``. ``stop_requested`` is set in either case.
        session: the Tally the cumulative hit rate is read from and added to (default ``SESSION``).
        prefix_chars: ``f(prompt_text, n_tokens) -> int``, the characters of ``prompt_text`` that
            the first ``n_tokens`` tokens of its encoding cover; used to shade the cached span when
            an event gives ``cached_tokens`` but no ``cached_chars``. ``prefix_chars_from(engine)``
            builds it from an engine's tokenizer. None: counts only, no shading, unless given.
        clock: monotonic seconds (tests inject a fake).

    Raises ``RuntimeError`` when an event method is called from another thread than the one
    that created the view, ``ValueError``/``KeyError`` on malformed events (unknown lane, counts
    out of range) with the field named.
    """

    def __init__(self, title: str = "lm", *, live: bool = True, updates: bool = True, max_hz: Optional[float] = None,
                 snapshot_s: float = 1.0, on_stop: Optional[Callable[[], None]] = None,
                 session: Optional[Tally] = None, prefix_chars: Optional[Callable[[str, int], int]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = RunModel(title=title)
        if live and not updates:
            raise ValueError("RunView(updates=False) needs live=False: a live widget is its updates")
        self.live = live
        self.updates = updates
        self.max_hz = float(max_hz if max_hz is not None else (20.0 if live else 5.0))
        if not self.max_hz > 0:
            raise ValueError(f"max_hz={max_hz!r} must be > 0")
        self.snapshot_s = snapshot_s
        self.stop_requested = threading.Event()
        self._on_stop = on_stop
        self._prefix_chars = prefix_chars
        self._session = session if session is not None else SESSION
        self.model.cumulative = self._session
        self._clock = clock
        self._t0 = clock()
        self._thread = threading.get_ident()
        self._handle = None
        self._widget: Optional[LiveRunWidget] = None
        self._bundle: Optional[dict] = None
        self._open_request: dict[str, RequestRecord] = {}
        # frame bookkeeping
        self._dirty = False
        self._last_frame = -math.inf
        self._last_snapshot = -math.inf
        self._sent_status = self.model.status
        self._sent_parts: dict[str, str] = {}
        self._sent: dict[str, tuple[int, int]] = {}  # lane -> (segments sent, tokens sent in last gen)
        self._full_dirty: set[str] = set()
        self.frames = 0  # frames sent after show(): snapshots + op frames (or static updates)

    # --- display ------------------------------------------------------------------------------
    @property
    def display_id(self) -> Optional[str]:
        """The display_id of the shown output (None before ``show()``)."""
        return self._handle.display_id if self._handle is not None else None

    @property
    def finished(self) -> bool:
        """Whether the cell finished (its static bundle is made)."""
        return self._bundle is not None

    def show(self) -> None:
        """Display the view (live widget, or the static bundle in static mode) under a new
        display_id; ``finish()`` replaces that output in place."""
        from IPython.display import display

        self._check_thread()
        if self._handle is not None:
            raise RuntimeError("RunView.show() was already called; one view is displayed once")
        if self.live:
            self._widget = LiveRunWidget(render_run_html(self.model, live=True), on_stop=self._request_stop)
            self._widget.status = self._sent_status = self.model.status
            self._mark_all_sent()
            data, md = self._widget._repr_mimebundle_()
            # (a frontend without widgets shows these: the widget's own text/plain is its repr,
            # "<...LiveRunWidget object at 0x...>", which jupyter-run printed as the cell's output)
            data = {**data, "text/html": LIVE_PLACEHOLDER, "text/plain": LIVE_PLACEHOLDER_TEXT}
            # (its status too, as a static view's: ``lmnb run`` tells a view whose finish never came)
            self._handle = display(data, raw=True, metadata={**md, **self._metadata()}, display_id=True)
        else:
            self._handle = display(self._static_bundle(), raw=True, metadata=self._metadata(), display_id=True)
        self._last_frame = self._last_snapshot = self._clock()

    def loading(self) -> None:
        """Call before ``show()`` when the run must wait for its backend (a kernel's first cell
        loads the model): the header says "loading" until ``loaded()``, so the cell is not blank
        meanwhile, and live views show no Stop button (Ctrl-C is held while a model loads)."""
        self._check_thread()
        self.model.status = "loading"

    def loaded(self, prefix_chars: Optional[Callable[[str, int], int]] = None) -> None:
        """The backend is ready and the run starts ("running"); ``prefix_chars`` as in the
        constructor (the engine's tokenizer exists only now)."""
        self._check_thread()
        if prefix_chars is not None:
            self._prefix_chars = prefix_chars
        self.model.status = "running"
        self._changed()

    # --- events -------------------------------------------------------------------------------
    def on_fork(self, parent: str, lanes: Sequence[str], labels: Optional[Sequence[str]] = None) -> None:
        """``parent`` forks into new lanes ``lanes`` (ids, str); each starts with the parent's whole
        text so far (shown once, in the parent). ``labels`` are display names (default: the ids)."""
        self._check_thread()
        parent_lane = self.model.lane(parent)
        lanes = list(lanes)
        if not lanes:
            raise ValueError("on_fork needs at least one lane id")
        seen: set = set()  # (not lanes.count per lane: quadratic in a wide fork)
        for lid in lanes:
            if lid in self.model.lanes or lid in seen:
                raise ValueError(f"lane {lid!r} already exists; fork lanes need new ids")
            seen.add(lid)
        if labels is not None and len(labels) != len(lanes):
            raise ValueError(f"labels has {len(labels)} names for {len(lanes)} lanes")
        prefix = self.model.full_chars(parent)
        for i, lid in enumerate(lanes):
            self.model.lanes[lid] = Lane(lid, parent=parent, label=labels[i] if labels else lid, prefix_chars=prefix,
                                         number=len(self.model.lanes))
        self._close_gen(parent_lane)
        parent_lane.segments.append(Segment("fork", lanes=lanes))
        self._changed()

    def on_join(self, into: str, lanes: Sequence[str]) -> None:
        """Lanes ``lanes`` were joined (their requests finished) back into ``into``."""
        self._check_thread()
        target = self.model.lane(into)
        for lid in lanes:
            lane = self.model.lane(lid)
            self._close_gen(lane)
            lane.joined_into = into
        target.segments.append(Segment("join", lanes=list(lanes)))
        self._changed()

    def on_text(self, lane: str, text: str, *, source: Optional[str] = None) -> None:
        """Program text appended to ``lane`` (an extend, a role marker, or the text of a named state
        continued from an earlier cell, with ``source`` saying which, e.g. ``"state s (cell 2)"``).
        It is shaded cached/computed once a request's prompt covers it (``on_prompt``)."""
        self._check_thread()
        if not isinstance(text, str):
            raise TypeError(f"on_text expects str text, got {type(text).__name__}")
        ln = self.model.lane(lane)
        self._close_gen(ln)
        if text:
            ln.segments.append(Segment("text", text, source=source))
            self._changed()

    def on_media(self, lane: str, text: str, *, kind: str, thumb: Any = None, frames: Optional[int] = None) -> None:
        """An ``image()``/``video()`` input appended to ``lane``: ``text`` is its placeholder in the
        program text (the image token), ``kind`` ``"image"`` or ``"video"``, ``thumb`` a
        ``media.Thumbnail`` (None: shown as a label only), ``frames`` a video's frame count. Its
        cache status comes with the first request that sends it (``on_media_cache``)."""
        self._check_thread()
        if kind not in ("image", "video"):
            raise ValueError(f"on_media kind={kind!r} must be 'image' or 'video'")
        ln = self.model.lane(lane)
        self._close_gen(ln)
        info = {"kind": kind, "frames": frames}
        if thumb is not None:
            info.update(url=thumb.url, width=thumb.width, height=thumb.height)
        ln.segments.append(Segment("media", text, thumb=info))
        self._changed()

    def on_media_cache(self, lane: str, images: Sequence[dict]) -> None:
        """A request of ``lane`` reported, per image/video input of its prompt in order,
        ``{"tokens", "cached_tokens"}`` (``meta["images"]`` of the in-process backend): inputs not
        yet marked show "cached" (their KV and vision encoding were reused), "new" or "partly
        cached"."""
        self._check_thread()
        from .media import classify_media

        self._full_dirty |= classify_media(self.model, lane, list(images))
        self._changed()

    def on_media_sent(self, lane: str) -> None:
        """A request of ``lane`` went out, and its backend reports no per-image cache (no
        ``meta["images"]``): inputs not yet marked show "sent" instead of "not sent yet"."""
        self._check_thread()
        from .media import mark_sent

        changed = mark_sent(self.model, lane)
        if changed:
            self._full_dirty |= changed
            self._changed()

    def on_prompt(self, lane: str, *, prompt_tokens: int, cached_tokens: int, cached_chars: Optional[int] = None,
                  prompt_chars: Optional[int] = None, rid: Optional[str] = None, name: Optional[str] = None) -> None:
        """A request for ``lane`` was sent; its prompt is the lane's whole text so far.

        Args:
            prompt_tokens, cached_tokens: the engine's counts (``RequestMeta``); ``cached_tokens``
                prompt tokens had their KV in the radix cache. Both add to the cell and session tallies.
            cached_chars: how many leading characters of the lane's text those cached tokens cover
                (e.g. ``len(tokenizer.decode(prompt_ids[:cached_tokens]))`` when the prompt is the lane
                text). Needed to shade the cached span; without it only the counts are shown.
            prompt_chars: characters of the lane's text in the prompt (default: all of it).
            rid, name: the request id and the gen/select variable name, for the request table.
        """
        self._check_thread()
        full = self.model.full_chars(lane)
        for field, v in (("prompt_tokens", prompt_tokens), ("cached_tokens", cached_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"on_prompt {field}={v!r} must be an int >= 0")
        if cached_tokens > prompt_tokens:
            raise ValueError(f"on_prompt cached_tokens={cached_tokens} exceeds prompt_tokens={prompt_tokens}")
        prompt_chars = full if prompt_chars is None else prompt_chars
        if not 0 <= prompt_chars <= full:
            raise ValueError(f"on_prompt prompt_chars={prompt_chars} is outside the lane's text (0..{full})")
        rec = RequestRecord(lane=lane, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, rid=rid, name=name)
        self.model.requests.append(rec)
        self._open_request[lane] = rec
        self.model.lane(lane).prompts.add(prompt_tokens, cached_tokens)
        self.model.cell.add(prompt_tokens, cached_tokens)
        self._session.add(prompt_tokens, cached_tokens)
        if cached_chars is None and self._prefix_chars is not None:
            text = self.model.full_text(lane)[:prompt_chars]
            cached_chars = min(max(int(self._prefix_chars(text, cached_tokens)), 0), prompt_chars) if cached_tokens else 0
        if cached_chars is not None:
            if not 0 <= cached_chars <= prompt_chars:
                raise ValueError(f"on_prompt cached_chars={cached_chars} must be in 0..prompt_chars={prompt_chars}")
            self._full_dirty |= classify_prefix(self.model, lane, prompt_chars, cached_chars)
        self._close_gen(self.model.lane(lane))
        self._changed()

    def on_delta(self, lane: str, text: str, *, token_ids: Sequence[int] = (),
                 token_texts: Optional[Sequence[str]] = None, logprobs: Optional[Sequence[Any]] = None,
                 name: Optional[str] = None) -> None:
        """Generated text for ``lane`` (one ``StreamEvent``'s ``text_delta`` and ``token_ids``).

        Consecutive deltas form one generated span until ``on_gen_end`` (or any other event on the
        lane). ``token_texts``: the decoded text of each id, so every token gets its own tooltip;
        when absent (or not adding up to ``text``) the delta is one piece listing all its ids.
        ``logprobs``: one per id, floats or ``TokenLogprob``s. ``name``: the gen's variable name.
        """
        self._check_thread()
        ln = self.model.lane(lane)
        seg = ln.segments[-1] if ln.segments else None
        if seg is None or seg.kind != "gen" or not seg.open:
            seg = Segment("gen", name=name, open=True)
            ln.segments.append(seg)
        ids = [int(t) for t in token_ids]
        lps = [_logprob(x) for x in logprobs] if logprobs is not None else []
        if lps and len(lps) != len(ids):
            raise ValueError(f"on_delta got {len(lps)} logprobs for {len(ids)} token ids")
        if token_texts is not None and len(token_texts) == len(ids) and "".join(token_texts) == text and ids:
            for i, piece in enumerate(token_texts):
                seg.tokens.append(Token(piece, [ids[i]], [lps[i]] if lps else []))
        elif text or ids:
            seg.tokens.append(Token(text, ids, lps))
        seg.text += text
        self._changed()

    def on_gen_end(self, lane: str, *, meta: Any = None, finish_reason: Any = None, name: Optional[str] = None,
                   regex: Optional[str] = None, json_schema: Optional[str | dict | bool] = None,
                   cached_chars: Optional[int] = None) -> None:
        """The current gen on ``lane`` finished.

        Args:
            meta: the request's ``RequestMeta`` (or its dict): completion_tokens, forward_passes and
                jumped_tokens go to the request table and the jump-forward line. If no ``on_prompt``
                was reported for this request, it is recorded here from meta's prompt_tokens and
                cached_tokens, and the cached span is shaded from ``cached_chars`` (this argument or
                ``meta["cached_chars"]``; see ``on_prompt``), the prompt being the lane's text
                before this gen's output.
            finish_reason: ``FinishReason``, its dict, or its type string.
            regex, json_schema: the constraint the gen was decoded with; the output is checked
                against it (JSON tree, schema validity, regex matches).
        """
        self._check_thread()
        ln = self.model.lane(lane)
        seg = ln.segments[-1] if ln.segments and ln.segments[-1].kind == "gen" else None
        if seg is not None:
            seg.open = False
            seg.name = seg.name or name
        m = _meta_dict(meta)
        rec = self._open_request.pop(lane, None)
        if rec is None and "prompt_tokens" in m:
            output_chars = len(seg.text) if seg is not None else 0
            self.on_prompt(lane, prompt_tokens=int(m["prompt_tokens"]), cached_tokens=int(m.get("cached_tokens", 0)),
                           cached_chars=cached_chars if cached_chars is not None else m.get("cached_chars"),
                           prompt_chars=self.model.full_chars(lane) - output_chars, rid=m.get("id"), name=name)
            rec = self._open_request.pop(lane)
        if rec is not None:
            rec.name = rec.name or name or (seg.name if seg else None)
            rec.finish_reason = _finish_str(finish_reason)
            for key in ("completion_tokens", "forward_passes", "jumped_tokens"):
                if m.get(key) is not None:
                    setattr(rec, key, int(m[key]))
        if regex is not None or json_schema is not None:
            text = seg.text if seg is not None else ""
            rec_s = check_structured(text, json_schema=json_schema, regex=regex,
                                     completion_tokens=m.get("completion_tokens"),
                                     forward_passes=m.get("forward_passes"), jumped_tokens=m.get("jumped_tokens"))
            if not rec_s["valid"] and _finish_str(finish_reason) == "length":  # the usual cause: say it first
                rec_s["errors"].insert(0, {"path": "$", "message": _CUT_BY_MAX_TOKENS})
            elif not rec_s["valid"] and _stop_matched(finish_reason) is not None:  # the gen's own stop cut it
                rec_s["errors"].insert(0, {"path": "$", "message": _cut_by_stop(_stop_matched(finish_reason))})
            rec_s["name"] = name or (seg.name if seg else None) or "output"
            rec_s["lane"] = lane
            self.model.structured.append(rec_s)
        self._changed()

    def on_select(self, lane: str, *, name: str, choices: Sequence[str], scores: Sequence[float],
                  chosen: Optional[int] = None, meta: Any = None) -> None:
        """A ``select`` on ``lane`` picked one of ``choices`` (str) by ``scores`` (float, one per
        choice, higher is better: SGLang's normalized prompt logprobs). ``chosen``: the index picked
        (default: the best score). The chosen text is appended to the lane."""
        self._check_thread()
        ln = self.model.lane(lane)
        choices, scores = [str(c) for c in choices], [float(s) for s in scores]
        if not choices or len(choices) != len(scores):
            raise ValueError(f"on_select needs one score per choice (got {len(choices)} choices, {len(scores)} scores)")
        if chosen is None:
            chosen = max(range(len(scores)), key=lambda i: (scores[i] if math.isfinite(scores[i]) else -math.inf, -i))
        if not 0 <= chosen < len(choices):
            raise ValueError(f"on_select chosen={chosen} is not an index into {len(choices)} choices")
        self._close_gen(ln)
        ln.segments.append(Segment("select", choices[chosen], name=name))
        self.model.selects.append(SelectRecord(lane, name, choices, scores, chosen))
        if meta is not None or lane in self._open_request:
            self.on_gen_end(lane, meta=meta, name=name)
        self._changed()

    def tick(self) -> None:
        """Send a frame if changes are pending and the rate allows (call it on queue timeouts)."""
        self._check_thread()
        self._flush(force=False)

    def finish(self, status: str = "done", *, error: Any = None) -> dict:
        """End the run: ``status`` is ``"done"``, ``"error"`` or ``"interrupted"``; ``error`` an
        exception or message shown in the header. Replaces the displayed output (same display_id)
        with the static bundle, closes the widget, and returns the bundle: ``{"text/html",
        "text/plain", VIEW_MIME}``. Later calls return the same bundle and display nothing."""
        self._check_thread()
        if self._bundle is not None:
            return self._bundle
        if status not in ("done", "error", "interrupted"):
            raise ValueError(f"finish status={status!r} must be 'done', 'error' or 'interrupted'")
        for ln in self.model.lanes.values():
            last = ln.segments[-1] if ln.segments else None
            if last is not None and last.kind == "gen" and last.open:  # stopped before on_gen_end
                self.model.unfinished_tokens += sum(t.n_tokens for t in last.tokens)
                self.model.unfinished_gens += 1
            self._close_gen(ln)
        self.model.status = status
        if error is not None:
            self.model.error = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        self.model.elapsed_s = self._clock() - self._t0
        self.model.cumulative = Tally(self._session.prompt_tokens, self._session.cached_tokens)  # freeze
        self._bundle = self._static_bundle()
        if self._handle is not None:
            self._handle.update(self._bundle, raw=True, metadata=self._metadata())
        if self._widget is not None:  # and its Layout, a widget (a comm) of its own that close() leaves open
            layout = getattr(self._widget, "layout", None)
            # nbclient (papermill, nbconvert --execute) keeps a closed widget's last state in the
            # notebook's metadata: its last snapshot held the run's text again, as the live HTML;
            # the status goes with it, so the model's last state is not "running"
            self._widget.send_snapshot("", status=status)
            self._widget.close()
            if layout is not None:
                layout.close()
        return self._bundle

    # --- internals ----------------------------------------------------------------------------
    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError("RunView must be used from the thread that created it (the cell's main thread); "
                               "engine threads should queue their events for the cell's pump loop")

    def _request_stop(self) -> None:
        # Runs on the comm handler's thread: only thread-safe work here.
        if self._bundle is not None or self.stop_requested.is_set():
            return
        self.stop_requested.set()
        if self._on_stop is not None:
            try:
                self._on_stop()
            except Exception:  # a failing abort must not kill the comm handler
                log.exception("lmnb: the Stop callback failed")

    def _close_gen(self, lane: Lane) -> None:
        if lane.segments and lane.segments[-1].kind == "gen":
            lane.segments[-1].open = False

    def _changed(self) -> None:
        self._dirty = True
        self._flush(force=False)

    def _metadata(self) -> dict:
        return {"lmnb": {"view": "run", "status": self.model.status}}

    def _static_bundle(self) -> dict:
        return {"text/html": render_run_html(self.model, live=False), "text/plain": render_run_text(self.model),
                VIEW_MIME: self.model.to_dict()}

    def _flush(self, force: bool) -> None:
        if self._handle is None or self._bundle is not None or not self.updates:
            return
        now = self._clock()
        if self.stop_requested.is_set() and self.model.status == "running":
            self.model.status = "stopping"
            self._dirty = True
        if now - self._last_frame < 1.0 / self.max_hz and not force:
            return
        if not self._dirty and now - self._last_frame < 1.0:  # else refresh the elapsed time once a second
            return
        self.model.elapsed_s = now - self._t0
        if self._widget is None:
            self._handle.update(self._static_bundle(), raw=True, metadata=self._metadata())
        elif self.model.status != self._sent_status or now - self._last_snapshot >= self.snapshot_s:
            self._widget.send_snapshot(render_run_html(self.model, live=True), status=self.model.status)
            self._sent_status = self.model.status
            self._mark_all_sent()
            self._last_snapshot = now
        else:
            ops = self._lane_ops() + self._part_ops()
            if not ops:
                self._dirty = False
                return
            self._widget.send_ops(ops)
        self.frames += 1
        self._dirty = False
        self._last_frame = now

    def _mark_sent(self, lane_id: str) -> None:
        """Record ``lane_id`` (and the lanes forked inside it) as fully rendered in the frontend."""
        lane = self.model.lane(lane_id)
        segs = lane.segments
        self._sent[lane_id] = (len(segs), len(segs[-1].tokens) if segs and segs[-1].kind == "gen" else 0)
        self._full_dirty.discard(lane_id)
        for s in segs:
            if s.kind == "fork":
                for child in s.lanes:
                    self._mark_sent(child)

    def _mark_all_sent(self) -> None:
        self._sent.clear()
        self._full_dirty.clear()
        self._mark_sent("main")
        self._sent_parts = top_parts(self.model)

    def _lane_ops(self) -> list[dict]:
        ops: list[dict] = []
        for lid, lane in self.model.lanes.items():
            if lid not in self._sent:  # not in the DOM yet: rendered with its parent's fork segment
                continue
            if lid in self._full_dirty:
                ops.append({"op": "set", "k": f"lane:{lid}", "html": render_lane_body(self.model, lid, live=True)})
                self._mark_sent(lid)
                continue
            n_seg, n_tok = self._sent[lid]
            segs = lane.segments
            if n_seg and segs[n_seg - 1].kind == "gen" and len(segs[n_seg - 1].tokens) > n_tok:
                ops.append({"op": "append", "k": f"seg:{lid}:{n_seg - 1}",
                            "html": render_tokens(segs[n_seg - 1].tokens, n_tok)})
            if len(segs) > n_seg:
                html = "".join(render_segment(self.model, lane, i, live=True) for i in range(n_seg, len(segs)))
                ops.append({"op": "append", "k": f"lane:{lid}", "html": html})
                for s in segs[n_seg:]:
                    for child in s.lanes if s.kind == "fork" else ():
                        self._mark_sent(child)
            self._sent[lid] = (len(segs), len(segs[-1].tokens) if segs and segs[-1].kind == "gen" else 0)
        return ops

    def _part_ops(self) -> list[dict]:
        ops = []
        for key, html in top_parts(self.model).items():
            if self._sent_parts.get(key) != html:
                ops.append({"op": "set", "k": key, "html": html})
                self._sent_parts[key] = html
        return ops

