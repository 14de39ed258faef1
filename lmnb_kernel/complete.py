"""Completion and is_complete for ``%lm`` lines and ``%%lm`` cells (the kernel's complete_request
and is_complete_request).

IPython completes a ``%lm`` line as Python (magic names, builtins) and reads a ``%%lm`` cell as a
cell magic (incomplete until a blank line). Here the names come from where the magics take them:
``%lm`` subcommands and their options from ``magics.line_parser``, ``%%lm`` options from
``magics.cell_parser``, a state's name (``%lm pin NAME``, ``--state NAME``) from the session's named
states, the engine's dtype and device names for ``%lm load --dtype`` / ``--device``, file names
(IPython's, not its magic names) for ``%lm load``'s model path alone, a hole's first word from the
cell parser's ``KEYWORDS``, a gen's or select's options from ``lmnb.template.options.allowed`` (the
options the parser checks against) and a video's ``frames=`` (none of them where the line or hole
gives it already); a Python expression a construct takes (an image's or video's source, a fork's
count or items, an option's value), and a hole that is one (``{person.na``), from IPython's
completion of that expression alone, in brackets (or of its innermost part: ``[ti``), after the
names the cell binds there (an enclosing fork's target, an earlier gen's result), the attributes
of such a name as those of a value of its kind (``parser.stand_ins``: a fork target's as its first
item's, a gen's result's as a str's); no IPython
magic name in a hole, and no name in a hole's string but file names (IPython's) in an image's or
video's literal path (``{image "ca``) and the names of an f-string's replacement field, a Python
expression (``{f"{person.na``); whether a cell is finished from the cell parser itself
(``UnclosedError``). Each match has its type in the reply's metadata, as ipykernel's reply from
IPython has (JupyterLab shows it): IPython's own for its matches, one in IPython's words for lmnb's.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Callable, Optional

_LINE_MAGIC = re.compile(r"^\s*%lm\s+")  # (not %%lm: IPython's own completion of "%lm" stays)
_CELL_MAGIC_LINE = re.compile(r"^[ \t]*%%lm(?:[ \t].*)?$", re.MULTILINE)
_WORD_BEFORE = re.compile(r"[^\s]*$")
# (\Z, not $, which matches before a last "\n" too: "{sel\n" would replace "sel\n", the line above's)
_HOLE_WORD = re.compile(r"^\s*(/?)([A-Za-z_]\w*)?\Z")  # {gen, {/us: the hole's first word being typed
# {gen x max_to, {video clip fr: an option's key being typed, after the name or source
_OPTION = re.compile(r"^\s*(gen|select|image|video)\s+\S.*?\s([A-Za-z_]\w*)?\Z", re.DOTALL)
_MEDIA_SOURCE = re.compile(r"^\s*(image|video)\s+(.*)\Z", re.DOTALL)  # {image ca: the source being typed
_FORK = re.compile(r"^\s*fork\s+(.*)\Z", re.DOTALL)  # {fork 2, {fork tip in ti: an expression
_PRIMITIVE = re.compile(r"^\s*(?:gen|select|image|video)\s+(.*)\Z", re.DOTALL)  # its options' values
_MEDIA_OPTIONS = {"image": (), "video": ("frames",)}  # (as the cell parser's media() takes them)
# (command, argument dest): the values that are a file path, whose completion is IPython's (file
# names), and those that name a state (%%lm's options are command "")
_PATH_VALUES = {("load", "model")}
_STATE_VALUES = {("reset", "name"), ("pin", "name"), ("unpin", "name"), ("", "state")}


def _dtypes(value: str) -> list[str]:
    """The ``--dtype`` values the engine takes that begin with ``value``: torch's names, or where
    none does, the short ones (``fp`` → ``fp32``, ``fp16``), from the engine's own table."""
    from lmnb_engine.device_names import DTYPE_NAMES, DTYPES

    names = [n for n in DTYPE_NAMES if n.startswith(value)]
    return names or [n for n in DTYPES if n.startswith(value)]


