"""Which cells of a notebook run once and which run per input row, and what a row must provide.

The model (written into every exported script's docstring):
- Every input row is one pass of the notebook from its first ``%%lm`` cell on (``run_row``);
  Python cells before it run once, at import (setup), in order.
- The row's fields are the notebook's example inputs: variables that the per-row part reads and
  that setup first binds to a string literal (``question = "What is 2+2?"``), or that a ``%%lm``
  cell reads and nothing binds (unless a cell star-imports a module other than lmnb, which may
  bind it: ``from math import *``). ``lmnb export --inputs a,b`` names them instead.
- A setup cell that computes something the per-row part needs from a row field (``prompt =
  f"Q: {question}"``) runs per row too, without its example assignments of row fields.
- The papermill ``parameters`` cell runs once wherever it is; its variables become options.

Beside the plan, the export notes set-up state that the rows carry over from row to row; the notes'
heuristics are modules of their own that ``plan`` calls (``notes_objects``, ``notes_modules``,
``class_state``, ``star_builtins``).
"""

from __future__ import annotations

import builtins
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from lmnb.batch.options import TYPED_DEFAULTS, parameter_options
from lmnb.export.cells import Backend, Cell, Code, Dropped, ExportError, LMCell, _mutated, bound_by, deleted_by
from lmnb.export.class_state import _class_attributes, _held_object_notes, _setup_classes
from lmnb.export.notes_closures import _closure_notes
from lmnb.export.notes_defaults import _default_notes
from lmnb.export.notes_modules import _local_module_state, _module_classes, _seeded_module_notes
from lmnb.export.notes_objects import _carried_over, _made_objects
from lmnb.export.notes_reloads import _reload_notes
from lmnb.export.notes_wording import _RACE, _cells_of, _functions_of, _grouped, _number_words, _verb
from lmnb.export.parameters import read_parameters
from lmnb.export.primitive_holes import refuse_primitive_holes
from lmnb.export.star_builtins import _builtins_set_by
from lmnb.export.syntax import (_bound_before_read, _cell_binds, _own_nodes, _run_reads, _statements, _tests_unset,
                                binds_name)
from lmnb.template.template import python_name

_BUILTINS = frozenset(dir(builtins))
# Jupyter's own built-ins that the script defines when the code uses them (writer._imports): no row fields
JUPYTER_BUILTINS = frozenset({"display"})


@dataclass
class Plan:
    """The exported job's shape.

    setup / row: cells at module level and in ``run_row``, in notebook order (every ``%%lm`` cell
    is in ``row``; its ``@lmnb.function`` is defined at module level). inputs: row fields, in order
    of first use. parameters: variables of the parameters cell. parameter_defaults: each one's
    default as the cell's literal gives it (``read_parameters``: ``NO_DEFAULT`` where the cell
    computes it), for the job's options before any cell runs. lm_params: ``%%lm`` cell index →
    row-local variables its program takes as arguments (other names it reads are module globals).
    binds: ``%%lm`` cell index → captured variables bound as locals after it runs. texts: the row
    fields whose notebook example is a string (the job refuses a row that gives another value,
    which the notebook's code was never run on). types: the row fields that are parameters (named in
    ``--inputs``) with a default other than text → the default's type, which the job reads a row's
    value as (``Job``'s types). strip: moved
    setup cell index → row fields whose literal assignments are commented out there. copied:
    module-level names the row part rebinds or changes in place (each row starts from a copy of
    the module value: ``Job.row_copy``), but those that it only changes in place and that a
    function of a setup cell that the row cells call changes in place too (``stats["calls"] +=
    1``): the script's one object, as in the notebook, where the cells and the function change it
    together; it carries over between rows. star_locals: the other module-level names that the row part
    reads at or after a per-row star import (``from math import *`` sets e): run_row's own variables,
    from the module value, so that the import changes them for the row from where it stands, as in
    the notebook, and not the module's value for every row from the start. star_names: where a
    row cell star-imports, the names the row cells read that no cell binds (sqrt; a builtin such
    as pow, which ``from math import *`` replaces) above the row's last star import, or delete, and
    those of ``star_globals`` wherever the row reads them: run_row's own variables too, holding the value the notebook has before the row's first import
    (``Job.star_start``), each import's from its line on (two imports in a row give each its own
    sqrt). One read only below the last import (``print``, ``pi``) is the script's global, which
    ``Job.star_import`` sets at load to the value the imports leave, as the notebook has it there,
    where the row star-imports only standard library modules: another's (a module of the user's,
    which a reload or the row may change before its import) is run_row's own too, but a builtin.
    rebound_builtins: the builtins (len) that a row cell binds and a row cell reads: run_row's
    variables, which start as the builtin
    (``Job.star_start``), as the notebook's name is until the cell binds it (a read above that
    cell raised UnboundLocalError). shared: the names that a function of a row cell declares
    ``global`` and binds, and those that a function of a setup cell that the row cells call
    declares so and a row cell binds, changes in place, or reads below its star import (but row
    fields): the script's globals in run_row too, as in the
    notebook, where the function and the cells' code set one variable (run_row's own hid what the
    function set); rows share them. restored: the module-level names (but row fields) of
    ``shared``, and those that the functions of setup cells that the row cells use (call) declare
    ``global`` and bind: each row starts from the value the setup cells left (``Job.keep``), as
    each pass of the notebook does, where the next row read on from what the last one set; but
    those the setup cells set to None or False, made on first use (``_made_on_first_use``); and
    "C.n" for an attribute of a setup class that the row cells or the functions they call change
    (``_class_attributes``), and the names of ``star_globals``.
    star_globals: where a row cell star-imports, the names that no cell binds (pi; but builtins:
    ``early_builtins``) that a function of a setup cell the row uses above that import reads: the
    script's globals, which each row starts from as the setup cells left them (``restored``: unbound, the builtin's),
    and which the row's import sets from its line on (``Job.star_globals``), as the notebook's.
    jupyter: Jupyter's built-ins (``JUPYTER_BUILTINS``) that the code reads before a cell binds a
    name of its own to them: the script imports them. function_reads: where a row cell star-imports, "f (cell 1)" →
    the module-level names that function (or class) of a setup cell reads: it reads the script's
    globals, which a row's import leaves as they are (the job warns when it sets one:
    ``Job.star_import``). early_reads: where a row cell star-imports, "f (cell 1)" → (where the row
    uses it above its last star import: "cell 3, line 1", or "through g, cell 3, line 1" for a setup
    function g that reads f; the names but the module-level ones that f reads): the script makes the
    import before the rows, so f reads the module's names from the start of every row (the job warns
    when the import sets one: ``Job.star_import``), where the notebook's read them from the import on;
    but the names of ``star_globals``, and the builtins the import sets, which ``Job.star_import``
    finds at run time and treats as ``star_globals`` (``early_builtins``).
    """

    cells: list
    setup: list
    row: list
    inputs: tuple
    parameters: tuple = ()
    parameters_cell: Optional[int] = None
    parameter_defaults: dict = field(default_factory=dict)
    lm_params: dict = field(default_factory=dict)
    binds: dict = field(default_factory=dict)
    strip: dict = field(default_factory=dict)
    copied: tuple = ()
    star_locals: tuple = ()
    star_names: tuple = ()
    rebound_builtins: tuple = ()
    shared: tuple = ()
    star_globals: tuple = ()
    restored: tuple = ()
    texts: tuple = ()
    types: dict = field(default_factory=dict)
    jupyter: tuple = ()
    function_reads: dict = field(default_factory=dict)
    early_reads: dict = field(default_factory=dict)
    backend: Backend = field(default_factory=Backend)
    notes: list = field(default_factory=list)

    @property
    def early_builtins(self) -> tuple:
        """The builtins of ``early_reads`` (len, pow): ``Job.star_import`` keeps those the row's star
        imports set, at run time, as ``star_globals`` are kept (the export cannot tell which they are
        without importing the module)."""
        return tuple(dict.fromkeys(n for _, names in self.early_reads.values() for n in names if n in _BUILTINS))

    @property
    def lm_cells(self) -> list:
        """The ``%%lm`` cells run for every row."""
        return [c for c in self.row if isinstance(c, LMCell)]

    @property
    def captures(self) -> tuple:
        """The variables those cells capture, in order of first capture, without repeats."""
        out: list = []
        for c in self.lm_cells:
            out += [n for n in c.captures if n not in out]
        return tuple(out)


