"""A ``regex`` constraint's refusal in the words every front end uses, without torch: the whole check.

A ``regex`` constraint is checked in three places: where the language's ``gen(regex=...)`` is
called (``lmnb.ir.check_regex``), in a ``%%lm`` cell's literal options (``lmnb.template.options``),
and in the engine, for the server's clients too (``constrained.grammar.compile_grammar``). All
three word an invalid pattern with ``regex_problem`` (``pattern_problem`` for a string), so a user
hears one error whichever way the pattern came, and the language's early check refuses no pattern
the engine takes (``\\p{L}``). ``pattern_problem`` asks, in order, the checks of the modules below,
each of which words one kind of problem with its fix: an empty pattern (``regex_edges``), a
Unicode class the automaton library does not build or at an end of a range
(``regex_unicode_classes``), a class Python flags as ambiguous (``regex_ambiguous_class``), PCRE's
quoting (here), another dialect's back-reference or group name (``regex_references``), Python's
own syntax error (``regex_python_error``), a class that matches no character
(``regex_empty_class``), then what no backend builds (``no_backend_problem``, which the engine's own
check asks first too, so that a pattern with several such features is refused for the same one by
both): a back-reference (``regex_references``), a lookbehind or a word boundary (here), a
lookahead (here) and a conditional, an atomic group or a possessive quantifier (here). ``unbuilt_feature``
asks the engine's own check (``constrained.regex_check``) and ``offer_taken`` both, for the fixes
those modules offer, which import it when they weigh an offer. The text walk all of them share is
``regex_parts``. Importing it loads neither torch nor the engine's constrained-decoding package.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from lmnb_engine.regex_ambiguous_class import ambiguous_class
from lmnb_engine.regex_edges import empty_pattern_problem, without_edge_anchors
from lmnb_engine.regex_parts import classes_held, pattern_parts
from lmnb_engine.regex_python_error import invalid_regex, shown_regex
from lmnb_engine.regex_references import (back_reference_problem, named_group_problem, named_reference_problem,
                                          repeated_name_problem)
from lmnb_engine.regex_tree import constants, parser, walk
from lmnb_engine.regex_unicode_classes import class_range_problem, unbuilt_class_problem


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
    ``re`` refuses (``named_reference_problem``) before any other syntax error, since no
    automaton can do it, ECMA's named group ``(?<year>`` (``named_group_problem``, offering
    Python's ``(?P<year>``), a syntax error (``invalid_regex``), a repeat count above what ``re``
    reads, parentheses nested too deeply for its parser, which recurses once per level (some hundreds
    of levels), a class that matches no character (``regex_empty_class``), or a back-reference by
    number or Python's ``(?P=n)``, a lookbehind or a word boundary, a lookahead, or a conditional,
    an atomic group or a possessive quantifier, which no backend
    can constrain output with as ``re`` reads them (``no_backend_problem``, the engine's words). The pattern
    is read by ``re`` with its classes held (``classes_held``), so an error's position is its
    place in ``pattern``, and a pattern with classes is refused as its twin without them is.
    ``empty_class`` False: all but the empty class check (the engine asks it before its own refusals)."""
    problem = (long_count_problem(pattern) or empty_pattern_problem(pattern) or unbuilt_class_problem(pattern)
               or class_range_problem(pattern))
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
        return (_quoting_problem(pattern) or named_reference_problem(pattern) or repeated_name_problem(pattern)
                or named_group_problem(pattern, e) or _braced_code_point_problem(pattern, e)
                or invalid_regex(pattern, e))
    except RecursionError:
        return _too_deep(pattern)
    except OverflowError:  # (a count above 2**32 - 2: Python raises no re.error for it)
        return (f"regex {shown_regex(pattern)} repeats a part more times than Python's re reads (4,294,967,294); "
                'use an unbounded repeat ("+" or "*") and bound the length with max_tokens instead')
    from lmnb_engine.regex_empty_class import empty_class_problem  # (it imports this module)

    # (a class that matches no character first: its words name what the engine refuses beside it)
    problem = empty_class_problem(pattern) if empty_class else None
    return problem or no_backend_problem(parsed, pattern) or surrogate_problem(pattern)


