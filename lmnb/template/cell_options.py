"""The options of a ``%%lm`` line, defined once for the magic and the exporter.

``lmnb_kernel.magics.cell_parser`` builds IPython's ``MagicArgumentParser`` with
``add_cell_options``; the notebook exporter reads a cell's first line with ``parse_cell_line``
(a plain ``argparse`` parser from the same function), because lmnb cannot import the kernel
package (imports go lmnb_kernel → lmnb).
"""

from __future__ import annotations

import argparse
import re
import shlex
import unicodedata
from dataclasses import dataclass
from typing import Collection, Optional, Sequence

from lmnb_engine.cli_options import (Once, OnceFlag, digits_fix, option_integer, option_number, pool_tokens,
                                     suggest_option)
from lmnb_engine.params import TEMPERATURE_RULE, past_digit_limit, shown_integer_text, too_many_digits
from lmnb.template.parser import IPYTHON_BUILTINS, PYTHON_BUILTINS
from lmnb_engine.suggest import close_match

# Rule for ``--state`` names (letters, digits, ``_ . -``; not starting with a digit).
STATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
STATE_NAME_RULE = "a state name starts with a letter or _ and goes on with letters, digits, _ . or - (e.g. chat.v2)"


def _temperature(text: str) -> float:
    """argparse ``type=`` of ``--temperature``: a finite number >= 0 in ASCII digits (a bad one
    failed mid-run; ``option_number``: "1_0" and "１.５", which ``float()`` reads, are refused
    naming the fix)."""
    value = option_number(text)
    if value is None or not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{TEMPERATURE_RULE}, got {_given(text)}{digits_fix(text, number=True)}")
    return value


def _token_count(text: str) -> int:
    """argparse ``type=`` of ``--max-tokens``: an integer >= 0 in ASCII digits (``option_integer``:
    "1_0" and "１０", which ``int()`` reads, are refused naming the fix), of at most the digits
    Python reads (one longer was told it is no integer >= 0). Leading zeros are no digits
    (``integer_text_value``): 5000 zeros and a 7 is 7, where it was told it has more digits than
    Python reads."""
    value = option_integer(text)
    if value is None and too_many_digits(text) and not digits_fix(text):
        raise argparse.ArgumentTypeError(f"got {_given(text)}, {past_digit_limit()}; give at most the model's context "
                                         "length")
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {_given(text)}{digits_fix(text)}")
    return value


def _seed(text: str) -> int:
    """argparse ``type=`` of ``--seed``: an integer the engine takes (64 bits); a bigger one failed
    mid-run, and only in gens outside a fork (a branch derives its own seed from it). Leading zeros
    are no digits (``integer_text_value``): 5000 zeros and a 7 is 7, where ``int()`` refused it for
    its length and the refusal said 7 does not fit. ASCII digits only, as ``--max-tokens``."""
    value = option_integer(text)
    if value is None or not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer that fits in 64 bits, got {_given(text)}"
                                         f"{digits_fix(text)}")
    return value


def _given(text: str) -> str:
    """An option's ``text`` as its refusal shows it: quoted, but an integer of more digits than
    Python reads (thousands: each was echoed whole) as ``shown_integer_text`` writes it."""
    return shown_integer_text(text) if too_many_digits(text) else repr(text)


def add_cell_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``%%lm`` options, with their help texts, to ``parser``; returns ``parser``."""
    parser.add_argument("--python", action=OnceFlag,
                        help="the body is Python: an lmnb program body with the state as `s`")
    parser.add_argument("--state", metavar="NAME", action=Once,
                        help="continue the named program state (created by the first cell that names it); "
                             "its prefix stays in the KV cache; re-running the cell that extended it last "
                             "replaces that cell's earlier turn")
    parser.add_argument("--append", action=OnceFlag,
                        help="with --state: a re-run adds another turn to the state instead of replacing this "
                             "cell's earlier one")
    parser.add_argument("--temperature", type=_temperature, action=Once, help="default temperature of every gen (0 = greedy)")
    parser.add_argument("--max-tokens", type=_token_count, dest="max_tokens", action=Once, help="default max_tokens of every gen")
    parser.add_argument("--seed", type=_seed, action=Once, help="seed for sampling, so a sampled cell can be repeated")
    parser.add_argument("--out", metavar="VAR", action=Once, help="also store the program state in kernel variable VAR")
    parser.add_argument("--quiet", action=OnceFlag, help="show nothing; still capture variables")
    parser.add_argument("--static", action=OnceFlag,
                        help="no live widget: update the output in place (display_id) while running")
    return parser


@dataclass(frozen=True)
class CellOptions:
    """The options of one ``%%lm`` line.

    python: the body is an lmnb program body (``%%lm --python``); state: named state to create or
    continue; temperature / max_tokens / seed: the run's sampling defaults (None = lmnb's);
    out: kernel variable that also gets the program state. ``--quiet`` and ``--static`` only change
    the display and are not kept, nor is ``--append``: it only changes how the kernel re-runs a
    cell, and an exported program runs each cell once.
    """

    python: bool = False
    state: Optional[str] = None
    temperature: Optional[float] = None
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    out: Optional[str] = None

    def run_kwargs(self) -> dict:
        """Keyword arguments of ``SglFunction.run`` these options set (the magic and the exporter both
        pass these)."""
        kw = {}
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.max_tokens is not None:
            kw["max_new_tokens"] = self.max_tokens
        if self.seed is not None:
            kw["seed"] = self.seed
        return kw


class CellLineError(ValueError):
    """The ``%%lm`` line cannot be read; the message names the option and the fix."""


class _Parser(argparse.ArgumentParser):
    """The exporter's parser of a ``%%lm`` / ``%lm load`` / ``%lm connect`` line, which takes what
    the kernel's takes (``lmnb_kernel.magics``): no prefix of an option (``allow_abbrev`` off:
    ``--dtyp`` is refused, where argparse read it as ``--dtype``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):  # argparse would print usage and exit
        raise CellLineError(message)


