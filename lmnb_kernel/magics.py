"""The ``%%lm`` cell magic and the ``%lm`` line magics (one IPython ``Magics`` class).

``%%lm [options]`` runs the cell body — the prompt template of docs/CELL_LANGUAGE.md, or with
``--python`` an lmnb program body with state ``s`` — on the session's backend, streaming into a
``RunView`` and putting the captured variables into the kernel namespace. ``%lm SUBCOMMAND``
manages the session (``lmnb_kernel.commands``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import traceback
from typing import Iterator, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display

from lmnb.interrupt import held_interrupts
from lmnb.template.cell_options import (
    STATE_NAME,
    STATE_NAME_RULE,
    CellLineError,
    CellOptions,
    add_cell_options,
    add_connect_arguments,
    add_load_arguments,
    check_cell_names,
    checked_out,
    close_subcommand,
    suggest_option,
)
from lmnb_kernel import commands
from lmnb_kernel.cellrun import CellOutcome, Listener, run_cell, start_run
from lmnb_kernel.errors import CellError, cell_interrupt
from lmnb_kernel.feed import ViewFeeder
from lmnb_kernel.lmnb_name import define_lmnb
from lmnb_kernel.session import NO_TREE_ROUTE, NOT_STARTED, Session, get_session
from lmnb_kernel.tables import cell_label, cell_summary

# The engine's words for a prompt that fits the context but not with its new tokens (a gen's
# max_tokens, a cell's --max-tokens): "prompt of 499 tokens + max_tokens=20 exceeds ..."
_PROMPT_AND_NEW = re.compile(r"prompt of (\d+) tokens? \+ max_(?:new_)?tokens=(\d+) exceeds the model's context")

# Output mode for every cell: "live" (a widget while running), "static" (display updates only) or
# "headless" (lmnb run: display updates once a second; a frame renders the whole run on the kernel's
# main thread, which at 20 Hz took a third of a long fork cell's time from the engine's threads).
# A static frame resends the whole view: at 20/s a {fork 8} cell of 450 tokens sent 140 updates, 31 MB.
VIEW_ENV = "LMNB_VIEW"
_FRAMES_PER_S = {"live": 20.0, "static": 5.0, "headless": 1.0}
RECENT_CELLS = 8  # unnamed cells whose radix paths %lm tree labels


class _Parser(MagicArgumentParser):
    """IPython's parser (a ``UsageError``, not an exit) that takes no prefix of an option: argparse
    read ``%lm load --dtyp bfloat16`` as ``--dtype`` without a word, and a notebook's prefix would
    change meaning once an option beginning the same way came. ``MagicArgumentParser`` takes no
    ``allow_abbrev``; the exporter's parser (``cell_options._Parser``) refuses them too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allow_abbrev = False


# ``prog`` goes without one "%": IPython's usage line puts a "%" before it.
def cell_parser() -> MagicArgumentParser:
    """The options of ``%%lm`` (defined in ``lmnb.template.cell_options``, which the exporter reads too)."""
    return add_cell_options(_Parser(prog="%lm", description="Run the cell as an LM program."))


def line_parser() -> MagicArgumentParser:
    """The subcommands of the ``%lm`` line magic (load, connect, stats, tree, states, reset, flush, pin, unpin,
    help)."""
    p = _Parser(prog="lm", description="Manage the kernel's LM session.")
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)

    def add(name: str, help: str):  # the help is also the description %lm NAME --help shows
        return sub.add_parser(name, prog=f"lm {name}", help=help, description=help)

    add_load_arguments(add("load", "load a model into a new in-process engine now"))
    add_connect_arguments(add("connect", "run cells on a server instead"))
    add("stats", "cache hit rate, KV pool usage, evictions")
    add("tree", "the radix tree (refreshed after every cell; lmnb run keeps it as it was)")
    add("states", "the named states")
    add("reset", "forget a named state (all without NAME)").add_argument("name", nargs="?")
    add("flush", "evict every unpinned prefix from the radix cache (connected to an SGLang-protocol server: "
                 "flush the server's cache)")
    add("pin", "keep a named state's prefix in the cache").add_argument("name")
    add("unpin", "let a named state's prefix be evicted again").add_argument("name")
    # (run_command reads `help [SUBCOMMAND]` as `[SUBCOMMAND] --help`; listed so the help names it)
    add("help", "this help; %%lm help SUBCOMMAND: a subcommand's options").add_argument("subcommand", nargs="?")
    return p


