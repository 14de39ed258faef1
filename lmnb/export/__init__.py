"""Notebook → batch script: ``lmnb export NOTEBOOK.ipynb -o job.py`` and ``nbconvert --to lmnb``.

The script is plain Python importing only ``lmnb`` (and IPython's ``display`` if called): each
``%%lm`` cell becomes an ``@lmnb.function`` written by the cell-language parser (``lmnb.template``,
the same parse the ``%%lm`` magic runs), Python cells are kept in order, display-only magics are dropped with a
comment, and the papermill ``parameters`` cell becomes command-line options. Running it
(``python job.py --input rows.jsonl --output results.jsonl``) is ``lmnb.batch.Job``'s work.
Which cells run once and which per row is explained in ``lmnb.export.plan``.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from lmnb.export.cells import ExportError, cell_read_problem, listed_cell_errors, read_cells, unknown_cell_notes
from lmnb.export.plan import Plan, plan
from lmnb.export.writer import write_script
from lmnb.output_paths import make_folders, why_unwritable
from lmnb_engine.cli_options import Once

# the commands of the tools that export a notebook, which a script's docstring names (older scripts: lmnb export's)
LMNB_EXPORT, NBCONVERT = "lmnb export", "jupyter nbconvert --to lmnb"
EXPORTERS = (LMNB_EXPORT, NBCONVERT)
# The end of the re-export command of a job exported to stdout (``reexport_command``), which its tool
# writes to stdout again: the file the user saved the job in is not known to the export.
SAVE_OVER_JOB = " and save its output over this job's file"

__all__ = ["ExportError", "Plan", "export", "export_arguments", "export_notebook", "notebook_from_text", "plan_notebook",
           "read_notebook"]


def read_notebook(path: Path, check_cells: bool = True):
    """``nbformat.read(path, as_version=4)``, also of a file that begins with a UTF-8 byte order mark
    (Windows editors write one; nbformat refused it as "does not appear to be JSON"). Its cells are
    checked (``cell_read_problem``) unless ``check_cells`` is False (``notebook_from_text``).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not UTF-8, not JSON (a ``.py`` file: said to be a script, with how to run
            it or make a notebook of it), JSON that is not a notebook (the message names what is
            missing; nbformat's own ``ValidationError`` prints the whole schema), or cells that cannot
            run (every one listed).
    """
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise not_utf8(e, data) from None
    try:
        return notebook_from_text(text, check_cells)
    except _NotJSON:
        if Path(path).suffix.lower() != ".py":
            raise
    script = shlex.quote(str(path))
    raise ValueError(f"not a notebook (.ipynb JSON) but a Python script; run it with python {script}, or make a "
                     f"notebook of it first (e.g. jupytext --to notebook {script})") from None


def notebook_path_problem(path: Path) -> Optional[str]:
    """Why ``path``, given as the notebook to run or export, names no file (missing, or a folder),
    or None: said before reading it ("[Errno 21] Is a directory" named no fix)."""
    if Path(path).is_file():
        return None
    if Path(path).is_dir():
        return f"{path} is a folder, not a notebook; name the .ipynb file in it"
    return f"no such notebook: {path}"


class _NotJSON(ValueError):
    """A notebook file's text that is not JSON (nbformat: "Notebook does not appear to be JSON")."""


def not_utf8(e: UnicodeDecodeError, data: bytes) -> ValueError:
    """The error for a notebook file ``data`` that is not UTF-8 (``e``: where decoding it as
    ``utf-8-sig`` failed). Its byte is the offset in the file, as a hex editor shows it: ``e.start``
    counts from after a leading byte order mark, which ``utf-8-sig`` skips."""
    offset = e.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
    return ValueError(f"not UTF-8 text ({e.reason} at byte {offset}); a notebook is UTF-8 JSON: save it as "
                      "UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def notebook_from_text(text: str, check_cells: bool = True):
    """The v4 notebook in ``text`` (a notebook file's text; a leading byte order mark is skipped).
    Raises ``ValueError`` as ``read_notebook`` does; with ``check_cells`` False, not for its cells
    (``cell_read_problem``): the export's ``read_cells`` lists them with its own errors."""
    import nbformat

    text = text.removeprefix("\ufeff")
    if not text.strip():  # (nbformat: "Notebook does not appear to be JSON: ''")
        raise ValueError("the file is empty; save the notebook from Jupyter again (File > Save)")
    import warnings

    from nbformat.warnings import MissingIDFieldWarning

    try:
        data = json.loads(text)
    except ValueError as e:  # (nbformat's message quoted the file's first 40 characters, and no fix)
        at = f" (line {e.lineno}, column {e.colno}: {e.msg})" if isinstance(e, json.JSONDecodeError) else ""
        raise _NotJSON(f"not a notebook: a notebook (.ipynb) is JSON, and this text is not{at}; give the .ipynb "
                       "file, or, if this is one, save it from Jupyter again (an edit or a cut-short save broke "
                       "it)") from None
    shape = _json_shape_problem(data)
    if shape:
        raise ValueError(f"not a Jupyter notebook: {shape}; a notebook (.ipynb) is a JSON object of its cells, "
                         "metadata and nbformat: give the .ipynb file, or save it from Jupyter again")
    version = _version_problem(data)
    if version:
        raise ValueError(f"not a Jupyter notebook: {version}")
    try:
        with warnings.catch_warnings():
            # A notebook (4.5+) without cell ids, hand-made or an older tool's: nbformat adds them, as
            # Jupyter does, but warned in four lines advising a call to normalize().
            warnings.simplefilter("ignore", MissingIDFieldWarning)
            nb = _notebook_v4(data)
    except nbformat.ValidationError as e:
        raise ValueError(f"not a Jupyter notebook: {e.message}{_old_version_hint(data)}") from None
    except (AttributeError, TypeError, KeyError) as e:  # (shapes _json_shape_problem leaves: a v3 "worksheets": 5)
        # a cell whose cell_type is no string (where cells have ids) or whose lines are no strings
        # stops nbformat's own code: named as cell_read_problem names it, with every cell it cannot read
        cells = data.get("cells") if isinstance(data, dict) else None
        _raise_cell_problems([nbformat.from_dict(c) for c in cells] if isinstance(cells, list) else [])
        raise ValueError(f"not a Jupyter notebook (nbformat: {type(e).__name__}: {e})") from None
    if check_cells:
        _raise_cell_problems(nb.cells)
    return nb


def _notebook_v4(data):
    """``nbformat.reads(text, as_version=4)`` of the text whose parsed JSON is ``data`` (an object
    of a version ``nbformat.versions`` holds), without parsing the text again: the steps of
    nbformat 5's ``reads`` (its reader's, then ``convert`` and ``validate``), which logs a notebook
    the schema refuses (traitlets' ``get_logger``: "Notebook JSON is invalid") and returns it.

    Raises:
        nbformat.ValidationError: a key the version's reader needs is missing (as nbformat's reader
            raises it); AttributeError, TypeError or KeyError: nbformat's code fails on the shape.
    """
    import nbformat
    from nbformat.reader import get_version
    from traitlets.log import get_logger

    major, minor = get_version(data)
    try:
        nb = nbformat.versions[major].to_notebook_json(data, minor=minor)
    except AttributeError as e:
        raise nbformat.ValidationError(f"The notebook is invalid and is missing an expected key: {e}") from None
    nb = nbformat.convert(nb, 4)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        get_logger().error("Notebook JSON is invalid: %s", e)
    return nb


class CellsUnreadable(ValueError):
    """Cells of a notebook that cannot be read (``cell_read_problem``), each named with the fix."""


def _raise_cell_problems(cells) -> None:
    """Raise ``CellsUnreadable`` naming every one of the notebook's ``cells`` (nbformat cells, in
    order) that cannot be read (``cell_read_problem``), in one error: one run shows them all."""
    problems = [p for p in (cell_read_problem(n, c) for n, c in enumerate(cells, start=1)) if p]
    if problems:
        raise CellsUnreadable(problems[0] if len(problems) == 1 else listed_cell_errors(problems, "read")) from None


def _json_shape(value) -> str:
    """JSON's name for the kind of a parsed JSON ``value`` ("a list", "a string"...)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")


def _version_problem(data) -> Optional[str]:
    """What is wrong with the format version a notebook's parsed JSON ``data`` (a dict) gives,
    with the fix, or None: nbformat said "Unsupported nbformat version 4" of a string "4", as of a
    version 5, which named neither what was wrong nor the fix, and failed on a string
    ``nbformat_minor`` with a bare AssertionError. (No "nbformat" at all: nbformat reads it.)"""
    import nbformat

    if "nbformat" not in data:
        return None
    major = data["nbformat"]
    if type(major) is not int:  # (not bool either: true is no version)
        return (f'its "nbformat" is {_shown(major)}, not the integer 4; write "nbformat": 4 (a number, no quotes) '
                "in the file's JSON, or save the notebook from Jupyter again")
    if major not in nbformat.versions:
        return (f'its "nbformat" is {major}, and the notebook format\'s versions are 1 to {nbformat.current_nbformat} '
                f'(Jupyter writes {nbformat.current_nbformat}); write "nbformat": {nbformat.current_nbformat} in the '
                "file's JSON if its cells are in \"cells\", or save the notebook from Jupyter again")
    minor = data.get("nbformat_minor", 0)
    if type(minor) is not int:
        return (f'its "nbformat_minor" is {_shown(minor)}, not an integer; write it as a number (Jupyter writes '
                f'"nbformat_minor": {nbformat.current_nbformat_minor}) in the file\'s JSON, or save the notebook '
                "from Jupyter again")
    return None


def _old_version_hint(data) -> str:
    """For a notebook nbformat found invalid: why, where its parsed JSON ``data`` says an older
    format version (1 to 3: no "cells") but holds version 4's "cells", with the fix; else ""."""
    major = data.get("nbformat") if isinstance(data, dict) else None
    if major in (2, 3) and type(major) is int and "cells" in data:
        return (f' (its "nbformat" is {major}, but it has "cells", as version 4 notebooks do: write "nbformat": 4 '
                f"in the file's JSON; a version {major} notebook keeps its cells in \"worksheets\", and jupyter "
                "nbconvert --to notebook upgrades one)")
    return ""


def _shown(value) -> str:
    """A parsed JSON ``value`` as the file has it, cut short, with its kind: '"4" (a string)'."""
    text = json.dumps(value)
    kind = "" if value is None or isinstance(value, bool) else f" ({_json_shape(value)})"  # (not "null (null)")
    return f"{text if len(text) <= 40 else text[:40] + '…'}{kind}"


def _json_shape_problem(data) -> Optional[str]:
    """What makes ``data`` (a notebook file's parsed JSON) no notebook by its shape, or None: JSON other than an object,
    v4's ``cells`` other than a list, cells that are no objects, a notebook or cells whose
    ``metadata`` is missing or no object, cells whose ``outputs`` are no list of objects, or
    attachments or display data that are no objects (``_bundle_problems``), every one named. nbformat read them with an AttributeError or TypeError of its own code ("'list'
    object has no attribute 'get'"), which named neither."""
    if not isinstance(data, dict):
        return f"the file's JSON is {_json_shape(data)}, not an object"
    if "cells" not in data:  # (no v4 notebook: nbformat names what it lacks)
        return None
    cells = data["cells"]
    if not isinstance(cells, list):
        return f'its "cells" is {_json_shape(cells)}, not a list of cells'
    bad = [f"{n} ({_json_shape(c)})" for n, c in enumerate(cells, start=1) if not isinstance(c, dict)]
    if bad:
        return f"cell{'s' if len(bad) > 1 else ''} {', '.join(bad)} {'are' if len(bad) > 1 else 'is'} no JSON object"
    # (nbformat: "missing an expected key: metadata", naming neither the notebook nor which cell)
    bare = (["the notebook"] if "metadata" not in data else []) + [
        f"cell {n}" for n, c in enumerate(cells, start=1) if "metadata" not in c]
    if bare:
        return f'{", ".join(bare)} {"have" if len(bare) > 1 else "has"} no "metadata" (add "metadata": {{}})'
    # (nbformat: "'NoneType' object has no attribute 'pop'" for null, a TypeError of its code for a list)
    odd = [(where, value) for where, value in [("the notebook", data["metadata"])] + [
        (f"cell {n}", c["metadata"]) for n, c in enumerate(cells, start=1)] if not isinstance(value, dict)]
    if odd:
        return ", ".join(f'{where}\'s "metadata" is {_json_shape(value)}' for where, value in odd) + (
            ', not an object (write "metadata": {})')
    # (nbformat: "'NoneType' object is not iterable", "'int' object has no attribute 'get'")
    odd = [str(n) for n, c in enumerate(cells, start=1) if "outputs" in c and not (
        isinstance(c["outputs"], list) and all(isinstance(o, dict) for o in c["outputs"]))]
    if odd:
        many = len(odd) > 1
        return (f'cell{"s" * many} {", ".join(odd)} {"have" if many else "has"} "outputs" that {"are" if many else "is"} '
                'no list of objects (write "outputs": [], which a run fills)')
    odd = [problem for n, c in enumerate(cells, start=1) for problem in _bundle_problems(n, c)]
    if odd:
        return "; ".join(odd)
    return None


def _bundle_problems(number: int, cell: dict) -> list:
    """What in the cell numbered ``number`` (its parsed JSON, whose ``outputs`` are a list of
    objects) is no object where nbformat's reader takes one, each with the fix: its
    ``"attachments"`` (name → {MIME type: data}), an attachment, or the ``"data"`` ({MIME type:
    data}) of a display output; and an output's ``"output_type"`` that is a list or an object,
    which the reader cannot look up. nbformat's reader failed on each with "missing an expected key:
    'int' object has no attribute 'values'" (or "unhashable type: 'list'"), naming neither the cell
    nor the field."""
    problems = []
    if "attachments" in cell:
        attachments = cell["attachments"]
        if not isinstance(attachments, dict):
            problems.append(f'cell {number}\'s "attachments" is {_json_shape(attachments)}, not an object of the '
                            'images pasted into the cell ({"name.png": {"image/png": "<base64>"}}); write '
                            '"attachments": {} (or remove the key) in the file\'s JSON')
        else:
            problems += [f'cell {number}\'s attachment {json.dumps(name)} is {_json_shape(value)}, not an object of '
                         'its data by MIME type ({"image/png": "<base64>"}); remove it from "attachments" in the '
                         "file's JSON"
                         for name, value in attachments.items() if not isinstance(value, dict)]
    outputs = cell.get("outputs", ()) if cell.get("cell_type") == "code" else ()  # (the reader reads no other's)
    for k, output in enumerate(outputs, start=1):
        kind = output.get("output_type")
        if isinstance(kind, (list, dict)):  # (the reader looks it up in a set: "unhashable type: 'list'")
            problems.append(f'cell {number}\'s output {k} has "output_type" that is {_json_shape(kind)}, not a '
                            'string naming its kind ("stream", "display_data", "execute_result" or "error"); write '
                            '"outputs": [] for the cell in the file\'s JSON (a run fills it)')
        elif kind in ("execute_result", "display_data") and not isinstance(output.get("data", {}), dict):
            problems.append(f'cell {number}\'s output {k} has "data" that is {_json_shape(output["data"])}, not an '
                            'object of its data by MIME type; write "outputs": [] for the cell in the file\'s JSON '
                            "(a run fills it)")
    return problems


def plan_notebook(nb, inputs: Optional[Sequence[str]] = None, folder: Optional[Path] = None) -> Plan:
    """How ``nb`` (an ``nbformat`` v4 notebook, in ``folder`` where known) maps onto a batch job.
    Raises ``ExportError``."""
    p = plan(read_cells(nb), inputs, folder)
    p.notes += unknown_cell_notes(nb.cells)
    return p


def export_notebook(nb, notebook_name: str = "notebook.ipynb", script_name: str = "job.py",
                    inputs: Optional[Sequence[str]] = None, folder: Optional[Path] = None,
                    reexport: Optional[str] = None, exported_by: str = LMNB_EXPORT) -> tuple[str, Plan]:
    """The batch script for ``nb`` and its plan (``plan.notes`` lists what was dropped).

    ``inputs``: the row fields (default: the notebook's example inputs, see ``lmnb.export.plan``).
    ``folder``: the notebook's, where the modules of the user's that it imports are (None: not known).
    ``reexport``: the command that exports the notebook again with the row fields NAMES, which the
    job's messages give (``reexport_command``; default: ``lmnb export``'s).
    ``exported_by``: the tool's command, which the script's docstring names (``EXPORTERS``).

    Raises:
        ExportError: a cell that cannot be read (``cells.cell_read_problem``) or does not parse, no
            ``%%lm`` cell, or unusable ``inputs``.
    """
    p = plan_notebook(nb, inputs, folder)
    # A lone surrogate (a broken character) becomes its escape: in a string literal it reads back the same.
    if reexport is None:
        reexport = reexport_command(LMNB_EXPORT, notebook_name, "--inputs ")
    source = write_script(p, notebook_name, script_name, reexport, exported_by)
    source = source.encode("utf-8", "backslashreplace").decode("utf-8")
    try:  # what compiles cell by cell can still fail as one script (e.g. nesting too deep)
        compile(source, script_name, "exec")
    except (SyntaxError, RecursionError, ValueError, MemoryError) as e:
        where = f" (script line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ExportError(f"the exported script does not compile{where}: {type(e).__name__}: {e}; split the "
                          "longest cells, or simplify expressions in their {...} holes") from None
    return source, p


def reexport_command(export: str, notebook_name: str, inputs_option: str, output: str = "",
                     to_stdout: bool = False) -> str:
    """The command that exports the notebook ``notebook_name`` again with the row fields NAMES
    (``Job(reexport=...)``, whose messages give it with the fields they mean), run in the notebook's
    folder: ``export``, the tool's command (``lmnb export``, ``jupyter nbconvert --to lmnb``), the
    notebook, ``output``, the tool's option that names the job's file, quoted for a shell (``-o
    jobs/x.py``; "" for the notebook's default, ``nb.py`` beside it, or a file not known), then
    ``inputs_option``, the tool's spelling of ``--inputs`` up to the names (``"--inputs "``,
    ``"--LMScriptExporter.inputs="``). The name is quoted for a shell, and one that begins with "-"
    is written ``./-nb.ipynb``, which no tool takes for an option. ``to_stdout``: the job was
    exported to stdout (``output`` is the tool's option for it, ``-o -``, ``--stdout``), so the
    command says to save its output over the job's file (``SAVE_OVER_JOB``): the notebook's
    default, which the command without it writes, is another file, and the job stayed as it was."""
    name = f"./{notebook_name}" if notebook_name.startswith("-") else notebook_name
    command = " ".join(part for part in (export, shlex.quote(name), output, f"{inputs_option}NAMES") if part)
    return command + (SAVE_OVER_JOB if to_stdout else "")


def reexport_output(notebook: Path, out: Path) -> Optional[str]:
    """``out``, the file a job was written to, as the re-export command (``reexport_command``, run
    in the folder of the notebook ``notebook``) names it: relative to that folder (``jobs/x.py``,
    ``../jobs/x.py``; its full path where there is none, on another drive), or None where it is the
    notebook's default, ``nb.py`` beside it, which the command leaves out. One that begins with "-"
    is written ``./-x.py``, which no tool takes for an option."""
    folder, out = notebook.parent.resolve(), out.resolve()  # (a folder's symlinks: where "../" really goes)
    if out == folder / f"{notebook.stem}.py":
        return None
    try:
        written = os.path.relpath(out, folder)
    except ValueError:  # pragma: no cover - Windows: on another drive than the notebook
        written = str(out)
    return f"./{written}" if written.startswith("-") else written


def unnamed_output(out: Optional[str], default: Path) -> Optional[str]:
    """Why the ``-o`` given, ``out``, names no file, or None (also for no ``-o``): empty (an unset
    variable in a script, which fell back to ``default`` silently) or blank (a file named " " was
    written)."""
    if out is None or out.strip():
        return None
    given = "is empty" if out == "" else f"{out!r} is blank"
    return f"-o {given}; give a file name, or leave -o out for {default}"


def folder_given(out: str, example: str) -> Optional[str]:
    """Why the output path ``out`` (an ``-o``) names a folder, not a file, or None: an existing
    folder, or one written as such (``-o runs/`` or ``-o runs/.`` wrote a file named ``runs``: ``Path``
    drops the ending). ``example``: a file name to suggest in it; "" (no ``-o``) and "-" (stdout) name
    no folder. Where ``out`` is written as a folder that is a file (``-o notes.txt/``), that is said,
    and ``example`` alone suggested: ``-o notes.txt/job.py`` cannot be written either."""
    ending = out.replace(os.sep, "/").rsplit("/", 1)[-1]
    if out not in ("", "-") and ending in ("", ".") and Path(out).is_file():
        return f"{out} names a folder, and {Path(out)} is a file; give the file name to write, e.g. -o {example}"
    if out not in ("", "-") and (ending in ("", ".", "..") or Path(out).is_dir()):
        return f"{out} is a folder; give a file name, e.g. -o {Path(out) / example}"
    return None


def not_an_export(path: Path) -> bool:
    """Whether ``path`` is an existing file that no export wrote: ``lmnb export nb.ipynb`` replaced
    any ``nb.py`` without a word (a jupytext pairing's script, the user's own code). An earlier
    export, by either tool (its docstring says "exported by `TOOL` from" in its first lines), is
    replaced, as a re-export should be."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8", "replace")
    except OSError:
        return False  # (the write reports it)
    return not any(f"exported by `{tool}` from " in head for tool in EXPORTERS)


def free_job_name(out: Path) -> Path:
    """A file beside ``out`` to suggest in the refusal to write over ``out`` (``not_an_export``):
    ``NAME_job.py``, else ``NAME_job2.py``, ``NAME_job3.py``, ... , the first that is not there or
    is an earlier export (which the export replaces): one the user's file holds too was suggested,
    to be refused again in the same words."""
    stem, n = out.stem, 1
    while True:
        name = out.with_name(f"{stem}_job{n if n > 1 else ''}.py")
        if not not_an_export(name):
            return name
        n += 1


def export_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``lmnb export``."""
    parser.add_argument("notebook", type=Path, help="the .ipynb notebook with %%%%lm cells")
    parser.add_argument("-o", "--output", default=None, action=Once,  # (a str: Path drops a trailing slash, "runs/")
                        help="the script to write (default: the notebook's name with .py; '-' = stdout)")
    parser.add_argument("--inputs", default=None, metavar="A,B", action=Once,
                        help="the fields each input row gives (default: the notebook's example inputs: "
                             "variables the %%lm cells depend on that a cell sets to a string)")


def export(args: argparse.Namespace) -> int:
    """``lmnb export``: write the script; returns the exit status (2 when the notebook cannot be used)."""
    path: Path = args.notebook
    problem = notebook_path_problem(path)
    if problem:  # (before the output's name: "." has no name to give it a .py, a traceback)
        print(f"lmnb export: {problem}", file=sys.stderr)
        return 2
    default = path.with_suffix(".py")
    unnamed = unnamed_output(args.output, default)
    if unnamed:
        print(f"lmnb export: {unnamed}", file=sys.stderr)
        return 2
    to_stdout = args.output == "-"  # only a bare "-", as for lmnb run (and Unix tools): ./- is a file named -
    out = Path(args.output) if args.output else default
    inputs = None if args.inputs is None else [n.strip() for n in args.inputs.split(",") if n.strip()]
    try:  # (first: lmnb export job.py, a script, said its output "job.py is a notebook")
        nb = read_notebook(path, check_cells=False)  # (export_notebook lists them with the cells it cannot export)
    except CellsUnreadable as e:  # (cells nbformat cannot read past: said as export_notebook says the others,
        print(f"lmnb export: {path}: {e}", file=sys.stderr)  # not "cannot read" for "cell_type": null only)
        return 2
    except (OSError, ValueError) as e:  # (read_notebook: a ValueError names what is wrong and the fix)
        print(f"lmnb export: cannot read {path}: {e}", file=sys.stderr)
        return 2
    if not to_stdout and (out.suffix.lower() == ".ipynb" or out.resolve() == path.resolve()):
        # the script would replace a notebook (a slip of -o, or tab completion): refuse, lose nothing
        print(f"lmnb export: the output {out} is a notebook; the script goes to a .py file, e.g. -o "
              f"{default}", file=sys.stderr)
        return 2
    folder = folder_given(args.output or "", default.name)
    if folder:
        print(f"lmnb export: {folder}", file=sys.stderr)
        return 2
    script_name = "job.py" if to_stdout else out.name
    written = "-" if to_stdout else reexport_output(path, out)  # (stdout: again, as the job's file is not known)
    reexport = reexport_command(LMNB_EXPORT, path.name, "--inputs ", f"-o {shlex.quote(written)}" if written else "",
                                to_stdout)
    try:
        source, p = export_notebook(nb, path.name, script_name, inputs, path.parent, reexport)
    except ExportError as e:
        print(f"lmnb export: {path}: {e}", file=sys.stderr)
        return 2
    for note in p.notes:
        print(f"lmnb export: {path}: {note}", file=sys.stderr)
    if to_stdout:
        sys.stdout.write(source)
        return 0
    if not_an_export(out):
        print(f"lmnb export: {out} exists and was not written by lmnb export (a script of yours, or a jupytext "
              f"pairing?); the script would replace it, so it is left as it is: give another -o, e.g. -o "
              f"{free_job_name(out)}, or move or delete {out} first", file=sys.stderr)
        return 2
    try:
        made = make_folders(out)
        if made is not None:
            print(f"lmnb export: created the folder {made} (it did not exist) for {out}", file=sys.stderr)
        out.write_text(source, encoding="utf-8")
    except OSError as e:
        print(f"lmnb export: cannot write {out}: {why_unwritable(out, e)}; give -o a path in a folder you can "
              f"write to (e.g. -o {default.name})", file=sys.stderr)
        return 2
    # the command is copied into a shell: a path with a space stays one word, and one that begins
    # with "-" (-o ./-) is not read by python as an option (python - reads the script from stdin)
    script = shlex.quote(f"./{out}" if str(out).startswith("-") else str(out))
    if not p.row:
        print(f"wrote {out}; run it with\n  python {script}", file=sys.stderr)
        return 0
    fields = ", ".join(p.inputs) or "none"
    print(f"wrote {out} (row fields: {fields}); run it with\n  python {script} --input rows.jsonl "
          "--output results.jsonl", file=sys.stderr)
    return 0
