"""A user's regex, read as Python's ``re`` reads it, spelled so the automaton library reads the same.

lmnb checks patterns with Python's parser (``regex_check``) and documents Python's syntax, but
outlines-core builds its automaton with the ``regex-automata`` crate, whose syntax differs. Python
spellings it refuses with a bare "error building NFA": ``a{,3}`` and ``a{,}`` (counts from 0), a
``{`` that Python reads as a literal (``{abc}``, ``a{x}``), octal escapes (``\\0``, ``\\040``,
``[\\1]``), ``\\N{NAME}`` and ``(?#comments)``. One it reads differently without a word: a ``[``
inside a class (``[a[]`` is ``a`` or ``[`` in Python, a nested class there). Python's own
"possible set operation" warnings (``[[:alpha:]]``, ``[a&&b]``, ``[a||b]``) mark spellings whose
meaning differs between the two (a POSIX class or a set operation there, literal characters in
Python); those are refused with the fix rather than guessed.
"""

from __future__ import annotations

import re
import unicodedata
import warnings

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.constrained.regex_check import _p

_COUNT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")  # what Python reads as a repeat count after an item
_NAMED = re.compile(r"N\{([^}]*)\}")
_OCTAL = "01234567"


def _char(code: int) -> str:
    """One character as an escape both Python and the automaton library read."""
    return f"\\U{code:08x}"


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """(the automaton's spelling, end index) of the escape at ``pattern[i] == '\\\\'``."""
    c = pattern[i + 1]
    if c in _OCTAL:
        j = i + 2
        while j < min(len(pattern), i + 4) and pattern[j] in _OCTAL:
            j += 1
        if in_class or c == "0" or j == i + 4:  # octal (else a group reference, refused by regex_check)
            return _char(int(pattern[i + 1:j], 8)), j
    named = _NAMED.match(pattern, i + 1)
    if named:
        return _char(ord(unicodedata.lookup(named.group(1)))), named.end()
    return pattern[i:i + 2], i + 2


def automaton_syntax(pattern: str) -> str:
    """``pattern`` (Python ``re`` syntax) rewritten into the automaton library's syntax with the
    same meaning; a pattern Python cannot parse is returned unchanged (the library may read it,
    e.g. ``\\p{L}``, or name its own error).

    Raises:
        GrammarError: a class whose meaning Python itself flags as ambiguous (``[[:alpha:]]``,
            ``[a&&b]``, ``[a--b]``, ``[a||b]``, ``[a~~b]``), with the fix.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", FutureWarning)
        try:
            parsed = _p.parse(pattern)
        except FutureWarning as w:
            raise GrammarError(
                f"regex {pattern!r}: {w} — Python reads it as literal characters, the automaton library as a "
                "POSIX class or a set operation; escape the character (e.g. '[\\[:alpha:]]' for the "
                "characters, '[A-Za-z]' for letters)") from None
        except (re.error, RecursionError, OverflowError):
            return pattern
    if parsed.state.flags & re.VERBOSE:  # (a '#' comment may hold any text: both syntaxes take it alike)
        return pattern
    out, i, n, in_class = [], 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            text, i = _escape(pattern, i, in_class)
            out.append(text)
            continue
        if in_class:
            out.append("\\[" if ch == "[" else ch)
            in_class = ch != "]"
            i += 1
            continue
        count = _COUNT.match(pattern, i) if ch == "{" else None
        if ch == "[":
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"  # a ']' first in the class is a literal, in both syntaxes
            out.append(pattern[i:j])
            i, in_class = j, True
        elif count and count.group(0) != "{}":
            lo, comma, hi = count.groups()
            out.append("{" + (lo or "0") + (comma or "") + (hi or "") + "}")
            i = count.end()
        elif ch == "{":
            out.append("\\{")
            i += 1
        elif pattern.startswith("(?#", i):  # a comment: Python ends it at the first ')'
            i = pattern.index(")", i) + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)