def _devices(value: str) -> list[str]:
    """The ``--device`` values the engine takes that begin with ``value``: ``cuda``, ``cuda:N`` for
    each CUDA device torch sees, ``cpu``. The devices are asked of torch only where the kernel has
    imported it already (an engine was loaded): importing it for a completion takes seconds."""
    from lmnb_engine.device_names import DEVICE_TYPES

    torch = sys.modules.get("torch")
    count = torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0
    numbered = {"cuda": [f"cuda:{i}" for i in range(count)]}  # (a cpu device's number selects nothing)
    names = [n for t in DEVICE_TYPES for n in (t, *numbered.get(t, ()))]
    return [n for n in names if n.startswith(value)]


# (command, argument dest) -> the values it takes that begin with a text: the parser has no
# choices for these (its own checks word the errors), so the values come from the engine's tables
_CHOICE_VALUES = {("load", "dtype"): _dtypes, ("load", "device"): _devices}
_BRACES = re.compile(r"\{\{|\}\}|[{}]")
# {image "ca, {video 'clips/a: the source being typed is a literal path (file names)
_PATH_SOURCE = re.compile(r"""^\s*(?:image|video)\s+([rR]?["'][^"'\n]*)\Z""")
_NAME_END = re.compile(r"(?<![\w.])(?:[^\W\d]\w*)?\Z")  # the name a Python text ends in ("" after "len(")
# t.up, t.real.im, r[0].up, x.split()[0].up: an attribute of a name (through its subscripts and calls)
_ATTRIBUTE_END = re.compile(r"(?<![\w.])([^\W\d]\w*)((?:\.\w+|\[[^][]*\]|\([^()]*\))*\.[\w.]*)\Z")
_FSTRING_PREFIX = re.compile(r"(?<!\w)(?:[fF][rR]?|[rR][fF])\Z")  # the prefix of an f-string's quote
_TYPES = "_jupyter_types_experimental"  # (complete_reply's metadata key for the matches' types)
# The type shown beside each of lmnb's own matches, in IPython's words: "param" for an option (its
# type for a keyword argument and for a magic's argument, %colors NAME), "magic" for a %lm
# subcommand (what the docs call a line magic), "keyword" for a hole's construct, "instance" for a
# named state (a ProgramState) and a name the cell binds (a fork's target, a gen's result)
Offer = tuple[str, str, str]  # a match: (text, type, signature)


def lm_completions(code: str, cursor_pos: int, python: Callable[[str, int], dict]) -> Optional[dict]:
    """The complete_reply content for ``code`` with the cursor at ``cursor_pos`` (characters) in a
    ``%lm`` line, a ``%%lm`` line or a ``%%lm`` cell's hole; None where this has nothing to add
    (IPython completes as Python). ``python(code, cursor_pos)`` is IPython's reply for other code,
    which a hole's first word gets too (a kernel variable, ``{pe`` → ``person``), and a Python
    expression in a construct alone (``{image ca`` → ``cat``, ``{fork tip in ti`` → ``tips``,
    ``{gen x max_tokens=n`` → ``n_max``: IPython reads the whole line as no expression)."""
    from lmnb.export.cells import lm_cell_parts
    from lmnb.template.cell_options import asks_for_python

    before = code[:cursor_pos]
    line = before[before.rfind("\n") + 1 :]
    after = code[cursor_pos:].partition("\n")[0]  # (the line's rest: options given after the cursor)
    parts = lm_cell_parts(code)
    magic = _CELL_MAGIC_LINE.search(code) if parts is not None else None
    if magic is not None and magic.start() <= cursor_pos:
        if cursor_pos <= magic.end():
            return _cell_options(line, after, cursor_pos)
        if asks_for_python(parts[0]):  # a Python body: IPython's
            return None
        return _hole(code, magic.end() + 1, cursor_pos, python)
    if _LINE_MAGIC.match(line):
        reply = _line_command(line[_LINE_MAGIC.match(line).end() :], after, cursor_pos)
        if reply is None:  # a model's path: IPython's file names, not its
            theirs = python(code, cursor_pos)  # magic names (automagic offered %cat, %%capture for "ca")
            reply = _reply(_ipython_offers(theirs, magics=False), cursor_pos,
                           theirs.get("cursor_start", cursor_pos))
        return reply
    return None


