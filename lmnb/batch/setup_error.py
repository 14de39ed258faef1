"""What an exported job says when the notebook's set-up (the cells run once, at the script's module
level, before ``Job.run``) raises: one message naming the cell, its line and the error, and exit 2
(the job could not start), where Python printed a traceback and exited 1, which the docs give to
rows that failed.

The script runs in the folder it is started from, as any Python script and papermill do, while
``lmnb run`` and Jupyter run the notebook in its own folder: a file the set-up opens by a relative
path is then looked for elsewhere, and the message says where, and where it is.
"""

from __future__ import annotations

import io
import linecache
import os
import re
import sys
import tokenize
from types import FrameType, TracebackType
from typing import Callable, Optional

from lmnb.batch.messages import say

EXIT_SETUP = 2  # (runner's EXIT_FATAL: imported from there, this module would import the runner's imports)


def install(script: str, per_row: bool = True) -> Callable[[], None]:
    """Make ``sys.excepthook`` say an exception that ``script`` (the exported script's path, run as
    ``__main__``) raised at its module level in one message on stderr and exit 2 (a ``SystemExit``
    from the hook, which Python honours). Other exceptions (KeyboardInterrupt, or ones raised
    elsewhere) go to the hook there was. ``per_row``: False for a script of a notebook without
    ``%%lm`` cells, whose cells all run once, with no rows. Returns what puts the hook there was
    back (``Job.run`` calls it as it starts: its errors are its own, no longer the set-up's)."""
    previous = sys.excepthook

    def hook(kind: type, error: BaseException, tb: Optional[TracebackType]) -> None:
        top = tb  # the script's module-level frame (below runpy's, for `python -m`)
        while top is not None and (top.tb_frame.f_code.co_filename, top.tb_frame.f_code.co_name) != (
                script, "<module>"):
            top = top.tb_next
        if not isinstance(error, Exception) or top is None:
            return previous(kind, error, tb)
        say(f"lmnb batch: {message(error, top, script, per_row)}")
        raise SystemExit(EXIT_SETUP)

    def uninstall() -> None:
        if sys.excepthook is hook:
            sys.excepthook = previous

    sys.excepthook = hook
    return uninstall


def is_program(frame: FrameType) -> bool:
    """Whether ``frame`` (the script's module level) is the program's own: no frame above it but
    runpy's for ``python -m``, or the script is named on the process's own command line
    (``sys.orig_argv``): a tool that runs it as the program, ``coverage run job.py`` or ``python -m
    cProfile job.py`` (``-m pkg.job`` too), which hands its uncaught error to ``sys.excepthook``.
    Not a script that another program runs in its process (``runpy.run_path``, IPython's ``%run``),
    which gets the error itself. (Such a program that also names the script on its command line,
    ``python -m pdb job.py``, ``ipython job.py``, is taken for a tool: the hook only words an
    uncaught set-up error, and the job takes it off again when it is done.)"""
    return _only_runpy_above(frame) or _named_on_command_line(frame)


def _named_on_command_line(frame: FrameType) -> bool:
    """Whether an argument of ``sys.orig_argv`` (past the interpreter's name) is the file of
    ``frame``'s code, or follows a ``-m`` and is its module's name."""
    module = getattr(frame.f_globals.get("__spec__"), "name", None)
    arguments = sys.orig_argv[1:]
    for before, argument in zip(["", *arguments], arguments):
        if module is not None and (before, argument) == ("-m", module):
            return True
        try:
            if os.path.samefile(argument, frame.f_code.co_filename):
                return True
        except (OSError, ValueError):  # (an option, or a name no file has)
            continue
    return False


def _only_runpy_above(frame: FrameType) -> bool:
    """Whether no frame above ``frame`` is another's but runpy's (``python -m``)."""
    above = frame.f_back
    while above is not None:
        if above.f_globals.get("__name__") != "runpy":
            return False
        if above.f_back is None:  # (the interpreter's own call for python -m)
            return above.f_code.co_name == "_run_module_as_main"
        above = above.f_back
    return True


def message(error: BaseException, tb: TracebackType, script: str, per_row: bool = True) -> str:
    """The words for ``error``, raised by the set-up of ``script``, whose module-level frame is
    ``tb``'s: the cell that was running (the ``# -- cell N`` comment the export writes above
    each cell), the script's last line in the traceback, with its code (the user's own line, where
    a traceback's last lines are lmnb's or a library's), the error, and the fix."""
    cell = _cell(script, tb.tb_lineno)
    last = tb
    while tb is not None:  # (the innermost frame in the script: the cell's line, or a set-up function's)
        if tb.tb_frame.f_code.co_filename == script:
            last = tb
        tb = tb.tb_next
    code = _code(linecache.getline(script, last.tb_lineno))
    where = f"{os.path.basename(script)} line {last.tb_lineno}" + (f": {code}" if code else "")
    said = f"{type(error).__name__}: {error}"
    failed = f"failed in cell {cell}" if cell else "failed"
    head = f"the notebook's set-up {failed}, before any row ran" if per_row else f"the notebook {failed}"
    head += f" ({where}): {said}"
    name = getattr(error, "filename", None) if isinstance(error, OSError) else None
    if isinstance(name, (str, bytes, os.PathLike)) and not os.path.isabs(name):
        return f"{head}; {_relative(os.fsdecode(name), script)}"
    return f"{head}; fix the notebook and export it again"


def _relative(name: str, script: str) -> str:
    """The fix for a relative path ``name`` the set-up could not open: where it was looked for, and
    the folder to run the job from where the script's folder holds it."""
    here = os.getcwd()
    said = (f"the path {name!r} is read from the folder the job runs in, {here}, where lmnb run and Jupyter "
            "read it from the notebook's folder")
    folder = os.path.dirname(os.path.abspath(script))
    if folder != here and os.path.exists(os.path.join(folder, name)):
        return (f"{said}; the script's folder has it: run the job from there (cd {folder}, with --input and "
                "--output given from there), or open it by its full path in the notebook and export it again")
    return (f"{said}; run the job from the folder that has it, or open it by its full path in the notebook and "
            "export it again")


def _code(line: str) -> str:
    """``line`` without its comment (the export's "# the notebook's example; ..." notes), stripped."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):  # (a line of a longer statement: a string's middle)
        pass
    return line.strip()


def _cell(script: str, lineno: int) -> Optional[str]:
    """The number N of the ``# -- cell N`` comment nearest above line ``lineno`` of ``script``."""
    for i in range(lineno, 0, -1):
        mark = re.match(r"\s*# -- cell (\d+)", linecache.getline(script, i))
        if mark:
            return mark.group(1)
    return None
