"""Incremental matching of the stop regexes a finite automaton can represent.

``StopStringMatcher`` must know, after each token, whether the output holds a stop regex's match
and where a match may still begin (what streaming holds back). The ``regex`` package answers both
only by searching again from where a match may begin, so while a match stays open
(``BEGIN[\\s\\S]*?END`` after "BEGIN") each token cost time linear in the output's length. A
pattern made only of characters, classes, concatenation, alternation, groups and repeats (greedy
or lazy: the language, the set of strings it matches, is the same) is a regular language, and an
automaton reads each new character in time bounded by the pattern's size instead.

The automaton is Glushkov's position automaton (V. M. Glushkov, "The abstract theory of
automata", 1961; as in Navarro & Raffinot, "Flexible Pattern Matching in Strings", 2002): one state
per character position of the pattern, no empty transitions. It is read unanchored, a thread
starting at every character, and threads in the same position are merged keeping the earliest
start (their futures are the same). So after each character it tells whether some match ends
there, and the earliest start whose thread is still alive: where a match may still begin. (The
``regex`` package's partial search, given a text holding no match, finds its partial match there
or, where it over-approximates, earlier: ``[ab]*?Éb.`` on "bA" is partial to it, though no match
starts "bA"; streaming then holds back more text than it needs.) Subsets of threads become states
of a deterministic automaton built as characters come (subset construction, cached). Where the
states keep being new (threads that never merge: ``a.{30}b`` over "a"s and "c"s), building them
costs more than searching, and the run gives up (``AutomatonRun.given_up``) to the search.

The pattern's structure is read by Python's own parser (``re._parser``): a pattern it reads
differently from the ``regex`` package (``regex_reach.parse_as_python``: a nested set, a
fuzzy-matching constraint such as ``{e<=1}``, which Python reads as characters), or with anything else (anchors, lookarounds,
backreferences, atomic groups, possessive repeats, verbose mode, a scoped ASCII or Unicode flag,
``regex``-only syntax such as ``\\p{L}``) gets no automaton, and is searched as before. Which
characters each position accepts is decided by the ``regex`` package itself (a one-character
pattern of its own, with the pattern's global flags and inside the scoped flag groups that hold the
position, as written), so ``\\d``, ``\\w`` and case-insensitive matching mean what they mean in
the whole pattern.

A pattern with assertions (anchors, word boundaries, lookarounds) may be read ``loosened``, with
them left out (but for a lookahead that ends the pattern, read as its text consumed): a larger
language, so where its automaton finds no match the pattern has none in
the text or any prefix of it, and the stop matcher need not search the pattern.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from lmnb_engine.regex_reach import Unreadable, parse_as_python
from lmnb_engine.regex_tree import one_character
from lmnb_engine.regex_tree import parser as _sre

# Positions (pattern characters, repeats written out) above which a pattern gets no automaton:
# each new character is decided by up to this many one-character patterns, once per character.
MAX_POSITIONS = 256
# Parts (sequences and their items, repeats written out) read to build an automaton, above which the
# pattern gets none: repeats of empty groups add no position, and "(?:(?:(?:(?:){250}){250}){250}){250}x"
# took hours to write out, in the thread that submits the request
_MAX_PARTS = 16 * MAX_POSITIONS
# Cached characters and transitions per automaton; past this the cache starts over (a text of many
# distinct characters would otherwise grow it without bound).
_CACHE_LIMIT = 1 << 13
# Threads (a start's set of positions, an int of up to 60 bytes) in the states the cached transitions
# go from and to, each counted once; past this the cache starts over. A state may hold a thread per
# position ("a.{250}b" on a text of "a" and "c": one per "a" in the last 250 characters), so a count
# of transitions alone let one automaton hold hundreds of MB.
_CACHE_THREADS = 1 << 15
# A run gives up (its text is searched by the regex package from then on) when over half of the
# characters it read in a block of this many missed the transition cache, counting only
# characters read before: states that never repeat ("a.{30}b" over "a"s and "c"s keeps a thread
# per recent "a") build a transition per character, O(positions + threads) Python steps, 1.6x to
# 3x the search's time there (benches/results/2026-12-05-cpu-stop-regex-many-threads.md), while
# the patterns it is for, once their states are built, miss on few characters (BEGIN[\s\S]*?END:
# 1%) but new ones (Chinese text: many; not counted). 4 MAX_POSITIONS: while threads build up,
# up to one per position, each state may be new ("(ab|ac|ad){100}e": 200 misses, then none)
_MISS_BLOCK = 4 * MAX_POSITIONS

# A state's threads: per start still alive, earliest first, the positions its threads are in
# (disjoint sets, each an int whose bit p is position p); the state before any character holds none
Threads = tuple[int, ...]
# What a step returns: the new state, the origin of each of its threads, whether a match ends, and
# the threads kept as a cut of the old ones (StopAutomaton.step)
Step = tuple["State", tuple[int, ...], bool, "tuple[int, int, bool] | None"]


class State:
    """A state of the deterministic automaton: its ``threads`` and its cached transitions (``next``:
    character -> ``Step``), kept by the state, not in one dict keyed by (threads, character): such a
    key's hash reads every thread, a big int each, on every character (3 us for 200 threads).
    ``held``: whether the automaton's cache counts it (``StopAutomaton._hold``)."""

    __slots__ = ("threads", "next", "held")

    def __init__(self, threads: Threads) -> None:
        self.threads = threads
        self.next: dict[str, Step] = {}
        self.held = False

