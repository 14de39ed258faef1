"""Which methods of a set-up class change nothing of the instance they are called on, as far as can be
told safely from their code (they only read its attributes, or plain containers held in them): a
row's call of one (``tok.encode(x)``) carries no state over from row to row."""

from __future__ import annotations

from lmnb.export.cells import bound_by
from lmnb.export.syntax import _statements


# What a read-only method may call with its instance's attribute (``_reads_only``): builtins that
# neither keep nor change their argument (those that run through it only on a plain container's:
# they would consume an iterator), and the methods by which str, dict, list and tuple are read (only
# on a plain container's: a Queue's get, or a set-up class's, may change it)
_PURE_BUILTINS = frozenset({"len", "str", "repr", "int", "float", "bool", "sorted", "list", "tuple", "set", "dict",
                            "min", "max", "sum", "any", "all", "isinstance", "abs", "round", "hash", "format"})
_ITERATING_BUILTINS = frozenset({"sorted", "list", "tuple", "set", "dict", "min", "max", "sum", "any", "all"})
_READ_METHODS = frozenset({"get", "keys", "values", "items", "index", "count", "copy", "format", "join", "split",
                           "strip", "lower", "upper", "startswith", "endswith", "encode", "decode", "replace"})
# (the values that make a plain container: a display, a comprehension, a string, or a call of these)
_CONTAINERS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "sorted"})


def _read_only_methods(setup: list) -> dict:
    """Class name → the methods of each set-up class (its last top-level definition) that change
    nothing of the instance they are called on (``_reads_only``), for the classes with no base
    but ``object`` (an inherited method, ``__getattr__`` or ``__setattr__`` is not known here),
    each → whether it passes out an item of an attribute (``_passes_out_item``), which its caller
    may change in place."""
    import ast

    out: dict = {}
    for _, stmt in _statements(setup):
        for name in bound_by(stmt):
            out.pop(name, None)
        if not isinstance(stmt, ast.ClassDef) or stmt.keywords or stmt.decorator_list \
                or any(ast.unparse(b) != "object" for b in stmt.bases):
            continue
        methods = {s.name: s for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if {"__getattr__", "__getattribute__", "__setattr__"} & set(methods):
            continue
        plain = _plain_attributes(methods) - _changed_outside(setup, stmt)
        literal = _literal_attributes(methods, plain)
        fixed = _immutable_attributes(stmt, methods) - _changed_outside(setup, stmt)
        out[stmt.name] = {m: _passes_out_item(methods[m]) for m in methods
                          if _reads_only(methods[m], methods, set(), plain, literal, fixed)}
    return out


def _static(method) -> bool:
    """Whether ``method`` is a plain ``@staticmethod``, which is passed no instance."""
    return [getattr(d, "id", None) for d in method.decorator_list] == ["staticmethod"]


def _passes_out_item(method) -> bool:
    """Whether ``method`` returns or yields an item of an attribute of its instance as it is
    (``return self.rows[0]``, ``return self.vocab.get(k)``, ``self.rows[0][1]``), which ``_read``
    takes for a read (such items are strings and numbers more often than not), but which a caller
    may change in place (``_result_changed``)."""
    import ast

    if _static(method) or not method.args.args:
        return False
    me = method.args.args[0].arg
    for node in ast.walk(method):
        if not (isinstance(node, (ast.Return, ast.Yield)) and node.value is not None):
            continue
        value = node.value
        while isinstance(value, ast.Subscript) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                                                   and value.func.attr == "get"):
            value = value.value if isinstance(value, ast.Subscript) else value.func.value
        if value is not node.value and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) \
                and value.value.id == me:
            return True
    return False


def _changed_in_place(node, parents: dict) -> bool:
    """Whether the value of the expression ``node`` is changed in place where it is used: a method
    call on it other than ``_READ_METHODS`` (``row.append(x)``), or an attribute or item set or
    deleted on it (``item.n = 1``, ``row[0] = x``), also through an attribute or item of it
    (``h.seen.append(x)``). A value handed on (``out.append(w)``) is taken to be read."""
    import ast

    user = parents.get(node)
    if isinstance(user, ast.Attribute):
        call = parents.get(user)
        if not isinstance(user.ctx, ast.Load) or (isinstance(call, ast.Call) and call.func is user):
            return not isinstance(user.ctx, ast.Load) or user.attr not in _READ_METHODS
        return _changed_in_place(user, parents)
    if isinstance(user, ast.Subscript) and user.value is node:
        return not isinstance(user.ctx, ast.Load) or _changed_in_place(user, parents)
    return False


