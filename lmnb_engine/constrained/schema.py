"""JSON schema → regex, through outlines-core's schema builder, with the gaps closed.

``outlines_core.json_schema.build_regex_from_schema`` turns a schema into one regex (objects with
keys in ``properties`` order, optional keys, arrays with item bounds, enums ...). Six of its
behaviours would break the guarantee that output validates, so this module wraps it:

* Keywords it does not enforce are silently ignored there (``uniqueItems``, ``not``,
  ``patternProperties``, ``multipleOf`` ...). Here every keyword is checked against the list of
  enforced or annotation-only keywords; anything else raises ``GrammarError`` naming it and its
  location. ``uniqueItems`` over items that list their values is written here
  (``schema_unique``).
* It ignores numeric bounds. Bounded ``integer`` / ``number`` subschemas are replaced with a
  placeholder constant before building and the placeholder is swapped for the bounded grammar
  from ``numeric.py`` after.
* Its ``format`` grammars emit JSON-invalid strings (``email``, ``time``, ``uri`` allow an
  unescaped quote or backslash) or values that are not (any Unicode digit, a month 13, a
  31 February, years of any length, no time zone), and it drops a format beside a length, so the
  formats here are this module's own (``_FORMAT_PATTERN``: a subset of each RFC that jsonschema's
  format checker accepts), written out like a ``pattern``.
* Where it stops a recursive ``$ref`` it writes ``{}``, valid or not; ``schema_refs.inline_refs``
  resolves every reference first and cuts recursion where the output stays valid (and prunes
  ``false``, which it refuses, and so a subschema whose ``enum``/``const`` lists no value that
  passes its other keywords: ``_NoListedValue``).
* It pastes ``pattern`` between the quotes, so the pattern constrained the JSON text, not the
  string (a raw ``"`` or control character got through), and it drops a pattern beside
  ``minLength``/``maxLength``; ``json_string.pattern_regex`` rewrites it over JSON text, with the
  lengths folded in.
* A schema of any value (``{}`` inside an object) becomes an ungrouped alternation that lets the
  whole output be ``null``; ``true``, ``{}`` and annotation-only schemas are given every type.

Objects with ``properties`` never get other keys (``additionalProperties`` beside them is accepted,
but extra keys are not generated, which keeps every output valid); an ``additionalProperties``
schema alone makes a map of any keys, and with ``propertyNames`` listing the names, one of those
keys (each optional). Accepted inputs: a ``dict``, a JSON string, a pydantic
model class (``lmnb_engine.pydantic_schema``), or the boolean schema ``true`` (any value; ``false`` is refused).
"""

from __future__ import annotations

import copy
import json
import math
import re
from decimal import Decimal
from typing import Any

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.constrained.numeric import decimal_parts, integer_range_regex, number_range_regex
from lmnb_engine.constrained.json_string import pattern_regex
from lmnb_engine.constrained.regex_check import MAX_REPEAT_COUNT, check_regex
from lmnb_engine.constrained.regex_syntax import automaton_syntax
from lmnb_engine.constrained.schema_oneof import check_one_of
from lmnb_engine.constrained.schema_refs import _MISSING, child, inline_refs, pointer_parts
from lmnb_engine.constrained.schema_unique import listed_item_values, unique_items_regex
from lmnb_engine.constrained.vocab import START_MARKER
from lmnb_engine.pydantic_schema import CLOCK as _CLOCK, DATE as _DATE, pydantic_json_schema
from lmnb_engine.json_schema import SHOWN_CHARS, json_value, loaded_schema
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import constants as _c, parser as _p, walk
from lmnb_engine.schema_copies import too_many_copies, too_much_text

# Keywords outlines-core enforces (plus its own minDigits/maxDigits extension).
_ENFORCED = {
    "type", "properties", "required", "items", "prefixItems", "minItems", "maxItems", "enum",
    "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format",
    "minLength", "maxLength", "minDigits", "maxDigits", "additionalProperties",
}
# Keywords with no effect on which instances validate (the content vocabulary too: since draft 7
# validators do not check it, jsonschema among them, so an output it would reject still validates;
# and OpenAPI's annotations, e.g. pydantic's json_schema_extra={"example": ...} as FastAPI taught it).
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "contentEncoding", "contentMediaType", "contentSchema",
    "example", "externalDocs", "xml",
}
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minDigits", "maxDigits")  # each becomes a counted repeat
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ANY_TYPES = ["object", "array", "string", "number", "boolean", "null"]  # every JSON value (integers are numbers)
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAX_BOUND_DIGITS = 40  # of a numeric bound (1e300 would spell 301)
_PLACEHOLDER = "LMNBPLACEHOLDER"  # letters and digits only: appears verbatim in the regex
_STRING_CHAR = '[^"\\\\\\x00-\\x1F\\x7F-\\x9F]'  # outlines-core's unescaped string character
# outlines-core's unbounded number, and the same numbers up to ~1e299: read as floats (jsonschema,
# pydantic), 1e+400 or a 400-digit number is infinity, which FiniteFloat refuses and JSON cannot write
_LIBRARY_NUMBER = r"((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?"
_FINITE_NUMBER = r"((-)?(0|[1-9][0-9]{0,99}))(\.[0-9]+)?([eE](-[0-9]+|\+[01]?[0-9]{1,2}))?"

