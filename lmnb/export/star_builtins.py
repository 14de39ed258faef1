"""Which builtins a per-row star import replaces (``from math import *`` sets pow), for the export's
note on the builtins a set-up function reads above such an import: found by importing the module,
for modules of Python's standard library only."""

from __future__ import annotations

import builtins
import sys


# (standard-library modules that act when imported: the export imports the others to learn their names)
_ACTING_ON_IMPORT = frozenset({"this", "antigravity", "__hello__", "__phello__", "idlelib", "turtledemo"})


def _builtins_set_by(modules: list, read: tuple) -> dict:
    """Builtin → the ``modules`` (a per-row cell's star imports, in order) whose ``from m import *``
    gives it another value, of the builtins ``read`` (``Plan.early_builtins``: math's pow). Only
    modules of Python's standard library are looked at, by importing them (code of the interpreter's
    own, which runs nothing of the notebook's): importing another here could run anything, so what
    such a one sets is found only when the job runs (``Job.star_import``); so is what a script of
    the library sets (``venv.__main__``, which would run on the export's argv), and what one that
    acts on import sets (``_ACTING_ON_IMPORT``)."""
    import importlib.util
    import sysconfig

    stdlib = tuple(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib"))
    out: dict = {}
    for module in dict.fromkeys(modules):
        top = module.split(".")[0]
        if (not read or not top or top not in sys.stdlib_module_names or top in _ACTING_ON_IMPORT
                or module.split(".")[-1] == "__main__"):  # (the script of `python -m venv`: it runs on import)
            continue
        try:  # (a file of the notebook's folder named like the module would be imported instead: not one of these)
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None or not (spec.origin in ("built-in", "frozen") or str(spec.origin).startswith(stdlib)):
            continue
        names: dict = {}
        try:
            exec(f"from {module} import *", names)
        except (Exception, SystemExit):  # (one this platform lacks, tkinter without Tk, or fails or
            continue  # exits: left to the job's run-time check)
        for n in read:
            if n in names and names[n] is not getattr(builtins, n):
                out.setdefault(n, []).append(module)
    return out
