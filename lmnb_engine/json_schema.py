"""The JSON Schema meta-schema check of a ``json_schema`` constraint, and values in messages
written as JSON writes them, without torch.

Shared by the engine (``constrained.schema.load_schema``), the language's ``gen(json_schema=...)``,
which runs it where it is called (``lmnb.ir.json_schema_value``), and the ``%%lm`` cell parser,
which runs it on a literal schema before anything runs (``lmnb.template.options``), so all three
word a bad schema alike (``loaded_schema``); the server's and ``lmnb export``'s messages show a
client's values with ``json_value``; and the JSON-pointer steps of a local ``$ref`` (``pointer_parts``,
``child``), shared by the engine's ``$ref`` inlining and the count of a schema's regex copies,
and the refusal of a local ``$ref`` to nothing (``dangling_ref_problem``, ``ref_to_nothing``);
and the refusal of a schema with too many of those copies or of values in its JSON text
(``copies_problem``, asked first). Importing it loads only ``jsonschema``.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
from typing import Any, Callable, Optional
from urllib.parse import unquote

from lmnb_engine.regex_parts import classes_held, unicode_classes

# A value in a schema's error message is cut after this many characters (``json_value``), as
# ``regex_check`` cuts a pattern: a schema's const, enum or pattern can run to megabytes, which the
# message then repeated whole; the message's place (``at #/...``) says where the whole value is.
SHOWN_CHARS = 80

# A schema Python's recursive code (json's encoder and decoder, jsonschema, re's parser) cannot
# walk: some hundreds of levels of nesting, or of a pattern's parentheses.
TOO_DEEP = "JSON schema nests too deeply to check (a pattern's parentheses, or the schema itself); flatten it"


def at_a_unicode_class(error: re.error) -> bool:
    """Whether Python's ``re`` raised ``error`` at a ``\\p``/``\\P`` escape: a Unicode property class
    (``\\p{L}``), which ``re`` lacks and the engine's automaton library reads. Shared by the regex
    checks (``regex_errors.regex_problem``), the schema check below and the ``%%lm`` view's."""
    return error.msg in (r"bad escape \p", r"bad escape \P")


def checked_schema(schema: dict | bool, engine: bool = True) -> dict | bool:
    """A fresh copy of ``schema`` in JSON's own types (tuples built in Python become the arrays
    they mean), checked against the JSON Schema meta-schema of its ``$schema`` draft (2020-12 when
    it names none) with ``jsonschema``. The boolean schema ``true`` (any JSON value) is returned
    as it is. ``engine`` False leaves out the in-process engine's own checks, for the language's
    checks, made before a backend is known: the meta-schema's ``regex`` format check of each
    ``pattern`` is narrowed to syntax errors of every dialect (``_no_dialect_reads``), since which
    dialect a pattern is in is the backend's question (the engine reads Python's; an
    OpenAI-compatible API may take ECMA's ``\\p{Lu}``), so only a pattern no backend could read
    (``a(b``) is refused; and the size check is the JSON text's alone (``copies_problem``), since
    the limit on regex copies is the engine's, which an API or an SGLang server does not build.

    Raises:
        ValueError: the boolean schema ``false`` (valid JSON Schema, which no value passes), a
            value JSON cannot represent, a schema the meta-schema rejects (the message gives
            the location, e.g. ``#/properties/a``; a ``pattern`` Python's ``re`` cannot compile
            is worded by ``_refused_pattern``), or one nested too deeply to check (``TOO_DEEP``),
            or one whose engine regex would hold too many subschema copies, or its JSON text too
            many values (``copies_problem``, asked first), or a local ``$ref`` that points at
            nothing (``dangling_ref_problem``), which every use of the schema would meet.
    """
    if schema is False:
        raise ValueError("JSON schema false accepts no value: no output could validate; pass true or {} "
                         "for any JSON value")
    if schema is True:
        return schema
    import jsonschema

    copies_problem(schema, engine)  # first: the walks below visit each path, 2**30 of a Python-built schema sharing objects
    try:
        schema = json.loads(json.dumps(schema, allow_nan=False))  # NaN and inf are no JSON
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    except (TypeError, ValueError) as e:
        long_int = _long_integer(schema)
        if long_int is not None:  # (json's words: "Exceeds the limit (4300 digits) for integer string conversion")
            from lmnb_engine.params import past_digit_limit, shown_number  # (it imports this module)

            where, value = long_int
            raise ValueError(f"JSON schema at {where} holds {shown_number(value)}, "
                             f"{past_digit_limit(verb='writes')}; give a smaller number") from None
        raise ValueError(_non_finite(schema) or f"json_schema holds a value JSON cannot represent ({e})") from None
    if not isinstance(schema.get("$schema", ""), str):  # validator_for looks it up as a dict key
        raise ValueError("JSON schema at #/$schema must be a string (a draft's URI), not "
                         f"{json_value(schema['$schema'], SHOWN_CHARS)}")
    try:
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema, format_checker=_engine_checker(validator) if engine else _syntax_checker())
    except RecursionError:  # (a pattern whose parentheses nest some hundred levels: Python's re recurses)
        raise ValueError(TOO_DEEP) from None
    except jsonschema.SchemaError as e:
        where = "/".join(["#", *map(str, e.path)])
        if engine and _key_left_to_keyword(e):
            from lmnb_engine.constrained.schema import unsupported_keyword  # (the engine's own words)

            raise ValueError(unsupported_keyword("patternProperties", where.removesuffix("/patternProperties"))) from None
        refused = _refused_pattern(where, e.instance, ecma=not engine) if "is not a 'regex'" in e.message else None
        if refused:
            raise ValueError(refused) from None
        # (jsonschema writes the values it names as Python does: 'x' is not of type 'array', True ...)
        negative = _negative_count(e, where) or _multiple_not_above_0(e, where)
        if negative:
            raise ValueError(negative) from None
        message = (_type_typo(e) or _type_shape(e) or _keyword_type(e)
                   or in_json_words(e.message, json_parts([e.instance, e.validator_value])))
        raise ValueError(f"JSON schema at {where} is not a valid JSON Schema: {message}") from None
    problem = dangling_ref_problem(schema)
    if problem:
        raise ValueError(problem)
    return schema


# What each count keyword counts, for its refusal of a number below 0 (the meta-schema's "nonNegativeInteger")
_COUNTED = {"minLength": "characters", "maxLength": "characters", "minItems": "items", "maxItems": "items",
            "minProperties": "properties", "maxProperties": "properties", "minContains": "matching items",
            "maxContains": "matching items"}


def _negative_count(error: Any, where: str) -> Optional[str]:
    """lmnb's refusal of a count keyword (``maxLength``, ``minItems``, ...; ``_COUNTED``) below 0,
    at any depth (the meta-schema's ``error`` at ``where``), or None: jsonschema's own words were
    "-1 is less than the minimum of 0", naming neither what is counted nor the fix."""
    key = error.path[-1] if error.path else None
    if error.validator != "minimum" or key not in _COUNTED or not isinstance(error.instance, (int, float)):
        return None
    from lmnb_engine.params import shown_number  # (it imports this module)

    return (f"JSON schema at {where} is {shown_number(error.instance)}, a number of {_COUNTED[key]} below 0; "
            f"give 0 or more, or leave {key} out")


def _multiple_not_above_0(error: Any, where: str) -> Optional[str]:
    """lmnb's refusal of a ``multipleOf`` of 0 or below (the meta-schema's ``error`` at ``where``),
    with the fix (``_number_fix``), or None: jsonschema's words were "0 is less than or equal to
    the minimum of 0"."""
    key = error.path[-1] if error.path else None
    if (key != "multipleOf" or error.validator not in ("exclusiveMinimum", "minimum")
            or isinstance(error.instance, bool) or not isinstance(error.instance, (int, float))):
        return None
    return (f"JSON schema at {where} is not a valid JSON Schema: \"multipleOf\" is {json_value(error.instance)}"
            f"{_number_fix(error.instance, key, ['number'])}")


def _long_integer(schema: Any) -> Optional[tuple[str, int]]:
    """The place (``#/maximum``) and value of the first int in ``schema`` (dicts, lists and tuples
    as built in Python) of more digits than Python writes (``params.digits_over_limit``), which
    ``json.dumps`` refuses, or None."""
    from lmnb_engine.params import decimal_digits, digits_over_limit  # (it imports this module)

    return _first_value(schema, lambda v: isinstance(v, int) and not isinstance(v, bool)
                        and digits_over_limit(decimal_digits(v)))


def _non_finite(schema: Any) -> Optional[str]:
    """lmnb's refusal of the first NaN or infinity in ``schema`` (``{"maximum": float("nan")}``,
    or JSON text's ``NaN``, which Python's json reads), naming its place and the fix, or None: it
    said "json_schema holds a value JSON cannot represent (Out of range float values are not JSON
    compliant)", naming neither."""
    found = _first_value(schema, lambda v: isinstance(v, float) and not math.isfinite(v))
    if found is None:
        return None
    where, value = found
    parent, key = where.split("/")[-2:] if where.count("/") > 1 else ("", where.split("/")[-1])
    word = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    bound = key in _BOUNDS and parent not in ("properties", "enum", "const")  # (not a property so named)
    leave = f", or leave {json_value(key)} out for no bound" if bound else ""
    return f"JSON schema at {where} is {word}, which is no JSON number; write a number{leave}"