def _split(line: str) -> list[str]:
    import shlex

    try:
        return shlex.split(line)
    except ValueError as e:
        raise UsageError(f"cannot read the options {line!r}: {e}") from None


def _subcommands(parser) -> dict:
    """The subcommand parsers of ``parser`` by name (none for the ``%%lm`` line's)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _shown_help(parser) -> str:
    """``parser``'s help as printed for a user: IPython's MagicHelpFormatter opens the usage with
    "::" and an indent (reST, for a magic's docstring), which ``%lm help`` printed as its first line;
    here it opens with argparse's "usage: ", one character longer, so the usage's wrapped lines move
    one to the right with it."""
    usage, blank, rest = parser.format_help().removeprefix("::\n\n  ").partition("\n\n")
    return "usage: " + usage.replace("\n", "\n ") + blank + rest


def _help(parser, words: list[str]) -> str | None:
    """``parser``'s help (its subcommand's, for ``%lm SUBCOMMAND --help``) if ``words`` ask for it
    with ``-h`` / ``--help``, else None. The magics' parsers have no help option of their own, so
    ``%%lm --help`` was refused as an unrecognized argument."""
    if "-h" not in words and "--help" not in words:
        return None
    subcommand = _subcommands(parser).get(words[0])
    return _shown_help(subcommand or parser)


def _stopped_state(command: str, session: Session, swapped: bool = False) -> str:
    """What a Ctrl-C during ``%lm COMMAND`` left as it was, said after "%lm COMMAND was stopped":
    whether the cache is whole and whether the command can be run again ("" where there is nothing
    to say). A stopped flush or stats said "was stopped" alone, and a user could not tell whether
    the cache was flushed, half flushed, or broken. A flush waits for the engine (or the server)
    to run it; the engine runs a flush it was handed between its steps, wait or no wait, and one it
    was not is not run, so the cache is flushed or as it was, never part of each. ``swapped``: the
    session's backend changed meanwhile (a load or connect stopped as it said so: "%lm load was
    stopped" alone left a user to guess which model the next cell would run on)."""
    if command == "pin":
        return "; the state's pin is as it was"
    if command == "flush" and session.remote is not None:
        return (f" while it waited for {session.remote}; the server's cache is flushed if the request reached it, "
                "else as it was; %lm flush can be run again")
    if command == "flush":
        return ("; the radix cache is whole: a flush the engine was handed still runs between its steps, else the "
                "cache is as it was (pinned prefixes stay either way); %lm flush can be run again")
    if command == "stats":
        return "; it only reads figures, so nothing changed; %lm stats can be run again"
    if command in ("load", "connect"):  # (one stopped in Session.connect's wait says so itself)
        done = "loaded" if command == "load" else "connected"
        return (f" once it had {done}; cells run on {session.current()} now" if swapped else
                f" before it {done}; cells still run on {session.current()}")
    return ""


def _help_word(words: list[str]) -> list[str]:
    """``%lm help [SUBCOMMAND]`` spelt as ``%lm [SUBCOMMAND] --help``: a first try at the magic, and
    the word other tools' help goes by, which was refused as an invalid subcommand."""
    return words[1:] + ["--help"] if words[:1] == ["help"] else words


def _check_help_subcommand(words: list[str]) -> None:
    """Refuse help asked for a subcommand ``%lm`` lacks (``%lm help stat``, ``%lm nosuch --help``),
    with "did you mean": the general help was printed instead, as if the name were one.

    Raises:
        UsageError: ``words[0]`` is neither an option nor a subcommand.
    """
    subcommands = _subcommands(line_parser())
    if words[0].startswith("-") or words[0] in subcommands:
        return
    close = close_subcommand(words[0], subcommands)
    hint = f"did you mean: %lm help {close}? " if close else ""
    raise UsageError(f"%lm has no subcommand {words[0]!r}; {hint}%lm help lists them")


def _suggest_subcommand(message: str, parser, words: list[str]) -> str:
    """argparse's ``message`` for a ``%lm`` line, with "did you mean" for a misspelt subcommand
    (``%lm stat``) or option of one (``%lm load --devise``), as ``%%lm`` options and gen options
    get: the message only listed the subcommands, or named the option alone."""
    subcommands = _subcommands(parser)
    if words[0] in subcommands:
        return suggest_option(message, subcommands[words[0]], f"%lm {words[0]} --help")
    close = close_subcommand(words[0], subcommands)
    return message + (f" (did you mean: %lm {close}?)" if "invalid choice" in message and close else "")


