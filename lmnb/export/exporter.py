"""``jupyter nbconvert --to lmnb NOTEBOOK.ipynb``: the same script as ``lmnb export``.

Registered in pyproject.toml under ``[project.entry-points."nbconvert.exporters"]``; nbconvert's
external-exporter protocol (docs/source/external_exporters.rst in nbconvert): an ``Exporter``
subclass with ``file_extension`` and ``from_notebook_node``.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import logging
import os
import re
import shlex
from pathlib import Path
from typing import Optional

from nbconvert.exporters import Exporter
from nbconvert.utils.exceptions import ConversionException
from nbconvert.writers import FilesWriter, StdoutWriter
from traitlets import List, Unicode

from lmnb.export import (LMNB_EXPORT, NBCONVERT, ExportError, export_notebook, free_job_name, not_an_export,
                         not_utf8, notebook_from_text, reexport_command, reexport_output)
from lmnb.export.cells import NOTEBOOK_CELL_TYPES, cell_read_problem, cell_tags, unknown_cell_notes
from lmnb.output_paths import make_folders, why_unwritable


class NotebookExportError(ExportError, ConversionException):
    """``ExportError`` as nbconvert's own failures are: a ``ConversionException``, which
    ``jupyter nbconvert`` logs as "Error while converting" and exits 1 on. Anything else escapes
    nbconvert and ends the process with the whole traceback, through our internals."""


class _FieldNames(List):
    """The row fields' trait: a list of names. nbconvert's command line hands an entry point's exporter
    a lone ``--LMScriptExporter.inputs=...`` as a string (the app parses before it loads the exporter,
    so it does not know the trait is a list), which traitlets' List reads only as a Python literal, and
    then not at all (its check of the items needs an instance): ``=person`` reached the exporter as no
    fields, ``='["person"]'`` as one field named ``["person"]``. A string is read here as ``lmnb export
    --inputs`` reads one, names split at commas (``person,place``), or as a list literal; one option
    given again (``--LMScriptExporter.inputs=a --LMScriptExporter.inputs=b``) is traitlets' list."""

    def from_string(self, s: str):
        if s == "None":
            return None
        if s.lstrip().startswith(("[", "(")):
            try:
                value = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                value = None
            # (anything else is one field, which the export refuses as no variable name, naming it)
            ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
            return list(value) if ok else [s.strip()]
        return [n.strip() for n in s.split(",") if n.strip()]


# lmnb export's option in the plan's words, which nbconvert's command line spells as the trait
_INPUTS_OPTION = re.compile(r"(?<![\w.-])--inputs\b")
_INPUTS_SPELLING = "--LMScriptExporter.inputs"


def nbconvert_reexport(notebook_name: str, output: Optional[str] = None, to_stdout: bool = False) -> str:
    """The command that exports ``notebook_name`` again with the row fields NAMES, spelt for
    nbconvert: the job's messages give it (lmnb export's ``--inputs`` named nbconvert's users an
    option it does not take). ``output``: the job's file as ``reexport_output`` names it (None: the
    default, or not known), given as ``--output``, which nbconvert reads relative to the notebook's
    folder (its ``.py`` is dropped, and its braces read as a pattern's: doubled). ``to_stdout``: the
    job went to stdout (``--stdout``), as the command sends it again (``reexport_command``)."""
    option = "" if output is None else "--output=" + shlex.quote(output.replace("{", "{{").replace("}", "}}"))
    return reexport_command(NBCONVERT, notebook_name, f"{_INPUTS_SPELLING}=", "--stdout" if to_stdout else option,
                            to_stdout)


def _nbconvert_words(text: str) -> str:
    """``text`` (an export note or error) with lmnb export's ``--inputs`` spelt as nbconvert takes it."""
    return _INPUTS_OPTION.sub(_INPUTS_SPELLING, text)


