"""The part of a pattern that an empty character class keeps from ever matching, and the pattern
without it.

A class that matches no character (``regex_empty_class``) fails every match through it, so the
innermost part around it that the pattern can do without never matches either: the alternative
holding it (``[^\\w\\W]|b``: the pattern matches what ``b`` does), a part that may be repeated
zero times (``(a[^\\d\\D])?b``, ``x[^\\s\\S]*``: it only ever matches nothing), or a negative
lookaround (``(?![^\\s\\S])``: it always holds). Where no such part holds it, the whole pattern
never matches. The pattern is read as Python's parser delimits its classes and comments
(``regex_parts.pattern_parts``), its groups and ``|`` as written.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

from lmnb_engine.regex_parts import global_flags, pattern_parts
from lmnb_engine.regex_python_error import shown_regex

# A repeat after an atom, as Python and the regex package read one: its low count, or none for
# "?" and "*" (group 1: the low count of a counted repeat, "{2}", "{2,}", "{,3}", "{,}"; "{}" is two
# literal characters to both), then "?" (lazy) or "+" (possessive)
_REPEAT = re.compile(r"(?:[?*+]|\{(?:(\d+)(?:,\d*)?|,\d*)\})[?+]?")
# A reference to a group by number or name, whose number removing a group before it would change
_GROUP_REFERENCE = re.compile(r"\\[1-9]|\\g<|\(\?P=|\(\?\(|\\k<")
# The verbose flag, global or scoped ("(?x)", "(?ix:"): spaces may then stand between a part and its repeat
_VERBOSE = re.compile(r".*?\(\?[a-zA-Z-]*x", re.DOTALL)
# What verbose mode skips: spaces and comments ("# ..." to the line's end)
_SPACES = re.compile(r"(?:\s|#[^\n]*)*")


class DeadPart(NamedTuple):
    """A part of a pattern that never matches, or only matches nothing, because of an empty class:
    its ``start`` and ``end`` in the pattern, what it does in words (``"the alternative [^\\w\\W] can
    never match"``)
    and the pattern without it (None where it cannot be written so: a group it removes is referred
    to, or the pattern is verbose, where spaces may stand between a part and its repeat)."""

    start: int
    end: int
    what: str
    without: Optional[str]


def dead_part(pattern: str, start: int, end: int, written: Optional[str] = None) -> DeadPart | None:
    """The innermost part of ``pattern`` that the empty class at ``pattern[start:end]`` keeps from
    ever matching but the pattern can do without (the module docstring), or None where the whole
    pattern never matches for it. In a conditional, ``(?(1)...|...)``, whose branches are no
    alternatives, it is the branch, offered without a rewrite. ``written``: the pattern as the user
    wrote it, of ``pattern``'s length, whose text the words show and the rewrite is cut from, where
    ``pattern`` is its spelling for Python's parser (ECMA's empty class ``[]`` as ``\\a``:
    ``schema_empty_class``)."""
    text = pattern if written is None else written
    groups, bars = _groups_and_bars(pattern)
    verbose = _VERBOSE.match(pattern) is not None
    while True:
        repeat = _REPEAT.match(pattern, _past_spaces(pattern, end) if verbose else end)
        if repeat and _low(repeat) == 0:
            part = shown_regex(text[start:repeat.end()])
            return _part(pattern, text, start, repeat.end(), f"the repeat {part} can only match nothing")
        around = max((g for g in groups if g[0] < start and end <= g[1]), default=None)  # (the innermost group)
        if around and pattern.startswith("(?(", around[0]):  # (a branch of it is taken or not by its condition)
            conditional = shown_regex(text[around[0]:around[1] + 1])
            return DeadPart(start, end, f"the branch of the conditional {conditional} that holds it can never match",
                            None)
        # (where each of its alternatives starts, less one, and where the last ends; the pattern's own
        # start after its global flags, which hold whatever alternative is removed)
        first = around[0] + _head_length(pattern, around[0]) if around else len(global_flags(pattern))
        splits = [first - 1, *[b for b in bars if _owner(groups, b) == around], around[1] if around else len(pattern)]
        if len(splits) > 2:  # (an alternative of several: the pattern without it, and a "|" beside it)
            k = next(k for k in range(len(splits) - 1) if splits[k] < start < splits[k + 1])
            lo, hi = splits[k] + 1, splits[k + 1]
            cut = (lo - 1, hi) if k > 0 else (lo, hi + 1)
            return _part(pattern, text, *cut, f"the alternative {shown_regex(text[lo:hi])} can never match")
        if around is None:
            return None
        start, end = around[0], around[1] + 1
        if pattern.startswith(("(?!", "(?<!"), start):
            return _part(pattern, text, start, end, f"the lookaround {shown_regex(text[start:end])} always holds")


def _part(pattern: str, text: str, start: int, end: int, what: str) -> DeadPart:
    """``pattern[start:end]`` as a ``DeadPart`` described by ``what``, with ``text`` (the pattern as
    written: ``dead_part``) without it where that keeps every group reference's meaning and the
    pattern is not verbose."""
    unsure = (_GROUP_REFERENCE.search(pattern) and "(" in pattern[start:end]) or _VERBOSE.match(pattern)
    return DeadPart(start, end, what, None if unsure else text[:start] + text[end:])


def _past_spaces(pattern: str, at: int) -> int:
    """Where what verbose mode skips from ``pattern[at]`` on ends (taken as verbose wherever it sets
    the flag: a repeat read past spaces where the flag does not hold only loses a rewrite)."""
    return _SPACES.match(pattern, at).end()


def _low(repeat: re.Match) -> int:
    """The least count of the repeat ``repeat`` (``_REPEAT``'s match)."""
    if repeat.group().startswith("{"):
        return int(repeat.group(1) or 0)
    return 1 if repeat.group().startswith("+") else 0


def _head_length(pattern: str, at: int) -> int:
    """How many characters open the group at ``pattern[at]`` ("(", "(?:", "(?P<n>", "(?<=", "(?i:")."""
    m = re.compile(r"\((?:\?(?:P?<[^>=!]*>|<[=!]|[=!:>|]|[a-zA-Z-]*:|P?'[^']*'))?").match(pattern, at)
    return m.end() - at


def _owner(groups: list[tuple[int, int]], at: int) -> tuple[int, int] | None:
    """The innermost group of ``groups`` around ``pattern[at]``, or None at the top level."""
    return max((g for g in groups if g[0] < at < g[1]), default=None)


def _groups_and_bars(pattern: str) -> tuple[list[tuple[int, int]], list[int]]:
    """The (index of "(", index of its ")") of each group of ``pattern``, and the index of each "|"
    outside classes, comments and escapes (``regex_parts.pattern_parts``); a group never closed
    ends at the pattern's end."""
    groups, bars, open_ = [], [], []
    for part in pattern_parts(pattern):
        if part.kind == "(":
            open_.append(part.start)
        elif part.kind == ")" and open_:
            groups.append((open_.pop(), part.start))
        elif part.kind == "":
            bars += [at for at in range(part.start, part.end) if pattern[at] == "|"]
    groups += [(at, len(pattern)) for at in open_]
    return groups, bars
