"""``lmnb run NOTEBOOK [-o OUT] [-p NAME VALUE]``: execute a notebook headless with the lmnb kernel.

``run_client.Client`` (nbclient) runs every cell in a fresh ``lmnb`` kernel (started from this
Python, installed or not), the executed notebook is saved — also when a cell fails, so nothing is
lost — and a summary is printed: cells run, tokens and the radix-cache hit rate, read from the ``lmnb`` metadata that each
``%%lm`` cell's summary output carries. ``-p`` injects parameters after the cell tagged
``parameters``, as papermill does (research/jupyter.md §4.4). Ctrl-C interrupts the running cell,
as JupyterLab's stop button does, and ends the run; a second Ctrl-C shuts the kernel down. One
that comes while no cell's code runs (before the first cell, or once a cell's reply is in) ends
the run before the next cell, and one after the last cell's reply stops nothing (``CtrlC``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import signal
import sys
import threading
import time
import unicodedata
from pathlib import Path
from types import SimpleNamespace

from lmnb.export.cells import (Code, Dropped, ExportError, LMCell, cell_tags, is_lm_cell, python_cell, read_cells,
                               unknown_cell_notes)
from lmnb.export.parameters import NO_DEFAULT, read_parameters
from lmnb_engine.cli_options import Once, OnceFlag, digits_fix, option_number, take_negative_numbers
from lmnb_engine.suggest import close_match
from lmnb_kernel.cell_failure import describe_failure, with_note
from lmnb_kernel.install import KERNEL_NAME, kernel_spec


EXIT_CELL_ERROR = 3
EXIT_STATUSES = ("0 every cell ran (with --allow-errors: also when some raised); 1 a cell ran past --timeout, "
                 "the kernel died or did not start, or a %%lm cell's view is saved unfinished (the kernel's last "
                 "update of it never came: the kernel was killed); 2 the notebook cannot be read, the output cannot be "
                 f"written, or a -p cannot be used; {EXIT_CELL_ERROR} a cell raised an error (the "
                 "report names the cell and shows the error's frames in the notebook's cells); 130 Ctrl-C or SIGTERM "
                 "before the last cell finished (one that comes after it stops nothing, and the status is the run's "
                 "own, as without it: the notebook is saved whole)")


def run_arguments(parser) -> None:
    """Options of ``lmnb run``, with the exit statuses as the help's epilog."""
    parser.epilog = f"exit status: {EXIT_STATUSES}"
    take_negative_numbers(parser)  # (--timeout -1: refused as a number, not as an unknown option)
    parser.add_argument("notebook", help="the .ipynb to execute")
    parser.add_argument("-o", "--output", action=Once,
                        help="where to save the executed notebook (default: NAME.out.ipynb; "
                             "-: stdout, and the summary goes to stderr)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="set a parameter (or -p NAME=VALUE; VALUE may start with '-': -p name -Bob, and is "
                             "one of lmnb run's options only as -p NAME=VALUE: -p name=-o), read "
                             "like its default in the parameters cell as the exported job reads it (else a Python "
                             "literal, else the text); repeatable, once per NAME")
    _read_parameters_first(parser)
    parser.add_argument("--timeout", type=_seconds, default=1800, action=Once,
                        help="seconds one cell may take, and then its last output (default 1800; 0: no limit)")
    parser.add_argument("--allow-errors", action=OnceFlag, help="keep going after a failing cell")


def _read_parameters_first(parser) -> None:
    """Make ``parser`` take each ``-p`` out of the arguments before argparse reads them:
    ``-p NAME VALUE`` takes VALUE whatever it starts with (argparse read the -Bob of ``-p name
    -Bob`` as an option, and said "expected 2 arguments"), and ``-p NAME=VALUE`` is one argument
    (NAME, a Python name, holds no "="). A VALUE that is one of ``lmnb run``'s own options (``-p n -o
    out.ipynb``: n's value forgotten, which took -o, and out.ipynb then read as a second notebook or
    lost) is refused, naming ``-p n=-o`` for that text: papermill's ``-p`` takes any next word, and
    a forgotten value there silently takes the option. The others go to argparse; ``--`` ends the
    options."""
    parse_known_args = parser.parse_known_args

    def is_parameter(arg: str) -> bool:  # -p, --parameter, or an abbreviation argparse allows
        return arg == "-p" or arg.startswith("--p") and "--parameter".startswith(arg) and (
            arg == "--parameter" or parser.allow_abbrev)

    def option_named(word: str):  # the option of lmnb run that word is, as argparse reads it, else None
        given = word.partition("=")[0] if word.startswith("--") else word  # (--timeout=5: --timeout)
        for action in parser._actions:  # (complete by the time it parses: every option is added)
            for option in action.option_strings:
                # (--out, an abbreviation of --output: argparse's, or, where it takes none, one the
                # user surely meant, which n would otherwise take with out.ipynb left over)
                if option == given or (given.startswith("--") and len(given) > 2 and option.startswith(given)):
                    return action
                # argparse reads -oout.ipynb and -o=out.ipynb as -o with that value (-pm=3 as -p m=3); a
                # flag's -hello it refuses itself, and -Bob names no option
                if (not given.startswith("--") and option == given[:2] and len(given) > 2
                        and action.nargs != 0):
                    return action
        return None

    def attached(arg: str):  # -pNAME[=VALUE], -p=NAME..., --parameter=NAME...: the words after -p, else None
        if arg.startswith("-p") and not arg.startswith("--") and len(arg) > 2:
            return arg[3:] if arg[2] == "=" else arg[2:]
        option, equals, word = arg.partition("=")
        return word if equals and option.startswith("--") and is_parameter(option) else None

    def parse(args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        given, rest, i = [], [], 0
        while i < len(args):
            if args[i] == "--":
                rest += args[i:]
                break
            word = attached(args[i])
            if word is not None:  # (argparse's attached forms: read as -p followed by that word)
                args[i:i + 1] = ["-p", word]
            if not is_parameter(args[i]):
                rest.append(args[i])
                i += 1
            elif i + 1 < len(args) and args[i + 1][:1] == "-" and args[i + 1] != "-":  # (-p -o out.ipynb)
                parser.error(f"argument -p/--parameter: expected NAME VALUE or NAME=VALUE after {args[i]}, and "
                             f"{args[i + 1]!r} looks like an option, not a variable name; e.g. -p n 3 or -p n=3")
            elif i + 1 < len(args) and "=" in args[i + 1]:
                given.append(args[i + 1].split("=", 1))
                i += 2
            elif i + 2 < len(args) and (action := option_named(args[i + 2])) is not None:  # (-p n -o out.ipynb)
                name, value = args[i + 1], args[i + 2]  # (n's value forgotten)
                option = "/".join(action.option_strings)
                given = value.partition("=")[0]
                full = next((o for o in action.option_strings if o.startswith(given) and o != given), None)
                if full is None or parser.allow_abbrev:
                    is_option, spelled = f"is lmnb run's option {option}", value
                else:  # (no abbreviation is taken: the example spells the option out)
                    is_option, spelled = f"cuts short lmnb run's option {option}, which is written in full", full
                parser.error(f"argument -p/--parameter: {args[i]} {name} takes {value!r} as its value, but {value!r} "
                             f"{is_option}: give {name} its value first (e.g. -p {name} 3 {spelled} ...), or write "
                             f"-p {name}={value} if the value is the text {value!r}")
            elif i + 2 < len(args):
                given.append([args[i + 1], args[i + 2]])
                i += 3
            else:
                parser.error(f"argument -p/--parameter: expected NAME VALUE or NAME=VALUE after {args[i]}")
        namespace, extra = parse_known_args(rest, namespace)
        namespace.parameter = given
        return namespace, extra

    parser.parse_known_args = parse


def run(args) -> int:
    """Execute, save, print the summary. Returns an exit status (``EXIT_STATUSES``); the executed
    notebook is saved in every case but 2. A cell that raised is reported by
    ``cell_failure.describe_failure``: its number and first line, the error, its frames."""
    from lmnb.export import folder_given, notebook_path_problem, read_notebook, unnamed_output
    from lmnb.output_paths import OutputInUse, lock_output, make_folders, why_unwritable

    # Python reads a name as its NFKC form (-p ｘ sets x), as the injected cell's names are read
    parameters = [(unicodedata.normalize("NFKC", name), name, text) for name, text in args.parameter]
    names = [name for name, _, _ in parameters]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:  # (the last value would win silently, as a repeated option's did)
        spellings = list(dict.fromkeys(typed for name, typed, _ in parameters if name == twice))
        same = f" ({' and '.join(spellings)} are one name to Python)" if len(spellings) > 1 else ""
        print(f"lmnb run: -p {twice} is given twice{same}; give it once", file=sys.stderr)
        return 2
    from lmnb.template.parser import is_reserved

    bad = [typed for name, typed, _ in parameters if not name.isidentifier() or is_reserved(name)]
    if bad:  # the injected cell would be a SyntaxError, found only once the kernel has started
        print(f"lmnb run: -p {bad[0]!r} is not a Python variable name; name a variable the notebook sets",
              file=sys.stderr)
        return 2
    src = Path(args.notebook)
    problem = notebook_path_problem(src)
    if problem:
        print(f"lmnb run: {problem}", file=sys.stderr)
        return 2
    default = src.with_suffix(".out.ipynb")
    unnamed = unnamed_output(args.output, default)
    if unnamed:
        print(f"lmnb run: {unnamed}", file=sys.stderr)
        return 2
    # papermill's and lmnb export's "-": the notebook on stdout (None); ./- is a file named -
    to_stdout = args.output == "-"
    out = None if to_stdout else Path(args.output) if args.output else default
    try:
        nb = read_notebook(src)
    except (OSError, ValueError) as e:  # (read_notebook: a ValueError names what is wrong and the fix)
        print(f"lmnb run: cannot read {src}: {e}", file=sys.stderr)
        return 2
    language = _kernel_language(nb)
    if language is not None and not language.lower().startswith("python"):  # (its cells ran as Python: NameErrors)
        print(f"lmnb run: the kernel of {src} is for {language}, and lmnb run executes Python cells on the lmnb "
              "kernel; run it with its own kernel (jupyter nbconvert --execute)", file=sys.stderr)
        return 2
    folder = folder_given(args.output or "", default.name)
    if folder:  # (before the run: it would be lost at the end)
        print(f"lmnb run: {folder}", file=sys.stderr)
        return 2
    # (-o job.py, a slip for lmnb export; an .ipynb is replaced, even one a failed save left cut short)
    in_the_way = None if out is None or out.suffix.lower() == ".ipynb" else _no_notebook_at(out)
    if in_the_way == "held":
        print(f"lmnb run: {OutputInUse(out)}", file=sys.stderr)
        return 2
    if in_the_way == "file":
        print(f"lmnb run: {out} exists and is not a notebook, which the executed notebook would replace; name "
              f"a .ipynb file with -o (e.g. -o {default}), or move {out} away first",
              file=sys.stderr)
        return 2
    values = {}
    defaults = parameter_defaults(nb) if parameters else {}
    for name, typed, text in parameters:
        try:
            values[name] = parse_value(text, defaults.get(name, NO_DEFAULT))
        except ValueError as e:
            shown = text if len(text) <= 60 else text[:60] + "…"  # (a value of 5000 digits was written out whole)
            print(f"lmnb run: -p {typed} {shown!r}: {e}", file=sys.stderr)
            return 2
    # (the folders are made after every check: a refused run left them behind, empty)
    lock, made_file = None, False
    try:  # before the run: a path that cannot be written would lose it at the end
        if not to_stdout:
            made = make_folders(out)
            if made is not None:
                print(f"lmnb run: created the folder {made} (it did not exist) for {out}", file=sys.stderr)
            # held to the end: a second run writing the same file, which one of the two would lose,
            # is refused before its kernel starts, as a batch job's second writer is. (Its open is the
            # test that the path can be written: os.access says yes to root on a read-only file
            # system, or under /proc.)
            made_file = not out.exists()
            lock = lock_output(out)
    except OutputInUse as e:
        print(f"lmnb run: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lmnb run: cannot write {out}: {why_unwritable(out, e)}; give -o a path in a folder you can write "
              f"to (e.g. -o {default.name})", file=sys.stderr)
        return 2
    try:
        return _execute(args, nb, src, out, values)
    finally:
        if lock is not None:
            _unlock(lock, out, made_file)


def _execute(args, nb, src: Path, out: Path | None, values: dict) -> int:
    """``run``'s run of ``nb`` (read from ``src``) with the parameters ``values`` injected, once its
    checks passed and the output ``out`` (None: stdout) is locked. Returns the exit status."""
    from jupyter_core.utils import run_sync
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from lmnb_kernel.run_client import Client

    to_stdout = out is None
    # (in the notebook's own numbering: before a parameters cell is injected; said as the exports say it)
    for note in unknown_cell_notes(nb.cells, done="not run, kept as it is in the executed notebook"):
        print(f"lmnb run: {src}: {note}", file=sys.stderr)
    injected = inject_parameters(nb, values) if values else None
    clear_outputs(nb)

    def cell_name(number: int) -> str:
        # in the source notebook's numbering, which the user edits, and the saved one's where the injected
        # parameters cell shifted it: the saved notebook, where the outputs are, numbers the cells from there on
        if injected is None or number - 1 < injected:
            return f"cell {number}"
        saved = f"cell {number} in the saved notebook"
        return f"the injected parameters cell ({saved})" if number - 1 == injected else f"cell {number - 1} ({saved})"

    # Headless: no one watches live widgets or their frames, so cells update their output in place,
    # rarely. The setting goes to the kernel's environment only, never into this process's os.environ.
    env = {**os.environ, "LMNB_VIEW": os.environ.get("LMNB_VIEW", "headless")}
    # Our manager, not one nbclient owns: on SIGINT nbclient cleans up an owned one twice and fails
    # on an assertion. Its signal handler still shuts the kernel down on a Ctrl-C or SIGTERM before
    # the kernel is up, when CtrlC takes both over; the end of the run, we do.
    km = kernel_manager()
    ctrl_c = CtrlC(km, cell_name)
    # cell number -> error name of each cell whose execute reply was an error: a UsageError (a
    # misspelt %%lm option, an unknown %lm subcommand) leaves no error output, only stderr text
    errors: dict[int, str] = {}

    def on_cell_error(cell, cell_index, execute_reply, **_) -> None:
        errors[cell_index + 1] = execute_reply.get("content", {}).get("ename") or "error"

    ended: list[int] = []  # the cells that ended (their reply came), whose views should be final

    def on_cell_executed(cell, cell_index, **kwargs) -> None:
        ended.append(cell_index + 1)
        ctrl_c.ended(cell, cell_index)

    client = Client(
        nb, km=km, timeout=cell_timeout(args.timeout), startup_timeout=120, allow_errors=args.allow_errors,
        iopub_timeout=cell_timeout(args.timeout), resources={"metadata": {"path": str(src.resolve().parent)}},
        on_notebook_start=ctrl_c.install, on_cell_execute=ctrl_c.starting, on_cell_executed=on_cell_executed,
        on_cell_error=on_cell_error, on_notebook_complete=ctrl_c.complete,
    )
    ctrl_c.client = client
    t0 = time.monotonic()
    failed, status = None, 0
    still_running = False  # a cell nbclient stopped waiting for (--timeout) may still run in the kernel
    timed_out = None  # the cell nbclient stopped at --timeout (its error is the KeyboardInterrupt that stopped it)
    found = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        # With -o -, the kernel's own fd 1 (native code's prints, not a cell's output) goes to
        # stderr, so that stdout holds the notebook alone.
        client.execute(env=env, **({"stdout": 2} if to_stdout else {}))
    except CellTimeoutError:
        still_running = True
        if ctrl_c.count:
            failed, status = f"interrupted ({ctrl_c.name}) in {cell_name(ctrl_c.cell_number)}; it did not stop", 130
        else:
            failed, status = (f"{cell_name(ctrl_c.cell_number)} ran longer than --timeout {args.timeout:g} s; "
                              "give a larger --timeout (0: no limit)"), 1
            timed_out = ctrl_c.cell_number
    except DeadKernelError:
        # On a second Ctrl-C, a cell that did not stop after the first, or SIGTERM (CtrlC's handler,
        # or nbclient's at start-up, which notes the future it started), the kernel is shut down, so
        # the cell then ends as if the kernel had died.
        # (before the first cell: in nbclient's wait for the kernel's info, once CtrlC has taken over)
        which = None if ctrl_c.cell_number is None else cell_name(ctrl_c.cell_number)
        during = "before any cell ran" if which is None else f"while {which} ran"
        if ctrl_c.forced:
            failed, status = (f"interrupted (Ctrl-C); {which} did not stop within "
                              f"{CtrlC.GRACE_S:g} s, so the kernel was shut down"), 130
        elif ctrl_c.count > 1 or getattr(client, "_async_cleanup_kernel_future", None) is not None:
            how = "SIGTERM" if ctrl_c.terminated else "Ctrl-C twice" if ctrl_c.count > 1 else "Ctrl-C or SIGTERM"
            failed, status = f"interrupted ({how}) {during}; the kernel was shut down", 130
        else:
            failed, status = f"the kernel died {during} (out of memory, or a crash in native code)", 1
    except Interrupted:  # a Ctrl-C or SIGTERM stopped the run (CtrlC's hooks)
        failed, status = ctrl_c.where_stopped("written out" if to_stdout else "saved"), 130
    except CellExecutionError as e:  # the cell raised (on its own: one a Ctrl-C interrupted is Interrupted)
        cell = nb.cells[ctrl_c.cell_number - 1]  # (the cell hooks noted the cell it raised in)
        failed, status = describe_failure(cell, cell_name(ctrl_c.cell_number), e.ename, e.evalue), EXIT_CELL_ERROR
    except RuntimeError as e:  # e.g. "Kernel didn't respond in 120 seconds" at start-up
        failed, status = f"the lmnb kernel failed: {e}", 1
    except (KeyboardInterrupt, asyncio.CancelledError):  # outside a cell (kernel start-up)
        failed, status = "interrupted while the lmnb kernel was starting; no cell ran", 130
    finally:
        # From here the run ends on its own within seconds (the saves, the kernel's shutdown, the last
        # read): a Ctrl-C or SIGTERM is ignored, and the run's report and status stand. nbclient's end
        # had put Python's defaults back: one in the first save (a large notebook's takes a while)
        # ended the process, a SIGTERM silently with 143 and the kernel orphaned, a Ctrl-C with
        # "lmnb: interrupted" and no report. The handlers the run found are given back after it.
        with _signals_ignored(signal.SIGINT, signal.SIGTERM, restore=found):
            # Saved before the shutdown (which may take seconds), and again after it: the run's reader
            # of the kernel's output (left running on its event loop, which the shutdown's wait runs)
            # adds what the kernel sent until it exited: a cell still running past --timeout, which
            # the shutdown interrupts and waits for, its KeyboardInterrupt and an %%lm view's last
            # state; a thread's late print; output still on its way. (To stdout it is written once,
            # after the shutdown.)
            saved = None
            try:
                if not to_stdout:
                    saved = save(nb, out)
            finally:
                try:
                    # (after the shutdowns a Ctrl-C, SIGTERM or nbclient's handler started, which it awaits)
                    _shutdown(km, busy=failed is not None, running=still_running,
                              pending=(ctrl_c.stopping, getattr(client, "_async_cleanup_kernel_future", None)))
                finally:
                    try:
                        # (a Ctrl-C or SIGTERM ends the read, its own loop handlers', and the run goes on to
                        # its report and status. Taken away, those leave Python's defaults, not the ignore
                        # around the tail: this block sets that again for the last save and the clean-up)
                        with _signals_ignored(signal.SIGINT, signal.SIGTERM):
                            run_sync(client.read_last_output)()
                        saved = save(nb, out if saved is None else saved)  # (again where the first save went)
                    finally:
                        if client.kc is not None:  # (nbclient stops its channels only for a manager it owns)
                            client.kc.stop_channels()
                        km.cleanup_connection_dir()
                        # nbclient leaves its exit hook registered when the kernel dies at start-up; run at
                        # exit, it failed on an assertion and printed "Exception ignored in atexit callback"
                        atexit.unregister(client._cleanup_kernel)
    where = "stdout" if to_stdout and saved == out else saved
    cut_short = {number: unfinished_view(nb.cells[number - 1]) for number in ended}
    cut_short = {number: said for number, said in cut_short.items() if said is not None}
    print(summary(nb, src, where, time.monotonic() - t0, cell_name, timed_out, errors, cut_short, injected),
          file=sys.stderr if to_stdout else sys.stdout)
    if failed is None and ctrl_c.came is not None:  # (it stopped nothing: the run's own status stands)
        print(f"lmnb run: {ctrl_c.came_after_the_last()}", file=sys.stderr)
    if failed is not None:
        print(f"lmnb run: {failed}\n(outputs so far are {'written to' if where == 'stdout' else 'saved in'} "
              f"{where})", file=sys.stderr)
    elif cut_short:  # the cells ran, but the notebook saved does not show how they ended
        cells = ", ".join(with_note(cell_name(number), f"it says {said!r}") for number, said in cut_short.items())
        many = len(cut_short) > 1
        print(f"lmnb run: the %%lm view{'s' * many} of {cells} {'written to' if where == 'stdout' else 'saved in'} "
              f"{where} {'are' if many else 'is'} unfinished, with no summary: the kernel's last update of "
              f"{'them' if many else 'it'} never came, neither within --timeout {args.timeout:g} s after the cell "
              f"ended nor before the kernel exited (it was killed); run the "
              "notebook again", file=sys.stderr)
        status = 1
    return 2 if saved != out and status == 0 else status


FINAL_STATUSES = ("done", "error", "interrupted")  # a RunView's status once finish() froze it


def unfinished_view(cell) -> str | None:
    """The status a ``%%lm`` run view in ``cell``'s saved outputs says when it is not final
    ("running", "loading", "stopping": the update that froze it never came), else None."""
    for output in cell.get("outputs", []):
        meta = output.get("metadata", {}).get("lmnb", {})
        if meta.get("view") == "run" and meta.get("status") not in FINAL_STATUSES:
            return str(meta.get("status"))
    return None


def _unlock(lock: int, out: Path, made: bool) -> None:
    """Release the lock ``lock`` (``lock_output``'s descriptor) on ``out``; where the run ``made``
    the file and wrote nothing to it (stopped before its kernel started), remove it, as a run
    refused before it leaves none: only the file the lock holds (a link's target, not the link)."""
    from lmnb.output_paths import remove_if_unwritten

    try:
        if made:
            remove_if_unwritten(lock, out)
    finally:
        os.close(lock)


def _kernel_language(nb) -> str | None:
    """The language of ``nb``'s kernel (its kernelspec's, else its language_info's), None when it
    names none."""
    meta = nb.get("metadata") or {}
    spec, info = meta.get("kernelspec"), meta.get("language_info")  # (either may be null, or not an object)
    language = (spec.get("language") if isinstance(spec, dict) else None) or \
        (info.get("name") if isinstance(info, dict) else None)
    return language if isinstance(language, str) and language else None


def _no_notebook_at(out: Path) -> str | None:
    """What stands at the output ``out`` (not an .ipynb) that the executed notebook must not replace:
    "held", an empty file that another run holds (the file that run made as it took its lock on it,
    which it writes its notebook to at its end: that run is in the way); "file", a file that is no
    notebook; None for no file, or a notebook. A file gone while it is looked at is no file: the
    run that made it, empty, stopped before its kernel started and removed it (that was a
    FileNotFoundError traceback)."""
    from lmnb.output_paths import held_by_another

    try:
        if not out.is_file() or _is_notebook(out):
            return None
        if out.stat().st_size == 0 and held_by_another(out):
            return "held"
        return "file" if out.exists() else None  # (held_by_another says no for a file gone meanwhile)
    except FileNotFoundError:
        return None


def _is_notebook(path: Path) -> bool:
    """Whether ``path`` reads as a notebook (an earlier run's output, which a run may replace)."""
    from lmnb.export import read_notebook

    try:
        read_notebook(path)
    except (OSError, ValueError):
        return False
    return True


def save(nb, out: Path | None) -> Path | None:
    """Write the executed ``nb`` to ``out`` (None: stdout); when that fails (the disk filled up,
    the folder went away during the run, a closed pipe), to a new file in the temporary folder
    instead, saying so, so the run's work is not lost. Returns the path written (None: stdout)."""
    import tempfile

    import nbformat

    # A lone surrogate (a markdown cell's broken character, read from a "\ud800" escape) is
    # written as that escape again: backslashreplace writes it so, and JSON holds it only in strings.
    try:
        if out is None:
            text = nbformat.writes(nb) + "\n"  # (as nbformat.write ends a file)
            sys.stdout.write(text.encode("utf-8", "backslashreplace").decode("utf-8"))
            sys.stdout.flush()
        else:
            with open(out, "w", encoding="utf-8", errors="backslashreplace") as f:
                nbformat.write(nb, f)
        return out
    except OSError as e:
        fd, fallback = tempfile.mkstemp(prefix=f"{'stdout' if out is None else out.stem}-", suffix=".ipynb")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            nbformat.write(nb, f)
        print(f"lmnb run: cannot save {'to stdout' if out is None else out}: {e}; the executed notebook "
              f"is saved in {fallback} instead",
              file=sys.stderr)
        return Path(fallback)


def _seconds(text: str) -> float:
    """``--timeout``: a number of seconds, 0 (or ``inf``) for no limit.

    Raises:
        argparse.ArgumentTypeError: not a number in ASCII digits (``option_number``), or below 0."""
    import argparse

    value = option_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}{digits_fix(text, number=True)}")
    if not value >= 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more seconds, got {text!r}")
    return value


def cell_timeout(seconds: float) -> int | None:
    """nbclient's ``timeout`` for ``--timeout seconds``: whole seconds, rounded up (its trait takes
    only an int: 2.5 was a TraitError traceback), None for no limit (0, inf)."""
    if not seconds or math.isinf(seconds):
        return None
    return math.ceil(seconds)


def _shutdown(km, busy: bool, running: bool = False, pending=()) -> None:
    """Shut the kernel down and wait for it (left running, it would notice this process exit and
    stop on its own, after it). A kernel that may still run a cell (``busy``: the run failed) is
    interrupted first: shut down mid-cell, it prints a traceback when the cell ends. A cell known
    to be running (``running``: past --timeout) is given up to ``STOP_S`` to end: a ``%%lm --python``
    body stops half a second after the interrupt, past the 0.5 s waited before, so the kernel was
    shut down mid-cell and printed a ZMQ traceback into the run's output.

    ``pending``: shutdowns already started (tasks, or None), awaited first, their errors dropped: one
    running alongside this one made both fail on ZMQError. When this one fails all the same (a
    kernel already going), the kernel is killed; a kill that fails too is said in one line."""
    from jupyter_core.utils import run_sync

    async def stop() -> None:
        for task in pending:
            if task is not None:
                try:
                    await task
                except (Exception, asyncio.CancelledError):  # (it was retrieved: no "never retrieved")
                    pass
        try:
            if km.has_kernel and await km.is_alive():
                if running:
                    await _interrupt_and_wait_idle(km, STOP_S)
                elif busy:
                    await km.interrupt_kernel()
                    await asyncio.sleep(0.5)  # for the cell to end (its reply has no reader; no harm)
                await km.shutdown_kernel()
        except Exception:  # e.g. zmq.ZMQError "Operation not supported": its sockets already closed
            try:
                if km.has_kernel:
                    await km.shutdown_kernel(now=True)
            except Exception as e:
                print(f"lmnb run: could not shut the kernel down ({type(e).__name__}: {e}); "
                      "it may still be running", file=sys.stderr)

    # A Ctrl-C now would cut the shutdown short, leave the manager broken and print its traceback,
    # and a SIGTERM ended the process with 143 and no report (the kernel left to notice it); the
    # kernel stops within seconds (killed after the manager's wait), so neither is taken.
    with _signals_ignored(signal.SIGINT, signal.SIGTERM):
        run_sync(stop)()


@contextlib.contextmanager
def _signals_ignored(*signals: signal.Signals, restore: dict | None = None):
    """Ignore ``signals`` inside the block (in the main thread only: elsewhere Python sets no
    handlers), giving their handlers back after it: the ones found, or those ``restore`` (signal
    number -> handler, as ``signal.getsignal`` gives; None: one not set from Python, left ignored)
    names."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in signals}
    try:
        yield
    finally:
        for number, handler in {**previous, **(restore or {})}.items():
            if handler is not None:
                signal.signal(number, handler)


STOP_S = 5.0  # how long a cell still running at --timeout is given to end after the interrupt


async def _interrupt_and_wait_idle(km, limit: float) -> None:
    """Interrupt the kernel and wait, up to ``limit`` seconds, for it to say it is idle (the
    interrupted cell ended)."""
    kc = km.client()
    kc.start_channels()
    try:
        await asyncio.sleep(0.2)  # (a subscriber that joins late misses what is sent before)
        await km.interrupt_kernel()
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await kc.get_iopub_msg(timeout=left)
            except Exception:  # (queue.Empty at the limit)
                return
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                return
    finally:
        kc.stop_channels()


class Interrupted(Exception):
    """Raised into nbclient (from a cell hook) to end the run after a Ctrl-C."""


class CtrlC:
    """Ctrl-C while ``lmnb run`` runs a cell: the first one interrupts the kernel (SIGINT, as
    JupyterLab's stop button does), so the cell ends with ``KeyboardInterrupt`` and keeps its
    partial output, and the run stops there, with ``--allow-errors`` too. A second one shuts the
    kernel down, for a cell that does not stop; so does a cell still running ``GRACE_S`` after
    the first (an interrupt that lands in ipykernel outside the cell's code loses the cell's
    reply, which nbclient would wait for until ``--timeout``). (nbclient's own handler shuts the
    kernel down at once: the cell's reply was lost and the kernel printed a ZMQ traceback.) The
    kernel runs in a session of its own, so the terminal's Ctrl-C reaches only this process.
    SIGTERM counts as the second Ctrl-C: nbclient's handler asked a busy kernel to shut down
    (it printed a ZMQ traceback when the cell ended) while the run's own shutdown of the same
    kernel ran, and failed on ZMQError without a summary.

    Where no cell's code runs, nothing is interrupted, and the run stops before the next cell
    (``where_stopped`` says where): before the first one (the kernel has started), or once a
    cell's reply has come (its code has ended in the kernel), whose output, still awaited (up to
    ``--timeout``), is awaited no longer (``stop_output_wait`` of ``client``). One after the last
    cell's reply, or in nbclient's end of the run, stops nothing: every cell ran, and the run ends
    as it would have, saying so (``came``, ``came_after_the_last``). ``cell_name(number)`` names
    the cell at 1-based ``number``, as ``run`` reports it."""

    GRACE_S = 30.0  # long enough for an %%lm cell to abort its requests, or a model load to end

    def __init__(self, km, cell_name=lambda number: f"cell {number}"):
        self.km, self.count, self.cell_number = km, 0, None  # cell_number: the cell started last (1-based)
        self.cell_name = cell_name
        self.forced = self.terminated = False
        self._grace = None
        self.stopping = None  # the task that kills the kernel, once one was started
        self.client = None  # the notebook's client (run_client.Client), whose wait for a cell's output a Ctrl-C ends
        self._cell = None  # the running cell (between its on_cell_execute and on_cell_executed), else None
        self.interrupted = None  # the number of the cell the first Ctrl-C or SIGTERM came in, before its reply
        self.before = None  # the number of the cell whose start the run stopped at, after a Ctrl-C outside a cell
        self.came = None  # "Ctrl-C" or "SIGTERM": the first signal, where it came outside a cell (it stopped none)

    def install(self, notebook) -> None:
        """``on_notebook_start``: once the kernel is up, replace nbclient's SIGINT and SIGTERM handlers."""
        try:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
            loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        except (NotImplementedError, RuntimeError):  # no signal handlers (Windows, not the main thread)
            pass

    def starting(self, cell, cell_index, **_) -> None:
        """``on_cell_execute``: remember the cell, which now runs; after a Ctrl-C, end the run before it."""
        if self.count:
            if self._grace is not None:
                self._grace.cancel()
            self.before = cell_index + 1
            raise Interrupted(f"interrupted before cell {self.before}")
        self.cell_number, self._cell = cell_index + 1, cell

    def ended(self, cell, cell_index, **_) -> None:
        """``on_cell_executed``: the cell has ended; if a Ctrl-C came while its code ran, end the run."""
        self._cell = None
        if self.interrupted == cell_index + 1:
            if self._grace is not None:
                self._grace.cancel()
            raise Interrupted(f"interrupted in cell {self.interrupted}")

    def complete(self, notebook) -> None:
        """``on_notebook_complete``, in nbclient's end of the run (every cell ran, or the run
        stopped): from here a Ctrl-C or SIGTERM is noted (``came``) and stops nothing, as in the
        run's own end after it. nbclient's removal of its handlers, which follows, put Python's
        defaults back, under which one raised KeyboardInterrupt (reported as an interrupt while the
        kernel started, no cell run) or ended the process by SIGTERM, with no report: the loop's
        handlers are removed here, so that nbclient's removal finds none and leaves these."""
        if threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(RuntimeError):  # (no event loop running: nothing to remove)
            loop = asyncio.get_running_loop()
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(number)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self._noted)

    def _noted(self, signum, frame) -> None:
        if self.came is None and not self.count:
            self.came = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"

    def _on_sigint(self) -> None:
        self.count += 1
        if self.count == 1:
            if self._in_a_cell():
                print("lmnb run: interrupting the running cell (Ctrl-C again shuts the kernel down)", file=sys.stderr)
                asyncio.ensure_future(self.km.interrupt_kernel())
                self._grace = asyncio.get_running_loop().call_later(self.GRACE_S, self._force)
            else:
                print(f"lmnb run: {self._outside_a_cell()}", file=sys.stderr)
        elif self.count == 2:
            self._stop_kernel()

    def _on_sigterm(self) -> None:
        self.terminated = True
        if not self.count:
            self._in_a_cell()
        self.count = max(self.count, 2)
        self._stop_kernel()

    def _in_a_cell(self) -> bool:
        """Whether the first Ctrl-C (or SIGTERM) came while a cell's code ran (its request sent, its
        reply not yet in), noted as ``interrupted``. Else it stops no cell (``came``): it came before
        the first cell, or after a cell's reply, whose output is then waited for no longer."""
        if self._cell is not None and (self.client is None or self.client.replied is not self._cell):
            self.interrupted = self.cell_number
            return True
        self.came = self.name
        if self.client is not None:  # (a cell whose reply came has ended: its output is not waited for)
            self.client.stop_output_wait()
        return False

    def _outside_a_cell(self) -> str:
        """What the run does after a Ctrl-C that stopped no cell (``_in_a_cell``), said at once."""
        following = self._next_cell()
        if self.cell_number is None:
            return "stopping before the first cell runs"
        done = self.cell_name(self.cell_number)
        if following is None:
            return f"Ctrl-C after the last cell, {done}, had finished: the run ends as it would have"
        return f"stopping: {done} has finished, and {self.cell_name(following)} will not run"

    def _next_cell(self) -> int | None:
        """The number of the code cell nbclient runs next (one of code that is not blank, nor
        tagged to be skipped), None if none is left; None where there is no client to ask."""
        if self.client is None:
            return None
        after = self.cell_number or 0
        for number, cell in enumerate(self.client.nb.cells[after:], start=after + 1):
            if (cell.cell_type == "code" and cell.source.strip()
                    and self.client.skip_cells_with_tag not in cell.metadata.get("tags", [])):
                return number
        return None

    def where_stopped(self, saved: str = "saved") -> str:
        """The report of a run ``Interrupted``: in the cell the Ctrl-C interrupted, or between
        the cell that had finished and the one that did not start (before the first). ``saved``:
        how the notebook's outputs were kept, "saved" or "written out" (to stdout)."""
        name = self.name
        if self.interrupted is not None:  # (it is the cell started last: none starts after a Ctrl-C)
            last = self.client is not None and self._next_cell() is None  # (none left to skip)
            after = ", the last one" if last else "; the cells after it did not run"
            return f"interrupted ({name}) in {self.cell_name(self.interrupted)}{after}"
        following = self.cell_name(self.before)
        if self.cell_number is None:
            return f"interrupted ({name}) before any cell ran; {following} and the cells after it did not run"
        done = self.cell_name(self.cell_number)
        return (f"interrupted ({name}) between {done} and {following}: {done} had finished, and its outputs are "
                f"{saved}; {following} and the cells after it did not run")

    def came_after_the_last(self) -> str:
        """What a run that ``came`` says: the signal stopped nothing."""
        if self.cell_number is None:
            return f"{self.came} came when no cell was left to run; it stopped nothing"
        return (f"{self.came} came after the last cell, {self.cell_name(self.cell_number)}, had finished; it stopped "
                "nothing, and the run ends as it would have")

    @property
    def name(self) -> str:
        """What interrupted the run, for its messages: "SIGTERM" or "Ctrl-C"."""
        return "SIGTERM" if self.terminated else "Ctrl-C"

    def _force(self) -> None:
        self.forced = True
        self._stop_kernel()

    def _stop_kernel(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
        if self.stopping is None:  # (once: two shutdowns of one kernel at a time fail on ZMQError)
            self.stopping = asyncio.ensure_future(self.km.shutdown_kernel(now=True))


def kernel_manager():
    """An ``AsyncKernelManager`` for the ``lmnb`` kernel of this Python, whether or not the spec is
    installed. nbclient needs the async kind: with the blocking ``KernelManager`` it never notices
    a dead kernel (the run hangs) and never enforces its cell timeout.

    On POSIX the kernel's sockets are Unix sockets (``transport="ipc"``) in a private temporary
    folder: nothing the notebook prints crosses TCP, and ipykernel has no plain-TCP warning to
    print. The folder is short on purpose (a socket path has at most 107 bytes); the manager's
    ``cleanup_connection_dir()`` removes it."""
    import shutil
    import tempfile

    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class _Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            if kernel_name == KERNEL_NAME:
                spec = kernel_spec()
                # The run is the kernel's one client and reads all it sends: its iopub socket waits
                # for the run rather than drop output (lmnb_kernel.kernel.LMNBKernelApp.iopub_nodrop)
                spec["argv"] = [*spec["argv"], "--LMNBKernelApp.iopub_nodrop=True"]
                return KernelSpec(resource_dir="", **spec)
            return super().get_kernel_spec(kernel_name)

    class _Manager(AsyncKernelManager):
        def client(self, **kwargs):
            import zmq

            kc = super().client(**kwargs)
            # No limit on the messages queued on this side (ZMQ's default: 1000 a socket, past
            # which the kernel's iopub socket drops what it sends): a cell's output came in faster
            # than nbclient read it (a loop of display() calls) and was lost, 7900 of a cell's 30000
            # outputs (an idle status lost so would hold the run for --timeout). Set before the
            # channels connect (nbclient starts them after making the client). (The kernel's own
            # queue dropped some still, 39 of the 30000: it now waits instead, iopub_nodrop above.)
            kc.context.setsockopt(zmq.RCVHWM, 0)
            return kc

        def cleanup_connection_dir(self) -> None:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    folder = None
    options = {}
    if os.name == "posix":
        folder = tempfile.mkdtemp(prefix="lmnb-")
        if len(os.fsencode(os.path.join(folder, "kernel-ipc-99999"))) <= 100:  # else TCP (a long $TMPDIR)
            options = {"transport": "ipc", "connection_file": os.path.join(folder, "kernel.json")}
    return _Manager(kernel_name=KERNEL_NAME, kernel_spec_manager=_Specs(), **options)


def parse_value(text: str, default=NO_DEFAULT):
    """A ``-p`` value, read like the parameter's ``default`` from the parameters cell, as the
    exported job reads ``--NAME`` (``lmnb.batch.options.parameter_type``: ``false`` is False for
    a bool, ``1`` is 1.0 for a float, ``0x20`` is 32 for an int, ``[1, 2]`` a list for a list);
    without a literal default, as for a None one: a Python literal (``3``, ``[1, 2]``, ``'x'``,
    ``(1, 2)``) or else the string (``1,2``, a tuple without its parentheses, stays the string, as
    papermill keeps it).

    Raises:
        ValueError: text the default's type cannot take (what is expected, with an example), or an
            integer too long for Python to write in decimal."""
    import argparse

    from lmnb.batch.options import parameter_type

    try:
        return parameter_type(None if default is NO_DEFAULT else default)(text)
    except argparse.ArgumentTypeError as e:
        where = "" if default is NO_DEFAULT else f"the parameters cell sets it to {default!r:.60}: "
        raise ValueError(f"{where}{e}") from None


def parameter_defaults(nb) -> dict:
    """name → literal default of the variables the cell tagged ``parameters`` assigns
    (``lmnb.export.parameters.read_parameters``, as the exported job's options)."""
    known = _parameters(nb.cells)
    return {name: value for name, value in (known or {}).items() if value is not NO_DEFAULT}


def _parameters(cells) -> dict | None:
    """What the first cell tagged ``parameters`` sets (``read_parameters``), its IPython syntax
    (``%env``, ``!pip``) left out as the exporter leaves it out, so both read the same names and
    defaults; None without such a cell, or when it is not Python even so."""
    cell = next((c for c in cells if _is_parameters(c)), None)
    if cell is None:
        return None
    try:
        return read_parameters(python_cell(0, cell.source).source)
    except (ExportError, SyntaxError):
        return None


def _first_setter(cells, name: str) -> int | None:
    """The number of the first code cell that sets ``name`` when the kernel runs it
    (``_kernel_sets``), None if none does."""
    for number, cell in enumerate(cells, start=1):
        if cell.cell_type == "code" and name in _kernel_sets(cell):
            return number
    return None


def _kernel_sets(cell) -> tuple:
    """The names a code cell (of nbformat) sets when the kernel runs it: as the exporter reads the cell
    (``_cell_sets``), or, for a cell it refuses (``files = !ls``) or drops (``%%bash --out
    VAR``), as IPython's own translation of the cell to Python binds them (``_ipython_sets``)."""
    try:
        read = read_cells(SimpleNamespace(cells=[cell]))
    except ExportError:
        read = None
    if read is not None and not (read and isinstance(read[0], Dropped)):
        return _cell_sets(read[0]) if read else ()
    return _ipython_sets(cell.source if isinstance(cell.source, str) else "".join(cell.source))


def _ipython_sets(source: str) -> tuple:
    """The names IPython's translation of a cell to Python binds at top level (``files = !ls`` is
    ``files = get_ipython().getoutput('ls')``), and those its cell magic sets: a script magic's
    ``--out`` / ``--err`` (and ``--proc`` with ``--bg``: ``%%bash --out VAR``), what the body of
    ``%%time`` or ``%%capture`` binds and ``%%capture``'s variable; () for a cell that is not Python
    even so."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.core.magics._table import default_script_magics
    from IPython.core.magics.script import ScriptMagics
    from IPython.utils.process import arg_split

    from lmnb.export.cells import bound_by
    from lmnb_kernel.lmnb_name import magic_call

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return ()
    out = [name for stmt in tree.body for name in bound_by(stmt)]
    script_magics = ("script", *default_script_magics())
    for stmt in tree.body:  # get_ipython().run_cell_magic(NAME, LINE, BODY)
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not (magic_call(call, (*script_magics, "time", "capture"), "run_cell_magic") and len(call.args) == 3
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)):
            continue
        magic, line, body = (a.value for a in call.args)
        if magic in script_magics:
            args, _ = ScriptMagics.shebang.parser.parse_known_args(arg_split(line))
            out += [n for n in (args.out, args.err, args.proc if args.bg else None) if n]
        elif magic in ("time", "capture"):
            out += _ipython_sets(body)
            if magic == "capture":
                out += [w for w in line.split() if not w.startswith("-")][:1]
    return tuple(out)


def _cell_sets(cell) -> tuple:
    """The names a cell (``lmnb.export.cells.read_cells``) sets when the kernel runs it: a Python
    cell's top-level bindings (also below ``%%time`` / ``%%capture``, and ``%%capture``'s variable;
    none below ``%%timeit``, whose body IPython runs in a function of its own, but those it declares
    ``global``: ``Code.assigns`` has only those), a ``%%lm`` cell's ``{gen NAME}`` / ``{select NAME}`` variables and its ``--out`` state."""
    if isinstance(cell, Code):
        return cell.assigns + ((cell.captured_output,) if cell.captured_output else ())
    if isinstance(cell, LMCell):
        return cell.sets
    return ()


def _is_parameters(cell) -> bool:
    # (tags read as the export reads them, cell_tags: "tags": "parameters", a string, had its
    # substring found, and "tags": 5 ended the run on a TypeError)
    return "parameters" in cell_tags(cell)


def inject_parameters(nb, params: dict) -> int | None:
    """Insert a cell assigning ``params`` after the cell tagged ``parameters`` (or first, if none),
    replacing a previously injected one — papermill's convention, so its tools read it. Returns
    the index of the inserted cell (None if it replaced one)."""
    import nbformat

    source = "# Parameters\n" + "".join(f"{k} = {python_source(v)}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    cells = nb.cells
    tagged = [i for i, c in enumerate(cells) if _is_parameters(c)]
    known = _parameters(cells)
    if known is not None:  # a misspelt -p name would otherwise run silently with the notebook's default
        for name in params:
            if unicodedata.normalize("NFKC", name) not in known:  # as Python reads the injected cell
                close = close_match(name, sorted(known))
                fix = f"did you mean -p {close}?" if close else "check the spelling"
                print(f"lmnb run: warning: parameter {name!r} is not set in the cell tagged 'parameters' "
                      f"(it sets {', '.join(sorted(known)) or 'nothing'}); {fix}", file=sys.stderr)
    old = [i for i, c in enumerate(cells) if "injected-parameters" in cell_tags(c)]
    if old:
        cells[old[0]] = cell
        return None
    if not tagged:
        print("lmnb run: no cell is tagged 'parameters'; the parameters go in a new first cell", file=sys.stderr)
        for name in params:
            setter = _first_setter(cells, unicodedata.normalize("NFKC", name))
            if setter is not None:  # (the notebook's value then replaced the one given, silently)
                print(f"lmnb run: warning: cell {setter} sets {name} after the new first cell, so -p {name} has no "
                      "effect; tag the cell that sets the notebook's parameters 'parameters' (papermill's "
                      "convention), and the parameters go after it", file=sys.stderr)
    cells.insert(tagged[0] + 1 if tagged else 0, cell)
    return tagged[0] + 1 if tagged else 0


def clear_outputs(nb) -> None:
    """Empty every code cell's outputs and execution count, as papermill does before a run: nbclient
    clears only the cells it runs, so after a failure the cells below it kept the outputs of an
    earlier run, the saved notebook showed them as run, and the summary counted their tokens. The
    widget state saved with those outputs (JupyterLab's, for their widget views) goes with them:
    nbclient replaces it only when the run leaves a widget open, so it stayed otherwise."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None


def python_source(value) -> str:
    """``value`` (what ``parse_value`` returns: a literal) as Python source that evaluates back to
    it. ``repr`` is that but for non-finite numbers: ``inf`` and ``nan`` are no Python names, so an
    injected ``x = inf`` (``-p x 1e400``) was a NameError; they are written as papermill writes them."""
    if isinstance(value, (float, complex)) and not _finite(value):
        return f"{type(value).__name__}({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(map(python_source, value)) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(python_source, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, set) and value:
        return "{" + ", ".join(map(python_source, value)) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_source(k)}: {python_source(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _finite(number) -> bool:
    parts = (number.real, number.imag) if isinstance(number, complex) else (number,)
    return all(math.isfinite(p) for p in parts)


def summary(nb, src: Path, out: Path, seconds: float, cell_name=lambda number: f"cell {number}",
            timed_out: int | None = None, errors: dict | None = None, cut_short: dict | None = None,
            injected: int | None = None) -> str:
    """The printed summary: cells run, ``%%lm`` cells, the cells that raised (with
    ``--allow-errors`` the run goes on past them, and nothing else would say so), the ``%%lm``
    cells' tokens and hit rate (labelled so: a notebook whose Python cells ran programs, as
    06-batch's ``run_batch``, read "tokens: prompt 0"), time. ``cell_name(number)`` names the cell at 1-based ``number`` of ``nb``;
    ``timed_out``: the one stopped at ``--timeout``, whose KeyboardInterrupt says so; ``errors``:
    cell number -> error name of the cells whose execute reply was an error (``_raised``);
    ``cut_short``: cell number -> the status its unfinished ``%%lm`` view says (``unfinished_view``),
    named apart from the cells without a summary (``--quiet``); ``injected``: the 0-based index of
    the parameters cell ``-p`` inserted (``inject_parameters``), which "cells run" leaves out of its
    count of the notebook's cells and names after it, as ``cell_name`` names it."""
    # (a code cell of blank source is not run, by nbclient as by JupyterLab: not a cell left unrun)
    code = [(number, c) for number, c in enumerate(nb.cells, start=1) if c.cell_type == "code" and c.source.strip()]
    ran = [(number, c) for number, c in code if c.get("execution_count") is not None]
    parameters = ""
    if injected is not None:  # (the source notebook's cells are counted, as the report numbers them)
        parameters = f", and {cell_name(injected + 1)}" if nb.cells[injected].get("execution_count") is not None else ""
        code = [(number, c) for number, c in code if number != injected + 1]
        ran = [(number, c) for number, c in ran if number != injected + 1]
    tokens = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
    lm_cells = unreported = unknown_prompts = 0
    cut_short = cut_short or {}
    for number, c in ran:
        if not is_lm_cell(c.source):
            continue
        lm_cells += 1
        counts = [o["metadata"]["lmnb"]["tokens"] for o in c.get("outputs", [])
                  if "tokens" in o.get("metadata", {}).get("lmnb", {})]
        # --quiet (or a cell that failed before running) shows no summary
        unreported += not counts and number not in cut_short
        for t in counts:
            for k in tokens:
                tokens[k] += int(t.get(k, 0))
            unknown_prompts += int(t.get("unreported_prompts", 0))
    p, ca, g = tokens["prompt_tokens"], tokens["cached_tokens"], tokens["completion_tokens"]
    hit = f"{100 * ca / p:.0f}%" if p else "n/a"
    missing = f" ({unreported} %%lm cell{'s' * (unreported > 1)} without a summary not counted)" if unreported else ""
    if cut_short:
        names = ", ".join(cell_name(number) for number in cut_short)
        missing += f" (not counted: the unfinished view{'s' * (len(cut_short) > 1)} of {names})"
    if unknown_prompts:  # (gens stopped before an OpenAI-compatible API reported their usage)
        missing += f" (the prompts of {unknown_prompts} stopped gen{'s' * (unknown_prompts > 1)} are not counted)"
    return (f"lmnb run: {src} -> {out}\n"
            f"  cells run: {len(ran)} of {len(code)} ({lm_cells} %%lm){parameters}\n"
            + _raised(nb, cell_name, timed_out, errors=errors) +
            f"  %%lm tokens: prompt {p}, cached {ca} (hit rate {hit}), completion {g}{missing}\n"
            f"  time: {seconds:.1f} s")


def _raised(nb, cell_name, timed_out: int | None = None, shown: int = 3, errors: dict | None = None) -> str:
    """The summary's line for the cells whose outputs hold an error, or whose execute reply was
    one (``errors``: cell number -> error name; IPython shows a UsageError as stderr text, with no
    error output) ("" if none): how many, and the first ``shown`` of them with their error's name
    (the timed-out cell's KeyboardInterrupt, nbclient's interrupt at ``--timeout``, says so: it
    read as a Ctrl-C)."""
    def name(number: int, ename: str) -> str:
        at_timeout = number == timed_out and ename == "KeyboardInterrupt"
        return with_note(cell_name(number), f"{ename}{' at --timeout' if at_timeout else ''}")

    errors = errors or {}
    raised = []
    for number, c in enumerate(nb.cells, start=1):
        if c.cell_type != "code":
            continue
        shown_errors = [o.get("ename", "error") for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if not shown_errors and number in errors:
            shown_errors = [errors[number]]
        raised += [name(number, ename) for ename in shown_errors]
    if not raised:
        return ""
    more = f", and {len(raised) - shown} more" if len(raised) > shown else ""
    return f"  cells that raised: {len(raised)}: {', '.join(raised[:shown])}{more}\n"
