"""Render a ``RunModel`` as sanitizer-safe HTML (whole view or live parts) and as plain text.

Layout: header (status, tokens, time) · cache-hit line (this cell and the session) · the main lane,
whose text holds fork blocks (child lanes side by side in a table, each streaming its own text) and
join markers · structured outputs (collapsible JSON tree, schema validity, regex checks,
jump-forward savings) · selects (score bars, chosen marked) · requests · colour legend.

``live=True`` adds ``data-k`` keys that the live widget's ops target (``lane:<id>`` lane bodies,
``seg:<id>:<i>`` open gen spans, ``lanehdr:<id>`` lane headers, and the top-level parts
``header``/``cache``/``details``); the static bundle is rendered with ``live=False``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from .html import (BAD, BODY_STYLE, CACHED_BG, COMPUTED_BG, GEN_BG, GEN_LINE, LANE_COLORS, MONO, MUTED,
                   OK, ROOT_STYLE, ROW_COLORS, SELECT_BG, SELECT_LINE, TABLE_COLORS, badge, bar, esc, legend, pct,
                   tag)
from .model import MAX_TOKEN_DETAIL, Lane, RunModel, Token
from .structured import path_step

# Bounds that keep a saved notebook small and the browser responsive on long outputs.
MAX_TEXT_CHARS = 4000  # per program-text segment: longer ones keep their head and tail
TEXT_HEAD, TEXT_TAIL = 1200, 2400
MAX_JSON_NODES = 500  # JSON tree nodes drawn per structured output
MAX_JSON_DEPTH = 32  # JSON tree levels drawn as nested <details>; deeper values are JSON text
LANES_PER_ROW = 4  # fork lanes side by side; more wrap onto further rows of the fork's table
MAX_SELECT_ROWS = 50  # choices drawn per select: the best-scored ones and the chosen one
MAX_REQUEST_ROWS = 200  # rows of the requests table (a fork of thousands makes one request each)

STATUS_COLORS = {"running": GEN_LINE, "stopping": "#9a6700", "done": OK, "error": BAD, "interrupted": "#9a6700"}
CACHE_STYLE = {"cached": f"background-color:{CACHED_BG}", "computed": f"background-color:{COMPUTED_BG}"}
GEN_STYLE = f"background-color:{GEN_BG};border-bottom:2px solid {GEN_LINE}"
SELECT_STYLE = f"background-color:{SELECT_BG};border-bottom:2px solid {SELECT_LINE}"


# --- tokens and segments ----------------------------------------------------------------------
def token_title(t: Token) -> str:
    """Tooltip of one piece: its text (repr, so whitespace shows), ids and logprobs."""
    parts = [repr(t.text)]
    if t.token_ids:
        parts.append("id " + ", ".join(map(str, t.token_ids)))
    lps = [lp for lp in t.logprobs if lp is not None]
    if lps:
        parts.append("logprob " + ", ".join(f"{lp:.4f} (p={math.exp(lp):.3f})" for lp in lps))
    return " · ".join(parts)


def render_tokens(tokens: list[Token], start: int = 0) -> str:
    """HTML of ``tokens[start:]``: one ``lmnb-tok`` span with a tooltip per piece, plain text after
    ``MAX_TOKEN_DETAIL``."""
    out = []
    for i in range(start, len(tokens)):
        t = tokens[i]
        out.append(tag("span", esc(t.text), cls="lmnb-tok", title=token_title(t))
                   if i < MAX_TOKEN_DETAIL else esc(t.text))
    return "".join(out)


def _elided_note(text: str) -> str:
    """What stands for the middle of a program text longer than ``MAX_TEXT_CHARS``."""
    return f" … {len(text) - TEXT_HEAD - TEXT_TAIL:,} characters not shown … "


def _elide(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return esc(text)
    note = tag("span", esc(_elided_note(text)), cls="lmnb-elided", style=f"color:{MUTED};font-style:italic")
    return esc(text[:TEXT_HEAD]) + note + esc(text[-TEXT_TAIL:])


def _elide_plain(text: str) -> str:
    """``_elide`` for the text/plain view: the saved notebook holds a cell's whole text once, in the
    view's JSON; text/plain held it whole too, so a 1 MB prompt was saved twice."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:TEXT_HEAD] + _elided_note(text) + text[-TEXT_TAIL:]


