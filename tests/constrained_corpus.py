"""Corpus of regexes and JSON schemas for the constrained-decoding tests (issue 5).

Every pattern is bounded (finite language or bounded repetition) except a few number fractions, so
a random-weight model reaches a full match well within ``MAX_NEW_TOKENS``. ``CONSTANT_RUNS`` marks
the entries with long forced strings, where jump-forward must save forward passes. Regexes use
``[0-9]`` rather than ``\\d``: the DFA's ``\\d`` follows a newer Unicode version than Python's ``re``.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic

MAX_NEW_TOKENS = 256

REGEXES = [
    r"(yes|no|maybe)",
    r"[0-9]{3}-[0-9]{4}",
    r"The answer is (red|blue|green)\.",
    r"[😀-😂]{2,4}",
    r"(café|naïve|東京){1,3}",
    r"[一-龥]{1,4}",
    r"[αβγδ]{1,3}-[а-я]{1,3}",
    r"[a-z]{2,8}@[a-z]{2,6}\.(com|org|net)",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(0|[1-9][0-9]{0,5})(\.[0-9]{1,3})?",
    r"-?[1-9][0-9]{0,2}",
    r"(true|false)",
    r'"([^"\\\n]|\\["\\n]){0,12}"',
    r"[A-Z][a-z]{1,6}( [A-Z][a-z]{1,6}){0,2}",
    r"(https?://)?(www\.)?[a-z]{3,8}\.(com|io)(/[a-z]{1,5}){0,2}",
    r"#[0-9a-f]{6}",
    r"(\+1 )?\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"([01][0-9]|2[0-3]):[0-5][0-9]",
    r"Name: [A-Za-z]{1,10}\nAge: [0-9]{1,3}\nCity: (Paris|London|Tokyo)",
    r"(alpha|beta|gamma|delta)(, (alpha|beta|gamma|delta)){0,3}",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}",
    r"BEGIN-RECORD-0000-CONSTANT-HEADER: (ok|fail) END-OF-RECORD-WITH-A-LONG-CONSTANT-TRAILER",
    r"\[([0-9]{1,2}(, [0-9]{1,2}){0,3})?\]",
    r"(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day",
    r"[0-9]{1,3}(\.[0-9]{1,3}){3}",
]

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "color"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4}, "ok": {"type": "boolean"}}, "required": ["items", "ok"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}, "required": ["id", "tags"]}, "active": {"type": "boolean"}}, "required": ["user", "active"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}, "c": {"type": "string", "maxLength": 3}}},
    {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10}}, "required": ["text"]},
    {"enum": ["a\"b", "c\\d", "line\nbreak", "plain"]},
    {"const": "fixed-value-with-a-long-constant-run"},
    {"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["p"]},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"]}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 100}, {"type": "null"}]},
    {"type": ["integer", "null"], "minimum": -20, "maximum": 20},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "integer", "minimum": -9, "maximum": 9}}, "required": ["x", "y"]}}, "type": "object", "properties": {"start": {"$ref": "#/$defs/pt"}, "end": {"$ref": "#/$defs/pt"}}, "required": ["start", "end"]},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "uuid"},
    {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "boolean"}, {"enum": ["x", "y"]}]},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"type": "object", "properties": {"l1": {"type": "object", "properties": {"l2": {"type": "object", "properties": {"l3": {"enum": ["deep", "deeper"]}, "n": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["l3"]}}, "required": ["l2"]}}, "required": ["l1"]},
    {"enum": ["東京", "café", "😀 smile", "naïve"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": -10, "maximum": -2}}, "required": ["t"]},
]


class Spell(pydantic.BaseModel):
    """A pydantic model class as the schema (Literal → enum, bounded int, optional field)."""

    incantation: str = pydantic.Field(max_length=12)
    school: str = pydantic.Field(pattern=r"^(charm|curse|hex)$")
    level: int = pydantic.Field(ge=1, le=7)
    note: str | None = pydantic.Field(default=None, max_length=4)


SCHEMAS.append(Spell)
# recursion that ends in an integer, cut at lmnb_engine.constrained.schema_refs.MAX_REF_DEPTH levels
SCHEMAS.append({"$defs": {"e": {"type": "object", "properties": {"op": {"enum": ["+", "*"]}, "arg": {"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": 9}, {"$ref": "#/$defs/e"}]}}, "required": ["op", "arg"]}},
    "$ref": "#/$defs/e"})

CONSTANT_RUNS = {
    ("regex", r"BEGIN-RECORD-0000-CONSTANT-HEADER: (ok|fail) END-OF-RECORD-WITH-A-LONG-CONSTANT-TRAILER"),
    ("regex", r"The answer is (red|blue|green)\."),
    ("regex", r"Name: [A-Za-z]{1,10}\nAge: [0-9]{1,3}\nCity: (Paris|London|Tokyo)"),
    ("schema", 6),  # const
    ("schema", 16),  # three levels of nesting
    ("schema", 0),  # keys of a flat object
}


def corpus() -> list[tuple[str, object, str]]:
    """(kind, source, test id) for every entry: kind is "regex" or "schema"."""
    out = [("regex", r, f"regex{i}") for i, r in enumerate(REGEXES)]
    out += [("schema", s, f"schema{i}") for i, s in enumerate(SCHEMAS)]
    return out


def has_constant_runs(kind: str, source: object) -> bool:
    if kind == "regex":
        return (kind, source) in CONSTANT_RUNS
    return ("schema", SCHEMAS.index(source)) in CONSTANT_RUNS


def check_output(kind: str, source: object, text: str) -> None:
    """Assert ``text`` fully matches the regex / is JSON that validates against the schema."""
    if kind == "regex":
        assert re.fullmatch(source, text), f"{text!r} does not match {source!r}"
        return
    schema = source.model_json_schema() if isinstance(source, type) else source
    jsonschema.Draft202012Validator(schema).validate(json.loads(text))
    if isinstance(source, type):
        source.model_validate_json(text)
