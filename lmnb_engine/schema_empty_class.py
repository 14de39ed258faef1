"""ECMA 262's empty class ``[]``, and any class that matches no JSON string character, in a JSON
schema's ``pattern``: found and named for the engine.

In ECMA 262, JSON Schema's dialect, ``[]`` is a class that matches no character, so the part of a
pattern that holds it never matches (``a[]`` matches no string; ``^[]$|^a$`` what ``^a$`` does).
Python's ``re``, with which the engine reads a schema's pattern and jsonschema checks each
output, has no empty class: to it a "]" first in a class is a member, so it refuses ``a[]`` as a
class left open, and reads ``[][]``, two empty classes to ECMA, as the class of "[" and "]". The
engine refuses such a pattern naming the class, what it keeps from matching (``regex_dead_part``,
as for a ``regex``'s empty class: ``regex_empty_class``) and the fix, the pattern without that
part where the engine takes it. So it does for any other class that matches no character the
engine writes in a JSON string (``[^\\s\\S]``; ``[^\\D0-9]``, its ``\\d`` being ASCII, as ECMA's is),
which its build met only as a part "no JSON string character can match", offering nothing, where
a ``regex``'s is named so (``regex_empty_class``), and for a lone surrogate outside a class
(``\\uD800``, ``\\u{D800}``, not half of a pair ``\\uD83D\\uDE00``), which no JSON text written as
UTF-8 holds: ``\\uD800|a`` was built as ``a`` without a word, ``a\\uD800?`` told "widen it" with no
fix. ``gen()`` and a ``%%lm`` cell leave the pattern, valid JSON Schema, to the backend, as they do
ECMA's class of any character ``[^]``.
"""

from __future__ import annotations

import re
from typing import Iterator, Optional

from lmnb_engine.regex_dead_part import dead_part

EMPTY, ANY = "[]", "[^]"  # ECMA's empty class and its class of any character, which Python's re lacks
_SURROGATE_ESCAPE = re.compile(r"\\u[Dd][89A-Fa-f][0-9A-Fa-f]{2}")  # (ECMA's \u is lowercase; a pair's half too)


