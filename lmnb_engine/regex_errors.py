"""A regular expression's errors in the words every front end uses, without torch.

A ``regex`` constraint is checked in three places: where the language's ``gen(regex=...)`` is
called (``lmnb.ir.check_regex``), in a ``%%lm`` cell's literal options (``lmnb.template.options``),
and in the engine, for the server's clients too (``constrained.grammar.compile_grammar``). All
three word an invalid pattern with ``regex_problem`` (``invalid_regex``), and show a pattern with
``shown_regex``, so a user hears one error whichever way the pattern came, and the language's early
check refuses no pattern the engine takes (``\\p{L}``); the language's two word a value that is no
pattern (``gen(regex=5)``) with it too. The engine's own refusals of a class Python flags as
ambiguous (``ambiguous_class``) and of a Unicode class at an end of a range
(``class_range_problem``), made before compiling (``constrained.regex_syntax``), are worded here
too, and the language's two make them. A ``stop_regex`` error is placed as a ``regex`` error is
(``python_error``). ``pattern_parts`` walks a pattern's text as written (its classes, comments,
escapes and groups, with the inline flags in force) for the modules that read one so
(``regex_empty_class``, ``regex_dead_part``, the engine's ``params`` for a ``stop_regex``). Importing
it loads neither torch nor the engine's constrained-decoding package.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any, Callable, Iterator, NamedTuple

from lmnb_engine.json_schema import (SHOWN_CHARS, as_ranges, back_reference_words, code_point_runs, json_value,
                                      without_surrogates)
from lmnb_engine.regex_tree import constants, parser, walk
from lmnb_engine.regex_u_flag import OTHER_REFERENCE


def shown_regex(pattern: str) -> str:
    """``pattern`` for a message, written as JSON writes a string (``"a["``), so that the error reads
    the same in Python and from the server, cut after ``SHOWN_CHARS`` characters (a schema's regex
    runs to kilobytes)."""
    return json_value(pattern, SHOWN_CHARS)


def invalid_regex(pattern: str, error: re.error) -> str:
    """The message for a ``regex`` constraint that Python's ``re`` refused with ``error`` (read with
    its Unicode classes held: ``classes_held``): the pattern (``shown_regex``), what is wrong and
    where (``error_words``), and the fix."""
    return (f"regex {shown_regex(pattern)} cannot be compiled: it is not a valid regular expression "
            f"({error_words(pattern, error)}); fix the pattern")


def error_words(pattern: str, error: re.error, place: Callable[[int], int] | None = None,
                written: str | None = None) -> str:
    """What ``error``, Python's ``re`` error on ``pattern`` with its Unicode classes held, says is
    wrong and where (``error.pos``, a character index into ``pattern``, or into ``written``, the
    text the user wrote, ``place(index)``, where ``pattern`` respells it): ``error.msg`` at that
    position (the message alone where ``error.pos`` is None), a bad character range as the user
    wrote it (``_bad_range``), unless the message quotes the text holding a class (a class in a group's name, ``(?P<\\p{L}>...)``, or after
    ``(?``): then the class, by its own text, and where it stands."""
    place = place or (lambda index: index)
    where = _bad_range(pattern, error, place, written or pattern)
    # (re gives no position for a look-behind of varying width, found as the pattern compiles)
    where = where or (error.msg if error.pos is None else f"{error.msg} at position {place(error.pos)}")
    classes = unicode_classes(pattern)
    if not classes or error.pos is None:
        return where
    try:  # the message quotes held text when it changes with the character that holds the classes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(classes_held(pattern, hold=","))
    except re.error as other:
        if other.msg == error.msg:
            return where
    except (RecursionError, OverflowError):
        return where
    cls = next((m for m in classes if m.end() > error.pos), classes[-1])
    return (f"the class {cls.group(2)} at position {place(cls.start(2))} stands where no class can: in a group's name or "
            "reference, after \"(?\", or as an end of a range")


_BAD_RANGE = "bad character range "


def _bad_range(pattern: str, error: re.error, place: Callable[[int], int], written: str) -> str | None:
    """Python's "bad character range" ``error`` on ``pattern`` with the range as the user wrote it
    and where it starts in ``written`` (``place``: ``error_words``), or None for another error.
    Python's message shows only the first two characters of an escape at either end (``\\x-\\x``
    for ``[\\x5a-\\x41]``) and places it that many characters after the range's start (it
    subtracts the shown length from where it stopped reading), so the range is found by its end:
    ``error.pos`` plus that length, the end of a class item (``_class_items``) two items after
    the range's start."""
    if not error.msg.startswith(_BAD_RANGE) or error.pos is None:
        return None
    end = error.pos + len(error.msg) - len(_BAD_RANGE)
    for items in _class_items(pattern):
        for k in range(2, len(items)):
            if items[k][1] == end and items[k - 1] == (items[k - 2][1], items[k - 2][1] + 1):
                start = place(items[k - 2][0])
                return f"{_BAD_RANGE}{written[start:place(end)]} at position {start}"
    return None


def python_error(pattern: str, place: Callable[[int], int] | None = None, written: str | None = None) -> str | None:
    """What Python's ``re`` finds wrong in ``pattern`` and where (``error_words``, with ``place`` and
    ``written``), reading its Unicode classes as classes (held: ``classes_held``), or None where it
    reads the pattern.
    ``stop_regex`` errors use it, so that a pattern's error is worded, and placed, as a
    ``regex``'s is (the ``regex`` package, which stop strings match with, places an open group's
    error at the pattern's end, where it gave up)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(classes_held(pattern))
    except re.error as e:
        return error_words(pattern, e, place, written)
    except (RecursionError, OverflowError):  # (not re's words: the regex package's are kept)
        pass
    return None


def regex_problem(pattern: Any) -> str | None:
    """Why ``pattern``, a ``regex`` constraint as the language's ``gen()`` or a ``%%lm`` cell was
    given it, is refused, or None for a pattern the engine reads as Python's ``re`` reads it (its
    Unicode property classes as the engine's automaton library reads them) or for None (no
    constraint): not a string (a compiled ``re.Pattern``, whose text is wanted, or any other type,
    named), or ``pattern_problem``."""
    if pattern is None:
        return None
    if isinstance(pattern, re.Pattern):  # (a Python snippet to write, so repr: JSON's text could be cut)
        return (f"regex must be a string, not a compiled Pattern; pass its text, regex={pattern.pattern!r} "
                "(flags written inline, e.g. '(?i)...')")
    if not isinstance(pattern, str):
        return f"regex must be a string, not {type(pattern).__name__}"
    return pattern_problem(pattern)


def pattern_problem(pattern: str, empty_class: bool = True) -> str | None:
    """Why the pattern ``pattern`` is refused, or None: an empty pattern (``empty_pattern_problem``),
    a Unicode class the automaton library does not build (``unbuilt_class_problem``) or at an end
    of a range (``class_range_problem``), a class Python's ``re`` flags as ambiguous
    (``ambiguous_class``), a back-reference by name in another dialect's syntax, ``\\k<n>``, which
    ``re`` refuses (``_named_reference_problem``) before any other syntax error, since no
    automaton can do it, ECMA's named group ``(?<year>`` (``_named_group_problem``, offering
    Python's ``(?P<year>``), a syntax error (``invalid_regex``), a repeat count above what ``re``
    reads, parentheses nested too deeply for its parser, which recurses once per level (some hundreds
    of levels), a class that matches no character (``regex_empty_class``), or a back-reference by
    number or Python's ``(?P=n)``, which no backend can constrain output with
    (``back_reference_problem``, the engine's words). The pattern
    is read by ``re`` with its classes held (``classes_held``), so an error's position is its
    place in ``pattern``, and a pattern with classes is refused as its twin without them is.
    ``empty_class`` False: all but the empty class check (the engine asks it before its own refusals)."""
    problem = empty_pattern_problem(pattern) or unbuilt_class_problem(pattern) or class_range_problem(pattern)
    if problem:
        return problem
    held = classes_held(pattern)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", FutureWarning)
            parsed = parser.parse(held)  # (not re.compile, whose cache skips the parse, and the warning, the second time)
            re.compile(held)  # (the compiler's own errors: a look-behind of varying width)
    except FutureWarning as w:
        return ambiguous_class(pattern, w)
    except re.error as e:
        return (_quoting_problem(pattern) or _named_reference_problem(pattern) or _repeated_name_problem(pattern)
                or _named_group_problem(pattern, e) or invalid_regex(pattern, e))
    except RecursionError:
        return _too_deep(pattern)
    except OverflowError:  # (a count above 2**32 - 2: Python raises no re.error for it)
        return (f"regex {shown_regex(pattern)} repeats a part more times than Python's re reads (4,294,967,294); "
                'use an unbounded repeat ("+" or "*") and bound the length with max_tokens instead')
    from lmnb_engine.regex_empty_class import empty_class_problem  # (it imports this module)

    # (a class that matches no character first: its words name what the engine refuses beside it)
    problem = empty_class_problem(pattern) if empty_class else None
    return problem or back_reference_problem(parsed, pattern)


def unsupported_words(pattern: str, feature: str, fix: str) -> str:
    """The engine's refusal of ``pattern`` for ``feature`` (e.g. "a lookbehind"), which no finite
    automaton expresses, with the ``fix`` (``constrained.regex_check``'s words)."""
    return (f"regex {shown_regex(pattern)} uses {feature}, which constrained decoding cannot support "
            f"(patterns compile to a finite automaton): {fix}")


# A back-reference as Python's re reads one outside a class: by number, one or two digits (three
# octal ones are an octal escape: first_back_reference), or by name, (?P=n) (the name: group 1, read
# to the next ")" as Python reads it, which takes any identifier, \w or not: "a\u0301", "\u2118")
_NUMBER_REFERENCE = re.compile(r"\\([1-9][0-9]?)")
_PYTHON_REFERENCE = re.compile(r"\(\?P=([^)]+)\)")


def first_back_reference(parsed, pattern: str) -> tuple[str, str, int | None] | None:
    """The first back-reference in ``pattern`` parsed by ``re._parser`` (``parsed``), by number
    or Python's ``(?P=n)``, as ``json_schema.back_reference_words`` takes it: (its text, its
    group's number or name, its position), found in the text as Python's parser reads it
    (outside classes and comments: ``pattern_parts``; ``\\101``, three octal digits, is an octal
    escape, ``\\18`` group 18), or by the group's number alone where the text shows none (where
    ``pattern_parts`` reads the text otherwise than Python: a comment holding an escaped newline
    before ``(?x)`` hides that flag from it, ``(?#\\<newline>)(?x)(a)#[<newline>\\1]``); None where
    it has none. Python's own parser tells a back-reference from an octal escape (``[\\1]``) and
    from a reference to no group (``\\10`` before a tenth), which it refuses."""
    group = next((av for op, av in walk(parsed) if op is constants.GROUPREF), None)
    if group is None:
        return None
    for part in pattern_parts(pattern):
        if part.kind == "(" and (m := _PYTHON_REFERENCE.match(pattern, part.start)):
            return m.group(), m.group(1), part.start
        m = _NUMBER_REFERENCE.match(pattern, part.start) if part.kind == "escape" else None
        if m and not (len(m.group(1)) == 2 and "8" not in m.group(1) and "9" not in m.group(1)
                      and pattern[m.end():m.end() + 1] in tuple("01234567")):
            return m.group(), m.group(1), part.start
    return f"\\{group}", str(group), None


def back_reference_problem(parsed, pattern: str) -> str | None:
    """The engine's words (``json_schema.back_reference_words``) for the first back-reference, by
    number or Python's ``(?P=n)``, in ``pattern`` parsed by ``re._parser`` (``parsed``:
    ``first_back_reference``), or None where it has none. No backend can constrain output with
    one (no regular language holds it: xgrammar says "Backreference is not supported yet",
    outlines' automaton library has none), so ``gen()`` refuses it, where it leaves a lookaround
    to the backend (``pattern_problem``)."""
    found = first_back_reference(parsed, pattern)
    return found and f"regex {shown_regex(pattern)} {back_reference_words(*found)}"


def unbuilt_feature(pattern: str) -> str | None:
    """The engine's words for what in the ``regex`` constraint ``pattern`` no automaton can build (a
    lookaround, a back-reference, an anchor inside: ``regex_check.check_regex``, asked of it without
    its edge anchors, as the engine asks), or None where it has none. ``gen()`` leaves these to the
    backend, but offers no pattern that holds one (``offer_taken``)."""
    from lmnb_engine.constrained.errors import GrammarError
    from lmnb_engine.constrained.regex_check import check_regex  # (torch-free; it imports this module)

    trimmed = without_edge_anchors(pattern)
    try:
        check_regex(trimmed)
    except GrammarError as e:
        return str(e).replace(shown_regex(trimmed), shown_regex(pattern), 1)
    return None


def offer_taken(pattern: str) -> bool:
    """Whether ``pattern``, written as the fix of a refused one, may be offered: ``gen()`` takes it
    (``pattern_problem``) and the engine builds it (``unbuilt_feature``), so that no offer is
    refused next (``c(?<=x)\\p{InGreek}`` is offered ``[\\u0370-\\u03ff]`` for its class, not
    ``c(?<=x)[\\u0370-\\u03ff]``, which holds the lookbehind)."""
    return pattern_problem(pattern) is None and unbuilt_feature(pattern) is None


# A back-reference by name in the syntax of ECMA 262, .NET and the regex package (the name: group 1)
_NAMED_REFERENCE = re.compile(r"\\k<(\w+)>")
# (and in other dialects' syntax, \g<n>, \k'n' ...: regex_u_flag.OTHER_REFERENCE)


def _named_reference_problem(pattern: str) -> str | None:
    """Why ``pattern``, which Python's ``re`` refuses, is refused for its first back-reference by
    name in another dialect's syntax, ``\\k<n>``, ``\\g<n>``, ``\\k'n'`` (an escape outside classes and
    comments: ``pattern_parts``), or None where it has none: ``re`` said only that it cannot read it
    (or that it cannot read the ``(?<n>`` group before it), where respelling it as Python's
    ``(?P=n)`` would only be refused next. A name no group of the pattern has is said to be so."""
    names = list(dict.fromkeys(m.group(2) for part in pattern_parts(pattern)
                               if part.kind == "(" and (m := _ANY_NAMED_GROUP.match(pattern, part.start))))
    for part in pattern_parts(pattern):
        if part.kind == "escape" and (reference := _NAMED_REFERENCE.match(pattern, part.start)
                                      or OTHER_REFERENCE.match(pattern, part.start)):
            words = back_reference_words(reference.group(), reference.group(1), part.start, names)
            return f"regex {shown_regex(pattern)} {words}"
    return None


# (what a pattern with PCRE's \\Q...\\E is told: a schema's pattern too, json_schema._refused_pattern)
QUOTING_WORDS = ("uses \\Q...\\E at position {at}, PCRE's quoting, which Python's re, the regex package and ECMA 262 "
                 "lack (they refuse \\Q, or read a bare Q): escape each special character of the text instead, as "
                 "re.escape does")


def _quoting_problem(pattern: str) -> str | None:
    """Why ``pattern``, which Python's ``re`` refuses, is refused for PCRE's quoting ``\\Q...\\E``
    (``regex_u_flag.pcre_quoting``), with the pattern its text escaped offered where ``offer_taken``;
    None where it has none. ``re`` said only "bad escape \\Q", "fix the pattern"."""
    from lmnb_engine.regex_u_flag import pcre_quoting

    found = pcre_quoting(pattern)
    if found is None:
        return None
    at, offer = found
    written = f": write {shown_regex(offer)}" if offer_taken(offer) else ""
    return f"regex {shown_regex(pattern)} {QUOTING_WORDS.format(at=at)}{written}"


# A named group's opening, Python's (?P<name> or ECMA's (?<name> (group 1: "P" or ""; group 2: the name)
_ANY_NAMED_GROUP = re.compile(r"\(\?(P?)<([^\W\d]\w*)>")


def repeated_name(pattern: str, ecma: bool = True) -> tuple[str, list[int], str] | None:
    """The first group name ``pattern`` gives twice (``(?<m>a)|(?<m>b)``, which ECMA 262 takes since
    2025 where the two are in different alternatives, and Python's ``re`` refuses): (the name, where
    each group of that name opens, in order, the pattern with each group whose name an earlier one
    has opened as a group that captures nothing, ``(?:``), or None where no name is repeated.
    Groups are found outside classes and comments (``pattern_parts``). ``ecma`` False: Python's
    ``(?P<name>`` groups alone (a schema's pattern, whose ECMA groups the engine reads as plain
    ones: ``json_schema.ecma_names_as_python``)."""
    seen: dict[str, list[int]] = {}  # each name's groups' openings
    repeats = []  # (where, the opening's length) of each group whose name an earlier one has
    found = None
    for part in pattern_parts(pattern):
        m = _ANY_NAMED_GROUP.match(pattern, part.start) if part.kind == "(" else None
        if m and (ecma or m.group(1)):
            if m.group(2) in seen:
                repeats.append((part.start, m.end() - part.start))
                found = found or m.group(2)
            seen.setdefault(m.group(2), []).append(part.start)
    if found is None:
        return None
    offer = pattern
    for at, length in reversed(repeats):
        offer = offer[:at] + "(?:" + offer[at + length:]
    return found, seen[found], offer


_COUNTS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def repeated_name_words(name: str, places: list[int], reader: str) -> str:
    """What is wrong with a pattern that names two or more groups ``name`` (opening at positions
    ``places``: ``repeated_name``) and the fix, words that follow the pattern; ``reader``: what
    Python's ``re`` reads here ("a regex"). Said of a ``regex`` and of a schema's ``pattern`` alike."""
    count = len(places)
    where = f"{', '.join(map(str, places[:-1]))} and {places[-1]}"
    fix = ("rename one, or make the second a group that captures nothing" if count == 2 else
           "rename all but one, or make each after the first a group that captures nothing")
    return (f"it names {_COUNTS.get(count, count)} groups {name}, at positions {where}, and Python's re, which reads "
            f"{reader}, takes a group's name once (ECMA 262 takes one again only in another alternative); {fix}, (?:...)")


def _repeated_name_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused where it names two groups alike (``repeated_name``), or None:
    Python's ``re`` said "redefinition of group name", or only "unknown extension ?<m", and "fix
    the pattern". The fix (``repeated_name_words``) offers the pattern so written, each group
    spelled as Python does, ``(?P<m>``, where ``offer_taken``."""
    found = repeated_name(pattern)
    if found is None:
        return None
    name, places, offer = found
    ecma = [part.start for part in pattern_parts(offer)  # (each group's opening: not "(?<m>" in a class, nor "\\(?<m>")
            if part.kind == "(" and (m := _ANY_NAMED_GROUP.match(offer, part.start)) and not m.group(1)]
    for at in reversed(ecma):
        offer = offer[:at + 2] + "P" + offer[at + 2:]
    written = f": write {shown_regex(offer)}" if offer != pattern and offer_taken(offer) else ""
    return (f"regex {shown_regex(pattern)} cannot be compiled: "
            + repeated_name_words(name, places, "a regex here") + written)


# A named group's opening as ECMA 262, .NET and Rust's regex write it, (?<name>, with a name Python
# takes (group 1), which Python's re writes (?P<name>
_OTHER_NAMED_GROUP = re.compile(r"\(\?<([^\W\d]\w*)>")


def _named_group_problem(pattern: str, error: re.error) -> str | None:
    """Why ``pattern`` is refused where Python's ``re`` refused it (``error``) at a named group's
    opening in another dialect's syntax, ``(?<year>`` (outside classes and comments:
    ``pattern_parts``), with Python's spelling, ``(?P<year>``, offered: the whole pattern so
    written, each such group respelled, where ``gen()`` takes it and the engine builds it (as
    ``offer_taken`` asks); else that group alone, and why the pattern so written is refused
    next (a back-reference, a lookbehind ...); or None for another error, or where ``re``
    refuses the respelled pattern too (a name given twice, another syntax error)."""
    opens = [part.start for part in pattern_parts(pattern)
             if part.kind == "(" and _OTHER_NAMED_GROUP.match(pattern, part.start)]
    if error.pos is None or error.pos - 1 not in opens:
        return None
    python = pattern
    for at in reversed(opens):
        python = python[:at + 2] + "P" + python[at + 2:]
    if python_error(python) is not None:
        return None
    name = _OTHER_NAMED_GROUP.match(pattern, error.pos - 1).group(1)
    refused = pattern_problem(python) or unbuilt_feature(python)
    part = f"(?P<{name}>...) for it" if len(opens) == 1 else "(?P<name>...) for each (?<name>...)"
    fix = f"write {shown_regex(python)}" if refused is None else f"write {part}; but so written, {refused}"
    return (f"regex {shown_regex(pattern)} cannot be compiled: it is not a valid regular expression "
            f"({error_words(pattern, error)}); Python's re, which reads a regex here, names a group (?P<{name}>...), "
            f"where ECMA 262, .NET and Rust's regex write (?<{name}>...): {fix}")


# Global inline flags, (?i)(?x): Python takes them only at the pattern's start, where they come
# before an edge anchor (``(?i)^yes$``) and say whether ``#`` opens a comment (``(?x)``), and the
# stop matcher reads past them for a lookbehind first (``stop_matcher``). The letters are the regex
# package's (the stop matcher's): Python's, aiLmsux, and b e f p r w and the versions V0 V1, which
# Python refuses (its own error names them). (Not "(?R)": a recursion, to the regex package.)
GLOBAL_FLAGS = re.compile(r"(?:\(\?(?:[abefiLmprsuwx]|V[01])+\))+")
# A group head that sets or clears flags in its scope, (?i: (?-i: (?x-s: (?V1x: ...: its letters set
# (group 1) and cleared (group 2), as the regex package (the stop matcher's reader) reads them, which
# sets b e f p r w and V0 V1 there too and clears f w: a superset of Python's (aiLmsux set, imsx
# cleared), so the two read any group head a pattern Python takes holds alike ("(?:" sets none)
SCOPED_FLAGS = re.compile(r"\(\?((?:[abefiLmprsuwx]|V[01])*)(?:-([afiLmsuwx]+))?:")


def without_edge_anchors(pattern: str) -> str:
    """``pattern`` without the anchors at its edges: ``^`` or ``\\A`` opening it, or opening any of
    its top-level alternatives, and ``$`` or ``\\Z`` closing them (``^\\d{3}$``, ``^yes$|^no$``).
    Constrained output must match the whole pattern, so there they always hold; xgrammar, SGLang's
    default grammar backend, drops them too, and so do JSON Schema patterns here
    (``constrained.json_string``). Other anchors are left for the engine's
    ``constrained.regex_check.check_regex`` to refuse by name."""
    flags = GLOBAL_FLAGS.match(pattern)
    head = flags.group() if flags else ""
    return head + "|".join(_trim_anchors(alt) for alt in _top_level_alternatives(pattern[len(head):]))


def _top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at its ``|`` outside groups, character classes and escapes."""
    parts, start, depth, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1
            i += pattern.startswith("^", i)  # a negation, then a ']' first in the class is literal
            i += pattern.startswith("]", i)
            continue
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


def _escaped(text: str, at: int) -> bool:
    """Whether ``text[at]`` follows an odd run of backslashes (is escaped)."""
    run = len(text[:at]) - len(text[:at].rstrip("\\"))
    return run % 2 == 1


def _trim_anchors(alternative: str) -> str:
    """``alternative`` (a top-level one) less the ``^`` / ``\\A`` opening it and the unescaped ``$`` /
    ``\\Z`` closing it (``without_edge_anchors``)."""
    while alternative.startswith(("^", "\\A")):
        alternative = alternative[1 if alternative[0] == "^" else 2:]
    while True:
        if alternative.endswith("$") and not _escaped(alternative, len(alternative) - 1):
            alternative = alternative[:-1]
        elif alternative.endswith("\\Z") and not _escaped(alternative, len(alternative) - 2):
            alternative = alternative[:-2]
        else:
            return alternative


def empty_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused as empty, or None: nothing but anchors at its edges
    (``without_edge_anchors``: ``""``, ``^$``, ``\\Z``), or what is left matches only the empty
    string (``(?i)^$``, ``^|$``, ``(?:)``, ``a{0}``), so a constrained output could hold no text.
    Asked by the language's ``gen()`` and a ``%%lm`` cell (``pattern_problem``) and by the engine,
    in these words."""
    trimmed = without_edge_anchors(pattern)
    if trimmed == "":
        dropped = " once its anchors are dropped (the output matches the whole pattern)" if pattern else ""
        what = f"is empty{dropped}"
    elif _matches_only_empty(trimmed):
        what = "matches only the empty string"
    else:
        return None
    return (f"regex {shown_regex(pattern)} {what}; it would only allow an empty output, with no text: "
            "give a pattern that matches some text, or no regex (for no output at all, max_tokens=0)")


def _matches_only_empty(pattern: str) -> bool:
    """Whether Python's ``re`` reads ``pattern`` as matching the empty string and no longer text
    (``(?:)``, ``a{0}``, ``|``, ``(?i)``: each of its matches is zero characters wide), each Unicode
    class held by one character (as ``classes_held`` holds them, but one wide, as the class is);
    False where it cannot read it (its own error is named elsewhere)."""
    held = pattern
    for m in reversed(unicode_classes(pattern)):
        held = held[:m.start(2)] + "%" + held[m.end(2):]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return parser.parse(held).getwidth()[1] == 0 and re.fullmatch(held, "") is not None
    except (re.error, RecursionError, OverflowError):
        return False


def _too_deep(pattern: str) -> str:
    return (f"regex {shown_regex(pattern)} nests its parentheses too deeply for Python's re to read; flatten "
            "the pattern")


# The POSIX classes a user most likely meant by "[[:name:]]", as the characters the automaton
# library (Rust's regex) reads them as, ASCII only (the POSIX "C" locale's), spelled so that
# Python's re and that library read them alike.
_POSIX = {"alpha": "A-Za-z", "digit": "0-9", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
          "space": "\\t\\n\\v\\f\\r ", "xdigit": "0-9A-Fa-f", "punct": "!-/:-@\\[-`{-~", "word": "0-9A-Za-z_",
          "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f", "graph": "!-~", "print": " -~"}


def ambiguous_class(pattern: str, warning: FutureWarning) -> str:
    """The message for a class that Python's ``re`` flags as ambiguous with ``warning`` ("Possible
    nested set at position 1": ``[[:alpha:]]``, ``[a&&b]``, ``[a--b]``, ``[a||b]``, ``[a~~b]``),
    which the automaton library (Rust's regex) reads as a POSIX class or a set operation: the
    pattern, the warning, and the fix (``_ambiguity_fix``)."""
    return (f"regex {shown_regex(pattern)}: {warning} — Python reads it as literal characters, the automaton library "
            f"as a POSIX class or a set operation; {_ambiguity_fix(pattern, warning)}")


def _ambiguity_fix(pattern: str, warning: FutureWarning) -> str:
    """How to write ``pattern`` so both readers agree, made from the pattern itself: where a flagged
    class matches no character as the automaton library reads it (``[\\s&&\\S]``), that, and to
    remove it or write what was meant (a rewrite in that reading would be refused); else for known
    POSIX classes (``_posix_reading``), first, the characters each stands for, for a difference or an
    intersection of two Unicode or Perl classes (``_set_operation``) a negated class both read so,
    and for another set operation or nested class the ASCII characters it holds (``_members_reading``); then the
    character(s) Python flagged escaped (a "[" that opens a nested set, both of "&&", "--", "||",
    "~~"; ``_literal_reading``), the literal reading, which a user meaning a POSIX class or a set
    operation does not want; that only where ``gen()`` takes it: where Python's own reading is no
    pattern (``[[:alpha:]|)]``: the class ends at the first "]", and the ")" after it closes no
    group), that is said with Python's error instead."""
    m = re.search(r"at position (\d+)", str(warning))
    if m is None:  # (every Python that warns names the position; say what to do anyway)
        return 'escape the "[" or the doubled character to mean the characters themselves'
    i = int(m.group(1))
    n = 1 if pattern[i] == "[" else 2
    read_literally = _literal_reading(pattern, i)
    # (where the rest of the pattern holds what the engine cannot build, no whole pattern is offered:
    # the flagged class alone is, written as each reading has it)
    alone_fix = _class_alone_fix(pattern, i) if unbuilt_feature(read_literally) else None
    if alone_fix:
        return alone_fix
    refused = pattern_problem(read_literally)
    if refused is None:
        literal, alone = f"{shown_regex(read_literally)} to mean the characters", ""
    else:  # (Python's own reading is no pattern: "[[:alpha:]|)]" has an unbalanced ")" to it, "[[:alpha:]" a class)
        literal = None
        why = python_error(read_literally) or refused
        alone = (f"read as Python reads it, its characters literal ({shown_regex(read_literally)}), it is refused too "
                 f"({why})")
    empty = [pattern[start:end] for start, end in _rust_classes(pattern)
             if _flagged(pattern[start:end]) and _automaton_matches_nothing(pattern[start:end])]
    if empty:
        classes = f"the class {empty[0]} matches" if len(empty) == 1 else f"the classes {', '.join(empty)} match"
        return (f"{classes} no character as the automaton library reads it (an empty set, which it refuses): remove "
                f"{'it' if len(empty) == 1 else 'them'}, or write the class you meant; "
                + (f"write {literal}" if literal else alone))
    posix = _posix_reading(pattern) if n == 1 else None
    operation = None if posix else _set_operation(pattern, i)
    members = None if posix or operation else _members_reading(pattern)
    if posix:
        offer = f"write {shown_regex(posix[0])} for {posix[1]} (ASCII, as the automaton library reads it)"
    elif operation:
        offer = f"write {shown_regex(operation[0])} for the set {operation[1]}"
    elif members:
        offer = f"write {shown_regex(members[0])} for {members[1]} (its characters, as the automaton library reads it)"
    else:
        return f"write {literal}" if literal else f"{alone}; fix the pattern"
    return f"{offer}, or {literal}" if literal else f"{offer}; {alone}"


def _class_alone_fix(pattern: str, at: int) -> str | None:
    """``_ambiguity_fix`` of the class of ``pattern`` that holds ``at`` (as the automaton library
    delimits it: ``_rust_classes``), taken as a pattern alone, said as the fix for that class;
    None where no class holds ``at`` or Python flags none alone."""
    for start, end in _rust_classes(pattern):
        if start <= at < end and (start, end) != (0, len(pattern)):
            cls = pattern[start:end]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", FutureWarning)
                    parser.parse(classes_held(cls))
            except FutureWarning as w:
                return f"for the class {cls}: {_ambiguity_fix(cls, w)}"
            except (re.error, RecursionError, OverflowError):
                return None
    return None


def _posix_reading(pattern: str) -> tuple[str, str] | None:
    """``pattern`` with each character class that opens with a POSIX class (which Python's ``re``
    flags as a possible nested set), as the automaton library (Rust's regex) delimits it
    (``_rust_classes``), written as the characters that library reads it as, and the POSIX
    classes' names (``[:alpha:], [:digit:]``), where ``gen()`` then takes the pattern; None where
    a name is no known POSIX class (``[:foo:]``) or ``gen()`` refuses the result. A class of
    POSIX classes and single items (``[[:alpha:][:digit:]_]``) has each class written as its
    characters (``_POSIX``: ``[A-Za-z0-9_]``); one with a negated POSIX class, a nested class or a
    set operation (``[[:^alpha:]]``, ``[[:alpha:]&&a]``) is written as the characters it holds
    (``_class_members``)."""
    names: list[str] = []
    rewrites = []
    caseless = bool(_CASELESS.search(pattern))  # (erring towards yes: a form is then checked under (?i))
    for start, end in _rust_classes(pattern):
        text = pattern[start:end]
        posix = list(_POSIX_CLASS.finditer(text))
        if not posix or not _POSIX_CLASS.match(text, 1 + text.startswith("[^")):
            continue  # (a "[" after a class's first item is a literal to Python, and to the engine)
        if any(m.group(1).lstrip("^") not in _POSIX for m in posix):
            return None
        names += [m.group() for m in posix]
        bare = _POSIX_CLASS.sub("", text[1:-1])  # (what is left beside the POSIX classes)
        if "[" in bare or re.search(r"&&|--|~~|\[:\^", text):
            spelled = _class_members(_POSIX_CLASS.sub(_posix_set, text), caseless=text if caseless else None)
        else:
            spelled = _POSIX_CLASS.sub(lambda m: _POSIX[m.group(1)], text)
        if spelled is None:
            return None
        rewrites.append((start, end, spelled))
    return _rewritten(pattern, rewrites, names, offer_taken)


def _rewritten(pattern: str, rewrites: list[tuple[int, int, str]], names: list[str],
               takes: Callable[[str], bool]) -> tuple[str, str] | None:
    """(``pattern`` with each ``(start, end, text)`` of ``rewrites``, in order and apart, in place of
    ``pattern[start:end]``; ``names``, once each, joined by ", ") where ``takes`` that pattern, the
    end of each class rewrite offered here; None where nothing was rewritten or it does not."""
    out, done = [], 0
    for start, end, text in rewrites:
        out += [pattern[done:start], text]
        done = end
    fixed = "".join(out) + pattern[done:]
    if not rewrites or not takes(fixed):
        return None
    return fixed, ", ".join(dict.fromkeys(names))


def _members_reading(pattern: str) -> tuple[str, str] | None:
    """``pattern`` with each character class that Python's ``re`` flags as ambiguous (a set
    operation, ``[a-z&&[^aeiou]]``, or a nested class, ``[[a-z]]``), as the automaton library
    (Rust's regex) delimits it (``_rust_classes``), written as the ASCII characters that library
    reads it to hold (``_class_members``: ``[b-df-hj-np-tv-z]``), and those classes as written
    (``[a-z&&[^aeiou]]``), where ``gen()`` then takes the pattern; None where a flagged class
    holds a POSIX class (``_posix_reading``'s) or "||" (a union to the ``regex`` package, two
    "|" to Rust's regex), or holds characters beyond ASCII and not all of them (``[\\w--\\d]``)."""
    names: list[str] = []
    rewrites = []
    caseless = bool(_CASELESS.search(pattern))  # (erring towards yes: a form is then checked under (?i))
    for start, end in _rust_classes(pattern):
        text = pattern[start:end]
        if not _flagged(text):
            continue
        spelled = (None if _POSIX_CLASS.search(text) or "||" in text
                   else _class_members(text, ascii_only=True, caseless=text if caseless else None))
        if spelled is None:
            return None
        names.append(text)
        rewrites.append((start, end, spelled))
    return _rewritten(pattern, rewrites, names, offer_taken)


def _flagged(cls: str) -> bool:
    """Whether Python's ``re`` flags the class ``cls`` (its Unicode classes held) as a possible
    nested set or set operation (a ``FutureWarning``)."""
    return _flag_position(cls) is not None


def _flag_position(pattern: str) -> int | None:
    """Where Python's ``re`` first flags ``pattern`` (its Unicode classes held) for a possible nested
    set or set operation (the position its ``FutureWarning`` names), or None where it flags nothing."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", FutureWarning)
            parser.parse(classes_held(pattern))
    except FutureWarning as w:
        m = re.search(r"at position (\d+)", str(w))
        return int(m.group(1)) if m else None
    except (re.error, RecursionError, OverflowError):
        pass
    return None


def _literal_reading(pattern: str, at: int) -> str:
    """``pattern`` with the character(s) Python's ``re`` flags at ``at`` escaped (a "[" that opens a
    nested set, both of "&&", "--", "||", "~~"), and so each it flags after, so that ``gen()`` takes
    it with each such class read as its characters, as Python reads it (``[a\\&\\&b]``). Where
    Python reads the pattern, a "--" it reads in a range (``[(--]``, "(" to "-"; ``[--a]``, "-" to
    "a") has one "-" escaped, the one that keeps Python's reading (``[(-\\-]``, ``[\\--a]``);
    where it does not (``[a--b]``, a range down from "a"), both, each "-" a character."""
    read = python_reading(pattern)
    while at is not None:
        n = 1 if pattern[at] == "[" else 2
        ways = [pattern[:at] + "".join("\\" + c for c in pattern[at:at + n]) + pattern[at + n:]]
        if pattern.startswith("--", at):
            ways += [pattern[:at + 1] + "\\" + pattern[at + 1:], pattern[:at] + "\\" + pattern[at:]]
        pattern = next((way for way in ways if read is not None and python_reading(way) == read), ways[0])
        at = _flag_position(pattern)  # (each escape takes a flag away: the loop ends)
    return pattern


def python_reading(pattern: str) -> str | None:
    """Python's parse of ``pattern`` (warnings ignored), written out (a group's parse compares by
    identity, its text by value), or None where it cannot read it, or holds a Unicode class, which
    Python reads only held by other characters: two patterns Python reads alike parse alike."""
    if unicode_classes(pattern):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return repr(parser.parse(pattern))
    except (re.error, RecursionError, OverflowError):
        return None


def stop_posix_problem(pattern: str) -> str | None:
    """Why the ``stop_regex`` ``pattern`` is refused for a POSIX class in a character class
    (``[[:alpha:]]``, ``[a[:alpha:]]``), or another property class the stop matcher reads in that
    form (``[[:Script=Greek:]]``, ``[[:^Greek:]]``: ``_V0_PROPERTY_CLASS``), or None: the stop
    matcher (the ``regex`` package) reads it as a class of Unicode characters, Python's ``re`` as
    literal characters (where it opens the class, ``regex=`` refuses it as ambiguous:
    ``ambiguous_class``). The message names the first such class and offers the pattern as the stop
    matcher reads it with each POSIX class as its ASCII characters (``_stop_posix_reading``; none
    for another property), then the literal reading, every such class's "[" escaped
    (``_stop_literal_reading``), where the stop matcher reads it (else that Python's own reading is
    no pattern, and why). A class is found where an item of a character class, as Python's
    parser delimits them (``_class_items``), opens one."""
    posix = _first_posix(pattern)
    if posix is None:
        return None
    import regex  # (the stop matcher's reader)

    i = posix.start()
    read_literally = _stop_literal_reading(pattern)
    try:
        regex.compile(read_literally)
        literal = f"{shown_regex(read_literally)} to mean the characters"
    except regex.error as e:  # (Python's own reading is no pattern: "[[:alpha:]|)]" has an unbalanced ")" to it)
        literal = None
        refused = (f"read as Python reads it, its characters literal ({shown_regex(read_literally)}), it is refused too "
                   f"({python_error(read_literally) or e})")
    fix = _stop_posix_reading(pattern)
    offer = ""
    if fix:
        operators = [op for op in ("&&", "--", "||", "~~") if op in fix[1]]
        told = (f" (the stop matcher has no set operations: it reads {', '.join(map(shown_regex, operators))} in a "
                "class as characters)") if operators else ""
        offer = f"write {shown_regex(fix[0])} for its ASCII characters{told}"
    kind = "POSIX class" if posix.group(1).lstrip("^") in _POSIX else "property class"
    if literal:
        fixes = f"{offer}, or {literal}" if offer else f"write {literal}"
    else:
        fixes = f"{offer}; {refused}" if offer else f"{refused}; fix the pattern"
    return (f"{shown_regex(pattern)} holds the {kind} {posix.group()} at position {i}, which the stop "
            "matcher (the regex package) reads as a class of Unicode characters, and Python's re as literal "
            f"characters; {fixes}")


def _stop_literal_reading(pattern: str) -> str:
    """``pattern`` with the "[" of each class the stop matcher reads as a POSIX or property class
    (``_first_posix``) escaped, as Python's ``re`` reads them all: one escape at a time, since the
    stop matcher's classes end where Python's do only up to its first such class
    (``[[:alpha:][:digit:]]``: Python's first class ends at the first "]"). Each escape takes one
    class away, so the loop ends."""
    while (posix := _first_posix(pattern)) is not None:
        pattern = pattern[:posix.start()] + "\\" + pattern[posix.start():]
    return pattern


def _first_posix(pattern: str) -> re.Match | None:
    """The first POSIX or property class (``[:alpha:]``, ``[:Script=Greek:]``:
    ``_V0_PROPERTY_CLASS``) that opens an item of a character class of ``pattern``, as Python's
    parser delimits a class's items (``_class_items``), or None."""
    for items in _class_items(pattern):
        posix = next((m for start, _ in items if (m := _V0_PROPERTY_CLASS.match(pattern, start))), None)
        if posix:
            return posix
    return None


# An inline flag group that may turn on case-insensitive matching ("(?i)", "(?ai:"), erring towards yes
_CASELESS = re.compile(r"\(\?\^?[a-zA-Z]*i")


def _stop_posix_reading(pattern: str) -> tuple[str, str] | None:
    """The ``stop_regex`` ``pattern`` with each character class that holds a POSIX class written as
    the characters the stop matcher reads it to hold, each POSIX class read as its ASCII characters
    (``_POSIX``, the POSIX "C" locale's), and the classes rewritten joined by ", "; None where a
    POSIX class has no ASCII reading here (``[:greek:]``), a class would hold no character or over
    ``_MAX_MEMBER_RANGES`` ranges, or the result still holds a POSIX class. The stop matcher reads a
    pattern with the ``regex`` package's version 0, its default, where a class is a union of items
    with no set operation and no nested class (``[[:alpha:]&&a]``: the letters, "&" and "a"; a "-"
    beside a POSIX class is a "-": ``_v0_class_chars``); None too for a pattern that turns on
    version 1 (``(?V1)``), whose rewrite Python's ``re`` would refuse for that flag anyway."""
    import regex  # (a dependency of transformers, declared by lmnb too; the stop matcher's reader)

    try:
        if regex.compile(pattern).flags & regex.VERSION1:
            return None
    except regex.error:
        return None
    caseless = bool(_CASELESS.search(pattern))
    names, rewrites = [], []
    for start, end, posix in _v0_classes(pattern):
        if not posix:
            continue
        if any(m.group(1).lstrip("^") not in _POSIX for m in posix):
            return None
        spelled = _v0_class_chars(pattern, start, end, posix, caseless)
        if spelled is None:
            return None
        names.append(pattern[start:end])
        rewrites.append((start, end, spelled))

    def takes(fixed: str) -> bool:
        try:
            regex.compile(fixed)
        except regex.error:
            return False
        return _first_posix(fixed) is None

    return _rewritten(pattern, rewrites, names, takes)


def _classes(pattern: str, class_end: Callable[[str, int], tuple | None]) -> Iterator[tuple]:
    """(start, *what ``class_end`` says) for each outermost character class of ``pattern``, where
    ``class_end(pattern, start)`` reads the class that opens at ``start`` as one dialect delimits it,
    giving (its end, ...) or None for an unclosed class, which ends the walk. Outside classes an
    escape is one item (``_item_end``) and a comment is skipped as Python's parser skips it
    (``_comments``)."""
    comments = dict(_comments(pattern))
    i, n = 0, len(pattern)
    while i < n:
        if i in comments:
            i = comments[i]
        elif pattern[i] == "\\":
            i = _item_end(pattern, i)
        elif pattern[i] != "[":
            i += 1
        else:
            found = class_end(pattern, i)
            if found is None:
                return
            yield i, *found
            i = found[0]


def _v0_classes(pattern: str) -> Iterator[tuple[int, int, list[re.Match]]]:
    """The (start, end) of each character class of ``pattern`` as the ``regex`` package's version 0
    delimits it, with the POSIX classes it holds: after "[" and an optional "^" its first item is
    read whatever it is (a "]" there is a literal), then items up to the next "]", each an escape
    (``_item_end``), a POSIX class ``[:name:]`` whole (a "[" else is a literal: no nested class)
    or one character (``_classes`` walks between them)."""

    def class_end(pattern: str, i: int) -> tuple | None:
        posix, n = [], len(pattern)
        i += 1 + pattern.startswith("^", i + 1)
        first = True
        while i < n and (first or pattern[i] != "]"):
            first = False
            m = _V0_PROPERTY_CLASS.match(pattern, i)
            if m:
                posix.append(m)
                i = m.end()
            elif pattern[i] == "\\":
                i = _item_end(pattern, i)
            else:
                i += 1
        return None if i >= n else (i + 1, posix)

    return _classes(pattern, class_end)


def _outside_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The code points outside ``runs`` (``[lo, hi)`` pairs, in order), as runs alike: the negated
    spelling of a class whose characters are ``runs``."""
    return [(lo, hi) for lo, hi in zip([0] + [e for _, e in runs], [s for s, _ in runs] + [0x110000]) if lo < hi]


def _v0_class_chars(pattern: str, start: int, end: int, posix: list[re.Match], caseless: bool) -> str | None:
    """The class ``pattern[start:end]`` (which holds the POSIX classes ``posix``), read as the
    ``regex`` package's version 0 reads it with each POSIX class as its ASCII characters
    (``_POSIX``), written as ranges of its characters (``_ranges``): the class's other items are read
    by that package with each POSIX class held by ``\\P{Any}``, an item of no character that, as a
    POSIX class does, ends no range (``[a-[:digit:]]``: "a", "-" and the digits), and that union
    is joined with each POSIX class's characters (or, negated, ``[:^digit:]``, all but those).
    The class is written negated where it was, so that case-insensitive matching (which tests a
    character's other cases against the set) reads it as it read the original; where no flag
    group can turn that on (``caseless``), the shorter of it and its complement. None where that
    package does not read it or no form fits ``_MAX_MEMBER_RANGES`` ranges."""
    negated = pattern.startswith("[^", start)
    body, done = [], start + 1 + negated
    for m in posix:
        body += [pattern[done:m.start()], "\\P{Any}"]
        done = m.end()
    body.append(pattern[done:end - 1])
    # (a "^" first after "[^" is a literal: escaped, so that the class of the other items stays unnegated)
    others = "".join(body)
    others = "\\" + others if others.startswith("^") else others
    union = "|".join([f"[{others}]"] + [f"[{'^' if m.group(1).startswith('^') else ''}{_POSIX[m.group(1).lstrip('^')]}]"
                                              for m in posix])
    inside = code_point_runs(union)
    if inside is None:
        return None
    outside = _outside_runs(inside)
    forms = [(inside, "^" if negated else ""), (outside, "" if negated else "^")][:1 if caseless else 2]
    spelled = [form for form in (_ranges(spans, negation) for spans, negation in forms) if form is not None]
    return min(spelled, key=len) if spelled else None


def _posix_set(m: re.Match) -> str:
    """The POSIX class ``m`` (``[:alpha:]``, ``[:^alpha:]``) as a nested set the ``regex`` package reads."""
    name = m.group(1)
    return f"[^{_POSIX[name[1:]]}]" if name.startswith("^") else f"[{_POSIX[name]}]"


def _rust_classes(pattern: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of each outermost character class of ``pattern`` as Rust's regex delimits
    it: a "[" inside it opens a nested class (a POSIX class ``[:name:]`` is one item), a "]" first
    (after "[" or "[^") is a literal, and an escape is one item (``_item_end``; ``_classes`` walks
    between them)."""

    def class_end(pattern: str, i: int) -> tuple | None:
        depth, n = 0, len(pattern)
        while i < n:
            if pattern[i] == "[" and depth and _POSIX_CLASS.match(pattern, i):
                i = _POSIX_CLASS.match(pattern, i).end()
            elif pattern[i] == "[":
                depth += 1
                i += 1 + pattern.startswith("^", i + 1)
                i += pattern.startswith("]", i)
            elif pattern[i] == "]":
                depth -= 1
                i += 1
                if depth == 0:
                    return (i,)
            else:
                i = _item_end(pattern, i)
        return None

    return _classes(pattern, class_end)


# A class is offered as its characters when it makes at most this many ranges.
_MAX_MEMBER_RANGES = 8


# A set operator that opens a class or follows another or ends a class (erring towards yes: an escaped
# "[" before one too): the regex package and Rust read such a class apart
_EMPTY_OPERAND = re.compile(r"\[\^?(?:&&|--|~~)|(?:&&|--|~~)(?:&&|--|~~|\])")


def _class_members(cls: str, ascii_only: bool = False, caseless: str | None = None) -> str | None:
    """The class ``cls`` (with nested classes and set operations: ``[[A-Za-z]&&a]``) as a class of
    the characters the ``regex`` package's version 1 reads it to hold, which is Rust's reading of
    such a class: ranges of them (``[a]``), or a negated class of the rest where that is shorter
    (``[^A-Za-z]``); None where that package cannot read it or it takes more than
    ``_MAX_MEMBER_RANGES`` ranges, or where a set operation has an empty operand (``[a&&]``,
    ``[&&a]``, ``[a--&&b]``, ``[--a]``), which Rust reads as an empty set and the package otherwise.
    Surrogates, which no text holds, are left out of the ranges. ``ascii_only``: only a class of
    ASCII characters, or a negated one of ASCII characters (every other character held), is
    written, so that no Unicode table, where the package's and Rust's may differ (``\\w``, ``\\d``:
    ``[\\w--\\d]`` holds ``é``), decides what the class holds. None too for a class of no character
    (``[[:alpha:]&&[:digit:]]``), which no class offered can stand for. ``caseless``: the class as
    the pattern writes it, where ``(?i)`` may hold there; then only a form that the engine reads
    under ``(?i)`` as the library reads that class is written (``_caseless_alike``): the library
    adds each item's case pairs before negating it, so that the complement of a class may hold
    other characters (``(?i)[[^B]b-e]`` holds every character, ``(?i)[^B]`` neither case of b)."""
    if _EMPTY_OPERAND.search(cls):
        return None
    inside = code_point_runs(cls, "(?V1)")
    if not inside:  # (no character: a negated class of every one, which the automaton library refuses)
        return None
    outside = _outside_runs(inside)
    forms = [_ranges(spans, negation) for spans, negation in ((inside, ""), (outside, "^"))
             if not ascii_only or all(hi <= 0x80 for _, hi in spans)]
    forms = [form for form in forms if form is not None and (caseless is None or _caseless_alike(caseless, form))]
    return min(forms, key=len) if forms else None


@functools.cache
def _cased_vocabulary():
    """An outlines-core vocabulary of one token per character that has another case (as Python's
    ``str.lower``, ``str.upper`` and ``str.casefold`` tell, a few thousand) and per ASCII character,
    with the characters in id order; built once, when an ambiguous class is met where (?i) may hold."""
    from outlines_core import Vocabulary  # (torch-free)

    # (planes 0 and 1 hold every character with case; the last, U+1E943, is Adlam's)
    chars = [chr(c) for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF
             and (c < 0x80 or chr(c).lower() != chr(c) or chr(c).upper() != chr(c) or chr(c).casefold() != chr(c))]
    return Vocabulary(len(chars), {ch.encode(): [i] for i, ch in enumerate(chars)}), chars


@functools.lru_cache(maxsize=256)
def _caseless_alike(cls: str, form: str) -> bool:
    """Whether the engine reads the class ``form`` under ``(?i)`` (``automaton_syntax``, as it reads
    a pattern ``gen()`` takes) to hold the characters the automaton library reads the class ``cls``
    under ``(?i)`` to hold: asked of that library, of every character with another case (only
    those can fold; every other one the two hold alike, or not, by how ``form`` was worked out)."""
    from outlines_core import Index

    from lmnb_engine.constrained.regex_syntax import automaton_syntax  # (torch-free; it imports this module)

    vocabulary, chars = _cased_vocabulary()

    def held(pattern: str) -> set[str]:
        try:
            index = Index(pattern, vocabulary)
        except ValueError:  # (no character leads on: an empty class)
            return set()
        start = index.get_initial_state()
        return {ch for i, ch in enumerate(chars) if (state := index.get_next_state(start, i)) is not None
                and index.is_final_state(state)}

    return held(f"(?i){cls}") == held(automaton_syntax(f"(?i){form}"))


def _ranges(spans: list[tuple[int, int]], negation: str) -> str | None:
    """A class of the code points in ``spans`` (``[lo, hi)`` pairs), cut around the surrogates,
    each written as both Python's ``re`` and Rust's regex read it; None beyond ``_MAX_MEMBER_RANGES``
    ranges or for no code point."""
    cut = without_surrogates(spans)
    if not cut or len(cut) > _MAX_MEMBER_RANGES:
        return None
    items = (_spelled(lo) if lo == hi else f"{_spelled(lo)}-{_spelled(hi)}" for lo, hi in cut)
    return f"[{negation}" + "".join(items) + "]"


def _spelled(code: int) -> str:
    """One character in a class: an ASCII letter or digit as itself, other printable ASCII escaped
    where a class would read it otherwise, the rest as a ``\\x``, ``\\u`` or ``\\U`` escape."""
    ch = chr(code)
    if ch.isascii() and ch.isalnum():
        return ch
    if 0x20 < code < 0x7F:
        return "\\" + ch if ch in "\\]^-[&~|" else ch
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_POSIX_CLASS = re.compile(r"\[:(\^?\w+):\]")

# A class in a class that the regex package (the stop matcher) reads as a property, as its parser
# (parse_posix_class) reads one: "[:", an optional "^", a name of ASCII letters, digits and
# " &_-.", optionally ":" or "=" and a value of those and "/" (not only spaces, else no value is
# read and the name must be followed by ":]"), then ":]" (``[:alpha:]``, ``[:^Greek:]``,
# ``[:Script=Greek:]``, ``[:sc:Greek:]``, ``[:nv=1/2:]``); a name it knows no property by is an
# error, not literal characters
_V0_PROPERTY_CLASS = re.compile(r"\[:(\^?[A-Za-z0-9 &_.-]*(?:[:=][A-Za-z0-9 &_./-]*[A-Za-z0-9&_./-][A-Za-z0-9 &_./-]*)?):\]")


def _in_a_class(pattern: str, at: int) -> bool:
    """Whether ``pattern[at]``, where an item starts, stands inside a character class, as Python's
    parser delimits a class's items (``_class_items``)."""
    return any(start == at for items in _class_items(pattern) for start, _ in items)


def _set_operation(pattern: str, at: int) -> tuple[str, str] | None:
    """``pattern`` with the class whose "--" or "&&" is at ``at``, a difference or an intersection of
    two Unicode classes (``[\\p{L}--\\p{Ll}]``, Rust's reading; the second may be nested, negated
    or not: ``[\\p{L}&&[^\\p{Ll}]]``) or Perl classes (``[\\w--\\d]``), written as a negated class
    of their complements (``[^\\P{L}\\p{Ll}]``, ``[^\\W\\d]``: A and not B is not (not A or B)),
    which Python's ``regex`` package and the automaton library read alike (each class as it reads
    it), and the operation's name; None for another class, or where ``gen()`` refuses the result
    (another ambiguous class in the pattern: ``[\\w--\\d][a-c&&b]``)."""
    cls = _OPERAND_CLASS
    for m in re.finditer(rf"\[({cls})(--|&&)(?:({cls})|\[(\^?)({cls})\])\]", pattern):
        if m.start(2) == at:
            second = m.group(3) or (_complement(m.group(5)) if m.group(4) else m.group(5))
            first, second = _complement(m.group(1)), second if m.group(2) == "--" else _complement(second)
            name = "difference" if m.group(2) == "--" else "intersection"
            fixed = pattern[:m.start()] + f"[^{first}{second}]" + pattern[m.end():]
            return (fixed, name) if offer_taken(fixed) else None
    return None


def _complement(cls: str) -> str:
    """The class of the characters not in the Unicode or Perl class ``cls`` (``\\p{L}`` ->
    ``\\P{L}``, ``\\w`` -> ``\\W``, and back)."""
    return cls[0] + cls[1].swapcase() + cls[2:]


# a Unicode property class where a backslash stands: \p{Name}, \p{Key=Value}, \pL (or \P)
UNICODE_CLASS_AT = re.compile(r"\\[pP](?:\{[^}]*\}|[A-Za-z])")
# one anywhere: after any escaped backslashes (group 1), the class (group 2)
_UNICODE_CLASS = re.compile(r"(?<!\\)((?:\\\\)*)(" + UNICODE_CLASS_AT.pattern + ")")
# a class a set operation of two classes is offered as one negated class for (``_set_operation``):
# a Unicode class or a Perl one (\d, \w, \s, or their negations)
_OPERAND_CLASS = UNICODE_CLASS_AT.pattern + r"|\\[dDsSwW]"


def unicode_classes(pattern: str) -> list[re.Match]:
    """The Unicode property classes of ``pattern`` (``_UNICODE_CLASS`` matches: the class is group
    2), but for text in a comment (``(?#\\p{L})``, ``(?#\\p{)}``: Python's comment ends at that
    ")", so the "}" after it is a literal), which is no class."""
    found, at, comments = [], 0, _comments(pattern)
    while (m := _UNICODE_CLASS.search(pattern, at)) is not None:
        comment_end = next((end for start, end in comments if start <= m.start(2) < end), None)
        if comment_end is None:
            found.append(m)
        at = m.end() if comment_end is None else comment_end
    return found


def unbuilt_class_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused for a Unicode property class the engine's automaton library does
    not build, or None. Python's ``re`` lacks these classes (``\\p{L}``, ``\\P{Lu}``,
    ``\\p{Greek}``); that library (Rust's ``regex``, in outlines-core) reads them, and SGLang's
    grammar backends do, so the language's early check leaves them to the backend. Each class is
    asked of that library itself (``_automaton_reads``): one it cannot build (a Unicode block, the
    ``regex`` package's own names, ``\\p{^Lu}``) is named with the fix (``_unbuilt_class_fix``)."""
    from lmnb_engine.regex_properties import unknown_property

    unknown = [m for m in unicode_classes(pattern) if unknown_property(m.group(2))]
    if unknown:  # (each named and offered its closest: the offer of the first alone was refused for the next)
        names = list(dict.fromkeys(m.group(2) for m in unknown))
        named = (f"the class {names[0]}, which names" if len(names) == 1 else
                 f"the classes {', '.join(names[:-1])} and {names[-1]}, which name")
        return f"regex {shown_regex(pattern)} uses {named} no Unicode property; " + _unknown_class_fix(pattern, unknown)
    for m in unicode_classes(pattern):
        cls = m.group(2)
        if not _automaton_reads(cls):
            return (f"regex {shown_regex(pattern)} uses the class {cls}, which the engine's automaton library (Rust's "
                    f"regex) does not read; {_unbuilt_class_fix(pattern, m.start(2), cls)}")
    return None


_PROPERTY_KINDS = ("use a general category, a script or a binary property the automaton library reads (\\p{L}, \\p{Greek}, \\p{Alphabetic}), "
                   "or the characters as a class")


def _unknown_class_fix(pattern: str, unknown: list[re.Match]) -> str:
    """How to write ``pattern`` for its classes ``unknown`` (``unicode_classes`` matches), whose names
    no regex dialect knows (``\\p{Lettr}``): the class of ECMA's property closest to each
    (``regex_properties.closest_property``, ``\\p{Letter}``), which the automaton library reads, with
    the whole pattern so written where ``gen()`` then takes it and each has one; for those with
    none, the kinds of class that library reads."""
    from lmnb_engine.regex_properties import closest_property

    classes = list(dict.fromkeys(m.group(2) for m in unknown))
    meant = {cls: close for cls in classes if (close := closest_property(cls)) and _automaton_reads(close)}
    if not meant:
        return _PROPERTY_KINDS
    offers = (next(iter(meant.values())) if len(classes) == 1 else
              ", ".join(f"{cls} → {close}" for cls, close in meant.items()))
    if len(meant) < len(classes):  # (the whole pattern is offered only with every class respelled)
        rest = ", ".join(cls for cls in classes if cls not in meant)
        return f"did you mean {offers}? write {', '.join(meant.values())}; for {rest}, {_PROPERTY_KINDS}"
    respelled = pattern
    for m in reversed(unknown):
        respelled = respelled[:m.start(2)] + meant[m.group(2)] + respelled[m.end(2):]
    return f"did you mean {offers}? " + (f"write {shown_regex(respelled)}" if offer_taken(respelled)
                                         else f"write {', '.join(meant.values())}")


def _unbuilt_class_fix(pattern: str, at: int, cls: str) -> str:
    """How to write ``pattern`` without the class ``cls`` at ``at`` that the automaton library does
    not build: its negation for ``\\p{^Lu}``, ``\\p{LC}`` for ``\\p{L&}``, its characters as a few
    code-point ranges where the ``regex`` package reads it (``as_ranges``: a Unicode block,
    ``\\p{InGreek}``, is ``[\\u0370-\\u03ff]``, not the script ``\\p{Greek}``), the whole pattern
    so written where ``gen()`` then takes it (inside a class without the brackets), else the kinds
    of class it reads."""
    negated = re.fullmatch(r"\\([pP])\{\s*\^(.*)\}", cls)
    if negated:
        return f"write \\{'P' if negated.group(1) == 'p' else 'p'}{{{negated.group(2).strip()}}} for its negation"
    if "&" in cls:
        return "write \\p{LC} for the cased letters"
    ranges = as_ranges(cls)
    if ranges:
        respelled = pattern[:at] + (ranges[1:-1] if _in_a_class(pattern, at) else ranges) + pattern[at + len(cls):]
        if offer_taken(respelled):
            return f"write {shown_regex(respelled)}, its characters as code-point ranges"
        return f"write {cls} as {ranges}, its characters as code-point ranges"
    return _PROPERTY_KINDS


def class_range_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused for a range in a character class with a Unicode class at an end
    (``[\\p{L}-z]``, ``[a-\\p{L}]``), or None: a range runs between two characters, and the
    automaton library (Rust's regex) refuses such a one (Python's ``re``, reading the class held by
    a character, would take it). A ``--`` (``[\\p{L}--\\p{Ll}]``, a set difference to Rust) is left
    to ``ambiguous_class``."""
    found = _class_range(pattern)
    if found is None:
        return None
    start, dash, end = found
    cls = (UNICODE_CLASS_AT.match(pattern, start) or UNICODE_CLASS_AT.match(pattern, dash + 1)).group()
    escaped = pattern[:dash] + "\\-" + pattern[dash + 1:]
    # (the range alone, where the whole pattern so written holds what the engine cannot build)
    escaped = shown_regex(escaped) if offer_taken(escaped) else pattern[start:dash] + "\\-" + pattern[dash + 1:end]
    return (f"regex {shown_regex(pattern)} uses the class {cls} as an end of the range {pattern[start:end]} (at "
            f"position {start}), which the automaton library (Rust's regex) refuses: a range runs between two "
            f"characters; write {escaped} for the class, the character and a hyphen, or give the range two "
            "characters")


def _class_range(pattern: str) -> tuple[int, int, int] | None:
    """(start, index of the "-", end) of the first range in a character class that has a Unicode
    class at an end, as Python's parser delimits a class's items (``_class_items``: an item, "-"
    and an item other than the closing "]" make a range), or None."""
    for items in _class_items(pattern):
        k = 0
        while k < len(items):
            start, end = items[k]
            if k + 2 < len(items) and pattern.startswith("-", end):  # (items[k + 1] is that "-")
                dash, range_end = end, items[k + 2][1]
                at_an_end = UNICODE_CLASS_AT.match(pattern, start) or UNICODE_CLASS_AT.match(pattern, dash + 1)
                if at_an_end and pattern[dash + 1] != "-":
                    return start, dash, range_end
                k += 3
            else:
                k += 1
    return None


def _class_items(pattern: str) -> Iterator[list[tuple[int, int]]]:
    """Per character class of ``pattern``, in order, the (start, end) of each of its items
    (``pattern_parts``)."""
    return (list(part.items) for part in pattern_parts(pattern) if part.kind == "class")


def _comments(pattern: str) -> list[tuple[int, int]]:
    """The (start, end) of each comment in ``pattern``, ``(?#...)`` or a verbose part's ``# ...``
    (``pattern_parts``)."""
    return [(part.start, part.end) for part in pattern_parts(pattern) if part.kind == "comment"]


class PatternPart(NamedTuple):
    """A part of a pattern's text (``pattern_parts``): its ``kind``, "class", "comment", "escape",
    "(" (a group's opening character), ")", or "" (a run of other characters, "|" and "{" among
    them, which holds no ``\\``, ``[``, ``(`` or ``)``, and a "#" only first, where the verbose flag
    does not hold); its ``start`` and ``end`` in the pattern; the inline ``flags`` that hold there
    (letters: the global ones and those a scoped group around it sets, less those one clears; for
    a "(", those outside its group); and, for a class, the (start, end) of each of its ``items``."""

    kind: str
    start: int
    end: int
    flags: str
    items: tuple[tuple[int, int], ...] = ()


# A run of characters that opens no part of ``pattern_parts`` (a "#" ends it: a comment under (?x))
_PLAIN = re.compile(r"[^\\\[()#]*")


def pattern_parts(pattern: str, flags: str | None = None) -> Iterator[PatternPart]:
    """``pattern``'s text, in order, as parts (``PatternPart``) delimited as Python's parser
    delimits them, which the regex package's version 0 shares for every pattern both read. A
    character class: after "[" and an optional "^", a "]" first is a literal, and each item is
    ``_item_end``'s (an escape whole, a Unicode class whole, whose braces may hold a "["); the
    class ends at the next "]". A comment, "(?#" outside a class, ends at the next ")" that no
    backslash escapes (its "[" or "\\p{" is no class); where the verbose flag holds, one from a
    "#" outside a class ends with its line. Either, unclosed, ends at the pattern's end. Outside
    them an escape is one part (``_item_end``). ``flags``: the letters that hold over the whole
    pattern (the regex package's, which reads ``(?x)`` anywhere as global: from the compiled
    pattern), or None for those of the global flag groups opening it (``_leading_flags``: Python
    takes them only there); a group ``SCOPED_FLAGS`` opens sets and clears its own up to its ")"."""
    if flags is None:
        flags = _leading_flags(pattern)
    scopes, i, n = [flags], 0, len(pattern)
    while i < n:
        start, held = i, scopes[-1]
        if pattern[i] == "\\":
            i = _item_end(pattern, i)
            yield PatternPart("escape", start, i, held)
        elif pattern[i] == "#" and "x" in held:
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            yield PatternPart("comment", start, i, held)
        elif pattern.startswith("(?#", i):
            i += 3
            while i < n and pattern[i] != ")":
                i += 2 if pattern[i] == "\\" else 1
            i = min(i + 1, n)
            yield PatternPart("comment", start, i, held)
        elif pattern[i] == "[":
            i += 1 + pattern.startswith("^", i + 1)
            items: list[tuple[int, int]] = []
            while i < n and (not items or pattern[i] != "]"):
                items.append((i, _item_end(pattern, i)))
                i = items[-1][1]
            i = min(i + 1, n)
            yield PatternPart("class", start, i, held, tuple(items))
        elif pattern[i] == "(":
            scoped = SCOPED_FLAGS.match(pattern, i)
            on, off = (scoped.group(1), scoped.group(2) or "") if scoped else ("", "")
            scopes.append("".join(c for c in held if c not in off) + on)
            i += 1
            yield PatternPart("(", start, i, held)
        elif pattern[i] == ")":
            if len(scopes) > 1:
                scopes.pop()
            i += 1
            yield PatternPart(")", start, i, held)
        else:  # (a run of characters none of which opens a part: a long pattern is walked in fewer steps)
            i = _PLAIN.match(pattern, i + 1).end()
            yield PatternPart("", start, i, held)


# What may open a pattern before its first item, as Python reads it: a global flag group (group 1: its
# letters, the regex package's too, as GLOBAL_FLAGS's), a comment, and, once the verbose flag holds,
# whitespace and a "#" comment to the line's end (group 2), which Python skips there
_LEADING = re.compile(r"\(\?((?:[abefiLmprsuwx]|V[01])+)\)|\(\?#(?:\\.|[^\\)])*\)|(\s+|#[^\n]*\n?)")


def _leading_flags(pattern: str) -> str:
    """The letters of the global flag groups that open ``pattern``, read past comments between them
    (``(?#c)(?x)``) and, after ``(?x)``, whitespace and ``#`` comments (``(?x) (?i)``), as Python
    takes them as global there (and refuses them further on)."""
    letters, at = "", 0
    while (m := _LEADING.match(pattern, at)) and m.end() > at and not (m.group(2) and "x" not in letters):
        letters += re.sub(r"V[01]", "", m.group(1) or "")
        at = m.end()
    return letters


_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}  # (Python reads exactly as many hex digits, or refuses the pattern)


def _item_end(pattern: str, i: int) -> int:
    """The end index of the class item at ``pattern[i]``: a Unicode class, an escape as Python's
    parser delimits it in a class (``\\x41``, ``\\N{SPACE}``, ``\\101``), or one character."""
    m = UNICODE_CLASS_AT.match(pattern, i)
    if m:
        return m.end()
    if pattern[i] != "\\" or i + 1 == len(pattern):
        return i + 1
    c = pattern[i + 1]
    if c in _ESCAPE_DIGITS:
        return i + 2 + _ESCAPE_DIGITS[c]
    if c == "N" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 2)
        return len(pattern) if end < 0 else end + 1
    end = i + 2
    while c in "01234567" and end < min(len(pattern), i + 4) and pattern[end] in "01234567":
        end += 1
    return end


def classes_held(pattern: str, hold: str = "%") -> str:
    """``pattern`` with each Unicode property class (``unicode_classes``) held by as many ``hold``
    characters: what Python's ``re`` can parse, with the rest of the pattern, and every position,
    as they were, so that checks made with ``re`` (``pattern_problem``, the engine's
    ``check_regex`` and ``automaton_syntax``) see the rest of a pattern that has such classes. A
    "%" is a literal outside a class and in one, and no name's character, so a class standing
    where a name does (``(?P<\\p{L}>...)``) is refused (``error_words``)."""
    for m in reversed(unicode_classes(pattern)):
        pattern = pattern[:m.start(2)] + hold * len(m.group(2)) + pattern[m.end(2):]
    return pattern


@functools.lru_cache(maxsize=256)
def _automaton_matches_nothing(cls: str) -> bool:
    """Whether the automaton library reads the character class ``cls`` (``[\\s&&\\S]``) as holding no
    character: its automaton over every single byte has no transition from the start (a class with
    a character has the first byte of its UTF-8). False where the library refuses ``cls`` otherwise."""
    from outlines_core import Index, Vocabulary  # (torch-free)

    try:
        Index(cls, Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    except ValueError as e:
        return "no transitions" in str(e)
    return False


@functools.lru_cache(maxsize=256)
def _automaton_reads(cls: str) -> bool:
    """Whether the automaton library builds the Unicode class ``cls`` (``\\p{Greek}``): a few
    milliseconds at most, once per class. Offered beside ``a`` and a vocabulary of ``a`` alone, so
    that only the class can fail the build, not the vocabulary."""
    from outlines_core import Index, Vocabulary  # (torch-free)

    try:
        Index(f"(?:{cls}|a)", Vocabulary(0, {b"a": [1]}))
    except ValueError:
        return False
    return True
