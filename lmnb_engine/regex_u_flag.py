"""The syntax errors of ECMA 262's regular expressions with the u flag that JSON Schema asks a
``pattern`` be read with (2020-12 core, section 6.4), among the patterns Python's ``re`` or the
``regex`` package read: ECMA 262 section 22.2.1 with ``[+UnicodeMode]``, where Annex B's
readings without the flag (a lone ``{``, ``\\c`` before no letter, ``\\1`` in a class as an
octal escape ...) are errors. Standard library only, but for the ``regex`` package's property
names (``regex_properties``) and a block's ranges (``json_schema.as_ranges``); ``json_schema``
words them, for the language's schema check and the engine's alike.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple, Optional

# ECMA 262's SyntaxCharacter and "/": the characters an identity escape may stand for under the u flag
_SYNTAX_CHARACTERS = "^$\\.*+?()[]{}|/"
# a verbose flag, global or scoped (or turned off: "(?-x)", which a quote's codes do no harm in)
_VERBOSE = re.compile(r"\(\?[a-zA-Z-]*x")
# the letters an ECMA escape with the u flag may begin with: an assertion (b, B), a control escape
# (f n r t v), a control letter (c), a class (d D s S w W, p P), a code (x, u) or a group name (k);
# in a class, b is a backspace and B and k no escape, and "-" is one
_ESCAPE_LETTERS = "bBfnrtvcdDsSwWpPxuk"
_CLASS_ESCAPE_LETTERS = "bfnrtvcdDsSwWpPxu-"
_CLASS_ESCAPES = "dDsSwWpP"
_DIGITS = "0123456789"  # (ECMA's DecimalDigit: ASCII only, where str.isdigit takes any script's)
_DECIMAL = re.compile("[0-9]+")  # (a class escape cannot end a range under the u flag)

# A RegExpIdentifierName (ECMA 262 section 22.2.1: ID_Start or $ _, then ID_Continue or $, ZWNJ, ZWJ),
# as Python's identifiers approximate it
_GROUP_NAME = re.compile(r"[^\W\d][\w$\u200c\u200d]*|\$[\w$\u200c\u200d]*")
_QUANTIFIER_BRACES = re.compile(r"\{[0-9]+(,[0-9]*)?\}")
_PROPERTY = re.compile(r"[pP]\{[^}]*\}")
_CODE_POINT = re.compile(r"u\{([0-9A-Fa-f]+)\}")
_HEX = re.compile(r"x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}")
# A named group's opening, ECMA's (?<name> or Python's (?P<name> (group 1: "P" or ""); named_groups finds them
_NAMED_GROUP = re.compile(r"\(\?(P?)<(" + _GROUP_NAME.pattern + ")>")
_NAMED_REFERENCE = re.compile(r"\\k<(" + _GROUP_NAME.pattern + ")>")
# A back-reference in another dialect's syntax, by name or number (group 1): .NET's and PCRE's \k'n', Perl's
# \k{n} and \g{n}, the regex package's (and Oniguruma's) \g<n>. Python's \g<n> is replacement syntax, but in a
# pattern it is a reference: read as an identity escape, its offer "g<n>" would be literal text
OTHER_REFERENCE = re.compile(r"\\(?:k'(?=\w+')|[kg]\{(?=\w+\})|g<(?=\w+>))(\w+)['}>]")
_LEGACY_OCTAL = re.compile(r"[0-3][0-7]{0,2}|[4-7][0-7]?")  # (Annex B's LegacyOctalEscapeSequence: at most 0o377)


class UFlagError(NamedTuple):
    """A syntax error of a pattern under the u flag: where it starts in the pattern, what it is
    (words that follow "it has"), and the pattern written so that it means, with the flag, what
    ECMA reads it as without it (Annex B), or None where that reading is an error too; then, where
    it is, the patterns the user may have meant, each with what it means (``(?<n>a)\\k<n>``, "a
    back-reference to the group n"); and, where none is offered, what to do, if more is known than
    to fix the pattern."""

    at: int
    what: str
    instead: Optional[str]
    meant: tuple[tuple[str, str], ...] = ()
    fix: Optional[str] = None  # (what to do where nothing is offered: "fix the pattern" where None)


def identity_escape(pattern: str) -> Optional[tuple[int, str]]:
    """(where, the character) of the first identity escape in the schema ``pattern`` that ECMA 262
    refuses with the u flag: there ``IdentityEscape[+UnicodeMode]`` is a ``SyntaxCharacter`` or "/"
    (and ``ClassEscape`` adds "-"), so ``\\U``, ``\\%`` or ``\\e`` are syntax errors, which without
    the flag (Annex B) stand for the character itself; None where there is none. A digit after a
    backslash (a back-reference, ``\\0``) is no identity escape and is left to ``u_flag_error``."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            c = pattern[i + 1]
            allowed = _CLASS_ESCAPE_LETTERS if in_class else _ESCAPE_LETTERS
            if not (c in _DIGITS or c in _SYNTAX_CHARACTERS or c in allowed):
                return i, c
            i += 2
            continue
        in_class = ch != "]" if in_class else ch == "["
        i += 1
    return None


def named_groups(pattern: str) -> list[re.Match]:
    """The openings of ``pattern``'s named groups (``_NAMED_GROUP``'s matches), in order: outside
    escapes and character classes, where ``(?<n>`` is characters (``[(?<n>a)]`` names no group).
    A class ends at its first "]" not escaped, as ECMA reads it (``[]`` is the empty class). Also
    ``json_schema.ecma_names_as_python``'s scan."""
    return [m for i in _outside_classes(pattern) if (m := _NAMED_GROUP.match(pattern, i)) is not None]


def named_back_reference(pattern: str) -> Optional[re.Match]:
    """The first back-reference by name in ``pattern``, ECMA's ``\\k<name>`` (also the regex
    package's and .NET's), outside character classes (``_outside_classes``), or None."""
    return next((m for i in _outside_classes(pattern) if (m := _NAMED_REFERENCE.match(pattern, i))), None)


def other_back_reference(pattern: str) -> Optional[re.Match]:
    """The first back-reference in ``pattern`` in another dialect's syntax (``OTHER_REFERENCE``:
    ``\\g<n>``, ``\\k'n'``, ``\\k{n}``, ``\\g{n}``; group 1: the group's name or number), outside
    character classes (``_outside_classes``), or None."""
    return next((m for i in _outside_classes(pattern) if (m := OTHER_REFERENCE.match(pattern, i))), None)


# Python's syntax that ECMA 262 lacks, as an opening outside classes: a named group (?P<name>, a
# back-reference (?P=name), a comment (?#...) and inline flags, (?i) or scoped (?i:...) (group 1: what to call it)
_PYTHON_ONLY = re.compile(r"\(\?(?:P<[^>]*>|P=\w+\)|#[^)]*\)|[aiLmsux-]+[:)])")


def python_only_syntax(pattern: str) -> list[str]:
    """Each of ``pattern``'s openings of Python's ``re`` syntax that ECMA 262 reads as an error
    (``_PYTHON_ONLY``: ``(?P<y>``, ``(?P=y)``, ``(?#c)``, ``(?i)``, ``(?i:``), as written, in order,
    each once, outside character classes (``_outside_classes``)."""
    found = (m.group() for i in _outside_classes(pattern) if (m := _PYTHON_ONLY.match(pattern, i)) is not None)
    return list(dict.fromkeys(found))


def pcre_quoting(pattern: str) -> Optional[tuple[int, str]]:
    """(where the first ``\\Q`` is, ``pattern`` with each quoted text written as escapes) for a pattern
    holding PCRE's (and Perl's, Java's) quoting ``\\Q...\\E`` outside character classes, whose text
    is taken literally (to the pattern's end without ``\\E``), which Python's ``re``, the ``regex``
    package and ECMA 262 lack (they read ``\\Q`` as an error, or Annex B the letter): ``\\Qa.b\\E``
    as ``a\\.b``, each syntax character (``_SYNTAX_CHARACTERS``) escaped, which all of them read
    alike; None where there is none. Where verbose mode may hold (``(?x)``), a space or "#" of the
    text is written as a code (``\\x20``, ``\\x23``), which verbose mode does not skip, as PCRE does
    not skip them in a quote."""
    first, i, verbose = None, 0, _VERBOSE.search(pattern) is not None
    while (at := next((j for j in _outside_classes(pattern) if j >= i and pattern.startswith("\\Q", j)), None)) is not None:
        end = pattern.find("\\E", at + 2)
        end = len(pattern) if end < 0 else end
        quoted = "".join("\\" + c if c in _SYNTAX_CHARACTERS else _code(c) if verbose and (c.isspace() or c == "#")
                         else c for c in pattern[at + 2:end])
        first = at if first is None else first
        pattern, i = pattern[:at] + quoted + pattern[end + 2:], at + len(quoted)
    return None if first is None else (first, pattern)


# Another dialect's escape of a code point, which ECMA 262 reads as other text without the u flag (Annex B:
# the letters, "\\x{41}" an x 41 times) and refuses with it: Python's \\UXXXXXXXX (group 1) and \\N{name}
# (group 3), PCRE's (Perl's, Rust's) \\x{...} (group 2: any number of hex digits, as PCRE takes leading zeros,
# \\x{00000041}; the value is checked)
_FOREIGN_CODE_POINT = re.compile(r"\\(?:U([0-9A-Fa-f]{8})|x\{([0-9A-Fa-f]+)\}|N\{([^{}\\]+)\})")


def foreign_code_points(pattern: str) -> Optional[tuple[int, str, str]]:
    """(where the first is, it as written, ``pattern`` with each written as ECMA 262 with the u flag
    and Python's ``re`` both read its code point) for a pattern holding another dialect's escape of
    a code point (``_FOREIGN_CODE_POINT``: ``\\U00010330``, ``\\x{10330}``, ``\\N{GOTHIC LETTER
    AHSA}``), in a class or out: ``\\uXXXX`` up to U+FFFF (a syntax character among them stays
    one character), the character itself past it, as ``json_schema.as_ranges`` writes a block's
    ends; None where there is none but those that name no code point (past U+10FFFF, a name
    ``unicodedata`` does not know) or a surrogate (``\\U0000D800``, which no UTF-8 output holds and
    the engine refuses outside a class), which the other checks word, and which are kept as written
    beside the others (``a\\x{DBFF}\\x{41}`` is ``a\\x{DBFF}\\u0041``)."""
    import unicodedata

    first, out, i, n = None, [], 0, len(pattern)
    while i < n:
        found = _FOREIGN_CODE_POINT.match(pattern, i) if pattern[i] == "\\" else None
        if found is None:
            out.append(pattern[i:i + 2] if pattern[i] == "\\" else pattern[i])
            i += 2 if pattern[i] == "\\" else 1
            continue
        try:
            code = int(found.group(1) or found.group(2), 16) if found.group(3) is None else ord(
                unicodedata.lookup(found.group(3)))
        except (KeyError, TypeError):  # (TypeError: a named sequence, two characters, which re refuses too)
            code = -1
        # (a surrogate: no output holds one, the engine refuses it; it is kept as written, for the u flag's words,
        # the others respelled: a\x{DBFF}\x{41} was offered ax\{DBFF\}x{41}, its \x{41} an x 41 times)
        if not 0 <= code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            out.append(found.group())
            i = found.end()
            continue
        first = (i, found.group()) if first is None else first
        out.append(f"\\u{code:04x}" if code <= 0xFFFF else chr(code))
        i = found.end()
    return None if first is None else (*first, "".join(out))


def _code(c: str) -> str:
    """``c`` as an escape of its code point (``\\x20``, ``\\u2028``), read alike by ``re`` and ECMA."""
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _outside_classes(pattern: str) -> Iterator[int]:
    """Where each item of ``pattern`` outside character classes starts, an escape (its backslash)
    or a character, in order. A class ends at its first "]" not escaped, as ECMA reads it (``[]``
    is the empty class)."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        if not in_class and ch != "[":
            yield i
        if ch == "\\":
            i += 2
            continue
        in_class = ch != "]" if in_class else ch == "["
        i += 1


def _octal_reading(pattern: str, i: int) -> tuple[int, str]:
    """(where it ends, Annex B's reading) of the decimal escape at ``pattern[i]`` (a backslash before
    a digit) read as a legacy octal escape, ``\\xHH`` (``\\1`` is U+0001), or, for 8 and 9, as the
    digit itself."""
    octal = _LEGACY_OCTAL.match(pattern, i + 1)
    if octal is None:
        return i + 2, pattern[i + 1]
    return octal.end(), f"\\x{int(octal.group(), 8):02x}"


def _escape_error(pattern: str, i: int, in_class: bool) -> Optional[tuple[int, UFlagError]]:
    """The error of the escape at ``pattern[i]`` (a backslash) under the u flag, with where the
    escape ends; None where it is valid or is an identity escape (``identity_escape``'s)."""
    n = len(pattern)
    if i + 1 >= n:
        return i + 1, UFlagError(i, "a backslash that ends the pattern, escaping nothing", pattern[:i] + "\\\\")
    c = pattern[i + 1]

    def instead(end: int, text: str) -> str:
        return pattern[:i] + text + pattern[end:]

    if c == "c" and not (i + 2 < n and pattern[i + 2].isascii() and pattern[i + 2].isalpha()):
        return i + 2, UFlagError(i, "\\c before no ASCII letter (a control escape is \\cA to \\cZ)", instead(i + 1, "\\\\"))
    if c in "pP" and not _PROPERTY.match(pattern, i + 1):
        return i + 2, UFlagError(i, f"\\{c} with no {{...}} after it (a property class is \\{c}{{L}})", instead(i + 1, ""))
    if c in "pP" and (unknown := _unknown_property(pattern, i)):
        return unknown
    if c in "xu" and not _HEX.match(pattern, i + 1):
        code_point = _CODE_POINT.match(pattern, i + 1) if c == "u" else None
        if code_point and int(code_point.group(1), 16) <= 0x10FFFF:
            return None
        what = ("a code point escape past U+10FFFF (the last code point)" if code_point else
                f"\\{c} without its {'two' if c == 'x' else 'four'} hex digits"
                + (" (or \\u{...} with one to six)" if c == "u" else ""))
        return i + 2, UFlagError(i, what, None if code_point else instead(i + 1, ""))
    if c == "0" and i + 2 < n and pattern[i + 2] in _DIGITS:
        end, octal = _octal_reading(pattern, i)
        return end, UFlagError(i, f"an octal escape {pattern[i:end]} (with the flag \\0 is NUL, before no digit)",
                               instead(end, octal))
    if in_class and c in "123456789":
        end, octal = _octal_reading(pattern, i)
        return end, UFlagError(i, f"a back-reference {pattern[i:end]} in a class", instead(end, octal))
    if not in_class and c == "k" and not (pattern.startswith("<", i + 2) and (m := _GROUP_NAME.match(pattern, i + 3))
                                          and pattern.startswith(">", m.end())):
        named = list(dict.fromkeys(m.group(1, 2) for m in named_groups(pattern)))
        if not named:  # (Annex B reads \k as the letter only in a pattern that names no group)
            return i + 2, UFlagError(i, "\\k with no group name <name> after it", instead(i + 1, ""))
        meant = [(instead(i + 2, f"(?P={name})" if python else f"\\k<{name}>"), f"a back-reference to the group {name}")
                 for python, name in named]
        return i + 2, UFlagError(i, "\\k with no group name <name> after it (an error without the flag too, where the "
                                    "pattern names a group)", None, (*meant, (instead(i + 1, ""), "the letter k")))
    return None


def _unknown_property(pattern: str, i: int) -> Optional[tuple[int, UFlagError]]:
    """The error of the property class at ``pattern[i]`` (``\\p{...}``) where its name is one no
    regex dialect knows (``regex_properties.unknown_property``) or one ECMA does not read
    (``regex_properties.ecma_problem``: ``\\p{Greek}``, ``\\p{lu}``), with the pattern with each
    such class respelled offered (``_property_offer``), and where the class ends; None for any other.
    Of a negated class that Hrkt so read keeps from matching any character (``[^\\P{Hrkt}]``) it says so."""
    from lmnb_engine.regex_properties import (NEGATED_HRKT_NOTHING, closest_property, ecma_problem, hrkt_class,
                                              negated_hrkt_ranges, unknown_property)

    end = _PROPERTY.match(pattern, i + 1).end()
    cls = pattern[i:end]
    if unknown_property(cls):
        kinds = "" if closest_property(cls) else (" (ECMA's: a general category, \\p{L}, a binary property, "
                                                  "\\p{Alphabetic}, or a script, \\p{Script=Greek})")
        what = f"naming no Unicode property{kinds}"
    elif (problem := ecma_problem(cls)) is not None:
        what = problem[0]
    else:
        return None
    offer = _property_offer(pattern)
    around = _negated_class_around(pattern, i) if hrkt_class(cls) else None
    # (read as \P{Hrkt} is offered, every character, [^\P{Hrkt}] is none: said, with no offer)
    nothing = around and negated_hrkt_ranges(pattern[around[0]:around[1]], ecma=True) == ""
    fix = NEGATED_HRKT_NOTHING.format(negated=pattern[around[0]:around[1]]) if nothing else None
    return end, UFlagError(i, f"a class {cls} {what}", None, (offer,) if offer else (), fix)


def _property_offer(pattern: str) -> Optional[tuple[str, str]]:
    """(``pattern`` with each of its property classes that no dialect knows, or that ECMA does not
    read, respelled: as ECMA's closest (``closest_property``: ``\\p{Lettr}``, ``\\p{Letter}``), as
    ECMA spells it (``ecma_problem``: ``\\p{Greek}``, ``\\p{Script=Greek}``), else as its characters'
    code-point ranges where they are few (``json_schema.as_ranges``: a block), what the pattern so
    written holds: "the class \\p{Letter}", "the classes \\p{Letter} and \\p{Number}"); None where one
    of them has no such spelling. Each is offered, so that the pattern offered is read. A negated
    class holding Hrkt is respelled whole, as \\P{Hrkt} is (``regex_properties.negated_hrkt_ranges``:
    ``[^\\p{Hrkt}]`` every character, where the two scripts would leave out kana), and none where it
    so matches no character (``[^\\P{Hrkt}]``)."""
    from lmnb_engine.json_schema import as_ranges
    from lmnb_engine.regex_properties import (closest_property, ecma_problem, hrkt_class, negated_hrkt_ranges,
                                              unknown_property)

    fixes: list[tuple[int, int, str, bool]] = []  # (start, end, the spelling, in a class) of each class respelled
    for start, end, in_class in _property_classes(pattern):
        cls = pattern[start:end]
        problem = None if unknown_property(cls) else ecma_problem(cls)
        if (not unknown_property(cls) and problem is None) or (fixes and fixes[-1][0] < start < fixes[-1][1]):
            continue  # (ECMA reads it, or it stands in a class respelled whole)
        around = _negated_class_around(pattern, start) if in_class and hrkt_class(cls) else None
        if around:  # (Hrkt in a negated class: the class read as \P{Hrkt} is, Hrkt holding no character)
            fix = negated_hrkt_ranges(pattern[around[0]:around[1]], ecma=True)
            if not fix:
                return None
            fixes = [f for f in fixes if not around[0] < f[0] < around[1]] + [(*around, fix, False)]
            continue
        fix = closest_property(cls) if problem is None else problem[1] or as_ranges(cls, ecma=True)
        if fix is None:
            return None
        fixes.append((start, end, fix, in_class))
    for start, end, fix, in_class in reversed(fixes):  # (ranges inside a class without their brackets)
        pattern = pattern[:start] + (fix[1:-1] if in_class and fix.startswith("[") else fix) + pattern[end:]
    shown = list(dict.fromkeys(fix for _, _, fix, _ in fixes))
    return pattern, (f"the class {shown[0]}" if len(shown) == 1 else
                     f"the classes {', '.join(shown[:-1])} and {shown[-1]}")


def _negated_class_around(pattern: str, at: int) -> Optional[tuple[int, int]]:
    """(start, end) of the negated class ``[^...]`` of ``pattern`` that ``pattern[at]`` stands in, as
    ECMA delimits it (``schema_empty_class.ecma_classes``), or None."""
    from lmnb_engine.schema_empty_class import ecma_classes

    return next(((start, end) for start, end in ecma_classes(pattern)
                 if start < at < end and pattern.startswith("[^", start)), None)


def _property_classes(pattern: str) -> Iterator[tuple[int, int, bool]]:
    """(start, end, inside a character class) of each property class ``\\p{...}`` of ``pattern``, in order."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        if pattern[i] == "\\":
            found = _PROPERTY.match(pattern, i + 1)
            if found:
                yield i, found.end(), in_class
            i = found.end() if found else i + 2
            continue
        in_class = pattern[i] != "]" if in_class else pattern[i] == "["
        i += 1


def _escape_end(pattern: str, i: int) -> int:
    """Where the valid escape at ``pattern[i]`` (a backslash, ``_escape_error`` None) ends."""
    c = pattern[i + 1]
    found = (_PROPERTY.match(pattern, i + 1) if c in "pP" else _HEX.match(pattern, i + 1) or
             _CODE_POINT.match(pattern, i + 1) if c in "xu" else None)
    if found:
        return found.end()
    if c == "k":
        return pattern.index(">", i) + 1
    if c in "123456789":
        return _DECIMAL.match(pattern, i + 1).end()
    return i + 3 if c == "c" else i + 2


def _class_end(pattern: str, i: int) -> tuple[int, Optional[UFlagError]]:
    """(where the class opening at ``pattern[i]`` ends, its first error under the u flag, or None).
    An unclosed class is left to the other checks (it ends the pattern)."""
    n, j = len(pattern), i + 1 + pattern.startswith("^", i + 1)
    atoms: list[tuple[int, int, bool]] = []  # (start, end, a class escape) of each atom, "-" too
    while j < n and pattern[j] != "]":
        if pattern[j] == "\\":
            found = _escape_error(pattern, j, in_class=True)
            if found:
                return found[0], found[1]
            end = _escape_end(pattern, j) if pattern[j + 1] != "-" else j + 2
            atoms.append((j, end, pattern[j + 1] in _CLASS_ESCAPES))
            j = end
        else:
            atoms.append((j, j + 1, False))
            j += 1
    k = 0
    while k + 2 < len(atoms):  # (ranges: an atom, "-", an atom; read left to right as ECMA's grammar does)
        (start, _, left), (dash, dash_end, _), (_, end, right) = atoms[k:k + 3]
        if pattern[dash:dash_end] == "-":
            if left or right:
                return j + 1, UFlagError(start, f"a class escape at an end of the range {pattern[start:end]}",
                                         pattern[:dash] + "\\" + pattern[dash:])
            k += 3
        else:
            k += 1
    return j + 1, None


class _Place(NamedTuple):
    """Where a scan of a pattern is: in which group (its id, 0 for the pattern itself), which of
    its alternatives, at what depth, and the place of the group in the group around it."""

    group: int
    alternative: int
    depth: int
    outer: Optional["_Place"]


def _may_both_match(first: _Place, second: _Place) -> bool:
    """Whether groups at the places ``first`` and ``second`` may both take part in a match: unless
    they are in different alternatives of the innermost group holding both (ES2025's
    MightBothParticipate). Checking each named group against the last one of its name suffices:
    an earlier one in the same alternative as it would be in the same alternative as that last one."""
    while first.depth > second.depth:
        first = first.outer
    while second.depth > first.depth:
        second = second.outer
    while first.group != second.group:
        first, second = first.outer, second.outer
    return first.alternative == second.alternative


def u_flag_error(pattern: str) -> Optional[UFlagError]:
    """The first syntax error under the u flag of ``pattern`` other than an identity escape
    (``identity_escape``) and those Python's ``re`` raises too once ECMA's syntax is spelled as its
    (unbalanced parentheses, a repeat of nothing, ``{2,1}``, ``[z-a]``): ECMA 262 section 22.2.1
    with ``[+UnicodeMode]``. A lone ``{``, ``}`` or ``]`` (a ``PatternCharacter`` is no
    ``SyntaxCharacter``); a repeated assertion (only Annex B's ``QuantifiableAssertion``, without
    the flag, repeats a lookahead); Python's conditional group ``(?(1)a|b)``; a repeat of a repeat (``a?+``, Python's possessive repeat); a group never closed, a ``)`` closing none (which Python's
    ``re`` may report after an error of its own, ``\\1a(``); ``\\c`` before no letter, ``\\p`` or ``\\x`` or ``\\u`` without
    what follows them, a code point past U+10FFFF, ``\\0`` before a digit and a back-reference in
    a class (Annex B's octal escapes), ``\\k`` with no name; a back-reference to no group (by
    number or name; ``\\k<n>`` to a group named in Python's syntax, ``(?P<n>...)``, is offered
    Python's ``(?P=n)`` and ECMA's ``(?<n>...)``, each such one respelt); a group name that is none, or one named twice in a single alternative
    (ES2025 allows a name twice only in different alternatives); a class escape at an end of a
    range (``[\\d-z]``); a backslash that ends the pattern. None where there is none."""
    groups = 0
    names: dict[str, tuple] = {}  # each group name: the place (_Place) of the last group of that name
    references: list[tuple[int, int | str, int]] = []  # (where, group number or name, where it ends)
    stack: list[tuple[str, int]] = []  # per open group: its kind and start
    place = _Place(0, 0, 0, None)  # the group and alternative the scan is in
    last = None  # the previous item outside a class, where it is an assertion: (its start, what it is), else None
    i, n = 0, len(pattern)
    while i < n:
        c, closed = pattern[i], None
        if c == "\\":
            found = _escape_error(pattern, i, in_class=False)
            if found:
                return found[1]
            end = _escape_end(pattern, i)
            if pattern[i + 1] in "bB":
                closed = (i, f"the assertion \\{pattern[i + 1]}")
            if pattern[i + 1] in "123456789" or pattern[i + 1] == "k":
                ref = pattern[i + 3:end - 1] if pattern[i + 1] == "k" else int(pattern[i + 1:end])
                references.append((i, ref, end))
            i = end
        elif c == "[":
            i, error = _class_end(pattern, i)
            if error:
                return error
        elif c == "(":
            kind, width = "group", 1
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                kind, width = "lookaround", 3 + (pattern[i + 2] == "<")
            elif pattern.startswith("(?<", i):
                name = _GROUP_NAME.match(pattern, i + 3)
                if not (name and pattern.startswith(">", name.end())):
                    return UFlagError(i, "a group name that is no identifier (a named group is (?<name>...), its "
                                         "name a letter, $ or _, then letters, digits, $ or _)", None)
                groups += 1
                if name.group() in names and _may_both_match(names[name.group()], place):
                    return UFlagError(i, f"a second group named {name.group()} where the first may match too", None)
                names[name.group()] = place
                width = name.end() + 1 - i
            elif pattern.startswith("(?(", i):  # (Python's conditional: gen() took it, the engine refused it)
                return UFlagError(i, "Python's conditional group (?(n)...|...)", None,
                                  fix="write the alternatives out with | (no automaton builds a conditional either)")
            elif pattern.startswith("(?", i):
                width = 2  # ((?: and Python's own syntax, which the other checks read)
                groups += pattern.startswith("(?P<", i)  # (Python's named group captures: \\1 may refer to it)
            else:
                groups += 1
            stack.append((kind, i))
            place = _Place(i + 1, 0, place.depth + 1, place)  # (its id: where it opens, past the root's 0)
            i += width
        elif c == ")":
            if not stack:
                return UFlagError(i, "a ) that closes no group", None)
            kind, start = stack.pop()
            place = place.outer
            if kind == "lookaround":
                closed = (start, "a look" + ("ahead" if pattern[start + 2] in "=!" else "behind"))
            i += 1
        elif c == "|":
            place = place._replace(alternative=place.alternative + 1)
            i += 1
        elif c in "*+?" or _QUANTIFIER_BRACES.match(pattern, i):
            end = _QUANTIFIER_BRACES.match(pattern, i).end() if c == "{" else i + 1
            end += pattern.startswith("?", end)  # (lazy)
            if last is not None:  # (Annex B repeats a lookahead, as a group of it does with the flag)
                start, what = last
                instead = pattern[:start] + "(?:" + pattern[start:i] + ")" + pattern[i:] if what == "a lookahead" else None
                return UFlagError(i, f"a repeat {pattern[i:end]} of {what}", instead)
            if end < n and (pattern[end] in "*+?" or _QUANTIFIER_BRACES.match(pattern, end)):
                return UFlagError(end, f"a repeat of the repeat {pattern[i:end]} (Python's possessive a*+ is none of "
                                       "ECMA's)", None)
            i = end
        elif c in "^$":
            closed = (i, f"the assertion {c}")
            i += 1
        elif c in "{}]":
            return UFlagError(i, f"a lone {c} (the flag reads it only escaped, \\{c})", pattern[:i] + "\\" + pattern[i:])
        else:
            i += 1
        last = closed
    if stack:
        return UFlagError(stack[-1][1], "a group that is never closed", None)
    named = set(names)
    python_named: dict[str, int] = {}  # each name of a group named as Python's re names it, (?P<n>...): where it opens
    for m in named_groups(pattern):
        if m.group(1):
            python_named.setdefault(m.group(2), m.start())
    for at, ref, end in references:
        if isinstance(ref, int) and ref > groups:
            octal_end, octal = _octal_reading(pattern, at)
            held = f"{groups} group{'' if groups == 1 else 's'}"
            return UFlagError(at, f"a back-reference {pattern[at:end]} to group {ref} (the pattern has {held})",
                              pattern[:at] + octal + pattern[octal_end:])
        if isinstance(ref, str) and ref not in named:
            if ref not in python_named:
                return UFlagError(at, f"a back-reference {pattern[at:end]} to no group of that name", None)
            # (the group named as Python's re names it, (?P<n>...), which ECMA lacks: the back-reference
            # spelled as Python's, or the group as ECMA's; each such one, so that the offer is read)
            python = [(a, r, e) for a, r, e in references if isinstance(r, str) and r not in named and r in python_named]
            as_python, as_ecma = pattern, pattern
            for a, r, e in reversed(python):
                as_python = as_python[:a] + f"(?P={r})" + as_python[e:]
            for p in sorted({python_named[r] + 2 for _, r, _ in python}, reverse=True):  # (where each "P" is)
                as_ecma = as_ecma[:p] + as_ecma[p + 1:]
            names = list(dict.fromkeys(r for _, r, _ in python))
            groups = (f"a back-reference to the group {names[0]}" if len(names) == 1 else
                      f"back-references to the groups {', '.join(names[:-1])} and {names[-1]}")
            return UFlagError(at, f"a back-reference {pattern[at:end]} to the group {ref} named in Python's syntax "
                                  f"(?P<{ref}>...), which ECMA lacks (ECMA names a group (?<{ref}>...))", None,
                              ((as_python, f"{groups} in Python's syntax"), (as_ecma, f"{groups} in ECMA's syntax")))
    return None
