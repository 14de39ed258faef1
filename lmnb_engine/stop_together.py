"""Whether a stop regex's match that reads the text's end is settled by several ways together.

A match that reads the end of the text so far (``a(?:\\B|(?!\\w))`` after "a") may be undone by
no text that can follow though each way of matching it alone may be: ``\\B`` holds where a word
character follows, ``(?!\\w)`` where any other does, and one of them where the output ends. Such a
match is final at once (``tests/stop_regex_reference.py``, which tries every continuation, meets
it so). The checks of ``stop_end_reading`` try one way at a time; this one tries every text that
can follow instead, as that reference does, over a set of characters that stands for all of
them, for a pattern where that set is small and known (``together``).

What can follow is told apart by a pattern only through what it tests a character for: the
characters and ranges it names, the classes ``\\w``, ``\\d``, ``\\s`` and the newline (for ``.``,
``$``, ``^``). Two characters that pass the same of those tests are read alike, so one of each
such kind stands for all (``Together.alphabet``). Its assertions read at most its assertion reach
``A`` characters past a match (``regex_reach.assertion_reach``), so every text of up to ``A`` of
those characters, ended there, stands for every text that can follow.

This module imports neither ``stop_matcher`` nor ``stop_end_reading``, which use it.
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Any, NamedTuple, Sequence

from lmnb_engine.regex_parts import global_flags
from lmnb_engine.regex_reach import Unreadable, assertion_reach, parse_as_python, reach
from lmnb_engine.regex_tree import walk
from lmnb_engine.stop_relaxed import ending_by

# The most texts that can follow a match tried per match (every one when it is settled)
MAX_CONTINUATIONS = 2000
# One character outside ASCII per kind of them that a pattern naming only ASCII characters can tell
# apart: a word character, a digit (a word character too), a space, none of these. (The newline,
# which "." and "$" test for, is ASCII.)
_BEYOND_ASCII = "\u00e9\u0663\u00a0\u00b6"
# The operations of a pattern this module reads (Python's parser's names); any other (a backreference,
# a conditional) may read the text otherwise, and the pattern is left out
_READ = {"LITERAL", "NOT_LITERAL", "ANY", "IN", "SUBPATTERN", "BRANCH", "MAX_REPEAT", "MIN_REPEAT", "AT",
         "ASSERT", "ASSERT_NOT", "NEGATE", "RANGE", "CATEGORY"}
# Where a match may be made more than one way (a choice between alternatives or of a repeat's count)
_CHOICE = {"BRANCH", "MAX_REPEAT", "MIN_REPEAT"}
# The assertions that read forward: an end or word-boundary one, a lookahead
_BACKWARD_AT = {"AT_BEGINNING", "AT_BEGINNING_STRING", "AT_BEGINNING_LINE"}


class Together(NamedTuple):
    """What ``settled_together`` tries for one stop regex: ``alphabet``, one character of each kind
    the pattern tells apart; ``ahead``, its assertion reach (the most characters past a match
    that it reads)."""

    alphabet: str
    ahead: int


@functools.lru_cache(maxsize=256)
def together(pattern: str) -> Together | None:
    """``Together`` of ``pattern``, where several ways of matching one span may read what follows
    (a choice between alternatives or of a repeat's count, and an assertion that reads forward),
    and the texts to try are at most ``MAX_CONTINUATIONS``, however far a match reaches from its
    start (``a+(?:\\B|(?!\\w))``: only the assertion reach sizes the texts tried, and the search
    of ``undone_by_one`` runs backward from the text's end); None
    otherwise, or where the pattern is read otherwise than by characters, ASCII ranges and classes
    (``_READ``; Python's parser must read it as the ``regex`` package does, ``parse_as_python``),
    or is case-insensitive (a folded character may lie outside ASCII: "K", KELVIN SIGN)."""
    try:
        parsed = parse_as_python(pattern)
    except Unreadable:
        return None
    ahead = assertion_reach(pattern)
    if not ahead or parsed.state.flags & re.IGNORECASE:
        return None
    chars: set[int] = set()
    ranges: list[tuple[int, int]] = []
    choice = forward = False
    for op, av in walk(parsed):
        name = op.name
        if name not in _READ:
            return None
        choice = choice or (name in _CHOICE and (name == "BRANCH" or av[0] != av[1]))
        forward = forward or (name == "AT" and av.name not in _BACKWARD_AT) or (name in ("ASSERT", "ASSERT_NOT") and av[0] > 0)
        if name in ("LITERAL", "NOT_LITERAL"):
            chars.add(av)
        elif name == "RANGE":
            ranges.append(av)
    if not (choice and forward) or any(c > 127 for c in chars) or any(hi > 127 for _, hi in ranges):
        return None
    alphabet = _kinds(chars, ranges)
    if sum(len(alphabet) ** n for n in range(1, ahead + 1)) > MAX_CONTINUATIONS:
        return None
    return Together(alphabet, ahead)


def _kinds(chars: set[int], ranges: list[tuple[int, int]]) -> str:
    """One character of each kind that the characters ``chars`` and ranges ``ranges`` (all ASCII)
    and the classes tell apart: every ASCII character, grouped by what it passes, and one of each
    kind beyond ASCII, which none of those names."""
    import regex

    classes = [regex.compile(c) for c in (r"\w", r"\d", r"\s", "\n")]
    seen: dict[tuple, str] = {}
    for ch in [chr(i) for i in range(128)] + list(_BEYOND_ASCII):
        kind = (ord(ch) if ord(ch) in chars else None, tuple(lo <= ord(ch) <= hi for lo, hi in ranges),
                tuple(c.fullmatch(ch) is not None for c in classes))
        seen.setdefault(kind, ch)
    return "".join(seen.values())


def settled_together(how: Together, pattern: str, text: str, start: int, e: int, end: int, budget: float) -> Any:
    """The match of ``pattern`` (one ``together`` gives ``how``) from ``start`` to ``e`` in
    ``text[:end]`` where it matches so whatever text follows, else None: where nothing follows,
    and after every text of up to ``how.ahead`` characters of ``how.alphabet`` (the shortest first:
    one of them most often undoes a match that is not settled).

    Raises:
        TimeoutError: a match ran past ``budget`` seconds.
    """
    head, found = text[:end], None
    for n in range(0, how.ahead + 1):
        exact = ending_by(pattern, end - e + n, exact=True)
        if exact is None:
            return None
        for more in itertools.product(how.alphabet, repeat=n):
            if (m := exact.match(head + "".join(more), start, timeout=budget)) is None:
                return None
            found = found or m
    return found


def undone_by_one(how: Together, pattern: str, text: str, end: int, budget: float, order: str,
                  branches: Sequence[tuple[Any, str]] = ()) -> str | None:
    """A character that, following ``text[:end]``, leaves no match of ``pattern`` (one ``together``
    gives ``how``) that ends within ``how.ahead`` characters of ``end``, None where each of
    ``how.alphabet`` leaves one. Where one does, no match ending there is settled, together or not
    (each would hold after it too), as one search per character tells, not one check per start
    and end. ``order``: the characters to try first (the one that told it last: over an open run,
    the same one tells it again). ``branches``: per top-level alternative of ``pattern``, the
    assertions that end each of its matches (``stop_end_reading.Tail.plain``, compiled; None where
    it has none) and its text, where known: a character after which none of them can end a match
    there (``_ends_none``) is told by reading those few places.

    The search of all of ``pattern`` runs backward from the text's end
    (``_ending_within_after_one``), so that it tries only the ends near it: run forward, it tried
    every start of an open run, each read to the run's end (``a+(?:\\B|(?!\\w))b`` over 4000
    "a"s: ~1 s a search); backward, each place still costs a test of the lookahead (~50 ns), which
    ``branches`` spares where it tells. The search is not bounded below by where a match may still
    begin: a backward search from a position reads no lookbehind past it, and a match that begins
    earlier only sends the caller to its checks of each end. (Backward, the ``regex`` package may
    miss a match where the pattern matches empty beside a lookbehind,
    ``benches/results/2026-12-06-cpu-stop-regex-run.md``: the character then seems to undo it, and
    the match is met with the next character, as where this check is not made.)

    Raises:
        TimeoutError: a search ran past ``budget`` seconds.
    """
    probe, head = _ending_within_after_one(pattern, how.ahead), text[:end]
    for c in order + "".join(c for c in how.alphabet if c not in order):
        after = head + c
        if branches and all(_ends_none(how.ahead, tail, alternative, after, end, budget) for tail, alternative in branches):
            return c
        if probe.search(after, timeout=budget) is None:
            return c
    return None


def _ends_none(ahead: int, tail: Any, alternative: str, text: str, end: int, budget: float) -> bool:
    """Whether no match of the top-level alternative ``alternative`` (``undone_by_one``'s branches)
    ends from ``end - ahead`` to ``end`` in ``text``, told by reading near there only: its ending
    assertions ``tail`` hold at none of those places, or, where it has none and its matches read a
    bounded stretch from their start (``regex_reach.reach``), a search from that far back finds
    none. False where that cannot be told so.

    Raises:
        TimeoutError: a search ran past ``budget`` seconds.
    """
    if tail is not None:
        t = tail.search(text, max(0, end - ahead), timeout=budget)
        return t is None or t.start() > end
    width = reach(alternative)
    return width is not None and _ending_within_after_one(alternative, ahead, backward=False).search(
        text, max(0, end - ahead - width), timeout=budget) is None


@functools.lru_cache(maxsize=256)
def _ending_within_after_one(pattern: str, ahead: int, backward: bool = True) -> Any:
    """``pattern`` matching only where 1 to ``ahead`` + 1 characters follow its match (its match
    ending within ``ahead`` characters of the text's end before one more character); ``backward``:
    searched backward (the ``regex`` package's ``(?r)``: the same matches, the ends tried from the
    text's end, each first tested by the lookahead that holds only near it)."""
    import regex

    lead = global_flags(pattern)
    end = "\n" if regex.compile(pattern).flags & regex.VERBOSE else ""  # (a verbose "#" comment ends there)
    reverse = "(?r)" if backward else ""
    return regex.compile(f"{lead}{reverse}(?:{pattern[len(lead):]}{end})(?=[\\s\\S]{{1,{ahead + 1}}}\\Z)")
