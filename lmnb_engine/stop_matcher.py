"""Stop-string and stop-regex matching for streamed output.

Stop strings and stop regexes are matched on the text the detokenizer gives (``detokenizer``),
including across token boundaries; text that could still turn into a stop is held back from the
stream, so a matched stop is never shown. How a match that may read the text's end is told final
is in ``stop_end_reading`` (whose checks ``StopStringMatcher`` inherits), and how a stop regex is
rewritten for these searches in ``stop_relaxed``; neither imports this module. The budget of every
search, ``REGEX_TIMEOUT_S``, is set here only.
"""

from __future__ import annotations

import collections
import functools
import re
from typing import Any, Callable, Collection, Sequence

from lmnb_engine.regex_parts import global_flags, pattern_parts
from lmnb_engine.regex_last import last_characters
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_reach import assertion_reach, ends_at_text_end, reach, settled_width, unbounded_lookahead
from lmnb_engine.stop_automaton import AutomatonRun, automaton
from lmnb_engine.stop_end_reading import (EndReadingChecks, branches, end_reading, ending_assertions, top_level_tail,
                                          windowed)
from lmnb_engine.stop_relaxed import MULTILINE_FLAG, ending_by, relax
from lmnb_engine.stop_together import together

# How long one search of a stop regex may take, in seconds. A search over an output's tail takes
# microseconds, well under a millisecond for a linear pattern over tens of thousands of characters;
# one that backtracks catastrophically ("(x|x)+y" on many x's) takes seconds, doubling with each
# character, on the scheduler's thread, where it stalls every request. Past this the search is given
# up and the request aborted: it stalls the others about twice this, once.
REGEX_TIMEOUT_S = 0.05


