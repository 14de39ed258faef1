"""An assertion of a stop regex that can never hold where it stands, found and named.

A stop regex that can never match is valid to the regex package, so a ``gen(stop_regex=...)`` of
one ran to ``max_new_tokens`` and the user never learned why. A class that matches no character
is refused already (``regex_empty_class``); this finds the assertions that can never hold, by
rules that are sound by construction, each about the characters the parts right beside it consume
(a missed case only leaves a pattern taken, as before; a refusal is always right):

- a negative lookaround whose pattern has no assertion and matches the empty string (``(?!)``,
  ``(?<!x?)``): that pattern matches everywhere, so the lookaround fails everywhere;
- ``\\b`` between two characters that can only be word characters (``a\\bb``), or only non-word ones
  (``" \\b "``), and ``\\B`` between a word character and a non-word one (``a\\B ``), word
  characters being the regex package's ``\\w`` under the flags there (its ``\\b`` is read by them);
- ``\\A``, and ``^`` without the multiline flag, after a character (``a^b``), and ``^`` with it
  after a character that can be no newline;
- ``\\Z`` before a character, and ``$`` before one that can be no newline (``$a``).

"Beside" is in Python's parse of the pattern: the assertion held by a character the pattern lacks
(as ``regex_empty_class._read`` finds a class), its neighbours in the sequence that holds it, each
one consuming exactly one character (a literal, a class, ``.``), past the assertions and
lookarounds next to it, which consume nothing (``(?m)a$^b``: "a" is before "^"); a lookahead among
those names the character after it too by its first item, a lookbehind the one before by its last
(``a(?=b)\\b``, ``(?<=a)\\bb``). An assertion first or last in a group, or beside a group or a
repeat, with no such lookaround, is not judged. Where such an assertion makes the pattern
never match is decided as for an empty class (``regex_dead_part``): only where no alternative,
optional part or negative lookaround around it lets the pattern match without it. Patterns the
regex package reads otherwise than Python's parser (``regex_reach.parse_as_python``), verbose ones
and those with flags Python lacks (word, version 1, ...) are not judged.
"""

from __future__ import annotations

import functools
import itertools
import re
import warnings
from typing import Any

from lmnb_engine.regex_dead_part import dead_part
from lmnb_engine.regex_parts import pattern_parts
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_reach import Unreadable, parse_as_python
from lmnb_engine.regex_tree import one_character, walk
from lmnb_engine.regex_tree import parser as _sre

# The flags (pattern_parts' letters) under which the rules above are the regex package's reading:
# others (word mode "w", which moves \b to Unicode's word boundaries and adds line breaks to ^ and
# $; ASCII "a", which the regex package reads by where it stands; version 1 "V1"; locale "L";
# verbose "x") leave the pattern unjudged
_JUDGED_FLAGS = set("imsu")
# An assertion's text, by the name Python's parser gives it: \b, \B, \A, \Z, ^, $
_ASSERTIONS = {"\\b": "AT_BOUNDARY", "\\B": "AT_NON_BOUNDARY", "\\A": "AT_BEGINNING_STRING",
               "\\Z": "AT_END_STRING", "^": "AT_BEGINNING", "$": "AT_END"}
# What consumes exactly one character, as Python's parser names it
_ONE_CHARACTER = ("LITERAL", "NOT_LITERAL", "ANY", "IN")
# What consumes nothing, as Python's parser names it: an assertion, a lookaround
_ZERO_WIDTH = ("AT", "ASSERT", "ASSERT_NOT")


@functools.lru_cache(maxsize=256)
def never_problem(pattern: str) -> str | None:
    """Why the stop regex ``pattern`` (valid, matching no empty string) can never match, for an
    assertion that can never hold where it stands (the module docstring), or None: the assertion,
    its position, why, and the fix. None too where the pattern may still match without it. Cached:
    ``gen()``, ``SamplingParams`` and the engine each ask (a class beside ``\\b`` is searched for
    in every character an output may hold, some 10 ms)."""
    try:
        parse_as_python(pattern)
    except Unreadable:
        return None
    parts = list(pattern_parts(pattern))
    if any(set(_letters(part.flags)) - _JUDGED_FLAGS for part in parts):
        return None
    for start, end, flags in _candidates(pattern, parts):
        why = _never(pattern, start, end, flags)
        if why is not None and dead_part(pattern, start, end) is None:
            return f"{shown_regex(pattern)} can never match (the output would run to its max tokens): {why}"
    return None


def _letters(flags: str) -> list[str]:
    """pattern_parts' flag letters as single flags ("V1" one)."""
    return re.findall(r"V[01]|.", flags)