def ecma_classes(pattern: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each character class of ``pattern`` as ECMA 262 delimits it: from a "["
    outside an escape and a class to the first "]" after it that no backslash escapes, a "]"
    first too (``EMPTY``, ``ANY``: to Python's ``re`` a "]" first is a member); one left open
    ends at the pattern's end."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "\\":
            i += 2
        elif pattern[i] == "[":
            j = i + 1 + pattern.startswith("[^", i)
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            yield i, min(j + 1, n)
            i = j + 1
        else:
            i += 1


def empty_class_problem(pattern: str, where: str) -> Optional[str]:
    """The engine's words for the schema ``pattern`` (at ``where``, e.g. ``#/properties/a/pattern``)
    holding ECMA's empty class (the module docstring), another class that matches no JSON string
    character as the engine writes classes (``empty_classes``) or a lone surrogate outside a
    class (``lone_surrogates``), not in a part repeated at most zero times
    (``matching_nothing``), or None where it holds none: the first one and where it starts, with
    the first of each other of these kinds it holds (``[]|[^\\s\\S]a``: both), what they keep
    from ever matching (an alternative, a part repeated zero times, or the whole pattern, as where
    each alternative holds one: ``[]|a[]``) and the fix, the pattern without that part (each such
    part out) where the engine takes it (``json_schema._offer_taken``), else what the engine
    refuses that pattern for (``json_schema._refused_next``)."""
    from lmnb_engine.json_schema import SHOWN_CHARS, _offer_taken, _refused_next, json_value, pattern_subject

    found = list(matching_nothing(pattern))
    if not found:
        return None
    start, end = found[0]
    kinds = {_kind(pattern, start, end): (start, end)}
    for span in found:  # (the first of each other kind, whose words and fix differ: named too)
        kinds.setdefault(_kind(pattern, *span), span)
    dead = dead_part(_as_python_atoms(pattern), start, end, written=pattern)
    offer, whats = dead and dead.without, [dead.what] if dead else []
    while offer is not None and (more := next(matching_nothing(offer), None)) is not None:  # ("[]|a[]|b" is "b")
        more_dead = dead_part(_as_python_atoms(offer), *more, written=offer)
        whats += [more_dead.what] if more_dead and _kind(offer, *more) != _kind(pattern, start, end) else []
        dead, offer = (dead, more_dead.without) if more_dead else (None, None)  # (none: what is left never matches)
    it = "them" if len(kinds) > 1 else "it"
    meant = "write " + " and ".join(_meant(kind, pattern[a:b], len(kinds) > 1) for kind, (a, b) in kinds.items())
    if offer is not None and _offer_taken(offer):
        fix = f"write {json_value(offer, SHOWN_CHARS)} without {it}, or {meant}"
    else:
        fix = f"remove {it}, or {meant}" if dead else meant
        then = _refused_next(offer) if offer is not None else None
        fix += f"; without {it}, {then}" if then else ""
    # (the engine's reading of another class is no validator's: [\x80-\x9f] passes "\x85")
    never = (f"so {', and '.join(whats)}" if dead else "so the pattern can never match, and no string passes it"
             if list(kinds) == [EMPTY] else "so the pattern can never match here")
    holds = ", and ".join(_holds(pattern, a, b) for a, b in kinds.values())
    return f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} holds {holds}, {never}; {fix}"


def _meant(kind: str, part: str, several: bool) -> str:
    """How to fix ``part``, a part of ``kind`` (``_kind``) that matches nothing, after "write", the
    part named where the pattern holds ``several`` kinds."""
    if kind == EMPTY:
        return f"the class you meant{' for []' if several else ''} (\"]\" in it escaped, \\])"
    if kind == "class":
        return f"the class you meant for {part}" if several else "the class you meant"
    # Only the character itself: this engine refuses a surrogate pair's escapes and \u{...} alike.
    return f"the character you meant{' for ' + part if several else ''} (one past U+FFFF as the character itself)"


def _kind(pattern: str, start: int, end: int) -> str:
    """The kind of the part of ``pattern`` at ``start``-``end`` that matches nothing
    (``matching_nothing``): ECMA's empty class (``EMPTY``), another class, or a lone surrogate."""
    return EMPTY if pattern[start:end] == EMPTY else "class" if pattern.startswith("[", start) else "surrogate"


def _holds(pattern: str, start: int, end: int) -> str:
    """What the part of ``pattern`` at ``start``-``end`` that matches nothing is, in words
    (``empty_class_problem``'s)."""
    from lmnb_engine.constrained.json_string import NO_CHARACTER_WORDS  # (torch-free; it imports json_schema)

    kind = _kind(pattern, start, end)
    if kind == EMPTY:
        return (f"ECMA's empty class [] at position {start}, which matches no character (Python's re, which reads a "
                'schema\'s pattern here, has no empty class: to it a "]" first in a class is a member): an empty '
                "class can never match")
    if kind == "class":  # (the engine's reading: [\x80-\x9f], [^\S\x00-\x7f] match characters to ECMA and re)
        return (f"the class {pattern[start:end]} at position {start}, which matches no character the engine writes in "
                f"a JSON string ({NO_CHARACTER_WORDS}): such a class can never match here")
    # (a validator passes the string "\ud800", a JSON escape: no text the engine writes holds one)
    code = ord(pattern[start]) if end == start + 1 else int(pattern[start + 2:end].strip("{}"), 16)
    return (f"the lone surrogate U+{code:04X} at position {start}, half of a UTF-16 pair and no character, which no "
            "JSON text written as UTF-8 holds: it can never match here")


def first_matching_nothing(pattern: str) -> Optional[tuple[int, int]]:
    """(start, end) of the first part of ``pattern`` that ``matching_nothing`` finds, or None."""
    return next(matching_nothing(pattern), None)


def matching_nothing(pattern: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each part of ``pattern`` that matches no character the engine writes in a
    JSON string, in order: a class (``empty_classes``) or a lone surrogate outside one
    (``lone_surrogates``), but for one in a part repeated at most zero times (``x[^\\s\\S]{0}``,
    which matches what ``x`` does, as a ``regex`` takes it: ``regex_empty_class``), ECMA's empty
    class ``[]`` aside, which Python's ``re`` cannot read there either (``a[]{0}b``)."""
    from lmnb_engine.json_schema import ecma_names_as_python  # (it imports this module)
    from lmnb_engine.regex_empty_class import _read

    python = _as_python_atoms(ecma_names_as_python(pattern))  # (each part at its place)
    for start, end in sorted([*empty_classes(pattern), *lone_surrogates(pattern)]):
        try:
            read = pattern[start:end] == EMPTY or _read(python, start, end)
        except (re.error, RecursionError, OverflowError):  # (one re cannot read, \u{41}: taken as read)
            read = True
        if read:
            yield start, end


def lone_surrogates(pattern: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each surrogate of ``pattern`` outside a class (``ecma_classes``), as the
    character itself, an escape ``\\uD800`` or the u flag's ``\\u{D800}``, but for a pair of escapes,
    ``\\uD83D\\uDE00``, one code point to ECMA (``json_schema._code_point_escape``)."""
    from lmnb_engine.json_schema import _code_point_escape  # (it imports this module)

    classes = dict(ecma_classes(pattern))
    i, n = 0, len(pattern)
    while i < n:
        start = i
        if i in classes:
            i = classes[i]
        elif pattern[i] == "\\":
            escape, lone = _code_point_escape(pattern, i), _SURROGATE_ESCAPE.match(pattern, i)
            i = escape[1] if escape else lone.end() if lone else i + 2
            if (lone and not escape) or (escape and 0xD800 <= int(escape[0][2:], 16) <= 0xDFFF):
                yield start, i
        else:
            i += 1
            if "\ud800" <= pattern[start] <= "\udfff":
                yield start, i


def empty_classes(pattern: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each class of ``pattern`` that matches no character the engine writes in a
    JSON string: ECMA's empty class, or another class (``[^\\s\\S]``, ``[^\\D0-9]``:
    ``json_string.class_matches_nothing``), read with its ECMA code point escapes as ECMA reads
    them (``[\\uD83D\\uDE00]``, two surrogates to ``re``, is the class of one character:
    ``json_schema.code_point_fix`` names it)."""
    from lmnb_engine.constrained.json_string import class_matches_nothing  # (it imports json_schema)
    from lmnb_engine.json_schema import _code_points_as_python  # (it imports this module)

    for start, end in ecma_classes(pattern):
        cls = pattern[start:end]
        try:
            if cls == EMPTY or (cls != ANY and class_matches_nothing(_code_points_as_python(cls))):
                yield start, end
        except (re.error, ValueError):  # (a class re reads otherwise, or not at all: re's words follow)
            continue


def _as_python_atoms(pattern: str) -> str:
    """``pattern`` with each ``EMPTY`` and ``ANY`` class, and each lone surrogate ``\\u{D800}``
    (``lone_surrogates``), written as text of its length that Python's parser reads as one atom
    (``\\a``, ``[a]``, ``[aaaaaa]``), so that ``dead_part`` finds its groups and alternatives at
    their places in ``pattern``."""
    spans = [(start, end) for start, end in ecma_classes(pattern) if pattern[start:end] in (EMPTY, ANY)]
    spans += [(start, end) for start, end in lone_surrogates(pattern) if pattern.startswith("\\u{", start)]
    out, last = [], 0
    for start, end in sorted(spans):
        out += [pattern[last:start], "\\a" if end - start == 2 else "[" + "a" * (end - start - 2) + "]"]
        last = end
    return "".join(out) + pattern[last:]
