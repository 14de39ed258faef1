"""The characters a stop regex's match may end with: what its last consuming item may consume.

A match of a pattern that matches no empty string consumes at least one character, and its last
one is consumed by one of the items that may come last in it (``[0-9]`` of ``[a-z]{1,300}[0-9]``;
``b`` or ``c`` of ``a+(?:b|c)``; assertions after them consume nothing). Where none of the text
after a point is one of those, no match ends after that point: ``StopStringMatcher.find`` then
need not search for a new one (a search of ``a{1,500}b`` over a run of "a"s tried each of the
last 500 starts to the run's end after each token).

The pattern's structure is read by Python's own parser (``regex_reach.parse_as_python``), as
``regex_reach`` reads it; the items are written back as the ``regex`` package reads them
(``regex_tree.one_character``).
"""

from __future__ import annotations

import functools
from typing import Any

from lmnb_engine.regex_parts import global_flags
from lmnb_engine.regex_reach import Unreadable, parse_as_python
from lmnb_engine.regex_tree import one_character


class _NotRead(Exception):
    pass


def _last(items: Any) -> tuple[set[str], bool]:
    """The one-character items that may consume the last character a sequence consumes, and
    whether it may consume none."""
    found: set[str] = set()
    for op, av in reversed(list(items)):
        last, empty = _item(op.name, av)
        found |= last
        if not empty:
            return found, False
    return found, True


def _item(name: str, av: Any) -> tuple[set[str], bool]:
    if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
        item = one_character(name, av)
        if item is None:
            raise _NotRead
        return {item}, False
    if name == "SUBPATTERN":
        if av[1] or av[2]:  # (a scoped flag: its items read otherwise than under the global flags)
            raise _NotRead
        return _last(av[3])
    if name == "BRANCH":
        found, empty = set(), False
        for sub in av[1]:
            last, e = _last(sub)
            found, empty = found | last, empty or e
        return found, empty
    if name in ("MAX_REPEAT", "MIN_REPEAT"):
        low, high, sub = av
        if high == 0:
            return set(), True
        last, empty = _last(sub)
        return last, empty or low == 0
    if name in ("AT", "ASSERT", "ASSERT_NOT"):  # (they consume nothing)
        return set(), True
    raise _NotRead  # an atomic group, a possessive repeat, a backreference, a conditional ...


@functools.lru_cache(maxsize=256)
def last_characters(pattern: str) -> Any:
    """One character class (compiled with ``pattern``'s global flags) of every character a match
    of ``pattern`` may end with: its search past a point finds nothing where no match ends past it.
    None where ``pattern`` may match the empty string, is not read as the ``regex`` package reads
    it (``parse_as_python``), holds a scoped flag, or an item other than characters, classes,
    groups, alternatives, greedy or lazy repeats and assertions."""
    import regex

    try:
        last, empty = _last(parse_as_python(pattern))
    except (Unreadable, _NotRead):
        return None
    if empty or not last:
        return None
    try:
        return regex.compile(global_flags(pattern) + "(?:" + "|".join(sorted(last)) + ")")
    except regex.error:
        return None
