"""Parse a ``%%lm`` cell body into a ``Template`` (grammar: docs/CELL_LANGUAGE.md).

One pass over the pieces from ``scanner.scan`` with a stack of open blocks. Names read by
expressions are resolved while parsing, because the answer depends on what came before: a fork
target, a variable captured earlier in the same state, or else a kernel variable.
"""

from __future__ import annotations

import ast
import builtins
import copy
import io
import keyword
import re
import tokenize
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lmnb.ir import OUTPUT_OPTIONS, did_you_mean, output_clash, token_bounds_problem
from lmnb.template import options as opts
from lmnb.template.errors import (
    LONE_SURROGATE, TOO_DEEP, TOO_DEEP_HINT, TemplateSyntaxError, UnclosedError, curly_quotes_hint, node_offset,
    offset_of, straightened, surrogate_problem,
)
from lmnb.template.nodes import (
    Expr, Fork, Interp, Media, Node, Option, Primitive, RefKind, Role, Target, Text, target_names,
)
from lmnb.template.scanner import decode_text, scan, top_level

if TYPE_CHECKING:
    from lmnb.template.template import Template

ROLES = ("system", "user", "assistant")
MEDIA = ("image", "video")
KEYWORDS = ("gen", "select", "fork", "join") + MEDIA + ROLES
_BLOCK_OPEN = {"role", "fork"}
_BLOCK_CLOSE = {"close_role", "join"}
_WORD = re.compile(r"(\s*)(/?)([A-Za-z_][A-Za-z_0-9]*)")
_MAX_FORK_DEPTH = 20  # Python's limit on statically nested blocks ("too many statically nested blocks")
_IDENT = re.compile(r"[^\W\d]\w*")  # a Python identifier's shape, Unicode letters included

# Builtins an expression may call without the kernel defining them. Other builtin names
# (input, format, type, id, ...) are treated as kernel variables: they are common variable names.
BUILTIN_NAMES = frozenset(
    "abs all any bool dict enumerate filter float int isinstance len list map max min range "
    "repr reversed round set sorted str sum tuple zip".split()
)
# Python's builtins, and those IPython's shell adds to them (display; get_ipython while a cell
# runs): names a hole or a result reads or hides in a kernel (template, cell_options).
PYTHON_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
IPYTHON_BUILTINS = frozenset({"display", "get_ipython"})


@dataclass
class _Scope:
    """Names visible in one program state: the top-level state or one fork branch."""

    parent: "_Scope | None" = None
    locals: set = field(default_factory=set)  # fork targets bound by this branch
    vars: set = field(default_factory=set)  # readable as state[name]
    captured: list = field(default_factory=list)  # captured in this state, in order

    def child(self) -> "_Scope":
        return _Scope(parent=self, vars=set(self.vars))

    def is_local(self, name: str) -> bool:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.locals:
                return True
            scope = scope.parent
        return False

    def capture(self, name: str) -> None:
        self.vars.add(name)
        if name not in self.captured:
            self.captured.append(name)


@dataclass
class _Block:
    kind: str  # "role" | "fork"
    offset: int
    role: str | None = None
    fork: dict | None = None  # count / target / items of an open fork
    children: list = field(default_factory=list)
    outer_scope: _Scope | None = None


def parse(source: str, first_line: int = 1, filename: str = "<%%lm cell>", indent: str = "") -> Template:
    """Parse a cell body. ``first_line`` is the cell line of the body's first line (2 under ``%%lm``);
    ``indent`` the indentation taken off each line of an indented cell, which columns count (so
    errors point into the cell as typed).

    Returns a ``Template``. Raises ``TemplateSyntaxError`` (with line and column) for any cell that
    does not follow the grammar.
    """
    from lmnb.template.template import Template

    source = source.replace("\r\n", "\n").replace("\r", "\n")  # a lone \r ends a line for Python too
    return Template(**_Parser(source, first_line, filename, indent).run())


def names_bound(source: str) -> list[str]:
    """The names a hole written at the end of ``source``, a cell body whose blocks may still be
    open, reads from the cell rather than the kernel (docs/CELL_LANGUAGE.md, "Where names come
    from"): the targets of the forks open there, the innermost fork's first, then the results
    captured before it that a hole there reads (earlier gens' and selects', a joined fork's lists,
    its own branch's), alphabetically. Empty where the parser refuses ``source`` before its end
    (the scopes past a bad hole are not known). For completion in a hole being typed."""
    return names_and_stand_ins(source)[0]


def stand_ins(source: str) -> dict[str, str | None]:
    """The names the cell binds at the end of ``source`` (read as ``names_bound`` reads it), each
    with a Python expression of kernel variables and literals alone whose value is of the kind the
    name holds there, or None where none is known: for completion of the name's attributes, which
    the kernel's variable of that name, if any, does not have.

    A fork target is its items' first item (``{fork t in stops}`` -> ``(stops)[0]``), where the
    items are ``enumerate(xs)`` or ``zip(xs, ys)`` a tuple of the first items (``(0)``,
    ``(xs)[0]``), ``d.items()`` the first key and its value (``(list(d))[0]``,
    ``(d)[(list(d))[0]]``; ``keys()``, ``values()`` the one), a result's text a str (``''``: a
    character), and a destructured target's names are the parts of that item (``{fork i, t in
    pairs}``: ``t`` -> ``((pairs)[0])[1]``); names of the cell in the items are their own stand-ins
    (``{fork u in t}`` -> ``((stops)[0])[0]``). A gen's or select's result is text, ``''``, a gen's
    value parsed by ``dtype`` a value of its type (``(0)``, ``(0.0)``, ``(False)``; ``''`` for
    str), but by ``json_schema`` or a ``dtype`` not known here (a kernel variable's), None; a
    result gathered by ``{join}`` is a list of the branches' (``['']``). The innermost binding of
    a name is the one given."""
    return names_and_stand_ins(source)[1]


def names_and_stand_ins(source: str) -> tuple[list[str], dict[str, str | None]]:
    """``names_bound(source)`` and ``stand_ins(source)``, from one reading of ``source``
    (completion asks for both)."""
    parser = _parsed_to_end(source)
    if parser is None:
        return [], {}
    targets = [n for b in reversed(parser.stack) if b.kind == "fork" and b.fork["target"] is not None
               for n in target_names(b.fork["target"])]
    names = list(dict.fromkeys(targets)) + sorted(parser.scope.vars - set(targets))
    return names, _stand_ins(parser)