def _statement(node, parents: dict) -> str:
    """The statement that holds ``node`` (``parents``: the nodes' parents), as written."""
    import ast

    while not isinstance(node, ast.stmt):
        node = parents[node]
    return ast.unparse(node)


def _changed_by_call(node, parents: dict, functions: dict) -> str | None:
    """Where the value of ``node``, an argument of a call of one of ``functions`` (name → its
    ``def``: ``f(tok.first())``), is changed in place by that function through the parameter it is
    passed to (``_changed_in_place``: ``def f(x): x.append(q)``, or ``x += [q]``; not after the
    parameter is bound again at the function's top level, ``_rebound_in``): that statement of the
    function, as written, or None. What the function hands it on to is not followed."""
    import ast

    user = parents.get(node)
    user = parents.get(user) if isinstance(user, ast.keyword) else user  # (f(x=y): the keyword's call)
    if not (isinstance(user, ast.Call) and isinstance(user.func, ast.Name) and user.func.id in functions):
        return None
    function = functions[user.func.id]
    positional = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    index = next((i for i, a in enumerate(user.args) if a is node), None)
    if index is not None:  # (after a *spread, which parameter it is, is not known here)
        starred = any(isinstance(a, ast.Starred) for a in user.args[:index + 1])
        param = positional[index] if index < len(positional) and not starred else None
    else:
        param = next((k.arg for k in user.keywords if k.value is node), None)
    if param is None:
        return None
    inner = {child: n for n in ast.walk(function) for child in ast.iter_child_nodes(n)}
    ended = _rebound_in(function.body, param)  # (def f(x): x = list(x); x.append(q) changes its copy)
    changed = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == param and n not in ended and (
        isinstance(n.ctx, ast.Load) and _changed_in_place(n, inner)
        or isinstance(inner.get(n), ast.AugAssign) and inner[n].target is n)]
    return _statement(changed[0], inner) if changed else None


def _result_changed(call, tree, parents: dict, functions: dict | None = None) -> str | None:
    """Where the row code ``tree`` (``parents``: its nodes' parents) changes in place what ``call``
    returns (``_changed_in_place``), in the same expression (``tok.first().append(q)``) or through
    a name bound to it alone (``x = tok.first()``, then ``x.append(q)``, or ``x += [q]``, which
    extends a list in place), also by passing it to a function of ``functions`` (name → its ``def``)
    that does so to its parameter (``f(tok.first())``, ``_changed_by_call``): the statements that
    do so, as written, or None."""
    import ast

    functions = functions or {}

    def statement(node) -> str:
        return _statement(node, parents)

    if _changed_in_place(call, parents):
        return statement(call)
    if inside := _changed_by_call(call, parents, functions):
        return f"{statement(call)}; {inside}"
    bound = parents.get(call)
    if not (isinstance(bound, ast.Assign) and len(bound.targets) == 1 and isinstance(bound.targets[0], ast.Name)):
        return None
    name = bound.targets[0].id
    ended = _rebound_after(bound, name, parents)
    changed = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and n not in ended and (
        isinstance(n.ctx, ast.Load) and (_changed_in_place(n, parents) or _changed_by_call(n, parents, functions))
        or isinstance(parents.get(n), ast.AugAssign) and parents[n].target is n)]
    if not changed:
        return None
    inside = _changed_by_call(changed[0], parents, functions) if isinstance(changed[0].ctx, ast.Load) \
        and not _changed_in_place(changed[0], parents) else None
    return f"{ast.unparse(bound)}; {statement(changed[0])}" + (f"; {inside}" if inside else "")


def _rebound_after(bound, name: str, parents: dict) -> set:
    """The nodes where ``name``, bound by the statement ``bound``, is surely bound to another value:
    those of the statements after the first one that binds it again (``x = []``, ``x, y = ...``) in
    the same body as ``bound`` (``x = tok.first()``), which runs whenever ``bound`` has and before
    them, to a value that does not read it (``x = x or []`` may keep it) or to a copy (``x = list(x)``:
    ``_rebound_in``). A binding under an ``if``
    or in a loop, or a use after the body (past a ``break``) is not followed: such uses are kept."""
    body = next((b for field in ("body", "orelse", "finalbody") for b in [getattr(parents.get(bound), field, None)]
                 if isinstance(b, list) and bound in b), None)
    return set() if body is None else _rebound_in(body[body.index(bound) + 1:], name)


