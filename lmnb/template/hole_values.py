"""lmnb's own objects as a hole's value: refused, since a hole's value is prompt text.

``{lmnb.gen("a", max_tokens=3)}`` (SGLang's ``s += "A:" + sgl.gen("a")`` written into a hole) made
the text "Gen('a')": the cell ran with no gen, and the export's job did the same. The cell language
writes it ``{gen a max_tokens=3}``; a ``--python`` body adds it as SGLang does. A program's state, a
fork's branches and a program itself are refused alike (their ``str`` is no text a prompt means).
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from lmnb.template.nodes import Expr

# lmnb's functions that return a primitive (an lmnb.ir.Expr), which a hole cannot hold
PRIMITIVE_FUNCTIONS = frozenset({
    "gen", "gen_int", "gen_string", "select", "image", "video",
    *(f"{role}{end}" for role in ("system", "user", "assistant") for end in ("", "_begin", "_end"))})


def construct_of_hole(expr: Expr, word: Optional[str] = None) -> Optional[str]:
    """The cell's construct for a hole that is a call of one of lmnb's primitives, bare or through
    a module (``gen("a", max_tokens=3)``, ``lmnb.gen("a", max_tokens=3)``: ``{gen a max_tokens=3}``;
    ``lmnb.user_begin()``: ``{user}...{/user}``); None for another hole. ``word``: the primitive the
    call's name is (``"user"`` for ``u`` of ``from lmnb import user as u``); default the name."""
    from lmnb.template.calls import construct_for_call

    call = expr.tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    word = word or (call.func.id if isinstance(call.func, ast.Name) else call.func.attr)
    for end in ("_begin", "_end"):
        word = word.removesuffix(end)
    if word not in PRIMITIVE_FUNCTIONS:
        return None
    return construct_for_call(ast.Call(ast.Name(word), call.args, call.keywords), "(" + expr.source + ")")


def primitive_refusal(expr: Expr, what: str, word: Optional[str] = None) -> tuple[str, str]:
    """(the problem, the fix) of the hole ``{expr}``, whose value is ``what`` (at run time "an lmnb
    primitive, Gen('a')"; in the export, which runs nothing, "lmnb.gen(...), an lmnb primitive");
    ``word``: as ``construct_of_hole`` takes it."""
    construct = construct_of_hole(expr, word)
    meant = f"; did you mean {construct}?" if construct else ""
    problem = (f"{{{expr.source}}} is {what}, not text: a hole's value becomes prompt text (its repr), and the "
               f"primitive would not run{meant}")
    fix = f"write {construct or 'the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...)'}"
    return problem, f"{fix} in place of the hole, or add it in a %%lm --python cell: s += {expr.source.strip()}"


def refused_value(value: Any, expr: Expr) -> Optional[tuple[str, str]]:
    """(the problem, the fix) of ``value``, the value of the hole ``{expr}``, where it is one of lmnb's
    own objects: a primitive (``lmnb.ir.Expr``: ``gen(...)``, ``"A: " + gen(...)``, ``user("hi")``), a
    ``ProgramState``, a ``ProgramStateGroup`` (a fork's branches) or an ``SglFunction``; else None.
    Reads no state (``str`` of a state waits for its program)."""
    from lmnb.api import SglFunction
    from lmnb.interpreter import ProgramState, ProgramStateGroup
    from lmnb.ir import Expr as Primitive
    from lmnb.tracer import stop_if_tracing

    hole, source = "{" + expr.source + "}", expr.source.strip()
    if isinstance(value, (Primitive, ProgramState, ProgramStateGroup, SglFunction)):
        stop_if_tracing()  # (run_batch's prefix trace: an argument's placeholder is a Primitive; its text ends it)
    if isinstance(value, Primitive):
        return primitive_refusal(expr, f"an lmnb primitive, {value!r}")
    if isinstance(value, ProgramState):
        return (f"{hole} is an lmnb ProgramState (a program's state), not text",
                f"write {{{source}.text()}} for its text, or {{{source}['NAME']}} for a variable it captured")
    if isinstance(value, ProgramStateGroup):
        return (f"{hole} is a fork's branches (an lmnb ProgramStateGroup), not text",
                f"write {{{source}[0].text()}} for a branch's text")
    if isinstance(value, SglFunction):
        return (f"{hole} is the lmnb program {value.__name__!r} itself, not text",
                f"write {{{source}(...).text()}} for the text of a run of it, or call its body on this state "
                f"in a %%lm --python cell: {source}.func(s, ...)")
    return None
