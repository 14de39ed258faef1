"""A ``regex`` constraint's edge anchors, which constrained output always meets, and the refusal of a
pattern that leaves no text to write: ``without_edge_anchors`` drops the ``^``/``\\A`` and
``$``/``\\Z`` at the edges of each top-level alternative, as xgrammar and the engine do, and
``empty_pattern_problem`` refuses what is then empty or matches only the empty string (``^$``,
``(?:)``, ``a{0}``), in the words ``gen()``, a ``%%lm`` cell and the engine share.
"""

from __future__ import annotations

import re
import warnings

from lmnb_engine.regex_parts import global_flags, unicode_classes
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import parser


def without_edge_anchors(pattern: str) -> str:
    """``pattern`` without the anchors at its edges: ``^`` or ``\\A`` opening it, or opening any of
    its top-level alternatives, and ``$`` or ``\\Z`` closing them (``^\\d{3}$``, ``^yes$|^no$``).
    Constrained output must match the whole pattern, so there they always hold; xgrammar, SGLang's
    default grammar backend, drops them too, and so do JSON Schema patterns here
    (``constrained.json_string``). Other anchors are left for the engine's
    ``constrained.regex_check.check_regex`` to refuse by name."""
    head = global_flags(pattern)
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
