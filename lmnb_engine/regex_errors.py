"""A regular expression's errors in the words every front end uses, without torch.

A ``regex`` constraint is checked in three places: where the language's ``gen(regex=...)`` is
called (``lmnb.ir.check_regex``), in a ``%%lm`` cell's literal options (``lmnb.template.options``),
and in the engine, for the server's clients too (``constrained.grammar.compile_grammar``). All
three word an invalid pattern with ``regex_problem`` (``invalid_regex``), and show a pattern with
``shown_regex``, so a user hears one error whichever way the pattern came, and the language's early
check refuses no pattern the engine takes (``\\p{L}``); the language's two word a value that is no
pattern (``gen(regex=5)``) with it too. Importing it loads neither torch nor the
engine's constrained-decoding package.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any

from lmnb_engine.json_schema import SHOWN_CHARS, at_a_unicode_class, json_value


def shown_regex(pattern: str) -> str:
    """``pattern`` for a message, written as JSON writes a string (``"a["``), so that the error reads
    the same in Python and from the server, cut after ``SHOWN_CHARS`` characters (a schema's regex
    runs to kilobytes)."""
    return json_value(pattern, SHOWN_CHARS)


def invalid_regex(pattern: str, error: re.error) -> str:
    """The message for a ``regex`` constraint that Python's ``re`` refused with ``error``: the
    pattern (``shown_regex``), what is wrong and where (``error.msg`` at ``error.pos``, a character
    index into ``pattern``), and the fix."""
    return (f"regex {shown_regex(pattern)} cannot be compiled: it is not a valid regular expression ({error.msg} at "
            f"position {error.pos}); fix the pattern")


def regex_problem(pattern: Any) -> str | None:
    """Why ``pattern``, a ``regex`` constraint as the language's ``gen()`` or a ``%%lm`` cell was
    given it, is refused, or None for a pattern Python's ``re`` compiles (or would, but for Unicode
    property classes the engine reads: ``unicode_class_problem``) or for None (no constraint):
    not a string (a compiled ``re.Pattern``, whose text is wanted, or any other type, named), a
    syntax error (``invalid_regex``), or parentheses nested too deeply for its parser, which
    recurses once per level (some hundreds of levels: a ``RecursionError``)."""
    if pattern is None:
        return None
    if isinstance(pattern, re.Pattern):  # (a Python snippet to write, so repr: JSON's text could be cut)
        return (f"regex must be a string, not a compiled Pattern; pass its text, regex={pattern.pattern!r} "
                "(flags written inline, e.g. '(?i)...')")
    if not isinstance(pattern, str):
        return f"regex must be a string, not {type(pattern).__name__}"
    try:
        re.compile(pattern)
    except re.error as e:
        if at_a_unicode_class(e):
            return unicode_class_problem(pattern)
        return invalid_regex(pattern, e)
    except RecursionError:
        return _too_deep(pattern)
    return None


def _too_deep(pattern: str) -> str:
    return (f"regex {shown_regex(pattern)} nests its parentheses too deeply for Python's re to read; flatten "
            "the pattern")


# a \p or \P escape (after any escaped backslashes, group 1) and its class (group 2): \p{Name}, \p{Key=Value}, \pL
UNICODE_CLASS = re.compile(r"(?<!\\)((?:\\\\)*)(\\[pP](?:\{[^}]*\}|[A-Za-z]))")


def unicode_class_problem(pattern: str) -> str | None:
    """Why ``pattern``, which Python's ``re`` refused at a ``\\p``/``\\P`` escape, is refused, or None.
    ``re`` lacks Unicode property classes (``\\p{L}``, ``\\P{Lu}``, ``\\p{Greek}``); the engine's
    automaton library (Rust's ``regex``, in outlines-core) reads them, and SGLang's grammar
    backends do, so the language's early check leaves them to the backend. Each class is asked of
    that library itself (``_automaton_reads``): one it cannot build (a Unicode block, the
    ``regex`` package's own names, ``\\p{^Lu}``) is named with the fix. The rest of the pattern is
    then checked by Python's ``re`` with each class held by as many ``a``s, so an error's position
    is its place in ``pattern``."""
    for m in UNICODE_CLASS.finditer(pattern):
        cls = m.group(2)
        if not _automaton_reads(cls):
            negated = re.fullmatch(r"\\([pP])\{\s*\^(.*)\}", cls)
            fix = (f"write \\{'P' if negated.group(1) == 'p' else 'p'}{{{negated.group(2).strip()}}} for its negation"
                   if negated else "write \\p{LC} for the cased letters" if "&" in cls else "use a general category, a script or a binary property it reads (\\p{L}, \\p{Greek}, "
                   "\\p{Alphabetic}), or the characters as a class")
            return (f"regex {shown_regex(pattern)} uses the class {cls}, which the engine's automaton library (Rust's "
                    f"regex) does not read; {fix}")
    try:
        with warnings.catch_warnings():  # (re's FutureWarning on a "--" or "&&" in a class: not the user's code)
            warnings.simplefilter("ignore")
            re.compile(classes_held(pattern))
    except re.error as e:
        return invalid_regex(pattern, e)
    except RecursionError:
        return _too_deep(pattern)
    return None


def classes_held(pattern: str) -> str:
    """``pattern`` with each Unicode property class (``UNICODE_CLASS``) held by as many ``a``s: what
    Python's ``re`` can parse, with the rest of the pattern, and every position, as they were, so
    that checks made with ``re`` (``unicode_class_problem``, the engine's ``check_regex``) see the
    rest of a pattern that has such classes."""
    return UNICODE_CLASS.sub(lambda m: m.group(1) + "a" * len(m.group(2)), pattern)


@functools.lru_cache(maxsize=256)
def _automaton_reads(cls: str) -> bool:
    """Whether the automaton library builds the Unicode class ``cls`` (``\\p{Greek}``): a few
    milliseconds at most, once per class. Offered beside ``a`` and a vocabulary of ``a`` alone, so
    that only the class can fail the build, not the vocabulary."""
    from outlines_core import Index, Vocabulary  # (torch-free)

    try:
        Index(f"(?:{cls}|a)", Vocabulary(0, {b"a": [1]}))
    except ValueError:
        return False
    return True