class _StopPrefixes:
    """Aho-Corasick automaton over the stop strings (Aho & Corasick, "Efficient string matching",
    CACM 1975), used for its state only: after reading a text, the state's depth is the length of
    the text's longest suffix that is a prefix of some stop. Read incrementally, that costs O(1)
    amortized per new character whatever the number and length of the stops (testing each suffix
    against each stop cost their product on every token), plus one comparison of the text with the
    last one read."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        for s in stops:
            node = 0
            for ch in s:
                if ch not in self._goto[node]:
                    self._goto[node][ch] = len(self._goto)
                    self._goto.append({})
                    self._depth.append(self._depth[node] + 1)
                node = self._goto[node][ch]
        self._fail = [0] * len(self._goto)
        queue = collections.deque(self._goto[0].values())  # breadth first: a node's fail link is shallower
        while queue:
            node = queue.popleft()
            for ch, child in self._goto[node].items():
                self._fail[child] = self._next(self._fail[node], ch) if node else 0
                queue.append(child)
        self._text, self._state = "", 0

    def _next(self, node: int, ch: str) -> int:
        while node and ch not in self._goto[node]:
            node = self._fail[node]
        return self._goto[node].get(ch, 0)

    def suffix_len(self, text: str, limit: int) -> int:
        """Length of ``text``'s longest suffix that is a prefix of some stop and at most ``limit``
        characters long."""
        if not text.startswith(self._text):  # not the last text extended: read it from the start
            self._text, self._state = "", 0
        state = self._state
        for ch in text[len(self._text):]:
            state = self._next(state, ch)
        self._text, self._state = text, state
        while self._depth[state] > limit:  # the next shorter such suffix
            state = self._fail[state]
        return self._depth[state]


class StopRegexes:
    """The compiled stop regexes of one request, shared by its ``n`` samples: a search of one that
    runs past ``REGEX_TIMEOUT_S`` gives that pattern up for all of them (``given_up``) and sets
    ``problem``, so the other samples are aborted without searching it again (one stall per
    request, not one per sample); the other patterns are still searched, and a match of one on
    the same token still ends its sample with "stop".

    Args:
        patterns: ``SamplingParams.stop_regex`` as a list (checked there).
    """

    def __init__(self, patterns: Sequence[str]) -> None:
        if patterns:
            import regex  # its partial matching says where a match may yet begin

            self.compiled = [regex.compile(p) for p in patterns]
            # (where a match ending in text not checked may end later instead: _new_match)
            self.longest = [regex.compile(p, regex.POSIX) for p in patterns]
        else:
            self.compiled, self.longest = [], []
        # per pattern: whether it may match a text that ends earlier without matching the longer
        # text (StopStringMatcher.find may then not skip the check after each character)
        self.end_sensitive = [bool(_END_SENSITIVE.search(p)) for p in patterns or ()]
        # per pattern: what safe_len's partial search uses (None: nothing past the floor is shown).
        # The regex package decides an end assertion at the text's end as if no text followed, so
        # a match start that only more text would complete ('a\B' on "a", then "b") was dropped
        # and shown; an end-sensitive pattern is searched with those assertions relaxed
        self.partial = []
        dropped = []  # per pattern: its partial form with its lookbehinds left out, where it is that
        for p, rx, sensitive in zip(patterns or (), self.compiled, self.end_sensitive):
            body = p[len(global_flags(p)):]
            dropped.append(None)
            if _LATE_LOOKBEHIND.search(body):
                # (None: nothing past the floor shown, where the window or an automaton leaves it)
                relaxed = dropped[-1] = None if _NO_SUPERSET.search(body) else relax(p, drop_lookbehinds=True)
            elif (sensitive and _END_ASSERTION.search(p)) or ("^" in p and MULTILINE_FLAG.search(p)):
                relaxed = relax(p)
            else:
                relaxed = p
            try:
                self.partial.append(rx if relaxed == p else None if relaxed is None else regex.compile(relaxed))
            except regex.error:  # a form of the pattern not read right: hold back, never show a stop
                self.partial.append(None)
        # per pattern: its incremental automaton (stop_automaton), None where it cannot represent the
        # pattern or the pattern is end-sensitive: that one is searched by the regex package
        self.automata = [None if sensitive else automaton(p)
                         for p, sensitive in zip(patterns or (), self.end_sensitive)]
        # per pattern searched: the automaton of the pattern with its assertions left out, which
        # matches wherever the pattern does (None where it cannot represent even that): while it
        # finds no match in the text, find need not search the pattern (\bBEGIN\b[\s\S]*?\bEND\b
        # open over a long output: a search per new character, each over all of the open match)
        self.loosened = [automaton(p, loosened=True) if a is None else None for p, a in zip(patterns or (), self.automata)]
        # per pattern: how far past a start its matching there reads (regex_reach), None where
        # unbounded: a match more text may still complete or make new begins in the last reach - 1
        # characters, so a search need not start before them
        self.reach = [reach(p) for p in patterns or ()]
        # per pattern whose partial form is its loosened automaton's (its assertions, all lookbehinds
        # after its start, left out: that form holds none, as an automaton of it tells) and whose
        # reach is unbounded: safe_len takes where a match may still begin from that automaton's
        # run, read a character at a time, where the partial search, from the floor to the text's
        # end each token, grew with the square of an open run (\w+(?<=ing) over a run of letters)
        self.loose_partial = [a is not None and r is None and d is not None and automaton(d) is not None
                              for a, r, d in zip(self.loosened, self.reach, dropped)]
        # per pattern: how far past a match's end its assertions read (None: unbounded), so _final
        # need try only the ends whose match reads the text's last character
        self.assertion_reach = [assertion_reach(p) for p in patterns or ()]
        # per pattern: how many characters its matches consume at most, where safe_len may tell
        # from the text's end that a start that many or more before it begins no stop (_settled);
        # None where it may not (a longer pattern is not asked: each start tried costs 10 matches)
        self.settled_width = [w if (w := settled_width(p)) is not None and w <= _SETTLED_WIDTH else None
                              for p in patterns or ()]
        # per pattern: its head relaxed as for the partial search (_open_head), None where it has none
        self.open_heads = [_open_head(p) for p in patterns or ()]
        # per pattern whose match may read the text's end (an end assertion, a negative lookahead, a
        # conditional on a lookaround): how find tells whether a match is final (EndReading); None
        # where every match is final once met
        self.end_readings = [end_reading(p) if sensitive and _READS_END.search(p) else None
                             for p, sensitive in zip(patterns or (), self.end_sensitive)]
        # per pattern: whether every match ends in an assertion of the text's end (\Z, $), so none
        # is final before the output ends (ends_at_text_end): find searches it only then, as the
        # search from each start after each character, every one still open, grows with the square
        # of the output (.+\Z ran past REGEX_TIMEOUT_S at ~1000 characters)
        # per pattern whose match may read the text's end: where several ways of one match may
        # settle it together though none does alone, what tries every text that may follow
        # (stop_together.together; None where that cannot be or need not be tried): _final meets
        # such a match at once, where it was met a character late
        self.together = [None if r is None or r.relaxed is None else together(p)
                         for p, r in zip(patterns or (), self.end_readings)]
        self.end_only = [r is not None and ends_at_text_end(p) for p, r in zip(patterns or (), self.end_readings)]
        # per pattern whose matches find checks with _final: its relaxed form whole, ending within
        # its assertion reach of the text's end, where both are known (StopStringMatcher._none_final)
        self.windows = [None if r is None or a is None else windowed(p, r, a)
                        for p, r, a in zip(patterns or (), self.end_readings, self.assertion_reach)]
        # per pattern with a window: the assertions that end each of its matches, as written and as
        # its window reads them (stop_end_reading.ending_assertions), None where it has none: searched
        # first, over the places a match could end, not from every start of an open run
        self.tails = [None if w is None else ending_assertions(p, a)
                      for p, w, a in zip(patterns or (), self.windows, self.assertion_reach)]
        # per pattern with a window whose top level is alternatives: each alone, searched so
        # (stop_end_reading.branches), None where it is not split: a run one alternative leaves open
        # (\w+\b|x) is not read from every start through the others
        self.branches = [None if w is None else branches(p, c, a)
                         for p, c, w, a in zip(patterns or (), self.compiled, self.windows, self.assertion_reach)]
        # per pattern searched that reads nothing past its match (no end assertion, no lookahead:
        # _reads_past_match) and whose matches all end in lookbehinds (\w+(?<=ing), a.*(?<!a)):
        # those alone (_lookbehind_tail), None otherwise. A new match ends past the text checked,
        # where they hold: where they hold nowhere there, find need not search it (the search
        # from every start of an open run read each start to the run's end: ~100 ms a token at
        # 800 characters of a run, given up at ~1100)
        # (whether each pattern is such: searched, reading nothing past its match; told once)
        plain = [a is None and not sensitive and not _reads_past_match(p)
                 for p, a, sensitive in zip(patterns or (), self.automata, self.end_sensitive)]
        self.back_tails = [_lookbehind_tail(p) if ok else None for p, ok in zip(patterns or (), plain)]
        # ... and of those, one class of every character a match may end with (regex_last), None
        # where not known: a new match ends with one in the text past what was checked, so where
        # none is there, find need not search it (a{1,500}b over a run of "a"s: each of the last
        # 500 starts read to the run's end, a cost per token growing with the square of the bound)
        self.last_characters = [last_characters(p) if ok else None for p, ok in zip(patterns or (), plain)]
        self.given_up: set[int] = set()  # indices into ``compiled``
        self.problem: str | None = None


# The longest match (in characters) of a pattern whose starts near the text's end safe_len may find
# settled (StopRegexes.settled_width)
_SETTLED_WIDTH = 32
# What may follow the text, as its assertions at or before the text's end tell it apart: nothing, a
# word character, another, a final newline, a newline and more (StopStringMatcher._settled)
_FOLLOWERS = ("", "a", " ", "\n", "\n ")


# The end assertions and negative lookaheads, as text found in a pattern: _END_ASSERTION, and the
# start of _END_SENSITIVE
_END_ASSERTION_SOURCE = r"\$|\\[bBZzmM]|\(\?!"

# What lets a regex match where its text ends and not once more text comes: an end anchor ("a$"
# on "Wha" but not on "What"), a word boundary (the text's end is one), a negative lookahead (it
# sees nothing past the end), and what takes what more text adds and gives nothing back: an atomic
# group or possessive repeat, a grapheme cluster \X or line break \R (atomic too), a backtracking
# verb such as "(*PRUNE)" ("[ab](?>a*)(?<=b)" matches "b" in "b", not in "ba"; "\R(?<=\r)" "\r" in
# "\r", not in "\r\n"). Found in the pattern's text, erring towards yes (an escaped "\\$", "\\++"
# too): a yes only costs a search per new character instead of one per token.
_END_SENSITIVE = re.compile(_END_ASSERTION_SOURCE + r"|\\[XR]|\(\?\(\?|\(\?>|[*+?}]\+|\(\*")
# ... of which the end assertions and negative lookaheads, which stop_relaxed.relax rewrites for
# safe_len's partial search. A conditional on a lookaround ("x(?(?=y)q|)": "x" in "x", no match in
# "xy") and what gives nothing back are end-sensitive too, for find, but not rewritten (relax cannot
# read a conditional): the partial search keeps a start there as a whole or partial match
_END_ASSERTION = re.compile(_END_ASSERTION_SOURCE)

# ... and a conditional on a lookaround: what may make a match read the text's end, where what
# comes next may undo it (StopRegexes.end_readings)
_READS_END = re.compile(_END_ASSERTION_SOURCE + r"|\(\?\(\?")


# A lookbehind after the pattern's start (after flags): where one fails at the text's end, the
# regex package's partial search may drop a start that more text still completes past a repeat
# before it ("a.*?(?<!a)" on "aa": partial at 1, not 0, though "aab" matches from 0), and safe_len
# showed a stop's text. Such a pattern is searched with those lookbehinds left out
# (stop_relaxed.relax's drop_lookbehinds): a match of the pattern is one of that form too, so where
# the form's partial search says a match may begin is no later than where one of the pattern may.
# (Found in the pattern's text, erring towards yes: an escaped "\\(?<=" too; a lookbehind first in
# the pattern reads only text that is there, and is kept.)
_LATE_LOOKBEHIND = re.compile(r"(?<!^)\(\?<[=!]")
# What makes leaving a lookbehind out match less, not more, found in the pattern's text erring
# towards yes: what commits to the first way it matches, an atomic group or possessive repeat (an
# alternative a lookbehind ruled out is taken instead: "(?>a(?<=xa)|ab)c" matches "abc", "(?>a|ab)c"
# does not), a backtracking verb ("(*COMMIT)" reached earlier), a call of a group (the regex
# package's recursion may commit so too), a fuzzy constraint (a "{" that is no count: its best
# match is chosen), and an inline flag after the start (global in the regex package's version 0:
# one inside a lookbehind left out would change the whole pattern)
_NO_SUPERSET = re.compile(r"\(\?>|[*+?}]\+|\(\*|\(\?(?:R|&|P>|[+-]?\d)|\(\?[a-zA-Z-][a-zA-Z0-9-]*\)"
                          r"|\{(?!\d*(?:,\d*)?\})")


def _new_match(rx: Any, longest: Any, text: str, floor: int, new_from: int, endpos: int,
               final: Callable[[Any, int], Any] | None = None) -> Any:
    """The first match of ``rx`` in ``text[floor:endpos]`` that is new past ``new_from`` (the text
    already checked): it ends after it, or a lookahead, which sees past its end, could not match
    there yet ('x(?=y)' once "y" comes). None if there is none. ``final``, where given, takes such
    a match and ``endpos`` and returns the match to stop at from its start, or None where none is
    final there (``StopStringMatcher._final``): the search goes on to the next start.

    Every start is tried (``overlapped``), and where ``rx``'s own match there ends in text not
    checked (the first ``min_new_tokens``), ``longest`` (``rx`` with POSIX leftmost-longest
    matching) says whether one ending after it starts there too: a match straddling ``new_from``
    is new, as a stop string that does ("bc" of ``ab|bc`` on "xab" then "c"; "abc" of
    ``ab|abc`` on "ab" then "c"), where the search passed over it, and so is one ending by it that
    the text up to ``new_from`` did not hold (``_new_before``)."""
    for m in rx.finditer(text, floor, endpos, overlapped=True, timeout=REGEX_TIMEOUT_S):
        new = _new_from_start(rx, longest, text, m, new_from, endpos)
        if new is not None and (final is None or (new := final(new, endpos)) is not None):
            return new
    return None


def _new_from_start(rx: Any, longest: Any, text: str, m: Any, new_from: int, endpos: int) -> Any:
    """A match new past ``new_from`` from where ``m``, ``rx``'s match there, begins, or None
    (``_new_match``)."""
    if m.end() > new_from or rx.match(text, m.start(), new_from, timeout=REGEX_TIMEOUT_S) is None:
        return m
    start = m.start()
    if (m := longest.match(text, start, endpos, timeout=REGEX_TIMEOUT_S)) is not None and m.end() > new_from:
        return m
    return _new_before(rx.pattern, text, start, new_from, endpos)


def _new_before(pattern: str, text: str, start: int, new_from: int, endpos: int) -> Any:
    """The longest match of ``pattern`` in ``text[:endpos]`` from ``start`` that ends by
    ``new_from`` and that ``text[:new_from]`` did not hold, None if none: an assertion read past
    its end (r"a.*?\\B" after "ab" not checked, then "c", where "ab" from 0 is one only once "c"
    comes). Such a match is new, as a check after each character meets it. Every match from the
    start is tried, longest first (each the longest ending before the last), not only the longest
    or the first: ``a|abb|ab(?=bc)`` after "abb" not checked, then "c", holds "ab" from 0 anew,
    where "a" and "abb" were there before. Only a pattern that reads past its match's end can have
    one (an assertion reading past ``new_from``), only from a start within its reach of
    ``new_from`` and only ending within its assertions' reach of it
    (``regex_reach.assertion_reach``).

    Raises:
        TimeoutError: a match ran past ``REGEX_TIMEOUT_S``.
    """
    if not _reads_past_match(pattern) or ((r := reach(pattern)) is not None and start + r <= new_from):
        return None
    ahead = assertion_reach(pattern)
    low = start if ahead is None else max(start, new_from - ahead + 1)
    bound = new_from
    while bound >= low:
        if (longest := ending_by(pattern, endpos - bound)) is None:
            return None  # (a form not read right: as before this check, the match is not new)
        m = longest.match(text, start, endpos, timeout=REGEX_TIMEOUT_S)
        if m is None or m.end() < low or (before := ending_by(pattern, new_from - m.end(), exact=True)) is None:
            return None
        if before.match(text, start, new_from, timeout=REGEX_TIMEOUT_S) is None:
            return m
        bound = m.end() - 1
    return None


@functools.lru_cache(maxsize=256)
def _reads_past_match(pattern: str) -> bool:
    """Whether ``pattern`` may read past its match's end, found in its text erring towards yes: a
    lookahead, an end assertion, or what takes more text whole (``_END_SENSITIVE``)."""
    return bool(_END_SENSITIVE.search(pattern)) or "(?=" in pattern


def _lookbehind_tail(pattern: str) -> Any:
    """``StopRegexes.back_tails`` of ``pattern``, one that reads nothing past its match's end
    (``_reads_past_match``, which the caller tells): where its top level ends in lookbehinds only
    (``stop_end_reading.top_level_tail``), those lookbehinds, compiled with its global flags; else
    None. Each match of the pattern ends where they hold."""
    import regex

    if (found := top_level_tail(pattern)) is None:
        return None
    tail, items = found
    if any(op.name not in ("ASSERT", "ASSERT_NOT") or av[0] > 0 for op, av in items):
        return None
    try:
        return regex.compile(tail)
    except regex.error:  # (a reference to a group of the pattern's head)
        return None


# A class of every character ([\s\S] and its like), as written in a pattern
_ANY_CLASS = re.compile(r"\[(?:\\s\\S|\\S\\s|\\d\\D|\\D\\d|\\w\\W|\\W\\w)\]")


def _open_head(pattern: str) -> Any:
    """The part of ``pattern`` before its first repeat of any character (``[\\s\\S]*?``, ``[\\d\\D]*``,
    ``.*`` under ``(?s)``) outside every group, compiled relaxed as for the partial search
    (``stop_relaxed.relax``), where the pattern has no ``|`` outside groups and is not verbose; None
    where it has no such repeat or the head cannot be read so. Once the head matches whole from a
    start, and no match is in the text, a match from there stays open: what follows reads
    anything until the tail matches (``StopStringMatcher._open``)."""
    import regex

    depth, cut = 0, None
    parts = list(pattern_parts(pattern))
    for k, part in enumerate(parts):
        text = pattern[part.start:part.end]
        if "x" in part.flags:
            return None
        if part.kind == "(":
            depth += 1
        elif part.kind == ")":
            depth -= 1
        elif depth == 0 and part.kind == "" and "|" in text:
            return None
        elif depth == 0 and cut is None:
            following = parts[k + 1] if k + 1 < len(parts) else None
            if (part.kind == "class" and _ANY_CLASS.fullmatch(text) and following is not None
                    and following.kind == "" and re.match(r"[*+](?!\+)", pattern[following.start:following.end])):
                cut = part.start
            elif part.kind == "" and "s" in part.flags and (dot := re.search(r"\.[*+](?!\+)", text)):
                cut = part.start + dot.start()
    if cut is None:
        return None
    head = pattern[:cut]
    relaxed = relax(head) if _END_ASSERTION.search(head) else head
    try:
        return None if relaxed is None else regex.compile(relaxed)
    except regex.error:
        return None


def _live_start(rx: Any, text: str, pos: int, extends: Callable[[int], bool],
                settled: Callable[[int], bool] = lambda start: False) -> int:
    """Where in ``text[pos:]`` the first match of ``rx`` that more text may complete or extend
    begins, ``len(text)`` where none may: no start before it can begin a stop in any text that
    extends ``text``, so later searches may start there (safe_len's floor).

    A whole match in text not checked (the first ``min_new_tokens``) is passed over, unless one
    from its start may end past the text's end: once more text comes it straddles the checked
    text's start, a stop (``_new_match``). A partial search prefers a whole match to a partial
    one before it ("xbc|b" on "xb": "b", though "xbc" may begin at 0), so before a whole match
    every start is tried with a partial ``fullmatch``; past it, the search goes on. A start where
    the rest of the text is a whole match is passed over too unless ``extends(start)``: a longer
    match may begin there ("ab|abc" after "ab"; not "ab" after "x", "ab", which nothing can make
    a stop, so it is shown at once, as a stop string's is). A start ``settled`` says no stop can
    begin at is passed over too ("a" of ``a$`` after "xa", which the relaxed ``$`` reads as
    partial: no text after it makes a stop there).

    No start passed over can begin a stop in any longer text: one the search went past begins no
    match nor partial match; one whose partial ``fullmatch`` is None begins only matches that end
    in the text and read nothing past it (a read past its end is partial), so they are there
    already when more text comes, none new; one whose ``fullmatch`` is whole, but not
    ``extends``, lies past the pattern's reach (decided by the text) or is read by an automaton
    (no assertions) that says no longer match begins there.

    Raises:
        TimeoutError: a search ran past ``REGEX_TIMEOUT_S``.
    """
    # (a partial match from pos itself ends the search there: the search would scan every later
    # start for a whole match first, each to the text's end, which grew with the square of an open
    # run: \w+\b over a run of letters. A match from pos at most says partial where the search
    # would not, holding back no less)
    if pos < len(text) and (m := rx.match(text, pos, partial=True, timeout=REGEX_TIMEOUT_S)) is not None \
            and m.partial and not settled(pos):
        return pos
    # (a search from past the text's end searches from its end: an empty match there, passed
    # over, would be found again and again)
    while pos <= len(text) and (m := rx.search(text, pos, partial=True, timeout=REGEX_TIMEOUT_S)) is not None:
        if m.partial:  # (no start before it begins a match or a partial one)
            if not settled(m.start()):
                return m.start()
            pos = m.start() + 1
            continue
        for start in range(pos, m.start() + 1):
            whole = rx.fullmatch(text, start, partial=True, timeout=REGEX_TIMEOUT_S)
            if whole is not None and (whole.partial or extends(start)) and not settled(start):
                return start
        pos = m.start() + 1
    return len(text)


def _open_start(rx: Any, text: str, pos: int, settled: Callable[[int], bool]) -> int:
    """``_live_start`` of a relaxed pattern that no text matches whole, only partially (one whose
    every match ends in an assertion of the text's end, ``StopRegexes.end_only``): the first start
    from ``pos`` with a partial match that ``settled`` does not pass over, ``len(text)`` where none
    has. Matched from each start in turn: a partial search tries every start for a whole match
    first, each to the text's end, which grows with the square of the output.

    Raises:
        TimeoutError: a match ran past ``REGEX_TIMEOUT_S``.
    """
    for start in range(pos, len(text) + 1):
        m = rx.match(text, start, partial=True, timeout=REGEX_TIMEOUT_S)
        if m is not None and not settled(start):  # (partial: a whole match would be taken as one too)
            return start
    return len(text)


class StopStringMatcher(EndReadingChecks):
    """Finds the first stop string or stop regex match to end in generated text and says how much
    text is safe to stream.

    Args:
        stops: the stop strings (empty strings are ignored).
        regexes: stop regular expressions (``SamplingParams.stop_regex``, checked there: none
            matches the empty string), or the request's ``StopRegexes``, shared by its samples.
        whole_texts: those of ``stops`` that are the whole text of a token the text leaves out (a
            skipped special token's, ``stop_special``): an occurrence of one with such a token's
            place inside it (``find``'s ``marks``) is no match, as in SGLang's text, which keeps
            that token's text there.

    A stop regex search that runs past ``REGEX_TIMEOUT_S`` is given up, and ``problem`` says so
    (for every sample of the request): the scheduler then aborts the request with that message.
    """

    def __init__(self, stops: Sequence[str], regexes: Sequence[str] | StopRegexes = (),
                 whole_texts: Collection[str] = frozenset()) -> None:
        self.stops = [s for s in stops if s]
        self._whole_texts = frozenset(whole_texts)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._prefixes = _StopPrefixes(self.stops) if self.stops else None
        self._shared = regexes if isinstance(regexes, StopRegexes) else StopRegexes(regexes)
        self._regexes = self._shared.compiled
        # safe_len's last text and, per regex, the position before which no match can begin in
        # any text extending it: the searches start there, not over the whole output each token
        self._seen = ""
        self._floors = [0] * len(self._regexes)
        # per regex with an automaton: this sample's reading of the text by it; per regex searched,
        # by its loosened automaton
        self._runs = [a and AutomatonRun(a) for a in self._shared.automata]
        self._loose_runs = [a and AutomatonRun(a) for a in self._shared.loosened]
        # per regex: (its automaton's first match's end, the text up to it, whether the regex
        # package finds a match there too), for _agrees
        self._agreed: list[tuple | None] = [None] * len(self._regexes)
        self._loose_agreed: list[tuple | None] = [None] * len(self._regexes)  # (the same of _loose_runs)
        # the length of the text not checked (min_new_tokens) that find first met: a match of a
        # regex that may read the text's end is let through where that text held it (_new_match)
        self._held_to: int | None = None
        self._checked = ""  # (the last text find checked)
        # per regex: where the earliest match that find met in its text (_pending_text) begins that
        # reads its end, where one does: safe_len holds it back
        self._pending: dict[int, int] = {}
        self._pending_text = ""
        # per regex with StopRegexes.together: the character that last showed no match near the
        # text's end settled (_none_final), tried first next time
        self._undoing: dict[int, str] = {}
        # whether a match of a regex may read the text's end: find(at_end=True) is asked where the output ends
        self.reads_end = any(r is not None for r in self._shared.end_readings)

    @property
    def problem(self) -> str | None:
        """Why the stop regexes were given up (a search ran too long), or None."""
        return self._shared.problem

    @staticmethod
    def _budget() -> float:
        """The seconds one search may take in the checks ``EndReadingChecks`` gives:
        ``REGEX_TIMEOUT_S``, read at each call, as callers and tests set it on this module."""
        return REGEX_TIMEOUT_S

    def _floor(self, i: int, text: str, new_from: int | None = None) -> int:
        # (a floor may lie past a whole match in the last text, which no later text can make new;
        # a find from before its end, after a rollback and the same text again, may meet it)
        valid = text.startswith(self._seen) and (new_from is None or new_from >= len(self._seen))
        return self._floors[i] if valid else 0

    def _read(self, k: int, text: str, loosened: bool = False) -> AutomatonRun | None:
        """Regex ``k``'s automaton run (``loosened``: its loosened automaton's) having read ``text``;
        None where the regex is searched: it has no automaton, or its run gave up
        (``AutomatonRun.given_up``), for the rest of the sample. The search then starts from the
        floor the run left: where the earliest match that more text may complete begins, before
        which none can begin, as a search would have left it."""
        runs = self._loose_runs if loosened else self._runs
        run = runs[k]
        if run is not None:
            run.read(text)
            if run.given_up:
                runs[k] = run = None
        return run

    def _agrees(self, k: int, run: AutomatonRun, text: str, loosened: bool = False) -> bool:
        """Whether the regex package too matches regex ``k`` where its automaton's first match
        begins, within the text up to where it ends (tried once per first match): where it does
        not, the two read the pattern apart, and the regex package decides (searched, as ``find``
        does). ``loosened``: of the loosened automaton's run, matched by the partial search's form
        (``StopRegexes.loose_partial``)."""
        agreed, rx = (self._loose_agreed, self._shared.partial[k]) if loosened else (self._agreed, self._regexes[k])
        if agreed[k] is None or agreed[k][0] != run.first_end or not text.startswith(agreed[k][1]):
            try:
                found = rx.match(text, run.first_start, run.first_end, timeout=REGEX_TIMEOUT_S) is not None
            except TimeoutError:
                found = False  # (the search below meets the same pattern, and gives it up)
            agreed[k] = (run.first_end, text[:run.first_end], found)
        return agreed[k][2]

    def _extends(self, k: int, text: str, start: int) -> bool:
        """Whether regex ``k`` may match a text that begins with ``text[start:]`` and is longer,
        as far as it is known: not where that is at least the pattern's reach long, nor where its
        automaton says no match goes on from there (``StopAutomaton.extends``)."""
        reach, a = self._shared.reach[k], self._shared.automata[k]
        if reach is not None and len(text) - start >= reach:
            return False
        return a is None or a.extends(text, start)

    def _settled(self, k: int, text: str, start: int, checked: bool = False) -> bool:
        """Whether no stop of regex ``k`` can begin at ``start`` in any text that extends ``text``
        (``text`` being checked, or not: the first ``min_new_tokens``), where every match from
        ``start`` ends in ``text`` (``StopRegexes.settled_width``): a stop from there would be a
        match that a longer text holds and a shorter one, cut where it was checked, did not
        (``_new_match``), and for each end the match's assertions read no more of what follows
        than whether it is nothing, a word character, another, a final newline or a newline and
        more (``_FOLLOWERS``), so it is no stop where each match that what follows may make, the
        text holds already, and one after a newline and more, after the newline alone: "a" of
        ``a$`` after "xa" (a newline after it keeps it a match, anything else makes none), not
        " " of ``" \\b"`` after "x " ("a" after it makes it one). Where ``checked`` (the text's
        end was checked, and a match that reads it is met once what follows settles it: find), it
        is no stop only where what follows changes none: not "a" of ``a$`` after "xa".

        Raises:
            TimeoutError: a match ran past ``REGEX_TIMEOUT_S``.
        """
        width = self._shared.settled_width[k]
        if width is None or start + width > len(text):
            return False
        pattern = self._regexes[k].pattern
        # (an assertion before the text's last character reads only text that is there: only a
        # match ending at its last character or after it may read what follows)
        for end in range(max(start + 1, len(text) - 1), len(text) + 1):
            holds = []
            for follower in _FOLLOWERS:
                exact = ending_by(pattern, len(text) + len(follower) - end, exact=True)
                if exact is None:
                    return False
                holds.append(exact.match(text + follower, start, timeout=REGEX_TIMEOUT_S) is not None)
            if len(set(holds)) > 1 if checked else (any(holds[1:]) and not holds[0]) or (holds[4] and not holds[3]):
                return False
        return True

    def _open(self, k: int, text: str, pos: int) -> bool:
        """Whether regex ``k``'s head (``StopRegexes.open_heads``) matches whole from ``pos``: a
        match from there stays open, the repeat of any character taking whatever comes until its
        tail matches, so no search need find where one may begin (pos: before it none can, the
        caller knows). The search of an open match read all of it on every token (linear in its
        length: ``\\bBEGIN\\b[\\s\\S]*?\\bEND\\b``), the head reads only itself. A head that
        times out is given up on as a search is."""
        head = self._shared.open_heads[k]
        if head is None or pos >= len(text):
            return False
        try:
            m = head.match(text, pos, partial=True, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            self._timed_out(k, self._regexes[k], text)
            return False
        return m is not None and not m.partial

    def _timed_out(self, i: int, rx: Any, text: str) -> None:
        self._shared.given_up.add(i)
        # (a lookahead reading to the text's end from each start costs time cubic in the output
        # where matches end in the text not checked: "a[\s\S]*?(?=[^z]*z)|a" after 200 "a"s, no
        # overlapping alternatives, which the words below alone sent the user looking for)
        lookahead = unbounded_lookahead(rx.pattern)
        ahead = (f", or the lookahead {lookahead}, which reads on without bound, read to the output's end again from "
                 "each place a match may begin" if lookahead else "")
        fix = " and each lookahead reads a bounded stretch" if lookahead else ""
        # (a linear pattern whose match stays open over a long run, read again from each start
        # after each token, is given up too: a\w*(?!\w) over ~850 letters, which the words on
        # backtracking alone misnamed)
        self._shared.problem = (
            f"stop_regex {shown_regex(rx.pattern)} took over {REGEX_TIMEOUT_S:g} s to search {len(text)} characters of "
            "output: a long stretch where a match may still begin or end, searched again from each such place "
            "after each token (a\\w*(?!\\w) over a long run of letters), or catastrophic backtracking (a repeat of "
            f'overlapping alternatives like "(x|x)+"{ahead}); bound its repeats (\\w{{1,64}} for \\w*) or use a stop '
            f"string, and rewrite it so each character can be matched one way only{fix}")

    def find(self, text: str, new_from: int, at_end: bool = False,
             marks: Sequence[tuple[int, int, int]] = ()) -> tuple[int, str] | None:
        """The stop in ``text`` that ends first after ``new_from`` (the length of the text already
        checked); returns ``(start index, matched text)`` or None. ``at_end``: the output ends
        with ``text`` (its last token came, or an EOS or stop token): a match that reads its end
        is a stop now. ``marks``: the skipped tokens' places in ``text``
        (``IncrementalDetokenizer.marks``: (token index, token id, place) each), read only where one
        of ``whole_texts`` occurs: an occurrence with a place strictly inside it is passed over.

        A regex's match that reads the end of the text checked (an end assertion, a negative
        lookahead, a conditional on a lookaround: ``StopRegexes.end_readings``) is met only once
        text after it, or the output's end, settles it (``\\bEND\\b`` in "ENDING" never is; in
        "END " it is met with the space): a check after the next character finds it again, from
        the text up to ``new_from`` on, and safe_len holds its start back meanwhile. Among stops
        met at one character, the one whose match ends first wins (``\\bEND\\b`` before the stop
        string "\\n" in "END\\n"; ``x(?=y)`` before "y" in "xy"), then as below.

        Several stops may end in one token's text. The one whose match ends first wins, as when
        the text is checked character by character; among matches ending at the same character,
        stop strings before stop regexes, each in list order (a regex's match is the one a check
        after each character meets: ``\\d+`` on "123" matches "1", and ``ab*c|b`` on "abbc"
        matches "b", though over all of the text they match "123" and "abbc"). That is SGLang's
        result wherever it does not depend on the tokenization: SGLang checks after each token, in list order, every stop in the text's tail
        (``Req._check_str_based_finish``; its detokenizer then cuts at the matched stop's first
        occurrence), so its list order decides between stops ending at the same character, but
        also between those that one multi-character token completes at different places: there,
        ``stop=["bc", "ab"]`` on "x" + "abc" stops before "bc" ("xa") where tokens "a", "b", "c"
        stop before "ab" ("x"); this gives "x" for both."""
        # (where met, where the match ends, rank, start, matched text); the least wins
        best: tuple[int, int, int, int, str] | None = None
        if self.reads_end:
            if self._held_to is None or new_from < self._held_to or not text.startswith(self._checked[:self._held_to]):
                self._held_to = new_from  # (the first check, after the first min_new_tokens, or a rollback before it)
            self._checked = text
            if text != self._pending_text:
                self._pending, self._pending_text = {}, text
        for rank, s in enumerate(self.stops):  # (each from its own length back: a shorter stop ending
            # before new_from lies in text that was not checked, the first min_new_tokens, or already shown)
            i = text.find(s, max(0, new_from - len(s) + 1))
            # (a skipped token sampled inside a stop that is one's whole text: no stop there; read
            # on a hit alone, so a request pays nothing per token for it)
            while i != -1 and marks and s in self._whole_texts and any(i < m[2] < i + len(s) for m in marks):
                i = text.find(s, i + 1)
            if i != -1:
                best = min(best or (i + len(s), i + len(s), rank, i, s), (i + len(s), i + len(s), rank, i, s))
        for k, rx in enumerate(self._regexes):
            if k in self._shared.given_up:
                continue
            run = self._read(k, text)
            if run is not None and run.first_end is None:  # the text holds no match at all
                continue
            if run is None and (loose := self._read(k, text, loosened=True)) is not None and loose.first_end is None:
                continue  # (nor of the pattern without its assertions: none in the text or a prefix of it)
            floor, longest = self._floor(k, text, new_from), self._shared.longest[k]
            try:
                if ((tail := self._shared.back_tails[k]) is not None and tail.search(
                        text, min(new_from + 1, len(text)), timeout=REGEX_TIMEOUT_S) is None) or (
                        (last := self._shared.last_characters[k]) is not None
                        and last.search(text, new_from, timeout=REGEX_TIMEOUT_S) is None):
                    continue  # (no match ends past the text checked)
                if (run is not None and run.first_end > new_from
                        and (m := _new_match(rx, longest, text, floor, new_from, run.first_end)) is not None):
                    # no match ends by new_from, so the first to end is new and met where it ends,
                    # as the matched text finditer's first (leftmost) match up to there
                    met = run.first_end, m
                # (else a match ends in text not checked, the first min_new_tokens: searched as
                # below, which passes over it; or the regex package finds no match there, where it
                # reads a character otherwise than its one-character patterns did: it decides)
                # (no match over all of the text is none in any shorter text, but for a pattern
                # that can match only where the text ends: "a$" meets "Wha" of one token "What")
                elif not self._shared.end_sensitive[k] and _new_match(rx, longest, text, floor, new_from, len(text)) is None:
                    continue
                else:
                    # met where a check after each character meets it: at the first end e (past
                    # new_from) by which the text holds a new match, and that match, which may end
                    # before the one over all of the text (r"\d+" on "123": "1") or begin after it
                    # (r"ab*c|b" on "abbc": "b", read before "c" comes)
                    # A match that may read the text's end is new past the text not checked, and
                    # met only where final (_final): it was not at the last check, or it had stopped
                    reading = self._shared.end_readings[k] is not None
                    held = self._held_to if reading else new_from
                    first = min(new_from + 1, len(text)) if reading and at_end else new_from + 1
                    if self._shared.end_only[k]:  # (a match is final only where the output ends: what
                        # _final finds, one search instead of one from each start after each character)
                        if not at_end:
                            if (m := _new_match(rx, longest, text, floor, held, len(text))) is not None:
                                self._pending[k] = m.start()
                            continue
                        first = len(text)
                    final = functools.partial(self._final, k, text, at_end) if reading else None
                    met = next(((e, m) for e in range(first, len(text) + 1)
                                if not (reading and not at_end and self._none_final(k, text, floor, e))
                                and (m := _new_match(rx, longest, text, floor, held, e, final)) is not None), None)
            except TimeoutError:
                self._timed_out(k, rx, text)
                continue
            if met is None:
                continue
            end, m = met
            found = (end, m.end(), len(self.stops) + k, m.start(), m.group())
            best = min(best or found, found)
        return None if best is None else (best[3], best[4])

    def safe_len(self, text: str) -> int:
        """Length of the prefix of ``text`` that cannot become part of a stop: the text minus its
        longest suffix that is a proper prefix of some stop string, or from where a stop regex
        may still match once more text comes (``\\B`` on "a" may match once "b" comes; a pattern
        ``stop_relaxed.relax`` cannot read holds back all text from where it was last searched)."""
        # (a whole stop at the end was found already, unless it lies in the first min_new_tokens)
        safe = len(text) - (self._prefixes.suffix_len(text, self._longest - 1) if self._prefixes else 0)
        floors = []
        past_held = self._held_to is not None and len(text) > self._held_to  # (text checked: find)
        for i in range(len(self._regexes)):
            run = None if i in self._shared.given_up else self._read(i, text)
            if run is not None:
                if run.first_end is None:
                    # the text holds no match: where the earliest match that more text may complete
                    # begins (what the partial search below finds, but for the regex package's
                    # partial match of a lazy class repeat that the text's last character ends)
                    floors.append(run.live_start(len(text)))
                    safe = min(safe, floors[-1])
                    continue
                if self._agrees(i, run, text):
                    # a whole match in the text not checked: where the earliest match that more
                    # text may complete or extend begins, in time bounded per character (the
                    # search below tries every start before a whole match, each to the text's end)
                    floors.append(run.open_start(len(text)))
                    safe = min(safe, floors[-1])
                    continue
            # pos ends where a match may yet begin (len(text): nowhere); a pattern given up, or whose
            # search timed out, stops where the search stood: nothing past it is shown
            pos = floor = self._floor(i, text)
            if (reach := self._shared.reach[i]) is not None:  # (what more text can make a stop begins after)
                pos = floor = min(len(text), max(floor, len(text) - reach + 1))
            open_ = False  # (whether a match of the pattern stays open from pos, whatever comes)
            read = False  # (whether the loosened automaton's run told pos: no search)
            loose = None if i in self._shared.given_up else self._read(i, text, loosened=True)
            if loose is not None and loose.first_end is None:
                # (a match more text may complete is one of the pattern without its assertions too,
                # and no earlier start has one: often none at all, and nothing is searched)
                pos = floor = max(floor, loose.live_start(len(text)))
                open_ = self._open(i, text, pos)
            elif loose is not None and self._shared.loose_partial[i] and self._agrees(i, loose, text, loosened=True):
                # (the partial search's form is the loosened pattern: where the earliest match of it
                # that more text may complete or extend begins is what that search finds)
                pos, read = max(floor, loose.open_start(len(text))), True
            rx = self._shared.partial[i]  # (an end-sensitive pattern relaxed; None: show nothing past the floor)
            if rx is not None and i not in self._shared.given_up and not open_ and not read:
                # (_settled lets through a match the text not checked holds; past that text, one
                # reading its end is met once what follows settles it: find)
                checked = past_held and self._shared.end_readings[i] is not None
                settled = functools.partial(self._settled, i, text, checked=checked)
                try:
                    pos = (_open_start(rx, text, pos, settled) if self._shared.end_only[i] else
                           _live_start(rx, text, pos, functools.partial(self._extends, i, text), settled))
                except TimeoutError:
                    self._timed_out(i, self._regexes[i], text)
            if self._pending and i in self._pending and text == self._pending_text:
                pos = min(pos, self._pending[i])  # (a match find met that reads the text's end)
            safe = min(safe, pos)
            # (no start before pos can begin a stop in any longer text: _live_start)
            floors.append(pos)
        if self._regexes:
            self._seen, self._floors = text, floors
        return safe
