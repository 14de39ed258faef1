"""The export's notes on the default values of set-up functions that the rows call: a list, dict or
set default is made once, where the ``def`` runs, so what a call changes in it carries over from
row to row in the job, where each pass of the notebook runs the ``def`` anew."""

from __future__ import annotations

from lmnb.export.cells import _mutated, bound_by
from lmnb.export.syntax import _bound_before_read, _function_locals, _own_nodes, _row_trees, _statements


def _made_once(value) -> bool:
    """Whether the default ``value`` (an expression) is a new dict, list or set: a display, a
    comprehension or ``list()``, ``dict()``, ``set()``."""
    import ast

    return isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "dict", "set"))


def _changed_defaults(function) -> list:
    """(position, or None for a keyword-only one; name; default) of each parameter of ``function`` whose
    default is a new dict, list or set (``_made_once``) that its body changes in place
    (``acc.append(x)``, ``acc[k] = v``) and never binds again (``acc = []`` of a None default's
    ``if acc is None``: then which object it changes is not known here)."""
    import ast

    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaulted = [(i, a, d) for i, (a, d) in enumerate(zip(positional[len(positional) - len(args.defaults):],
                                                            args.defaults), len(positional) - len(args.defaults))]
    defaulted += [(None, a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    rebound = {n.id for n, _ in _own_nodes(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    return [(i, a.arg, d) for i, a, d in defaulted
            if _made_once(d) and a.arg not in rebound and a.arg in _mutated(_closures_of(function, a.arg), surely=True)]


def _leaves_out(call, position, name: str) -> bool:
    """Whether ``call`` (an ``ast.Call``) leaves the parameter ``name`` (at ``position``, None for a
    keyword-only one) to its default: it passes it neither by position nor by keyword, nor may pass
    it by a spread (``*args``, ``**kw``: not known here)."""
    import ast

    spread = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
    given = (position is not None and position < len(call.args)) or name in {k.arg for k in call.keywords}
    return not (spread or given)


def _closures_of(function, name: str):
    """A copy of ``function``'s body (a module) without the functions and lambdas in it whose own
    variable ``name`` is (a parameter, ``def inner(acc)``, a name it binds, or one it declares
    ``global``): what those change by that name is not ``function``'s ``name``, where a closure's
    change is (``def inner(): acc.append(x)``)."""
    import ast
    import copy

    class Without(ast.NodeTransformer):
        def _own(self, node) -> bool:
            declared = {n for m, _ in _own_nodes(node) if isinstance(m, ast.Global) for n in m.names}
            return name in _function_locals(node) | declared

        def visit_FunctionDef(self, node):
            return None if self._own(node) else self.generic_visit(node)

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Lambda(self, node):
            return ast.Constant(None) if self._own(node) else self.generic_visit(node)

    return Without().visit(ast.Module(body=copy.deepcopy(function.body), type_ignores=[]))


def _default_notes(row: list, called: list, defs: dict, setup: list = ()) -> list:
    """The notes for the set-up functions the rows call (``called``: ``_called``; ``defs``: their
    ``def``s, ``_made_objects``') with a dict, list or set default that they change in place
    (``_changed_defaults``), where a call by name in a row cell (where no row cell binds that name)
    or in one of those functions leaves that parameter to its default (``seen(q)`` of ``def seen(x,
    acc=[])``; not ``seen(q, [])``), also by another name bound to the function (``_function_names``:
    ``g = seen`` of a ``setup`` cell or a row cell, then ``g(q)``)."""
    import ast

    functions = [(f[0], d) for f in called if (d := defs.get((f[0], f[1]))) is not None
                 and isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # (a name a row cell binds before any row cell reads it calls the row's own function there: only the set-up
    # functions, which read the script's globals, call the set-up one by it; bound after a call, the call is the
    # set-up one's)
    own = _bound_before_read(row)
    setup_names, row_names = _function_names(setup, row, {d.name for _, d in functions})
    aliases = {**{n: f for n, f in setup_names.items() if n not in own}, **row_names}
    calls = [n for tree in [t for _, t in _row_trees(row)] for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and (n.func.id not in own or n.func.id in aliases)]
    calls += [n for _, d in functions for n in ast.walk(d) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    notes = []
    for index, function in functions:
        found = []
        for position, name, default in _changed_defaults(function):
            if any(_leaves_out(c, position, name) for c in calls if aliases.get(c.func.id, c.func.id) == function.name):
                found.append((name, ast.unparse(default)))
        if found:
            names = [n for n, _ in found]
            notes.append(f"cell {index}: {function.name}, which the rows call, changes in place its default"
                         f"{'s' * (len(names) > 1)} {', '.join(names)}, which the def makes once (a call that leaves "
                         f"{'it' if len(names) == 1 else 'them'} out gets that one): what one row changes, the next row "
                         "sees, where each pass of the notebook runs the def anew; default it to None and make a new "
                         f"one in the function (`if {names[0]} is None: {names[0]} = {found[0][1]}`), and rows running "
                         "at once (--num-threads above 1) share it")
    return notes


def _function_names(setup: list, row: list, functions: set) -> tuple[dict, dict]:
    """(name → the set-up function of ``functions`` it stands for, for each name that a ``setup``
    cell binds last, at its top level, to one (``g = seen``); the same for the names the ``row``
    cells bind once, by an assignment to the name alone, and nowhere else (a parameter, a loop's
    target: which value a call reads is not known here), to one they do not bind)."""
    import ast

    out: dict = {}
    for _, stmt in _statements(setup):
        for name in bound_by(stmt):
            out.pop(name, None)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Name) and stmt.value.id in functions:
            out[stmt.targets[0].id] = stmt.value.id
    nodes = [n for _, tree in _row_trees(row) for n in ast.walk(tree)]
    counts: dict = {}
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) or isinstance(node, ast.arg):
            name = node.id if isinstance(node, ast.Name) else node.arg
            counts[name] = counts.get(name, 0) + 1
    theirs = {n.targets[0].id: n.value.id for n in nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0], ast.Name) and counts.get(n.targets[0].id) == 1
              and isinstance(n.value, ast.Name) and n.value.id in functions and counts.get(n.value.id) is None}
    return out, theirs
