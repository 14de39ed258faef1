"""A set of characters written as a character class that Python's ``re`` and the automaton library
(Rust's regex) read alike, for the fixes that offer a class as its characters.

``POSIX`` holds the POSIX classes' ASCII characters (the "C" locale's); ``class_members`` reads a
class with nested classes or set operations as the ``regex`` package's version 1 (Rust's reading)
and writes its characters as a few ranges (``class_of_runs``, at most ``MAX_MEMBER_RANGES``), or
negated, checked under ``(?i)`` where that may hold (``_caseless_alike``, asked of the automaton
library); ``rewritten`` puts such classes back into the pattern where a check takes the result.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from lmnb_engine.json_schema import code_point_runs, without_surrogates


# The POSIX classes a user most likely meant by "[[:name:]]", as the characters the automaton
# library (Rust's regex) reads them as, ASCII only (the POSIX "C" locale's), spelled so that
# Python's re and that library read them alike.
POSIX = {"alpha": "A-Za-z", "digit": "0-9", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
          "space": "\\t\\n\\v\\f\\r ", "xdigit": "0-9A-Fa-f", "punct": "!-/:-@\\[-`{-~", "word": "0-9A-Za-z_",
          "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f", "graph": "!-~", "print": " -~"}


def rewritten(pattern: str, rewrites: list[tuple[int, int, str]], names: list[str],
               takes: Callable[[str], bool]) -> tuple[str, str] | None:
    """(``pattern`` with each ``(start, end, text)`` of ``rewrites``, in order and apart, in place of
    ``pattern[start:end]``; ``names``, once each, joined by ", ") where ``takes`` that pattern, the
    end of each class rewrite offered here; None where nothing was rewritten or it does not."""
    out, done = [], 0
    for start, end, text in rewrites:
        out += [pattern[done:start], text]
        done = end
    fixed = "".join(out) + pattern[done:]
    if not rewrites or not takes(fixed):
        return None
    return fixed, ", ".join(dict.fromkeys(names))


# An inline flag group that may turn on case-insensitive matching ("(?i)", "(?ai:"), erring towards yes
CASELESS = re.compile(r"\(\?\^?[a-zA-Z]*i")


def outside_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The code points outside ``runs`` (``[lo, hi)`` pairs, in order), as runs alike: the negated
    spelling of a class whose characters are ``runs``."""
    return [(lo, hi) for lo, hi in zip([0] + [e for _, e in runs], [s for s, _ in runs] + [0x110000]) if lo < hi]


# A class is offered as its characters when it makes at most this many ranges.
MAX_MEMBER_RANGES = 8

# A set operator that opens a class or follows another or ends a class (erring towards yes: an escaped
# "[" before one too): the regex package and Rust read such a class apart
_EMPTY_OPERAND = re.compile(r"\[\^?(?:&&|--|~~)|(?:&&|--|~~)(?:&&|--|~~|\])")


def class_members(cls: str, ascii_only: bool = False, caseless: str | None = None) -> str | None:
    """The class ``cls`` (with nested classes and set operations: ``[[A-Za-z]&&a]``) as a class of
    the characters the ``regex`` package's version 1 reads it to hold, which is Rust's reading of
    such a class: ranges of them (``[a]``), or a negated class of the rest where that is shorter
    (``[^A-Za-z]``); None where that package cannot read it or it takes more than
    ``MAX_MEMBER_RANGES`` ranges, or where a set operation has an empty operand (``[a&&]``,
    ``[&&a]``, ``[a--&&b]``, ``[--a]``), which Rust reads as an empty set and the package otherwise.
    Surrogates, which no text holds, are left out of the ranges. ``ascii_only``: only a class of
    ASCII characters, or a negated one of ASCII characters (every other character held), is
    written, so that no Unicode table, where the package's and Rust's may differ (``\\w``, ``\\d``:
    ``[\\w--\\d]`` holds ``é``), decides what the class holds. None too for a class of no character
    (``[[:alpha:]&&[:digit:]]``), which no class offered can stand for. ``caseless``: the class as
    the pattern writes it, where ``(?i)`` may hold there; then only a form that the engine reads
    under ``(?i)`` as the library reads that class is written (``_caseless_alike``): the library
    adds each item's case pairs before negating it, so that the complement of a class may hold
    other characters (``(?i)[[^B]b-e]`` holds every character, ``(?i)[^B]`` neither case of b)."""
    if _EMPTY_OPERAND.search(cls):
        return None
    inside = code_point_runs(cls, "(?V1)")
    if not inside:  # (no character: a negated class of every one, which the automaton library refuses)
        return None
    outside = outside_runs(inside)
    forms = [class_of_runs(spans, negation) for spans, negation in ((inside, ""), (outside, "^"))
             if not ascii_only or all(hi <= 0x80 for _, hi in spans)]
    forms = [form for form in forms if form is not None and (caseless is None or _caseless_alike(caseless, form))]
    return min(forms, key=len) if forms else None


