"""The wording that the export's notes share: what sharing the script's globals between rows means and
the fixes, the advice for set-up state the job does not set back, and the words for one name or
several and for the set-up cells whose functions hold them ("cell 1", "cells 1, 3")."""

from __future__ import annotations


# What sharing the script's globals between rows means, and the fixes (the export's notes)
_RACE = ("so rows running at once (--num-threads above 1) may read each other's value; return the value from the "
         "function instead, or run the job with --num-threads 1")
# (the advice of the notes on set-up state that the job does not set back per row)
_OWN_STATE = "keep that state in a variable the row makes (after the first %%lm cell) instead"


def _number_words(names: list) -> dict:
    """The words a note about ``names`` (one or more) uses for them: ``is_`` ("is"/"are"), ``it``
    ("it"/"them"), ``one`` ("one x"/"one of each") and ``s`` (a plural's "s")."""
    if len(names) == 1:
        return {"is_": "is", "it": "it", "one": f"one {names[0]}", "s": ""}
    return {"is_": "are", "it": "them", "one": "one of each", "s": "s"}


def _cells_of(called: list, at: int, wanted) -> dict:
    """Name → the set-up cells (indexes, in order) whose ``called`` functions (``_called``) list it
    at item ``at`` of their entry (2: read, 3: set by ``global``, 4: changed in place), for the
    names ``wanted`` (a test) lets through, in order of first mention."""
    out: dict = {}
    for f in called:
        for n in f[at]:
            if wanted(n) and f[0] not in out.setdefault(n, []):
                out[n].append(f[0])
    return out


def _grouped(cells_of: dict) -> list:
    """[(where: "cell 1" or "cells 1, 3", the names of ``cells_of`` (name → cell indexes) that those
    cells, and only they, hold)], in order of each group's first name."""
    groups: dict = {}
    for name, cells in cells_of.items():
        groups.setdefault(tuple(cells), []).append(name)
    return [(f"cell{'s' * (len(cells) > 1)} {', '.join(map(str, cells))}", names) for cells, names in groups.items()]


def _functions_of(where: str) -> str:
    """"a function of this cell", or "functions of these cells" where ``where`` names several."""
    return "functions of these cells" if where.startswith("cells") else "a function of this cell"


def _verb(verb: str, where: str) -> str:
    """``verb`` as said of ``_functions_of(where)``: "changes", or "change" for several cells' functions."""
    return verb if where.startswith("cells") else verb + "s"
