"""lmnb's own objects as a hole's value: refused, since a hole's value is prompt text.

``{lmnb.gen("a", max_tokens=3)}`` (SGLang's ``s += "A:" + sgl.gen("a")`` written into a hole) made
the text "Gen('a')": the cell ran with no gen, and the export's job did the same. The cell language
writes it ``{gen a max_tokens=3}``; a ``--python`` body adds it as SGLang does. A program's state, a
fork's branches and a program itself are refused alike (their ``str`` is no text a prompt means),
and so is a list, tuple, dict or set that holds one (``{[x]}``: a container's text is its items' repr).
"""

from __future__ import annotations

import ast
import collections
import functools
import itertools
import reprlib
import sys
from typing import Any, Callable, Iterable, Optional

from lmnb.template.nodes import Expr, written_hole

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
    problem = (f"{written_hole(expr.source)} is {what}, not text: a hole's value becomes prompt text (its repr), and the "
               f"primitive would not run{meant}")
    fix = f"write {construct or 'the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...)'}"
    return problem, f"{fix} in place of the hole, or add it in a %%lm --python cell: s += {expr.source.strip()}"


def held_refusal(expr: Expr, what: str, where: str, container: str, primitive: bool) -> tuple[str, str]:
    """(the problem, the fix) of the hole ``{expr}``, whose value is a ``container`` (``"list"``,
    ``"dict"``, ...) that holds ``what`` (at run time "an lmnb primitive, Gen('a')"; in the export
    "lmnb.gen(...), an lmnb primitive") ``where`` ("at [0]['k']", "as an item of the set at [1]");
    ``primitive``: ``what`` is a primitive (not a state, a fork's branches or a program)."""
    why = (f"a {container}'s text is its items' repr, and the primitive would not run" if primitive
           else f"and a {container}'s text is its items' repr")
    problem = f"{written_hole(expr.source)} holds {what}, {where}, not text: a hole's value becomes prompt text, {why}"
    if primitive:
        return problem, ("write the construct ({gen NAME ...}, {select NAME choices=[...]}, {image SRC}, ...) in "
                         "place of the hole, or add the primitive in a %%lm --python cell: s += lmnb.gen(...)")
    return problem, ("take the text out where the value is built: a state's .text() (or ['NAME'] for a variable "
                     "it captured), a fork branch's [0].text(), a program's (...).text()")


def refused_value(value: Any, expr: Expr) -> Optional[tuple[str, str]]:
    """(the problem, the fix) of ``value``, the value of the hole ``{expr}``, where it is one of lmnb's
    own objects: a primitive (``lmnb.ir.Expr``: ``gen(...)``, ``"A: " + gen(...)``, ``user("hi")``), a
    ``ProgramState``, a ``ProgramStateGroup`` (a fork's branches) or an ``SglFunction``, or a list,
    tuple, dict or set that holds one (``held_object``); else None. Reads no state (``str`` of a state
    waits for its program)."""
    from lmnb.ir import Expr as Primitive

    if _is_own(value):
        if isinstance(value, Primitive):
            return primitive_refusal(expr, _what(value))
        source = expr.source.strip()
        if not isinstance(expr.tree.body, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            source = f"({source})"  # (the fix adds .text(): "{c or v.text()}" would call it on v alone)
        return _own_refusal(value, written_hole(expr.source), source)
    held = held_object(value)
    if held is None:
        return None
    where, item = held
    return held_refusal(expr, _what(item), where, _container_name(value), isinstance(item, Primitive))


def _is_own(value: Any) -> bool:
    """``value`` is one of lmnb's own objects that a hole refuses; ends a prefix trace where it is
    (``run_batch``'s: an argument's placeholder is a primitive, whose text ends the trace)."""
    if not isinstance(value, _own_types()):
        return False
    from lmnb.tracer import stop_if_tracing

    stop_if_tracing()
    return True


@functools.lru_cache(maxsize=None)
def _own_types() -> tuple[type, ...]:
    """lmnb's primitive, ``ProgramState``, ``ProgramStateGroup`` and ``SglFunction`` (imported once:
    a container's search asks of each item)."""
    from lmnb.api import SglFunction
    from lmnb.interpreter import ProgramState, ProgramStateGroup
    from lmnb.ir import Expr as Primitive

    return Primitive, ProgramState, ProgramStateGroup, SglFunction


def _what(value: Any) -> str:
    """How a refusal names ``value``, one of lmnb's own objects."""
    from lmnb.api import SglFunction
    from lmnb.interpreter import ProgramState
    from lmnb.ir import Expr as Primitive

    if isinstance(value, Primitive):
        return f"an lmnb primitive, {value!r}"
    if isinstance(value, ProgramState):
        return "an lmnb ProgramState (a program's state)"
    if isinstance(value, SglFunction):
        return f"the lmnb program {value.__name__!r}"
    return "a fork's branches (an lmnb ProgramStateGroup)"


def _own_refusal(value: Any, hole: str, source: str) -> tuple[str, str]:
    from lmnb.interpreter import ProgramState, ProgramStateGroup

    if isinstance(value, ProgramState):
        captured = written_hole(source + "['NAME']")
        return (f"{hole} is {_what(value)}, not text",
                f"write {written_hole(source + '.text()')} for its text, or {captured} for a variable it captured")
    if isinstance(value, ProgramStateGroup):
        return (f"{hole} is {_what(value)}, not text", f"write {written_hole(source + '[0].text()')} for a branch's text")
    return (f"{hole} is {_what(value)} itself, not text",
            f"write {written_hole(source + '(...).text()')} for the text of a run of it, or call its body on this state "
            f"in a %%lm --python cell: {source}.func(s, ...)")


# How far a hole's container is searched for lmnb's objects: HELD_DEPTH containers down, HELD_ITEMS
# items in all, so that a hole holding a long list (a document's lines) costs next to nothing more.
HELD_DEPTH, HELD_ITEMS = 4, 1000
# (a deque's, a UserList's and a UserDict's text is their items' repr too)
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque, collections.UserList, collections.UserDict)
_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})
_KEY = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_KEY.maxstring = _KEY.maxother = 30


