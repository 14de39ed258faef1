"""A character class Python's ``re`` flags as ambiguous (a ``FutureWarning``: ``[[:alpha:]]``,
``[a&&b]``, ``[a--b]``), which it reads as literal characters and the automaton library (Rust's
regex) as a POSIX class or a set operation, refused with a fix both read alike (``ambiguous_class``):
the POSIX classes as their characters, a set operation of two Unicode or Perl classes as one negated
class, another flagged class as its ASCII characters, or the flagged characters escaped. Each
whole pattern offered is weighed by the whole check (``regex_errors``, imported when an offer is
weighed: it imports this module).
"""

from __future__ import annotations

import re
import warnings
from typing import Iterator

from lmnb_engine.regex_automaton import automaton_matches_nothing
from lmnb_engine.regex_class_spelling import CASELESS, POSIX, POSIX_CLASS, class_members, rewritten
from lmnb_engine.regex_parts import UNICODE_CLASS_AT, classes_held, item_end, outer_classes
from lmnb_engine.regex_python_error import python_error, python_reading, shown_regex
from lmnb_engine.regex_tree import parser


def _taken(offer: str) -> bool:
    """``regex_errors.offer_taken`` (the whole check, which imports this module)."""
    from lmnb_engine.regex_errors import offer_taken

    return offer_taken(offer)


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
    from lmnb_engine.regex_errors import pattern_problem, unbuilt_feature  # (it imports this module)

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
             if _flagged(pattern[start:end]) and automaton_matches_nothing(pattern[start:end])]
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
    characters (``POSIX``: ``[A-Za-z0-9_]``); one with a negated POSIX class, a nested class or a
    set operation (``[[:^alpha:]]``, ``[[:alpha:]&&a]``) is written as the characters it holds
    (``class_members``)."""
    names: list[str] = []
    rewrites = []
    caseless = bool(CASELESS.search(pattern))  # (erring towards yes: a form is then checked under (?i))
    for start, end in _rust_classes(pattern):
        text = pattern[start:end]
        posix = list(POSIX_CLASS.finditer(text))
        if not posix or not POSIX_CLASS.match(text, 1 + text.startswith("[^")):
            continue  # (a "[" after a class's first item is a literal to Python, and to the engine)
        if any(m.group(1).lstrip("^") not in POSIX for m in posix):
            return None
        names += [m.group() for m in posix]
        bare = POSIX_CLASS.sub("", text[1:-1])  # (what is left beside the POSIX classes)
        if "[" in bare or re.search(r"&&|--|~~|\[:\^", text):
            spelled = class_members(POSIX_CLASS.sub(_posix_set, text), caseless=text if caseless else None)
        else:
            spelled = POSIX_CLASS.sub(lambda m: POSIX[m.group(1)], text)
        if spelled is None:
            return None
        rewrites.append((start, end, spelled))
    return rewritten(pattern, rewrites, names, _taken)


def _members_reading(pattern: str) -> tuple[str, str] | None:
    """``pattern`` with each character class that Python's ``re`` flags as ambiguous (a set
    operation, ``[a-z&&[^aeiou]]``, or a nested class, ``[[a-z]]``), as the automaton library
    (Rust's regex) delimits it (``_rust_classes``), written as the ASCII characters that library
    reads it to hold (``class_members``: ``[b-df-hj-np-tv-z]``), and those classes as written
    (``[a-z&&[^aeiou]]``), where ``gen()`` then takes the pattern; None where a flagged class
    holds a POSIX class (``_posix_reading``'s) or "||" (a union to the ``regex`` package, two
    "|" to Rust's regex), or holds characters beyond ASCII and not all of them (``[\\w--\\d]``)."""
    names: list[str] = []
    rewrites = []
    caseless = bool(CASELESS.search(pattern))  # (erring towards yes: a form is then checked under (?i))
    for start, end in _rust_classes(pattern):
        text = pattern[start:end]
        if not _flagged(text):
            continue
        spelled = (None if POSIX_CLASS.search(text) or "||" in text
                   else class_members(text, ascii_only=True, caseless=text if caseless else None))
        if spelled is None:
            return None
        names.append(text)
        rewrites.append((start, end, spelled))
    return rewritten(pattern, rewrites, names, _taken)


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


def _posix_set(m: re.Match) -> str:
    """The POSIX class ``m`` (``[:alpha:]``, ``[:^alpha:]``) as a nested set the ``regex`` package reads."""
    name = m.group(1)
    return f"[^{POSIX[name[1:]]}]" if name.startswith("^") else f"[{POSIX[name]}]"


def _rust_classes(pattern: str) -> Iterator[tuple[int, int]]:
    """The (start, end) of each outermost character class of ``pattern`` as Rust's regex delimits
    it: a "[" inside it opens a nested class (a POSIX class ``[:name:]`` is one item), a "]" first
    (after "[" or "[^") is a literal, and an escape is one item (``item_end``; ``outer_classes`` walks
    between them)."""

    def class_end(pattern: str, i: int) -> tuple | None:
        depth, n = 0, len(pattern)
        while i < n:
            if pattern[i] == "[" and depth and POSIX_CLASS.match(pattern, i):
                i = POSIX_CLASS.match(pattern, i).end()
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
                i = item_end(pattern, i)
        return None

    return outer_classes(pattern, class_end)


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
            return (fixed, name) if _taken(fixed) else None
    return None


def _complement(cls: str) -> str:
    """The class of the characters not in the Unicode or Perl class ``cls`` (``\\p{L}`` ->
    ``\\P{L}``, ``\\w`` -> ``\\W``, and back)."""
    return cls[0] + cls[1].swapcase() + cls[2:]


# a class a set operation of two classes is offered as one negated class for (``_set_operation``):
# a Unicode class or a Perl one (\d, \w, \s, or their negations)
_OPERAND_CLASS = UNICODE_CLASS_AT.pattern + r"|\\[dDsSwW]"