def render_segment(model: RunModel, lane: Lane, index: int, *, live: bool) -> str:
    """HTML of one segment of a lane: program text (cached or computed prompt), a gen's tokens or a marker."""
    s = lane.segments[index]
    if s.kind == "text":
        cls = f"lmnb-text lmnb-{s.cache}" if s.cache else "lmnb-text"
        title = {"cached": "prompt text whose KV came from the radix cache",
                 "computed": "prompt text prefilled by this cell"}.get(s.cache or "", "program text")
        if s.source:
            title += f" · from {s.source}"
        return tag("span", _elide(s.text), cls=cls, style=CACHE_STYLE.get(s.cache or "", ""), title=title)
    if s.kind == "gen":
        title = f"gen {s.name}" if s.name else "generated"
        if len(s.tokens) > MAX_TOKEN_DETAIL:
            title += f" · ids and logprobs of its first {MAX_TOKEN_DETAIL} of {len(s.tokens)} pieces only"
        return tag("span", render_tokens(s.tokens), cls="lmnb-gen", style=GEN_STYLE, title=title,
                   key=f"seg:{lane.id}:{index}" if live else None)
    if s.kind == "select":
        return tag("span", esc(s.text), cls="lmnb-select-choice", style=SELECT_STYLE,
                   title=f"select {s.name}" if s.name else "select")
    if s.kind == "media":
        return render_media(s)
    if s.kind == "fork":
        return render_fork(model, s.lanes, live=live)
    if s.kind == "join":
        names = ", ".join(model.lane(l).label or l for l in s.lanes)
        return tag("div", esc("⤶ joined " + names), cls="lmnb-join",
                   style=f"color:{MUTED};font-style:italic;{MONO}")
    raise ValueError(f"unknown segment kind {s.kind!r}")


MEDIA_BADGE = {"cached": ("cached", OK), "partial": ("partly cached", "#9a6700"), "computed": ("new", "#9a6700"),
               "sent": ("sent", MUTED)}


def render_media(s) -> str:
    """An image/video input: its thumbnail (a PNG data URL, ≤ 96 px) and a badge saying whether its
    tokens' KV came from the radix cache ("cached"), were computed ("new"), were sent to a backend
    that does not say ("sent": an OpenAI-compatible API, an SGLang server), or are not sent yet."""
    info = s.thumb or {}
    kind = info.get("kind", "image")
    label = kind if not info.get("frames") else f"video, {info['frames']} frames"
    if info.get("url"):
        pic = (f'<img src="{esc(info["url"])}" alt="{esc(label)}" width="{int(info["width"])}" '
               f'height="{int(info["height"])}" style="vertical-align:middle;border:1px solid #d0d7de">')
    else:
        pic = esc(f"[{label}]")
    text, color = MEDIA_BADGE.get(s.cache or "", ("not sent yet", MUTED))
    title = label
    if "tokens" in info:
        title += f" · {info['cached_tokens']}/{info['tokens']} tokens from the radix cache"
    return tag("span", pic + badge(text, color=color, cls=f"lmnb-badge lmnb-media-{s.cache or 'pending'}"),
               cls=f"lmnb-media lmnb-{kind}", title=title, style="display:inline-block;vertical-align:middle")


def render_lane_body(model: RunModel, lane_id: str, *, live: bool) -> str:
    """The inner HTML of a lane's body: its segments in order (fork blocks nest child lanes)."""
    lane = model.lane(lane_id)
    return "".join(render_segment(model, lane, i, live=live) for i in range(len(lane.segments)))


# --- lanes ------------------------------------------------------------------------------------
def lane_label(model: RunModel, lane_id: str) -> str:
    """The name a lane is shown by (``"branch 0"``), for every place that names it; its id if it has none."""
    lane = model.lanes.get(lane_id)
    return (lane.label if lane is not None else None) or lane_id


def lane_color(model: RunModel, lane_id: str) -> str:
    """The colour of lane ``lane_id``."""
    return LANE_COLORS[model.lane(lane_id).number % len(LANE_COLORS)]


def render_lane_header(model: RunModel, lane_id: str) -> str:
    """Inner HTML of a lane header: name, parent, generated tokens, this lane's prompt cache hits."""
    lane = model.lane(lane_id)
    bits = [tag("b", esc(lane.label or lane.id))]
    if lane.parent is not None:
        bits.append(esc(f"fork of {model.lane(lane.parent).label or lane.parent}"))
    bits.append(esc(f"{lane.completion_tokens} tok"))
    p = lane.prompts
    if p.prompt_tokens:
        bits.append(esc(f"prompt {p.prompt_tokens}, cached {p.cached_tokens} ({pct(p.hit_rate)})"))
    if lane.joined_into is not None:
        into = model.lane(lane.joined_into)
        bits.append(badge(f"joined into {into.label or into.id}", cls="lmnb-badge lmnb-joined"))
    return " · ".join(bits)