def _stand_ins(parser: "_Parser") -> dict[str, str | None]:
    """``stand_ins`` of the names bound at the end of what ``parser`` read."""
    values: dict[str, str | None] = _captured_stand_ins(parser.root)
    for b in parser.stack:  # (outermost first: each block's children come before the next block opened)
        fork = b.fork if b.kind == "fork" else None
        if fork is not None and fork["target"] is not None:
            values.update(_destructured(fork["target"], _first_item(fork["items"], values)))
        values.update(_captured_stand_ins(b.children))
    return values


def _captured_stand_ins(nodes) -> dict[str, str | None]:
    """``stand_ins`` of the results that ``nodes`` (a run of the cell's nodes) capture for the
    nodes after them."""
    values: dict[str, str | None] = {}
    for node in nodes:
        if isinstance(node, Primitive) and node.name is not None:
            values[node.name] = _result_stand_in(node)
        elif isinstance(node, Role):
            values.update(_captured_stand_ins(node.body))
        elif isinstance(node, Fork):  # (joined: each branch's result gathered into a list)
            values.update({name: None if value is None else f"[{value}]"
                           for name, value in _captured_stand_ins(node.body).items()})
    return values


# A value of each type a gen's dtype= parses its text into (lmnb.ir.dtype_regex), by the type's name
_DTYPE_STAND_INS = {"int": "(0)", "float": "(0.0)", "bool": "(False)", "str": "''", "string": "''"}
_NUMBERS = ("(0)", "(0.0)", "(False)")  # (the stand-ins of values that have no items, enumerate's index's too)


def _result_stand_in(node: Primitive) -> str | None:
    """The stand-in of the result a gen or select ``node`` captures: its text, ``''``, or for a
    gen's ``dtype`` of int, float, bool or str (the builtin or its name as a literal) a value of
    that type; None for a value parsed by a ``json_schema`` or by a ``dtype`` not known here (a
    kernel variable's)."""
    stand_in = "''"
    for o in node.options:
        value = _literal(o.value)
        if o.key == "json_schema" and value is not None:
            return None
        if o.key == "dtype" and value is not None:
            body = o.value.tree.body
            name = body.id if isinstance(body, ast.Name) and not o.value.refs else value  # (int: a builtin)
            if not isinstance(name, str) or name not in _DTYPE_STAND_INS:
                return None
            stand_in = _DTYPE_STAND_INS[name]
    return stand_in


_Item = str | tuple | None  # an item's stand-in: an expression, a tuple of its parts' stand-ins, or None


def _first_item(items: Expr, values: dict[str, str | None]) -> _Item:
    """The stand-in of the first item of a fork's ``items``, whose names bound by the cell have the
    stand-ins ``values``; None where one of those has none."""
    body = items.tree.body
    if isinstance(body, ast.Name) and values.get(body.id) == "''":  # (a result's text: its items are characters,
        return "''"  # str; ('')[0] is an IndexError where IPython evaluates it, without Jedi)
    if isinstance(body, ast.Name) and values.get(body.id) in _NUMBERS:  # (no items: the fork fails as it runs)
        return None
    try:
        tree = copy.deepcopy(body)
        for name, node in _free_names(tree):
            if name in values:
                if values[name] is None:
                    return None
                node.id = values[name]  # (a name ast.unparse writes as it is; a stand-in is a primary: no brackets)
        return _item_of(tree)
    except RecursionError:  # (items nested deeper than deepcopy or ast.unparse goes)
        return None


def _item_of(tree: ast.expr) -> _Item:
    """The stand-in of the first item of the items ``tree`` (their stand-ins put in its names)."""
    if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.args
            and not any(isinstance(a, ast.Starred) for a in tree.args)):
        if tree.func.id == "enumerate" and len(tree.args) + len(tree.keywords) <= 2 and all(
                k.arg == "start" for k in tree.keywords):
            return ("(0)", _item_of(tree.args[0]))  # (an int index, whatever the start)
        if tree.func.id == "zip" and all(k.arg == "strict" for k in tree.keywords):
            return tuple(_item_of(a) for a in tree.args)
    if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and not tree.args and not tree.keywords
            and tree.func.attr in ("items", "keys", "values")):
        # a mapping's view, which has no [0]: its first key and that key's value, through a list of
        # the keys (Jedi, IPython's default completer, infers nothing from a call of a view's method,
        # and IPython's "limited" evaluation calls list() but neither next() nor iter())
        mapping = ast.unparse(tree.func.value)
        key = f"(list({mapping}))[0]"
        value = f"({mapping})[{key}]"
        return {"items": (key, value), "keys": key, "values": value}[tree.func.attr]
    return f"({ast.unparse(tree)})[0]"


def _destructured(target: Target, item: _Item) -> dict[str, str | None]:
    """The stand-ins of the names of a fork's ``target`` bound to the item whose stand-in is
    ``item``: a part of a tuple item by its place, ``(item)[k]`` of another."""
    if isinstance(target, str):
        return {target: _expression(item)}
    if isinstance(item, tuple) and len(item) != len(target):  # (the fork fails as it runs)
        item = None
    values: dict[str, str | None] = {}
    for k, part in enumerate(target):
        inner = item[k] if isinstance(item, tuple) else None if item is None else f"({item})[{k}]"
        values.update(_destructured(part, inner))
    return values


def _expression(item: _Item) -> str | None:
    """``item`` as one expression: a tuple's parts in a tuple display."""
    if not isinstance(item, tuple):
        return item
    parts = [_expression(p) for p in item]
    return None if None in parts else "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _parsed_to_end(source: str) -> "_Parser | None":
    """A parser that read the cell body ``source`` to its end, its blocks open there still on its
    stack; None where it refuses ``source`` before its end."""
    parser = _Parser(source.replace("\r\n", "\n").replace("\r", "\n"), 1, "<%%lm cell>")
    try:
        parser.run()
    except UnclosedError:  # (the blocks still open at the end: the scope there is the hole's)
        pass
    except TemplateSyntaxError:
        return None
    return parser


