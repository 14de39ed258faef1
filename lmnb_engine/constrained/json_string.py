"""A JSON Schema ``pattern`` as a regex over the JSON text of a string, quotes included.

outlines-core pastes ``pattern`` between the quotes as it is, so the pattern constrains the JSON
text rather than the string it decodes to: ``[^@]+@[^@]+`` let the model close the string early
(a raw ``"``), write a raw control character (not JSON) or a lone backslash, and ``a\\\\b``
(a literal backslash) produced ``"a\\b"``, which decodes to a backspace. Here the pattern is parsed
with Python's own parser (``re._parser``: jsonschema checks ``pattern`` with Python's ``re``) and
written out again over JSON text:

* a character that needs escaping in JSON (``"``, ``\\``, control characters) is matched by its
  escape (``\\"``, ``\\\\``, ``\\n``, ``\\u001f``), every other one as itself (never escaped);
* a class or ``.`` is split the same way; ``\\d``, ``\\w``, ``\\s`` and their negations, whose
  Unicode tables differ between Python and the automaton library, are narrowed to the ASCII
  characters Python's ``re`` puts in them, so every output passes Python's check, and that pydantic's
  Rust regex puts in them too (its ``\\s`` lacks ``\\x1c``-``\\x1f``, as under ``re.ASCII``);
* ``^`` / ``$`` at the ends are dropped, also at the ends of the alternatives and groups that reach
  them (``^a$|^b$``): the whole string must match, as in outlines-core, SGLang and vLLM (narrower
  than JSON Schema's search, so every output still validates);
* ``minLength`` / ``maxLength`` beside the pattern (outlines-core kept the length and dropped the
  pattern) are met by narrowing the pattern's one open-ended part: pydantic's
  ``Field(pattern="^[A-Z][a-z]+$", max_length=8)`` becomes ``[A-Z][a-z]{1,7}`` (``_fit_length``).
"""

from __future__ import annotations

import re
import warnings

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.constrained.regex_check import MAX_REPEAT_COUNT, check_parsed, largest_repeat
from lmnb_engine.constrained.vocab import START_MARKER
from lmnb_engine.json_schema import ecma_names_as_python, pattern_subject
from lmnb_engine.regex_python_error import shown_regex
from lmnb_engine.regex_tree import constants as _c, parser as _p, walk

_SHORT_ESCAPES = {'"': '\\\\"', "\\": "\\\\\\\\", "\b": "\\\\b", "\f": "\\\\f", "\n": "\\\\n", "\r": "\\\\r",
                  "\t": "\\\\t"}  # the regex text of each JSON escape
_CATEGORY = {_c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_NOT_DIGIT: r"\D", _c.CATEGORY_WORD: r"\w",
             _c.CATEGORY_NOT_WORD: r"\W", _c.CATEGORY_SPACE: r"\s", _c.CATEGORY_NOT_SPACE: r"\S"}
# code points from here on are written as themselves (U+0080-U+009F, the C1 controls, are not
# generated; U+007F is ASCII, written with the rest)
_FIRST_PLAIN = 0xA0
_MARKER = ord(START_MARKER)  # it and U+10FFFF are never generated (noncharacters; grammar.compile_grammar)
# Why a part matches no JSON string character here (a class's characters as ``_class`` writes them)
NO_CHARACTER_WORDS = ("constrained strings use ASCII for \\d, \\w, \\s and their negations, write no U+0080-U+009F "
                      "for a class or \".\", and UTF-8 text holds no surrogates U+D800-U+DFFF")


def _needs_escape(ch: str) -> bool:
    return ch in '"\\' or ord(ch) < 0x20


def _json_char(ch: str) -> str:
    """The regex of ``ch`` as JSON string text."""
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    if ord(ch) < 0x20:
        return f"\\\\u{ord(ch):04x}"
    return re.escape(ch)


def _in_class(ch: str) -> str:
    """``ch`` inside a ``[...]`` class, read alike by Python and the automaton library."""
    return f"\\U{ord(ch):08x}" if not ch.isprintable() or ch in "\\]^-[&~" else ch


