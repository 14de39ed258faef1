"""The syntax tree of a ``%%lm`` cell: what the parser produces and both faces consume.

Every node maps onto one lmnb construct (docs/CELL_LANGUAGE.md, "Mapping"):
``Text``/``Interp`` → ``s += str``, ``Primitive`` → ``s += lmnb.gen(...)``/``lmnb.select(...)``,
``Media`` → ``s += lmnb.image(src)``/``lmnb.video(src, n)``, ``Role`` → ``lmnb.<role>(...)`` or
``<role>_begin()``/``<role>_end()``, ``Fork`` → ``s.fork(n)`` … ``forks.join(mode)``. Offsets are character offsets into the cell body (``Template.source``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from types import CodeType
from typing import Iterable, Iterator, Literal, Union

# Where a name read by an expression comes from when the program runs:
#   "local": a fork target of an enclosing {fork NAME in ...} block (a Python loop variable);
#   "var":   a variable captured earlier in the same program state (s["name"]);
#   "arg":   a kernel variable, passed to the program as an argument.
RefKind = Literal["local", "var", "arg"]


@dataclass(frozen=True)
class Expr:
    """A Python expression written in a hole or as an option value.

    ``refs`` lists the free names it reads, in order of first use, with where each comes from;
    ``code`` evaluates to a function taking their values in that order and returning the value.
    """

    source: str
    offset: int
    refs: tuple[tuple[str, RefKind], ...]
    tree: ast.Expression = field(compare=False, repr=False)
    code: CodeType = field(compare=False, repr=False)


def written_hole(source: str) -> str:
    """The hole of the Python expression ``source`` as a cell writes it, for messages: ``{x}``, but
    ``{ {"k": x} }`` for one that begins with ``{`` or ends with ``}``, where ``{{`` and ``}}`` would
    read as the escaped braces of the prompt's text (an f-string asks the same space)."""
    return "{ " + source + " }" if source.startswith("{") or source.endswith("}") else "{" + source + "}"


@dataclass(frozen=True)
class Text:
    """Literal prompt text (escapes already decoded)."""

    text: str
    offset: int


@dataclass(frozen=True)
class Interp:
    """``{expr}``, ``{expr!r}``, ``{expr:spec}``: a Python value as text, as in an f-string.

    ``conversion`` is ``"r"``, ``"s"``, ``"a"`` or None; ``spec`` the format spec ("" for none).
    """

    expr: Expr
    offset: int
    conversion: str | None = None
    spec: str = ""

    def render(self, value) -> str:
        """The text the hole contributes: ``format(converted value, spec)``."""
        if self.conversion:
            value = {"r": repr, "s": str, "a": ascii}[self.conversion](value)
        return format(value, self.spec) if self.spec else str(value)


@dataclass(frozen=True)
class Option:
    """``key=value`` of a primitive; the value is a Python expression."""

    key: str
    value: Expr
    offset: int


@dataclass(frozen=True)
class Primitive:
    """``{gen NAME opts}`` / ``{select NAME opts}`` → ``lmnb.gen(NAME, **opts)`` / ``lmnb.select(...)``."""

    primitive: Literal["gen", "select"]
    name: str | None
    options: tuple[Option, ...]
    offset: int


@dataclass(frozen=True)
class Media:
    """``{image SRC}`` → ``lmnb.image(SRC)``; ``{video SRC frames=N}`` → ``lmnb.video(SRC, N)``.

    ``source`` is a Python expression (a kernel variable holding a PIL image, path or bytes, or a
    literal path); ``frames`` the frame count expression of a video (None for an image).
    """

    kind: Literal["image", "video"]
    source: Expr
    frames: Expr | None
    offset: int


@dataclass(frozen=True)
class Role:
    """``{user} ... {/user}`` (or system / assistant): a chat turn."""

    role: Literal["system", "user", "assistant"]
    body: tuple["Node", ...]
    offset: int

    @property
    def simple(self) -> bool:
        """True when the body is only text and interpolations, so it maps onto ``lmnb.<role>(text)``."""
        return all(isinstance(n, (Text, Interp)) for n in self.body)


# A fork target: a name, or a (nested) tuple of names, as in ``for i, (a, b) in ...``.
Target = Union[str, tuple["Target", ...]]


@dataclass(frozen=True)
class Fork:
    """``{fork N}`` or ``{fork TARGET in ITEMS}`` … ``{join}`` / ``{join concat}``.

    Exactly one of ``count`` (N identical branches) or ``items`` (one branch per item, with
    ``target`` bound to the item inside the branch) is set. ``join`` is the lmnb join mode.
    """

    count: Expr | None
    target: Target | None
    items: Expr | None
    body: tuple["Node", ...]
    join: Literal["gather_variable", "concate_and_append"]
    offset: int


Node = Union[Text, Interp, Primitive, Media, Role, Fork]


def walk(body: Iterable[Node]) -> Iterator[Node]:
    """Every node of ``body`` in cell order, a role's or fork's own node before those of its body
    (depth first): what a check of a cell's holes or expressions filters."""
    for node in body:
        yield node
        if isinstance(node, (Role, Fork)):
            yield from walk(node.body)


def target_names(target: Target) -> list[str]:
    """The names bound by a fork target, left to right."""
    if isinstance(target, str):
        return [target]
    return [n for t in target for n in target_names(t)]


def statements(run: list) -> list[list]:
    """How a run of ``Text``/``Interp`` nodes is appended: one ``s += ...`` per returned group.

    The run is one statement, except that text before its first interpolation goes first on its
    own: then a program's constant prefix ends where its first argument is used, so ``run_batch``
    can find the prefix by tracing and prefill it once for every item (paper §3).
    """
    first = next((i for i, n in enumerate(run) if isinstance(n, Interp)), None)
    if first is None or first == 0:
        return [run]
    return [run[:first], run[first:]]
