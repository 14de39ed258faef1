"""The walks over the cells' code that the export's plan and its notes share: a cell's top-level
statements, the syntax trees of the row cells, the names a cell binds, a function's own nodes (with
the ``if`` tests above each) and its own variables, whether a test asks if a name is unset, the
names a node binds (which the kernel's watch of the ``lmnb`` name and the reading of the
parameters cell share), and ``getattr(o, 'n')`` and the like read as the attribute ``o.n``."""

from __future__ import annotations

import copy

from lmnb.export.cells import Cell, Code, LMCell, bound_by


def names_bound(node) -> list:
    """The names the syntax tree ``node`` itself (not its children) binds or deletes: a ``Name``
    stored or deleted (an assignment's, a loop's, a ``with``'s or a ``:=``'s target, ``del``), an
    import's alias (``import a.b`` binds ``a``; ``from m import *`` gives ``"*"``), a
    ``def``/``class``, an ``except ... as``, or a ``match`` capture (``case x``, ``case [*x]``,
    ``case {**x}``)."""
    import ast

    if isinstance(node, ast.Name):
        return [] if isinstance(node.ctx, ast.Load) else [node.id]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.split(".")[0]]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler, ast.MatchAs,
                         ast.MatchStar)):
        return [node.name] if node.name else []  # (a bare ``except``, ``case _``, ``case [*_]``)
    return [node.rest] if isinstance(node, ast.MatchMapping) and node.rest else []


def binds_name(node, name: str) -> bool:
    """Whether the syntax tree ``node`` itself (not its children) binds or deletes ``name``
    (``names_bound``)."""
    return name in names_bound(node)


def _statements(cells: list):
    """(cell, statement) for each top-level statement of the Python cells of ``cells``, in order:
    what a set-up cell binds at module level, read statement by statement."""
    import ast

    for c in cells:
        if isinstance(c, Code):
            for stmt in ast.parse(c.source).body:
                yield c, stmt


def _row_trees(row: list) -> list:
    """("cell N", its syntax tree) for each row cell with Python in it: a Python cell's source, or
    the Python a ``%%lm`` cell's parsed program holds."""
    import ast

    return [(f"cell {c.index}", tree) for c in row
            if (tree := ast.parse(c.source) if isinstance(c, Code)
                else getattr(getattr(c, "python", None), "tree", None)) is not None]


def _function_locals(function) -> set:
    """The names that are ``function``'s own variables: its parameters and what its body binds
    (not in the functions inside it), but those it declares ``global`` or ``nonlocal``."""
    import ast

    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                             *filter(None, [arguments.vararg, arguments.kwarg])]}
    names |= {n.id for n, _ in _own_nodes(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    outer = {name for n, _ in _own_nodes(function) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    return names - outer


def _own_nodes(node, tests: tuple = ()):
    """(node, the ``if`` tests whose body holds it) for each node inside ``node`` (a function) but
    those of the functions, classes and lambdas in it, which have their own variables."""
    import ast

    for field_name, value in ast.iter_fields(node):
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST) and not isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                inner = (*tests, node.test) if isinstance(node, ast.If) and field_name == "body" else tests
                yield child, inner
                yield from _own_nodes(child, inner)


def _run_reads(tree) -> list:
    """The names that the code of ``tree`` (a cell) loads where the cell runs, in order of first
    load: not in the bodies of its functions and lambdas (their decorators and defaults run), nor in
    the body of a ``try`` that catches NameError (``try: cache except NameError: cache = {}`` asks
    whether the name is set)."""
    import ast

    loads = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.append((node.lineno, node.col_offset, node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            todo += [*getattr(node, "decorator_list", ()), *arguments.defaults, *filter(None, arguments.kw_defaults)]
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))) and any(map(_catches_name_error,
                                                                                         node.handlers)):
            todo += [*node.handlers, *node.orelse, *node.finalbody]
        else:
            todo += ast.iter_child_nodes(node)
    return list(dict.fromkeys(name for _, _, name in sorted(loads)))


def _catches_name_error(handler) -> bool:
    """Whether an ``except`` clause catches NameError: bare, or naming it, Exception or BaseException."""
    import ast

    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(ast.unparse(k).split(".")[-1] in ("NameError", "Exception", "BaseException") for k in kinds)


def _tests_unset(test, names: set) -> bool:
    """Whether ``test`` is ``x is None`` or ``not x`` for a name x of ``names``."""
    import ast

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, ast.Name) and test.operand.id in names
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id in names
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _cell_binds(c: Cell) -> tuple:
    """The names cell ``c`` binds: a Python cell's ``assigns``, a ``%%lm`` cell's ``sets``; none for the others."""
    return c.assigns if isinstance(c, Code) else c.sets if isinstance(c, LMCell) else ()


def _bound_before_read(row: list) -> set:
    """The names the row cells (``Plan.row``, in order) bind before they read them: a top-level
    assignment to the name (not one in an ``if``, a loop or a ``try``, which may not run), ``def``,
    ``class`` or import above the first statement, of that cell or an earlier row cell, that reads it
    (a ``%%lm`` cell: its ``reads``). What the rows call by such a name is their own function, not
    the set-up's (``use = lambda x: x.n`` then ``use(c)``), in each pass of the notebook and in the
    job, where it is run_row's variable."""
    import ast

    read, own = set(), set()
    for c in row:
        if isinstance(c, LMCell):
            read.update(c.reads)
        if not isinstance(c, Code):
            continue
        for stmt in ast.parse(c.source).body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if stmt.value else []
                binds = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
                         and isinstance(n.ctx, ast.Store)}
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                binds = set(bound_by(stmt))  # (a recursive def's call of its own name is a call of itself)
            else:
                binds = set()
            read |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - (
                binds if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else set())
            own |= binds - read  # (a statement's reads come before its binding: use = wrap(use) calls the set-up's)
    return own


def _as_attributes(node):
    """``node`` (an expression) with ``getattr(o, 'n')`` and ``vars(o)['n']`` in it written as
    ``o.n``, and itself, ``setattr(o, 'n', v)`` or ``delattr(o, 'n')``, as the attribute ``o.n``
    set or deleted: a constant name is the attribute it names (``getattr(helpers, 'seen').append(x)``
    changes ``helpers.seen``). A copy where there is such a call, else ``node`` itself."""
    import ast

    def name(arg) -> str | None:
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
            and arg.value.isidentifier() else None

    def call_of(n, function: str, count: int) -> bool:
        return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function \
            and len(n.args) == count and not n.keywords

    class Spelled(ast.NodeTransformer):
        def visit_Call(self, n):
            n = self.generic_visit(n)
            return ast.Attribute(n.args[0], name(n.args[1]), ast.Load()) \
                if call_of(n, "getattr", 2) and name(n.args[1]) else n

        def visit_Subscript(self, n):
            n = self.generic_visit(n)
            return ast.Attribute(n.value.args[0], name(n.slice), n.ctx) \
                if call_of(n.value, "vars", 1) and name(n.slice) else n

    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in {"getattr", "vars", "setattr", "delattr"} for n in ast.walk(node)):
        return node
    node = Spelled().visit(copy.deepcopy(node))
    for function, count, ctx in (("setattr", 3, ast.Store), ("delattr", 2, ast.Del)):
        if call_of(node, function, count) and name(node.args[1]):
            return ast.Attribute(node.args[0], name(node.args[1]), ctx())
    return node