class _Unsupported(Exception):
    """The pattern holds something the automaton does not represent."""


def _letters(flags: int) -> str:
    """An inline flag group's letters for re's flag bits (as re._parser gives a scoped group's)."""
    return "".join(c for c, f in (("i", re.IGNORECASE), ("m", re.MULTILINE), ("s", re.DOTALL), ("x", re.VERBOSE))
                   if flags & f)


def _mask(positions: Any) -> int:
    """The int whose bit p is set for each position p."""
    return sum(1 << p for p in set(positions))


def _lookahead_consumed(items: list) -> list:
    """``items`` (a parsed pattern's top level) with a positive lookahead ``(?=X)`` that ends every
    match read as ``X`` consumed, in each alternative and group that ends the pattern: a match of
    ``P(?=X)`` ending where the text so far holds X is one of ``PX`` there, so the loosened
    automaton still finds a match wherever the pattern has one, in the text or a prefix, and may
    begin one where the pattern may; with the lookahead left out instead, ``a[^c]*(?=c)`` over a long
    run of ``a`` matched at every character, and each token's check searched the pattern from every
    start of the run, each to the text's end (time growing with the square of the run)."""
    if not items:
        return items
    op, av = items[-1]
    if op.name == "ASSERT" and av[0] == 1:  # (direction 1: a lookahead)
        return items[:-1] + [(_sre.SUBPATTERN, (None, 0, 0, av[1]))]
    if op.name == "BRANCH":
        return items[:-1] + [(op, (av[0], [_lookahead_consumed(list(sub)) for sub in av[1]]))]
    if op.name == "SUBPATTERN":
        group, add, remove, sub = av
        return items[:-1] + [(op, (group, add, remove, _lookahead_consumed(list(sub))))]
    return items