def plan(cells: Sequence[Cell], inputs: Optional[Sequence[str]] = None, folder: Optional[Path] = None) -> Plan:
    """Split ``cells`` (from ``cells.read_cells``) into setup and per-row parts (module docstring).

    ``inputs``: the row fields, overriding the example-based choice (a parameter named here is a
    row field instead of an option). A notebook without ``%%lm`` cells has no per-row part: its
    script runs the cells once (``Plan.row`` is empty). ``folder``: the notebook's, where a module
    it imports or star-imports may be a file of the user's (``_local_module_state``); None: not known.

    Raises:
        ExportError: an ``inputs`` name that is not a variable or that the row part never reads; an
            example assignment that shares its line with other code.
    """
    params_cell = next((c for c in cells if isinstance(c, Code) and c.is_parameters), None)
    defaults = read_parameters(params_cell.source) if params_cell else {}
    parameters = tuple(defaults)
    # (a name given twice is one field: it became a duplicate parameter of run_row, a SyntaxError;
    # in Python's NFKC form, as the cells' code reads it: --inputs ｑ is the cells' q)
    given = None if inputs is None else tuple(dict.fromkeys(unicodedata.normalize("NFKC", n) for n in inputs))
    if given is not None:
        bad = [n for n in given if not n.isidentifier()]
        if bad:
            raise ExportError(f"--inputs {', '.join(bad)}: an input must be a variable name")
        parameters = tuple(n for n in parameters if n not in given)
    lm = [c for c in cells if isinstance(c, LMCell)]
    try:  # (a job with no per-row part has no --limit of its own)
        parameter_options(parameters, per_row=bool(lm))
    except ValueError as e:
        raise ExportError(f"cell {params_cell.index} (parameters): {e}") from None
    if not lm:
        if given:
            raise ExportError(f"--inputs {', '.join(given)}: the notebook has no %%lm cell to run per row")
        p = Plan(list(cells), list(cells), [], (), parameters, params_cell.index if params_cell else None)
        p.parameter_defaults = {n: defaults[n] for n in parameters}
        p.jupyter = _jupyter_builtins(cells)
        p.backend, p.notes = _backend(cells, [])
        p.notes.append("the notebook has no %%lm cell: the script runs its cells once, with no input rows")
        p.notes += _cell_notes(cells)  # (what the script leaves out of it, as for a notebook with rows)
        return p
    first = lm[0].index
    before = [c for c in cells if c.index < first and c is not params_cell]
    after = [c for c in cells if c.index >= first and c is not params_cell]
    first_binding: dict = {}  # name -> whether the cells before the first %%lm cell first bind it to a string
    for c in cells:
        if isinstance(c, Code) and (c.index < first or c is params_cell):
            for name, literal in c.bindings:
                first_binding.setdefault(name, literal)
    if given is not None:
        examples = set(given)
    else:
        examples = {n for n, literal in first_binding.items() if literal and n not in parameters}

    moved = _moved_setup_cells(before, after, examples)
    setup = [c for c in cells if (c in before and c not in moved) or c is params_cell]
    row = [c for c in cells if c in moved or c in after]
    _drop_definition_calls(setup, row)
    p = Plan(list(cells), setup, row, (), parameters, params_cell.index if params_cell else None)
    p.parameter_defaults = {n: defaults[n] for n in parameters}
    p.inputs, from_star = _fields(p, examples, given, parameters)
    _refuse_called_fields(p, given is not None)
    refuse_primitive_holes(cells, p.lm_cells)
    p.texts = tuple(n for n in p.inputs if first_binding.get(n))
    # (the script names the type: `types={'x': ellipsis}` for `x = ...` was a NameError)
    p.types = {n: type(defaults[n]) for n in p.inputs if type(defaults.get(n)) in TYPED_DEFAULTS}
    p.strip = {c.index: {n for n in p.inputs if n in c.string_assignments} for c in moved}
    for c in moved:
        _check_strippable(c, p.strip[c.index])
    p.jupyter = _jupyter_builtins(cells)
    functions = _setup_functions(setup)
    # (a name a set-up function the row calls sets by `global` is read as the script's global: a copy hid
    # what a call set; that of a function the row does not call stays the row's own, which rows do not share)
    links = _links(setup, functions)
    called = _called(functions, row, links)
    declared = tuple(dict.fromkeys(n for f in called for n in f[3]))
    module, lazy = _module_names(setup, parameters), _made_on_first_use(setup)
    star = any(isinstance(c, Code) and c.star_imports for c in row)
    p.shared = _shared(row, declared, p.inputs)
    # (a set-up container that such a function changes in place is the script's one object in the row's cells
    # too, as in the notebook: a row's copy hid what a call changed, and the calls missed what the cells changed)
    changed = _changed_by_called(called, row)
    p.copied = _copied(setup, row, p.inputs + p.shared + changed, parameters + p.jupyter)
    # (and any set-up function's `global`: one the set-up never called leaves no module value to start from)
    unbound = tuple(n for c in setup if isinstance(c, Code) for n in c.declared_globals)
    p.star_locals = _star_locals(setup, row, p.inputs + p.copied + p.shared + unbound, parameters + p.jupyter)
    p.rebound_builtins = tuple(n for n in _rebound_builtins(setup, row, p.inputs + parameters + p.jupyter)
                               if n not in p.shared)
    if star:  # (also when its cells read no other name it sets)
        p.function_reads = _function_reads(functions, module)
        early = _early_reads(functions, row, module, links)
        # (a name only the import may set: the script's global, which each row starts without and the import sets)
        p.star_globals = _set_by_star_import_only(early, cells, p.inputs + parameters + p.jupyter)
        p.early_reads = {f: (where, kept) for f, (where, names) in early.items()
                         if (kept := tuple(n for n in names if n not in p.star_globals))}
    # (a name a set-up function reads above the import, pi, is a global each row sets back: the row's own
    # reads of it stay run_row's variable, which rows running at once do not share; a builtin that the import
    # sets is found only at run time, where the job's warning of rows run at once names it)
    p.star_names = _star_names(setup, row, p.inputs + parameters + p.jupyter, set(p.star_globals))
    p.restored = tuple(n for n in dict.fromkeys([*p.shared, *declared, *p.star_globals])
                       if (n in module or n in p.star_globals) and n not in p.inputs and n not in lazy)
    # (a set-up class's attribute that the rows change starts each row as the set-up left it, as in each notebook pass)
    classes = _setup_classes(setup)
    attributes, computed = _class_attributes(called, row, classes)
    p.restored += attributes
    changed_classes = {a.split(".")[0] for a in attributes}
    row_binds = set().union(*map(_cell_binds, row))  # (a class a row cell binds is run_row's variable: still copied)
    p.copied = tuple(n for n in p.copied if n not in changed_classes or n in row_binds)
    for c in p.lm_cells:  # (a program reads a module global, so it takes a row variable as an argument)
        p.lm_params[c.index] = tuple(n for n in c.reads if n in p.lm_params[c.index] or n in p.star_locals
                                     or n in p.star_names or n in p.rebound_builtins)
    p.backend, p.notes = _backend(setup, row)
    for n, kind in p.types.items():
        p.notes.append(f"{n}: a parameter of cell {params_cell.index}, read from each input row (--inputs), so the job "
                       f"has no {parameter_options([n])[n]} option; a row's {n} is read as its default's type, "
                       f"{kind.__name__}")
    if from_star:
        stars = ", ".join(f"`from {m} import *` (cell {c.index})" for c in cells if isinstance(c, Code)
                          for m in c.star_imports)
        p.notes.append(f"{', '.join(from_star)}: read by the %%lm cells and set by no cell, so taken to come from "
                       f"{stars}, not to be row fields; name the row fields with --inputs if one is")
    p.notes += _misspelt_fields(p, examples, parameters) if given is None else []
    later_notes, advised = _read_before_set(cells, p)
    p.notes += later_notes
    if not p.inputs:
        p.notes.append("no row fields: every input row runs the same programs; name the fields with "
                       "--inputs (e.g. a parameter or a variable the %%lm cells read)")
    p.notes += _setup_functions_reading_row_variables(functions, row, p.shared, advised)
    for c in row:  # (run_row's nested function writes the script's global, which the rows' threads share)
        if isinstance(c, (Code, LMCell)) and c.declared_globals:
            shown = ", ".join(c.declared_globals)
            p.notes.append(f"cell {c.index}: a function of this cell, which runs per row, sets {shown} by `global`: "
                           f"the rows share the script's globals, {_RACE}")
    changed_too = set().union(*(set(c.mutates) for c in row if isinstance(c, (Code, LMCell))))
    # (one note per object, naming every set-up cell whose called functions change it: one per cell said it twice)
    changers = _cells_of(called, 4, lambda n: n in changed and n in module and n not in p.inputs
                         and n not in changed_classes)
    surely = {n for f in called for n in f[5]}  # (alone, a call that may change it is no change to note: PAT.sub(...))
    for both, why in ((True, "{is_} changed in place per row too (a cell that runs per row changes {it}, and calls "
                             "the function): the job keeps {one}, the script's, as the notebook does, not a "
                             "copy per row"),
                      (False, "{is_} changed by the rows' calls: the job keeps {one}, the script's, where each "
                              "pass of the notebook starts from the set-up's (a memo cache gives the same results "
                              "either way)")):
        for where, names in _grouped({n: cs for n, cs in changers.items()
                                      if (n in changed_too) == both and (both or n in surely)}):
            w = _number_words(names)
            p.notes.append(f"{where}: {', '.join(names)}, which {_functions_of(where)} (run once) "
                           f"{_verb('change', where)} in place, " + why.format(**w)
                           + f": what one row changes, the next row sees, and the rows share {w['it']}, {_RACE}")
    setters = _cells_of(called, 3, lambda n: n in p.restored + p.shared)
    for where, names in _grouped(setters):
        w = _number_words(names)
        p.notes.append(f"{where}: {', '.join(names)}, which {_functions_of(where)} (run once) {_verb('set', where)} by "
                       f"`global`, {w['is_']} set per row too (a cell that runs per row sets {w['it']}, or calls a "
                       f"function that does): the job keeps {w['one']}, the script's global{w['s']}, as the notebook does, "
                       f"which the rows share, {_RACE}")
    for where, names in _grouped(_cells_of(called, 2, lambda n: n in p.star_globals)):
        shown = ", ".join(names)
        p.notes.append(f"{where}: {shown}, which {_functions_of(where)} (run once) {_verb('read', where)} and the rows "
                       f"use above a per-row star import, may be set by that import: the job sets the script's "
                       f"global{_number_words(names)['s']} {shown} there, as the notebook does, and each row starts "
                       f"from what the cells run once left, {_RACE}")
    early_functions = [f for f in called if f"{f[1]} (cell {f[0]})" in p.early_reads]
    star_builtins = _builtins_set_by([m for c in row if isinstance(c, Code) for m in c.star_imports], p.early_builtins)
    for where, names in _grouped(_cells_of(early_functions, 2, lambda n: n in star_builtins)):
        shown, w = ", ".join(names), _number_words(names)
        stars = ", ".join(f"`from {m} import *`" for m in dict.fromkeys(m for n in names for m in star_builtins[n]))
        p.notes.append(f"{where}: {shown}, {'a builtin' if len(names) == 1 else 'builtins'} that "
                       f"{_functions_of(where)} (run once) {_verb('read', where)} and the rows use above a per-row "
                       f"star import, {w['is_']} set by that import ({stars}): the job sets the script's global{w['s']} "
                       f"{shown} there, as the notebook does, and each row starts from the builtin{w['s']}, {_RACE}")
    for index in dict.fromkeys(classes[a.split(".")[0]] for a in attributes):
        here = [a for a in attributes if classes[a.split(".")[0]] == index]
        what = "a class attribute" if len(here) == 1 else "class attributes"
        p.notes.append(f"cell {index}: {', '.join(here)}, {what} of this cell that the rows change: each row starts "
                       "from the value the cells run once left (the job sets it back), as each pass of the notebook "
                       f"does; the rows share the class, {_RACE}")
    for name in computed:
        p.notes.append(f"cell {classes[name]}: {name}, a class of this cell, is changed by the rows through setattr or "
                       "delattr of a computed name, which the export cannot follow: what one row sets, the next row "
                       "sees, where each pass of the notebook starts from the class the cells run once left; name the "
                       f"attribute with a string (setattr({name}, 'n', ...)), or run the job with --num-threads 1 and "
                       "reset it in the row")
    parsed: dict = {}  # (each module file of the user's, read and parsed once an export)
    imported = _module_classes(setup, folder, parsed)  # (Cache of `from helpers import Cache`: c = Cache() too)
    objects = _made_objects(setup, {**imported, **classes})
    # (the notes follow what the rows run: not a set-up function whose name a row cell binds to its own before it
    # calls it, which `called` keeps for what the script shares; c was noted as changed by use() the rows never ran)
    rows_call = _called(functions, row, links, _bound_before_read(row))
    p.notes += _carried_over(setup, row, rows_call, objects, p.copied, lazy, imported)
    p.notes += _local_module_state(cells, row, rows_call, folder, objects[2], parsed)
    p.notes += _reload_notes(cells, row, folder, parsed)
    p.notes += _seeded_module_notes(setup, row, rows_call, objects[2])
    p.notes += _default_notes(row, rows_call, objects[2], setup)
    p.notes += _closure_notes(setup, row, rows_call)
    p.notes += _held_object_notes(setup, row, rows_call, classes)
    p.notes += _cell_notes(cells)
    return p