def render_lane(model: RunModel, lane_id: str, *, live: bool) -> str:
    """A lane: header + body (the main lane at top level, children inside fork blocks)."""
    color = lane_color(model, lane_id)
    header = tag("div", render_lane_header(model, lane_id), cls="lmnb-lane-header",
                 style=f"color:{color};font-size:12px;margin-bottom:2px",
                 key=f"lanehdr:{lane_id}" if live else None)
    # a fork branch scrolls inside its lane; the main lane (which holds the fork blocks) grows
    scroll = ";max-height:24em;overflow-y:auto" if model.lane(lane_id).parent is not None else ""
    body = tag("div", render_lane_body(model, lane_id, live=live), cls="lmnb-lane-body", style=BODY_STYLE + scroll,
               key=f"lane:{lane_id}" if live else None)
    return header + body


def render_fork(model: RunModel, lane_ids: list[str], *, live: bool) -> str:
    """Child lanes side by side: one table cell per lane (tables survive every sanitizer), at most
    ``LANES_PER_ROW`` to a row (a fork of 32 in one row made 3%-wide lanes, a few letters a line)."""
    per_row = min(max(len(lane_ids), 1), LANES_PER_ROW)
    width = f"{100 / per_row:.2f}%"
    rows = []
    for start in range(0, len(lane_ids), per_row):
        cells = "".join(
            tag("td", render_lane(model, lid, live=live), cls="lmnb-lane",
                style=f"vertical-align:top;text-align:left;width:{width};"
                      f"border-left:3px solid {lane_color(model, lid)};padding:2px 6px;background-color:#f6f8fa")
            for lid in lane_ids[start:start + per_row])
        rows.append(tag("tr", cells, style=ROW_COLORS))
    label = tag("div", esc("⤷ fork → " + ", ".join(model.lane(l).label or l for l in lane_ids)),
                style=f"color:{MUTED};font-style:italic;{MONO}")
    table = tag("table", tag("tbody", "".join(rows)), cls="lmnb-lanes",
                style="width:100%;border-collapse:separate;border-spacing:4px 2px;margin:2px 0;"
                      f"white-space:normal;table-layout:fixed;{TABLE_COLORS}")
    return tag("div", label + table, cls="lmnb-fork", style="white-space:normal;margin:2px 0")


# --- top-level parts --------------------------------------------------------------------------
def render_header(model: RunModel) -> str:
    """HTML of the view's header: title, status, lanes, generated tokens, time."""
    tokens = sum(ln.completion_tokens for ln in model.lanes.values())
    bits = [tag("b", esc(model.title)),
            badge(model.status, color=STATUS_COLORS.get(model.status, MUTED), cls=f"lmnb-badge lmnb-status-{model.status}"),
            esc(f"{len(model.lanes)} lane{'s' if len(model.lanes) != 1 else ''}"),
            esc(f"{tokens} generated tok"),
            esc(f"{model.elapsed_s:.1f} s")]
    out = " · ".join(bits)
    if model.error:
        out += tag("div", esc(model.error), cls="lmnb-error-message", style=f"color:{BAD};{MONO};white-space:pre-wrap")
    return out


def unreported(model: RunModel) -> str:
    """What the cell's prompt counts leave out, or "": gens stopped before their backend reported
    them (an OpenAI-compatible API reports usage only at the stream's end)."""
    n = model.unfinished_gens
    if not n:
        return ""
    return f" + unknown ({n} gen{'s' * (n > 1)} stopped before the backend reported {'their' if n > 1 else 'its'} prompt)"


def render_cache(model: RunModel) -> str:
    """Cached / prompt tokens and hit rate for this cell and cumulatively for the session."""
    def one(label: str, t, cls: str, note: str = "") -> str:
        return tag("span", esc(f"{label}: {t.cached_tokens} / {t.prompt_tokens} prompt tokens cached ")
                   + bar(t.hit_rate, fg="#2da44e", bg=COMPUTED_BG, title=f"hit rate {pct(t.hit_rate)}")
                   + tag("b", esc(pct(t.hit_rate))) + esc(note), cls=cls, style="margin-right:14px")
    return esc("KV cache · ") + one("this cell", model.cell, "lmnb-hit-cell", unreported(model)) + one(
        "session", model.cumulative, "lmnb-hit-session")


