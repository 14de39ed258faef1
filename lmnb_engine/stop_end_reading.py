"""How a stop regex's match that may read the end of the text is told final (``StopStringMatcher.find``).

A stop regex with an end assertion (``$``, ``\\b``, ``\\Z``), a negative lookahead or a conditional
on a lookaround may match where the text so far ends and not once more text comes (``\\bEND\\b`` on
"END", then "ING"): such a match is a stop only once it is final, no text after it able to undo
it, or where the output ends there. This module tells that: per pattern, its relaxed form and its
negative lookaheads (``EndReading``, ``end_reading``), one search saying that no match near the
text's end is final (``windowed``) and, where every match ends in assertions, those alone, searched
first where a match may end (``ending_assertions``), per top-level alternative where there are several
(``branches``); per match, the checks ``StopStringMatcher`` inherits
(``EndReadingChecks``), which read its state: ``_shared`` (``StopRegexes``), ``_regexes``,
``_held_to`` (the length of the text not checked, the first ``min_new_tokens``) and ``_pending``
(where a match that reads the text's end begins, which ``safe_len`` holds back) and ``_undoing``
(per pattern, the character ``_none_final`` last found to settle no match), and call its
``_budget()``: the seconds one search may take (``stop_matcher.REGEX_TIMEOUT_S``, where callers and
tests set it, read at each check), past which a search raises ``TimeoutError``.

The patterns' rewritten forms, shared with the partial search, come from ``stop_relaxed``. This
module does not import ``stop_matcher``, which imports it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple

from lmnb_engine.regex_parts import global_flags
from lmnb_engine.regex_reach import assertion_reach, reach
from lmnb_engine.stop_relaxed import LOOKAHEAD_MARK, ending_by, relax
from lmnb_engine.stop_together import settled_together, undone_by_one


class EndReading(NamedTuple):
    """How to tell whether a match of a stop regex that may read the end of the text is final,
    whatever text comes next (``StopStringMatcher._final``). ``relaxed``: the pattern as the
    partial search reads it (``stop_relaxed.relax``, compiled), whose whole match is one no end
    assertion of which reads the text's end, its negative lookaheads marked; ``lookaheads``: each
    negative lookahead's X relaxed, compiled, whose partial match where the lookahead stood in the
    match tells that more text may undo it (the partial search does not: ``a(?!bc)`` on "ab" is a
    whole match to it). Where the pattern cannot be read so (``relaxed`` None), ``ahead``
    instead: the characters past its match that it may read (None where unknown or unbounded:
    final only where the output ends). ``settled``: the pattern whose whole match, in a search
    that is not partial, is one no text after it undoes (``_settled_form``), None where it cannot
    be made: it finds a final path that the partial match of ``relaxed`` hides behind an earlier
    one reading past the text's end (``\\w(?!a)|x`` on "x")."""

    relaxed: Any
    lookaheads: tuple
    ahead: int | None
    settled: Any = None


def end_reading(pattern: str) -> EndReading:
    """``StopRegexes.end_readings`` of ``pattern``, one that may read the text's end (``EndReading``)."""
    import regex

    lookaheads: list[str] = []
    relaxed = relax(pattern, lookaheads=lookaheads)
    lead = global_flags(pattern)
    try:
        if relaxed is not None:
            return EndReading(regex.compile(relaxed), tuple(regex.compile(lead + x) for x in lookaheads), 0,
                              _settled_form(pattern))
    except regex.error:
        pass
    if not re.search(r"\(\?[=!(]", pattern):
        # (a pattern not read, whose only forward reading is its end and word-boundary assertions
        # (where assertion_reach does not read it either): none reads 2 characters past its place)
        return EndReading(None, (), 2)
    return EndReading(None, (), assertion_reach(pattern))


# What makes a whole match at the text's end, in a search that is not partial, one that more text
# may undo though no assertion in it reads past that end, found in the pattern's text erring towards
# yes: what commits to the first way it matches and takes what more text adds (an atomic group, a
# possessive repeat, \X, \R, a verb: "[ab](?>a*)(?<=b)" matches "b", not "ba"), a call of a group, a
# backreference, a fuzzy constraint (the best match is chosen); and a lookbehind that holds what may
# read the text's end (_READING_LOOKBEHIND)
_NOT_SETTLED = re.compile(r"\(\?>|[*+?}]\+|\\[XRgk1-9]|\(\*|\(\?(?:R|&|P>|P=|[+-]?\d)|\{(?!\d*(?:,\d*)?\})")
# In a lookbehind's body, what may read the text's end, found erring towards yes (an escaped "\$"
# too): an end or word-boundary assertion, a lookaround, a conditional. Left as written in the
# settled form, its end assertions unrelaxed: "a(?<!a\B)" matches "a", not "ab". A lookbehind
# without them reads only text before its place, there already, as the whole search does
_END_IN_LOOKBEHIND = re.compile(r"\\[bBZzmM]|\$|\(\?[=!(<]")


