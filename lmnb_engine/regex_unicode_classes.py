"""A Unicode property class (``\\p{...}``) the engine's automaton library does not build, or stands
where it cannot, refused with the fix: one no dialect knows (``\\p{Lettr}``) offered ECMA's closest
(``regex_properties``, imported only for a pattern with such a class), one the library lacks (a
block, ``\\p{InGreek}``; ``\\p{^Lu}``) its characters as ranges or its other spelling
(``unbuilt_class_problem``), and one at an end of a range in a class (``[\\p{L}-z]``,
``class_range_problem``). Python's ``re`` lacks these classes, so the language's check leaves the
ones the library builds to the backend. Each whole pattern offered is weighed by the whole check
(``regex_errors``, imported when an offer is weighed: it imports this module).
"""

from __future__ import annotations

import re

from lmnb_engine.json_schema import as_ranges
from lmnb_engine.regex_automaton import automaton_reads
from lmnb_engine.regex_parts import UNICODE_CLASS_AT, class_items, in_a_class, pattern_parts, unicode_classes
from lmnb_engine.regex_python_error import shown_regex


def _taken(offer: str) -> bool:
    """``regex_errors.offer_taken`` (the whole check, which imports this module)."""
    from lmnb_engine.regex_errors import offer_taken

    return offer_taken(offer)


def _then(offer: str) -> str:
    """"; then " and what ``offer``, the pattern with its class respelled, which ``_taken`` refused,
    is refused for next (``regex_errors.pattern_problem``, else ``unbuilt_feature``: the lookahead of
    ``(?=a)\\p{sc=Hrkt}``, named only after its class was respelled), so that the user hears of both
    at once; "" where neither names one."""
    from lmnb_engine.regex_errors import pattern_problem, unbuilt_feature

    then = pattern_problem(offer) or unbuilt_feature(offer)
    return f"; then {then}" if then else ""


