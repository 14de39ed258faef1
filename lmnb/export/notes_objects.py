"""The export's notes on objects that the set-up cells make once and the rows use, which carry over
from row to row where each pass of the notebook starts from a new one: instances of set-up classes,
iterators and generators, random number generators (and lists or dicts of them) that the rows
change by their calls, and the ``nonlocal`` state of a set-up decorator's closure."""

from __future__ import annotations

from typing import Optional

from lmnb.export.cells import bound_by
from lmnb.export.held_items import _ANY, _as_item, _constant_key, _items_of
from lmnb.export.read_only import _ITERATING_BUILTINS, _READ_METHODS, _read_only_methods, _result_changed
from lmnb.export.syntax import _cell_binds, _function_locals, _own_nodes, _row_trees, _statements, _tests_unset


# The calls whose value keeps its own place to go on from (a set-up iterator the rows consume)
_ITERATOR_CALLS = frozenset({"iter", "itertools.count", "itertools.cycle", "map", "filter", "zip", "enumerate",
                             "reversed"})
# Seeded random number generators as a set-up cell makes them (the standard library's, numpy's under
# its usual names): each draw moves the generator on, so the rows draw what the notebook's first row
# would not
_GENERATOR_CALLS = frozenset({"random.Random", "Random", "np.random.default_rng", "numpy.random.default_rng",
                              "default_rng", "np.random.RandomState", "numpy.random.RandomState", "RandomState"})


def _made_objects(setup: list, classes: dict) -> tuple[dict, dict, dict]:
    """(name → (set-up cell index, "an instance of C", "an iterator (f())" or "a random number
    generator (f())", C or None, whether it is a generator: a set-up generator function's call)
    for the set-up globals last bound at top level to a call of a set-up class, of
    ``_ITERATOR_CALLS`` or a set-up generator function, or of ``_GENERATOR_CALLS``; the same for
    those bound to a list, tuple or dict (a display or a comprehension) with an item or value that
    is such a call, as (set-up cell index, "a list of iterators (gen())" for ``items = [gen()]``, "a
    list holding an iterator (gen())" for ``[1, gen()]``, (the index or key, what it is as above or
    None: a plain value) for each item: ``_container_items``), also a list or dict of plain values
    alone that a later statement stores such a call in (``_stored_objects``, the cell index then
    that statement's); (cell index, name) → the top-level
    ``def`` of each set-up function, or the one a top-level ``name = lambda ...`` stands for)."""
    import ast

    made: dict = {}
    held: dict = {}
    plain: dict = {}  # (each set-up list or dict display of plain values alone: name → (kind, its items))
    defs: dict = {}
    functions: dict = {}  # (each set-up function's last top-level def, by name)
    generators: set = set()

    def making(call) -> Optional[tuple]:
        if isinstance(call, ast.GeneratorExp):  # ((x for x in xs): a generator too, as a generator function's)
            return "an iterator (a generator expression)", None, True
        func = ast.unparse(call.func) if isinstance(call, ast.Call) else None
        if func in classes:
            return f"an instance of {func}", func, False
        if func in _ITERATOR_CALLS or func in generators:
            return f"an iterator ({func}())", None, func in generators
        if func in _GENERATOR_CALLS:
            return f"a random number generator ({func}())", None, False
        return None

    for c, stmt in _statements(setup):
        for name in bound_by(stmt):
            made.pop(name, None)
            held.pop(name, None)
            plain.pop(name, None)
            functions.pop(name, None)
        stored = _stored_objects(stmt, {*plain, *held}, making)
        # (its items may be others now: which one a key names is unknown; but for an object stored, which is put
        # where its key says, below)
        for name in _changed_in_place(stmt, held, functions) - {name for name, _, _ in stored}:
            held[name] = (*held[name][:2], [(_ANY, f) for _, f in held[name][2]])
        for name in _changed_in_place(stmt, plain, functions) - {name for name, _, _ in stored}:
            plain[name] = (plain[name][0], [(_ANY, f) for _, f in plain[name][1]])
        for name, key, what in stored:  # (items = [1, 2], then items[0] = Counter(): it holds one now)
            kind, found = plain.pop(name) if name in plain else (held[name][1].split()[1], held[name][2])
            found = _with_stored(kind, found, key, what)
            held[name] = (c.index, _described(kind, found), found)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs[(c.index, stmt.name)] = functions[stmt.name] = stmt
            generators.discard(stmt.name)
            if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n, _ in _own_nodes(stmt)):
                generators.add(stmt.name)
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, value = stmt.targets[0].id, stmt.value
        if isinstance(value, ast.Lambda):  # (use = lambda x: x.bump(): read as the def it stands for)
            defs[(c.index, name)] = functions[name] = ast.FunctionDef(
                name=name, args=value.args, body=[ast.Return(value.body)], decorator_list=[], returns=None)
            continue
        if (what := making(value)) is not None:
            made[name] = (c.index, *what)
            continue
        kind, items = _container_items(value)
        found = [(key, making(item)) for key, item in items]
        if any(f for _, f in found):
            held[name] = (c.index, _described(kind, found), found)
        elif kind in ("list", "set", "dict"):
            plain[name] = (kind, found)
    return made, held, defs


