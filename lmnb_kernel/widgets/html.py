"""Sanitizer-safe HTML building blocks shared by the run view and the tree view.

Everything here must survive JupyterLab's HTML sanitizer (``packages/apputils/src/sanitizer.ts``,
used for untrusted notebooks) and GitHub's: no ``<script>``/``<style>`` elements, no event
handlers, no ``data-*`` in static output, and inline ``style`` attributes whose properties and
values the sanitizer accepts (hex colours, px/% lengths, no ``var()``/``calc()``/``gap``/``flex``).
Classes (``lmnb-*``) carry the meaning so the markup stays readable with every style stripped, and
so tests and the live widget can find the parts.
"""

from __future__ import annotations

import html
import math
from typing import Optional

from lmnb_engine.byte_size import byte_size

# Colours (hex only: the sanitizer's colour grammar has no hsl()/var()).
CACHED_BG = "#c8ecd0"  # radix-cache hit: KV reused
COMPUTED_BG = "#ffe1bd"  # prefilled by this cell
GEN_BG = "#e7efff"
GEN_LINE = "#1f6feb"
SELECT_BG = "#f1e6ff"
SELECT_LINE = "#8250df"
MUTED = "#57606a"
OK = "#1a7f37"
BAD = "#cf222e"
LANE_COLORS = ("#1f6feb", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#0a7b83", "#cf222e", "#57606a")

TEXT = "#1f2328"
BG = "#ffffff"
ROOT_STYLE = ("border:1px solid #d0d7de;border-radius:6px;padding:6px 8px;margin:2px 0;"
              f"background-color:{BG};color:{TEXT};font-size:13px;font-family:sans-serif")
# JupyterLab's rendered-HTML CSS gives every <table> the theme's text colour and every <tr> the
# theme's row background (light grey text, near-black rows in JupyterLab Dark) instead of inheriting
# the root's: on the view's light background that text was unreadable, so tables and rows set both.
TABLE_COLORS = f"color:{TEXT}"
ROW_COLORS = f"background-color:{BG}"
MONO = "font-family:monospace;font-size:12px;line-height:1.5"
BODY_STYLE = f"white-space:pre-wrap;word-wrap:break-word;{MONO}"


def esc(text: object) -> str:
    """HTML-escape text for element content and for attribute values, which are always written in
    double quotes here: ``&``, ``<``, ``>`` and ``"``. Not ``'`` (``html.escape`` writes ``&#x27;``):
    a token's tooltip quotes its text as Python's repr does, ``'…'``, and those two escapes were an
    eighth of a run view's saved HTML (16 of 125 KB in a {fork 8} of 200 tokens a branch)."""
    return html.escape(str(text), quote=False).replace('"', "&quot;")


def tag(name: str, content: str = "", *, cls: str = "", style: str = "", title: Optional[str] = None,
        key: Optional[str] = None, extra: str = "") -> str:
    """``<name class=… style=… title=…>content</name>``; ``content`` must already be escaped.
    ``key`` adds ``data-k`` (live widget only: the sanitizer drops ``data-*``, static output omits it)."""
    attrs = ""
    if cls:
        attrs += f' class="{esc(cls)}"'
    if style:
        attrs += f' style="{esc(style)}"'
    if title is not None:
        attrs += f' title="{esc(title)}"'
    if key is not None:
        attrs += f' data-k="{esc(key)}"'
    if extra:
        attrs += " " + extra
    return f"<{name}{attrs}>{content}</{name}>"


def pct(x: Optional[float]) -> str:
    """A ratio in [0, 1] as ``"87.5%"``, or ``"–"`` for None."""
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def bar(fraction: Optional[float], *, width_px: int = 120, fg: str = OK, bg: str = "#eaeef2",
        cls: str = "lmnb-bar", title: Optional[str] = None) -> str:
    """A horizontal bar filled to ``fraction`` (0..1), made of two nested divs."""
    f = 0.0 if fraction is None or not math.isfinite(fraction) else min(max(fraction, 0.0), 1.0)
    inner = tag("div", "", style=f"width:{100 * f:.1f}%;height:8px;background-color:{fg}")
    return tag("div", inner, cls=cls, title=title,
               style=f"display:inline-block;width:{width_px}px;height:8px;background-color:{bg};"
                     "vertical-align:middle;margin:0 4px")


def badge(text: str, *, color: str = MUTED, cls: str = "lmnb-badge", title: Optional[str] = None) -> str:
    """A small bordered label (HTML). An inline block, so that badges wrapped onto two lines of a
    narrow fork lane stack instead of their borders overlapping."""
    return tag("span", esc(text), cls=cls, title=title,
               style=f"border:1px solid {color};color:{color};border-radius:8px;padding:0 5px;"
                     "font-size:11px;margin:1px 2px;white-space:nowrap;display:inline-block")


def human_bytes(n: Optional[float]) -> str:
    """``1536 -> "1.5 KiB"`` (``byte_size``, as the engine's messages say sizes); None -> ``"–"``."""
    return "–" if n is None else byte_size(n)


def swatch(label: str, style: str) -> str:
    """A legend entry: ``label`` in ``style``."""
    return tag("span", esc(label), style=f"{style};padding:0 4px;margin-right:6px;{MONO}")


def legend() -> str:
    """The colour key shown under every run view."""
    return tag("div", "".join([
        swatch("cached prompt (radix cache hit)", f"background-color:{CACHED_BG}"),
        swatch("computed prompt (prefill)", f"background-color:{COMPUTED_BG}"),
        swatch("generated", f"background-color:{GEN_BG};border-bottom:2px solid {GEN_LINE}"),
        swatch("selected", f"background-color:{SELECT_BG};border-bottom:2px solid {SELECT_LINE}"),
    ]), cls="lmnb-legend", style=f"color:{MUTED};font-size:11px;margin-top:4px")