def _first_value(schema: Any, wanted: Callable[[Any], bool]) -> Optional[tuple[str, Any]]:
    """The place (``#/maximum``) and value of the first value in ``schema`` (dicts, lists and
    tuples as built in Python) that is ``wanted``, in the order they stand, or None. Each
    container is looked in once: one that holds itself (which ``json.dumps`` refuses too) is no
    endless walk."""
    todo: list[tuple[str, Any]] = [("#", schema)]
    seen: set[int] = set()
    while todo:
        where, value = todo.pop()
        if wanted(value):
            return where, value
        if not isinstance(value, (dict, list, tuple)) or id(value) in seen:
            continue
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        todo += reversed([(f"{where}/{key}", item) for key, item in items])  # (popped in the order they stand)
    return None


def _key_left_to_keyword(error: Any) -> bool:
    """Whether the meta-schema's ``error`` refuses a ``patternProperties`` key that the language's
    check takes (``_syntax_checker``): the engine, which does not enforce that keyword, refuses
    the keyword for it, as it would next (its words for the key offered ``ab`` for ``a[]{0}b``, and
    the schema so written was refused for the keyword); removing the keyword is a fix wherever it stands."""
    return (error.validator == "format" and list(error.path)[-1:] == ["patternProperties"]
            and _syntax_checker().conforms(error.instance, "regex"))


_MISSING = object()  # (``child``: no such step)


def pointer_parts(ref: str) -> list[str]:
    """The JSON-pointer steps of a local ``$ref`` (after its ``#``), unescaped (RFC 6901 and percent)."""
    fragment = unquote(ref.partition("#")[2])
    return [p.replace("~1", "/").replace("~0", "~") for p in fragment.split("/")[1:]]


def child(node: Any, part: str) -> Any:
    """One pointer step into an object or array; ``_MISSING`` where there is nothing."""
    if isinstance(node, dict):
        return node.get(part, _MISSING)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _MISSING


def ref_to_nothing(ref: str, where: str, step: int, container: Any) -> str:
    """Why the local ``$ref`` ``ref`` at ``where`` (``#/properties/p``) cannot be followed: step
    ``step`` of its pointer (``pointer_parts``) finds nothing in ``container``, the object or array
    the steps before it reached; a reference to a definition (``#/$defs/NAME``) names the definition,
    and the name in ``container`` closest to the missing one that holds a schema or more is
    offered. Said by ``dangling_ref_problem`` (where ``gen()`` is called) and by the engine's
    ``$ref`` inlining (``schema_refs.inline_refs``) alike."""
    import difflib

    parts = pointer_parts(ref)
    part = parts[step]
    names = [k for k, v in container.items() if isinstance(v, (dict, list))] if isinstance(container, dict) else []
    close = difflib.get_close_matches(part, names, n=1)
    meant = f"; did you mean {json_value(close[0], SHOWN_CHARS)}?" if close else ""
    if parts[0] in ("$defs", "definitions") and len(parts) > 1 and step <= 1:
        missing = (f"no definition {json_value(parts[1], SHOWN_CHARS)} under {json_value(parts[0])}"
                   + (f": the schema has no {json_value(parts[0])}" if step == 0 else meant))
    else:
        missing = f"no {json_value(part, SHOWN_CHARS)} there{meant}"
    return (f"JSON schema $ref {json_value(ref, SHOWN_CHARS)} at {where} points at nothing in this schema ({missing}); "
            "fix the reference")


# The keywords whose value is a schema, an object of schemas by name, or an array of schemas: JSON
# Schema 2020-12's applicators, with draft 7's array form of "items", "additionalItems" and
# "dependencies" (whose values may also be arrays of names: no schema, skipped). "$defs" and
# "definitions" are not among them: a definition is reached through the $ref that names it.
_ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SCHEMAS_BY_NAME = ("properties", "patternProperties", "dependentSchemas", "dependencies")
_SCHEMA_ARRAYS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def dangling_ref_problem(schema: Any) -> Optional[str]:
    """Why ``schema`` (JSON's types, checked against the meta-schema) cannot be used: a local
    ``$ref`` (a JSON pointer after ``#``, with no document before it or the root's ``$id``) at a
    place that holds a schema, reached from the root through the applicator keywords and the
    ``$ref``s followed, that points at nothing (``ref_to_nothing``'s words); else None. The engine
    refused it only once the gen ran, as it inlined the reference; other references (another
    document, an anchor, and any reference inside a subschema with an ``$id`` of its own, an
    embedded resource against which its ``#...`` references resolve, 2020-12 core section 9.2.1)
    are the backend's to read. The first met is named (depth first, a reference's target before
    the keywords beside it); each object is walked once, without recursion (a schema as deep as the
    meta-schema check took)."""
    if not isinstance(schema, dict):
        return None
    root_id = schema.get("$id")
    base = root_id.partition("#")[0] if isinstance(root_id, str) else ""
    # (each with whether it lies in an embedded resource: a subschema below the root with an $id, whose
    # "#/$defs/b" means its own $defs, not the root's)
    todo, seen = [(schema, "#", False)], set()
    while todo:
        node, where, embedded = todo.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        embedded = embedded or (node is not schema and isinstance(node.get("$id"), str))
        inside = []
        ref = node.get("$ref")
        doc, _, fragment = ref.partition("#") if isinstance(ref, str) else ("", "", "")
        pointer = unquote(fragment)
        if isinstance(ref, str) and not embedded and doc in ("", base) and (not pointer or pointer.startswith("/")):
            target, passed = schema, False
            for step, part in enumerate(pointer_parts(ref)):
                if child(target, part) is _MISSING:
                    return ref_to_nothing(ref, where, step, target)
                target = child(target, part)
                passed = passed or (isinstance(target, dict) and isinstance(target.get("$id"), str))
            inside.append((target, "#" + pointer, passed))
        for key, value in node.items():
            if key in _ONE_SCHEMA:
                inside.append((value, f"{where}/{key}", embedded))
            if key in _SCHEMAS_BY_NAME and isinstance(value, dict):
                inside += [(sub, f"{where}/{key}/{name}", embedded) for name, sub in value.items()]
            if key in _SCHEMA_ARRAYS and isinstance(value, list):
                inside += [(sub, f"{where}/{key}/{i}", embedded) for i, sub in enumerate(value)]
        todo += reversed(inside)  # (popped in the order they stand)
    return None


def copies_problem(schema: Any, engine: bool = True) -> None:
    """Refuse ``schema`` (a dict or list as built in Python: objects may be shared) where the
    engine's regex of it would hold more than ``MAX_REGEX_COPIES`` subschema copies (with
    ``engine``: the in-process engine's limit, which a backend that builds no regex of ours, an
    OpenAI-compatible API or an SGLang server, does not have), or its JSON text more than
    ``MAX_JSON_VALUES`` values (every backend: the schema is written as JSON to send it), each
    counted once per distinct object (``schema_copies``): a schema holding one object at two places
    of each level, 30 levels deep, is refused at once, in the words of its JSON text (which shares
    nothing), before any walk that visits each of its 2**30 paths (each path is a value of that
    text, so the values alone bound those walks). The copies are asked first (their words name the
    keywords that multiply them); the values count the keywords the regex does not write (``not``,
    ``if``).

    Raises:
        ValueError: ``too_many_copies``'s or ``too_many_values``'s words, or ``TOO_DEEP`` past
            Python's recursion limit.
    """
    from lmnb_engine.schema_copies import too_many_copies, too_many_values  # (it imports this module)

    try:
        problem = (too_many_copies(schema) if engine else None) or too_many_values(schema)
    except RecursionError:
        raise ValueError(TOO_DEEP) from None
    if problem:
        raise ValueError(problem)


@functools.cache
def _syntax_checker():
    """A ``jsonschema`` format checker of the ``regex`` format alone, which refuses a pattern only
    where ``_no_dialect_reads``, ``u_flag_problem``, ``back_reference_problem`` or ``assertion_problem``
    (``checked_schema``'s ``engine`` False)."""
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    checker.checks("regex")(lambda pattern: not (isinstance(pattern, str) and (
        _long_count(pattern) or _no_dialect_reads(pattern) or _no_backend_builds(pattern))))
    return checker


def _long_count(pattern: str, subject: str = "regex") -> Optional[str]:
    """``regex_errors.long_count_problem``: a repeat count of more digits than Python reads, on
    which every check that parses the pattern (``re``'s, the format checkers') raised int()'s
    "Exceeds the limit (4300 digits)" ValueError, not a refusal."""
    from lmnb_engine.regex_errors import long_count_problem  # (it imports modules that import this one)

    return long_count_problem(pattern, subject)


def _no_backend_builds(pattern: str) -> bool:
    """Whether a schema's ``pattern`` is refused by both format checkers: a syntax error under
    ECMA's u flag (``u_flag_problem``), a back-reference (``back_reference_problem``), or what else
    no backend builds (``assertion_problem``)."""
    return bool(_u_flag_reading(pattern) or back_reference_problem(pattern) or assertion_problem(pattern))