def _reading_lookbehind(pattern: str) -> bool:
    """Whether a lookbehind in ``pattern`` holds what may read the text's end (``_END_IN_LOOKBEHIND``)."""
    from lmnb_engine.regex_parts import pattern_parts

    opened: list[int | None] = []  # per open group: where its body starts where it is a lookbehind
    parts = list(pattern_parts(pattern))
    for k, part in enumerate(parts):
        if part.kind == "(":
            head = pattern[parts[k + 1].start:parts[k + 1].end] if k + 1 < len(parts) else ""
            opened.append(parts[k + 1].start + 3 if head.startswith(("?<=", "?<!")) else None)
        elif part.kind == ")" and opened:
            start = opened.pop()
            if start is not None and _END_IN_LOOKBEHIND.search(pattern, start, part.start):
                return True
    return False


def _settled_form(pattern: str) -> Any:
    """``EndReading.settled`` of ``pattern``: its relaxed form for a search that is not partial
    (``stop_relaxed.relax``, ``partial`` False: each end assertion first reads past where its value
    can still change, so at the text's end it fails) with each negative lookahead ``(?!X)`` followed
    by what settles X: where X is one-character items, that the text after it is no proper prefix
    of an X (``_unopened``), else as many characters as X's reach (``regex_reach.reach``). None
    where a construct of ``_NOT_SETTLED`` is in it, such an X's reach is unbounded or the form
    does not compile."""
    import regex

    if _NOT_SETTLED.search(pattern) or _reading_lookbehind(pattern):
        return None
    lookaheads: list[str] = []
    form = relax(pattern, lookaheads=lookaheads, partial=False)
    if form is None:
        return None
    lead = global_flags(pattern)
    for i, x in enumerate(lookaheads):
        if (unopen := _unopened(lead, x)) is None and (ahead := reach(lead + x)) is None:
            return None
        form = form.replace(f"(?P<{LOOKAHEAD_MARK}{i}>)", unopen or f"(?=[\\s\\S]{{{ahead}}})")
    try:
        return regex.compile(form)
    except regex.error:
        return None


def _unopened(lead: str, x: str) -> str | None:
    """Where a negative lookahead's X (``x``, under the global flags ``lead``) is a sequence of
    one-character items c1 ... cn: what asserts, after ``(?!X)``, that no more text can make X
    match there, ``(?!\\Z|c1\\Z|c1c2\\Z|...)`` (the text from there is no proper prefix of an X);
    None for any other X. Following ``(?!X)`` by X's reach in characters instead (the settled
    form's way for the others) also asks that the text hold them: ``(?!b )`` before the last "a" of
    " a", which no text after can undo, was taken as open, and another match chosen."""
    from lmnb_engine.regex_reach import Unreadable, parse_as_python
    from lmnb_engine.regex_tree import one_character

    try:
        items = [one_character(op.name, av) for op, av in parse_as_python(lead + x)]
    except Unreadable:
        return None
    if not items or None in items:
        return None
    prefixes = ["".join(items[:n]) + r"\Z" for n in range(len(items))]
    return f"(?!{'|'.join(prefixes)})"


# What in a negative lookahead's X may read the text before its place, or read it otherwise than
# by consuming characters: an assertion, a lookaround, a conditional, a verb (found in its text
# with escapes and sets first taken out: windowed)
_NOT_CONSUMING = re.compile(r"\\[AbBGmMZzKyY]|[\^$]|\(\?[<(=!]|\(\*")
_ESCAPE_OR_SET = re.compile(r"\\[AbBGmMZzKyY]|\\.|\[\^?\]?(?:\\.|[^\]\\])*\]")


