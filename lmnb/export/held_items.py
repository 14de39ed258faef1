"""The forms of row code that reach the items of a set-up list, tuple or dict that holds objects
(``notes_objects``' held containers) other than by indexing it: a slice (``items[1:]``, which a
starred target, ``a, *m = items``, is), a copy or reordering (``sorted(items)``, ``list(items)``), an
iterator over it (``iter(items)``), and the builtins that pick one of its items (``max(items,
key=f)``, ``next(iter(items))``)."""

from __future__ import annotations

from typing import Optional

# The builtins whose value holds or yields the items of the one iterable passed them (sorted: with its key and
# reverse), and those that return one of them (max and min: with key and default)
_ITEMS_OF = frozenset({"sorted", "list", "tuple", "reversed", "iter"})
_PICKING = frozenset({"max", "min"})
# The key of an item of a held container that no constant names (a comprehension's, a computed dict key)
_ANY = object()


def _constant_key(node):
    """The constant an index or key expression ``node`` is (``1``, ``-1``, ``'a'``), or ``_ANY``."""
    import ast

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int):
        return -node.operand.value
    return _ANY


def _one_iterable(call, names: set, keywords: frozenset):
    """The one positional argument of ``call`` where it is an ``ast.Call`` of a builtin of ``names``
    with no keyword but ``keywords``, else None."""
    import ast

    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names \
            and len(call.args) == 1 and not isinstance(call.args[0], ast.Starred) \
            and all(k.arg in keywords for k in call.keywords):
        return call.args[0]
    return None


def _items_of(node, held: dict) -> Optional[str]:
    """The name of ``held`` (name → its ``_made_objects`` entry) whose items (a dict's values) the
    expression ``node`` holds or runs through, as they are: ``items``, ``items[1:]``,
    ``sorted(items, key=f)``, ``list(items[1:])``, ``iter(items)``, ``d.values()``; else None (a
    dict's keys: ``d``, ``sorted(d)``)."""
    import ast

    def listed(name: str) -> Optional[str]:
        return name if name in held and not held[name][1].startswith("a dict") else None

    if isinstance(node, ast.Name):
        return listed(node.id)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and isinstance(node.value, ast.Name):
        return listed(node.value.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values" \
            and not node.args and not node.keywords and isinstance(node.func.value, ast.Name) \
            and node.func.value.id in held and held[node.func.value.id][1].startswith("a dict"):
        return node.func.value.id
    inner = _one_iterable(node, _ITEMS_OF, frozenset({"key", "reverse"}))
    return _items_of(inner, held) if inner is not None else None


def _as_item(node, held: dict):
    """``node`` as the subscript of a ``held`` name that it is an item of, where it is one other than
    by an index: ``items[1:][0]`` → ``items[1]`` (the index where the slice's bounds are constants,
    else ``_ANY``: any), ``max(items, key=f)``, ``min(items)``,
    ``next(iter(items))``, ``sorted(items)[0]`` → ``items[_ANY]``; else ``node`` itself."""
    import ast

    def item(name: str, key):
        return ast.Subscript(ast.Name(name, ast.Load()), ast.Constant(key), ast.Load())

    if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        name = _items_of(node.value, held)
        if name is None or isinstance(node.value, ast.Name):
            return node
        key, part = _constant_key(node.slice), node.value
        if isinstance(part, ast.Subscript) and part.slice.step is None and isinstance(key, int) \
                and not isinstance(key, bool):
            lower, upper = (_constant_key(b) if b is not None else None for b in (part.slice.lower, part.slice.upper))
            if key >= 0 and isinstance(lower, int) and lower >= 0:
                return item(name, lower + key)
            if key >= 0 and lower is None:
                return item(name, key)
            if key < 0 and isinstance(upper, int) and upper <= 0 or key < 0 and upper is None:
                return item(name, key + (upper or 0))
        return item(name, _ANY)
    picked = _one_iterable(node, _PICKING, frozenset({"key", "default"}))
    if picked is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" \
            and 1 <= len(node.args) <= 2 and not node.keywords and isinstance(node.args[0], ast.Call):
        picked = node.args[0]  # (next(iter(items)): next(items) of a list is no item of it)
    name = _items_of(picked, held) if picked is not None else None
    return item(name, _ANY) if name is not None else node
