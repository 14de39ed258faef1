"""Thumbnails of a run's ``image()``/``video()`` inputs, and their radix-cache status.

A thumbnail is a PNG data URL at most ``THUMB_PX`` pixels on its longer side, small enough to sit
inline in the run view and in a saved notebook (a few KB). JupyterLab's sanitizer keeps
``<img src="data:...">``: ``img`` with ``src``/``alt``/``width``/``height`` is on its allowlist and
``src`` is exempt from its URL-scheme check (``packages/apputils/src/sanitizer.ts``,
``allowedSchemesAppliedToAttributes``; jupyterlab#5183).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any, Optional

THUMB_PX = 96


@dataclass(frozen=True)
class Thumbnail:
    """``url``: ``data:image/png;base64,...``; ``width``/``height``: its size in pixels (≤ ``THUMB_PX``)."""

    url: str
    width: int
    height: int


def thumbnail(media: Any) -> Optional[Thumbnail]:
    """The thumbnail of an ``lmnb.ir.Image`` (its picture) or ``lmnb.ir.Video`` (the middle one of
    the frames the model gets), read with the engine's own readers (``lmnb_engine.multimodal``), so
    the limits and formats are the model's. None when the input cannot be read: the program's own
    request reports that error, and the view must not fail first."""
    from lmnb.backend.media import frames
    from lmnb_engine.multimodal import ImageInputError, load_image

    try:
        if hasattr(media, "num_frames"):  # the program's sampled frames, decoded once for both
            sampled = frames(media)
            image = sampled[len(sampled) // 2]
        else:
            image = load_image(media.source).image
        small = image.convert("RGB")
        small.thumbnail((THUMB_PX, THUMB_PX))  # keeps the aspect ratio, never enlarges
        buf = io.BytesIO()
        small.save(buf, format="PNG")
    except (ImageInputError, OSError, ValueError):
        return None
    return Thumbnail("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
                     small.width, small.height)


def cache_class(entry: dict) -> str:
    """``"cached"`` / ``"computed"`` / ``"partial"`` for one entry of a request's ``meta["images"]``
    (``lmnb.backend.engine.media_cache``): all, none or some of the input's tokens had their KV in
    the radix cache."""
    tokens, cached = int(entry["tokens"]), int(entry["cached_tokens"])
    if cached >= tokens > 0:
        return "cached"
    return "partial" if cached > 0 else "computed"


def _media_segments(model, lane_id: str) -> list:
    """(lane id, segment) of ``lane_id``'s whole text (``RunModel.ancestry``: inherited ones first)."""
    segments = []
    for lane, own_limit in model.ancestry(lane_id):
        pos = 0
        for s in lane.segments:
            if pos >= own_limit:
                break
            segments.append((lane.id, s))
            pos += len(s.text)
    return segments


def mark_sent(model, lane_id: str) -> set:
    """Mark the media segments of ``lane_id``'s whole text that no request classified yet as
    ``"sent"``: a request of the lane went out with them, but its backend reported no per-image
    cache (``meta["images"]``). Returns the ids of the lanes whose segments changed."""
    changed = set()
    for lid, seg in _media_segments(model, lane_id):
        if seg.kind == "media" and seg.cache is None:
            seg.cache = "sent"
            changed.add(lid)
    return changed


def classify_media(model, lane_id: str, entries: list) -> set:
    """Mark the media segments of ``lane_id``'s whole text (``RunModel.ancestry``: inherited ones
    first) with one request's ``meta["images"]`` ``entries``, which list that request's inputs in
    prompt order. Placeholders inside other text (images a ``{join concat}`` brought back from
    branches) take their entries too, so the rest stay aligned. As with prompt text
    (``classify_prefix``), the first request that sent an input decides; later ones leave it alone.
    Returns the ids of the lanes whose segments changed."""
    segments = _media_segments(model, lane_id)
    tokens = {s.text for _, s in segments if s.kind == "media" and s.text}
    changed, i = set(), 0
    for lid, seg in segments:
        if i >= len(entries):
            break
        if seg.kind != "media":
            i += sum(seg.text.count(t) for t in tokens)
            continue
        if seg.cache is None:
            seg.cache = cache_class(entries[i])
            seg.thumb = {**(seg.thumb or {}), "tokens": int(entries[i]["tokens"]),
                         "cached_tokens": int(entries[i]["cached_tokens"])}
            changed.add(lid)
        i += 1
    return changed
