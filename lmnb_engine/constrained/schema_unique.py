"""``uniqueItems`` over listed item values: pydantic's ``set[Literal["a", "b"]]``, ``set[SomeEnum]``,
``frozenset[bool]``.

outlines-core ignores ``uniqueItems`` (``["a", "a"]`` got through), and no regular language holds
"no two items equal" over open item types. Over a finite list of item values it does: the output
is a subsequence of the list, each value at most once, in the listed order. JSON Schema does not
care about the order, so every output validates; only arrays in another order are never written
(as ``propertyNames`` writes a map's keys in the listed order).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from lmnb_engine.constrained.errors import GrammarError

# The most item values of the subsequence regex (its text grows with the square of the count).
MAX_UNIQUE_VALUES = 64
# The most arrays written out one by one where minItems/maxItems narrow the count.
MAX_COUNTED_ARRAYS = 1000
_LISTING_KEYS = {"enum", "const", "type"}


def listed_item_values(items: Any, annotations: set[str]) -> list[Any] | None:
    """The values an ``items`` schema allows, if it lists them: ``enum``/``const`` (with an
    optional ``type`` and annotations), or a ``type`` of ``boolean``/``null`` alone; None if it
    does not. Values the schema's own ``type``/``enum``/``const`` reject are dropped (checked by
    jsonschema), and values JSON Schema holds equal (``1`` and ``1.0``, ``[1]`` and ``[1.0]``, not
    ``1`` and ``true``) are kept once."""
    if not isinstance(items, dict) or not all(k in _LISTING_KEYS or k in annotations for k in items):
        return None
    if "const" in items:
        values = [items["const"]]
    elif "enum" in items:
        values = list(items["enum"])
    else:
        types = [items["type"]] if isinstance(items.get("type"), str) else list(items.get("type") or ["?"])
        if not set(types) <= {"boolean", "null"}:
            return None
        values = [False, True] * ("boolean" in types) + [None] * ("null" in types)
    import jsonschema

    valid = jsonschema.Draft202012Validator({k: v for k, v in items.items() if k in _LISTING_KEYS}).is_valid
    kept, seen = [], set()
    for v in values:
        key = _json_key(v)
        if valid(v) and key not in seen:
            seen.add(key)
            kept.append(v)
    return kept


def _json_key(value: Any):
    """A hashable key equal for values JSON Schema calls equal: numbers by value (1 and 1.0, also
    inside arrays and objects), booleans apart from numbers, objects whatever their key order."""
    if isinstance(value, bool) or value is None:
        return ("const", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _json_key(v)) for k, v in value.items()))
    return ("string", value)


def unique_items_regex(values: list[Any], min_items: int, max_items: int | None, whitespace: str,
                       where: str) -> str:
    """Regex of the JSON arrays of ``min_items`` to ``max_items`` (None: any) of ``values``, each
    at most once, in the listed order; ``whitespace`` is the pattern between JSON tokens.

    Raises:
        GrammarError: too few values for ``min_items``, more than ``MAX_UNIQUE_VALUES`` values, or
            more than ``MAX_COUNTED_ARRAYS`` arrays where the counts narrow them."""
    n = len(values)
    top = n if max_items is None else min(max_items, n)
    if min_items > top:
        raise GrammarError(f"JSON schema at {where} has uniqueItems over {n} distinct item value(s) and "
                           f"minItems {min_items}: no array fits; lower minItems or list more values")
    if n > MAX_UNIQUE_VALUES:
        raise GrammarError(f"JSON schema at {where} has uniqueItems over {n} item values, above the limit of "
                           f"{MAX_UNIQUE_VALUES}; use a list (drop uniqueItems) or list fewer values")
    texts = [re.escape(json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for v in values]
    comma = f"{whitespace},{whitespace}"
    if min_items <= 1 and top == n:
        # a first value, then each later one or not: the subsequences of every length from 1
        body = "|".join(texts[i] + "".join(f"(?:{comma}{t})?" for t in texts[i + 1:]) for i in range(n))
        body = f"(?:{body})" + ("?" if min_items == 0 else "")
    else:
        count = sum(math.comb(n, k) for k in range(min_items, top + 1))
        if count > MAX_COUNTED_ARRAYS:
            raise GrammarError(f"JSON schema at {where} has uniqueItems with minItems/maxItems that leave {count} "
                               f"arrays of its {n} item values, above the limit of {MAX_COUNTED_ARRAYS}; drop "
                               "minItems/maxItems or uniqueItems")
        arrays = [comma.join(texts[i] for i in chosen) for k in range(min_items, top + 1)
                  for chosen in itertools.combinations(range(n), k)]
        body = "(?:" + "|".join(arrays) + ")"
    return f"\\[{whitespace}{body}{whitespace}\\]"