def _cell_number(shell) -> int:
    """N of the running cell's In [N]. The input history has In [N] stored by now, whereas
    ``shell.execution_count`` is already N + 1 while a cell runs in ipykernel 7 / IPython 9 (N in
    older versions and in a terminal)."""
    stored = len(shell.history_manager.input_hist_raw) - 1
    return stored if stored > 0 else shell.execution_count


@magics_class
class LMMagics(Magics):
    """``%%lm`` cells and ``%lm`` commands; see ``%lm?``."""

    def __init__(self, shell):
        super().__init__(shell)
        self.session = get_session()
        self.tree_view = None  # shown by %lm tree, refreshed after every cell
        self.recent_cells: dict = {}  # "cell [n]" -> its final ProgramState, the last RECENT_CELLS runs
        # The running cells (pre_run_cell's ExecutionInfo: the cell as typed, its Jupyter cell id),
        # outermost first: %%capture runs its body as a cell of its own, and a %%lm below it counts
        # its lines in the cell the user typed.
        self.running_cells: list = []

    def note_cell(self, info) -> None:
        """pre_run_cell hook: remember the cell as typed, for the line numbers of a ``%%lm`` below
        ``%%time`` or ``%%capture``, and its cell id, which tells a re-run of a ``--state`` cell."""
        self.running_cells.append(info)

    def forget_cell(self, result) -> None:
        """post_run_cell hook: the cell ended (a silent run, which fires no hook, must not see it).
        ``result`` is None for a cell ipykernel cancelled (Ctrl-C while it awaited)."""
        if self.running_cells and (result is None or self.running_cells[-1].raw_cell == result.info.raw_cell):
            self.running_cells.pop()  # (an empty cell fires only this hook)

    @no_var_expand
    @line_cell_magic
    def lm(self, line: str, cell: str | None = None):
        """LM programs in cells (docs/CELL_LANGUAGE.md).

        ``%%lm [--state NAME] [--append] [--temperature T] [--max-tokens N] [--seed N] [--out VAR] [--quiet]
        [--static] [--python]`` runs the cell: a prompt with holes (``{name}``, ``{gen NAME ...}``,
        ``{select NAME choices=[...]}``, ``{user}...{/user}``, ``{fork x in xs}...{join}``), or with
        ``--python`` an lmnb program body whose state is ``s``. Captured variables land in the kernel.
        Re-running the cell that extended a state last replaces its turn (``--append`` adds another).

        ``%lm load [MODEL] | connect URL [--openai MODEL] | stats | tree | states | reset [NAME] |
        flush | pin NAME | unpin NAME | help [SUBCOMMAND]`` manages the engine, the named states and the
        KV cache.
        """
        if cell is None:
            return self.run_command(line)
        return self.run_program(line, cell)

    # -- %lm ------------------------------------------------------------------------------------
    def run_command(self, line: str) -> None:
        """Run one ``%lm SUBCOMMAND`` line (``--help``/``-h`` anywhere prints the options)."""
        words = _help_word(_split(line))
        shown = _help(line_parser(), words)
        if shown is not None:
            _check_help_subcommand(words)
            if words[0].startswith("-"):  # %lm --help: also the cell options, which %%lm --help alone
                # cannot show (IPython refuses a cell magic with an empty body, pointing to %lm)
                shown += "\nCells: %%lm [options], then the prompt on the lines below.\n" + _shown_help(cell_parser())
            return print(shown)
        parser = line_parser()
        try:
            args = parser.parse_args(words)
        except UsageError as e:
            raise UsageError(_suggest_subcommand(str(e), parser, words)) from None
        if args.command is None:
            raise UsageError("%lm needs a subcommand:\n" + _shown_help(line_parser()))
        name = getattr(args, "name", None)
        if name is not None and not STATE_NAME.match(name):
            raise UsageError(f"{name!r} is not a valid state name: {STATE_NAME_RULE}")
        before = self.session.made_backend
        try:
            if args.command == "tree":
                return self.show_tree()
            getattr(commands, args.command)(args, self.session)
        except CellError as e:
            if args.command not in ("load", "connect"):
                raise
            # (a load that closed the old engine first, to free its GPU, and then failed: the next
            # cell starts the old one again, not "still" runs on it)
            still = " still" if self.session.made_backend is before else ""
            raise CellError(f"{e}\ncells{still} run on {self.session.current()}") from e.__cause__
        except KeyboardInterrupt as e:  # e.g. %lm pin of a long state, waiting for its prefill
            if hasattr(e, "_render_traceback_"):  # one line already (a load that finished first)
                raise
            swapped = self.session.made_backend is not before
            raise cell_interrupt(f"%lm {args.command} was stopped"
                                 f"{_stopped_state(args.command, self.session, swapped)}") from None
        finally:
            # a new backend (%lm load, %lm connect; also one a Ctrl-C stopped once the backend was
            # swapped): the old cells' paths are gone with the old one
            if self.session.made_backend is not before:
                self.recent_cells.clear()
                self.tree_view = None  # it showed the old engine's nodes (as ghosts, once refreshed)

    def show_tree(self) -> None:
        """Display the radix tree view (``%lm tree``)."""
        from lmnb_kernel.widgets import TreeView, kv_bytes_per_token

        if not self.session.started:
            return commands.say(f"no radix tree yet: {NOT_STARTED}")
        engine = self.session.engine("%lm tree", NO_TREE_ROUTE)
        self.tree_view = TreeView(kv_bytes_per_token=kv_bytes_per_token(engine.model_info()))
        snapshot = engine.tree_snapshot()
        self.tree_view.show(snapshot, **self.tree_labels(engine, snapshot))

    def refresh_tree(self, result=None) -> None:
        """post_run_cell hook: redraw the tree shown by ``%lm tree`` (if any) in place; not in a
        headless run (``lmnb run``), whose saved notebook shows each tree as it was at its cell
        (refreshed, it showed the cells after it)."""
        if self.tree_view is None or not self.session.started or self.session.remote is not None:
            return
        if os.environ.get(VIEW_ENV) == "headless":
            return
        engine = self.session.engine("%lm tree")
        snapshot = engine.tree_snapshot()
        self.tree_view.refresh(snapshot, **self.tree_labels(engine, snapshot))

    def tree_labels(self, engine, snapshot=None) -> dict:
        """``TreeView`` arguments besides ``snapshot`` (``engine.tree_snapshot()``, taken when
        None): ``paths`` (label -> radix node where the tokens of each named state and recent
        unnamed cell end, found with ``Engine.match_node``, which leaves LRU order alone; None when
        none of it is cached), ``pinned`` node ids and ``stats``. A label names a state and the cell
        that extended it last, "NAME (cell [N])", or a recent cell, "cell [N]" (``cell_label``), and
        says how much of the path is cached when not all of it is, and why where that is no
        eviction (``tree_paths``)."""
        from lmnb_kernel.tree_paths import cached_note, node_ends
        from lmnb_kernel.widgets.tree import flatten

        ends = node_ends(flatten(engine.tree_snapshot() if snapshot is None else snapshot))
        states = {f"{n.name} ({cell_label(n.cells[-1])})" if n.cells else n.name: n.state
                  for n in self.session.states.values()}
        states.update(self.recent_cells)
        paths = {}
        for label, state in states.items():
            text = state.text()
            try:  # [issue 10] with its images: the text holds one placeholder token per image
                ids = self.session.prompt_ids(state) if text else []
            except ValueError:  # an image that cannot be read any more
                ids = engine.prompt_ids(text)
            match = engine.match_node(ids) if ids else None
            label += cached_note(state, ids, match, ends)
            paths[label] = match[0] if match is not None else None
        return {"paths": paths, "pinned": engine.pinned_node_ids(), "stats": engine.cache_stats()}

    # -- %%lm -----------------------------------------------------------------------------------
    def run_program(self, line: str, cell: str) -> None:
        """Run a ``%%lm`` cell: parse options and body, run the program with a view, capture its variables."""
        from lmnb.export.cells import lm_cell_parts
        from lmnb.template import TemplateError, cell_body, parse, parse_python

        parser = cell_parser()
        words = _split(line)
        shown = _help(parser, words)
        if shown is not None:
            return print(shown)
        try:
            args = parser.parse_args(words)
        except UsageError as e:
            raise UsageError(suggest_option(str(e), parser, "%%lm --help")) from None
        try:
            args.out = checked_out(args, self.shell.user_ns)
        except CellLineError as e:
            raise UsageError(str(e)) from None
        if not cell.strip():
            raise UsageError("%%lm: the cell body is empty; write the prompt below the %%lm line")
        # The prompt as typed, from the running cell: IPython cleans a cell up as Python first (it
        # drops '>>> ' / 'In [1]: ' prompts when the second line has one, blanks whitespace-only
        # lines), which changed the prompt, and the export reads it as typed (a --python body is
        # Python: its clean-up stands). Its first line is the cell's line below the %%lm line, and
        # columns count the indentation an indented cell's lines share, which IPython took off.
        typed = lm_cell_parts(self.running_cells[0].raw_cell) if self.running_cells else None
        first_line, indent, cell_id = 2, "", None
        if typed is not None and typed[0] == line.strip():
            _, body, first_line, indent = typed
            cell = cell if args.python else body
            # The notebook's id of the cell (JupyterLab, Notebook 7 and VS Code send it): only for the
            # %%lm the cell itself holds, not one that Python code (or %run) calls, maybe in a loop.
            cell_id = self.running_cells[0].cell_id
        cell = cell_body(cell)
        count = _cell_number(self.shell)
        filename = f"<%%lm cell {count}>"
        ns = self.shell.user_ns
        try:
            if args.python:
                define_lmnb(self.shell)  # again: the body needs it, which a `del lmnb` took away
                python = parse_python(cell, first_line=first_line, filename=filename, indent=indent)
                program, params = python.program(ns), {}
            else:
                template = parse(cell, first_line=first_line, filename=filename, indent=indent)
                program, params = template.program(), template.bind(ns)
        except TemplateError as e:
            raise CellError(str(e)) from None
        except KeyboardInterrupt:  # (the first JSON schema check imports jsonschema: a second or so)
            raise cell_interrupt("the cell was stopped while it was being read; nothing ran") from None
        captures = python.captures if args.python else template.captures  # (a --python body's literal names)
        try:
            check_cell_names(args.out, captures, args.python, bound=ns)
        except CellLineError as e:
            raise UsageError(str(e)) from None
        defaults = CellOptions(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed).run_kwargs()
        previous = self.session.states.get(args.state) if args.state else None
        rerun = _rerun(previous, cell_id, args.append)
        # the state this cell continues: on a re-run that replaces its turn, the state before it
        start = previous.before if rerun == "replace" else previous.state if previous is not None else None
        starting = not self.session.started
        view = self.make_view(args, count)
        if starting:
            view.loading()
        if start is not None:
            view.on_text("main", start.text(), source=f"state {args.state!r}")
        if not args.quiet:
            view.show()
        with _ending(view):  # (whatever it raises from here on ends the view too)
            backend = self.session.backend()  # (Ctrl-C is held while loading: the model is loaded, the cell stops)
            if starting:
                view.loaded(self._prefix_chars())
            listener = Listener()
            try:
                state = start_run(program, params, backend, defaults, listener, start)
            except KeyboardInterrupt:  # (the body may have started: stop every program it began)
                with held_interrupts():
                    for executor in list(listener.roots):
                        executor.abort()
                raise cell_interrupt("the cell was stopped as it started; the named state is as it was") from None
            feeder = ViewFeeder(view, state.stream_executor.sid)
            try:
                outcome = run_cell(state, listener, feeder, view)
            except KeyboardInterrupt as interrupt:
                outcome = getattr(interrupt, "lmnb_outcome", None)  # None: a second Ctrl-C cut the abort short
                refusal = self.finish(args, view, outcome, count, cell_id, rerun) if outcome is not None else None
                raise cell_interrupt(_with(refusal, "the cell was stopped; its output so far and the variables it "
                                                    "finished are kept")) from None
            message = None
            if outcome.error is not None:
                message = _describe(outcome.error, filename, None if args.python else template)
                # the prompt alone is too long (the engine's words, also through lmnb serve): a state that grew
                if start is not None and "tokens exceeds the model's context length" in message:
                    message += self._overflow_hint(args.state, start)
                elif start is not None and "exceeds the model's context length" in message:
                    message += self._state_and_tokens_hint(args.state, start, message)
            refusal = self.finish(args, view, outcome, count, cell_id, rerun, message)
            if message is not None:
                raise CellError(_with(refusal, message)) from outcome.error
            if outcome.status == "interrupted":  # the view's Stop button: a Run-All stops here, as at Ctrl-C
                raise cell_interrupt(_with(refusal, "the cell was stopped by its Stop button; its output so far and "
                                                    "the variables it finished are kept"))
            if refusal is not None:
                raise UsageError(refusal)

    def _overflow_hint(self, name: str, state) -> str:
        """What to do about a ``--state`` cell whose prompt went past the model's context: the state
        grew past it, or, where the in-process engine shows the state fits, this cell's text on top
        of it did (then the hint to reset the state alone misled: the cell's own text was too long)."""
        fix = f"`%lm reset {name}` starts it afresh, or continue in a new --state"
        if self.session.remote is None:
            context_len = self.session.engine("%%lm").context_len
            try:
                held = len(self.session.prompt_ids(state))
            except ValueError:  # an image of the state that cannot be read any more
                held = context_len
            if held < context_len:
                return (f"\nthe state {name!r} holds {held} of those tokens (the model's context is {context_len}): "
                        f"shorten this cell's text, or {fix}")
        return f"\nthe state {name!r} has grown past the model's context; {fix}"

    def _state_and_tokens_hint(self, name: str, state, message: str) -> str:
        """What to say of a ``--state`` cell whose prompt fits the model's context but not with its
        new tokens (``message``: the engine's "prompt of N tokens + max_tokens=M exceeds ..."),
        where the state holds so many of them that the cell would fit without it: "shorten the
        prompt" named the cell's few lines. Nothing where it would not fit even so (the fix is
        lowering max_tokens), or where the state's tokens cannot be counted here (a server)."""
        said = _PROMPT_AND_NEW.search(message)
        if said is None or self.session.remote is not None:
            return ""
        prompt, new = map(int, said.groups())
        try:
            held = len(self.session.prompt_ids(state))
        except ValueError:  # an image of the state that cannot be read any more
            return ""
        context_len = self.session.engine("%%lm").context_len
        if prompt - held + new > context_len:
            return ""
        return (f"\nthe state {name!r} holds {held} of those {prompt} tokens: `%lm reset {name}` starts it afresh, "
                "or continue in a new --state")

    def make_view(self, args, count):
        """The cell's view for its options and ``$LMNB_VIEW`` (live widget, static or headless).
        Output that is captured (``%%capture``) gets a static view shown as the run starts and
        replaced once as it ends: a live widget's comm messages bypass the capture and reached the
        frontend, which made a widget model that nothing showed, while what was captured was a
        widget view whose model closed with the cell; and static frames would each be kept."""
        from lmnb_kernel.widgets import RunView
        from lmnb_kernel.widgets.tree_view import captured_outputs

        mode = os.environ.get(VIEW_ENV, "live")
        captured = captured_outputs(self.shell) is not None
        live = not args.static and mode == "live" and not captured
        rate = _FRAMES_PER_S["live" if live else mode if mode == "headless" else "static"]
        title = cell_label(count) + (f" · state {args.state}" if args.state else "")
        return RunView(title, live=live, updates=not captured, max_hz=rate,
                       prefix_chars=self._prefix_chars() if self.session.started else None)

    def _prefix_chars(self):
        """The in-process engine's tokenizer mapping cached tokens to the characters shaded as
        cached (``prefix_chars_from``); None over a server, which says ``cached_chars`` itself."""
        from lmnb_kernel.widgets import prefix_chars_from

        return prefix_chars_from(self.session.engine("%%lm")) if self.session.remote is None else None

    def finish(self, args, view, outcome: CellOutcome, count, cell_id, rerun,
               message: Optional[str] = None) -> Optional[str]:
        """Put the results in the kernel namespace and keep the named state, then freeze the view
        and show the summary: a Ctrl-C while the view draws stops the cell in one line and loses
        no result. ``cell_id``: the cell's Jupyter id (None: none was sent); ``rerun``: what a re-run
        does with the cell's earlier turn in the state (``_rerun``; None: not a re-run), which the
        summary says. ``message``: the failed cell's error as its ``CellError`` says it, which the
        view shows too (the raw error read "ProgramError: the body of program 'cell' failed:
        TemplateRuntimeError: line 2, ...", the same error in lmnb's inner words); None: the
        outcome's own error, if any.

        Returns:
            The refusal of the results whose names, computed as a ``--python`` body ran, the
            checks before the cell ran could not see (``_refused``), None where there are none:
            the caller raises it once the cell is finished."""
        # Variables the program finished are results even if a later part failed or was stopped.
        kept_in = args.state if outcome.status == "done" else None  # (a failed cell leaves the state as it was)
        variables = _readable(outcome.captured, args.out, kept_in)
        refused = _refused(variables, args.out, self.shell.user_ns)
        variables = {name: value for name, value in variables.items() if name not in refused}
        refusal = _refusal(refused, variables, args.out, kept_in)
        # (interactive: the user's variables, listed by %who, as a Python cell's assignments are)
        self.shell.push(variables, interactive=True)
        if args.out:
            self.shell.push({args.out: outcome.state}, interactive=True)
        if outcome.status == "done" and args.state:
            self.session.keep(args.state, outcome.state, count, cell_id, replace=rerun == "replace")
        elif outcome.status == "done" and self.session.remote is None:  # labels a path in %lm tree
            self.recent_cells[cell_label(count)] = outcome.state
            while len(self.recent_cells) > RECENT_CELLS:
                del self.recent_cells[next(iter(self.recent_cells))]
        try:
            view.finish(outcome.status, error=message if message is not None else outcome.error)
            tokens = _tokens(view.model)
            self.session.totals.add(tokens["prompt_tokens"], tokens["cached_tokens"], tokens["completion_tokens"],
                                   outcome.status)
            if not args.quiet:
                meta = {"lmnb": {"tokens": tokens, "captured": list(variables), "status": outcome.status}}
                if outcome.interrupt_s is not None:  # Ctrl-C: how long stopping the requests took
                    meta["lmnb"]["interrupt_s"] = round(outcome.interrupt_s, 3)
                note = _rerun_note(rerun, args.state) if outcome.status == "done" else None
                display(cell_summary(variables, tokens, args.state, note), raw=True, metadata=meta)
        except KeyboardInterrupt:
            raise cell_interrupt(_with(refusal, "the cell was stopped while its view was drawn; its results are "
                                                "kept")) from None
        return refusal


