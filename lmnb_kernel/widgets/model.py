"""The data model of one cell run's view: plain dataclasses fed by events, no Jupyter imports.

A run is a tree of *lanes* (program states). The root lane is ``"main"``; ``fork`` opens child
lanes whose text starts where the parent's text stood at the fork, and ``join`` closes them. A
lane's text is a list of *segments*:

- ``text``   program text appended by the program (extend, role markers, the text of a named state
  continued from an earlier cell); each character is classified by the first request whose prompt
  covered it as ``cached`` (its KV came from the radix cache) or ``computed`` (prefilled), or stays
  unclassified (``None``) if no request has covered it yet;
- ``gen``    generated tokens (one ``Token`` each, with its text and, when requested, its logprob);
- ``select`` the chosen text of a ``select`` call;
- ``media``  an ``image()``/``video()`` input: its placeholder text (the image token), a thumbnail,
  and whether the first request that sent it found its tokens in the radix cache (``cache``);
- ``fork``   a marker where child lanes branch off (the renderer draws them side by side there);
- ``join``   a marker where child lanes were joined back.

Cache accounting follows the paper's definition (SGLang, arXiv 2312.07104, §6): the hit rate is
cached prompt tokens / prompt tokens, summed over the requests of the cell (and of the session).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional

SegmentKind = Literal["text", "gen", "select", "media", "fork", "join"]
CacheClass = Optional[Literal["cached", "computed", "partial", "sent"]]  # "sent": media, cache not reported


# Per gen: the pieces whose ids and logprobs the view shows (a tooltip each, ~65 bytes of saved HTML);
# later ones are plain text there.
MAX_TOKEN_DETAIL = 1500


@dataclass
class Token:
    """One streamed piece of generated text, normally exactly one token.

    ``text``: its decoded text (str); ``token_ids``: the ids it covers (list[int]; several when the
    caller could not split a delta per token, empty when it only had text); ``logprobs``: natural-log
    probability per id (list[float | None]; empty when not requested).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Optional[float]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        """Tokens this piece stands for (1 when the caller gave text only)."""
        return len(self.token_ids) or 1


@dataclass
class Segment:
    """A run of lane text of one kind (see the module docstring)."""

    kind: SegmentKind
    text: str = ""
    cache: CacheClass = None
    source: Optional[str] = None  # where program text came from, e.g. "state s (cell 3)"
    name: Optional[str] = None  # variable name of a gen/select
    tokens: list[Token] = field(default_factory=list)
    open: bool = False  # a gen that is still receiving tokens
    lanes: list[str] = field(default_factory=list)  # fork/join: the child lane ids
    thumb: Optional[dict] = None  # media: {"kind", "url", "width", "height", "frames", "tokens", "cached_tokens"}


@dataclass
class Lane:
    """One program state. ``prefix_chars``: length of the text inherited from ``parent`` at the
    fork (the lane's own segments continue from there). ``number``: its place among the run's
    lanes (main is 0), which picks its colour. ``prompts``: its requests' prompt and cached tokens
    (kept here, not summed from the run's requests per lane: that is quadratic in a wide fork)."""

    id: str
    parent: Optional[str] = None
    label: Optional[str] = None
    prefix_chars: int = 0
    segments: list[Segment] = field(default_factory=list)
    joined_into: Optional[str] = None
    number: int = 0
    prompts: "Tally" = field(default_factory=lambda: Tally())

    @property
    def own_chars(self) -> int:
        """Characters of text this lane added itself."""
        return sum(len(s.text) for s in self.segments)

    @property
    def completion_tokens(self) -> int:
        """Tokens this lane's gens produced."""
        return sum(t.n_tokens for s in self.segments if s.kind == "gen" for t in s.tokens)


@dataclass
class RequestRecord:
    """One engine request of the cell: its lane, prompt size and radix-cache hit (token counts)."""

    lane: str
    prompt_tokens: int
    cached_tokens: int
    rid: Optional[str] = None
    name: Optional[str] = None
    completion_tokens: Optional[int] = None
    forward_passes: Optional[int] = None
    jumped_tokens: Optional[int] = None
    finish_reason: Optional[str] = None


@dataclass
class SelectRecord:
    """A ``select``: the choices, their scores (normalized prompt logprobs, higher is better, as in
    SGLang's ``select``; NaN where a choice was not scored) and the index of the chosen one."""

    lane: str
    name: str
    choices: list[str]
    scores: list[float]
    chosen: int

    def relative_likelihoods(self) -> list[float]:
        """exp(score - best score) per choice, in [0, 1]: how likely each choice is relative to the
        best one under the model (1.0 for the best); 0.0 for unscored choices."""
        finite = [s for s in self.scores if math.isfinite(s)]
        if not finite:
            return [0.0] * len(self.scores)
        best = max(finite)
        return [math.exp(s - best) if math.isfinite(s) else 0.0 for s in self.scores]