@functools.cache
def _engine_checker(validator: type):
    """``validator``'s own format checker (jsonschema's default for its draft) with its ``regex``
    check, a compile by Python's ``re``, refusing too a pattern with a syntax error under ECMA's
    u flag (``u_flag_problem``), a back-reference (``back_reference_problem``), a lookaround or a word
    boundary (``assertion_problem``), as the language's check (``_syntax_checker``) does, and one
    with ECMA's empty class ``[]``, which ``re`` lacks, another class that matches no JSON string
    character or a lone surrogate outside a class (``schema_empty_class``), or a surrogate pair
    ``\\uD83D\\uDE00``, which ``re`` reads as two surrogates (``_surrogate_pair_problem``)."""
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = dict(validator.FORMAT_CHECKER.checkers)
    python_check, raises = checker.checkers["regex"]

    def regex_format(pattern: Any) -> bool:
        import warnings

        if isinstance(pattern, str) and _long_count(pattern):  # (re's parse would raise int()'s ValueError)
            return False

        from lmnb_engine.schema_empty_class import first_matching_nothing  # (it imports this module)

        with warnings.catch_warnings():  # (re's "possible nested set" of "[[": ECMA reads a "[" in a class)
            warnings.simplefilter("ignore", FutureWarning)
            python_reads = python_check(ecma_names_as_python(pattern) if isinstance(pattern, str) else pattern)
        # (ECMA's empty class: re reads [][] as a class of "[" and "]", which ECMA reads as two that match nothing;
        # any other empty class, [^\s\S], which the build met only as a part no character matches)
        return python_reads and not (isinstance(pattern, str) and (
            _no_backend_builds(pattern) or first_matching_nothing(pattern) is not None
            or _surrogate_pair(pattern) is not None))

    checker.checks("regex", raises)(regex_format)
    return checker


# Python's ``re`` errors (``re.error.msg``, its start) that ECMA 262, JSON Schema's own pattern
# dialect, raises too (unbalanced parentheses, a repeat of nothing or of a repeat, {2,1}, [z-a], an
# unclosed class), once ECMA's own syntax is spelled as Python reads it (``_ecma_as_python``):
# others are ECMA syntax that Python lacks, which a backend may read.
_ERRORS_OF_EVERY_DIALECT = ("missing )", "unbalanced parenthesis", "nothing to repeat", "multiple repeat",
                            "min repeat greater than max repeat", "bad character range", "unterminated character set")

_ECMA_GROUP_NAME = re.compile(r"\(\?<([A-Za-z_$][\w$]*)>")
_ECMA_BACKREFERENCE = re.compile(r"\\k<([A-Za-z_$][\w$]*)>")
# Python's named group, (?P<name>: one whose name an earlier one has (ES2025 takes a name again in another
# alternative, where Python's re refuses it, and an error after it) is read as a plain group
_PYTHON_GROUP_NAME = re.compile(r"\(\?P<(\w+)>")
_ECMA_CONTROL = re.compile(r"\\c[A-Za-z]")
# a character by its code point (the u flag's \u{1F600}), or a surrogate pair, one code point under the u flag
_ECMA_CODE_POINT = re.compile(r"\\u\{([0-9A-Fa-f]+)\}")
# (ECMA's \u is a lowercase u, its hex digits of either case: \UD83D is no escape of a surrogate)
_ECMA_SURROGATE_PAIR = re.compile(r"\\u([Dd][89ABab][0-9A-Fa-f]{2})\\u([Dd][C-Fc-f][0-9A-Fa-f]{2})")
# \x or \u without its hex digits: the letter itself (ECMA 262's Annex B, without the u flag)
_ECMA_LONE_LETTER = re.compile(r"\\(x(?![0-9A-Fa-f]{2})|u(?![0-9A-Fa-f]{4}))")


def _ecma_as_python(pattern: str, u_flag: bool = True) -> tuple[str, Callable[[int], int]]:
    """``pattern`` with the ECMA 262 syntax that Python's ``re`` lacks or reads otherwise spelled
    as text that ``re`` reads as the same kind of syntax, so that ``re`` finds the errors after it,
    and the place in ``pattern`` of each index into that text (an index into respelled syntax: the
    syntax's start). A named group ``(?<year>`` is a group and a comment, ``((?#ear)``, and so is
    Python's ``(?P<m>`` after one of that name, ``((?#m)`` (Python's ``re`` refuses the name again,
    before any error after it: ``(?P<m>a)|(?P<m>b)[``); a
    back-reference ``\\k<n>`` a comment, ``(?#n)``; a character escape a Python escape of the same
    character, which matters in a class, where it may end a range: ``\\u{1F600}`` (the u flag's,
    which JSON Schema asks patterns be read with) and a surrogate pair ``\\uD83D\\uDE00`` (one
    code point under that flag) as ``\\U0001F600`` (one past U+10FFFF, which that flag refuses, as
    the letter "u": without the flag, "u" repeated), a control escape ``\\cZ`` by its code in octal
    (``\\32``), and ``\\x`` or ``\\u`` without their hex digits as the letter (as ECMA's Annex B
    reads them; ``\\xHH``, ``\\uHHHH`` and ``\\0`` are Python's too); the empty class ``[]``
    and the class of any character ``[^]`` (to Python, a "]" first in a class is a member) as a
    character and a class (``\\a``, ``[a]``). Only the syntax is kept, not what it matches.
    ``u_flag`` False: as ECMA reads the pattern without that flag (``\\u{41}`` the letter "u" and
    a count, a surrogate pair two characters: ``_u_flag_note``)."""
    out, i, n, in_class = [], 0, len(pattern), False
    starts: list[tuple[int, int, bool]] = []  # per piece of out: its index in the text, in pattern, same length
    written = 0

    def put(text: str, end: int) -> None:
        nonlocal i, written
        starts.append((written, i, len(text) == end - i))
        out.append(text)
        written += len(text)
        i = end

    named: set[str] = set()  # the names of Python's named groups met
    while i < n:
        group = None if in_class else _ECMA_GROUP_NAME.match(pattern, i)
        reference = None if in_class else _ECMA_BACKREFERENCE.match(pattern, i)
        python = None if in_class else _PYTHON_GROUP_NAME.match(pattern, i)
        if group:
            put("((?#" + group.group(1)[1:] + ")", group.end())
        elif python and python.group(1) in named:
            put("((?#" + python.group(1) + ")", python.end())
        elif python:
            named.add(python.group(1))
            put(python.group(), python.end())
        elif reference:
            put("(?#" + reference.group(1) + ")", reference.end())
        elif _ECMA_CONTROL.match(pattern, i):  # (in a class, its own code, in octal: it may end a range)
            put(f"\\{ord(pattern[i + 2]) % 32:02o}" if in_class else "\\01", i + 3)
        elif u_flag and (escape := _code_point_escape(pattern, i)):
            put(*escape)
        elif _ECMA_LONE_LETTER.match(pattern, i):
            put(pattern[i + 1], i + 2)
        elif pattern[i] == "\\":
            put(pattern[i:i + 2], i + 2)
        elif in_class:
            in_class = pattern[i] != "]"
            put(pattern[i], i + 1)
        elif pattern.startswith(("[]", "[^]"), i):
            empty = pattern.startswith("[]", i)
            put("\\a" if empty else "[a]", i + (2 if empty else 3))
        else:
            in_class = pattern[i] == "["
            put(pattern[i], i + 1)

    def place(index: int) -> int:
        """The index into ``pattern`` of ``index`` into the respelled text."""
        if index >= written:
            return n
        at, start, same_length = starts[bisect.bisect_right(starts, (index, n + 1)) - 1]
        return start + (index - at) if same_length else start

    return "".join(out), place


def ecma_names_as_python(pattern: str) -> str:
    """``pattern`` with each of ECMA 262's named group openings ``(?<year>`` (outside escapes and
    classes: ``regex_u_flag.named_groups``) spelled as a plain group holding a comment of the same
    length, ``((?#ear)``, which Python's ``re`` reads (it has no ``(?<name>``). A group's name
    changes no string the pattern matches, so the engine checks and builds a schema's pattern from
    this spelling, and an error after the group keeps its place in the pattern as written.
    Python's ``(?P<name>`` and the rest are left as they are (``\\k<year>`` too: no regular
    language holds a back-reference, ``_refused_pattern`` refuses it)."""
    from lmnb_engine.regex_u_flag import named_groups

    for m in reversed([m for m in named_groups(pattern) if not m.group(1)]):
        pattern = pattern[:m.start()] + "((?#" + m.group(2)[1:] + ")" + pattern[m.end():]
    return pattern


def _code_point_escape(pattern: str, i: int) -> Optional[tuple[str, int]]:
    """(Python's ``\\U`` escape of the code point, where it ends in ``pattern``) for the ECMA code
    point escape at ``pattern[i]``: the u flag's ``\\u{1F600}`` (up to U+10FFFF) or a surrogate
    pair ``\\uD83D\\uDE00``, one code point under that flag; None for any other text."""
    code_point = _ECMA_CODE_POINT.match(pattern, i)
    if code_point and int(code_point.group(1), 16) <= 0x10FFFF:
        return f"\\U{int(code_point.group(1), 16):08X}", code_point.end()
    pair = _ECMA_SURROGATE_PAIR.match(pattern, i)
    if pair:
        high, low = int(pair.group(1), 16), int(pair.group(2), 16)
        return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08X}", pair.end()
    return None


def _code_points_as_python(pattern: str) -> str:
    """``pattern`` with each ECMA code point escape (``_code_point_escape``) spelled as Python's
    ``re`` and ECMA 262 with the u flag both read that code point (``re`` reads ``\\u{`` as an error
    and a pair as two surrogates; ECMA refuses Python's ``\\U``): ``\\uXXXX`` up to U+FFFF, the
    character itself past it (no syntax character); the rest as it is (an escaped backslash kept
    whole)."""
    out, i = [], 0
    while i < len(pattern):
        escape = _code_point_escape(pattern, i)
        if escape:
            code = int(escape[0][2:], 16)
            text, i = (f"\\u{code:04X}" if code <= 0xFFFF else chr(code)), escape[1]
        else:
            text, i = (pattern[i:i + 2] if pattern[i] == "\\" else pattern[i]), i + 1 + (pattern[i] == "\\")
        out.append(text)
    return "".join(out)