def _described(kind: str, found: list) -> str:
    """What a held container is, "a list of iterators (gen())" or "a list holding an instance of C",
    from its ``kind`` and items (``_made_objects``' (key, what) pairs, what None for a plain value)."""
    objects = [f for _, f in found if f]
    if len(objects) == len(found):
        return f"a {kind} of " + objects[0][0].replace("an instance of", "instances of").replace(
            "an iterator", "iterators").replace("a random number generator", "random number generators").replace(
            "a generator expression", "generator expressions")
    # (a list that also holds a str: which item a row uses is told by its index, `items[1]`, where written)
    return f"a {kind} holding " + ", ".join(dict.fromkeys(f[0] for f in objects))


# Where ``_stored_objects`` puts an item appended to a list
_APPENDED = object()


def _stored_objects(stmt, names: set, making) -> list:
    """(name, key, what ``making`` says it is) for each object the set-up statement ``stmt`` makes
    and stores in a list, set or dict of ``names``: ``items[0] = Counter()``, ``items.append(gen())``
    (key ``_APPENDED``), ``items.insert(0, gen())`` or a set's ``items.add(gen())`` (``_ANY``),
    ``d.setdefault('a', Counter())``,
    also in the body of a block (``for k in keys: d[k] = Counter()``; in a loop, at ``_ANY``)."""
    import ast

    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)):
        loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
        inner = [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", []),
                 *(s for h in getattr(stmt, "handlers", []) for s in h.body)]
        return [(name, _ANY if loop else key, what) for s in inner for name, key, what in _stored_objects(s, names, making)]
    out = []
    if isinstance(stmt, ast.Assign) and (what := making(stmt.value)) is not None:
        out += [(t.value.id, _constant_key(t.slice), what) for t in stmt.targets
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in names]
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id in names and not call.keywords:
        method, args = call.func.attr, call.args
        key, value = (_APPENDED, args[0]) if method == "append" and len(args) == 1 else \
            (_ANY, args[0]) if method == "add" and len(args) == 1 else \
            (_ANY, args[1]) if method == "insert" and len(args) == 2 else \
            (_constant_key(args[0]), args[1]) if method == "setdefault" and len(args) == 2 else (None, None)
        if value is not None and (what := making(value)) is not None:
            out.append((call.func.value.id, key, what))
    return out


def _with_stored(kind: str, found: list, key, what: tuple) -> list:
    """The items (``_made_objects``' (key, what) pairs) of a list or dict (``kind``) once the object
    ``what`` is stored at ``key`` (``_stored_objects``'): in its place where the key is known, else
    with every key ``_ANY``."""
    if key is not _ANY and not any(k is _ANY for k, _ in found):
        if kind == "dict" and key is not _APPENDED:
            return [(k, f) for k, f in found if k != key] + [(key, what)]
        if kind == "list" and key is _APPENDED:
            return [*found, (len(found), what)]
        if kind == "list" and isinstance(key, int) and not isinstance(key, bool) and -len(found) <= key < len(found):
            return [(k, what if i == key % len(found) else f) for i, (k, f) in enumerate(found)]
    return [(_ANY, f) for _, f in found] + [(_ANY, what)]


# The functions (by their last name: random.shuffle, rng.shuffle, heapq.heapify) that reorder the list
# passed them first, in place
_REORDERING = frozenset({"shuffle", "heapify", "heappush", "heappop", "heapreplace", "heappushpop", "insort",
                         "insort_left", "insort_right"})


def _changed_in_place(stmt, held, functions: Optional[dict] = None) -> set:
    """The names of ``held`` whose items the set-up statement ``stmt`` may set, move or remove
    (``items[0] = Counter()``, ``del items['a']``, ``items.insert(0, x)``, ``items.reverse()``: any
    call of a method but a read one; ``random.shuffle(items)``, ``_REORDERING``'s; a set-up function
    of ``functions``, name → its ``def``, that does so to the parameter it is passed to,
    ``swap(items)``), so that an index or key no longer says which item it is."""
    import ast

    out = set()
    for node in ast.walk(stmt):
        targets = []
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            targets = [node.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr not in _READ_METHODS:
            targets = [node.func.value]
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func).rsplit(".", 1)[-1] in _REORDERING:
            targets.append(node.args[0])
        function = (functions or {}).get(node.func.id) if isinstance(node, ast.Call) and \
            isinstance(node.func, ast.Name) else None
        if function is not None:  # (one level: what it calls is read as _REORDERING's or a method call)
            params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
            changed = _changed_in_place(function, params)
            targets += [arg for arg, param in zip(node.args, params) if param in changed]
        out.update(t.id for t in targets if isinstance(t, ast.Name) and t.id in held)
    return out