def _candidates(pattern: str, parts: list) -> list[tuple[int, int, str]]:
    """(start, end, flag letters there) of each assertion and negative lookaround group of
    ``pattern``, outside classes and comments; a group runs to its ")" (or the pattern's end)."""
    found, open_ = [], []
    for part in parts:
        if part.kind == "escape" and pattern[part.start:part.end] in _ASSERTIONS:
            found.append((part.start, part.end, part.flags))
        elif part.kind == "":
            found += [(at, at + 1, part.flags) for at in range(part.start, part.end) if pattern[at] in "^$"]
        elif part.kind == "(":
            open_.append(part)
        elif part.kind == ")" and open_:
            head = open_.pop()
            if pattern.startswith(("(?!", "(?<!"), head.start):
                found.append((head.start, part.end, head.flags))
    return sorted(found)


def _never(pattern: str, start: int, end: int, flags: str) -> str | None:
    """Why the assertion or negative lookaround at ``pattern[start:end]`` (read under ``flags``)
    can never hold where it stands, or None where that is not shown."""
    text = pattern[start:end]
    if text.startswith("("):
        sub = text[4 if text.startswith("(?<!") else 3:-1]
        if _matches_empty_everywhere(sub, flags):
            looks_for = f"what it looks for, {shown_regex(sub)}, matches the empty string" if sub else "it looks for nothing"
            return (f"the negative lookaround {text} at position {start} never holds: {looks_for}, which is found "
                    "everywhere; remove it, or write in it what must not be there")
        return None
    beside = _neighbours(pattern, start, end)
    if beside is None:
        return None
    # (the character before it is every item of befores' too, and the one after every item of
    # afters': any pair that rules it out does)
    befores, afters = beside
    for pair in itertools.product(befores or [None], afters or [None]):
        why = _never_between(text, start, pair, flags)
        if why is not None:
            return why
    return None


def _never_between(text: str, start: int, beside: tuple[Any, Any], flags: str) -> str | None:
    """``_never`` of the assertion ``text`` at ``start`` between the one-character items ``beside``
    (Python's parse; None where none is known)."""
    before, after = (None if leaf is None else _leaf(leaf, flags) for leaf in beside)
    name = _ASSERTIONS[text]
    if name in ("AT_BOUNDARY", "AT_NON_BOUNDARY") and before and after:
        word = [_only(node, r"\w", flags) for node in beside]
        non_word = [_only(node, r"\W", flags) for node in beside]
        if name == "AT_BOUNDARY" and (all(word) or all(non_word)):
            kind = "word" if all(word) else "non-word"
            return (f"the word boundary \\b at position {start} stands between two characters that can only be "
                    f"{kind} characters, where no boundary is (\\b holds between a word character, \\w, and a "
                    "non-word one); remove \\b, or write the characters you meant around it")
        if name == "AT_NON_BOUNDARY" and ((word[0] and non_word[1]) or (non_word[0] and word[1])):
            return (f"\\B at position {start} stands between a word character and a non-word one, where a word "
                    "boundary always is (\\B holds between two word characters or two non-word ones); remove \\B")
    elif name == "AT_BEGINNING_STRING" and before:
        return (f"\\A at position {start} holds only at the output's start, and a character comes before it; "
                "put \\A first, or remove it")
    elif name == "AT_BEGINNING" and before and "m" not in flags:
        return (f"^ at position {start} holds only at the output's start (without the multiline flag), and a "
                "character comes before it; put ^ first, or add (?m) for a line's start (after a newline)")
    elif name == "AT_BEGINNING" and before and before.fullmatch("\n") is None:
        return (f"^ at position {start} holds only at a line's start (multiline), and the character before it "
                "can be no newline; write \\n before it, or put ^ first")
    elif name == "AT_END_STRING" and after:
        return (f"\\Z at position {start} holds only at the output's end, and a character must follow it; "
                "put \\Z last, or remove it")
    elif name == "AT_END" and after and after.fullmatch("\n") is None:
        return (f"$ at position {start} holds only at the output's end or before a newline, and the character "
                "after it can be no newline; put $ last, or write \\n for a line's end")
    return None


def _matches_empty_everywhere(sub: str, flags: str) -> bool:
    """Whether ``sub`` (a lookaround's pattern) holds no assertion, lookaround or reference to a
    group and matches the empty string (so it does at every position, whatever the text)."""
    import regex

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = _sre.parse(sub)
        compiled = regex.compile(_scoped(sub, flags))
    except (re.error, regex.error, RecursionError, OverflowError):
        return False
    reads_context = ("AT", "ASSERT", "ASSERT_NOT", "GROUPREF", "GROUPREF_EXISTS", "GROUPREF_IGNORE")
    if any(op.name in reads_context for op, _ in walk(parsed)):
        return False
    return compiled.fullmatch("") is not None