def _surrogate_pair(pattern: str) -> Optional[tuple[int, str, int]]:
    """(where it starts, it as written, its code point) of the first surrogate pair escape
    ``\\uD83D\\uDE00`` in ``pattern`` (in a class or out; ``_code_point_escape``) where Python's
    ``re`` reads the pattern with each such escape as ECMA reads it (``code_point_fix``); else None."""
    i = 0
    while i < len(pattern):
        if _ECMA_SURROGATE_PAIR.match(pattern, i) and (escape := _code_point_escape(pattern, i)):
            return (i, pattern[i:escape[1]], int(escape[0][2:], 16)) if code_point_fix(pattern) else None
        i += 2 if pattern[i] == "\\" else 1
    return None


def _surrogate_pair_problem(pattern: str, where: str) -> Optional[str]:
    """The engine's words for the schema ``pattern`` (at ``where``) holding a surrogate pair escape
    (``_surrogate_pair``), one character to ECMA 262 with the u flag and two surrogates to Python's
    ``re``, which reads it here and which no JSON text written as UTF-8 holds (the build said "has a
    part no JSON string character can match here", as if the pattern could not match, and
    ``[a\\uD83D\\uDE00]`` was built as ``[a]``), with its fix (``code_point_fix``); None where it
    holds none."""
    found = _surrogate_pair(pattern)
    if found is None:
        return None
    at, text, code = found
    return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} holds the surrogate pair {text} at position "
            f"{at}, one character, U+{code:04X}, to ECMA 262 with the u flag JSON Schema asks patterns be read with, "
            "but to this engine two lone surrogates, which no JSON text written as UTF-8 holds; "
            f"{code_point_fix(pattern)}")


def code_point_fix(pattern: str) -> Optional[str]:
    """The fix of a schema's ``pattern`` that Python's ``re`` (which the engine and jsonschema read
    it with) reads otherwise than ECMA 262 for its code point escapes only: the pattern with each
    spelled as both read it (``_code_points_as_python``), where ``re`` reads that (how to spell
    them alone where the engine would refuse that pattern for more: ``_engine_builds``); else None."""
    from lmnb_engine.regex_python_error import python_error  # (it imports this module)

    python = _code_points_as_python(pattern)
    if python == pattern or python_error(ecma_names_as_python(python)) is not None:
        return None
    names, python_only = _ecma_named_groups(python), _python_only(python)
    kept = (f" ({names}: ECMA's, which this engine reads and Python's re does not)" if names else "") + (
        f" ({python_only}: Python's, which this engine reads and ECMA does not)" if python_only else "")
    whole = f", the pattern {json_value(python, SHOWN_CHARS)}{kept}" if _engine_builds(python) else ""
    return ("Python's re, which reads a schema's pattern here (jsonschema checks each output with it), has no ECMA "
            "code point escape (\\u{...}, or a surrogate pair \\uD83D\\uDE00): write each as the character itself, "
            f"or as \\uXXXX up to U+FFFF, which both read alike{whole}")


def _ecma_named_groups(pattern: str) -> str:
    """ECMA's named groups in ``pattern`` (``regex_u_flag.named_groups``), for an offer that keeps
    them ("its named group (?<year>...)", "its named groups (?<y>...), (?<m>...)"), or "" where it
    has none: the engine reads them (as plain groups: ``ecma_names_as_python``), Python's ``re``
    does not, so an offer holding one is not read alike by ``re`` and ECMA."""
    from lmnb_engine.regex_u_flag import named_groups

    names = list(dict.fromkeys(f"(?<{m.group(2)}>...)" for m in named_groups(pattern) if not m.group(1)))
    return f"its named group{'s' if len(names) > 1 else ''} {', '.join(names)}" if names else ""


def _python_only(pattern: str) -> str:
    """Python's syntax in ``pattern`` that ECMA 262 lacks (``regex_u_flag.python_only_syntax``), for
    an offer that keeps it ("its (?P<y>...), (?i)"), or "" where it has none: the engine and
    Python's ``re`` read it, ECMA does not, so an offer holding it is not read alike by both."""
    from lmnb_engine.regex_u_flag import python_only_syntax

    found = [s if s.endswith(")") else s + "...)" for s in python_only_syntax(pattern)]
    return f"its {', '.join(found)}" if found else ""


def _engine_builds(python: str) -> bool:
    """Whether the engine builds the schema pattern ``python`` (one Python's ``re`` reads, or with
    ECMA's named groups), so that it may be offered whole: it holds no lookaround, back-reference
    or anchor inside (``regex_errors.unbuilt_feature``), nor case-insensitive matching, ``(?i)`` or
    ``(?i:...)``, which the engine would refuse next (``constrained.json_string``)."""
    from lmnb_engine.regex_errors import unbuilt_feature  # (it imports this module)
    from lmnb_engine.regex_tree import constants, parser, walk

    spelled = ecma_names_as_python(python)
    parsed = parser.parse(classes_held(spelled))  # (read: the offers' callers checked python_error first)
    ignores_case = bool(parsed.state.flags & constants.SRE_FLAG_IGNORECASE) or any(
        op is constants.SUBPATTERN and av[1] & constants.SRE_FLAG_IGNORECASE for op, av in walk(parsed))
    return not ignores_case and unbuilt_feature(spelled) is None


def _ecma_syntax_fix(pattern: str) -> Optional[str]:
    """The fix of a schema's ``pattern`` that is ECMA 262's (JSON Schema's dialect) but that Python's
    ``re`` (which the engine and jsonschema read it with) refuses for ECMA syntax it lacks: the
    class of any character ``[^]`` (to ``re`` a class whose first member is "]", left open),
    written as what both read alike (``[\\s\\S]``), where ``re`` reads the result (ECMA's named
    groups as the engine reads them: ``ecma_names_as_python``; ``[\\s\\S]`` alone where the engine
    would refuse that pattern for more: ``_engine_builds``); else None (ECMA's empty class ``[]``
    is named before: ``schema_empty_class``). The engine said only "unterminated character set",
    "fix the pattern", of such a pattern, valid in JSON Schema."""
    from lmnb_engine.regex_python_error import python_error  # (it imports this module)
    from lmnb_engine.schema_empty_class import ANY, ecma_classes  # (it imports this module)

    out, last = [], 0
    for start, end in ecma_classes(pattern):
        if pattern[start:end] == ANY:
            out += [pattern[last:start], "[\\s\\S]"]
            last = end
    python = "".join(out) + pattern[last:]
    if python == pattern or python_error(ecma_names_as_python(python)) is not None:
        return None
    whole, names, python_only = _engine_builds(python), _ecma_named_groups(python), _python_only(python)
    written = f"the pattern {json_value(python, SHOWN_CHARS)}" if whole else "[\\s\\S] for each [^]"
    # (ECMA's named group kept in the whole pattern: ECMA's and the engine's reading, not re's; Python's
    # syntax kept, (?P<y>, (?i): re's and the engine's, not ECMA's; both: the engine's alone)
    readers = ("which this engine reads" if names and python_only else
               "which ECMA and this engine read alike" if names else "which Python's re and this engine read alike")
    unread = "; ".join(([f"Python's re reads [\\s\\S] so too, but not {names}"] if names else [])
                       + ([f"ECMA reads [\\s\\S] so too, but not {python_only} (Python's)"] if python_only else []))
    alike = f"{readers}: {unread}" if whole and (names or python_only) else "which both read alike"
    return ("it holds syntax of ECMA 262, JSON Schema's dialect, that Python's re, which reads a schema's pattern "
            f"here (jsonschema checks each output with it), lacks: [^] (any character); write {written}, {alike}")


# At most this many syntax errors under the u flag are respelled in the spelling offered
# (``u_flag_problem``): each is found by a pass over the pattern.
MAX_U_FLAG_FIXES = 64


# (the engine's words for a back-reference that a schema pattern's fix would need: as regex_check's)
NO_BACK_REFERENCES = ("constrained decoding cannot do a back-reference, in ECMA's syntax or Python's (patterns "
                      "compile to a finite automaton): repeat the group's pattern instead of referring to it")


def back_reference_words(reference: str, group: str, at: Optional[int], names: Optional[list[str]] = None) -> str:
    """What is wrong with a pattern that has the back-reference ``reference`` (as written: ECMA's
    ``\\k<n>``, ``\\1``, Python's ``(?P=n)``, another dialect's ``\\g<n>``, ``\\k'n'``) to the group
    ``group`` (its name or number) at position ``at`` (None where it is not known), and what to
    write instead, words that follow the pattern: a back-reference matches the very text its group
    matched, which no regular language, and so no automaton the engine builds, can express; where
    ``names`` (the pattern's group names) lacks the name ``group``, that it has no such group.
    Every refusal of a back-reference, by ``gen()`` or the engine, of a ``regex`` or a schema's
    ``pattern``, is worded so."""
    where = "" if at is None else f" at position {at}"
    if names is not None and group not in names and not group.isdigit():
        held = f"its named groups: {', '.join(names)}" if names else "it names no group"
        return (f"has a back-reference {reference}{where} to a group {group}, which the pattern does not have ({held}); "
                f"even with such a group, {NO_BACK_REFERENCES}")
    return (f"has a back-reference {reference}{where}: it matches again the very text the group {group} matched, which "
            f"no regular language expresses; {NO_BACK_REFERENCES}")


def pattern_subject(where: str) -> str:
    """What a refusal of a schema's ``pattern`` calls it before its text (``json_value(pattern,
    SHOWN_CHARS)``): "JSON schema at #/properties/a/pattern: the pattern", ``where`` being the JSON
    pointer of its ``pattern`` keyword. Every such refusal, here or by the regex checks' builders
    (their ``subject``: ``regex_errors.unsupported_words``, ``constrained.regex_check``), opens so."""
    return f"JSON schema at {where}: the pattern"