def _reply(offers: list[Offer], cursor_pos: int, start: int) -> dict:
    """The complete_reply content offering ``offers`` for the text from ``start`` to ``cursor_pos``,
    with each one's type in the metadata as ipykernel's reply from IPython carries it
    (``_jupyter_types_experimental``: an entry per match, in the same order, since JupyterLab reads
    match i's type from entry i; its span is the one the match replaces, in the cell's offsets)."""
    types = [{"start": start, "end": cursor_pos, "text": text, "type": kind, "signature": signature}
             for text, kind, signature in offers]
    return {"matches": [text for text, _, _ in offers], "cursor_start": start, "cursor_end": cursor_pos,
            "metadata": {_TYPES: types}, "status": "ok"}


def _typed(names, kind: str) -> list[Offer]:
    """``names`` offered as matches of the type ``kind`` (no signature)."""
    return [(name, kind, "") for name in names]


def _ipython_offers(reply: dict, magics: bool = True) -> list[Offer]:
    """The matches of IPython's complete_reply ``reply``, each with the type and signature its
    metadata gives it (IPython's ``<unknown>`` where it gives none); without its magic names
    (``%cat``, ``%%capture``: its automagic offers them for a bare word) unless ``magics``."""
    types = {entry["text"]: entry for entry in reply.get("metadata", {}).get(_TYPES, [])}
    return [(m, types[m]["type"], types[m].get("signature", "")) if m in types else (m, "<unknown>", "")
            for m in reply["matches"] if magics or not m.startswith("%")]


def _options(parser, given=()) -> list[str]:
    """The long options of an argparse ``parser`` and ``--help`` (which the magics read themselves),
    less those in ``given`` (the words of the line, ``--state=x`` read as ``--state``) that an option
    takes once (all but argparse's append, extend and count actions)."""
    given = {w.partition("=")[0] for w in given}
    repeats = (argparse._AppendAction, argparse._AppendConstAction, argparse._ExtendAction, argparse._CountAction)
    options = [(s, isinstance(a, repeats)) for a in parser._actions for s in a.option_strings if s.startswith("--")]
    return [s for s, again in [*options, ("--help", False)] if again or s not in given]


def _cell_options(line: str, after: str, cursor_pos: int) -> Optional[dict]:
    from lmnb_kernel.magics import cell_parser

    word = _WORD_BEFORE.search(line).group()
    if line.lstrip().startswith("%%lm") and len(line.lstrip()) == len(word):  # still the magic's name
        return None
    words = line[: len(line) - len(word)].split()[1:]  # (the words after %%lm)
    parser = cell_parser()
    # a value (--state NAME, --seed=4), also where none is typed yet after its option (--state |):
    # %%lm takes no positional argument, so a value has an option before it
    if (word and not word.startswith("-")) or "=" in word or (not word and _value_of(parser, words) is not None):
        return _value(parser, "", words, word, cursor_pos)
    given = (line[: len(line) - len(word)] + " " + after).split()
    return _reply(_typed([o for o in _options(parser, given) if o.startswith(word)], "param"), cursor_pos,
                  cursor_pos - len(word))


