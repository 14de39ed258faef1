"""IPython input transform for a ``%%lm`` cell (or ``%%time`` / ``%%capture`` over one) with
comments above its magic line.

IPython finds a cell magic only on a cell's first line (after blank lines). Below a ``# comment``
it reads ``%%lm OPTIONS`` as the line magic ``%lm`` and the prompt as Python, and shows the
parser's "invalid syntax. Perhaps you forgot a comma?" for the prompt's text. This transform
names the real problem instead, as ``lmnb export`` does for the same cell.
"""

from __future__ import annotations

from IPython.core.error import UsageError

from lmnb.export.cells import LATE_CELL_MAGIC


def refuse_cell_magic_below_comments(lines: list[str]) -> list[str]:
    """IPython cleanup transform (``shell.input_transformers_cleanup``): ``lines`` unchanged,
    unless only comment and blank lines stand above a cell magic line (``%%lm``; also ``%%time``
    over a ``%%lm`` line, whose prompt IPython read as Python as well).

    Only that case is caught: with code above, a ``%%lm`` line could be text inside a string.
    IPython has already taken off leading blank lines and shared indentation.

    Raises:
        UsageError: a cell magic line below comments (IPython shows its one-line message).
    """
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if text.startswith("#") or not text:
            continue
        if number > 1 and text.startswith("%%"):
            magic = text.split()[0]
            # (no line number: IPython has dropped the cell's leading blank lines from ``lines``)
            raise UsageError(f"{magic} below a comment: {LATE_CELL_MAGIC}; a comment above the {magic} line "
                             "makes IPython read the cell as Python")
        return lines
    return lines


# IPython's completeness check (a console's Enter) runs cleanup transforms unless they say this;
# it expects only SyntaxError from them.
refuse_cell_magic_below_comments.has_side_effects = True
