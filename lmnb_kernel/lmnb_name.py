"""The ``lmnb`` name the extension puts into the kernel namespace (``%%lm --python`` bodies write
``lmnb.gen(...)``), put back after ``%reset``, and taken away again at ``%unload_ext`` only while it
is still the extension's, not the user's.

A user's own ``import lmnb`` binds the very module object the extension put there, so the value
cannot tell whose the name is. What tells is the code the user ran: from the load on, an IPython
AST transformer that changes nothing (``NameWatch``) looks at every cell's code for a binding of
``lmnb``; the cell that ran ``%load_ext`` is looked at too (its code after the magic ran after the
load), and so is the body of a ``%%lm --python`` cell, which runs with the namespace as its
globals (``global lmnb`` there binds the name) but not through the transformers. Code the watch
cannot read, run by a cell (``%run`` of a script, which copies the script's names in, with ``-i``
or not; ``exec``; ``globals()[...] =``; ``%store -r``), may bind the name as well: such a cell
makes the name the user's too, so that an unload never takes a name the user bound (kept, the
extension's name is the module the user would import).
"""

from __future__ import annotations

import ast

NAME = "lmnb"

# Builtins that run code the watch cannot read, or reach the namespace as a dict.
_UNSEEN_CALLS = frozenset({"exec", "eval", "globals", "vars", "locals"})
# The shell's ways to set or delete names of its namespace as a dict (get_ipython().push(...)).
_NAMESPACE_ATTRIBUTES = frozenset({"user_ns", "user_global_ns", "push", "del_var", "drop_by_id"})
# Line magics that set or delete names the cell's code does not show: %run (a script's names),
# %xdel and %reset_selective (names given as text or a pattern), %store -r (stored variables).
_NAMESPACE_MAGICS = frozenset({"run", "xdel", "reset_selective", "store"})


