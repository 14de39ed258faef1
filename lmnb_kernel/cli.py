"""The ``lmnb`` command line: one entry point, one subcommand per job.

Lives in ``lmnb_kernel`` because it sits at the top of the import chain
(lmnb_kernel → lmnb → lmnb_engine). Only the chosen subcommand's module is imported, so
``lmnb --help`` is fast, never loads torch, and one subcommand's dependencies cannot break another.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

# subcommand -> (module, function, one-line help). Each module exposes
# ``<function>_arguments(parser)`` and ``<function>(args) -> int``. Help texts are written as
# shown; argparse %-formats them, so "%" is doubled where they are passed.
SUBCOMMANDS = {
    "run": ("lmnb_kernel.run", "run", "execute a notebook headless with the lmnb kernel"),
    "install-kernel": ("lmnb_kernel.install", "install", "install the lmnb kernelspec"),
    "serve": ("lmnb_engine.http_server", "serve", "serve the in-process engine over HTTP"),
    "export": ("lmnb.export", "export", "export a %%lm notebook to a batch script"),
}


# Subcommands that SIGTERM stops as Ctrl-C does until they take it over: `lmnb run` exited 143
# without a word when terminated in its first second or two (its imports), before its handlers,
# and `lmnb serve` while its model loaded, before its server's handlers.
SIGTERM_AS_CTRL_C = ("run", "serve")


# `lmnb serve`'s phase (``lmnb_engine.http_server.phase``) -> what the line of a SIGTERM that
# reached ``main`` says of it: one while the server served, between its "serving" line and its own
# handlers, says just that it stopped, as theirs does.
SERVE_PHASE_WORDS = {"loading": " before it started serving", "serving": "", "shutting down": " while shutting down"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (``SIGTERM_AS_CTRL_C``)."""


def _stopped(signum, frame) -> None:
    """SIGTERM's handler (``Terminated``) and, for ``lmnb serve``, SIGINT's (Python's
    KeyboardInterrupt, as its default handler raises): the exception is also left in
    ``lmnb_engine.http_server.stop_raised``, for the model's load may swallow it (``serve``)."""
    stop = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    server = sys.modules.get("lmnb_engine.http_server")
    if server is not None:
        server.stop_raised = stop
    raise stop