# The formats, as Python regexes (written over JSON text by json_string, like a pattern), each a
# subset of its RFC that jsonschema's format checker (with its optional checkers) accepts; ASCII only.
# RFC 3339 full-date and partial-time (_DATE, _CLOCK) are pydantic_schema's (torch-free: for NaiveDatetime);
# full-time: then "Z" or an offset (the upper-case letters: what every validator accepts).
_TIME = _CLOCK + r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
# RFC 1123 host names of up to 4 labels, at most 253 characters (the last label at most 61); the
# last one starts with a letter (URL parsers read an all-digit one as an IPv4 address:
# http://1.2.3.256 fails).
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = f"(?:{_LABEL}\\.){{0,3}}[A-Za-z](?:[A-Za-z0-9-]{{0,59}}[A-Za-z0-9])?"
# RFC 5322 dot-atom local part of at most 62 characters (RFC 5321: 64) @ up to 3 labels of at most
# 40 and a last label of letters (email-validator's rule too): at most 247 characters, so that
# pydantic's EmailStr with max_length=254 or 255 (a common field) needs no narrowing.
_EMAIL_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,38}[A-Za-z0-9])?"
_EMAIL = (f"[A-Za-z0-9_+-]{{1,20}}(?:\\.[A-Za-z0-9_+-]{{1,20}}){{0,2}}@(?:{_EMAIL_LABEL}\\.){{1,3}}"
          "[A-Za-z]{2,61}")
# RFC 3986 http(s) URIs: host, port, up to 8 path segments of 32 characters, a 128-character
# query: at most 1430 characters, within pydantic's HttpUrl maxLength of 2083.
_URI_CHAR = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"
_PORT = "(?:0|[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"  # 0-65535
_URI = (f"https?://{_HOST}(?::{_PORT})?(?:/{_URI_CHAR}{{0,32}}){{0,8}}"
        f"(?:\\?(?:{_URI_CHAR}|[/?]){{0,128}})?")
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"  # no leading zeros (Python's ipaddress refuses them)
# RFC 3339 appendix A durations without weeks mixed in: P[nD][T[nH][nM][nS]], at least one part;
# 6 digits a part, so the sum stays within Python's timedelta (999999999 days; pydantic's limit).
_DURATION_TIME = "T(?:[0-9]{1,6}H(?:[0-9]{1,6}M)?(?:[0-9]{1,6}S)?|[0-9]{1,6}M(?:[0-9]{1,6}S)?|[0-9]{1,6}S)"
# Formats that constrain nothing: pydantic's SecretStr, bytes and Path take any string.
_ANY_STRING_FORMATS = ("password", "binary", "path")
_FORMAT_PATTERN = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "duration": f"P(?:[0-9]{{1,6}}D(?:{_DURATION_TIME})?|{_DURATION_TIME}|[0-9]{{1,6}}W)",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    # pydantic's UUID1 ... UUID8: that version digit, and RFC 4122's variant (else Python's
    # uuid.UUID reports no version and pydantic refuses it)
    **{f"uuid{v}": f"[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-{v}[0-9a-fA-F]{{3}}-[89abAB][0-9a-fA-F]{{3}}-[0-9a-fA-F]{{12}}"
       for v in range(1, 9)},
    "email": _EMAIL,
    "hostname": _HOST,
    "ipv4": f"(?:{_OCTET}\\.){{3}}{_OCTET}",
    "uri": _URI,
}