# A repeat count as Python's parser reads one: "{", digits, optionally "," and digits, "}" (no spaces)
_COUNT = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def long_count_problem(pattern: str, subject: str = "regex") -> str | None:
    """The engine's refusal of a repeat count above ``MAX_REPEAT_COUNT`` (``regex_check``'s words;
    the pattern named as ``subject``, as ``too_many`` names it: a schema's is ``pattern_subject``'s)
    for ``pattern``'s first repeat count of more digits than Python reads as an integer, or None:
    Python's parser reads a count with ``int()``, which raised "Exceeds the limit (4300 digits) for
    integer string conversion" from every check that parses the pattern. Counts are read outside
    classes, comments and escapes (in the runs of ``pattern_parts``, which hold every ``{m,n}``)."""
    from lmnb_engine.params import digits_over_limit, past_digit_limit, shown_integer_text  # (torch-free)

    for part in pattern_parts(pattern):
        if part.kind != "":
            continue
        for count in _COUNT.finditer(pattern, part.start, part.end):
            for digits in count.groups():
                if digits and digits_over_limit(len(digits)):
                    from lmnb_engine.constrained.regex_check import MAX_REPEAT_COUNT, too_many  # (it imports this)

                    value = digits.lstrip("0")
                    if len(value) > len(str(MAX_REPEAT_COUNT)) or int(value or "0") > MAX_REPEAT_COUNT:
                        return too_many(pattern, shown_integer_text(digits), subject)
                    # (leading zeros, which int() counts too, past the limit: a small count)
                    return (f"{subject} {shown_regex(pattern)} writes a repeat count in {len(digits)} digits, "
                            f"{past_digit_limit()}; write it without its leading zeros")
    return None


def surrogate_problem(pattern: str) -> str | None:
    """The engine's refusal (``surrogate_words``) of ``pattern``, one Python's ``re`` reads, for its
    first surrogate outside a class and a comment, as a character or a ``\\u`` or ``\\U`` escape
    (no other escape reaches U+D800), or None: ``re`` takes ``\\ud800``, so gen() took it and the
    engine refused it at compile."""
    for part in pattern_parts(pattern):
        if part.kind == "escape" and pattern[part.start + 1] in "uU":
            codes = [int(pattern[part.start + 2:part.end], 16)]
        elif part.kind == "":
            codes = [ord(c) for c in pattern[part.start:part.end]]
        else:  # (a class leaves surrogates out; a comment, a group's parenthesis and other escapes hold none)
            continue
        code = next((c for c in codes if 0xD800 <= c <= 0xDFFF), None)
        if code is not None:
            return surrogate_words(pattern, code)
    return None


def surrogate_words(pattern: str, code: int) -> str:
    """Why ``pattern`` is refused for the surrogate ``code`` outside a class (gen()'s and the engine's words)."""
    return (f"regex {shown_regex(pattern)} has the surrogate U+{code:04X} outside a class, which no UTF-8 text holds, "
            "so no output can hold it; remove it (in a class, surrogates are left out)")


def no_backend_problem(parsed, pattern: str, subject: str = "regex") -> str | None:
    """The engine's words for what in ``pattern`` (parsed by ``re._parser``: ``parsed``) no backend
    builds, which ``gen()`` refuses, or None where it has none: its first back-reference
    (``back_reference_problem``), else its first lookbehind or word boundary (``assertion_problem``),
    else its first lookahead (``lookahead_problem``), else its first conditional, atomic group or
    possessive quantifier (``backtracking_problem``). The one order for a pattern with several:
    ``gen()`` and a ``%%lm`` cell ask it (``pattern_problem``), and the engine's own check asks it
    before its other refusals (``constrained.regex_check.check_parsed``), so that both name the
    same feature (``(?=a)a\\b``: the word boundary). ``subject``: what the words call the pattern
    (``unsupported_words``)."""
    return (back_reference_problem(parsed, pattern, subject) or assertion_problem(parsed, pattern, subject)
            or lookahead_problem(parsed, pattern, subject) or backtracking_problem(parsed, pattern, subject))


# The fixes for a lookaround and a word boundary, in the words gen() and the engine say (no_backend_problem)
LOOKAROUND_FIX = "express the condition with character classes and alternatives"
BOUNDARY_FIX = "spell out the characters allowed on each side"
BOUNDARIES = {constants.AT_BOUNDARY: "a word boundary '\\b'", constants.AT_NON_BOUNDARY: "a non-word-boundary '\\B'"}


