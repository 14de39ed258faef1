"""The export's notes on the closures that the set-up cells make once and the rows call: a function
that a set-up function returns (``add = make()``) keeps the variables of that call, so what it
changes in them carries over from row to row in the job, where each pass of the notebook makes the
closure anew."""

from __future__ import annotations

from lmnb.export.cells import Code, LMCell, _mutated, bound_by
from lmnb.export.syntax import _cell_binds, _function_locals, _statements


def _closure_changes(factory) -> list:
    """The variables of the function ``factory`` (its own: ``_function_locals``) that a function or
    lambda it defines changes, in place (``log.append(x)``: ``cells._mutated``'s sure changes) or
    by ``nonlocal`` (``n += 1``), and does not bind as its own, in order of first mention."""
    import ast

    outer = _function_locals(factory)
    found: dict = {}
    for inner in ast.walk(factory):
        if inner is factory or not isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        own = _function_locals(inner)
        declared = {n for node in ast.walk(inner) if isinstance(node, ast.Nonlocal) for n in node.names}
        changed = [n for n in _mutated(inner, surely=True) if n not in own]
        changed += [n.id for n in ast.walk(inner) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                    and n.id in declared]
        found.update(dict.fromkeys(n for n in changed if n in outer))
    return list(found)


def _closure_notes(setup: list, row: list, called: list) -> list:
    """The notes for the set-up globals bound at top level to a call of a set-up function defined
    above (``add = make()``) whose variables a function it defines changes (``_closure_changes``),
    where the row cells, or the set-up functions they call (``called``: ``_called``), use that
    global and no row cell binds it."""
    import ast

    used = {n for c in row if isinstance(c, (Code, LMCell)) for n in (c.uses if isinstance(c, Code) else c.reads)}
    used |= {n for f in called for n in f[2]}
    bound = set().union(*map(_cell_binds, row))
    functions: dict = {}
    made: dict = {}
    for c, stmt in _statements(setup):
        for name in bound_by(stmt):
            made.pop(name, None)
            functions.pop(name, None)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[stmt.name] = stmt
        value = stmt.value if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in functions \
                and (changed := _closure_changes(functions[value.func.id])):
            made[stmt.targets[0].id] = (c.index, value.func.id, changed)
    notes = []
    for name, (index, factory, changed) in made.items():
        if name in used and name not in bound:
            notes.append(f"cell {index}: {name}, which {factory}() makes once here and the rows use, changes the "
                         f"variable{'s' * (len(changed) > 1)} {', '.join(changed)} of that call of {factory}(), which "
                         "it keeps: what one row changes, the next row sees, where each pass of the notebook makes it "
                         f"anew; call {factory}() in a cell that runs per row ({name} = {factory}(...) after the "
                         "first %%lm cell), and rows running at once (--num-threads above 1) share it")
    return notes
