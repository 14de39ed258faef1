"""Which options ``{gen ...}`` and ``{select ...}`` accept, and parse-time checks of literal values.

The option names are exactly the keyword parameters of ``lmnb.gen`` and ``lmnb.select`` (read from
their signatures), so a template option means what the same keyword means in Python.
"""

from __future__ import annotations

import ast
import inspect
import operator
import re
import reprlib
from collections.abc import Iterator, Mapping
from typing import Optional

from lmnb.ir import CHECKED_ALONE, dtype_regex, json_schema_value, param_problem, stop_regex_refusal, shown_value


# Branches one {fork N} makes. Each branch is a program state with its own requests (and a lane in
# the kernel's view), so a count past this is most likely a typo ({fork 100000} for {fork 10}).
MAX_FORK_BRANCHES = 256


# File name endings of the images and videos {image}/{video} read, for telling a path written
# without quotes ({image cat.png}, which Python reads as the attribute png of a variable cat) from
# an attribute meant (``{image photo.image}``).
_MEDIA_SUFFIX = re.compile(r"\.(png|jpe?g|gif|webp|bmp|tiff?|mp4|mov|avi|mkv|webm|m4v)$", re.IGNORECASE)
_PATH_CHARACTERS = re.compile(r"[\w.~/\\-]+")


def bare_media_path(kind: str, source: str, frames: str = "N") -> Optional[str]:
    """The hint for an ``{image SRC}``/``{video SRC frames=...}`` (``frames``: the count as written)
    whose ``SRC`` is a file path written without quotes (``cat.png``, ``photos/cat.png``,
    ``~/cat.png``, ``/tmp/cat.png``), which Python reads as names (``name 'cat' is not defined``) or
    not at all; None for other sources."""
    path = source.strip()
    if not _PATH_CHARACTERS.fullmatch(path) or not ("/" in path or path.startswith("~") or _MEDIA_SUFFIX.search(path)):
        return None
    count = f" frames={frames.strip()}" if kind == "video" else ""
    return f'a file path goes in quotes: {{{kind} "{path}"{count}}}'


def fork_count(n, source: Optional[str] = None):
    """``n``, checked as the branch count of a ``{fork N}`` whose ``N`` is written ``source`` (the
    hole's expression, for the message; None: not known): the kernel checks it so, and the
    exported program calls this for a count it reads from a variable (a literal is checked when
    the cell is parsed).

    An integer of another type (numpy's ``np.int64``, from ``len(df)`` or a sum) counts as the
    Python int it holds (``operator.index``), as ``s.fork(n)`` takes it; the int is returned.

    Raises:
        ValueError: not an integer >= 1, or more than ``MAX_FORK_BRANCHES``; the message names the fix.
    """
    try:
        count = None if isinstance(n, bool) else operator.index(n)
    except TypeError:
        count = None
    if count is None or count < 1:
        braces = ""
        if isinstance(n, (set, frozenset)):
            # ({fork {n}}: braces inside a hole are Python's, a set, where a user meant a hole in a
            # hole; the fix is what the user wrote inside them, {fork 2} for {fork {2}})
            inner = braced_item(source) if source is not None else None
            if inner:
                braces = (f": a set, as braces inside a hole make one; write the count without them "
                          f"({{fork {inner}}}, not {{fork {source.strip()}}})")
            elif source is not None:  # ({fork s}, s = {2}: the braces are in the value, where s was set)
                # (the item as the example only where it is a count: "('a', not {'a'})" made no integer)
                item = next(iter(n)) if len(n) == 1 else None
                example = f" ({item!r}, not {n!r})" if type(item) is int and item >= 1 else ""
                braces = (f": a set; {{fork {source.strip()}}} takes the count itself: make {source.strip()} an "
                          f"integer{example}")
            else:
                braces = (": a set, as braces inside a hole make one; write the count without them ({fork n}, not "
                          "{fork {n}})")
        raise ValueError(f"fork count must be an integer >= 1, got {shown_value(n)}{braces}")
    if count > MAX_FORK_BRANCHES:
        raise ValueError(f"fork count {shown_value(count)} is over the limit of {MAX_FORK_BRANCHES} branches per {{fork N}} (a "
                         "typo?); for more branches, fork in a %%lm --python cell (forks = s.fork(n)), or run one "
                         "program per input with run_batch")
    return count