def render_json_tree(value: Any, *, key: Optional[str] = None, path: str = "$",
                     marks: Optional[dict[str, str]] = None, depth: int = 0,
                     budget: Optional[list[int]] = None) -> str:
    """A collapsible tree (``<details>``/``<summary>``) of a JSON value; ``marks`` maps paths
    (``$.a[0]``) to a problem shown in red next to that node. At most ``MAX_JSON_NODES`` nodes are
    drawn (``budget``: the nodes left, shared by the whole tree); the rest are counted in notes."""
    marks = marks or {}
    budget = budget if budget is not None else [MAX_JSON_NODES]
    budget[0] -= 1
    head = tag("span", esc(json.dumps(key)) + ": ", style="color:#953800") if key is not None else ""
    mark = ""
    if path in marks:
        mark = " " + tag("span", esc("✗ " + marks[path]), cls="lmnb-json-error", style=f"color:{BAD}")
    if (isinstance(value, dict) or isinstance(value, list)) and depth >= MAX_JSON_DEPTH:
        # one recursion (two frames) per level overflowed Python's stack at ~400 levels, failing the
        # cell's view; deeper values show as compact JSON text (their errors stay listed below)
        text = tag("span", esc(json.dumps(value, ensure_ascii=False)), cls="lmnb-json-deep",
                   title=f"nested deeper than {MAX_JSON_DEPTH} levels: shown as JSON text")
        return tag("span", head + text + mark, cls="lmnb-json-leaf", style=MONO)
    if isinstance(value, dict) or isinstance(value, list):
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        opener, closer = ("{", "}") if isinstance(value, dict) else ("[", "]")
        # each drawn node is ~200 bytes of markup: a 5000-number array (29 KB of output) made ~1 MB
        # of HTML in the saved notebook, so the drawn part is bounded and the rest counted
        shown = []
        for k, v in items:
            if budget[0] <= 0:
                shown.append(tag("li", esc(f"… {len(items) - len(shown)} more not shown"), cls="lmnb-json-more",
                                 style=f"list-style-type:none;color:{MUTED}"))
                break
            shown.append(tag("li", render_json_tree(
                v, key=k if isinstance(value, dict) else None,
                path=path_step(path, k),
                marks=marks, depth=depth + 1, budget=budget), style="list-style-type:none"))
        kids = "".join(shown)
        count = f"{len(items)} {'keys' if isinstance(value, dict) else 'items'}"
        summary = tag("summary", head + esc(f"{opener}…{closer} ") + tag("span", esc(count), style=f"color:{MUTED}") + mark)
        return tag("details", summary + tag("ul", kids, style="margin:0;padding-left:16px"),
                   cls="lmnb-json-node", extra="open" if depth < 3 else "")
    color = {str: "#0a3069", bool: "#8250df", type(None): "#8250df"}.get(type(value), "#0550ae")
    return tag("span", head + tag("span", esc(json.dumps(value, ensure_ascii=False)), style=f"color:{color}") + mark,
               cls="lmnb-json-leaf", style=MONO)