def _loop_items(node) -> list:
    """(what it iterates, its target, the nodes where the target's names are the items) for a
    ``for`` loop ``node`` (its body), or for each ``for`` of a comprehension ``node`` (the whole
    comprehension); [] for another node."""
    import ast

    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [(node.iter, node.target, [*node.body, *node.orelse])]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return [(g.iter, g.target, [node]) for g in node.generators]
    return []


def _held_items(iterated, target, held: dict) -> tuple:
    """(the ``held`` name, the names that ``target`` binds to its items) where a loop over
    ``iterated`` takes the items of a list or tuple ``held`` names (``for h in handlers``, or
    ``held_items``' forms: ``handlers[1:]``, ``sorted(handlers)``), or the values of a dict
    (``handlers.values()``, the second of ``k, h`` in ``handlers.items()``: its keys
    are no such objects); (None, set()) otherwise."""
    import ast

    def names(node) -> set:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    if (name := _items_of(iterated, held)) is not None:  # (items, items[1:], sorted(items), d.values())
        return name, names(target)
    if isinstance(iterated, ast.Call) and not iterated.args and isinstance(iterated.func, ast.Attribute) \
            and isinstance(iterated.func.value, ast.Name) and iterated.func.value.id in held:
        name, method = iterated.func.value.id, iterated.func.attr
        if method == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            return name, names(target.elts[1])
    return None, set()


# The built-in containers (and their subclasses in collections) that ``Job.row_copy`` copies for a row
_ROW_COPIED = frozenset({"dict", "list", "set", "bytearray", "OrderedDict", "defaultdict", "Counter"})


def _container_classes(setup: list) -> set:
    """The names of the set-up classes (their last top-level definitions) with a base of
    ``_ROW_COPIED`` (``class Registry(dict)``), whose instances ``Job.row_copy`` copies per row."""
    import ast

    out: set = set()
    for _, stmt in _statements(setup):
        for name in bound_by(stmt):
            out.discard(name)
        if isinstance(stmt, ast.ClassDef) and any(ast.unparse(b).rsplit(".", 1)[-1] in _ROW_COPIED
                                                  for b in stmt.bases):
            out.add(stmt.name)
    return out


def _container_items(value) -> tuple[str, list]:
    """("list", "tuple", "set" or "dict"; (its index, or a dict's key where a constant, else ``_ANY``
    (a set's items: always); the expression) for each of its items, or a dict's values) for a
    display, a comprehension (one item: its element, at ``_ANY``) or a constructor called with no
    items, ``list()``, ``set()``, ``dict()``, ``dict(a=Counter())``; ("", []) for another value."""
    import ast

    if isinstance(value, (ast.List, ast.Tuple)):
        if any(isinstance(e, ast.Starred) for e in value.elts):  # (the indices after *xs are unknown here)
            return type(value).__name__.lower(), [(_ANY, e) for e in value.elts]
        return type(value).__name__.lower(), list(enumerate(value.elts))
    if isinstance(value, ast.Dict):
        return "dict", [(k.value if isinstance(k, ast.Constant) else _ANY, v)
                        for k, v in zip(value.keys, value.values) if k is not None]  # (not a **spread's)
    if isinstance(value, ast.Set):
        return "set", [(_ANY, e) for e in value.elts]
    if isinstance(value, (ast.ListComp, ast.SetComp)):
        return "list" if isinstance(value, ast.ListComp) else "set", [(_ANY, value.elt)]
    if isinstance(value, ast.DictComp):
        return "dict", [(_ANY, value.value)]
    # (the constructors called empty, as a display is written: list(), set(), dict() or dict(a=Counter()))
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "set", "dict") \
            and not value.args and (value.func.id == "dict" or not value.keywords) \
            and all(k.arg is not None for k in value.keywords):  # (not a **spread's)
        return value.func.id, [(k.arg, k.value) for k in value.keywords]
    return "", []


def _held_elements(entry: tuple, key) -> list:
    """What the items of a held container (``entry``: ``_made_objects``') that a row may use are
    (``making``'s tuples, the plain ones left out), where it uses the item at ``key`` (a constant:
    ``items[1]``, ``items.get('a')``), or any (``_ANY``: ``items[i]``, a loop over them)."""
    items = entry[2]
    if key is not _ANY and not any(k is _ANY for k, _ in items):
        if entry[1].startswith("a dict"):
            chosen = [f for k, f in items if k == key]
        elif isinstance(key, int) and not isinstance(key, bool) and -len(items) <= key < len(items):
            chosen = [items[key][1]]
        else:
            chosen = [f for _, f in items]
        if chosen:  # (a key no display names: set later, so any)
            return [f for f in chosen if f]
    return [f for _, f in items if f]