def add_load_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of ``%lm load`` (the magic's and the exporter's)."""
    parser.add_argument("model", nargs="?", help="Hugging Face checkpoint directory or hub id (or a preset with "
                        "--random-weights), or demo for the built-in demo model; default: $LMNB_MODEL, else "
                        "the demo model")
    parser.add_argument("--device", action=Once, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", action=Once, help="bfloat16, float16 or float32 (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--max-total-tokens", type=pool_tokens, action=Once, help="KV pool size in tokens")
    parser.add_argument("--random-weights", action=OnceFlag, help="seeded random weights (benchmarks)")
    return parser


def add_connect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of ``%lm connect`` (the magic's and the exporter's)."""
    from lmnb.backend.runtime_endpoint import MODEL_INFO_TIMEOUT_S, READ_TIMEOUT_S
    from lmnb_engine import API_KEY_ENV

    parser.add_argument("url", help="server URL, e.g. http://127.0.0.1:30000 (with --openai: its /v1 root)")
    parser.add_argument("--openai", metavar="MODEL", action=Once, help="the server is OpenAI-compatible; use this model name")
    parser.add_argument("--completion", action=OnceFlag,
                        help="with --openai: a completion model (prompts go out as text, not chat messages)")
    parser.add_argument("--continue-final-message", action=OnceFlag,
                        help="with --openai, a chat model on a vLLM, SGLang or lmnb serve server: a gen after text "
                             "inside an assistant message has the server continue that text (their "
                             "continue_final_message field, which OpenAI's API lacks)")
    parser.add_argument("--api-key", action=Once, help=f"API key sent to the server (default: ${API_KEY_ENV} in the "
                        "kernel's environment; with --openai: $OPENAI_API_KEY)")
    parser.add_argument("--timeout", type=positive_seconds, metavar="SECONDS", action=Once,
                        help=f"seconds to wait for the server's response before the cell fails "
                             f"(default {READ_TIMEOUT_S:g}); connecting to an SGLang-protocol server waits at "
                             f"most {MODEL_INFO_TIMEOUT_S:g} s (or this, if less) for its model info")
    return parser


def positive_seconds(text: str) -> float:
    """A command-line number of seconds, > 0 (argparse ``type=``; also the batch job's options).

    Raises:
        argparse.ArgumentTypeError: not a number in ASCII digits (``option_number``), not positive
            (or NaN)."""
    value = option_number(text)  # (argparse's own words named the function: "invalid positive_seconds value")
    if value is None or not value > 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}"
                                         f"{digits_fix(text, number=True)}")
    return value


def close_subcommand(word: str, subcommands) -> Optional[str]:
    """The ``%lm`` subcommand of ``subcommands`` (names) that ``word`` most likely misspells: itself
    in another case (``%lm HELP``, which difflib's case-sensitive match missed), else the closest
    name (``%lm stat``); None if none is close. The kernel and the export both say it."""
    if word.lower() in subcommands:
        return word.lower()
    return close_match(word.lower(), subcommands)


def parse_backend_line(command: str, words: list[str]) -> argparse.Namespace:
    """The arguments of a ``%lm load`` / ``%lm connect`` line (``words`` after the command).

    Raises:
        CellLineError: an unknown option or a missing URL.
    """
    add = add_load_arguments if command == "load" else add_connect_arguments
    parser = add(_Parser(prog=f"%lm {command}", add_help=False))
    try:
        return parser.parse_args(words)
    except (argparse.ArgumentError, CellLineError) as e:  # (the kernel's %lm line offers the same)
        raise CellLineError(suggest_option(str(e), parser, f"%lm {command} --help")) from None


