"""The ``lmnb`` name the extension puts into the kernel namespace (``%%lm --python`` bodies write
``lmnb.gen(...)``), and taking it away again at ``%unload_ext`` only while it is still the
extension's, not the user's.

A user's own ``import lmnb`` binds the very module object the extension put there, so the value
cannot tell whose the name is. What tells is the code the user ran: from the load on, an IPython
AST transformer that changes nothing (``BindingWatch``) looks at every cell's code for a binding of
``lmnb``; the cell that ran ``%load_ext`` is looked at too (its code after the magic ran after the
load). A name bound by code outside cells (``%run`` of a script, ``exec``, ``globals()[...] = ``)
is not seen, and is removed at unload like the extension's own.
"""

from __future__ import annotations

import ast

NAME = "lmnb"

# Nodes that bind (or delete) the name in their ``name`` field: ``def lmnb``, ``class lmnb``,
# ``except E as lmnb``, ``case lmnb`` / ``case [*lmnb]``.
_NAMED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler, ast.MatchAs, ast.MatchStar)


def binds(tree: ast.AST, name: str) -> bool:
    """Whether code ``tree`` binds or deletes ``name``: an assignment (of any kind, loop and
    ``with`` targets, ``:=``), ``del``, an import (``import lmnb``, ``import lmnb.api``,
    ``from x import y as lmnb``), a ``def``/``class``, an ``except ... as`` or a ``match`` capture.
    In any scope: a function's local ``lmnb`` counts too, which errs on the safe side (the name is
    kept)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            return True
        if isinstance(node, _NAMED) and node.name == name:
            return True
        if isinstance(node, ast.MatchMapping) and node.rest == name:
            return True
    return False


class BindingWatch(ast.NodeTransformer):
    """IPython AST transformer (``shell.ast_transformers``) that leaves every cell's code as it is
    and sets ``bound`` once a cell's code binds ``lmnb`` (``binds``)."""

    def __init__(self, bound: bool = False):
        super().__init__()
        self.bound = bound

    def visit(self, node):
        if not self.bound:
            self.bound = binds(node, NAME)
        return node


def define_lmnb(shell) -> bool:
    """Put ``lmnb`` in the namespace unless the name is taken (hidden from ``%who``). True if it
    was put there now."""
    if NAME in shell.user_ns:
        return False
    import lmnb

    shell.push({NAME: lmnb}, interactive=False)
    return True


def put_lmnb(shell):
    """At load: ``define_lmnb``, and if it put the name there, start a ``BindingWatch`` on the
    shell's cells (returned; None when the name was taken: then it is never the extension's)."""
    if not define_lmnb(shell):
        return None
    watch = BindingWatch(bound=_running_cell_binds(shell))
    shell.ast_transformers.append(watch)
    return watch


def take_lmnb(shell, watch) -> None:
    """At unload: stop ``watch`` (``put_lmnb``'s) and remove ``lmnb`` from the namespace unless a
    cell bound it or it is no longer the module (a capture named ``lmnb``)."""
    import lmnb

    if watch in shell.ast_transformers:
        shell.ast_transformers.remove(watch)
    if not watch.bound and shell.user_ns.get(NAME) is lmnb:
        shell.drop_by_id({NAME: lmnb})


def _running_cell_binds(shell) -> bool:
    """Whether the cell running now (the one that loads the extension, if a cell does; IPython
    gives its displayhook the running cell's result) binds ``lmnb``: its AST went through the
    transformers before the watch was there."""
    running = getattr(shell.displayhook, "exec_result", None)
    code = getattr(getattr(running, "info", None), "transformed_cell", None)
    if not code:
        return False
    try:
        return binds(ast.parse(code), NAME)
    except SyntaxError:  # (it runs, so it parsed; IPython's compiler may take what ast.parse won't)
        return True
