"""A ``regex`` constraint's edge anchors, which constrained output always meets, and the refusal of a
pattern that leaves no text to write: ``without_edge_anchors`` drops the ``^``/``\\A`` and
``$``/``\\Z`` at the edges of each top-level alternative, as xgrammar and the engine do, and
``empty_pattern_problem`` refuses what is then empty or matches only the empty string (``^$``,
``(?:)``, ``a{0}``), in the words ``gen()``, a ``%%lm`` cell and the engine share, as
``lookahead_past_end_problem`` refuses a lookahead that reads past the pattern's end (`` \\w+(?= )``).
"""

from __future__ import annotations

import re
import warnings

from lmnb_engine.regex_parts import GLOBAL_FLAGS, unicode_classes
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import constants, parser

_REPEATS = (constants.MAX_REPEAT, constants.MIN_REPEAT, getattr(constants, "POSSESSIVE_REPEAT", None))


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
    held = _one_wide(pattern)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return parser.parse(held).getwidth()[1] == 0 and re.fullmatch(held, "") is not None
    except (re.error, RecursionError, OverflowError):
        return False


def _one_wide(pattern: str) -> str:
    """``pattern`` with each Unicode class held by one character, "%" (as ``classes_held`` holds them,
    but as wide as the class is), for Python's ``re`` to measure."""
    for m in reversed(unicode_classes(pattern)):
        pattern = pattern[:m.start(2)] + "%" + pattern[m.end(2):]
    return pattern


def lookahead_past_end_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused for a lookahead that reads past its end, or None: one every match
    passes through (in no alternative, optional part, conditional or other lookaround) whose pattern
    needs more characters than the rest of the pattern can match after it (`` \\w+(?= )``,
    ``(?=abc)ab``). Constrained output matches the whole pattern, so no text follows its end, and
    the lookahead can never hold (Python's ``re.fullmatch`` matches no text; interegular, older
    outlines', reads the lookahead's text as the pattern's own). Other lookaheads are left to the
    backend (the engine refuses them all, in its own words: ``constrained.regex_check``). None too
    where Python's ``re`` cannot read the pattern (each Unicode class held by one character)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = parser.parse(_one_wide(pattern))
    except (re.error, RecursionError, OverflowError):
        return None
    stack = [(parsed.data, 0)]  # (items every match reads in turn, the most characters that can follow them)
    while stack:
        items, rest = stack.pop()
        for op, av in reversed(items):  # (rest: the most characters that can follow the item)
            width = parser.SubPattern(parsed.state, [(op, av)]).getwidth()[1]
            if op is constants.ASSERT and av[0] == 1 and av[1].getwidth()[0] > rest:  # (direction 1: ahead)
                return (f"regex {shown_regex(pattern)} has a lookahead that needs more text than can follow it: the "
                        "output matches the whole pattern, and no text follows the pattern's end, so the lookahead "
                        "can never hold and the pattern never matches; remove the lookahead (the output ends where "
                        "the pattern does), or take its text out of it, into the pattern, for the output to hold that "
                        "text too")
            if op is constants.SUBPATTERN or op is constants.ATOMIC_GROUP:
                stack.append(((av[-1] if op is constants.SUBPATTERN else av).data, rest))
            elif op in _REPEATS and av[0] >= 1 and (av[1] != constants.MAXREPEAT or width == 0):
                # (a repeat read once at least: what its later rounds match may follow a round)
                more = 0 if av[1] == constants.MAXREPEAT else (av[1] - 1) * av[2].getwidth()[1]
                stack.append((av[2].data, rest + more))
            rest += width
    return None
