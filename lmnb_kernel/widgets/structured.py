"""Check a constrained generation's output: JSON against its schema, regex fields, jump-forward.

The checks use the libraries that define the rules, not our own decoder: ``json`` for parsing,
``jsonschema`` (the validator class the schema's ``$schema`` names, Draft 2020-12 by default) for
validity, and ``re`` for regexes; a regex with Unicode property classes (``\\p{Lu}``), which ``re``
lacks, is asked of the engine's own automaton library, outlines-core (``_automaton_accepts``). A
whole-output ``regex`` constraint must
match the entire text (``re.fullmatch``), as SGLang's regex-constrained decoding produces; a
JSON Schema ``pattern`` is unanchored (``re.search``), as JSON Schema §6.3.3 specifies (Python's
``re`` stands in for ECMA-262 regexes; the two agree on the common subset constrained decoders
support).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Mapping, Optional

from lmnb_engine.json_schema import at_a_unicode_class


def path_step(path: str, key: Any) -> str:
    """``path`` (JSONPath: ``$``, ``$.name``, ``$.items[2]``) one step down: ``[2]`` for an array
    index, ``.name`` for a key that is a plain name, else the key quoted as JSON (``$["a.b"]``),
    so every node has its own path: the key "a.b" and the key b under a are told apart, as is the
    key "2" from index 2. The view marks errors on nodes by this path."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if key.isidentifier() and key.isascii() else f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _path_str(path) -> str:
    """The JSONPath (``path_step``) of a sequence of keys and indexes from the root."""
    out = "$"
    for p in path:
        out = path_step(out, p)
    return out


def _pattern_fields(schema: Any, instance: Any, path: tuple = ()) -> list[dict]:
    """Every string in ``instance`` whose subschema (reached through ``properties``, ``items`` and
    ``prefixItems``) has a ``pattern``: ``{"path", "pattern", "value", "match"}``."""
    found: list[dict] = []
    if not isinstance(schema, Mapping):
        return found
    if isinstance(instance, str) and isinstance(schema.get("pattern"), str):
        try:
            ok = re.search(schema["pattern"], instance) is not None
        except re.error as e:
            ok = None
            found.append({"path": _path_str(path), "pattern": schema["pattern"], "value": instance,
                          "match": ok, "error": f"bad pattern: {e}"})
            return found
        found.append({"path": _path_str(path), "pattern": schema["pattern"], "value": instance, "match": ok})
    if isinstance(instance, Mapping):
        for key, sub in (schema.get("properties") or {}).items():
            if key in instance:
                found += _pattern_fields(sub, instance[key], path + (key,))
    elif isinstance(instance, list):
        prefix = schema.get("prefixItems") or []
        for i, item in enumerate(instance):
            sub = prefix[i] if i < len(prefix) else schema.get("items")
            found += _pattern_fields(sub, item, path + (i,))
    return found


def _fullmatch(pattern: str, text: str) -> bool:
    """Whether ``text`` matches all of ``pattern``: with Python's ``re``, or, for a pattern with
    Unicode property classes (``\\p{Lu}``), which ``re`` lacks and the engine reads
    (``lmnb_engine.regex_errors.regex_problem`` takes them), as the engine reads it: by its
    automaton library (``_automaton_accepts``), whose classes (Rust's ``regex``: ``\\p{Age=3.0}``,
    ``\\p{isLu}``, ``[\\p{Lu}&&[^AEIOU]]``) the ``regex`` package reads differently or not at all.
    Where that library is not installed (a kernel that only talks to a remote backend, installed
    without it) or cannot build the pattern, the ``regex`` package reads it. Raises ``re.error``
    for a pattern none of them reads."""
    try:
        return re.fullmatch(pattern, text) is not None
    except re.error as e:
        if not at_a_unicode_class(e):
            raise
        accepted = _automaton_accepts(pattern, text)
        if accepted is not None:
            return accepted
        import regex

        try:
            return regex.fullmatch(pattern, text) is not None
        except regex.error:
            raise e from None


def _automaton_accepts(pattern: str, text: str) -> Optional[bool]:
    """Whether outlines-core, the engine's automaton library, accepts all of ``text`` for
    ``pattern``, built as the engine builds a pattern Python's ``re`` cannot read: respelled
    (``_engine_spelling``) and bare (``lmnb_engine.constrained.grammar.compile_grammar``); or None
    where the library is not installed or refuses the pattern.

    First the text's bytes are walked, one by one, through the pattern's index over a vocabulary
    of every single byte (``_byte_index``: built once per pattern, as the engine caches its
    compile; a build took seconds for a large pattern, paid again at each output's end). A walk
    that ends in a final state is the automaton's own path: accepted. But the library drops a
    one-byte step out of a state where a match could already end (``[0-9]+(\\.[0-9]+)?`` after
    "3" loses the "."), so where the walk fails the text is judged as one token of a vocabulary
    that also has every single byte: the index's state after that token is the automaton's state
    after the text's bytes, and the text is accepted when that state is final. Every output the
    engine constrained with this pattern is accepted (its tokens lead to that same state, which
    allowed EOS); a match the bare automaton prunes (leftmost-first: "Ab" for
    ``\\p{Lu}|\\p{Lu}b``) is refused, as the engine never writes it."""
    try:
        from outlines_core import Index, Vocabulary  # (torch-free)
    except ImportError:
        return None
    spelled = _engine_spelling(pattern)
    index = _byte_index(spelled)
    if index is None:
        return None
    data = text.encode("utf-8", "surrogatepass")  # (a lone surrogate: bytes no pattern matches)
    state = index.get_initial_state()
    for byte in data:
        state = index.get_next_state(state, byte)
        if state is None:
            break
    if state is not None and index.is_final_state(state):
        return True
    tokens = {bytes([b]): [b] for b in range(256)}
    tokens.setdefault(data, []).append(256)
    try:
        index = Index(spelled, Vocabulary(257, tokens))
    except ValueError:
        return None
    state = index.get_initial_state()
    if data:
        state = index.get_next_state(state, 256)
    return state is not None and index.is_final_state(state)


