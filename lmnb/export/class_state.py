"""The state that the set-up cells' classes hold and the rows change: the classes themselves and the
class attributes the rows change, which the job sets back at each row's start (``Plan.restored``),
and the notes on the objects those classes hold (an Enum's members, a class attribute's instance),
which it cannot set back."""

from __future__ import annotations

from lmnb.export.cells import Code, bound_by
from lmnb.export.notes_wording import _OWN_STATE
from lmnb.export.syntax import _statements


def _setup_classes(setup: list) -> dict:
    """Name → the index of the setup cell that last defines a class of that name at top level, for
    the names that the setup cells bind last by a ``class`` statement, and "Outer.Inner" for the
    classes such a class's body defines (all the way down)."""
    import ast

    def nested(stmt, prefix: str) -> list:
        return [n for s in stmt.body if isinstance(s, ast.ClassDef) for n in [f"{prefix}.{s.name}",
                                                                              *nested(s, f"{prefix}.{s.name}")]]

    out: dict = {}
    for c, stmt in _statements(setup):
        for name in bound_by(stmt):
            out = {n: i for n, i in out.items() if not n.startswith(name + ".")}  # (rebound: not its own)
            out[name] = c.index if isinstance(stmt, ast.ClassDef) else None
            if isinstance(stmt, ast.ClassDef):
                out.update(dict.fromkeys(nested(stmt, name), c.index))
    return {name: index for name, index in out.items() if index is not None}


def _class_attributes(called: list, row: list, classes: dict) -> tuple[tuple, tuple]:
    """(the attributes of set-up ``classes`` (``_setup_classes``) that the row cells (Python, and
    ``%%lm --python`` bodies) or the set-up functions they call (``_called``) change, as "C.n";
    the classes they change through setattr or delattr of a computed name)
    (``cells.class_attribute_changes``)."""
    found, computed = _attribute_changes(called, row)
    return (tuple(a for a in dict.fromkeys(found) if a.rsplit(".", 1)[0] in classes),
            tuple(n for n in dict.fromkeys(computed) if n in classes))


def _held_object_notes(setup: list, row: list, called: list, classes: dict) -> list[str]:
    """The notes on objects that a set-up class holds and the rows change, which the job cannot set
    back (each row goes on from the last one's): attributes the rows set by name on an Enum's
    member or a class attribute's instance (``_held_object_attributes``), and those the methods of a
    set-up Enum the rows use set on its members (``_enum_member_attributes``)."""
    notes = []
    # (an Enum's member is made once, with its class, and is the class's own, Color(1) is Color.RED: no copy can
    # stand in for it per row, so the job leaves what the rows set on it, and the notes say so)
    for owner, changed in _held_object_attributes(called, row, classes).items():
        root = owner.split(".")[0]
        notes.append(f"cell {classes[root]}: {owner}, an object that the class {root} of this cell holds (an Enum's "
                     f"member, or a class attribute's value), has {', '.join(changed)} set by the rows: the job does "
                     "not set it back at each row's start, so it carries over from row to row (what one row sets, "
                     "the next row sees), where each pass of the notebook starts from the one the cells run once "
                     f"made, and rows running at once (--num-threads above 1) share it; {_OWN_STATE}")
    for root, changed in _enum_member_attributes(setup, called).items():
        notes.append(f"cell {classes[root]}: {root}'s members (an Enum's, which the class holds) have "
                     f"{', '.join(changed)} set by its methods, and the rows use {root}: the job does not set them "
                     "back at each row's start, so what they set carries over from row to row (what one row sets, "
                     "the next row sees), where each pass of the notebook starts from the members the cells run "
                     f"once made, and rows running at once (--num-threads above 1) share them; {_OWN_STATE}")
    return notes


def _attribute_changes(called: list, row: list) -> tuple[list, list]:
    """(the attributes "C.n" that the row cells (Python, and ``%%lm --python`` bodies) or the set-up
    functions they call (``_called``) change; the names whose attributes they change by a computed
    name) (``cells.class_attribute_changes``), of any name."""
    import ast

    from lmnb.export.cells import class_attribute_changes

    found, computed = [n for f in called for n in f[6]], [n for f in called for n in f[7]]
    for c in row:
        tree = ast.parse(c.source) if isinstance(c, Code) else getattr(getattr(c, "python", None), "tree", None)
        if tree is not None:  # (a Python cell's, or a %%lm --python body's: it runs on the notebook's globals)
            attributes, unknown = class_attribute_changes(tree)
            found += attributes
            computed += unknown
    return found, computed


def _held_object_attributes(called: list, row: list, classes: dict) -> dict:
    """"Color.RED" → its attributes ("Color.RED.hits") that the row cells or the set-up functions
    they call set or change, for each object that a set-up class holds and that is no class of
    ``classes`` (an Enum's member, a class attribute's instance): the job cannot set it back."""
    found, _ = _attribute_changes(called, row)
    out: dict = {}
    for a in dict.fromkeys(found):
        owner = a.rsplit(".", 1)[0]
        if "." in owner and owner not in classes and owner.split(".")[0] in classes:
            out.setdefault(owner, []).append(a)
    return out


_ENUM_BASES = frozenset(f"{m}{b}" for m in ("", "enum.") for b in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"))


def _enum_member_attributes(setup: list, called: list) -> dict:
    """Enum class name → the attributes ("Color.RED.hits" shown as "hits (hit())") that its methods
    set on ``self`` (a member, which the class makes once and holds), for each set-up Enum class the
    rows use (``called``; whichever methods they call): the job cannot set them back
    (``_held_object_attributes`` finds those set by name, ``Color.RED.hits = 1``)."""
    import ast

    used = {f[1] for f in called}
    out: dict = {}
    for _, cls in _statements(setup):
        if not (isinstance(cls, ast.ClassDef) and cls.name in used
                and any(ast.unparse(b) in _ENUM_BASES for b in cls.bases)):
            continue
        for method in cls.body:
            if not (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.args.args):
                continue
            me = method.args.args[0].arg
            out.setdefault(cls.name, []).extend(
                f"{t.attr} ({method.name}())" for t in ast.walk(method)
                if isinstance(t, ast.Attribute) and isinstance(t.ctx, (ast.Store, ast.Del))
                and isinstance(t.value, ast.Name) and t.value.id == me)
    return {name: list(dict.fromkeys(changed)) for name, changed in out.items() if changed}
