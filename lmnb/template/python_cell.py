"""``%%lm --python``: a cell body that is the body of an lmnb program with an implicit state ``s``."""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import unicodedata
from dataclasses import dataclass, field

from lmnb.template.errors import (LONE_SURROGATE, TOO_DEEP, TOO_DEEP_HINT, TemplateSyntaxError, curly_quotes_hint,
                                  node_offset, offset_of, straightened, surrogate_problem)
from lmnb.template.parser import is_reserved


@dataclass(frozen=True)
class PythonCell:
    """A parsed Python-mode cell. ``source`` is the body; ``first_line`` the cell line of its line 1."""

    source: str
    first_line: int = 1
    filename: str = "<%%lm cell>"
    tree: ast.Module = field(default=None, compare=False, repr=False)

    def program(self, namespace: dict, name: str = "cell"):
        """An ``lmnb.function`` ``name(s)`` whose body is the cell; globals are ``namespace``.

        Line numbers in tracebacks are cell line numbers (under ``filename``).
        """
        import lmnb

        local: dict = {}
        exec(self.compiled(name), namespace, local)
        return lmnb.function(local[name])

    @property
    def captures(self) -> tuple[str, ...]:
        """The variables the body names with a string literal (``lmnb.gen("answer")``, in order):
        those the kernel knows before the cell runs; names computed as it runs are not here."""
        return tuple(dict.fromkeys(name for _, name, _ in _literal_result_names(self.tree)))

    def compiled(self, name: str = "cell"):
        """The code of a module defining ``def <name>(s): <body>``."""
        func = ast.FunctionDef(
            name=name,
            args=ast.arguments(posonlyargs=[], args=[ast.arg("s")], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=list(self.tree.body) or [ast.Pass()],
            decorator_list=[],
            returns=None,
        )
        if sys.version_info >= (3, 12):
            func.type_params = []
        module = ast.Module(body=[func], type_ignores=[])
        here = ast.Pass(lineno=self.first_line, col_offset=0, end_lineno=self.first_line, end_col_offset=0)
        ast.copy_location(func, self.tree.body[0] if self.tree.body else here)  # (a body of comments has none)
        ast.fix_missing_locations(module)
        return compile(module, self.filename, "exec")

    def to_python(self, name: str = "cell", parameters: tuple[str, ...] = ()) -> str:
        """Source of ``@lmnb.function def <name>(s, *parameters): <body>``; multi-line strings keep
        their text. ``parameters`` turn names the body reads from globals into arguments (the
        exporter passes a batch row's fields this way)."""
        lines = [indent_code(self.source.rstrip("\n"))] if self.source.strip() else []
        if not self.tree.body:  # empty, or comments only: a function needs a statement
            lines.append("    pass")
        return f"@lmnb.function\ndef {name}({', '.join(['s', *parameters])}):\n" + "\n".join(lines) + "\n"


def lmnb_name_fix(name: str) -> str:
    """The fix for a ``--python`` body's undefined ``name`` that lmnb exports (``gen``, ``select``,
    ``image``, ``user``, ...), which SGLang programs write unqualified (after ``from sglang import
    *``) and the body's namespace, the kernel's, does not hold: "in a --python cell, write
    lmnb.gen (...)"; "" for another name."""
    import lmnb

    if name not in lmnb.__all__:
        return ""
    return f"in a --python cell, write lmnb.{name} (or run `from lmnb import {name}` in a cell above)"


def _parses(code: str) -> bool:
    """Whether ``code`` is a Python module's source."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def parse_python(source: str, first_line: int = 1, filename: str = "<%%lm cell>", indent: str = "") -> PythonCell:
    """Parse a ``%%lm --python`` body. Raises ``TemplateSyntaxError`` with the cell line and column
    (``indent``: the indentation taken off each line of an indented cell, which columns count)."""
    source = source.replace("\r\n", "\n").replace("\r", "\n")  # a lone \r ends a line for Python too
    lone = LONE_SURROGATE.search(source)
    if lone:
        raise TemplateSyntaxError(surrogate_problem(lone.group()), source, lone.start(), first_line, indent=indent)
    try:
        tree = ast.parse(source, filename=filename)
    except (MemoryError, RecursionError):
        raise TemplateSyntaxError(TOO_DEEP, source, 0, first_line, TOO_DEEP_HINT, indent) from None
    except SyntaxError as e:
        lines = source.split("\n")
        lineno = min(max(e.lineno or 1, 1), len(lines))
        offset = offset_of(source, lineno, max((e.offset or 1) - 1, 0))
        # (the error's line offered straightened, where that makes the whole body Python)
        hint = curly_quotes_hint(source, straightened(source).split("\n")[lineno - 1].strip(), _parses)
        raise TemplateSyntaxError(f"invalid Python: {e.msg}", source, offset, first_line, hint, indent) from None
    found = _yield_in_body(tree)
    if found is not None:  # the body would become a generator function: the cell would run nothing
        raise TemplateSyntaxError("a --python body cannot use yield: it runs as the program's function, which "
                                  "yield would turn into a generator that never runs; use s += ... instead",
                                  source, node_offset(source, found), first_line, indent=indent)
    found = _assignment_to_s(tree)
    if found is not None:  # s = "..." leaves the state behind: nothing after it reaches the model
        raise TemplateSyntaxError("s is the program's state; binding it (s = ..., for s in ..., import ... as s) "
                                  "replaces it with another value, so nothing after it reaches the model; add to "
                                  "it with s += ... (or use another name)",
                                  source, node_offset(source, found), first_line, indent=indent)
    branches = _branch_parts(tree)  # (a branch's result is a kernel variable only if the branches are joined)
    found = next((f for f in _literal_result_names(tree) if result_name_problem(f[1]) and f[2] not in branches),
                 None)
    if found is not None:  # the kernel would put it among its variables, where no code could read it
        call, name, node = found
        problem, fix = result_name_problem(name), variable_name_for(name)
        raise TemplateSyntaxError(f"{call}({name!r}) names the kernel variable its result goes in, but {problem}, so "
                                  f"no code could read the variable; name it {fix!r}", source,
                                  node_offset(source, node), first_line,
                                  f"the first argument of {call} names its variable; the prompt is what s holds "
                                  f"(s += \"...\"): {call}({fix!r}{'' if call.endswith('var_scope') else ', ...'})",
                                  indent)
    ast.increment_lineno(tree, first_line - 1)
    cell = PythonCell(source, first_line, filename, tree)
    try:  # what only a function body refuses (await, nonlocal) shows here, not as a traceback later
        cell.compiled()
    except SyntaxError as e:
        line = min(max((e.lineno or first_line) - first_line + 1, 1), source.count("\n") + 1)
        offset = offset_of(source, line, max((e.offset or 1) - 1, 0))
        raise TemplateSyntaxError(f"invalid Python in a --python body (it runs as the program's function): "
                                  f"{e.msg}", source, offset, first_line, indent=indent) from None
    return cell


# the calls whose first argument (or name=) names a variable of the state, which a cell captures
_NAMING_CALLS = ("gen", "select", "gen_int", "gen_string", "var_scope")


def _literal_result_names(tree: ast.AST) -> list[tuple[str, str, ast.AST]]:
    """(the call as written, its name, the name's node) of each ``gen("answer")`` (``gen``,
    ``select``, ``gen_int``, ``gen_string``, bare or of the ``lmnb`` module, as the kernel's
    globals or the body's ``import lmnb as sgl`` name it; ``s.var_scope``) of the body itself
    that names its variable with a string literal, in order. A method of another object is not
    lmnb's (``soup.select("div p")``, ``df.select("first name")``: its string is no result name);
    functions defined in the body are left alone (they may be programs of their own, whose results
    the cell does not capture), as are names computed as it runs and blank ones, which ``gen``
    refuses itself."""
    modules = {"lmnb"} | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
                          for alias in node.names if alias.name == "lmnb" and alias.asname}
    found, todo = [], list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if not isinstance(node, ast.Call):
            continue
        func, call = node.func, None
        if isinstance(func, ast.Name):
            call = func.id
        elif isinstance(func, ast.Attribute) and (func.attr == "var_scope" or (
                isinstance(func.value, ast.Name) and func.value.id in modules)):
            call = func.attr
        named = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
        if (call in _NAMING_CALLS and isinstance(named, ast.Constant) and isinstance(named.value, str)
                and named.value.strip()):
            found.append((ast.unparse(node.func), named.value, named))
    return sorted(found, key=lambda f: (f[2].lineno, f[2].col_offset))


def _branch_parts(tree: ast.AST) -> set:
    """The nodes of what the body adds to a state other than ``s`` (``b += lmnb.gen("idea text")``
    of a fork's branch ``b``, ``b.var_scope(...)``): a branch's result reaches the kernel's
    variables only if the body joins the branches, so a name there that no variable can have is
    caught as the cell runs (``_readable`` in the kernel), not refused before: the branches'
    ``b["idea text"]``, read in the body, are a program the kernel ran without a word."""
    parts: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and not (isinstance(node.target, ast.Name) and node.target.id == "s"):
            parts.update(ast.walk(node.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "var_scope"
              and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "s")):
            parts.update(ast.walk(node))
    return parts


def result_name_problem(name: str) -> str | None:
    """Why a result named ``name`` can be in no kernel variable that code reads back by that name
    (``'my answer' is no Python name``), None where it can."""
    if not name.isidentifier():
        return f"{name!r} is no Python name"
    if is_reserved(name):
        return f"{unicodedata.normalize('NFKC', name)!r} is reserved in Python"
    if unicodedata.normalize("NFKC", name) != name:
        return f"Python reads the name {name!r} as {unicodedata.normalize('NFKC', name)!r}"
    return None


def variable_name_for(name: str) -> str:
    """A Python name close to the result name ``name`` (``my answer`` → ``my_answer``, ``1st`` →
    ``_1st``, ``class`` → ``class_``), to offer in ``result_name_problem``'s refusal."""
    fixed = re.sub(r"\W+", "_", unicodedata.normalize("NFKC", name)).strip("_") or "result"
    fixed = "_" + fixed if fixed[0].isdigit() else fixed
    return fixed + "_" if is_reserved(fixed) else fixed


def _yield_in_body(tree: ast.AST) -> ast.AST | None:
    """The first ``yield`` / ``yield from`` of the body itself (not of a function defined in it)."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return None


def _assignment_to_s(tree: ast.AST) -> ast.AST | None:
    """The first binding of ``s`` by the body itself other than ``s += ...`` (``s = ...``, ``s, t = ...``,
    ``for s in``, ``with ... as s``, ``import ... as s``, ``del s``, ...); functions, classes, lambdas
    and comprehensions defined in it have their own ``s``, unless they reach the body's
    (``nonlocal s`` in a helper, ``:=`` in a comprehension)."""
    found = _program_s_bindings(tree.body)
    return min(found, key=lambda n: (n.lineno, n.col_offset), default=None)


def _program_s_bindings(body: list[ast.AST]) -> list[ast.AST]:
    """The bindings of the program's ``s`` in ``body``, the statements of a scope whose ``s`` is
    the program's, and in the functions and classes defined there whose ``s`` is that one too."""
    found, scopes, _ = _own_bindings(body)
    return found + _reaching(scopes)


def _reaching(scopes: list[ast.AST]) -> list[ast.AST]:
    """The bindings of the program's ``s`` in functions and classes defined where ``s`` is the
    program's: a function's ``s`` is its own if it is a parameter, or the function binds it
    without ``nonlocal s``; a class body never hides it from the functions in the class."""
    found = []
    for scope in scopes:
        own, inner, declared = _own_bindings(scope.body)
        if declared == "nonlocal":
            found += own + _reaching(inner)
        elif isinstance(scope, ast.ClassDef):
            found += _reaching(inner) if declared is None else []
        elif declared is None and not own and "s" not in _parameters(scope):
            found += _reaching(inner)
    return found


def _own_bindings(body: list[ast.AST]) -> tuple[list[ast.AST], list[ast.AST], str | None]:
    """(bindings of ``s`` by the statements of one scope, the functions and classes defined in it,
    ``"nonlocal"`` / ``"global"`` if the scope declares ``s`` so)."""
    found, scopes, declared = [], [], None
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            todo.append(node.value)  # s += ... adds to the state
            continue
        if isinstance(node, (ast.Nonlocal, ast.Global)) and "s" in node.names:
            declared = "nonlocal" if isinstance(node, ast.Nonlocal) else "global"
        name = (node.id if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)
                else (node.asname or node.name.split(".")[0]) if isinstance(node, ast.alias)
                else getattr(node, "name", None) if isinstance(node, _NAMED_BINDINGS) else None)
        if name == "s":
            found.append(node)
        if isinstance(node, _COMPREHENSIONS):
            found.extend(_walrus_to_s(node))  # := in a comprehension binds the enclosing function's name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scopes.append(node)
        if isinstance(node, _OWN_SCOPE):
            todo.extend(_evaluated_outside(node))
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found, scopes, declared


def _parameters(func: ast.AST) -> set[str]:
    a = func.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}


def _walrus_to_s(comprehension: ast.AST) -> list[ast.AST]:
    """The ``s := ...`` of a comprehension (nested ones included, not functions or lambdas in it)."""
    found = []
    todo = [comprehension]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.NamedExpr) and node.target.id == "s":
            found.append(node.target)
        if isinstance(node, _OWN_SCOPE) and not isinstance(node, _COMPREHENSIONS):
            todo.extend(_evaluated_outside(node))
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def _evaluated_outside(node: ast.AST) -> list[ast.AST]:
    """The parts of a function, lambda, class or comprehension that run in the enclosing scope:
    default values, decorators, base classes, the first iterable of a comprehension."""
    if isinstance(node, _COMPREHENSIONS):
        return [node.generators[0].iter]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    parts = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    return parts + (node.decorator_list if not isinstance(node, ast.Lambda) else [])


_NAMED_BINDINGS = (ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, *_COMPREHENSIONS)


def indent_code(source: str) -> str:
    """Indent each line by four spaces, except lines that continue a multi-line string literal."""
    inside: set[int] = set()  # 1-based lines that start inside a string token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return "\n".join(
        line if (i in inside or not line) else "    " + line for i, line in enumerate(source.split("\n"), start=1)
    )