def windowed(pattern: str, reading: EndReading, after: int) -> Any:
    """``StopRegexes.windows`` of ``pattern``, whose ``end_reading`` is ``reading`` and whose
    assertions read ``after`` characters past a match at most: its relaxed form, as a search that
    is not partial reads it, matching only where at most ``after`` characters follow its match
    (``_ending_within``); None where that form cannot be made, or ``reading`` has none
    (``EndReading.relaxed`` None). There each negative lookahead
    ``(?!X)`` whose X consumes one character and reads nothing else (``[\\s\\S]``'s reach, no
    assertion or lookaround, and a partial match where the text ends) is followed by a
    character, its mark (``LOOKAHEAD_MARK``) made ``(?=[\\s\\S])``: where the text ends right
    after it, X may still match what comes (``_lookahead_open``), so no match through it there
    is final. Else the window held a whole match from every start of a run that such a lookahead
    ends (``a\\w*(?!\\w)`` over a run of letters), and each start was checked on its own after
    each character, at a cost growing with the run."""
    if reading.relaxed is None:
        return None
    lookaheads: list[str] = []
    window = relax(pattern, lookaheads=lookaheads, partial=False)
    if window is None:
        return None
    for i, x in enumerate(reading.lookaheads):
        body = x.pattern[len(global_flags(x.pattern)):]
        kept = _ESCAPE_OR_SET.sub(lambda m: m.group() if _NOT_CONSUMING.fullmatch(m.group()) else "", body)
        if (reach(x.pattern) == 1 and assertion_reach(x.pattern) == 0 and not _NOT_CONSUMING.search(kept)
                and (f := x.match("", partial=True)) is not None and f.partial):
            window = window.replace(f"(?P<{LOOKAHEAD_MARK}{i}>)", r"(?=[\s\S])")
    return _ending_within(window, after)


# A top-level item of a pattern that asserts and consumes nothing, and reads no text before the
# search's start otherwise than a full search does (not "^", \A, \G): an end or word-boundary
# assertion, or a lookaround (ending_assertions)
_ASSERTION_ITEM = re.compile(r"\\[bBZzmM]|\$|\(\?<?[=!]")
# What after a pattern's global flags sets flags for all of it (the regex package's version 0: an
# inline flag anywhere is global), which its tail alone would not have
_INLINE_FLAG = re.compile(r"\(\?[a-zA-Z-][a-zA-Z0-9-]*\)")


class Tail(NamedTuple):
    """The assertions that end every match of a stop regex (``ending_assertions``), empty matches of
    each of which hold wherever the regex's own form (``plain``: the pattern, ``window``: its
    window, ``windowed``) may end a match, searched where those would read every start."""

    window: Any
    plain: Any


def ending_assertions(pattern: str, after: int) -> Tail | None:
    """``StopRegexes.tails`` of ``pattern``: where its top level is one sequence that ends in
    assertions (``\\w+\\b``, ``[a-z]+\\b(?!-)``, ``a\\w*(?!\\w)``), those assertions alone
    (its global flags kept first), as written (``plain``) and as ``windowed`` reads them
    (``window``, ``after`` the pattern's assertion reach): every match passes them last, so one
    ends only where they hold, and in the window each is rewritten alike or, where the rest of the
    pattern decides its form (a multiline flag turned off there), more loosely. Searched over the
    places a match may end (``_none_final``: the window's last ``after`` + 1), where they find none
    the pattern has no match, found without reading every start. None where the pattern is not of
    that form (``top_level_tail``), or either form of its tail cannot be made."""
    import regex

    found = top_level_tail(pattern)
    if found is None:
        return None
    tail, _ = found
    window = windowed(tail, end_reading(tail), after)
    try:
        return None if window is None else Tail(window, regex.compile(tail))
    except regex.error:  # (a reference to a group of the pattern's head)
        return None


