"""Calls of a kernel variable in a cell's holes (``{f(q)}``), and the construct that a call of one
of lmnb's own functions there means (``{gen("a", max_tokens=3)}`` is the cell's ``{gen a max_tokens=3}``).

A hole is Python, so ``{gen(...)}`` reads a variable ``gen`` that no cell defines (the kernel
says "name 'gen' is not defined"); these give the fix in the cell language's words.
"""

from __future__ import annotations

import ast
import inspect
from typing import Iterator, Optional

from lmnb.template.errors import node_offset
from lmnb.template.nodes import Expr, Fork, Interp, Media, Primitive, walk

# lmnb's typed gens, which the cell writes as a gen with a dtype
_TYPED = {"gen_int": "int", "gen_string": "str"}


def _exprs(body) -> Iterator[Expr]:
    """Every Python expression of ``body`` (holes, options, media sources, fork counts and items;
    roles' and forks' bodies too), in cell order."""
    for node in walk(body):
        if isinstance(node, Interp):
            yield node.expr
        elif isinstance(node, Primitive):
            yield from (o.value for o in node.options)
        elif isinstance(node, Media):
            yield from (e for e in (node.source, node.frames) if e is not None)
        elif isinstance(node, Fork):
            yield from (e for e in (node.count, node.items) if e is not None)


def calls_of(body, name: str) -> list[tuple[int, ast.Call, str]]:
    """(offset in the cell body of the called name, the call, the source its nodes index) of each
    call of the kernel variable ``name`` in ``body`` (``{f(q)}``, ``{x + f()}``), in cell order; a
    call of a fork target or of a lambda's parameter of that name is none."""
    from lmnb.template.parser import _free_names

    out = []
    for expr in _exprs(body):
        if dict(expr.refs).get(name) != "arg":
            continue
        wrapped = "(" + expr.source + ")"  # (as the parser parsed it: the tree's columns count the "(")
        free = {id(node) for n, node in _free_names(expr.tree) if n == name}
        calls = [c for c in ast.walk(expr.tree) if isinstance(c, ast.Call) and id(c.func) in free]
        out += sorted(((expr.offset + node_offset(wrapped, c.func) - (c.func.lineno == 1), c, wrapped)
                       for c in calls), key=lambda found: found[0])
    return out


def construct_for_call(call: ast.Call, source: str) -> Optional[str]:
    """The cell's construct for ``call`` (its nodes index ``source``), a call of a name that is a
    word of the cell language or lmnb's ``gen_int``/``gen_string``: ``gen("a", max_tokens=3)`` →
    ``{gen a max_tokens=3}``, ``gen_int("n")`` → ``{gen n dtype=int}``, ``image(path)`` →
    ``{image path}``; the construct's outline (``{gen ...}``, ``{user}``) where the call's arguments
    have no such spelling (a name that is no literal, ``*args``); None for any other name."""
    from lmnb.template.parser import _SHORTHANDS, KEYWORDS, ROLES, construct_offer

    word = call.func.id
    if word not in KEYWORDS and word not in _TYPED:
        return None
    outline = _SHORTHANDS.get(word) or construct_offer(word)
    if word in ROLES:
        return "{" + word + "}...{/" + word + "}"
    if word in ("fork", "join"):  # (no lmnb function of that name: nothing to spell its arguments from)
        return outline
    typed = _TYPED.get(word)
    keywords = {k.arg: k.value for k in call.keywords}
    if (any(isinstance(a, ast.Starred) for a in call.args) or None in keywords
            or (typed and (len(call.args) > 1 or "dtype" in keywords))):  # (gen_int's later positions are SGLang's)
        return outline
    import lmnb

    try:
        bound = inspect.signature(getattr(lmnb, "gen" if typed else word)).bind(*call.args, **keywords).arguments
    except TypeError:  # (an argument lmnb's function does not take: the cell's checks name it)
        return outline

    def text(node: ast.AST) -> str:
        return ast.get_source_segment(source, node)

    if word in ("image", "video"):
        frames = f" frames={text(bound['num_frames'])}" if "num_frames" in bound else ""
        return "{" + f"{word} {text(bound['source'])}{frames}" + "}"
    name = bound.pop("name", None)
    if name is not None and not (isinstance(name, ast.Constant) and isinstance(name.value, str)
                                 and name.value.isidentifier()):
        return outline  # (the cell names the result with a bare word, never a variable's value)
    parts = ["gen" if typed else word, *([name.value] if name is not None else []),
             *([f"dtype={typed}"] if typed else []), *(f"{k}={text(v)}" for k, v in bound.items())]
    return "{" + " ".join(parts) + "}"