def back_reference_problem(pattern: str, where: str = "#/pattern") -> Optional[str]:
    """The engine's words for the schema ``pattern``'s first back-reference (at ``where``, its
    ``pattern`` keyword's place), or None where it has none: ECMA's ``\\k<n>`` or another dialect's
    (``\\g<n>``, ``\\k'n'``: ``regex_u_flag.other_back_reference``), else one by number,
    ``\\1``, or Python's ``(?P=n)``, as Python's parser reads the pattern once its ECMA syntax is
    spelled as Python's (``_ecma_as_python``: a named group stays a group, so its number holds;
    ``regex_references.first_back_reference``), each in ``back_reference_words``. No backend can
    constrain output with one (no regular language holds it), so ``gen()`` refuses it as the
    engine does. A pattern Python's parser cannot read then is left to the other checks."""
    from lmnb_engine.regex_references import first_back_reference  # (it imports this module)
    from lmnb_engine.regex_tree import quiet_parse
    from lmnb_engine.regex_u_flag import named_back_reference, named_groups, other_back_reference

    named = min(filter(None, (named_back_reference(pattern), other_back_reference(pattern))), default=None,
                key=lambda m: m.start())
    if named:
        names = list(dict.fromkeys(m.group(2) for m in named_groups(pattern)))
        return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} "
                f"{back_reference_words(named.group(), named.group(1), named.start(), names)}")
    spelled, place = _ecma_as_python(pattern)
    parsed = quiet_parse(classes_held(spelled))
    if parsed is None:
        return None
    found = first_back_reference(parsed, spelled)
    if found is None:
        return None
    found = found[0], found[1], None if found[2] is None else place(found[2])
    return f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} {back_reference_words(*found)}"


def assertion_problem(pattern: str, where: str = "#/pattern") -> Optional[str]:
    """The engine's words for the schema ``pattern``'s first lookbehind or word boundary
    (``regex_errors.assertion_problem``), else its first lookahead
    (``regex_errors.lookahead_problem``), else its first atomic group (``regex_errors.backtracking_problem``:
    ECMA's u flag refuses a possessive quantifier and a conditional already, ``u_flag_problem``, but
    not ``(?>``), as a ``regex`` constraint's are asked (at ``where``, its
    ``pattern`` keyword's place), as Python's parser reads the pattern once its ECMA syntax is
    spelled as Python's (``_ecma_as_python``), or None where it has none or that parser cannot read
    it, which the other checks name. No backend builds one: ``gen()`` refuses it as the engine does."""
    from lmnb_engine.regex_errors import (assertion_problem, backtracking_problem,  # (it imports this module)
                                          lookahead_problem)
    from lmnb_engine.regex_tree import quiet_parse

    parsed = quiet_parse(classes_held(_ecma_as_python(pattern)[0]))
    subject = pattern_subject(where)
    return None if parsed is None else (assertion_problem(parsed, pattern, subject)
                                        or lookahead_problem(parsed, pattern, subject)
                                        or backtracking_problem(parsed, pattern, subject))


# (why the in-process engine refuses a schema pattern's \\p{...} class, and what it takes instead)
_NO_SCHEMA_CLASSES = ("takes no \\p{...} class in a schema (its outputs are made to pass jsonschema's check, which "
                      "reads a pattern with Python's re, which has none): write the characters as a class")
# (what gen() and the engine alike say of an offer that holds a \\p{...} class, which the engine takes in no schema)
_CLASSES_ELSEWHERE = (", where the backend reads \\p{...} in a schema (an OpenAI-compatible API may); the in-process "
                      f"engine {_NO_SCHEMA_CLASSES}")


def u_flag_problem(pattern: str, engine: bool = False) -> Optional[str]:
    """The words for the schema ``pattern``'s first syntax error under ECMA 262's u flag, which JSON
    Schema asks patterns be read with (2020-12 core, section 6.4), or None: an identity escape that
    flag refuses (``regex_u_flag.identity_escape``), offering the pattern with each such character
    unescaped, which means what ECMA reads it as without that flag, and what Python's ``re`` (the
    engine's and jsonschema's reader) reads it as too; else another such error
    (``regex_u_flag.u_flag_error``: a lone ``{``, ``\\c`` before no letter, a back-reference in a
    class ...), with the pattern written to mean what it means without the flag, each such error
    respelled (up to ``MAX_U_FLAG_FIXES``), where it has that meaning, else the patterns the user may
    have meant that the flag reads (``UFlagError.meant``: for ``(?<n>a)\\k``, ``\\k<n>`` and ``k``);
    No back-reference is offered, as constrained decoding cannot do one (``gen()`` refuses it as the
    engine does: ``back_reference_problem``); the words say so and to repeat the group's pattern.
    ``engine``: the in-process engine's words, which offer no ``\\p{...}`` class, which it takes in
    no schema (for ``\\p{Lettr}``: ECMA's closest, ``\\p{Letter}``, named, and that); the language's
    words offer the pattern with it for a backend that reads it, and say the engine takes none.
    Asked by the language's schema check and the engine's alike, so both refuse the same patterns in
    the same words.

    A pattern whose every such error has a reading without the flag (Annex B) that Python's ``re``
    reads it as too (``\\-`` and ``\\%`` as the character, a lone ``{``, ``[\\1]`` as octal 1) is
    taken: every dialect a backend may read it in reads it alike, and such escapes are common in
    schemas written for Python or Pydantic (``^\\d{3}\\-\\d{4}$``), as a validator that falls back to
    Annex B's grammar takes them (corvus-json-schema's ecmaregex). One read otherwise by Python
    (``x\\Z``, ``a{,3}``) or not at all (``\\k``) is refused.

    Each pattern offered is one ``gen()`` and the engine take (``_offer_taken``; one with a
    ``\\p{...}`` class, ``gen()`` alone, and the words say so): for ``(?=a)\\Z``, whose ``(?=a)Z``
    holds the lookahead refused next, they say to write each such character unescaped, offer no
    pattern, and say what the pattern so written is refused for (``_refused_next``), so too for a
    pattern written to mean what it means without the flag (``(?=a)a{,3}``)."""
    reading = _u_flag_reading(pattern)
    if reading is None:
        return None
    found, unescaped, error, instead = reading
    if found is None:
        meant = [(p, what) for p, what in error.meant if _u_flag_reading(p) is None]
        # (no back-reference is offered, in any syntax: gen() refuses one as the engine does, which builds
        # none; nor, by the engine, a \\p{...} class, which it takes in no schema: each would be refused next)
        refs = any("back-reference" in what for _, what in meant)
        classes = [what for p, what in meant if unicode_classes(p)]
        meant = [(p, what) for p, what in meant
                 if not (refs and "back-reference" in what) and not (engine and what in classes) and _offer_taken(p)]
        taken = instead is not None and _offer_taken(instead)
        # (where the fix holds what is refused next, (?=a)a\{,3\}, both are named, with the second's offer)
        then = None if taken or instead is None or meant or refs or classes or error.fix else _refused_next(instead)
        if taken:
            fix = (f"write {json_value(instead, SHOWN_CHARS)}, which means, with the flag too, what ECMA reads it as "
                   f"without it{_CLASSES_ELSEWHERE if unicode_classes(instead) else ''}")
        elif then:
            fix = f"written to mean, with the flag too, what ECMA reads it as without it, {then}"
        else:
            fix = (f"write {', or '.join(f'{json_value(p, SHOWN_CHARS)} for {what}' for p, what in meant)}" if meant
                   else "" if refs or classes else error.fix or "fix the pattern")
        if refs:
            fix += ("; " if meant else "") + NO_BACK_REFERENCES
        # (the offer holds a \p{...} class, which the engine refuses next: the engine's words offer none, and
        # gen()'s, made before the backend is known, say which backends take it; where gen() refuses it for
        # more, (?=a)\p{Letter}, the class is named alone)
        if classes and (engine or not meant):
            are = "are" if classes[0].startswith("the classes") else "is"  # (each misspelt class offered: regex_u_flag)
            fix += (("; " if meant or refs else "") + f"ECMA's closest {are} {classes[0]}"
                    + (f", but this engine {_NO_SCHEMA_CLASSES}" if engine else ""))
        elif classes:
            fix += _CLASSES_ELSEWHERE
        return (f"it has {error.what} at position {error.at}, a syntax error of ECMA 262 with the u flag JSON Schema "
                f"asks patterns be read with (2020-12 core, section 6.4); {fix}")
    at, c = found
    code = " (ECMA's escape of a code point is \\u{...} or \\uXXXX, its u lowercase)" if c == "U" else ""
    taken = _offer_taken(unescaped)
    written = ("write each such character unescaped," if not taken else
               f"write {json_value(unescaped, SHOWN_CHARS)}, each such character unescaped,"
               + (_CLASSES_ELSEWHERE if unicode_classes(unescaped) else ""))
    # (the pattern so written holds what is refused next, (?=a)Z: both named, the second's offer with them)
    then = None if taken else _refused_next(unescaped)
    return (f"it escapes {json_value(c, SHOWN_CHARS)} at position {at}, an identity escape ECMA 262 refuses with the u flag "
            "JSON Schema asks patterns be read with (2020-12 core, section 6.4): there a backslash stands before a "
            f'syntax character (^ $ \\ . * + ? ( ) [ ] {{ }} |), "/", "-" in a class, or an escape it defines; {written} '
            f"as ECMA reads the escape without the flag{code}" + (f"; so written, {then}" if then else ""))