def _aliases(tree, made: dict, held: dict, given: Optional[dict] = None) -> dict:
    """Name → the expression it stands for, for each name that ``tree`` (a row cell or a function
    of one, its own nodes) binds once, to a ``made`` object, a ``held`` container or its item:
    ``x = c``, ``xs = items``, ``x = items[1]``, ``x = items.get('a')``, ``x = max(items, key=f)``,
    ``xs = sorted(items)`` (``held_items``' forms), or by unpacking a held list or tuple, ``a, b =
    items`` (b: ``items[1]``; after a starred target, negative indices; the starred one, ``*m``:
    ``items[1:]``); also through such a name bound above, ``xs = items`` then ``x = max(xs)``
    (x: ``max(items)``), or through a parameter of ``given`` (``_argument_places``': parameter →
    what a row passes it), ``first = x`` of ``f(c)`` (first: ``c``). A name bound again is left
    out: which value a use reads is not known here."""
    import ast

    bindings: dict = {}
    for node, _ in _own_nodes(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) or isinstance(node, ast.arg):
            name = node.id if isinstance(node, ast.Name) else node.arg
            bindings[name] = bindings.get(name, 0) + 1
    found: dict = dict(given or {})
    for node, _ in _own_nodes(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        value = _unaliased(node.value, {n: v for n, v in found.items() if bindings.get(n) == 1})[0]
        if isinstance(target, ast.Name) and _stands_for(value, made, held):
            found[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, ast.Name) and value.id in held and \
                not held[value.id][1].startswith("a dict"):  # (a dict unpacks to its keys)
            star = next((i for i, e in enumerate(target.elts) if isinstance(e, ast.Starred)), None)
            for i, element in enumerate(target.elts):
                if isinstance(element, ast.Name) and i != star:
                    index = i if star is None or i < star else i - len(target.elts)
                    found[element.id] = ast.Subscript(value, ast.Constant(index), ast.Load())
                elif i == star and isinstance(element.value, ast.Name):  # (a, *m, b = items: m is items[1:-1])
                    after = len(target.elts) - 1 - i
                    upper = ast.UnaryOp(ast.USub(), ast.Constant(after)) if after else None
                    found[element.value.id] = ast.Subscript(value, ast.Slice(ast.Constant(i) if i else None, upper),
                                                            ast.Load())
    return {name: value for name, value in found.items() if bindings.get(name) == 1}


def _stands_for(value, made: dict, held: dict) -> bool:
    """Whether the expression ``value`` is a ``made`` object, a ``held`` container or its item, as a
    name bound to it stands for it (``_aliases``): ``c``, ``items``, ``items[1]``,
    ``items.get('a')``, or ``held_items``' forms, ``max(items, key=f)``, ``sorted(items)``."""
    import ast

    source = value.func.value if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
        value.func.attr == "get" else value.value if isinstance(value, ast.Subscript) else None
    return (isinstance(value, ast.Name) and (value.id in made or value.id in held)
            or isinstance(source, ast.Name) and source.id in held
            or _items_of(value, held) is not None or _as_item(value, held) is not value)


def _argument_places(places: list, row: list, made: dict, held: dict, owners: Optional[dict] = None,
                     callers: Optional[list] = None, handlers: Optional[dict] = None) -> list:
    """For each function of ``places`` (``_carried_over``'s: a row cell's, or a set-up one the rows
    call) and each call of it at the top level of a row cell that passes it a set-up object, a held
    container or its item (``_stands_for``, after the cell's own ``_aliases``: ``f(c)``,
    ``use(items[1])``), that place again, its parameters standing for what is passed: (where, the
    ``def``, its local names but those parameters, True (what is passed is the row's), parameter →
    the expression passed; ``*args`` → a tuple of the positional arguments it takes, ``**kwargs``
    → a dict of the keyword ones: ``use(1, c)`` of ``def use(*xs)``, xs being ``(1, c)``, so that
    ``xs[1]`` is c). A parameter the function binds again is left out. ``owners``: id of a method's
    ``def`` → its set-up class, for a method of ``places``, called on a ``made`` instance of that
    class (``u.use(c)``: its first parameter, self, is u). ``callers``: the places whose calls are
    read instead of the row cells' (such a place's function, its aliases: a function passed an
    object that passes it on, ``inner(x)`` in ``def outer(x)``). ``handlers``: ``_held_functions``'
    (a call of an item of one by a constant, ``handlers['a'](c)``, calls the function there)."""
    import ast

    callers = [(tree, _aliases(tree, made, held)) for _, tree in _row_trees(row)] if callers is None else callers
    calls = [(node, aliases) for tree, aliases in callers
             for node, _ in _own_nodes(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, (ast.Name, ast.Attribute, ast.Subscript))]
    out = []
    for where, function, skipped, _ in places:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        owner = (owners or {}).get(id(function))
        positional = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if owner is not None and "staticmethod" not in map(ast.unparse, function.decorator_list):
            positional = positional[1:]  # (self, or a classmethod's cls)
        named = {*(a.arg for a in function.args.args), *(a.arg for a in function.args.kwonlyargs)}
        rebound = {n.id for n, _ in _own_nodes(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        for call, aliases in calls:
            func = call.func
            if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):  # (handlers['a'](c))
                func = ast.Name((handlers or {}).get(func.value.id, {}).get(_constant_key(func.slice), ""))
            if not (isinstance(func, ast.Name) and func.id == function.name if owner is None else
                    isinstance(func, ast.Attribute) and func.attr == function.name and isinstance(func.value, ast.Name)
                    and func.value.id in made and made[func.value.id][2] == owner):
                continue
            starred = next((i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)), len(call.args))
            given = {**dict(zip(positional, call.args[:starred])),
                     **{k.arg: k.value for k in call.keywords if k.arg in named}}
            found = {param: value for param, arg in given.items() for value in [_unaliased(arg, aliases)[0]]
                     if param not in rebound and _stands_for(value, made, held)}
            # (*args: the positional arguments past the named ones; **kwargs: the other keywords; not where a
            # *spread or **spread passes some, which are not known here)
            rest = [k for k in call.keywords if k.arg not in named]
            packed = [(function.args.vararg, ast.Tuple(call.args[len(positional):], ast.Load()),
                       starred == len(call.args)),
                      (function.args.kwarg, ast.Dict([ast.Constant(k.arg) for k in rest], [k.value for k in rest]),
                       all(k.arg for k in rest))]
            for param, value, known in packed:
                value = _unaliased(value, aliases)[0]
                items = value.elts if isinstance(value, ast.Tuple) else value.values
                if param is not None and known and param.arg not in rebound and any(
                        _stands_for(v, made, held) for v in items):
                    found[param.arg] = value
            if found:
                out.append((where, function, tuple(n for n in skipped if n not in found), True, found))
    return out


def _held_functions(setup: list, functions: set) -> dict:
    """Name → (its index or key → the name of the set-up function there), for each dict, list or
    tuple display of names that a set-up cell binds last at its top level and then changes nowhere
    (``_changed_in_place``), with an item one of ``functions`` (``handlers = {'a': use}``, ``hs =
    [use]``): a call of its item by a constant, ``handlers['a'](c)``, calls that function."""
    import ast

    out: dict = {}
    for _, stmt in _statements(setup):
        for name in {*bound_by(stmt), *_changed_in_place(stmt, out)}:
            out.pop(name, None)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            kind, items = _container_items(stmt.value)
            if kind in ("dict", "list", "tuple") and all(k is not _ANY for k, _ in items):
                found = {k: v.id for k, v in items if isinstance(v, ast.Name) and v.id in functions}
                if found:
                    out[stmt.targets[0].id] = found
    return out


def _unaliased(node, aliases: dict) -> tuple:
    """(``node``, an expression, with each name of ``aliases`` (``_aliases``') in it replaced by what
    it stands for, ``xs[1]`` → ``items[1]``, and a constant item of a tuple or dict so put in taken
    out (``xs[1]`` of xs being ``(1, c)`` → ``c``, ``kw.get('a')`` of ``{'a': c}`` → ``c``); the
    first such name, or None where there is none)."""
    import ast
    import copy

    found = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in aliases]
    if not found:
        return node, None

    def passed(packed, key, node):  # (an item of a *args tuple or a **kwargs dict: what was passed there)
        if isinstance(packed, ast.Tuple) and type(key) is int and -len(packed.elts) <= key < len(packed.elts):
            return packed.elts[key]
        if isinstance(packed, ast.Dict) and isinstance(key, str):
            return next((v for k, v in zip(packed.keys, packed.values) if isinstance(k, ast.Constant) and k.value == key),
                        node)
        return node

    class _Swap(ast.NodeTransformer):
        def visit_Name(self, name):
            return copy.deepcopy(aliases[name.id]) if name.id in aliases else name

        def visit_Subscript(self, node):
            node = self.generic_visit(node)
            return passed(node.value, _constant_key(node.slice), node)

        def visit_Call(self, node):
            node = self.generic_visit(node)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 1:
                return passed(node.func.value, _constant_key(node.args[0]), node)
            return node

    return _Swap().visit(copy.deepcopy(node)), found[0]


