"""argparse actions that refuse an option given twice on one command line.

argparse keeps the last of a repeated option silently, so ``lmnb run -o a.ipynb -o b.ipynb`` wrote
b.ipynb only and ``--temperature 0 --temperature 1`` sampled. Every lmnb command line (``%%lm``,
``%lm load`` / ``%lm connect``, ``lmnb run`` / ``export`` / ``serve`` / ``install-kernel``, an
exported job's options) stores its options with these instead; options meant to repeat keep
``action="append"``. Defined here, at the bottom of the import chain (lmnb_kernel → lmnb →
lmnb_engine), so that all of them share it without importing torch. Also: how an engine's error
names its fix in each front end's syntax (``option_error``, ``in_option_syntax``).
"""

from __future__ import annotations

import argparse
import re
import sys
import weakref
from typing import Optional

from lmnb_engine.params import integer_text_value
from lmnb_engine.suggest import close_match, did_you_mean


def _nowhere() -> None:
    return None


class _GivenOnce(argparse.Action):
    """Remembers the namespace this option was last parsed into, to refuse it a second time there.
    The namespace's value cannot tell: an option whose default is not None (``--port 30000``) holds
    a value before it is given. A weak reference, not an attribute on the namespace, which
    ``vars(args)`` would show."""

    _given_in = staticmethod(_nowhere)

    def _refuse_repeat(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> None:
        if self._given_in() is namespace:
            parser.error(f"{'/'.join(self.option_strings)} is given twice; give it once")
        self._given_in = weakref.ref(namespace)


class Once(_GivenOnce):
    """``action="store"`` (the default action), refusing the option a second time."""

    def __call__(self, parser, namespace, values, option_string=None):
        self._refuse_repeat(parser, namespace)
        setattr(namespace, self.dest, values)


class OnceFlag(_GivenOnce):
    """``action="store_true"``, refusing the flag a second time: ``--quiet --quiet`` is a slip (a line
    edited twice, a pasted option) worth a word, not a silent no-op. ``default`` is False unless
    given (the batch job's ``--completion`` is None when not given, to tell it from the notebook's)."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        self._refuse_repeat(parser, namespace)
        setattr(namespace, self.dest, True)


# An integer option's text: a sign and the ASCII digits 0-9, ASCII whitespace around. int() also
# reads "1_0" (Python's digit separator) and any script's decimal digits ("１０", fullwidth), which an
# option's value written so is more likely a slip than meant: such text is refused, naming the fix.
_OPTION_INTEGER = re.compile(r"[-+]?[0-9]+")  # (whitespace around is stripped first, any script's:
# a no-break space pasted after a number is no slip of its digits)


def option_integer(text: str) -> Optional[int]:
    """The value of an integer option's ``text`` (``_OPTION_INTEGER``: ASCII digits, an optional
    sign, whitespace around), leading zeros being no digits (``lmnb_engine.params.integer_text_value``); None where
    ``text`` is written otherwise or its digits past the zeros are more than Python reads. A
    refusal adds ``digits_fix(text)``."""
    return integer_text_value(text.strip()) if _OPTION_INTEGER.fullmatch(text.strip()) else None


# A number option's text (a temperature, seconds): a decimal or exponent number in ASCII, or
# inf/infinity/nan, ASCII whitespace around; float() also reads "1_0" and other scripts' digits
_OPTION_NUMBER = re.compile(r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|(?i:inf|infinity|nan))")


def option_number(text: str) -> Optional[float]:
    """The value of a number option's ``text`` (``_OPTION_NUMBER``: what ``float()`` reads, in ASCII
    digits with no ``_``, whitespace around); None where ``text`` is written otherwise. A refusal adds
    ``digits_fix(text, number=True)``."""
    return float(text) if _OPTION_NUMBER.fullmatch(text.strip()) else None


def digits_fix(text: str, number: bool = False) -> str:
    """The end of the refusal of an integer option's ``text`` (of a number option's, ``number``)
    that ``int()`` (``float()``) reads but ``option_integer`` (``option_number``) does not ("1_0",
    "１０"): how to write it, with its value ("; write it with the digits 0-9 alone: 10"); "" for
    other text."""
    if number:
        try:
            value = None if _OPTION_NUMBER.fullmatch(text.strip()) else float(text)
        except ValueError:
            value = None
    else:
        value = None if _OPTION_INTEGER.fullmatch(text.strip()) else integer_text_value(text)
    return "" if value is None else f"; write it with the digits 0-9 alone (no _, no other script's digits): {value}"


def pool_tokens(text: str) -> int:
    """argparse ``type=`` of ``--max-total-tokens`` (``%lm load``, ``lmnb serve``, an exported job):
    a whole number; argparse's own words were "invalid int value: 'abc'". The engine refuses a
    pool too small, naming the least.

    Raises:
        argparse.ArgumentTypeError: ``text`` is no whole number in ASCII digits (``option_integer``)."""
    value = option_integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be the KV pool's size as a whole number of tokens (e.g. 4096), "
                                         f"got {text!r}{digits_fix(text)}")
    return value


def tcp_port(text: str) -> int:
    """argparse ``type=`` of ``lmnb serve --port``: a whole number (argparse's own words were
    "invalid int value: 'abc'"); ``serve`` refuses one outside 0-65535 before the model loads.

    Raises:
        argparse.ArgumentTypeError: ``text`` is no whole number in ASCII digits (``option_integer``)."""
    value = option_integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a TCP port number, 0-65535 (0: a free one), got {text!r}"
                                         f"{digits_fix(text)}")
    return value


# argparse reads an argument that starts with "-" as an option unless it looks like a negative number,
# which before Python 3.14 is -1 or -1.5 only: `lmnb run -p lr -1e-3` (or -1_000, -0x20, -inf) said
# "argument -p/--parameter: expected 2 arguments", though papermill takes it.
_NEGATIVE_NUMBER = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def take_negative_numbers(parser: argparse.ArgumentParser) -> None:
    """Let ``parser``'s options take any negative number as their value (``-1e-3``, ``-1_000``,
    ``-0x20``, ``-inf``), not only argparse's -1 and -1.5. For a parser none of whose options
    looks like a number (argparse then reads such arguments as values only)."""
    parser._negative_number_matcher = _NEGATIVE_NUMBER


# argparse's refusal of a value not among an argument's choices (group 1: the argument's name, as
# argparse names it; group 2: the value, a str's repr): "argument COMMAND: invalid choice: 'rnu' (choose from ...)"
_INVALID_CHOICE = re.compile(r"argument (.+?): invalid choice: '([^'\\]*)' \(choose from ")


def _suggest_choice(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's ``message`` refusing a value not among an argument's choices (``_INVALID_CHOICE``:
    ``lmnb rnu``, ``lmnb serve --log-level debg``) with the closest choice offered
    (``suggest.did_you_mean``: ``; did you mean 'run'?``); any other as it is."""
    m = _INVALID_CHOICE.match(message)
    choices = next((action.choices for action in parser._actions if m and action.choices is not None
                    and argparse._get_action_name(action) == m.group(1)), None)
    return message if choices is None else message + did_you_mean([m.group(2)], ("", [str(c) for c in choices]))


