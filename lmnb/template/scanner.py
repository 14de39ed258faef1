"""Split cell text into literal text and ``{...}`` holes.

Follows Python's ``str.format`` conventions for braces: ``{{`` and ``}}`` are literal braces, a lone
``}`` is an error. Inside a hole the text is Python, so quotes open string literals (whose braces do
not count) and brackets nest: ``{gen n regex=r"\\d{3}"}`` is one hole. So do curly quotes (“}”, closed
on their line), which Python refuses: the parser then offers the hole with straight ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from lmnb.template.errors import CURLY_QUOTES, CURLY_QUOTES_WORDS, TemplateSyntaxError, UnclosedError, line_col

_OPEN = "([{"
_CLOSE = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class Piece:
    """A run of raw text (``kind="text"``) or a hole (``kind="hole"``) at ``source[start:end]``.

    For a hole, ``start`` is the ``{`` and ``end`` is one past the closing ``}``.
    """

    kind: str
    start: int
    end: int


def scan(source: str, first_line: int = 1, indent: str = "") -> list[Piece]:
    """Pieces covering ``source`` in order. Raises ``TemplateSyntaxError`` for lone or unclosed braces
    (``first_line`` and ``indent`` place it in the cell as typed: see ``errors.line_col``)."""
    pieces: list[Piece] = []
    i = text_start = 0
    n = len(source)
    while i < n:
        c = source[i]
        if c == "{":
            if source.startswith("{{", i):
                i += 2
                continue
            end = hole_end(source, i, first_line, indent)
            if text_start < i:
                pieces.append(Piece("text", text_start, i))
            pieces.append(Piece("hole", i, end))
            i = text_start = end
        elif c == "}":
            if source.startswith("}}", i):
                i += 2
                continue
            raise TemplateSyntaxError(
                "single '}' outside a hole", source, i, first_line, indent=indent, hint="write '}}' for a literal '}'"
            )
        else:
            i += 1
    if text_start < n:
        pieces.append(Piece("text", text_start, n))
    return pieces


def decode_text(raw: str) -> str:
    """Literal text of a raw text run: ``{{`` → ``{`` and ``}}`` → ``}``."""
    return raw.replace("{{", "{").replace("}}", "}")


def hole_end(source: str, start: int, first_line: int = 1, indent: str = "") -> int:
    """Index one past the ``}`` that closes the hole opened at ``source[start] == "{"``."""
    stack: list[tuple[str, int]] = []
    # (a string pasted with curly quotes, which the parser refuses with the hole written straight:
    # its braces are the string's, as a straight-quoted string's are: {gen x stop=“}”} is one hole)
    for j, c in code_chars(source, start + 1, first_line, indent):
        if c in _OPEN:
            stack.append((c, j))
        elif c in _CLOSE:
            if not stack:
                if c == "}":
                    return j + 1
                raise TemplateSyntaxError(f"unmatched '{c}' in hole", source, j, first_line, indent=indent)
            opener, at = stack.pop()
            if opener != _CLOSE[c]:
                raise TemplateSyntaxError(
                    f"'{c}' does not match '{opener}' opened at col {line_col(source, at, 1, indent)[1]}",
                    source, j, first_line, indent=indent,
                )
    curly = _open_curly_quote(source, start + 1)
    if curly is not None:  # (as "a: a string left open, which more lines cannot close, not an open hole)
        raise TemplateSyntaxError("unterminated string literal in hole", source, curly, first_line, indent=indent,
                                  hint=CURLY_QUOTES_WORDS)
    raise UnclosedError(
        "'{' opens a hole that is never closed", source, start, first_line, indent=indent,
        hint="close the hole with '}', or write '{{' for a literal '{'",
    )


def code_chars(text: str, start: int = 0, first_line: int = 1, indent: str = "",
               curly: bool = True) -> Iterator[tuple[int, str]]:
    """Yield ``(index, char)`` for the characters of Python ``text`` from ``start`` on that are
    outside its string literals: straight-quoted ones (``string_end``) and, with ``curly``,
    curly-quoted ones closed on their line (``_curly_end``); a curly quote that no quote of its
    kind closes is yielded. The one walk of hole text that ``hole_end``, ``top_level``, and
    lmnb_kernel's completion share.

    Raises ``TemplateSyntaxError`` (``UnclosedError`` for a triple-quoted one) where a
    straight-quoted string is never closed, placed as ``string_end`` places it."""
    j = start
    while j < len(text):
        c = text[j]
        if c in "'\"":
            j = string_end(text, j, first_line, indent)
            continue
        end = _curly_end(text, j) if curly and c in CURLY_QUOTES else None
        if end is not None:
            j = end
            continue
        yield j, c
        j += 1


def _open_curly_quote(source: str, start: int) -> int | None:
    """The offset of the first curly quote in ``source`` from ``start`` on, outside straight-quoted
    strings, that no curly quote of its kind closes on its line (``_curly_end``); None where there
    is none, or a straight-quoted string is left open first."""
    try:
        return next((j for j, c in code_chars(source, start) if c in CURLY_QUOTES), None)
    except TemplateSyntaxError:
        return None


def _curly_end(source: str, start: int) -> int | None:
    """Index one past the curly quote that closes the string a curly quote opens at ``start``: the
    next of its kind (“ or ” for “, ‘ or ’ for ‘) on its line, a backslash escaping the character
    after it, as ``errors.straightened`` reads such a string; None where its line has none."""
    kind = CURLY_QUOTES[source[start]]
    j = start + 1
    while j < len(source) and source[j] != "\n":
        if source[j] == "\\":
            j += 2
            continue
        if CURLY_QUOTES.get(source[j]) == kind:
            return j + 1
        j += 1
    return None


def string_end(source: str, start: int, first_line: int = 1, indent: str = "") -> int:
    """Index one past the Python string literal whose opening quote is at ``start``.

    A backslash always skips the next character (true for raw strings too, as far as finding the
    end goes: ``r"\\""`` is one literal). Raises ``UnclosedError`` for a triple-quoted string that
    the source ends in, ``TemplateSyntaxError`` for another unterminated one.
    """
    quote = source[start]
    triple = source.startswith(quote * 3, start)
    delim = quote * 3 if triple else quote
    j = start + len(delim)
    while j < len(source):
        c = source[j]
        if c == "\\":
            j += 2
            continue
        if source.startswith(delim, j):
            return j + len(delim)
        if c == "\n" and not triple:
            break
        j += 1
    if triple:  # (the cell may go on: a console reads another line, as Python's for an open ''')
        raise UnclosedError("unterminated triple-quoted string literal in hole", source, start, first_line,
                            indent=indent, hint=f"close the string with {delim}")
    raise TemplateSyntaxError("unterminated string literal in hole", source, start, first_line, indent=indent)


def top_level(text: str):
    """Yield ``(index, char)`` for characters of Python ``text`` outside strings and brackets.

    A string written with curly quotes (“a=b”, which Python refuses) counts as a string too, so
    that what it holds is not read as the cell's syntax (an option b=) but told where it starts."""
    depth = 0
    try:
        for j, c in code_chars(text):
            if c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth -= 1
            elif depth == 0:
                yield j, c
    except TemplateSyntaxError:  # (an unterminated string: nothing after it is top-level text)
        return
