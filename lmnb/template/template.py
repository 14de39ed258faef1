"""``Template``: a parsed ``%%lm`` cell with its two faces (a runnable program, Python source)."""

from __future__ import annotations

import builtins
import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from lmnb.template.errors import TemplateRuntimeError
from lmnb.template.nodes import Fork, Media, Node, Role
from lmnb.template.options import bare_media_path
from lmnb.template.parser import BUILTIN_NAMES, IPYTHON_BUILTINS, PYTHON_BUILTINS

# Names the generated code uses itself: the state ``s``, the ``lmnb`` module, and per fork depth d
# the group ``forks{d}``, the branch state ``f{d}`` and the item list ``items{d}`` (d omitted for 1).
_GENERATED = re.compile(r"^(s|lmnb|(forks|f|items)\d*)$")


@functools.lru_cache(maxsize=1)
def _run_keywords() -> frozenset:
    """Keywords of ``SglFunction.run`` (temperature, stop, state, ...): a program argument with one
    of these names could not be passed to ``run``."""
    import lmnb

    params = inspect.signature(lmnb.SglFunction.run).parameters.values()
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def python_name(name: str, taken: set[str] = frozenset()) -> str:
    """``name``, or ``name_``, ``name__``... if it clashes with a name the generated code uses
    or with a keyword of ``SglFunction.run``."""
    while _GENERATED.match(name) or name in _run_keywords() or name in taken:
        name += "_"
    return name


# JSON constants -> their Python spelling, for the hint of a hole that reads one as a variable
_JSON_CONSTANTS = {"true": "True", "false": "False", "null": "None"}


def _media_source_at(body, offset: int) -> Optional[Media]:
    """The ``{image}``/``{video}`` node of ``body`` (roles' and forks' bodies too) whose source
    expression holds ``offset`` (the first undefined name of ``photos/cat.png`` may be ``cat``), or
    None."""
    for node in body:
        if isinstance(node, Media) and node.source.offset <= offset < node.source.offset + len(node.source.source):
            return node
        if isinstance(node, (Role, Fork)):
            found = _media_source_at(node.body, offset)
            if found is not None:
                return found
    return None


def _tag_meant(name: str, source: str, offset: int) -> Optional[str]:
    """The construct (``{join}``, ``{system}``, ``{gen ...}``) that the hole at ``offset`` of
    ``source`` means where it is only the name ``name`` and that is a construct's word in another
    case (``{Join}``, ``{SYSTEM}``), which Python reads as a variable; else None."""
    from lmnb.template.parser import KEYWORDS, construct_offer

    word = name.lower()
    if word == name or word not in KEYWORDS:
        return None
    bare = source[:offset].rstrip().endswith("{") and source[offset + len(name):].lstrip().startswith("}")
    return construct_offer(word) if bare else None


# Python's builtins that a hole reads as kernel variables (those parser.BUILTIN_NAMES leaves out):
# where the kernel defines none, the error says so rather than "define it". In a kernel, the
# builtins hold IPython's too (IPYTHON_BUILTINS: its shell adds display, and get_ipython while a
# cell runs), which are not Python's: looked up as the error is made, not at this import, which
# may come before the shell.
_HOLELESS_BUILTINS = PYTHON_BUILTINS - BUILTIN_NAMES - IPYTHON_BUILTINS


def _did_you_mean(name: str, namespace: Mapping[str, Any], called: bool = False) -> str:
    """"; did you mean 'person'?" for a name the namespace lacks, naming its closest variable (as
    Python's own NameError suggests one), or "". IPython's history names (``_``, ``_i3``, ``_oh``)
    are left out unless the name itself starts with "_". A function is offered only where the hole
    calls the name (``called``: ``{summarise(doc)}``), and then before other values: a plain
    ``{persn}`` was offered IPython's ``open``, which a prompt never means."""
    from lmnb_engine.suggest import close_match

    names = [k for k in namespace if isinstance(k, str) and (name.startswith("_") or not k.startswith("_"))]
    values = [k for k in names if not callable(namespace[k])]
    tiers = ([k for k in names if callable(namespace[k])], values) if called else (values,)
    close = next(filter(None, (close_match(name, tier) for tier in tiers)), None)
    return f"; did you mean {close!r}?" if close else ""