def _rerun(named, cell_id, append: bool):
    """What a ``--state`` cell with Jupyter id ``cell_id`` does with its earlier turn in ``named``
    (the state's ``NamedState``, None if there is none yet): "replace" when it was the last cell to
    extend the state (it runs from the state before that turn); "kept" when other cells extended it
    since (it adds another turn: rewinding would drop theirs); None when it never extended it,
    without a cell id, or with ``--append`` (it adds another turn, as asked)."""
    if named is None or cell_id is None or cell_id not in named.cell_ids or append:
        return None
    return "replace" if named.last_cell_id == cell_id else "kept"


def _rerun_note(rerun, name: str):
    """The summary's line for a re-run (``_rerun``), None for a first run."""
    if rerun == "replace":
        return f"re-run: replaced this cell's earlier turn in state {name!r} (--append adds another instead)"
    if rerun == "kept":
        return (f"re-run: state {name!r} still holds this cell's earlier turn, as later cells extended it; "
                f"to start over, %lm reset {name} and re-run its cells in order")
    return None


def _where_kept(name: str, out: Optional[str], state: Optional[str]) -> str:
    """Where the result ``name``, which became no kernel variable, can be read: in ``out``'s
    state (the cell's ``--out``), or in the named state ``state`` (the cell's ``--state``, None
    where the state was not kept: a failed cell leaves it as it was), else nowhere any more."""
    if out:
        return f"the result is kept in the cell's state only, {out}[{name!r}] reads it"
    if state:
        return (f"the result is kept in state {state!r} only, which a later %%lm --state {state} --out st cell "
                f"reads as st[{name!r}]")
    return f"the result was kept nowhere: run the cell again with --out st, and st[{name!r}] reads it"


