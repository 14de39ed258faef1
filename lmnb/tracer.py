"""Find a program's constant prefix (the text every run of it begins with) without running it
(the batch prefix hint, paper §3).

``run_batch`` prefills this prefix once before starting the items, so all of them find it in the
prefix cache instead of racing to compute it. Like SGLang's ``extract_prefix_by_tracing``, the
program body runs against a recording state whose arguments are placeholders: the prefix is the
text appended before the first primitive that needs the model or an argument (gen, select, fork,
reading a variable, using an argument's value, running another program). Bound arguments
(``bind``) are real values.
"""

from __future__ import annotations

import contextvars
from typing import Any, Optional

from lmnb.chat_template import ChatTemplate
from lmnb.ir import ConstantText, Expr, ExprList, RoleBegin, RoleEnd, added_twice, as_expr, role_message

_tracing: contextvars.ContextVar[Optional["_TracingState"]] = contextvars.ContextVar("lmnb_tracing", default=None)


class _StopTrace(Exception):
    """The traced program reached something that depends on the model or an argument."""


def stop_if_tracing() -> None:
    """End the trace where the traced program runs another program (``run``, ``run_batch`` or a
    call of it): that program's text comes from the model, and running it would send real
    requests (with placeholder arguments) only to find a prefix."""
    state = _tracing.get()
    if state is not None:
        state.stop()


class _Placeholder(Expr):
    """An argument whose value is unknown while tracing. ``"text" + arg`` builds an expression
    (so the text before it still counts, as with SGLang's ``SglArgument``); any other use of its
    value, and reaching it in the prompt, ends the trace."""

    def __init__(self, state: "_TracingState"):
        object.__setattr__(self, "_state", state)

    def _stop(self, *args, **kwargs):
        self._state.stop()

    # (__repr__ too: a list's str is its items' repr, which put "[<...Placeholder object at 0x...>]"
    # into the prefix every item was to share)
    __str__ = __repr__ = __format__ = __iter__ = __len__ = __getitem__ = __contains__ = __call__ = _stop
    __bool__ = __int__ = __float__ = __index__ = __eq__ = __lt__ = __gt__ = _stop
    __hash__ = None  # type: ignore[assignment]

    def __getattr__(self, name):
        self._state.stop()


class _TracingState:
    """Records constant text and role markers exactly as the interpreter would render them."""

    def __init__(self, chat_template: ChatTemplate):
        self.template = chat_template
        self.text = ""
        self.messages = 0
        self.last_role = None  # (the role of the last message: Llama-2's form depends on it)
        self.role = None
        self.stopped = False

    def stop(self) -> None:
        """End the trace. For good: a body that catches the exception (``except Exception``) and
        goes on must not add the text after a gen to the prefix."""
        self.stopped = True
        raise _StopTrace()

    def _run(self, expr: Expr) -> None:
        if self.stopped:
            self.stop()
        if isinstance(expr, ExprList):
            for e in expr.exprs:
                self._run(e)
        elif isinstance(expr, ConstantText):
            self.text += expr.value
        elif isinstance(expr, RoleBegin) and self.role is None:
            begin, implicit = self.template.role_begin(expr.role, self.messages, not self.text, self.last_role)
            self.text += begin
            if implicit:
                self.messages += 1
                self.last_role = "system"
            self.role = expr.role
        elif isinstance(expr, RoleEnd) and self.role == expr.role:
            self.text += self.template.get_prefix_and_suffix(expr.role)[1]
            self.last_role = expr.role
            self.role = None
            self.messages += 1
        else:
            self.stop()

    def __iadd__(self, other: Any) -> "_TracingState":
        try:
            added_twice(other, self)
        except ValueError:  # (the real run raises it there)
            self.stop()
        self._run(as_expr(other))
        return self

    def _role(self, role: str, expr: Any = None):
        if expr is not None:  # returned as in a real run, where the body may go on to use it
            message = role_message(role, expr, self)
            self._run(message)
            return message
        return _RoleScope(self, role)

    def system(self, expr: Any = None):
        return self._role("system", expr)

    def user(self, expr: Any = None):
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        return self._role("assistant", expr)

    def __getattr__(self, name):  # fork, text, s["x"], var_scope, ...: the prefix ends here
        self.stop()

    def __getitem__(self, name):
        self.stop()


class _RoleScope:
    def __init__(self, state: _TracingState, role: str):
        self.state, self.role = state, role

    def __enter__(self):
        self.state._run(RoleBegin(self.role))
        return self.state

    def __exit__(self, *exc):
        if exc[0] is None:
            self.state._run(RoleEnd(self.role))
        return False


def extract_prefix(program, chat_template: ChatTemplate) -> str:
    """The text every run of ``program`` (an ``SglFunction``) starts with, whatever its arguments.

    Never raises: a program that fails under tracing yields the prefix traced so far.
    """
    state = _TracingState(chat_template)
    kwargs = {name: _Placeholder(state) for name in program.arg_names}
    kwargs.update(program.bind_arguments)
    token = _tracing.set(state)
    try:
        program.func(state, **kwargs)
    except _StopTrace:
        pass
    except Exception:  # noqa: BLE001 - tracing is only a hint; the real run reports errors
        pass
    finally:
        _tracing.reset(token)
    return state.text
