"""How many subschema copies outlines-core's regex of a JSON schema holds, and how many
characters of their text, how many values its JSON text holds, and the limits on them.

Torch-free, and linear in the number of distinct objects of the schema: a schema built in Python
may hold one subschema object at many places (``s = {"items": s, "prefixItems": [s]}``, 30 deep),
whose paths, and so the walks that visit each path (``json.dumps``, the meta-schema check), number
2**30; each object is counted once here (a memo by identity), so such a schema is refused at once,
with the words its JSON text would get (``json_schema.copies_problem``, asked first by
``json_schema.checked_schema``; the engine's ``schema.schema_to_regex`` counts copies, and their
text, again on the rewritten and the inlined schema).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from lmnb_engine.json_schema import child, pointer_parts

# Subschema copies outlines-core's regex of a schema may hold (``regex_copies``). Past it, the
# regex alone takes gigabytes: arrays nested 50 deep wrote 2**50 copies, and the process was killed
# for its memory while building the string, before any compile limit could act.
MAX_REGEX_COPIES = 1 << 18

# Values (objects, arrays, strings, numbers, ...) a schema's JSON text may hold (``json_values``).
# The regex copies above follow only the keywords outlines-core writes out; a Python-built schema
# sharing one object under others ({"not": s, "if": s}, 20 deep) writes 2**20 copies into its JSON
# text, and json.dumps ran for hours on the caller's thread. 10**6 values is some 7 MB of JSON,
# well above any realistic schema (draft 7's meta-schema holds 166, an object of 300 integer
# properties about 600); the meta-schema check of a schema at the limit takes some seconds, not hours.
MAX_JSON_VALUES = 10**6


def regex_copies(node: Any, root: Any = None, memo: dict | None = None, open_refs: frozenset = frozenset(),
                 weight: Callable[[dict], int] = lambda node: 1) -> int:
    """How many subschema copies outlines-core's regex of ``node`` holds, counting ``node``: its
    regex writes an array's ``items`` twice (the first item and the repeat), ``additionalProperties``
    twice too, and, in an object none of whose properties is required, property i of k once for
    each property from i on that may come first (measured on outlines-core 0.2: 300 optional
    integers take 2 MB). So each level of nesting multiplies them. A local ``$ref`` into ``root``
    counts its target's copies, as ``inline_refs`` will write it there (a definition that refers to
    another twice, 20 deep, inlined to 2**20 copies), but once on a path (``open_refs``): recursion
    is cut at ``MAX_REF_DEPTH`` levels when inlined, and counted again then. A subschema met again
    (a shared definition, an object a Python-built schema holds at several places, or what
    ``inline_refs`` shares) is counted once (``memo``, by identity), in time linear in the number
    of distinct objects. Lists may be tuples (a schema built in Python, not yet JSON). ``weight``
    counts each copy of a subschema (a dict, not a ``$ref``) as more than 1 (``regex_chars``).

    Raises:
        RecursionError: nesting deeper than Python's recursion limit (some hundreds of levels).
    """
    memo = {} if memo is None else memo
    if not isinstance(node, dict):
        return 1
    if id(node) in memo:
        return memo[id(node)]
    ref = node.get("$ref")
    if isinstance(ref, str):
        doc = ref.partition("#")[0]
        root_id = root.get("$id") if isinstance(root, dict) else None  # (not yet checked: may be no string)
        if doc and doc != (root_id.partition("#")[0] if isinstance(root_id, str) else ""):
            return 1  # another document: inline_refs refuses it
        target = root
        for part in pointer_parts(ref):
            target = child(target, part)
        if not isinstance(target, dict) or ref in open_refs:
            return 1
        return regex_copies(target, root, memo, open_refs | {ref}, weight)
    total = weight(node)
    props = node.get("properties")
    if isinstance(props, dict):
        required = node.get("required")
        required = {r for r in required if isinstance(r, str)} if isinstance(required, (list, tuple)) else set()
        for i, (name, sub) in enumerate(props.items()):
            times = 1 if name in required else 2 if required else len(props) - i
            total += times * regex_copies(sub, root, memo, open_refs, weight)
    for key in ("items", "additionalProperties"):
        total += 2 * regex_copies(node[key], root, memo, open_refs, weight) if isinstance(node.get(key), dict) else 0
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), (list, tuple)):
            total += sum(regex_copies(sub, root, memo, open_refs, weight) for sub in node[key])
    memo[id(node)] = total
    return total


def too_many_copies(schema: Any) -> Optional[str]:
    """Why ``schema`` (``$ref``s inlined or not) is refused, where its regex would hold more than
    ``MAX_REGEX_COPIES`` subschema copies (``regex_copies``): the count, the limit, why nesting
    multiplies it and the fix; else None.

    Raises:
        RecursionError: as ``regex_copies``.
    """
    copies = regex_copies(schema, schema)
    if copies <= MAX_REGEX_COPIES:
        return None
    return (f"JSON schema is too large to compile: its regex would write its subschemas about {copies} "
            f"times, above the limit of {MAX_REGEX_COPIES} (an array writes its items twice, so each "
            "level of arrays within arrays doubles them; so does additionalProperties, and an object "
            "with no required property writes each property once per property); nest less deeply, "
            "or make a property required")


# Characters of subschema text outlines-core's regex of a schema may hold (``regex_chars``): the
# copies above count each subschema as one, but one that lists 100,000 values (600 kB of JSON) at
# the end of 8 levels of definitions that each refer to the next twice was written out 256 times,
# a 150 MB regex built for 25 s on the submitting thread, and at 12 levels the process ran out of
# memory; arrays nested 17 deep, at the copy limit, estimate 4.7 million (a 6 MB regex).
MAX_REGEX_CHARS = 1 << 24

# The keywords ``regex_copies`` follows (their subschemas are counted as copies of their own) and
# the definitions, reached through ``$ref`` alone: no part of a subschema's own text.
_NOT_OWN_TEXT = ("properties", "items", "additionalProperties", "prefixItems", "anyOf", "oneOf", "allOf", "$defs",
                 "definitions")


def json_chars(value: Any, memo: dict | None = None) -> int:
    """How many characters ``json.dumps(value)`` writes (its default separators and
    ``ensure_ascii``), an object, array or string held at several places counted at each but
    walked once (``memo``, by identity): an enum list shared by 4,096 copies of a definition is
    measured once. Lists may be tuples.

    Raises:
        RecursionError: nesting deeper than Python's recursion limit.
    """
    memo = {} if memo is None else memo
    if not isinstance(value, (dict, list, tuple, str)):
        return len(json.dumps(value))
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, str):
        size = len(json.dumps(value))
    elif isinstance(value, dict):  # {"k": v, ...}: the braces, ": " after each key, ", " between items
        size = 2 + sum(len(json.dumps(k)) + 2 + json_chars(v, memo) for k, v in value.items()) + 2 * max(len(value) - 1, 0)
    else:
        size = 2 + sum(json_chars(v, memo) for v in value) + 2 * max(len(value) - 1, 0)
    memo[id(value)] = size
    return size


def regex_chars(schema: Any, fragments: dict[str, str] | None = None) -> int:
    """About how many characters outlines-core's regex of ``schema`` holds: ``regex_copies`` with
    each copy of a subschema weighed by its own JSON text (``json_chars``: its keywords but the
    subschemas counted as copies of their own, with its property names), which the regex writes
    out in its own form once per copy (an enum's values as alternatives, a const as a literal). A
    placeholder constant that stands for a regex fragment (``fragments``: name → regex, the
    engine's rewritten schema) weighs as that fragment, which replaces it at each copy."""
    fragments = fragments or {}
    texts: dict = {}

    def own_text(node: dict) -> int:  # (json_chars of the node without _NOT_OWN_TEXT, with no dict made for it)
        own = [(k, v) for k, v in node.items() if k not in _NOT_OWN_TEXT]
        size = 2 + sum(len(json.dumps(k)) + 2 + json_chars(v, texts) for k, v in own) + 2 * max(len(own) - 1, 0)
        props = node.get("properties")
        names = sum(json_chars(name, texts) for name in props) if isinstance(props, dict) else 0
        const = node.get("const")
        fragment = len(fragments[const]) if isinstance(const, str) and const in fragments else 0
        return size + names + fragment

    return regex_copies(schema, schema, {}, frozenset(), own_text)


def too_much_text(schema: Any, fragments: dict[str, str] | None = None) -> Optional[str]:
    """Why ``schema`` is refused, where its regex would hold more than ``MAX_REGEX_CHARS``
    characters of its subschemas' text (``regex_chars``): the count, the limit, why and the fix;
    else None.

    Raises:
        RecursionError: as ``regex_copies``.
    """
    chars = regex_chars(schema, fragments)
    if chars <= MAX_REGEX_CHARS:
        return None
    return (f"JSON schema is too large to compile: its regex would write about {chars} characters of its "
            f"subschemas' text, above the limit of {MAX_REGEX_CHARS} (each subschema is written once per copy: "
            "once per $ref to it, twice as an array's items, so a long enum, const or pattern nested in arrays "
            "or definitions that refer to others is written many times); shorten the long values, or write "
            "them at fewer places")


def json_values(value: Any, memo: dict | None = None, distinct: list | None = None) -> int:
    """How many values the JSON text of ``value`` holds: ``value`` and every value inside it, at
    any depth (an object's keys are not counted: each has its value). An object or array held at
    several places is written out at each, and counted so, but walked once (``memo``, by identity);
    ``distinct``, a one-item list, is raised by the values of each object walked, so it ends as
    the count with each object counted once. Lists may be tuples (a schema built in Python). An
    object met again inside itself counts 1: ``json.dumps`` names that circular reference.

    Raises:
        RecursionError: nesting deeper than Python's recursion limit (some hundreds of levels).
    """
    if not isinstance(value, (dict, list, tuple)):
        return 1
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = 1  # (until counted: only a circular reference meets it)
    items = value.values() if isinstance(value, dict) else value
    if distinct is not None:
        distinct[0] += 1 + sum(not isinstance(v, (dict, list, tuple)) for v in items)
    memo[id(value)] = 1 + sum(json_values(v, memo, distinct) for v in items)
    return memo[id(value)]


def too_many_values(schema: Any) -> Optional[str]:
    """Why ``schema`` is refused, where its JSON text would hold more than ``MAX_JSON_VALUES``
    values (``json_values``): the count, the limit and the fix, which names the objects it shares
    where they make it so large; else None.

    Raises:
        RecursionError: as ``json_values``.
    """
    distinct = [0]
    values = json_values(schema, {}, distinct)
    if values <= MAX_JSON_VALUES:
        return None
    words = (f"JSON schema is too large: written out as JSON it would hold {values} values, above the "
             f"limit of {MAX_JSON_VALUES}")
    if distinct[0] > MAX_JSON_VALUES:
        return words + "; make it smaller (fewer properties, shorter enums)"
    return (words + f", from {distinct[0]} distinct ones: it holds one dict or list at several places, "
            "written out in full at each (one shared at each level of its nesting doubles the text per "
            'level); nest less deeply, or name the shared subschema once under "$defs" and write '
            '{"$ref": "#/$defs/<name>"} at each place')