def _email_within(max_length: int) -> str:
    """The ``email`` format narrowed so that every address it writes has at most ``max_length``
    (6 to 246) characters: a share of the length for the local part and one for the domain, each
    part's atoms or labels cut to fit (a subset: the narrowing ``json_string`` does for a pattern
    cannot split one length over several parts)."""
    local = max(1, min(62, (max_length - 5) // 2))  # the domain needs 4 at least ("b.cc")
    dots = 2 if local >= 44 else 1 if local >= 9 else 0  # atoms of at least 4 characters
    atom = (local - dots) // (dots + 1)
    local_rx = f"[A-Za-z0-9_+-]{{1,{atom}}}" + (f"(?:\\.[A-Za-z0-9_+-]{{1,{atom}}}){{0,{dots}}}" if dots else "")
    domain = max_length - 1 - local
    tld = max(2, min(61, domain // 4))
    rest = domain - tld  # for the labels, each with its dot
    labels = 1 if rest < 12 else 2 if rest < 30 else 3
    width = min(40, rest // labels - 1)
    label = "[A-Za-z0-9]" + (f"(?:[A-Za-z0-9-]{{0,{width - 2}}}[A-Za-z0-9])?" if width > 1 else "")
    return f"{local_rx}@(?:{label}\\.){{1,{labels}}}[A-Za-z]{{2,{tld}}}"


def _format_pattern(fmt: str, max_length: int | None) -> str:
    """The regex of ``format`` ``fmt``; an email field with a ``maxLength`` below the 247 characters
    ``_EMAIL`` may take gets the narrowed one (``_email_within``)."""
    if fmt == "email" and max_length is not None and 6 <= max_length < 247:
        return _email_within(max_length)
    return _FORMAT_PATTERN[fmt]


def load_schema(schema: Any) -> dict | bool:
    """The schema as a fresh ``dict``: from a dict (``json_schema.checked_schema``'s copy), a JSON
    string, or a pydantic class; or the boolean schema ``true`` (JSON Schema's any value), given
    as a bool or as a JSON string.

    Raises:
        GrammarError: the string is not JSON or its JSON is no object or boolean, a dict holds a
            value JSON cannot represent, the schema breaks the JSON Schema meta-schema or is
            ``false`` (``json_schema.loaded_schema``, as the language words them), or the value is
            none of the accepted kinds.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        try:
            return pydantic_json_schema(schema)
        except ValueError as e:
            raise GrammarError(f"json_schema {schema.__name__}: {e}") from None
    if isinstance(schema, (str, bool, dict)):
        try:
            return loaded_schema(schema)
        except ValueError as e:
            raise GrammarError(str(e)) from None
    raise GrammarError(
        f"json_schema must be a dict, a JSON string or a pydantic model class, got {type(schema).__name__}"
    )


def _bound_value(value: Any, key: str, where: str) -> Decimal:
    """A numeric bound as an exact decimal (a float as its shortest repr: the number the schema
    wrote, as JSON text).

    Raises:
        GrammarError: not a finite number, or more digits than a bounded grammar should spell out."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GrammarError(f"JSON schema {json_value(key, SHOWN_CHARS)} at {where} must be a finite number, got {json_value(value, SHOWN_CHARS)}")
    bound = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    whole, fraction = decimal_parts(abs(bound))
    if len(str(whole).lstrip("0")) + len(fraction) > _MAX_BOUND_DIGITS:
        raise GrammarError(f"JSON schema {key}={json_value(value, SHOWN_CHARS)} at {where} spells more than {_MAX_BOUND_DIGITS} digits, "
                           "too many for a bounded number grammar; round the bound")
    return bound


class _NoListedValue(GrammarError):
    """No listed value (``enum``/``const``) of the subschema can validate: the subschema accepts
    nothing, like ``false``, and is pruned where the schema can do without it (``schema_refs``)."""


def _filter_listed_values(node: dict, where: str, root: dict) -> None:
    """Drop the ``enum`` values (or refuse the ``const``) that the node's other keywords reject (a
    ``const`` beside an ``enum`` is checked against it, and the ``enum`` dropped):
    JSON Schema applies them all, but the listed values alone become the grammar, so a
    ``{"format": "date", "enum": ["2024-02-30"]}`` would emit an invalid date. Checked by
    jsonschema itself (Draft 2020-12, with its format checker), a ``$ref`` among the keywords
    resolved in ``root`` (the whole schema).

    Raises:
        _NoListedValue: no listed value passes, so nothing validates this subschema.
        GrammarError: a ``$ref`` among the keywords points at nothing."""
    checks = {k: v for k, v in node.items() if k not in ("enum", "const", "$defs", "definitions") and k not in _ANNOTATIONS}
    if "const" in node and "enum" in node:  # both hold: the const, where the enum lists it, is the value
        checks["enum"] = node.pop("enum")  # (outlines-core wrote the enum's values and dropped the const)
    if not checks or ("enum" not in node and "const" not in node):
        return
    import jsonschema
    import referencing.exceptions

    # (evolve keeps the root's resolver: with the plain checks alone, a $ref inside them would
    # not resolve, and required/items/properties around one went unchecked: ["s"] for items {"$ref": int})
    checker = jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker()).evolve(schema=checks)

    def valid(value: Any) -> bool:
        try:
            return checker.is_valid(value)
        except referencing.exceptions.Unresolvable as e:
            raise GrammarError(f"JSON schema at {where} has a $ref beside its listed values that points at nothing "
                               f"in this schema ({json_value(_written_ref(e, root), SHOWN_CHARS)}); fix the reference") from None

    if "const" in node and not valid(node["const"]):
        raise _NoListedValue(f"JSON schema at {where} has const {json_value(node['const'], SHOWN_CHARS)}, which does not pass its own "
                           f"{', '.join(checks)}; no output could validate: fix the const")
    if "enum" in node:
        kept = [v for v in node["enum"] if valid(v)]
        if not kept:
            raise _NoListedValue(f"JSON schema at {where}: no enum value passes its own {', '.join(checks)}; "
                               "no output could validate: fix the enum")
        node["enum"] = kept


def _written_ref(error: Any, root: Any) -> str:
    """The ``$ref`` of ``root`` as written that ``error`` (``referencing``'s ``Unresolvable``, as
    jsonschema raises it) could not follow: the error holds the reference resolved against the
    schema's base URI, split for an anchor (``ref`` "" and ``anchor`` "nope" for ``"#nope"``), so
    its own ``ref`` alone named an anchor as ""; the first written reference whose fragment is the
    missing anchor or pointer, else the error's parts put back together."""
    anchor = getattr(error, "anchor", None)
    ref = getattr(error, "ref", None)
    missing = anchor if anchor is not None else ref
    stack = [root]
    while stack:  # (depth first, in the schema's order: the reference the message names)
        node = stack.pop()
        if isinstance(node, dict):
            written = node.get("$ref")
            if isinstance(written, str) and "#" in written and written.partition("#")[2] == missing:
                return written
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    if anchor is not None:
        return f"{ref or ''}#{anchor}"
    return str(ref) if ref is not None else str(error)


_COMBINATORS = ("anyOf", "oneOf", "allOf")


def _check_structure(node: dict, where: str) -> None:
    """Refuse what outlines-core would drop without a word, so that output need not validate:
    keywords beside ``anyOf``/``oneOf``/``allOf`` (it generates the branches alone), a ``required``
    name with no schema in ``properties`` (it writes only those), ``minItems``/``maxItems`` that
    the ``prefixItems`` count breaks (it writes exactly that many), and object keys that JSON must
    escape (it writes them raw). Beside ``enum``/``const`` only the bounds and keys are checked:
    the listed values alone are written, filtered by every other keyword (``_filter_listed_values``)."""
    listed_values = "enum" in node or "const" in node
    combinators = [k for k in _COMBINATORS if k in node]
    beside = [k for k in node if k not in _ANNOTATIONS and k not in (*_COMBINATORS, "$defs", "definitions")]
    if combinators and (beside or len(combinators) > 1) and not listed_values:
        other = beside[0] if beside else combinators[1]
        raise GrammarError(f"JSON schema at {where} has {json_value(other, SHOWN_CHARS)} beside {json_value(combinators[0], SHOWN_CHARS)}, which "
                           "constrained decoding cannot combine (only the branches would be generated); move "
                           f"{json_value(other, SHOWN_CHARS)} "
                           "into each branch")
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    missing = [k for k in node.get("required", []) if k not in properties]
    if missing and not listed_values:
        raise GrammarError(f"JSON schema at {where} requires {json_value(missing[0], SHOWN_CHARS)}, which has no schema under "
                           '"properties"; constrained decoding writes only the listed properties: add '
                           f'"properties": {{{json_value(missing[0], SHOWN_CHARS)}: {{}}}} (any value) or a schema for it')
    for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength"), ("minDigits", "maxDigits")):
        if isinstance(node.get(lo), int) and isinstance(node.get(hi), int) and node[lo] > node[hi]:
            raise GrammarError(f"JSON schema at {where} has {lo} {node[lo]} above {hi} {node[hi]}: no value fits; "
                               "fix the bounds")
    if isinstance(node.get("prefixItems"), list) and not listed_values:
        n = len(node["prefixItems"])
        if node.get("minItems", 0) > n or node.get("maxItems", n) < n:
            raise GrammarError(f"JSON schema at {where} has {n} prefixItems and minItems/maxItems that exclude "
                               f"{n} items; constrained decoding writes exactly the prefixItems: make the bounds "
                               f"allow {n}, or list that many prefixItems")
    listed = [node["const"]] if "const" in node else node.get("enum", [])
    for key in [*properties, *(k for v in listed for k in _object_keys(v))]:
        if any(c in '"\\' or ord(c) < 0x20 for c in key):
            raise GrammarError(f"JSON schema at {where} has the object key {json_value(key, SHOWN_CHARS)}, which JSON writes "
                               "with escapes; constrained decoding writes keys as they are: rename it")


_TYPE_KEYWORDS = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": _BOUNDS,
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems"),
    "object": ("properties", "required", "additionalProperties", "propertyNames"),
}


def _type_list(node: dict, default: str | None = None) -> list[str]:
    """``node``'s ``type`` as a list (``default`` where it has none)."""
    types = node.get("type", default)
    return [types] if isinstance(types, str) else list(types or [])


def _with_implied_type(node: dict, where: str) -> dict:
    """``node`` with the ``type`` its keywords imply, where it has none: ``{"minLength": 3}``
    becomes a string of 3 or more characters (outlines-core failed with "Unsupported JSON Schema
    structure"). JSON Schema lets values of the other types through such a schema too; writing
    only the implied type keeps every output valid.

    Raises:
        GrammarError: the keywords belong to more than one type."""
    if "type" in node or any(k in node for k in ("enum", "const", "$ref", *_COMBINATORS)):
        return node
    implied = [t for t, keys in _TYPE_KEYWORDS.items() if any(k in node for k in keys)]
    if len(implied) > 1:
        raise GrammarError(f"JSON schema at {where} has no \"type\" and keywords for {' and '.join(implied)} values; "
                           'constrained decoding writes one kind of value per subschema: add "type", or split '
                           'it into "anyOf" branches')
    return dict(node, type=implied[0]) if implied else node


def unsupported_keyword(key: str, where: str) -> str:
    """The engine's refusal of the keyword ``key`` at ``where`` (``#/properties/a``), which it does
    not enforce; ``json_schema.checked_schema`` says it too for a ``patternProperties`` key it
    would refuse otherwise."""
    return (f"JSON schema keyword {json_value(key, SHOWN_CHARS)} at {where} is not supported by constrained decoding "
            f"(it cannot be enforced while decoding); remove it. Supported keywords: "
            f"{', '.join(sorted(_ENFORCED | set(_BOUNDS)))}")


def _without_moot_keywords(node: dict) -> dict:
    """``node`` without the keywords its ``type`` makes moot: each constrains only values of one
    type (JSON Schema ignores it for the others), and outlines-core writes an object or an array
    wherever it sees theirs (``{"type": "string", "additionalProperties": false}`` wrote ``{}``);
    bounds beside a string and a format beside a number (OpenAPI's ``int64``) were refused."""
    if "type" not in node:
        return node
    types = {"number" if t == "integer" else t for t in _type_list(node)}
    moot = [k for t, keys in _TYPE_KEYWORDS.items() if t not in types for k in keys]
    return {k: v for k, v in node.items() if k not in moot}


def _draft4_bounds(node: Any) -> None:
    """Draft 4's boolean ``exclusiveMinimum``/``exclusiveMaximum`` (its meta-schema allows only
    that form) as later drafts write them, in every subschema first: the checks of a parent
    (``_filter_listed_values``, ``oneOf``) read its children with 2020-12's meaning."""
    if isinstance(node, list):
        for sub in node:
            _draft4_bounds(sub)
        return
    if not isinstance(node, dict):
        return
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(flag), bool):
            if node.pop(flag) and bound in node:
                node[flag] = node.pop(bound)
    for key in (*_SUBSCHEMA_MAPS, *_SUBSCHEMA_LISTS, "items", "additionalProperties"):
        sub = node.get(key)
        _draft4_bounds(list(sub.values()) if key in _SUBSCHEMA_MAPS and isinstance(sub, dict) else sub)


def _is_legacy_draft(schema: dict) -> bool:
    """``schema``'s ``$schema`` names a draft before 2020-12 (jsonschema's reading of it)."""
    import jsonschema

    draft = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return draft is not jsonschema.Draft202012Validator


def _draft7_items(node: Any, legacy: bool) -> None:
    """Drafts 3 to 2019-09's tuple form, ``items`` as a list (the meta-schema of 2020-12 refuses it,
    so only those drafts get here) and ``additionalItems`` for the items after it, written as
    2020-12 writes them, ``prefixItems`` and ``items``, in every subschema (outlines-core failed
    with "Unsupported JSON Schema structure"). Beside a non-list ``items`` ``additionalItems``
    constrains nothing in any draft, so it is dropped; in a ``legacy`` schema (its ``$schema``
    names one of those drafts) so is ``prefixItems``, which they do not know (their ``items``
    schema applies to every item)."""
    if isinstance(node, list):
        for sub in node:
            _draft7_items(sub, legacy)
        return
    if not isinstance(node, dict):
        return
    if legacy:
        node.pop("prefixItems", None)
    if isinstance(node.get("items"), list):
        node["prefixItems"] = node.pop("items")
        if "additionalItems" in node:
            node["items"] = node.pop("additionalItems")
    node.pop("additionalItems", None)
    for key in (*_SUBSCHEMA_MAPS, *_SUBSCHEMA_LISTS, "items", "additionalProperties"):
        sub = node.get(key)
        _draft7_items(list(sub.values()) if key in _SUBSCHEMA_MAPS and isinstance(sub, dict) else sub, legacy)


def _check_big_integers(node: dict, where: str) -> None:
    """Refuse listed integers beyond 2**53: outlines-core writes them through a float
    (``2**64 + 1`` became ``1.8446744073709552e+19``, another value)."""
    stack = [node.get("const")] + list(node.get("enum", []))
    while stack:
        v = stack.pop()
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53:
            raise GrammarError(f"JSON schema at {where} lists the integer {v}, beyond 2**53, which constrained "
                               "decoding cannot write exactly; list it as a string, or use a bounded integer type")
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())


def _check_listed_text(node: dict, where: str) -> None:
    """Refuse listed strings (values or object keys) holding a lone surrogate: no UTF-8 text holds
    one (outlines-core said only "Expected a valid JSON string")."""
    stack = [node.get("const")] + list(node.get("enum", []))
    while stack:
        v = stack.pop()
        texts = [v] if isinstance(v, str) else list(v) if isinstance(v, dict) else []
        bad = next((t for t in texts if any(0xD800 <= ord(c) <= 0xDFFF for c in t)), None)
        if bad is not None:
            raise GrammarError(f"JSON schema at {where} lists the string {json_value(bad, SHOWN_CHARS)}, which holds a lone surrogate "
                               "(no UTF-8 text holds one); remove it or write the character it stands for")
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())