def option_parser() -> argparse.ArgumentParser:
    """The ``%%lm`` options as a plain ``argparse`` parser (raises ``CellLineError``, never exits)."""
    return add_cell_options(_Parser(prog="%%lm", add_help=False))


def asks_for_python(line: str) -> bool:
    """Whether the ``%%lm`` line ``line`` (the text after ``%%lm``) makes the cell's body Python
    (``--python``), its words read as the magic reads them (``shlex``: ``"--python"`` is
    ``--python``). A line ``shlex`` cannot read (an unclosed quote: the magic refuses the cell) is
    split at its spaces, as these readers read every line before.
    For readers of a cell that do not run it: completion, ``is_complete``, the lmnb name watch."""
    try:
        return "--python" in shlex.split(line)
    except ValueError:
        return "--python" in line.split()


def parse_cell_line(line: str) -> CellOptions:
    """Options of a ``%%lm`` line (the text after ``%%lm``).

    Raises:
        CellLineError: unknown option, bad value, or an invalid ``--state`` / ``--out`` name.
    """
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise CellLineError(f"cannot read the options {line!r}: {e}") from None
    args = _parse(words)
    return CellOptions(args.python, args.state, args.temperature, args.max_tokens, args.seed, checked_out(args))


def checked_out(args: argparse.Namespace, bound: Collection[str] = ()) -> Optional[str]:
    """``args.out`` NFKC-normalized, as Python code reads the name, after checking ``args.state``,
    ``args.append`` and ``args.out`` (the magic's and the exporter's check). The name a refusal
    offers is none of ``bound`` (the kernel's namespace, ``check_cell_names``).

    Raises:
        CellLineError: a ``--state`` that breaks ``STATE_NAME_RULE``; ``--append`` without ``--state``;
        an ``--out`` that is not a Python name, or is a keyword Python code could never read (``--out if``).
    """
    from lmnb.template.parser import is_reserved

    if args.state is not None and not STATE_NAME.match(args.state):
        raise CellLineError(f"--state {args.state!r} is not a valid name: {STATE_NAME_RULE}")
    if args.append and args.state is None:  # (it would do nothing, silently)
        raise CellLineError("--append only applies to a --state cell; add --state NAME, or remove --append")
    if args.out is None:
        return None
    if not args.out.isidentifier():
        raise CellLineError(f"--out {args.out!r} is not a valid name: --out takes a Python variable name")
    out = unicodedata.normalize("NFKC", args.out)
    if is_reserved(out):
        free = out + "_"
        while free in bound:
            free += "_"
        raise CellLineError(f"--out {args.out!r} is reserved in Python, so the variable could never be read; "
                            f"pick another name, e.g. --out {free}")
    return out


# The names every IPython shell defines for itself (InteractiveShell.init_user_ns, less get_ipython,
# refused with its own words, and open, a builtin), listed for the exporter, which has no shell.
_IPYTHON_NAMES = frozenset({"In", "Out", "_ih", "_oh", "_dh", "exit", "quit"})
# IPython's history names, which it sets as cells run: _, __, ___ (the last outputs), _i, _ii, _iii
# (the last inputs), _iN and _N (cell N's input and output).
_HISTORY_NAME = re.compile(r"_{1,3}|_i{1,3}|_i?[0-9]+")


