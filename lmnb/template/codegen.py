"""Face 2: write a ``Template`` as readable Python source that uses only ``lmnb``.

The notebook → script exporter calls this (through ``Template.to_python``); the kernel runs the
same tree through ``interpreter``. Both issue the same lmnb calls in the same order.
"""

from __future__ import annotations

import ast
import copy

from lmnb.template.nodes import Expr, Fork, Interp, Media, Primitive, Role, Target, Text, statements, target_names
from lmnb.template.options import braced_item, shared_by_branches
from lmnb.template.template import python_name

_INDENT = "    "
# Characters that keep an expression out of an f-string replacement field on Python 3.10/3.11.
_NOT_IN_FSTRING = set('\\"\n#{}!:')


def generate(template, name: str, parameters: tuple[str, ...]) -> str:
    """Source of ``@lmnb.function def <name>(s, <parameters>): ...`` for ``template``."""
    unknown = [p for p in parameters if p not in template.arguments]
    if unknown:
        raise ValueError(f"{unknown} are not arguments of this cell; its arguments are {list(template.arguments)}")
    params = {k: v for k, v in template.parameters.items() if k in parameters}
    for g in template.arguments:
        if g not in params and python_name(g) != g:
            raise ValueError(f"the global {g!r} clashes with a name the generated code uses; make it a parameter")
    gen = _Writer(params)
    gen.block(template.body, "s", {}, 1, depth=0)
    body = gen.lines or [_INDENT + "pass"]
    signature = ", ".join(["s", *params.values()])
    return "\n".join(["@lmnb.function", f"def {name}({signature}):", *body]) + "\n"