def _refused_next(offer: str) -> Optional[str]:
    """Why the fix ``offer`` of a refused schema pattern, which ``_offer_taken`` does not take, is
    refused, in the words of the check that weighed it (the engine's, or ``gen()``'s for one with a
    ``\\p{...}`` class) after their "JSON schema at #/pattern: ", for a refusal to name both
    problems and offer the second's fix (``(?=a)\\Z``: "the pattern "(?=a)Z" uses a lookahead
    ..."); None where that check takes it (the engine would not build it: ``_engine_builds``).
    They said "fix the pattern", or to unescape the character, of the first alone."""
    try:
        checked_schema({"type": "string", "pattern": offer}, not unicode_classes(offer))
    except ValueError as e:
        return str(e).removeprefix(pattern_subject("#/pattern").removesuffix("the pattern"))
    return None


def _u_flag_reading(pattern: str) -> Optional[tuple]:
    """None where ``u_flag_problem`` takes the schema ``pattern``, else what its words are made of,
    without weighing an offer (the format checks ask it, and ``_offer_taken`` first, so that weighing
    an offer asks for no offer of its own): (the first identity escape the u flag refuses, or None:
    ``regex_u_flag.identity_escape``; the pattern with each such character unescaped; the first other
    syntax error of that, or None: ``regex_u_flag.u_flag_error``; the pattern written to mean what it
    means without the flag, or None where it has no such spelling)."""
    from lmnb_engine.regex_python_error import python_reading  # (it imports this module)
    from lmnb_engine.regex_u_flag import identity_escape, u_flag_error

    found = identity_escape(pattern)
    unescaped = pattern
    while (more := identity_escape(unescaped)) is not None:
        unescaped = unescaped[:more[0]] + unescaped[more[0] + 1:]
    error = u_flag_error(unescaped)
    if found is None and error is None:
        return None
    instead = unescaped if error is None else error.instead
    for _ in range(MAX_U_FLAG_FIXES):  # (each error of the pattern respelled: a{,3} is a\{,3\})
        more = u_flag_error(instead) if instead is not None and identity_escape(instead) is None else None
        if more is None:
            break
        instead = more.instead
    else:
        instead = None
    if instead is not None and (read := python_reading(pattern)) is not None and python_reading(instead) == read:
        return None
    return found, unescaped, error, instead


def _offer_taken(pattern: str, engine: bool = False) -> bool:
    """Whether ``pattern``, written as the fix of a refused schema pattern, may be offered, as
    ``regex_errors.offer_taken`` weighs a ``regex``'s: ECMA's u flag reads it (``_u_flag_reading``),
    and the engine takes it as a schema's (``checked_schema``) and builds it (``_engine_builds``),
    so that no offer is refused next (``(?=a)\\Z`` is not offered ``(?=a)Z``, which holds the
    lookahead) and ``gen()`` and the engine word each refusal alike. One with a ``\\p{...}``
    class, which the engine takes in no schema, is weighed by the language's check alone, for
    words that say it is for a backend that reads it (``_CLASSES_ELSEWHERE``), unless ``engine``
    (the engine's words alone, which offer none)."""
    if _u_flag_reading(pattern) is not None:  # (first: the schema check's words would weigh offers of their own)
        return False
    by_engine = engine or not unicode_classes(pattern)
    try:
        checked_schema({"type": "string", "pattern": pattern}, by_engine)
    except ValueError:
        return False
    return not by_engine or _engine_builds(pattern)


def _no_dialect_reads(pattern: str, u_flag: bool = True) -> bool:
    """Whether ``pattern`` is a syntax error for every dialect a backend may read it in: once its
    ECMA syntax is spelled as Python's (``_ecma_as_python``), one of ``_ERRORS_OF_EVERY_DIALECT``
    for Python's ``re`` (its Unicode classes read as classes, as ``regex_python_error.python_error``
    reads them), and an error for the ``regex`` package too, which reads more (``[\\d-z]``):
    ``a(b``, ``(?<year>\\d{4})-(\\d{2}``, ``[a``. A pattern too deep or too large for either to
    tell is taken; the backend has the last word on it. ``u_flag``: as ``_ecma_as_python``'s."""
    import warnings

    import regex


    spelled, _ = _ecma_as_python(pattern, u_flag)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                re.compile(classes_held(spelled))
                return False
            except re.error as e:
                if not e.msg.startswith(_ERRORS_OF_EVERY_DIALECT):
                    return False
            regex.compile(spelled)
    except regex.error:
        return True
    except (RecursionError, OverflowError):
        pass
    return False


def _refused_pattern(where: str, pattern: Any, ecma: bool = False) -> str | None:
    """Why the schema's ``pattern`` (at ``where``, e.g. ``#/properties/a/pattern``), which the
    meta-schema's ``regex`` format check refused, cannot be taken, or None where that is not
    known: a syntax error, worded and placed as a ``regex`` constraint's
    (``regex_python_error.python_error``, its Unicode classes read as classes), or a Unicode class
    (``\\p{L}``): valid JSON Schema, whose patterns are ECMA's, but jsonschema, whose check every
    output is made to pass, reads a pattern with Python's ``re``, which has no such classes.
    ``ecma``: the error is found once its ECMA syntax is spelled as Python's (``_ecma_as_python``,
    which keeps positions), as ``_no_dialect_reads`` found it. The language's refusals come first,
    in its words, for the engine too (``ecma`` False): PCRE's quoting, another dialect's code point
    escape (``_code_point_problem``), an error of every dialect, then one of ECMA's u flag
    (``u_flag_problem``), so the engine refuses each pattern ``gen()`` refuses as it does; then a
    back-reference (``back_reference_problem``), a lookaround or a word boundary
    (``assertion_problem``), which no backend builds."""
    from lmnb_engine.regex_python_error import python_error  # (it imports this module)
    from lmnb_engine.regex_u_flag import other_back_reference
    from lmnb_engine.schema_empty_class import empty_class_problem  # (it imports this module)

    if not isinstance(pattern, str):
        return None
    long_count = _long_count(pattern, pattern_subject(where))  # (first: every reading of it raised int()'s error)
    if long_count:
        return long_count
    named = f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)}"
    # the language's refusals first, in its words, for the engine too: an error of every dialect,
    # then one of ECMA's u flag; then, for the engine, Python's own errors
    every = _no_dialect_reads(pattern)
    # (a back-reference in another dialect's syntax, \\g<n> or \\k'n', first: the u flag's words read it as an
    # identity escape and offered it as literal text, "g<n>")
    if not every and other_back_reference(pattern):
        return back_reference_problem(pattern, where)
    quoting = _quoting_problem(pattern, where)  # (first: the u flag's words offered the quote's letters, "Qa.bE")
    if quoting:
        return quoting
    # (before the u flag's words, which offered the escape's letters, "[U00010330-U0001034f]", other characters)
    code_points = _code_point_problem(pattern, where)  # (before every: Annex B reads [\x{41}-\x{5A}] as a bad range)
    if code_points:
        return code_points
    escape = None if every else u_flag_problem(pattern, engine=not ecma)
    if escape:
        return f"{named} cannot be read as JSON Schema reads it: {escape}"
    # (a back-reference, a lookaround or a word boundary, which no backend builds: gen() refuses them as the engine
    # does, before Python's own errors, which fix no such pattern: ECMA takes (?<=a+), where re wants a fixed width)
    reference = None if every else back_reference_problem(pattern, where) or assertion_problem(pattern, where)
    if reference:
        return reference
    # (a name given twice, which Python's re takes once: gen() leaves it to the backend, as other patterns
    # the regex package reads, ECMA's (?<m>a)|(?<m>b) among them)
    repeated = None if ecma or every else _repeated_name_problem(pattern, where)
    if repeated:
        return repeated
    # (ECMA's empty class, which re lacks: before re's reading, which refuses a[] as a class left open)
    empty = None if ecma or every else empty_class_problem(pattern, where)
    if empty:
        return empty
    ecma = ecma or every
    # (the engine reads ECMA's named groups: ecma_names_as_python, which keeps each error's place)
    problem = (python_error(*_ecma_as_python(pattern), written=pattern) if ecma else
               python_error(ecma_names_as_python(pattern), written=pattern))
    if problem:
        # (ecma: what gen() refuses, which no escape or respelling helps)
        fix = None if ecma else code_point_fix(pattern) or _ecma_syntax_fix(pattern)
        return (f"{named} cannot be compiled: it is not a valid regular expression ({problem}); "
                f"{fix or 'fix the pattern'}{_u_flag_note(pattern) if ecma else ''}")
    pair = None if ecma else _surrogate_pair_problem(pattern, where)
    if pair:
        return pair
    if not unicode_classes(pattern):
        return None  # (re's parser recursed too deeply, or a count it cannot hold: re's own words follow)
    return (f"{named} uses a \\p{{...}} class, which this engine cannot take in a schema: its outputs are made "
            "to pass jsonschema's check, which reads a pattern with Python's re, and re has no such classes; "
            f"{_unicode_class_fix(pattern)}")


def _quoting_problem(pattern: str, where: str) -> Optional[str]:
    """The words for the schema ``pattern`` (at ``where``) holding PCRE's quoting ``\\Q...\\E``
    (``regex_u_flag.pcre_quoting``), as a ``regex``'s are worded (``regex_errors.QUOTING_WORDS``),
    with the pattern its text escaped offered where ``gen()`` and the engine take it
    (``_offer_taken``); None where it has none."""
    from lmnb_engine.regex_errors import QUOTING_WORDS  # (it imports this module)
    from lmnb_engine.regex_u_flag import pcre_quoting

    found = pcre_quoting(pattern)
    if found is None:
        return None
    at, offer = found
    taken = _offer_taken(offer)
    return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} {QUOTING_WORDS.format(at=at)}"
            + (f": write {json_value(offer, SHOWN_CHARS)}" if taken else ""))


