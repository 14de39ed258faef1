"""A regular expression's text as Python's parser delimits it, for the checks that read a pattern as
written rather than as parsed.

``pattern_parts`` walks a pattern in order as its classes (with their items), comments, escapes,
group openings and closings, with the inline flags in force at each (``GLOBAL_FLAGS`` opening the
pattern, ``SCOPED_FLAGS`` for a group's own); ``outer_classes`` delimits the outermost classes as
another dialect does (the ``regex`` package's version 0, Rust's regex). ``unicode_classes`` finds a
pattern's Unicode property classes (``\\p{L}``), which Python's ``re`` lacks, and ``classes_held``
holds each by as many plain characters, so that ``re`` reads the rest of the pattern, every position
as it was. Standard library only; imports no other module of the engine.
"""

from __future__ import annotations

import re
from typing import Callable, Iterator, NamedTuple


# Global inline flags, (?i)(?x): Python takes them only at the pattern's start, where they come
# before an edge anchor (``(?i)^yes$``) and say whether ``#`` opens a comment (``(?x)``), and the
# stop matcher reads past them for a lookbehind first (``stop_matcher``). The letters are the regex
# package's (the stop matcher's): Python's, aiLmsux, and b e f p r w and the versions V0 V1, which
# Python refuses (its own error names them). (Not "(?R)": a recursion, to the regex package.)
GLOBAL_FLAGS = re.compile(r"(?:\(\?(?:[abefiLmprsuwx]|V[01])+\))+")


def global_flags(pattern: str) -> str:
    """The global inline flags opening ``pattern`` (``(?i)``, ``GLOBAL_FLAGS``), or ""."""
    flags = GLOBAL_FLAGS.match(pattern)
    return flags.group() if flags else ""

# A group head that sets or clears flags in its scope, (?i: (?-i: (?x-s: (?V1x: ...: its letters set
# (group 1) and cleared (group 2), as the regex package (the stop matcher's reader) reads them, which
# sets b e f p r w and V0 V1 there too and clears f w: a superset of Python's (aiLmsux set, imsx
# cleared), so the two read any group head a pattern Python takes holds alike ("(?:" sets none)
SCOPED_FLAGS = re.compile(r"\(\?((?:[abefiLmprsuwx]|V[01])*)(?:-([afiLmsuwx]+))?:")


def outer_classes(pattern: str, class_end: Callable[[str, int], tuple | None]) -> Iterator[tuple]:
    """(start, *what ``class_end`` says) for each outermost character class of ``pattern``, where
    ``class_end(pattern, start)`` reads the class that opens at ``start`` as one dialect delimits it,
    giving (its end, ...) or None for an unclosed class, which ends the walk. Outside classes an
    escape is one item (``item_end``) and a comment is skipped as Python's parser skips it
    (``comment_spans``)."""
    comments = dict(comment_spans(pattern))
    i, n = 0, len(pattern)
    while i < n:
        if i in comments:
            i = comments[i]
        elif pattern[i] == "\\":
            i = item_end(pattern, i)
        elif pattern[i] != "[":
            i += 1
        else:
            found = class_end(pattern, i)
            if found is None:
                return
            yield i, *found
            i = found[0]


def in_a_class(pattern: str, at: int) -> bool:
    """Whether ``pattern[at]``, where an item starts, stands inside a character class, as Python's
    parser delimits a class's items (``class_items``)."""
    return any(start == at for items in class_items(pattern) for start, _ in items)


# a Unicode property class where a backslash stands: \p{Name}, \p{Key=Value}, \pL (or \P)
UNICODE_CLASS_AT = re.compile(r"\\[pP](?:\{[^}]*\}|[A-Za-z])")

# one anywhere: after any escaped backslashes (group 1), the class (group 2)
_UNICODE_CLASS = re.compile(r"(?<!\\)((?:\\\\)*)(" + UNICODE_CLASS_AT.pattern + ")")


def unicode_classes(pattern: str) -> list[re.Match]:
    """The Unicode property classes of ``pattern`` (``_UNICODE_CLASS`` matches: the class is group
    2), but for text in a comment (``(?#\\p{L})``, ``(?#\\p{)}``: Python's comment ends at that
    ")", so the "}" after it is a literal), which is no class."""
    found, at, comments = [], 0, comment_spans(pattern)
    while (m := _UNICODE_CLASS.search(pattern, at)) is not None:
        comment_end = next((end for start, end in comments if start <= m.start(2) < end), None)
        if comment_end is None:
            found.append(m)
        at = m.end() if comment_end is None else comment_end
    return found


def class_items(pattern: str) -> Iterator[list[tuple[int, int]]]:
    """Per character class of ``pattern``, in order, the (start, end) of each of its items
    (``pattern_parts``)."""
    return (list(part.items) for part in pattern_parts(pattern) if part.kind == "class")


def comment_spans(pattern: str) -> list[tuple[int, int]]:
    """The (start, end) of each comment in ``pattern``, ``(?#...)`` or a verbose part's ``# ...``
    (``pattern_parts``)."""
    return [(part.start, part.end) for part in pattern_parts(pattern) if part.kind == "comment"]


class PatternPart(NamedTuple):
    """A part of a pattern's text (``pattern_parts``): its ``kind``, "class", "comment", "escape",
    "(" (a group's opening character), ")", or "" (a run of other characters, "|" and "{" among
    them, which holds no ``\\``, ``[``, ``(`` or ``)``, and a "#" only first, where the verbose flag
    does not hold); its ``start`` and ``end`` in the pattern; the inline ``flags`` that hold there
    (letters: the global ones and those a scoped group around it sets, less those one clears; for
    a "(", those outside its group); and, for a class, the (start, end) of each of its ``items``."""

    kind: str
    start: int
    end: int
    flags: str
    items: tuple[tuple[int, int], ...] = ()


