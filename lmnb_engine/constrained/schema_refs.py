"""Local ``$ref`` inlining and ``false`` pruning for the JSON schema → regex path, so output validates.

outlines-core resolves ``$ref`` itself, but where it stops a recursion it writes ``{}`` for the
reference whatever the reference points at. For a list that ends in ``null``
(``{"properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}, "required": ["next"]}``)
its regex lets the model write ``{"next": {"next": {}}}``, which does not validate; an array of
its own schema it refuses ("Ref recusion limit reached"); a JSON pointer with ``~0``/``~1`` escapes
it cannot resolve; the schema ``false`` (no value) it refuses wherever it stands. So every local
reference is replaced by (a copy of) its target before outlines-core sees the schema. A reference
already open ``MAX_REF_DEPTH`` times on the current path, and a ``false`` subschema, have no value
to generate there; that is met with the smallest change that keeps every output valid:

* an optional property that holds it is not generated;
* an ``anyOf`` / ``oneOf`` branch that holds it is dropped;
* an array whose items hold it is generated empty (``maxItems`` 0); a map (``additionalProperties``
  without ``properties``) is generated as ``{}``.

Where none applies (a required property, the only branch, ``minItems`` above 0, a ``prefixItems``
entry) the enclosing schema has no value either. If that reaches the root the schema is refused:
no finite JSON value validates it (a shortest valid value never nests one schema in itself, so a
depth of one would have found it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.json_schema import _MISSING, SHOWN_CHARS, child, json_value, pointer_parts, ref_to_nothing
from lmnb_engine.schema_copies import MAX_REGEX_COPIES

# How often one schema may be open on a path (the root counts): a list of itself holds up to this
# many levels, as deep as outlines-core's own resolution went. Each level multiplies a tree's automaton.
MAX_REF_DEPTH = 5
_DEFINITIONS = ("$defs", "definitions")  # only reachable through $ref: gone once refs are inlined


class _NoValue(Exception):
    """The subschema at ``where`` has no value to generate: ``false``, or a ``$ref`` (``ref``)
    open ``MAX_REF_DEPTH`` times."""

    def __init__(self, where: str, ref: str | None = None):
        super().__init__(where, ref)
        self.where, self.ref = where, ref


_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # a name, then a schema
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")  # an index, then a schema
_SCHEMA_ITEMS = ("items", "additionalProperties")  # a schema (items: or a list)


def inline_refs(schema: Any, original: Any = None, reasons: dict[str, str] | None = None) -> Any:
    """``schema`` (``original`` as the user wrote it, when ``schema`` is a rewritten copy) with
    every ``$ref`` replaced by its target, ``$defs`` / ``definitions`` removed
    and ``false`` subschemas pruned: the same outputs for outlines-core to generate, with
    recursion cut at ``MAX_REF_DEPTH`` levels (module docstring). The input is not changed.

    References resolve as JSON pointers (RFC 6901: ``~0``, ``~1`` and percent escapes) into the
    root document, named ``#...`` or with the root's ``$id`` before the ``#``. Keywords beside a
    ``$ref`` are annotations only (``schema._Rewriter`` refuses others), so the target replaces
    the whole subschema. ``reasons`` maps the location of a ``false`` that stands for a subschema
    with no valid value to the message that says why (refused with it where it cannot be pruned).

    Each subschema written out counts towards ``MAX_REGEX_COPIES``, the limit on the regex's
    subschema copies (each is at least one): the count made before inlining follows each
    recursion one level, and a recursion that refers back from k places writes k**4 copies of
    its schema at its fifth level, so a schema of 40 such properties (2 kB) was written out for
    minutes, gigabytes of it, before the count after inlining could refuse it.

    Raises:
        GrammarError: a reference to another document, an ``$anchor`` name, a pointer to nothing
            (in ``original``) or into a value that is no schema, or a schema with no finite valid value (a required recursion, a required ``false``),
            or one that writes out more than ``MAX_REGEX_COPIES`` subschemas.
    """
    original = schema if original is None else original
    written = [0]  # subschemas written out so far
    base = schema.get("$id", "").partition("#")[0] if isinstance(schema, dict) else ""

    def resolve(ref: str, where: str) -> tuple[str, Any]:
        doc, _, fragment = ref.partition("#")
        if doc and doc != base:
            raise GrammarError(f"JSON schema $ref {json_value(ref, SHOWN_CHARS)} at {where} points into another document, which "
                               'constrained decoding cannot fetch; put that schema under "$defs" and refer to '
                               'it as "#/$defs/NAME"')
        pointer = unquote(fragment)
        if pointer and not pointer.startswith("/"):
            raise GrammarError(f"JSON schema $ref {json_value(ref, SHOWN_CHARS)} at {where} names an anchor, which is not supported; "
                               'refer to the schema by its JSON pointer, e.g. "#/$defs/NAME"')
        node, written, expect = schema, original, "schema"
        for step, part in enumerate(pointer_parts(ref)):
            # Only through keywords that hold schemas: "#/$defs/h/default" is a value, never checked as a schema.
            if expect == "schema":
                expect = "map" if part in _SCHEMA_MAPS else "list" if part in _SCHEMA_LISTS else \
                    "schema" if part in _SCHEMA_ITEMS else None
                if expect is None:
                    raise GrammarError(f"JSON schema $ref {json_value(ref, SHOWN_CHARS)} at {where} points into {json_value(part, SHOWN_CHARS)}, which "
                                       'holds no schema; refer to a schema, e.g. "#/$defs/NAME"')
                if expect == "schema" and isinstance(written, dict) and isinstance(written.get(part), list):
                    expect = "list"  # items as a list (draft 7's tuples)
            else:
                expect = "schema"
            if child(written, part) is _MISSING or child(node, part) is _MISSING:
                # (the user's schema first: the rewritten copy may hold more)
                raise GrammarError(ref_to_nothing(ref, where, step, written if child(written, part) is _MISSING else node))
            written, node = child(written, part), child(node, part)
        return pointer, node

    def expand(node: Any, where: str, open_refs: tuple[str, ...]) -> Any:
        if node is False:
            raise _NoValue(where)
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            pointer, target = resolve(node["$ref"], where)
            if open_refs.count(pointer) >= MAX_REF_DEPTH:
                raise _NoValue(where, node["$ref"])
            return expand(target, "#" + pointer, (*open_refs, pointer))
        written[0] += 1
        if written[0] > MAX_REGEX_COPIES:
            raise GrammarError(
                f"JSON schema is too large to compile: written out with its $refs inlined, each recursion "
                f"{MAX_REF_DEPTH} levels deep, it holds more than {MAX_REGEX_COPIES} subschemas, above the limit of "
                f"{MAX_REGEX_COPIES} on its regex's subschema copies (each level of a recursion multiplies its "
                "subschemas by the number of places that refer back); refer back from fewer places")
        out = {k: v for k, v in node.items() if k not in _DEFINITIONS}
        if isinstance(node.get("properties"), dict):
            required = node.get("required", [])
            out["properties"] = {}
            for key, sub in node["properties"].items():
                try:
                    out["properties"][key] = expand(sub, f"{where}/properties/{key}", open_refs)
                except _NoValue:
                    if key in required:
                        raise
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                kept, missing = [], None
                for i, sub in enumerate(node[key]):
                    try:
                        kept.append(expand(sub, f"{where}/{key}/{i}", open_refs))
                    except _NoValue as e:
                        missing = e
                if not kept:
                    raise missing
                out[key] = kept
        for key in ("allOf", "prefixItems", "items"):
            if isinstance(node.get(key), list):
                out[key] = [expand(sub, f"{where}/{key}/{i}", open_refs) for i, sub in enumerate(node[key])]
        closed_tuple = "prefixItems" in node and node.get("items") is False  # outlines-core takes that false
        if "items" in node and not isinstance(node["items"], list) and not closed_tuple:
            try:
                out["items"] = expand(node["items"], f"{where}/items", open_refs)
            except _NoValue:
                if node.get("minItems", 0) > 0 or "prefixItems" in node:
                    raise
                del out["items"]
                out["maxItems"] = 0
        if isinstance(node.get("additionalProperties"), dict):
            try:
                out["additionalProperties"] = expand(node["additionalProperties"], f"{where}/additionalProperties",
                                                     open_refs)
            except _NoValue:
                out["additionalProperties"] = False  # no key is generated beside the properties
                out.setdefault("properties", {})
        return out

    try:
        return expand(schema, "#", ("",))
    except _NoValue as e:
        if e.ref is None and e.where in (reasons or {}):
            raise GrammarError(reasons[e.where]) from None
        if e.ref is None:
            raise GrammarError(
                f"JSON schema has no valid value: the subschema false at {e.where} accepts nothing, and the "
                "schema needs a value there (a required property, the only branch, or an array with "
                "minItems); remove it or make it optional") from None
        raise GrammarError(
            f"JSON schema has no finite valid value: every value would nest the schema that $ref {json_value(e.ref, SHOWN_CHARS)} "
            f"at {e.where} refers to inside itself without end (a required property or the only branch "
            "refers back to its own schema); make the recursion optional, e.g. drop the property from "
            '"required" or add an "anyOf" branch {"type": "null"} beside the $ref'
        ) from None