def _begun(word: str, known: list[str]) -> list[str]:
    """Those of ``known`` (options without their "--") that ``word`` begins, and is not, sorted: the
    options an abbreviation, which the parsers take no more (``allow_abbrev`` off), may have meant."""
    return sorted(k for k in known if k.startswith(word) and k != word) if word else []


def _and_list(items: list[str]) -> str:
    """``items`` in words: ``a``, ``a and b``, ``a, b and c``."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def suggest_option(message: str, parser: argparse.ArgumentParser, help_line: str | None = None) -> str:
    """argparse's ``message`` with "did you mean" for each unrecognized option close to one of
    ``parser``'s (``--temprature`` → ``--temperature``; ``suggest.close_match``), or that begins
    only one of them (``--temp``: ``_begun``); one that begins several is told their names
    (``--sta begins --state and --static; write the option in full``); and, where ``help_line``
    is given (``%%lm --help``), for an unrecognized word with no close option (``--bogus``, a stray
    ``3``) the line that lists the options. A word that is no option (``3``) is offered none. A
    value not among an argument's choices, a subcommand's name among them, is offered the closest
    (``_suggest_choice``). Other messages come back as they are."""
    if not message.startswith("unrecognized arguments:"):
        return _suggest_choice(message, parser)
    message = _long_integers_shown(message)
    known = [o[2:] for action in parser._actions for o in action.option_strings if o.startswith("--")]
    # compared without the "--" every option shares: with it, "--bogus" was "close" to "--out"
    words = message.split()[2:]
    if "--" in words:  # the options after it are read as words: a guess would name them as they are
        return message + " ('--' ends the options; remove it)"
    names = [w.split("=")[0] for w in words if w.startswith("--")]
    begun = {w: _begun(w[2:], known) for w in names}
    # a prefix of several options (--sta: --state, --static) is told them all: a close match was a guess
    ambiguous = [w for w in names if len(begun[w]) > 1]
    guesses = [(w, begun[w][0] if begun[w] else close_match(w[2:], sorted(known))) for w in names if w not in ambiguous]
    hints = [f"{w} → --{g}" for w, g in guesses if g and g != w[2:]]
    notes = [f"did you mean: {', '.join(hints)}?"] if hints else []
    notes += [f"{w} begins {_and_list(['--' + k for k in begun[w]])}; write the option in full" for w in ambiguous]
    if help_line and (len(hints) < len(guesses) or not names):  # (no "--" word: a stray word, as in "%%lm 3")
        notes.append(f"{help_line} lists the options")
    return message + f" ({'; '.join(notes)})" if notes else message


def _long_integers_shown(message: str) -> str:
    """``message`` with each integer of more digits than Python reads (``--n <5001 digits>``: all
    echoed) as every message shows one (``params.shown_integer_text``)."""
    from lmnb_engine.params import shown_integer_text, too_many_digits  # (torch-free)

    def shown(match: re.Match) -> str:
        return shown_integer_text(match.group()) if too_many_digits(match.group()) else match.group()

    return re.sub(r"[-+]?\d+(?:_\d+)*", shown, message)


class SuggestingParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose "unrecognized arguments" refusal offers each misspelt
    option its closest option (``suggest_option``): ``lmnb run`` / ``serve`` / ``export`` (their
    subparsers are of their parser's class) and an exported job, whose ``--limt 3`` was refused with
    no guess. Python 3.11's argparse has no such offer. Exits 2 with the usage, as argparse does.
    ``allow_abbrev`` is off unless asked for: argparse took a prefix of one option (``--mod``,
    ``--max-total``) for that option without a word, so a slip went through, and a script's
    prefix would change meaning, or stop working, once an option beginning the same way came."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)
        self._words: list = []

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)  # (for error: the words left over)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """Exits 2 with ``message``, a misspelt option offered its closest. argparse reports a
        missing required argument before the words it did not recognize, so a job's ``--inp
        rows.jsonl`` was told only "the following arguments are required: --input": the words it
        did not recognize come first, with their suggestions, and then the required arguments that
        none of the suggestions names."""
        unknown = self._unrecognized() if message.startswith(_REQUIRED) else []
        if unknown:
            words = "unrecognized arguments: " + " ".join(unknown)
            said = suggest_option(words, self)
            offered = set(re.findall(r"--[\w-]+", said[len(words):]))  # (the options its notes name)
            missing = [name for name in message[len(_REQUIRED):].split(", ") if name not in offered]
            message = said + (f"; {_REQUIRED}{', '.join(missing)}" if missing else "")
        else:
            message = suggest_option(message, self)
        super().error(message)

    def _unrecognized(self) -> list:
        """The words of the last parse that no argument takes, found by parsing them again with no
        argument required (that parse reached the required check, so it refuses nothing else)."""
        required = [action for action in self._actions if action.required]
        for action in required:
            action.required = False
        try:
            return self.parse_known_args(self._words, argparse.Namespace())[1]
        finally:
            for action in required:
                action.required = True


# argparse's refusal of missing required arguments, before their names (", "-separated)
_REQUIRED = "the following arguments are required: "


def option_error(kind: type, problem: str, *fixes: tuple) -> BaseException:
    """A ``kind`` error that says ``problem`` and its ``fixes``, which name ``Engine``'s keyword
    arguments (``use device='cpu'``); ``in_option_syntax`` says them in a command line's options
    instead. Each fix is ``(text, keyword, value)``, ``text`` with ``{}`` where the keyword goes
    (``value`` None: its name alone, e.g. to raise it), or ``(text,)`` for one that takes no option."""
    e = kind(_said(problem, fixes, None))
    e.option_fixes = (problem, fixes)  # (kept by pickling: a worker's error reaches the front end whole)
    return e


class _OptionMessage(str):
    """A message (``str``) that keeps the fixes ``option_message`` made it of, for ``in_option_syntax``."""


def option_message(problem: str, *fixes: tuple) -> str:
    """``option_error``'s message, for one that is not raised: an aborted request's
    ``FinishReason.message``. A ``str`` in ``Engine``'s keyword syntax, which ``in_option_syntax``
    says in a command line's options as it does an error's."""
    message = _OptionMessage(_said(problem, fixes, None))
    message.option_fixes = (problem, fixes)
    return message


def in_option_syntax(e: BaseException, options, command: str = "", reworded: dict | None = None) -> str:
    """The message of ``e``, an engine's error (or ``option_message``), for a command line (``%lm load``, ``lmnb serve``, an
    exported job) whose options are ``options`` (their dests, e.g. ``vars(args)``): a fix made by
    ``option_error`` names ``--device cpu`` where the Python API says ``device='cpu'``, and is left
    out where the command line has no such option (a job has no ``--random-weights``; an HTTP
    client, ``options`` empty, has none of the server's). ``options`` None: the Python API's
    keywords, as ``str(e)``. ``command``: the command those options belong to, where the error
    shows up elsewhere (a ``%%lm`` cell's request, whose engine ``%lm load`` made, says
    "raise %lm load's --max-total-tokens": the cell has options of its own). ``reworded``: the
    front end's own words for a fix that takes no option (a cell says ``UNPIN`` with the magic
    that unpins, ``%lm unpin NAME``)."""
    fixes = getattr(e, "option_fixes", None)
    return str(e) if fixes is None else _said(*fixes, options, command, reworded)


# The fix of an abort that pinned prefixes cause, which a front end that pins its own way rewords.
UNPIN = "unpin prefixes"


def _said(problem: str, fixes: tuple, options, command: str = "", reworded: dict | None = None) -> str:
    """``problem`` and the ``fixes`` a front end can take, in ``Engine``'s keyword syntax
    (``options`` None) or as the command-line options among ``options`` (of ``command``), a fix
    that takes no option in the words ``reworded`` gives it."""
    said = []
    for text, *option in fixes:
        if option:
            keyword, value = option
            if options is None:
                spelled = keyword if value is None else f"{keyword}={value!r}"
            elif keyword in options:
                spelled = (f"{command}'s " if command else "") + "--" + keyword.replace("_", "-") + (
                    "" if value is None or value is True else f" {value}")
            else:
                continue
            text = text.format(spelled)
        else:
            text = (reworded or {}).get(text, text)
        said.append(text)
    return problem + ("; " + ", or ".join(said) if said else "")