def _line_command(text: str, after: str, cursor_pos: int) -> Optional[dict]:
    from lmnb_kernel.magics import _subcommands, line_parser

    word = _WORD_BEFORE.search(text).group()
    words = text[: len(text) - len(word)].split()
    subcommands = _subcommands(line_parser())
    if not words and word.startswith("-"):  # %lm --help
        options = [o for o in _options(line_parser(), after.split()) if o.startswith(word)]
        return _reply(_typed(options, "param"), cursor_pos, cursor_pos - len(word))
    if not words:
        return _reply(_typed([s for s in subcommands if s.startswith(word)], "magic"), cursor_pos,
                      cursor_pos - len(word))
    if words == ["help"]:  # %lm help SUBCOMMAND
        return _reply(_typed([s for s in subcommands if s.startswith(word) and s != "help"], "magic"), cursor_pos,
                      cursor_pos - len(word))
    if words[0] not in subcommands:  # (no argument of a subcommand: IPython offered file names)
        return _reply([], cursor_pos, cursor_pos - len(word))
    if word.startswith("-") and "=" not in word:
        options = _options(subcommands[words[0]], words[1:] + after.split())
        return _reply(_typed([o for o in options if o.startswith(word)], "param"), cursor_pos, cursor_pos - len(word))
    return _value(subcommands[words[0]], words[0], words[1:], word, cursor_pos)


def _value(parser, command: str, words: list[str], word: str, cursor_pos: int) -> Optional[dict]:
    """Completion of ``word``, a value of the ``%lm COMMAND`` (``command``; "" for the ``%%lm``
    line) whose ``parser`` read ``words`` before it: IPython's (file names, less its magic names:
    None here, which ``lm_completions`` asks IPython for) for a file path alone (``%lm load
    MODEL``), the named states for a state's name (``%lm pin NAME``, ``%%lm --state NAME``), the
    engine's names for ``%lm load --dtype`` and ``--device`` (``_CHOICE_VALUES``), nothing for
    another value (IPython offered file names for ``%lm connect --api-key "ab`` and a URL). ``--opt=value`` reads as ``--opt value``."""
    from lmnb_kernel.session import get_session

    key, eq, value = word.partition("=") if word.startswith("-") else ("", "", word)
    if eq:
        action = next((a for a in parser._actions if key in a.option_strings), None)
    else:
        action = _value_of(parser, words)
    where = (command, action.dest if action is not None else None)
    if where in _PATH_VALUES:
        return None
    if where in _CHOICE_VALUES:
        return _reply(_typed(_CHOICE_VALUES[where](value), "param"), cursor_pos, cursor_pos - len(value))
    names = sorted(get_session().states) if where in _STATE_VALUES else []
    return _reply(_typed([n for n in names if n.startswith(value)], "instance"), cursor_pos, cursor_pos - len(value))


def _value_of(parser, words: list[str]) -> Optional[argparse.Action]:
    """The argument of ``parser`` that the word after ``words`` is the value of: the option just
    before it where that option takes a value, else the first positional argument not yet given;
    None where there is none (a word too many)."""
    options = {s: a for a in parser._actions for s in a.option_strings}
    positionals = [a for a in parser._actions if not a.option_strings]
    given, takes_value = 0, False
    for w in words:
        if takes_value:
            takes_value = False
        elif w in options:
            takes_value = options[w].nargs != 0
        elif not w.startswith("-"):
            given += 1
    if takes_value:
        return options[words[-1]]
    return positionals[given] if given < len(positionals) else None


def _open_hole(body: str) -> Optional[tuple[int, Optional[int]]]:
    """The offset of the ``{`` of the hole still open at the end of ``body`` (-1 where ``body`` ends
    in the prompt's text) and that of the quote of the string of that hole which ``body`` ends in
    (``{gen x stop="a``, ``stop='''a``, ``stop=“a``; None where it ends in none); None where that
    cannot be told (a hole the cell parser refuses before it). A lone ``}`` in the text, which the
    cell's run refuses, is passed over: the holes after it are read as the parser reads them."""
    from lmnb.template.errors import TemplateSyntaxError, UnclosedError
    from lmnb.template.scanner import hole_end

    i = 0
    while (m := _BRACES.search(body, i)) is not None:
        if m.group() != "{":  # {{, }} or a lone }
            i = m.end()
            continue
        try:
            i = hole_end(body, m.start())
        except UnclosedError as e:  # (the hole, or a triple-quoted string in it, left open)
            return m.start(), (e.offset if e.offset != m.start() else None)
        except TemplateSyntaxError as e:  # (a one-line string ends at its line: open only on the last)
            unterminated = e.message == "unterminated string literal in hole" and "\n" not in body[e.offset:]
            return (m.start(), e.offset) if unterminated else None
    return -1, None