class LMScriptExporter(Exporter):
    """Export a notebook with ``%%lm`` cells as a resumable batch script (``lmnb.export``).

    Config: ``LMScriptExporter.inputs`` (list of field names) overrides the row fields; on nbconvert's
    command line ``--LMScriptExporter.inputs=person,place`` (``_FieldNames``). The notes and errors
    name it so where lmnb export's say ``--inputs``.
    Raises ``NotebookExportError`` (an ``lmnb.export.ExportError``) for notebooks that cannot
    be exported, and for nbconvert's ``--inputs``, which nbconvert does not hand on.
    """

    export_from_notebook = "lmnb batch script"
    output_mimetype = "text/x-python"
    inputs = _FieldNames(Unicode(), default_value=None, allow_none=True,
                         help="the fields each input row gives, e.g. person,place (default: the notebook's "
                              "example inputs)").tag(config=True)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        _logger(self.log).addFilter(_ONE_LINE)  # (once: a logger keeps one of an equal filter)

    def _file_extension_default(self):
        return ".py"

    def from_file(self, file_stream, resources=None, **kw):
        """Export the notebook read from ``file_stream`` (text, or bytes) as ``lmnb export`` reads a
        file: one that starts with a UTF-8 byte order mark too, which nbformat refused as not JSON."""
        data = b""  # (a text stream may fail in read(), which decodes: its bytes are not had)
        try:
            data = file_stream.read()
            # (its cells unchecked: export_notebook lists them with the cells it cannot export, as lmnb export)
            with _no_schema_log():
                nb = notebook_from_text(data.decode("utf-8-sig") if isinstance(data, bytes) else data,
                                        check_cells=False)
        except UnicodeDecodeError as e:
            raise NotebookExportError(str(not_utf8(e, data))) from None
        except ValueError as e:
            raise NotebookExportError(str(e)) from None
        return self.from_notebook_node(nb, resources=resources, **kw)

    def from_notebook_node(self, nb, resources=None, **kw):
        if any(cell_read_problem(number, cell) for number, cell in enumerate(nb.cells, start=1)):
            # A cell without a source fails nbconvert's own check of the notebook (run by
            # super()), on a traceback, and one with a lone surrogate stopped the read: the export
            # lists them with the cells it cannot export, as lmnb export does, and raises.
            self._export(nb, resources or {})
        nb_copy, resources = super().from_notebook_node(_schema_valid_copy(nb), resources, **kw)
        source, plan, script, out = self._export(nb_copy, resources)
        if out is not None and not_an_export(out):  # (lmnb export refuses it too)
            raise NotebookExportError(
                f"{out} exists and was not written by {NBCONVERT} or {LMNB_EXPORT} (a script of yours, or a jupytext "
                f"pairing?); the script would replace it, so it is left as it is: give another name with --output, "
                f"e.g. --output {free_job_name(out).stem}, or run lmnb export with -o, or move or delete {out} first")
        if out is not None:
            self._ready_to_write(out, script)
        # (the copy's unknown cells are raw cells, which the export leaves out without a note)
        for note in plan.notes + unknown_cell_notes(nb.cells):
            self.log.warning("%s", _nbconvert_words(note))
        resources["output_extension"] = ".py"
        return source, resources

    def _ready_to_write(self, out: Path, script: str) -> None:
        """Make the folders the app's output file ``out`` goes in and open it for appending, as
        lmnb export makes them before it writes, so that a path it cannot write is said in a line:
        nbconvert's writer ended on an OSError traceback (a file where a folder goes, a folder as
        the output, a --output in a folder not there, /proc). ``script``: its name without .py.

        Raises:
            NotebookExportError: ``out`` cannot be written, naming it, why (``why_unwritable``)
                and the fix.
        """
        try:
            made = make_folders(out)
            with open(out, "a", encoding="utf-8"):  # (an empty new file, which the writer fills next)
                pass
        except OSError as e:
            raise NotebookExportError(f"cannot write {out}: {why_unwritable(out, e)}; give a folder you can write "
                                      f"to, e.g. --output-dir . --output {script}") from None
        if made is not None:  # (a mistyped --output folder is made: said, as lmnb export says it)
            self.log.info("created the folder %s (it did not exist) for %s", made, out)

    def _export(self, nb, resources: dict):
        """``export_notebook`` of ``nb``, named after ``resources`` as nbconvert names the files:
        (script text, ``Plan``, the script's name without .py, the file the app writes it to or None,
        as ``app_output_path``). Raises ``NotebookExportError``."""
        given = self.config.get("inputs")
        if self.inputs is None and given is not None:
            # `jupyter nbconvert --inputs person`: a top-level key of the app's config, which nbconvert
            # warns "Unrecognized alias" of and no exporter reads; a job without the fields asked for
            # would run every row alike
            names = given if isinstance(given, str) else ",".join(map(str, given))
            raise NotebookExportError(f"--inputs is lmnb export's option, which nbconvert does not hand to the "
                                      f"exporter; write {_INPUTS_SPELLING}={names}")
        name = (resources.get("metadata") or {}).get("name") or "notebook"
        # nbconvert's app names the output file after unique_key: the notebook's name, or --output's
        script = os.path.basename(resources.get("unique_key") or "") or name
        folder = (resources.get("metadata") or {}).get("path")  # (from a file: its folder, "" for the current one)
        out = app_output_path(resources, script)
        written = None if out is None else reexport_output(Path(folder or "") / f"{name}.ipynb", out)
        reexport = nbconvert_reexport(f"{name}.ipynb", written, isinstance(_app_writer(), StdoutWriter))
        try:
            source, plan = export_notebook(nb, f"{name}.ipynb", f"{script}.py", self.inputs,
                                           None if folder is None else Path(folder), reexport, NBCONVERT)
        except ExportError as e:  # the message says it all: no frames of ours, no chained SyntaxError
            raise NotebookExportError(_nbconvert_words(str(e))) from None
        return source, plan, script, out