def _readable(captured: dict, out: Optional[str], state: Optional[str]) -> dict:
    """The results of ``captured`` that code can read back as kernel variables. A ``--python``
    body's name computed as it ran (``gen(f"my {x}")``; a literal one is refused as the cell is
    read) may be no Python name: that result is kept in the state only, and said so on stderr,
    with where it can be read (``_where_kept``: ``out``, ``state``); it became a variable no code
    could read, without a word."""
    from lmnb.template.python_cell import result_name_problem, variable_name_for

    readable = {}
    for name, value in captured.items():
        problem = result_name_problem(name)
        if problem is None:
            readable[name] = value
        else:
            sys.stderr.write(f"lmnb: the result {name!r} is in no kernel variable: {problem} ("
                             f"{_where_kept(name, out, state)}); name it {variable_name_for(name)!r} to have the "
                             f"variable\n")
    return readable


def _refused(variables: dict, out: Optional[str], bound: dict) -> dict:
    """``{name: why}`` of the results of ``variables`` that may not become kernel variables, by the
    checks the cell's names pass before it runs (``check_cell_names``: Python's builtins,
    ``get_ipython``, ``lmnb``, dunder names, IPython's own, the ``--out`` name
    ``out``): a ``--python`` body's name computed as it ran (``gen(f"{x}")``) is known only now,
    and ``print`` hid print() from every later cell. The name each refusal offers is no kernel
    variable (``bound``, the namespace) already."""
    refused = {}
    for name in variables:
        try:
            check_cell_names(out, [name], python=True, taken=variables, bound=bound)
        except CellLineError as e:
            refused[name] = str(e)
    return refused