def render_structured(rec: dict, name: str, lane: str) -> str:
    """HTML of one constrained gen's check: valid or not, with the pattern."""
    ok = rec["valid"]
    what = "JSON" if rec["kind"] == "json" else "regex"
    head = [tag("b", esc(name)), esc(f"({lane}) {what}"),
            badge("✓ valid" if ok else "✗ invalid", color=OK if ok else BAD,
                  cls=f"lmnb-badge lmnb-{'valid' if ok else 'invalid'}")]
    if rec.get("regex") is not None:
        m = rec.get("regex_match")
        head.append(tag("span", esc(f"/{rec['regex']}/ ") + esc("✓ full match" if m else "✗ no full match"),
                        cls="lmnb-regex", style=f"{MONO};color:{OK if m else BAD}"))
    parts = [tag("div", " · ".join(head))]
    jump = rec.get("jump")
    if jump:
        txt = (f"jump-forward: {jump['jumped_tokens']} tokens jumped; {jump['forward_passes']} forward passes "
               f"for {jump['completion_tokens']} tokens")
        if jump.get("passes_saved") is not None:
            txt += f" (saved {jump['passes_saved']})"
        parts.append(tag("div", esc(txt), cls="lmnb-jump", style=f"color:{MUTED};font-size:12px"))
    marks = {e["path"]: e["message"] for e in rec["errors"]}
    if rec["value"] is not None:
        parts.append(tag("div", render_json_tree(rec["value"], marks=marks), cls="lmnb-json", style=MONO))
    else:
        # the lane above shows the whole output; this copy keeps its head and tail, so an output cut
        # by max_tokens (the usual invalid JSON) does not double a long cell's saved size
        parts.append(tag("pre", _elide(rec["text"]), cls="lmnb-structured-text",
                         style=f"{MONO};margin:2px 0;white-space:pre-wrap"))
    if rec["errors"]:
        parts.append(tag("ul", "".join(tag("li", esc(f"{e['path']}: {e['message']}")) for e in rec["errors"]),
                         cls="lmnb-errors", style=f"color:{BAD};margin:2px 0;font-size:12px"))
    if rec["patterns"]:
        rows = "".join(
            tag("li", tag("span", esc(f"{p['path']} ~ /{p['pattern']}/ "), style=MONO)
                + tag("span", esc("✓ matches" if p["match"] else "✗ no match"),
                      style=f"color:{OK if p['match'] else BAD}"), cls="lmnb-pattern")
            for p in rec["patterns"])
        parts.append(tag("ul", rows, style="margin:2px 0;font-size:12px"))
    return tag("div", "".join(parts), cls="lmnb-structured",
               style="border-top:1px solid #d0d7de;padding-top:4px;margin-top:4px")


def shown_choices(rec) -> list[int]:
    """Indexes of the select's choices the view shows, in their order: the ``MAX_SELECT_ROWS``
    best-scored and the chosen one (a select over thousands of labels drew a row each: megabytes of
    HTML in the saved notebook)."""
    best = sorted(range(len(rec.choices)), key=lambda i: -rec.scores[i] if math.isfinite(rec.scores[i]) else math.inf)
    drawn = set(best[:MAX_SELECT_ROWS]) | {rec.chosen}
    return [i for i in range(len(rec.choices)) if i in drawn]


def _more_choices(rec, shown: list[int]) -> str:
    hidden = len(rec.choices) - len(shown)
    return f"… {hidden} more choices, with lower scores, not shown" if hidden > 0 else ""


def render_select(model: RunModel, rec) -> str:
    """HTML table of a select's choices, scores and relative likelihoods."""
    rel = rec.relative_likelihoods()
    rows = []
    shown = shown_choices(rec)
    for i in shown:
        choice, score, r = rec.choices[i], rec.scores[i], rel[i]
        chosen = i == rec.chosen
        score_txt = f"{score:.3f}" if math.isfinite(score) else "–"
        rows.append(tag("tr", "".join([
            tag("td", esc(("✓ " if chosen else "") + choice),
                style=f"{MONO};text-align:left;font-weight:{'bold' if chosen else 'normal'}"),
            tag("td", bar(r, width_px=160, fg=SELECT_LINE if chosen else "#afb8c1",
                          title=f"relative likelihood {r:.3f}"), style="text-align:left"),
            tag("td", esc(score_txt), style=f"{MONO};text-align:right;color:{MUTED}"),
        ]), cls="lmnb-choice lmnb-chosen" if chosen else "lmnb-choice", style=ROW_COLORS))
    head = tag("div", tag("b", esc(rec.name)) + esc(f" ({lane_label(model, rec.lane)}) select · bar = exp(score − best), "
                                                    "score = normalized prompt logprob"))
    more = _more_choices(rec, shown)
    more = more and tag("div", esc(more), cls="lmnb-more", style=f"color:{MUTED};font-size:12px")
    return tag("div", head + tag("table", tag("tbody", "".join(rows)), style=f"border-collapse:collapse;{TABLE_COLORS}")
               + more, cls="lmnb-select", style="border-top:1px solid #d0d7de;padding-top:4px;margin-top:4px")