def top_level_tail(pattern: str) -> tuple[str, list] | None:
    """Where ``pattern``'s top level is one sequence that ends in assertions (end, boundary or
    start ones, lookarounds) after something that consumes: those assertions alone, its global
    flags kept first, and them as Python's parser reads them (``(op, av)`` pairs); None where it
    is not of that form, or holds an inline flag after its global ones, or is verbose, or Python's
    parser reads its last items otherwise."""
    from lmnb_engine.regex_parts import pattern_parts
    from lmnb_engine.regex_reach import Unreadable, parse_as_python

    lead = global_flags(pattern)
    if _INLINE_FLAG.search(pattern, len(lead)) or "x" in lead:
        return None
    body = pattern[len(lead):]
    depth, count, items = 0, False, []  # items: the top level's (start in body, whether an assertion)
    for part in pattern_parts(body):
        text = body[part.start:part.end]
        if part.kind == "(":
            if depth == 0:
                items.append((part.start, bool(_ASSERTION_ITEM.match(body, part.start))))
            depth += 1
        elif part.kind == ")":
            depth -= 1
        elif depth == 0 and part.kind == "":
            for i, c in enumerate(text):
                if c == "|":
                    return None
                if count or c in "*+?{":  # (a repeat makes the item before it one that consumes: "\b*" too)
                    count = (count or c == "{") and c != "}"
                    if items:
                        items[-1] = (items[-1][0], False)
                else:
                    items.append((part.start + i, c == "$"))
        elif depth == 0 and part.kind != "comment":
            items.append((part.start, part.kind == "escape" and bool(_ASSERTION_ITEM.fullmatch(text))))
    cut = len(items)
    while cut and items[cut - 1][1]:
        cut -= 1
    if cut == 0 or cut == len(items):
        return None
    tail = body[items[cut][0]:]
    try:  # (what was read here as the top level's last items, Python's parser reads so too)
        whole, head, last = (list(parse_as_python(lead + t)) for t in (body, body[:items[cut][0]], tail))
    except Unreadable:
        return None
    if len(whole) != len(head) + len(last) or any(op.name not in ("AT", "ASSERT", "ASSERT_NOT") for op, _ in last):
        return None
    return lead + tail, last


# What in a pattern reads across its top-level alternatives: a recursion or a call of a group
# ((?R), (?1), (?&n), (?P>n)) or a verb ((*SKIP), (*COMMIT)), which one alternative alone would read
# otherwise (found in its text, erring towards yes: StopRegexes.branches)
_ACROSS = re.compile(r"\(\?(?:R|[+-]?\d|&|P>)|\(\*")


class Branch(NamedTuple):
    """One top-level alternative of a stop regex, as ``_none_final`` searches it: its window
    (``windowed``), itself as written (``plain``) and its ending assertions (``ending_assertions``),
    None where it has none."""

    window: Any
    plain: Any
    tail: Tail | None


def branches(pattern: str, compiled: Any, after: int) -> tuple[Branch, ...] | None:
    """``StopRegexes.branches`` of ``pattern`` (``compiled``, its assertion reach ``after``) where
    its top level is alternatives (``\\w+\\b|x``): each alone, the pattern's global flags kept
    first, as a ``Branch``. A match of the pattern, or of its window, from a start is one of some
    alternative's, or of its window, from there, so the pattern's window matches where one of
    theirs does and its leftmost match starts where theirs first do; each is searched on its own,
    the one whose matches all end in assertions those first, not read from every start of a run
    (``\\w+\\b``). None where the top level has no "|", or the pattern holds a group (whose number
    or name an alternative alone reads otherwise), a recursion or a verb (``_ACROSS``), an inline
    flag after its global ones, or is verbose, or an alternative's window cannot be made."""
    import regex

    from lmnb_engine.regex_parts import pattern_parts

    lead = global_flags(pattern)
    if compiled.groups or _ACROSS.search(pattern) or _INLINE_FLAG.search(pattern, len(lead)) or "x" in lead:
        return None
    body, depth, bars = pattern[len(lead):], 0, []
    for part in pattern_parts(body):
        if part.kind == "(":
            depth += 1
        elif part.kind == ")":
            depth -= 1
        elif depth == 0 and part.kind == "":
            bars += [part.start + i for i, c in enumerate(body[part.start:part.end]) if c == "|"]
    if not bars:
        return None
    found = []
    for alternative in (lead + body[i + 1:j] for i, j in zip([-1] + bars, bars + [len(body)])):
        window = windowed(alternative, end_reading(alternative), after)
        if window is None:
            return None
        try:
            found.append(Branch(window, regex.compile(alternative), ending_assertions(alternative, after)))
        except regex.error:
            return None
    return tuple(found)


def _ending_within(pattern: str, after: int) -> Any:
    """``pattern`` matching only where at most ``after`` characters follow its match
    (as ``stop_relaxed.ending_by`` matches where at least so many do)."""
    import regex

    lead = global_flags(pattern)
    try:
        return regex.compile(f"{lead}(?:{pattern[len(lead):]})(?=[\\s\\S]{{0,{after}}}\\Z)")
    except regex.error:
        return None