@functools.cache
def _cased_vocabulary():
    """An outlines-core vocabulary of one token per character that has another case (as Python's
    ``str.lower``, ``str.upper`` and ``str.casefold`` tell, a few thousand) and per ASCII character,
    with the characters in id order; built once, when an ambiguous class is met where (?i) may hold."""
    from outlines_core import Vocabulary  # (torch-free)

    # (planes 0 and 1 hold every character with case; the last, U+1E943, is Adlam's)
    chars = [chr(c) for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF
             and (c < 0x80 or chr(c).lower() != chr(c) or chr(c).upper() != chr(c) or chr(c).casefold() != chr(c))]
    return Vocabulary(len(chars), {ch.encode(): [i] for i, ch in enumerate(chars)}), chars


@functools.lru_cache(maxsize=256)
def _caseless_alike(cls: str, form: str) -> bool:
    """Whether the engine reads the class ``form`` under ``(?i)`` (``automaton_syntax``, as it reads
    a pattern ``gen()`` takes) to hold the characters the automaton library reads the class ``cls``
    under ``(?i)`` to hold: asked of that library, of every character with another case (only
    those can fold; every other one the two hold alike, or not, by how ``form`` was worked out)."""
    from outlines_core import Index

    from lmnb_engine.constrained.regex_syntax import automaton_syntax  # (torch-free; it imports this module)

    vocabulary, chars = _cased_vocabulary()

    def held(pattern: str) -> set[str]:
        try:
            index = Index(pattern, vocabulary)
        except ValueError:  # (no character leads on: an empty class)
            return set()
        start = index.get_initial_state()
        return {ch for i, ch in enumerate(chars) if (state := index.get_next_state(start, i)) is not None
                and index.is_final_state(state)}

    return held(f"(?i){cls}") == held(automaton_syntax(f"(?i){form}"))


def class_of_runs(spans: list[tuple[int, int]], negation: str) -> str | None:
    """A class of the code points in ``spans`` (``[lo, hi)`` pairs), cut around the surrogates,
    each written as both Python's ``re`` and Rust's regex read it; None beyond ``MAX_MEMBER_RANGES``
    ranges or for no code point."""
    cut = without_surrogates(spans)
    if not cut or len(cut) > MAX_MEMBER_RANGES:
        return None
    items = (_spelled(lo) if lo == hi else f"{_spelled(lo)}-{_spelled(hi)}" for lo, hi in cut)
    return f"[{negation}" + "".join(items) + "]"


def _spelled(code: int) -> str:
    """One character in a class: an ASCII letter or digit as itself, other printable ASCII escaped
    where a class would read it otherwise, the rest as a ``\\x``, ``\\u`` or ``\\U`` escape."""
    ch = chr(code)
    if ch.isascii() and ch.isalnum():
        return ch
    if 0x20 < code < 0x7F:
        return "\\" + ch if ch in "\\]^-[&~|" else ch
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


POSIX_CLASS = re.compile(r"\[:(\^?\w+):\]")
