"""Write a ``Plan`` as a plain Python script that imports only ``lmnb`` and the submodules it calls
(and IPython's ``display`` when the notebook's code calls it).

Layout: docstring (how to run it, what a row needs, what it writes), ``job = lmnb.batch.Job(...)``,
the setup cells and one ``@lmnb.function`` per ``%%lm`` cell at module level in notebook order,
``run_row(<fields>)`` holding the per-row cells, and ``job.run(run_row, ...)`` under ``__main__``.
The ``@lmnb.function`` bodies come from the cell-language parser's source face
(``Template.to_python``), the same tree the ``%%lm`` magic runs, so script and notebook agree.
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass

from lmnb.batch.options import parameter_options
from lmnb.export.cells import TIMEIT_BODY, Code, Dropped, ExportError, LMCell, Markdown, bound_by, deleted_by
from lmnb.export.parameters import NO_DEFAULT
from lmnb.export.plan import _BUILTINS, Plan
from lmnb.template.python_cell import indent_code

_INDENT = "    "
RUN_LINE = ("python {script} --input rows.jsonl --output results.jsonl [--backend engine|URL] [--model PATH]\n"
            "{pad} [--num-threads N] [--limit N] [--id-field F]")


def write_script(p: Plan, notebook_name: str = "notebook.ipynb", script_name: str = "job.py",
                 reexport: str = "--inputs NAMES", exported_by: str = "lmnb export") -> str:
    """The script's source text (see the module docstring). ``reexport``: the job's (``lmnb.batch.Job``);
    ``exported_by``: the command of the tool that exports it, which its docstring names."""
    names = _Names(p)
    w = _Writer(p, names, reexport, exported_by)
    if not p.row:
        return _join(_with_imports(p, w.run_once(notebook_name, script_name)))
    parts = [w.docstring(notebook_name, script_name), "", w.job_line()]  # (imports: once the code is written)
    for cell in p.setup + [c for c in p.row if isinstance(c, LMCell)]:
        parts.append(w.module_cell(cell))
    parts.append(w.keep())  # (before the star imports: a row starts without the names only they set)
    parts.append(w.star_imports())
    parts.append(w.run_row())
    # Prefix hints trace each program once before the rows; a --python body is the user's own code,
    # whose side effects (a print, a file or API write) would run an extra time, on placeholders.
    programs = ", ".join(names.function(c) for c in p.lm_cells if c.template is not None)
    parts.append(f'if __name__ == "__main__":\n{_INDENT}raise SystemExit({names.job}.run({names.run_row}, '
                 f"programs=[{programs}]))\n")
    return _join(_with_imports(p, parts))


def _with_imports(p: Plan, parts: list) -> list:
    """``parts`` (docstring, a placeholder, then the code) with the placeholder replaced by the imports
    the code needs."""
    return [parts[0], _imports(p, "\n".join(parts[2:])), *parts[2:]]


def _imports(p: Plan, code: str) -> str:
    """The script's imports: lmnb, lmnb.batch, lmnb.template where ``code`` (the rest of the script)
    calls it (a fork's checks: it ran only because lmnb.batch happens to import it), and Jupyter's
    built-ins (IPython's ``display``) that the notebook's code calls before defining its own
    (``Plan.jupyter``: every row failed on a NameError; outside IPython ``display`` prints its
    arguments)."""
    lines = ["import lmnb", "import lmnb.batch"]
    if re.search(r"\blmnb\.template\.", code):
        lines.append("import lmnb.template")
    for name in p.jupyter:
        lines.append(f"from IPython.display import {name}  # Jupyter's built-in, used by the notebook's code")
    return "\n".join(lines) + "\n"


def _join(parts: list) -> str:
    text = "\n\n".join(part.rstrip("\n") + "\n" for part in parts if part.strip())
    return "#!/usr/bin/env python3\n" + re.sub(r"\n{4,}", "\n\n\n", text)


class _Names:
    """Names the script introduces, chosen not to clash with any name the notebook uses."""

    def __init__(self, p: Plan):
        taken = set(p.inputs) | set(p.parameters) | {"lmnb"}
        for c in p.cells:
            taken |= set(getattr(c, "reads", ())) | set(getattr(c, "assigns", ())) | set(getattr(c, "captures", ()))
            if isinstance(c, LMCell) and c.options.out:
                taken.add(c.options.out)
        self.taken = taken
        self.job = self.fresh("job")
        self.run_row = self.fresh("run_row")
        self.params = self.fresh("params")
        self.state = self.fresh("state")
        self._functions: dict = {}
        self._states: dict = {}

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken or keyword.iskeyword(name):
            name += "_"
        self.taken.add(name)
        return name

    def function(self, cell: LMCell) -> str:
        if cell.index not in self._functions:
            self._functions[cell.index] = self.fresh(f"cell_{cell.index}")
        return self._functions[cell.index]

    def named_state(self, name: str) -> str:
        if name not in self._states:
            self._states[name] = self.fresh("state_" + re.sub(r"\W", "_", name))
        return self._states[name]


class _Writer:
    def __init__(self, p: Plan, names: _Names, reexport: str, exported_by: str):
        self.p, self.names, self.reexport, self.exported_by = p, names, reexport, exported_by
        # row field → (cell, line) of the notebook's first example of it ((0, 0): none, the row gives it from the start)
        self.field_at = {n: min(((c.index, first) for c in p.cells if isinstance(c, Code)
                                 for first, _ in c.string_assignments.get(n, [])), default=(0, 0)) for n in p.inputs}

    # -- header ---------------------------------------------------------------------------------
    def docstring(self, notebook_name: str, script_name: str) -> str:
        p = self.p
        setup = [c.index for c in p.setup if isinstance(c, Code)]
        row = [c.index for c in p.row if isinstance(c, (Code, LMCell))]
        fields = ", ".join(p.inputs) or "none (every row runs the same program)"
        lines = [
            f"Batch job exported by `{self.exported_by}` from {notebook_name}: its %%lm programs, run once per input row.",
            "",
            "    " + RUN_LINE.format(script=script_name, pad=" " * len(f"python {script_name}")).replace("\n", "\n    "),
            "",
            f"Each input row (a JSON object per line, or a CSV row under a header) gives: {fields}.",
        ]
        if p.texts:
            lines.append(f"Text, as the notebook's examples are (a JSON string, not a number or a list): "
                         f"{', '.join(p.texts)}.")
        if p.parameters:
            lines.append(f"Notebook parameters, as options: {', '.join(parameter_options(p.parameters).values())}.")
        lines += [
            f"Cells run once at start: {_ranges(setup) or 'none'}; cells run for every row (run_row): {_ranges(row)}.",
            "",
            "Output: one JSON line per row: row (its index in the input), line, id (with --id-field),",
            "status (ok / error / bad_input), variables (what the %%lm cells captured:",
            f"{', '.join(p.captures) or 'none'}), finish_reasons, tokens (prompt, cached, completion),",
            "seconds, error, and input_hash and script (what a rerun checks: a row whose input changed is",
            "refused, rows run by an edited script are counted). The output is appended to as rows finish",
            "(with --num-threads above 1 that is not input order: sort on row); run the same command again",
            "after a crash or Ctrl-C and it continues with the rows not yet written.",
            "",
            "Exit status: 0 every row of the output is ok; 1 some row failed or its input was unusable (its",
            "record says why; each row is checked before any runs, and the good ones run), also on a rerun that",
            "leaves it so: the output is not complete until every row is ok; 2 the job could not start; 130",
            "stopped by Ctrl-C or SIGTERM, 141 by a closed pipe that the rows print into (| head), before",
            "every row was written.",
        ]
        body = "\n".join(lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        return f'"""{body}\n"""'

    def run_once(self, notebook_name: str, script_name: str) -> list:
        """The parts of a script for a notebook without ``%%lm`` cells: its cells, run once."""
        n = self.names
        doc = (f'"""Script exported by `{self.exported_by}` from {notebook_name}. The notebook has no %%lm cell, so\n'
               "there is no program to run per input row: this runs the notebook's cells once, in order, on\n"
               "the backend the options choose.\n\n"
               f"    python {script_name} [--backend engine|URL] [--model PATH]"
               + "".join(f" [{o} VALUE]" for o in parameter_options(self.p.parameters, per_row=False).values())
               + '\n"""')
        start = f"{n.job}.start()  # the backend the notebook's programs run on (--backend, --model)"
        parts = [doc, "", self.job_line(per_row=False)]  # (imports: once the code is written)
        if not self.p.parameters:
            parts.append(start)
        for cell in self.p.setup:
            parts.append(self.module_cell(cell))
            if cell.index == self.p.parameters_cell and self.p.parameters:
                parts.append(start)
        return parts

    def job_line(self, per_row: bool = True) -> str:
        if not per_row:
            return (f"{self.names.job} = lmnb.batch.Job(__doc__, per_row=False{self.backend_kwargs()}"
                    f"{self.parameter_kwargs()}, options_first=True)")
        texts = f", texts={list(self.p.texts)!r}" if self.p.texts else ""
        if self.p.types:  # (the type's name: the builtin, as the job line comes before the notebook's code)
            texts += ", types={" + ", ".join(f"{n!r}: {t.__name__}" for n, t in self.p.types.items()) + "}"
        start = f"{self.names.job} = lmnb.batch.Job("
        # (the command on a line of its own: on the settings' line it ran past 150 characters)
        return (f"{start}__doc__, inputs={list(self.p.inputs)!r}{texts}{self.backend_kwargs()}"
                f"{self.parameter_kwargs()}, options_first=True,\n{' ' * len(start)}reexport={self.reexport!r})")

    def parameter_kwargs(self) -> str:
        """The job's ``parameters=`` (each parameter's default as the parameters cell's literal
        gives it) and ``computed=`` (those the cell computes, ``n = len(x)``, or whose value no
        literal writes back, ``1e999``): the job reads its command line, ``--help`` too, before
        any cell runs (it ran the cells above the parameters cell first: a model load); "" for
        none."""
        if not self.p.parameters:
            return ""
        defaults, computed = {}, []
        for name in self.p.parameters:
            default = self.p.parameter_defaults.get(name, NO_DEFAULT)
            if default is NO_DEFAULT or not _written_back(default):
                computed.append(name)
                default = None
            defaults[name] = default
        return f", parameters={{{', '.join(f'{n!r}: {v!r}' for n, v in defaults.items())}}}" + (
            f", computed={computed!r}" if computed else "")

    def backend_kwargs(self) -> str:
        kwargs = []
        b = self.p.backend
        for key, value in (("model", b.model), ("backend", b.url), ("openai_model", b.openai_model),
                           ("completion", b.completion or None), ("timeout", b.timeout),
                           ("continue_final_message", b.continue_final_message or None)):
            if value is not None:
                kwargs.append(f", {key}={value!r}")
        return "".join(kwargs)

    # -- module level ---------------------------------------------------------------------------
    def module_cell(self, cell) -> str:
        if isinstance(cell, Markdown):
            return _markdown(cell)
        if isinstance(cell, Dropped):
            return f"# -- cell {cell.index}: {cell.first_line} -- dropped: {cell.reason}"
        if isinstance(cell, LMCell):
            return f"# -- cell {cell.index}: %%lm {cell.line}".rstrip() + "\n" + self.program(cell)
        if cell.index == self.p.parameters_cell and self.p.parameters:
            return self.parameters_cell(cell)
        return f"# -- cell {cell.index}{_magic_note(cell)}\n{_mark_examples(cell, self.p.inputs)}"

    def parameters_cell(self, cell: Code) -> str:
        n = self.names
        args = ", ".join(f"{name}={name}" for name in self.p.parameters)
        lines = [f"# -- cell {cell.index}: parameters (papermill); command-line options override them",
                 cell.source, f"{n.params} = {n.job}.parameters({args})"]
        lines += [f"{name} = {n.params}.{name}" for name in self.p.parameters]
        return "\n".join(lines)

    def program(self, cell: LMCell) -> str:
        """The ``@lmnb.function`` of a ``%%lm`` cell, from the cell-language parser."""
        name, params = self.names.function(cell), self.p.lm_params[cell.index]
        if cell.template is not None:
            try:
                return cell.template.to_python(name, parameters=params)
            except ValueError as e:
                from lmnb.export.cells import ExportError

                raise ExportError(f"cell {cell.index} (%%lm): {e}") from None
        return python_program_source(cell.python, name, params)

    # -- per row --------------------------------------------------------------------------------
    def star_imports(self) -> str:
        """The star imports of the per-row cells, made at module level before ``run_row`` for the
        names that no variable of the script holds (a function cannot make one; the functions of the
        setup cells read them as globals, run_row its own variables: ``Plan.star_names``):
        ``Job.star_import``. Empty if none."""
        found = {c.index: _star_imports(c) for c in self.p.row if isinstance(c, Code)}
        modules = list(dict.fromkeys(s.module for stars in found.values() for s in stars))
        if not modules:
            return ""
        cells = _ranges([i for i, stars in found.items() if stars])
        # the setup cells' star imports, made above: their names are no variables, and a row's import replaces them
        earlier = self.setup_star_modules()
        over = f", over={earlier}" if earlier != "()" else ""
        if self.p.function_reads:
            over += f", functions={self.p.function_reads!r}"
        if self.p.early_reads:
            over += f", early={self.p.early_reads!r}"
        return (f"# -- the star imports of {'cell' if cells.isdigit() else 'cells'} {cells}, which run per row: here, "
                "as a function (run_row) cannot make one,\n# for the functions of the cells run once; run_row's "
                "variables take the module's values where the cell imports\n"
                + f"{self.names.job}.star_import(globals(), {', '.join(map(repr, modules))}{over})")

    def setup_star_modules(self) -> str:
        """The modules the setup cells star-import, in order, as a tuple's source text."""
        modules = list(dict.fromkeys(m for c in self.p.setup if isinstance(c, Code) for m in c.star_imports))
        return f"({', '.join(map(repr, modules))}{',' * (len(modules) == 1)})"

    def keep(self) -> str:
        """The module-level line that keeps the values of ``Plan.restored`` (``Job.keep``); empty if none."""
        if not self.p.restored:
            return ""
        return ("# set in each row (by a function's `global`, a row's star import, or a change of a class attribute\n"
                "# 'C.n'): each row starts from the value the cells run once left\n"
                f"{self.names.job}.keep(globals(), {', '.join(map(repr, self.p.restored))})")

    def run_row(self) -> str:
        n, p = self.names, self.p
        cells = _ranges([c.index for c in p.row if isinstance(c, (Code, LMCell))])
        which = "cell" if cells.isdigit() else "cells"
        doc = (f'"""Notebook {which} {cells} for one input row. The job records what the %%lm cells\n'
               f'{_INDENT}capture; an exception (a failed cell raises at its sync()) fails the row."""')
        body = [doc]
        if p.shared:  # (a cell's code and a function's `global` set one variable, as in the notebook)
            body.append(f"global {', '.join(p.shared)}  # set or read by a function too: the script's, which rows "
                        "share")
        if p.restored or p.early_builtins:
            kept = [*p.restored, *(["the builtins the row's star import sets"] if p.early_builtins else [])]
            body.append(f"{n.job}.restore(globals())  # {', '.join(kept)}: as the cells run once left them")
        setup = [s for c in p.setup if isinstance(c, Code) for s in ast.parse(c.source).body]
        defined = _surely_bound(setup)  # (the notebook's globals bound whatever ran: a `del` of one is no NameError)
        defined |= set(p.jupyter)  # (the script imports them)
        for name in p.copied:
            body.append(_row_variable(name, f'{n.job}.row_copy(globals(){_lookup(name, defined, n.job)})',
                                      "changed below: each row starts from the module value", n.job, defined))
        for name in p.star_locals:
            body.append(_row_variable(name, f"globals(){_lookup(name, defined, n.job)}",
                                      "a star import below may set it: the row's own variable", n.job, defined))
        # run_row's variables so far (but the row fields), and those of them bound whatever ran (star_values)
        bound = [*p.copied, *p.star_locals, *p.star_names, *p.rebound_builtins]
        sure = (set(bound) - set(p.star_names) - set(p.copied) - set(p.star_locals)) \
            | ((set(p.copied) | set(p.star_locals)) & defined)
        # (and the kept globals that the cells run once bind whatever ran: job.restore binds them)
        sure |= set(p.restored) & defined
        if p.star_names or p.rebound_builtins:
            names = (*p.star_names, *p.rebound_builtins)
            lines = ["# set by no cell, but a star import below may, or builtins that a cell below binds: the row's "
                     "own variables, as the notebook has them before it" if p.rebound_builtins else
                     "# set by no cell, but a star import below may: the row's own variables, as the notebook has "
                     "them before it",
                     f"{', '.join(names)}{',' * (len(names) == 1)} = {n.job}.star_start("
                     f"{self.setup_star_modules()}, {', '.join(map(repr, names))})"]
            for name in names:
                if name in _BUILTINS:
                    sure.add(name)
                else:
                    lines.append(f"if {name} is {n.job}.UNBOUND:  # (no builtin, nor set by the cells run once)\n"
                                 f"{_INDENT}del {name}")
            body.append("\n".join(lines))
        for i, cell in enumerate(p.row):
            body.append(self.row_cell(cell, bound, sure, p.row[i + 1:], frozenset(defined)))
            if isinstance(cell, Code):
                bound += [name for name in cell.assigns if name not in p.shared]
                sure = _surely_bound(ast.parse(cell.source).body, sure)
                defined = _surely_bound(ast.parse(cell.source).body, defined)
            elif isinstance(cell, LMCell):
                bound += [name for name in self.lm_sets(cell) if name not in p.shared]
                sure |= set(self.lm_sets(cell))
                defined |= set(self.lm_sets(cell))
        text = "\n\n".join(indent_code(b) for b in body)
        return f"def {n.run_row}({', '.join(p.inputs)}):\n{text}"

    def lm_sets(self, cell: LMCell) -> list:
        """The variables run_row binds after a ``%%lm`` cell: its captures read later, its ``--out``."""
        return [*self.p.binds[cell.index], *([cell.options.out] if cell.options.out else [])]

    def row_cell(self, cell, bound: list, sure: set, later: list, defined: frozenset = frozenset()) -> str:
        """A cell of run_row. ``bound``: the variables run_row binds before it; ``sure``: those of
        them that it binds whatever ran (not only in an ``if``); ``defined``: the notebook's globals
        bound whatever ran before it (``_builtins_back``); ``later``: the row cells after it
        (``star_values``)."""
        if isinstance(cell, Markdown):
            return _markdown(cell)
        if isinstance(cell, Dropped):
            return f"# -- cell {cell.index}: {cell.first_line} -- dropped: {cell.reason}"
        if isinstance(cell, Code):
            source = _strip_examples(cell, self.p.strip.get(cell.index, set()))
            lines = _builtins_back(cell.source, source.split("\n"), self.names.job, self.p.shared, defined)
            later_binds = set()
            for c in later:
                if isinstance(c, Code):
                    later_binds |= set(c.assigns) - set(self.p.shared)
                elif isinstance(c, LMCell):
                    later_binds |= set(self.lm_sets(c))
            for star in _star_imports(cell, sure):  # (line by line: the cell's lines stay, up to the import's)
                lines[star.first - 1:star.last] = ["# " + line for line in lines[star.first - 1:star.last]]
                # a row field counts from where the notebook's example of it was (the row's value replaces it there)
                fields = [n for n in self.p.inputs if self.field_at[n] < (cell.index, star.first)]
                known = [n for n in [*bound, *star.above] if n not in self.p.inputs and n not in self.p.shared]
                # a variable bound below and read (or deleted) there before it is surely bound: the import's value
                reads = self.read_before_bound(star.after, later)
                binds = later_binds | star.after_binds
                below = sorted((reads & binds) - set(known) - set(self.p.inputs) - set(self.p.shared))
                names = list(dict.fromkeys([*fields, *known, *below]))
                shared = self.p.shared
                if not names and not shared and not self.p.star_globals and not self.p.early_builtins:
                    lines[star.last - 1] += "  <- made at module level, before run_row"
                    continue
                # run_row's variables take the module's values, as the notebook's import set them
                job, values = self.names.job, []
                if names:
                    values.append(f"{', '.join(names)}{',' * (len(names) == 1)} = {job}.star_values({star.module!r}, "
                                  f"locals(), {', '.join(map(repr, names))})  # {star.statement}: here its values of "
                                  "run_row's variables")
                if shared:  # (the script's globals in run_row: the module's value, else the global's)
                    values.append(f"{', '.join(shared)}{',' * (len(shared) == 1)} = {job}.star_values("
                                  f"{star.module!r}, globals(), {', '.join(map(repr, shared))})  # {star.statement}: "
                                  "here its values of the globals that functions set or read")
                if self.p.star_globals or self.p.early_builtins:  # (read by functions of the cells run once)
                    values.append(f"{job}.star_globals({star.module!r}, globals()"
                                  f"{''.join(', ' + repr(g) for g in self.p.star_globals)})  # {star.statement}: here for the "
                                  "functions of the cells run once")
                for name in [*names, *shared]:
                    if name not in self.p.inputs and name not in star.above_sure:
                        values.append(f"if {name} is {job}.UNBOUND:  # (not bound here, and {star.module} has no "
                                      f"{name})\n{_INDENT}del {name}")
                lines[star.last - 1] = "\n".join(values)
            return f"# -- cell {cell.index}{_magic_note(cell)}\n" + "\n".join(lines)
        return self.row_lm(cell)

    def read_before_bound(self, statements: list, later: list) -> set:
        """The names that ``statements`` (a row cell's, below its star import), then the ``later``
        row cells, read, change (``+=``) or delete where they may not be bound yet: not after a
        top-level binding whatever ran (``_bind``; ``r = f(x)`` then ``{r}`` reads the cell's r)."""
        sure: set = set()
        out: set = set()
        for c in [None, *later]:
            if isinstance(c, LMCell):
                out |= set(c.reads) - sure
                sure |= set(self.lm_sets(c))
                continue
            for statement in statements if c is None else ast.parse(c.source).body if isinstance(c, Code) else []:
                out |= _touched(statement) - sure
                _bind(sure, statement)
        return out

    def row_lm(self, cell: LMCell) -> str:
        n, o = self.names, cell.options
        state = n.named_state(o.state) if o.state else n.state
        args = list(self.p.lm_params[cell.index])
        args += [f"{k}={v!r}" for k, v in o.run_kwargs().items()]
        earlier = [c.index for c in self.p.lm_cells if c.index < cell.index and c.options.state == o.state]
        # %lm reset forgets the state; so do %lm load and %lm connect (the backend is not followed)
        reset = earlier and any(isinstance(c, Code) and (None in c.resets or o.state in c.resets or c.backends)
                                and earlier[-1] < c.index < cell.index for c in self.p.row)
        continues = bool(o.state and earlier and not reset)  # the same --state continues, unless that forgot it
        if continues:
            args.append(f"state={n.job}.continued({state})")  # (on a copy: an earlier --out keeps its state)
        # run() gives a program declaring seed (or state) the value of seed= (state=): a --python
        # body reading a variable of that name, a parameter here, would get it twice
        passed = set(o.run_kwargs()) | ({"state"} if continues else set())
        taken = [] if cell.template is not None else sorted(  # (a template's parameter is renamed: seed_)
            passed & {"seed", "state"} & set(self.p.lm_params[cell.index]))
        if taken:
            from lmnb.export.cells import ExportError

            option = "--seed" if taken[0] == "seed" else "--state"
            raise ExportError(f"cell {cell.index} (%%lm --python): the body reads a variable named {taken[0]!r}, "
                              f"which the job's run() also takes for the cell's {option}; rename the variable "
                              f"(e.g. {taken[0]}_) in the notebook")
        lines = [f"# -- cell {cell.index}: %%lm {cell.line}".rstrip(),
                 f"{state} = {n.function(cell)}.run({', '.join(args)})", f"{state}.sync()"]
        for name in self.p.binds[cell.index]:
            lines.append(f'{name} = {state}["{name}"]')
        if o.out:
            lines.append(f"{o.out} = {state}")
        return "\n".join(lines)


def python_program_source(cell, name: str, params: tuple) -> str:
    """``@lmnb.function`` source of a ``%%lm --python`` cell taking ``params`` after ``s``.

    ``PythonCell.to_python`` writes ``def name(s)``: a body reading row-local variables needs them
    as parameters in a script, so the signature is widened here (requested from the template
    package as ``PythonCell.to_python(name, parameters=...)``).
    """
    source = cell.to_python(name)
    head = f"def {name}(s):"
    if head not in source:
        raise AssertionError(f"unexpected PythonCell.to_python output: {source[:80]!r}")
    return source.replace(head, f"def {name}({', '.join(['s', *params])}):", 1)


def _markdown(cell: Markdown) -> str:
    return "\n".join(("# " + line).rstrip() for line in cell.text.split("\n"))


def _magic_note(cell: Code) -> str:
    if cell.magic and cell.magic.split()[0] == "%%timeit":
        return (f": {cell.magic} dropped, its body run once in a function ({TIMEIT_BODY}), as IPython runs it: "
                "the names it binds are not set, but those it declares global")
    return f": {cell.magic} dropped, its body kept" if cell.magic else ""


def _mark_examples(cell: Code, fields: tuple) -> str:
    """The setup cell's source with a note after each example value of a row field (run_row's
    parameter of that name replaces it)."""
    lines = cell.source.split("\n")
    for name in fields:
        for _, last in cell.string_assignments.get(name, []):
            lines[last - 1] += f"  # the notebook's example; each input row gives its own {name}"
    return "\n".join(lines)


@dataclass
class _StarImport:
    """A ``from M import *`` of a cell that runs per row: its lines in the cell's source, the names
    the cell's statements above it bind, those bound there whatever ran (with the names bound so
    before the cell: ``_surely_bound``), its statements below it, and the names they bind."""

    first: int
    last: int
    module: str
    above: list
    above_sure: set
    after: list
    after_binds: set

    @property
    def statement(self) -> str:
        return f"from {self.module} import *"


def _star_imports(cell: Code, sure: frozenset = frozenset()) -> list:
    """The ``from M import *`` statements of a cell that runs per row (``_StarImport``); the script
    makes them at module level and sets run_row's variables from them where they stand. ``sure``:
    the names bound whatever ran before the cell.

    Raises:
        ExportError: one the script cannot move: in a block (``if``, ``try``) or on a line with other code.
    """
    if "*" not in cell.source:
        return []
    tree = ast.parse(cell.source)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.names[0].name == "*"):
            continue
        statement = f"from {'.' * node.level}{node.module or ''} import *"
        shared = [s for s in tree.body if s is not node and s.lineno <= node.end_lineno and s.end_lineno >= node.lineno]
        if node not in tree.body or shared:
            where = "in a block" if node not in tree.body else "on a line with other code"
            raise ExportError(f"cell {cell.index}, line {node.lineno}: `{statement}` {where} of a cell that runs per "
                              "input row, where the script cannot make it (a function cannot star-import); move it "
                              "to a cell of its own before the first %%lm cell")
        k = tree.body.index(node)
        above, below = tree.body[:k], tree.body[k + 1:]
        deleted = set().union(*map(deleted_by, below))  # (read and bound, for run_row: the import's value, then unbound)
        out.append(_StarImport(
            node.lineno, node.end_lineno, statement.removeprefix("from ").removesuffix(" import *"),
            [name for s in above for name in bound_by(s)], _surely_bound(above, sure),
            below, {name for s in below for name in bound_by(s)} | deleted))
    return out


