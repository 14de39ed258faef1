"""Face 1: run a ``Template``'s syntax tree as the body of an lmnb program.

Each node issues the lmnb call that ``codegen`` writes for it (see the mapping table in
docs/CELL_LANGUAGE.md); a test runs both faces on a recording state and compares the calls.
"""

from __future__ import annotations

import builtins
import re
import reprlib
from typing import Any

from lmnb.choices import choice_list
from lmnb.ir import CHECKED_ALONE, check_text, param_problem
from lmnb.template.errors import TemplateRuntimeError
from lmnb.template.hole_values import held_long_integer, refused_value
from lmnb.template.nodes import Expr, Fork, Interp, Media, Primitive, Role, Text, statements, target_names, written_hole
from lmnb.template.options import (
    SAMPLING_FIELDS, braces_hint, branch_choices, check_literal, first_refused, fork_count, fork_items,
    shared_by_branches)


def execute(template, s, arguments: dict[str, Any]) -> None:
    """Run ``template`` on program state ``s``; ``arguments`` maps kernel variable names to values."""
    _Run(template, arguments).block(s, template.body, {})


class _Run:
    def __init__(self, template, arguments: dict[str, Any]):
        self.t = template
        self.args = arguments
        self.bound = None  # inside a fork: the names its innermost fork binds (branch_choices); else None
        # inside forks: (branch index, its item as "v=1", or None for {fork N}), outermost first
        self.branch: list[tuple[int, str | None]] = []

    def error(self, message: str, offset: int, hint: str | None = None) -> TemplateRuntimeError:
        """The failure ``message`` at character ``offset`` of the cell body, placed in the cell as typed;
        inside a ``{fork v in items}`` it names the branch and its item ("in fork branch 0 (v=1): ..."),
        as a hole reads the same source in every branch (the branches of a ``{fork N}`` differ in no
        value a hole is given, so they are not named)."""
        items = ", ".join(item for _, item in self.branch if item is not None)
        if items:
            message = f"in fork branch {'.'.join(str(i) for i, _ in self.branch)} ({items}): {message}"
        return TemplateRuntimeError(message, self.t.source, offset, self.t.first_line, hint=hint,
                                    indent=self.t.indent)

    def block(self, s, nodes, local: dict[str, Any]) -> None:
        run: list = []
        for node in nodes:
            if isinstance(node, (Text, Interp)):
                run.append(node)
                continue
            self.text(s, run, local)
            run = []
            if isinstance(node, Primitive):
                s += self.primitive(node, s, local)
            elif isinstance(node, Media):
                s += self.media(node, s, local)
            elif isinstance(node, Role):
                self.role(node, s, local)
            elif isinstance(node, Fork):
                self.fork(node, s, local)
        self.text(s, run, local)

    def text(self, s, run: list, local) -> None:
        for group in statements(run) if run else ():
            s += "".join(n.text if isinstance(n, Text) else self.interp(n, s, local) for n in group)

    def primitive(self, node: Primitive, s, local):
        import lmnb

        kwargs, refused = {}, []
        for o in node.options:
            kwargs[o.key] = value = self.value(o.value, s, local, f"{node.primitive} option {o.key}={o.value.source}")
            if o.key == "choices":  # as lmnb.select reads them: a numpy array, a pandas Series, a set (sorted)
                try:
                    if self.bound is not None and shared_by_branches(o.value, self.bound):
                        branch_choices(value, o.value.source)
                    kwargs[o.key] = value = choice_list(value, o.value.source.strip())
                except TypeError as e:  # (a dict: its keys or its values?)
                    raise self.error(str(e), o.value.offset) from None
            # a value from a variable gets the check a literal got at parse time (None: one lmnb's
            # own check refuses, which lmnb tells below)
            problem = _check_value(node.primitive, o.key, value)
            if problem or (o.key in CHECKED_ALONE and param_problem(o.key, value)):
                refused.append((o, problem))
        if refused:  # (of several, the one lmnb names for the same values, as the parser tells literals)
            fine = {k: v for k, v in kwargs.items() if k not in {o.key for o, _ in refused}}
            o, problem = refused[first_refused(node.primitive, [(o.key, kwargs[o.key]) for o, _ in refused], fine)
                                 if len(refused) > 1 else 0]
            if problem:
                raise self.error(problem, o.value.offset)
        fn = getattr(lmnb, node.primitive)
        try:
            expr = fn(node.name, **kwargs) if node.name is not None else fn(**kwargs)
        except (TypeError, ValueError) as e:  # lmnb refused a value the check above lets through
            # at the option the message names ("stop=5 is invalid"), if exactly one; else the hole
            named = [o for o in node.options if re.search(rf"\b{re.escape(o.key)}\b", str(e))]
            # (prefixed with the primitive's name, unless gen()'s words name it already: "gen() takes one of ...")
            words = str(e) if str(e).startswith(f"{node.primitive}(") else f"{node.primitive}: {e}"
            raise self.error(words, named[0].value.offset if len(named) == 1 else node.offset) from e
        expr.cell_offset = node.offset  # (its failure as it runs, the backend's refusal, points at the hole too)
        return expr

    def media(self, node: Media, s, local):
        import lmnb

        # (named as the hole shows them, as a gen's options are: "{p + 1} failed" named a hole the cell lacks)
        frames = f" frames={node.frames.source}" if node.frames is not None else ""  # ({video v + 1 frames=2})
        hole = f"{{{node.kind} {node.source.source}{frames}}}"
        source = self.value(node.source, s, local, hole)
        if node.frames is None:
            expr = lmnb.image(source)
        else:
            frames = self.value(node.frames, s, local, f"video option frames={node.frames.source}")
            try:
                expr = lmnb.video(source, frames)
            except ValueError as e:  # a frame count that is not a positive int
                raise self.error(str(e), node.frames.offset) from e
        expr.cell_offset = node.offset  # (a source that cannot be read, a text-only model: at this hole)
        # (and named so: its repr named a PIL image by its memory address, "Image(<PIL... at 0x7F63...>)")
        expr.cell_hole = hole
        return expr

    def role(self, node: Role, s, local) -> None:
        import lmnb

        if node.simple:
            parts = [n.text if isinstance(n, Text) else self.interp(n, s, local) for n in node.body]
            s += getattr(lmnb, node.role)("".join(parts))
            return
        s += getattr(lmnb, f"{node.role}_begin")()
        self.block(s, node.body, local)
        s += getattr(lmnb, f"{node.role}_end")()

    def fork(self, node: Fork, s, local) -> None:
        outer, self.bound = self.bound, frozenset(target_names(node.target) if node.target is not None else ())
        try:
            self.branches(node, s, local)
        finally:
            self.bound = outer

    def branches(self, node: Fork, s, local) -> None:
        if node.count is not None:
            # (named as the fork shows it: "{n} failed" of {fork {n}} read as the literal-brace escape)
            n = self.value(node.count, s, local, f"{{fork {node.count.source}}}")
            try:
                n = fork_count(n, node.count.source)
            except ValueError as e:
                raise self.error(str(e), node.count.offset) from None
            forks = s.fork(n)
            for i, f in enumerate(forks):
                self.in_branch(i, None, f, node.body, local)
        else:
            items = self.value(node.items, s, local, f"{{fork ... in {node.items.source}}}")
            try:
                items = fork_items(items, node.items.source)
            except (TypeError, ValueError) as e:
                raise self.error(str(e), node.items.offset) from None
            forks = s.fork(len(items))
            for i, (f, item) in enumerate(zip(forks, items)):
                inner = dict(local)
                try:
                    _bind(node.target, item, inner)
                except (TypeError, ValueError) as e:
                    raise self.error(f"fork target: {e}", node.items.offset) from e
                self.in_branch(i, f"{_target_source(node.target)}={_short_repr(item)}", f, node.body, inner)
        # (a failed branch ends the wait and aborts the others: nothing can join them now)
        if node.join == "gather_variable":
            forks.join_or_abort()
        else:
            forks.join_or_abort(node.join)

    def in_branch(self, index: int, item: str | None, s, body, local) -> None:
        """Run ``body`` on branch ``s`` (number ``index``, bound to ``item``), named in its errors."""
        self.branch.append((index, item))
        try:
            self.block(s, body, local)
        finally:
            self.branch.pop()

    def interp(self, node: Interp, s, local) -> str:
        value = self.value(node.expr, s, local)
        refused = refused_value(value, node.expr)
        if refused:  # (its str is a repr, "Gen('a')", which the prompt held while nothing ran)
            raise self.error(refused[0], node.offset, hint=refused[1])
        try:
            text = node.render(value)
        except Exception as e:  # a __str__ / __format__ that raises anything else is the hole's failure too
            detail = str(e) if isinstance(e, (TypeError, ValueError)) else f"{type(e).__name__}: {e}"
            if isinstance(e, ValueError):  # (Python's words: "Exceeds the limit (4300 digits) ...", naming no item)
                from lmnb_engine.params import decimal_digits, digits_over_limit, past_digit_limit, shown_number

                if isinstance(value, int):
                    too_long = f"it is {shown_number(value)}" if digits_over_limit(decimal_digits(value)) else None
                else:  # (a list holding one: which item)
                    too_long = held_long_integer(value, node.expr)
                if too_long is not None:
                    detail = (f"{too_long}, {past_digit_limit(verb='writes')}; write a smaller number, or lift "
                              "Python's limit in the kernel first (sys.set_int_max_str_digits(0))")
            raise self.error(f"cannot format {written_hole(node.expr.source)}: {detail}", node.offset) from e
        try:  # (else refused once joined with the text around it, as the program's body failing, at no hole)
            check_text(text, f"the text of {written_hole(node.expr.source)}:")
        except ValueError as e:
            raise self.error(str(e), node.offset) from None
        return text

    def value(self, expr: Expr, s, local: dict[str, Any], what: str = ""):
        """``expr`` evaluated; a failure is a ``TemplateRuntimeError`` at it, naming ``what`` it is
        (default: the hole ``{expr}``)."""
        try:
            values = [local[name] if kind == "local" else s[name] if kind == "var" else self.args[name]
                      for name, kind in expr.refs]
            return eval(expr.code, {"__builtins__": builtins})(*values)
        except Exception as e:
            # ({fork x in {items}}: the braces made a set of a list, where a hole in a hole was meant)
            hint = braces_hint(expr.source, e)
            raise self.error(f"{what or written_hole(expr.source)} failed: {type(e).__name__}: {e}{hint}",
                             expr.offset) from e