def _cell_notes(cells: list) -> list[str]:
    """The notes that reading ``cells`` left on them (IPython syntax and ``%lm`` commands dropped,
    ``%%capture``'s variable not set, options not carried) and one per dropped cell (``%%bash``),
    in cell order: what the script leaves out, whether or not it has a per-row part."""
    notes = []
    for c in cells:
        notes += getattr(c, "notes", [])
        if isinstance(c, Dropped):
            notes.append(f"cell {c.index}: dropped {c.first_line} ({c.reason})")
    return notes


def _drop_definition_calls(setup: list, row: list) -> None:
    """Take out of the row cells' ``mutates`` the set-up classes, functions and modules (the names the
    set-up binds last by ``class``, ``def`` or ``import m``) that a row cell only calls methods of
    (``Person.model_validate_json(x)``, ``json.loads(x)``): such a call is no change in place of a
    container, which each row would need its own copy of (``Job.row_copy`` copies none of them). A
    class attribute the rows change is ``_class_attributes``'s."""
    import ast

    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Import)
    last: dict = {}
    for c in setup:
        if isinstance(c, Code):
            for stmt in ast.parse(c.source).body:
                for name in bound_by(stmt):
                    last[name] = isinstance(stmt, kinds)
            for name in c.declared_globals:  # (a function's `global` may bind it to anything)
                last[name] = False
    definitions = {name for name, defined in last.items() if defined}
    for c in row:
        if not isinstance(c, (Code, LMCell)) or not set(c.mutates) & definitions:
            continue
        tree = ast.parse(c.source) if isinstance(c, Code) else c.python.tree  # (a template cell changes nothing)
        stored = set(_mutated(tree, calls=False))  # (an attribute or item set on it is a change: kept)
        c.mutates = tuple(n for n in c.mutates if n not in definitions or n in stored)