def braced_item(source: str) -> Optional[str]:
    """The expression inside the braces of ``source`` (a hole's expression) where it is a set of
    one item, ``{items}``: braces inside a hole, which Python reads as a set, where a hole in a hole
    was meant; else None."""
    try:
        body = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    # ({*items} unpacks items into the set, a set written on purpose, not one item in braces)
    if not (isinstance(body, ast.Set) and len(body.elts) == 1) or isinstance(body.elts[0], ast.Starred):
        return None
    return ast.get_source_segment(source.strip(), body.elts[0])


def braces_hint(source: str, error: Exception) -> str:
    """" (the braces inside the hole make a set of items; write items without them)" where
    ``error``, raised evaluating a hole's expression ``source``, is the TypeError of an unhashable
    item put in a set by braces inside the hole (``{fork x in {items}}``, a hole in a hole meant);
    else ""."""
    inner = braced_item(source) if isinstance(error, TypeError) and "unhashable" in str(error) else None
    return f" (the braces inside the hole make a set of {inner}; write {inner} without them)" if inner else ""


def braced_set(item, source: str) -> set:
    """``{item}``: the set that a hole's expression ``source`` of one braced item makes, as Python
    makes it, for the exported program of a fork over ``{items}`` or ``{n}`` (``fork_items`` and
    ``fork_count`` then refuse the set, as the kernel does).

    Raises:
        TypeError: ``item`` is unhashable (a list, a dict); the message has the kernel's hint that
            the braces made the set (``braces_hint``)."""
    try:
        return {item}
    except TypeError as e:
        raise TypeError(f"{e}{braces_hint(source, e)}") from None


def fork_items(items, source: str) -> list:
    """``items`` as the list of branches of a ``{fork x in ITEMS}`` whose ``ITEMS`` is written
    ``source``: the kernel checks them so, and the exported program calls this, so both refuse
    the same values with the same message.

    A string or bytes is refused rather than forked once per character, and a mapping rather than
    forked once per key, since either is far more often one value (or a table) put where a list
    was meant; the message names the explicit spelling of each intent. A set is refused too: its
    order of iteration, so the branches' order and a join's, depends on the process's string
    hashes (``PYTHONHASHSEED``), and a notebook rerun or its exported job would order them otherwise.

    Raises:
        TypeError: ``items`` is a str, bytes, bytearray, mapping or set, or is not iterable.
        ValueError: ``items`` has no items (a fork needs at least one branch).
    """
    where = f"{{fork ... in {source}}}"
    if isinstance(items, (str, bytes, bytearray)):
        kind = "character" if isinstance(items, str) else "byte"
        raise TypeError(f"{where}: {source} is a {type(items).__name__} ({reprlib.repr(items)}), which would fork "
                        f"one branch per {kind}; fork over a list of items, e.g. {{fork ... in [{source}]}}")
    if isinstance(items, Mapping):
        raise TypeError(f"{where}: {source} is a {type(items).__name__}, which would fork one branch per key; say "
                        f"which you mean: {source}.keys(), {source}.values() or {source}.items(), or a list of "
                        f"items, e.g. [{source}]")
    inner = braced_item(source)
    if isinstance(items, (set, frozenset)) and inner is not None:
        raise TypeError(f"{where}: {source} is a set, as braces inside a hole make one; write the items without "
                        f"them ({{fork ... in {inner}}}, not {{fork ... in {source}}})")
    if isinstance(items, (set, frozenset)):
        raise TypeError(f"{where}: {source} is a {type(items).__name__}, whose order (the branches' order, and "
                        "the order a join puts them in) can change from run to run (strings hash differently in "
                        f"each process); fork over a list in the order you want, e.g. sorted({source})")
    try:
        iterator = iter(items)
    except TypeError:
        raise TypeError(f"{where}: {source} is not iterable (got {type(items).__name__}); a fork makes one "
                        f"branch per item: fork over a list of items, e.g. [{source}]") from None
    branches = list(iterator)
    if not branches:
        raise ValueError(f"{where}: {source} has no items; a fork needs at least one branch")
    return branches


def shared_by_branches(expr, bound) -> bool:
    """Whether the option value ``expr`` (a ``nodes.Expr``) in a ``{fork}`` branch gives every
    branch the same object: a variable or an attribute of one (``opts``, ``cfg.opts``), not a name
    in ``bound`` (those the innermost fork binds, one item a branch) and not an expression that
    makes a new value each time it is read (a call, a generator expression)."""
    node = expr.tree.body
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id not in bound