def render_requests(model: RunModel) -> str:
    """HTML table of the cell's requests: prompt, cached and completion tokens, finish reason."""
    if not model.requests:
        return ""
    head = tag("tr", "".join(tag("th", esc(h), style="text-align:left;padding:0 6px")
                             for h in ("lane", "name", "prompt", "cached", "hit", "completion", "finish")),
               style=ROW_COLORS)
    rows = "".join(tag("tr", "".join(
        tag("td", esc(v), style="padding:0 6px;text-align:left")
        for v in (lane_label(model, r.lane), r.name or "", r.prompt_tokens, r.cached_tokens,
                  pct(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else None),
                  "" if r.completion_tokens is None else r.completion_tokens, r.finish_reason or "")),
        style=ROW_COLORS) for r in model.requests[:MAX_REQUEST_ROWS])
    table = tag("table", tag("thead", head) + tag("tbody", rows), style=f"border-collapse:collapse;{MONO};{TABLE_COLORS}")
    hidden = len(model.requests) - MAX_REQUEST_ROWS
    if hidden > 0:
        table += tag("div", esc(f"… {hidden} more requests not shown"), cls="lmnb-more", style=f"color:{MUTED}")
    return tag("details", tag("summary", esc(f"requests ({len(model.requests)})")) + table,
               cls="lmnb-requests", style="margin-top:4px;font-size:12px")


def render_details(model: RunModel) -> str:
    """HTML of the details section: constrained gens, selects, requests."""
    parts = [render_structured(rec, rec.get("name") or "", lane_label(model, rec.get("lane") or ""))
             for rec in model.structured]
    parts += [render_select(model, rec) for rec in model.selects]
    parts.append(render_requests(model))
    return "".join(parts)


# --- the whole view ---------------------------------------------------------------------------
def top_parts(model: RunModel) -> dict[str, str]:
    """Small parts the live widget re-sends whole when they change: key -> inner HTML."""
    parts = {"header": render_header(model), "cache": render_cache(model), "details": render_details(model)}
    for lane_id in model.lanes:
        parts[f"lanehdr:{lane_id}"] = render_lane_header(model, lane_id)
    return parts


def render_run_html(model: RunModel, *, live: bool = False) -> str:
    """The whole view as one ``<div class="lmnb-run lmnb-<status>">``."""
    k = (lambda name: name) if live else (lambda name: None)
    inner = "".join([
        tag("div", render_header(model), cls="lmnb-header", key=k("header")),
        tag("div", render_cache(model), cls="lmnb-cache", style="font-size:12px;margin:3px 0", key=k("cache")),
        tag("div", render_lane(model, "main", live=live), cls="lmnb-main"),
        tag("div", render_details(model), cls="lmnb-details", key=k("details")),
        legend(),
    ])
    return tag("div", inner, cls=f"lmnb-run lmnb-{model.status}", style=ROOT_STYLE)


def render_run_text(model: RunModel) -> str:
    """Plain-text summary for terminals and diffs: header, cache line, each lane's text."""
    c, s = model.cell, model.cumulative
    lines = [f"[lmnb {model.title}: {model.status}, {model.elapsed_s:.1f} s]",
             f"KV cache: this cell {c.cached_tokens}/{c.prompt_tokens} prompt tokens cached ({pct(c.hit_rate)})"
             f"{unreported(model)}; "
             f"session {s.cached_tokens}/{s.prompt_tokens} ({pct(s.hit_rate)})"]
    if model.error:
        lines.append(f"error: {model.error}")

    def lane_text(lane_id: str, indent: str) -> None:
        lane = model.lane(lane_id)
        label = lane.label or lane.id
        lines.append(f"{indent}── {label}" + (f" (fork of {lane_label(model, lane.parent)})" if lane.parent else "")
                     + " ──")
        buf = ""
        for seg in lane.segments:
            if seg.kind == "fork":
                if buf:
                    lines.append(indent + buf)
                    buf = ""
                for child in seg.lanes:
                    lane_text(child, indent + "  ")
            elif seg.kind == "join":
                buf += f"\n[joined {', '.join(model.lane(l).label or l for l in seg.lanes)}]\n"
            else:
                buf += _elide_plain(seg.text) if seg.kind == "text" else seg.text
        if buf:
            lines.append(indent + buf.replace("\n", "\n" + indent))

    lane_text("main", "")
    for rec in model.structured:
        why = f": {rec['errors'][0]['message']}" if rec["errors"] else ""  # (the first: the cause where it is known)
        lines.append(f"{rec.get('name')}: {'valid' if rec['valid'] else 'INVALID'} "
                     f"{'JSON' if rec['kind'] == 'json' else 'regex'} output{why}")
    for sel in model.selects:
        shown = shown_choices(sel)
        scores = ", ".join(f"{'*' if i == sel.chosen else ''}{sel.choices[i]!r}={sel.scores[i]:.3f}" for i in shown)
        more = _more_choices(sel, shown)
        lines.append(f"select {sel.name}: {scores}" + (f", {more}" if more else ""))
    return "\n".join(lines)