@functools.lru_cache(maxsize=2)
def _byte_index(spelled: str):
    """outlines-core's index of the automaton pattern ``spelled`` over a vocabulary of the 256
    single bytes (token id = the byte), or None where the library refuses the pattern. The last
    two are kept (a batch's outputs share one pattern): an index holds tens of MB for a bounded
    pattern (38 MB for ``[\\p{L}\\p{N}]{1,64}@\\p{L}{1,20}\\.\\p{L}{2,6}``), hundreds for a
    larger one."""
    from outlines_core import Index, Vocabulary

    try:
        return Index(spelled, Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    except ValueError:
        return None


def _engine_spelling(pattern: str) -> str:
    """``pattern`` as the engine hands it to the automaton library (``GrammarBackend.to_regex``):
    anchors at its edges dropped and the rest respelled to keep Python's meaning (``\\w`` holds
    Python's word characters, not Rust's), Unicode classes kept. A pattern the engine refuses
    (``[\\p{Lu}&&[^AEIOU]]``: ambiguous to Python) came from a backend that took it as written,
    so it is returned as written, for the library to read as Rust's ``regex`` does. Loads no torch."""
    from lmnb_engine.constrained.errors import GrammarError
    from lmnb_engine.regex_edges import without_edge_anchors
    from lmnb_engine.constrained.regex_syntax import automaton_syntax

    try:
        return automaton_syntax(without_edge_anchors(pattern))
    except GrammarError:
        return pattern


def check_structured(
    text: str,
    *,
    json_schema: Optional[str | Mapping | bool] = None,
    regex: Optional[str] = None,
    completion_tokens: Optional[int] = None,
    forward_passes: Optional[int] = None,
    jumped_tokens: Optional[int] = None,
) -> dict:
    """Check one constrained output; returns a JSON-ready dict for the view.

    Args:
        text: the generated text (str).
        json_schema: the JSON Schema (dict, JSON string, or JSON Schema's boolean schema ``True``,
            which ``gen(json_schema=True)`` takes) the output was constrained by; pass ``{}`` or
            ``True`` for "any JSON". None when the constraint was a regex only.
        regex: the whole-output regex constraint, if any.
        completion_tokens, forward_passes, jumped_tokens: the request's counts (``RequestMeta``).
            Without jump-forward every generated token costs one decode forward pass, so
            ``passes_saved = completion_tokens - forward_passes`` (paper §4, "jump-forward").

    Returns ``{"text", "kind": "json"|"regex", "valid": bool, "errors": [{"path", "message"}],
    "value" (parsed JSON or None), "patterns": [...], "regex": str|None, "regex_match": bool|None,
    "jump": {"completion_tokens", "forward_passes", "jumped_tokens", "passes_saved"} | None}``.

    Raises ``ValueError`` when neither ``json_schema`` nor ``regex`` is given.
    """
    if json_schema is None and regex is None:
        raise ValueError("check_structured needs json_schema= or regex= (the constraint the output was decoded with)")
    out: dict = {"text": text, "kind": "json" if json_schema is not None else "regex", "valid": True,
                 "errors": [], "value": None, "patterns": [], "regex": regex, "regex_match": None}
    if regex is not None:
        try:
            out["regex_match"] = _fullmatch(regex, text)
        except re.error as e:
            out["errors"].append({"path": "$", "message": f"the regex does not compile: {e}"})
            out["regex_match"] = False
        if not out["regex_match"]:
            out["valid"] = False
            if not out["errors"]:
                out["errors"].append({"path": "$", "message": f"output does not fully match /{regex}/"})
    if json_schema is not None:
        _check_json(text, json_schema, out)
    out["jump"] = None
    if forward_passes or jumped_tokens:
        saved = (completion_tokens - forward_passes) if completion_tokens is not None and forward_passes else None
        out["jump"] = {"completion_tokens": completion_tokens, "forward_passes": forward_passes,
                       "jumped_tokens": jumped_tokens or 0, "passes_saved": saved}
    return out


def _check_json(text: str, json_schema: str | Mapping | bool, out: dict) -> None:
    if isinstance(json_schema, str):
        try:
            schema = json.loads(json_schema)
        except json.JSONDecodeError as e:
            out["valid"] = False
            out["errors"].append({"path": "$", "message": f"the schema is not JSON: {e}"})
            return
    else:  # (a boolean schema is a schema as it is: dict(True) failed and took the cell's view down)
        schema = json_schema if isinstance(json_schema, bool) else dict(json_schema)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        out["valid"] = False
        out["errors"].append({"path": "$", "message": f"not JSON: {e}"})  # (line, column and char)
        return
    except RecursionError:  # json.loads recurses per level: a few thousand nested [ exhaust the stack
        out["valid"] = False
        out["errors"].append({"path": "$", "message": "nested too deeply to parse"})
        return
    out["value"] = value
    import jsonschema  # here, not at import: it takes ~2 s (its format checkers build a grammar)

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        out["valid"] = False
        out["errors"].append({"path": "$", "message": f"the schema is invalid: {e.message}"})
        return
    for err in sorted(cls(schema).iter_errors(value), key=lambda e: list(map(str, e.absolute_path))):
        out["valid"] = False
        out["errors"].append({"path": _path_str(err.absolute_path), "message": err.message})
    out["patterns"] = _pattern_fields(schema, value)
