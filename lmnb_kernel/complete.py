"""Completion and is_complete for ``%lm`` lines and ``%%lm`` cells (the kernel's complete_request
and is_complete_request).

IPython completes a ``%lm`` line as Python (magic names, builtins) and reads a ``%%lm`` cell as a
cell magic (incomplete until a blank line). Here the names come from where the magics take them:
``%lm`` subcommands and their options from ``magics.line_parser``, ``%%lm`` options from
``magics.cell_parser``, a hole's first word from the cell parser's ``KEYWORDS`` and a gen's or
select's options from ``lmnb.template.options.allowed`` (the options the parser checks against);
whether a cell is finished from the cell parser itself (``UnclosedError``).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

_LINE_MAGIC = re.compile(r"^\s*%lm\s+")  # (not %%lm: IPython's own completion of "%lm" stays)
_CELL_MAGIC_LINE = re.compile(r"^[ \t]*%%lm(?:[ \t].*)?$", re.MULTILINE)
_WORD_BEFORE = re.compile(r"[^\s]*$")
# (\Z, not $, which matches before a last "\n" too: "{sel\n" would replace "sel\n", the line above's)
_HOLE_WORD = re.compile(r"^\s*(/?)([A-Za-z_]\w*)?\Z")  # {gen, {/us: the hole's first word being typed
_PRIMITIVE_OPTION = re.compile(r"^\s*(gen|select)\s+\S.*?\s([A-Za-z_]\w*)?\Z", re.DOTALL)  # {gen x max_to


def lm_completions(code: str, cursor_pos: int, python: Callable[[], dict]) -> Optional[dict]:
    """The complete_reply content for ``code`` with the cursor at ``cursor_pos`` (characters) in a
    ``%lm`` line, a ``%%lm`` line or a ``%%lm`` cell's hole; None where this has nothing to add
    (IPython completes as Python). ``python()`` is IPython's reply, which a hole's first word gets
    too (a kernel variable, ``{pe`` → ``person``)."""
    from lmnb.export.cells import lm_cell_parts

    before = code[:cursor_pos]
    line = before[before.rfind("\n") + 1 :]
    parts = lm_cell_parts(code)
    magic = _CELL_MAGIC_LINE.search(code) if parts is not None else None
    if magic is not None and magic.start() <= cursor_pos:
        if cursor_pos <= magic.end():
            return _cell_options(line, cursor_pos)
        if "--python" in parts[0].split():  # a Python body: IPython's
            return None
        return _hole(before[magic.end() + 1 :], cursor_pos, python)
    if _LINE_MAGIC.match(line):
        return _line_command(line[_LINE_MAGIC.match(line).end() :], cursor_pos)
    return None


def _reply(matches, cursor_pos: int, start: int) -> dict:
    return {"matches": list(matches), "cursor_start": start, "cursor_end": cursor_pos, "metadata": {}, "status": "ok"}


def _options(parser) -> list[str]:
    """The long options of an argparse ``parser`` and ``--help`` (which the magics read themselves)."""
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")] + ["--help"]


def _cell_options(line: str, cursor_pos: int) -> Optional[dict]:
    from lmnb_kernel.magics import cell_parser

    word = _WORD_BEFORE.search(line).group()
    if line.lstrip().startswith("%%lm") and len(line.lstrip()) == len(word):  # still the magic's name
        return None
    if word and not word.startswith("-"):  # a value (--state NAME): nothing to offer
        return _reply([], cursor_pos, cursor_pos - len(word))
    return _reply([o for o in _options(cell_parser()) if o.startswith(word)], cursor_pos, cursor_pos - len(word))


def _line_command(text: str, cursor_pos: int) -> Optional[dict]:
    from lmnb_kernel.magics import _subcommands, line_parser

    word = _WORD_BEFORE.search(text).group()
    words = text[: len(text) - len(word)].split()
    subcommands = _subcommands(line_parser())
    if not words:
        return _reply([s for s in subcommands if s.startswith(word)], cursor_pos, cursor_pos - len(word))
    if words == ["help"]:  # %lm help SUBCOMMAND
        return _reply([s for s in subcommands if s.startswith(word) and s != "help"], cursor_pos, cursor_pos - len(word))
    if words[0] in subcommands and word.startswith("-"):
        options = _options(subcommands[words[0]])
        return _reply([o for o in options if o.startswith(word)], cursor_pos, cursor_pos - len(word))
    return None  # a value (a model path, a state name): IPython's (file names)


def _hole(body: str, cursor_pos: int, python: Callable[[], dict]) -> Optional[dict]:
    """Completion in the hole of the body text ``body`` (up to the cursor) still open; none in text."""
    from lmnb.template.errors import TemplateSyntaxError, UnclosedError
    from lmnb.template.options import allowed
    from lmnb.template.parser import KEYWORDS, ROLES
    from lmnb.template.scanner import scan, top_level

    try:
        scan(body)
        return _reply([], cursor_pos, cursor_pos)  # the cursor is in the prompt's text: no Python there
    except UnclosedError as e:
        if body[e.offset] != "{":  # a triple-quoted string still open in the hole: a value, IPython's
            return None
        hole = body[e.offset + 1 :]
    except TemplateSyntaxError:
        return None
    first = _HOLE_WORD.match(hole)
    if first:
        slash, word = first.group(1), first.group(2) or ""
        names = ["/" + r for r in ROLES] if slash else KEYWORDS
        ours = [n for n in names if n.startswith(slash + word)]
        if slash:
            return _reply(ours, cursor_pos, cursor_pos - len(word) - 1)
        reply = python()  # (kernel variables; not IPython's magic names, which a hole cannot hold)
        theirs = [m for m in reply["matches"] if not m.startswith("%") and m not in ours]
        if reply.get("cursor_start") != cursor_pos - len(word):  # another word than ours: ours alone
            theirs = []
        return _reply(ours + theirs, cursor_pos, cursor_pos - len(word))
    option = _PRIMITIVE_OPTION.match(hole)
    space = len(hole) - len(option.group(2) or "") - 1 if option else -1
    if option and (space, hole[space]) in top_level(hole):  # (not in a string: stop="a b)
        kind, word = option.group(1), option.group(2) or ""
        return _reply([k + "=" for k in allowed(kind) if k.startswith(word)], cursor_pos, cursor_pos - len(word))
    return None  # a Python expression or an option's value: IPython's


def lm_is_complete(code: str) -> Optional[dict]:
    """The is_complete_reply content for a ``%%lm`` template cell that is unfinished
    (``{"status": "incomplete", "indent": ""}``: a hole or a block left open) or that the cell
    parser refuses (``{"status": "invalid"}``); None for a cell this leaves to IPython (one that
    parses, a ``--python`` cell, any other cell)."""
    from lmnb.export.cells import lm_cell_parts
    from lmnb.template import TemplateSyntaxError, cell_body, parse
    from lmnb.template.errors import UnclosedError

    parts = lm_cell_parts(code)
    if parts is None or "--python" in parts[0].split():
        return None
    try:
        parse(cell_body(parts[1]))
    except UnclosedError:
        return {"status": "incomplete", "indent": ""}
    except TemplateSyntaxError:
        return {"status": "invalid"}
    return None