def assertion_problem(parsed, pattern: str, subject: str = "regex") -> str | None:
    """The engine's words (``unsupported_words``, as ``constrained.regex_check`` says them) for the
    first lookbehind, ``(?<=...)`` or ``(?<!...)``, or word boundary, ``\\b`` or ``\\B``, nested ones
    too, in ``pattern`` parsed by ``re._parser`` (``parsed``), or None where it has none. No
    backend builds either: the engine cannot; xgrammar says "Lookbehind is not supported yet";
    Rust's regex (outlines-core's, llguidance's) has no look-around, and outlines-core says "cannot
    build DFAs for regexes with Unicode word boundaries"; interegular (older outlines') says
    "lookbacks are not implemented" and "Escape \\b is not implemented"; so ``gen()`` refuses
    them, as it does a back-reference. A JSON schema's pattern is asked this too
    (``json_schema.assertion_problem``); a lookahead, ``lookahead_problem``.
    ``subject``: what the words call the pattern (``unsupported_words``)."""
    for op, av in walk(parsed):
        if (op is constants.ASSERT or op is constants.ASSERT_NOT) and av[0] == -1:  # (direction -1: behind)
            kind = "a negative lookbehind" if op is constants.ASSERT_NOT else "a lookbehind"
            return unsupported_words(pattern, kind, LOOKAROUND_FIX, subject)
        if op is constants.AT and av in BOUNDARIES:
            return unsupported_words(pattern, BOUNDARIES[av], BOUNDARY_FIX, subject)
    return None


def lookahead_problem(parsed, pattern: str, subject: str = "regex") -> str | None:
    """The engine's words (``unsupported_words``, as ``constrained.regex_check`` says them) for the
    first lookahead, ``(?=...)`` or ``(?!...)``, nested ones too, in ``pattern`` parsed by
    ``re._parser`` (``parsed``), or None where it has none. No backend
    constrains output with one as Python's ``re`` reads it: the engine cannot build one; xgrammar
    says "Lookahead is not supported yet"; Rust's regex (outlines-core's, llguidance's) has no
    look-around, and outlines-core fails with "error building NFA"; interegular (older outlines',
    an SGLang server's) reads the lookahead's text as the output's own (its `` \\w+(?= )`` takes
    " ab ", its ``a(?!b)`` takes "a ", which ``re.fullmatch`` refuses), so its output would not
    match the pattern. So ``gen()`` refuses it, as it does a lookbehind, in a ``regex`` constraint
    and in a JSON schema's pattern (``json_schema.assertion_problem``, whose converters in xgrammar
    and outlines-core build the pattern with the same regex readers). ``subject``: what the words
    call the pattern (``unsupported_words``)."""
    for op, av in walk(parsed):
        if (op is constants.ASSERT or op is constants.ASSERT_NOT) and av[0] == 1:  # (direction 1: ahead)
            kind = "a negative lookahead" if op is constants.ASSERT_NOT else "a lookahead"
            return unsupported_words(pattern, kind, LOOKAROUND_FIX, subject)
    return None


# What re reads as backtracking control or a condition on a group, and each one's fix, in the words gen() and the
# engine say (backtracking_problem); ATOMIC_GROUP and POSSESSIVE_REPEAT are Python 3.11's (before it, re refuses them)
_BACKTRACKING = [(getattr(constants, name), words) for name, words in [
    ("GROUPREF_EXISTS", ("a conditional group '(?(n)...|...)'", "write the alternatives out with '|'")),
    ("ATOMIC_GROUP", ("an atomic group '(?>...)'", "use a plain group '(?:...)'")),
    ("POSSESSIVE_REPEAT", ("a possessive quantifier ('*+', '++', '?+')", "use the greedy quantifier")),
] if hasattr(constants, name)]


def backtracking_problem(parsed, pattern: str, subject: str = "regex") -> str | None:
    """The engine's words (``unsupported_words``) for the first conditional ``(?(1)b|c)``, atomic
    group ``(?>...)`` or possessive quantifier (``a++``, ``a{2}+``), nested ones too, in ``pattern``
    parsed by ``re._parser`` (``parsed``), or None where it has none. No backend builds one as
    ``re`` reads it: outlines-core (Rust's regex) fails on a conditional or an atomic group with
    "error building NFA" and reads ``a*+`` as ``(?:a*)+``, so that its ``a*+a`` takes "aa", which
    ``re.fullmatch`` refuses (the possessive repeat gives back no "a"); interegular says
    "Conditional matching is not implemented", "Unknown group-extension: '>'", and reads ``a*+a``
    so too; xgrammar says "Group modifier flag is not supported yet" of ``(?>`` and ``(?(``, and
    refuses two repeat modifiers in a row. So ``gen()`` refuses them, in a ``regex`` constraint and
    in a JSON schema's pattern (``json_schema.assertion_problem``). ``subject``: what the words call
    the pattern (``unsupported_words``)."""
    for op, _ in walk(parsed):
        for code, words in _BACKTRACKING:
            if op is code:  # (by identity: re's codes are ints, equal to others of another kind)
                return unsupported_words(pattern, *words, subject)
    return None


