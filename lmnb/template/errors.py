"""Errors of the ``%%lm`` cell language, each pointing at a line and column of the cell."""

from __future__ import annotations

import re


def line_col(source: str, offset: int, first_line: int = 1) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``source``; ``first_line`` numbers line 1."""
    offset = max(0, min(offset, len(source)))
    line = source.count("\n", 0, offset)
    col = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return line + first_line, col


def offset_of(source: str, line: int, col: int) -> int:
    """Character offset in ``source`` of 1-based ``line``, 0-based character ``col`` (the inverse
    of ``line_col`` with ``first_line=1``)."""
    lines = source.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + col


def node_offset(source: str, node) -> int:
    """Character offset in ``source`` of an ``ast`` node (ast columns count UTF-8 bytes)."""
    line = source.split("\n")[node.lineno - 1]
    return offset_of(source, node.lineno, len(line.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")))


# Half of a UTF-16 pair: JSON can escape one ("\ud800"), so a notebook's text can hold it, but it
# is no character, and Python's parser (which reads UTF-8) fails on it with UnicodeEncodeError.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_problem(char: str) -> str:
    """What is wrong with code that holds the lone surrogate ``char``, and the fix."""
    return (f"the lone surrogate {char!r} is half of a UTF-16 pair and no character, so Python cannot run "
            "code that holds it; delete it, or write the character it was part of")


# Python's parser raises MemoryError or RecursionError, not SyntaxError, for code nested this deep.
TOO_DEEP = "this is too long or nested too deeply for Python's parser"
TOO_DEEP_HINT = "build the value in a Python cell and use the variable here"


class TemplateError(Exception):
    """A problem located in a cell: ``line``/``col`` (1-based) say where, ``message`` says what.

    ``str(err)`` is ``"line L, col C: message"`` followed by the offending source line with a caret
    under the column and, when there is one, a hint that says how to fix it.
    """

    kind = "error"

    def __init__(self, message: str, source: str, offset: int, first_line: int = 1, hint: str | None = None):
        self.message = message
        self.hint = hint
        self.line, self.col = line_col(source, offset, first_line)
        lines = source.split("\n")
        self.source_line = lines[self.line - first_line] if 0 <= self.line - first_line < len(lines) else ""
        super().__init__(self._render())

    def _render(self) -> str:
        out = f"line {self.line}, col {self.col}: {self.message}"
        if self.source_line.strip():
            out += f"\n    {self.source_line}\n    {' ' * (self.col - 1)}^"
        if self.hint:
            out += f"\n  hint: {self.hint}"
        return out


class TemplateSyntaxError(TemplateError, ValueError):
    """The cell does not follow the grammar (docs/CELL_LANGUAGE.md); raised by ``parse``."""


class TemplateRuntimeError(TemplateError, RuntimeError):
    """An expression in a hole failed while the program ran (the cause is chained as ``__cause__``)."""
