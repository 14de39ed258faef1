"""ECMA 262's empty class ``[]`` in a JSON schema's ``pattern``: found and named for the engine.

In ECMA 262, JSON Schema's dialect, ``[]`` is a class that matches no character, so the part of a
pattern that holds it never matches (``a[]`` matches no string; ``^[]$|^a$`` what ``^a$`` does).
Python's ``re``, with which the engine reads a schema's pattern and jsonschema checks each
output, has no empty class: to it a "]" first in a class is a member, so it refuses ``a[]`` as a
class left open, and reads ``[][]``, two empty classes to ECMA, as the class of "[" and "]". The
engine refuses such a pattern naming the class, what it keeps from matching (``regex_dead_part``,
as for a ``regex``'s empty class: ``regex_empty_class``) and the fix, the pattern without that
part where the engine takes it. ``gen()`` and a ``%%lm`` cell leave the pattern, valid JSON
Schema, to the backend, as they do ECMA's class of any character ``[^]``.
"""

from __future__ import annotations

from typing import Iterator, Optional

from lmnb_engine.regex_dead_part import dead_part

EMPTY, ANY = "[]", "[^]"  # ECMA's empty class and its class of any character, which Python's re lacks


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
    holding ECMA's empty class (the module docstring), or None where it holds none: the first one
    and where it starts, what it keeps from ever matching (an alternative, a part repeated zero
    times, or the whole pattern, as where each alternative holds one: ``[]|a[]``) and the fix, the
    pattern without that part (each such part out) where the engine takes it
    (``json_schema._offer_taken``), else what the engine refuses that pattern for
    (``json_schema._refused_next``)."""
    from lmnb_engine.json_schema import SHOWN_CHARS, _offer_taken, _refused_next, json_value, pattern_subject

    start = first_empty_class(pattern)
    if start is None:
        return None
    dead = dead_part(_as_python_atoms(pattern), start, start + 2, written=pattern)
    offer = dead and dead.without
    while offer is not None and (more := first_empty_class(offer)) is not None:  # (each out: "[]|a[]|b" is "b")
        more_dead = dead_part(_as_python_atoms(offer), more, more + 2, written=offer)
        dead, offer = (dead, more_dead.without) if more_dead else (None, None)  # (none: what is left never matches)
    meant = 'write the class you meant ("]" in it escaped, \\])'
    if offer is not None and _offer_taken(offer):
        fix = f"write {json_value(offer, SHOWN_CHARS)} without it, or {meant}"
    else:
        fix = f"remove it, or {meant}" if dead else meant
        then = _refused_next(offer) if offer is not None else None
        fix += f"; without it, {then}" if then else ""
    never = f"so {dead.what}" if dead else "so the pattern can never match, and no string passes it"
    return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} holds ECMA's empty class [] at position "
            f"{start}, which matches no character (Python's re, which reads a schema's pattern here, has no empty "
            f'class: to it a "]" first in a class is a member): an empty class can never match, {never}; {fix}')


def first_empty_class(pattern: str) -> Optional[int]:
    """Where ``pattern``'s first ECMA empty class starts, or None."""
    return next((start for start, end in ecma_classes(pattern) if pattern[start:end] == EMPTY), None)


def _as_python_atoms(pattern: str) -> str:
    """``pattern`` with each ``EMPTY`` and ``ANY`` class written as text of its length that Python's
    parser reads as one atom (``\\a``, ``[a]``), so that ``dead_part`` finds its groups and
    alternatives at their places in ``pattern``."""
    out, last = [], 0
    for start, end in ecma_classes(pattern):
        if pattern[start:end] in (EMPTY, ANY):
            out += [pattern[last:start], "\\a" if end - start == 2 else "[a]"]
            last = end
    return "".join(out) + pattern[last:]
