"""``CellError``: a problem in a ``%%lm`` / ``%lm`` cell, shown as one clear message, no traceback."""

from __future__ import annotations


class CellError(Exception):
    """What went wrong in the cell and how to fix it; IPython shows only ``CellError: message``.

    The internals of the magic are not the user's concern, so the extension registers
    ``show_cell_error`` as IPython's handler for this type (``shell.set_custom_exc``). The
    original exception, if any, is kept as ``__cause__``.
    """


def cell_interrupt(message: str) -> KeyboardInterrupt:
    """A ``KeyboardInterrupt`` for a stopped ``%%lm`` cell that IPython shows as one line,
    ``KeyboardInterrupt: message``, through its ``_render_traceback_`` hook: the frames would be
    the magic's and its live view's, wherever the interrupt happened to land. Its type stays
    ``KeyboardInterrupt``, the name the kernel reports and a Run-All stops on."""
    interrupt = KeyboardInterrupt(message)
    interrupt._render_traceback_ = lambda: [f"\x1b[0;31mKeyboardInterrupt\x1b[0m: {message}"]
    return interrupt


def show_cell_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler: print ``CellError: message`` on stderr without frames."""
    stb = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb
