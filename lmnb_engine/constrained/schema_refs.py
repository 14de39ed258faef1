"""Local ``$ref`` inlining for the JSON schema → regex path, with recursion cut so output validates.

outlines-core resolves ``$ref`` itself, but where it stops a recursion it writes ``{}`` for the
reference whatever the reference points at. For a list that ends in ``null``
(``{"properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}, "required": ["next"]}``)
its regex lets the model write ``{"next": {"next": {}}}``, which does not validate; an array of
its own schema it refuses ("Ref recusion limit reached"); a JSON pointer with ``~0``/``~1`` escapes
it cannot resolve. So every local reference is replaced by (a copy of) its target before
outlines-core sees the schema, and a reference that is already open ``MAX_REF_DEPTH`` times on the
current path is cut with the smallest change that keeps every output valid:

* an optional property that holds it is not generated;
* an ``anyOf`` / ``oneOf`` branch that holds it is dropped;
* an array whose items hold it is generated empty (``maxItems`` 0); a map (``additionalProperties``
  without ``properties``) is generated as ``{}``.

Where none applies (a required property, the only branch, ``minItems`` above 0, a ``prefixItems``
entry) the cut moves up to the enclosing schema. If it reaches the root, no finite JSON value
validates the schema at all (a shortest valid value never nests one schema in itself, so a depth
of one would have found it), and the schema is refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from lmnb_engine.constrained.errors import GrammarError

# How often one schema may be open on a path (the root counts): a list of itself holds up to this
# many levels, as deep as outlines-core's own resolution went. Each level multiplies a tree's automaton.
MAX_REF_DEPTH = 5
_DEFINITIONS = ("$defs", "definitions")  # only reachable through $ref: gone once refs are inlined


class _Cut(Exception):
    """The reference at ``where`` was open ``MAX_REF_DEPTH`` times: the schema holding it cannot
    be generated at this depth."""

    def __init__(self, ref: str, where: str):
        super().__init__(ref, where)
        self.ref, self.where = ref, where


def inline_refs(schema: Any) -> Any:
    """``schema`` with every ``$ref`` replaced by its target and ``$defs`` / ``definitions``
    removed: the same outputs for outlines-core to generate, with recursion cut at
    ``MAX_REF_DEPTH`` levels (module docstring). The input is not changed.

    References resolve as JSON pointers (RFC 6901: ``~0``, ``~1`` and percent escapes) into the
    root document, named ``#...`` or with the root's ``$id`` before the ``#``. Keywords beside a
    ``$ref`` are annotations only (``schema._Rewriter`` refuses others), so the target replaces
    the whole subschema.

    Raises:
        GrammarError: a reference to another document, an ``$anchor`` name, a pointer to nothing,
            or a schema with no finite valid value (a required recursion).
    """
    base = schema.get("$id", "").partition("#")[0] if isinstance(schema, dict) else ""

    def resolve(ref: str, where: str) -> tuple[str, Any]:
        doc, _, fragment = ref.partition("#")
        if doc and doc != base:
            raise GrammarError(f"JSON schema $ref {ref!r} at {where} points into another document, which "
                               "constrained decoding cannot fetch; put that schema under '$defs' and refer to "
                               "it as '#/$defs/NAME'")
        pointer = unquote(fragment)
        if pointer and not pointer.startswith("/"):
            raise GrammarError(f"JSON schema $ref {ref!r} at {where} names an anchor, which is not supported; "
                               "refer to the schema by its JSON pointer, e.g. '#/$defs/NAME'")
        node = schema
        for part in pointer.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise GrammarError(f"JSON schema $ref {ref!r} at {where} points at nothing in this schema "
                                   f"(no {part!r} there); fix the reference")
        return pointer, node

    def expand(node: Any, where: str, open_refs: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node  # a boolean schema
        if "$ref" in node:
            pointer, target = resolve(node["$ref"], where)
            if open_refs.count(pointer) >= MAX_REF_DEPTH:
                raise _Cut(node["$ref"], where)
            return expand(target, "#" + pointer, (*open_refs, pointer))
        out = {k: v for k, v in node.items() if k not in _DEFINITIONS}
        if isinstance(node.get("properties"), dict):
            required = node.get("required", [])
            out["properties"] = {}
            for key, sub in node["properties"].items():
                try:
                    out["properties"][key] = expand(sub, f"{where}/properties/{key}", open_refs)
                except _Cut:
                    if key in required:
                        raise
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                kept, cut = [], None
                for i, sub in enumerate(node[key]):
                    try:
                        kept.append(expand(sub, f"{where}/{key}/{i}", open_refs))
                    except _Cut as e:
                        cut = e
                if not kept:
                    raise cut
                out[key] = kept
        for key in ("allOf", "prefixItems", "items"):
            if isinstance(node.get(key), list):
                out[key] = [expand(sub, f"{where}/{key}/{i}", open_refs) for i, sub in enumerate(node[key])]
        if isinstance(node.get("items"), dict):
            try:
                out["items"] = expand(node["items"], f"{where}/items", open_refs)
            except _Cut:
                if node.get("minItems", 0) > 0 or "prefixItems" in node:
                    raise
                del out["items"]
                out["maxItems"] = 0
        if isinstance(node.get("additionalProperties"), dict):
            try:
                out["additionalProperties"] = expand(node["additionalProperties"], f"{where}/additionalProperties",
                                                     open_refs)
            except _Cut:
                out["additionalProperties"] = False  # no key is generated beside the properties
                out.setdefault("properties", {})
        return out

    try:
        return expand(schema, "#", ("",))
    except _Cut as e:
        raise GrammarError(
            f"JSON schema has no finite valid value: every value would nest the schema that $ref {e.ref!r} "
            f"at {e.where} refers to inside itself without end (a required property or the only branch "
            "refers back to its own schema); make the recursion optional, e.g. drop the property from "
            "'required' or add an 'anyOf' branch {'type': 'null'} beside the $ref"
        ) from None

