"""The export's note on a module of the user's that the rows reload and whose top level changes
another module of the user's (``counter.n += 1`` in helpers.py, beside ``import counter``): the job
imports that other module once, so each row's reload changes it again, where each pass of the
notebook imports it anew and runs the change as often in every pass."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from lmnb.export.cells import bound_by
from lmnb.export.notes_modules import _containers, _module_file, _parsed, _row_reloads

# (the methods of a list, dict, set or deque whose change made twice is not the one made once: a second
# append adds again, where a second clear(), add(x) or update(d) leaves what the first left)
_GROWS = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "reverse", "appendleft",
                    "extendleft", "popleft", "rotate"})


def _reload_notes(cells: list, row: list, folder: Optional[Path], parsed: dict) -> list:
    """The notes for each module of the user's (NAME.py in the notebook's ``folder``) that a row
    cell reloads (``importlib.reload(helpers)``: ``notes_modules._row_reloads``) whose top level
    changes another module of the user's so that running it twice leaves another value than once
    (``_carried_changes``): not where the row sets that attribute (``counter.n = 0``) or reloads
    that module above the reload. ``parsed``: ``notes_modules._parsed``'s."""
    import ast

    if folder is None:
        return []
    modules, statements = _row_reloads(cells, row)
    done, fresh, notes = set(), set(), []  # (fresh: (module, attribute) the row sets above, (module, None) reloads)
    for c, stmt, module in statements:
        if module is None:  # (a value of its own, not one made from the module's: counter.n = counter.n + 1)
            if isinstance(stmt, ast.Assign) and not any(isinstance(n, (ast.Name, ast.Attribute))
                                                        and ast.unparse(n) in modules for n in ast.walk(stmt.value)):
                fresh |= {(modules[ast.unparse(t.value)], t.attr) for t in stmt.targets
                          if isinstance(t, ast.Attribute) and ast.unparse(t.value) in modules}
            continue
        path = _module_file(folder, module)
        if path is not None and module not in done:
            done.add(module)
            changed: dict = {}  # (other module → ("counter.n", "line 2, `counter.n += 1`") for each attribute)
            for (other, attr), change in _carried_changes(path, folder, parsed).items():
                if (other, None) not in fresh and (other, attr) not in fresh:
                    changed.setdefault(other, []).append((f"{other}.{attr}",
                                                          f"line {change.lineno}, `{ast.unparse(change)}`"))
            for other, found in changed.items():
                it, attrs = ("it", found[0][0]) if len(found) == 1 else ("them", "them")
                notes.append(
                    f"cell {c.index}: `{ast.unparse(stmt)}` runs the top level of {module} "
                    f"({path.relative_to(folder).as_posix()}, beside the notebook) again each row, which changes "
                    f"{' and '.join(f'{name} ({where})' for name, where in found)} of {_module_file(folder, other).relative_to(folder).as_posix()}: the job "
                    f"imports {other} once, so each row's reload changes {it} again (what one row's reload left, the "
                    "next row's changes further), where each pass of the notebook imports it anew, and rows running "
                    f"at once (--num-threads above 1) share it; set {attrs} back in the row above the reload, or "
                    f"reload {other} there too, above it (`importlib.reload({other})`)")
        fresh.add((module, None))
    return notes