def _object_keys(value: Any):
    """Every object key inside a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _object_keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _object_keys(v)


def _bounded_regex(node: dict, kind: str, where: str) -> str:
    """The regex of a bounded ``integer`` or ``number`` subschema (keys in ``_BOUNDS``): the
    tightest lower and upper bound, an integer's rounded inwards to integers."""
    lo = hi = None
    lo_excl = hi_excl = False
    for key in ("minimum", "exclusiveMinimum"):
        if key in node:
            v, excl = _bound_value(node[key], key, where), key == "exclusiveMinimum"
            if lo is None or v > lo or (v == lo and excl):
                lo, lo_excl = v, excl
    for key in ("maximum", "exclusiveMaximum"):
        if key in node:
            v, excl = _bound_value(node[key], key, where), key == "exclusiveMaximum"
            if hi is None or v < hi or (v == hi and excl):
                hi, hi_excl = v, excl
    written = " and ".join(f"{k} {node[k]}" for k in _BOUNDS if k in node)
    try:
        if kind == "integer":
            lo = None if lo is None else math.floor(lo) + 1 if lo_excl else math.ceil(lo)
            hi = None if hi is None else math.ceil(hi) - 1 if hi_excl else math.floor(hi)
            return integer_range_regex(lo, hi)
        return number_range_regex(lo, hi, lo_excl, hi_excl)
    except GrammarError as e:
        raise GrammarError(f"JSON schema at {where} ({written}): {e}") from None