def _scoped(pattern: str, flags: str) -> str:
    """``pattern`` read under the flag letters ``flags`` (as a scoped group sets them)."""
    return f"(?{flags}:{pattern})" if flags else pattern


def _neighbours(pattern: str, start: int, end: int) -> tuple[list, list] | None:
    """The one-character items (Python's parse) that the characters right before and right after
    the assertion at ``pattern[start:end]`` must each match: the items beside it in the sequence
    that holds it, past the assertions and lookarounds beside it (they consume nothing: in
    ``(?m)a$^b`` "a" is before "^"), and the last item of a lookbehind and the first of a lookahead
    among those (``a(?=b)\\b``: "b" comes after ``\\b``); each list empty where none is known. None
    where the assertion is not found so (it stands in a repeat, or is no assertion there). Found
    by holding it by a character the pattern lacks."""
    mark = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in pattern), None)
    if mark is None:
        return None
    name = _ASSERTIONS[pattern[start:end]]
    try:
        original, marked = parse_as_python(pattern), parse_as_python(pattern[:start] + mark + pattern[end:])
    except Unreadable:
        return None

    def count(parsed: Any) -> int:
        return sum(op.name == "AT" and av.name == name for op, av in walk(parsed))

    if count(original) != count(marked) + 1:  # (it was no such assertion there)
        return None
    for sequence in _sequences(marked):
        for k, (op, av) in enumerate(sequence):
            if op.name == "LITERAL" and av == ord(mark):
                befores, afters = [], []
                for side, step in ((befores, -1), (afters, 1)):
                    at = k + step
                    while 0 <= at < len(sequence) and sequence[at][0].name in _ZERO_WIDTH:
                        item_op, item_av = sequence[at]
                        if item_op.name == "ASSERT":  # (a lookahead reads the character after, a lookbehind the one before)
                            direction, sub = item_av
                            items = list(sub)
                            if items:
                                (afters if direction == 1 else befores).append(items[0] if direction == 1 else items[-1])
                        at += step
                    if 0 <= at < len(sequence):
                        side.append(sequence[at])
                return ([n for n in befores if n[0].name in _ONE_CHARACTER],
                        [n for n in afters if n[0].name in _ONE_CHARACTER])
    return None


def _sequences(node: Any) -> list[list]:
    """Every sequence of items (a ``SubPattern``'s) in a parse, nested ones included."""
    found, stack = [], [node]
    while stack:
        node = stack.pop()
        if isinstance(node, _sre.SubPattern):
            found.append(node.data)
            stack.extend(node.data)
        elif isinstance(node, (list, tuple)):
            stack.extend(part for part in node if isinstance(part, (list, tuple, _sre.SubPattern)))
    return found


def _leaf(node: Any, flags: str) -> Any:
    """The one-character item ``node`` as the regex package's pattern, compiled under ``flags``,
    or None where it is not written here (a class item it lacks)."""
    import regex

    text = one_character(node[0].name, node[1])
    if text is None:
        return None
    return regex.compile(_scoped(text, flags))


def _only(node: Any, category: str, flags: str) -> bool:
    """Whether every character an output may hold that the one-character item ``node`` (Python's
    parse) matches under ``flags`` is one of ``category`` (``\\w`` or ``\\W``). A literal without
    the ignore-case flag matches its one character; another item is searched for in every
    character an output may hold (``_only_written``)."""
    import regex

    if node[0].name == "LITERAL" and "i" not in flags:
        return regex.fullmatch(_scoped(category, flags), chr(node[1])) is not None
    return _only_written(one_character(node[0].name, node[1]), category, flags)


@functools.lru_cache(maxsize=1024)
def _only_written(item: str, category: str, flags: str) -> bool:
    """``_only`` of the one-character item written ``item`` (``one_character``'s), by a search of
    every character an output may hold (some 1.1 million: 30 ms). Cached, so that a pattern's
    ``\\w`` beside each of its ``\\b``, or the same class in another pattern, is searched for once."""
    import regex

    from lmnb_engine.regex_empty_class import _text_characters

    outside = regex.compile(_scoped(f"(?={item})" + ("\\W" if category == "\\w" else "\\w"), flags))
    return outside.search(_text_characters()) is None and outside.search("\U0010fffe\U0010ffff") is None