def _code_point_problem(pattern: str, where: str) -> Optional[str]:
    """The words for the schema ``pattern`` (at ``where``) holding another dialect's escape of a
    code point (``regex_u_flag.foreign_code_points``: Python's ``\\U00010330``, PCRE's
    ``\\x{10330}``), which ECMA 262 reads as other text without the u flag and refuses with it,
    with the pattern each such escape respelled as ECMA and Python's ``re`` both read that code
    point offered where ``gen()`` and the engine take it (``_offer_taken``; one with a ``\\p{...}``
    class, ``gen()`` alone, and the words say so); else what the pattern so written is refused for
    next (``(?=a)\\U00010330``: the lookahead); None where it has none. The u flag's words offered
    the escape unescaped, ``U00010330``, which means those letters."""
    from lmnb_engine.regex_u_flag import foreign_code_points

    found = foreign_code_points(pattern)
    if found is None:
        return None
    at, escape, written = found
    if _offer_taken(written):
        fix = f"write {json_value(written, SHOWN_CHARS)}, each such escape so" + (
            _CLASSES_ELSEWHERE if unicode_classes(written) else "")
    else:
        then = _refused_next(written)  # (what the pattern so written is refused for)
        fix = "write each such escape so" + (f"; then {then}" if then else "")
    return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} writes a code point as another dialect "
            f"does, {escape} at position {at}, which ECMA 262 (JSON Schema's dialect) reads as other characters "
            "without the u flag and refuses with it; ECMA's escape is \\u{...} or \\uXXXX, but Python's re, which "
            "reads a schema's pattern here, has no \\u{...}: \\uXXXX up to U+FFFF and the character itself past it "
            f"are read alike by both; {fix}")


def _repeated_name_problem(pattern: str, where: str) -> Optional[str]:
    """The engine's words for the schema ``pattern`` (at ``where``) that names two of Python's groups
    alike, ``(?P<m>a)|(?P<m>b)`` (``regex_references.repeated_name``; an ECMA group, ``(?<m>``, the
    engine reads as a plain one: ``ecma_names_as_python``), as a ``regex``'s are worded
    (``repeated_name_words``), the pattern so written offered where the engine takes it
    (``_offer_taken``); None where no such name is repeated. It said only "redefinition of group
    name 'm' as group 2 ...; fix the pattern"."""
    from lmnb_engine.regex_references import repeated_name, repeated_name_words  # (it imports this module)

    found = repeated_name(pattern, ecma=False)
    if found is None:
        return None
    name, places, offer = found
    written = f": write {json_value(offer, SHOWN_CHARS)}" if _offer_taken(offer, engine=True) else ""
    return (f"{pattern_subject(where)} {json_value(pattern, SHOWN_CHARS)} cannot be compiled: "
            + repeated_name_words(name, places, "a schema's pattern here (jsonschema checks each output with it)")
            + written)


# a code-point escape \u{...} (after an even run of backslashes, group 1; its digits, group 2)
_CODE_POINT_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u\{([0-9A-Fa-f]+)\}")


def _unflagged(m: re.Match) -> str:
    """The code-point escape ``m`` written as ECMA reads it without the u flag, for any reader: "u"
    and a count (``u{41}``, a count outside a class and those characters in one), or "u" and the
    characters "{1F600}", whose braces the u flag reads only escaped."""
    digits = m.group(2)
    return m.group(1) + (f"u{{{digits}}}" if digits.isdigit() else f"u\\{{{digits}\\}}")


def _u_flag_note(pattern: str) -> str:
    """For a schema pattern refused as ECMA 262 reads it with the u flag, which JSON Schema asks
    patterns be read with (2020-12, core section 6.4), but valid without it (where ``\\u{41}`` is
    the letter "u" and a count, or those characters in a class, and a surrogate pair two
    characters): that, and, where it holds no surrogate pair (two characters only without the
    flag, which no JSON text holds alone), the pattern as it reads without the flag, written
    for any reader (``_unflagged``); "" for a pattern invalid either way."""
    if _ecma_as_python(pattern, u_flag=False)[0] == _ecma_as_python(pattern)[0] or _no_dialect_reads(pattern, False):
        return ""
    unflagged = json_value(_CODE_POINT_ESCAPE.sub(_unflagged, pattern), SHOWN_CHARS)
    instead = "" if _ECMA_SURROGATE_PAIR.search(pattern) else f"; to mean what it means without the flag, write {unflagged}"
    return (": it is read with ECMA 262's u flag, as JSON Schema asks (\\u{...} as one character, a surrogate pair as one "
            f"code point), and is valid only without that flag{instead}")


# A Unicode class is offered spelled as ranges (``as_ranges``) when it makes at most this many.
MAX_SPELLED_RANGES = 4


def _unicode_class_fix(pattern: str) -> str:
    """How to write the schema pattern ``pattern`` without its Unicode classes: each as the ranges
    of its characters where that is short (a Unicode block, ``\\p{InGreek}``: ``[\\u0370-\\u03ff]``),
    else as a class of the characters meant; and the whole output constrained with ``regex=``
    instead, only where ``regex=`` takes the pattern (Rust's regex has no Unicode blocks)."""
    from lmnb_engine.regex_errors import pattern_problem

    spelled = {cls: as_ranges(cls, ecma=True) for cls in dict.fromkeys(m.group(2) for m in unicode_classes(pattern))}
    if all(spelled.values()):
        fix = "write " + ", ".join(f"{cls} as {ranges}" for cls, ranges in spelled.items())
    else:
        fix = "write the characters as a class (e.g. [A-Z] for ASCII capitals)"
    if pattern_problem(pattern) is None:
        fix += ", or constrain the whole output with regex=, where \\p{...} works"
    return fix


def code_point_runs(cls: str, flags: str = "") -> Optional[list[tuple[int, int]]]:
    """The runs of code points the class ``cls`` holds as the ``regex`` package reads it (with the
    inline ``flags``, e.g. ``"(?V1)"``), as ``[lo, hi)`` pairs in order; None where the package is
    missing or does not read ``cls``. Searches all 0x110000 code points (``_every_code_point``)."""
    try:
        import regex
    except ImportError:
        return None
    try:
        runs = regex.compile(f"{flags}(?:{cls})+")
    except regex.error:
        return None
    return [(m.start(), m.end()) for m in runs.finditer(_every_code_point())]


@functools.lru_cache(maxsize=1)
def _every_code_point() -> str:
    """Every code point, in order: the index of a character is its code point (4.4 MB). Built once:
    a build takes 0.1-0.25 s, which each refused class with a POSIX part took again."""
    return "".join(map(chr, range(0x110000)))


