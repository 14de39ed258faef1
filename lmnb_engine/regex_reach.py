"""How far past a match attempt's start a stop regex may read: its reach.

A match of a stop regex tried at one start reads only the characters from there up to the
longest match (what its repeats and alternatives can consume) plus what a lookahead or an end
assertion looks at past them. Where that reach ``R`` is finite, whether the pattern matches at a
start ``s`` (and what) is decided by the text up to ``s + R``: once the text holds that much,
no more text can change it. So a stop that more text may still complete can only begin in the
text's last ``R - 1`` characters, and the stop matcher searches only those, whatever the length
of the output (``StopStringMatcher.safe_len``). This is the bound SGLang takes for its tail check
(``get_max_seq_length`` of a stop regex), with the lookaheads counted too.

The pattern's structure is read by Python's own parser (``re._parser``), as ``stop_automaton``
reads it; a pattern it cannot read, or may read otherwise than the ``regex`` package does (a
``{`` that is no repeat count, which the ``regex`` package may read as a fuzzy-matching
constraint), has no known reach (None), nor has one with an unbounded repeat or a backreference.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

from lmnb_engine.regex_parts import pattern_parts
from lmnb_engine.regex_tree import parser as _sre
from lmnb_engine.regex_tree import walk

# A "{" that begins no repeat count ("x{e<=1}"): Python's parser reads it as a character, the
# regex package as a fuzzy-matching constraint ("x" with up to one error). (An escaped "\{" is
# caught too: only a cost, the pattern is then read by the regex package alone.)
_NOT_A_COUNT = re.compile(r"\{(?!\d*(?:,\d*)?\})")
# A verbose flag, global or scoped ("(?x)", "(?ix:"), found erring towards yes ("(?-x:" too)
_VERBOSE = re.compile(r"\(\?[a-zA-Z-]*x")
# What verbose mode reads otherwise in the two parsers: a space Python's parser keeps as a character
# and the regex package skips (any other than " \t\n\r\v\f" that str.isspace takes: "\xa0",
# "\u2028"), and an escaped newline, which Python's parser reads as one character, so a "#" comment
# goes on past it, where the regex package's comment ends at it ("(?x)a#\\<newline>b": "a" or "ab")
_VERBOSE_UNLIKE = re.compile(r"[^\S \t\n\r\v\f]|\\\n")
# End and boundary assertions read the character at their position and, for "$" (which holds
# before a final newline too), the one after it.
_ASSERTION_READS = 2
# Assertions that read only backwards: the start of the text or of a line.
_BACKWARD_AT = {"AT_BEGINNING", "AT_BEGINNING_STRING", "AT_BEGINNING_LINE"}


class Unreadable(Exception):
    """Python's parser cannot read the pattern as the ``regex`` package does."""