def _carried_changes(path: Path, folder: Path, parsed: dict) -> dict:
    """(module, attribute) → the statement that first changes it, for each attribute of another
    module of the user's (``import counter``, ``as c`` too, ``from pkg import counter``; or a name
    ``from counter import seen`` binds) that the top level of the module file ``path`` (its
    statements under an if, a loop, a with or a try too, not in a function or a class) changes so
    that running it again changes it again: by ``counter.n += 1``, ``counter.n = counter.n + 1``,
    ``counter.seen.append(x)`` (``_GROWS``) or ``counter.d[k] += 1``, of a value that does not
    come from the run itself (not after ``counter.n = 0`` above: ``counter.n = 5`` alone is the
    same each run)."""
    import ast

    tree = _parsed(path, parsed)
    aliases: dict = {}  # (what names another module there, "counter" or "pkg.counter" → its dotted name)
    names: dict = {}  # (a name a from-import binds → (module, its name there))
    # (key → the (module, attribute) keys whose values at the run's start it depends on, and "+" where the
    # run changes what it got from them: n → {n, "+"} after `counter.n += 1`)
    depends: dict = {}
    first: dict = {}

    def key(node):  # (the (module, attribute) an expression is, or holds: counter.n, counter.d[k], seen)
        while True:
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in aliases:
                return aliases[ast.unparse(node.value)], node.attr
            if isinstance(node, ast.Name) and node.id in names:
                return names[node.id]
            if not isinstance(node, (ast.Attribute, ast.Subscript)):
                return None
            node = node.value

    def reads(node) -> set:  # (what an expression's value depends on, at the run's start)
        found = {k for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name)) and isinstance(n.ctx, ast.Load)
                 and (k := key(n)) is not None and (not isinstance(n, ast.Attribute) or k[1] == n.attr)}
        return set().union(*(depends.get(k, {k}) for k in found)) - {"+"}

    def change(k, stmt, got: set, grows: bool, whole: bool = False):
        before = set() if whole else depends.get(k, {k})
        depends[k] = before | got | ({"+"} if grows and (before or got) else set())
        if whole:
            first[k] = stmt
        first.setdefault(k, stmt)

    for stmt in _top_level(tree.body if tree is not None else []):
        if isinstance(stmt, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in stmt.names
                            if _module_file(folder, a.name) not in (None, path)})
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            for a in stmt.names:
                if _module_file(folder, f"{stmt.module}.{a.name}") not in (None, path):
                    aliases[a.asname or a.name] = f"{stmt.module}.{a.name}"
                elif a.name != "*" and _module_file(folder, stmt.module) not in (None, path):
                    names[a.asname or a.name] = (stmt.module, a.name)
            continue
        for node in (n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            if (k := key(node.func.value)) is not None:
                got = set().union(*map(reads, [*node.args, *(w.value for w in node.keywords)]))
                change(k, stmt, got, node.func.attr in _GROWS)
        # (`seen += [x]` of a from-import's list changes the list; of a number, it binds the module's own seen)
        in_place = isinstance(stmt, ast.AugAssign) and (k := key(stmt.target)) is not None and (
            not isinstance(stmt.target, ast.Name) or k[1] in _containers(_parsed(_module_file(folder, k[0]), parsed)))
        if in_place:
            change(k, stmt, reads(stmt.value), True)
        for target in stmt.targets if isinstance(stmt, ast.Assign) else []:
            if isinstance(target, ast.Name) or (k := key(target)) is None:
                continue
            got = reads(stmt.value)
            whole = ast.unparse(target.value) in aliases
            # (a value made from what the run started with, not that value itself: counter.n = counter.n + 1)
            made = not isinstance(stmt.value, (ast.Name, ast.Attribute)) and (whole or k in got)
            change(k, stmt, got, made, whole)
        for name in bound_by(stmt) if not in_place else []:  # (a name bound again is the module's own: seen = [])
            aliases.pop(name, None)
            names.pop(name, None)
    carried = {k for k, on in depends.items() if "+" in on and k in on}
    grew = True
    while grew:  # (and what is set from such a value: counter.m = counter.n, of a counter.n += 1)
        more = {k for k, on in depends.items() if on & carried}
        grew, carried = not more <= carried, carried | more
    return {k: first[k] for k in first if k in carried}


def _top_level(body: list):
    """The simple statements that running ``body`` (a module's) runs, in order: also those under an if,
    a loop, a with or a try, not those in a function or a class."""
    import ast

    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        inner = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
        inner += [h.body for h in getattr(stmt, "handlers", [])]
        if any(inner):
            for block in inner:
                yield from _top_level(block)
        else:
            yield stmt
