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

import re
from typing import Any

from lmnb_engine.json_schema import SHOWN_CHARS, json_value


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
    property classes: ``_unicode_classes_error``) or for None (no constraint):
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
        if e.msg in (r"bad escape \p", r"bad escape \P"):
            e = _unicode_classes_error(pattern)
            if e is None:
                return unicode_class_problem(pattern)
        return invalid_regex(pattern, e)
    except RecursionError:
        return (f"regex {shown_regex(pattern)} nests its parentheses too deeply for Python's re to read; flatten "
                "the pattern")
    return None


def _unicode_classes_error(pattern: str):
    """What is wrong with ``pattern``, which Python's ``re`` refused at a ``\\p``/``\\P`` escape, once
    Unicode property classes (``\\p{L}``, ``\\P{Lu}``) are read (a ``regex.error``, with ``msg`` and
    ``pos`` as ``re.error``'s), or None when nothing is: ``re`` lacks those classes, the engine's
    automaton library (Rust's ``regex-automata``) and SGLang's grammar backends read them, so the
    language's early check leaves such a pattern to the backend. The ``regex`` package reads them
    as Rust does and checks the rest of the pattern."""
    import regex

    try:
        regex.compile(pattern)
    except regex.error as e:
        return e
    return None


# a \p or \P escape (not an escaped backslash before a "p") and its class: {Name}, {Key=Value}, or one letter
UNICODE_CLASS = re.compile(r"(?<!\\)(?:\\\\)*\\([pP])(\{[^}]*\}|[A-Za-z])")
# the keys whose values Rust's regex reads (\p{sc=Greek}), as Rust compares them (see unicode_class_problem)
_RUST_KEYS = ("gc", "generalcategory", "sc", "script", "scx", "scriptextensions", "age", "gcb", "graphemeclusterbreak",
              "wb", "wordbreak", "sb", "sentencebreak")


def unicode_class_problem(pattern: str) -> str | None:
    """Why a Unicode property class of ``pattern`` (a pattern the ``regex`` package compiles) is
    refused, or None: the classes the ``regex`` package reads that the engine's automaton library
    (Rust's ``regex``) does not, which failed in the engine's build as "error building NFA": the
    negation ``\\p{^Lu}`` (write ``\\P{Lu}``), ``\\p{L&}`` (``\\p{LC}``), Unicode blocks
    (``\\p{InGreek}``, ``\\p{Block=Greek}``, ``\\p{Greek_and_Coptic}``), which Rust has none of,
    ``Key=Value`` for a key Rust reads no values of (``\\p{Bidi_Class=L}``, ``\\p{Alpha=Yes}``), the
    ``regex`` package's POSIX names (``\\p{Word}``, ``\\p{XDigit}``, ``\\p{PosixDigit}``), and
    surrogates and the Unknown script (``\\p{Cs}``, ``\\p{Zzzz}``), which UTF-8 text or Rust's tables lack."""
    import regex

    def reads(p: str) -> bool:
        try:
            regex.compile(p)
        except regex.error:
            return False
        return True

    def not_a_block(name: str) -> bool:  # a category, a script or a binary property (Rust's kinds)
        return (name.lower().replace("_", "").replace("-", "") in ("ascii", "any", "assigned")
                or any(reads(rf"\p{{{k}={name}}}") for k in ("gc", "Script", "scx")) or reads(rf"\p{{{name}=Yes}}"))

    for m in UNICODE_CLASS.finditer(pattern):
        name = m.group(2).strip("{}").strip()
        shown = m.group(0).lstrip("\\")
        shown = "\\" + shown
        keyed = re.search(r"!?[=:]", name)  # (both packages read "Key=Value", "Key:Value" and "Key!=Value")
        # as Rust compares names: case, spaces, "_" and "-" ignored, and a leading "is" dropped
        key = re.sub(r"^is", "", re.sub(r"[\s_-]", "", (name[:keyed.start()] if keyed else name).lower()))
        if name.startswith("^"):
            fix = f"write \\{'P' if m.group(1) == 'p' else 'p'}{{{name[1:].strip()}}} for its negation"
        elif "&" in name:
            fix = "write \\p{LC} for the cased letters"
        elif keyed and key not in _RUST_KEYS + ("block", "blk"):
            fix = ("it reads Key=Value only for General_Category, Script, Script_Extensions, Age, Grapheme_Cluster_Break, "
                   "Word_Break and Sentence_Break: write a binary property by its name (\\p{Alpha}, or \\P{Alpha} for "
                   "its negation), or the characters as a class")
        elif not keyed and (key in ("alnum", "blank", "graph", "print", "word", "xdigit") or key.startswith("posix")):
            fix = "that name is the regex package's own: write the characters as a class (\\w, [0-9A-Fa-f], ...)"
        elif not keyed and key in ("cs", "surrogate", "unknown", "zzzz"):
            fix = "UTF-8 text holds no surrogates, and Rust's tables have no Unknown script: remove it or name the classes wanted"
        elif (keyed and key in ("block", "blk")) or (
                not keyed and not not_a_block(name)
                and not (name.lower().startswith("is") and not_a_block(name[2:]))):
            fix = "it has no Unicode blocks: use a script, as \\p{Greek}, or a range of characters, as [\\u0370-\\u03ff]"
        else:
            continue
        return (f"regex {shown_regex(pattern)} uses the class {shown}, which the engine's automaton library (Rust's "
                f"regex) does not read; {fix}")
    return None
