"""The papermill ``parameters`` cell: which variables it sets and, where it says, their defaults.

One reading for everyone who needs it: ``lmnb export`` turns these variables into the job's
options, and ``lmnb run -p`` checks a name against them and reads a value like its default, so a
notebook run and its exported job agree on what a parameter is.
"""

from __future__ import annotations

import ast
from collections import Counter

from lmnb.export.syntax import names_bound


class _NoDefault:
    """The default of a parameter set to something other than a literal (``n = len(x)``)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()


def read_parameters(source: str) -> dict:
    """name → default of each variable the cell's top-level statements assign (``x = ...``,
    ``x: int = ...``, ``a, b = ...``), in order of first assignment. The default is the literal
    value of the last ``name = literal`` where the cell binds the name only by top-level
    ``name = ...`` statements, else ``NO_DEFAULT`` (the cell computes it when it runs): ``label =
    3`` followed by a loop that sets ``label = 'x'``, or ``count = 5`` and ``count += 1``, ends with
    another value than the literal, so any other binding (augmented assignment, a
    ``for``/``with``/``except`` target, a walrus, an import, ``del``, tuple unpacking, an
    assignment in a block, a ``global`` in a function) makes it ``NO_DEFAULT``. What the cell
    imports or defines, binds only inside a block, or merely annotates (``x: int``, which binds
    nothing) is set-up, not a parameter.

    Raises:
        SyntaxError: the source is not plain Python (IPython syntax is not replaced here).
    """
    tree = ast.parse(source)
    bound = _module_bindings(tree)
    plain: Counter = Counter()  # (top-level `name = ...` statements)
    out: dict = {}
    for stmt in tree.body:
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
            if isinstance(target, ast.Name):  # (the last one is the value the cell leaves)
                plain[target.id] += 1
                out[target.id] = _literal(stmt.value)
    for name in out:
        if bound[name] != plain[name] or bound[_STAR]:
            out[name] = NO_DEFAULT
    return out


_STAR = "*"  # (the key of ``from m import *``, which may bind any name; ``names_bound`` gives it)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _module_bindings(tree: ast.Module) -> Counter:
    """name → how many statements or expressions of ``tree`` bind it in the module's scope (an
    assignment in a loop counts once, however often it runs); ``_STAR`` counts star imports.
    A function's or class's own names are its own, except those it declares ``global``; a
    comprehension's loop variables are its own, but a walrus in it binds the scope around it."""
    count: Counter = Counter()

    def walk(node: ast.AST, binds_module, in_comprehension: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                if not isinstance(child, ast.Lambda) and binds_module(child.name):
                    count[child.name] += 1
                walk(child, _globals(child).__contains__, False)
                continue
            if isinstance(child, ast.NamedExpr):
                if binds_module(child.target.id):
                    count[child.target.id] += 1
                walk(child.value, binds_module, in_comprehension)
                continue
            for name in _bound_by(child, in_comprehension):
                if binds_module(name):
                    count[name] += 1
            walk(child, binds_module, in_comprehension or isinstance(child, _COMPREHENSIONS))

    walk(tree, _anything, False)
    return count


def _anything(name: str) -> bool:
    return True


def _bound_by(node: ast.AST, in_comprehension: bool) -> list:
    """The names ``node`` itself binds (not its children), ``_STAR`` for a star import; a
    comprehension's loop variables (``in_comprehension``) are left out, being its own."""
    if in_comprehension and isinstance(node, ast.Name):
        return []
    return names_bound(node)


def _globals(scope: ast.AST) -> set:
    """The names a function's or class's own body declares ``global`` (not its nested scopes')."""
    out: set = set()
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Global):
            out.update(node.names)
        elif not isinstance(node, _SCOPES):
            todo += ast.iter_child_nodes(node)
    return out


def _literal(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {[1]}
        return NO_DEFAULT
