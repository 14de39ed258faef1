"""Name the regex features that a finite automaton cannot express, before compiling.

outlines-core builds a DFA with the ``regex-automata`` crate; a pattern with a backreference or a
lookaround fails there with "error building NFA", which says nothing about the cause. Here the
pattern is parsed with Python's own regex parser (``re._parser``) and walked for those features,
so the error names the feature and the fix. Unicode property classes (``\\p{L}``), which Python
lacks and ``regex-automata`` reads, are held by other characters meanwhile
(``regex_parts.classes_held``); other patterns Python cannot parse are left to the library.
"""

from __future__ import annotations

import re
import warnings

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.regex_errors import no_backend_problem, unsupported_words
from lmnb_engine.regex_parts import classes_held
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import constants as _c
from lmnb_engine.regex_tree import parser as _p
from lmnb_engine.regex_tree import walk

_ANCHOR_HINT = (
    "constrained output must match the whole pattern, so the pattern is anchored at both ends "
    "already, and anchors opening or closing it (or each of its top-level alternatives) are "
    "dropped; one inside cannot hold, remove it"
)

_AT_NAMES = {
    _c.AT_BEGINNING: ("a '^' anchor", _ANCHOR_HINT),
    _c.AT_BEGINNING_STRING: ("a '\\A' anchor", _ANCHOR_HINT),
    _c.AT_END: ("a '$' anchor", _ANCHOR_HINT),
    _c.AT_END_STRING: ("a '\\Z' anchor", _ANCHOR_HINT),
}


def _unsupported(op, av) -> tuple[str, str] | None:
    """(feature name, fix) if the parsed node ``(op, av)`` has no finite-automaton equivalent, of
    those ``gen()`` leaves to the engine (``check_parsed`` asks ``no_backend_problem`` first): an
    anchor inside."""
    return _AT_NAMES[av] if op is _c.AT and av in _AT_NAMES else None


# The automaton library (regex-syntax) refuses a pattern nested more than 250 levels deep, where a
# group, an alternation, a concatenation and a repeat each count a level, so up to 4 levels a
# parenthesis, e.g. ``((b|ac)*)``; Python's parser folds some of them away (``(?:b|(?:c|a))`` is one
# class), so the parentheses are counted in the text. 60 of them stay within the library's limit,
# and within Python's own parser (which runs out of recursion near 500).
MAX_NESTING = 60


def nesting_depth(pattern: str) -> int:
    """How deeply parentheses nest in ``pattern`` (escaped ones and those in a class not counted)."""
    deepest = depth = 0
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 1
        elif ch == "[":  # to the class's end: a ']' first (after an optional '^') is a literal
            i += 2 if pattern.startswith("^", i + 1) else 1
            i += pattern.startswith("]", i + 1)
            while i + 1 < n and pattern[i + 1] != "]":
                i += 2 if pattern[i + 1] == "\\" else 1
            i += 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(depth - 1, 0)
        i += 1
    return deepest


# Like RE2, which refuses a repeat count above 1000: the automaton has a state per repetition, and
# compiling it against a vocabulary takes seconds per thousand (a{16000}: 4 s on the demo
# vocabulary), so a larger count is refused at once rather than killed at the compile time limit.
# Nested counts multiply, so the limit applies to their product along each path.
MAX_REPEAT_COUNT = 1000


def largest_repeat(node, outer: int = 1) -> int:
    """The largest product of bounded repeat counts along a nesting path of a parsed pattern
    (an unbounded ``{m,}`` counts as ``m``), walked with a stack of its own (as ``regex_tree.walk`` is)."""
    largest, stack = outer, [(node, outer)]
    while stack:
        node, outer = stack.pop()
        if isinstance(node, _p.SubPattern):
            node = node.data
        if isinstance(node, list):
            stack.extend((item, outer) for item in node)
        elif isinstance(node, tuple):
            # (by identity: a range's (low, high) is a pair too, equal to one from "+" or "," on Python 3.11)
            if len(node) == 2 and (node[0] is _c.MAX_REPEAT or node[0] is _c.MIN_REPEAT):
                lo, hi, sub = node[1]
                outer *= max(lo if hi is _c.MAXREPEAT else hi, 1)
                largest = max(largest, outer)
                stack.append((sub, outer))
            else:
                stack.extend((part, outer) for part in node if isinstance(part, (list, tuple, _p.SubPattern)))
    return largest