def without_surrogates(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` (``[lo, hi)`` code-point pairs, in order) cut around the surrogates, which no text
    holds and which a class of Python's ``re`` or Rust's regex cannot spell, as inclusive
    ``(lo, hi)`` ranges."""
    return [(lo, hi - 1) for start, end in runs
            for lo, hi in ((start, min(end, 0xD800)), (max(start, 0xE000), end)) if lo < hi]


@functools.lru_cache(maxsize=64)
def as_ranges(cls: str, ecma: bool = False) -> str | None:
    """The Unicode class ``cls`` (``\\p{InGreek}``) as a class of code-point ranges Python's ``re``
    reads (``[\\u0370-\\u03ff]``), its characters as the ``regex`` package reads them (the Unicode
    Character Database; surrogates, which no text holds, left out), or None where that package
    does not read it or the ranges number more than ``MAX_SPELLED_RANGES``. ``ecma``: for a
    schema's pattern, which ECMA 262 with the u flag reads too, a code point above U+FFFF is
    written as the character itself (``\\p{InGothic}``: ``[𐌰-𐍏]``, U+10330 to U+1034F), which both
    read alike: ECMA has no ``\\U00010330``, Python's ``re`` no ``\\u{10330}``."""
    runs = code_point_runs(cls)
    spans = without_surrogates(runs or [])
    if not spans or len(spans) > MAX_SPELLED_RANGES:
        return None

    def code(c: int) -> str:
        return f"\\u{c:04x}" if c <= 0xFFFF else chr(c) if ecma else f"\\U{c:08x}"

    return "[" + "".join(code(lo) if lo == hi else f"{code(lo)}-{code(hi)}" for lo, hi in spans) + "]"


# The names a schema's "type" may take (every draft's simpleTypes).
JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def _type_typo(error: Any) -> Optional[str]:
    """The message for a "type" that names no JSON type (``"intger"``, or one in a list): each such
    name with the closest type, as Python's NameError offers one; None for other errors (the
    meta-schema's ``anyOf`` on "type" says only that the value matches none of its schemas)."""
    import difflib

    names = error.instance if isinstance(error.instance, list) else [error.instance]
    if error.validator != "anyOf" or not error.path or error.path[-1] != "type" or not all(isinstance(n, str) for n in names):
        return None
    wrong = [n for n in names if n not in JSON_TYPES]
    if not wrong:  # (a list's fault is elsewhere, e.g. a name twice)
        return None
    said = []
    for name in wrong:
        close = difflib.get_close_matches(name.lower(), JSON_TYPES, n=1, cutoff=0.6)
        said.append(f"{json_value(name, SHOWN_CHARS)} is not a JSON type"
                    + (f"; did you mean {json_value(close[0])}?" if close else ""))
    return "; ".join(said) + f" (the types: {', '.join(map(json_value, JSON_TYPES))})"


def _type_shape(error: Any) -> Optional[str]:
    """The message for a "type" that is neither a type name nor an array of them (``5``, ``null``,
    an object), an array holding something else (``["string", 5]``), an empty array, or one that
    names a type twice; None for other errors. The meta-schema's ``anyOf`` on "type" said only
    "5 is not valid under any of the given schemas"."""
    if error.validator != "anyOf" or list(error.schema_path)[-2:] != ["type", "anyOf"] or list(error.path)[-1:] != ["type"]:
        return None
    value, types = error.instance, f"the types: {', '.join(map(json_value, JSON_TYPES))}"
    if isinstance(value, list) and not value:
        return f'"type" must name at least one type; [] allows none ({types})'
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        twice = next((name for i, name in enumerate(value) if name in value[:i]), None)
        return f'"type" names {json_value(twice, SHOWN_CHARS)} twice; name each type once' if twice is not None else None
    held = (f"; the array holds {json_value(next(n for n in value if not isinstance(n, str)), SHOWN_CHARS)}, no type "
            "name" if isinstance(value, list) else f", not {json_value(value, SHOWN_CHARS)}")
    return f'"type" must be a type name (a string) or an array of them{held}; e.g. "string" or ["string", "null"] ({types})'


# What each keyword's value is, for the fix of one of the wrong JSON type ("required": "a")
_KEYWORD_VALUES = {
    "format": 'a format name, e.g. "date-time"',
    "pattern": 'a regular expression, e.g. "^[a-z]+$"',
    "required": 'the names of the required properties, e.g. ["name"]',
    "properties": 'each property\'s name and its schema, e.g. {"name": {"type": "string"}}',
    "enum": "the values allowed, e.g. [1, 2]",
}

_JSON_TYPE_WORDS = {"array": "an array", "boolean": "a boolean", "integer": "an integer", "null": "null",
                    "number": "a number", "object": "an object", "string": "a string"}


def _keyword_type(error: Any) -> Optional[str]:
    """The message for a keyword whose value is of the wrong JSON type (``"format": 5``,
    ``"required": "a"``, ``"properties": []``, a name in "required" that is no string): the keyword,
    the JSON type it takes and what it means (``_KEYWORD_VALUES``), and where one value was given
    for an array, that value in one (``["a"]``); None for other errors. jsonschema said only
    '"a" is not of type "array"'."""
    steps, path = list(error.schema_path), list(error.path)
    if error.validator != "type" or not path:
        return None
    wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    takes = " or ".join(_JSON_TYPE_WORDS.get(t, t) for t in wanted)
    given = json_value(error.instance, SHOWN_CHARS)
    if wanted == ["object", "boolean"]:  # (a subschema's place: "items", a property's, a $defs entry)
        return f"a schema must be an object or a boolean (true: any value, false: none), not {given}"
    if steps[-4:-2] == ["properties", path[-2] if len(path) > 1 else None] and steps[-2] == "items" and isinstance(path[-1], int):
        return f"each item of {json_value(path[-2])} must be {takes}; item {path[-1]} is {given}"
    if steps[-3:-1] != ["properties", path[-1]] or not isinstance(path[-1], str):
        return None
    meaning = _KEYWORD_VALUES.get(path[-1])
    fix = f": write [{given}]" if wanted == ["array"] and not isinstance(error.instance, (list, dict)) else ""
    fix = _number_fix(error.instance, path[-1], wanted) or fix
    return f"{json_value(path[-1])} must be {takes}{f' ({meaning})' if meaning else ''}, not {given}{fix}"


# Keywords whose value bounds the value or its size, which a bound left out leaves unbounded
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", *_COUNTED)


def _number_fix(value: Any, key: str, wanted: list) -> Optional[str]:
    """The fix, after the message's "not VALUE", for ``value`` given to the keyword ``key``, which
    takes a number of JSON type ``wanted`` (``["integer"]`` or ``["number"]``): a number in quotes
    (``"3"``, as JSON reads it) or a number of the wrong type (``3.5`` for an integer). Where the
    number is one the keyword takes, the quotes off (``: write "minLength": 3``); else what is
    wrong with it and the fix: a count (``_COUNTED``) below 0, a fraction for an integer (the whole
    numbers on either side), ``multipleOf`` not above 0, NaN and the infinities (Python's json
    reads ``"NaN"``, ``"Infinity"`` and ``"1e400"`` as such; JSON has none of them). None for a
    value that holds no number (``"abc"``). ``"minLength": "3"`` was told only that it must be an
    integer, not "3", and ``"3.5"``, ``"-1"`` and ``"NaN"`` not even what would do."""
    if wanted not in (["integer"], ["number"]) or isinstance(value, bool):
        return None
    number = value
    if isinstance(value, str):
        try:
            number = json.loads(value)
        except ValueError:  # (no JSON, or an integer of more digits than Python reads)
            return None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return None
    name, counted = json_value(key), _COUNTED.get(key)
    leave = f"leave {name} out" + (" for no bound" if key in _BOUNDS else "")
    takes = "a whole number, 0 or more" if counted else "a number above 0" if key == "multipleOf" else "a number"
    if isinstance(number, float) and math.isnan(number):
        return f": NaN is not a number (JSON has no NaN); write {takes}, or {leave}"
    if isinstance(number, float) and math.isinf(number):
        # (a string's: a float inf in the schema itself is refused before, by _non_finite)
        spelt = not isinstance(value, str) or value.strip().lstrip("+-") == "Infinity"
        why = "JSON has no Infinity" if spelt else "it is past the largest number a double holds (about 1.8e308)"
        return f": {why}; write {takes}, or {leave}"
    if counted and number < 0:
        return f": a number of {counted} cannot be negative; write 0 or more, or {leave}"
    if wanted == ["integer"] and isinstance(number, float):
        if not number.is_integer():
            what = f"a number of {counted}" if counted else name
            low = math.floor(number)
            return f": {what} is a whole number; write {name}: {low} or {name}: {low + 1}"
        if abs(number) < 2**53:  # ("3.0": 3, as JSON Schema counts it; a float past 2**53 as written)
            number = int(number)
    if key == "multipleOf" and number <= 0:
        if number == 0:
            return f": it must be above 0 (only 0 is a multiple of 0); write a number above 0, or {leave}"
        return f": it must be above 0; write {name}: {json_value(-number)}, whose multiples are the same"
    return f": write {name}: {json_value(number)}" if isinstance(value, str) else None


def loaded_schema(schema: str | dict | bool, engine: bool = True) -> dict | bool:
    """``checked_schema`` of a ``json_schema`` given as a JSON string (parsed first), a dict or a
    bool (``engine``: as there).

    Raises:
        ValueError: a string that is not JSON, or whose JSON is neither an object nor a boolean
            (an array, a number: no schema), or nests too deeply to read (``TOO_DEEP``), or holds
            an integer of more digits than Python reads, or ``checked_schema``'s refusals.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:  # (json's decoder recurses per level)
            raise ValueError(TOO_DEEP) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON ({e}); pass a dict or a JSON string") from None
        except ValueError:  # (json's words: "Exceeds the limit (4300 digits) for integer string conversion")
            from lmnb_engine.params import long_integer_in_json, past_digit_limit, shown_integer_text  # (it imports this)

            found = long_integer_in_json(schema)
            if found is None:
                raise
            where = "/".join(["#", *map(str, found[0])])
            raise ValueError(f"JSON schema at {where} holds {shown_integer_text(found[1])}, {past_digit_limit()}; "
                             "write a smaller number") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"json_schema must be a JSON object or a boolean, got {json_value(schema, SHOWN_CHARS)}")
    return checked_schema(schema, engine)


def json_value(value: Any, limit: Optional[int] = None) -> str:
    """``value`` as a JSON client writes it (``true``, ``null``, ``"a"``), cut after ``limit``
    characters, with "…", when given. A lone surrogate (no character: it cannot be printed or
    encoded) is written as its escape, ``"\\ud800"``; an int of more digits than Python writes as
    ``params.shown_number`` shows it (``1.000e+5000 (an integer of 5001 digits)``)."""
    try:
        written = json.dumps(value, ensure_ascii=False)
    except ValueError:  # (an int of more digits than Python writes, which JSON writes alike: as Python's messages show it)
        from lmnb_engine.params import shown_number  # (it imports this module)

        written = shown_number(value)
    text = re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", written)
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def json_parts(value: Any) -> list:
    """``value`` and every value inside it: a dict's keys and values, a list's or tuple's items."""
    parts, todo = [], [value]
    while todo:
        v = todo.pop()
        parts.append(v)
        if isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple)):
            todo += v
    return parts


def in_json_words(message: str, values: list) -> str:
    """``message``, which shows ``values`` (the parts of a JSON document: ``json_parts``) as Python
    writes them (``'x'``, ``True``, ``None``, ``{'a': [1]}``), with each as JSON writes it
    (``"x"``, ``true``, ``null``, ``{"a": [1]}``), as a client that wrote JSON reads it, cut after
    ``SHOWN_CHARS`` characters. Numbers are left as they are: both write them alike."""
    shown = {}
    for v in values:
        if v is None or isinstance(v, (str, bool, dict, list, tuple)):
            try:
                shown.setdefault(repr(v), json_value(v, SHOWN_CHARS))  # (a lone surrogate as its escape, as repr has it)
            except (TypeError, ValueError):  # (a Python value JSON has no words for: left as it is)
                pass
    for py in sorted(shown, key=len, reverse=True):  # (a whole object before the strings inside it)
        if py in ("True", "False", "None"):  # (as words: not inside another)
            message = re.sub(rf"\b{py}\b", shown[py], message)
        else:
            message = message.replace(py, shown[py])
    return message