def _scalar_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` of code points cut to those from ``_FIRST_PLAIN`` on that UTF-8 text can hold:
    without the surrogates U+D800-U+DFFF (the automaton library refuses them in a class), and
    without the grammar's markers U+10FFFE and U+10FFFF, noncharacters (``grammar.compile_grammar``)."""
    out = []
    for a, b in ranges:
        a = max(a, _FIRST_PLAIN)
        for lo, hi in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)):
            hi = min(hi, _MARKER - 1)
            out += [(lo, hi)] if lo <= hi else []
    return out


def _every_scalar(ranges: list[tuple[int, int]]) -> bool:
    """Whether ``ranges`` (``_scalar_ranges``'s) hold every code point from ``_FIRST_PLAIN`` on that
    ``_scalar_ranges`` keeps."""
    reach = _FIRST_PLAIN  # (the first code point not yet held)
    for lo, hi in sorted(ranges):
        if lo > reach:
            return False
        reach = max(reach, hi + 1)
        reach = 0xE000 if reach == 0xD800 else reach
    return reach >= _MARKER


def _char_set(member, ascii_only: bool, non_ascii: list[tuple[int, int]], negated: bool) -> str:
    """The regex of one character of a set: ``member(ch)`` says (Python's answer) for ASCII;
    above it, ``non_ascii`` ranges (allowed, or with ``negated`` excluded), none if ``ascii_only``."""
    plain, escaped = [], []
    for code in range(0x80):
        ch = chr(code)
        if member(ch):
            (escaped if _needs_escape(ch) else plain).append(ch)
    parts = []
    if plain:
        parts.append("[" + "".join(_in_class(c) for c in plain) + "]")
    if not ascii_only:
        if negated:  # (none where the ranges hold every character: [^\u0000-\ud7ff\ue000-\U0010ffff])
            excluded = _scalar_ranges(non_ascii)
            kept = "".join(f"{_in_class(chr(a))}-{_in_class(chr(b))}" for a, b in excluded)
            parts += [] if _every_scalar(excluded) else [
                f"[^\\x00-\\x9f{kept}{_in_class(chr(_MARKER))}-{_in_class(chr(_MARKER + 1))}]"]
        else:
            parts += [f"[{_in_class(chr(a))}-{_in_class(chr(b))}]" for a, b in _scalar_ranges(non_ascii)]
    parts += [_json_char(c) for c in escaped]
    if not parts:
        raise GrammarError("empty")  # replaced by the caller's message
    return "(?:" + "|".join(parts) + ")"


def _class(op, av) -> str:
    """The regex of one character matched by a parsed ``LITERAL`` / ``NOT_LITERAL`` / ``ANY`` / ``IN``."""
    if op is _c.LITERAL:
        if 0xD800 <= av <= 0xDFFF:
            raise GrammarError("empty")  # (a surrogate: no UTF-8 text holds one; the caller's message)
        return _json_char(chr(av))
    if op is _c.NOT_LITERAL:
        return _char_set(lambda ch: ord(ch) != av, False, [(av, av)], True)
    if op is _c.ANY:
        return _char_set(lambda ch: ch != "\n", False, [], True)
    items = list(av)
    negated = bool(items) and items[0][0] is _c.NEGATE
    if negated:
        items = items[1:]
    ranges = [(v, v) if o is _c.LITERAL else v for o, v in items if o in (_c.LITERAL, _c.RANGE)]
    categories = [_CATEGORY[v] for o, v in items if o is _c.CATEGORY]

    def member(ch: str) -> bool:  # by Python's reading and by pydantic's (Rust's regex, read as re.ASCII reads it)
        return all((any(a <= ord(ch) <= b for a, b in ranges) or any(re.fullmatch(c, ch, flags) for c in categories))
                   != negated for flags in (0, re.ASCII))

    return _char_set(member, bool(categories), ranges, negated)


def class_matches_nothing(cls: str) -> bool:
    """Whether the character class ``cls`` (``[...]`` or ``[^...]``, as Python's ``re`` reads it)
    matches no character this module writes for it in a JSON string: ``\\d``, ``\\w``, ``\\s``
    and their negations narrowed to ASCII, no U+0080-U+009F, surrogate or marker (``[^\\s\\S]``,
    ``[^\\D0-9]``, ``[\\ud800]``, ``[\\x80-\\x9f]``, ``[^\\u0000-\\ud7ff\\ue000-\\U0010ffff]``;
    ``schema_empty_class`` names such a class). Raises ``re.error`` where ``re`` reads
    no class."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (op, av), = _p.parse(cls)
    try:
        _class(op, av)
    except GrammarError:
        return True
    return False


def _emit(parsed) -> str:
    out = []
    for op, av in parsed:
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
            out.append(_class(op, av))
        elif op is _c.BRANCH:
            out.append("(?:" + "|".join(_emit(alt) for alt in av[1]) + ")")
        elif op is _c.SUBPATTERN:
            out.append("(?:" + _emit(av[-1]) + ")")
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi, sub = av
            if hi == 0:  # (it matches nothing, whatever it repeats: x[^\s\S]{0} is x, as in a regex=)
                continue
            out.append(f"(?:{_emit(sub)}){{{lo},{'' if hi is _c.MAXREPEAT else hi}}}")
        else:  # (check_parsed refused the rest: anchors inside, lookarounds, backreferences ...)
            raise GrammarError(f"unsupported regex construct {op}")
    return "".join(out)


def _width(items: list, state) -> tuple[int, int | None]:
    """(fewest, most) characters a match of ``items`` has; most is None when unbounded."""
    lo, hi = _p.SubPattern(state, list(items)).getwidth()
    return lo, None if hi >= _c.MAXREPEAT else hi


class _NoFit(Exception):
    """No match of this part has a length within the bounds."""


def _fit_length(items: list, state, lo: int, hi: int | None) -> list:
    """``items`` (a parsed sequence) narrowed to the matches of ``lo`` to ``hi`` characters
    (``hi`` None: no upper bound). The lengths of a regular language's words are no regex
    rewrite in general, so this covers the shapes length-bounded patterns take: when the whole
    already fits nothing changes; otherwise exactly one item may vary in length, and it is a
    repeat of a fixed-width part (its count is narrowed), a group (narrowed inside) or an
    alternation (each branch narrowed, those that cannot fit dropped).

    Raises:
        _NoFit: no match has such a length.
        GrammarError: (message without the location, the caller adds it) the lengths vary in
            more than one place, or inside a repeat of a variable-width part. (The narrowed
            counts are checked against the repeat limit by the caller, on the whole pattern.)
    """
    low, high = _width(items, state)
    if lo <= low and (hi is None or (high is not None and high <= hi)):
        return list(items)
    if (high is not None and high < lo) or (hi is not None and low > hi):
        raise _NoFit
    widths = [_width([item], state) for item in items]
    varying = [i for i, (a, b) in enumerate(widths) if a != b]
    if len(varying) != 1:
        raise GrammarError("its length varies in more than one place")
    at = varying[0]
    fixed = sum(a for i, (a, _) in enumerate(widths) if i != at)
    lo, hi = max(lo - fixed, 0), None if hi is None else hi - fixed
    op, av = items[at]
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
        count_lo, count_hi, sub = av
        step, sub_high = _width(sub, state)
        if sub_high != step:
            raise GrammarError("it repeats a part whose length varies")
        new_lo = max(count_lo, -(-lo // step))
        caps = ([] if count_hi is _c.MAXREPEAT else [count_hi]) + ([] if hi is None else [hi // step])
        new_hi = min(caps) if caps else None
        if new_hi is not None and new_lo > new_hi:
            raise _NoFit
        item = (op, (new_lo, _c.MAXREPEAT if new_hi is None else new_hi, sub))
    elif op is _c.SUBPATTERN:
        item = (op, (*av[:-1], _p.SubPattern(state, _fit_length(av[-1], state, lo, hi))))
    elif op is _c.BRANCH:
        branches = []
        for branch in av[1]:
            try:
                branches.append(_p.SubPattern(state, _fit_length(branch, state, lo, hi)))
            except _NoFit:
                continue
        if not branches:
            raise _NoFit
        item = (op, (av[0], branches))
    else:  # (the only other variable-width items are anchors and lookarounds, refused before)
        raise GrammarError(f"its length varies in a {op}")
    return [*items[:at], item, *items[at + 1:]]


_BEGINNINGS = ((_c.AT, _c.AT_BEGINNING), (_c.AT, _c.AT_BEGINNING_STRING))  # ^ and \A
_ENDS = ((_c.AT, _c.AT_END), (_c.AT, _c.AT_END_STRING))  # $ and \Z


def _without_edge_anchors(items: list, state, start: bool = True, end: bool = True) -> list:
    """``items`` (a parsed sequence) without the anchors at the string's edges: ``^``/``\\A``
    first where ``start``, ``$``/``\\Z`` last where ``end``, and so inside each alternation and
    group that reaches an edge. The decoded string must match whole, so there they always hold
    and dropping them is exact. A ZIP code written ``^\\d{5}$|^\\d{5}-\\d{4}$`` (which Python's
    parser holds as ``^`` then the alternatives ``\\d{5}$`` and ``\\d{5}-\\d{4}$``) or ``(^a$)`` would
    otherwise keep an anchor that ``check_parsed`` refuses."""
    items = list(items)
    while start and items and items[0] in _BEGINNINGS:
        items = items[1:]
    while end and items and items[-1] in _ENDS:
        items = items[:-1]
    last = len(items) - 1
    for i in sorted({0, last}) if items else []:
        at_start, at_end = start and i == 0, end and i == last
        op, av = items[i]
        if op is _c.BRANCH and (at_start or at_end):
            alternatives = [_p.SubPattern(state, _without_edge_anchors(alt, state, at_start, at_end)) for alt in av[1]]
            items[i] = (op, (av[0], alternatives))
        elif op is _c.SUBPATTERN and (at_start or at_end):
            items[i] = (op, (*av[:-1], _p.SubPattern(state, _without_edge_anchors(av[-1], state, at_start, at_end))))
    return items


def pattern_regex(pattern: str, where: str, min_length: int = 0, max_length: int | None = None,
                  name: str | None = None) -> str:
    """The regex of the JSON string literals (quotes included) that decode to a full match of
    ``pattern`` (a JSON Schema ``pattern``, read by Python's ``re`` as jsonschema reads it, ECMA's
    named groups as plain ones: ``ecma_names_as_python``) with
    ``min_length`` to ``max_length`` characters (code points, as JSON Schema counts; None: no
    upper bound). ``name`` is what messages call it (default: the pattern itself).

    Raises:
        GrammarError: the pattern is not a regex Python reads, uses a feature a finite automaton
            cannot express (``regex_check``), or has a character class with no character that
            can be written (e.g. only control characters, in a negated Unicode class); no match
            has a length within the bounds, or the bounds cannot be folded into the pattern
            (``_fit_length``).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = _p.parse(ecma_names_as_python(pattern))  # (ECMA's (?<name>: a name matches nothing)
    except (re.error, OverflowError, RecursionError) as e:
        raise GrammarError(f"JSON schema pattern {shown_regex(pattern)} at {where} is not a regular expression Python's re "
                           f"reads ({e}), and JSON Schema validators check it with one; fix it") from None
    ignore_case = _c.SRE_FLAG_IGNORECASE
    if parsed.state.flags & ignore_case or any(op is _c.SUBPATTERN and av[1] & ignore_case for op, av in walk(parsed)):
        # (classes are written out here, and case folding would have to be too: [^a-z] excludes 'K')
        raise GrammarError(f"JSON schema pattern {shown_regex(pattern)} at {where} uses case-insensitive matching (?i), which "
                           "constrained strings do not support; spell both cases out, e.g. [Aa] or [A-Za-z]")
    # (JSON Schema searches: an end without its anchor lets other characters in there, so a length
    # no whole-string match has may still be valid)
    anchored = bool(parsed.data) and parsed.data[0] in _BEGINNINGS and parsed.data[-1] in _ENDS
    items = _without_edge_anchors(parsed.data, parsed.state)
    parsed.data = items
    # (in the words of the schema's other pattern refusals, json_schema._refused_pattern, at the keyword's place)
    check_parsed(parsed, pattern, pattern_subject(f"{where}/pattern"))
    bounds = (f"at least {min_length}" if max_length is None else f"at most {max_length}" if not min_length
              else f"{min_length} to {max_length}") + (" character" if max_length == 1 or (
                  max_length is None and min_length == 1) else " characters")
    fix = ('put the length into the pattern (e.g. "^[A-Z]{1,8}$") and drop minLength/maxLength' if name is None
           else "drop minLength/maxLength (the format fixes the shape) or give a pattern instead")
    name = name or f"pattern {shown_regex(pattern)}"
    try:
        parsed.data = _fit_length(items, parsed.state, min_length, max_length)
    except _NoFit:
        if name == f"pattern {shown_regex(pattern)}" and not anchored:
            raise GrammarError(f"JSON schema {name} at {where} has no whole-string match of {bounds} "
                               "(minLength/maxLength); constrained decoding writes a string the whole pattern "
                               "matches, as if it were anchored (\"^...$\"): anchor it and spell out the characters "
                               'around it, within the length (e.g. "^.{1,2}x$" rather than "x" with '
                               "minLength 2)") from None
        raise GrammarError(f"JSON schema {name} at {where} has no match of {bounds} "
                           "(minLength/maxLength): no string can validate; fix the pattern or the bounds") from None
    except GrammarError as e:
        raise GrammarError(f"JSON schema {name} at {where} cannot be narrowed to {bounds} "
                           f"(minLength/maxLength) while decoding: {e}; {fix}") from None
    count = largest_repeat(parsed)  # (narrowed counts: regex_check's limit, nested repeats multiplied)
    if count > MAX_REPEAT_COUNT:
        raise GrammarError(f"JSON schema {name} at {where} cannot be narrowed to {bounds} (minLength/maxLength) "
                           f"while decoding: the narrowed repeat would count to {count} (nested repeats "
                           f"multiplied), above the limit of {MAX_REPEAT_COUNT}; {fix}")
    try:
        return '"' + _emit(parsed) + '"'
    except GrammarError:  # (a surrogate pair, two surrogates to re, the schema check refuses: json_schema)
        raise GrammarError(f"JSON schema pattern {shown_regex(pattern)} at {where} has a part no JSON string character "
                           f"can match here ({NO_CHARACTER_WORDS}); widen it") from None
