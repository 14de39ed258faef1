"""A notebook's cells as the exporter sees them: Python code, ``%%lm`` programs, markdown.

IPython-only syntax is turned into plain Python here: ``%lm load`` / ``%lm connect`` become the
job's default backend, the other ``%lm`` commands and IPython's own magics (``%time``, ``!ls``) are
dropped with a comment (they only display or manage a kernel session), and cell magics other than
``%%lm`` are dropped with a comment (their bodies are not Python) except the timing/capture ones,
whose bodies are kept (run once; a ``%%timeit`` body, and ``%timeit``'s statement, in a function of
its own, as IPython runs them, so the names they bind are not set, but those they declare ``global``).
Each cell also records the global names it reads and binds (``symtable``).
"""

from __future__ import annotations

import ast
import copy
import os
import re
import shlex
import symtable
import textwrap
from dataclasses import dataclass, field
from typing import Optional, Union

from lmnb.batch.options import Backend  # (the job's record of it: the script's defaults)
from lmnb.template.cell import cell_body
from lmnb.template.errors import LONE_SURROGATE, surrogate_problem
from lmnb.template.python_cell import indent_code
from lmnb.template.cell_options import (CellLineError, CellOptions, check_cell_names, close_subcommand,
                                        parse_backend_line, parse_cell_line)
from lmnb_engine.json_schema import SHOWN_CHARS, json_value

# Cell magics whose body is Python: the body is kept, the magic is dropped.
PYTHON_BODY_MAGICS = ("time", "timeit", "capture")
DISPLAY_COMMANDS = ("stats", "tree", "states")  # %lm commands that only display
SESSION_COMMANDS = ("reset", "flush", "pin", "unpin")  # %lm commands about the kernel's session
_INDENT = re.compile(r"^([ \t]*)[^ \t\n]", re.MULTILINE)  # a line's indentation, where it holds text (textwrap's)
_LM_LINE = re.compile(r"^(\s*)%lm(?:\s+(.*))?$")
# %time STMT, %timeit [-n N -r R ...] STMT
_TIMING_LINE = re.compile(r"^(\s*)%(time|timeit(?:\s+-[nrp]\s*\d+|\s+-[tcqov])*)\s+(.+)$")
# lmnb primitives whose first argument (or name=) names a captured variable.
_CAPTURING = ("gen", "gen_int", "gen_string", "select")
# The function a %%timeit body or a %timeit statement runs in: IPython runs it in a function of its
# own, so the names it binds are not set (the script runs it once).
TIMEIT_BODY = "_timeit_body"
# Said of a cell magic below a cell's first line, here and by the kernel (lmnb_kernel.transforms).
LATE_CELL_MAGIC = "a cell magic works only on a cell's first line; move it up, or split the cell there"


class ExportError(ValueError):
    """The notebook cannot be exported; the message names the cell, the problem and the fix."""


@dataclass
class Markdown:
    """A markdown cell, kept as a comment in the exported script."""
    index: int  # 1-based position in the notebook
    text: str


@dataclass
class Dropped:
    """A cell with nothing to run in a script (a non-Python cell magic); kept as a comment."""

    index: int
    first_line: str
    reason: str
    notes: list = field(default_factory=list)  # for the export's warnings


@dataclass
class Code:
    """A Python cell (IPython syntax already replaced by comments).

    reads: names the cell reads from outside (not bound by an earlier statement of its own), in
    order of first use (names its functions read count); uses: every global it reads, also those it
    binds first; assigns: names it binds at top level; bindings: (name, binds it to a string literal?) for each
    top-level binding in order; string_assignments: name → [(first, last) line] of top-level
    ``name = "literal"`` statements.
    """

    index: int
    source: str
    tags: tuple = ()
    reads: tuple = ()
    uses: tuple = ()
    assigns: tuple = ()
    bindings: tuple = ()
    string_assignments: dict = field(default_factory=dict)
    mutates: tuple = ()  # globals it changes in place (x.append(...), x[k] = v): each row needs its own copy
    notes: list = field(default_factory=list)  # what was dropped, for the export's warnings
    backends: list = field(default_factory=list)
    resets: list = field(default_factory=list)  # %lm reset [NAME] lines: the state names, None for all
    magic: Optional[str] = None  # "%%time" etc. when the cell had a Python-bodied cell magic
    star_imports: tuple = ()  # modules other than lmnb's it star-imports (``from math import *``): names unknown here
    declared_globals: tuple = ()  # names its functions declare ``global`` and bind (in ``assigns`` too)
    captured_output: Optional[str] = None  # the VARIABLE of ``%%capture VARIABLE``: IPython binds it, the job does not

    @property
    def is_parameters(self) -> bool:
        """Whether the cell is tagged ``parameters`` (papermill's convention)."""
        return "parameters" in self.tags


@dataclass
class LMCell:
    """A ``%%lm`` cell: ``template`` (prompt template) or ``python`` (``--python`` body) is set.

    reads: kernel variables the program reads, in order; captures: variables it sets on its state.
    """

    index: int
    line: str
    options: CellOptions
    template: object = None  # lmnb.template.Template
    python: object = None  # lmnb.template.PythonCell
    reads: tuple = ()
    captures: tuple = ()
    mutates: tuple = ()  # (--python) globals its body changes in place: each row needs its own copy
    declared_globals: tuple = ()  # (--python) names its body and functions declare ``global`` and bind
    notes: list = field(default_factory=list)  # for the export's warnings

    @property
    def sets(self) -> tuple:
        """The kernel variables the cell sets: its ``captures`` and its ``--out`` state."""
        return self.captures + ((self.options.out,) if self.options.out else ())


Cell = Union[Markdown, Dropped, Code, LMCell]


def read_cells(nb) -> list[Cell]:
    """The cells of an ``nbformat`` v4 notebook (empty and raw cells are left out).

    Raises:
        ExportError: a ``%%lm`` cell or a Python cell that does not parse (cell number, line, fix);
            with several such cells, one error lists them all (``listed_cell_errors``), as a compiler
            lists every error, so one run shows every cell to fix.
    """
    out: list[Cell] = []
    errors: list[ExportError] = []
    names = LmnbNames()  # as the cells so far bind them: a --python body reads the kernel's names
    for index, cell in enumerate(nb.cells, start=1):
        problem = cell_read_problem(index, cell)
        if problem:  # (as reading the notebook says it: a UnicodeEncodeError from ast.parse, or an AttributeError)
            errors.append(ExportError(problem))
            continue
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        source = source.replace("\r\n", "\n")
        if not is_lm_cell(source):  # a lone \r ends a line for Python and IPython (a prompt keeps it)
            source = source.replace("\r", "\n")
        if not source.strip() or cell.cell_type == "raw":
            continue
        if cell.cell_type == "markdown":
            out.append(Markdown(index, source.strip("\n")))
        elif cell.cell_type == "code":
            tags = cell_tags(cell)
            try:
                out.append(_code_cell(index, source, tags, names=names))
            except ExportError as e:
                errors.append(e)
                continue
            if isinstance(out[-1], Code):
                names = names.seen(ast.parse(out[-1].source))
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExportError(listed_cell_errors([str(e) for e in errors], "exported"))
    return out