def _hole(code: str, body_start: int, cursor_pos: int, python: Callable[[str, int], dict]) -> Optional[dict]:
    """Completion in the hole still open at ``cursor_pos`` of the cell ``code``, whose template body
    starts at ``body_start``; none in text. Options the hole gives after the cursor are not offered."""
    from lmnb.template.options import allowed
    from lmnb.template.parser import KEYWORDS, ROLES, _option_starts, names_and_stand_ins
    from lmnb.template.scanner import top_level

    body = code[body_start:cursor_pos]
    open_hole = _open_hole(body)
    if open_hole is None:
        return None
    start, string = open_hole
    hole = body[start + 1 :]

    def bound() -> tuple[list[str], dict]:  # (the names the cell binds at the hole: parsed only for an expression)
        return names_and_stand_ins(body[:start])

    field = _fstring_field(body, string) if string is not None else None
    if field is not None:  # {f"{person.na: the expression of an f-string's replacement field
        return _python_alone(field, cursor_pos, python, *bound())
    path = _PATH_SOURCE.match(hole) if string is not None else None
    if path:  # {image "ca: an image's or video's path: file names (IPython's, in the kernel's directory)
        return _python_alone(path.group(1), cursor_pos, python)
    if start < 0 or string is not None:  # the prompt's text or another string: no name to offer there
        return _reply([], cursor_pos, cursor_pos)
    first = _HOLE_WORD.match(hole)
    if first:
        slash, word = first.group(1), first.group(2) or ""
        names = ["/" + r for r in ROLES] if slash else KEYWORDS
        ours = _typed([n for n in names if n.startswith(slash + word)], "keyword")
        if slash:
            return _reply(ours, cursor_pos, cursor_pos - len(word) - 1)
        theirs, at = _python_offers(hole, cursor_pos, python, *bound())  # (the cell's names, kernel variables)
        theirs = [o for o in theirs if o[0] not in {text for text, _, _ in ours}]
        if at != cursor_pos - len(word):  # another word than ours: ours alone
            theirs = []
        return _reply(ours + theirs, cursor_pos, cursor_pos - len(word))
    media = _MEDIA_SOURCE.match(hole)
    if media and not any(c.isspace() for _, c in top_level(media.group(2))):  # {image ca: the source
        return _python_alone(media.group(2), cursor_pos, python, *bound())
    option = _OPTION.match(hole)
    space = len(hole) - len(option.group(2) or "") - 1 if option else -1
    if option and (space, hole[space]) in top_level(hole):  # (not in a string: stop="a b)
        kind, word = option.group(1), option.group(2) or ""
        keys = _MEDIA_OPTIONS[kind] if kind in _MEDIA_OPTIONS else allowed(kind)
        given = {key for at, key, _ in _option_starts(_whole_hole(hole, code[cursor_pos:])) if at != space + 1}
        eq = "" if code.startswith("=", cursor_pos) else "="  # (max_to|=4: the "=" is there already)
        return _reply(_typed([k + eq for k in keys if k.startswith(word) and k not in given], "param"), cursor_pos,
                      cursor_pos - len(word))
    expression = _expression(hole)
    if expression is not None:  # {fork tip in ti, {gen x max_tokens=n: that expression alone
        return _python_alone(expression, cursor_pos, python, *bound())
    return _python_alone(hole, cursor_pos, python, *bound())  # a hole that is a Python expression


def _python_alone(source: str, cursor_pos: int, python: Callable[[str, int], dict], names=(), values=None) -> dict:
    """The complete_reply content of ``_python_offers``."""
    offers, start = _python_offers(source, cursor_pos, python, names, values)
    return _reply(offers, cursor_pos, start)