def _rebound_in(statements: list, name: str) -> set:
    """The nodes of ``statements`` (a body, or its part after a binding of ``name``) after the first
    of them that binds ``name`` to a value that does not read it, or to a new plain container
    (``x = list(x)``, ``_CONTAINERS``' call, as ``x = list(tok.first())`` is taken to copy), at that
    level (``_rebound_after``)."""
    import ast

    for i, stmt in enumerate(statements):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            and stmt.value is not None else []
        copied = isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in _CONTAINERS
        reads = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt.value)) if targets else True
        if (copied or not reads) and any(isinstance(e, ast.Name) and e.id == name for t in targets
                                         for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])):
            return {n for later in statements[i + 1:] for n in ast.walk(later)}
    return set()


def _changed_outside(setup: list, cls) -> set:
    """The attribute names that set-up code outside the class ``cls`` (a ``ClassDef``) sets, deletes,
    stores an item into or calls a method of other than a read one, on any object: ``tok.words =
    [iter('xyz')]``, ``tok.words[0] = ...``, ``tok.words.append(...)``. What the class's methods set
    such an attribute to is then not all it may hold (an iterator, which iterating consumes). But
    another class's methods setting their own instance's (``self.words = ...`` of ``class Other``,
    not a subclass of ``cls``), nor set-up code setting it on a name bound only to a new object that is
    no ``cls`` (``_other_objects``): no instance of ``cls`` is that."""
    import ast

    out = set()
    others = _other_objects(setup, cls)
    for _, stmt in _statements(setup):
        if isinstance(stmt, ast.ClassDef) and stmt.name == cls.name:  # (its methods: _plain_attributes)
            continue
        own = set()  # (the nodes of its own instance's attributes, of a class that is no subclass of cls)
        if isinstance(stmt, ast.ClassDef) and not any(isinstance(n, ast.Name) and n.id == cls.name
                                                      for b in stmt.bases for n in ast.walk(b)):
            own = {id(n) for m in stmt.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.args.args
                   for n in ast.walk(m) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                   and n.value.id == m.args.args[0].arg}
        parents = {child: node for node in ast.walk(stmt) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Attribute) or id(node) in own or (
                    isinstance(node.value, ast.Name) and node.value.id in others):
                continue
            if isinstance(node.ctx, (ast.Store, ast.Del)) or _changed_in_place(node, parents):
                out.add(node.attr)
    return out


def _other_objects(setup: list, cls) -> set:
    """The names that the set-up cells bind only at top level, each time to a new object that is no
    instance of ``cls`` (a ``ClassDef``): a call of another set-up class, no subclass of ``cls``
    (``o = Other()``), or of what an import gives (``ns = types.SimpleNamespace()``, ``SimpleNamespace()``
    of ``from types import SimpleNamespace``) with no name in its arguments, which could hand back an
    instance of ``cls`` (``copy.copy(tok)``). A name that a
    function declares ``global``, or that is bound otherwise (``ns = tok``, ``ns = make()``), may be one."""
    import ast

    statements = [stmt for _, stmt in _statements(setup)]
    imported = {n for stmt in statements if isinstance(stmt, (ast.Import, ast.ImportFrom)) for n in bound_by(stmt)}
    classes = {stmt.name for stmt in statements if isinstance(stmt, ast.ClassDef) and stmt.name != cls.name
               and not any(isinstance(n, ast.Name) and n.id == cls.name for b in stmt.bases for n in ast.walk(b))}

    def new_other(value) -> bool:
        if not isinstance(value, ast.Call):
            return False
        if isinstance(value.func, ast.Name) and value.func.id in classes:
            return True
        root = value.func
        while isinstance(root, ast.Attribute):
            root = root.value
        arguments = [*value.args, *(k.value for k in value.keywords)]
        return (isinstance(root, ast.Name) and root.id in imported
                and not any(isinstance(n, ast.Name) for a in arguments for n in ast.walk(a)))

    other: dict = {}  # name → whether every binding so far is such an object
    for stmt in statements:
        single = (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name))
        for name in bound_by(stmt):
            other[name] = other.get(name, True) and single and new_other(stmt.value)
    declared = {n for c in setup for n in getattr(c, "declared_globals", ())}
    return {name for name, yes in other.items() if yes and name not in declared}


def _plain_attributes(methods: dict) -> set:
    """The attributes that the class's ``methods`` only ever set on their instance to a plain
    container (``self.vocab = {}``, ``self.words = list(ws)``: ``_CONTAINERS``): a dict, list,
    tuple, set or str, whose read methods and iteration change nothing."""
    import ast

    plain, other = set(), set()
    for method in methods.values():
        me = method.args.args[0].arg if method.args.args else None
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                    value = getattr(node, "value", None)
                    made = isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.JoinedStr, ast.ListComp,
                                              ast.DictComp, ast.SetComp)) \
                        or (isinstance(value, ast.Constant) and isinstance(value.value, str)) \
                        or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                            and value.func.id in _CONTAINERS)
                    (plain if made and not isinstance(node, ast.AugAssign) else other).add(t.attr)
    return plain - other