def _is_dunder(name: str) -> bool:
    """``__name__``-shaped: Python's and IPython's own names (``__builtins__``, ``__name__``)."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _name_problem(what: str, name: str, python: bool) -> Optional[str]:
    """Why the result or ``--out`` (``what``) ``name`` may not be a kernel variable, without the fix;
    None if it may (``check_cell_names``)."""
    if name == "get_ipython":
        return (f"{what} {name!r} would replace IPython's get_ipython, which every magic (%%lm and %lm included) "
                f"calls, so no magic could run after this cell")
    if name == "lmnb":
        return (f"{what} {name!r} would replace the lmnb module, which %%lm --python bodies call (lmnb.gen, "
                f"lmnb.select), so every later --python cell would fail")
    if name in _IPYTHON_NAMES:  # (before the builtins: Python's exit and quit are IPython's in a kernel)
        return (f"{what} {name!r} would replace IPython's {name}, one of the names it defines for itself (In, Out, "
                f"_ih, _oh, _dh, exit, quit), which IPython and later cells read ({{gen Out}} made every cell that "
                f"shows a value fail)")
    # (IPython's display listed, not looked up: a plain Python run of the exporter has no kernel's
    # builtins, and both refuse the same names; get_ipython was refused above in its own words)
    if name in PYTHON_BUILTINS or name in IPYTHON_BUILTINS:
        # (a --python body's results go in the state as it runs: only a template's later holes read them)
        holes = (f", and a later hole of this cell calling {name}(...) would call the result"
                 if what == "the result" and not python else "")
        hidden = (f"IPython's {name}, which a kernel adds to the builtins" if name in IPYTHON_BUILTINS else
                  f"Python's builtin {name}")
        return (f"{what} {name!r} would hide {hidden}: it becomes a kernel variable, which every later cell reads "
                f"instead{holes}")
    if _is_dunder(name):
        return (f"{what} {name!r} is a dunder name (__...__), which Python and IPython keep for themselves: as a "
                f"kernel variable it could break every later cell (__builtins__ made each one fail)")
    if _HISTORY_NAME.fullmatch(name):
        return (f"{what} {name!r} is one of IPython's history names (_, __, ___, _i, _ii, _iii, _iN, _N), which "
                f"IPython sets itself as cells run: it would overwrite the result, or the result its history")
    return None


def _free_name(name: str, python: bool, taken: Collection[str] = ()) -> str:
    """A name like ``name`` that ``check_cell_names`` takes (``print_``, ``builtins`` for
    ``__builtins__``, ``i1`` for ``_i1``) and that is none of ``taken`` (the cell's other names: a
    fix that renamed ``{gen Out}`` to an ``Out_`` the cell also captures made one result overwrite
    the other; the kernel's variables), for the fix of a refusal."""
    from lmnb.template.parser import is_reserved

    free = name.strip("_") or "value"
    if free == name:
        free += "_"
    elif not free.isidentifier():  # (_5: cell 5's output)
        free = f"value{free}"
    while is_reserved(free) or _name_problem("", free, python) is not None or free in taken:
        free += "_"
    return free


def check_cell_names(out: Optional[str], captures: Sequence[str], python: bool = False,
                     taken: Collection[str] = (), bound: Collection[str] = ()) -> None:
    """The checks of a ``%%lm`` cell's variable names, once its body is read (the magic's and the
    exporter's, so a notebook the kernel refuses does not export): ``out`` is the cell's ``--out``
    (``checked_out``), ``captures`` the variables its prompt template captures (a ``--python``
    body's: those it names with a string literal, ``PythonCell.captures``; others are known only
    as it runs); ``python``: the body is Python (``--python``). IPython's own names are listed here,
    not read from a shell, so the exporter, which has none, refuses the same names. The names a
    kernel's start-up or an extension hid from ``%who`` (``user_ns_hidden``) are the user's to
    replace, as a Python cell may. ``taken``: the cell's other names (a ``--python`` body's results
    named as it ran), which, as ``captures`` and ``out``, the name a refusal offers is none of;
    nor is it one of ``bound``, the names the kernel's namespace binds (``user_ns``; the exporter
    has none): the fix named a variable the user already had, which following it overwrote.

    Raises:
        CellLineError: a result or ``--out`` named ``get_ipython`` (it replaced IPython's, which runs
            every magic, so no later ``%%lm`` or ``%lm`` cell could run) or ``lmnb`` (it replaced the
            module that ``--python`` bodies call, so every later one failed); one named like a Python
            builtin (``{gen print}``, ``--out type``) or IPython's ``display``: the kernel variable
            would hide the builtin in every later cell (``print(...)`` called the text; it was only
            warned about), and a later hole of a template cell calling it (``{len(xs)}`` after
            ``{gen len}``) would call the result; a dunder name (``{gen __builtins__}`` made every
            later Python cell fail), one of IPython's history names (``_``, ``_i``, ``_i3``, ``_3``)
            or a name of IPython's own (``In``, ``Out``, ``exit``; ``{gen Out}``
            made every cell that shows a value fail); an ``--out`` that is also a captured variable
            (the state would overwrite the value). Each message ends with a name that would be taken.
    """
    names = {*captures, *taken, *([out] if out is not None else [])}  # (with bound, the offered name is none of them)
    for what, name in [*(("the result", c) for c in captures), ("--out", out)]:
        if name is None:
            continue
        problem = _name_problem(what, name, python)
        if problem is not None:
            raise CellLineError(f"{problem}; rename it, e.g. {_free_name(name, python, names | set(bound))}")
    if out is not None and out in captures:
        state = out + "_state"
        while state in names or state in bound:
            state += "_"
        raise CellLineError(f"--out {out} is also a variable the cell captures ({{gen {out}}}/{{select {out}}}), "
                            f"which --out would overwrite with the program state; give --out another name, e.g. "
                            f"--out {state}")


def _parse(words: list[str]) -> argparse.Namespace:
    parser = option_parser()
    try:
        return parser.parse_args(words)
    except (argparse.ArgumentError, CellLineError) as e:  # (ArgumentError instead of error() on some Pythons)
        raise CellLineError(suggest_option(str(e), parser, "%%lm --help")) from None