def _refusal(refused: dict, pushed: dict, out: Optional[str], state: Optional[str]) -> Optional[str]:
    """The error for the ``refused`` results (``_refused``), each with where it is kept
    (``_where_kept``: ``out``, ``state``), and the kernel variables the cell did set (``pushed``,
    and ``out``'s state). None where none was refused."""
    if not refused:
        return None
    lines = [f"{why} (its name was computed as the body ran: {_where_kept(name, out, state)})"
             for name, why in refused.items()]
    set_ = [*pushed, *([f"{out} (--out)"] if out else [])]
    lines.append(f"the cell's other results are set: {', '.join(set_)}" if set_ else
                 "the cell set no other kernel variable")
    return "\n".join(lines)


def _with(refusal: Optional[str], message: str) -> str:
    """``message``, then ``refusal`` (``_refusal``) on the lines after it, if any."""
    return message if refusal is None else f"{message}\n{refusal}"


def _tokens(model) -> dict:
    tokens = {
        "prompt_tokens": model.cell.prompt_tokens,
        "cached_tokens": model.cell.cached_tokens,
        "completion_tokens": sum(r.completion_tokens or 0 for r in model.requests) + model.unfinished_tokens,
    }
    if model.unfinished_gens:  # their prompts are in no count: the summary says "unknown", not a false 0
        tokens["unreported_prompts"] = model.unfinished_gens
    return tokens


