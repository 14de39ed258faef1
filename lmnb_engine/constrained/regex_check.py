"""Name the regex features that a finite automaton cannot express, before compiling.

outlines-core builds a DFA with the ``regex-automata`` crate; a pattern with a backreference or a
lookaround fails there with "error building NFA", which says nothing about the cause. Here the
pattern is parsed with Python's own regex parser (``re._parser``) and walked for those features,
so the error names the feature and the fix. Patterns Python cannot parse (e.g. ``\\p{L}``, which
``regex-automata`` accepts) are left to the library.
"""

from __future__ import annotations

import re
import warnings

from lmnb_engine.constrained.errors import GrammarError

try:  # Python >= 3.11
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

_ANCHOR_HINT = (
    "constrained output must match the whole pattern, so the pattern is anchored at both ends "
    "already; remove the anchor"
)

_AT_NAMES = {
    _c.AT_BEGINNING: ("a '^' anchor", _ANCHOR_HINT),
    _c.AT_BEGINNING_STRING: ("a '\\A' anchor", _ANCHOR_HINT),
    _c.AT_END: ("a '$' anchor", _ANCHOR_HINT),
    _c.AT_END_STRING: ("a '\\Z' anchor", _ANCHOR_HINT),
    _c.AT_BOUNDARY: ("a word boundary '\\b'", "spell out the characters allowed on each side"),
    _c.AT_NON_BOUNDARY: ("a non-word-boundary '\\B'", "spell out the characters allowed on each side"),
}


def _unsupported(op, av) -> tuple[str, str] | None:
    """(feature name, fix) if the parsed node ``(op, av)`` has no finite-automaton equivalent."""
    if op is _c.GROUPREF:
        return f"a backreference '\\{av}'", "repeat the group's pattern instead of referring to it"
    if op is _c.GROUPREF_EXISTS:
        return "a conditional group '(?(n)...|...)'", "write the alternatives out with '|'"
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        direction = "lookahead" if av[0] == 1 else "lookbehind"
        kind = "negative " if op is _c.ASSERT_NOT else ""
        return f"a {kind}{direction}", "express the condition with character classes and alternatives"
    if op is _c.AT and av in _AT_NAMES:
        return _AT_NAMES[av]
    if getattr(_c, "ATOMIC_GROUP", None) is not None and op is _c.ATOMIC_GROUP:
        return "an atomic group '(?>...)'", "use a plain group '(?:...)'"
    if getattr(_c, "POSSESSIVE_REPEAT", None) is not None and op is _c.POSSESSIVE_REPEAT:
        return "a possessive quantifier ('*+', '++', '?+')", "use the greedy quantifier"
    return None


def _walk(node):
    """Yield every ``(op, av)`` pair in a parsed pattern, depth first."""
    if isinstance(node, _p.SubPattern):
        node = node.data
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, tuple):
        if len(node) == 2 and isinstance(node[0], _c._NamedIntConstant):
            yield node
        for part in node:
            if isinstance(part, (list, tuple, _p.SubPattern)):
                yield from _walk(part)


# Like RE2, which refuses a repeat count above 1000: the automaton has a state per repetition, and
# compiling it against a vocabulary takes seconds per thousand (a{16000}: 4 s on the demo
# vocabulary), so a larger count is refused at once rather than killed at the compile time limit.
# Nested counts multiply, so the limit applies to their product along each path.
MAX_REPEAT_COUNT = 1000


def largest_repeat(node, outer: int = 1) -> int:
    """The largest product of bounded repeat counts along a nesting path of a parsed pattern
    (an unbounded ``{m,}`` counts as ``m``)."""
    if isinstance(node, _p.SubPattern):
        node = node.data
    if isinstance(node, list):
        return max((largest_repeat(item, outer) for item in node), default=outer)
    if not isinstance(node, tuple):
        return outer
    if len(node) == 2 and node[0] in (_c.MAX_REPEAT, _c.MIN_REPEAT):
        lo, hi, sub = node[1]
        inner = outer * max(lo if hi is _c.MAXREPEAT else hi, 1)
        return max(inner, largest_repeat(sub, inner))
    return max((largest_repeat(part, outer) for part in node if isinstance(part, (list, tuple, _p.SubPattern))),
               default=outer)


def check_regex(pattern: str) -> None:
    """Raise ``GrammarError`` if ``pattern`` uses a feature a DFA cannot express.

    Checked: backreferences, conditionals, lookahead/lookbehind (positive and negative), anchors
    (``^ $ \\A \\Z``; matches are whole-output already), word boundaries, atomic groups,
    possessive quantifiers, and repeat counts above ``MAX_REPEAT_COUNT`` (nested ones multiplied).
    A pattern that Python's parser rejects is passed on unchanged (the DFA library may accept it,
    or report its own error when compiling).

    Raises:
        GrammarError: naming the first unsupported feature found and how to rewrite it.
        TypeError: ``pattern`` is not a string.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"regex must be a str, got {type(pattern).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = _p.parse(pattern)
    except OverflowError:  # "the repetition number is too large" (above 2**32 - 2)
        raise GrammarError(_too_many(pattern, f"more than {_c.MAXREPEAT - 1:,}")) from None
    except (re.error, RecursionError):
        return
    check_parsed(parsed, pattern)


def check_parsed(parsed, pattern: str) -> None:
    """``check_regex`` on a pattern parsed by ``re._parser`` (``pattern``: its text, for messages)."""
    for op, av in _walk(parsed):
        found = _unsupported(op, av)
        if found is not None:
            feature, fix = found
            raise GrammarError(
                f"regex {pattern!r} uses {feature}, which constrained decoding cannot support "
                f"(patterns compile to a finite automaton): {fix}"
            )
    count = largest_repeat(parsed)
    if count > MAX_REPEAT_COUNT:
        raise GrammarError(_too_many(pattern, str(count)))


def _too_many(pattern: str, count: str) -> str:
    shown = repr(pattern[:80]) + ("..." if len(pattern) > 80 else "")
    return (f"regex {shown} repeats a part {count} times (nested repeats multiplied), above the limit of "
            f"{MAX_REPEAT_COUNT}: its automaton would take too long to build; use an unbounded repeat "
            "('+' or '*') and bound the length with max_tokens instead")