def magic_call(node, names, method: str = "run_line_magic") -> bool:
    """Whether ``node`` (a syntax tree, or None) calls one of the line magics ``names`` as IPython
    writes a ``%magic`` line (``get_ipython().run_line_magic('run', '-i s.py')``; cell magics with
    ``method`` ``run_cell_magic``: ``get_ipython().run_cell_magic('time', '', BODY)``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and node.args[0].value in names)


def _runs_unseen_code_here(node: ast.AST) -> bool:
    """Whether the one node ``node`` (not those below it) may set names of the namespace by code or
    names it does not show: a call of ``exec``, ``eval``, ``globals``, ``vars`` or ``locals``, the
    shell's namespace (``get_ipython().user_ns``, ``.push``), or a ``%run``, ``%xdel``,
    ``%reset_selective`` or ``%store`` line."""
    return ((isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _UNSEEN_CALLS)
            or (isinstance(node, ast.Attribute) and node.attr in _NAMESPACE_ATTRIBUTES)
            or magic_call(node, _NAMESPACE_MAGICS))


def _resets_here(node: ast.AST) -> bool:
    """Whether the one node ``node`` (not those below it) clears the namespace as IPython's
    ``%reset`` does (``%reset`` or ``get_ipython().reset()``), which removes ``lmnb`` with the
    user's names."""
    return magic_call(node, ("reset",)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "reset"
        and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython")


def _lm_python_body_takes_the_name(node: ast.AST) -> bool:
    """Whether the one node ``node`` runs a ``%%lm --python`` cell (IPython writes one as
    ``get_ipython().run_cell_magic('lm', '--python', BODY)``) whose body takes the name
    (``takes_the_name``) or whose options or body the code computes (unreadable here). A body that
    is no Python takes nothing: the magic refuses it, and it runs nothing."""
    from lmnb.template.cell_options import asks_for_python

    if not (magic_call(node, ("lm",), "run_cell_magic") and len(node.args) == 3):
        return False
    line, body = node.args[1:]
    if not (isinstance(line, ast.Constant) and isinstance(line.value, str)):
        return True
    if not asks_for_python(line.value):
        return False
    if not (isinstance(body, ast.Constant) and isinstance(body.value, str)):
        return True
    try:
        return takes_the_name(ast.parse(body.value))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


def takes_the_name(tree: ast.AST) -> bool:
    """Whether code ``tree`` may make ``lmnb`` the user's: it binds or deletes the name (an
    assignment of any kind, loop and ``with`` targets, ``:=``, ``del``, an import: ``import lmnb``,
    ``import lmnb.api``, ``from x import y as lmnb``, a ``def``/``class``, an ``except ... as`` or a
    ``match`` capture; in any scope: a function's local ``lmnb`` counts too, which errs on the safe
    side; node by node, as the export reads a binding, ``lmnb.export.syntax.binds_name``), runs
    code that may set it unseen (``_runs_unseen_code_here``), or runs a ``%%lm --python`` body that
    does either or that it cannot read. One walk of ``tree``."""
    return any(_takes_the_name_here(node) for node in ast.walk(tree))


def _takes_the_name_here(node: ast.AST) -> bool:
    """``takes_the_name`` of the one node ``node``, not of those below it."""
    from lmnb.export.syntax import binds_name

    return binds_name(node, NAME) or _runs_unseen_code_here(node) or _lm_python_body_takes_the_name(node)


class NameWatch(ast.NodeTransformer):
    """IPython AST transformer (``shell.ast_transformers``) that leaves every cell's code as it is
    and keeps whether the ``lmnb`` name is the extension's (``owned``): put there by the extension,
    and since then taken by no cell (``takes_the_name``). Its ``after_cell`` (a post_run_cell hook)
    puts the name back after a cell that ran ``%reset`` (``_resets_here``), as IPython puts back
    its own names (``get_ipython``, ``In``). One walk of a cell's tree answers both."""

    def __init__(self, shell, owned: bool):
        super().__init__()
        self.shell = shell
        self.owned = owned
        self.reset_ran = False

    def visit(self, node):
        for each in ast.walk(node):
            if self.owned and _takes_the_name_here(each):
                self.owned = False
            self.reset_ran = self.reset_ran or _resets_here(each)
            if not self.owned and self.reset_ran:
                break
        return node

    def after_cell(self, result=None) -> None:
        """post_run_cell hook: after a cell that ran ``%reset``, ``lmnb`` is the extension's again
        where the cell left the name free (``define_lmnb``); a name the cell bound after its reset
        stays the user's."""
        if self.reset_ran:
            self.reset_ran = False
            define_lmnb(self.shell)


def define_lmnb(shell) -> bool:
    """Put ``lmnb`` in the namespace unless the name is taken (hidden from ``%who``). True if it
    was put there now; the extension's then (``NameWatch.owned``), while it is loaded."""
    if NAME in shell.user_ns:
        return False
    import lmnb

    shell.push({NAME: lmnb}, interactive=False)
    watch = getattr(shell, "_lmnb_name_watch", None)
    if watch is not None:
        watch.owned = True
    return True


def put_lmnb(shell) -> None:
    """At load: ``define_lmnb``, and start a ``NameWatch`` on the shell's cells
    (``shell._lmnb_name_watch``), owning the name if it put it there now and the cell that loads
    the extension binds it not below the magic."""
    owned = define_lmnb(shell) and not _running_cell_binds(shell)
    watch = NameWatch(shell, owned)
    shell.ast_transformers.append(watch)
    shell.events.register("post_run_cell", watch.after_cell)
    shell._lmnb_name_watch = watch


def take_lmnb(shell) -> None:
    """At unload: stop ``put_lmnb``'s watch and remove ``lmnb`` from the namespace if it is the
    extension's (``NameWatch.owned``) and still the module (not a capture named ``lmnb``)."""
    import lmnb

    watch = getattr(shell, "_lmnb_name_watch", None)
    if watch is None:
        return
    del shell._lmnb_name_watch
    if watch in shell.ast_transformers:
        shell.ast_transformers.remove(watch)
    shell.events.unregister("post_run_cell", watch.after_cell)
    if watch.owned and shell.user_ns.get(NAME) is lmnb:
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
        tree = ast.parse(code)
    except SyntaxError:  # (it runs, so it parsed; IPython's compiler may take what ast.parse won't)
        return True
    return takes_the_name(tree)