def _check_value(primitive: str, key: str, value):
    """``options.check_literal`` of a ``regex`` string, a ``json_schema`` dict or JSON string,
    ``choices``, ``stop_regex`` and the engine's sampling fields (``seed``, ``min_p``, ..., whose
    check reads numpy scalars as their values) (a message, or None): the checks that lmnb or the
    engine make too, but where the value is known. Other values (numbers lmnb reads from numpy
    scalars, a pydantic class) are left to lmnb."""
    if key in ("choices", "stop_regex", *SAMPLING_FIELDS) or (key == "regex" and isinstance(value, str)) or (
            key == "json_schema" and isinstance(value, (str, dict))):
        return check_literal(primitive, key, value)
    return None


class _ShortRepr(reprlib.Repr):
    """``reprlib``'s short repr, with an int of more digits than Python writes (its ``repr`` raises
    ValueError) as ``params.shown_number`` shows it, where reprlib failed."""

    def repr_int(self, x: int, level: int) -> str:
        from lmnb_engine.params import decimal_digits, digits_over_limit, shown_number  # torch-free

        return shown_number(x) if digits_over_limit(decimal_digits(x)) else super().repr_int(x, level)


_REPR = _ShortRepr()  # (keyword arguments only from Python 3.12)
_REPR.maxstring = _REPR.maxother = 40


def _short_repr(item) -> str:
    """``repr(item)``, cut to about 40 characters (an item may be a long document); an int too long
    for Python to write as ``params.shown_number`` shows it (``1.000e+5000 (an integer of 5001 digits)``)."""
    try:
        return _REPR.repr(item)
    except Exception as e:  # noqa: BLE001 - a __repr__ that raises must not hide the branch's own error
        return f"<{type(item).__name__}: repr failed: {type(e).__name__}>"


def _target_source(target) -> str:
    """A fork target as written: ``v``, or ``(k, v)`` for an unpacking one."""
    return target if isinstance(target, str) else "(" + ", ".join(_target_source(t) for t in target) + ")"


def _bind(target, value, into: dict[str, Any]) -> None:
    """Bind a fork target to one item with Python's unpacking rules."""
    if isinstance(target, str):
        into[target] = value
        return
    values = list(value)
    if len(values) != len(target):
        raise ValueError(f"cannot unpack {len(values)} values into {len(target)} fork targets")
    for t, v in zip(target, values):
        _bind(t, v, into)