# The cell types of nbformat's v4 schema: Jupyter runs and shows no cell of another type.
NOTEBOOK_CELL_TYPES = ("code", "markdown", "raw")


def cell_tags(cell) -> tuple:
    """The tags of a notebook cell (an nbformat cell): the strings of its metadata's "tags" list.
    Tags of another shape (``"tags": "x"``, hand-edited JSON, which nbformat's schema refuses) are
    none: iterating them took a string's letters, and ended a number or null on a TypeError."""
    tags = cell.get("metadata", {}).get("tags")
    return tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()


def unknown_cell_notes(cells, done: str = "left out") -> list[str]:
    """The notes on the notebook's ``cells`` (nbformat cells, in order) of a type Jupyter does not
    know, which the exports leave out and ``lmnb run`` keeps unrun (``done``: what was done with
    the cell), as Jupyter runs none: a typo ("markdwon") lost a cell unseen. The type is cut after
    ``SHOWN_CHARS`` characters, as errors show a value (one of 5000 characters was shown whole)."""
    return [f"cell {n}: {done}, its cell_type {json_value(c.cell_type, SHOWN_CHARS)} is none Jupyter "
            "knows, so no Jupyter runs or shows it; write \"code\", \"markdown\" or \"raw\" in the file's JSON"
            for n, c in enumerate(cells, start=1)
            if isinstance(c.get("cell_type"), str) and c.cell_type not in NOTEBOOK_CELL_TYPES]


def cell_read_problem(number: int, cell) -> Optional[str]:
    """Why the notebook's cell ``number`` (an nbformat cell) can neither run nor be exported, with
    the fix, or None: no cell_type or source that is text (nbformat reads it; running or exporting
    it failed later with a bare AttributeError), or a code cell holding a lone surrogate (JSON can
    escape one, "\\ud800"; Python cannot compile it, nor the kernel's messages carry it)."""
    problem = _cell_shape_problem(cell)
    if problem:
        return (f"not a Jupyter notebook: cell {number} {problem} (a cell has a cell_type such as \"code\" or "
                "\"markdown\", and a source: a string, or a list of strings, its lines); fix the cell in the "
                "file's JSON, or delete it")
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    lone = LONE_SURROGATE.search(source) if cell.cell_type == "code" else None
    if lone:
        line = source.count("\n", 0, lone.start()) + 1
        return f"cell {number}, line {line}: {surrogate_problem(lone.group())}"
    return None


def _cell_shape_problem(cell) -> Optional[str]:
    """What makes a notebook cell one that cannot run or export, said after "cell N" (None if
    nothing): its type and its text must be strings (or a list of strings, its lines, as in the
    file; nbformat's reader joins them). A key the cell lacks is said to be missing, one it gives
    another value (null too: it said "has no cell_type" of ``"cell_type": null``) is shown as the
    file's JSON spells it, cut after ``SHOWN_CHARS`` characters."""
    kind, source = cell.get("cell_type"), cell.get("source")
    if not isinstance(kind, str):
        return "has no cell_type" if "cell_type" not in cell else \
            f"has the cell_type {json_value(kind, SHOWN_CHARS)}, not a string"
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return None
    if not isinstance(source, str):
        return "has no source" if "source" not in cell else \
            f"has the source {json_value(source, SHOWN_CHARS)}, not text"
    return None


def listed_cell_errors(messages: list[str], done: str) -> str:
    """One message for several cells that cannot be ``done`` ("exported"): counted, then each
    cell's own message (its cell, the problem, the fix) one a line, its further lines (a caret
    under a column) indented below it."""
    listed = "\n".join(textwrap.indent(m, "    ").replace("    ", "  - ", 1) for m in messages)
    return f"{len(messages)} cells cannot be {done}; fix each, then try again:\n{listed}"


def _cell_magic(source: str) -> tuple[str, str, str, int, str]:
    """(name, first line, body, lines above the first line, indentation dropped) of a cell that
    begins with a cell magic; ("", "", source, 0, "") otherwise. As in IPython, blank lines above
    the magic are skipped and the indentation all lines share is dropped (so an indented ``%%lm``
    cell is one; the last item is that indentation); the body is otherwise as typed. The first line ends where IPython ends it, at any line break
    ``str.splitlines`` knows (a lone ``\r`` too); the body keeps its own line breaks."""
    lines = source.splitlines(keepends=True)
    skipped = next((i for i, line in enumerate(lines) if not line.isspace()), len(lines))
    text, margin = _dedent("".join(lines[skipped:]))
    line = text.splitlines(keepends=True)[0] if text else ""
    first, body = (line.splitlines() or [""])[0], text[len(line):]
    if not first.startswith("%%"):
        return "", "", source, 0, ""
    return (first[2:].split(None, 1)[0] if first[2:].strip() else ""), first, body, skipped, margin


def _dedent(text: str) -> tuple[str, str]:
    """(``text`` less the leading spaces and tabs its lines with text all begin with, those spaces
    and tabs): as IPython (``textwrap.dedent``) takes them off a cell, but with lines of only
    whitespace kept as typed (beyond that indentation): they are part of a prompt."""
    margin = os.path.commonprefix(_INDENT.findall(text))
    return (re.sub("(?m)^" + re.escape(margin), "", text) if margin else text), margin