@dataclass
class Tally:
    """Prompt and cached token totals (ints); ``hit_rate`` = cached / prompt, None when empty."""

    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Count one request's tokens."""
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens

    @property
    def hit_rate(self) -> Optional[float]:
        """Cached over prompt tokens; None before any prompt."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_dict(self) -> dict:
        """The counts and hit rate as a dict."""
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "hit_rate": self.hit_rate}


@dataclass
class RunModel:
    """Everything one run view shows; mutated only through ``RunView``'s event methods."""

    title: str = "lm"
    status: str = "running"  # loading | running | stopping | done | error | interrupted
    error: Optional[str] = None
    elapsed_s: float = 0.0
    lanes: dict[str, Lane] = field(default_factory=lambda: {"main": Lane("main", label="main")})
    requests: list[RequestRecord] = field(default_factory=list)
    selects: list[SelectRecord] = field(default_factory=list)
    structured: list[dict] = field(default_factory=list)  # see structured.check_structured
    cell: Tally = field(default_factory=Tally)
    cumulative: Tally = field(default_factory=Tally)
    # Tokens streamed into gens that were stopped (Ctrl-C, abort) before their request reported its
    # counts: no RequestRecord holds them, but they were generated. ``unfinished_gens``: how many
    # such gens, whose prompt counts are unknown (an OpenAI-compatible API reports usage only at
    # the stream's end).
    unfinished_tokens: int = 0
    unfinished_gens: int = 0

    # --- queries -------------------------------------------------------------------------------
    def lane(self, lane_id: str) -> Lane:
        """The lane ``lane_id``."""
        try:
            return self.lanes[lane_id]
        except KeyError:
            known = ", ".join(self.lanes)
            raise KeyError(
                f"unknown lane {lane_id!r} (known: {known}); open it first with on_fork(parent, [{lane_id!r}])"
            ) from None

    def full_chars(self, lane_id: str) -> int:
        """Length of the lane's whole text: the inherited prefix plus its own segments."""
        lane = self.lane(lane_id)
        return lane.prefix_chars + lane.own_chars

    def full_text(self, lane_id: str) -> str:
        """The lane's whole text (inherited prefix + own segments), as the program state holds it."""
        parts = []
        for lane, own_limit in self.ancestry(lane_id):
            parts.append("".join(s.text for s in lane.segments)[:own_limit])
        return "".join(parts)

    def ancestry(self, lane_id: str) -> list[tuple[Lane, int]]:
        """The lanes whose segments make up ``lane_id``'s whole text, root first, each with how many
        characters of its own text belong to it (a parent contributes only the text it had when the
        child forked)."""
        chain: list[tuple[Lane, int]] = []
        lane = self.lane(lane_id)
        limit = lane.own_chars
        while True:
            chain.append((lane, limit))
            if lane.parent is None:
                break
            parent = self.lane(lane.parent)
            limit = lane.prefix_chars - parent.prefix_chars
            lane = parent
        return chain[::-1]

    # --- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready data of the vendor mimetype (``kind: "run"``, ``version`` 2): lanes and their
        segments' text, requests, selects, structured checks and cache counts; a gen gives its
        text and ``n_tokens`` (tokens generated), not its per-token ids and logprobs. Those are in
        the ``text/html`` of the same bundle, one tooltip per token, which is what shows them: no
        view reads this data, and the per-token lists (version 1) made it as large as the HTML, a
        {fork 8} of 200 tokens a branch ~120 KB of a saved notebook."""

        def seg(s: Segment) -> dict:
            d = {"kind": s.kind, "text": s.text}
            for key in ("cache", "source", "name", "thumb"):
                if getattr(s, key) is not None:
                    d[key] = getattr(s, key)
            if s.kind == "gen":
                d["n_tokens"] = sum(t.n_tokens for t in s.tokens)
            if s.lanes:
                d["lanes"] = list(s.lanes)
            return d

        return {
            "kind": "run",
            "version": 2,
            "title": self.title,
            "status": self.status,
            "error": self.error,
            "elapsed_s": round(self.elapsed_s, 3),
            "lanes": [
                {"id": ln.id, "parent": ln.parent, "label": ln.label, "prefix_chars": ln.prefix_chars,
                 "joined_into": ln.joined_into, "segments": [seg(s) for s in ln.segments]}
                for ln in self.lanes.values()
            ],
            "requests": [asdict(r) for r in self.requests],
            "selects": [asdict(s) for s in self.selects],
            "structured": self.structured,
            "cache": {"cell": self.cell.to_dict(), "cumulative": self.cumulative.to_dict()},
        }


def classify_prefix(model: RunModel, lane_id: str, prompt_chars: int, cached_chars: int) -> set[str]:
    """Mark the first ``prompt_chars`` characters of ``lane_id``'s whole text: ``[0, cached_chars)``
    as cached and the rest as computed. Only program text that no earlier request classified is
    marked (the first request that prefilled a character decides how it got its KV); generated and
    selected text keep their own marking. Segments are split at the boundaries. Returns the ids of
    the lanes whose segments changed."""
    changed: set[str] = set()
    offset = 0  # whole-text offset where the current lane's own text starts
    for lane, own_limit in model.ancestry(lane_id):
        hi = min(prompt_chars, offset + own_limit)
        pos = offset
        new_segments: list[Segment] = []
        for s in lane.segments:
            s_start, s_end = pos, pos + len(s.text)
            pos = s_end
            if s.kind != "text" or s.cache is not None or s_start >= hi or not s.text:
                new_segments.append(s)
                continue
            cut1 = min(max(cached_chars, s_start), s_end)
            cut2 = min(max(hi, s_start), s_end)
            for a, b, cls in ((s_start, cut1, "cached"), (cut1, cut2, "computed"), (cut2, s_end, None)):
                if b > a:
                    new_segments.append(Segment("text", s.text[a - s_start:b - s_start], cls, s.source))
            changed.add(lane.id)
        lane.segments = new_segments
        offset += own_limit
    return changed