def _check_combinations(node: dict, where: str) -> None:
    """Refuse what outlines-core would turn into output that does not validate: an empty ``enum``
    (it yields an empty match; the meta-schema allows it, unlike an empty ``type`` or ``anyOf``)
    and ``allOf`` over several subschemas (it concatenates them, which is not their intersection);
    ``oneOf``: ``schema_oneof.check_one_of``. Beside ``enum``/``const`` ``allOf`` only filters the
    listed values (``_filter_listed_values``)."""
    if node.get("enum") == []:
        raise _NoListedValue(f"JSON schema at {where} has an empty \"enum\": no value can validate against it; "
                           "list at least one value")
    listed_values = "enum" in node or "const" in node
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1 and not listed_values:
        raise GrammarError(f"JSON schema at {where} has \"allOf\" with {len(node['allOf'])} subschemas, which "
                           "constrained decoding cannot intersect; merge them into one schema")



class _Rewriter:
    """Checks keywords and swaps bounded numeric subschemas for placeholders (one pass, in place)."""

    def __init__(self, prefix: str, root: dict, whitespace: str) -> None:
        self.prefix = prefix  # of the placeholder names: text the schema itself does not hold
        self.root = root  # the schema as written (the visit rewrites a copy)
        self.whitespace = whitespace  # between JSON tokens, for the arrays written here
        self.fragments: dict[str, str] = {}
        self.strings: dict[tuple, str] = {}  # _string_regex's results: the visit asks before _formatted
        self.no_value: dict[str, str] = {}  # where a subschema lists no valid value → why (for schema_refs)

    def visit(self, node: Any, where: str) -> Any:
        """``node`` (at ``where``) rewritten for outlines-core; ``false`` where it lists no valid value.

        Raises:
            GrammarError: a keyword, format or structure constrained decoding cannot enforce."""
        try:
            return self._visit(node, where)
        except _NoListedValue as e:
            # Like false: schema_refs drops it where the schema can do without it (an optional
            # property, one anyOf branch, the items of an array that may be empty), else refuses
            # the schema with this message.
            self.no_value[where] = str(e)
            return False

    def _visit(self, node: Any, where: str) -> Any:
        if node is True or (isinstance(node, dict) and all(k in _ANNOTATIONS or k in ("$defs", "definitions")
                                                           for k in node)):
            # Any value. outlines-core refuses true and a schema of annotations only, and renders {}
            # as an ungrouped alternation: in {"properties": {"x": {}}} the whole output could be "null".
            node = {**(node if isinstance(node, dict) else {}), "type": _ANY_TYPES}
        if node is False:
            return node  # no value: schema_refs.inline_refs prunes it
        if not isinstance(node, dict):
            raise GrammarError(f"JSON schema at {where} must be an object or a boolean, got {json_value(node, SHOWN_CHARS)}")
        node = _without_moot_keywords(_with_implied_type(node, where))
        if node.get("format") in _ANY_STRING_FORMATS:
            node = {k: v for k, v in node.items() if k != "format"}
        if "propertyNames" in node:
            node = self._named_properties(node, where)
        for key in node:
            if key not in _ENFORCED and key not in _ANNOTATIONS and key not in _BOUNDS:
                if key == "uniqueItems":  # (enforced over listed item values: _unique_items)
                    continue
                raise GrammarError(unsupported_keyword(key, where))
        if "format" in node and node["format"] not in _FORMAT_PATTERN:
            raise GrammarError(
                f"JSON schema format {json_value(node['format'], SHOWN_CHARS)} at {where} is not supported; supported formats: "
                f"{', '.join(sorted(_FORMAT_PATTERN))} (or give a \"pattern\" instead)"
            )
        beside = [k for k in node if k not in _ANNOTATIONS and k not in ("$ref", "$defs", "definitions")]
        if "$ref" in node and beside:  # (2019-09 on they apply with the reference; draft 7 ignored them)
            raise GrammarError(f"JSON schema at {where} has {', '.join(json_value(b, SHOWN_CHARS) for b in beside)} beside \"$ref\", which "
                               "constrained decoding cannot intersect with the schema it refers to; move them "
                               "into that schema")
        listed = "enum" in node or "const" in node  # (those values are checked against all of them)
        if "format" in node and "pattern" in node and not listed:  # outlines-core enforced one, dropped the other
            raise GrammarError(f"JSON schema at {where} has format {json_value(node['format'], SHOWN_CHARS)} and a pattern, which "
                               "constrained decoding cannot intersect: drop one of them")
        shaped = "string" in _type_list(node, "string") and not listed and ("pattern" in node or "format" in node)
        for key in _COUNTS:
            if isinstance(node.get(key), float):  # 5.0 is a valid count; outlines-core drops a float one
                node[key] = int(node[key])
            if isinstance(node.get(key), int) and node[key] > MAX_REPEAT_COUNT and not (shaped and "Length" in key):
                raise GrammarError(
                    f"JSON schema {key}={node[key]} at {where} is above the limit of {MAX_REPEAT_COUNT}: it becomes "
                    "a counted repeat whose automaton would take too long to build (the limit user regexes "
                    f"have too); drop {key} and bound the length with max_tokens instead"
                )
        if shaped:
            self._string_regex(node, where)  # (its errors now, before the rest of the schema)
        _check_combinations(node, where)
        if isinstance(node.get("oneOf"), list) and not listed:  # (beside listed values it only filters them)
            check_one_of(node["oneOf"], where, self.root, self._deref)
        _check_structure(node, where)
        _filter_listed_values(node, where, self.root)
        if "enum" in node or "const" in node:
            # Filtered by every keyword beside them, the listed values alone are the grammar (beside
            # properties or prefixItems, outlines-core wrote those and dropped the values).
            node = {k: v for k, v in node.items() if k in ("enum", "const") or k in _ANNOTATIONS}
            _check_big_integers(node, where)
            _check_listed_text(node, where)
        if node.pop("uniqueItems", False) is True and "array" in _type_list(node, "array"):
            return self._unique_items(node, where)
        if node.get("additionalProperties") is False and "properties" not in node:
            node["properties"] = {}  # the schema of "{}", which outlines-core fails on without properties
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                node[key] = {k: self.visit(v, f"{where}/{key}/{k}") for k, v in node[key].items()}
        for key in (*_SUBSCHEMA_LISTS, "items"):
            if isinstance(node.get(key), list):
                node[key] = [self.visit(v, f"{where}/{key}/{i}") for i, v in enumerate(node[key])]
        if isinstance(node.get("items"), (dict, bool)):
            node["items"] = self.visit(node["items"], f"{where}/items")
        if isinstance(node.get("additionalProperties"), dict):  # (outlines-core takes true and false there)
            node["additionalProperties"] = self.visit(node["additionalProperties"], f"{where}/additionalProperties")
            if node["additionalProperties"] is False:
                node.setdefault("properties", {})  # (as above: outlines-core needs them beside false)
        if any(k in node for k in _BOUNDS):
            return self._bounded(node, where)
        return self._formatted(node, where)

    def _named_properties(self, node: dict, where: str) -> dict:
        """``node`` with a ``propertyNames`` that lists the names (``enum``/``const``, as pydantic
        writes ``dict[Literal["a", "b"], V]``) turned into optional ``properties`` of the
        ``additionalProperties`` schema, which outlines-core writes (it ignores ``propertyNames``).

        Raises:
            GrammarError: ``propertyNames`` is not such a list, or ``properties`` beside it name a
                key it does not allow."""
        import jsonschema

        names_schema = self._deref(node["propertyNames"])
        if not (isinstance(names_schema, dict) and ("enum" in names_schema or "const" in names_schema)
                and all(k in ("enum", "const", "type") or k in _ANNOTATIONS for k in names_schema)):
            raise GrammarError(f"JSON schema \"propertyNames\" at {where} is supported only as a list of names "
                               '("enum" or "const", e.g. pydantic\'s dict[Literal[\'a\', \'b\'], int]); list the names '
                               'or give "properties" instead')
        listed = [names_schema["const"]] if "const" in names_schema else names_schema["enum"]
        is_name = jsonschema.Draft202012Validator(names_schema).is_valid
        names = [v for v in listed if isinstance(v, str) and is_name(v)]
        node = {k: v for k, v in node.items() if k != "propertyNames"}
        if "properties" in node:  # (only those are written: each must be an allowed name)
            bad = [k for k in node["properties"] if k not in names]
            if bad:
                raise GrammarError(f"JSON schema at {where} has the property {json_value(bad[0], SHOWN_CHARS)}, which its "
                                   '"propertyNames" does not allow; drop it or add it to the names')
            return node
        value = node.get("additionalProperties", True)
        node["properties"] = {} if value is False else {name: copy.deepcopy(value) for name in names}  # (visits rewrite in place)
        return node

    def _unique_items(self, node: dict, where: str) -> dict:
        """An array node with ``uniqueItems``: a placeholder for the arrays of its listed item
        values, each at most once (``schema_unique``), or-ed with its other types.

        Raises:
            GrammarError: the items do not list their values, or prefixItems are beside it."""
        values = None if "prefixItems" in node else listed_item_values(self._deref(node.get("items", {})),
                                                                         _ANNOTATIONS)
        if values is None:
            raise GrammarError(f"JSON schema at {where} has uniqueItems, which constrained decoding enforces only "
                               "over items that list their values (\"enum\"/\"const\"/boolean, e.g. pydantic's "
                               "set[Literal['a', 'b']] or set[SomeEnum]); list the item values, or use a list "
                               "(drop uniqueItems)")
        _check_listed_text({"enum": values}, f"{where}/items")
        fragment = unique_items_regex(values, node.get("minItems", 0), node.get("maxItems"), self.whitespace, where)
        rest = {k: v for k, v in node.items() if k not in _TYPE_KEYWORDS["array"]}
        return self._placeholder(fragment, rest, ["array"], where)

    def _deref(self, node: Any) -> Any:
        """``node`` with its local ``$ref`` followed in the schema as written (as it is where that
        fails: ``schema_refs`` names a bad reference)."""
        for _ in range(32):  # (a chain of references to references, not a cycle)
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
                return node
            target = self.root
            for part in pointer_parts(node["$ref"]):
                target = child(target, part)
                if target is _MISSING:
                    return node
            node = target
        return node

    def _placeholder(self, fragment: str, node: dict, covered: list[str], where: str) -> dict:
        """A placeholder constant for ``fragment`` (the regex of the ``covered`` types of
        ``node``), or-ed with what ``node`` still allows of its other types."""
        name = f"{self.prefix}{len(self.fragments)}X"
        self.fragments[name] = fragment
        others = [t for t in _type_list(node) if t not in covered]
        if not others:
            return {"const": name}
        rest = self._formatted(dict(node, type=others if len(others) > 1 else others[0]), where)
        return {"anyOf": [{"const": name}, rest]}

    def _string_regex(self, node: dict, where: str) -> str:
        """The regex of the JSON strings ``node``'s ``format`` (``_FORMAT_PATTERN``) or ``pattern``
        allows, with its ``minLength`` / ``maxLength`` folded in (``json_string.pattern_regex``)."""
        fmt, pattern = node.get("format"), node.get("pattern")
        lo, hi = node.get("minLength", 0), node.get("maxLength")
        key = (fmt, pattern, lo, hi)
        if key not in self.strings:
            self.strings[key] = pattern_regex(_format_pattern(fmt, hi) if fmt is not None else pattern, where, lo, hi,
                                              name=None if fmt is None else f"format {json_value(fmt, SHOWN_CHARS)}")
        return self.strings[key]

    def _formatted(self, node: dict, where: str) -> dict:
        """A string with a ``format`` or ``pattern``: a placeholder for its regex
        (``_string_regex``); any other node as it is."""
        if not ("format" in node or "pattern" in node) or "enum" in node or "const" in node:
            return node
        if "string" not in _type_list(node, "string"):
            return node  # the format or pattern applies to strings only: nothing to narrow
        fragment = self._string_regex(node, where)
        node = {k: v for k, v in node.items() if k not in ("format", "pattern", "minLength", "maxLength")}
        return self._placeholder(fragment, node, ["string"], where)

    def _bounded(self, node: dict, where: str) -> dict:
        bounds = {k: node.pop(k) for k in _BOUNDS if k in node}
        if "enum" in node or "const" in node:
            return node  # the listed values (those within the bounds: _filter_listed_values) are the grammar
        numeric = [t for t in _type_list(node) if t in ("integer", "number")]
        if not numeric:
            raise GrammarError(
                f"JSON schema at {where} has {', '.join(bounds)} but no type \"integer\" or \"number\"; "
                "add the type"
            )
        kind = "number" if "number" in numeric else "integer"
        return self._placeholder(_bounded_regex(bounds, kind, where), node, ["integer", "number"], where)