def _shared(row: list, declared: tuple, inputs: tuple) -> tuple:
    """``Plan.shared``: the names that a function of a row cell declares ``global`` and binds, and
    those of ``declared`` (what the setup functions that the row cells call declare so) that a row
    cell binds or changes in place too, or reads at or below a row cell's star import (which sets
    the script's global there, as the notebook's import does), but row fields (``inputs``)."""
    bound = set()  # (a name a row cell changes in place is the row's copy otherwise: the function's value is hidden)
    star = next((c.index for c in row if isinstance(c, Code) and c.star_imports), None)
    for c in row:
        if isinstance(c, (Code, LMCell)):
            bound |= set(_cell_binds(c)) | set(c.mutates)
            bound |= set(c.reads) if star is not None and c.index >= star else set()
    names = [n for c in row if isinstance(c, (Code, LMCell)) for n in c.declared_globals] \
        + [n for n in declared if n in bound]
    return tuple(n for n in dict.fromkeys(names) if n not in inputs)


def _made_on_first_use(setup: list) -> set:
    """The names that the setup cells last bind at top level to None or False and that their
    functions set by ``global`` only under ``if x is None:`` or ``if not x:`` of such a name x:
    values made on first use and kept (``global model; if model is None: model = load()``, or a
    ``loaded`` flag), and the globals those functions set only under such a test (``vocab``, made
    with ``model``). Not ``Plan.restored``: starting each row from None made every row load it
    again, where the rows can share the one the first call makes, which no call changes. (A
    running ``best`` that a function sets under another test, ``if best is None or x > best:``, is
    restored.)"""
    import ast

    trees = [ast.parse(c.source) for c in setup if isinstance(c, Code)]
    last: dict = {}  # name → whether its last top-level binding is `= None` (or False)
    for tree in trees:
        for stmt in tree.body:
            unset = (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                     and (stmt.value.value is None or stmt.value.value is False))
            last.update(dict.fromkeys(bound_by(stmt), unset))
    out = {name for name, unset in last.items() if unset}
    functions = [[*_own_nodes(n)] for tree in trees for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    changed = True
    while changed:  # (a name set under the test of one that is not made on first use is not either)
        changed = False
        for nodes in functions:
            for name in {n for node, _ in nodes if isinstance(node, ast.Global) for n in node.names} & out:
                if any(binds_name(node, name) and not any(_tests_unset(test, out) for test in tests)
                       for node, tests in nodes):
                    out.discard(name)
                    changed = True
    # (and the other globals made in the same guarded block, `global model, vocab; if model is None:
    # model, vocab = load()`: restored to the set-up's [] each row, they stayed empty once model was made)
    guarded: dict = {}  # global name → whether every binding of it is under a test of one of out
    for nodes in functions:
        for name in {n for node, _ in nodes if isinstance(node, ast.Global) for n in node.names} - out:
            for node, tests in nodes:
                if binds_name(node, name):
                    guarded[name] = guarded.get(name, True) and any(_tests_unset(test, out) for test in tests)
    return out | {name for name, always in guarded.items() if always}


def _moved_setup_cells(before: list, after: list, examples: set) -> list:
    """Setup cells that must run per row: they bind something the row part needs from a row
    field, or read what such a cell binds (a fixpoint over the cells' names)."""
    needed = set().union(*(set(c.reads) for c in after if isinstance(c, (Code, LMCell))))
    moved: list = []
    moved_binds: set = set()
    changed = True
    while changed:
        changed = False
        for c in before:
            if not isinstance(c, Code) or c in moved:
                continue
            # uses, not reads: the cell's own example assignment (question = "...") goes away
            # when it runs per row, so what it reads after it comes from the row
            feeds_row = set(c.assigns) & needed and set(c.uses) & examples
            if feeds_row or set(c.reads) & moved_binds:
                moved.append(c)
                needed |= set(c.uses)
                moved_binds |= set(c.assigns)
                changed = True
    return moved


def _misspelt_fields(p: Plan, examples: set, parameters: tuple) -> list[str]:
    """Notes on the row fields that no cell sets and that are spelt like a name a cell sets: a
    typo (``{persn}`` beside ``person = "..."``), which fails the notebook's cell with a NameError,
    made the job ask every row for a field ``persn``, without a word; or like a tag in another case
    (``{Join}``), which the notebook's cell offers the tag for."""
    from lmnb_engine.suggest import close_match

    defined = set(parameters)
    for c in p.cells:
        defined |= _value_names(c) if isinstance(c, Code) else set(c.sets) if isinstance(c, LMCell) else set()
    notes = []
    for n in p.inputs:
        meant = _tag_meant_by(p, n)
        if meant:  # ({Join}: the cell fails in the notebook, saying "did you mean {join}?")
            notes.append(f"{n}: {{{n}}} in %%lm cell {meant[0]} is read as a Python variable, not the tag, and no cell "
                         f"sets it, so a row field; did you mean {meant[1]}? (write it lowercase, or name the row "
                         "fields with --inputs)")
            continue
        # (a field that is a form of a set name, {text} beside texts = [...], names another thing on
        # purpose: no other name it is close to, `next`, is meant either)
        forms = n in examples or any(_word_forms(n, m) for m in defined)
        close = None if forms else close_match(n, sorted(defined))
        if close:
            notes.append(f"{n}: read by a %%lm cell and set by no cell, so a row field; did you mean {close!r}, "
                         f"which a cell sets? (fix the cell, or name the row fields with --inputs)")
    return notes


def _refuse_called_fields(p: Plan, given: bool) -> None:
    """Refuse a row field that a ``%%lm`` cell calls (``{gen("a", max_tokens=3)}``, ``{f(q)}`` where
    no cell defines f; ``s += gen("a")`` in a ``--python`` body): a row's value is JSON data, which
    cannot be called, so every row failed (with "missing field 'gen'"), where the notebook's cell
    fails with a NameError and its hint (``Template.unbound``, ``lmnb_name_fix``); the export said
    only "row fields: q, gen". ``given``: the fields are ``--inputs``'s.

    Raises:
        ExportError: at the first call of the first such field: cell, line (column), and the fix.
    """
    import ast

    from lmnb.template.calls import calls_of
    from lmnb.template.python_cell import lmnb_name_fix

    for c in p.lm_cells:
        for n in p.inputs:
            problem = (f"name {n!r} is not defined, and it cannot be a row field: the cell calls it, and a row's "
                       "values are JSON data")
            error = None
            if c.template is not None:
                error = c.template.unbound(n, problem=problem, at_call=True) if calls_of(c.template.body, n) else None
                where = error and f"line {error.line}, col {error.col}"
            else:  # (a --python body: a call of the global the body reads; the tree's lines are the cell's)
                found = [x.lineno for x in ast.walk(c.python.tree) if isinstance(x, ast.Call)
                         and isinstance(x.func, ast.Name) and x.func.id == n] if n in c.reads else []
                where = found and f"line {min(found)}"
            if not where:
                continue
            if given:  # (a name --inputs gives: the cell may define it too, so "define it" is no fix)
                raise ExportError(f"--inputs {n}: %%lm cell {c.index} calls {n} ({where}), and a row field is JSON "
                                  f"data, which cannot be called; leave {n} out of --inputs")
            if error is not None:
                raise ExportError(f"cell {c.index} (%%lm): {error}")
            raise ExportError(f"cell {c.index} (%%lm), {where}: {problem}; "
                              f"{lmnb_name_fix(n) or f'define {n} in a Python cell first'}")


def _tag_meant_by(p: Plan, name: str) -> Optional[tuple]:
    """(the %%lm cell's index, the tag: ``{join}``) for the first template of ``p`` whose hole that
    first reads ``name`` is that name alone and a tag's word in another case (``{Join}``,
    ``{SYSTEM}``: ``Template.bind``'s hint in the notebook); else None."""
    from lmnb.template.template import _tag_meant

    for c in p.lm_cells:
        offsets = getattr(c.template, "argument_offsets", {})
        tag = _tag_meant(name, c.template.source, offsets[name]) if name in offsets else None
        if tag:
            return c.index, tag
    return None


def _read_before_set(cells: list, p: Plan) -> tuple[list[str], set]:
    """(notes on the names a cell reads that only a later cell sets, (cell index, name, read name) of
    the set-up functions whose reads the notes give the advice on, which
    ``_setup_functions_reading_row_variables`` leaves out). A ``%%lm`` cell's reads (``{person}`` in cell
    1, ``person = "Arvel"`` in cell 2), and a Python cell's where it runs (``_run_reads``: not in its
    functions' bodies; the parameters cell runs first), also where a function or lambda of an earlier
    cell (or of the Python cell itself) that the cell uses reads it, or one that such a function uses,
    and so on (``{greet()}`` of ``greet = lambda: person``: ``_reached``): in Jupyter, running that
    cell first hides it, but the script runs the cells in order, and each row failed with a NameError,
    told to fix its input (a set-up cell's ended the job before any row ran, with no word on the later
    cell). Not where an earlier cell or the Python cell star-imports, which may set it. A set-up
    function's read of a name a per-row cell sets gets the advice that works for both: pass it as an
    argument (it reads the script's global, where moving the code above the cell left a row variable)."""
    import ast

    notes, advised = [], set()
    setup = {c.index for c in p.setup}
    row_bound = set().union(*map(_cell_binds, p.row)) - set(p.shared)
    checked = [c for c in cells if isinstance(c, LMCell) or isinstance(c, Code) and not c.is_parameters]
    for c in checked:
        earlier = [d for d in cells if d.index < c.index and isinstance(d, (Code, LMCell))]
        if any(isinstance(d, Code) and d.star_imports for d in [*earlier, c]):
            continue
        set_before = {n for d in earlier for n in (d.assigns if isinstance(d, Code) else d.sets)}
        # (the definitions in force when the cell runs, the last ones, a Python cell's own too; no class, of whose
        # methods the cell may call none: c.name)
        defining = earlier + [c] if isinstance(c, Code) else earlier
        classes = _setup_classes(defining)
        functions = [f for f in _setup_functions(defining) if f[1] not in classes]
        defined = {f[1]: f for f in functions}
        if isinstance(c, LMCell):
            reads, used, own = c.reads, c.reads, set()
        else:  # (a name the cell sets by `global`, or before it calls a function, is set when that reads it)
            ran = _run_reads(ast.parse(c.source))
            reads = [n for n in ran if n in c.reads and n not in c.declared_globals]
            used, own = [n for n in ran if n in c.reads or n in defined and defined[n][0] == c.index], set(c.assigns)
        read = {n: ("", None) for n in reads}
        for name, entry in _reached(functions, used, _links(defining, functions)).items():
            where = f"cell {defined[name][0]}" if name == entry else f"{name} of cell {defined[name][0]} reads it"
            read.update({n: (f" through {entry} ({where})", name) for n in defined[name][2]
                         if n not in read and n not in own})
        for n, (through, reader) in read.items():  # (a builtin is there until a cell binds the name: no NameError)
            if n in set_before or n in p.inputs or n in p.parameters or n in _BUILTINS or n in JUPYTER_BUILTINS:
                continue
            later = next((d for d in cells if d.index > c.index and (
                n in d.assigns if isinstance(d, Code) else isinstance(d, LMCell) and n in d.sets)), None)
            if later is None:
                continue
            what = "the %%lm cell" if isinstance(c, LMCell) else "the cell"
            fails = ("the job would stop in its set-up with NameError before any row ran" if c.index in setup
                     else "every row would fail with NameError")
            fix = f"move the code that sets {n} above cell {c.index}"
            index = defined[reader][0] if reader else None
            if index in setup and n in row_bound:  # (the set-up function reads the script's global, not the row's)
                fix = (f"{reader}, defined in a cell that runs once, reads the script's globals, not the row's "
                       f"variables: pass {n} to {reader} as an argument, and set {n} above cell {c.index}")
                advised.add((index, reader, n))
            notes.append(f"cell {c.index}: {what} reads {n}{through}, which only a later cell, {later.index}, sets: "
                         f"the script runs the cells in the notebook's order, so {fails} (in Jupyter, running cell "
                         f"{later.index} first hides it); {fix}")
    return notes, advised


def _word_forms(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are forms of one word, so two names on purpose and no typo: one is the
    other plus a plural ending (``q``/``qs``, ``answer``/``answers``, ``box``/``boxes``,
    ``entry``/``entries``) or a suffix after ``_`` or a digit (``name``/``name_2``, ``q``/``q1``).
    A one-letter slip (``persn``, ``perso``) or a transposition (``preson``) of ``person`` is none
    of these, nor is a number changed (``q1``/``q12``: the digit extends a number, not adds one)."""
    short, long = sorted((a, b), key=len)
    if short.endswith("y") and long == short[:-1] + "ies":
        return True
    rest = long[len(short):]
    new_number = rest[:1].isdigit() and not short[-1:].isdigit()
    return long.startswith(short) and (rest in ("s", "es") or rest[:1] == "_" or new_number)


def _value_names(cell: Code) -> set:
    """The names ``cell`` binds to values: not those only a ``def``, ``class`` or ``import`` binds
    (a row field ``{ref}`` is no misspelt module ``re``, ``{task}`` no function ``ask``)."""
    import ast

    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Import, ast.ImportFrom)
    names = {n for stmt in ast.parse(cell.source).body if not isinstance(stmt, kinds) for n in bound_by(stmt)}
    return names | set(cell.declared_globals)


def _fields(p: Plan, examples: set, given: Optional[tuple], parameters: tuple) -> tuple[tuple, tuple]:
    """(the row fields, the names left out of them as a star import's): a name a %%lm cell reads and
    no cell sets is a row field, unless a cell star-imports another module than lmnb, which may set
    it (``from math import *`` sets pi: it became a field every row had to give)."""
    defined = set(parameters)
    star = any(c.star_imports for c in p.cells if isinstance(c, Code))
    from_star: list = []
    for c in p.cells:
        if isinstance(c, Code):
            defined |= set(c.assigns)
        elif isinstance(c, LMCell):
            defined |= set(c.sets)
    fields: list = list(given or ())
    local: set = set()
    read_in_row: set = set()
    later_reads: dict = {}
    row_code = [c for c in p.row if isinstance(c, (Code, LMCell))]
    for i, c in enumerate(row_code):
        later_reads[c.index] = set().union(*(set(d.reads) for d in row_code[i + 1:]))
    moved = [c for c in row_code if isinstance(c, Code) and c.index < min(x.index for x in p.lm_cells)]
    for c in row_code:
        reads = c.uses if c in moved else c.reads  # a moved cell's example assignments are removed
        read_in_row |= set(reads)
        if given is None:
            for n in reads:
                if n in local or n in fields or n in parameters:
                    continue
                undefined = n not in defined and n not in _BUILTINS | JUPYTER_BUILTINS and n != "lmnb"
                if n in examples or (isinstance(c, LMCell) and undefined and not star):
                    fields.append(n)
                elif isinstance(c, LMCell) and undefined and n not in from_star:
                    from_star.append(n)
        if isinstance(c, LMCell):
            # A global named like the generated code's own names (s, items, forks, ...) is passed
            # as an argument too: the parser renames parameters, not globals.
            clashes = c.template is not None
            local |= set(c.mutates)  # the row's own copy, passed in (the module value is the set-up one)
            p.lm_params[c.index] = tuple(n for n in c.reads if n in local or n in fields
                                         or (clashes and python_name(n) != n))
            captured = c.captures if c.template is not None else tuple(
                n for n in c.captures if n in later_reads[c.index])
            p.binds[c.index] = captured
            local |= set(captured) | ({c.options.out} if c.options.out else set())
        else:
            local |= set(c.assigns) | set(c.mutates)  # (a changed object is the row's own copy)
    def sets(c, n: str) -> bool:  # (a moved cell's example assignment of a field is stripped)
        if isinstance(c, LMCell):
            return n in c.sets
        return n in c.assigns and not (c in moved and n in c.string_assignments)

    for n in given or ():
        producer = next((c for c in row_code if sets(c, n)), None)
        if producer is not None:
            what = "%%lm cell" if isinstance(producer, LMCell) else "cell"
            raise ExportError(f"--inputs {n}: the {what} {producer.index} sets {n} in each row, so a row's "
                              f"value would be overwritten; leave it out of --inputs")
    unused = [n for n in fields if n not in read_in_row]
    if given is not None and unused:
        raise ExportError(f"--inputs {', '.join(unused)}: the cells that run per row never read "
                          f"{'it' if len(unused) == 1 else 'them'}{_did_you_mean(unused, read_in_row)}")
    return tuple(fields), tuple(from_star)


def _did_you_mean(unused: list, read: set) -> str:
    """"; did you mean person?" naming the variables the rows read that are closest to misspelt
    ``--inputs`` names (a typo got only "never read it"), or ""."""
    from lmnb_engine.suggest import close_match

    close = [m for n in unused if (m := close_match(n, sorted(read)))]
    return f"; did you mean {', '.join(dict.fromkeys(close))}?" if close else ""


def _check_strippable(cell: Code, names: set) -> None:
    import ast

    tree = ast.parse(cell.source)
    for name in names:
        for first, last in cell.string_assignments[name]:
            overlapping = [s for s in tree.body if s.lineno <= last and s.end_lineno >= first]
            if len(overlapping) > 1:
                raise ExportError(
                    f"cell {cell.index}, line {first}: the example value of the row field {name!r} shares "
                    f"its line with other code; put `{name} = ...` on a line of its own"
                )


def _jupyter_builtins(cells: Sequence[Cell]) -> tuple:
    """The Jupyter built-ins (``JUPYTER_BUILTINS``) that a cell reads before any cell binds the name
    (``display(x)`` in cell 3, ``def display`` in cell 5: cell 3 called Jupyter's; the import was left
    out for the later definition, and cell 3 failed with a NameError)."""
    out = []
    for name in sorted(JUPYTER_BUILTINS):
        for c in cells:
            if name in getattr(c, "reads", ()):
                out.append(name)
                break
            if name in _cell_binds(c):
                break
    return tuple(out)


def _module_names(setup: list, module_names: tuple) -> set:
    """The module-level names: ``module_names`` (parameters and the like) and what setup cells bind."""
    module = set(module_names)
    for c in setup:
        if isinstance(c, Code):
            module |= set(c.assigns)
    return module


def _copied(setup: list, row: list, inputs: tuple, module_names: tuple) -> tuple:
    """The module-level names (``_module_names``) that the row part reads and rebinds or changes in
    place (``Plan.copied``), but ``inputs`` (the row fields, and ``Plan.shared``: no run_row variables).
    A ``del y`` reads y too: the notebook's deletes its global, run_row's needs its variable bound."""
    module = _module_names(setup, module_names)
    rebound, read = set(), set()
    for c in row:
        if isinstance(c, Code):
            rebound |= set(c.assigns) | set(c.mutates)
            read |= set(c.reads) | _deleted_names(c.source)
        elif isinstance(c, LMCell):
            rebound |= set(c.sets) | set(c.mutates)
            read |= set(c.reads)
    return tuple(sorted((rebound & module & read) - set(inputs)))


def _deleted_names(source: str) -> set:
    """The names that a ``del`` in ``source`` (a cell) deletes at its top level, not in its functions
    and classes (their own variables): ``cells.deleted_by`` of each statement."""
    import ast

    return set().union(*map(deleted_by, ast.parse(source).body))


def _star_locals(setup: list, row: list, locals_: tuple, module_names: tuple) -> tuple:
    """The module-level names (``_module_names``) that the row cells read from the first one with a
    star import on, but those in ``locals_`` (row fields and ``Plan.copied``: run_row's variables
    already; names that functions set by ``global``: read as the script's globals) and lmnb (the
    script's own import) (``Plan.star_locals``)."""
    first = next((c.index for c in row if isinstance(c, Code) and c.star_imports), None)
    if first is None:
        return ()
    read = set().union(*(set(c.reads) for c in row if isinstance(c, (Code, LMCell)) and c.index >= first))
    return tuple(sorted((read & _module_names(setup, module_names)) - set(locals_) - {"lmnb"}))


def _star_names(setup: list, row: list, module_names: tuple, set_back: set = frozenset()) -> tuple:
    """The names the row cells read that no cell binds, nor ``module_names`` (row fields,
    parameters and the like), where a row cell star-imports (``Plan.star_names``); not lmnb nor
    dunder names (``__name__`` is the script's, not a builtin's). ``set_back``: ``Plan.star_globals``,
    whose global each row sets back and sets at its import: run_row's own wherever the row reads them."""
    if not any(isinstance(c, Code) and c.star_imports for c in row):
        return ()
    bound = _module_names(setup, module_names) | {"lmnb"}
    read: list = []
    for c in row:
        if isinstance(c, (Code, LMCell)):
            bound |= set(_cell_binds(c))
            read += c.reads
    # (a name read only below the row's last star import of standard library modules reads the script's global,
    # which job.star_import sets at load as that import leaves it; one read above it, or deleted, is run_row's own,
    # import by import, and so is one that another module may set: a module of the user's gives the row's import
    # what it holds there, which a reload or a change of its globals above it makes other than at load)
    early = set(_used_above_star_imports(row)).union(set_back, *(_deleted_names(c.source) for c in row
                                                                 if isinstance(c, Code)))
    fixed = all(m.split(".")[0] in sys.stdlib_module_names for c in row if isinstance(c, Code) for m in c.star_imports)
    return tuple(n for n in dict.fromkeys(read) if n not in bound and not n.startswith("__")
                 and (n in early or not fixed and n not in _BUILTINS))


def _rebound_builtins(setup: list, row: list, module_names: tuple) -> tuple:
    """``Plan.rebound_builtins``: not those the setup cells bind, nor ``module_names`` (row fields,
    parameters and the like): run_row's variables from their module value already, or arguments."""
    read, rebound = set(), set()
    for c in row:
        if isinstance(c, (Code, LMCell)):
            read |= set(c.reads)
            rebound |= set(_cell_binds(c))
    names = (read & rebound & _BUILTINS) - _module_names(setup, module_names)
    return tuple(sorted(n for n in names if not n.startswith("__")))


def _setup_functions(setup: list) -> list:
    """(cell index, name, the globals it reads, those it declares ``global`` and binds, those it
    may change in place, those it surely does, the class attributes it changes, the names whose
    attributes it changes by a computed name) for each function, lambda and class that a setup
    cell defines (``function_globals``), in order."""
    from lmnb.export.cells import function_globals

    return [(c.index, name, *globals_) for c in setup if isinstance(c, Code)
            for name, globals_ in function_globals(c.source).items()]


def _reached(functions: list, used, links: dict) -> dict:
    """Name → the name of ``used`` it is reached from, for each of the setup cells' ``functions``
    (``_setup_functions``) that ``used`` (names the row cells read, in order) reach: one of them, or
    one that such a function reads (calls), or that ``links`` (``_links``) says a reached name holds
    (a decorator's wrapper, a dict of functions), and so on. A later definition of a name is the
    one reached, as in the notebook."""
    defined = {f[1]: f for f in functions}
    out: dict = {}
    seen: set = set()
    for entry in used:
        todo = [entry]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo += links.get(name, ())
            if name in defined:
                out[name] = entry
                todo += defined[name][2]
    return out


def _links(setup: list, functions: list) -> dict:
    """Name → the setup cells' ``functions`` (names) that a call through it may run, as the setup
    cells' top-level statements bind them: a function's or class's decorators (``@counted``: the
    wrapper runs) and its methods' decorators, a class's bases and metaclass (whose methods it has:
    ``B.bump()`` of ``class B(C)``), the functions a class's attributes hold (``class R: handler =
    f``), those a function's (or method's) defaults hold (``def f(cb=bump)``, ``cb=lambda:
    bump()``), and the functions an assignment's value holds (``handlers = {"a": f}``, ``g = f``,
    ``ask = counted(ask)``, and the class whose instance it makes: ``c = C()``) or that a change in
    place puts in it (``handlers["b"] = g``, ``hooks.append(g)``). A function that a call of the value only takes as
    an argument is held (``partial(f)``), the called one too where it takes a function
    (``counted(ask)``); ``x = f(1)`` holds f's result, not f, and so does ``list(map(f, xs))``
    (``_consumed``) where f makes no function to return, nor is a generator or an ``async def``."""
    import ast

    known = {f[1] for f in functions}
    classes = set(_setup_classes(setup))
    statements = [stmt for _, stmt in _statements(setup)]
    # (a generator or async def's result runs its body later, where a row iterates or awaits it)
    plain = {s.name for s in statements if isinstance(s, ast.FunctionDef)
             and not _returns_functions(s, known)
             and not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(s))}
    # (a name bound otherwise too, `f = counted(f)`, or decorated, may be anything)
    plain -= {n for s in statements if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
              or s.decorator_list for n in bound_by(s)}
    out: dict = {}
    for stmt in statements:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            held, targets = _function_holds(stmt, known, classes), [stmt.name]
        elif isinstance(stmt, ast.ClassDef):  # (and the functions its attributes hold: `handler = f`)
            held = {n.id for e in [*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)]
                    for n in ast.walk(e) if isinstance(n, ast.Name)}
            held |= {n for s in stmt.body if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value
                     for n in _held(s.value, known, classes)}
            held |= {n for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                     for n in _function_holds(s, known, classes)}  # (its methods' decorators, defaults)
            targets = [stmt.name]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            held = _held(stmt.value, known, classes, plain)
            targets = [n for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                       for n in _names_changed_or_bound(t)]
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
              and isinstance(stmt.value.func, ast.Attribute) and isinstance(stmt.value.func.value, ast.Name)):
            held = _held(stmt.value, known, classes) - {stmt.value.func.value.id}  # (hooks.append(g))
            targets = [stmt.value.func.value.id]
        else:
            continue
        for name in targets:
            out.setdefault(name, set()).update(held & known)
    return out


def _function_holds(function, known: set, classes: set) -> set:
    """The names a ``def``'s decorators and defaults hold (``_links``): a default's lambda is called
    with the function, so all it reads."""
    import ast

    defaults = [*function.args.defaults, *filter(None, function.args.kw_defaults)]
    return ({n.id for d in function.decorator_list for n in ast.walk(d) if isinstance(n, ast.Name)}
            | {n for d in defaults for n in _held(d, known, classes)}
            | {n.id for d in defaults for lam in ast.walk(d) if isinstance(lam, ast.Lambda)
               for n in ast.walk(lam.body) if isinstance(n, ast.Name)})


# Builtins that run through an iterable at once and keep none of the functions that map() or a
# key= applies: list(map(f, xs)) holds f's results, sorted(xs, key=f) xs's items
_CONSUMERS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "sum", "min", "max", "any", "all", "len"})


