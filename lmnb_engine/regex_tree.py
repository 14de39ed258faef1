"""A regex's syntax tree as Python's own parser gives it, and a walk over all of its nodes.

The engine reads patterns with ``re._parser`` (``sre_parse`` before Python 3.11) in several
places: the constrained-decoding check names the features a finite automaton lacks
(``constrained.regex_check``) and the modules that rewrite a pattern for the automaton library
read its tree, the stop matcher measures how far a stop regex reads (``regex_reach``) and builds
automata of stop regexes (``stop_automaton``), ``regex_errors`` words what Python refuses, and
``regex_empty_class`` finds a class that matches no character. They import the parser modules from here, and search the tree with ``walk``;
the stop automaton and ``regex_never`` write a one-character item back as a pattern with ``one_character``;
``quiet_parse`` parses a pattern that may be no pattern, for the checks that leave that to others.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Iterator

try:  # Python >= 3.11
    from re import _constants as constants
    from re import _parser as parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as constants  # type: ignore[no-redef]
    import sre_parse as parser  # type: ignore[no-redef]


def quiet_parse(text: str) -> Any:
    """``text`` parsed by Python's parser (a ``parser.SubPattern``), its warnings silenced (re's
    FutureWarning of a possible nested set, ``[[``, and its DeprecationWarnings), or None where the
    parser refuses it (``re.error``) or cannot hold it (``RecursionError``: parentheses nested some
    hundreds deep; ``OverflowError``: a count above 2**32 - 2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return parser.parse(text)
        except (re.error, RecursionError, OverflowError):
            return None


def walk(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every ``(op, av)`` node in a parsed pattern (``parser.parse``'s result, or any part of it),
    depth first, nested ones included: those in groups, alternatives, repeats, lookarounds,
    conditionals and character classes (a class's items, ``(LITERAL, 97)``, ``(RANGE, (97,
    122))``, are nodes too). Walked with a stack of its own, so a deeply nested pattern does not
    exhaust Python's recursion limit."""
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, parser.SubPattern):
            node = node.data
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, tuple):
            if len(node) == 2 and isinstance(node[0], constants._NamedIntConstant):
                yield node
            stack.extend(part for part in reversed(node) if isinstance(part, (list, tuple, parser.SubPattern)))


# A class's category items, as Python's parser names them, written as the regex package reads them
_CATEGORIES = {"CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s",
               "CATEGORY_NOT_SPACE": r"\S", "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W"}


def one_character(name: str, av: Any) -> str | None:
    """The item of a parse that consumes one character, ``(op, av)`` with ``op.name`` ``name``
    (``LITERAL``, ``NOT_LITERAL``, ``ANY``, ``IN``), as a pattern the regex package reads alike
    (each character escaped as ``\\U0000NNNN``: ``[^\\U00000061]`` for ``NOT_LITERAL`` 97); None for
    another item, or a class holding an item not written here (a category other than ``\\d``,
    ``\\s``, ``\\w`` and their negations)."""
    if name == "LITERAL":
        return _char(av)
    if name == "NOT_LITERAL":
        return f"[^{_char(av)}]"
    if name == "ANY":
        return "."
    if name != "IN":
        return None
    parts = []
    for op, item in av:
        if op.name == "NEGATE":
            parts.append("^")
        elif op.name == "LITERAL":
            parts.append(_char(item))
        elif op.name == "RANGE":
            parts.append(f"{_char(item[0])}-{_char(item[1])}")
        elif op.name == "CATEGORY" and item.name in _CATEGORIES:
            parts.append(_CATEGORIES[item.name])
        else:
            return None
    return "[" + "".join(parts) + "]"


def _char(code: int) -> str:
    return f"\\U{code:08x}"