def check_regex(pattern: str) -> None:
    """Raise ``GrammarError`` if ``pattern`` uses a feature a DFA cannot express.

    Checked: backreferences, conditionals, lookahead/lookbehind (positive and negative), anchors
    (``^ $ \\A \\Z``; matches are whole-output already), word boundaries, atomic groups,
    possessive quantifiers, repeat counts above ``MAX_REPEAT_COUNT`` (nested ones multiplied), and
    parentheses nested deeper than ``MAX_NESTING`` (``nesting_depth``), in a pattern with Unicode
    classes too (read with them held by ``a``s: ``regex_parts.classes_held``). A pattern that
    Python's parser rejects is passed on unchanged (the DFA library may accept it, or report its own error
    when compiling).

    Raises:
        GrammarError: naming an unsupported feature and how to rewrite it: of several, the one
            ``gen()`` names (``check_parsed``).
        TypeError: ``pattern`` is not a string.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"regex must be a str, got {type(pattern).__name__}")
    _check_nesting(pattern)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # (a Unicode class, \p{Lu}, which re lacks, held by "a"s: the rest is checked all the same;
            # "\p{Lu}{5000}" went unchecked to a compile that ran to its 60 s limit)
            parsed = _p.parse(classes_held(pattern))
    except OverflowError:  # "the repetition number is too large" (above 2**32 - 2)
        raise GrammarError(too_many(pattern, f"more than {_c.MAXREPEAT - 1:,}")) from None
    except (re.error, RecursionError):
        return
    check_parsed(parsed, pattern)


def check_parsed(parsed, pattern: str, subject: str = "regex") -> None:
    """``check_regex`` on a pattern parsed by ``re._parser`` (``pattern``: its text, for messages,
    which name it as ``subject``, e.g. a schema's ``json_schema.pattern_subject``, before its text):
    its nesting, then what ``gen()`` refuses, in ``gen()``'s words and order
    (``regex_errors.no_backend_problem``: a back-reference, a lookbehind or word boundary, a
    lookahead, a conditional, atomic group or possessive quantifier), then the other features in
    the pattern's order, then its repeat counts."""
    _check_nesting(pattern, subject)
    # (what gen() refuses first, in gen()'s order: a pattern with a lookahead and a word boundary, (?=a)a\b,
    # was refused here for the lookahead, the first in the pattern, and by gen() for the boundary)
    problem = no_backend_problem(parsed, pattern, subject)
    if problem:
        raise GrammarError(problem)
    for op, av in walk(parsed):
        found = _unsupported(op, av)
        if found is not None:
            raise GrammarError(unsupported_words(pattern, *found, subject))
    count = largest_repeat(parsed)
    if count > MAX_REPEAT_COUNT:
        raise GrammarError(too_many(pattern, str(count), subject))


def _check_nesting(pattern: str, subject: str = "regex") -> None:
    depth = nesting_depth(pattern)
    if depth > MAX_NESTING:
        raise GrammarError(
            f"{subject} {shown_regex(pattern)} nests parentheses {depth} levels deep, above the limit of {MAX_NESTING}: "
            "the automaton library cannot build it; flatten the pattern (a group around a single item, or an "
            "alternative of alternatives, can be written without the extra level)")


def too_many(pattern: str, count: str, subject: str = "regex") -> str:
    """The refusal of ``pattern`` (named as ``subject``) for repeating a part ``count`` times (its
    text: a number, "more than 4,294,967,294", or ``shown_integer_text``'s of a count too long to read)."""
    shown = shown_regex(pattern)
    return (f"{subject} {shown} repeats a part {count} times (nested repeats multiplied), above the limit of "
            f"{MAX_REPEAT_COUNT}: its automaton would take too long to build; use an unbounded repeat "
            '("+" or "*") and bound the length with max_tokens instead')