def _ipython_magic_body(source: str) -> str:
    """The body IPython hands the cell magic on the first line of ``source``: the cell after
    IPython's clean-up as Python (blank lines above and common indentation dropped, pasted
    ``>>> `` / ``In [1]:`` prompts taken off, whitespace-only lines emptied), less its first line.
    A ``%%lm --python`` body runs so in the kernel."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = (source if source.endswith("\n") else source + "\n").splitlines(keepends=True)
    for transform in TransformerManager().cleanup_transforms:
        lines = transform(lines)
    return "".join(lines[1:])


def is_lm_cell(source: str) -> bool:
    """Whether a code cell runs a ``%%lm`` program: it begins with ``%%lm``, or with a cell magic
    whose body IPython runs as a cell (``%%time``) over one."""
    name, _, body, _, _ = _cell_magic(source)
    return name == "lm" or (name in PYTHON_BODY_MAGICS and is_lm_cell(body))


def lm_cell_parts(source: str) -> tuple[str, str, int, str] | None:
    """(options line, body, cell line of the body's first line, indentation taken off the body's
    lines) of a cell's source that runs a ``%%lm`` program, as typed (it may stand below ``%%time``,
    ``%%timeit``, ``%%capture`` and blank lines, and be indented: see ``_cell_magic``; error columns
    count the indentation back); None for any other cell."""
    first_line, indent = 1, ""
    while True:
        name, first, body, skipped, margin = _cell_magic(source)
        if not first or (name != "lm" and name not in PYTHON_BODY_MAGICS):
            return None
        first_line += skipped + 1  # (the line below the magic's)
        indent += margin  # (a %%time body is dedented again when IPython runs it)
        if name == "lm":
            return first[4:].strip(), body, first_line, indent
        source = body


def _code_cell(index: int, source: str, tags: tuple, first_line: int = 1, indent: str = "", *,
               names: LmnbNames) -> Cell:
    """The cell of ``source``, which starts at line ``first_line`` of the notebook cell (below a
    ``%%time``, say) with ``indent`` taken off its lines: errors give the notebook cell's lines
    and columns, as the kernel does. ``names``: lmnb's names the cells above it bind."""
    name, first, body, skipped, margin = _cell_magic(source)
    if first:
        # the line below the magic's line, past the blank lines IPython skips before it
        body_line, indent = first_line + skipped + 1, indent + margin
        if name == "lm":  # (the prompt without its final line break, as in the kernel)
            return _lm_cell(index, first[4:].strip(), cell_body(body), body_line,
                            cell_body(_ipython_magic_body(source)), indent, names)
        if name in PYTHON_BODY_MAGICS:
            # %%time over %%lm (IPython runs the inner cell magic): the inner cell is the program
            # %%timeit's statement on its line is setup code, run before the body: it leads the body, on
            # the magic's line
            setup = _TIMING_LINE.match(first[1:]) if name == "timeit" else None
            if setup is not None and not setup.group(3).startswith("-"):
                body, body_line = f"{setup.group(3)}\n{body}", body_line - 1
            inner = (_code_cell(index, body, tags, body_line, indent, names=names) if _cell_magic(body)[1]
                     else python_cell(index, body, tags, body_line))
            if isinstance(inner, Code) and inner.magic is None:
                inner.magic = first.strip()
                if name == "timeit":
                    _in_timeit_function(inner, body_line)
            variable = next((w for w in first.split()[1:] if not w.startswith("-")), None)
            if name == "capture" and variable:  # (over a dropped %%bash too: IPython binds it all the same)
                if not isinstance(inner, Dropped):
                    inner.captured_output = variable
                inner.notes.append(f"cell {index}: {first.strip()}: the job does not set {variable} (IPython's "
                                   "captured output), so a cell that reads it fails there")
            return inner
        return Dropped(index, first.strip(), f"IPython cell magic %%{name}: its body is not Python")
    return python_cell(index, source, tags)


def _lm_cell(index: int, line: str, body: str, first_line: int, python_body: str, indent: str,
             names: LmnbNames) -> LMCell:
    """The ``%%lm`` cell of options ``line``: a prompt ``body`` as typed, or with ``--python``
    ``python_body``, the body as IPython cleaned it up (``_ipython_magic_body``), as the kernel runs
    them; ``indent`` was taken off the lines of an indented cell (error columns count it);
    ``names``: what the cells above call lmnb's gen/select (a ``--python`` body's captures)."""
    from lmnb.template import TemplateError, parse, parse_python

    try:
        options = parse_cell_line(line)
    except CellLineError as e:
        raise ExportError(f"cell {index}: %%lm {line}: {e}") from None
    if not body.strip():
        raise ExportError(f"cell {index}: the %%lm cell body is empty; write the prompt below the %%lm line")
    filename = f"<%%lm cell {index}>"
    try:
        if options.python:
            body = python_body
            program = parse_python(body, first_line=first_line, filename=filename, indent=indent)
            reads, declared = python_program_reads(body)
            cell = LMCell(index, line, options, python=program, reads=reads, declared_globals=declared,
                          captures=python_program_captures(program.tree, names),
                          mutates=tuple(n for n in _mutated(program.tree) if n in reads and n != "lmnb"),
                          notes=computed_capture_notes(index, program.tree, names))
            _check_python_choices(program, names, indent)
        else:
            template = parse(body, first_line=first_line, filename=filename, indent=indent)
            cell = LMCell(index, line, options, template=template, reads=template.arguments,
                          captures=template.captures)
    except TemplateError as e:
        raise ExportError(f"cell {index} (%%lm): {e}") from None
    try:  # the kernel's checks, which refuse the cell before it runs (a --python body's literal names too)
        check_cell_names(options.out, program.captures if options.python else cell.captures, options.python)
    except CellLineError as e:
        raise ExportError(f"cell {index} (%%lm): {e}") from None
    return cell