def _python_offers(source: str, cursor_pos: int, python: Callable[[str, int], dict],
                   names=(), values=None) -> tuple[list[Offer], int]:
    """Those of ``names``, the names the cell binds where the hole is (``names_bound``), that the
    name ``source`` ends in begins (none after a ``.``: an attribute), then IPython's completion of
    ``source``, the Python text the cursor at ``cursor_pos`` ends, read alone and in brackets, as
    the hole's braces hold it. IPython reading the hole's whole cell as
    Python found no expression there (``{fork tips`` and ``{image ca`` got nothing; ``{fork tip in ``
    and ``{image `` its magic names, ``%%latex``, which no hole can hold, and those are left out here
    too), nor after a quote in the prompt's text (``it's {person.na`` got nothing: the rest of the
    line read as a string); unbracketed, a hole's new line (``{name\n .up``) is no expression and
    ``{fo`` offers the statement ``for``. Where that gives no name, the innermost expression being
    typed is asked alone (IPython without Jedi reads ``[ti`` as magic names). IPython knew no name
    the cell binds, not being the kernel's (``{fork t in stops}{gen x max_tokens=len(t`` offered
    ``tuple``, ``type``, not ``t``). Returns the matches, with their types, and the offset in the
    cell where the text they replace starts. An attribute of a name the cell binds (``t.up``, or
    through its subscripts and calls, ``r[0].up``),
    which IPython read as the kernel's ``t``, if any, is asked as one of that name's stand-in
    (``values``: ``stand_ins``): ``(stops)[0].up`` of ``{fork t in stops}``; none is offered where
    the name has none (a gen's value parsed by its ``json_schema``)."""
    attribute = _ATTRIBUTE_END.search(source)
    if attribute and attribute.group(1) in (values or {}):
        stand_in = values[attribute.group(1)]
        if stand_in is None:
            return [], cursor_pos - len(attribute.group(2).rpartition(".")[2])
        asked = "(" + stand_in + attribute.group(2)
        reply = python(asked, len(asked))
        return _ipython_offers(reply, magics=False), cursor_pos - len(asked) + reply.get("cursor_start", len(asked))
    for text in dict.fromkeys((source, _innermost(source))):
        reply = python("(" + text, len(text) + 1)
        offers = _ipython_offers(reply, magics=False)
        if offers:
            break
    start = cursor_pos - len(text) - 1 + reply.get("cursor_start", len(text) + 1)
    word = _NAME_END.search(source)
    ours = _typed([n for n in names if n.startswith(word.group())], "instance") if word else []
    if not ours:
        return offers, start
    at = cursor_pos - len(word.group())
    theirs = [o for o in offers if o[0] not in names] if start == at else []  # (IPython's other word: ours alone)
    return ours + theirs, at


def _fstring_field(text: str, quote: int) -> Optional[str]:
    """The Python expression being typed in a replacement field of the f-string whose quote is at
    ``quote`` in ``text``, which ``text`` ends in: ``person.na`` of ``f"{person.na``, ``w`` of
    ``f"{x:>{w`` (a field nested in a format spec). None where that string is no f-string or
    ``text`` ends in its literal text, in a field's conversion or format spec, or in a string
    inside a field. Read as Python 3.11 reads an f-string (PEP 498): ``{{`` and ``}}`` are literal
    braces, and so is the brace of a named escape ``\\N{...}`` outside a raw string; a field's
    expression ends at a ``!`` (not ``!=``), ``:`` or ``}`` outside its brackets."""
    from lmnb.template.errors import TemplateSyntaxError
    from lmnb.template.scanner import string_end

    prefix = _FSTRING_PREFIX.search(text, 0, quote)
    if text[quote] not in "'\"" or prefix is None:
        return None
    raw = "r" in prefix.group().lower()
    i = quote + (3 if text.startswith(text[quote] * 3, quote) else 1)
    fields = []  # each open field: [where its expression starts, still in it?, its brackets open]
    while i < len(text):
        c = text[i]
        if fields and fields[-1][1]:  # a field's expression
            field = fields[-1]
            if c in "'\"":  # (a string in it, of the other quote: nothing to complete where it is open)
                try:
                    i = string_end(text, i)
                except TemplateSyntaxError:
                    return None
                continue
            if c in "([{":
                field[2] += 1
            elif c in ")]}" and field[2]:
                field[2] -= 1
            elif c == "}":
                fields.pop()
            elif c in "!:" and not field[2] and not text.startswith("!=", i):
                field[1] = False
        elif c == "\\" and not raw:  # (a backslash escapes the next character, but not a brace)
            if text.startswith("N{", i + 1):
                end = text.find("}", i)
                if end < 0:
                    return None
                i = end
            elif text[i + 1 : i + 2] not in ("{", "}"):
                i += 1
        elif text.startswith(("{{", "}}"), i) and not fields:
            i += 1
        elif c == "{":
            fields.append([i + 1, True, 0])
        elif c == "}" and fields:  # (the end of a format spec)
            fields.pop()
        i += 1
    return text[fields[-1][0] :] if fields and fields[-1][1] else None