def _consumed(value, known: set, plain: set) -> set:
    """The ids of the names in ``value`` (an expression) of ``plain`` functions that a consuming
    builtin (``_CONSUMERS``, where no set-up function, ``known``, takes its name) calls through
    ``map``/``filter`` among its arguments, or as its ``key=``: called there, not held."""
    import ast

    out = set()
    for node in ast.walk(value):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONSUMERS
                and node.func.id not in known):
            continue
        applied = [a.args[0] for a in node.args if isinstance(a, ast.Call) and isinstance(a.func, ast.Name)
                   and a.func.id in ("map", "filter") and a.func.id not in known and a.args]
        applied += [k.value for k in node.keywords if k.arg == "key"]
        out |= {id(f) for f in applied if isinstance(f, ast.Name) and f.id in plain}
    return out


def _returns_functions(function, known: set) -> bool:
    """Whether ``function`` (a ``def``) may give a function back: it defines one (or a lambda, or a
    class) inside, or returns or yields a name of ``known`` (the set-up's functions)."""
    import ast

    for node in ast.walk(function):
        if node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return True
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) and node.value is not None \
                and any(isinstance(n, ast.Name) and n.id in known for n in ast.walk(node.value)):
            return True
    return False


def _held(value, known: set, classes: set, plain: set = frozenset()) -> set:
    """The names ``value`` (an expression) holds as values, not as functions it calls, but the
    ``classes`` it calls (an instance holds its class's methods): ``_links``. ``plain``: the set-up
    functions that give no function back (``_consumed``)."""
    import ast

    called = _consumed(value, known, plain)
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in classes:
            arguments = [*node.args, *(k.value for k in node.keywords)]
            takes_function = any(isinstance(n, ast.Name) and n.id in known for a in arguments for n in ast.walk(a))
            if not takes_function:
                called.add(id(node.func))
    lambdas = {id(n) for lam in ast.walk(value) if isinstance(lam, ast.Lambda) for n in ast.walk(lam.body)}
    return {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and id(n) not in called and id(n) not in lambdas}