def parse_as_python(pattern: str) -> Any:
    """``pattern`` as parsed by Python's ``re`` (``re._parser.parse``), for a pattern the ``regex``
    package reads the same way.

    Raises:
        Unreadable: Python's parser refuses the pattern or warns that it may read it otherwise
            (a nested set "[[", a set operation "--"), or the pattern holds a "{" that begins no
            repeat count (a fuzzy constraint to the ``regex`` package), or, where verbose mode
            may hold, a space Python's parser does not skip or an escaped newline
            (``_VERBOSE_UNLIKE``).
    """
    if _NOT_A_COUNT.search(pattern):
        raise Unreadable("a '{' that is no repeat count (a fuzzy constraint to the regex package)")
    if _VERBOSE.search(pattern) and _VERBOSE_UNLIKE.search(pattern):
        raise Unreadable("verbose mode with a space or an escaped newline the regex package reads otherwise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "possible nested set": the regex package reads "[[" otherwise
        try:
            return _sre.parse(pattern)
        except (re.error, Warning, RecursionError) as e:
            raise Unreadable(str(e)) from None


class _Unbounded(Exception):
    pass


def _span(items: Any) -> tuple[int, int]:
    """``(width, reach)`` of a sequence: the most characters it consumes, and the most it reads
    from its start (consumed, or looked at past them)."""
    width = reach = 0
    for op, av in items:
        w, r = _item(op.name, av)
        reach = max(reach, width + r)
        width += w
    return width, max(reach, width)


def _item(name: str, av: Any) -> tuple[int, int]:
    if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
        return 1, 1
    if name == "SUBPATTERN":
        return _span(av[3])
    if name == "ATOMIC_GROUP":
        return _span(av)
    if name == "BRANCH":
        spans = [_span(sub) for sub in av[1]]
        return max(w for w, _ in spans), max(r for _, r in spans)
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, high, sub = av
        if high == _sre.MAXREPEAT:
            raise _Unbounded
        if high == 0:
            return 0, 0
        w, r = _span(sub)
        return high * w, (high - 1) * w + r
    if name == "AT":
        return 0, 0 if av.name in _BACKWARD_AT else _ASSERTION_READS
    if name in ("ASSERT", "ASSERT_NOT"):
        direction, sub = av
        if direction > 0:  # a lookahead reads what its pattern does, consuming nothing
            return 0, _span(sub)[1]
        # a lookbehind reads backwards, unless an assertion inside it looks ahead of where it ends
        if any(op.name in ("AT", "ASSERT", "ASSERT_NOT") for op, _ in walk(sub)):
            raise _Unbounded
        return 0, 0
    raise _Unbounded  # GROUPREF, GROUPREF_EXISTS, ... (a backreference's width is its group's text)


@functools.lru_cache(maxsize=256)
def reach(pattern: str) -> int | None:
    """The most characters, from a match attempt's start, that matching ``pattern`` there may
    read: those of its longest match plus what its lookaheads and end or word-boundary
    assertions (2 each, "$" reading up to a final newline's next character) look at past them.
    None where that is unbounded (a ``*``, ``+`` or ``{n,}`` repeat), not known (a backreference,
    an assertion inside a lookbehind) or the pattern is not read as the ``regex`` package reads it
    (``parse_as_python``).

    Only forward reading counts: a lookbehind's text lies before the start, and is there already.
    """
    try:
        parsed = parse_as_python(pattern)
        return _span(parsed)[1]
    except (Unreadable, _Unbounded):
        return None


@functools.lru_cache(maxsize=256)
def settled_width(pattern: str) -> int | None:
    """The most characters a match of ``pattern`` consumes, where what lies past them can change
    whether it matches only through the assertions it makes at the characters it consumed or
    right after them (anchors, word boundaries, lookbehinds, none of which reads more than the
    character after its position and whether one follows that), not a lookahead nor what commits
    to its first way (an atomic group, a possessive repeat). None where that is unbounded or not
    known (as ``reach``), or the pattern reads so otherwise."""
    try:
        parsed = parse_as_python(pattern)
        for op, av in walk(parsed):
            if op.name in ("ATOMIC_GROUP", "POSSESSIVE_REPEAT") or (op.name in ("ASSERT", "ASSERT_NOT") and av[0] > 0):
                return None
        return _span(parsed)[0]
    except (Unreadable, _Unbounded):
        return None


@functools.lru_cache(maxsize=256)
def assertion_reach(pattern: str) -> int | None:
    """The most characters that an assertion of ``pattern`` may read from its own position on: a
    lookahead's reach, 2 for an end or word-boundary assertion ("$" reads up to a final newline's
    next character), 0 where none reads forward. A match of ``pattern`` ending at ``e`` reads no
    character past ``e + assertion_reach - 1`` beyond what it consumes (its assertions stand at or
    before ``e``; one inside a lookahead is counted in that lookahead's reach). None where that is
    unbounded (a lookahead with a ``*``, ``+`` or ``{n,}`` repeat), not known (an assertion inside
    a lookbehind, a backreference in a lookahead) or the pattern is not read as the ``regex``
    package reads it (``parse_as_python``)."""
    try:
        parsed = parse_as_python(pattern)
        most = 0
        for op, av in walk(parsed):
            if op.name == "AT" and av.name not in _BACKWARD_AT:
                most = max(most, _ASSERTION_READS)
            elif op.name in ("ASSERT", "ASSERT_NOT"):
                most = max(most, _item(op.name, av)[1])  # (raises _Unbounded for a lookbehind reading ahead)
        return most
    except (Unreadable, _Unbounded):
        return None


def unbounded_lookahead(pattern: str) -> str | None:
    """The first lookahead of ``pattern`` (``(?=...)`` or ``(?!...)``, outside classes and comments)
    whose own pattern reads on without bound (``reach`` None: ``(?=[^z]*z)``), as written, or
    None. Searched again from every start where a match may begin, such a lookahead reads to the
    text's end each time."""
    open_: list[int] = []
    for part in pattern_parts(pattern):
        if part.kind == "(":
            open_.append(part.start)
        elif part.kind == ")" and open_:
            start = open_.pop()
            if pattern.startswith(("(?=", "(?!"), start) and reach(pattern[start + 3:part.start]) is None:
                return pattern[start:part.end]
    return None


@functools.lru_cache(maxsize=256)
def ends_at_text_end(pattern: str) -> bool:
    """Whether every match of ``pattern`` ends in an assertion of the text's end: its last
    top-level item (no top-level alternation) is ``\\Z``, or ``$`` outside multiline mode
    (``.+\\Z``, ``[\\s\\S]+$``). Such a match holds only where the text ends or (``$``) before a
    final newline, so any character more undoes it: it is a stop only where the output ends. False
    where the pattern is not read as the ``regex`` package reads it (``parse_as_python``)."""
    try:
        parsed = parse_as_python(pattern)
    except Unreadable:
        return False
    if not parsed.data:
        return False
    op, av = parsed.data[-1]
    return op.name == "AT" and (av.name == "AT_END_STRING" or (av.name == "AT_END" and not parsed.state.flags & re.MULTILINE))