_JSON_WHITESPACE = " \t\n\r"  # RFC 8259 §2


def _check_whitespace(pattern: str) -> None:
    """Refuse a ``whitespace_pattern`` that can match anything but JSON's four whitespace
    characters (``\\s`` also matches e.g. U+00A0, which JSON does not allow between tokens)."""
    check_regex(pattern)
    parsed = _p.parse(pattern)
    allowed = {ord(c) for c in _JSON_WHITESPACE}
    for op, av in walk(parsed):
        bad = (op is _c.LITERAL and av not in allowed) or op in (_c.NOT_LITERAL, _c.ANY, _c.CATEGORY) or (
            op is _c.RANGE and not set(range(av[0], av[1] + 1)) <= allowed) or op is _c.NEGATE
        if bad:
            raise GrammarError(f"whitespace_pattern {shown_regex(pattern)} can match characters other than JSON whitespace "
                               "(space, \\t, \\n, \\r), which would break the JSON; use only those, e.g. "
                               "r'[ \\n]{0,2}'")


def _check_regex_copies(schema: Any, fragments: dict[str, str]) -> None:
    """Refuse ``schema`` (``$ref``s inlined or not; ``fragments``: its placeholders' regexes) if
    its regex would hold more than ``MAX_REGEX_COPIES`` subschema copies
    (``lmnb_engine.schema_copies.too_many_copies``), or more than ``MAX_REGEX_CHARS`` characters
    of their text (``too_much_text``: few copies of a long enum).

    Raises:
        GrammarError: naming the count, the limit, why nesting multiplies it and the fix.
    """
    problem = too_many_copies(schema) or too_much_text(schema, fragments)
    if problem:
        raise GrammarError(problem)


