"""A ``stop_regex`` that holds a POSIX class in a character class (``[[:alpha:]]``), or another
property class the stop matcher reads in that form (``[[:Script=Greek:]]``), refused with the fix
(``stop_posix_problem``): the stop matcher (the ``regex`` package, version 0) reads it as a class of
Unicode characters, Python's ``re`` as literal characters. Offered: the pattern with each such
class written as the characters the stop matcher reads (POSIX classes as ASCII), or the literal
reading, each such class's "[" escaped. The ``regex`` package is imported only when one is met.
"""

from __future__ import annotations

import re
from typing import Iterator

from lmnb_engine.json_schema import code_point_runs
from lmnb_engine.regex_class_spelling import CASELESS, POSIX, class_of_runs, outside_runs, rewritten
from lmnb_engine.regex_parts import class_items, item_end, outer_classes
from lmnb_engine.regex_python_error import python_error, shown_regex


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
    parser delimits them (``class_items``), opens one."""
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
    kind = "POSIX class" if posix.group(1).lstrip("^") in POSIX else "property class"
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
    parser delimits a class's items (``class_items``), or None."""
    for items in class_items(pattern):
        posix = next((m for start, _ in items if (m := _V0_PROPERTY_CLASS.match(pattern, start))), None)
        if posix:
            return posix
    return None


def _stop_posix_reading(pattern: str) -> tuple[str, str] | None:
    """The ``stop_regex`` ``pattern`` with each character class that holds a POSIX class written as
    the characters the stop matcher reads it to hold, each POSIX class read as its ASCII characters
    (``POSIX``, the POSIX "C" locale's), and the classes rewritten joined by ", "; None where a
    POSIX class has no ASCII reading here (``[:greek:]``), a class would hold no character or over
    ``MAX_MEMBER_RANGES`` ranges, or the result still holds a POSIX class. The stop matcher reads a
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
    caseless = bool(CASELESS.search(pattern))
    names, rewrites = [], []
    for start, end, posix in _v0_classes(pattern):
        if not posix:
            continue
        if any(m.group(1).lstrip("^") not in POSIX for m in posix):
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

    return rewritten(pattern, rewrites, names, takes)


def _v0_classes(pattern: str) -> Iterator[tuple[int, int, list[re.Match]]]:
    """The (start, end) of each character class of ``pattern`` as the ``regex`` package's version 0
    delimits it, with the POSIX classes it holds: after "[" and an optional "^" its first item is
    read whatever it is (a "]" there is a literal), then items up to the next "]", each an escape
    (``item_end``), a POSIX class ``[:name:]`` whole (a "[" else is a literal: no nested class)
    or one character (``outer_classes`` walks between them)."""

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
                i = item_end(pattern, i)
            else:
                i += 1
        return None if i >= n else (i + 1, posix)

    return outer_classes(pattern, class_end)


def _v0_class_chars(pattern: str, start: int, end: int, posix: list[re.Match], caseless: bool) -> str | None:
    """The class ``pattern[start:end]`` (which holds the POSIX classes ``posix``), read as the
    ``regex`` package's version 0 reads it with each POSIX class as its ASCII characters
    (``POSIX``), written as ranges of its characters (``class_of_runs``): the class's other items are read
    by that package with each POSIX class held by ``\\P{Any}``, an item of no character that, as a
    POSIX class does, ends no range (``[a-[:digit:]]``: "a", "-" and the digits), and that union
    is joined with each POSIX class's characters (or, negated, ``[:^digit:]``, all but those).
    The class is written negated where it was, so that case-insensitive matching (which tests a
    character's other cases against the set) reads it as it read the original; where no flag
    group can turn that on (``caseless``), the shorter of it and its complement. None where that
    package does not read it or no form fits ``MAX_MEMBER_RANGES`` ranges."""
    negated = pattern.startswith("[^", start)
    body, done = [], start + 1 + negated
    for m in posix:
        body += [pattern[done:m.start()], "\\P{Any}"]
        done = m.end()
    body.append(pattern[done:end - 1])
    # (a "^" first after "[^" is a literal: escaped, so that the class of the other items stays unnegated)
    others = "".join(body)
    others = "\\" + others if others.startswith("^") else others
    union = "|".join([f"[{others}]"] + [f"[{'^' if m.group(1).startswith('^') else ''}{POSIX[m.group(1).lstrip('^')]}]"
                                              for m in posix])
    inside = code_point_runs(union)
    if inside is None:
        return None
    outside = outside_runs(inside)
    forms = [(inside, "^" if negated else ""), (outside, "" if negated else "^")][:1 if caseless else 2]
    spelled = [form for form in (class_of_runs(spans, negation) for spans, negation in forms) if form is not None]
    return min(spelled, key=len) if spelled else None


# A class in a class that the regex package (the stop matcher) reads as a property, as its parser
# (parse_posix_class) reads one: "[:", an optional "^", a name of ASCII letters, digits and
# " &_-.", optionally ":" or "=" and a value of those and "/" (not only spaces, else no value is
# read and the name must be followed by ":]"), then ":]" (``[:alpha:]``, ``[:^Greek:]``,
# ``[:Script=Greek:]``, ``[:sc:Greek:]``, ``[:nv=1/2:]``); a name it knows no property by is an
# error, not literal characters
_V0_PROPERTY_CLASS = re.compile(r"\[:(\^?[A-Za-z0-9 &_.-]*(?:[:=][A-Za-z0-9 &_./-]*[A-Za-z0-9&_./-][A-Za-z0-9 &_./-]*)?):\]")
