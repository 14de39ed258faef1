"""A character class of a ``regex`` constraint that matches no character: found and named.

A class such as ``[^\\s\\S]``, ``[^\\d\\D]`` or one of surrogates alone (``[\\ud800]``) is valid to
Python's ``re`` (which flags only the ambiguous ``[\\s&&\\S]``), but it can never match, and the
automaton library (Rust's regex, in outlines-core) refuses a pattern holding one ("no
transitions"), even in a part the output could skip (``(a[^\\d\\D])?b``). So the language's
``gen()``, a ``%%lm`` cell and the engine refuse it before compiling, in one message, and so
they refuse it in a ``stop_regex``, which could never match there (and which the regex package, the
stop matcher's reader, reads as every character where it is ``[^\\s\\S]``), naming what it keeps
from matching and the pattern without that (``regex_dead_part``).

Whether a class is empty is decided from what it holds, not from its spelling: the class is read
by Python's ``re`` under the case-insensitive flag where it holds there, and searched for in a
text of every character an output may hold (every code point but the surrogates, which no UTF-8
text holds, and U+10FFFE and U+10FFFF, which the engine keeps for marking a match's ends and
leaves out of every class). A class with a Unicode property class in it (``\\p{L}``, which ``re``
lacks) is asked of the automaton library itself, as the engine writes the class
(``constrained.regex_syntax.class_syntax``), since only it reads such a class: under ``(?i)`` it
adds each character's simple case pairs to ``\\p{Lu}`` or ``\\P{Ll}``, where the ``regex``
package reads ``(?i)\\P{Ll}`` as every character.
"""

from __future__ import annotations

import array
import functools
import re
import sys
import warnings
from typing import Iterator

from lmnb_engine.regex_automaton import automaton_matches_nothing
from lmnb_engine.regex_errors import unbuilt_feature
from lmnb_engine.regex_parts import classes_held, pattern_parts, unicode_classes
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_dead_part import dead_part
from lmnb_engine.regex_tree import constants as _c, parser, quiet_parse

# The code points the engine keeps for itself (constrained.regex_syntax leaves them out of classes)
_MARKERS = (0x10FFFE, 0x10FFFF)
_SURROGATES = (0xD800, 0xDFFF)
_LITERAL = _c.LITERAL
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None))


_FIRST_CHARACTERS = "".join(map(chr, range(0x800)))


@functools.cache
def _text_characters() -> str:
    """Every character an output may hold, in code point order (about 1.1 million: 4 MB, built once,
    in some 0.2 s)."""
    codes = array.array("I", range(_SURROGATES[0]))
    codes.extend(range(_SURROGATES[1] + 1, _MARKERS[0]))
    return codes.tobytes().decode("utf-32-be" if sys.byteorder == "big" else "utf-32-le")  # (a join of chr() takes 1 s)


def empty_class_problem(pattern: str, stop: bool = False) -> str | None:
    """Why ``pattern`` is refused for a character class that matches no character an output may
    hold (the module docstring says how that is decided), or None: the first such class, where it
    starts, what it keeps from ever matching (``regex_dead_part``: an alternative, a part repeated
    zero times, the whole pattern), and the fix, the pattern without that part where it can be
    written and is taken. None too where Python's ``re`` cannot read the pattern (its Unicode
    classes held: ``classes_held``), whose error is named elsewhere. ``stop``: ``pattern`` is a
    ``stop_regex``, matched by the regex package, not the automaton library, in text that may hold
    U+10FFFE and U+10FFFF (the engine's markers only in a ``regex`` constraint's automaton); the
    message names it as ``stop_regex_problem``'s do."""
    found = _first_empty_class(pattern, stop)
    if found is None:
        return None
    start, end, caseless = found
    dead = dead_part(pattern, start, end)
    offer = dead and dead.without
    while offer and (more := _first_empty_class(offer, stop)) and (more_dead := dead_part(offer, *more[:2])):
        offer = more_dead.without  # (each dead part out, one at a time: "[^\d\D]|[^\w\W]|b" is "b")
    unbuilt = None if stop or not offer else unbuilt_feature(offer)
    if offer and not unbuilt and _taken(offer, stop):
        fix = f"write {shown_regex(offer)} without it, or write the class you meant"
    else:
        fix = "remove it, or write the class you meant" if dead else "write the class you meant"
        # (the pattern without it is no fix: gen() would take it and the engine refuse it)
        fix += f"; but without it, {unbuilt}" if unbuilt else ""
    never = f"so {dead.what}" if dead else "so the pattern can never match"
    if stop:  # (the stop matcher's own reading told where it differs: it would stop at any character)
        misread = ("; the stop matcher (the regex package) reads the class as matching characters, and would stop "
                   "at them" if _regex_package_reads_some(pattern[start:end], caseless) else "")
        return (f"{shown_regex(pattern)} holds the class {pattern[start:end]} at position {start}, which matches no "
                f"character an output may hold (surrogates are none): an empty class can never match, {never}"
                f"{misread}; {fix}")
    return (f"regex {shown_regex(pattern)} holds the class {pattern[start:end]} at position {start}, which matches no "
            "character an output may hold (surrogates and U+10FFFE-U+10FFFF are none): an empty class can never match, "
            f"{never}, and the automaton library refuses it; {fix}")