@contextlib.contextmanager
def _no_schema_log():
    """Drop nbformat's "Notebook JSON is invalid: <the schema's error>" from the logger its reading
    logs to (traitlets' ``get_logger``: nbconvert's app's) while it reads a notebook: an ERROR of many
    lines, where notebook_from_text names a problem it cannot read past itself, and one it reads
    past (a cell of an unknown type) is exported as lmnb export exports it, which logs nothing."""
    from traitlets.log import get_logger

    logger = _logger(get_logger())
    quiet = _SchemaLogFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _logger(log) -> logging.Logger:
    """The ``logging.Logger`` of ``log`` (traitlets' loggers may be a ``LoggerAdapter``)."""
    return log.logger if isinstance(log, logging.LoggerAdapter) else log


class _OneLineError(logging.Filter):
    """Says a ``NotebookExportError`` in the line that logs it, without its traceback: nbconvert's
    app logs a conversion's error with ``exc_info`` ("Error while converting 'nb.ipynb'" and a
    traceback through nbconvert and the exporter), where the error's message names the problem and
    the fix, as ``lmnb export`` says it in one line. Other records pass as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, NotebookExportError) and isinstance(record.args, tuple):
            record.msg, record.args = f"{record.msg}: %s", (*record.args, error)
            record.exc_info = record.exc_text = None
        return True


_ONE_LINE = _OneLineError()


class _SchemaLogFilter(logging.Filter):
    """Drops the records of nbformat's reading that say the notebook fails its schema."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Notebook JSON is invalid")


def _schema_valid_copy(nb):
    """``nb``, or a copy of it that nbformat's schema accepts, with the same script, for nbconvert's
    own check of the notebook, which ended on a NotebookValidationError traceback where lmnb export
    exports the notebook. In the copy, a cell of a type nbformat does not know (``"cell_type":
    "weird"``, hand-edited JSON) is a raw cell: Jupyter runs neither kind, lmnb run (nbclient) skips
    one and lmnb export leaves both out. A code cell without ``outputs`` or ``execution_count``, or
    with ones the schema refuses, has none (``[]``, null); a metadata field of the wrong type
    (``"tags": "x"``, ``"kernelspec": 3``) is left out; a cell id it refuses (``"bad id!"``) is a
    new one: the export reads none of these but the tags, and those as ``cell_tags`` does (a list's
    unique strings, which the copy keeps).

    Raises:
        NotebookExportError: what the schema refuses otherwise (a ``nbformat_minor`` it has no
            schema for), naming the cell or the notebook, with the fix.
    """
    if next(_schema_errors(nb), None) is None:
        return nb
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") not in NOTEBOOK_CELL_TYPES:
            cell.cell_type = "raw"
            for key in ("outputs", "execution_count"):  # (a raw cell has neither, in the schema)
                cell.pop(key, None)
    # nbformat names one error a cell (the first, of the cell type's schema): repair each cell's and
    # look again, so that the checks are as many as a cell's errors, not as all the notebook's (one
    # at a time, 400 cells without "outputs" took 800 checks of the whole notebook, minutes)
    for _ in range(10 * len(nb.cells) + 10):
        errors = list(_schema_errors(nb))
        if not errors:
            return nb
        for error in errors:
            if not _repair(nb, error):
                raise NotebookExportError(_schema_problem(list(error.absolute_path), error.message))
    raise NotebookExportError(_schema_problem(list(errors[0].absolute_path), errors[0].message))


