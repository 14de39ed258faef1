"""A regex's syntax tree as Python's own parser gives it, and a walk over all of its nodes.

The engine reads patterns with ``re._parser`` (``sre_parse`` before Python 3.11) in several
places: the constrained-decoding check names the features a finite automaton lacks
(``constrained.regex_check``) and the modules that rewrite a pattern for the automaton library
read its tree, the stop matcher measures how far a stop regex reads (``regex_reach``) and builds
automata of stop regexes (``stop_automaton``), ``regex_errors`` words what Python refuses, and
``regex_empty_class`` finds a class that matches no character. They import the parser modules from here, and search the tree with ``walk``.
"""

from __future__ import annotations

from typing import Any, Iterator

try:  # Python >= 3.11
    from re import _constants as constants
    from re import _parser as parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as constants  # type: ignore[no-redef]
    import sre_parse as parser  # type: ignore[no-redef]


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
