"""The JSON schema of a pydantic model, written so that every output it allows validates.

pydantic's own ``model_json_schema()`` gives a ``Decimal`` field ``{"anyOf": [{"type": "number"},
{"type": "string"}]}``: the string has no pattern (any text passes JSON Schema, pydantic refuses
``"abc"``), and ``max_digits``/``decimal_places`` appear nowhere, so constrained output validated
against the schema and still failed ``Model.model_validate_json``. Here a ``Decimal`` is

* with ``max_digits`` or ``decimal_places``: a string of plain decimal notation within them (as
  pydantic serializes a Decimal: ``"12.34"``); together with bounds (``ge``, ``lt`` ...), which a
  pattern cannot hold beside digit counts, it is refused;
* otherwise: a JSON number, with the bounds (the bounded number grammar holds them).

Other fields whose pydantic schema allows text the model refuses:

* a ``str`` with ``strip_whitespace`` and ``min_length`` (pydantic counts what stripping leaves)
  starts and ends with no whitespace; with a ``pattern`` (checked on the stripped text too) it is
  refused unless no match of the pattern begins or ends with whitespace;
* a ``bytes`` or ``SecretBytes`` field with ``max_length`` (pydantic counts UTF-8 bytes) is written
  in ASCII, one read as base64 (``val_json_bytes``; pydantic's format follows ``ser_json_bytes``) as
  padded base64;
* a ``ByteSize`` (pydantic's pattern is unanchored at its end and takes any word as the unit) is a
  non-negative integer or a decimal with an optional unit of pydantic's (``"1.5 KiB"``);
* a ``Hashable`` (any value in pydantic's schema) is a string, number, boolean or null: an object
  or array reads as an unhashable dict or list;
* a ``NaiveDatetime`` (pydantic writes plain ``date-time``, whose strings carry an offset it
  refuses) gets the pattern of a date-time without the offset;
* refused with a one-line error: a date, time, datetime or timedelta with bounds (``gt``,
  ``PastDate`` ...; pydantic's schema drops them), a field whose validation aliases are all
  ``AliasPath`` (pydantic's schema names the field, which it refuses), a ``dict`` whose key type the
  schema drops (``int``, ``Literal[1, 2]``), a path checked against the disk (``FilePath``,
  ``NewPath`` ...), and a ``Json`` or ``complex`` field (a string pydantic parses).

Errors name the field (``field 'amount'``; ``field 'Inner.amount'`` in a nested class). Custom
validators (``field_validator``, ``model_validator``, ``AfterValidator`` ...) are code, which no
schema holds: the output is constrained to the schema of the types and ``Field`` constraints
alone, and a validator may still refuse it (``lmnb``'s ``gen(json_schema=Model)`` then validates
the output with the class and fails naming the field).

Torch-free, so ``lmnb`` converts a model class with it before any backend is chosen.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

# RFC 3339 §5.6 full-date: years 0001-9999 (Python's and so jsonschema's range), each month's days,
# 29 February in leap years (divisible by 4, centuries only by 400).
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
DATE = (f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
        f"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
# partial-time: hh:mm:ss, up to 6 fraction digits (no leap second 60: what every validator accepts).
# Here, not in constrained.schema (its formats' source), because a NaiveDatetime needs them torch-free.
CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
# padded base64 whose unused low bits are 0 (pydantic refuses "YR==")
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$"
# a ByteSize string: a decimal (up to 100 digits a side: float() of it times 2**60 stays finite),
# an optional space, an optional unit of pydantic's (b, k ... e, kb, kib, bit, kbit, kibit ...; any case)
BYTE_SIZE_PATTERN = ("^(?:[0-9]{1,100}(?:\\.[0-9]{1,100})?|\\.[0-9]{1,100}) ?"
                     "(?:[kKmMgGtTpPeE](?:[iI]?[bB](?:[iI][tT])?)?|[bB](?:[iI][tT])?)?$")


def pydantic_json_schema(model: type) -> dict:
    """``model.model_json_schema()``, with the fields above tightened.

    Only pydantic's public API is used (the core schema's ``config`` and fields, the generator's
    documented per-type methods), so a pydantic release moving its private helpers changes nothing.

    Args:
        model: a pydantic ``BaseModel`` subclass.

    Raises:
        ValueError: a field refused above, named (``field 'amount': a Decimal field with ...``; a
            field of a nested class as ``Inner.amount``).
    """
    from pydantic import ByteSize
    from pydantic.json_schema import GenerateJsonSchema

    class _Exact(GenerateJsonSchema):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # (class name, core config) of each model, dataclass or TypedDict being written: the
            # config applies to the fields of the innermost one, as pydantic-core applies it
            self.lmnb_owners: list[tuple[str, dict]] = []
            self.lmnb_field_names: dict[int, str] = {}  # id of a field's core schema -> its name

        def lmnb_config(self, key: str, default: Any = None) -> Any:
            """The innermost class's core config value ``key`` (pydantic-core's name)."""
            return self.lmnb_owners[-1][1].get(key, default) if self.lmnb_owners else default

        @contextlib.contextmanager
        def lmnb_owner(self, schema: Any) -> Iterator[None]:
            """Write the fields of a model, dataclass or TypedDict core schema under its name and config."""
            self.lmnb_owners.append((getattr(schema.get("cls"), "__name__", ""), schema.get("config") or {}))
            try:
                yield
            finally:
                self.lmnb_owners.pop()

        def model_schema(self, schema: Any) -> dict:
            with self.lmnb_owner(schema):
                return super().model_schema(schema)

        def dataclass_schema(self, schema: Any) -> dict:
            with self.lmnb_owner(schema):
                return super().dataclass_schema(schema)

        def typed_dict_schema(self, schema: Any) -> dict:
            with self.lmnb_owner(schema):
                self.lmnb_named(schema["fields"])
                return super().typed_dict_schema(schema)

        def model_fields_schema(self, schema: Any) -> dict:
            self.lmnb_named(schema["fields"])
            return super().model_fields_schema(schema)

        def dataclass_args_schema(self, schema: Any) -> dict:
            self.lmnb_named({field["name"]: field for field in schema["fields"]})
            return super().dataclass_args_schema(schema)

        def lmnb_named(self, fields: dict) -> None:
            """Remember the fields' names (so an error names its field); refuse a field whose
            validation aliases are all ``AliasPath``: pydantic's schema then keys it by its name,
            which the model refuses unless it validates by name."""
            for name, field in fields.items():
                self.lmnb_field_names[id(field)] = name
                paths = field.get("validation_alias") if self.mode == "validation" else None
                if isinstance(paths, list) and paths and not isinstance(paths[0], list):
                    paths = [paths]  # (one AliasPath: a path, not a list of them)
                by_name = self.lmnb_config("validate_by_name") or self.lmnb_config("populate_by_name")
                named = isinstance(paths, list) and any(len(p) == 1 and isinstance(p[0], str) for p in paths)
                if isinstance(paths, list) and not named and not by_name:
                    raise ValueError(f"{self.lmnb_field(field)} has only AliasPath validation aliases, which "
                                     f"constrained decoding cannot write (the key {name!r} would be, which the model "
                                     "refuses); add a plain name to its AliasChoices, or set validate_by_name=True")

        def lmnb_field(self, field: Any) -> str:
            """``field 'name'``, or ``field 'Inner.name'`` in a class nested in ``model``."""
            name = self.lmnb_field_names.get(id(field), "?")
            owner = self.lmnb_owners[-1][0] if self.lmnb_owners else ""
            return f"field {name!r}" if owner in ("", model.__name__) else f"field '{owner}.{name}'"

        def lmnb_in_field(self, schema: Any, write: Any) -> dict:
            try:
                return write(schema)
            except ValueError as e:
                if str(e).startswith("field '"):  # (named deeper already)
                    raise
                raise ValueError(f"{self.lmnb_field(schema)}: {e}") from None

        def model_field_schema(self, schema: Any) -> dict:
            return self.lmnb_in_field(schema, super().model_field_schema)

        def dataclass_field_schema(self, schema: Any) -> dict:
            return self.lmnb_in_field(schema, super().dataclass_field_schema)

        def typed_dict_field_schema(self, schema: Any) -> dict:
            return self.lmnb_in_field(schema, super().typed_dict_field_schema)

        def decimal_schema(self, schema: Any) -> dict:
            digits, places = schema.get("max_digits"), schema.get("decimal_places")
            if digits is None and places is None:
                return super().decimal_schema(schema)["anyOf"][0]  # the number with its bounds
            if digits == 0:  # (pydantic counts a lone 0 as a digit: it accepts no value at all)
                raise ValueError("a Decimal field with max_digits=0 accepts no value; give it at least 1")
            bounds = [k for k in ("gt", "ge", "lt", "le", "multiple_of") if schema.get(k) is not None]
            if bounds:
                raise ValueError(
                    f"a Decimal field with max_digits/decimal_places and {'/'.join(bounds)} cannot be "
                    "constrained exactly (a pattern holds the digits, not the bounds); drop one of them"
                )
            return {"type": "string", "pattern": decimal_pattern(digits, places)}

        def str_schema(self, schema: Any) -> dict:
            json_schema = super().str_schema(schema)
            if schema.get("pattern") == ByteSize.byte_string_pattern:
                # ByteSize's string: pydantic's pattern is unanchored at its end ("1kbx" passed it) and
                # takes any word as the unit, which the validator then refuses
                return {**json_schema, "pattern": BYTE_SIZE_PATTERN}
            if not (schema.get("strip_whitespace") or self.lmnb_config("str_strip_whitespace")):
                return json_schema
            if "pattern" in json_schema:
                # pydantic checks the pattern and the lengths on the stripped text: "a " passed ^[a-z ]+$ and
                # was one character for min_length=2; a pattern whose matches never begin or end with
                # whitespace makes the written text the stripped one
                if pattern_can_touch_whitespace(json_schema["pattern"]):
                    raise ValueError(f"a str field with strip_whitespace and the pattern {json_schema['pattern']!r}, "
                                     "which can begin or end with whitespace, cannot be constrained (pydantic checks "
                                     "the pattern and lengths on the stripped text); make the pattern begin and end "
                                     r"with a non-space (e.g. \S), or drop strip_whitespace")
            elif json_schema.get("minLength"):
                # pydantic counts the characters left after stripping: write none to strip (the
                # lengths go into the pattern, which lmnb cannot narrow to them)
                lo, hi = json_schema.pop("minLength"), json_schema.pop("maxLength", None)
                middle = "" if hi == 1 else f"(?:[\\s\\S]{{{max(lo - 2, 0)},{'' if hi is None else hi - 2}}}\\S)"
                json_schema["pattern"] = f"^\\S{middle}{'?' if lo == 1 and middle else ''}$"
            return json_schema

        def dict_schema(self, schema: Any) -> dict:
            json_schema = super().dict_schema(schema)
            keys = schema.get("keys_schema", {"type": "any"})
            while keys["type"].startswith("function-") and "schema" in keys:  # (a validator around the key type)
                keys = keys["schema"]
            if keys["type"] not in ("str", "any") and not {"propertyNames", "patternProperties"} & set(json_schema):
                # pydantic's schema drops such a key type: any string key would be written
                raise ValueError(f"a dict field with {keys['type']} keys cannot be constrained (pydantic's schema "
                                 "allows any string key, which it then refuses); use str keys, or Literal "
                                 "string keys ('1', '2')")
            return json_schema

        def function_after_schema(self, schema: Any) -> dict:
            check = schema["function"]["function"]
            name = getattr(check, "__qualname__", "")
            if name.startswith("PathType.validate_"):  # (FilePath, NewPath ...: NewPath's schema is plain 'path')
                raise ValueError(f"a {name.removeprefix('PathType.validate_')} path field checks the disk, which "
                                 "constrained decoding cannot know (it would write any path); use pathlib.Path")
            json_schema = super().function_after_schema(schema)
            limit = getattr(getattr(check, "func", None), "__name__", "")  # (a functools.partial)
            if limit in ("min_length_validator", "max_length_validator") and _json_type(schema["schema"]) == "bytes":
                # a length around a bytes type (SecretBytes): pydantic counts its bytes, as for bytes
                self.lmnb_bytes_length(json_schema, limit == "max_length_validator")
            return json_schema

        def lmnb_bytes_length(self, json_schema: dict, has_max: bool) -> None:
            if self.lmnb_config("val_json_bytes", "utf8") == "base64":  # (config options of pydantic >= 2.11)
                raise ValueError("a bytes field read as base64 (val_json_bytes) with min_length/max_length "
                                 "cannot be constrained (they count the decoded bytes); drop them")
            if has_max:  # pydantic counts the UTF-8 bytes, maxLength the characters: ASCII makes them one
                json_schema["pattern"] = "^[\\x00-\\x7f]*$"

        def custom_error_schema(self, schema: Any) -> dict:
            if schema.get("custom_error_type") == "is_hashable":
                # pydantic's schema for Hashable is any value; a JSON object or array reads as an
                # unhashable dict or list, which it refuses
                return {"type": ["string", "number", "boolean", "null"]}
            return super().custom_error_schema(schema)

        def json_schema(self, schema: Any) -> dict:
            raise ValueError("a Json field holds JSON text inside a string, which constrained decoding cannot "
                             "shape (any string would be written); give the field the inner type instead")

        def complex_schema(self, schema: Any) -> dict:
            raise ValueError("a complex field is a string in Python's complex() syntax, which constrained decoding "
                             "does not write (any string would be); use two float fields")

        def bytes_schema(self, schema: Any) -> dict:
            # (pydantic's format follows ser_json_bytes; validation reads val_json_bytes)
            json_schema = {k: v for k, v in super().bytes_schema(schema).items() if k != "format"}
            if "minLength" in json_schema or "maxLength" in json_schema:
                self.lmnb_bytes_length(json_schema, "maxLength" in json_schema)
            elif self.lmnb_config("val_json_bytes", "utf8") == "base64":
                json_schema["pattern"] = BASE64_PATTERN
            return json_schema

        def datetime_schema(self, schema: Any) -> dict:
            _refuse_temporal_bounds(schema)
            if schema.get("tz_constraint") == "naive":
                return {"type": "string", "pattern": f"^{DATE}T{CLOCK}$"}  # (date-time's, without the offset)
            if isinstance(schema.get("tz_constraint"), int):
                raise ValueError("a datetime field fixed to one UTC offset (TzInfo constraint) cannot be constrained "
                                 "(any offset would be written); use datetime or AwareDatetime")
            return super().datetime_schema(schema)

        def date_schema(self, schema: Any) -> dict:
            return _refuse_temporal_bounds(schema) or super().date_schema(schema)

        def time_schema(self, schema: Any) -> dict:
            return _refuse_temporal_bounds(schema) or super().time_schema(schema)

        def timedelta_schema(self, schema: Any) -> dict:
            return _refuse_temporal_bounds(schema) or super().timedelta_schema(schema)

    return model.model_json_schema(schema_generator=_Exact)


def _json_type(schema: Any) -> str:
    """The core schema type JSON input is validated by, under wrappers (``SecretBytes``: a
    lax-or-strict of json-or-python of an after-validator of ``bytes``)."""
    while True:
        inner = {"lax-or-strict": "lax_schema", "json-or-python": "json_schema"}.get(schema["type"], "schema")
        if inner not in schema or not (schema["type"] in ("lax-or-strict", "json-or-python")
                                       or schema["type"].startswith("function-")):
            return schema["type"]
        schema = schema[inner]


# pydantic-core's str_strip_whitespace trims what Rust's str::trim does: Unicode White_Space
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


def pattern_can_touch_whitespace(pattern: str) -> bool:
    """Whether some string matching ``pattern`` (whole, as the decoder writes it) begins or ends
    with whitespace, found with the ``regex`` package's partial matching (forwards, and in reverse
    for the end). A pattern it cannot read counts as one that can."""
    import regex

    try:
        forwards, backwards = regex.compile(pattern), regex.compile(pattern, regex.REVERSE)
    except regex.error:
        return True
    return any(forwards.fullmatch(c, partial=True) or backwards.fullmatch(c, partial=True) for c in _WHITE_SPACE)


def _refuse_temporal_bounds(schema: Any) -> None:
    """Refuse a date, time, datetime or timedelta core schema with bounds (``gt``, ``le`` ...) or
    ``now_op`` (``PastDate``, ``FutureDatetime``): its format would write values outside them."""
    bounds = [k for k in ("gt", "ge", "lt", "le", "now_op") if schema.get(k) is not None]
    if bounds:
        what = "past/future" if bounds == ["now_op"] else "/".join(bounds)
        raise ValueError(f"a {schema['type']} field with {what} bounds cannot be constrained (its format would "
                         f"write {schema['type']}s outside them); drop the bounds and check them after generation")


def decimal_pattern(max_digits: int | None, decimal_places: int | None) -> str:
    """Regex of the plain decimals (``-12.34``; no exponent, no leading or trailing zeros) with at
    most ``max_digits`` digits, ``decimal_places`` of them after the point (one of the two may be
    None: no limit), counted as pydantic counts them (the ``0`` of ``0.5`` is no digit)."""
    places = max_digits if decimal_places is None else decimal_places
    if max_digits is None:
        return f"^-?(?:0|[1-9][0-9]*){_fraction(places)}$"
    whole_room = max_digits - (decimal_places or 0)
    # pydantic counts a lone 0 as a whole digit but not the 0 of 0.5
    alternatives = ["0" + _fraction(min(max_digits, places), optional=whole_room > 0)]
    for whole in range(1, whole_room + 1):
        alternatives.append("[1-9]" + "[0-9]" * (whole - 1) + _fraction(min(max_digits - whole, places)))
    return "^-?(?:" + "|".join(alternatives) + ")$"


def _fraction(room: int, optional: bool = True) -> str:
    """Up to ``room`` digits after the point, the last not 0 (``room`` 0: no point)."""
    if room <= 0:
        return ""
    return f"(?:\\.[0-9]{{0,{room - 1}}}[1-9])" + ("?" if optional else "")