def _names_changed_or_bound(target) -> list:
    """The names an assignment's ``target`` binds (``f``), or changes in place (``handlers["b"]``)."""
    import ast

    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _called(functions: list, row: list, links: dict, own: frozenset = frozenset()) -> list:
    """The setup cells' ``functions`` (``_setup_functions``) that the row cells use (``_reached``), but
    through a name of ``own`` (``_bound_before_read``), which the rows use as their own."""
    used = [n for c in row if isinstance(c, (Code, LMCell)) for n in (c.uses if isinstance(c, Code) else c.reads)
            if n not in own]
    reached = _reached(functions, dict.fromkeys(used), links)
    return [f for f in functions if f[1] in reached]


def _changed_by_called(called: list, row: list) -> tuple:
    """The globals that ``called`` (``_called``) change in place, but those a row cell binds: a row
    cell's new object is run_row's variable, which the functions do not see either way."""
    bound = set().union(*(set(_cell_binds(c)) for c in row))
    return tuple(n for n in dict.fromkeys(n for f in called for n in f[4]) if n not in bound)


def _setup_functions_reading_row_variables(functions: list, row: list, shared: tuple, advised: set) -> list:
    """Notes for the functions (and classes' methods) of setup cells (``_setup_functions``) that
    read a variable the row cells set: they read the script's globals, not run_row's variables, so
    in the job they get a NameError or the value the setup cells left, where the notebook's read
    the row's value. Not for ``shared`` names (``Plan.shared``), which run_row sets as the
    script's globals, nor for the (cell index, function, name) of ``advised``, whose note on a read
    before a later cell sets it (``_read_before_set``) says to pass it."""
    bound = set().union(*map(_cell_binds, row)) - set(shared)
    notes = []
    for index, name, reads, *_ in functions:
        read = [n for n in reads if n in bound and (index, name, n) not in advised]
        if read:
            them = "it as an argument" if len(read) == 1 else "them as arguments"
            notes.append(f"cell {index}: {name}, defined in a cell that runs once, reads {', '.join(read)}, "
                         "which the cells that run per row set: in the job it reads the script's globals, not "
                         "the row's variables (a NameError, or the value the cells run once set); pass "
                         f"{them} to {name}, or move {name} into a cell below the first %%lm cell")
    return notes