def schema_to_regex(schema: Any, whitespace_pattern: str | None = None) -> str:
    """Regex whose matches are exactly the JSON texts the decoder may produce for ``schema``.

    Args:
        schema: dict, JSON string or pydantic model class.
        whitespace_pattern: regex for the optional whitespace between JSON tokens (outlines-core's
            default is ``[ ]?``); e.g. ``r"[ \\n]{0,2}"`` for pretty-printed output.

    Raises:
        GrammarError: unsupported keyword, format or regex feature (named, with its location), an
            empty numeric range, a structure outlines-core rejects, or one whose regex would hold
            more than ``MAX_REGEX_COPIES`` subschema copies or ``MAX_REGEX_CHARS`` characters of
            their text (``schema_copies``), checked before the ``$ref``s are inlined too.
    """
    from outlines_core.json_schema import WHITESPACE, build_regex_from_schema

    if whitespace_pattern is not None:  # named here: in the built regex it would be lost in kilobytes
        try:
            re.compile(whitespace_pattern)
        except re.error as e:
            raise GrammarError(f"whitespace_pattern {shown_regex(whitespace_pattern)} is not a valid regular expression "
                               f"({e.msg} at position {e.pos}); fix it, e.g. r'[ \\n]{{0,2}}'") from None
        _check_whitespace(whitespace_pattern)
        whitespace_pattern = f"(?:{automaton_syntax(whitespace_pattern)})"  # outlines-core splices it in ungrouped
    schema = load_schema(schema)  # (false is refused there: no value passes it)
    prefix = _PLACEHOLDER
    while prefix in json.dumps(schema):  # a user's own text must never be taken for a placeholder
        prefix += "Q"
    _draft4_bounds(schema)
    _draft7_items(schema, _is_legacy_draft(schema))
    rewriter = _Rewriter(prefix, schema, whitespace_pattern or WHITESPACE)
    visited = rewriter.visit(copy.deepcopy(schema), "#")
    _check_regex_copies(visited, rewriter.fragments)  # before inlining, which would write those copies out
    rewritten = inline_refs(visited, schema, rewriter.no_value)
    _check_regex_copies(rewritten, rewriter.fragments)  # with recursion inlined, MAX_REF_DEPTH levels of it
    try:
        regex = build_regex_from_schema(json.dumps(rewritten), whitespace_pattern)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"outlines-core cannot compile this JSON schema: {e}") from None
    # One pass, so a fragment's own text (a pattern may spell a placeholder name) is never replaced.
    # A name is absent where its subschema is never generated (a $defs entry no $ref names, a cut
    # recursion branch, additionalProperties beside properties), present once per use of a $ref.
    names = re.compile(f'"({re.escape(prefix)}\\d+X)"')
    if prefix in names.sub("", regex) or any(n not in rewriter.fragments for n in names.findall(regex)):
        raise GrammarError("internal error: a placeholder was left in the schema regex")  # (a library change)
    regex = regex.replace(_LIBRARY_NUMBER, _FINITE_NUMBER)  # (the library's own text: before the fragments)
    regex = names.sub(lambda m: f"(?:{rewriter.fragments[m.group(1)]})", regex)
    # a string never holds the grammar's markers (noncharacters), so they may mark its start and end
    return regex.replace(_STRING_CHAR, _STRING_CHAR[:-1] + f"\\U{ord(START_MARKER):08x}-\\U{ord(START_MARKER) + 1:08x}]")