class _Writer:
    def __init__(self, params: dict[str, str]):
        self.params = params
        self.lines: list[str] = []
        self.bound = None  # inside a fork: the names its innermost fork binds (branch_choices); else None

    def emit(self, indent: int, text: str) -> None:
        self.lines += [_INDENT * indent + line for line in text.split("\n")]

    # names: what each name an expression reads becomes in the generated code
    def rename(self, expr: Expr, state: str, local: dict[str, str]) -> dict[str, str]:
        out = {}
        for n, kind in expr.refs:
            if kind == "local":
                out[n] = local[n]
            elif kind == "var":
                out[n] = f"{state}[{n!r}]"
            else:
                out[n] = self.params.get(n, n)
        return out

    def expr(self, expr: Expr, state: str, local: dict[str, str]) -> str:
        names = self.rename(expr, state, local)
        # The parser read the source inside parentheses; a bare tuple or generator needs them
        # as a call argument (choices="a", "b" would be two arguments), and unparse writes them.
        bare = isinstance(expr.tree.body, (ast.Tuple, ast.GeneratorExp))
        if all(v == k for k, v in names.items()) and "\n" not in expr.source and not bare:
            return expr.source
        tree = copy.deepcopy(expr.tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in names:
                node.id = names[node.id]  # may be "s['x']": unparse writes it verbatim
        return ast.unparse(tree.body)

    def block(self, nodes, state: str, local: dict[str, str], indent: int, depth: int) -> None:
        run: list = []
        for node in nodes:
            if isinstance(node, (Text, Interp)):
                run.append(node)
                continue
            self.texts(run, state, local, indent)
            run = []
            if isinstance(node, Primitive):
                self.emit(indent, f"{state} += {self.primitive(node, state, local)}")
            elif isinstance(node, Media):
                self.emit(indent, f"{state} += {self.media(node, state, local)}")
            elif isinstance(node, Role):
                self.role(node, state, local, indent, depth)
            elif isinstance(node, Fork):
                self.fork(node, state, local, indent, depth)
        self.texts(run, state, local, indent)

    def texts(self, run: list, state: str, local, indent: int) -> None:
        for group in statements(run) if run else ():
            self.emit(indent, f"{state} += {self.text(group, state, local)}")

    def primitive(self, node: Primitive, state: str, local) -> str:
        args = [] if node.name is None else [_literal(node.name)]
        for o in node.options:
            value = self.expr(o.value, state, local)
            if o.key == "choices" and self.bound is not None and shared_by_branches(o.value, self.bound):
                value = f"lmnb.template.branch_choices({value}, {_literal(o.value.source.strip())})"
            args.append(f"{o.key}={value}")
        return f"lmnb.{node.primitive}({', '.join(args)})"

    def media(self, node: Media, state: str, local) -> str:
        source = self.expr(node.source, state, local)
        if node.frames is None:
            return f"lmnb.image({source})"
        return f"lmnb.video({source}, {self.expr(node.frames, state, local)})"

    def role(self, node: Role, state: str, local, indent: int, depth: int) -> None:
        if node.simple:
            text = self.text(list(node.body), state, local) if node.body else '""'
            self.emit(indent, f"{state} += lmnb.{node.role}({text})")
            return
        self.emit(indent, f"{state} += lmnb.{node.role}_begin()")
        self.block(node.body, state, local, indent, depth)
        self.emit(indent, f"{state} += lmnb.{node.role}_end()")

    def fork(self, node: Fork, state: str, local: dict[str, str], indent: int, depth: int) -> None:
        d = "" if depth == 0 else str(depth + 1)
        forks, branch, items = f"forks{d}", f"f{d}", f"items{d}"
        inner = dict(local)
        if node.count is not None:
            count = self.expr(node.count, state, local)
            if not _is_literal(node.count):  # (a literal count was checked when the cell was parsed)
                # (the source, for the message's fix in the user's own words: {fork s} with s = {2})
                count = (f"lmnb.template.fork_count({self.braced(count, node.count.source)}, "
                         f"{_literal(node.count.source)})")
            self.emit(indent, f"{forks} = {state}.fork({count})")
            self.emit(indent, f"for {branch} in {forks}:")
        else:
            taken = set(self.params.values()) | set(local.values())
            target = _target_source(node.target, inner, taken)
            source = self.braced(self.expr(node.items, state, local), node.items.source)
            self.emit(indent, f"{items} = lmnb.template.fork_items({source}, {_literal(node.items.source)})")
            self.emit(indent, f"{forks} = {state}.fork(len({items}))")
            self.emit(indent, f"for {branch}, {target} in zip({forks}, {items}):")
        before = len(self.lines)
        outer, self.bound = self.bound, frozenset(target_names(node.target) if node.target is not None else ())
        self.block(node.body, branch, inner, indent + 1, depth + 1)
        self.bound = outer
        if len(self.lines) == before:
            self.emit(indent + 1, "pass")
        mode = "" if node.join == "gather_variable" else _literal(node.join)
        self.emit(indent, f"{forks}.join_or_abort({mode})")  # (as the cell joins: a failed branch aborts the rest)

    @staticmethod
    def braced(code: str, source: str) -> str:
        """``code`` (the generated expression of a fork's ``source``), where ``source`` is one braced
        item, ``{items}``, as ``lmnb.template.braced_set(items, "{items}")``: Python's set of a list
        failed the job with a bare "unhashable type: 'list'", where the kernel says the braces made it."""
        if braced_item(source) is None:
            return code
        item = ast.unparse(ast.parse(code, mode="eval").body.elts[0])
        return f"lmnb.template.braced_set({item}, {_literal(source)})"

    def text(self, run: list, state: str, local) -> str:
        """A Python string expression for a run of text and interpolations (f-string when possible)."""
        parts: list = []  # str or rendered expression source (wrapped in a 1-tuple)
        for node in run:
            parts.append(node.text if isinstance(node, Text) else (self.expr(node.expr, state, local), node))
        fstring_ok = all(isinstance(p, str) or _fits_fstring(*p) for p in parts)
        lines = _split_lines(parts)
        rendered = [_render_line(line, fstring_ok) for line in lines]
        if len(rendered) == 1:
            return rendered[0]
        # Lines are indented relative to the statement; ``emit`` adds the statement's indent.
        sep = "\n" + _INDENT
        joiner = sep if fstring_ok else " +" + sep
        return "(" + sep + joiner.join(rendered) + "\n)"


def _split_lines(parts: list) -> list[list]:
    """Split parts after each newline in text, so multi-line prompts print one line per line."""
    lines: list[list] = [[]]
    for p in parts:
        if not isinstance(p, str):
            lines[-1].append(p)
            continue
        chunks = p.split("\n")
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            text = chunk if last else chunk + "\n"
            if text:
                lines[-1].append(text)
            if not last:
                lines.append([])
    return [line for line in lines if line]


def _render_line(parts: list, fstring_ok: bool) -> str:
    if all(isinstance(p, str) for p in parts):
        return _literal("".join(parts))
    if fstring_ok:
        body = "".join(_escape(p).replace("{", "{{").replace("}", "}}") if isinstance(p, str) else _field(*p) for p in parts)
        return f'f"{body}"'
    return " + ".join(_literal(p) if isinstance(p, str) else _call(*p) for p in parts)


def _fits_fstring(source: str, node: Interp) -> bool:
    return not (set(source) & _NOT_IN_FSTRING or set(node.spec) & set('\\"\n{}'))


def _field(source: str, node: Interp) -> str:
    """An f-string replacement field for an interpolation."""
    conv = f"!{node.conversion}" if node.conversion else ""
    spec = f":{node.spec}" if node.spec else ""
    return "{" + source + conv + spec + "}"


def _call(source: str, node: Interp) -> str:
    """The same interpolation as a plain call, for expressions an f-string cannot hold."""
    if node.conversion:
        source = f"{dict(r='repr', s='str', a='ascii')[node.conversion]}({source})"
        return f"format({source}, {_literal(node.spec)})" if node.spec else source
    return f"format({source}, {_literal(node.spec)})" if node.spec else f"str({source})"


def _escape(text: str) -> str:
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 32 or ord(c) == 127:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)


def _literal(text: str) -> str:
    return f'"{_escape(text)}"'


def _is_literal(expr: Expr) -> bool:
    try:
        ast.literal_eval(expr.tree.body)
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


def _target_source(target: Target, local: dict[str, str], taken: set[str]) -> str:
    if isinstance(target, str):
        local[target] = python_name(target, taken)
        return local[target]
    inner = ", ".join(_target_source(t, local, taken) for t in target)
    return f"({inner})"