class StopAutomaton:
    """The position automaton of one stop regex, read unanchored (see the module's docstring).

    ``step`` reads one character (a ``State``).

    Args:
        pattern: a stop regex (``SamplingParams.stop_regex``, checked there).
        loosened: read the pattern with its anchors, word boundaries and lookarounds left out
            (a lookahead that ends it read as its text consumed: ``_lookahead_consumed``): a pattern that matches wherever (and more often than) the pattern does, so where
            this one finds no match the pattern has none, whatever text follows or is cut.

    Raises:
        _Unsupported: the pattern holds something the automaton does not represent.
    """

    def __init__(self, pattern: str, loosened: bool = False) -> None:
        self._loosened = loosened
        try:  # (refusing what the regex package reads otherwise: "[[", a fuzzy constraint "{e<=1}")
            parsed = parse_as_python(pattern)
        except Unreadable as e:
            raise _Unsupported(str(e)) from None
        flags = parsed.state.flags
        if flags & (re.VERBOSE | re.LOCALE):
            raise _Unsupported("verbose or locale mode")
        import regex

        # the pattern's global flags, as the regex package compiles a leaf with them
        self._flags = ((regex.IGNORECASE if flags & re.IGNORECASE else 0) | (regex.DOTALL if flags & re.DOTALL else 0)
                       | (regex.ASCII if flags & re.ASCII else 0))
        self._leaves: list[Any] = []  # per position: a compiled one-character pattern
        self._follow: list[set[int]] = []
        self._parts = 0  # (read so far, up to _MAX_PARTS)
        nullable, first, last = self._sequence(_lookahead_consumed(list(parsed)) if loosened else list(parsed), "")
        if nullable:
            raise _Unsupported("matches the empty string")  # (refused by SamplingParams already)
        self._first = _mask(first)
        self._last = _mask(last)
        self._follow_masks = [_mask(f) for f in self._follow]
        self.goes_on = _mask(p for p, f in enumerate(self._follow) if f)  # (positions with a follower)
        self.finals = self._last  # (positions a match may end in)
        self.start = State(())  # (before any character)
        self._states: dict[Threads, State] = {(): self.start}  # the states the cache built, one per threads
        self._held: list[State] = []  # the states the cached transitions go from or to
        self._cached_transitions = 0
        self._cached_threads = 0  # (in the held states)
        self.misses = 0  # characters read before whose transition was not cached (read by AutomatonRun)
        self._accepts: dict[str, int] = {}  # per character read: the positions that accept it

    # -- construction: each returns (nullable, first positions, last positions) and adds follow links

    def _leaf(self, pattern: str, scopes: str) -> tuple[bool, set[int], set[int]]:
        import regex

        if len(self._leaves) >= MAX_POSITIONS:
            raise _Unsupported(f"over {MAX_POSITIONS} positions")
        # inside the scoped flag groups that hold it, as written: the regex package reads a scoped
        # flag unlike the same global one ("(?ai:σ)" matches "Σ", "(?ai)σ" does not)
        self._leaves.append(regex.compile(scopes + pattern + ")" * scopes.count("("), self._flags))
        self._follow.append(set())
        p = len(self._leaves) - 1
        return False, {p}, {p}

    def _concat(self, a: tuple[bool, set[int], set[int]], b: tuple[bool, set[int], set[int]]):
        for p in a[2]:
            self._follow[p] |= b[1]
        return a[0] and b[0], a[1] | b[1] if a[0] else a[1], b[2] | a[2] if b[0] else b[2]

    def _sequence(self, items: list, scopes: str) -> tuple[bool, set[int], set[int]]:
        # scopes: the heads of the scoped flag groups ("(?i:") that hold the items, outermost first
        self._parts += 1 + len(items)
        if self._parts > _MAX_PARTS:
            raise _Unsupported(f"over {_MAX_PARTS} parts with its repeats written out")
        result: tuple[bool, set[int], set[int]] = (True, set(), set())
        for op, av in items:
            result = self._concat(result, self._item(op.name, av, scopes))
        return result

    def _item(self, name: str, av: Any, scopes: str) -> tuple[bool, set[int], set[int]]:
        if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
            text = one_character(name, av)
            if text is None:
                raise _Unsupported(f"{name} with an item not written")
            return self._leaf(text, scopes)
        if name == "SUBPATTERN":
            _, add, remove, sub = av
            if (add | remove) & (re.ASCII | re.UNICODE):
                # the regex package reads these by where they stand: "(?i)(?a:[^\w])" matches "é",
                # "(?i)(?a:x?[^\w])" does not
                raise _Unsupported("a scoped ASCII or Unicode flag")
            if add or remove:
                scopes += "(?" + _letters(add) + ("-" + _letters(remove) if remove else "") + ":"
            return self._sequence(list(sub), scopes)
        if name == "BRANCH":
            options = [self._sequence(list(sub), scopes) for sub in av[1]]
            return (any(o[0] for o in options), set().union(*(o[1] for o in options)),
                    set().union(*(o[2] for o in options)))
        if name in ("MAX_REPEAT", "MIN_REPEAT"):  # greedy or lazy: the same strings match
            low, high, sub = av
            unbounded = high == _sre.MAXREPEAT
            if low > MAX_POSITIONS or (not unbounded and high > MAX_POSITIONS):
                raise _Unsupported(f"a repeat over {MAX_POSITIONS}")
            result: tuple[bool, set[int], set[int]] = (True, set(), set())
            for _ in range(low):
                result = self._concat(result, self._sequence(list(sub), scopes))
            for _ in range(1 if unbounded else high - low):  # optional copies: x{1,3} is x(x)?(x)?
                _, first, last = self._sequence(list(sub), scopes)
                if unbounded:
                    for p in last:
                        self._follow[p] |= first
                result = self._concat(result, (True, first, last))
            return result
        if self._loosened and name in ("AT", "ASSERT", "ASSERT_NOT"):
            return True, set(), set()  # (an assertion left out: it matches the empty string)
        raise _Unsupported(name)  # AT, ASSERT, ASSERT_NOT, GROUPREF, ATOMIC_GROUP, POSSESSIVE_REPEAT, ...

    # -- reading

    def step(self, state: State, ch: str) -> Step:
        """Read the one character ``ch`` in ``state`` (``start`` before any character): returns the
        new state, for each of its threads the index of the thread it comes from in ``state`` (-1:
        the thread that starts at ``ch``), whether a match ends with ``ch``, and ``(a, b, new)``
        where those are threads ``a`` to ``b - 1`` of ``state``, in order, then the new one if
        ``new`` (None where they are not): the common case, read by a cut of the starts' list."""
        hit = state.next.get(ch)
        if hit is None:
            self.misses += ch in self._accepts
            threads, origins, ends, run = self._transition(state.threads, ch)
            if (self._cached_transitions >= _CACHE_LIMIT
                    or self._cached_threads + len(state.threads) + len(threads) > _CACHE_THREADS):
                self._start_over()
            target = self._states.setdefault(threads, State(threads))
            self._hold(state)
            self._hold(target)
            hit = state.next[ch] = (target, origins, ends, run)
            self._cached_transitions += 1
        return hit

    def _hold(self, state: State) -> None:
        if not state.held:
            state.held = True
            self._held.append(state)
            self._cached_threads += len(state.threads)

    def _start_over(self) -> None:
        """Drop every cached transition and state (a state a run is in stays valid, uncached)."""
        for state in self._held:
            state.next, state.held = {}, False
        self._held.clear()
        self._states = {(): self.start}
        self._cached_transitions = self._cached_threads = 0

    def _accepting(self, ch: str) -> int:
        """The positions whose characters include ``ch`` (each one-character pattern run once per
        character, not once per thread and state)."""
        accepts = self._accepts.get(ch)
        if accepts is None:
            if len(self._accepts) >= _CACHE_LIMIT:
                self._accepts.clear()
            accepts = self._accepts[ch] = _mask(q for q, leaf in enumerate(self._leaves) if leaf.fullmatch(ch))
        return accepts

    def extends(self, text: str, start: int) -> bool:
        """Whether a match of the pattern may begin with ``text[start:]`` and go on past its end:
        the positions that reading it from the pattern's start reaches have a follower (a class
        that no character fits counts as one: erring towards yes). False where no match begins so.
        Time linear in ``len(text) - start``."""
        reachable = self._first
        for i in range(start, len(text)):
            positions = reachable & self._accepting(text[i])
            if not positions:
                return False
            reachable = self._followers(positions)
        return bool(reachable)

    def _followers(self, positions: int) -> int:
        """The positions that follow any of ``positions`` (a bit mask): one look-up per position."""
        reachable = 0
        while positions:
            low = positions & -positions
            reachable |= self._follow_masks[low.bit_length() - 1]
            positions ^= low
        return reachable

    def _transition(self, state: Threads, ch: str) -> tuple[Threads, tuple[int, ...], bool, tuple[int, int, bool] | None]:
        accepts = self._accepting(ch)
        taken = 0
        threads, origins = [], []
        for origin, positions in [*enumerate(state), (-1, None)]:  # (-1: the thread starting at ch)
            # (the threads' positions are disjoint: P look-ups in all)
            reachable = self._first if positions is None else self._followers(positions)
            # (a position an earlier start reached already: the earlier start is kept)
            now = reachable & accepts & ~taken
            if now:
                threads.append(now)
                origins.append(origin)
                taken |= now
        new = bool(origins) and origins[-1] == -1
        kept = origins[:-1] if new else origins
        a = kept[0] if kept else 0
        run = (a, a + len(kept), new) if kept == list(range(a, a + len(kept))) else None
        return tuple(threads), tuple(origins), bool(self._last & taken), run


