"""``CellError``: a problem in a ``%%lm`` / ``%lm`` cell, shown as one clear message, no traceback."""

from __future__ import annotations


class CellError(Exception):
    """What went wrong in the cell and how to fix it; IPython shows only ``CellError: message``.

    The internals of the magic are not the user's concern, so the extension registers
    ``show_cell_error`` as IPython's handler for this type (``shell.set_custom_exc``). The
    original exception, if any, is kept as ``__cause__``.
    """


def show_cell_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler: print ``CellError: message`` on stderr without frames."""
    stb = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb
