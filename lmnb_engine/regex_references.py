"""A pattern's back-references and group names, which another dialect writes otherwise or no
automaton can build, worded with the fix.

A back-reference by number or Python's ``(?P=n)`` (``first_back_reference``) is refused for every
backend (``back_reference_problem``); one by name in another dialect's syntax, ``\\k<n>``, ``\\g<n>``
(``named_reference_problem``), is named as such rather than as Python's syntax error. A group name
given twice (``repeated_name``, which ECMA 262 takes in another alternative and Python's ``re``
refuses) and ECMA's named group ``(?<year>`` (``named_group_problem``) are offered the pattern as
Python writes it, where the whole check (``regex_errors``, imported when an offer is weighed: it
imports this module) takes the offer.
"""

from __future__ import annotations

import re

from lmnb_engine.json_schema import back_reference_words
from lmnb_engine.regex_parts import pattern_parts
from lmnb_engine.regex_python_error import error_words, python_error, shown_regex
from lmnb_engine.regex_tree import constants, walk
from lmnb_engine.regex_u_flag import OTHER_REFERENCE


def _taken(offer: str) -> bool:
    """``regex_errors.offer_taken`` (the whole check, which imports this module)."""
    from lmnb_engine.regex_errors import offer_taken

    return offer_taken(offer)


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


def back_reference_problem(parsed, pattern: str, subject: str = "regex") -> str | None:
    """The engine's words (``json_schema.back_reference_words``) for the first back-reference, by
    number or Python's ``(?P=n)``, in ``pattern`` parsed by ``re._parser`` (``parsed``:
    ``first_back_reference``), or None where it has none. No backend can constrain output with
    one (no regular language holds it: xgrammar says "Backreference is not supported yet",
    outlines' automaton library has none), so ``gen()`` refuses it, as it does a lookaround
    (``regex_errors.assertion_problem``, ``lookahead_problem``).
    ``subject`` names the pattern before its text (a schema's: ``json_schema.pattern_subject``)."""
    found = first_back_reference(parsed, pattern)
    return found and f"{subject} {shown_regex(pattern)} {back_reference_words(*found)}"


# A back-reference by name in the syntax of ECMA 262, .NET and the regex package (the name: group 1)
_NAMED_REFERENCE = re.compile(r"\\k<(\w+)>")
# (and in other dialects' syntax, \g<n>, \k'n' ...: regex_u_flag.OTHER_REFERENCE)


def named_reference_problem(pattern: str) -> str | None:
    """Why ``pattern``, which Python's ``re`` refuses, is refused for its first back-reference by
    name in another dialect's syntax, ``\\k<n>``, ``\\g<n>``, ``\\k'n'`` (an escape outside classes and
    comments: ``pattern_parts``), or None where it has none: ``re`` said only that it cannot read it
    (or that it cannot read the ``(?<n>`` group before it), where respelling it as Python's
    ``(?P=n)`` would only be refused next. A name no group of the pattern has is said to be so."""
    names = list(dict.fromkeys(m.group(2) for part in pattern_parts(pattern)
                               if part.kind == "(" and (m := ANY_NAMED_GROUP.match(pattern, part.start))))
    for part in pattern_parts(pattern):
        if part.kind == "escape" and (reference := _NAMED_REFERENCE.match(pattern, part.start)
                                      or OTHER_REFERENCE.match(pattern, part.start)):
            words = back_reference_words(reference.group(), reference.group(1), part.start, names)
            return f"regex {shown_regex(pattern)} {words}"
    return None


# A named group's opening, Python's (?P<name> or ECMA's (?<name> (group 1: "P" or ""; group 2: the name)
ANY_NAMED_GROUP = re.compile(r"\(\?(P?)<([^\W\d]\w*)>")


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
        m = ANY_NAMED_GROUP.match(pattern, part.start) if part.kind == "(" else None
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


def repeated_name_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused where it names two groups alike (``repeated_name``), or None:
    Python's ``re`` said "redefinition of group name", or only "unknown extension ?<m", and "fix
    the pattern". The fix (``repeated_name_words``) offers the pattern so written, each group
    spelled as Python does, ``(?P<m>``, where ``offer_taken``."""
    found = repeated_name(pattern)
    if found is None:
        return None
    name, places, offer = found
    ecma = [part.start for part in pattern_parts(offer)  # (each group's opening: not "(?<m>" in a class, nor "\\(?<m>")
            if part.kind == "(" and (m := ANY_NAMED_GROUP.match(offer, part.start)) and not m.group(1)]
    for at in reversed(ecma):
        offer = offer[:at + 2] + "P" + offer[at + 2:]
    written = f": write {shown_regex(offer)}" if offer != pattern and _taken(offer) else ""
    return (f"regex {shown_regex(pattern)} cannot be compiled: "
            + repeated_name_words(name, places, "a regex here") + written)


# A named group's opening as ECMA 262, .NET and Rust's regex write it, (?<name>, with a name Python
# takes (group 1), which Python's re writes (?P<name>
_OTHER_NAMED_GROUP = re.compile(r"\(\?<([^\W\d]\w*)>")


def named_group_problem(pattern: str, error: re.error) -> str | None:
    """Why ``pattern`` is refused where Python's ``re`` refused it (``error``) at a named group's
    opening in another dialect's syntax, ``(?<year>`` (outside classes and comments:
    ``pattern_parts``), with Python's spelling, ``(?P<year>``, offered: the whole pattern so
    written, each such group respelled, where ``gen()`` takes it and the engine builds it (as
    ``offer_taken`` asks); else that group alone, and why the pattern so written is refused
    next (a back-reference, a lookbehind ...); or None for another error, or where ``re``
    refuses the respelled pattern too (a name given twice, another syntax error)."""
    from lmnb_engine.regex_errors import pattern_problem, unbuilt_feature  # (it imports this module)

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