def _touched(statement: ast.stmt) -> set:
    """The names ``statement`` reads, changes in place by ``+=`` or deletes, in its functions too."""
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)} | {
        n.target.id for n in ast.walk(statement) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}


def _builtins_back(original: str, lines: list, job: str, shared: tuple, bound: frozenset = frozenset()) -> list:
    """``lines`` (the cell's, from ``original``) with each ``del`` of a builtin's name (``del pow``
    after ``from math import *``) followed by giving run_row's variable the builtin again: the
    notebook's ``del`` removes its global, so that a later read finds the builtin, where run_row's
    variable was left unbound (UnboundLocalError). Before it, ``Job.deletable`` raises the
    notebook's NameError where its global is unbound (run_row's variable holds the builtin: a second
    ``del pow``). Not in functions and classes (their own variables), nor for the names run_row
    declares ``global`` (``shared``: the ``del`` removes the global, as in the notebook). ``bound``:
    the names the notebook has bound whatever ran before the cell (``_surely_bound``); a name bound
    so before the ``del``, or by the cell's statements above it (in its block, and in the blocks
    around it: ``for ...: pow = builtins.pow; del pow``), gets no ``Job.deletable`` check, which
    cannot tell ``pow = builtins.pow`` from no pow at all."""
    edits = []  # (line, column, text put there)
    for node, bound_here in _deletes(ast.parse(original).body, bound):
        names = [t.id for t in node.targets if isinstance(t, ast.Name) and t.id in _BUILTINS and t.id not in shared]
        if names:
            shown = ", ".join(map(repr, names))
            checked = [n for n in names if n not in bound_here]
            if checked:  # (on the statement's line, before and after it: within an `if x: del pow` too)
                edits.append((node.lineno, node.col_offset,
                              f"{job}.deletable(locals(), {', '.join(map(repr, checked))}); "))
            edits.append((node.end_lineno, node.end_col_offset,
                          f"; {', '.join(names)}{',' * (len(names) == 1)} = {job}.star_start((), {shown})"))
    original_lines = original.split("\n")
    as_typed = {i for i, line in enumerate(lines) if line == original_lines[i]}  # (not a row field's example)
    for row, col, text in sorted(edits, reverse=True):  # (from the end: the columns before stay right)
        if row - 1 in as_typed:
            line = lines[row - 1].encode()  # (ast's columns count bytes)
            lines[row - 1] = line[:col].decode() + text + line[col:].decode()
    return lines