def _stopped_at_once(signum, frame) -> None:
    """``lmnb serve``'s SIGTERM and SIGINT handler in its own process (``main`` with no ``argv``):
    a stop before it serves (its imports, its model's load: phase "loading") says its line and ends
    the process at once, with 128 + the signal's number. Raised as an exception (``_stopped``), it
    waited for the imports or the load to finish where a library caught it (transformers' lazy
    imports turn it into another error, and the load goes on), and then for the interpreter's exit
    after torch: Ctrl-C a second after launch took seconds to end it. Nothing of the start-up needs
    undoing: the process's end frees the engine's memory and closes the bound socket. Later phases
    raise, as ``_stopped`` does: the engine, once serving, is shut down."""
    if _serve_phase() != "loading":
        _stopped(signum, frame)
    for stream in (sys.stdout, sys.stderr):  # (what was said before, then the line, unbuffered)
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # (closed, a closed pipe, a write this handler cut short)
            pass
    line = f"lmnb serve: stopped ({signal.Signals(signum).name}){SERVE_PHASE_WORDS['loading']}\n"
    try:
        os.write(2, line.encode())
    except OSError:
        pass
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return its exit status; 130
    (the shell's code for SIGINT) when Ctrl-C comes before the subcommand takes it over, e.g.
    while torch is being imported, instead of a traceback; for ``lmnb run``, SIGTERM too. SIGTERM
    or Ctrl-C to ``lmnb serve`` outside its server's own handlers (its model loading, its engine
    shutting down after the server stopped): a line that says which (``SERVE_PHASE_WORDS``), and
    143 or 130 (the status of a process the signal ended, as while it serves); in ``lmnb serve``'s
    own process, one before it serves ends it at once (``_stopped_at_once``).

    Called with no ``argv``, as the ``lmnb`` command is (its console script, ``python -m
    lmnb_kernel.cli``), ``lmnb serve`` and ``lmnb run`` (``SIGTERM_AS_CTRL_C``) ignore SIGTERM
    once their run has ended, however it ended: the process is exiting (its interpreter's exit
    takes a moment after torch) with its report or stop already said and its status chosen, and a
    late SIGTERM (a supervisor's, after a Ctrl-C) ended it with 143 and no line. Ignored, the
    status and the line stay the run's, as uvicorn's and ``Server.handle_exit`` keep a stop under
    way (only a second Ctrl-C forces one). A call with ``argv`` (in-process) gets its SIGTERM
    handler back instead."""
    try:
        return _main(argv)
    except KeyboardInterrupt as e:
        signum = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
        if argv_command(argv) == "serve":  # (for Ctrl-C, as the server's own line on it)
            print(f"lmnb serve: stopped ({signum.name}){SERVE_PHASE_WORDS[_serve_phase()]}", file=sys.stderr)
            return 128 + signum
        print("lmnb: terminated (SIGTERM)" if signum == signal.SIGTERM else "lmnb: interrupted", file=sys.stderr)
        return 130


def _serve_phase() -> str:
    """``lmnb serve``'s phase; "loading" before its module is imported (its import is part of the
    load), read without importing it."""
    module = sys.modules.get("lmnb_engine.http_server")
    return getattr(module, "phase", "loading")


def argv_command(argv: list[str] | None) -> str | None:
    """The subcommand ``argv`` (default ``sys.argv[1:]``) names first, or None."""
    argv = sys.argv[1:] if argv is None else argv
    return argv[0] if argv and argv[0] in SUBCOMMANDS else None


def _main(argv: list[str] | None) -> int:
    exiting = argv is None  # (the command's own process, which ends when this returns: main)
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv_command(argv)
    if chosen not in SIGTERM_AS_CTRL_C or threading.current_thread() is not threading.main_thread():
        return _run(chosen, argv)
    handler = _stopped_at_once if exiting and chosen == "serve" else _stopped
    previous = signal.signal(signal.SIGTERM, handler)  # (before the subcommand's imports, the slow part)
    # Ctrl-C too for `lmnb serve`, where it would be Python's own KeyboardInterrupt (not where
    # SIGINT is ignored, as in a background job, nor a caller's own handler)
    previous_int = signal.getsignal(signal.SIGINT)
    if chosen == "serve" and previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, handler)
    try:
        return _run(chosen, argv)
    finally:  # (a caller's own handler back, as in the tests; the subcommand's are gone by now)
        # SIG_IGN, not a Python handler: the interpreter's exit resets those before it tears the
        # modules down, the slow part (it leaves an ignored signal ignored)
        after = signal.SIG_IGN if exiting else previous
        if after is not None:
            signal.signal(signal.SIGTERM, after)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _version() -> str:
    """The installed lmnb distribution's version (``lmnb.__version__``'s, read without importing lmnb)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lmnb")
    except PackageNotFoundError:  # (run from a checkout that was never installed)
        return "0+unknown"


def _run(chosen: str | None, argv: list[str]) -> int:
    # (imported here, not with this module: a Ctrl-C while the lmnb command imports this module
    # comes before main's handlers, and ended in a KeyboardInterrupt traceback; the engine package
    # alone, no torch)
    from lmnb_engine.cli_options import SuggestingParser

    # (a misspelt option is offered its closest, in each subcommand: add_parser makes parser_class's)
    parser = SuggestingParser(prog="lmnb", description="lmnb: LM programs in notebooks")
    parser.add_argument("--version", action="version", version=f"lmnb {_version()}")  # (for a bug report)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (module, func, help_) in SUBCOMMANDS.items():
        p = subparsers[name] = sub.add_parser(name, help=help_.replace("%", "%%"), description=help_)  # (descriptions are not formatted)
        if name == chosen:
            getattr(importlib.import_module(module), f"{func}_arguments")(p)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not "usage: lmnb [-h] COMMAND ...", which shows none of its options
        (subparsers[chosen] if chosen else parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if chosen is None:
        parser.print_help()
        return 2
    module, func, _ = SUBCOMMANDS[chosen]
    return int(getattr(importlib.import_module(module), func)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