class _Parser:
    def __init__(self, source: str, first_line: int, filename: str, indent: str = ""):
        self.src = source
        self.first_line = first_line
        self.indent = indent
        self.filename = filename
        self.scope = _Scope()
        self.top = self.scope
        self.stack: list[_Block] = []
        self.root: list[Node] = []
        self.arguments: dict[str, int] = {}  # kernel variable -> offset of first use
        self.hole_spans: list[tuple[int, int]] = []  # (start, end) of each hole, set by run()

    # -- errors ---------------------------------------------------------------------------------
    def error(self, message: str, offset: int, hint: str | None = None,
              kind: type[TemplateSyntaxError] = TemplateSyntaxError) -> TemplateSyntaxError:
        return kind(message, self.src, offset, self.first_line, hint, self.indent)

    def capitalised_tag(self, tag: str, after: int, before: int) -> str | None:
        """A hint naming the first hole between offsets ``after`` and ``before`` that is ``tag``
        (``join``, ``user``, ...) in another case, ``{Join}``, which reads as a Python variable, so
        that the block it was to open or close is left unopened or unclosed; None where none is.
        For ``fork``, whose tag takes more, also a Python expression that starts with the word in
        another case (``{Fork(2)}``, ``{FORK -1}``; ``{Fork 2}`` is no expression and is told at itself)."""
        for start, end in self.hole_spans:
            body = self.src[start + 1 : end - 1].strip()
            word = _IDENT.match(body)
            if not (after <= start < before and word and word.group() != tag and word.group().lower() == tag):
                continue
            if body == word.group():
                how = "(lowercase, then a space)" if tag == "fork" else "(lowercase)"
                return (f"{{{body}}} at {self.where(start)} is read as a Python variable, not the tag: "
                        f"write {construct_offer(tag)} {how}")
            if tag == "fork":
                return (f"{{{body}}} at {self.where(start)} is read as a Python expression, not the tag: "
                        f"write {construct_offer(tag)} (lowercase, then a space)")
        return None

    def where(self, offset: int) -> str:
        from lmnb.template.errors import line_col

        line, col = line_col(self.src, offset, self.first_line, self.indent)
        return f"line {line}, col {col}"

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> dict:
        pieces = scan(self.src, self.first_line, self.indent)
        holes = {p.start: self.classify(p.start, p.end) for p in pieces if p.kind == "hole"}
        self.hole_spans = [(p.start, p.end) for p in pieces if p.kind == "hole"]
        deleted = self.standalone_lines(pieces, holes)
        for p in pieces:
            if p.kind == "text":
                kept = [i for i in range(p.start, p.end) if not deleted[i]]
                if kept:
                    raw = "".join(self.src[i] for i in kept)
                    self.emit(Text(decode_text(raw), kept[0]))
            else:
                self.hole(p.start, p.end, *holes[p.start])
        if self.stack:
            b = self.stack[-1]
            close = "{join}" if b.kind == "fork" else "{/" + b.role + "}"
            opener = "{fork}" if b.kind == "fork" else "{" + b.role + "}"
            hint = f"add {close} where the block ends"
            if b.kind == "role":  # most often a Python variable named user or system, meant as text
                hint += f"; to insert a variable named {b.role} as text, write {{({b.role})}}"
            raise self.error(f"{opener} is never closed", b.offset, kind=UnclosedError,
                             hint=self.capitalised_tag(close[1:-1], b.offset, len(self.src)) or hint)
        return dict(
            source=self.src,
            body=tuple(self.root),
            arguments=tuple(self.arguments),
            argument_offsets=dict(self.arguments),
            captures=tuple(self.top.captured),
            first_line=self.first_line,
            indent=self.indent,
            filename=self.filename,
        )

    def emit(self, node: Node) -> None:
        (self.stack[-1].children if self.stack else self.root).append(node)

    # -- lexical classification of holes --------------------------------------------------------
    def classify(self, start: int, end: int) -> tuple[str, int, str]:
        """(kind, offset of the rest, rest): kind is expr, gen, select, image, video, role, close_role,
        fork, join."""
        body = self.src[start + 1 : end - 1]
        m = _WORD.match(body)
        if body.lstrip().startswith("/") and not (m and m.group(2)):
            raise self.error("expected a closing tag such as {/user}", start)
        if not m:
            return "expr", start + 1, body
        word, slash = m.group(3), m.group(2)
        rest_at = start + 1 + m.end()
        rest = body[m.end() :]
        if slash:
            if word == "fork":
                raise self.error("a fork is closed with {join}, not {/fork}", start)
            if word not in ROLES:
                raise self.error(f"unknown closing tag {{/{word}}}", start, hint="closing tags are {/system}, {/user}, {/assistant}")
            if rest.strip():
                raise self.error(f"{{/{word}}} takes no options", rest_at + _lead(rest))
            return "close_role", rest_at, word
        if word not in KEYWORDS or (rest and not rest[0].isspace()):
            return "expr", start + 1, body
        if word in ROLES:
            if rest.strip():
                raise self.error(
                    f"{{{word}}} takes no options", rest_at + _lead(rest),
                    hint=f"put the {word} text between {{{word}}} and {{/{word}}}",
                )
            return "role", rest_at, word
        return word, rest_at, rest

    def standalone_lines(self, pieces, holes) -> bytearray:
        """Mark characters removed around block tags that stand alone on their line.

        Such a tag takes its whole line with it (indentation, tag, line break); a closing tag also
        takes the line break that ends the block's last line, so a block holds exactly the lines
        between its tags.
        """
        src = self.src
        deleted = bytearray(len(src))
        for p in pieces:
            if p.kind != "hole":
                continue
            kind = holes[p.start][0]
            if kind not in _BLOCK_OPEN | _BLOCK_CLOSE:
                continue
            ls = src.rfind("\n", 0, p.start) + 1
            le = src.find("\n", p.end)
            le = len(src) if le < 0 else le
            if src[ls : p.start].strip() or src[p.end : le].strip():
                continue
            for i in range(ls, min(le + 1, len(src))):
                deleted[i] = 1
            if kind in _BLOCK_CLOSE and ls > 0:
                deleted[ls - 1] = 1
        return deleted

    # -- holes ----------------------------------------------------------------------------------
    def hole(self, start: int, end: int, kind: str, rest_at: int, rest: str) -> None:
        self.current_hole = (start, end)  # (what a hint offers fixed)
        if kind == "expr":
            if not rest.strip():
                raise self.error("empty hole '{}'", start, hint="write '{{}}' for literal braces")
            self.interp(start, rest_at, rest)
        elif kind in ("gen", "select"):
            self.primitive(kind, start, rest_at, rest)
        elif kind in MEDIA:
            self.media(kind, start, rest_at, rest)
        elif kind == "role":
            self.open_role(rest, start)
        elif kind == "close_role":
            self.close_role(rest, start)
        elif kind == "fork":
            self.open_fork(start, rest_at, rest)
        elif kind == "join":
            self.join(start, rest_at, rest)

    def interp(self, start: int, rest_at: int, rest: str) -> None:
        """``{expr}`` with an optional ``!r``/``!s``/``!a`` conversion and ``:spec``, as in f-strings."""
        conversion, spec, end = None, "", len(rest)
        for i, c in top_level(rest):
            nxt = rest[i + 1 : i + 2]
            if c == "!" and nxt != "=":
                end = i
                conversion = nxt
                tail = rest[i + 2 :]
                if conversion not in ("r", "s", "a") or (tail.strip() and not tail.startswith(":")):
                    raise self.error("a conversion is !r, !s or !a", rest_at + i)
                spec = tail[1:] if tail.startswith(":") else ""
                break
            if c == ":":  # even before "=": f"{x:=^5}" is x centred with "=" fill, not a walrus
                end, spec = i, rest[i + 1 :]
                break
        if "{" in spec or "}" in spec:
            raise self.error("nested fields in a format spec are not supported", rest_at + rest.index("{", end) if "{" in spec else rest_at + end)
        self._refuse_self_documenting(rest[:end], rest_at, conversion, spec)
        try:
            expr = self.expr(rest[:end], rest_at, hint_braces=True)
        except TemplateSyntaxError as e:
            meant = _construct_meant(rest)
            if meant is None or not e.message.startswith("invalid Python expression"):
                raise
            word, offer = meant
            raise self.error(
                f"{word!r} starts no construct of the %%lm cell language, and the hole is no Python "
                f"expression either; did you mean {offer}?", rest_at + _lead(rest),
                hint="a hole is a construct where it starts with one of the words " + ", ".join(KEYWORDS)
                + ", in lowercase, alone ({user}) or before a space ({gen x}); any other hole is a Python expression",
            ) from None
        body = expr.tree.body
        if spec and isinstance(body, ast.Constant) and (isinstance(body.value, (str, bytes)) or spec[0].isspace()):
            # {"a": 1} parses as the constant "a" with format spec " 1", {1: 2} as 1 with " 2": JSON
            # or a dict, almost surely. A number with a spec ({3.14159:.2f}) is a hole like {x:.2f}.
            raise self.error(
                "this hole looks like JSON or a dict, not an interpolation", start,
                hint="to write literal braces, double them: '{{' and '}}'",
            )
        self.emit(Interp(expr, start, conversion, spec))

    def _refuse_self_documenting(self, text: str, at: int, conversion: str | None, spec: str) -> None:
        """Refuse f-strings' ``{x=}`` (text ``x=`` then the value), which a hole does not take, with
        the hole that writes the same; any other expression that ends in ``=`` is left to ``expr``."""
        body = text.rstrip()
        if not body.endswith("=") or not body[:-1].strip():
            return
        try:
            ast.parse("(" + body[:-1] + ")", mode="eval")
        except SyntaxError:
            return
        # f"{x = }" writes its text as it stands ("x = "), then repr(x) unless a conversion or
        # format spec says otherwise
        how = f"!{conversion}" if conversion else "" if spec else "!r"
        same = text + "{" + body[:-1].strip() + how + (":" + spec if spec else "") + "}"
        raise self.error("f-strings' self-documenting {expr=} is not supported in a %%lm hole", at + len(body) - 1,
                         hint=f"write {same}")

    def primitive(self, kind: str, start: int, rest_at: int, rest: str) -> None:
        allowed = opts.allowed(kind)
        comment = _comment_at(rest)
        if comment is not None:
            raise self.error(_COMMENT_IN_HOLE, rest_at + comment)
        starts = _option_starts(rest)
        head_end = starts[0][0] if starts else len(rest)
        head = rest[:head_end].strip().rstrip(",").strip()
        name = None
        if head:
            if head in KEYWORDS:  # ({user} would be the role tag, so the result could not be read as {user})
                raise self.error(
                    f"{head!r} is a word of the %%lm cell language (its {{{head}}} tag), so it cannot name a "
                    f"{kind} result", rest_at + _lead(rest), hint=f"pick another name, e.g. {head}_")
            if not head.isidentifier():
                raise self.error(
                    f"expected {{{kind} NAME option=value ...}}; {head!r} is not a variable name",
                    rest_at + _lead(rest),
                    hint="the name is a bare identifier (no quotes); options are written key=value",
                )
            name = unicodedata.normalize("NFKC", head)  # the name Python code reads it by
            if is_reserved(name):
                raise self.error(
                    f"{name!r} is reserved in Python, so it cannot name a {kind} result (the variable could "
                    "never be read)", rest_at + _lead(rest), hint=f"pick another name, e.g. {name}_")
        unknown = [(at, key) for at, key, _ in starts if key not in allowed]
        if unknown:  # (all of them, each offered its option: fixing one showed the next only on the next run)
            raise self.error(_no_options(kind, [key for _, key in unknown], allowed), rest_at + unknown[0][0],
                             hint=f"{kind} options: {', '.join(allowed)}")
        options: list[Option] = []
        seen: set[str] = set()
        for k, (at, key, eq) in enumerate(starts):
            if key in seen:
                raise self.error(f"option {key!r} is given twice", rest_at + at)
            seen.add(key)
            value = _option_value(rest, starts, k)
            if not value.strip():
                raise self.error(f"option {key!r} has no value", rest_at + eq)
            expr = self.expr(value, rest_at + eq + 1)
            options.append(Option(key, expr, rest_at + at))
        # the options given a value here (a literal None is gen()'s default, as if not written:
        # choices=None makes no pick, as gen(choices=None) makes none); one read from a variable may
        # hold None too, so a combination it is in is left to lmnb.gen, as the cell runs
        valued = {o.key for o in options if _given(o.value)}
        # gen(choices=...) checks the temperature as select() does (choices from a variable most
        # likely pick; select's rule and gen's refuse the same literals but None, which both take
        # here, so only the words depend on the guess)
        picks = kind == "gen" and any(o.key == "choices" and _literal(o.value) is not None for o in options)
        self.refuse_literals(kind, options, picks)
        if kind == "select" and "choices" not in seen:
            raise self.error("select needs choices=[...]", start, hint='e.g. {select answer choices=["yes", "no"]}')
        clash = [k for k in OUTPUT_OPTIONS if k in valued]
        problem = output_clash(clash) if kind == "gen" else None
        if problem:
            second = next(o for o in options if o.key == clash[1])
            raise self.error(problem, second.offset)
        if kind == "gen" and "choices" in valued:
            self._refuse_unused_by_a_pick(options)
        if kind == "gen":
            self._refuse_token_bounds(options)
        if name is not None:
            self.capture(name, start)
        self.emit(Primitive(kind, name, tuple(options), start))

    def _refuse_token_bounds(self, options: list[Option]) -> None:
        """Refuse, at ``min_tokens``, literal ``min_tokens`` and ``max_tokens`` that ``lmnb.gen``
        refuses together (more tokens at least than at most), which failed only once the cell ran."""
        given = {o.key: o for o in options if o.key in ("max_tokens", "min_tokens")}
        if len(given) == 2:
            problem = token_bounds_problem(_literal(given["max_tokens"].value), _literal(given["min_tokens"].value))
            if problem:
                raise self.error(problem, given["min_tokens"].value.offset)

    def _refuse_unused_by_a_pick(self, options: list[Option]) -> None:
        """Refuse, at the option, what ``lmnb.gen`` refuses with ``choices`` (only once the cell ran,
        pointing at the hole): a pick scores the choices and generates nothing, so it takes only
        ``temperature`` and ``choices_method`` (and ``n`` of 1). A value that does nothing there
        (None; 1 for ``n``) is let through as gen lets it, and so is a variable, which may hold
        None: ``lmnb.gen`` tells it at the option as the cell runs."""
        for o in options:
            if o.key in ("choices", "choices_method", "temperature"):
                continue
            value = _literal(o.value)
            if not _given(o.value) or (o.key == "n" and value == 1):
                continue
            if o.key == "n":
                raise self.error("a gen with choices picks one choice, so it takes no n", o.offset,
                                 hint="drop n; for several picks, {fork N} with a gen with choices=... temperature=... "
                                      "in each branch, then {join}")
            seeded = "; the cell's --seed (%%lm --seed N) makes a sampled pick reproducible" if o.key == "seed" else ""
            raise self.error(f"a gen with choices scores them and generates nothing, so {o.key} would do nothing",
                             o.offset, hint=f"drop {o.key}; with choices, gen takes only temperature and "
                                            f"choices_method{seeded}")

    def media(self, kind: str, start: int, rest_at: int, rest: str) -> None:
        """``{image SRC}`` / ``{video SRC frames=N}``: SRC is any Python expression (up to the first
        top-level ``key=``); a video needs ``frames``, an image takes no option."""
        starts = _option_starts(rest)
        head = rest[: starts[0][0] if starts else len(rest)].rstrip()
        head = head[:-1] if head.endswith(",") else head
        if not head.strip():
            example = '{image photo} or {image "cat.png"}' if kind == "image" else '{video clip frames=8}'
            raise self.error(
                f"{{{kind}}} needs a source: a kernel variable or a path", start,
                hint=f"e.g. {example}; to insert a variable named {kind} as text, write {{({kind})}}",
            )
        try:
            source = self.expr(head, rest_at)
        except TemplateSyntaxError as e:  # ({image /tmp/cat.png}: "invalid Python expression")
            frames_at = [k for k, (_, key, _) in enumerate(starts) if key == "frames"]
            path_hint = opts.bare_media_path(kind, head, _option_value(rest, starts, frames_at[0]) if frames_at else "N")
            if path_hint is None:
                raise
            raise self.error(e.message, e.offset, hint=path_hint) from None
        literal = _literal(source)
        if literal is not _NOT_LITERAL and not isinstance(literal, (str, bytes)):
            raise self.error(
                f"{kind} source must be a path, bytes or a PIL image, got {type(literal).__name__}", source.offset,
                hint="put the path in quotes, or name a kernel variable that holds the image",
            )
        if kind == "image" and starts:
            raise self.error("{image} takes no options", rest_at + starts[0][0],
                             hint="write {image SRC}; frames= is for {video}")
        unknown = [(at, key) for at, key, _ in starts if key != "frames"]
        if unknown:
            raise self.error(_no_options("video", [key for _, key in unknown], ["frames"]), rest_at + unknown[0][0],
                             hint="video's only option is frames=N")
        frames = None
        for k, (at, key, eq) in enumerate(starts):
            if frames is not None:
                raise self.error("option 'frames' is given twice", rest_at + at)
            value = _option_value(rest, starts, k)
            if not value.strip():
                raise self.error("option 'frames' has no value", rest_at + eq)
            frames = self.expr(value, rest_at + eq + 1)
            n = _literal(frames)
            if n is not _NOT_LITERAL and not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
                raise self.error(f"frames must be an integer >= 1, got {n!r}", frames.offset)
        if kind == "video" and frames is None:
            raise self.error("{video} needs frames=N (how many frames to sample)", start, hint="e.g. {video clip frames=8}")
        self.emit(Media(kind, source, frames, start))

    def refuse_literals(self, kind: str, options: list[Option], picks: bool) -> None:
        """Catch mistakes in literal option values at parse time, pointing at the value (``picks``:
        ``options.check_literal``'s, a gen with choices). Of several, the one ``lmnb.gen`` (or
        ``select``) called with the same values names (``options.first_refused``), not the first
        written, so that the cell and Python tell the same."""
        refused, fine = [], {}
        for o in options:
            body = o.value.tree.body
            if isinstance(body, ast.Set) and len(body.elts) == 1 and not isinstance(body.elts[0], ast.Constant):
                # max_tokens={n}: braces as around a hole, which make a set here (found only as the gen ran)
                inner = ast.unparse(body.elts[0])
                raise self.error(f"{o.key}={{{inner}}} is a set: inside a hole an option's value is a Python "
                                 "expression already", o.value.offset, hint=f"write {o.key}={inner}")
            joined = _side_by_side_strings(o.value)
            if joined:
                pieces, value, at = joined
                raise self.error(f"{' '.join(pieces)} in {o.key}= is one string{value}: Python joins strings "
                                 "written side by side; a list's items are separated by commas (spaces "
                                 "separate only a hole's options)", o.value.offset + at,
                                 hint=f"write {', '.join(pieces)}")
            value = _literal(o.value)
            if value is _NOT_LITERAL:
                continue  # checked by lmnb when the program runs
            problem = opts.check_literal(kind, o.key, value, o.value.source.strip(), picks and o.key == "temperature")
            if problem:
                refused.append((o, value, problem))
            else:
                fine[o.key] = value
        if refused:
            o, _, problem = refused[opts.first_refused(kind, [(o.key, v) for o, v, _ in refused], fine)
                                    if len(refused) > 1 else 0]
            raise self.error(problem, o.value.offset)

    def capture(self, name: str, offset: int) -> None:
        if self.scope.is_local(name):
            raise self.error(f"{name!r} is a fork target here; capture into another name", offset)
        self.scope.capture(name)

    def open_role(self, role: str, start: int) -> None:
        for b in reversed(self.stack):
            if b.kind == "role":
                raise self.error(
                    f"roles cannot nest: {{{b.role}}} opened at {self.where(b.offset)} is still open",
                    start, hint=f"close it with {{/{b.role}}} before {{{role}}}; to insert a variable named {role} as "
                                f"text, write {{({role})}}",
                )
        self.stack.append(_Block("role", start, role=role))

    def close_role(self, role: str, start: int) -> None:
        if not self.stack:
            raise self.error(f"{{/{role}}} without an open {{{role}}}", start,
                             hint=self.capitalised_tag(role, 0, start))
        b = self.stack[-1]
        if b.kind == "fork":
            raise self.error(
                f"{{/{role}}} inside the {{fork}} opened at {self.where(b.offset)}",
                start, hint="close the fork with {join} first, or open the role inside the fork",
            )
        if b.role != role:
            raise self.error(
                f"{{/{role}}} does not match {{{b.role}}} opened at {self.where(b.offset)}",
                start, hint=f"close it with {{/{b.role}}}",
            )
        self.stack.pop()
        self.emit(Role(role, tuple(b.children), b.offset))

    def open_fork(self, start: int, rest_at: int, rest: str) -> None:
        if not rest.strip():
            raise self.error("{fork} needs a branch count or 'NAME in ITEMS'", start, hint="e.g. {fork 3} or {fork tip in tips}")
        if sum(b.kind == "fork" for b in self.stack) == _MAX_FORK_DEPTH:
            raise self.error(f"forks nest at most {_MAX_FORK_DEPTH} deep: each is a loop in the exported program, "
                             "and Python allows no deeper", start, hint="close an outer fork with {join} first")
        split = next((i for i, _ in top_level(rest) if _is_in_keyword(rest, i)), None)
        count = items = target = None
        if split is None:
            count = self.expr(rest, rest_at)
            try:
                n = ast.literal_eval(count.tree.body)
            except (ValueError, TypeError, SyntaxError):
                n = None
            if n is not None:
                try:
                    opts.fork_count(n, count.source)
                except ValueError as e:
                    raise self.error(str(e), count.offset) from None
        else:
            target = self.target(rest[:split], rest_at)
            items = self.expr(rest[split + 2 :], rest_at + split + 2)
        outer = self.scope
        self.scope = outer.child()
        if target is not None:
            self.scope.locals.update(target_names(target))
        self.stack.append(_Block("fork", start, fork=dict(count=count, target=target, items=items), outer_scope=outer))

    def target(self, text: str, offset: int) -> Target:
        lead = _lead(text)
        lone = LONE_SURROGATE.search(text)
        if lone:
            raise self.error(surrogate_problem(lone.group()), offset + lone.start())
        try:
            tree = ast.parse("(" + text.strip() + ")", mode="eval").body
        except SyntaxError:
            tree = None

        def convert(node) -> Target:
            if isinstance(node, ast.Name):  # (the parser has NFKC-normalized the name)
                return node.id
            if isinstance(node, ast.Tuple) and node.elts:
                return tuple(convert(e) for e in node.elts)
            raise ValueError

        try:
            target = convert(tree)
        except ValueError:
            raise self.error(
                "a fork target must be a name or a tuple of names", offset + lead,
                hint="e.g. {fork tip in tips} or {fork i, tip in enumerate(tips)}",
            ) from None
        reserved = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and is_reserved(n.id)]
        if reserved:  # __debug__ parses as a name, but the exported loop could not assign it
            raise self.error(f"{reserved[0]!r} is reserved in Python, so it cannot be a fork target",
                             offset + lead, hint=f"pick another name, e.g. {reserved[0]}_")
        return target

    def join(self, start: int, rest_at: int, rest: str) -> None:
        word = rest.strip()
        if word not in ("", "concat"):
            raise self.error("expected {join} or {join concat}", rest_at + _lead(rest))
        if not self.stack or self.stack[-1].kind != "fork":
            if self.stack:
                b = self.stack[-1]
                raise self.error(
                    f"{{join}} inside {{{b.role}}} opened at {self.where(b.offset)}", start,
                    hint=self.capitalised_tag("fork", b.offset, start)
                    or f"close the role with {{/{b.role}}} before {{join}}",
                )
            raise self.error("{join} without an open {fork}", start, hint=self.capitalised_tag("fork", 0, start))
        b = self.stack.pop()
        branch, outer = self.scope, b.outer_scope
        self.scope = outer
        # Both join modes gather the branch variables into lists (concat also appends the text).
        for name in branch.captured:
            if name in outer.vars:
                raise self.error(
                    f"{name!r} is captured in the fork branches but already exists before the fork; "
                    "the join would replace it with the list of branch values",
                    start, hint="capture the branch values under a new name",
                )
            outer.capture(name)
        mode = "concate_and_append" if word == "concat" else "gather_variable"
        self.emit(Fork(b.fork["count"], b.fork["target"], b.fork["items"], tuple(b.children), mode, b.offset))

    # -- expressions ----------------------------------------------------------------------------
    def expr(self, text: str, offset: int, hint_braces: bool = False) -> Expr:
        lead = _lead(text)
        source = text.strip()
        at = offset + lead
        if not source:
            raise self.error("empty expression", offset)
        lone = LONE_SURROGATE.search(source)
        if lone:
            raise self.error(surrogate_problem(lone.group()), at + lone.start())
        wrapped = "(" + source + ")"
        try:
            tree = ast.parse(wrapped, mode="eval")
            compile(tree, self.filename, "eval")  # refuses what parses but cannot run: (yield), await
        except (MemoryError, RecursionError):
            raise self.error(TOO_DEEP, at, hint=TOO_DEEP_HINT) from None
        except SyntaxError as e:
            # (Python's words: "Exceeds the limit (4300 digits) for integer string conversion", at no offset; its
            # other errors are its own: 5000 zeros and a 3 are "leading zeros ... not permitted", not a long 0)
            long_int = _too_long_integer(source) if "int_max_str_digits" in e.msg else None
            if long_int is not None:
                from lmnb_engine.params import past_digit_limit, shown_integer_text  # torch-free

                start, literal = long_int
                raise self.error(f"invalid Python expression: {shown_integer_text(literal)} has {past_digit_limit()}; "
                                 "write a smaller number", at + start) from None
            comment = _comment_at(source)
            if comment is not None:  # "#" swallows the closing ")" of the wrapper: say what is wrong
                raise self.error(_COMMENT_IN_HOLE, at + comment) from None
            pos = at + _syntax_offset(source, e)
            hint = curly_quotes_hint(source, straightened(self.src[slice(*self.current_hole)]), _parses) or (
                "to write literal braces, double them: '{{' and '}}'" if hint_braces else None)
            raise self.error(f"invalid Python expression: {e.msg}", pos, hint=hint) from None
        walrus = next((n for n in ast.walk(tree) if isinstance(n, ast.NamedExpr)), None)
        if walrus is not None:  # exported, it would assign a variable of the program's function
            raise self.error("':=' cannot go in a hole: the exported program would assign that variable and "
                             "read it in later holes, where the cell reads the kernel's",
                             at + node_offset(wrapped, walrus) - (walrus.lineno == 1),
                             hint="assign the variable in a Python cell")
        refs: list[tuple[str, RefKind]] = []
        free = _free_names(tree)
        for name, node in free:
            if any(r[0] == name for r in refs):
                continue
            kind = self.resolve(name, at + node_offset(wrapped, node) - (node.lineno == 1))
            if kind is not None:
                refs.append((name, kind))
        self._refuse_called_results(tree, free, dict(refs), wrapped, at)
        # Compiled as a function of the names it reads: a variable named __builtins__ is then a
        # parameter, where as a global of eval() it would replace the builtins the hole calls.
        params = ast.arguments(posonlyargs=[], args=[ast.arg(name) for name, _ in refs], kwonlyargs=[],
                               kw_defaults=[], defaults=[])
        func = ast.Expression(ast.copy_location(ast.Lambda(params, tree.body), tree.body))
        try:
            code = compile(ast.fix_missing_locations(func), self.filename, "eval")
        except (MemoryError, RecursionError):
            raise self.error(TOO_DEEP, at, hint=TOO_DEEP_HINT) from None
        return Expr(source, at, tuple(refs), tree, code)

    def _refuse_called_results(self, tree: ast.AST, free: list, kinds: dict, wrapped: str, at: int) -> None:
        """Refuse a hole that calls a result the cell captured earlier (``{gen len}`` then
        ``{len(xs)}``): the result, text or a parsed value, is never a function, so the hole failed
        once the gens before it had run ("'str' object is not callable"), where the writer meant the
        builtin or a kernel function that the result's name hides from that point on."""
        free_nodes = {id(node) for _, node in free}
        for node in ast.walk(tree):
            func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Name) and id(func) in free_nodes and kinds.get(func.id) == "var":
                name = func.id
                raise self.error(f"{name}(...) calls the result {name!r} captured earlier in this cell, which is "
                                 "text (or a value parsed from it), not a function: from its capture on, the "
                                 f"name {name} is that result in the cell's holes",
                                 at + node_offset(wrapped, func) - (func.lineno == 1),
                                 hint=f"name the result otherwise (e.g. {name}_) to call {name} here")

    def resolve(self, name: str, offset: int) -> RefKind | None:
        if name == "__debug__":  # a constant Python compiles in, never a variable
            return None
        if keyword.iskeyword(name):  # "ｉn": Python reads the name NFKC-normalized, as a keyword
            raise self.error(f"{_IDENT.match(self.src, offset).group(0)!r} reads as the Python keyword {name!r}, "
                             "so no variable can have this name", offset, hint="write the name in plain letters")
        if self.scope.is_local(name):
            return "local"
        if name in self.scope.vars:
            return "var"
        if name in BUILTIN_NAMES:
            return None
        self.arguments.setdefault(name, offset)
        return "arg"