def python_cell(index: int, source: str, tags: tuple = (), first_line: int = 1) -> Code:
    """A Python cell with IPython syntax replaced, and its names; ``source`` starts at line
    ``first_line`` of the notebook cell. Raises ``ExportError``."""
    code = Code(index, "", tags)
    text = source
    try:
        ast.parse(text)
    except SyntaxError:
        text = _replace_magics(text, code, first_line)
    try:
        tree = ast.parse(text, filename=f"<cell {index}>")
    except SyntaxError as e:
        lines = source.split("\n")  # (IPython reads "%%lm" below the first line as a line magic "%lm %lm")
        # (an indented cell's too: IPython drops the indentation its lines share)
        late = next((n for n, line in enumerate(lines[1:], start=2) if line.lstrip().startswith("%%")), None)
        hint = "" if late is None else f"; {lines[late - 1].split()[0]} on line {late + first_line - 1}: {LATE_CELL_MAGIC}"
        raise ExportError(f"cell {index}, line {(e.lineno or 1) + first_line - 1}: invalid Python: {e.msg}{hint}") from None
    awaited = _top_level_await(tree)
    if awaited is not None:
        raise ExportError(f"cell {index}, line {awaited + first_line - 1}: top-level await (IPython runs it, a script cannot); "
                          "put the code in an async function and call it with asyncio.run(...)")
    code.source = text.rstrip("\n")  # (its blank lines above stay: the lines of tree and source are the cell's)
    try:  # (one symbol table for the names and the globals its functions declare)
        table = symtable.symtable(text, "<cell>", "exec")
    except SyntaxError as e:  # what ast.parse lets by and symtable refuses, as Python does (import * in a def)
        raise ExportError(f"cell {index}, line {(e.lineno or 1) + first_line - 1}: invalid Python: {e.msg}") from None
    code.reads, code.uses, code.assigns = names(table, tree)
    code.bindings, code.string_assignments = _bindings(tree)
    if f"def {TIMEIT_BODY}(): " in code.source:  # (%timeit STATEMENT lines: the function is the script's, no variable)
        code.source = re.sub(rf"(?m)^(\s*)def {TIMEIT_BODY}\(\): .*$", rf"\g<0>\n\g<1>{TIMEIT_BODY}()", code.source)
        code.assigns = tuple(n for n in code.assigns if n != TIMEIT_BODY)
        code.bindings = tuple(b for b in code.bindings if b[0] != TIMEIT_BODY)
    code.mutates = _mutated(tree)
    code.declared_globals = tuple(_scope_globals(table.get_children())[1])
    code.star_imports = tuple("." * n.level + (n.module or "") for n in ast.walk(tree)
                              if isinstance(n, ast.ImportFrom) and n.names[0].name == "*"
                              and not (n.module in _LMNB_MODULES and n.level == 0))
    return code


def _in_timeit_function(code: Code, first_line: int) -> None:
    """Make ``code`` (a ``%%timeit`` body, from line ``first_line`` of its cell) run in a function
    of its own, as IPython runs it, so that the names it binds are not set: it binds only those it
    declares ``global`` for the plan.

    Raises:
        ExportError: what a function cannot hold (``from math import *``), as IPython refuses it."""
    body = indent_code(code.source if ast.parse(code.source).body else code.source + "\npass")
    code.source = f"def {TIMEIT_BODY}():\n{body}\n{TIMEIT_BODY}()"
    try:
        code.declared_globals = code.assigns = declared_globals(code.source)
    except SyntaxError as e:  # (line 1 is the def's: the body's line k is line k + 1)
        raise ExportError(f"cell {code.index}, line {(e.lineno or 2) - 1 + first_line - 1}: invalid Python in a "
                          f"%%timeit body, which IPython runs in a function: {e.msg}; move that line out of the "
                          "%%timeit cell") from None
    code.bindings, code.string_assignments = (), {}


# the methods by which the built-in containers (dict, list, set) change in place
_CONTAINER_CHANGES = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
                                "setdefault", "add", "discard", "sort", "reverse", "difference_update",
                                "intersection_update", "symmetric_difference_update"})


def _mutated(tree: ast.AST, surely: bool = False, calls: bool = True) -> tuple:
    """Names whose object the code may change in place: a method call on them, or an item or
    attribute assigned or deleted (``seen.append(x)``, ``d[k] = v``, ``del d[k]``, ``d[k] += 1``).
    With ``surely``, of the method calls only those by which a dict, list or set changes in place
    (not ``PAT.sub(...)`` nor ``cache.get(k)``: a note that says a change must be true); with
    ``calls`` False, no method calls at all (the items and attributes changed alone)."""
    out: dict = {}
    for node in ast.walk(tree):
        base = None
        if (calls and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and (not surely or node.func.attr in _CONTAINER_CHANGES)):
            base = node.func.value
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
        if isinstance(base, ast.Name):
            out[base.id] = None
    return tuple(out)


def _top_level_await(tree: ast.Module) -> Optional[int]:
    """The line of the first ``await`` / ``async for`` / ``async with`` outside an async function."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return node.lineno
        if not isinstance(node, (ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return None


def _replace_magics(source: str, code: Code, first_line: int = 1) -> str:
    """``%lm`` lines and IPython magics / shell escapes → comments (``pass`` when indented).
    Raises ``ExportError`` for what the kernel refuses: a cell magic below the first line, or
    IPython syntax whose value is assigned."""
    lines = source.split("\n")
    for i, line in enumerate(lines):
        m = _LM_LINE.match(line)
        if m:
            lines[i] = _comment(m.group(1), _lm_command(code, (m.group(2) or "").strip()))
        m = _TIMING_LINE.match(line)
        if m:  # %time / %timeit STATEMENT: the statement runs (once), its timing is display only
            # (%timeit's in a function, as IPython runs it: python_cell adds the call on the next line)
            timeit = m.group(2) != "time"
            lines[i] = m.group(1) + (f"def {TIMEIT_BODY}(): " if timeit else "") + m.group(3)
    from IPython.core.inputtransformer2 import TransformerManager

    replaced = "\n".join(lines)
    # IPython drops the blank lines above the code: they stay, so errors give the cell's line numbers
    blank = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    transformed = [""] * blank + TransformerManager().transform_cell(replaced).rstrip("\n").split("\n")
    same_lines = len(transformed) == len(lines)
    for i, line in enumerate(transformed):
        if "get_ipython()" in line:
            original = lines[i].strip() if same_lines else line.strip()
            # IPython runs it as the line magic "%%lm", which does not exist (a "%..." line magic's name)
            late = re.match(r"\s*get_ipython\(\)\.run_line_magic\('(%[^']*)'", line)
            if late and i > blank:
                magic, at = "%" + late.group(1), i
                if not same_lines:  # (a line continued over several, which IPython joined: find it in the cell)
                    at = next((j for j in range(blank + 1, len(lines)) if lines[j].split()[:1] == [magic]), i)
                raise ExportError(f"cell {code.index}, line {at + first_line}: {magic} is below the "
                                  f"cell's first line, which the kernel refuses: {LATE_CELL_MAGIC}")
            if re.match(r"\s*[\w.,\s\[\]]+=\s*get_ipython\(\)", line):  # x = !ls, x = %env: a value a script lacks
                raise ExportError(f"cell {code.index}: {original!r} assigns what IPython syntax computes, which a "
                                  "plain script cannot; write it in Python (e.g. subprocess.run(..., "
                                  "capture_output=True, text=True).stdout for !cmd)")
            code.notes.append(f"cell {code.index}: dropped IPython syntax {original!r} (not plain Python)")
            indent = line[: len(line) - len(line.lstrip())]
            transformed[i] = _comment(indent, f"dropped IPython syntax (not plain Python): {original}")
    return "\n".join(transformed)


def _comment(indent: str, text: str) -> str:
    # An indented line may be a block's only statement, so it stays a statement.
    return f"{indent}pass  # {text}" if indent else f"# {text}"


_API_KEY = re.compile(r"(--api-key(?:=|\s+))(\"[^\"]*\"|'[^']*'|\S+)")


def _lm_command(code: Code, line: str) -> str:
    """Record a ``%lm`` line magic; returns the comment that replaces it."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    command = words[0] if words else ""
    shown = _API_KEY.sub(r"\1***", f"%lm {line}".strip())  # (the line becomes a comment of the script)
    if command == "help" or "-h" in words or "--help" in words:  # (the kernel prints help and runs nothing)
        return f"{shown}: help, display only, dropped"
    if command in ("load", "connect"):
        try:
            args = parse_backend_line(command, words[1:])
        except CellLineError as e:
            raise ExportError(f"cell {code.index}: {shown}: {e}") from None
        code.backends.append(Backend(model=args.model) if command == "load" else
                             Backend(url=args.url, openai_model=args.openai, completion=args.completion,
                                     timeout=args.timeout, continue_final_message=args.continue_final_message))
        kept = ("model",) if command == "load" else ("url", "openai", "completion", "timeout", "continue_final_message")
        lost = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k not in kept and v not in (None, False)]
        if lost:
            code.notes.append(f"cell {code.index}: {shown}: {', '.join(lost)} not carried into the job; pass "
                              "the job's own options (e.g. --dtype, --api-key) where it has them")
        # (one after the first %%lm cell is not followed: the plan's note says so)
        if command == "load":
            return f"{shown}: the job's default --model if before the first %%lm cell (the job loads one model, once)"
        return f"{shown}: the job's default --backend if before the first %%lm cell"
    if command in DISPLAY_COMMANDS:
        return f"{shown}: display only, dropped"
    if command == "reset":
        code.resets.append(words[1] if len(words) > 1 else None)
        return f"{shown}: the next %%lm cell with that --state starts a new state"
    if command in SESSION_COMMANDS:
        return f"{shown}: manages the notebook's kernel session, dropped"
    close = close_subcommand(command, ("help", "load", "connect", *DISPLAY_COMMANDS, *SESSION_COMMANDS))
    hint = f" (the kernel refuses it: did you mean %lm {close}?)" if close else ""  # (as the kernel's message says)
    code.notes.append(f"cell {code.index}: dropped unknown command {shown!r}{hint}")
    return f"{shown}: not a known %lm command, dropped{hint}"


