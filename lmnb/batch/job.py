"""``Job``: what a script written by ``lmnb export`` calls.

The script defines ``run_row(**fields)`` (one pass of the notebook for one input row) and ends with
``job.run(run_row, programs=[...])``. ``Job`` reads the rows, skips those already in the output,
runs the rest on a thread pool (the backend batches their requests: continuous batching and the
radix cache, paper §3), writes each finished row at once and prints a summary
(``lmnb.batch.runner``). Each row's variables are recorded through ``lmnb.observe``
(``lmnb.batch.record``).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import inspect
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from lmnb.batch import setup_error
from lmnb.batch.inputs import InputError, read_rows
from lmnb.batch.messages import say
from lmnb.batch.options import (add_parameters, check_backend_options, engine_model, job_parser, make_backend,
                                parameter_options, start_failure)
from lmnb.batch.runner import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, RowRunner, fatal, silence_stream
from lmnb.batch.store import ResultStore, StoreError, finite_floats
from lmnb_engine import DEMO_MODEL_NAME, MODEL_ENV, is_demo_name


def code_fingerprint(func: Callable) -> Optional[str]:
    """A short sha256 of the code of the file that defines ``func`` (an exported script's
    ``run_row``), or None where that file cannot be read (a function typed into a console).

    Comments, blank lines, layout and docstrings do not count (the syntax tree is hashed, without
    docstrings, as ``ast.unparse`` writes it: ``ast.dump``'s text changes with the Python version);
    any other change of the code does: an edited cell gives another value.
    """
    try:
        with open(inspect.getsourcefile(func), encoding="utf-8") as f:  # (closed: not left to the collector)
            tree = ast.parse(f.read())
    except (TypeError, OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            del body[0]  # (the tree is only hashed, so a body left empty does no harm)
    return hashlib.sha256(ast.unparse(tree).encode("utf-8")).hexdigest()[:16]


def continued(state: Any) -> Any:
    """A new ``ProgramState`` with ``state``'s text, messages and variables, for the next ``%%lm
    --state`` cell to extend, as the kernel continues a named state on a copy
    (``StreamExecutor.continuation``): ``state`` itself, which an earlier cell's ``--out`` may have
    bound, stays as that cell left it, as in the notebook.

    Raises:
        ProgramError: ``state`` failed (the row stops there, as the notebook stopped)."""
    from lmnb.interpreter import ProgramState

    return ProgramState(state.stream_executor.continuation())


class _Unbound:
    """``UNBOUND``'s type."""

    def __repr__(self) -> str:
        return "<unbound>"


# What ``star_values`` gives for a name that is neither bound yet nor set by the import: the script
# deletes that variable again (``if x is job.UNBOUND: del x``), so that it stays unbound, as in the notebook.
UNBOUND = _Unbound()


def _star_names(module: str) -> dict:
    """Name → value of what ``from module import *`` binds.

    Raises:
        ImportError: the module cannot be imported."""
    names: dict = {}
    exec(f"from {module} import *", names)
    names.pop("__builtins__", None)
    return names


def star_import(namespace: dict, /, *modules: str, over: Sequence[str] = (),
                functions: Optional[dict] = None, early: Optional[dict] = None) -> None:
    """``from module import *`` for each of ``modules`` in order (a later one's name wins) into
    ``namespace`` (the script's globals), but for the names it holds already. The script makes a
    per-row cell's star imports so, at module level (a function cannot make one): they give the
    functions of the cells run once the names that no cell binds (``sqrt``), and leave the
    notebook's own variables (a parameter ``e``); run_row reads its own variables of them, which an
    import changes only from where the cell makes it, in each row (``star_start``, ``star_values``).
    ``over``: the modules that the cells run once star-import (above, at module level): a name that
    still holds such a module's value is no variable of the notebook, and takes ``modules``' value,
    as the later import replaces it in the notebook (``from math import *`` once, then ``from cmath
    import *`` per row: sqrt is cmath's). ``functions``: "f (cell 1)" → the notebook's variables
    that a function (or class) of the cells run once reads: one that a module of ``modules`` sets is
    said on stderr, as that function reads the script's global, which the rows' imports leave as it
    is (rows run at once, so a row cannot change it), where the notebook's read the module's value
    after the import. ``early``: "f (cell 1)" → (where the rows use that function of the cells run
    once above their last star import, the names it reads but the notebook's variables): one that
    ``modules`` set here is said on stderr, as the function reads the module's value from the start
    of every row, where the notebook's read it only from the import on (rows run at once, so a row
    cannot give it the value it had before its import).

    Raises:
        ImportError: a module cannot be imported."""
    import builtins

    names: dict = {}
    setters: dict = {}  # name → the first of modules that sets it
    last: dict = {}  # name → the module whose value it takes: the last that sets it
    for module in modules:
        found = _star_names(module)
        names.update(found)
        for name in found:
            setters.setdefault(name, module)
            last[name] = module
    earlier: dict = {}
    for module in over:
        earlier.update(_star_names(module))
    kept = set()  # the notebook's variables, which the import changes only in run_row
    for name, value in names.items():
        if name not in namespace or (name in earlier and namespace[name] is earlier[name]):
            namespace[name] = value
        else:
            kept.add(name)
    for function, (where, reads) in (early or {}).items():
        short = function.split(" (cell ")[0]  # (the plan's "f (cell 1)")
        for name in (n for n in reads if n in names and n not in kept):
            if names[name] is earlier.get(name, getattr(builtins, name, UNBOUND)):  # (the value it had: no change)
                continue
            say(f"lmnb batch: warning: {function} reads {name}, which the per-row `from {last[name]} import *` sets, "
                f"and the row uses {short} above that import ({where}): in the notebook {short} read the {name} it "
                f"had before the import there, in this job it reads {last[name]}'s {name} from the start of every "
                f"row; pass {name} to {short} as an argument, or use `import {last[name]}` and {last[name]}.{name} "
                "instead of the star import")
    for function, reads in (functions or {}).items():
        for name in (n for n in reads if n in kept):
            say(f"lmnb batch: warning: {function} reads {name}, which the per-row `from {setters[name]} import *` "
                f"sets: in the notebook it read the module's {name} after that import, in this job it reads the "
                f"value the cells run once set, in every row; pass {name} to it as an argument")


def star_start(over: Sequence[str], /, *names: str) -> tuple:
    """The values of ``names`` (in order) where a row's cells begin, which no cell binds but a
    per-row cell's star import may set (``sqrt``; ``pow``, which ``from math import *``
    replaces), or which are builtins that a per-row cell binds (``len``: the builtin until
    then): what the star imports of ``over`` (the modules that the cells run once star-import,
    in order) set, else the builtin, else ``UNBOUND``. As in the notebook, the row's own imports
    change them only from their lines on (``star_values``); ``star_import`` filled the script's
    globals before, for all of run_row. ``over`` empty after a per-row cell's ``del pow``: the
    builtin, which the notebook reads once the ``del`` removed its global.

    Raises:
        ImportError: a module cannot be imported (``star_import`` failed first)."""
    import builtins

    values = dict(vars(builtins))
    for module in over:
        values.update(_star_names(module))
    return tuple(values.get(name, UNBOUND) for name in names)


def deletable(bound: dict, /, *names: str) -> None:
    """Raise the notebook's NameError for a per-row cell's ``del`` of a builtin's name (``del pow``)
    where the notebook has no global of that name to delete: one that ``bound`` (run_row's
    ``locals()``) lacks, or holds as the builtin, as run_row's variable does where the notebook's
    global is unbound (before a star import sets it, after a ``del``: ``star_start``).

    Raises:
        NameError: the first such name."""
    import builtins

    for name in names:
        if bound.get(name, getattr(builtins, name)) is getattr(builtins, name):
            raise NameError(f"name {name!r} is not defined", name=name)


def star_values(module: str, bound: dict, /, *names: str) -> tuple:
    """The values of ``names`` (in order) after ``from module import *``, made where a per-row cell
    makes it: the module's value where the import sets the name, else ``bound``'s (run_row's
    ``locals()``), else ``UNBOUND``.

    Raises:
        ImportError: the module cannot be imported (``star_import`` failed first)."""
    values = _star_names(module)
    return tuple(values[name] if name in values else bound.get(name, UNBOUND) for name in names)


def star_globals(module: str, namespace: dict, /, *names: str) -> None:
    """Set those of ``names`` that ``from module import *`` binds in ``namespace`` (the script's
    globals) to the module's values, where a per-row cell makes the import: the names that a
    function of the cells run once reads and that the row's cells above the import left as the
    notebook had them (``Job.restore``: unbound, or the builtin). The others stay as they are.

    Raises:
        ImportError: the module cannot be imported (``star_import`` failed first)."""
    values = _star_names(module)
    namespace.update((name, values[name]) for name in names if name in values)


def _settings_value(value: Any) -> Any:
    """``Job.settings``' JSON for a value JSON has not: a set as a list in a fixed order (its own
    order, and so its repr, changes from one process to the next for strings: a rerun with the
    same --tags was refused as one with other settings), another value as its repr."""
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:  # (items of several types: {1, 'a'})
            return sorted(value, key=repr)
    return repr(value)


def row_copy(value: Any) -> Any:
    """A row's own copy of a module value that its cells change: a deep copy of built-in
    containers (list, dict, set, bytearray), other values as they are (modules, models, clients
    are shared, and often cannot be copied). In the notebook the cells ran once, so each row must
    start from the set-up value, whatever the rows before it appended. Where something inside a
    container cannot be copied (a lock, an open file), the containers around it are still copied
    and that value alone is shared: a failed copy would fail every row."""
    import copy

    if not isinstance(value, (list, dict, set, bytearray)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # (deepcopy raises TypeError, copy.Error or the object's own error)
        return _copy_containers(value, {})


def _copy_containers(value: Any, memo: dict) -> Any:
    """``row_copy``'s fallback: built-in containers (and their subclasses) copied all the way down,
    each leaf deep-copied where it can be and shared where it cannot; ``memo`` keeps shared
    references and cycles as they were."""
    import copy

    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, (list, dict)):
        out = memo[id(value)] = copy.copy(value)  # (keeps a subclass and its state, e.g. defaultdict's factory)
        for k in range(len(out)) if isinstance(out, list) else list(out):
            out[k] = _copy_containers(out[k], memo)
        return out
    if isinstance(value, tuple) and (type(value) is tuple or hasattr(type(value), "_make")):  # (a namedtuple)
        items = [_copy_containers(v, memo) for v in value]
        out = memo[id(value)] = tuple(items) if type(value) is tuple else type(value)._make(items)
        return out
    if isinstance(value, (set, bytearray)):
        out = memo[id(value)] = copy.copy(value)  # (set members are hashable, so not changed in place)
        return out
    try:
        out = copy.deepcopy(value)
    except Exception:
        out = value
    memo[id(value)] = out
    return out


def _holders(cls: type, attribute: str) -> list:
    """``cls``, its subclasses (all the way down), and the class ``cls`` inherits ``attribute``
    from where it holds a built-in container there (``Job.keep``): the classes whose own
    ``attribute`` a row's change of ``cls``'s may set. ``cls`` alone where it is no class (a class
    decorator's instance: ``@singleton class Config``)."""
    if not isinstance(cls, type):
        return [cls]
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo += type.__subclasses__(c)
    if attribute not in vars(cls):
        owner = next((c for c in cls.__mro__[1:] if attribute in vars(c)), None)
        if owner is not None and isinstance(vars(owner)[attribute], (list, dict, set, bytearray)):
            out.append(owner)
    return out


class Job:
    """A notebook's batch job (see the module docstring).

    Args:
        description: help text of the command line (the script's docstring).
        inputs: names of the fields every input row must have; they become ``run_row``'s arguments.
        texts: those of ``inputs`` whose value must be a string (the notebook's example of each is):
            a row giving a number, a boolean, a list or an object there is bad input, named as such,
            instead of a run on code that was written for text (``question.strip()`` failed the row
            with an AttributeError; ``{question}`` quietly prompted with ``7`` or ``[1, 2]``).
        types: those of ``inputs`` that are notebook parameters (``lmnb export --inputs``) → their
            default's type (int, float, bool, list, ...): a row's value is read as the parameter's
            option reads its text (``lmnb.batch.options.parameter_type``: ``"32"`` or 32 is 32 for
            an int); one that does not read so is bad input, named as such (a CSV row's "32" ran
            as text, and ``range(n)`` failed the row).
        model: default ``--model`` (a notebook's ``%lm load``); None = ``$LMNB_MODEL``, else the
            built-in demo model.
        backend: default ``--backend`` (a notebook's ``%lm connect URL``); None = ``engine``.
        openai_model: default ``--openai`` (``%lm connect URL --openai MODEL``).
        completion: default ``--completion`` (``%lm connect ... --completion``).
        continue_final_message: default ``--continue-final-message`` (``%lm connect ...
            --continue-final-message``). Not among the settings a results file records: it changes
            no row's output, only lets rows run whose gens it refused (``--retry-errors`` reruns them).
        reexport: how to export the notebook again with other row fields, which the messages that
            say to do so give, with the fields they mean in place of its last ``NAMES``: the command
            of the tool that exported it (``lmnb export nb.ipynb --inputs NAMES``, ``jupyter
            nbconvert --to lmnb nb.ipynb --LMScriptExporter.inputs=NAMES``); default lmnb export's
            option alone.
        timeout: default ``--timeout`` in seconds (``%lm connect ... --timeout S``).
        argv: command-line arguments (default ``sys.argv[1:]``).
        per_row: False for a notebook without ``%%lm`` cells: no input rows, only the backend and
            parameter options (the script calls ``start`` instead of ``run``).
        parameters: the notebook parameters (papermill's ``parameters`` cell) → their defaults as
            the cell's literals give them, for ``options_first``; ``parameters()`` reads them
            again where the cell runs, with the values it set.
        computed: those of ``parameters`` whose default the cell computes (``n = len(x)``): their
            options take any text before the cell runs, read like the cell's value after, and
            ``--help`` says that the cell sets the default.
        options_first: run as ``__main__``, the job reads its command line as it is made, before
            the notebook's set-up cells run, so ``--help`` and a misspelt option answer at once
            (they ran every set-up cell first, a slow one or one that fails too; with a parameters
            cell, those above it: a model load). Exits as ``argparse`` does on bad options (status 2),
            and with status 2 where the backend options do not fit, the engine's model is a
            checkpoint directory that is not there, or ``--output`` holds rows run with other
            settings or keyed otherwise (``run`` refuses those too).
    """

    # The script's run_row calls these through the job object, whose name the exporter keeps free:
    # a notebook cell in the row that imports or assigns ``lmnb`` made ``lmnb.batch...`` there an
    # UnboundLocalError.
    continued = staticmethod(continued)
    row_copy = staticmethod(row_copy)
    star_start = staticmethod(star_start)
    star_values = staticmethod(star_values)
    deletable = staticmethod(deletable)
    UNBOUND = UNBOUND

    def __init__(self, description: str = "", inputs: Sequence[str] = (), *, texts: Sequence[str] = (),
                 types: Optional[dict] = None,
                 model: Optional[str] = None, backend: Optional[str] = None, openai_model: Optional[str] = None,
                 completion: bool = False, timeout: Optional[float] = None, reexport: str = "--inputs NAMES",
                 argv: Optional[Sequence[str]] = None, per_row: bool = True, parameters: Optional[dict] = None,
                 computed: Sequence[str] = (), options_first: bool = False, continue_final_message: bool = False):
        self.description = description
        self.inputs = list(inputs)
        self.texts = list(texts)
        self.types = dict(types or {})
        self.per_row = per_row
        self.default_model = model
        self.default_backend = backend
        self.default_openai = openai_model
        self.default_completion = completion
        self.default_continue_final_message = continue_final_message
        self.default_timeout = timeout
        self.reexport = reexport
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.args: Optional[argparse.Namespace] = None
        self.parameter_values: dict = {}
        self._parameters = (dict(parameters or {}), tuple(computed))  # (the options read before the cell runs)
        self._parameters_read = False
        self._read_early = False  # (options_first read the parameters' options: parameters() reads them again)
        self._kept: list = []  # (keep)
        self._star_builtins: tuple = ()  # (star_import)
        self._end_setup: Callable[[], None] = lambda: None  # (gives back the excepthook for the set-up's errors)
        self._start_folder = _current_folder()  # (the one the command ran in, before a set-up cell's os.chdir)
        caller = sys._getframe(1)  # the script, whose module level goes on to run the notebook's set-up
        if caller.f_globals.get("__name__") == "__main__":
            if options_first:
                parser = self._parser()
                dests = add_parameters(parser, *self._parameters, per_row=per_row)
                self.args = parser.parse_args(self.argv)
                self._read_early = bool(self._parameters[0])
                self._check_backend()
                self._check_resume(dests)
            if setup_error.is_program(caller):
                self._end_setup = setup_error.install(caller.f_code.co_filename, per_row)

    def keep(self, namespace: dict, /, *names: str) -> None:
        """Keep the values that ``namespace`` (the script's globals, once the cells run once ran)
        holds for ``names``: those that a function the cells run per row call sets by ``global``
        (a counter), or that a function sets so and those cells set too, one variable the rows
        share; ``restore`` gives them back at the start of each row, as each pass of the notebook
        starts from them. A name ``namespace`` lacks is kept as unbound: ``restore`` deletes it (a
        global that a set-up function sets but the cells run once never called; a name that only
        a per-row star import sets, ``pi``, which a set-up function reads). A name "C.n" is the
        attribute n of the class C (its own, not one it inherits), which the rows change
        (``C.n += 1``), and that of each subclass of C (``cls.n += 1`` in C's classmethod, called
        as ``B.bump()``, sets B's own n), and the built-in container (list, dict, set, bytearray)
        that C inherits as n, which ``C.n.append(x)`` changes in place; "Outer.Inner.n" that of
        a nested class; "Meta.n" of a metaclass, the n of each class of ``namespace`` made by it
        too. One of a class ``namespace`` lacks is not kept."""
        self._kept = []  # (the namespace or the class, name, value or UNBOUND)
        for name in names:
            owner, *inner, attribute = name.split(".") if "." in name else (name, None)
            if attribute is None:
                self._kept.append((namespace, name, namespace.get(name, UNBOUND)))
            elif owner in namespace:
                holder = namespace[owner]
                for part in inner:  # (a nested class: "Outer.Inner.n")
                    holder = getattr(holder, part, None)
                if not inner or isinstance(holder, type):
                    roots = [holder]
                    if isinstance(holder, type) and issubclass(holder, type):  # (a metaclass: its classes too)
                        roots += [v for v in namespace.values() if isinstance(v, holder)]
                    self._kept += [(cls, attribute, vars(cls).get(attribute, UNBOUND))
                                   for root in roots for cls in _holders(root, attribute)]

    def star_import(self, namespace: dict, /, *modules: str, over: Sequence[str] = (),
                    functions: Optional[dict] = None, early: Optional[dict] = None) -> None:
        """The module-level ``star_import`` (its arguments, and what it raises), which also finds the
        builtins that the functions of ``early`` read and that ``modules`` set (``from numpy import
        *`` sets sum): those are kept as the cells run once left them (the builtin; a set-up star
        import's value), set back by ``restore`` at each row's start and set by ``star_globals`` at
        the row's import, as the notebook has them; the export lists no builtin, as it cannot tell
        which a module sets without importing it. Call it after ``keep``."""
        read = {n for _, names in (early or {}).values() for n in names if hasattr(builtins, n)}
        before = {n: namespace.get(n, UNBOUND) for n in read}
        found = set().union(*(_star_names(m) for m in modules)) if read else set()
        self._star_builtins = tuple(sorted(read & found))
        self._kept += [(namespace, n, before[n]) for n in self._star_builtins]
        early = {f: (where, tuple(n for n in names if n not in self._star_builtins))
                 for f, (where, names) in (early or {}).items()}
        star_import(namespace, *modules, over=over, functions=functions, early=early)

    def star_globals(self, module: str, namespace: dict, /, *names: str) -> None:
        """The module-level ``star_globals`` of ``names`` and of the builtins ``star_import`` found
        the row's modules set, which the functions of the cells run once read."""
        star_globals(module, namespace, *names, *self._star_builtins)

    def warn_of_shared_state(self, rows: int) -> None:
        """Say on stderr that the rows share the kept state (``keep``) where more than one of them
        run at once: ``rows`` (those that will run: not a rerun's done rows, nor those past
        --limit) and --num-threads both above 1. The export's note is read once, if at all."""
        shared, at_once = self._kept_names(), min(self.args.num_threads, rows)
        if shared and at_once > 1:
            say(f"lmnb batch: warning: {at_once} rows run at once share {shared}, which each pass of the notebook "
                "starts from the cells run once: each row starts from those values only with --num-threads 1")

    def _kept_names(self) -> str:
        """The names and class attributes ``keep`` kept ("calls, Tally.n"; at most five, then "..."),
        for messages; "" where none. A builtin's name kept as unbound is left out but where the row's
        star import sets it (``star_import``): a script of an earlier export keeps every builtin a
        set-up function reads above a per-row star import (``str``), and listing them would hide the
        names that matter."""
        # (a holder is a class, or an instance where a class decorator made the class one: @singleton)
        names = list(dict.fromkeys(name if isinstance(holder, dict) else
                                   f"{getattr(holder, '__qualname__', type(holder).__qualname__)}.{name}"
                                   for holder, name, value in self._kept
                                   if value is not UNBOUND or not hasattr(builtins, name)
                                   or name in self._star_builtins))
        return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")

    def restore(self, namespace: dict) -> None:
        """Set the names and class attributes that ``keep`` kept to a copy of their kept values
        (``row_copy``: what a row changes in place is its own), and delete those kept as unbound.
        ``namespace``: the one ``keep`` was given."""
        for holder, name, value in self._kept:
            if isinstance(holder, dict):
                if value is UNBOUND:
                    holder.pop(name, None)
                else:
                    holder[name] = row_copy(value)
            elif value is UNBOUND:
                if name in vars(holder):
                    delattr(holder, name)
            else:
                setattr(holder, name, row_copy(value))

    def _parser(self) -> argparse.ArgumentParser:
        return job_parser(self.description, self.per_row, backend=self.default_backend, openai_model=self.default_openai,
                          model=self.default_model, completion=self.default_completion, timeout=self.default_timeout,
                          continue_final_message=self.default_continue_final_message)

    def _check_backend(self) -> None:
        """Exit with status 2 and the reason (as ``start`` words it) where the backend options do
        not fit together (``check_backend_options``: ``--timeout`` for the engine, a ``--backend``
        that is no URL) or the engine's model is a checkpoint directory that is not there (``%lm
        load /nonexistent/model``, ``--model`` a file): each was found only when the backend
        started, after the set-up cells ran (a slow one, one that fails and hides it). A hub id is
        left to the engine, which asks the hub's cache."""
        try:
            check_backend_options(self.args)
            model = engine_model(self.args, self.default_model)
            if model is not None and not is_demo_name(model):
                from lmnb_engine.checkpoint_path import local_checkpoint  # (no torch; only a job with a model needs it)

                local_checkpoint(model)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(fatal(start_failure(self.args, self.default_model, e))) from None

    def _check_resume(self, dests: dict) -> None:
        """Exit with status 2 and ``Job.run``'s reason where ``--output`` is the input file, or
        holds rows keyed otherwise (``--id-field``) or run with other settings
        (``ResultStore.check_before_setup``), which ``run`` refused only after the set-up cells ran
        (a model load: minutes). ``dests``: each
        parameter's option's dest in ``args`` (``add_parameters``); those the parameters cell
        computes are not known yet: ``run`` compares them."""
        args, computed = self.args, self._parameters[1]
        if not self.per_row:
            return
        if _same_file(args.output, args.input):
            raise SystemExit(fatal(_output_is_input(args)))
        known = {name: getattr(args, dest) for name, dest in dests.items() if name not in computed}
        store = ResultStore(args.output, args.id_field, self.settings(known))
        try:
            store.check_before_setup(unknown=[f"parameter {name}" for name in computed])
        except StoreError as e:
            raise SystemExit(fatal(str(e))) from None

    def parameters(self, **defaults: Any) -> argparse.Namespace:
        """Parse the command line now, with one option per notebook parameter (papermill's
        ``parameters`` cell): ``--name VALUE`` replaces the default, parsed like the default's type
        (``lmnb.batch.options.parameter_type``: bool: true/false; int; float; str; list, tuple, set,
        dict: a Python literal or JSON of that type, a list for a tuple or set; None: a Python
        literal, else the text, as ``1,2`` stays in papermill). Returns the values. A job that read
        its command line as it was made (``options_first`` with ``parameters``) reads it again here,
        with the values the cell set as the defaults.

        Exits with usage help (status 2) on bad options, as ``argparse`` does.
        """
        if self._parameters_read or self.args is not None and not self._read_early:
            raise RuntimeError("Job.parameters() is called once, before Job.run()")
        self._parameters_read = True
        parser = self._parser()
        dests = add_parameters(parser, defaults, per_row=self.per_row)
        self.args = parser.parse_args(self.argv)
        self.parameter_values = {name: getattr(self.args, dest) for name, dest in dests.items()}
        return argparse.Namespace(**self.parameter_values)

    def settings(self, parameters: Optional[dict] = None) -> dict:
        """What the rows' results depend on besides their fields: the notebook parameters
        (``parameters``, default those ``parameters()`` read) and the backend options, as JSON
        values (``repr`` for others, a float nan or inf too). Each record carries them. A model
        given as a local directory is recorded as its real path, however it was spelled (the
        built-in demo model, by its directory or its name "demo", as None, as a run without --model
        records it, but as "demo" where the notebook loads a model of its own, which a run without
        --model runs), and a server URL without a trailing "/"."""
        a = self.args
        # the user's --model, or $LMNB_MODEL where it picks the engine's model (a notebook's own
        # model is in the script already)
        model = a.model if a.model or self.default_model else engine_model(a)
        if model and os.path.isdir(model):  # ("ckpt", "./ckpt/" and its absolute path are one model)
            model = os.path.realpath(model)
        if _is_demo_model(model):  # (by its name "demo" or its folder, as the engine loads it)
            # recorded as no --model where that runs the demo model too; beside a notebook's own model, which
            # no --model runs, by its name: a rerun without --model is then other settings, not rows already done
            model = None if not self.default_model or _is_demo_model(self.default_model) else DEMO_MODEL_NAME
        backend = a.backend if a.backend == "engine" else a.backend.rstrip("/")  # (a URL, with or without "/")
        parameters = self.parameter_values if parameters is None else parameters
        values = {**{f"parameter {k}": v for k, v in parameters.items()}, "--backend": backend,
                  "--openai": a.openai, "--model": model, "--device": a.device, "--dtype": a.dtype}
        if a.completion:  # (only when set: results files written before the option stay readable)
            values["--completion"] = True
        if a.chat_template is not None:  # (as --completion)
            values["--chat-template"] = a.chat_template
        # (a float parameter's nan or inf as the file holds it, so that a rerun compares it alike)
        return finite_floats(json.loads(json.dumps(values, default=_settings_value)))

    def start(self):
        """For a script without input rows: parse the options (unless ``parameters`` did), start
        the backend they name and make it lmnb's default backend; returns it.

        Exits with status 2 and the reason if the backend cannot start.
        """
        import lmnb

        if self.args is None:
            self.args = self._parser().parse_args(self.argv)
        self._paths_from_start_folder()
        try:
            backend = make_backend(self.args, self.default_model)
        except (OSError, ValueError, RuntimeError, ImportError) as e:
            raise SystemExit(fatal(start_failure(self.args, self.default_model, e)))
        lmnb.set_default_backend(backend)
        return backend

    def run(self, run_row: Callable[..., Any], programs: Sequence[Any] = (), backend: Any = None) -> int:
        """Run ``run_row(**fields)`` for every input row not yet in the output; returns the exit
        status: 0 every row in the output is ok, 1 some rows failed or their input was unusable
        (their records say why), also on a rerun that leaves them so (the output is not complete: a
        script that goes on to read it must not take it for the whole), 2 the job could not start,
        130 stopped by Ctrl-C / SIGTERM before every row was written (after that, the job ends as
        usual, saying so), 141
        stopped because the rows printed into a pipe that closed (``| head``; those rows are not
        recorded, so a rerun does them), or stderr did (``2>&1 | head``).

        ``programs``: the notebook's ``@lmnb.function``s; their constant prefixes are put in
        the prefix cache before the rows start (as ``run_batch`` does), so all rows share them.
        ``backend``: an lmnb backend to use instead of the one the options name (not shut down).
        """
        if not self.per_row:
            raise RuntimeError("Job(per_row=False) has no input rows to run; call start()")
        self._end_setup()
        self._parameters_read = True  # (a parameters() after the rows ran would change what they ran with)
        if self.args is None:
            self.args = self._parser().parse_args(self.argv)
        self._paths_from_start_folder()
        args = self.args
        if _same_file(args.output, args.input):
            return fatal(_output_is_input(args))
        try:
            rows = list(read_rows(args.input, args.input_format))
        except InputError as e:
            return fatal(str(e))
        shadowed = self._parameter_fields(rows)
        if shadowed:
            return fatal(shadowed)
        unknown_id = _unknown_id_field(rows, args.id_field)
        if unknown_id:
            return fatal(unknown_id)
        unread_fields = sorted({str(k) for row in rows if row.error is None for k in row.fields} - {args.id_field})
        if not self.inputs and unread_fields:  # (not refused: running one program over and over may be meant)
            shown = ", ".join(map(repr, unread_fields[:5])) + (", ..." if len(unread_fields) > 5 else "")
            fields = f"the fields {shown} are" if len(unread_fields) > 1 else f"the field {shown} is"
            # (the command names the fields the rows have, where they are few enough to list)
            names = shlex.quote(",".join(unread_fields)) if len(unread_fields) <= 5 else "NAMES"
            say(f"lmnb batch: warning: this job reads no field of the input rows (its notebook's %%lm cells read "
                f"none), so every row runs the same programs and {fields} not used; to read "
                f"{'them' if len(unread_fields) > 1 else 'it'}, export the notebook again with {self._reexport(names)}")
        if not rows:  # (not an error: the job is done; but a wrong or unwritten file would go unnoticed)
            say(f"lmnb batch: warning: {args.input} has no input rows (an empty file?); nothing to run")
        unread = args.limit is not None and len(rows) > args.limit  # rows past --limit, kept as they are
        if args.limit is not None:
            rows = rows[: args.limit]
        store = ResultStore(args.output, args.id_field, self.settings(), code_fingerprint(run_row))
        try:
            store.open(retry_errors=args.retry_errors)
            if store.made_folder is not None:
                say(f"lmnb batch: created the folder {store.made_folder} (it did not exist) for {args.output}")
            if store.other_script:  # kept (an edit that fixes failed rows must not discard the good ones), but said
                n = store.other_script
                plural = n > 1
                say(f"lmnb batch: {n} row{'s' if plural else ''} in {args.output} {'were' if plural else 'was'} "
                    f"run by another version of this script (its code changed since) and {'are' if plural else 'is'} "
                    "kept; to run every row on this version, write to a new output file (--retry-errors runs the "
                    "failed ones again)")
            return RowRunner(self, args, store, rows, run_row, programs, backend, unread=unread).run()
        except BrokenPipeError:  # stderr (progress, summary) went to a pipe that closed: stop as SIGPIPE does
            silence_stream("stdout")
            silence_stream("stderr")
            return EXIT_BROKEN_PIPE
        except (StoreError, OSError) as e:
            return fatal(str(e))
        except KeyboardInterrupt:
            store.drop_if_unwritten()  # (as a backend that fails to start: an empty file reads as a run of no rows)
            say("lmnb batch: interrupted before the rows started")
            return EXIT_INTERRUPTED
        finally:
            store.close()

    def _paths_from_start_folder(self) -> None:
        """Where a set-up cell changed the folder (``os.chdir``), read the paths of the command line
        from the folder it ran in, as the user gave them and as the check of ``--output`` before the
        set-up cells did (``_check_resume``): ``--input``, ``--output`` and a ``--model`` directory
        there (else the notebook's ``%lm load`` one, the default ``--model``, which the check of
        the model before the set-up cells read there too, ``_check_backend``; with no model named,
        ``$LMNB_MODEL``'s, in this process's environment) become absolute paths. The job read the
        rows and wrote the results in the new folder, where the check had read another file. A
        model that is no path there (a hub id) stays as it is."""
        start, args = self._start_folder, self.args
        if start is None or _current_folder() in (start, None):
            return
        if self.per_row:
            args.input, args.output = Path(start, args.input), Path(start, args.output)
        if args.model and os.path.exists(os.path.join(start, args.model)):
            args.model = os.path.join(start, args.model)
        if not args.model and self.default_model and os.path.exists(os.path.join(start, self.default_model)):
            self.default_model = os.path.join(start, self.default_model)
        env_model = os.environ.get(MODEL_ENV)
        if not (args.model or self.default_model) and env_model and os.path.exists(os.path.join(start, env_model)):
            # (the engine, and the records' settings, read it after the set-up cells, as they read --model)
            os.environ[MODEL_ENV] = os.path.join(start, env_model)

    def _parameter_fields(self, rows) -> Optional[str]:
        """The error for input rows that hold a field named like a notebook parameter that is no
        row field (None if none do): the job ran every such row with the parameter's one value and
        wrote the results as ok, so `{"person": "Corin"}` rows of an export of 01-quickstart all
        answered for the default "Arvel", without a word."""
        params = [n for n in self.parameter_values if n not in self.inputs and n != self.args.id_field]
        seen = {k for row in rows if row.error is None for k in row.fields}
        fields = [n for n in params if n in seen]
        if not fields:
            return None
        options = parameter_options(fields, self.per_row)
        listed = ", ".join(f"{n!r} ({options[n]} {self.parameter_values[n]!r})" for n in fields)
        plural = len(fields) > 1
        reexport = self._reexport(",".join(self.inputs + fields))
        return (f"the input rows have the field{'s' * plural} {listed}, but {'they are' if plural else 'it is'} "
                f"the notebook's parameter{'s' * plural}, set once for the whole job by "
                f"{'their options' if plural else 'its option'}, not read from each row; to read "
                f"{'them' if plural else 'it'} from the rows, export again with {reexport}; "
                f"to use the option, leave the field{'s' * plural} out of the input")

    def _reexport(self, names: str) -> str:
        """``reexport`` with the row fields ``names`` (``"a,b"``) in place of its last NAMES."""
        head, found, tail = self.reexport.rpartition("NAMES")
        return head + names + tail if found else self.reexport


def _current_folder() -> Optional[str]:
    """``os.getcwd()``, or None where the folder is gone (removed while the job ran)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _output_is_input(args: argparse.Namespace) -> str:
    """The error for an ``--output`` that names the ``--input`` file (``_same_file``)."""
    return f"--output {args.output} is the input file; write the results to another file"


def _same_file(a: Path, b: Path) -> bool:
    """Whether the paths ``a`` and ``b`` name one existing file; False where either cannot be looked
    at (a folder on the way that may not be read: each option's own check names it)."""
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def _is_demo_model(model: Optional[str]) -> bool:
    """Whether ``model`` (a ``--model`` or a notebook's) names the built-in demo model: its name
    (``lmnb_engine.is_demo_name``) or its directory, however spelt."""
    return is_demo_name(model) or bool(model) and os.path.isdir(model) and os.path.realpath(model) == _demo_model_dir()


def _demo_model_dir() -> str:
    """The real path of the built-in demo model's directory (``lmnb_engine/demo_model``), found
    without importing the engine (which imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("lmnb_engine")
    return os.path.realpath(os.path.join(list(spec.submodule_search_locations)[0], "demo_model"))


def _unknown_id_field(rows: Sequence[Any], id_field: Optional[str]) -> Optional[str]:
    """Why ``--id-field`` cannot key ``rows`` (the rows ``read_rows`` gives), or None: no row that
    could be read has the field, so it is a misspelt or wrong option (each row was refused alone,
    a bad_input record and a stderr line per row), named with the fields the rows do have."""
    fields = [row.fields for row in rows if row.error is None]
    if id_field is None or not fields or any(id_field in f for f in fields):
        return None
    from lmnb_engine.suggest import close_match

    names = sorted({str(k) for f in fields for k in f})
    meant = close_match(id_field, names)
    shown = ", ".join(map(repr, names[:10])) + (", ..." if len(names) > 10 else "") if names else "none"
    return (f"--id-field {id_field}: no input row has a field {id_field!r}"
            f"{f' (did you mean {meant!r}?)' if meant else ''}; the rows' fields: {shown}. Give the field "
            "that holds each row's id, or leave --id-field out to key rows by their position")