# -- helpers ------------------------------------------------------------------------------------
def _parses(expression: str) -> bool:
    """Whether ``expression`` is a Python expression (as ``Parser.expr`` reads a hole's)."""
    try:
        ast.parse("(" + expression + ")", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _lead(text: str) -> int:
    return len(text) - len(text.lstrip())


_NOT_LITERAL = object()


def _literal(expr: Expr):
    """The value of a literal expression (``"cat.png"``, ``8``), else ``_NOT_LITERAL``."""
    try:
        return ast.literal_eval(expr.tree.body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _side_by_side_strings(expr: Expr):
    """``(pieces, value, offset)`` for the first item of a list, tuple or set literal that is string
    literals side by side on one line (``["yes" "no"]``: the pieces' texts, ``", 'yesno'"`` or ""
    for an f-string, and the item's offset in ``expr.source``), else None. Python joins them into one string; in a cell, where options are
    separated by spaces, that is a missing comma (choices=["yes" "no"] was a select of one choice).
    Pieces on separate lines are left alone: the way to write a long string over lines."""
    body = expr.tree.body
    if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
        return None
    wrapped = "(" + expr.source + ")"  # (what expr.tree was parsed from)
    lines = wrapped.splitlines(keepends=True)
    for item in body.elts:
        if not isinstance(item, (ast.Constant, ast.JoinedStr)) or not isinstance(getattr(item, "value", ""), str):
            continue
        text = ast.get_source_segment(wrapped, item)
        starts = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                  if t.type == tokenize.STRING or t.type == getattr(tokenize, "FSTRING_START", None)]
        if len(starts) > 1 and len({t.start[0] for t in starts}) == 1:
            line = lines[item.lineno - 1]
            at = sum(map(len, lines[:item.lineno - 1])) + len(line.encode()[:item.col_offset].decode()) - 1
            pieces = [text[t.start[1]:e.start[1]].rstrip() for t, e in zip(starts, starts[1:])]
            value = f", {item.value!r}" if isinstance(item, ast.Constant) else ""
            return pieces + [text[starts[-1].start[1]:].rstrip()], value, at
    return None


def _given(expr: Expr) -> bool:
    """Whether an option whose value is ``expr`` is certainly given, not left at ``lmnb.gen``'s
    default (None): a literal other than None, or an expression of builtins alone (``dtype=int``);
    one that reads a variable may hold None, known only as the cell runs."""
    return not expr.refs and _literal(expr) is not None


def _is_in_keyword(text: str, i: int) -> bool:
    if text[i : i + 2] != "in":
        return False
    before = text[i - 1] if i > 0 else " "
    after = text[i + 2] if i + 2 < len(text) else " "
    return not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_")


def is_reserved(name: str) -> bool:
    """A keyword, or ``__debug__``, once NFKC-normalized as Python reads names (``ｉｆ`` is ``if``):
    Python code can never assign (or read back) such a variable."""
    name = unicodedata.normalize("NFKC", name)
    return keyword.iskeyword(name) or name == "__debug__"


_COMMENT_IN_HOLE = "a comment (#) cannot go inside {...}; put it on a line of its own outside the braces"


def _comment_at(source: str) -> int | None:
    """Offset of the first ``#`` comment in ``source`` (outside string literals), or None."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                return offset_of(source, *tok.start)
    except (tokenize.TokenError, SyntaxError):
        pass
    return None


def _no_options(kind: str, keys: list[str], allowed) -> str:
    """``gen has no option 'max_token'; did you mean 'max_tokens'?``, naming every unknown key of
    one hole (``gen has no options 'a', 'b'; did you mean 'a' → ...``), each offered its closest
    option, as ``lmnb.gen`` names unknown keywords."""
    named = f"option {keys[0]!r}" if len(keys) == 1 else f"options {', '.join(map(repr, keys))}"
    return f"{kind} has no {named}{did_you_mean(keys, ('', allowed))}"


def _option_starts(rest: str) -> list[tuple[int, str, int]]:
    """(offset, key, offset of '=') of each top-level ``key=`` in a primitive's option text.

    The parameters of a top-level ``lambda`` (up to its ``:``) are not options: in
    ``stop=lambda q=1: q`` the ``q=`` is a default value.
    """
    found = []
    lambdas = 0  # lambdas whose parameter list is still open
    for i, c in top_level(rest):
        if c == ":" and lambdas:
            lambdas -= 1
            continue
        if not (c.isalpha() or c == "_"):
            continue
        if i > 0 and (rest[i - 1].isalnum() or rest[i - 1] == "_"):
            continue  # inside a word
        m = _IDENT.match(rest, i)
        if m.group(0) == "lambda":
            lambdas += 1
            continue
        if lambdas or (i > 0 and not (rest[i - 1].isspace() or rest[i - 1] == ",")):
            continue
        j = m.end()
        while j < len(rest) and rest[j] in " \t":
            j += 1
        if rest.startswith("=", j) and not rest.startswith("==", j):
            found.append((i, m.group(0), j))
    return found


def _option_value(rest: str, starts: list[tuple[int, str, int]], k: int) -> str:
    """The text of option ``k`` of ``starts`` (``_option_starts(rest)``) after its ``=``, up to the
    next option, without the trailing space and comma between them."""
    stop = starts[k + 1][0] if k + 1 < len(starts) else len(rest)
    value = rest[starts[k][2] + 1 : stop].rstrip()
    return value[:-1] if value.endswith(",") else value


# lmnb's gen() shorthands, which a cell writes as a gen with a dtype
_SHORTHANDS = {"gen_int": "{gen NAME dtype=int}", "gen_string": "{gen NAME dtype=str}"}
_FIRST_WORD = re.compile(r"\s*([A-Za-z_]\w*)\s+\S")


def _construct_meant(body: str) -> tuple[str, str] | None:
    """(first word, the construct to offer) for a hole ``body`` that Python cannot parse and
    whose first word, followed by more, is a keyword in another case or misspelt (``{Gen x}``,
    ``{gne x}``, ``{selct x ...}``, ``{for x in xs}``) or lmnb's ``gen_int``/``gen_string``
    (``{gen NAME dtype=int}`` in a cell); None where it is none of these."""
    m = _FIRST_WORD.match(body)
    if m is None:
        return None
    word = m.group(1)
    if word in _SHORTHANDS:
        return word, _SHORTHANDS[word]
    if keyword.iskeyword(word) and word != "for":  # ({in x} is no misspelt {join}; {for x in xs} a {fork})
        return None
    from lmnb_engine.suggest import close_match  # (here: importing lmnb.template loads no lmnb_engine module)

    close = close_match(word.lower(), KEYWORDS)
    if close is None:
        return None
    if close == "join" and body[m.end(1):].split() == ["concat"]:  # (its one option, kept where written)
        return word, "{join concat}"
    return word, construct_offer(close)


def construct_offer(word: str) -> str:
    """How a construct of the word ``word`` (one of ``KEYWORDS``) is written, for a "did you mean":
    ``{join}``, ``{user}`` alone; ``{gen ...}``, ``{fork ...}`` with what follows left out."""
    return "{" + word + ("}" if word in ROLES + ("join",) else " ...}")


def _free_names(tree: ast.AST) -> list[tuple[str, ast.Name]]:
    """(name, node) of names an expression reads from outside itself, in source order. A lambda's
    parameters and a comprehension's targets are bound only inside them (``[x for x in xs] + [x]``
    reads the outer ``x``); their default values and first iterable are read outside. An explicit
    stack, not recursion: an expression can nest as deep as the parser allows."""
    names = []
    stack: list[tuple[ast.AST, frozenset]] = [(tree, frozenset())]
    while stack:
        node, bound = stack.pop()
        if isinstance(node, ast.Lambda):
            a = node.args
            params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
            stack += [(d, bound) for d in (*a.defaults, *a.kw_defaults) if d is not None]
            stack.append((node.body, bound | params))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = bound
            for g in node.generators:
                stack.append((g.iter, inner))  # (the first one is read outside: nothing is bound yet)
                inner = inner | {n.id for n in ast.walk(g.target) if isinstance(n, ast.Name)}
                stack += [(cond, inner) for cond in g.ifs]
            parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            stack += [(part, inner) for part in parts]
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in bound:
                names.append(node)
        else:
            stack += [(child, bound) for child in ast.iter_child_nodes(node)]
    names.sort(key=lambda n: (n.lineno, n.col_offset))
    return [(n.id, n) for n in names]


def _too_long_integer(source: str) -> tuple[int, str] | None:
    """The offset in ``source`` and the text of its first decimal integer literal that Python
    refuses to read for its length (``params.too_many_digits``), or None."""
    from lmnb_engine.params import too_many_digits  # torch-free; only for a hole Python refused

    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NUMBER and too_many_digits(token.string):
                return offset_of(source, *token.start), token.string
    except (tokenize.TokenError, SyntaxError):  # (text it cannot split, after the literals it could)
        pass
    return None


def _syntax_offset(source: str, err: SyntaxError) -> int:
    """Offset in ``source`` of a SyntaxError raised while parsing ``"(" + source + ")"``."""
    lineno = err.lineno or 1
    col = (err.offset or 1) - 1 - (1 if lineno == 1 else 0)
    lines = source.split("\n")
    lineno = min(lineno, len(lines))
    return offset_of(source, lineno, max(0, min(col, len(lines[lineno - 1]))))