# ------------------------------------------------------------------------------------- names
def names(table: symtable.SymbolTable, tree: ast.Module) -> tuple[tuple, tuple, tuple]:
    """(names the code reads from outside; every global it reads; names bound at top level, or by a
    function that declares them ``global``); the first two in order of first use. ``table`` and
    ``tree``: the code's symbol table (``symtable.symtable(source, "<cell>", "exec")``) and syntax tree.

    A global (``symtable``: read at top level or from inside a function) counts as read from
    outside unless a top-level statement binds it before the first statement that reads it
    (a statement's reads come before its own binding, as in ``x = x + 1``).
    """
    inner_read, inner_declared = _scope_globals(table.get_children())
    read = {s.get_name() for s in table.get_symbols() if s.is_referenced()} | inner_read
    first_read: dict = {}  # name -> index of the first top-level statement reading it
    first_bound: dict = {}
    for i, stmt in enumerate(tree.body):
        for n in ast.walk(stmt):
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                read.add(n.target.id)  # symtable counts x += 1 as a binding only
                first_read.setdefault(n.target.id, i)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                first_read.setdefault(n.id, i)
        for name in bound_by(stmt):
            first_bound.setdefault(name, i)
    outside = {n for n, i in first_read.items() if n in read and i <= first_bound.get(n, i)}
    unbound = _annotated_only(tree)
    bound = tuple(s.get_name() for s in table.get_symbols()
                  if (s.is_assigned() or s.is_imported()) and s.get_name() not in unbound)
    bound += tuple(n for n in inner_declared if n not in bound)
    if any(isinstance(n, ast.ImportFrom) and n.module in _LMNB_MODULES and n.level == 0
           and any(a.name == "*" for a in n.names) for n in tree.body):
        import lmnb  # (symtable lists no name a star import binds: a row field "gen" was made)

        bound += tuple(n for n in lmnb.__all__ if n not in bound)
    return _in_order(tree, outside), _in_order(tree, read), bound


