"""How ``lmnb run`` reports a cell that raised: which cell, the error, and the traceback's frames
in the notebook's own cells.

The frames come from the cell's saved ``error`` output, as IPython formatted them. Frames in
files (lmnb, the standard library, other packages) are left out and counted: they are rarely
where the notebook's mistake is, and the saved notebook keeps the whole traceback.
"""

from __future__ import annotations

import itertools
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# IPython's heading of a frame in cell code: "Cell In[3], line 2" (IPython 8.0-8.5: "Input In [3]")
_CELL_FRAME = re.compile(r"(Cell In\[\d+\]|Input In \[\d+\])")
_FILE_FRAME = re.compile(r"File \S")  # "File ~/lib/python3.11/json/decoder.py:353, in ..."
FIRST_LINE_CHARS = 80
# A frame or error message longer than this (ValueError("x" * 10**6)) keeps its head and tail: the
# report is read in a terminal, and the saved notebook has it whole.
PART_HEAD_CHARS, PART_TAIL_CHARS = 1500, 500
# As Python's own traceback does (traceback._RECURSIVE_CUTOFF): a frame repeated more often than
# this (a runaway recursion: some 1,000 frames) is shown this many times, then counted.
REPEATED_FRAMES_SHOWN = 3


def with_note(name: str, note: str) -> str:
    """``name`` (a cell as the report calls it) with ``note`` in parentheses, inside those ``name``
    ends with ("cell 3 (cell 4 in the saved notebook; In [4])"), not a second pair."""
    return f"{name[:-1]}; {note})" if name.endswith(")") else f"{name} ({note})"


def describe_failure(cell, name: str, ename: str, evalue: str) -> str:
    """The report of ``cell`` (a notebook cell node, ``name`` as the report calls it: "cell 3",
    counted from 1 over the source notebook's cells, with the saved notebook's number where
    that differs),
    which raised ``ename: evalue`` (nbclient's ``CellExecutionError`` fields, used when the cell
    has no ``error`` output)::

        cell 3 (In [2]) raised KeyError; the cell begins: def f(d):

        Cell In[2], line 4
        ----> 4 f({})

        KeyError: 'k'

        (2 frames in library code left out; the saved notebook has the whole traceback)
    """
    error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
    if error is not None:
        ename, evalue = error.get("ename", ename), error.get("evalue", evalue)
    entries = [_ANSI.sub("", e).strip() for e in (error or {}).get("traceback", [])]
    frames = [e for e in entries if _CELL_FRAME.match(e)]
    left_out = sum(bool(_FILE_FRAME.match(e)) for e in entries)
    # frames are labelled by In [N], the execution count, which is not the cell's number
    run_as = with_note(name, f"In [{cell['execution_count']}]") if cell.get("execution_count") is not None else name
    head = f"{run_as} raised {ename}; the cell begins: {_first_line(cell.get('source', ''))}"
    parts = [head, *_collapse_repeats(frames)]
    if not (frames and frames[-1].splitlines()[-1].startswith(f"{ename}:")):  # a SyntaxError's frame has it
        parts.append(f"{ename}: {evalue}")
    if left_out:
        parts.append(f"({left_out} frame{'s' * (left_out > 1)} in library code left out; the saved notebook "
                     "has the whole traceback)")
    return "\n\n".join(_elide(part) for part in parts)


def _collapse_repeats(frames: list[str]) -> list[str]:
    """``frames`` with each run of one frame longer than ``REPEATED_FRAMES_SHOWN`` cut to that many
    and a line counting the rest, as Python prints a recursion: "[Previous frame repeated 970 more
    times]"."""
    out: list[str] = []
    for frame, run in itertools.groupby(frames):
        count = len(list(run))
        out += [frame] * min(count, REPEATED_FRAMES_SHOWN)
        if count > REPEATED_FRAMES_SHOWN:
            more = count - REPEATED_FRAMES_SHOWN
            out.append(f"[Previous frame repeated {more} more time{'s' * (more > 1)}]")
    return out


def _elide(text: str) -> str:
    hidden = len(text) - PART_HEAD_CHARS - PART_TAIL_CHARS
    if hidden <= 0:
        return text
    return (f"{text[:PART_HEAD_CHARS]} … {hidden:,} characters left out (the saved notebook has them) … "
            f"{text[-PART_TAIL_CHARS:]}")


def _first_line(source) -> str:
    text = source if isinstance(source, str) else "".join(source)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "(empty)")
    return line if len(line) <= FIRST_LINE_CHARS else line[: FIRST_LINE_CHARS - 1] + "…"