def unbuilt_class_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused for a Unicode property class the engine's automaton library does
    not build, or None. Python's ``re`` lacks these classes (``\\p{L}``, ``\\P{Lu}``,
    ``\\p{Greek}``); that library (Rust's ``regex``, in outlines-core) reads them, and SGLang's
    grammar backends do, so the language's early check leaves them to the backend. Each class is
    asked of that library itself (``automaton_reads``): one it cannot build (a Unicode block, the
    ``regex`` package's own names, ``\\p{^Lu}``) is named with the fix (``_unbuilt_class_fix``)."""
    from lmnb_engine.regex_properties import hrkt_class, unknown_property

    unknown = [m for m in unicode_classes(pattern) if unknown_property(m.group(2))]
    if unknown:  # (each named and offered its closest: the offer of the first alone was refused for the next)
        names = list(dict.fromkeys(m.group(2) for m in unknown))
        named = (f"the class {names[0]}, which names" if len(names) == 1 else
                 f"the classes {', '.join(names[:-1])} and {names[-1]}, which name")
        return f"regex {shown_regex(pattern)} uses {named} no Unicode property; " + _unknown_class_fix(pattern, unknown)
    for m in unicode_classes(pattern):
        cls = m.group(2)
        if not automaton_reads(cls):
            # (Hrkt, \P{Hrkt} too: why it holds no character, in the words a schema's pattern is told, and the two
            # scripts; in a negated class, the class read as \P{Hrkt} is: [^\p{Hrkt}] is every character)
            hrkt = hrkt_class(cls)
            around = _negated_class_around(pattern, m.start(2)) if hrkt else None
            if around:
                fix = _negated_hrkt_fix(pattern, *around)
            elif hrkt and hrkt[1]:
                fix = _respelled(pattern, m.start(2), cls, hrkt[1], ", the two scripts it names")
            else:
                fix = _unbuilt_class_fix(pattern, m.start(2), cls)
            why = hrkt[0] if hrkt else ""
            return (f"regex {shown_regex(pattern)} uses the class {cls}, {why}which the engine's automaton library "
                    f"(Rust's regex) does not read; {fix}")
    return None


def _negated_class_around(pattern: str, at: int) -> tuple[int, int] | None:
    """(start, end) of the negated class ``[^...]`` of ``pattern`` whose item starts at ``at``, as
    Python's parser delimits it (``pattern_parts``), or None."""
    return next(((part.start, part.end) for part in pattern_parts(pattern) if part.kind == "class"
                 and pattern.startswith("[^", part.start) and any(start == at for start, _ in part.items)), None)


def _negated_hrkt_fix(pattern: str, start: int, end: int) -> str:
    """How to write ``pattern`` for its negated class ``pattern[start:end]``, which holds a class
    naming Hrkt: the class as code-point ranges, read as ``\\P{Hrkt}`` is
    (``regex_properties.negated_hrkt_ranges``), where it has such a spelling; that it so matches no
    character (``[^\\P{Hrkt}]``), where it does not; else the kinds of class the library reads."""
    from lmnb_engine.regex_properties import NEGATED_HRKT_NOTHING, negated_hrkt_ranges

    negated = pattern[start:end]
    ranges = negated_hrkt_ranges(negated)
    if ranges == "":
        return NEGATED_HRKT_NOTHING.format(negated=negated)
    if ranges:
        return _respelled(pattern, start, negated, ranges, ", its characters as code-point ranges")
    return _PROPERTY_KINDS


_PROPERTY_KINDS = ("use a general category, a script or a binary property the automaton library reads (\\p{L}, \\p{Greek}, \\p{Alphabetic}), "
                   "or the characters as a class")


def _unknown_class_fix(pattern: str, unknown: list[re.Match]) -> str:
    """How to write ``pattern`` for its classes ``unknown`` (``unicode_classes`` matches), whose names
    no regex dialect knows (``\\p{Lettr}``): the class of ECMA's property closest to each
    (``regex_properties.closest_property``, ``\\p{Letter}``), which the automaton library reads, with
    the whole pattern so written where ``gen()`` then takes it and each has one (else each class and
    what that pattern is refused for next: ``_then``); for those with none, the kinds of class that
    library reads."""
    from lmnb_engine.regex_properties import closest_property

    classes = list(dict.fromkeys(m.group(2) for m in unknown))
    meant = {cls: close for cls in classes if (close := closest_property(cls)) and automaton_reads(close)}
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
    return f"did you mean {offers}? " + (f"write {shown_regex(respelled)}" if _taken(respelled)
                                         else f"write {', '.join(meant.values())}{_then(respelled)}")


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
        return _respelled(pattern, at, cls, ranges, ", its characters as code-point ranges")
    return _PROPERTY_KINDS


def _respelled(pattern: str, at: int, cls: str, by: str, what: str) -> str:
    """The fix "write ..." of ``pattern`` with the class ``cls`` at ``at`` written as the bracketed
    class ``by`` (inside a class without its brackets), ``what`` it is said to be: the whole pattern
    so written where ``gen()`` then takes it, else ``cls`` as ``by`` and what that pattern is refused
    for next (``_then``)."""
    respelled = pattern[:at] + (by[1:-1] if in_a_class(pattern, at) else by) + pattern[at + len(cls):]
    if _taken(respelled):
        return f"write {shown_regex(respelled)}{what}"
    return f"write {cls} as {by}{what}{_then(respelled)}"


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
    escaped = shown_regex(escaped) if _taken(escaped) else pattern[start:dash] + "\\-" + pattern[dash + 1:end]
    return (f"regex {shown_regex(pattern)} uses the class {cls} as an end of the range {pattern[start:end]} (at "
            f"position {start}), which the automaton library (Rust's regex) refuses: a range runs between two "
            f"characters; write {escaped} for the class, the character and a hyphen, or give the range two "
            "characters")


def _class_range(pattern: str) -> tuple[int, int, int] | None:
    """(start, index of the "-", end) of the first range in a character class that has a Unicode
    class at an end, as Python's parser delimits a class's items (``class_items``: an item, "-"
    and an item other than the closing "]" make a range), or None."""
    for items in class_items(pattern):
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