def _annotated_only(tree: ast.Module) -> set:
    """The names that only a bare annotation names (``x: int``, no value), which binds nothing,
    though ``symtable`` counts the name as assigned: the names the code's symbol table has as
    assigned or imported once those annotations are gone are the ones it binds."""
    bare = [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and n.value is None
            and isinstance(n.target, ast.Name)]
    if not bare:
        return set()

    class Drop(ast.NodeTransformer):
        def visit_AnnAssign(self, node):
            return ast.Pass() if node.value is None else node

    table = symtable.symtable(ast.unparse(Drop().visit(copy.deepcopy(tree))), "<cell>", "exec")
    return {n.target.id for n in bare} - {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def declared_globals(source: str) -> tuple:
    """The names that functions and classes in ``source`` (a cell) declare ``global`` and bind."""
    return tuple(_scope_globals(symtable.symtable(source, "<cell>", "exec").get_children())[1])


def function_globals(source: str) -> dict:
    """Name → (the globals it reads when called, those it declares ``global`` and binds, those of
    the globals it reads that it may change in place: ``stats["calls"] += 1``, ``log.append(x)``,
    those of them it surely changes, ``_mutated(surely=True)``, the class attributes it changes,
    and the names whose attributes it changes by a computed name: ``class_attribute_changes``),
    for each function, lambda and class that the top level of ``source`` (a cell) defines: a
    function's body, and the functions in it; a class's methods (its body runs where the cell
    defines it). A lambda in a top-level assignment's value is known by the names assigned
    (``f = lambda: pi``, ``handlers = {"a": lambda: ...}``: what calling them runs), its entry
    merged with theirs. Not comprehensions, which run there too, nor the function of a
    ``%%timeit`` body or a ``%timeit`` line (``TIMEIT_BODY``), called there."""
    table = symtable.symtable(source, "<cell>", "exec")
    changed: dict = {}  # (name, line) → the names that the definition there may change in place (_mutated)
    surely: dict = {}  # (name, line) → those it surely changes
    attributes: dict = {}  # (name, line) → the class attributes it changes ("C.n")
    computed: dict = {}  # (name, line) → the names whose attributes it changes by a computed name
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            changed.setdefault((getattr(node, "name", "lambda"), node.lineno), set()).update(_mutated(node))
            surely.setdefault((getattr(node, "name", "lambda"), node.lineno), set()).update(_mutated(node, True))
            found_here, computed_here = class_attribute_changes(node)
            attributes.setdefault((getattr(node, "name", "lambda"), node.lineno), set()).update(found_here)
            computed.setdefault((getattr(node, "name", "lambda"), node.lineno), set()).update(computed_here)
    assigned = {}  # line of a lambda in a top-level assignment's value → the names assigned
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            for node in ast.walk(stmt.value):
                if isinstance(node, ast.Lambda):
                    assigned.setdefault(node.lineno, []).extend(bound_by(stmt))
    found: dict = {}  # name → (where it was defined, [read, declared, may change, surely changes])
    for child in table.get_children():
        if child.get_name() in ("listcomp", "setcomp", "dictcomp", "genexpr", TIMEIT_BODY):  # (their tables' names)
            continue
        read, declared = _scope_globals([child] if child.get_type() == "function" else child.get_children())
        key = (child.get_name(), child.get_lineno())
        mutated = changed.get(key, set()) & read  # (not its own variables)
        lambda_line = key[1] if key[0] == "lambda" else None
        for name in assigned.get(lambda_line, [key[0]]):
            if found.get(name, (None,))[0] != (lambda_line or key):  # (a later definition replaces it, as it runs)
                found[name] = (lambda_line or key, [set(), {}, set(), set(), set(), set()])
            entry = found[name][1]  # (several lambdas of one assignment: what any of them does)
            entry[0] |= read
            entry[1].update(declared)
            entry[2] |= mutated
            entry[3] |= surely.get(key, set()) & read
            entry[4] |= {a for a in attributes.get(key, set()) if a.split(".")[0] in read | {key[0]}}
            entry[5] |= computed.get(key, set()) & (read | {key[0]})
    return {name: (tuple(sorted(r)), tuple(d), *(tuple(sorted(e)) for e in rest))
            for name, (_, (r, d, *rest)) in found.items()}


def class_attribute_changes(tree: ast.AST) -> tuple[tuple, tuple]:
    """(the class attributes that ``tree`` (code, or a function or class) sets, deletes or changes
    in place, as "C.n": ``C.n += 1``, ``del C.n``, ``C.seen[k] = v``, ``C.seen.append(x)``,
    ``setattr(C, "n", 1)``, and in a method of class C ``cls.n`` (a classmethod's), ``type(self).n``
    and ``self.__class__.n``; the names whose attribute ``setattr`` / ``delattr`` name by a computed
    string, which cannot be told). Any name's, class or not (the plan keeps those of set-up classes)."""
    found, unknown = [], []
    for node, owners in _with_owners(tree, {}):
        changed = None
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            changed = node
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            changed = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _CONTAINER_CHANGES:
            changed = node.func.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and len(node.args) >= 2:
            owner = _owner(node.args[0], owners)
            if owner is not None and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                found.append(f"{owner}.{node.args[1].value}")
            elif owner is not None:
                unknown.append(owner)
        if isinstance(changed, ast.Attribute):
            owner = _owner(changed.value, owners)
            if owner is not None:
                found.append(f"{owner}.{_mangled(changed.attr, owners.get(None, ''))}")
    return tuple(dict.fromkeys(found)), tuple(dict.fromkeys(unknown))


def _mangled(attribute: str, cls: str) -> str:
    """``attribute`` as Python stores it when code in the body of class ``cls`` ("" for none) names
    it: ``__n`` is ``_C__n`` there (private name mangling), dunder names are not."""
    if attribute.startswith("__") and not attribute.endswith("__") and cls.strip("_"):
        return f"_{cls.lstrip('_')}{attribute}"
    return attribute


def _with_owners(node: ast.AST, owners: dict):
    """(node, owners) for each node inside ``node``: owners maps a method's first parameter to its
    class's name, as ("cls", "C") for a classmethod's or a metaclass's (``class Meta(type)``) and
    ("self", "C") otherwise (``_owner``), and
    None to the name of the innermost class whose body holds the node (``_mangled``), "." to its
    qualified name ("Outer.Inner": a nested class's ``cls.n`` is "Outer.Inner.n")."""
    qualified = (f"{owners['.']}.{node.name}" if "." in owners else node.name) if isinstance(node, ast.ClassDef) else None
    for child in ast.iter_child_nodes(node):
        inner = owners
        if isinstance(node, ast.ClassDef):
            inner = {**owners, None: node.name, ".": qualified}
        if isinstance(node, ast.ClassDef) and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and child.args.args:
            # (a metaclass's method is given a class: "Meta.n" stands for n of its classes, Job.keep)
            classmethod_ = any(isinstance(d, ast.Name) and d.id == "classmethod" for d in child.decorator_list) \
                or any(isinstance(b, ast.Name) and b.id == "type" for b in node.bases)
            inner = {**inner, child.args.args[0].arg: ("cls" if classmethod_ else "self", qualified)}
        yield child, inner
        yield from _with_owners(child, inner)


def _owner(value: ast.AST, owners: dict):
    """The name of the class (or other global) whose attribute ``value.attr`` is, dotted where it is
    an attribute of one ("Outer.Inner"), or None (an instance's: ``self.n``)."""
    if isinstance(value, ast.Name):
        kind, cls = owners.get(value.id, (None, None))
        return cls if kind == "cls" else None if kind == "self" else value.id
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "type" \
            and len(value.args) == 1 and isinstance(value.args[0], ast.Name):
        kind, cls = owners.get(value.args[0].id, (None, None))
        return cls if kind == "self" else None
    if isinstance(value, ast.Attribute) and value.attr == "__class__" and isinstance(value.value, ast.Name):
        kind, cls = owners.get(value.value.id, (None, None))
        return cls if kind == "self" else None
    if isinstance(value, ast.Attribute):  # (an attribute's own attribute: a nested class's, "Outer.Inner")
        outer = _owner(value.value, owners)
        return None if outer is None else f"{outer}.{value.attr}"
    return None


def _scope_globals(tables) -> tuple[set, dict]:
    """(the globals that the scopes of ``tables`` (symbol tables) and those inside them read, the
    names they declare ``global`` and bind, in order). For the functions and classes inside a cell
    (its table's children; a %%timeit body runs in a function too), those names are the ones the
    cell binds when it calls them, as far as can be told without running it (a later %%lm cell that
    read one made it a row field)."""
    read, declared = set(), {}
    for table in tables:
        symbols = table.get_symbols()
        read |= {s.get_name() for s in symbols if s.is_referenced() and s.is_global()}
        declared.update(dict.fromkeys(s.get_name() for s in symbols
                                      if s.is_declared_global() and (s.is_assigned() or s.is_imported())))
        inner_read, inner_declared = _scope_globals(table.get_children())
        read |= inner_read
        declared.update(inner_declared)
    return read, declared


def _in_order(tree: ast.AST, wanted: set) -> tuple:
    uses = sorted((n.lineno, n.col_offset, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in wanted)
    seen = list(dict.fromkeys(name for _, _, name in uses))
    return tuple(seen) + tuple(sorted(wanted - set(seen)))


def _bindings(tree: ast.Module) -> tuple[tuple, dict]:
    bindings, strings = [], {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) or isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            literal = isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
            if all(isinstance(t, ast.Name) for t in targets):
                for t in targets:
                    bindings.append((t.id, literal))
                    if literal:
                        strings.setdefault(t.id, []).append((stmt.lineno, stmt.end_lineno))
                continue
        for name in bound_by(stmt):
            bindings.append((name, False))
    return tuple(bindings), strings


def bound_by(stmt: ast.stmt) -> list[str]:
    """The names a top-level statement binds in its scope (not those of functions, classes,
    lambdas and comprehensions inside it)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):  # (a star import binds names unknown here)
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    out = []
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            if node is not stmt:
                if not isinstance(node, ast.Lambda):
                    out.append(node.name)
                continue
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.AnnAssign) and node.value is None:  # (`x: int` binds nothing)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.append(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:  # (`case e:`, `case [*rest]:`)
            out.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:  # (`case {**rest}:`)
            out.append(node.rest)
        stack.extend(ast.iter_child_nodes(node))
    return out


def deleted_by(stmt: ast.stmt) -> set[str]:
    """The names a ``del`` in a top-level statement unbinds in its scope (not in the functions,
    classes and lambdas inside it, whose own variables they are)."""
    out, stack = set(), [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
            out.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return out


def python_program_reads(body: str) -> tuple[tuple, tuple]:
    """(the global names a ``%%lm --python`` body reads, in order; those it and the functions in
    it declare ``global`` and bind): it runs as ``def cell(s): <body>`` on the kernel's globals."""
    # Indenting changes multi-line strings' text but not which names the body reads; the closing
    # pass gives a body of comments only (which the kernel runs, as nothing) a statement.
    wrapped = "def _cell(s):\n" + textwrap.indent(body.rstrip("\n"), "    ", lambda _: True) + "\n    pass\n"
    table = symtable.symtable(wrapped, "<cell>", "exec")
    read, declared = _scope_globals(table.get_children())
    return _in_order(ast.parse(wrapped), read), tuple(declared)


@dataclass(frozen=True)
class LmnbNames:
    """What a notebook's code calls lmnb's capturing primitives (``_CAPTURING``) by, as its cells
    bind them in order. modules: names of a module that has them (``lmnb``, which the kernel defines
    for ``--python`` bodies; ``import lmnb as sgl``, ``import lmnb.api as A``); functions: names of
    a primitive (``from lmnb import gen as g``, ``from lmnb import *``, ``ask =
    functools.partial(lmnb.gen, max_tokens=5)``); partials: names of ``functools.partial`` (``from
    functools import partial as p``). A ``gen`` or ``select`` of anything else (``np.select``,
    ``df.select``, the user's own ``gen``, a ``gen`` imported from lmnb and then bound to another
    function) names no variable of the cell."""

    modules: frozenset = frozenset({"lmnb"})
    functions: frozenset = frozenset()
    partials: frozenset = frozenset({"partial"})

    def seen(self, tree: ast.AST) -> "LmnbNames":
        """These names as ``tree``'s bindings (``_lmnb_name_bindings``) leave them, taken in
        source order: imports of lmnb or of ``partial`` and ``partial(PRIMITIVE)`` assignments add
        names, any other binding of a name (``gen = my_function``, ``def gen``) takes it out."""
        names = self
        for node in sorted(_lmnb_name_bindings(tree), key=lambda n: (n.lineno, n.col_offset)):
            kept = {"module": set(names.modules), "function": set(names.functions), "partial": set(names.partials)}
            for name, kind in _bound_names(node, names):
                for known in kept.values():  # (a name bound anew is only what it is now)
                    known.discard(name)
                if kind is not None:
                    kept[kind].add(name)
            names = LmnbNames(*(frozenset(kept[k]) for k in ("module", "function", "partial")))
        return names

    def is_primitive(self, func: ast.expr) -> bool:
        """Whether the expression ``func`` is one of lmnb's capturing primitives."""
        if isinstance(func, ast.Attribute):
            return func.attr in _CAPTURING and isinstance(func.value, ast.Name) and func.value.id in self.modules
        return isinstance(func, ast.Name) and func.id in self.functions

    def is_partial_primitive(self, call: ast.Call) -> bool:
        """Whether ``call`` is ``partial(PRIMITIVE, ...)`` (``functools.partial`` too)."""
        func = call.func
        partial = ((isinstance(func, ast.Name) and func.id in self.partials)
                   or (isinstance(func, ast.Attribute) and func.attr == "partial"
                       and isinstance(func.value, ast.Name) and func.value.id == "functools"))
        return partial and bool(call.args) and self.is_primitive(call.args[0])

    def partial_name(self, call: ast.Call):
        """The name argument that ``partial(PRIMITIVE, NAME)`` (or ``name=NAME``) binds, else None."""
        if not self.is_partial_primitive(call):
            return None
        return _name_argument(call.args[1:], call.keywords)


def _lmnb_name_bindings(tree: ast.AST) -> list:
    """The nodes of ``tree`` that ``LmnbNames.seen`` reads: its imports and ``global`` statements,
    also those inside a function (the kernel may run them, and a function declares a name global
    to bind it), and what binds a name in its top scope: assignments, ``for`` and ``with ... as``
    targets, ``:=``, ``except ... as``, ``case ... as`` and ``case [*rest]`` names, ``del``, augmented
    assignments (``gen += ...``), ``def`` and ``class`` (those inside a function, class or lambda
    bind names of their own)."""
    out, todo = [], list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom, *_TOP_BINDINGS, *_SCOPES)):
            out.append(node)
        if isinstance(node, _SCOPES):
            out += [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom, ast.Global))]
        elif not isinstance(node, ast.Lambda):  # (a := inside a lambda binds the lambda's own name)
            todo += ast.iter_child_nodes(node)
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# What binds (or unbinds) names other than by an import, def or class: the names of its targets, or
# the name of an except/case clause.
_NAMED = (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)
_TARGETS = (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.AugAssign, ast.Delete)  # (values unknown here)
_TOP_BINDINGS = (ast.Assign, ast.AnnAssign, ast.NamedExpr, *_TARGETS, *_NAMED)
_LMNB_MODULES = ("lmnb", "lmnb.api")  # the modules whose gen/select are lmnb's