def _schema_errors(nb):
    """The errors nbconvert's check of ``nb`` finds (jsonschema errors), as it checks: keys the
    schema does not know are allowed (``relax_add_props``); nbformat gives one a cell."""
    from nbformat.validator import iter_validate

    return iter_validate(nb, relax_add_props=True)


def _repair(nb, error) -> bool:
    """Repair in ``nb`` (a copy) the schema ``error`` (a jsonschema error) as ``_schema_valid_copy``
    says; False where it is none of those."""
    path = list(error.absolute_path)
    if path[:1] == ["metadata"] and len(path) >= 2:
        nb.metadata.pop(path[1], None)  # (two errors of one field in a check: gone at the first)
        return True
    if path[:1] != ["cells"] or len(path) < 2:
        return False
    cell = nb.cells[path[1]]
    if len(path) >= 4 and path[2] == "metadata":
        key = path[3]
        if key == "tags" and isinstance(cell.metadata.tags, list):
            cell.metadata.tags = list(dict.fromkeys(cell_tags(cell)))  # (the schema: unique strings)
        else:
            cell.metadata.pop(key, None)
        return True
    if path[2:3] == ["id"]:  # (the export reads no id: a new one, as nbformat makes them)
        from nbformat.corpus.words import generate_corpus_id

        cell.id = generate_corpus_id()
        return True
    if cell.cell_type != "code":
        return False
    missing = error.validator == "required" and len(path) == 2
    if path[2:3] == ["outputs"] or (missing and "outputs" not in cell):
        cell.outputs = []
        return True
    if path[2:3] == ["execution_count"] or (missing and "execution_count" not in cell):
        cell.execution_count = None
        return True
    return False


def _schema_problem(path: list, message: str) -> str:
    """The error for a notebook that nbformat's schema refuses at ``path`` (jsonschema's absolute
    path, cells counted from 0) with ``message``, which ``_repair`` cannot repair."""
    cell = path[:1] == ["cells"] and len(path) >= 2
    where, inside = (f"cell {path[1] + 1}", path[2:]) if cell else ("the notebook", path)
    at = f" at {''.join(f'[{json.dumps(p)}]' for p in inside)}" if inside else ""
    return (f"not a Jupyter notebook: {where}{at}: {message.splitlines()[0]:.200} (nbformat's "
            "schema); fix it in the file's JSON, or open the notebook in Jupyter and save it again")


def _app_writer():
    """The writer of the running ``jupyter nbconvert`` (a ``FilesWriter``; ``StdoutWriter`` for
    ``--stdout``), or None where no app runs (the exporter called from Python)."""
    from nbconvert.nbconvertapp import NbConvertApp

    return getattr(NbConvertApp.instance(), "writer", None) if NbConvertApp.initialized() else None


def app_output_path(resources: dict, script: str) -> Optional[Path]:
    """The file ``jupyter nbconvert --to lmnb`` will write the script to (``script``: its name without
    .py), or None when no nbconvert app writes files: the exporter called from Python (the caller
    writes), or ``--stdout``. The app's ``FilesWriter`` writes to its ``build_directory``
    (``--output-dir``), else to the notebook's folder, the file named as ``unique_key`` says (a
    relative ``--output`` such as ``jobs/renamed`` keeps its folder). A writer of another class
    (``--writer``) is not known, so its output is not checked."""
    writer = _app_writer()
    if not isinstance(writer, FilesWriter):
        return None
    folder = writer.build_directory or (resources.get("metadata") or {}).get("path") or ""
    key = resources.get("unique_key") or script
    return Path(folder) / f"{key}.py"