def _deletes(statements: list, bound):
    """(each ``del`` statement among ``statements`` and in their blocks, but not in functions and
    classes; the names bound whatever ran before it: ``bound``, then those the statements above it
    in its block and the blocks around it bind, ``_bind``), in order."""
    bound = set(bound)
    for statement in statements:
        if isinstance(statement, ast.Delete):
            yield statement, frozenset(bound)
        elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and any(isinstance(n, ast.Delete) for n in ast.walk(statement)):
            blocks = [v for _, v in ast.iter_fields(statement) if isinstance(v, list) and v and isinstance(v[0], ast.stmt)]
            blocks += [h.body for h in getattr(statement, "handlers", [])] + [c.body for c in getattr(statement, "cases", [])]
            for block in blocks:  # (`for ...: pow = builtins.pow; del pow`: bound above the del in its block)
                yield from _deletes(block, bound)
        _bind(bound, statement)


def _lookup(name: str, defined: set, job: str) -> str:
    """The subscript or call that reads module global ``name`` in run_row: ``["name"]``, or
    ``.get("name", job.UNBOUND)`` where the cells run once may leave it unbound (not in ``defined``,
    ``_surely_bound``: bound in an ``if``, ``for``, ``try`` or ``with``)."""
    return f'["{name}"]' if name in defined else f'.get("{name}", {job}.UNBOUND)'