def _function_reads(functions: list, module: set) -> dict:
    """``Plan.function_reads``, of the setup cells' ``functions`` (``_setup_functions``); ``module``:
    the module-level names (``_module_names``)."""
    return {f"{name} (cell {index})": tuple(n for n in reads if n in module)
            for index, name, reads, *_ in functions if set(reads) & module}


def _early_reads(functions: list, row: list, module: set, links: dict) -> dict:
    """``Plan.early_reads``, of the setup cells' ``functions`` (``_setup_functions``); ``module``:
    the module-level names (``_module_names``); ``links``: ``_links``."""
    defined = {f[1]: f for f in functions}  # (a later definition wins, as it runs)
    uses = _used_above_star_imports(row)
    out: dict = {}
    for name, entry in _reached(functions, uses, links).items():
        index, _, reads, *_ = defined[name]
        names = tuple(n for n in reads if n not in module)
        if names:
            out[f"{name} (cell {index})"] = ((f"through {entry}, " if name != entry else "") + uses[entry], names)
    return out


def _set_by_star_import_only(early_reads: dict, cells: list, given: tuple) -> tuple:
    """The names of ``early_reads`` (``_early_reads``) that no cell binds, nor ``given`` (row fields,
    parameters and the like) holds, but lmnb, builtins and dunder names: a name only a star import
    sets (pi). (A builtin that the row's module sets, pow of math, is found at run time by
    ``Job.star_import``, which treats it so too: ``Plan.early_builtins``.) The set-up function
    reads it as the script's global, which run_row then sets at the row's star import and ``Job.restore`` takes back (to unbound, or the set-up's star import's
    value) at each row's start, as each pass of the notebook has it (``Plan.star_globals``)."""
    bound = set().union(*map(_cell_binds, cells)) | set(given) | {"lmnb"} | _BUILTINS
    names = (n for _, reads in early_reads.values() for n in reads)
    return tuple(n for n in dict.fromkeys(names) if n not in bound and not n.startswith("__"))


