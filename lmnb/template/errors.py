"""Errors of the ``%%lm`` cell language, each pointing at a line and column of the cell."""

from __future__ import annotations

import re
import unicodedata

import wcwidth  # (a dependency of IPython's prompt_toolkit)


def line_col(source: str, offset: int, first_line: int = 1, indent: str = "") -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``source``; ``first_line`` numbers line 1.

    ``indent`` is the indentation taken off each line of an indented cell (IPython drops what the
    lines of a cell share) before ``source`` was read: the column counts it, as the cell was typed.
    An empty line keeps column 1 (as typed it may have been shorter than ``indent``).
    """
    offset = max(0, min(offset, len(source)))
    line = source.count("\n", 0, offset)
    start = source.rfind("\n", 0, offset) + 1
    col = offset - start + 1
    if indent and source[start:start + 1] not in ("", "\n"):
        col += len(indent)
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


# A line longer than this is quoted around the error's column, QUOTED_AROUND characters on each
# side: a 1 MB prompt line was quoted whole (with a caret line as long), and a failed cell's saved
# error holds its message twice (Jupyter's evalue and traceback).
QUOTED_LINE_CHARS, QUOTED_AROUND = 240, 100

# Python's parser raises MemoryError or RecursionError, not SyntaxError, for code nested this deep.
TOO_DEEP = "this is too long or nested too deeply for Python's parser"
TOO_DEEP_HINT = "build the value in a Python cell and use the variable here"


def caret_padding(text: str) -> str:
    """What goes before a caret that points just past ``text`` (the start of a line): its tabs kept
    (a terminal or notebook expands them alike on both lines), and between them as many spaces as
    the text takes columns in a terminal, as the ``wcwidth`` package counts them: two for a wide
    (CJK, emoji) character or a cluster shown as one emoji (👩‍💻, 👍🏽, ❤️), none for a combining mark
    or a zero-width character (U+200B), one for any other. One space per character put the caret
    columns to the left of where it points on such lines. Control characters count none."""
    return "\t".join(" " * wcwidth.wcswidth("".join(c for c in part if unicodedata.category(c) != "Cc"))
                     for part in text.split("\t"))


# Curly quotes (as a word processor, a chat or a web page writes them) and the straight quote of
# each: a string pasted with them is no Python ("invalid character '“' (U+201C)").
CURLY_QUOTES = {"“": '"', "”": '"', "‘": "'", "’": "'"}


def straightened(code: str) -> str:
    """Python ``code`` with the curly quotes that open and close its strings made straight (“a” →
    "a", ‘a’ → 'a'), a straight quote inside such a string escaped (“say "hi"” → "say \\"hi\\""),
    curly quotes of the other kind inside it kept (“it’s” → "it’s"). Strings written with straight
    quotes and comments are left as they are ("it’s" stays); a curly-quoted string ends at its line."""
    out: list[str] = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "#" or c in "\"'":  # a comment, or a string written straight: as it stands
            end = code.find("\n", i) if c == "#" else _string_end(code, i)
            end = n if end < 0 else end
            out.append(code[i:end])
            i = end
        elif c in CURLY_QUOTES:
            quote, j = CURLY_QUOTES[c], i + 1
            out.append(quote)
            while j < n and code[j] != "\n" and CURLY_QUOTES.get(code[j]) != quote:
                step = 2 if code[j] == "\\" else 1  # (an escape: the next character cannot end it)
                out.append("\\" + quote if code[j] == quote else code[j:j + step])
                j += step
            if j < n and code[j] != "\n":  # (its closing quote)
                out.append(quote)
                j += 1
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _string_end(code: str, start: int) -> int:
    """The offset just past the straight-quoted string literal that starts at ``start`` (one that
    is never closed: its line's end, or the code's for a triple-quoted one)."""
    quote = code[start] * 3 if code.startswith(code[start] * 3, start) else code[start]
    i = start + len(quote)
    while i < len(code):
        if code[i] == "\\":
            i += 2
        elif code.startswith(quote, i):
            return i + len(quote)
        elif code[i] == "\n" and len(quote) == 1:
            return i
        else:
            i += 1
    return len(code)


CURLY_QUOTES_WORDS = "Python's strings take straight quotes (\" and '), not curly ones (“ ” ‘ ’)"


def curly_quotes_hint(code: str, fixed: str, parses) -> str | None:
    """The hint for Python ``code`` that failed to parse and holds curly quotes: ``fixed`` (the
    code as shown to the user, straightened) offered where ``parses(straightened(code))`` is true,
    else the words alone; None for code without curly quotes outside its straight-quoted strings."""
    straight = straightened(code)
    if straight == code:
        return None
    return f"{CURLY_QUOTES_WORDS}: {fixed}" if parses(straight) else CURLY_QUOTES_WORDS


class TemplateError(Exception):
    """A problem located in a cell: ``line``/``col`` (1-based) say where, ``message`` says what.

    ``str(err)`` is ``"line L, col C: message"`` followed by the offending source line with a caret
    under the column and, when there is one, a hint that says how to fix it.

    ``indent`` is the indentation taken off the lines of an indented cell before ``source`` was
    read (see ``line_col``): the column and the line shown are those of the cell as typed.
    """

    kind = "error"

    def __init__(self, message: str, source: str, offset: int, first_line: int = 1, hint: str | None = None,
                 indent: str = ""):
        self.message = message
        self.hint = hint
        self.offset = offset  # (into ``source``: a caller may say the error again with another hint)
        self.line, self.col = line_col(source, offset, first_line, indent)
        lines = source.split("\n")
        self.source_line = lines[self.line - first_line] if 0 <= self.line - first_line < len(lines) else ""
        if indent and self.source_line:  # (put back: the line as typed)
            self.source_line = indent + self.source_line
        super().__init__(self._render())

    def _render(self) -> str:
        out = f"line {self.line}, col {self.col}: {self.message}"
        line, at = self.source_line, self.col - 1
        if len(line) > QUOTED_LINE_CHARS:
            start, end = max(0, at - QUOTED_AROUND), at + QUOTED_AROUND
            if start:  # (the caret counts the "…" before the rest)
                line, at = "…" + line[start:], at - start + 1
            line = line[: at + QUOTED_AROUND] + ("…" if end < len(self.source_line) else "")
        if line.strip():
            out += f"\n    {line}\n    {caret_padding(line[:at])}^"
        if self.hint:
            out += f"\n  hint: {self.hint}"
        return out


class TemplateSyntaxError(TemplateError, ValueError):
    """The cell does not follow the grammar (docs/CELL_LANGUAGE.md); raised by ``parse``."""


class UnclosedError(TemplateSyntaxError):
    """A hole ``{...`` or a block (``{user}``, ``{fork ...}``) that the cell never closes: the cell
    may only be unfinished (the kernel's is_complete tells a console to read another line)."""


class TemplateRuntimeError(TemplateError, RuntimeError):
    """An expression in a hole failed while the program ran (the cause is chained as ``__cause__``)."""