@contextlib.contextmanager
def _ending(view) -> Iterator[None]:
    """End ``view`` as interrupted (Ctrl-C) or as an error with whatever is raised within, then let
    it go on: a view left "running" by a cell that raised (the program's thread could not start)
    looked like a cell still running, and ``lmnb run --allow-errors`` reported the failed cell as
    an unfinished view, cut short by a late update. A view already ended is left as it is."""
    try:
        yield
    except BaseException as e:
        if not view.finished:
            interrupted = isinstance(e, KeyboardInterrupt)
            try:
                view.finish("interrupted" if interrupted else "error", error=None if interrupted else e)
            except KeyboardInterrupt:  # (Ctrl-C while it draws) the cell's own exception still ends the cell
                pass
        raise


def _failed_holes(error) -> set:
    """The cell offsets (``Expr.cell_offset``) of the holes whose primitives failed as ``error``
    (a ``ProgramError``) ran: its own primitive's, or those of every failed branch of a
    ``ForkError``, a nested fork's too; None among them for a failure at no hole."""
    from lmnb.executor import ForkError

    if isinstance(error, ForkError) and error.errors:
        return set().union(*(_failed_holes(e) for e in error.errors.values()))
    return {getattr(getattr(error, "primitive", None), "cell_offset", None)}