def _used_above_star_imports(row: list) -> dict:
    """Name → where the row cells first read it ("cell 3, line 1"; "cell 3" for a ``%%lm`` cell)
    above the last star import of a row cell."""
    import ast

    last = max(c.index for c in row if isinstance(c, Code) and c.star_imports)
    out: dict = {}
    for c in row:
        if c.index > last:
            break
        if isinstance(c, LMCell):
            out.update({n: f"cell {c.index}" for n in c.reads if n not in out})
        elif isinstance(c, Code):
            body = ast.parse(c.source).body
            if c.index == last:  # (the statements above its last star import; one in a block is refused later)
                body = body[:max((i for i, s in enumerate(body) if isinstance(s, ast.ImportFrom)
                                  and s.names[0].name == "*"), default=len(body))]
            loads = sorted((n.lineno, n.col_offset, n.id) for s in body for n in ast.walk(s)
                           if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
            for line, _, name in loads:
                out.setdefault(name, f"cell {c.index}, line {line}")
    return out


def _backend(setup: list, row: list) -> tuple[Backend, list]:
    chosen, notes = Backend(), []
    for c in setup:
        for b in getattr(c, "backends", []):
            chosen = b
    for c in row:
        if getattr(c, "backends", None):
            notes.append(f"cell {c.index}: %lm load/connect after the first %%lm cell is not followed; "
                         "the job runs every row on one backend (its --backend / --model); the named "
                         "states it drops start afresh in the job too")
    return chosen, notes