def _instance_methods(methods: dict):
    """Each of the class's ``methods`` that takes an instance, as ``(method, me, parents)``: ``me``
    its first parameter's name, ``parents`` each of its nodes' parent node."""
    import ast

    for method in methods.values():
        if method.args.args:
            parents = {child: node for node in ast.walk(method) for child in ast.iter_child_nodes(node)}
            yield method, method.args.args[0].arg, parents


def _immutable_attributes(cls, methods: dict) -> set:
    """The attributes that the ``methods`` of the class ``cls`` (a ``ClassDef``) only ever set on
    their instance, by an assignment to it alone, to a number, string, bytes, bool or None
    (``self.n = 0``), or change by such a constant (``self.n += 1``): what they hold is immutable, so
    handing it on (``return self.n``) lets nothing change the instance. None where a method uses
    its first parameter otherwise than for an attribute (``setattr(self, 'n', [])``, ``f(self)``),
    or reaches ``__dict__``; nor an attribute the class body binds (a class attribute, a property),
    which the instance's reads give until a method sets it."""
    import ast

    fixed, other = set(), set()
    for method, me, parents in _instance_methods(methods):
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                return set()
            if not (isinstance(node, ast.Name) and node.id == me) or node is method.args.args[0]:
                continue
            attribute = parents.get(node)
            if not isinstance(attribute, ast.Attribute):
                return set()
            if isinstance(attribute.ctx, ast.Load):
                continue
            stmt = parents.get(attribute)
            value = getattr(stmt, "value", None)
            single = isinstance(stmt, ast.AugAssign) or isinstance(stmt, ast.AnnAssign) or (
                isinstance(stmt, ast.Assign) and stmt.targets == [attribute])
            constant = isinstance(value, ast.Constant) and not isinstance(value.value, type(...))
            (fixed if single and constant else other).add(attribute.attr)
    return fixed - other - set().union(*(bound_by(s) for s in cls.body))


def _literal_attributes(methods: dict, plain: set) -> set:
    """The attributes of ``plain`` (``_plain_attributes``) that the class's ``methods`` only ever set
    to a literal of strings and numbers (``['ab', 'cd']``, ``{'a': (1, 2)}``: ``ast.literal_eval``'s)
    or to a string (``str(x)``, an f-string), and use only to read (``_read``, iterating their items
    too): their items, and the items of those, are strings, numbers or such literals, which no
    iteration consumes (``for ch in self.words[0]`` reads)."""
    import ast

    out = set(plain)
    for method, me, parents in _instance_methods(methods):
        for node in ast.walk(method):
            if not (isinstance(node, ast.Attribute) and node.attr in out and isinstance(node.value, ast.Name)
                    and node.value.id == me):
                continue
            if isinstance(node.ctx, ast.Load):
                if not _read(node, parents, True, literal=True):
                    out.discard(node.attr)
                continue
            value = parents[node].value if isinstance(parents[node], (ast.Assign, ast.AnnAssign)) else None
            if not (_is_literal(value) or isinstance(value, ast.JoinedStr) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "str")):
                out.discard(node.attr)  # (and a target of a tuple, `self.a, self.b = ...`: its value unknown here)
    return out


