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

