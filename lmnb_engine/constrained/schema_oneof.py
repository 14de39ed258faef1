"""``oneOf`` for constrained decoding: its branches must be provably disjoint.

outlines-core alternates ``oneOf`` branches as it does ``anyOf``, so a value that two branches
accept can be generated, and it is invalid for ``oneOf`` (exactly one must match). Deciding in
general whether two schemas overlap is as hard as intersecting their languages, so the branches
are accepted only when a simple argument shows that no value passes two of them:

* their JSON types differ (``type``, or the types of their ``enum`` / ``const`` values; integers
  count as numbers);
* one lists its values (``enum`` / ``const``) and no listed value passes the other (checked by
  jsonschema);
* both are numbers with bounds that do not meet;
* both are objects that require a property whose ``enum`` / ``const`` values differ (a
  discriminated union, as pydantic writes one: ``oneOf`` of ``$ref``s with a ``Literal`` tag).

Anything else is refused with a message that says which branches and suggests ``anyOf``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from lmnb_engine.constrained.errors import GrammarError

_ALL_TYPES = frozenset({"object", "array", "string", "number", "boolean", "null"})


def check_one_of(branches: list, where: str, root: dict, resolve: Callable[[Any], Any]) -> None:
    """Raise ``GrammarError`` unless every pair of ``branches`` is provably disjoint (module
    docstring). ``root``: the whole schema (``$ref`` in a branch resolve against it, also for
    jsonschema); ``resolve`` follows a subschema's ``$ref`` (a subschema without one as it is)."""
    import jsonschema

    base = jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())

    def valid(schema: Any) -> Callable[[Any], bool]:
        return base.evolve(schema=schema).is_valid

    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            a, b = resolve(branches[i]), resolve(branches[j])
            overlap = _disjoint(a, b, resolve, valid)
            if overlap is not None:
                raise GrammarError(
                    f"JSON schema at {where} has \"oneOf\" branches {i} and {j} that can both accept {overlap}, "
                    'so an output could match both, which "oneOf" forbids (constrained decoding writes the '
                    "branches as alternatives); make them disjoint (other types, non-overlapping bounds or values, "
                    'a required property with a different const in each), or use "anyOf"')


def _listed(node: Any) -> list | None:
    if isinstance(node, dict) and "const" in node:
        return [node["const"]]
    if isinstance(node, dict) and isinstance(node.get("enum"), list):
        return node["enum"]
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _types(node: Any, resolve: Callable[[Any], Any]) -> frozenset:
    """The JSON types ``node`` can accept (a superset; integer as number)."""
    if node is False:
        return frozenset()
    if not isinstance(node, dict):
        return _ALL_TYPES
    listed = _listed(node)
    if listed is not None:
        return frozenset(map(_json_type, listed))
    out = _ALL_TYPES
    if "type" in node:
        types = [node["type"]] if isinstance(node["type"], str) else node["type"]
        out = frozenset("number" if t == "integer" else t for t in types)
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            out &= frozenset().union(*(_types(resolve(b), resolve) for b in node[key]))
    for sub in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
        out &= _types(resolve(sub), resolve)
    return out


def _range(node: dict) -> tuple[float, float]:
    lo = max([node[k] for k in ("minimum", "exclusiveMinimum") if isinstance(node.get(k), (int, float))],
             default=-math.inf)
    hi = min([node[k] for k in ("maximum", "exclusiveMaximum") if isinstance(node.get(k), (int, float))],
             default=math.inf)
    return lo, hi


def _ranges_apart(a: dict, b: dict) -> bool:
    (alo, ahi), (blo, bhi) = _range(a), _range(b)
    if ahi < blo or bhi < alo:
        return True
    # touching at one point: apart if either side excludes it
    if ahi == blo:
        return a.get("exclusiveMaximum") == ahi or b.get("exclusiveMinimum") == blo
    if bhi == alo:
        return b.get("exclusiveMaximum") == bhi or a.get("exclusiveMinimum") == alo
    return False


def _tagged_apart(a: dict, b: dict, resolve: Callable[[Any], Any]) -> bool:
    """Both objects require a property whose listed values differ (a discriminator)."""
    pa, pb = a.get("properties", {}), b.get("properties", {})
    for key in set(a.get("required", [])) & set(b.get("required", [])):
        la, lb = _listed(resolve(pa.get(key))), _listed(resolve(pb.get(key)))
        if la is not None and lb is not None:
            dumped = {json.dumps(v, sort_keys=True) for v in la}
            if not any(json.dumps(v, sort_keys=True) in dumped for v in lb):
                return True
    return False


def _disjoint(a: Any, b: Any, resolve: Callable[[Any], Any], valid: Callable) -> str | None:
    """None if no value passes both ``a`` and ``b`` (provably); else what may pass both."""
    if a is False or b is False:
        return None
    a, b = ({} if x is True else x for x in (a, b))  # (true accepts every value, as {} does)
    for x, y in ((a, b), (b, a)):
        listed = _listed(x)
        if listed is not None:
            own, other = valid(x), valid(y)
            for value in listed:
                if own(value) and other(value):  # (a listed value its own branch rejects is never written)
                    return json.dumps(value)
            return None
    common = _types(a, resolve) & _types(b, resolve)
    if not common:
        return None
    if common == {"number"} and _ranges_apart(a, b):
        return None
    if common == {"object"} and _tagged_apart(a, b, resolve):
        return None
    shown = sorted(common)[0]
    return f"{shown}s" + (" (integers count as numbers)" if shown == "number" else "")