def _is_literal(value) -> bool:
    """Whether the expression ``value`` is a literal that ``ast.literal_eval`` reads."""
    import ast

    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _reads_only(method, methods: dict, seen: set, plain: set = frozenset(), literal: set = frozenset(),
                fixed: set = frozenset()) -> bool:
    """Whether ``method`` (a plain ``def`` of a class whose ``methods`` are given) changes nothing of
    its instance, as far as can be told safely: its first parameter is used only to read attributes
    (``self.vocab[k]``, ``self.vocab.get(k)``, ``len(self.items)``, ``_read``), or to call methods of
    the class that read only (``seen``: those being checked, taken to read only), or to reach its
    class (``type(self)``, ``self.__class__``: what is set there is a class attribute's change,
    ``_class_attributes``'). ``plain``: the attributes that hold plain containers
    (``_plain_attributes``); ``literal``: those of them whose items are literals too
    (``_literal_attributes``); ``fixed``: those that hold only numbers, strings and such
    (``_immutable_attributes``), which any use reads (``return self.n``)."""
    import ast

    if _static(method):
        return True  # (it has no instance to change: what it changes of its class is a class attribute's)
    if method.decorator_list or not method.args.args:
        return False
    me = method.args.args[0].arg
    parents = {child: node for node in ast.walk(method) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(method):
        if not (isinstance(node, ast.Name) and node.id == me) or node is method.args.args[0]:
            continue
        attribute = parents.get(node)
        if (isinstance(attribute, ast.Call) and ast.unparse(attribute.func) == "type" and attribute.args == [node]
                and not attribute.keywords) or (isinstance(attribute, ast.Attribute) and attribute.attr == "__class__"):
            continue  # (type(self).n += 1 changes the class, whose attributes the job sets back, not the instance)
        if not (isinstance(attribute, ast.Attribute) and isinstance(attribute.ctx, ast.Load)):
            return False  # (self itself handed on, or an attribute set or deleted)
        user = parents.get(attribute)
        if isinstance(user, ast.Call) and user.func is attribute:  # (self.m(...): a method of the class)
            called = methods.get(attribute.attr)
            if called is None or (called.name not in seen
                                  and not _reads_only(called, methods, seen | {method.name}, plain, literal,
                                                      fixed)):
                return False
        elif attribute.attr not in fixed and not _read(attribute, parents, attribute.attr in plain, literal=attribute.attr in literal):
            return False
    return True


def _items_changed(loop, parents: dict) -> bool:
    """Whether a ``for`` loop or comprehension ``loop`` changes in place the items it takes, where
    its target names them: a method call on one other than ``_READ_METHODS``
    (``for row in self.rows: row.append(x)``), or an attribute or item set or deleted on one
    (``item.n = 1``, ``row[0] = x``), also through an attribute of it (``h.seen.append(x)``). An
    item handed on (``out.append(w)``) is taken to be read: the items of a plain container are
    strings and numbers more often than not."""
    import ast

    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    scope = [*loop.body, *loop.orelse] if isinstance(loop, (ast.For, ast.AsyncFor)) else [parents[loop]]
    return any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
               and _changed_in_place(n, parents) for part in scope for n in ast.walk(part))


def _read(value, parents: dict, plain: bool, item: bool = False, literal: bool = False) -> bool:
    """Whether ``value`` (an instance's attribute, or with ``item`` an item of it: ``self.rows[0]``,
    ``self.vocab.get(k)``) is only read where it is used (``_reads_only``): an item is looked at the
    same way (``self.rows[0].append(x)`` changes the attribute's list), but may be handed on, as
    ``return self.vocab[k]`` does; ``plain``: the attribute holds a plain container; ``literal``:
    one of literals (``_literal_attributes``), whose items are read by iterating them too."""
    import ast

    user = parents.get(value)
    if isinstance(user, ast.Subscript):
        return user.value is not value or (isinstance(user.ctx, ast.Load) and _read(user, parents, plain, True, literal))
    if isinstance(user, ast.Attribute):  # (self.vocab.get(k): a read method, and nothing else)
        call = parents.get(user)
        return (plain and isinstance(call, ast.Call) and call.func is user and user.attr in _READ_METHODS
                and (user.attr != "get" or _read(call, parents, plain, True, literal)))
    # (running through a plain container reads it; through an item of one, `for x in self.its[0]`, it may
    # consume an iterator the container holds, but for an item of literals, `for ch in self.words[0]`)
    iterable = plain and (not item or literal)
    if isinstance(user, ast.Call):  # (an argument: of a builtin that neither keeps nor changes it)
        return (isinstance(user.func, ast.Name) and user.func.id in _PURE_BUILTINS
                and (iterable or user.func.id not in _ITERATING_BUILTINS))
    if isinstance(user, ast.Compare) and value is not user.left:  # (`k in self.vocab` runs through it)
        return iterable or not any(isinstance(op, (ast.In, ast.NotIn)) for op in user.ops)
    if isinstance(user, (ast.For, ast.AsyncFor, ast.comprehension)) and value is user.iter:
        # (`for k in self.vocab`: iterating a plain container reads it, but for what the loop does to its items,
        # `for row in self.rows: row.append(x)`; an iterator is consumed)
        return iterable and not _items_changed(user, parents)
    # (handed on, kept or iterated: a list returned is changed where it goes)
    return item or not isinstance(user, (ast.Return, ast.keyword, ast.Assign, ast.AugAssign, ast.AnnAssign,
                                         ast.Starred, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.NamedExpr,
                                         ast.Yield, ast.YieldFrom, ast.Lambda, ast.comprehension, ast.For,
                                         ast.AsyncFor, ast.withitem, ast.Await))