def branch_choices(choices, source: str):
    """``choices`` (returned as given) of a ``select`` or ``gen`` in a ``{fork}`` branch, read by
    an expression ``source`` that gives every branch the same object (``shared_by_branches``): the
    kernel checks them so, and the exported program calls this, so both refuse the same values.

    Raises:
        TypeError: ``choices`` is an iterator (a generator, ``map(...)``, ``iter(...)``): the first
            branch's pick would use it up (``lmnb.select`` reads any iterable as the list of its
            items) and leave the other branches no choices.
    """
    if isinstance(choices, Iterator):
        name = source.strip()
        raise TypeError(f"choices={name} is an iterator ({type(choices).__name__}), which the first branch of the "
                        f"fork would use up, leaving the other branches no choices; make it a list before the cell "
                        f"({name} = list({name}))")
    return choices


def allowed(primitive: str) -> tuple[str, ...]:
    """Keyword options of ``lmnb.<primitive>`` other than ``name``, in signature order."""
    import lmnb

    params = inspect.signature(getattr(lmnb, primitive)).parameters.values()
    return tuple(p.name for p in params if p.name != "name" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def check_literal(primitive: str, key: str, value, source: str = "choices", picks: bool = False) -> str | None:
    """A message if a literal option value is certainly wrong, else None. ``source`` is the value's
    text in the cell, for the fix a dict of choices is told. ``picks``: the primitive is a gen with
    choices, whose temperature gets select()'s check and words, as ``gen(choices=...)`` gives it."""
    if key == "regex":  # (None, gen()'s default, is no constraint)
        from lmnb_engine.regex_errors import regex_problem  # gen()'s words, and the engine's (no torch)

        return regex_problem(value)
    elif key == "json_schema":  # gen()'s own check and words (a pydantic class is a name, no literal)
        try:
            json_schema_value(value)  # (None: no constraint; true: any JSON value; false: refused)
        except (TypeError, ValueError) as e:
            return str(e)
    elif key == "choices" and not (primitive == "gen" and value is None):  # (gen's None: no choices, no pick)
        from lmnb.choices import choice_list, choices_problem, mapping_choices_problem

        mapping = mapping_choices_problem(value, source)  # (the words a dict held in a variable gets)
        if mapping:
            return mapping
        # (a set sorted, as lmnb.select takes it, a literal {"b", "a"} too; select()'s own check)
        return choices_problem(choice_list(value))
    elif key == "temperature" and (primitive == "select" or picks):  # select()'s own check and words, not gen()'s
        from lmnb.choices import select_temperature_problem

        # (a gen pick's None is gen()'s default, temperature 0)
        return None if primitive == "gen" and value is None else select_temperature_problem(value)
    elif key in CHECKED_ALONE:  # gen()'s own check of the option alone: its words where gen() is called
        return param_problem(key, value)
    elif key == "dtype" and value is not None:  # (a literal: a string; int, a name, is no literal)
        try:
            dtype_regex(value)
        except ValueError as e:
            return str(e)
    elif key == "choices_method" and not (primitive == "gen" and value is None):  # (gen's None: the default)
        from lmnb.choices import choices_method_problem

        return choices_method_problem(value)
    elif key == "stop_regex":  # (the engine's own check, in gen()'s words)
        return stop_regex_refusal(value)
    return None


def first_refused(primitive: str, refused: list, others: Mapping) -> int:
    """Which of several refused option values (``refused``: ``(key, value)`` pairs, as written)
    ``lmnb.<primitive>`` names when called with all of them and the ``others`` (the hole's values
    it takes alone), as its index in ``refused``: gen() checks its arguments in an order of its
    own, not the order a cell writes them, so a cell tells the one the same Python call tells.
    It is the one whose refusal, given alone beside ``others``, reads as the call's; the first
    written where none does (a problem only the cell finds)."""
    import lmnb

    def refusal(kwargs) -> Optional[str]:
        try:
            getattr(lmnb, primitive)(**others, **kwargs)
        except Exception as e:  # (any refusal; what matters is which words)
            return f"{type(e).__name__}: {e}"
        return None

    together = refusal(dict(refused))
    return next((i for i, (key, value) in enumerate(refused) if refusal({key: value}) == together), 0)


# Options whose value from a variable the cell checks at the option (gen()'s own check, in its
# words) before it calls gen(): SamplingParams fields of the same name, which the engine checked only
# once the gen was sent, so seed="a" or min_p=2 failed mid-run, away from its hole.
SAMPLING_FIELDS = ("min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "seed", "return_logprob",
                    "logprob_start_len", "stop_token_ids")