def _bound_names(node: ast.stmt, names: LmnbNames) -> list:
    """(name, kind) for each name that ``node`` binds: kind is "module", "function" or "partial" for
    a module of lmnb's primitives, a primitive (``partial(PRIMITIVE)`` without a name too) and
    ``functools.partial``, as ``names`` call them, else None."""
    if isinstance(node, _SCOPES):
        return [(node.name, None)]
    if isinstance(node, ast.Global):
        return [(name, None) for name in node.names]
    if isinstance(node, _NAMED):  # (except E as gen, case str() as gen, case [*gen])
        return [(node.name, None)] if node.name else []
    if isinstance(node, _TARGETS):
        targets = (node.targets if isinstance(node, ast.Delete) else
                   [item.optional_vars for item in node.items if item.optional_vars is not None]
                   if isinstance(node, (ast.With, ast.AsyncWith)) else [node.target])
        return [(t.id, None) for target in targets for t in ast.walk(target)  # (not the i of `for a[i] in`)
                if isinstance(t, ast.Name) and not isinstance(t.ctx, ast.Load)]  # (del gen unbinds it)
    if isinstance(node, ast.Import):  # (import lmnb.api binds lmnb; import lmnb.api as A, the module api)
        return [(a.asname, "module" if a.name in _LMNB_MODULES else None) if a.asname else
                (a.name.split(".")[0], "module" if a.name.split(".")[0] == "lmnb" else None) for a in node.names]
    if isinstance(node, ast.ImportFrom):
        module = node.module if node.level == 0 else None
        out = []
        for a in node.names:
            if a.name == "*":  # another module's * binds names unknown here
                out += [(n, "function") for n in _CAPTURING] if module in _LMNB_MODULES else []
                continue
            kind = ("function" if (module or "").split(".")[0] == "lmnb" and a.name in _CAPTURING
                    else "module" if module == "lmnb" and a.name == "api"
                    else "partial" if module == "functools" and a.name == "partial" else None)
            out.append((a.asname or a.name, kind))
        return out
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if node.value is not None else []
    value = node.value
    alias = (names.is_primitive(value) or isinstance(value, ast.Call) and names.is_partial_primitive(value)
             and _name_argument(value.args[1:], value.keywords) is None)
    # ask = partial(gen, max_tokens=5) names no variable: ask("x") does, as gen("x") would
    kind = "function" if alias else "module" if isinstance(value, ast.Name) and value.id in names.modules else None
    return [(t.id, kind if isinstance(t, ast.Name) and t is target else None)
            for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]