def held_object(value: Any) -> Optional[tuple[str, Any]]:
    """(where, the object) of the first of lmnb's own objects (as ``refused_value`` names them) that
    ``value``, a list, tuple, dict, set, frozenset, deque, UserList or UserDict (their subclasses
    too: a namedtuple, an OrderedDict), holds, its containers searched in order, depth first, up to ``HELD_DEPTH`` deep
    and ``HELD_ITEMS`` items in all; where is "at [0]['k']" (the indexes that reach it), or "as an
    item of the set", "in a key of the dict at [1]" where no index reaches it; None where none is
    found, and for any other value (whose own ``str`` may hide its items)."""
    found = _search(value, (), HELD_DEPTH, [HELD_ITEMS])
    if found is None:
        return None
    return held_where(tuple(map(_step_text, found[0]))), found[1]


def _step_text(step) -> str:
    """``held_where``'s step for one of ``_items``': "[0]" for an index, "['k']" for a dict's key."""
    if isinstance(step, int):
        return f"[{step}]"
    return step if isinstance(step, str) else f"[{_KEY.repr(step[0])}]"


def _search(value: Any, steps: tuple, depth: int, budget: list,
            wanted: Optional[Callable[[Any], bool]] = None) -> Optional[tuple[tuple, Any]]:
    """(the steps to it, the object) of ``held_object``, in ``value`` reached by ``steps``; ``budget``:
    [the items it may still look at]; ``wanted``: the test of the object sought, where it is not
    one of lmnb's own (``_is_own``, which no plain value is)."""
    if depth == 0 or not isinstance(value, _CONTAINERS):
        return None
    for step, item in _items(value):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if wanted is not None:
            if wanted(item):
                return (*steps, step), item
        elif type(item) in _PLAIN:  # (most items: nothing to ask)
            continue
        elif _is_own(item):
            return (*steps, step), item
        if isinstance(item, _CONTAINERS):
            found = _search(item, (*steps, step), depth - 1, budget, wanted)
            if found is not None:
                return found
    return None


def held_long_integer(value: Any, expr: Expr) -> Optional[str]:
    """Which int in the containers of ``value``, the value of the hole ``{expr}``, has more digits
    than Python writes (``params.digits_over_limit``), so that the hole's text, its items' repr,
    raised "ValueError: Exceeds the limit (4300 digits) for integer string conversion", naming no
    item: "xs[3] is 1.000e+5000 (an integer of 5001 digits)" (``params.shown_number``'s form) for a
    hole that is a variable's name, "it holds 1.000e+5000 (...) at [3]" (or "as an item of the set",
    ``held_where``) for another; None where none is found. Searched as ``held_object`` searches,
    but as deep and as far as the containers go (the hole has failed: it costs nothing more)."""
    from lmnb_engine.params import decimal_digits, digits_over_limit, shown_number  # torch-free

    def too_long(item: Any) -> bool:
        return type(item) is int and digits_over_limit(decimal_digits(item))

    found = _search(value, (), sys.getrecursionlimit() // 4, [sys.maxsize], too_long)
    if found is None:
        return None
    steps, number = tuple(map(_step_text, found[0])), found[1]
    where = held_where(steps)
    if isinstance(expr.tree.body, ast.Name) and where.startswith("at "):
        return f"{expr.source.strip()}{''.join(steps)} is {shown_number(number)}"
    return f"it holds {shown_number(number)} {where}"


def _items(value: Any) -> Iterable[tuple[Any, Any]]:
    """(the step to it: its index, (the key,) for a dict's value, "key" / "set" for a dict's key
    and a set's item; the item) of each item of the container ``value``, through its base type's
    own iteration (a subclass's ``__iter__`` need not be what its ``str`` shows)."""
    if isinstance(value, (collections.UserList, collections.UserDict)):  # (their items are in .data)
        data = getattr(value, "data", None)
        return _items(data) if isinstance(data, (list, dict)) else ()
    if isinstance(value, collections.deque):
        return enumerate(collections.deque.__iter__(value))
    if isinstance(value, dict):
        return ((step, item) for key, v in dict.items(value) for step, item in (("key", key), ((key,), v)))
    if isinstance(value, (set, frozenset)):
        return zip(itertools.repeat("set"), (set.__iter__ if isinstance(value, set) else frozenset.__iter__)(value))
    return enumerate((list.__iter__ if isinstance(value, list) else tuple.__iter__)(value))


def held_where(steps: tuple) -> str:
    """"at [0]['k']" for index steps; from the first dict key or set item on, which no index reaches,
    "as a key of the dict at [0]" (the object itself) or "in an item of the set" (inside it)."""
    for k, step in enumerate(steps):
        if step in ("key", "set"):
            at = f" at {''.join(steps[:k])}" if k else ""
            part = "a key of the dict" if step == "key" else "an item of the set"
            return f"{'as' if k == len(steps) - 1 else 'in'} {part}{at}"
    return "at " + "".join(steps)


def _container_name(value: Any) -> str:
    """"list", "tuple", "dict", "set" (a frozenset's too), "deque", "UserList" or "UserDict": the base
    type of the container ``value``."""
    return next(name for t, name in ((list, "list"), (tuple, "tuple"), (dict, "dict"), (set, "set"),
                                     (frozenset, "set"), (collections.deque, "deque"),
                                     (collections.UserList, "UserList"), (collections.UserDict, "UserDict"))
                if isinstance(value, t))
