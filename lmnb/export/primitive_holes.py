"""The export's refusal of a ``%%lm`` hole that calls one of lmnb's primitives through a name a
cell imports (``{lmnb.gen("a", max_tokens=3)}``, ``{gen("a")}`` after ``from lmnb import gen``).

The job's generated code formats a hole in an f-string, so such a hole sent the text "Gen('a')" and
generated nothing in every row, without a word; the notebook's cell refuses its value as it runs
(``lmnb.template.hole_values``). The export runs no cell, so it reads the imports instead.
"""

from __future__ import annotations

import ast
from typing import Iterator, Sequence

from lmnb.export.cells import Code, ExportError, bound_by
from lmnb.export.syntax import _statements
from lmnb.template.errors import TemplateRuntimeError
from lmnb.template.hole_values import PRIMITIVE_FUNCTIONS, held_refusal, held_where, primitive_refusal
from lmnb.template.nodes import Interp, walk

_MODULE = ""  # what _lmnb_names maps a name of the lmnb module itself to
_DISPLAYS = {ast.List: "list", ast.Tuple: "tuple", ast.Set: "set", ast.Dict: "dict"}


def refuse_primitive_holes(cells: Sequence, lm_cells: Sequence) -> None:
    """Refuse the first hole of ``lm_cells`` whose value is a call of lmnb's ``gen``, ``select``,
    ``image``, ``video``, ``gen_int``/``gen_string`` or a role function (alone or added to text:
    ``{"A: " + lmnb.gen("a")}``), or a list, tuple, dict or set display that holds one
    (``{[lmnb.gen("a")]}``), through ``lmnb`` (which the kernel sets) or a name that a Python cell
    of ``cells`` imports from lmnb, or a variable that a Python cell sets to such a value (``g =
    lmnb.gen("a")``, then ``{g}`` or ``{[g]}``). What the export cannot read so (a function's
    result) is left as it was: the job's prompt holds its repr.

    Raises:
        ExportError: "cell N (%%lm): line L, col C: {...} is lmnb.gen(...), an lmnb primitive, not
            text ...; did you mean {gen a max_tokens=3}?" (or "{[...]} holds lmnb.gen(...), an lmnb
            primitive, at [0], not text ...") with the fix.
    """
    names, values = _lmnb_names(cells)
    for c in lm_cells:
        if c.template is None:
            continue
        for node in (n for n in walk(c.template.body) if isinstance(n, Interp)):
            args = {n for n, kind in node.expr.refs if kind == "arg"}
            called = next(_called(node.expr.tree.body, names, values, args), None)
            if called is not None:
                t, (spelled, word, steps, container) = c.template, called
                what = f"{spelled}, an lmnb primitive"
                problem, fix = (held_refusal(node.expr, what, held_where(steps), container, True) if steps
                                else primitive_refusal(node.expr, what, word))
                error = TemplateRuntimeError(problem, t.source, node.offset, t.first_line, indent=t.indent, hint=fix)
                raise ExportError(f"cell {c.index} (%%lm): {error}")


def _lmnb_names(cells: Sequence) -> tuple[dict[str, str], dict[str, tuple]]:
    """(name → the lmnb primitive it is: ``"gen"`` for ``from lmnb import gen as g``'s ``g``, or
    ``_MODULE`` for the module: ``lmnb``, which the kernel sets, and ``import lmnb as L``'s ``L``;
    variable → (what it was set to, "lmnb.gen(...) (cell 1)", the primitive, and as ``_called``
    gives them the steps to it and the container) where the cell's last binding of it is ``g =
    lmnb.gen(...)`` or ``g = [lmnb.gen(...)]``), as the notebook's Python cells leave them."""
    names, values = {"lmnb": _MODULE}, {}
    for c, stmt in _statements([c for c in cells if isinstance(c, Code)]):
        bound = bound_by(stmt)
        for n in bound:  # (gen = my_gen after the import: no longer lmnb's)
            names.pop(n, None)
            values.pop(n, None)
        if isinstance(stmt, ast.Import):
            names.update({(a.asname or "lmnb"): _MODULE for a in stmt.names
                          if a.name == "lmnb" or (a.asname is None and a.name.startswith("lmnb."))})
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "lmnb" and not stmt.level:
            names.update({(a.asname or a.name): a.name for a in stmt.names if a.name in PRIMITIVE_FUNCTIONS})
            if any(a.name == "*" for a in stmt.names):
                names.update({n: n for n in PRIMITIVE_FUNCTIONS})
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            called = next(_called(stmt.value, names, values, set(names) | set(values)), None)
            if called is not None:
                values.update({t.id: (f"{called[0]} (cell {c.index})", *called[1:]) for t in stmt.targets})
    return names, values


def _called(tree: ast.expr, names: dict, values: dict, args: set) -> Iterator[tuple[str, str, tuple, str]]:
    """("lmnb.gen(...)" as the hole spells it, "gen", the steps to it, the container) for each call
    of a primitive, or variable holding one, that is ``tree``, one of the terms it adds up (``"A: "
    + gen("a")``) or an item of a list, tuple, dict or set display (``[gen("a")]``, nested too);
    the steps (``held_where``'s: ``("[0]",)``, ``("key",)``) and the outermost container's name
    (``"list"``) are ``()`` and ``""`` for one that is not in a container; ``args``: the names the
    hole reads from the kernel (not a fork target's)."""
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Add):
        yield from _called(tree.left, names, values, args)
        yield from _called(tree.right, names, values, args)
    elif type(tree) in _DISPLAYS:
        for step, item in _display_items(tree):
            for spelled, word, steps, _ in _called(item, names, values, args):
                yield spelled, word, (step, *steps), _DISPLAYS[type(tree)]
    elif isinstance(tree, ast.Name) and tree.id in args and tree.id in values:
        yield values[tree.id]
    elif isinstance(tree, ast.Call):
        f = tree.func
        if isinstance(f, ast.Name) and f.id in args and names.get(f.id):
            yield f"{f.id}(...)", names[f.id], (), ""
        elif (isinstance(f, ast.Attribute) and f.attr in PRIMITIVE_FUNCTIONS and isinstance(f.value, ast.Name)
              and f.value.id in args and names.get(f.value.id) == _MODULE):
            yield f"{f.value.id}.{f.attr}(...)", f.attr, (), ""


def _display_items(tree: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """(the step to it, as ``held_where`` reads steps, the item) of each item of a list, tuple, set or
    dict display; none after a ``*xs`` or ``**d``, whose items move the indexes after it."""
    if isinstance(tree, ast.Dict):
        for key, value in zip(tree.keys, tree.values):
            if key is None:
                return
            yield "key", key
            yield f"[{ast.unparse(key)}]", value
    elif isinstance(tree, ast.Set):
        yield from (("set", e) for e in tree.elts)
    else:
        for i, e in enumerate(tree.elts):
            if isinstance(e, ast.Starred):
                return
            yield f"[{i}]", e