@dataclass(frozen=True)
class Template:
    """A parsed cell (see ``lmnb.template.parse``).

    Attributes:
        source: the cell body (line endings normalized to ``\\n``).
        body: the syntax tree (``lmnb.template.nodes``).
        arguments: kernel variables the cell reads, in order of first use.
        captures: variables the program captures at top level (gen/select names, and lists gathered
            from fork branches), in order.
        first_line: cell line number of the body's first line (error positions count from it).
        indent: the indentation taken off each line of an indented cell (error columns count it).
    """

    source: str
    body: tuple[Node, ...]
    arguments: tuple[str, ...]
    captures: tuple[str, ...]
    first_line: int = 1
    indent: str = ""
    filename: str = "<%%lm cell>"
    argument_offsets: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def parameters(self) -> dict[str, str]:
        """Kernel variable → parameter name of the program (renamed only if it clashes, e.g. ``s``)."""
        out: dict[str, str] = {}
        for name in self.arguments:
            out[name] = python_name(name, set(out.values()))
        return out

    def bind(self, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """Program arguments (parameter name → value) read from ``namespace`` (the kernel's variables).

        Raises ``TemplateRuntimeError`` at the first use of a name the namespace lacks.
        """
        params = self.parameters
        out = {}
        for name in self.arguments:
            if name not in namespace:
                raise self.unbound(name, namespace)
            out[params[name]] = namespace[name]
        return out

    def unbound(self, name: str, namespace: Optional[Mapping[str, Any]] = None, problem: Optional[str] = None,
                at_call: bool = False) -> TemplateRuntimeError:
        """The error of the kernel variable ``name`` that ``namespace`` lacks, at its first use (``at_call``:
        at its first call, ``{f(q)}``), with the fix: define it, or the construct meant (``{Join}``: ``{join}``,
        ``{gen("a")}``: ``{gen a}``, ``{image cat.png}``: the path in quotes). ``problem``: what the message
        says instead of "name 'x' is not defined" (the export's words); a "did you mean" follows it."""
        from lmnb.template.calls import calls_of, construct_for_call

        calls = calls_of(self.body, name)
        offset = calls[0][0] if at_call and calls else self.argument_offsets.get(name, 0)
        hint = f"define {name} in a Python cell first"
        ipythons = name in IPYTHON_BUILTINS and hasattr(builtins, name)
        builtin = name in _HOLELESS_BUILTINS or ipythons
        if builtin:  # ({frozenset(xs)}: a name Python has everywhere, so "define it" is no fix)
            hint = (f"compute the value in a Python cell (v = {name}(...)) and write {{v}}, or write the cell as "
                    "%%lm --python, whose Python has every builtin")
        if name in _JSON_CONSTANTS:  # JSON's spelling, in a hole that is Python
            hint = (f"a hole holds Python, where JSON's {name} is {_JSON_CONSTANTS[name]}: write "
                    f"{_JSON_CONSTANTS[name]}, or {hint}")
        at_offset = {at: (call, source) for at, call, source in calls}
        construct = construct_for_call(*at_offset[offset]) if offset in at_offset else None
        # only a name that opens a hole ({name}) may be text meant literally; not one it calls ({gen(...)})
        if self.source[offset - 1:offset] == "{" and construct is None and not (builtin and offset in at_offset):
            hint += ", or write {{ }} for literal braces"
        media = _media_source_at(self.body, offset)
        path_hint = None if media is None else bare_media_path(
            media.kind, media.source.source, media.frames.source if media.frames is not None else "N")
        if path_hint is not None:  # ({image cat.png}: Python reads the variable cat)
            hint = f"{path_hint}; or {hint}"
        tag = _tag_meant(name, self.source, offset)
        if tag is not None:  # ({Join} alone, which unbalances no block, so the parser took it as a name)
            hint = f"{{{name}}} is read as a Python variable, not the tag: write {tag} (lowercase), or {hint}"
        if construct is not None:  # (lmnb's Python call, {gen("a")}, where the cell has a construct)
            hint = (f"a hole holds Python, where {name}(...) calls a variable {name}; the cell language writes it "
                    f"{construct}: write that, or {hint}")
            tag = construct
        meant = f"; did you mean {tag}?" if tag else _did_you_mean(name, namespace or {}, called=bool(calls))
        if builtin and problem is None:
            problem = (f"{name!r} is IPython's {name}, which a kernel adds to the builtins and a hole does not provide"
                       if ipythons else f"{name!r} is a Python builtin that a hole does not provide")
            meant = ""
        return TemplateRuntimeError(f"{problem or f'name {name!r} is not defined'}{meant}",
                                    self.source, offset, self.first_line, indent=self.indent, hint=hint)

    def program(self, name: str = "cell"):
        """The cell as an ``lmnb.function`` whose parameters are ``self.parameters`` values.

        It runs the syntax tree directly (``lmnb.template.interpreter``) and issues the same lmnb
        calls, in the same order, as the source from ``to_python``. Errors in hole expressions raise
        ``TemplateRuntimeError`` with the hole's line and column.
        """
        import lmnb

        from lmnb.template.interpreter import execute

        params = self.parameters
        names = ", ".join(["s", *params.values()])
        mapping = ", ".join(f"{k!r}: {v}" for k, v in params.items())
        run = python_name("_execute", set(params.values()))  # a parameter named _execute would hide it
        namespace = {run: functools.partial(execute, self)}
        exec(f"def {name}({names}):\n    {run}(s, {{{mapping}}})\n", namespace)
        return lmnb.function(namespace[name])

    def to_python(self, name: str = "cell", parameters: tuple[str, ...] | None = None) -> str:
        """Readable source of an ``@lmnb.function`` equivalent to ``program()``; needs ``import lmnb``.

        ``parameters``: the kernel variables that become function parameters (default: all of
        ``arguments``); the others are left as references to module globals of the same name.
        Raises ``ValueError`` if such a global's name clashes with a name the generated code uses.
        """
        from lmnb.template.codegen import generate

        return generate(self, name, self.arguments if parameters is None else tuple(parameters))