def _taken(pattern: str, stop: bool) -> bool:
    """Whether ``pattern`` is taken as a ``stop_regex`` (``stop``) or a ``regex`` constraint."""
    if stop:
        from lmnb_engine.params import stop_regex_problem  # (it imports this module)

        return stop_regex_problem(pattern) is None
    from lmnb_engine.regex_errors import pattern_problem  # (it imports this module)

    return pattern_problem(pattern) is None


def _regex_package_reads_some(cls: str, caseless: bool) -> bool:
    """Whether the regex package, the stop matcher's reader, reads the class ``cls`` as matching a
    character (it reads a negated class of a class and its complement, ``[^\\s\\S]``, as every one)."""
    import regex

    compiled = regex.compile(cls, regex.IGNORECASE if caseless else 0)
    return compiled.search(_FIRST_CHARACTERS) is not None or compiled.search(_text_characters()) is not None


def _first_empty_class(pattern: str, stop: bool) -> tuple[int, int, bool] | None:
    """(start, end, whether the case-insensitive flag holds there) of the first class of ``pattern``
    that matches no character an output may hold (``empty_class_problem``'s ``stop`` says which) and
    stands where the pattern reads it, or None."""
    if quiet_parse(classes_held(pattern)) is None:
        return None
    for start, end, caseless in _classes(pattern):
        if _matches_nothing(pattern, start, end, caseless, stop) and _read(pattern, start, end):
            return start, end, caseless
    return None


def _classes(pattern: str) -> Iterator[tuple[int, int, bool]]:
    """(start, end, whether the case-insensitive flag holds there) for each character class of
    ``pattern`` as Python's parser delimits it (``regex_parts.pattern_parts``), outside comments.
    The flag holds where the pattern sets it globally or a group opening ``(?i:`` around the class
    does, and no ``(?-i:`` inside that."""
    return ((part.start, part.end, "i" in part.flags) for part in pattern_parts(pattern) if part.kind == "class")


def _read(pattern: str, start: int, end: int) -> bool:
    """Whether the class at ``pattern[start:end]`` stands where the pattern may read it: not in a
    part repeated zero times (``x[^\\s\\S]{0}``), which Python's ``re`` and the automaton library
    both read as nothing. Found by holding the class by a character the pattern lacks and looking
    for it in Python's parse of the pattern, outside a repeat of at most zero."""
    mark = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in pattern), None)
    if mark is None:  # (a pattern of all 6400 such characters: taken as read)
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parsed = parser.parse(classes_held(pattern[:start] + mark + pattern[end:]))
    stack: list = [parsed.data]
    while stack:
        node = stack.pop()
        if isinstance(node, parser.SubPattern):
            node = node.data
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, tuple):
            if len(node) == 2 and node[0] is _LITERAL and node[1] == ord(mark):
                return True
            if len(node) == 2 and any(node[0] is op for op in _REPEATS) and node[1][1] == 0:  # (by identity: a range's
                # (low, high) is a pair of ints too)
                continue  # (nothing under it is read)
            stack.extend(part for part in node if isinstance(part, (list, tuple, parser.SubPattern)))
    return False


def _matches_nothing(pattern: str, start: int, end: int, caseless: bool, stop: bool = False) -> bool:
    """Whether the class ``pattern[start:end]`` (``[...]`` or ``[^...]``, as Python delimits it)
    matches no character an output may hold, read under ``caseless`` (the module docstring), the
    engine's markers, U+10FFFE and U+10FFFF, among them for a ``stop`` regex."""
    cls = pattern[start:end]
    if not unicode_classes(cls):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = re.compile(cls, re.IGNORECASE if caseless else 0)
        # (most classes hold a character below U+0800: the whole text, 0.2 s to build, is searched only past them)
        return (compiled.search(_FIRST_CHARACTERS) is None and compiled.search(_text_characters()) is None
                and not (stop and compiled.search("".join(map(chr, _MARKERS)))))
    from lmnb_engine.constrained.regex_syntax import class_syntax  # (torch-free; it imports this package)

    return automaton_matches_nothing(("(?i)" if caseless else "") + class_syntax(pattern, start, caseless))