def unsupported_words(pattern: str, feature: str, fix: str, subject: str = "regex") -> str:
    """The engine's refusal of ``pattern`` for ``feature`` (e.g. "a lookbehind"), which no finite
    automaton expresses, with the ``fix`` (``constrained.regex_check``'s words); ``subject`` names
    the pattern before its text (a schema's: ``json_schema.pattern_subject``)."""
    return (f"{subject} {shown_regex(pattern)} uses {feature}, which constrained decoding cannot support "
            f"(patterns compile to a finite automaton): {fix}")


def unbuilt_feature(pattern: str) -> str | None:
    """The engine's words for what in the ``regex`` constraint ``pattern`` no automaton can build (a
    lookaround, a back-reference, an anchor inside: ``regex_check.check_regex``, asked of it without
    its edge anchors, as the engine asks), or None where it has none. ``gen()`` refuses some of these
    itself (``no_backend_problem``: a back-reference, a lookaround, a word boundary, a conditional,
    an atomic group, a possessive quantifier) and leaves the rest to the backend, but offers no
    pattern that holds one (``offer_taken``). Those ``gen()`` refuses are asked of ``pattern`` as
    written (``no_backend_problem``), so a back-reference's position is its place in ``pattern``."""
    from lmnb_engine.constrained.errors import GrammarError
    from lmnb_engine.constrained.regex_check import check_regex  # (torch-free; it imports this module)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            problem = no_backend_problem(parser.parse(classes_held(pattern)), pattern)
    except (re.error, RecursionError, OverflowError):
        problem = None  # (Python cannot read it: check_regex leaves it to the library too)
    if problem:  # (check_regex reads it without its edge anchors: the \1 of "^(a)\1" was placed at 3, not 4)
        return problem
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
    ``c(?<=x)[\\u0370-\\u03ff]``, which holds the lookbehind). A schema's pattern, ECMA's, has its
    own: ``json_schema._offer_taken``."""
    return pattern_problem(pattern) is None and unbuilt_feature(pattern) is None


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


# A braced escape of a code point, PCRE's (Perl's, Rust's) \\x{41} or ECMA's (Rust's) \\u{41}, which Python's re
# lacks (group 1: its hex digits, any number: all three take leading zeros, \\x{00000041}; the value is checked)
_BRACED_CODE_POINT = re.compile(r"\\[xu]\{([0-9A-Fa-f]+)\}")


def _braced_code_point_problem(pattern: str, error: re.error) -> str | None:
    """Why ``pattern``, which Python's ``re`` refused with ``error``, is refused, where it holds a
    braced escape of a code point (``_BRACED_CODE_POINT``, up to U+10FFFF, no surrogate): ``invalid_regex``'s
    words, with the pattern each such escape written as ``re`` writes the code point (``\\x41``,
    ``\\u3042``, ``\\U00010330``) offered where ``offer_taken``, else what the pattern so written is
    refused for (``pattern_problem``, ``unbuilt_feature``: ``(?=a)\\x{41}``'s lookahead, ``\\x{41}(``'s
    "("); None where ``error`` is not at such an escape. ``re`` said only "incomplete escape \\x",
    "fix the pattern"."""
    out, i, found = [], 0, set()  # (found: where each escape respelled starts)
    while i < len(pattern):
        m = _BRACED_CODE_POINT.match(pattern, i) if pattern[i] == "\\" else None
        # (a surrogate is no offer: no UTF-8 output holds one, the engine refuses one outside a class, and
        # PCRE and Rust refuse \\x{D800} themselves)
        if m and (code := int(m.group(1), 16)) <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
            found.add(i)
            i = m.end()
        else:
            step = 2 if pattern[i] == "\\" else 1
            out.append(pattern[i:i + step])
            i += step
    offer = "".join(out)
    if error.pos not in found:  # (re's error is another's: \x{110000}, past Unicode, or [z-a] before the escape)
        return None
    spelling = ("each braced escape of a code point (PCRE's \\x{...}, ECMA's \\u{...}) as Python's re writes it "
                "(\\xHH, \\uHHHH, \\UHHHHHHHH)")
    if offer_taken(offer):
        return invalid_regex(pattern, error, f"write {shown_regex(offer)}, {spelling}")
    # (the pattern so written is refused next, (?=a)\\x41 for its lookahead, \\x41( for its "(": both are named)
    return invalid_regex(pattern, error, f"write {spelling}; then {pattern_problem(offer) or unbuilt_feature(offer)}")


def _too_deep(pattern: str) -> str:
    return (f"regex {shown_regex(pattern)} nests its parentheses too deeply for Python's re to read; flatten "
            "the pattern")
