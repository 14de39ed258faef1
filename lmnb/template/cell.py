"""From a notebook cell to the text the parser reads — the same for the magic and the exporter."""

from __future__ import annotations


def cell_body(body: str) -> str:
    """The prompt of a ``%%lm`` cell body: without its final line break.

    IPython hands a cell magic its body with a line break appended when the cell does not end
    with one, so the last line break of a cell is never part of the prompt (write an empty line
    for a prompt that ends with one). Applying this to the raw notebook source gives the same text.
    """
    body = body.replace("\r\n", "\n")
    return body[:-1] if body.endswith("\n") else body


def split_cell(source: str) -> tuple[str, str] | None:
    """``(options line, prompt)`` of a notebook cell's source that starts with ``%%lm``, else None.

    The options line is what follows ``%%lm`` on the first line (parse it with
    ``lmnb.template.cell_options.parse_cell_line``); the prompt is ``cell_body`` of the rest.
    """
    first, _, body = source.replace("\r\n", "\n").partition("\n")
    if first.split(None, 1)[:1] != ["%%lm"]:
        return None
    return first[len("%%lm"):].strip(), cell_body(body)
