"""The papermill ``parameters`` cell: which variables it sets and, where it says, their defaults.

One reading for everyone who needs it: ``lmnb export`` turns these variables into the job's
options, and ``lmnb run -p`` checks a name against them and reads a value like its default, so a
notebook run and its exported job agree on what a parameter is.
"""

from __future__ import annotations

import ast


class _NoDefault:
    """The default of a parameter set to something other than a literal (``n = len(x)``)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()


def read_parameters(source: str) -> dict:
    """name → default of each variable the cell's top-level statements assign (``x = ...``,
    ``x: int = ...``, ``a, b = ...``), in order of first assignment. The default is the literal
    value of ``name = literal`` (the last assignment of the name counts, as when the cell runs),
    else ``NO_DEFAULT``. What the cell imports or defines, binds only inside a block, or merely
    annotates (``x: int``, which binds nothing) is set-up, not a parameter.

    Raises:
        SyntaxError: the source is not plain Python (IPython syntax is not replaced here).
    """
    out: dict = {}
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        else:
            continue
        for target in targets:
            names = [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
            for name in names:  # (a rebinding keeps the name's place: dict order is first insertion)
                out[name] = NO_DEFAULT
            if isinstance(target, ast.Name):
                out[target.id] = _literal(stmt.value)
    return out


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {[1]}
        return NO_DEFAULT