class EndReadingChecks:
    """The per-match checks of ``StopStringMatcher`` for regexes whose match may read the text's end
    (module docstring: the state they read)."""

    def _final(self, k: int, text: str, at_end: bool, m: Any, end: int) -> Any:
        """``m``, a match of regex ``k`` in ``text[:end]``, where no text after ``end`` can undo it
        (``StopRegexes.end_readings``) or the output ends there (``at_end`` and ``end`` is
        ``text``'s), or another from its start that none can, else None: then it reads the end of
        ``text[:end]``, and where that is ``text``'s, find keeps its start (``_pending``).

        Raises:
            TimeoutError: a match ran past ``_budget()`` seconds.
        """
        budget = self._budget()
        if at_end and end == len(text):
            return m
        relaxed, lookaheads, ahead, settled = self._shared.end_readings[k]
        if relaxed is None:
            final = ahead is not None and m.end() + ahead <= end
        else:  # (the relaxed match of m's own span: whole where no assertion in it reads past end)
            final = self._settled_span(k, text, m.start(), m.end(), end) is not None
        if final:
            return m
        if relaxed is not None:  # another match from its start that is final (ab?(?!a) on "aab" from 1: "a")
            f = relaxed.match(text, m.start(), end, partial=True, timeout=budget)
            if f is not None and not f.partial and self._unheld(k, text, f.start(), f.end()) and not self._lookahead_open(
                    lookaheads, f, text, end):
                return f
            # (where the relaxed match reads on to one a negative lookahead leaves open, the shortest,
            # within the pattern's reach, to ``end`` where that is unbounded: x[ab]*(?!c)|a on "xa "
            # from 0 is "x", the empty one too: a(?!\w)|(?=a) on " a" from 1; and from where its
            # assertions read the last character: each shorter text from past the text not checked
            # was checked, and one final there was met then; one ending in the text not checked only
            # where that text did not hold it, _unheld)
            reach, ahead = self._shared.reach[k], self._shared.assertion_reach[k]
            first = max(m.start(), 0 if ahead is None else end - ahead)
            for e in range(first, end + 1 if reach is None else min(end, m.start() + reach) + 1):
                if e == m.end() or not self._unheld(k, text, m.start(), e):  # (m's own span: not final, above)
                    continue
                if (f := self._settled_span(k, text, m.start(), e, end)) is not None:
                    return f
        if end == len(text):
            self._pending[k] = min(self._pending.get(k, end), m.start())
        return None

    def _settled_span(self, k: int, text: str, start: int, e: int, end: int) -> Any:
        """A match of regex ``k`` in ``text[:end]`` from ``start`` to ``e`` that no text after
        ``end`` can undo, None where none is found: the relaxed pattern's match there, whole where
        no assertion in it reads past ``end`` and no negative lookahead in it is open
        (``_lookahead_open``); else, where the regex package's partial match took an earlier way
        that reads past ``end`` and so hid a later one that does not (``\\w(?!a)|x`` on "x": the
        partial ``\\w(?!a)``, not ``x``), the match of ``EndReading.settled`` there, which tries
        every way; else, where no way alone is settled but several may be together
        (``StopRegexes.together``: ``a(?:\\B|(?!\\w))`` after "a"), the match that every text
        that can follow keeps (``stop_together.settled_together``). Only a regex with
        ``EndReading.relaxed``.

        Raises:
            TimeoutError: a match ran past ``_budget()`` seconds.
        """
        budget = self._budget()
        relaxed, lookaheads, _, settled = self._shared.end_readings[k]
        exact = ending_by(relaxed.pattern, end - e, exact=True)
        f = None if exact is None else exact.match(text, start, end, partial=True, timeout=budget)
        if f is not None and not f.partial and not self._lookahead_open(lookaheads, f, text, end):
            return f
        if f is None:  # (no way from start to e at all)
            return None
        if settled is not None and (exact := ending_by(settled.pattern, end - e, exact=True)) is not None \
                and (g := exact.match(text, start, end, timeout=budget)) is not None:
            return g
        how = self._shared.together[k]
        return None if how is None else settled_together(how, self._regexes[k].pattern, text, start, e, end, budget)

    def _unheld(self, k: int, text: str, start: int, end: int) -> bool:
        """Whether a match of regex ``k`` in ``text`` from ``start`` to ``end`` is new past the text
        not checked (the first ``min_new_tokens``, ``_held_to`` characters): it ends after that
        text, or that text alone did not hold it, an assertion reading past it (``b[a ]*\\b`` after
        "b " not checked, then "a": "b " from 0 is a match once "a" comes, as ``_new_before`` finds
        where the search meets it).

        Raises:
            TimeoutError: a match ran past ``_budget()`` seconds.
        """
        budget = self._budget()
        held_to, ahead = self._held_to or 0, self._shared.assertion_reach[k]
        if end > held_to:
            return True
        if ahead is not None and end + ahead <= held_to:  # (it reads no character past that text)
            return False
        exact = ending_by(self._regexes[k].pattern, held_to - end, exact=True)
        return exact is not None and exact.match(text, start, held_to, timeout=budget) is None

    def _none_final(self, k: int, text: str, floor: int, end: int) -> bool:
        """Whether no match of regex ``k`` in ``text[:end]`` from ``floor`` on is final (``_final``),
        by one search, where that tells: none of the relaxed pattern ends whole within the pattern's
        assertion reach of ``end`` (``StopRegexes.windows``). A final match ending earlier was final
        at an earlier check, and met there. Then the earliest match there, which reads the end, is
        held back (``_pending``) as ``_final`` holds it. The search of every start after each
        character, each through ``_final``, grew with the square of an open match's length
        (\\w+\\b over a run of letters was given up at ~600 characters), and so did the window's
        own search, every start of the run read to its end (past its budget at ~1000 to 2000
        characters): where the pattern's matches all end in assertions, those alone are searched
        first over the places a match in the window may end (``StopRegexes.tails``), and where
        none holds the window has no match; a pattern of top-level alternatives so each alternative
        (``StopRegexes.branches``: ``\\w+\\b|x``). Where several ways may settle a match
        together (``StopRegexes.together``), the window, which tries one way at a time, does not
        tell: a character after which no match ends there does (``stop_together.undone_by_one``).

        Raises:
            TimeoutError: a search ran past ``_budget()`` seconds.
        """
        budget = self._budget()
        window = self._shared.windows[k]
        if window is None:
            return False
        parts = self._shared.branches[k] or (Branch(window, self._regexes[k], self._shared.tails[k]),)
        since = max(floor, end - self._shared.assertion_reach[k])
        for part in parts:
            if ((part.tail is None or part.tail.window.search(text, since, end, timeout=budget) is not None)
                    and part.window.search(text, floor, end, timeout=budget) is not None):
                return False
        if (how := self._shared.together[k]) is not None:  # (the window tries one way at a time)
            ends = [(None if part.tail is None else part.tail.plain, part.plain.pattern) for part in parts]
            undone = undone_by_one(how, self._regexes[k].pattern, text, end, budget, self._undoing.get(k, ""), ends)
            if undone is None:  # (every character that may follow leaves a match: several ways may settle it)
                return False
            self._undoing[k] = undone
        # (the earliest match anywhere: where its tail holds nowhere, none, found in one pass)
        starts = [m.start() for part in parts
                  if end == len(text)
                  and (part.tail is None or part.tail.plain.search(text, floor, end, timeout=budget) is not None)
                  and (m := part.plain.search(text, floor, end, timeout=budget)) is not None]
        if starts:
            self._pending[k] = min(self._pending.get(k, end), *starts)
        return True

    def _lookahead_open(self, lookaheads: tuple, f: Any, text: str, end: int) -> bool:
        """Whether a negative lookahead where it stood in ``f`` (a match of ``EndReading.relaxed``)
        has an X that text after ``end`` may complete, undoing ``f``.

        Raises:
            TimeoutError: a match ran past ``_budget()`` seconds.
        """
        budget = self._budget()
        # (a partial match from the end of the text searched is partial to the regex package
        # whatever X's lookbehinds read there: "(?<=a)\w" from the end of "ab". From one character
        # earlier, that character consumed first, they are read: a\w*(?!(?<=a)\w) on "bab" met
        # "ab" only once one more character came)
        return any((x := (_after_one(rx.pattern).match(text, p - 1, end, partial=True, timeout=budget) if p == end > 0
                          else rx.match(text, p, end, partial=True, timeout=budget))) is not None and x.partial
                   for i, rx in enumerate(lookaheads) for p in f.starts(f"{LOOKAHEAD_MARK}{i}"))


@functools.lru_cache(maxsize=256)
def _after_one(pattern: str) -> Any:
    """``pattern`` (a negative lookahead's X, compiled by ``end_reading``) after one character of
    any kind, its global flags kept first: matched from one character before where X stood."""
    import regex

    lead = global_flags(pattern)
    return regex.compile(f"{lead}[\\s\\S](?:{pattern[len(lead):]})")
