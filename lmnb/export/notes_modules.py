"""The export's notes on state that modules keep, which the job imports once and so carries over from
row to row where each pass of the notebook starts afresh: a module's global random number
generator that a set-up cell seeds and the rows draw from, and the globals of a module of the
user's (a file beside the notebook) that the functions the rows call change."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional

from lmnb.export.cells import _CONTAINER_CHANGES, Code, LMCell, _mutated, bound_by, class_attribute_changes
from lmnb.export.notes_defaults import _changed_defaults, _leaves_out, _made_once
from lmnb.export.notes_objects import _ITERATOR_CALLS, _unaliased
from lmnb.export.notes_wording import _OWN_STATE
from lmnb.export.read_only import _ITERATING_BUILTINS, _read_only_methods, _result_changed
from lmnb.export.syntax import _as_attributes, _cell_binds, _function_locals, _own_nodes, _row_trees, _statements


# The module-level seeding calls of the standard library's and numpy's global random number generators
_SEEDS = {"random.seed": "random", "np.random.seed": "np.random", "numpy.random.seed": "numpy.random"}
# What those modules make a generator of its own with, which draws nothing from the module's seeded
# one (``random.Random(1)``, ``np.random.default_rng(1)``: the same in the job as in the notebook)
_OWN_GENERATORS = frozenset({"Random", "SystemRandom", "default_rng", "RandomState", "Generator", "SeedSequence",
                             "BitGenerator", "MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64"})
# ... and what sets the module's generator to a state (as seed does: a row that calls it starts from
# that state), or reads its state without drawing
_RESEEDS = frozenset({"seed", "setstate", "set_state"})
_STATE_READS = frozenset({"getstate", "get_state"})


def _seeded_module_notes(setup: list, row: list, called: list, defs: dict) -> list:
    """The notes for a module's global random number generator that a set-up cell seeds at top level
    (``random.seed(0)``, ``np.random.seed(0)``: ``_SEEDS``) and the row cells, or the set-up
    functions they call (``called``), draw from (``random.choice(xs)``), where no row cell seeds it
    again: the job seeds it once, so each row draws on from the last row's draws, where each pass of
    the notebook starts from the seed. ``defs``: the set-up functions' definitions (``_made_objects``')."""
    import ast

    seeded: dict = {}
    for c, stmt in _statements(setup):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) in _SEEDS:
            seeded[_SEEDS[ast.unparse(stmt.value.func)]] = (c.index, ast.unparse(stmt.value))
    draws: dict = {}
    for where, tree in _row_trees(row) + [(f"{f[1]}(), a function of cell {f[0]}", defs[f[0], f[1]]) for f in called
                                if (f[0], f[1]) in defs]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) in seeded:
                module = ast.unparse(node.func.value)
                if node.func.attr in _RESEEDS and where.startswith("cell"):
                    draws[module] = None  # (a row cell seeds it again: each row starts from its seed)
                elif node.func.attr not in _RESEEDS | _OWN_GENERATORS | _STATE_READS and module not in draws:
                    draws[module] = f"`{ast.unparse(node)}` in {where}"
    return [f"cell {seeded[m][0]}: {seeded[m][1]} seeds {m}'s generator once, and the rows draw from it ({use}): "
            "each row draws on from the last row's draws, where each pass of the notebook starts from the seed; "
            f"seed it in a cell that runs per row (after the first %%lm cell), and rows running at once "
            "(--num-threads above 1) share it"
            for m, use in draws.items() if use is not None]


def _local_module_state(cells: list, row: list, called: list, folder: Optional[Path], defs: dict,
                        parsed: Optional[dict] = None) -> list:
    """The notes for the functions of a module of the user's (NAME.py in the notebook's ``folder``)
    that a cell star-imports or from-imports (``from helpers import remember``, ``as rem`` too, a
    package's module too: ``from pkg.helpers import remember``, pkg/helpers.py) and the row cells
    call by name, or imports (``import helpers``, ``as h`` too, ``import pkg.helpers``) and they call
    as its attribute (``helpers.remember(x)``, ``pkg.helpers.remember(x)``), or the set-up functions they call
    (``called``: ``_called``; ``defs``: their definitions, ``_made_objects``') do so, which change
    the module's own globals: one they set by ``global``, or a dict, list or set the module makes
    and they change in place (``seen.append(x)``); and the methods of a class of the module that
    they call as its attribute (``Cache.add(x)``, ``helpers.Cache.add(x)``) which change the class's
    own attributes (``cls.store.append(x)``). The job imports the module once, so that state
    carries over from row to row, where each pass of the notebook imports it anew. The module's
    source is read, once an export, not run."""
    import ast

    if folder is None:
        return []
    bound = set().union(*map(_cell_binds, cells))  # (a cell's own function of that name is not the module's)
    # (but the name a from-import binds is the module's function, where nothing else binds it)
    defined = {n for _, stmt in _statements(cells) if not isinstance(stmt, (ast.Import, ast.ImportFrom))
               for n in bound_by(stmt)}
    used = {n for c in row if isinstance(c, (Code, LMCell)) for n in (c.uses if isinstance(c, Code) else c.reads)}
    used |= {n for f in called for n in f[2]}  # (`def use(x): return remember(x)` of a set-up cell, which the rows call)
    # (where → its tree: the row cells, "cell 3", and the set-up functions they call, "use(), a function of cell 1")
    row_placed = _row_trees(row)
    placed = row_placed + [(f"{f[1]}(), a function of cell {f[0]}", defs[f[0], f[1]]) for f in called
                           if (f[0], f[1]) in defs]
    trees = [tree for _, tree in placed]
    # (alias → the module's functions that the rows call as its attributes: helpers.remember(x), and
    # pkg.helpers.remember(x) of `import pkg.helpers`, whose alias is the dotted name)
    attributes: dict = {}
    for node in (n for tree in trees for n in ast.walk(tree)):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and _dotted(func.value):
            attributes.setdefault(ast.unparse(func.value), set()).add(func.attr)
    reloaded = _reloaded_modules(cells, row)
    row_bound = set().union(*map(_cell_binds, row))
    # (the functions the rows may pass an instance to, by name → (where, def): a row cell's, or a set-up one they call
    # that no row cell binds again)
    functions = {f[1]: (f"{f[1]}(), a function of cell {f[0]}", defs[f[0], f[1]]) for f in called
                 if (f[0], f[1]) in defs and f[1] not in row_bound}
    functions.update({f.name: (f"{where}, in its {f.name}()", f) for where, tree in row_placed
                      for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))})
    nodes = [n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Call)]  # (the calls, for defaults)
    setup_statements = [stmt for _, stmt in _statements([c for c in cells if c not in row])]
    walks: dict = {}  # (_walked's, for each tree)
    notes, read = [], {}  # (read: path → _module_state of its source)
    parsed = {} if parsed is None else parsed  # (module file → its syntax tree: _parsed)
    for c in cells:
        if not isinstance(c, Code):
            continue
        body = ast.parse(c.source).body
        # ((module, alias, the names a from-import binds → the module's names, the import that binds the alias): a
        # star import's alias is None, an import's names None)
        imported = [(module, None, None, None) for module in c.star_imports] + [
            (a.name, a.asname or a.name, None, f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
            for stmt in body if isinstance(stmt, ast.Import) for a in stmt.names] + [
            (stmt.module, None, {a.asname or a.name: a.name for a in stmt.names}, None) for stmt in body
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module
            and stmt.names[0].name != "*"]
        # (`from pkg import helpers` of pkg/helpers.py: the module, as `import pkg.helpers as helpers` gives it)
        imported += [(f"{module}.{original}", local, None,
                      f"from {module} import {original}" + (f" as {local}" if local != original else ""))
                     for module, _, names, _ in list(imported) if names for local, original in names.items()
                     if _module_file(folder, f"{module}.{original}") is not None
                     and not _defines(_module_file(folder, module), original, parsed)]
        for module, alias, names, statement in imported:
            path = _module_file(folder, module)
            if path is None:  # (no such file: a module installed, whose state is its own)
                continue
            changes, exported = _module_state(path, folder, read, parsed)
            file = path.relative_to(folder).as_posix()  # (pkg/helpers.py of `from pkg.helpers import f`)
            for name, state in changes.items():
                owner = name.rpartition(".")[0]  # (a class's method: "Cache.add" of Cache)
                # (a row's reload runs the module again in its own globals, which its functions read, and makes its
                # classes anew: helpers.Cache is the new one, where a from-import's Cache stays the one made first)
                # (but not what it imports from another module of the user's, "seen (store.py)", which the reload
                # imports again as it is)
                if module in reloaded and (not owner or alias is not None):
                    state = [s for s in state if s.endswith(")")]
                    if not state:
                        continue
                local = next((n for n, original in (names or {}).items() if original == (owner or name)), None)
                kind = "class attribute" + ("s" if len(state) > 1 else "") if owner else "globals"
                if owner:  # (called as the class's attribute: Cache.add(q); not where a cell binds its own Cache)
                    given = names is not None or alias is not None or (owner in exported and owner not in bound)
                    what = _class_method_call(name, module, file, local, alias, names, attributes, statement) \
                        if given and local not in defined else None
                elif names is not None and local in used and local not in defined:
                    shown = name if local == name else f"{name} as {local}"
                    what = f"{local}, which `from {module} import {shown}` gives ({file}, beside the notebook) and"
                elif names is None and alias is None and name in used and name in exported and name not in bound:
                    what = f"{name}, which `from {module} import *` gives ({file}, beside the notebook) and"
                elif alias is not None and name in attributes.get(alias, ()):
                    what = f"{alias}.{name}, of `{statement}` ({file}, beside the notebook), which"
                else:
                    what = None
                if what is not None:
                    notes.append(f"cell {c.index}: {what} the rows call, changes the module's own {kind} "
                                 f"{', '.join(state)}: the job imports the module once, so that carries over from row "
                                 "to row (what one row changes, the next row sees), where each pass of the notebook "
                                 f"imports it anew, and rows running at once (--num-threads above 1) share it; "
                                 f"{_OWN_STATE}")
            for name, found in _module_defaults(path, parsed).items():
                local = next((n for n, original in (names or {}).items() if original == name), None)
                # (a row's reload runs the def again, with a new default: helpers.remember is the new function, and so
                # is remember where a row cell imports it again; a from-import's remember is still the first)
                if module in reloaded and (alias is not None or local in row_bound):
                    continue
                if names is not None and local is not None and local not in defined:
                    shown = name if local == name else f"{name} as {local}"
                    what = f"{local}, which `from {module} import {shown}` gives ({file}, beside the notebook) and"
                    calls = [n for n in nodes if isinstance(n.func, ast.Name) and n.func.id == local]
                elif names is None and alias is None and name in exported and name not in bound:
                    what = f"{name}, which `from {module} import *` gives ({file}, beside the notebook) and"
                    calls = [n for n in nodes if isinstance(n.func, ast.Name) and n.func.id == name]
                elif alias is not None:
                    what = f"{alias}.{name}, of `{statement}` ({file}, beside the notebook), which"
                    calls = [n for n in nodes if isinstance(n.func, ast.Attribute) and n.func.attr == name
                             and ast.unparse(n.func.value) == alias]
                else:
                    continue
                left = [(p, d) for i, p, d in found if any(_leaves_out(call, i, p) for call in calls)]
                if left:
                    it = "it" if len(left) == 1 else "them"
                    notes.append(f"cell {c.index}: {what} the rows call, changes in place its default"
                                 f"{'s' * (len(left) > 1)} {', '.join(p for p, _ in left)}, which the def makes once "
                                 f"(a call that leaves {it} out gets that one): the job imports the module once, so "
                                 "what one row changes, the next row sees, where each pass of the notebook imports it "
                                 "anew, and rows running at once (--num-threads above 1) share it; default it to None "
                                 f"and make a new one in the function (`if {left[0][0]} is None: {left[0][0]} = "
                                 f"{left[0][1]}`)")
            # (its instances, and its iterators, which the rows change by running through them: next(_it))
            tree = _parsed(path, parsed)
            made = [*(_module_instances(tree).items() if tree is not None else ()),
                    *((name, (None, _ITERATES)) for name in (_module_iterators(tree) if tree is not None else ()))]
            for name, (cls, read_only) in made:
                local = next((n for n, original in (names or {}).items() if original == name), None)
                if names is not None and local is not None and local not in defined:
                    shown = name if local == name else f"{name} as {local}"
                    caller, what = local, f"{local}, which `from {module} import {shown}` gives"
                else:
                    reached = _reached_from_module(name, module, statement, alias, names, exported, bound, reloaded)
                    if reached is None:
                        continue
                    caller, what = reached
                # (its class as the same import gives it, for `C.bump(_c)`)
                named = f"{alias}.{cls}" if alias is not None else next(
                    (n for n, original in names.items() if original == cls and n not in defined), None) \
                    if names is not None else cls if cls in exported and cls not in bound else None
                change = _instance_change(placed, len(row_placed), caller, read_only, named,
                                          _setup_aliases(setup_statements, caller), row_bound, functions, walks)
                if change is not None:
                    notes.append(_made_once_note(c.index, what, file, f"an instance of {cls}" if cls else "an iterator",
                                                 change))
            # (a dict, list or set it makes, which the rows change as the module's attribute, helpers.seen.append(q), or
            # as a star import's name: not a from-import's, which is a set-up variable that the job copies per row)
            for name, container in _containers(tree).items() if tree is not None else ():
                reached = _reached_from_module(name, module, statement, alias, names, exported, bound, reloaded)
                if reached is None:
                    continue
                caller, what = reached
                change = _instance_change(placed, len(row_placed), caller, None, None, {}, row_bound, functions,
                                          walks)
                if change is not None:
                    notes.append(_made_once_note(c.index, what, file, f"a {container}", change))
    return notes


def _reached_from_module(name: str, module: str, statement: str, alias, names, exported, bound,
                         reloaded) -> Optional[tuple[str, str]]:
    """How the rows reach ``name``, an object the module ``module`` makes once at its top level, other
    than by a from-import: ``(what they write, the note's words for it)`` for the module's attribute
    of ``statement`` (``helpers._c`` of ``import helpers``, ``alias`` its name; not where a row
    reloads the module, which makes it anew) or a star import's name (``names`` and ``alias`` None,
    ``name`` in ``exported`` and not ``bound`` by the notebook; a reload leaves it the first, as a
    from-import's); None where they do neither."""
    if alias is not None and module not in reloaded:
        return f"{alias}.{name}", f"{alias}.{name}, of `{statement}`"
    if names is None and alias is None and name in exported and name not in bound:
        return name, f"{name}, which `from {module} import *` gives"
    return None


def _made_once_note(cell: int, what: str, file: str, kind: str, change: str) -> str:
    """The note for an object (``kind``: "an instance of C", "a list") that a module of the user's
    (``file``) makes at its top level, which the import of ``cell`` gives (``what``), and the rows
    change (``change``: ``_instance_change``'s)."""
    return (f"cell {cell}: {what} ({file}, beside the notebook), {kind} that the module makes once at its top "
            f"level, is changed by the rows ({change}): the job imports the module once, so what one row changes, "
            "the next row sees, where each pass of the notebook imports it anew, and rows running at once "
            f"(--num-threads above 1) share it; {_OWN_STATE}")


# (``_changes``' read_only for an iterator, which a run through it changes)
_ITERATES = object()


def _changes(node, caller: str, read_only, cls: Optional[str] = None) -> bool:
    """Whether ``node`` (of a syntax tree) changes the object that the expression ``caller``
    ("_c", "helpers._c") gives by calling a method of it that is none of ``read_only``
    (``_c.bump()``, or ``C.bump(_c)`` where ``cls`` is how its class is named there, "C"), by
    setting or deleting an attribute of it (``_c.n = 1``, ``_c.n += 1``), or by changing in place
    what an attribute of it holds: a dict's, list's or set's change (``_c.items.append(x)``,
    ``_c.rows[0].append(x)``), an item or an attribute set or deleted (``_c.seen[k] = 1``).
    ``read_only`` None: the object is a dict, list or set, which such a change of its own, or of
    an item, changes (``helpers.seen.append(x)``, ``helpers.seen[k] = 1``); ``_ITERATES``: an
    iterator, which a run through it changes (``_consumes``). An attribute named by a constant
    string is that attribute (``setattr(_c, 'n', 1)``, ``getattr(h, 'seen').append(x)``,
    ``vars(h)['seen']``: ``_as_attributes``)."""
    import ast

    if read_only is _ITERATES:
        return _consumes(node, caller)
    node = _as_attributes(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        of = ast.unparse(node.func.value)
        if read_only is not None and (of == caller or cls is not None and of == cls and node.args
                                      and ast.unparse(node.args[0]) == caller):
            return node.func.attr not in read_only
        return node.func.attr in _CONTAINER_CHANGES and (of == caller or _within(node.func.value, caller))
    if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
        if ast.unparse(node.value) == caller:  # (an instance's attribute; a dict's, list's or set's item)
            return isinstance(node, ast.Attribute if read_only is not None else ast.Subscript)
        return _within(node.value, caller)
    return False


def _consumes(node, caller: str) -> bool:
    """Whether ``node`` (of a syntax tree) runs through the iterator that the expression ``caller``
    gives: ``next(_it)``, a builtin that iterates it (``list(_it)``: ``_ITERATING_BUILTINS``), or
    a ``for`` loop or a comprehension over it."""
    import ast

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
            and node.func.id in {"next", *_ITERATING_BUILTINS}:
        return ast.unparse(node.args[0]) == caller
    return isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and ast.unparse(node.iter) == caller


def _within(node, caller: str) -> bool:
    """Whether the expression ``node`` is an attribute of what ``caller`` gives, or an item of one,
    all the way down (``_c.items``, ``_c.rows[0]``, ``_c.a.b``: the same objects that it holds,
    not a slice's copy, ``_c.items[:]``; ``getattr(_c, 'items')`` too: ``_as_attributes``)."""
    import ast

    node = _as_attributes(node)
    while isinstance(node, ast.Attribute) or isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        node = node.value
        if ast.unparse(node) == caller:
            return True
    return False


def _setup_aliases(statements: list, caller: str) -> dict:
    """Name → what it stands for ("_c", "_c.bump"), for each name that the set-up cells' top-level
    ``statements`` (in order) bind last to the instance that the expression
    ``caller`` gives (``k = _c``) or to an attribute of it (``f = _c.bump``), which the rows then
    only call (``f()``: a row's copy of a list such a name holds, ``Job.row_copy``'s, changes
    nothing of the instance)."""
    import ast

    out: dict = {}

    def gives(node) -> str:  # (what node gives, a name bound above to the instance read as caller)
        return caller if isinstance(node, ast.Name) and out.get(node.id) == caller else ast.unparse(node)

    for stmt in statements:
        for name in bound_by(stmt):
            out.pop(name, None)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            if gives(stmt.value) == caller:
                out[stmt.targets[0].id] = caller
            elif isinstance(stmt.value, ast.Attribute) and gives(stmt.value.value) == caller:
                out[stmt.targets[0].id] = f"{caller}.{stmt.value.attr}"
    return out


def _instance_change(placed: list, rows: int, caller: str, read_only, cls: Optional[str], given: dict,
                     row_bound: set, functions: Optional[dict] = None, walks: Optional[dict] = None) -> Optional[str]:
    """"`c.bump()` in cell 3, c being `helpers._c`": the first change (``_changes``) of the instance
    that the expression ``caller`` gives, of class ``cls`` as the rows name it, in ``placed``
    (``_local_module_state``'s (where, tree): the first ``rows`` of them the row cells, then the
    set-up functions they call), itself or through a name they bind once to it or to what it holds
    (``_bound_to``: a row cell's name is the later row cells' too), or a name of the set-up's that
    they do not bind (``given``: ``_setup_aliases``; one bound to an attribute, only where they
    call it), or in a function of ``functions`` (name → (where, its ``def``)) that they pass it to
    (``use(_c)`` of ``def use(x): x.bump()``: ``_passed_change``); None where there is none.
    ``walks``: ``_walked``'s, kept from call to call."""
    import ast

    walks = {} if walks is None else walks
    rows_bound = _bound_to([tree for _, tree in placed[:rows]], caller, walks)
    for i, (where, tree) in enumerate(placed):
        own, binds = rows_bound if i < rows else _bound_to([tree], caller, walks)
        # (name → (what it stands for, whether that is the instance itself))
        setup = {n: (ast.parse(v, mode="eval").body, v == caller) for n, v in given.items()
                 if n not in binds and n not in row_bound}
        for node in _walked(tree, walks)[0]:
            called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            aliases = {**{n: v for n, (v, whole) in setup.items() if whole or n == called}, **own}
            resolved, alias = _unaliased(node, aliases) if aliases else (node, None)
            being = f", {alias} being `{ast.unparse(aliases[alias])}`" if alias is not None else ""
            if _changes(resolved, caller, read_only, cls):
                return f"`{ast.unparse(node)}` in {where}{being}"
            # (a read-only method that passes out an item of an attribute, `return self.rows[0]`, which the row
            # changes in place: _c.first().append(q), or x = _c.first(); x.append(q))
            if isinstance(read_only, dict) and isinstance(resolved, ast.Call) \
                    and isinstance(resolved.func, ast.Attribute) and ast.unparse(resolved.func.value) == caller \
                    and read_only.get(resolved.func.attr):
                parents = {child: n for n in ast.walk(tree) for child in ast.iter_child_nodes(n)}
                defs = {name: d for name, (_, d) in (functions or {}).items()}
                if changing := _result_changed(node, tree, parents, defs):
                    return f"`{changing}` in {where}, changing what {ast.unparse(node)} passes out{being}"
            if called in (functions or {}) and (change := _passed_change(resolved, *functions[called], caller,
                                                                          read_only, cls)):
                return f"{change}, passed by `{ast.unparse(node)}` in {where}"
    return None


def _passed_change(call, where: str, function, caller: str, read_only, cls: Optional[str]) -> Optional[str]:
    """"`x.bump()` in use(), a function of cell 1, x being `_c`": the first change (``_changes``)
    that ``function`` (its ``def``, at ``where``) makes to the instance that the expression
    ``caller`` gives, which ``call`` (its names read as what they stand for) passes it, through the
    parameter that takes it (by position or by name; not a parameter the function binds again);
    None where there is none."""
    import ast

    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    passed = {**dict(zip(params, call.args)), **{k.arg: k.value for k in call.keywords if k.arg in params}}
    bindings = [n.id if isinstance(n, ast.Name) else n.arg for n in ast.walk(function)
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) or isinstance(n, ast.arg)]
    for param, arg in passed.items():
        if ast.unparse(arg) != caller or bindings.count(param) != 1:  # (bound again: which value is not known)
            continue
        for node in ast.walk(function):
            resolved, alias = _unaliased(node, {param: arg})
            if alias is not None and _changes(resolved, caller, read_only, cls):
                return f"`{ast.unparse(node)}` in {where}, {param} being `{caller}`"
    return None


def _bound_to(trees: list, caller: str, walks: dict) -> tuple[dict, set]:
    """(name → the expression it stands for, for each name that ``trees`` bind once, by an
    assignment to it alone, to the instance that the expression ``caller`` gives or to what it
    holds, ``_within``'s, also through such a name bound above: ``c = helpers._c``, ``items =
    c.items`` (items: ``helpers._c.items``); the names they bind at all, parameters too).
    ``walks``: ``_walked``'s."""
    import ast

    counts: dict = {}
    for tree in trees:
        for name, n in _walked(tree, walks)[1].items():
            counts[name] = counts.get(name, 0) + n
    found: dict = {}
    for node in (n for tree in trees for n in _walked(tree, walks)[2]):
        if counts.get(node.targets[0].id) == 1:
            value = _unaliased(node.value, found)[0] if found else node.value
            if ast.unparse(value) == caller or _within(value, caller):
                found[node.targets[0].id] = value
    return found, set(counts)


def _walked(tree, walks: dict) -> tuple:
    """(the nodes of the syntax ``tree`` that may change an object, ``_changes``': calls, attributes
    and items set or deleted, loops and comprehensions; name → how many times it binds the name,
    parameters too; its assignments of a name alone to a name, an attribute or an item, in order),
    for ``tree`` walked once: ``walks`` (id of a tree → this) keeps it."""
    import ast

    if id(tree) not in walks:
        nodes = list(ast.walk(tree))
        counts: dict = {}
        for node in nodes:
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) or isinstance(node, ast.arg):
                name = node.id if isinstance(node, ast.Name) else node.arg
                counts[name] = counts.get(name, 0) + 1
        walks[id(tree)] = (
            [n for n in nodes if isinstance(n, (ast.Call, ast.For, ast.AsyncFor, ast.comprehension))
             or isinstance(n, (ast.Attribute, ast.Subscript)) and not isinstance(n.ctx, ast.Load)],
            counts,
            sorted((n for n in nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and isinstance(n.value, (ast.Name, ast.Attribute, ast.Subscript))),
                   key=lambda n: (n.lineno, n.col_offset)))
    return walks[id(tree)]


def _module_defaults(path: Path, parsed: dict) -> dict:
    """(function name → ``notes_defaults._changed_defaults`` of it: (position, name, default source))
    for the top-level functions of the module file ``path`` with a dict, list or set default that
    they change in place (``def remember(x, acc=[])``), where no later statement binds the name
    again; {} for a file that does not parse. ``parsed``: ``_parsed``'s."""
    import ast

    tree = _parsed(path, parsed)
    out: dict = {}
    for stmt in tree.body if tree is not None else []:
        for name in bound_by(stmt):
            out.pop(name, None)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and (found := _changed_defaults(stmt)):
            out[stmt.name] = [(i, p, ast.unparse(d)) for i, p, d in found]
    return out


def _module_file(folder: Path, module: str, within: Optional[Path] = None) -> Optional[Path]:
    """The file of the user's module ``module`` (a dotted name) beside the notebook in ``folder``
    (or, for a relative import's, in the package folder ``within``): NAME.py, or a package's
    NAME/__init__.py; None where there is neither (a module installed)."""
    base = Path(within or folder, *module.split(".")) if module else Path(within or folder)
    for path in (base.with_suffix(".py") if module else None, base / "__init__.py"):
        if path is not None and path.is_file():
            return path
    return None


def _parsed(path: Path, parsed: dict):
    """The syntax tree of the module file ``path``, or None where it cannot be read or parsed (nested
    past what Python's parser takes, RecursionError: no import can run it either); ``parsed`` (path →
    tree) holds each file read, so that an export reads it once."""
    import ast

    if path not in parsed:
        try:
            parsed[path] = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, SyntaxError, RecursionError, MemoryError):
            parsed[path] = None
    return parsed[path]


def _defines(path: Optional[Path], name: str, parsed: dict) -> bool:
    """Whether the module file ``path`` binds ``name`` at its top level other than by an import (a
    package's pkg/__init__.py whose ``helpers`` is no module: `from pkg import helpers` gives that)."""
    import ast

    tree = _parsed(path, parsed) if path is not None else None
    return tree is not None and any(name in bound_by(stmt) for stmt in tree.body
                                    if not isinstance(stmt, (ast.Import, ast.ImportFrom)))


def _module_state(path: Path, folder: Path, read: dict, parsed: dict, seen: tuple = ()) -> tuple[dict, set]:
    """``_stateful_functions`` of the module file ``path`` (read and parsed once an export: ``read``,
    path → its result), with what it imports from another module of the user's and so gives as its
    own (``from .helpers import remember`` in pkg/api.py, or in pkg/__init__.py): that module's
    state for those names, each shown with its file ("seen (pkg/helpers.py)"), and the dicts, lists
    and sets of a module of the user's that it imports (``import store``), which its functions
    change as its attributes (``store.seen.append(x)``). ({}, set()) for a file that does not parse."""
    import ast

    if path in read:
        return read[path]
    read[path] = ({}, set())  # (a module that imports itself, or one that imports it: read once)
    tree = _parsed(path, parsed)
    if tree is None:
        return read[path]
    last = {name: i for i, stmt in enumerate(tree.body) for name in bound_by(stmt)}  # (what binds a name last)
    sources = []  # ((statement's index, statement, file) of each from-import of another module of the user's)
    for i, stmt in enumerate(tree.body):
        if not (isinstance(stmt, ast.ImportFrom) and stmt.names[0].name != "*"):
            continue
        if stmt.level > len(path.relative_to(folder).parents) - 1:  # (above the notebook's folder)
            continue
        within = path.parents[stmt.level - 1] if stmt.level else None
        source = _module_file(folder, stmt.module or "", within) if stmt.module or stmt.level else None
        if source is not None:
            sources.append((i, stmt, source))
    # (a dict, list or set that such a module makes at its top level and this one imports by name, `from store
    # import seen`: the same object, which this module's functions change)
    shared = {a.asname or a.name: f"{a.name} ({source.relative_to(folder).as_posix()})" for i, stmt, source in sources
              for a in stmt.names if last.get(a.asname or a.name) == i and a.name in _containers(_parsed(source, parsed))}
    # (and one such a module makes that this one reaches as its attribute, "store.seen" of `import store`, which
    # its functions change so: store.seen.append(x))
    shared.update({f"{a.asname or a.name}.{name}": f"{name} ({source.relative_to(folder).as_posix()})"
                   for i, stmt in enumerate(tree.body) if isinstance(stmt, ast.Import) for a in stmt.names
                   if last.get(a.asname or a.name.partition(".")[0]) == i
                   and (source := _module_file(folder, a.name)) is not None
                   for name in _containers(_parsed(source, parsed))})
    changes, exported = _stateful_functions(tree, shared)
    for i, stmt, source in sources:
        if source in seen:
            continue
        theirs, _ = _module_state(source, folder, read, parsed, (*seen, path))
        shown = source.relative_to(folder).as_posix()
        for a in (a for a in stmt.names if last.get(a.asname or a.name) == i):
            local = a.asname or a.name
            changes = {n: state for n, state in changes.items() if n.partition(".")[0] != local}
            for name, state in theirs.items():
                owner, _, method = name.rpartition(".")
                if (owner or name) == a.name:  # (state shown with its file already keeps it)
                    changes[f"{local}.{method}" if owner else local] = [
                        s if s.endswith(")") else f"{s} ({shown})" for s in state]
    read[path] = (changes, exported)
    return read[path]


def _module_classes(setup: list, folder: Optional[Path], parsed: dict) -> dict:
    """The classes of the user's modules (files in the notebook's ``folder``) that the set-up
    cells' top-level imports bind, as a set-up cell calls them to make an instance (``Cache`` of
    ``from helpers import Cache``, ``helpers.Cache`` of ``import helpers``) → the methods that
    change nothing of their instance (``read_only._read_only_methods`` of the module's source),
    for the classes with no base but ``object`` (where the methods are all known); where a later
    statement binds the name again, it is left out. ``parsed``: ``_parsed``'s."""
    import ast

    out: dict = {}
    read: dict = {}  # (path → its classes' read-only methods)

    def classes(module: str) -> dict:
        path = _module_file(folder, module) if folder is not None else None
        if path is not None and path not in read:
            tree = _parsed(path, parsed)
            read[path] = _read_only_methods([Code(0, ast.unparse(tree))]) if tree is not None else {}
        return read.get(path, {})

    for _, stmt in _statements(setup):
        for name in bound_by(stmt):
            out = {n: m for n, m in out.items() if n != name and not n.startswith(name + ".")}
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            found = classes(stmt.module)
            out.update({a.asname or a.name: found[a.name] for a in stmt.names if a.name in found})
            if stmt.names[0].name == "*" and found:  # (the classes it gives: _stateful_functions' names)
                given = _stateful_functions(_parsed(_module_file(folder, stmt.module), parsed))[1]
                out.update({name: methods for name, methods in found.items() if name in given})
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                out.update({f"{a.asname or a.name}.{cls}": methods for cls, methods in classes(a.name).items()})
    return out


def _reloaded_modules(cells: list, row: list) -> set:
    """The modules (by their dotted names) that a row cell reloads by a statement of its top level
    (``_row_reloads``): each row runs the module again, which sets its globals back, so that what
    one row changed, the next does not see."""
    return {module for _, _, module in _row_reloads(cells, row)[1] if module is not None}


def _row_reloads(cells: list, row: list) -> tuple[dict, list]:
    """(name → the dotted name of the module it is, for each name that a cell's top-level ``import
    helpers``, ``import helpers as h`` or ``from pkg import helpers`` binds; (cell, statement, the
    module it reloads or None) for each top-level statement of the row cells, in order), where a
    statement reloads a module by ``importlib.reload(helpers)`` or ``helpers = reload(helpers)`` (of
    ``from importlib import reload``): not one under an if or a loop, which may skip it in some rows."""
    import ast

    modules, reloads = {}, {"importlib.reload"}
    for _, stmt in _statements(cells):
        if isinstance(stmt, ast.Import):
            modules.update({a.asname or a.name: a.name for a in stmt.names})
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module == "importlib":
            reloads.update(a.asname or a.name for a in stmt.names if a.name == "reload")
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            # (a name of a package may be its module, pkg/helpers.py, or any other thing it binds: not known here)
            modules.update({a.asname or a.name: f"{stmt.module}.{a.name}" for a in stmt.names})
    out = []
    for c, stmt in _statements(row):
        call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        reloaded = isinstance(call, ast.Call) and ast.unparse(call.func) in reloads and len(call.args) == 1 \
            and ast.unparse(call.args[0]) in modules
        out.append((c, stmt, modules[ast.unparse(call.args[0])] if reloaded else None))
    return modules, out


def _class_method_call(name: str, module: str, file: str, local, alias, names, attributes: dict, statement=None):
    """"Cache.add, of `from helpers import Cache` (helpers.py, beside the notebook), which" for a
    method ``name`` ("Cache.add") of a class of the module that the rows call as the class's
    attribute where the cell's import gives it (``local``: the name a from-import binds to the
    class; ``alias``: an import's, bound by ``statement``; ``names`` None and ``alias`` None: a
    star import), else None (``attributes``: what the rows call as attributes of what:
    ``_local_module_state``)."""
    owner, _, method = name.rpartition(".")
    if names is not None:
        if local is None:
            return None
        caller = f"{local}.{method}"
        imports = f"from {module} import {owner if local == owner else f'{owner} as {local}'}"
    elif alias is None:
        caller, imports = name, f"from {module} import *"
    else:
        caller, imports = f"{alias}.{name}", statement
    if method not in attributes.get(caller.rpartition(".")[0], ()):
        return None
    return f"{caller}, of `{imports}` ({file}, beside the notebook), which"


def _dotted(node) -> bool:
    """Whether ``node`` (an expression) is a name or a dotted chain of names (``pkg.helpers``)."""
    import ast

    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _containers(tree) -> dict:
    """Name → "dict", "list" or "set", for the names that a module's ``tree`` (None: a file that
    does not parse) binds last, at its top level, to a new dict, list or set (``seen = []``:
    ``notes_defaults._made_once``)."""
    import ast

    out: dict = {}
    for stmt in tree.body if tree is not None else []:
        for name in bound_by(stmt):
            out.pop(name, None)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and _made_once(stmt.value):
            value = stmt.value
            made = value.func.id if isinstance(value, ast.Call) else type(value).__name__.lower().removesuffix("comp")
            out[stmt.targets[0].id] = made
    return out


def _module_instances(tree) -> dict:
    """Name → (its class's name, the methods of that class that change nothing of it:
    ``read_only._read_only_methods``'s) for each instance that a module's ``tree`` makes at its top level of a class it defines above
    (``_c = C()``): a class with a base other than ``object``, whose methods are not all known here,
    is left out, and so are its instances."""
    import ast

    classes, objects = set(), {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) \
                and stmt.value.func.id in classes:
            objects[stmt.targets[0].id] = stmt.value.func.id
        if isinstance(stmt, ast.ClassDef):
            classes.add(stmt.name)
    read_only = _read_only_methods([Code(0, ast.unparse(tree))])
    return {name: (cls, read_only[cls]) for name, cls in objects.items() if cls in read_only}


def _module_iterators(tree) -> set:
    """The names that a module's ``tree`` binds last, at its top level, to an iterator it makes
    there: a call of ``notes_objects._ITERATOR_CALLS`` (``_it = iter(xs)``), of one of its generator
    functions or a generator expression."""
    import ast

    generators = {d.name for d in tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n, _ in _own_nodes(d))}
    out: set = set()
    for stmt in tree.body:
        out -= set(bound_by(stmt))
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and (
                isinstance(stmt.value, ast.GeneratorExp) or isinstance(stmt.value, ast.Call)
                and ast.unparse(stmt.value.func) in _ITERATOR_CALLS | generators):
            out.add(stmt.targets[0].id)
    return out