def _carried_over(setup: list, row: list, called: list, objects: tuple, copied: tuple, lazy: set,
                  imported: Optional[dict] = None) -> list:
    """The notes for set-up state that the rows carry on from row to row, which the job does not
    set back (each pass of the notebook starts from a new one): a ``_made_objects`` global (``objects``:
    what it gives) that a
    row cell (but for the row's copy, ``copied``, where ``Job.row_copy`` copies it: a built-in
    container's, not an instance's or an iterator's, and not the generators a list or dict holds)
    or a set-up function the rows call (``_called``) uses by ``next(it)``, a method call
    (``c.bump()``) or, an iterator, by running through it (``for x in it``, ``list(it)``), or an
    item of one that holds them, by ``next(items[0])``, ``next(items.get('a'))``, ``for x in
    items[0]`` or ``handlers['a'].bump()``, or of a loop over one (``for h in handlers: h.bump()``;
    a dict's ``values()`` or ``items()``) (but under ``if x is None:`` of a value made on first use,
    ``lazy``: ``_made_on_first_use``), and the ``nonlocal`` state of a set-up decorator's closure
    around a function the rows call. ``imported``: the classes of the user's modules that the
    set-up imports, as called, → their read-only methods (``notes_modules._module_classes``). Static
    cases only."""
    import ast

    made, held, defs = objects
    read_only = {**(imported or {}), **_read_only_methods(setup)}
    bound = set().union(*map(_cell_binds, row))
    # (the row's copy is Job.row_copy's, which copies built-in containers only: a row cell's c.bump() changes
    # the set-up's instance itself, but for an instance of a class that subclasses one)
    containers = _container_classes(setup)
    # (a list or dict that holds them, which a row copies, copies them too, but for generators: deepcopy cannot
    # copy one, which the copy, Job.row_copy's fallback, shares)
    copied_held = {n for n in copied if n in held}
    copied = tuple(n for n in copied if (n not in made or made[n][2] in containers) and n not in held)
    # (where, tree, names that are not the set-up's there, whether its held containers are the row's copies; and
    # for a function a row passes an object, what its parameters stand for: _argument_places)
    places = [(where, tree, copied, True) for where, tree in _row_trees(row)]
    # (and the functions those cells define, which the rows call: `def take(): return next(it)`)
    places += [(f"{where}, in its {name}()", function, (*skipped, *_function_locals(function)), True)
               for where, tree, skipped, _ in list(places) for function in ast.walk(tree)
               if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
               for name in [getattr(function, "name", "lambda")]]
    # (whose own variables, c of def use(c), *c or c = Counter(), are no set-up globals: each was noted)
    places += [(f"{f[1]}(), a function of cell {f[0]}", d, tuple(_function_locals(d)), False) for f in called
               if (d := defs.get((f[0], f[1]))) is not None]
    # (and those functions where a row passes them an object, f(c) of def f(x): x.bump(): x stands for c there;
    # and the methods of set-up classes, where a row passes one to a method of an instance: u.use(c))
    method_places = [(f"{s.name}.{m.name}(), a method of cell {c.index}", m, tuple(_function_locals(m)), False)
                     for c, s in _statements(setup) if isinstance(s, ast.ClassDef) for m in s.body
                     if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    owners = {id(m[1]): m[0].split(".")[0] for m in method_places}

    def key(place) -> tuple:  # (a function, and what its parameters stand for there)
        return id(place[1]), *((param, ast.dump(value)) for param, value in place[4].items())

    handlers = {name: found for name, found in _held_functions(setup, {name for _, name in defs}).items()
                if name not in bound}
    passed = _argument_places(places + method_places, row, made, held, owners, handlers=handlers)
    # (and the functions those pass it on to, inner(x) in def outer(x), and so on: each place once, in a chain no
    # longer than there are functions)
    seen, new = set(map(key, passed)), passed
    for _ in range(len(places) + len(method_places)):
        if not new:
            break
        new = [p for p in _argument_places(places + method_places, row, made, held, owners,
                                           [(p[1], {**_aliases(p[1], made, held, p[4]), **p[4]}) for p in new],
                                           handlers) if key(p) not in seen]
        seen |= set(map(key, new))
        passed += new
    places += passed
    # (the set-up functions a row may call by name, which it may pass what a method passes out: f(tok.first()))
    setup_functions = {name: d for (_, name), d in sorted(defs.items(), key=lambda kv: kv[0][0]) if name not in bound}
    decorators = {name: d for (_, name), d in defs.items()
                  if any(isinstance(n, ast.Nonlocal) for n in ast.walk(d))}
    # (and a name a set-up cell binds, at its top level, to what such a function's call gives, `counted = make()`,
    # where no later statement binds it again: the closure of that call keeps the state)
    made_by_call: dict = {}
    for _, stmt in _statements(setup):
        for name in bound_by(stmt):
            made_by_call.pop(name, None)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) in decorators:
            made_by_call[stmt.targets[0].id] = decorators[ast.unparse(stmt.value.func)]
    decorators.update(made_by_call)
    # (a method of a set-up class the rows use is wrapped once too, where the class is defined)
    methods = {(c.index, s.name): [m for m in s.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
               for c, s in _statements(setup) if isinstance(s, ast.ClassDef)}
    # (a method so wrapped has a note of its own, below: its calls change the closure, not the instance)
    wrapped_methods = {(f[1], m.name) for f in called for m in methods.get((f[0], f[1]), [])
               if any(ast.unparse(x.func if isinstance(x, ast.Call) else x) in decorators for x in m.decorator_list)}

    def elements(name: str, key, copies: bool) -> list:
        """What the item (at ``key``) of the held ``name`` that a place uses may be, where it changes
        from row to row: but for generators, not where the place reads the row's copy (``copies``)."""
        found = _held_elements(held[name], key)
        return [e for e in found if e[2]] if copies and name in copied_held else found

    def changes(element: tuple, method, mixed: bool) -> bool:
        """Whether calling ``method`` (None: ``next()``) on ``element`` (``making``'s tuple) changes it:
        a set-up class's method that is no read-only one, any of another object's but, in a container that
        also holds plain values (``mixed``), a str's or dict's read method that the object has not
        (``w.upper()`` in a loop over them: the plain ones')."""
        if method is None:
            return True
        if mixed and method in _READ_METHODS and method not in own_methods.get(element[1], {method}):
            return False
        if element[1] is not None:
            return method not in read_only.get(element[1], ()) and (element[1], method) not in wrapped_methods
        return True

    # (the methods of each set-up class with no base but object, and no __getattr__: none other is its own;
    # None for an iterator or a random number generator, which has none of _READ_METHODS)
    own_methods: dict = {None: set()}
    for _, stmt in _statements(setup):
        if isinstance(stmt, ast.ClassDef) and not (stmt.keywords or stmt.decorator_list) and all(
                ast.unparse(b) == "object" for b in stmt.bases):
            names = {n for s in stmt.body for n in bound_by(s)}
            own_methods[stmt.name] = names if not {"__getattr__", "__getattribute__"} & names else {*_READ_METHODS}
        elif isinstance(stmt, ast.ClassDef):
            own_methods[stmt.name] = {*_READ_METHODS}

    uses: dict = {}
    for where, tree, skipped, copies, *passed in places:
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        # (x = items[1] then x.bump(), a, b = items then b.bump(): the item the row changes, by another name)
        aliases = {**_aliases(tree, made, held, passed[0] if passed else None), **(passed[0] if passed else {})}
        functions = {**setup_functions, **{f.name: f for f in ast.walk(tree)
                                           if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}}
        for node, tests in _own_nodes(tree):
            if any(_tests_unset(t, lazy) for t in tests):
                continue  # (a value made on first use, `if model is None: model = next(loads)`, is made once)
            for name, alias in _attribute_changes(node, made, aliases, {*bound, *skipped}):
                being = f", {alias} being `{ast.unparse(aliases[alias])}`" if alias is not None else ""
                statement = node
                while not isinstance(statement, ast.stmt) and statement in parents:
                    statement = parents[statement]
                uses.setdefault(name, (made[name], f"`{ast.unparse(statement)}` in {where}{being}"))
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):  # (`for x in it` consumes it)
                target, iterating, shown = node.iter, True, f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}"
            elif isinstance(func, ast.Name) and func.id in {"next", *_ITERATING_BUILTINS} and node.args:
                target, iterating, shown = node.args[0], func.id != "next", ast.unparse(node)
            elif isinstance(func, ast.Attribute):
                target, iterating, shown = func.value, False, ast.unparse(node)
            else:
                continue
            target, alias = _unaliased(target, aliases)
            target = _as_item(target, held)  # (max(items, key=f), m[0] of a, *m = items: an item of items)
            if iterating and isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Slice):
                continue  # (for x in items[1:] runs through a new list of them, consuming none: its loop, below)
            being = f", {alias} being `{ast.unparse(aliases[alias])}`" if alias is not None else ""
            # (an item of a list or dict that holds them: next(items[0]), handlers['a'].bump(), or of a dict by
            # get: next(items.get('a')))
            got = isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute) and target.func.attr == "get"
            known, name = (held, target.value) if isinstance(target, ast.Subscript) else \
                (held, target.func.value) if got else (made, target)
            if not (isinstance(name, ast.Name) and name.id in known) or (
                    got and not held[name.id][1].startswith("a dict")):
                continue
            name = name.id
            if name in bound or name in skipped:
                continue
            if known is made:
                found, mixed = [made[name][1:]], False
            else:  # (the item a constant names, items[1] or items.get('a'), where the display says what it is)
                index = target.slice if isinstance(target, ast.Subscript) else target.args[0] if target.args else None
                key = _constant_key(index)
                found, mixed = elements(name, key, copies), any(f is None for _, f in held[name][2])
            method = func.attr if isinstance(func, ast.Attribute) else None
            # (an instance of a set-up class iterated: what its __iter__ does is not followed; tok.encode(x) of a
            # method that changes nothing of tok)
            if any((e[1] is None) if iterating else changes(e, method, mixed) for e in found):
                uses.setdefault(name, (known[name], f"`{shown}` in {where}{being}"))
            # (a read-only method that passes out an item of an attribute, `return self.rows[0]`, which the row
            # changes in place: tok.first().append(q), or x = tok.first(); x.append(q))
            handed = not iterating and any(read_only.get(e[1], {}).get(method) for e in found)
            changing = _result_changed(node, tree, parents, functions) if handed else None
            if changing:
                uses.setdefault(name, (known[name], f"`{changing}` in {where}, changing what {shown} passes "
                                                    f"out{being}"))
        # (the items of one that holds them, taken by a loop: `for h in handlers: h.bump()`, `next(it)`)
        for node, tests in _own_nodes(tree):
            for iterated, target, scope in _loop_items(node):
                unaliased, alias = _unaliased(iterated, aliases)
                # (a loop over *args, `for x in xs` of use(c); not where the body binds x again, `x = Counter()`)
                if isinstance(unaliased, ast.Tuple) and isinstance(target, ast.Name) and alias is not None and not any(
                        _tests_unset(t, lazy) for t in tests) and not any(
                        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == target.id
                        and n is not target for part in scope for n in ast.walk(part)):
                    for element in unaliased.elts:
                        if not (isinstance(element, ast.Name) and element.id in made) or element.id in bound \
                                or element.id in skipped:
                            continue
                        for call in (n for part in scope for n in ast.walk(part) if isinstance(n, ast.Call)):
                            func = call.func
                            item = call.args[0] if isinstance(func, ast.Name) and func.id == "next" and call.args \
                                else func.value if isinstance(func, ast.Attribute) and changes(
                                    made[element.id][1:], func.attr, False) else None
                            if isinstance(item, ast.Name) and item.id == target.id:
                                uses.setdefault(element.id, (made[element.id], f"`{ast.unparse(call)}` in {where}, an "
                                                             f"item of `{ast.unparse(iterated)}`, {alias} being "
                                                             f"`{ast.unparse(unaliased)}`"))
                    continue
                name, names = _held_items(unaliased, target, held)
                if name is None or name in bound or name in skipped or any(_tests_unset(t, lazy) for t in tests):
                    continue
                found, mixed = elements(name, _ANY, copies), any(f is None for _, f in held[name][2])
                for call in (n for part in scope for n in ast.walk(part) if isinstance(n, ast.Call)):
                    func = call.func
                    if isinstance(func, ast.Name) and func.id == "next" and call.args:
                        item = call.args[0]
                    elif isinstance(func, ast.Attribute) and any(changes(e, func.attr, mixed) for e in found):
                        item = func.value
                    else:
                        continue
                    if isinstance(item, ast.Name) and item.id in names:
                        uses.setdefault(name, (held[name], f"`{ast.unparse(call)}` in {where}, an item of "
                                                           f"`{ast.unparse(iterated)}`"))
    notes = [f"cell {entry[0]}: {name}, {entry[1]} that this cell makes once, is used by the rows ({use}): "
             "what its calls change carries over from row to row (what one row changes, the next row sees), where "
             f"each pass of the notebook starts from a new one; make it in a cell that runs per row ({name} = ... "
             "after the first %%lm cell), and rows running at once (--num-threads above 1) share it"
             for name, (entry, use) in uses.items()]
    for f in called:
        d = defs.get((f[0], f[1]))
        for name, function in ([(f[1], d)] if d is not None else
                               [(f"{f[1]}.{m.name}", m) for m in methods.get((f[0], f[1]), [])]):
            # (a decorator factory's call too, @counted(): the closure of counted keeps the state)
            wrapped = [ast.unparse(x) for x in function.decorator_list
                       if ast.unparse(x.func if isinstance(x, ast.Call) else x) in decorators]
            if wrapped:
                notes.append(_wrapped_note(f[0], name, wrapped[0]))
    return notes