def _name_argument(args: list, keywords: list):
    """The name argument (AST node) of a primitive called with ``args`` and ``keywords``, or None."""
    return args[0] if args else next((k.value for k in keywords if k.arg == "name"), None)


def _captured_names(tree: ast.Module, names: LmnbNames) -> list:
    """The name arguments (AST nodes) of a ``--python`` body's calls of lmnb's ``gen``/``select``
    (and of ``partial(gen, NAME)``), its own imports counted with ``names``."""
    names = names.seen(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        arg = (_name_argument(node.args, node.keywords) if names.is_primitive(node.func)
               else names.partial_name(node))
        if arg is not None:
            out.append(arg)
    return out


def python_program_captures(tree: ast.Module, names: LmnbNames) -> tuple:
    """Variables a ``--python`` body's ``gen``/``select`` calls name with a string literal
    (``names``: what the cells above call them, see ``LmnbNames``)."""
    out: list = []
    for arg in _captured_names(tree, names):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value not in out:
            out.append(arg.value)
    return tuple(out)


def _check_python_choices(program, names: LmnbNames, indent: str) -> None:
    """Refuse a ``--python`` body's call of lmnb's ``select`` / ``gen`` whose choices are a literal
    list that names one choice twice (``lmnb.choices.repeated_choices_problem``), as a template
    cell's ``{select ...}`` is refused before anything runs; it failed only when the job ran.
    Computed lists are found as the cell runs, as in the kernel.

    Raises:
        TemplateSyntaxError: at the choices, in cell lines and columns (``indent``: see ``_lm_cell``).
    """
    from lmnb.choices import repeated_choices_problem
    from lmnb.template.errors import TemplateSyntaxError, node_offset

    tree = ast.parse(program.source)  # (program.tree counts the cell's lines)
    names = names.seen(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and names.is_primitive(n.func)]
    for call in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        called = ast.unparse(call.func)
        positional = call.args[1] if called.rsplit(".", 1)[-1] == "select" and len(call.args) > 1 else None
        choices = next((k.value for k in call.keywords if k.arg == "choices"), positional)
        try:
            value = ast.literal_eval(choices) if choices is not None else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, (list, tuple)) and all(isinstance(c, str) for c in value):
            problem = repeated_choices_problem(value)
            if problem:
                raise TemplateSyntaxError(f"{called}() {problem}", program.source, node_offset(program.source, choices),
                                          program.first_line, indent=indent)


def computed_capture_notes(index: int, tree: ast.Module, names: LmnbNames) -> list:
    """Warnings for the ``gen``/``select`` names a ``--python`` body computes (``f"g{i}"``): the
    kernel binds whatever name comes out, the job only the literal ones, so a later cell reading
    such a variable fails there with a NameError."""
    computed = [ast.unparse(a) for a in _captured_names(tree, names)  # (gen(None, ...) names no variable)
                if not isinstance(a, (ast.Constant, ast.Starred))]
    if not computed:
        return []
    shown = list(dict.fromkeys(computed))
    if len(shown) == 1:
        return [f"cell {index}: gen/select name {shown[0]} is computed, so the job does not bind it as a variable (the "
                "kernel does); name it with a string literal, or read it from the cell's --out state"]
    return [f"cell {index}: gen/select names {', '.join(shown)} are computed, so the job does not bind them as variables "
            "(the kernel does); name them with string literals, or read them from the cell's --out state"]