@functools.lru_cache(maxsize=64)
def automaton(pattern: str, loosened: bool = False) -> StopAutomaton | None:
    """The pattern's ``StopAutomaton`` (``loosened``: with its assertions left out), or None where
    it cannot represent the pattern (see the module's docstring); cached, so requests with the same
    stop regex share its transitions."""
    try:
        return StopAutomaton(pattern, loosened)
    except _Unsupported:
        return None


class AutomatonRun:
    """One text's reading by a ``StopAutomaton``, extended as the text grows; a text that does not
    extend the last one read (a rollback) is read again from its start.

    Attributes:
        first_end: the end (exclusive character index) of the text's first match to end, None if it
            holds none. The text is read on past it (a match in the text not checked, the first
            ``min_new_tokens``, ends nothing): ``open_start`` says where a stop may still begin.
        first_start: where the earliest match ending at ``first_end`` begins (None with it).
        given_up: over half of the characters of a block of ``_MISS_BLOCK`` read missed the
            transition cache (characters new to the automaton not counted): the caller searches
            the pattern from here on (where the automaton is slower than the search) and reads
            nothing more with this run.
    """

    def __init__(self, automaton_: StopAutomaton) -> None:
        self._automaton = automaton_
        self._text = ""
        self._state = automaton_.start
        self._starts: list[int] = []
        self.first_end: int | None = None
        self.first_start: int | None = None
        self.given_up = False
        self._block_read = self._block_missed = 0  # (characters read in this block, and missed)

    def read(self, text: str) -> None:
        """Read what ``text`` adds to the last text read (all of it where it does not extend it)."""
        if not text.startswith(self._text):
            self._text, self._state, self._starts = "", self._automaton.start, []
            self.first_end = self.first_start = None
        state, starts, step = self._state, self._starts, self._automaton.step
        begin, missed = len(self._text), self._automaton.misses
        for i in range(begin, len(text)):
            state, origins, ends, run = step(state, text[i])
            if run is None:
                starts = [starts[j] if j >= 0 else i for j in origins]
            else:  # (threads a to b - 1 go on, in order: a cut in C, where the list took O(threads) Python steps)
                a, b, new = run
                del starts[b:]
                del starts[:a]
                if new:
                    starts.append(i)
            if ends and self.first_end is None:
                self.first_end = i + 1
                finals = self._automaton.finals
                self.first_start = next(s for s, positions in zip(starts, state.threads) if positions & finals)
        self._state, self._starts = state, starts
        self._count(len(text) - begin, self._automaton.misses - missed)
        self._text = text

    def _count(self, read: int, missed: int) -> None:
        # (misses of other runs sharing the automaton in other threads may be counted: a guess either way)
        self._block_read += read
        self._block_missed += missed
        if self._block_read >= _MISS_BLOCK:
            self.given_up = 2 * self._block_missed > self._block_read
            self._block_read = self._block_missed = 0

    def live_start(self, length: int) -> int:
        """The character index where the earliest match that may still complete begins, or ``length``
        (pass the text's) where none is open; meaningful while ``first_end`` is None."""
        return self._starts[0] if self._starts else length

    def open_start(self, length: int) -> int:
        """The character index where the earliest match that more text may still complete or
        extend begins (its thread is in a position that has a follower), or ``length`` where none
        is: past a whole match, which a match ending later from its start need not follow."""
        goes_on = self._automaton.goes_on
        return next((s for s, positions in zip(self._starts, self._state.threads) if positions & goes_on), length)