def _attribute_changes(node, made: dict, aliases: dict, skipped: set) -> list:
    """(name, the alias it is used by or None) for each instance of a class among the ``made``
    objects (``_made_objects``' first) that ``node`` changes by setting or deleting an attribute of
    it, or by changing in place what an attribute holds (``c.n += 1``, ``c.items.append(q)``,
    ``x.items[0] = q`` of ``x = c``: ``notes_modules._changes``), as a method that changes it would;
    not by a method call of its own (``c.bump()``, which ``_carried_over`` asks its class about),
    nor for a name in ``skipped`` (the row's own there)."""
    import ast

    # (notes_modules imports this module: its test of a module instance's change, asked here of a set-up one)
    from lmnb.export.notes_modules import _changes

    found = []
    for name, entry in made.items():
        if entry[2] is None or name in skipped:
            continue
        callers = [(name, None)] + [(a, a) for a, v in aliases.items() if isinstance(v, ast.Name) and v.id == name]
        for caller, alias in callers:
            own_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and ast.unparse(node.func.value) == caller
            if not own_call and _changes(node, caller, ()):
                found.append((name, alias))
                break
    return found


def _wrapped_note(cell: int, name: str, decorator: str) -> str:
    """The note for a set-up function (or method) ``name`` of ``cell`` that the rows call, wrapped by
    ``decorator``, whose closure keeps state by ``nonlocal`` (``_carried_over``)."""
    return (f"cell {cell}: {name}, which the rows call, is wrapped by {decorator}, whose closure keeps "
            "state by `nonlocal`: it carries over from row to row (what one row changes, the next row "
            "sees), where each pass of the notebook starts from a new one; define it in a cell that runs "
            "per row (after the first %%lm cell), and rows running at once (--num-threads above 1) "
            "share it")