def _stateful_functions(tree, shared: Optional[dict] = None) -> tuple[dict, set]:
    """(function name → the module globals it changes, for the top-level functions of a module's
    ``tree`` that change some: a global set by ``global`` (``calls += 1``), or a dict, list or set
    the module binds at top level, or imports by name from another module of the user's (``shared``:
    its name here → that module's name and file, "seen (store.py)", which the result shows), that
    it changes in place (``seen.append(x)``; or reaches as that module's attribute, ``shared``'s
    "store.seen" of ``import store``: ``store.seen.append(x)``), or an instance of
    a class of the module it makes there, which it changes by a method that is no read-only one
    (``_c.bump()``, ``read_only._read_only_methods``), by setting an attribute or in what an
    attribute holds (``_c.items.append(x)``: ``_instance_change``), or an iterator it makes there
    (``_module_iterators``), which it runs through (``next(_it)``, ``for x in _it``), by itself or
    through the module's functions it calls by name (``_remember(x)``), and "C.m" → the attributes
    of class C, "C.n", that its method m changes (``class_attribute_changes``); the names of the
    functions, classes, instances and dicts, lists and sets that ``from m import *`` gives: its
    ``__all__`` where a list or tuple of strings says, else the names without a leading "_"; those
    it imports by name too)."""
    import ast

    shared = shared or {}
    containers, exported, functions, classes = set(shared), None, {}, {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
            if target == "__all__" and isinstance(value, (ast.List, ast.Tuple)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
                exported = {e.value for e in value.elts}
            if _made_once(value):
                containers.add(target)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[stmt.name] = stmt
        if isinstance(stmt, ast.ClassDef):
            classes[stmt.name] = stmt
    # (and what it imports by name, which a star import of it gives too: `from .helpers import remember`)
    imported = [a.asname or a.name for stmt in tree.body if isinstance(stmt, ast.ImportFrom)
                for a in stmt.names if a.name != "*"]
    objects = _module_instances(tree)
    iterators = _module_iterators(tree)
    given = {name for name in [*functions, *classes, *imported, *objects, *iterators, *_containers(tree)]
             if ((name in exported) if exported is not None else not name.startswith("_"))}
    changes: dict = {}
    walks: dict = {}  # (_walked's)
    for name, function in functions.items():
        declared = {g for n, _ in _own_nodes(function) if isinstance(n, ast.Global) for g in n.names}
        set_ = {n.id for n, _ in _own_nodes(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                and n.id in declared}
        # (an instance it changes by a method that is no read-only one, `_c.bump()` or `C.bump(_c)`, by setting an
        # attribute, or in what an attribute holds, `_c.items.append(x)`, also through a name bound to it, `c = _c`)
        changed = {o for o, (cls, read_only) in objects.items()
                   if _instance_change([("", function)], 0, o, read_only, cls, {}, set(), walks=walks)}
        changed |= set(_mutated(function, calls=False)) & set(objects)
        changes[name] = set_ | ((set(_mutated(function, surely=True)) & containers | changed)
                                - _function_locals(function))
        # (an iterator the module makes, which it runs through: next(_it), for x in _it, list(_it))
        consumed = {n.args[0].id for n, _ in _own_nodes(function) if isinstance(n, ast.Call) and n.args
                    and isinstance(n.func, ast.Name) and n.func.id in {"next", *_ITERATING_BUILTINS}
                    and isinstance(n.args[0], ast.Name)}
        consumed |= {n.iter.id for n, _ in _own_nodes(function)
                     if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(n.iter, ast.Name)}
        changes[name] |= consumed & iterators - _function_locals(function)
        # (another module's, which it changes as that module's attribute: store.seen.append(x), shared's "store.seen")
        changes[name] |= {key for key in shared if "." in key and key.partition(".")[0] not in _function_locals(function)
                          and any(_changes(n, key, None) for n, _ in _own_nodes(function))}
    # (and what the module's functions they call change, its private ones too: `def ask(x): _remember(x)`)
    calls = {name: {n.func.id for n, _ in _own_nodes(function) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name) and n.func.id in functions} - _function_locals(function)
             for name, function in functions.items()}
    grew = True
    while grew:
        grew = False
        for name in functions:
            more = changes[name].union(*(changes[c] for c in calls[name]))
            if more != changes[name]:
                changes[name], grew = more, True
    # (a class's methods that change its own attributes, Cache.store of `cls.store.append(x)` or
    # `Cache.store.append(x)`: its instances' attributes, self.n, are no module state)
    for cls in classes.values():
        for method in (m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))):
            shell = copy.copy(cls)  # (the class around the one method: a classmethod's cls is the class)
            shell.body = [method]
            changes[f"{cls.name}.{method.name}"] = {a for a in class_attribute_changes(shell)[0]
                                                   if a.split(".")[0] == cls.name}
    return {name: sorted(shared.get(s, s) for s in state) for name, state in changes.items() if state}, given