def _describe(error: BaseException, filename: str, template=None) -> str:
    """One message for a failed cell: the template's own position, the hole of the ``template``'s
    primitive that failed as it ran (a gen the backend refused; in a fork, the one hole where all
    the failed branches failed), or the cell line of Python code."""
    from lmnb.executor import ForkError, ProgramError
    from lmnb.template import TemplateError
    from lmnb.template.errors import TemplateRuntimeError

    chain = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__
    for exc in chain:
        if isinstance(exc, TemplateError):
            return str(exc)
    holes = _failed_holes(error) if isinstance(error, ProgramError) else {None}
    if template is not None and len(holes) == 1 and None not in holes:  # (fork branches that all failed there too)
        return str(TemplateRuntimeError(str(error), template.source, holes.pop(), template.first_line,
                                        indent=template.indent))
    if isinstance(error, ForkError):  # the join's line says nothing of which branch failed where
        return f"ForkError: {error}"
    site = getattr(error, "site", None)
    if isinstance(error, ProgramError) and site is not None and site.filename == filename:
        # a --python body's primitive that failed as it ran: the line that added it
        return f"line {site.lineno}: {type(error).__name__}: {error}"
    for exc in reversed(chain):  # innermost first: where the cell's own code failed
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
        if frames:
            return f"line {frames[-1].lineno}: {type(exc).__name__}: {exc}{_lmnb_name_hint(exc, template)}"
    return f"{type(error).__name__}: {error}"


def _lmnb_name_hint(error: BaseException, template) -> str:
    """"; " and ``lmnb_name_fix``'s words for a ``--python`` body's NameError of a name lmnb exports
    (``gen``, ``select``, ``image``, ``user``, ...); else ""."""
    from lmnb.template.python_cell import lmnb_name_fix

    fix = lmnb_name_fix(error.name) if template is None and type(error) is NameError and error.name else ""
    return f"; {fix}" if fix else ""