def _row_variable(name: str, value: str, why: str, job: str, defined: set) -> str:
    """run_row's line that binds its variable ``name`` to ``value`` (the module global's), commented
    ``why``; where the cells run once may leave the global unbound, then unbinding the variable, so
    that reading it is the notebook's NameError (not a KeyError of every row)."""
    line = f"{name} = {value}  # {why}"
    if name in defined:
        return line
    return f"{line}\nif {name} is {job}.UNBOUND:  # (the cells run once may leave it unbound)\n{_INDENT}del {name}"


def _surely_bound(statements: list, sure: frozenset = frozenset()) -> set:
    """``sure`` (names bound whatever ran before ``statements``) with the names that top-level
    ``statements`` bind whenever they run through: assignments, imports, ``def`` and ``class`` (not
    what an ``if``, ``for``, ``try`` or ``with`` binds); less those a ``del`` may unbind after that
    (``y = 1; del y``: a star import below gives y ``UNBOUND``, which must be deleted again)."""
    out = set(sure)
    for s in statements:
        _bind(out, s)
    return out


def _bind(bound: set, statement: ast.stmt) -> None:
    """Update ``bound`` (names bound whatever ran) in place past one top-level ``statement``
    (``_surely_bound``)."""
    kinds = (ast.Assign, ast.AugAssign, ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    if isinstance(statement, kinds) or (isinstance(statement, ast.AnnAssign) and statement.value is not None):
        bound |= set(bound_by(statement))
    bound -= deleted_by(statement)


def _strip_examples(cell: Code, names: set) -> str:
    """The cell's source with its literal assignments of row fields commented out."""
    lines = cell.source.split("\n")
    for name in names:
        for first, last in cell.string_assignments[name]:
            lines[first - 1] = f"# {lines[first - 1]}  <- notebook example; each row gives {name}"
            for i in range(first, last):
                lines[i] = "# " + lines[i]
    return "\n".join(lines)


def _ranges(indexes: list) -> str:
    out, start, prev = [], None, None
    for i in indexes:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def _written_back(value) -> bool:
    """Whether ``repr(value)`` is a literal of ``value`` (not ``inf``, nor an integer too long for
    Python to write), so that the script can hold it."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