def _innermost(source: str) -> str:
    """The end of the Python text ``source`` after its last bracket still open or its last comma
    inside that bracket, leading spaces left out: ``ti`` of ``[ti``, ``[a, (b, ti``, ``{ti``."""
    from lmnb.template.errors import TemplateSyntaxError
    from lmnb.template.scanner import code_chars

    starts = [0]  # where the expression being typed starts, at each depth of open brackets
    try:
        for j, c in code_chars(source, curly=False):
            if c in "([{":
                starts.append(j + 1)
            elif c in ")]}" and len(starts) > 1:
                starts.pop()
            elif c == ",":
                starts[-1] = j + 1
    except TemplateSyntaxError:
        return source
    return source[starts[-1]:].lstrip()


def _expression(hole: str) -> Optional[str]:
    """The Python expression the open ``hole`` (its text up to the cursor) ends in, where the cell
    parser reads one there: a fork's count or, after its top-level ``in``, its items; the value of a
    gen's, select's or video's last option (``max_tokens=n``). None elsewhere."""
    from lmnb.template.parser import _is_in_keyword, _option_starts
    from lmnb.template.scanner import top_level

    fork = _FORK.match(hole)
    if fork:
        rest = fork.group(1)
        split = next((i for i, _ in top_level(rest) if _is_in_keyword(rest, i)), None)
        return (rest if split is None else rest[split + 2 :]).lstrip()
    primitive = _PRIMITIVE.match(hole)
    starts = _option_starts(primitive.group(1)) if primitive else []
    return primitive.group(1)[starts[-1][2] + 1 :].lstrip() if starts else None


def _whole_hole(hole: str, rest: str) -> str:
    """The text of the open hole ``hole`` (up to the cursor) with what ``rest``, the cell after the
    cursor, adds to it up to its ``}``; ``hole`` alone where the cell never closes it."""
    from lmnb.template.errors import TemplateSyntaxError
    from lmnb.template.scanner import hole_end

    try:
        return ("{" + hole + rest)[1 : hole_end("{" + hole + rest, 0) - 1]
    except TemplateSyntaxError:
        return hole


def lm_is_complete(code: str) -> Optional[dict]:
    """The is_complete_reply content for a ``%%lm`` template cell that is unfinished
    (``{"status": "incomplete", "indent": ""}``: a hole or a block left open) or that the cell
    parser refuses (``{"status": "invalid"}``); None for a cell this leaves to IPython (one that
    parses, a ``--python`` cell, any other cell)."""
    from lmnb.export.cells import lm_cell_parts
    from lmnb.template.cell_options import asks_for_python
    from lmnb.template import TemplateSyntaxError, cell_body, parse
    from lmnb.template.errors import UnclosedError

    parts = lm_cell_parts(code)
    if parts is None or asks_for_python(parts[0]):
        return None
    try:
        parse(cell_body(parts[1]))
    except UnclosedError:
        return {"status": "incomplete", "indent": ""}
    except TemplateSyntaxError:
        return {"status": "invalid"}
    return None
