"""Small static outputs of the magics: tables (``%lm stats``, ``%lm states``) and a cell's summary.

Each is a mimebundle of sanitizer-safe ``text/html`` (inline styles only) and ``text/plain``.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

_TABLE = 'style="border-collapse:collapse;font-size:12px;font-family:monospace"'
_CELL = 'style="border:1px solid #d0d7de;padding:2px 8px;text-align:left"'


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict:
    """A titled table as ``{"text/html", "text/plain"}``; cells are shown with ``str``."""
    cells = [[str(c) for c in row] for row in rows]
    head = "".join(f"<th {_CELL}>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td {_CELL}>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    page = (f'<div class="lmnb-table"><div style="font-weight:bold;margin:2px 0">{html.escape(title)}</div>'
            f"<table {_TABLE}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return {"text/html": page, "text/plain": "\n".join(line.rstrip() for line in lines)}


def cell_label(number: int) -> str:
    """How a cell is named where lmnb shows it (a run view's title, a badge in ``%lm tree``, the
    cells of ``%lm states``): "cell [N]", N of its In [N] as Jupyter numbers it."""
    return f"cell [{number}]"


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters with an ellipsis."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def percent(part: int, whole: int) -> str:
    """``part`` as a whole-number percentage of ``whole``; ``n/a`` when ``whole`` is 0."""
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def cell_summary(captured: dict, tokens: dict, state: str | None = None, note: str | None = None) -> dict:
    """The summary under a cell's view: the variables it put in the kernel, its token counts and
    ``note``, a line on what a re-run did with the state (``--state`` cells).

    ``tokens``: prompt_tokens, cached_tokens, completion_tokens (ints) of the cell's requests;
    ``unreported_prompts``: how many gens were stopped before their prompt counts came (the
    prompt and cached counts are then shown as unknown, or as a lower bound).
    """
    p, c, g = tokens["prompt_tokens"], tokens["cached_tokens"], tokens["completion_tokens"]
    count = f"tokens: prompt {p}, cached {c} ({percent(c, p)} hit), completion {g}"
    if tokens.get("unreported_prompts"):
        def plus_unknown(n: int) -> str:
            return f"{n} + unknown" if p else "unknown"

        count = (f"tokens: prompt {plus_unknown(p)}, cached {plus_unknown(c)} (a gen was stopped before the "
                 f"backend reported its prompt), completion {g}")
    if state:
        count += f" · state {state!r}"
    plain = [f"{name} = {short(value)}" for name, value in captured.items()] + [count] + ([note] if note else [])
    rows = "".join(
        f"<tr><td {_CELL}><b>{html.escape(name)}</b></td><td {_CELL}>{html.escape(short(value))}</td></tr>"
        for name, value in captured.items()
    )
    page = '<div class="lmnb-summary" style="font-size:12px;font-family:monospace">'
    if rows:
        page += f"<table {_TABLE}>{rows}</table>"
    page += f'<div style="color:#57606a;margin-top:2px">{html.escape(count)}</div>'
    if note:
        page += f'<div style="color:#57606a">{html.escape(note)}</div>'
    page += "</div>"
    return {"text/html": page, "text/plain": "\n".join(plain)}