# A run of characters that opens no part of ``pattern_parts`` (a "#" ends it: a comment under (?x))
_PLAIN = re.compile(r"[^\\\[()#]*")


def pattern_parts(pattern: str, flags: str | None = None) -> Iterator[PatternPart]:
    """``pattern``'s text, in order, as parts (``PatternPart``) delimited as Python's parser
    delimits them, which the regex package's version 0 shares for every pattern both read. A
    character class: after "[" and an optional "^", a "]" first is a literal, and each item is
    ``item_end``'s (an escape whole, a Unicode class whole, whose braces may hold a "["); the
    class ends at the next "]". A comment, "(?#" outside a class, ends at the next ")" that no
    backslash escapes (its "[" or "\\p{" is no class); where the verbose flag holds, one from a
    "#" outside a class ends with its line. Either, unclosed, ends at the pattern's end. Outside
    them an escape is one part (``item_end``). ``flags``: the letters that hold over the whole
    pattern (the regex package's, which reads ``(?x)`` anywhere as global: from the compiled
    pattern), or None for those of the global flag groups opening it (``_leading_flags``: Python
    takes them only there); a group ``SCOPED_FLAGS`` opens sets and clears its own up to its ")"."""
    if flags is None:
        flags = _leading_flags(pattern)
    scopes, i, n = [flags], 0, len(pattern)
    while i < n:
        start, held = i, scopes[-1]
        if pattern[i] == "\\":
            i = item_end(pattern, i)
            yield PatternPart("escape", start, i, held)
        elif pattern[i] == "#" and "x" in held:
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            yield PatternPart("comment", start, i, held)
        elif pattern.startswith("(?#", i):
            i += 3
            while i < n and pattern[i] != ")":
                i += 2 if pattern[i] == "\\" else 1
            i = min(i + 1, n)
            yield PatternPart("comment", start, i, held)
        elif pattern[i] == "[":
            i += 1 + pattern.startswith("^", i + 1)
            items: list[tuple[int, int]] = []
            while i < n and (not items or pattern[i] != "]"):
                items.append((i, item_end(pattern, i)))
                i = items[-1][1]
            i = min(i + 1, n)
            yield PatternPart("class", start, i, held, tuple(items))
        elif pattern[i] == "(":
            scoped = SCOPED_FLAGS.match(pattern, i)
            on, off = (scoped.group(1), scoped.group(2) or "") if scoped else ("", "")
            scopes.append("".join(c for c in held if c not in off) + on)
            i += 1
            yield PatternPart("(", start, i, held)
        elif pattern[i] == ")":
            if len(scopes) > 1:
                scopes.pop()
            i += 1
            yield PatternPart(")", start, i, held)
        else:  # (a run of characters none of which opens a part: a long pattern is walked in fewer steps)
            i = _PLAIN.match(pattern, i + 1).end()
            yield PatternPart("", start, i, held)


# What may open a pattern before its first item, as Python reads it: a global flag group (group 1: its
# letters, the regex package's too, as GLOBAL_FLAGS's), a comment, and, once the verbose flag holds,
# whitespace and a "#" comment to the line's end (group 2), which Python skips there
_LEADING = re.compile(r"\(\?((?:[abefiLmprsuwx]|V[01])+)\)|\(\?#(?:\\.|[^\\)])*\)|(\s+|#[^\n]*\n?)")


def _leading_flags(pattern: str) -> str:
    """The letters of the global flag groups that open ``pattern``, read past comments between them
    (``(?#c)(?x)``) and, after ``(?x)``, whitespace and ``#`` comments (``(?x) (?i)``), as Python
    takes them as global there (and refuses them further on)."""
    letters, at = "", 0
    while (m := _LEADING.match(pattern, at)) and m.end() > at and not (m.group(2) and "x" not in letters):
        letters += re.sub(r"V[01]", "", m.group(1) or "")
        at = m.end()
    return letters


_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}  # (Python reads exactly as many hex digits, or refuses the pattern)


def item_end(pattern: str, i: int) -> int:
    """The end index of the class item at ``pattern[i]``: a Unicode class, an escape as Python's
    parser delimits it in a class (``\\x41``, ``\\N{SPACE}``, ``\\101``), or one character."""
    m = UNICODE_CLASS_AT.match(pattern, i)
    if m:
        return m.end()
    if pattern[i] != "\\" or i + 1 == len(pattern):
        return i + 1
    c = pattern[i + 1]
    if c in _ESCAPE_DIGITS:
        return i + 2 + _ESCAPE_DIGITS[c]
    if c == "N" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 2)
        return len(pattern) if end < 0 else end + 1
    end = i + 2
    while c in "01234567" and end < min(len(pattern), i + 4) and pattern[end] in "01234567":
        end += 1
    return end


def classes_held(pattern: str, hold: str = "%") -> str:
    """``pattern`` with each Unicode property class (``unicode_classes``) held by as many ``hold``
    characters: what Python's ``re`` can parse, with the rest of the pattern, and every position,
    as they were, so that checks made with ``re`` (``pattern_problem``, the engine's
    ``check_regex`` and ``automaton_syntax``) see the rest of a pattern that has such classes. A
    "%" is a literal outside a class and in one, and no name's character, so a class standing
    where a name does (``(?P<\\p{L}>...)``) is refused (``error_words``)."""
    for m in reversed(unicode_classes(pattern)):
        pattern = pattern[:m.start(2)] + hold * len(m.group(2)) + pattern[m.end(2):]
    return pattern
