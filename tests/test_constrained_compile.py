"""Constrained decoding without a model: errors, bounded numbers, token bytes, masks, compressed FSM.

References: Python's ``re`` and the ``regex`` module's partial matching (which prefixes can still
become a match), ``jsonschema`` validation, plain arithmetic, the tokenizer's own encode/decode.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import functools
import ipaddress
import itertools
import json
import random
import re
import threading
import time
import typing
import uuid
import warnings
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import jsonschema
import numpy as np
import pydantic
import pytest
import regex as regex_module
import torch

from lmnb_engine.constrained import (
    GrammarBackend,
    GrammarCompileStopped,
    GrammarCache,
    GrammarError,
    GrammarMatcher,
    TokenVocabulary,
    apply_token_bitmask_,
    compile_grammar,
    schema_to_regex,
)
from lmnb_engine.constrained import cache as cache_module
from lmnb_engine.constrained.grammar import pack_token_ids
from lmnb_engine.constrained.numeric import integer_range_regex, number_range_regex
from lmnb_engine.constrained.regex_check import check_regex
from lmnb_engine.constrained.regex_syntax import automaton_syntax
from lmnb.ir import REGEX_FLOAT
from lmnb_engine.pydantic_schema import pydantic_json_schema
from lmnb_engine.constrained.schema_refs import MAX_REF_DEPTH

from constrained_corpus import SCHEMAS


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


@pytest.fixture(scope="module")
def backend(tokenizer):
    b = GrammarBackend(tokenizer, {tokenizer.eos_token_id}, cache=GrammarCache())
    yield b
    b.shutdown()


# --- bad input is named at submission ---------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, feature",
    [
        (r"(a)b\1", "back-reference"),
        (r"(?=ab)a[a-z]", "lookahead"),
        (r"x(?<=x)y", "lookbehind"),
        (r"a(?!b)[a-z]", "negative lookahead"),
        (r"a^bc", "'^' anchor"),  # (at the edges they are dropped: test_anchors_at_the_edges_are_dropped)
        (r"ab$c", "'$' anchor"),
        (r"(^a)b", "'^' anchor"),
        (r"a\bb", "word boundary"),
        (r"(a)?(?(1)b|c)", "conditional group"),
        (r"(?>ab)c", "atomic group"),
    ],
)
def test_unsupported_regex_feature_is_named(backend, pattern, feature):
    with pytest.raises(GrammarError, match=re.escape(feature)):
        backend.to_regex(regex=pattern)



def _no_back_reference(reference, group, at):
    """The words, after the pattern, refusing the back-reference ``reference`` to ``group`` at ``at``."""
    return (f"has a back-reference {reference} at position {at}: it matches again the very text the group {group} matched, "
            "which no regular language expresses; constrained decoding cannot do a back-reference, in ECMA's syntax or "
            "Python's (patterns compile to a finite automaton): repeat the group's pattern instead of referring to it")


def test_a_back_reference_by_name_is_refused_as_one_that_no_automaton_can_do(backend):
    """ECMA's \\k<n> (a schema's pattern is ECMA's; the regex package's and .NET's too) was
    refused only as Python's re refuses it: "unknown extension ?<n" (regex=) or "bad escape \\k"
    (a schema, once its named group was read), "fix the pattern", as if respelling it would do.
    A back-reference matches again the very text its group matched, which no regular language
    expresses: both now say so, where it stands, and to repeat the group's pattern. So does a
    back-reference by number or Python's (?P=n), in the same words (they said "uses a
    backreference to group 1 (...), which constrained decoding cannot support ...")."""
    named = r"\k<n>"
    for pattern, at in ((r"(?<n>a|b)\k<n>", 9), (r"(?P<n>a)x\k<n>", 9), (r"[\k<n>](?<n>a)\k<n>", 14)):
        assert _refused_alike(backend, pattern) == f"regex {json.dumps(pattern)} {_no_back_reference(named, 'n', at)}"
    pattern = r"^(?<n>[a-z])-\k<n>$"
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value) == f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} {_no_back_reference(named, 'n', 13)}"
    for pattern, reference, group in ((r"(a)\1", r"\1", 1), (r"(?P<n>a)(?P=n)", "(?P=n)", "n")):
        with pytest.raises(GrammarError) as e:
            backend.to_regex(regex=pattern)
        assert str(e.value) == f"regex {json.dumps(pattern)} {_no_back_reference(reference, group, pattern.index(reference))}"


@pytest.mark.parametrize("pattern, reference, group, matched, unmatched", [
    (r"(a)\1", r"\1", 1, "aa", "a"), (r"(?P<n>a|b)x(?P=n)", "(?P=n)", "n", "bxb", "axb"),
    (r"(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\10", r"\10", 10, "abcdefghijj", "abcdefghija"),
    (r"c(?<=c)(a)\1", r"\1", 1, "caa", "ca"),  # (beside a lookbehind, which gen() refuses too: named first)
    (r"(a)[\1]\101(?#\1)\1", r"\1", 1, "a\x01Aa", "a\x01Ab"),  # (octal escapes and a comment first: the reference is the last)
    # (names Python takes that \w does not match, a combining accent, Other_ID_Start's U+2118: they were "\1", unplaced)
    ("(?P<a\u0301>x|y)(?P=a\u0301)", "(?P=a\u0301)", "a\u0301", "yy", "xy"),
    ("(?P<\u2118>x|y)(?P=\u2118)", "(?P=\u2118)", "\u2118", "xx", "yx"),
])
def test_a_back_reference_by_number_is_refused_by_gen_as_the_engine_refuses_it(backend, pattern, reference, group,
                                                                                matched, unmatched):
    """gen(regex="(a)\\1") and a %%lm cell took a back-reference, which no backend can constrain
    output with (the engine cannot; xgrammar says "Backreference is not supported yet", outlines'
    automaton library has none), and the program failed when it ran ("Gen('a') failed: GrammarError
    ..."). They now refuse it, in the engine's words, naming it as written and where it stands;
    the reference: Python's re reads each as a back-reference (it matches a repeat of the group's
    text and nothing else)."""
    at = pattern.rindex(reference)
    assert _refused_alike(backend, pattern) == f"regex {json.dumps(pattern, ensure_ascii=False)} {_no_back_reference(reference, group, at)}"
    assert re.fullmatch(pattern, matched) and not re.fullmatch(pattern, unmatched)


@pytest.mark.parametrize("pattern, feature, text", [
    (r"x(?<=x)y", "a lookbehind", "xy"), (r"a(?<!b)c", "a negative lookbehind", "ac"),
    (r"(?<=a)b", "a lookbehind", None),  # (at the output's start: no text matches it whole)
    (r"a(?=.(?<=b))\w", "a lookbehind", "ab"),  # (inside a lookahead: the lookbehind is named, asked first)
])
def test_a_lookbehind_is_refused_by_gen_as_the_engine_refuses_it(backend, pattern, feature, text):
    """gen(regex="(?<=a)b") and a %%lm cell took a lookbehind, which no backend can constrain output
    with (the engine cannot; xgrammar says "Lookbehind is not supported yet", Rust's regex in
    outlines-core and llguidance has no look-around, interegular, older outlines', "lookbacks are
    not implemented"), and the program failed when it ran ("GrammarError: regex ... uses a
    lookbehind"). They now refuse it up front, as a back-reference, in the engine's words. The
    reference: Python's re reads each pattern as said (its match, or none at all)."""
    words = (f"regex {json.dumps(pattern)} uses {feature}, which constrained decoding cannot support (patterns "
             "compile to a finite automaton): express the condition with character classes and alternatives")
    assert _refused_alike(backend, pattern) == words
    if text is None:
        assert not any(re.fullmatch(pattern, t) for t in ("b", "ab"))
    else:
        assert re.fullmatch(pattern, text)


@pytest.mark.parametrize("pattern, feature, text", [
    (r"(?=a)b", "a lookahead", ["a", "b", "ab"]),  # (a list: Python's re matches none of its texts)
    (r"a(?=b)\w", "a lookahead", "ab"), (r"(?=ab)ab", "a lookahead", "ab"), (r"a(?=b?)", "a lookahead", "a"),
    (r"a(?=$)", "a lookahead", "a"), (r"^a(?=b)\w$", "a lookahead", "ab"),  # (its edge anchors are dropped, not it)
    (r"a(?!b)", "a negative lookahead", "a"), (r"(?:a(?!b)|b)", "a negative lookahead", "b"),
    (r"(?:a(?= )|b)", "a lookahead", "b"), (r"(?:a(?= ))?b?", "a lookahead", "b"),  # (one a match need not pass)
    (r"(?:a(?= ))+", "a lookahead", ["a", "a ", "a a"]),
    # (reading past the pattern's end, where the output ends: it never holds)
    (r" \w+(?= )", "a lookahead", [" ab", " ab ", " ab c"]), (r"(?=abc)ab", "a lookahead", ["ab", "abc"]),
    (r"(a(?=bc))c?", "a lookahead", ["a", "ab", "ac", "abc"]),
    (r"\p{L}(?=\p{L})", "a lookahead", ["a", "ab"]),  # (a Unicode class, which Python's re lacks)
])
def test_a_lookahead_is_refused_by_gen_as_the_engine_refuses_it(backend, pattern, feature, text):
    """gen(regex="(?=a)b") and a %%lm cell took a lookahead, leaving it to the backend (but one that
    reads past the pattern's end, refused in words of their own), and the program, and each row of
    an exported job, failed when the gen ran ("GrammarError: regex ... uses a lookahead"). No backend constrains output with one as Python's re reads it: the engine cannot;
    xgrammar says "Lookahead is not supported yet"; Rust's regex in outlines-core and llguidance has
    no look-around; interegular, older outlines', reads the lookahead's text as the output's own
    (" \\w+(?= )" takes " ab "). They now refuse every one up front, as a lookbehind, in the engine's
    words. The reference: Python's re reads each pattern as said (its match, or none of the texts),
    and outlines-core's automaton library refuses it."""
    words = (f"regex {json.dumps(pattern)} uses {feature}, which constrained decoding cannot support (patterns "
             "compile to a finite automaton): express the condition with character classes and alternatives")
    assert _refused_alike(backend, pattern) == words
    python = pattern.replace(r"\p{L}", "[a-z]")
    if isinstance(text, str):
        assert re.fullmatch(python, text)
    else:
        assert not any(re.fullmatch(python, t) for t in text)
    assert not _automaton_builds(pattern)


@pytest.mark.parametrize("pattern, feature, text", [
    (r"a\bb", "a word boundary '\\b'", None), (r"\bword\b", "a word boundary '\\b'", "word"),
    (r"^\w+\b$", "a word boundary '\\b'", "ab"),  # (an edge anchor beside it is dropped; it is not)
    (r"a(?=.\b)\w", "a word boundary '\\b'", "ab"),  # (in a lookahead: the boundary is named, asked first)
    (r"a\Bb", "a non-word-boundary '\\B'", "ab"),
])
def test_a_word_boundary_is_refused_by_gen_as_the_engine_refuses_it(backend, pattern, feature, text):
    """gen(regex=r"\\bword\\b") and a %%lm cell took a word boundary, which no backend builds (the
    engine cannot; outlines-core's automaton library "cannot build DFAs for regexes with Unicode word
    boundaries", interegular says "Escape \\b is not implemented"), and the program failed when it
    ran ("GrammarError: regex ... uses a word boundary '\\b'"). They now refuse it up front, as a
    lookbehind, in the engine's words and with its fix. The reference: Python's re reads each
    pattern as said (its match, or none at all), and the automaton library refuses it."""
    from outlines_core import Index, Vocabulary

    words = (f"regex {json.dumps(pattern)} uses {feature}, which constrained decoding cannot support (patterns "
             "compile to a finite automaton): spell out the characters allowed on each side")
    assert _refused_alike(backend, pattern) == words
    assert re.fullmatch(pattern, text) if text else not re.fullmatch(pattern, "ab")
    with pytest.raises(ValueError, match="word boundaries"):
        Index(r"\w\b", Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)}))


_LOOKAROUND_FIX = "express the condition with character classes and alternatives"
_BOUNDARY_FIX = "spell out the characters allowed on each side"
# Parts of a pattern no backend builds: (text, [(where in it, rank, feature, fix)]); rank: gen()'s order, a
# back-reference (0) before a lookbehind or word boundary (1) before a lookahead (2), the first of a rank first
_UNBUILT_PARTS = [
    ("(?=a)", [(0, 2, "a lookahead", _LOOKAROUND_FIX)]), ("(?!b)", [(0, 2, "a negative lookahead", _LOOKAROUND_FIX)]),
    ("(?<=a)", [(0, 1, "a lookbehind", _LOOKAROUND_FIX)]),
    ("(?<!b)", [(0, 1, "a negative lookbehind", _LOOKAROUND_FIX)]),
    ("\\b", [(0, 1, "a word boundary '\\b'", _BOUNDARY_FIX)]),
    ("\\B", [(0, 1, "a non-word-boundary '\\B'", _BOUNDARY_FIX)]),
    ("(?=.(?<=b))", [(0, 2, "a lookahead", _LOOKAROUND_FIX), (4, 1, "a lookbehind", _LOOKAROUND_FIX)]),
    ("(?=.\\b)", [(0, 2, "a lookahead", _LOOKAROUND_FIX), (4, 1, "a word boundary '\\b'", _BOUNDARY_FIX)]),
    ("(\\w)\\{group}", None),  # (a back-reference to the group before it, at 4: numbered as it is made)
]


def _unbuilt_words(pattern, found):
    """The refusal of ``pattern`` for ``found``, (position, rank, feature, fix), in gen()'s words."""
    at, rank, feature, fix = found
    if rank == 0:
        return f"regex {json.dumps(pattern)} {_no_back_reference(feature, int(feature[1:]), at)}"
    return (f"regex {json.dumps(pattern)} uses {feature}, which constrained decoding cannot support (patterns "
            f"compile to a finite automaton): {fix}")


def _several_unbuilt(rng):
    """A pattern of two to four parts no backend builds (``_UNBUILT_PARTS``) between fillers that
    consume text, and the refusal gen() words for it: the one of the lowest rank, the first of those."""
    pattern, found, groups = "", [], 0
    for _ in range(rng.randint(2, 4)):
        pattern += rng.choice(["", "a", "[a-z]", "x*", "(?:ab|c)"])
        text, features = rng.choice(_UNBUILT_PARTS)
        if features is None:
            groups += 1
            text, features = text.format(group=groups), [(4, 0, f"\\{groups}", None)]
        found += [(len(pattern) + at, rank, feature, fix) for at, rank, feature, fix in features]
        pattern += text
    pattern += "c"
    return pattern, _unbuilt_words(pattern, min(found, key=lambda f: (f[1], f[0])))


def test_a_pattern_with_several_features_no_backend_builds_is_refused_for_the_same_one_everywhere(backend):
    r"""gen(regex=r"(?=a)a\b") and a %%lm cell named the word boundary, and the engine's own check
    (constrained.check_regex, which offers ask: "... but without it, ...") the lookahead, the first
    in the pattern; so with (?!a)\bb, and (?=a)(\w)\1 and (?<=a)(\w)\1, where gen() names the
    back-reference. The engine's check now asks gen()'s check first (regex_errors.no_backend_problem):
    a back-reference, then a lookbehind or word boundary, then a lookahead, the first of each. The
    reference: that order, applied to the features each pattern is built of (``_several_unbuilt``)."""
    from lmnb_engine.regex_errors import pattern_problem

    for pattern, words in [
        (r"(?=a)a\b", _unbuilt_words(r"(?=a)a\b", (6, 1, "a word boundary '\\b'", _BOUNDARY_FIX))),
        (r"(?!a)\bb", _unbuilt_words(r"(?!a)\bb", (5, 1, "a word boundary '\\b'", _BOUNDARY_FIX))),
        (r"(?=a)(\w)\1", _unbuilt_words(r"(?=a)(\w)\1", (9, 0, r"\1", None))),
        (r"(?<=a)(\w)\1", _unbuilt_words(r"(?<=a)(\w)\1", (10, 0, r"\1", None))),
    ] + [_several_unbuilt(random.Random(seed)) for seed in range(60)]:
        assert _refused_alike(backend, pattern) == words, pattern
        with pytest.raises(GrammarError) as e:
            check_regex(pattern)
        assert str(e.value) == words, pattern
    # where an offer is weighed: the pattern without its empty class, refused as gen() refuses it
    said = pattern_problem(r"(?=a)a\b|[^\s\S]")
    assert said.endswith("; but without it, " + _unbuilt_words(r"(?=a)a\b", (6, 1, "a word boundary '\\b'",
                                                                                 _BOUNDARY_FIX))), said


_POSSESSIVE = ("a possessive quantifier ('*+', '++', '?+')", "use the greedy quantifier")
_ATOMIC = ("an atomic group '(?>...)'", "use a plain group '(?:...)'")
_CONDITIONAL = ("a conditional group '(?(n)...|...)'", "write the alternatives out with '|'")


@pytest.mark.parametrize("pattern, found", [
    ("a++b", _POSSESSIVE), ("a{2}+", _POSSESSIVE), ("x(?:ab)*+", _POSSESSIVE), ("(?>ab)c", _ATOMIC),
    ("a(?:b|(?>cd))", _ATOMIC), ("(a)?(?(1)b|c)", _CONDITIONAL),
    ("a^b(?>c)", _ATOMIC),  # (gen()'s refusals before the engine's own: the engine named the anchor)
    ("(?>a)\\bb", ("a word boundary '\\b'", _BOUNDARY_FIX)),  # (a boundary before them, in gen()'s order)
])
def test_a_possessive_quantifier_atomic_group_or_conditional_is_refused_at_gen_in_the_engines_words(backend, pattern,
                                                                                                   found):
    """gen(regex="a++b") (or "a{2}+", "(?>ab)c", "(a)?(?(1)b|c)"), a %%lm cell and lmnb export took
    the pattern, and the engine refused it when each row ran. No backend builds one as Python's re
    reads it (regex_errors.backtracking_problem: outlines-core reads a*+a as (?:a*)+a, which takes
    "aa", see below), so gen() refuses it as the engine does (regex_errors.no_backend_problem, after
    a lookaround or boundary). The reference: the engine's words for each feature, written out."""
    feature, fix = found
    words = (f"regex {json.dumps(pattern)} uses {feature}, which constrained decoding cannot support (patterns "
             f"compile to a finite automaton): {fix}")
    assert _refused_alike(backend, pattern) == words
    with pytest.raises(GrammarError) as e:
        check_regex(pattern)
    assert str(e.value) == words


def test_outlines_core_reads_a_possessive_quantifier_otherwise_than_re():
    """Why gen() refuses a possessive quantifier rather than leave it to outlines-core: re's a*+a
    matches nothing (the repeat gives back no "a"), and outlines-core's automaton takes "aa"."""
    from outlines_core import Index, Vocabulary

    index = Index("a*+a", Vocabulary(9, {"a": [0]}))
    state = index.get_next_state(index.get_next_state(index.get_initial_state(), 0), 0)
    assert index.is_final_state(state) and re.fullmatch("a*+a", "aa") is None


def test_a_plain_group_beside_the_refused_features_stays_taken(backend):
    """The fixes the refusals offer (a plain group, the greedy quantifier, the alternatives written
    out) pass gen() and compile to what re reads."""
    import lmnb

    for pattern, texts in [("(?:ab)c", ["abc"]), ("a+b", ["ab", "aab"]), ("ab|c", ["ab", "c"])]:
        lmnb.gen("x", regex=pattern)
        compiled = backend.compile(regex=pattern).regex
        assert all(re.fullmatch(compiled, t) for t in texts) and not re.fullmatch(compiled, "b"), pattern


@pytest.mark.parametrize("pattern, refused", [("(?>a)b", True), ("a(?>b|c)d", True), ("(?:a)b", False)])
def test_a_schema_patterns_atomic_group_is_refused_at_gen_in_the_engines_words(pattern, refused):
    """gen(json_schema=...) and a %%lm cell took a schema whose pattern holds an atomic group
    (ECMA's u flag check refuses a possessive quantifier and a conditional, but not "(?>"), which
    the engine refused when the row ran; they refuse it in the engine's words now. A plain group
    stays taken. The reference: the engine's words for an atomic group, written out."""
    import lmnb
    from lmnb.template.options import check_literal

    schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": pattern}}}
    if not refused:
        lmnb.gen("x", json_schema=schema)
        assert check_literal("gen", "json_schema", schema) is None
        schema_to_regex(schema)
        return
    words = (f"JSON schema at #/properties/k/pattern: the pattern {json.dumps(pattern)} uses {_ATOMIC[0]}, which "
             f"constrained decoding cannot support (patterns compile to a finite automaton): {_ATOMIC[1]}")
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", json_schema=schema)
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex(schema)
    assert [str(at_gen.value), check_literal("gen", "json_schema", schema), str(in_engine.value)] == [words] * 3


def test_an_offer_refused_for_its_back_reference_places_it_in_the_pattern_as_written(backend):
    r"""gen(regex=r"^(a)\1$|[^\s\S]") and a %%lm cell said the pattern without its empty class,
    "^(a)\\1$", has "a back-reference \1 at position 3", its place once the engine's check had
    dropped the "^" (regex_errors.unbuilt_feature), where gen(regex=r"^(a)\1$") and the engine
    say 4. The reference: the \1's index in the pattern so written."""
    from lmnb_engine.regex_errors import pattern_problem

    offer, reference = r"^(a)\1$", r"\1"
    words = f"regex {json.dumps(offer)} {_no_back_reference(reference, 1, offer.index(reference))}"
    assert _refused_alike(backend, offer) == words
    said = pattern_problem(offer + r"|[^\s\S]")
    assert said.endswith(f"; but without it, {words}"), said


def test_a_back_reference_the_text_does_not_show_is_named_by_its_group(backend):
    """Where the text is read otherwise than Python's parser reads it (a comment holding an escaped
    newline before (?x) hides that flag from pattern_parts, which then reads "#[" as a class holding
    the \\1 Python reads after the comment's line), the back-reference Python finds is named by its
    group's number, without a place. The reference: Python's re reads a repeat of group 1 there."""
    pattern = "(?#\\\n)(?x)(a)#[\n\\1]"
    words = _no_back_reference(r"\1", 1, 0).replace(" at position 0", "")
    assert _refused_alike(backend, pattern) == f"regex {json.dumps(pattern)} {words}"
    assert re.fullmatch(pattern, "aa]") and not re.fullmatch(pattern, "ab]")


def test_what_only_looks_like_a_back_reference_is_not_refused_as_one(backend):
    """"\\1" in a class, and "\\101" (three octal digits), are octal escapes to Python's re (the
    characters U+0001 and "A"), so gen() and the engine take them; "\\10" before a tenth group is
    a reference to no group, which Python refuses as it did."""
    import lmnb

    for pattern, text in ((r"(a)[\1]", "a\x01"), (r"(a)\101", "aA")):
        lmnb.gen("x", regex=pattern)
        assert re.fullmatch(backend.compile(regex=pattern).regex, text), pattern
    assert _refused_alike(backend, r"(a)\10") == (
        'regex "(a)\\\\10" cannot be compiled: it is not a valid regular expression (invalid group reference 10 at '
        "position 4); fix the pattern")


def _named_group_words(pattern, name, at):
    return (f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression (unknown extension "
            f"?<{name[0]} at position {at}); Python's re, which reads a regex here, names a group (?P<{name}>...), "
            f"where ECMA 262, .NET and Rust's regex write (?<{name}>...): ")


@pytest.mark.parametrize("pattern, name, at, python, texts", [
    (r"(?<year>\d{4})", "year", 1, r"(?P<year>\d{4})", ["2024", "202", "20245", "abcd"]),
    (r"^(?<y>\d{2})-(?<m>[a-c])$|x", "y", 2, r"^(?P<y>\d{2})-(?P<m>[a-c])$|x", ["12-a", "12-d", "x", "1-a"]),
    # (the "(?<" in a class and in a comment opens no group: only the third is respelled)
    (r"[(?<]a(?#(?<c>)(?<n>[A-Z])", "n", 16, r"[(?<]a(?#(?<c>)(?P<n>[A-Z])", ["(aB", "<ab", "?aC", "aB"]),
])
def test_an_ecma_named_group_in_a_regex_is_offered_pythons_spelling(backend, pattern, name, at, python, texts):
    """gen(regex=r"(?<year>\\d{4})"), a %%lm cell and the engine said only "unknown extension ?<y
    ... fix the pattern". They now offer the pattern with Python's (?P<year>, which gen() takes and
    the engine builds, and which matches what the regex package (which reads (?<year> as Python
    reads (?P<year>) reads the pattern as matching."""
    import lmnb

    assert _refused_alike(backend, pattern) == _named_group_words(pattern, name, at) + f"write {json.dumps(python)}"
    lmnb.gen("x", regex=python)
    built = backend.compile(regex=python).regex
    for text in texts:
        assert bool(re.fullmatch(built, text)) == bool(regex_module.fullmatch(pattern, text)), text


@pytest.mark.parametrize("pattern, name, at, python, part", [
    (r"c(?<=c)(?<year>\d)", "year", 8, r"c(?<=c)(?P<year>\d)", "(?P<year>...) for it"),
    (r"(?<y>a)-(?<m>b)\1", "y", 1, r"(?P<y>a)-(?P<m>b)\1", "(?P<name>...) for each (?<name>...)"),
])
def test_an_ecma_named_group_beside_what_the_engine_refuses_is_offered_alone(backend, pattern, name, at, python, part):
    """Where the pattern with Python's (?P<name> is refused next (a lookbehind, a back-reference),
    no whole pattern is offered: the group's spelling alone, and the engine's words on that pattern
    (the reference: the engine's own refusal of it)."""
    with pytest.raises(GrammarError) as refused:
        backend.compile(regex=python)
    assert _refused_alike(backend, pattern) == (
        _named_group_words(pattern, name, at) + f"write {part}; but so written, {refused.value}")


@pytest.mark.parametrize("pattern, error", [
    (r"(?<a$>x)", "unknown extension ?<a at position 1"),  # (ECMA's "$" in a name, which re refuses in any spelling)
    (r"(?<n>a", "unknown extension ?<n at position 1"),
])
def test_an_ecma_named_group_is_offered_no_spelling_python_refuses(backend, pattern, error):
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression ({error}); fix the pattern")


@pytest.mark.parametrize("pattern, first, second, offer, texts", [
    (r"(?<m>a)|(?<m>b)", 0, 8, r"(?P<m>a)|(?:b)", ["a", "b", "ab", ""]),  # (ECMA 2025's: in two alternatives)
    (r"(?P<m>a)|(?P<m>b)", 0, 9, r"(?P<m>a)|(?:b)", ["a", "b", "ab"]),
    (r"x(?<y>\d)(?<m>a)|(?<m>b)c", 9, 17, r"x(?P<y>\d)(?P<m>a)|(?:b)c", ["x1a", "bc", "b", "x1"]),
    (r"[(?<m>](?P<m>a)(?#(?<m>)", None, None, None, ["(a", "ma", "a"]),  # (in a class, in a comment: no group)
    (r"c(?<=c)(?<m>a)|(?<m>b)", 7, 15, None, []),  # (the offer holds a lookbehind, which the engine refuses: none)
    # ("(?<m>" in a class, or after "\(", is characters, no group: it was respelt "(?P<m>", a class that matches "P")
    (r"(?<m>a)|(?<m>b)|[(?<m>]", 0, 8, r"(?P<m>a)|(?:b)|[(?<m>]", ["a", "b", "(", "m", "P", "ab"]),
    (r"(?<m>a)|(?<m>b)|\(?<m>", 0, 8, r"(?P<m>a)|(?:b)|\(?<m>", ["a", "b", "(<m>", "<m>", "P<m>", "(P<m>"]),
])
def test_a_group_name_given_twice_in_a_regex_is_named_with_the_fix(backend, pattern, first, second, offer, texts):
    """gen(regex=r"(?<m>a)|(?<m>b)"), which ECMA 262 takes since 2025 (a name again in another
    alternative), a %%lm cell and the engine said only "unknown extension ?<m ... fix the pattern"
    (and of (?P<m>a)|(?P<m>b) "redefinition of group name 'm'"). They now name the name given
    twice, where, that Python's re takes it once, and the fix (rename one, or a group that captures
    nothing), with the pattern so written where gen() takes it and the engine builds it. The
    reference: the regex package, which takes a name twice, matches the pattern as the offer."""
    import lmnb

    if first is None:
        lmnb.gen("x", regex=pattern)  # (one group named m: taken, as before)
        assert [bool(re.fullmatch(pattern, t)) for t in texts] == [True, True, False]
        return
    said = (f"regex {json.dumps(pattern)} cannot be compiled: it names two groups m, at positions {first} and {second}, "
            "and Python's re, which reads a regex here, takes a group's name once (ECMA 262 takes one again only in "
            "another alternative); rename one, or make the second a group that captures nothing, (?:...)")
    assert pattern[first:].startswith(("(?<m>", "(?P<m>")) and pattern[second:].startswith(("(?<m>", "(?P<m>"))
    assert _refused_alike(backend, pattern) == said + (f": write {json.dumps(offer)}" if offer else "")
    if offer:
        built = backend.compile(regex=offer).regex
        for text in texts:
            assert bool(re.fullmatch(built, text)) == bool(regex_module.fullmatch(pattern, text)), text


@pytest.mark.parametrize("pattern, first, second, offer, texts", [
    (r"(?P<m>a)|(?P<m>b)", 0, 9, r"(?P<m>a)|(?:b)", ["a", "b", "ab", ""]),
    # (ECMA's (?<m>, which the engine reads as a plain group, is kept as written, and counts for no repeat)
    (r"(?<x>c)(?P<m>a)|(?<m>z)|(?P<m>b)", 7, 24, r"(?<x>c)(?P<m>a)|(?<m>z)|(?:b)", ["ca", "z", "b", "a", "cz"]),
    (r"(?P<m>a)(?P<m>b)", 0, 8, r"(?P<m>a)(?:b)", ["ab", "a", "b"]),
    (r"(?P<m>\p{L})|(?P<m>b)", 0, 13, None, []),  # (its offer holds a \p{...} class, which no schema may hold here: none)
])
def test_a_group_name_given_twice_in_a_schema_pattern_is_named_with_the_fix(pattern, first, second, offer, texts):
    """The engine refused a schema pattern naming two of Python's groups alike, (?P<m>a)|(?P<m>b),
    with only "redefinition of group name 'm' as group 2 ...; fix the pattern", where regex= names
    the name and the fix. It now says so in the schema's framing. gen() and a %%lm cell take the
    pattern, as they take others Python's re alone refuses: the regex package reads it, so a backend
    may. The reference for the offer: the regex package, which takes a name twice,
    matches the pattern as the offer, and the engine builds the offer."""
    import lmnb
    from lmnb.template.options import check_literal

    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
    assert lmnb.gen("x", json_schema=schema).params.json_schema == schema
    assert check_literal("gen", "json_schema", schema) is None
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex(schema)
    said = (f"JSON schema at #/properties/a/pattern: the pattern {json.dumps(pattern)} cannot be compiled: it names "
            f"two groups m, at positions {first} and {second}, and Python's re, which reads a schema's pattern here "
            "(jsonschema checks each output with it), takes a group's name once (ECMA 262 takes one again only in "
            "another alternative); rename one, or make the second a group that captures nothing, (?:...)")
    assert str(in_engine.value) == said + (f": write {json.dumps(offer)}" if offer else "")
    if offer:
        built = schema_to_regex({"type": "string", "pattern": offer})
        for text in texts:
            assert bool(re.fullmatch(built, json.dumps(text))) == bool(regex_module.fullmatch(pattern, text)), text


@pytest.mark.parametrize("pattern, offer, texts", [
    (r"(?P<a>x)(?P<a>y)(?P<a>z)", r"(?P<a>x)(?:y)(?:z)", ["xyz", "xy", "x"]),
    (r"x(?<y>\d)(?<a>a)|(?<a>b)(?<a>c)", r"x(?P<y>\d)(?P<a>a)|(?:b)(?:c)", ["x1a", "bc", "b", "x1"]),
])
def test_a_group_name_given_three_times_is_counted_right(backend, pattern, offer, texts):
    """(?P<a>x)(?P<a>y)(?P<a>z) was said to name "two groups a, at positions 0 and 8", of a regex
    and of a schema's pattern alike: it names three, and the fix is to rename all but one. The
    positions counted by hand; the offer matches as the regex package, which takes a name again,
    matches the pattern."""
    places = [i for i in range(len(pattern)) if pattern.startswith(("(?<a>", "(?P<a>"), i)]
    assert len(places) == 3
    where = f"{places[0]}, {places[1]} and {places[2]}"
    words = (f"it names three groups a, at positions {where}, and Python's re, which reads {{}}, takes a group's name "
             "once (ECMA 262 takes one again only in another alternative); rename all but one, or make each after the "
             f"first a group that captures nothing, (?:...): write {json.dumps(offer)}")
    assert _refused_alike(backend, pattern) == (f"regex {json.dumps(pattern)} cannot be compiled: "
                                                + words.format("a regex here"))
    built = backend.compile(regex=offer).regex
    for text in texts:
        assert bool(re.fullmatch(built, text)) == bool(regex_module.fullmatch(pattern, text)), text
    if "(?<" in pattern:  # (a schema's ECMA groups the engine reads as plain ones: no name repeated there)
        return
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(in_engine.value) == (f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} cannot be compiled: "
                                    + words.format("a schema's pattern here (jsonschema checks each output with it)"))


_NO_REFERENCE = ("constrained decoding cannot do a back-reference, in ECMA's syntax or Python's (patterns compile to a "
                 "finite automaton): repeat the group's pattern instead of referring to it")


@pytest.mark.parametrize("pattern, reference, at", [
    (r"(?P<n>a)\g<n>", r"\g<n>", 8),  # (the regex package's reference; Python's \g<n> is replacement syntax)
    (r"(?<n>a)\k'n'", r"\k'n'", 7),  # (.NET's and PCRE's)
    (r"(?<n>a)\k{n}", r"\k{n}", 7),  # (Perl's)
])
def test_a_back_reference_in_another_dialects_syntax_is_refused_as_one(backend, pattern, reference, at):
    """A schema's (?P<n>a)\\g<n> was offered "(?P<n>a)g<n>" and (?<n>a)\\k'n' "(?<n>a)k'n'" (the
    reference read as an identity escape), literal text that means another thing: the regex
    package matches "aa" with the first, not "ag<n>". gen() said only "bad escape". Both now refuse
    it as the back-reference it is, in the words every back-reference refusal uses, with no offer."""
    import lmnb

    if "\\g" in pattern:
        assert regex_module.fullmatch(pattern, "aa") and not regex_module.fullmatch(pattern, "ag<n>")
    words = (f"has a back-reference {reference} at position {at}: it matches again the very text the group n matched, "
             f"which no regular language expresses; {_NO_REFERENCE}")
    assert _refused_alike(backend, pattern) == f"regex {json.dumps(pattern)} {words}"
    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", json_schema=schema)
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex(schema)
    assert str(at_gen.value) == str(in_engine.value) == f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} {words}"


@pytest.mark.parametrize("pattern, reference, at, held", [
    (r"\k<n>", r"\k<n>", 0, "it names no group"),
    (r"(?P<n>a)\k<m>", r"\k<m>", 8, "its named groups: n"),
    (r"(?<n>a)(?<o>b)\g<m>", r"\g<m>", 14, "its named groups: n, o"),
])
def test_a_back_reference_to_no_group_says_there_is_none(backend, pattern, reference, at, held):
    """regex=r"(?P<n>a)\\k<m>" was said to match "again the very text the group m matched", though
    the pattern has no group m: it now says so, naming the groups it has, then why no group would
    help."""
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} has a back-reference {reference} at position {at} to a group {reference[3]}, "
        f"which the pattern does not have ({held}); even with such a group, {_NO_REFERENCE}")


def test_anchors_at_the_edges_are_dropped_as_xgrammar_drops_them(backend):
    # SGLang programs write regex=r"^\d{3}$": xgrammar drops such anchors; they were refused here
    from lmnb_engine.regex_edges import without_edge_anchors

    for anchored, bare in ((r"^\d{3}$", r"\d{3}"), (r"^yes$|^no$", "yes|no"), (r"\Aab\Z", "ab"),
                           (r"(?i)^yes$", "(?i)yes"), (r"[$^]|(a|^b)$", r"[$^]|(a|^b)"), (r"[]|^]x$", "[]|^]x"),
                           (r"a\$", r"a\$"), (r"a\\$", "a\\\\"), (r"\^a", r"\^a")):
        assert without_edge_anchors(anchored) == bare, anchored
    assert backend.to_regex(regex=r"^yes$|^no$") == backend.to_regex(regex="yes|no")
    # the same whole matches, by Python's re, on every string over the patterns' alphabet up to length 3
    strings = ["".join(p) for n in range(4) for p in itertools.product("ab$^|", repeat=n)]
    for anchored in (r"^a$|^b", r"^(a|b)+$", r"\Aa|b\Z", r"^[$^]$", r"^a\$$|\^b", r"^a|(b|a)$"):
        bare = without_edge_anchors(anchored)
        assert [x for x in strings if re.fullmatch(anchored, x)] == [x for x in strings if re.fullmatch(bare, x)]


def test_a_schema_pattern_with_a_unicode_block_gets_a_fix_that_works():
    """A schema pattern with \\p{InGreek} was told to "constrain the whole output with regex=, where
    \\p{...} works", which refuses it too (Rust's regex has no Unicode blocks). The fix offered is the
    block as a range, U+0370-U+03FF (Unicode's Blocks.txt: "0370..03FF; Greek and Coptic"), which
    the schema check then takes and jsonschema reads as meant."""
    from lmnb_engine.json_schema import loaded_schema
    from lmnb_engine.regex_errors import regex_problem

    with pytest.raises(ValueError) as info:
        loaded_schema({"type": "string", "pattern": "^\\p{InGreek}+$"})
    said = str(info.value)
    # (ECMA 262, JSON Schema's dialect, has no block: the u flag's words offer the pattern with its ranges)
    assert said.endswith('; write "^[\\\\u0370-\\\\u03ff]+$" for the class [\\u0370-\\u03ff]') and "regex=" not in said, said
    assert regex_problem("^\\p{InGreek}+$") is not None  # (regex= refuses it: offering it was wrong)
    fixed = loaded_schema({"type": "string", "pattern": "^[\\u0370-\\u03ff]+$"})
    assert [jsonschema.Draft202012Validator(fixed).is_valid(text) for text in ("\u0370\u03b1\u03ff", "\u036f", "\u0400", "ab")] == [
        True, False, False, False]


@pytest.mark.parametrize(
    "schema, names",
    [
        ({"type": "object", "properties": {"a": {"type": "string", "foo": 1}}}, ['"foo"', "#/properties/a"]),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
         ["has uniqueItems", "only over items that list their values", "drop uniqueItems"]),
        ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 3},
         ["uniqueItems over 2 distinct item value(s) and minItems 3"]),
        ({"type": "array", "items": {"enum": list(range(65))}, "uniqueItems": True}, ["65 item values", "limit of 64"]),
        ({"type": "array", "items": {"enum": list(range(20))}, "uniqueItems": True, "minItems": 2, "maxItems": 5},
         ["leave 21679 arrays", "limit of 1000"]),
        ({"not": {"type": "string"}}, ['"not"']),
        ({"type": "object", "patternProperties": {"^a": {"type": "string"}}}, ['"patternProperties"']),
        ({"type": "string", "format": "ipv6"}, ['"ipv6"', "supported formats: date, date-time, duration"]),
        ({"type": "integer", "minimum": 5, "maximum": 3}, ["5 <= n <= 3"]),
        ({"type": "string", "pattern": "(?<=a)b"}, ["lookbehind"]),
        ("{not json", ["not valid JSON"]),
        # outlines-core concatenates allOf branches: '{"a":1}{"b":"x"}' is not even JSON
        ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, ['"allOf" with 2 subschemas', "merge them"]),
        # it alternates oneOf like anyOf: an integer matches both branches, which oneOf forbids
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, ["branches 0 and 1", "numbers", '"anyOf"']),
        ({"oneOf": [{"const": "auto"}, {"type": "string"}]}, ['branches 0 and 1 that can both accept "auto"', '"anyOf"']),
        ({"oneOf": [{"type": "integer", "minimum": 0}, {"enum": [-1, 5]}]}, ["branches 0 and 1 that can both accept 5"]),
        # only provably disjoint branches pass: these let '{"b": 99}', '[]', '2' and '"a"' through
        ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                    {"type": "object", "properties": {"b": {"type": "integer"}}}]}, ["can both accept objects"]),
        ({"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "items": {"type": "string"}}]},
         ["can both accept arrays"]),
        ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}, ["can both accept numbers"]),
        ({"oneOf": [{"type": "string", "pattern": "^a+$"}, {"type": "string", "pattern": "^a*$"}]},
         ["can both accept strings"]),
        ({"$defs": {"s": {"type": "string"}}, "oneOf": [{"$ref": "#/$defs/s"}, {"anyOf": [{"type": "string"}]}]},
         ["can both accept strings"]),
        ({"enum": []}, ['empty "enum"']),  # outlines-core makes these match only the empty string
        ({"type": "object", "properties": {"a": {"anyOf": []}}}, ["#/properties/a/anyOf", "should be non-empty"]),
        ({"type": []}, ["#/type is not a valid JSON Schema"]),
        # the meta-schema (outlines-core said only "Unsupported type: objekt")
        ({"type": "objekt"}, ['#/type is not a valid JSON Schema: "objekt" is not a JSON type; did you mean "object"?']),
        ({"type": ["Integer", "nul", "xyz"]}, ['#/type is not a valid JSON Schema: "Integer" is not a JSON type; did you '
                                               'mean "integer"?; "nul" is not a JSON type; did you mean "null"?; "xyz" is '
                                               'not a JSON type (the types: "array",']),
        ({"$schema": {}, "type": "string"}, ["#/$schema must be a string"]),  # jsonschema raised TypeError
        ({"type": "object", "properties": 5}, ['#/properties is not a valid JSON Schema: "properties" must be an '
                                               "object (each property's name and its schema"]),
        # jsonschema writes the values it names as Python does ('object', True): they are JSON's here
        ({"type": "object", "required": True}, ['#/required is not a valid JSON Schema: "required" must be an array '
                                                '(the names of the required properties, e.g. ["name"]), not true: '
                                                'write [true]']),
        # a required self-reference: no finite value validates (outlines-core cut it with an invalid '{}')
        ({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
         ["no finite valid value", '"#" at #/properties/child', "make the recursion optional"]),
        ({"$defs": {"x": {"type": "integer"}}, "properties": {"p": {"$ref": "#/$defs/x", "maximum": 3}}},
         ['#/properties/p has "maximum" beside "$ref"', "move them into that schema"]),
        ({"$ref": "other.json#/$defs/x"}, ['"other.json#/$defs/x" at #', "another document"]),
        ({"properties": {"p": {"$ref": "#/$defs/missing"}}}, ['"#/$defs/missing" at #/properties/p', "points at nothing"]),
        ({"properties": {"x": False}, "required": ["x"]}, ["no valid value", "false at #/properties/x"]),
        # a pointer into a value: its keywords were never checked ('{"b": 4}' for minimum 5)
        ({"properties": {"b": {"$ref": "#/$defs/h/default"}}, "$defs": {"h": {"default": {"type": "integer",
                                                                                     "minimum": 5}}}},
         ['"#/$defs/h/default" at #/properties/b points into "default", which holds no schema']),
        # a pointer that only the rewritten copy held (jsonschema: PointerToNowhere on every output)
        ({"properties": {"a": {"type": ["integer", "string"], "minimum": 5}, "b": {"$ref": "#/properties/a/anyOf/1"}}},
         ['points at nothing in this schema (no "anyOf" there)']),
        # (NaN and the infinities: "a value JSON cannot represent (Out of range float values are not JSON
        # compliant)", naming neither the place nor the fix)
        ({"const": float("nan")}, ["JSON schema at #/const is NaN, which is no JSON number; write a number"]),
        ({"type": "number", "maximum": float("inf")}, ['JSON schema at #/maximum is Infinity, which is no JSON number; '
                                                       'write a number, or leave "maximum" out for no bound']),
        ({"properties": {"a": {"type": "array", "maxItems": -float("inf")}}},
         ['JSON schema at #/properties/a/maxItems is -Infinity, which is no JSON number; write a number, or leave '
          '"maxItems" out for no bound']),
        ({"properties": {"minimum": {"enum": [1, float("nan")]}}},
         ["JSON schema at #/properties/minimum/enum/1 is NaN, which is no JSON number; write a number"]),
        ({"const": 2**64 + 1}, ["lists the integer 18446744073709551617, beyond 2**53"]),  # written as 1.8e+19
        ({"type": "array", "minItems": 3, "maxItems": 1}, ["minItems 3 above maxItems 1"]),  # "error building NFA"
        # classes are written out, case folding is not: (?i)^[^a-z]+$ let '"K"' through
        ({"type": "string", "pattern": "(?i)^[^a-z]+$"}, ["case-insensitive matching (?i)"]),
        ({"type": "string", "pattern": "^(?i:[^k])$"}, ["case-insensitive matching (?i)"]),
        # what outlines-core dropped without a word: the 'type' ('1' matched), the required 'b' ('{"a": 9}'),
        # minItems ('[5]'), and the escaping of a key ('{"q"": null}')
        ({"type": "string", "anyOf": [{"type": "integer"}, {"type": "string"}]}, ['"type" beside "anyOf"']),
        ({"anyOf": [{"type": "integer"}], "oneOf": [{"type": "string"}]}, ['"oneOf" beside "anyOf"']),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
         ['requires "b", which has no schema under "properties"']),
        ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3}, ["1 prefixItems and minItems"]),
        ({"type": "object", "properties": {'q"': {"type": "null"}}}, ['object key "q\\""', "rename it"]),
        ({"const": {"a\\b": 1}}, ['object key "a\\\\b"']),
        # a length beside a pattern is folded into its one open-ended part: here there are two
        ({"type": "string", "pattern": "^[a-z]+[0-9]+$", "maxLength": 8},
         ["cannot be narrowed to at most 8 characters", "more than one place", "into the pattern"]),
        ({"type": "string", "pattern": "^([a-z]+,)*$", "maxLength": 8}, ["repeats a part whose length varies"]),
        ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 2000}, ["would count to 2000", "limit of 1000"]),
        ({"type": "string", "pattern": "^(?:a{999})+$", "maxLength": 999000},  # 1000 x 999, nested
         ["would count to 999000 (nested repeats multiplied)", "limit of 1000"]),
        ({"type": "string", "pattern": "^(ab|cde)$", "minLength": 4}, ["has no match of at least 4 characters"]),
        ({"type": "string", "format": "date", "maxLength": 9}, ['format "date"', "no match of at most 9"]),
        # the location, and the bounds as written, in every message
        ({"properties": {"p": {"type": "string", "pattern": "x(^a|b)"}}}, ["JSON schema at #/properties/p/pattern: the pattern", "'^' anchor"]),
        ({"properties": {"n": {"type": "integer", "minimum": 0.5, "maximum": 0.7}}},
         ["at #/properties/n (minimum 0.5 and maximum 0.7)", "no integer"]),
        ({"properties": {"c": {"const": "a\ud800"}}}, ["at #/properties/c", "lone surrogate"]),  # "Expected a valid JSON string"
        ({"type": "string", "pattern": "^\\p{L}+$"}, ['at #/pattern: the pattern "^\\\\p{L}+$" uses a \\p{...} class',
                                                   "Python's re, and re has no such classes", "regex=, where \\p{...} works"]),
        # (a backslash, "p", and an open group: refused for the group, not as a \p{...} class)
        ({"type": "string", "pattern": "\\\\p("}, ['at #/pattern: the pattern "\\\\\\\\p(" cannot be compiled: it is not a valid '
                                               "regular expression (missing ), unterminated subpattern at position 3)"]),
        # said only '"a(b" is not a "regex"'; worded and placed as gen(regex="a(b") words it (the group opens at 1)
        ({"properties": {"x": {"type": "string", "pattern": "a(b"}}},
         ['JSON schema at #/properties/x/pattern: the pattern "a(b" cannot be compiled: it is not a valid regular '
          "expression (missing ), unterminated subpattern at position 1); fix the pattern"]),
        ({"type": "string", "format": "date-time", "maxLength": 25},
         ['format "date-time"', "more than one place", "the format fixes the shape"]),
        # (a pointer to nothing is refused as the schema is loaded, before the listed values are read)
        ({"enum": [[1]], "items": {"$ref": "#/$defs/nope"}}, ['"#/$defs/nope" at #/items points at nothing',
                                                              'no definition "nope"']),
        # (an anchor: not loaded); the reference as written, where the message showed ("")
        ({"enum": [[1]], "items": {"$ref": "#nope"}}, ['$ref beside its listed values that points at nothing in '
                                                       'this schema ("#nope")']),
        ({"$id": "https://example.com/s", "enum": [[1]], "items": {"$ref": "#%6Eope"}},
         ['points at nothing in this schema ("#%6Eope")']),
        ({"$defs": {"a": {"$ref": "#nope"}}, "enum": [[1]], "items": {"$ref": "#/$defs/a"}},
         ['points at nothing in this schema ("#nope")']),
        # a true branch accepts everything ({} passes both): this raised AttributeError 'bool' has no 'get'
        ({"oneOf": [{"type": "object"}, True]}, ['"oneOf" branches 0 and 1', "objects"]),
        ({"const": "a", "enum": [False, {"b": 1}]}, ['const "a"', "does not pass its own enum"]),
        ({"oneOf": [{"type": "number", "minimum": 3}, True]}, ['"oneOf" branches 0 and 1', "numbers"]),
    ],
)
def test_unsupported_schema_is_named(backend, schema, names):
    with pytest.raises(GrammarError) as info:
        backend.to_regex(json_schema=schema)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("schema, valid, invalid", [
    ({"type": "object", "additionalProperties": False}, ["{}", "{ }"], ['{"a": 1}']),
    # bounds beside a string, a format beside a number (OpenAPI's int64) constrain nothing: they were refused
    ({"type": "string", "minimum": 3}, ['"x"'], ["3"]),
    ({"type": "integer", "format": "int64", "maximum": 5}, ["5"], ["6", '"5"']),
    # pydantic's SecretStr and bytes: any string
    ({"type": "string", "format": "password", "maxLength": 2}, ['"ab"'], ['"abc"']),
    # object and array keywords beside a type that has neither constrain nothing (outlines-core wrote '{}')
    ({"type": "string", "additionalProperties": False}, ['"x"'], ["{}"]),
    ({"type": ["integer", "null"], "items": {"type": "string"}, "propertyNames": {"enum": ["a"]}}, ["3", "null"],
     ["[]", "{}"]),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, ["12", '"x"'], ["1.5", "true"]),
    ({"allOf": [{"type": "integer"}]}, ["7"], ['"7"']),
    # tuples built in Python mean arrays (the meta-schema check saw a tuple as no array)
    ({"type": ("string", "null"), "enum": ("x", None)}, ['"x"', "null"], ['"y"', "1"]),
    # branches of one type that their bounds, or a required tag (a discriminated union), keep apart
    ({"oneOf": [{"type": "integer", "maximum": 9}, {"type": "integer", "minimum": 10}]}, ["3", "12"], ['"3"']),
    ({"oneOf": [{"type": "integer", "exclusiveMaximum": 10}, {"type": "integer", "minimum": 10}]}, ["9", "10"], []),
    ({"$defs": {"cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "n": {"type": "integer"}},
                        "required": ["kind", "n"]},
                "dog": {"type": "object", "properties": {"kind": {"enum": ["dog"]}, "n": {"type": "integer"}},
                        "required": ["kind", "n"]}},
      "oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]},
     ['{"kind": "cat", "n": 1}', '{"kind": "dog", "n": 2}'], ['{"kind": "cow", "n": 1}', '{"n": 1}']),
    # listed values that no other branch accepts ("x" is not generated: it fails its own type)
    ({"oneOf": [{"type": "integer", "enum": ["x", 1]}, {"type": "string"}]}, ["1", '"x"', '"y"'], ["2", "null"]),
    # bounded and date subschemas that are never generated (an unused $defs entry, additionalProperties
    # beside properties) left their placeholder out of the regex: "internal error: placeholder missing"
    ({"properties": {"a": {"type": "integer"}}, "required": ["a"], "$defs": {"x": {"type": "integer", "minimum": 3}}},
     ['{"a": 1}'], ['{"a": "x"}', "{}"]),
    ({"properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": {"format": "date"}},
     ['{"a": "x"}'], ['{"a": 1}']),
    # JSON pointers with RFC 6901 escapes, into properties, and through the root's $id
    ({"$defs": {"a~b": {"type": "integer"}, "c/d": {"type": "null"}}, "required": ["p", "q"],
      "properties": {"p": {"$ref": "#/$defs/a~0b"}, "q": {"$ref": "#/$defs/c~1d"}}},
     ['{"p": 1, "q": null}'], ['{"p": null, "q": 1}']),
    ({"properties": {"a": {"type": "integer", "maximum": 5}, "b": {"$ref": "#/properties/a"}}, "required": ["a", "b"]},
     ['{"a": 1, "b": 5}'], ['{"a": 1, "b": 6}']),
    ({"$id": "https://example.com/s", "$defs": {"x": {"enum": ["y"]}}, "$ref": "https://example.com/s#/$defs/x"},
     ['"y"'], ['"x"']),
    # any value: outlines-core rendered {} as an ungrouped alternation ("null" matched this object schema),
    # and refused true and a schema of annotations only (pydantic's typing.Any)
    ({"type": "object", "properties": {"x": {}}, "required": ["x"]}, ['{"x": true}', '{"x": [1, {"a": null}]}'],
     ["null", "1", '"a"', "{}"]),
    ({"type": "object", "properties": {"x": {"title": "X"}}, "required": ["x"]}, ['{"x": "s"}'], ["{}"]),
    ({"type": "array", "items": True, "maxItems": 2}, ['[1, "a"]', "[]"], ["[1, 2, 3]"]),
    # no value (false): an optional property is left out, an array left empty, a branch dropped
    ({"type": "object", "properties": {"x": False, "y": {"type": "integer"}}, "required": ["y"]}, ['{"y": 1}'],
     ['{"x": 1, "y": 1}']),
    ({"type": "array", "items": False}, ["[]"], ["[1]"]),
    ({"anyOf": [False, {"type": "null"}]}, ["null"], ["1"]),
    # listed values are filtered by every keyword beside them (maxItems was ignored: '[1, 2, 3]')
    ({"enum": [[1, 2, 3], [1]], "maxItems": 2}, ["[1]"], ["[1, 2, 3]"]),
    ({"enum": [{}, {"a": 1}], "required": ["a"], "properties": {"a": {}}}, ['{"a": 1}'], ["{}"]),
    # listed values beside properties or prefixItems are the grammar (outlines-core wrote the object: '{"a": 7}')
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "enum": [{"a": 1}]}, ['{"a": 1}'], ['{"a": 7}', "{}"]),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "enum": [[1]]}, ["[1]"], ["[8]"]),
    # listed values are filtered by keywords holding a $ref too (only type/format/pattern/lengths/bounds
    # were checked there, so '["s"]' and '{}' were written)
    ({"enum": [[1], ["s"], []], "items": {"$ref": "#/$defs/x"}, "$defs": {"x": {"type": "integer"}}},
     ["[1]", "[]"], ['["s"]']),
    ({"enum": [{}, {"a": 1}, {"a": "s"}], "required": ["a"], "properties": {"a": {"$ref": "#/$defs/x"}},
      "$defs": {"x": {"type": "integer"}}}, ['{"a": 1}'], ["{}", '{"a": "s"}']),
    # beside listed values, required/prefixItems/anyOf/oneOf/allOf only filter them (they were refused:
    # "requires 'a', which has no schema under 'properties'", "'enum' beside 'anyOf'" ...)
    ({"type": "object", "enum": [{"a": 1}, {"b": 2}], "required": ["a"]}, ['{"a": 1}'], ['{"b": 2}']),
    ({"enum": [[1], [1, 2]], "prefixItems": [{"type": "integer"}, {"type": "integer"}], "maxItems": 1},
     ["[1]"], ["[1, 2]"]),
    ({"enum": [1, "s", None], "anyOf": [{"type": "integer"}, {"type": "null"}]}, ["1", "null"], ['"s"']),
    ({"enum": [1, 2, "a"], "oneOf": [{"type": "integer"}, {"minimum": 2}]}, ["1", '"a"'], ["2"]),
    ({"const": 3, "allOf": [{"type": "integer"}, {"minimum": 2}]}, ["3"], ["2"]),
    # const beside enum: both hold (the enum's values were written, and the const dropped)
    ({"const": "b", "enum": ["a", "b", 0]}, ['"b"'], ['"a"', "0"]),
    ({"type": "object", "properties": {"a": {"const": 1, "enum": [-1, False, 1]}}, "required": ["a"]},
     ['{"a": 1}'], ['{"a": -1}', '{"a": false}']),
    # the content vocabulary is annotation (validators do not check it: '"!!"' is no base64, and valid);
    # it was refused as "cannot be enforced while decoding"
    ({"type": "string", "contentEncoding": "base64", "contentMediaType": "image/png", "maxLength": 4},
     ['"ab"', '"!!"'], ['"abcde"', "1"]),
    ({"type": "object", "properties": {"d": {"type": "string", "contentMediaType": "application/json",
                                             "contentSchema": {"type": "integer"}}}, "required": ["d"]},
     ['{"d": "x"}'], ['{"d": 1}']),
    # a pattern may spell a placeholder name: it is no placeholder ('{"a": 3, "b": 1}' matched)
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^LMNB\\x50LACEHOLDER1X$"},
                                       "b": {"type": "integer", "minimum": 0}}, "required": ["a", "b"]},
     ['{"a": "LMNBPLACEHOLDER1X", "b": 1}'], ['{"a": 3, "b": 1}']),
    # the placeholders of bounded numbers are named with text the schema does not hold
    ({"properties": {"a": {"type": "integer", "minimum": 0}, "b": {"const": "LMNBPLACEHOLDER0X"}}, "required": ["a", "b"]},
     ['{"a": 3, "b": "LMNBPLACEHOLDER0X"}'], ['{"a": 3, "b": 1}']),
])
def test_schemas_next_to_the_refused_ones_still_compile_to_exactly_their_instances(backend, schema, valid, invalid):
    regex = backend.to_regex(json_schema=schema)
    for text in valid + invalid:
        jsonschema_ok = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert (regex_module.fullmatch(regex, text) is not None) == jsonschema_ok == (text in valid), text


DRAFT_7 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("schema, valid, invalid", [
    # drafts 3 to 2019-09 write a tuple as a list of items: outlines-core failed with "Unsupported JSON
    # Schema structure", and additionalItems was refused as unsupported
    ({"$schema": DRAFT_7, "type": "array", "items": [{"type": "integer"}, {"enum": ["x"]}], "additionalItems": False},
     ['[1, "x"]'], ['["x", 1]', '[1, "x", 2]', '[1, "y"]']),
    ({"$schema": DRAFT_7, "type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "boolean"},
      "maxItems": 3}, ["[1]"], ["[1, 2]", "[true]", "[1, true, true, true]"]),
    ({"$schema": DRAFT_7, "type": "object", "properties": {"p": {"type": "array", "items": [{"type": "null"}]}},
      "required": ["p"]}, ['{"p": [null]}'], ['{"p": [1]}']),
    # prefixItems is no draft 7 keyword: its items schema is every item's ('[1]' matched)
    ({"$schema": DRAFT_7, "type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"},
      "maxItems": 2}, ["[]", '["a"]', '["a", "b"]'], ["[1]", '[1, "a"]']),
    # beside a schema for every item, additionalItems constrains nothing
    ({"$schema": DRAFT_7, "type": "array", "items": {"type": "integer"}, "additionalItems": False, "maxItems": 2},
     ["[]", "[1, 2]"], ['["a"]', "[1, 2, 3]"]),
])
def test_draft_7_tuple_items_mean_what_draft_7_says(backend, schema, valid, invalid):
    # (as in 2020-12, exactly the tuple's items are written: a subset of the arrays draft 7 accepts)
    regex = regex_module.compile(backend.to_regex(json_schema=schema))
    validator = jsonschema.validators.validator_for(schema)(schema)
    for text in valid + invalid:
        in_language = regex.fullmatch(text) is not None
        assert in_language == validator.is_valid(json.loads(text)) == (text in valid), text
    for text in random_matches(regex, list('[]{}":, 1-ptruefalsnx'), walks=20):
        assert validator.is_valid(json.loads(text)), text


def test_pattern_outside_the_vocabulary_is_reported_not_decoded(tmp_path):
    """A vocabulary without '~' (and without byte fallback) cannot spell 'a~b'; a branch that needs
    '~' to finish must not be offered at all."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["abc xyz cab bay"] * 20, trainers.BpeTrainer(vocab_size=40, special_tokens=["</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    vocab = TokenVocabulary(fast)
    assert not vocab.byte_complete
    with pytest.raises(GrammarError, match="can never be satisfied"):
        compile_grammar("(ab)*~", vocab)
    grammar = compile_grammar("(xa+~|yb)", vocab)  # the x-branch can never finish
    allowed = {vocab.token_bytes[t] for t in grammar.allowed_ids(grammar.initial_state)}
    assert allowed and all(b.startswith(b"y") for b in allowed)


def test_compile_errors_are_cached(tokenizer):
    cache = GrammarCache()
    backend = GrammarBackend(tokenizer, cache=cache)
    try:
        fut = backend.submit("a(")  # a syntax error only the automaton library sees
        with pytest.raises(GrammarError, match="cannot be compiled"):
            fut.result()
        assert backend.submit("a(") is fut  # the same pattern fails the same way: not compiled again
        cache.clear()
        assert backend.submit("a(") is not fut
    finally:
        backend.shutdown()


def test_whitespace_patterns_are_grouped_and_only_json_whitespace():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=" |\n"))  # spliced in ungrouped: '\n9 '
    assert rx.fullmatch('{ "a" :\n1 }') and not rx.fullmatch("\n9 ") and not rx.fullmatch('{ "a" :\n1 ')
    for pattern in (r"\s*", "x?", "[^a]?", '"?'):  # \s: U+00A0 between tokens is no JSON
        with pytest.raises(GrammarError, match="other than JSON whitespace"):
            schema_to_regex(schema, whitespace_pattern=pattern)


@pytest.mark.parametrize("pattern", [
    "a{,2}", "a{,}b", "{ab}", "a{x}", "b{1,2", r"\0", r"[\1b]", r"a\040b", r"\N{SPACE}a", "(?#c{)a{,1}", "[a[]",
    "[]a]{,2}", "[^]a]", r"\x41|a", "a{2}|b{1,}",
    # read otherwise: set operations at the start of a class, a range from ']', a backspace, '\<'
    "[^&&a]", "[^~~a]", "[&&]", "[]-a]", "[^]-a]", r"[\b]", r"\<a\>", "a]", r"(?#\))x",
    "(?x) a [ ]{,2} # a comment [ with a bracket\n b", r"(?i)A[b]", r"\,\-\&\~\#\ ",
])
def test_python_spellings_the_automaton_library_reads_otherwise_match_what_python_matches(pattern):
    # each failed with a bare "error building NFA" ('[a[]' compiled as a nested class)
    _assert_automaton_matches_as_python(pattern, "abx{},[]: \x00\x01\x08A12^&~<>#-\\", 3)


@pytest.mark.parametrize("pattern", [
    r"\w{1,2}", r"\W{1,2}", r"\s+", r"\S{2}", r"\d\D", r"[\w.]{2}", r"[^\w.]{2}", r"[a\W]{2}", r"[^\s\d]{2}",
])
def test_categories_hold_the_characters_python_gives_them(pattern):
    # the automaton's Unicode tables: \w held combining marks (the Devanagari vowel sign in 'हि',
    # U+0300) and U+2054, not '½'; \s lacked \x1c-\x1f
    _assert_automaton_matches_as_python(pattern, "a_1.½\u2054\u093f\u0300\x1c \u00a0\u0663", 2)


@pytest.mark.parametrize("pattern", [
    "(?i)i", "(?i)I+", "(?i)ı", "(?i)İ", r"(?i)\u0131", r"(?i)\x49", "(?i)[i]", "(?i)[ı]k", "(?i)[^i]", "(?i)[^ıa]",
    "(?i)[h-j]", "(?i)[^h-j]", "(?i)[İ-ı]", r"(?i)[\w]", r"(?i)[^\Wi]", "(?i)(?-i:i)", "(?-i:i)(?i:ı)", "i(?i:İ)",
    "(?i)k", "(?i)[^k]", "(?i)s", "(?i)a[^a-z]?", "(?i)(?P<i>i)",
])
def test_case_insensitive_patterns_fold_the_dotted_and_dotless_i_as_python_does(pattern):
    # Python's (?i) folds i, I, ı and İ together; the library's simple case folding only i and I,
    # so "(?i)i" refused "İstanbul"'s first letter, and "(?i)[^i]" took "ı"
    _assert_automaton_matches_as_python(pattern, "iIıİkK\u212asSſa", 2)


@pytest.mark.parametrize("pattern, python_pattern", [
    (r"(?i)[\p{N}i]", "(?i)[5i]"), (r"(?i)[^\p{N}i]", "(?i)[^5i]"), (r"(?i)[\p{N}İ]+", "(?i)[5İ]+"),
])
def test_a_case_insensitive_class_with_a_unicode_class_folds_the_dotted_i_as_one_without(pattern, python_pattern):
    # the dotted and dotless i were added to a class only where it held no Unicode class (Python
    # cannot read one): "(?i)[\p{N}i]" refused "ı" where "(?i)\p{N}|i" took it. Over this
    # alphabet, \p{N} holds only "5", so Python reads the class as python_pattern does
    _assert_automaton_matches_as_python(pattern, "iIıİ5a", 2, lambda _, text: re.fullmatch(python_pattern, text))


def _assert_automaton_matches_as_python(pattern, alphabet, max_len, fullmatch=re.fullmatch):
    """Every text of up to ``max_len`` characters of ``alphabet`` is matched by the automaton built from
    ``automaton_syntax(pattern)`` exactly when Python's ``re.fullmatch`` (or ``fullmatch``) matches it."""
    from outlines_core import Index, Vocabulary

    # between two marker characters of their own (as compile_grammar builds it): outlines-core drops a
    # token out of a complete match into an incomplete one, so the index alone misses such matches
    tokens = {c.encode(): [i] for i, c in enumerate(alphabet + "\U0010fffe\U0010ffff", start=1)}
    start, end = len(alphabet) + 1, len(alphabet) + 2
    index = Index(f"\\x{{10FFFE}}(?:{automaton_syntax(pattern)})\\x{{10FFFF}}", Vocabulary(99, tokens))

    def automaton_matches(text):
        state = index.get_next_state(index.get_initial_state(), start)
        for ch in text:
            state = index.get_next_state(state, alphabet.index(ch) + 1)
            if state is None:
                return False
        return index.get_next_state(state, end) in index.get_final_states()

    for k in range(max_len + 1):
        for chars in itertools.product(alphabet, repeat=k):
            text = "".join(chars)
            assert automaton_matches(text) == bool(fullmatch(pattern, text)), text


def test_classes_that_python_and_the_automaton_read_differently_are_refused(backend):
    for pattern, flagged in [("[[:alpha:]]+", "nested set"), ("[a-c&&b]", "set intersection"), ("[a||b]", "set union")]:
        with pytest.raises(GrammarError, match=f"(?i)possible {flagged}.*Python reads it as literal characters"):
            backend.to_regex(regex=pattern)
    assert backend.submit(backend.to_regex(regex="[0-9]{,3}")).result()  # (the user's spelling, compiled)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for whitespace in ("[ ]{,2}", "\\040?"):  # (those failed with "error building NFA" too)
        backend.submit(backend.to_regex(json_schema=schema, whitespace_pattern=whitespace)).result()


def test_an_ambiguous_class_gets_a_fix_written_from_its_own_pattern():
    # the fix always read '[\\[:alpha:]]' and '[A-Za-z]', whatever the pattern was
    for pattern, fix in [("[a&&b]x", r'write "[a\\&\\&b]x" to mean the characters'),
                         ("d[[:digit:]]+", r'write "d[0-9]+" for [:digit:] (ASCII, as the automaton library reads it), '
                              r'or "d[\\[:digit:]]+" to mean the characters')]:
        with pytest.raises(GrammarError) as e:
            automaton_syntax(pattern)
        assert str(e.value).endswith(fix), str(e.value)
        assert "alpha" not in str(e.value)


@pytest.mark.parametrize("make, message", [
    (lambda: check_regex("[a-z]{1,2000}\u00e9"),
     'regex "[a-z]{1,2000}\u00e9" repeats a part 2000 times (nested repeats multiplied), above the limit of 1000: its '
     'automaton would take too long to build; use an unbounded repeat ("+" or "*") and bound the length with '
     "max_tokens instead"),
    (lambda: check_regex("(?:x)" + "y" * 100 + "{1,2000}"),
     'regex "(?:x)' + "y" * 74 + '\u2026 repeats a part 2000 times'),
    (lambda: automaton_syntax("(?a)\\d"), 'regex "(?a)\\\\d" uses the ASCII flag (?a)'),
    (lambda: automaton_syntax("a(?x:b)"), 'regex "a(?x:b)" scopes the verbose flag to a group'),
    (lambda: automaton_syntax("\\ud800"), 'regex "\\\\ud800" has the surrogate U+D800 outside a class'),
    (lambda: schema_to_regex({"type": "object"}, whitespace_pattern="([a"),
     'whitespace_pattern "([a" is not a valid regular expression'),
    (lambda: schema_to_regex({"type": "object"}, whitespace_pattern="[ a]"),
     'whitespace_pattern "[ a]" can match characters other than JSON whitespace'),
])
def test_a_regex_error_writes_the_pattern_as_json(make, message):
    # they wrote it as Python does ('(?a)\\d'), which the server rewrote for its clients (wire_message)
    with pytest.raises(GrammarError) as e:
        make()
    assert str(e.value).startswith(message), str(e.value)


def test_unicode_property_classes_which_the_engine_reads_pass_the_languages_check(backend):
    """Python's re lacks \\p{L}; the engine's automaton library reads it (as the regex package
    does), and so did the engine, while gen() and a %%lm cell refused it ("bad escape \\p"). They
    leave it to the backend now; a pattern wrong elsewhere too is refused by all three alike,
    where it is wrong."""
    import regex as regex_module

    import lmnb
    from lmnb.template.options import check_literal

    pattern = r"\p{Lu}\P{Lu}?"
    assert lmnb.gen("x", regex=pattern).params.regex == pattern
    assert check_literal("gen", "regex", pattern) is None
    backend.submit(pattern).result()
    _assert_automaton_matches_as_python(pattern, "aA1\u00c9 ", 3, fullmatch=regex_module.fullmatch)

    said = 'regex "\\\\p{L}(" cannot be compiled: it is not a valid regular expression (missing ), unterminated subpattern at position 5); fix the pattern'
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", regex=r"\p{L}(")
    with pytest.raises(GrammarError) as in_engine:
        backend.submit(r"\p{L}(").result()
    assert [str(at_gen.value), check_literal("gen", "regex", r"\p{L}("), str(in_engine.value)] == [said] * 3


@pytest.mark.parametrize("pattern, shown, fix", [
    (r"\p{L&}+", r"\p{L&}", r"write \p{LC} for the cased letters"),
    (r"\p{^Lu}", r"\p{^Lu}", r"write \P{Lu} for its negation"),
    (r"a\P{^Lu}", r"\P{^Lu}", r"write \p{Lu} for its negation"),
    # Unicode blocks (Rust's regex has none), keys it reads no values of, the regex package's own names,
    # surrogates, the Unknown script, a numeric value, a script newer than its tables
    *[(p, c, None) for p, c in [
        (r"\p{Bidi_Class=L}", r"\p{Bidi_Class=L}"), (r"\P{Alpha:Yes}", r"\P{Alpha:Yes}"), (r"\p{Word}+", r"\p{Word}"),
        (r"\p{IsXDigit}", r"\p{IsXDigit}"), (r"\p{Cs}", r"\p{Cs}"),
        (r"\p{Zzzz}", r"\p{Zzzz}"), (r"\p{1/2}", r"\p{1/2}"), (r"x[\p{L}\p{HorizSpace}]+", r"\p{HorizSpace}")]],
])
def test_unicode_classes_that_only_the_regex_package_reads_are_refused_alike_by_name(backend, pattern, shown, fix):
    r"""\p{L&}, \p{^Lu}, Unicode blocks and more pass the regex package, which gen() and a %%lm cell
    checked \p{...} with, but not the engine's automaton library (Rust's regex): they passed gen()
    and failed in the engine with "cannot be compiled to a token index: Failed to build DFA error
    building NFA". All three ask the automaton library now, and refuse them naming the class and
    the fix."""
    import regex as regex_module
    from outlines_core import Index, Vocabulary

    import lmnb
    from lmnb.template.options import check_literal

    regex_module.compile(pattern)  # the regex package reads it; the automaton library does not:
    with pytest.raises(Exception, match="NFA"):
        Index(pattern, Vocabulary(9, {b"a": [1], b"\xce\xa9": [2]}))
    fix = fix or (r"use a general category, a script or a binary property the automaton library reads (\p{L}, \p{Greek}, "
                  r"\p{Alphabetic}), or the characters as a class")
    said = (f"regex {json.dumps(pattern)} uses the class {shown}, which the engine's automaton library (Rust's regex) "
            f"does not read; {fix}")
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", regex=pattern)
    with pytest.raises(GrammarError) as in_engine:
        backend.submit(pattern).result()
    assert [str(at_gen.value), check_literal("gen", "regex", pattern), str(in_engine.value)] == [said] * 3


@pytest.mark.parametrize("pattern, twin", [
    (r"\p{Lu}(?=e)\w+", r"K(?=e)\w+"), (r"(\p{Lu})\1", r"(KKKKKK)\1"),  # (as long: the \1 named where it stands)
    (r"\p{Lu}++", r"K++"),
    (r"\p{Lu}\w+$x", r"K\w+$x"), (r"\p{Lu}{5000}", r"K{5000}"),
])
def test_a_pattern_with_a_unicode_class_gets_the_checks_its_twin_without_gets(backend, pattern, twin):
    # check_regex parsed the pattern with Python's re, which refuses \p: the lookahead, backreference,
    # anchor and repeat checks never ran, and "\p{Lu}{5000}" compiled until its 60 s limit. Each is
    # refused now as its twin with a plain letter is, in the same words
    with pytest.raises(GrammarError) as with_class:
        backend.compile(regex=pattern)  # (what the engine calls: the checks, then the compile)
    with pytest.raises(GrammarError) as plain:
        backend.compile(regex=twin)
    assert str(with_class.value).replace(json.dumps(pattern), "P") == str(plain.value).replace(json.dumps(twin), "P")


@pytest.mark.parametrize("pattern, offer", [
    (r"\p{Lettr}+", r"\p{Letter}+"), (r"[\p{Alphabtic}\d]", r"[\p{Alphabetic}\d]"), (r"\p{^Lettr}", r"\P{Letter}"),
    (r"x\p{xyzzy}", None), (r"\p{Script=Greak}", r"\p{Script=Greek}"),
])
def test_a_class_of_no_known_property_is_refused_by_name_with_the_one_meant(backend, pattern, offer):
    # regex=r"\p{Lettr}+" was told the automaton library "does not read" it and to use a category, a script or
    # a binary property, as \p{InGreek} is, though no reader knows the name: it is told that, with the closest
    # property's pattern offered, which gen() takes and the engine builds (the reference: node's RegExp and the
    # regex package refuse the name, and read the offer's class as the letters, \p{L}, where it names Letter)
    import regex as regex_module

    import lmnb

    cls = re.search(r"\\[pP]\{[^}]*\}", pattern).group()
    with pytest.raises(regex_module.error):
        regex_module.compile(cls)
    said = _refused_alike(backend, pattern)
    head = f"regex {json.dumps(pattern)} uses the class {cls}, which names no Unicode property; "
    if offer is None:
        assert said == head + (r"use a general category, a script or a binary property the automaton library reads "
                               r"(\p{L}, \p{Greek}, \p{Alphabetic}), or the characters as a class")
        return
    meant = re.search(r"\\[pP]\{[^}]*\}", offer).group()
    assert said == head + f"did you mean {meant}? write {json.dumps(offer)}"
    assert lmnb.gen("x", regex=offer).params.regex == offer
    backend.submit(offer).result()
    if "Letter" in meant:
        letters = regex_module.sub(r"\\([pP])\{Letter\}", r"\\\1{L}", offer)
        assert [bool(regex_module.fullmatch(offer, t)) for t in _SAMPLE_TEXTS[:3000]] == [
            bool(regex_module.fullmatch(letters, t)) for t in _SAMPLE_TEXTS[:3000]]


def _perl_fullmatches(pattern: str, texts: list[str]) -> list[bool] | None:
    r"""Whether Perl's regex (PCRE's model, which reads \Q...\E) matches each of ``texts`` whole with
    ``pattern``; None where perl is not at hand."""
    import shutil
    import subprocess

    if not shutil.which("perl"):
        return None
    # (the pattern written into the script: Perl reads \Q...\E in a regex literal, not in an interpolated value;
    # an \E after it ends a quote left open at the pattern's end, and is nothing otherwise)
    script = f"while (my $t = <STDIN>) {{ chomp $t; print(($t =~ m\x01\\A(?:{pattern}\\E)\\z\x01) ? 1 : 0) }}"
    run = subprocess.run(["perl", "-e", script], input="\n".join(texts) + "\n", capture_output=True, text=True,
                         check=True)
    return [c == "1" for c in run.stdout]


@pytest.mark.parametrize("pattern, at, offer", [
    (r"\Qa.b\E", 0, r"a\.b"), (r"x\Q(a)\E+", 1, r"x\(a\)+"), (r"\Q1+1", 0, r"1\+1"),  # (no \E: to the end)
    # (verbose mode skips a space and a "#" comment, which a quote keeps: written as codes, not as themselves)
    (r"(?x)\Qa b\E", 4, r"(?x)a\x20b"), (r"(?x) x \Qa#b\E", 7, r"(?x) x a\x23b"),
])
def test_pcre_quoting_in_a_regex_is_refused_with_its_text_escaped(backend, pattern, at, offer):
    r"""gen(regex=r"\Qa.b\E"), a %%lm cell and the engine said only "bad escape \Q at position 0; fix the
    pattern": PCRE's quoting, which Python's re lacks, is named, with the pattern its text escaped
    offered, which the engine builds and which matches as Perl matches the pattern (the reference,
    where at hand)."""
    import lmnb

    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses \\Q...\\E at position {at}, PCRE's quoting, which Python's re, the regex "
        "package and ECMA 262 lack (they refuse \\Q, or read a bare Q): escape each special character of the text "
        f"instead, as re.escape does: write {json.dumps(offer)}")
    assert lmnb.gen("x", regex=offer).params.regex == offer
    built = backend.compile(regex=offer).regex
    texts = ["a.b", "axb", "x(a)", "x(a))", "xa", "1+1", "11", "Qa.bE", "a b", "ab", "a", "xa#b", "xa"]
    perl = _perl_fullmatches(pattern, texts)
    assert perl is None or perl == [bool(re.fullmatch(built, t)) for t in texts]


def test_each_class_of_no_known_property_in_a_regex_is_offered_the_one_meant(backend):
    r"""regex=r"\p{Lettr}-\p{Nmber}" named the first class alone and offered "write \p{Letter}", the
    pattern with it respelled being refused for the second. Each is named and offered its closest
    (difflib's, as every "did you mean"), in one pattern, which gen() takes and the engine builds:
    it matches as the pattern of the general categories L and N does (the regex package, the
    reference). One with no close name is told the kinds of class to use instead."""
    import regex as regex_module

    import lmnb

    pattern, offer = r"\p{Lettr}-\p{Nmber}", r"\p{Letter}-\p{Number}"
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses the classes \\p{{Lettr}} and \\p{{Nmber}}, which name no Unicode property; "
        f"did you mean \\p{{Lettr}} → \\p{{Letter}}, \\p{{Nmber}} → \\p{{Number}}? write {json.dumps(offer)}")
    assert lmnb.gen("x", regex=offer).params.regex == offer
    built = backend.compile(regex=offer).regex
    for text in ["a-1", "é-٣", "a-b", "1-1", "a1", "-"]:
        assert bool(regex_module.fullmatch(built, text)) == bool(regex_module.fullmatch(r"\p{L}-\p{N}", text)), text
    assert _refused_alike(backend, r"\p{Lettr}\p{xyzzy}") == (
        r'regex "\\p{Lettr}\\p{xyzzy}" uses the classes \p{Lettr} and \p{xyzzy}, which name no Unicode property; did '
        r"you mean \p{Lettr} → \p{Letter}? write \p{Letter}; for \p{xyzzy}, use a general category, a script or a "
        r"binary property the automaton library reads (\p{L}, \p{Greek}, \p{Alphabetic}), or the characters as a class")


@pytest.mark.parametrize("pattern, part", [
    (r"c(?<=x)\p{InGreek}", r"\p{InGreek}"), (r"c(?<=x)[[:alpha:]]", "[[:alpha:]]"), (r"c(?<=x)[\w--\d]", r"[\w--\d]"),
    (r"x\b[a-c&&b]", "[a-c&&b]"), (r"(a)\1[\p{L}-z]", r"[\p{L}-z]"), (r"c(?!x)\p{Lettr}+", r"\p{Lettr}"),
])
def test_no_fix_offered_beside_a_part_the_engine_cannot_build_is_one_it_refuses(backend, pattern, part):
    # gen("x", regex=r"c(?<=x)\p{InGreek}"), a %%lm cell and the engine offered "c(?<=x)[\u0370-\u03ff]": gen()
    # takes it, and the engine refuses it for the lookbehind, as it did each whole pattern offered beside a
    # lookaround, a back-reference or \b. Each quoted pattern offered is now one the engine builds: the part
    # alone, written as it is offered for that part as a pattern by itself (the reference), where the whole
    # pattern so written would hold what the engine refuses; and the engine says so too, in gen()'s words
    import lmnb

    said = _refused_alike(backend, pattern)
    offers = [json.loads(o) for o in re.findall(r'(?:write |, or )("(?:[^"\\]|\\.)*")', said)]
    for offer in offers:
        assert lmnb.gen("x", regex=offer).params.regex == offer
        backend.compile(regex=offer)
    with pytest.raises(GrammarError):  # (the pattern with the part as offered: what was offered before)
        backend.compile(regex=pattern.replace(part, offers[0] if offers else "a"))
    alone = [json.loads(o) for o in re.findall(r'(?:write |, or )("(?:[^"\\]|\\.)*")', _refused_alike(backend, part))]
    # (each offered for the part, quoted, as written, or inside its class's brackets: a range as written)
    assert alone and all(any(form in said for form in (json.dumps(o), o, o[1:-1])) for o in alone), said


def test_unicode_classes_the_automaton_reads_pass(backend):
    # (scripts, categories, binary properties, Rust's "Is" prefix and \p{ASCII} are no blocks; \p{Age=3.0},
    # \p{IsLu} and \p{sc!=Latn} are Rust's, which the regex package refuses)
    import lmnb

    for pattern in [r"\p{Greek}", r"\p{IsGreek}", r"\p{Script=Greek}", r"\p{LC}", r"\p{ASCII}", r"\p{Alpha}", r"\pL",
                    r"\p{Age=3.0}", r"\p{IsLu}a", r"\p{sc!=Latn}"]:
        assert lmnb.gen("x", regex=pattern).params.regex == pattern
        backend.submit(pattern).result()


def test_a_constraint_not_compiled_for_the_shutdown_is_written_as_json():
    assert str(GrammarCompileStopped.for_shutdown("it's" + "x" * 100)) == (
        'the constraint "it\'s' + "x" * 75 + '\u2026 was not compiled: the engine shut down')


def test_an_invalid_regex_is_worded_alike_by_gen_a_cell_and_the_engine(backend):
    """One invalid pattern had three wordings: gen(regex=...)'s "regex 'a(b' is not a valid regular
    expression: ...", a %%lm cell's "invalid regex: ...", and the engine's (and so the server's)
    below, with the pattern written as JSON. All three say the engine's now."""
    import lmnb
    from lmnb.template import TemplateSyntaxError, parse

    said = ('regex "a(b" cannot be compiled: it is not a valid regular expression (missing ), unterminated '
            "subpattern at position 1); fix the pattern")  # the group left open begins at index 1
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", regex="a(b")
    with pytest.raises(TemplateSyntaxError) as in_cell:
        parse('{gen x regex="a(b"}')
    with pytest.raises(GrammarError) as in_engine:
        backend.submit("a(b").result()
    assert [str(at_gen.value), in_cell.value.message, str(in_engine.value)] == [said] * 3


@pytest.mark.parametrize("pattern", [r"(?<=a+)b", r"x(?<!a|bc)"])
def test_an_invalid_regex_re_places_nowhere_is_worded_without_a_position(backend, pattern):
    """Python's re refuses a look-behind of varying width as the pattern compiles, with no position
    (re.error.pos None): gen(), a %%lm cell and the engine said "(look-behind requires fixed-width
    pattern at position None)", and so did a schema's pattern, which ECMA 262 takes: that one is
    refused for its lookbehind now, which no backend builds, of any width."""
    with pytest.raises(re.error) as python:
        re.compile(pattern)
    assert python.value.pos is None
    error = python.value.msg  # "look-behind requires fixed-width pattern"
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression ({error}); fix the pattern")
    with pytest.raises(GrammarError) as in_schema:
        backend.compile(json_schema=json.dumps({"type": "string", "pattern": pattern}))
    assert str(in_schema.value).startswith(f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} uses a ")
    assert str(in_schema.value).endswith("lookbehind, which constrained decoding cannot support (patterns compile to a "
                                         "finite automaton): express the condition with character classes and alternatives")


@pytest.mark.parametrize("schema, said", [
    # (type's meta-schema is an anyOf of a type name or a list of them: jsonschema said only '"strng" is not
    # valid under any of the given schemas'; the closest type is the one difflib ranks first)
    ('{"type": "strng"}', 'JSON schema at #/type is not a valid JSON Schema: "strng" is not a JSON type; did you mean '
                          '"string"? (the types: "array", "boolean", "integer", "null", "number", "object", "string")'),
    ({"type": "object", "properties": 5}, 'JSON schema at #/properties is not a valid JSON Schema: "properties" must be '
                                          'an object (each property\'s name and its schema, e.g. {"name": {"type": '
                                          '"string"}}), not 5'),
    # (jsonschema said '5 is not valid under any of the given schemas', with no fix, where "strng" got one)
    ({"type": 5}, 'JSON schema at #/type is not a valid JSON Schema: "type" must be a type name (a string) or an array '
                  'of them, not 5; e.g. "string" or ["string", "null"] (the types: "array", "boolean", "integer", '
                  '"null", "number", "object", "string")'),
    ({"type": ["string", None]}, 'JSON schema at #/type is not a valid JSON Schema: "type" must be a type name (a '
                                 'string) or an array of them; the array holds null, no type name; e.g. "string" or '
                                 '["string", "null"] (the types: "array", "boolean", "integer", "null", "number", '
                                 '"object", "string")'),
    ({"type": []}, 'JSON schema at #/type is not a valid JSON Schema: "type" must name at least one type; [] allows none '
                   '(the types: "array", "boolean", "integer", "null", "number", "object", "string")'),
    ({"type": ["string", "null", "string"]}, 'JSON schema at #/type is not a valid JSON Schema: "type" names "string" '
                                             'twice; name each type once'),
    # (jsonschema said '5 is not of type "string"': the keyword, what it takes and the fix are named)
    ({"type": "string", "format": 5}, 'JSON schema at #/format is not a valid JSON Schema: "format" must be a string (a '
                                      'format name, e.g. "date-time"), not 5'),
    ({"type": "string", "pattern": 5}, 'JSON schema at #/pattern is not a valid JSON Schema: "pattern" must be a string '
                                       '(a regular expression, e.g. "^[a-z]+$"), not 5'),
    ({"type": "object", "required": "a"}, 'JSON schema at #/required is not a valid JSON Schema: "required" must be an '
                                          'array (the names of the required properties, e.g. ["name"]), not "a": write '
                                          '["a"]'),
    ({"type": "object", "required": ["a", 1]}, 'JSON schema at #/required/1 is not a valid JSON Schema: each item of '
                                               '"required" must be a string; item 1 is 1'),
    ({"type": "object", "properties": []}, 'JSON schema at #/properties is not a valid JSON Schema: "properties" must be '
                                           'an object (each property\'s name and its schema, e.g. {"name": {"type": '
                                           '"string"}}), not []'),
    ({"enum": 5}, 'JSON schema at #/enum is not a valid JSON Schema: "enum" must be an array (the values allowed, e.g. '
                  '[1, 2]), not 5: write [5]'),
    # (a number in quotes: the fix is the number without them, where it is of the type the keyword takes)
    ({"type": "string", "minLength": "3"}, 'JSON schema at #/minLength is not a valid JSON Schema: "minLength" must be '
                                           'an integer, not "3": write "minLength": 3'),
    ({"type": "array", "items": {"maxItems": " 2 "}}, 'JSON schema at #/items/maxItems is not a valid JSON Schema: '
                                                      '"maxItems" must be an integer, not " 2 ": write "maxItems": 2'),
    ({"type": "number", "maximum": "-1.5"}, 'JSON schema at #/maximum is not a valid JSON Schema: "maximum" must be a '
                                            'number, not "-1.5": write "maximum": -1.5'),
    # (a number in quotes that the keyword does not take: what is wrong with it and the fix; each
    # had no fix, "must be an integer, not "3.5"", as if no number were there)
    ({"type": "string", "maxLength": "3.5"}, 'JSON schema at #/maxLength is not a valid JSON Schema: "maxLength" must '
                                             'be an integer, not "3.5": a number of characters is a whole number; '
                                             'write "maxLength": 3 or "maxLength": 4'),
    ({"type": "string", "maxLength": 3.5}, 'JSON schema at #/maxLength is not a valid JSON Schema: "maxLength" must '
                                           'be an integer, not 3.5: a number of characters is a whole number; write '
                                           '"maxLength": 3 or "maxLength": 4'),  # (unquoted: the same fix)
    ({"type": "string", "minLength": "3.0"}, 'JSON schema at #/minLength is not a valid JSON Schema: "minLength" must '
                                             'be an integer, not "3.0": write "minLength": 3'),
    ({"type": "string", "minLength": "-1"}, 'JSON schema at #/minLength is not a valid JSON Schema: "minLength" must '
                                            'be an integer, not "-1": a number of characters cannot be negative; '
                                            'write 0 or more, or leave "minLength" out for no bound'),
    ({"type": "array", "maxItems": "-1"}, 'JSON schema at #/maxItems is not a valid JSON Schema: "maxItems" must be '
                                          'an integer, not "-1": a number of items cannot be negative; write 0 or '
                                          'more, or leave "maxItems" out for no bound'),
    ({"type": "number", "minimum": "NaN"}, 'JSON schema at #/minimum is not a valid JSON Schema: "minimum" must be a '
                                           'number, not "NaN": NaN is not a number (JSON has no NaN); write a number, '
                                           'or leave "minimum" out for no bound'),  # (Python's json reads it)
    ({"type": "string", "minLength": "NaN"}, 'JSON schema at #/minLength is not a valid JSON Schema: "minLength" must '
                                             'be an integer, not "NaN": NaN is not a number (JSON has no NaN); write a '
                                             'whole number, 0 or more, or leave "minLength" out for no bound'),
    ({"type": "number", "maximum": "-Infinity"}, 'JSON schema at #/maximum is not a valid JSON Schema: "maximum" must '
                                                 'be a number, not "-Infinity": JSON has no Infinity; write a number, or '
                                                 'leave "maximum" out for no bound'),
    ({"type": "number", "maximum": "1e400"}, 'JSON schema at #/maximum is not a valid JSON Schema: "maximum" must be a '
                                             'number, not "1e400": it is past the largest number a double holds (about '
                                             '1.8e308); write a number, or leave "maximum" out for no bound'),
    ({"type": "integer", "multipleOf": "0"}, 'JSON schema at #/multipleOf is not a valid JSON Schema: "multipleOf" '
                                             'must be a number, not "0": it must be above 0 (only 0 is a multiple of '
                                             '0); write a number above 0, or leave "multipleOf" out'),
    ({"type": "number", "multipleOf": "-2.5"}, 'JSON schema at #/multipleOf is not a valid JSON Schema: "multipleOf" '
                                               'must be a number, not "-2.5": it must be above 0; write "multipleOf": '
                                               '2.5, whose multiples are the same'),
    # (unquoted, jsonschema's words were "0 is less than or equal to the minimum of 0")
    ({"type": "number", "multipleOf": 0}, 'JSON schema at #/multipleOf is not a valid JSON Schema: "multipleOf" is 0: it '
                                          'must be above 0 (only 0 is a multiple of 0); write a number above 0, or '
                                          'leave "multipleOf" out'),
    ({"type": "integer", "multipleOf": -3}, 'JSON schema at #/multipleOf is not a valid JSON Schema: "multipleOf" is -3: '
                                            'it must be above 0; write "multipleOf": 3, whose multiples are the same'),
    ({"type": "integer", "multipleOf": "2"}, 'JSON schema at #/multipleOf is not a valid JSON Schema: "multipleOf" '
                                             'must be a number, not "2": write "multipleOf": 2'),
    ({"type": "array", "items": 5}, 'JSON schema at #/items is not a valid JSON Schema: a schema must be an object or a '
                                    'boolean (true: any value, false: none), not 5'),
    ("[1]", "json_schema must be a JSON object or a boolean, got [1]"),
    ("{x", "json_schema is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
           "pass a dict or a JSON string"),
    (False, "JSON schema false accepts no value: no output could validate; pass true or {} for any JSON value"),
    # json's decoder and encoder recurse per level: a RecursionError escaped all three (the server's 500)
    ("[" * 100_000, "JSON schema nests too deeply to check (a pattern's parentheses, or the schema itself); flatten it"),
    (functools.reduce(lambda inner, _: {"not": inner}, range(5000), {}),
     "JSON schema nests too deeply to check (a pattern's parentheses, or the schema itself); flatten it"),
], ids=["type strng", "properties 5", "type 5", "type holds null", "type []", "type twice", "format 5", "pattern 5",
         "required a", "required 1", "properties []", "enum 5", "minLength 3", "maxItems 2", "maximum -1.5",
         "maxLength 3.5", "maxLength 3.5 unquoted", "minLength 3.0", "minLength -1", "maxItems -1", "minimum NaN", "minLength NaN",
         "maximum -Infinity", "maximum 1e400", "multipleOf 0", "multipleOf -2.5", "multipleOf 0 unquoted",
         "multipleOf -3 unquoted", "multipleOf 2", "items 5", "an array", "not JSON", "false", "deep JSON text", "deep dict"])
def test_a_bad_json_schema_is_refused_at_the_gen_call_in_the_engines_words(schema, said):
    """gen(json_schema=...) checked only that a string was JSON: a typo in a schema surfaced once
    the program ran and the engine compiled it. It is refused at the call now, with the engine's
    own check and words, as a %%lm cell refuses a literal one."""
    import lmnb
    from lmnb.template.options import check_literal

    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", json_schema=schema)
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex(schema)
    assert [str(at_gen.value), check_literal("gen", "json_schema", schema), str(in_engine.value)] == [said] * 3


@pytest.mark.parametrize("schema", [
    *SCHEMAS, True, "true", {}, json.dumps(SCHEMAS[0]),
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "integer"}]},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "minimum": 0, "exclusiveMinimum": True},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
], ids=lambda s: None)
def test_a_schema_the_engine_takes_passes_the_gen_call_unchanged(schema):
    import lmnb

    schema_to_regex(schema)  # (the engine takes it)
    sent = lmnb.gen("x", json_schema=schema).params.json_schema
    if isinstance(schema, type):  # (a pydantic class: its schema is sent)
        assert sent == pydantic_json_schema(schema)
    else:
        assert sent is schema


def _refused_alike(backend, pattern):
    """The messages gen(), a %%lm cell's check and the engine give ``pattern`` (they must be one)."""
    import lmnb
    from lmnb.template.options import check_literal

    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", regex=pattern)
    with pytest.raises(GrammarError) as in_engine:
        backend.compile(regex=pattern)
    said = [str(at_gen.value), check_literal("gen", "regex", pattern), str(in_engine.value)]
    assert said == [said[0]] * 3, said
    return said[0]


def _automaton_builds(pattern):
    from outlines_core import Index, Vocabulary

    try:
        Index(pattern, Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)}))  # (every byte: every text)
    except ValueError as e:
        assert "NFA" in str(e)
        return False
    return True


@pytest.mark.parametrize("pattern, alphabet", [
    (r"\p{Lu}a{,2}", "aA["), (r"\p{Lu}{,2}x", "Ax"), (r"[\p{Lu}[]{1,2}", "aA["), (r"\p{Lu}{ab}", "A{}ab"),
    (r"[^\W\p{Lu}]", "aA1_-"), (r"[\p{Lu}\d]{2}", "aA1"), (r"[^\p{Lu}a]", "aAb-"), (r"\P{Lu}\x41", "aA"),
])
def test_a_pattern_with_a_unicode_class_is_respelled_as_its_twin_without_one(backend, pattern, alphabet):
    # automaton_syntax returned a pattern Python cannot parse unchanged: \p{Lu}a{,2} and [\p{Lu}[] failed in
    # the engine with the library's bare "error building NFA" (a{,2} and [a[] compiled). The regex package
    # reads Python's syntax and the classes, so it says what each must match
    backend.compile(regex=pattern)
    _assert_automaton_matches_as_python(pattern, alphabet, 2, fullmatch=regex_module.fullmatch)


@pytest.mark.parametrize("pattern, fix", [
    (r"\p{InGreek}+", r"[\u0370-\u03ff]+"), (r"x\p{Block=Greek}", r"x[\u0370-\u03ff]"),
    (r"\p{Greek_and_Coptic}+", r"[\u0370-\u03ff]+"), (r"\p{Block:Greek}", r"[\u0370-\u03ff]"),
    (r"[\p{InGreek}\d]+", r"[\u0370-\u03ff\d]+"), (r"[^\p{InGreek}]", r"[^\u0370-\u03ff]"),
    (r"\P{InGreek}", r"[\u0000-\u036f\u0400-\ud7ff\ue000-\U0010ffff]"), (r"\p{PosixDigit}", r"[\u0030-\u0039]"),
])
def test_a_unicode_block_is_offered_as_its_code_point_ranges_not_a_script(backend, pattern, fix):
    # \p{InGreek}+ was refused with "use ... a script ... (\p{L}, \p{Greek}, ...)": \p{Greek} is the Greek
    # script (U+1F00 and more, not U+03E2), not the Greek and Coptic block U+0370-U+03FF the user named
    from outlines_core import Index, Vocabulary

    assert _refused_alike(backend, pattern).endswith(f"; write {json.dumps(fix)}, its characters as code-point ranges")
    backend.compile(regex=fix)  # the fix passes gen(), a cell and the engine
    import lmnb

    assert lmnb.gen("x", regex=fix).params.regex == fix
    # and the automaton matches what the regex package (the Unicode Character Database) makes of the block
    alphabet = "x09a\u036f\u0370\u03e2\u03ff\u0400\u1f00\U0001d6a8"
    index = Index(fix, Vocabulary(99, {c.encode(): [i] for i, c in enumerate(alphabet)}))
    state = index.get_initial_state()
    if fix.startswith("x"):
        state = index.get_next_state(state, 0)
    allowed = set(index.get_allowed_tokens(state))
    meant = regex_module.compile(pattern.removeprefix("x").removesuffix("+"))
    assert {c for i, c in enumerate(alphabet) if i in allowed} == {c for c in alphabet if meant.fullmatch(c)}


@pytest.mark.parametrize("pattern, cls, fix", [
    (r"\p{Script=Hrkt}", r"\p{Script=Hrkt}", r"[\p{Script=Hiragana}\p{Script=Katakana}]"),
    (r"\p{scx=Katakana_Or_Hiragana}+", r"\p{scx=Katakana_Or_Hiragana}", r"[\p{scx=Hiragana}\p{scx=Katakana}]+"),
    (r"[\p{Hrkt}a]", r"\p{Hrkt}", r"[\p{Script=Hiragana}\p{Script=Katakana}a]"),
])
def test_hrkt_in_a_regex_is_told_why_and_offered_hiragana_and_katakana(backend, pattern, cls, fix):
    # \p{Script=Hrkt} was told "use a general category, a script or a binary property ...", with no word of
    # why, where a schema's pattern is told (2736c62): Hrkt is ISO 15924's code for Hiragana and Katakana
    # together, which Unicode gives no character (the regex package's Script and Script_Extensions classes
    # of it hold none); a regex= now gets the same words and the two scripts, which the engine builds
    from lmnb_engine.regex_properties import _HRKT_WORDS

    every = "".join(map(chr, range(0x3000, 0x3100))) + "a"
    assert regex_module.search(cls, every) is None
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses the class {cls}, {_HRKT_WORDS}which the engine's automaton library (Rust's "
        f"regex) does not read; write {json.dumps(fix)}, the two scripts it names")
    backend.compile(regex=fix)
    # (U+3042 あ is Hiragana, U+30A2 ア Katakana, U+4E00 一 Han)
    assert [bool(regex_module.fullmatch(fix, c)) for c in "\u3042\u30a2\u4e00"] == [True, True, False]


_LOOKAHEAD = ("uses a lookahead, which constrained decoding cannot support (patterns compile to a finite automaton): "
              "express the condition with character classes and alternatives")


@pytest.mark.parametrize("pattern, cls, why, fix, then", [
    (r"(?=a)\p{sc=Hrkt}", r"\p{sc=Hrkt}", "hrkt", r"write \p{sc=Hrkt} as [\p{sc=Hiragana}\p{sc=Katakana}], the two scripts "
     "it names", r"(?=a)[\p{sc=Hiragana}\p{sc=Katakana}]"),
    (r"(?=a)\p{InGreek}", r"\p{InGreek}", "", r"write \p{InGreek} as [\u0370-\u03ff], its characters as code-point "
     "ranges", r"(?=a)[\u0370-\u03ff]"),
])
def test_a_regex_class_the_engine_cannot_build_beside_a_lookahead_names_both(backend, pattern, cls, why, fix, then):
    # regex=r"(?=a)\p{sc=Hrkt}" was told only of its class, and to write it as the two scripts, where the pattern
    # so written is then refused for its lookahead (as (?=a)b is): the words now name that too, so the user learns
    # of both at once
    from lmnb_engine.regex_properties import _HRKT_WORDS

    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses the class {cls}, {_HRKT_WORDS if why else ''}which the engine's automaton "
        f"library (Rust's regex) does not read; {fix}; then regex {json.dumps(then)} {_LOOKAHEAD}")
    assert _refused_alike(backend, then) == f"regex {json.dumps(then)} {_LOOKAHEAD}"
    assert _refused_alike(backend, "(?=a)b") == f'regex "(?=a)b" {_LOOKAHEAD}'


_EVERY = r"[\u0000-\ud7ff\ue000-\U0010ffff]"  # (every character: surrogates are none)


@pytest.mark.parametrize("pattern, cls, offer", [
    (r"\p{IsHrkt}", r"\p{IsHrkt}", r"[\p{Script=Hiragana}\p{Script=Katakana}]"),
    (r"\P{Hrkt}", r"\P{Hrkt}", _EVERY),
    (r"[^\p{Hrkt}]", r"\p{Hrkt}", _EVERY),
    (r"[^\p{Hrkt}a]", r"\p{Hrkt}", r"[\u0000-\u0060\u0062-\ud7ff\ue000-\U0010ffff]"),  # (all but "a", U+0061)
    (r"[^\P{Hrkt}]", r"\P{Hrkt}", None),
])
def test_hrkt_in_a_negated_regex_class_is_read_as_its_negation_is(backend, pattern, cls, offer):
    # \P{Hrkt} was offered every character (the regex package's reading: Hrkt holds none), but [^\p{Hrkt}] the two
    # scripts' negation, which leaves out kana, and [^\P{Hrkt}] told to write \P{Hrkt} as a class inside it, which is
    # then refused as empty; \P{Hrkt} had no word of why, \p{IsHrkt} the generic words. Each now has Hrkt's words, a
    # negated class the ranges of what it matches so read (the reference: the regex package, on each range's ends
    # and the characters beside them), or, for one that matches nothing, that
    from lmnb_engine.regex_properties import _HRKT_WORDS

    what = "the two scripts it names" if "Script" in (offer or "") else "its characters as code-point ranges"
    fix = (f"write {json.dumps(offer)}, {what}" if offer else
           r"Hrkt holding no character, \P{Hrkt} is every character and the class [^\P{Hrkt}] matches none: write the "
           "class you meant")
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses the class {cls}, {_HRKT_WORDS}which the engine's automaton library (Rust's "
        f"regex) does not read; {fix}")
    if offer is None:
        assert regex_module.search(pattern, "".join(map(chr, range(0x110000)))) is None
        return
    backend.compile(regex=offer)
    if "Script" not in offer:
        ends = "\x00`ab\u3041\u3042\u30a2\ud7ff\ue000\U0010ffff"
        assert [bool(regex_module.fullmatch(offer, c)) for c in ends] == [
            bool(regex_module.fullmatch(pattern, c)) for c in ends]


# Rust's regex's POSIX classes, from its documentation (ASCII), each the characters of the alphabet below
_RUST_POSIX = {"alpha": "azAZfF", "digit": "09", "alnum": "09azAZfF", "upper": "AZF", "lower": "azf", "xdigit": "09afAF",
               "space": "\t\n\x0b\x0c\r ", "punct": "!/:@[`{~_-", "word": "09azAZfF_", "blank": "\t ",
               "cntrl": "\x00\t\n\x0b\x0c\r\x1f\x7f", "graph": "09azAZfF!/:@[`{~_-", "print": "09azAZfF!/:@[`{~_- "}


@pytest.mark.parametrize("name", sorted(_RUST_POSIX))
def test_a_posix_class_is_offered_first_as_its_characters(backend, name):
    # [[:alpha:]]+ was refused offering first "[\\[:alpha:]]+", the literal characters (which generated ':]'),
    # and [:space:] as \s (Unicode spaces: not Rust's [:space:]); [:punct:] had no offer at all
    alphabet = "09azAZfF!/:@[`{~_-\t\n\x0b\x0c\r \x00\x1f\x7f\xa0\xe9\u2003"
    pattern = f"[[:{name}:]]"
    said = _refused_alike(backend, pattern)
    head = "Python reads it as literal characters, the automaton library as a POSIX class or a set operation; write "
    fixes = said.split(head, 1)[1]
    fix = json.loads(fixes.split(f" for [:{name}:]")[0])
    assert fixes.endswith(f'(ASCII, as the automaton library reads it), or "[\\\\[:{name}:]]" to mean the characters')
    backend.compile(regex=fix)
    matched = {c for c in alphabet if re.fullmatch(fix, c)}
    assert matched == set(_RUST_POSIX[name]), matched  # Python reads the fix as Rust read the POSIX class
    from outlines_core import Index, Vocabulary

    index = Index(pattern, Vocabulary(99, {c.encode(): [i] for i, c in enumerate(alphabet, start=1)}))
    assert {alphabet[i - 1] for i in index.get_allowed_tokens(index.get_initial_state()) if i != 99} == matched


def test_posix_classes_in_one_set_are_offered_together(backend):
    said = _refused_alike(backend, r"[[:alpha:][:digit:]_]+")
    assert '; write "[A-Za-z0-9_]+" for [:alpha:], [:digit:] (ASCII' in said, said
    assert lmnb_gen_takes(r"[A-Za-z0-9_]+")


def test_the_engine_names_an_anchored_pattern_as_the_user_wrote_it(backend):
    # the engine drops edge anchors before its checks, and named the trimmed pattern: "regex \"[[:alpha:]]\":
    # Possible nested set at position 1", where gen() said "^[[:alpha:]]$" and position 2
    said = _refused_alike(backend, "^[[:alpha:]]$")
    assert said == ('regex "^[[:alpha:]]$": Possible nested set at position 2 — Python reads it as literal characters, '
                    'the automaton library as a POSIX class or a set operation; write "^[A-Za-z]$" for [:alpha:] (ASCII, '
                    r'as the automaton library reads it), or "^[\\[:alpha:]]$" to mean the characters'), said
    with pytest.raises(GrammarError) as e:  # (one gen() takes: the engine's own check, named as written)
        backend.compile(regex=r"^(?>ab)c$")
    assert str(e.value).startswith(r'regex "^(?>ab)c$" uses an atomic group'), str(e.value)


def _rust_matches(pattern, alphabet, length):
    """The strings of ``length`` characters of ``alphabet`` the automaton library (Rust's regex) matches whole."""
    from outlines_core import Index, Vocabulary

    index = Index(pattern, Vocabulary(999, {c.encode(): [i] for i, c in enumerate(alphabet)}))
    found = set()
    for chars in itertools.product(range(len(alphabet)), repeat=length):
        state = index.get_initial_state()
        for i in chars:
            state = None if state is None else index.get_next_state(state, i)
        if state is not None and index.is_final_state(state):
            found.add("".join(alphabet[i] for i in chars))
    return found


@pytest.mark.parametrize("pattern, fix, names, length", [
    ("[[:alpha:]][[:digit:]]", "[A-Za-z][0-9]", "[:alpha:], [:digit:]", 2),  # (two blocks: one rewrite of both)
    ("[[:alpha:]&&a]", "[a]", "[:alpha:]", 1),  # (Rust's intersection: "a" alone)
    ("[[:^alpha:]]", "[^A-Za-z]", "[:^alpha:]", 1),  # (Rust's negated POSIX class)
    ("x[[:alpha:]--[a-f]]", "x[A-Zg-z]", "[:alpha:]", 2),  # (Rust's difference)
])
def test_a_posix_class_in_a_set_operation_or_beside_another_gets_a_rewrite_that_works(backend, pattern, fix, names,
                                                                                     length):
    # only the first block was read ("[A-Za-z][[:digit:]]" still refused, so no rewrite was offered), and a
    # negated POSIX class or a set operation got only the literal rewrite, which still holds "&&"
    said = _refused_alike(backend, pattern)
    assert f"; write {json.dumps(fix)} for {names} (ASCII, as the automaton library reads it), or " in said, said
    assert lmnb_gen_takes(fix)
    alphabet = "xaAfgzZ09:_-&[]^ \t"
    strings = {"".join(p) for p in itertools.product(alphabet, repeat=length)}
    assert _rust_matches(pattern, alphabet, length) == {t for t in strings if re.fullmatch(fix, t)}


# every ASCII character but NUL, and a few beyond (a letter, an Arabic-Indic digit: \w and \d to both readers)
_ASCII_AND_MORE = "".join(map(chr, range(1, 128))) + "\u00e9\u0663"


@pytest.mark.parametrize("pattern, fix, names, length", [
    ("[a-z&&[^aeiou]]+", "[b-df-hj-np-tv-z]+", "[a-z&&[^aeiou]]", 1),  # (Rust's intersection)
    ("[a-z--[aeiou]]", "[b-df-hj-np-tv-z]", "[a-z--[aeiou]]", 1),  # (difference)
    ("[a-f~~d-k]", "[a-cg-k]", "[a-f~~d-k]", 1),  # (symmetric difference)
    (r"[\d&&[0-4]]", "[0-4]", r"[\d&&[0-4]]", 1),  # (a Unicode class cut down to ASCII)
    ("[^a-z&&[^aeiou]]", "[^b-df-hj-np-tv-z]", "[^a-z&&[^aeiou]]", 1),  # (all but some ASCII: negated)
    ("[[a-c]]x[a-c--b]", "[a-c]x[ac]", "[[a-c]], [a-c--b]", 2),  # (a nested class; two classes at once)
])
def test_a_set_operation_of_ascii_sets_is_offered_as_the_characters_it_holds(backend, pattern, fix, names, length):
    # a set operation or nested class with no POSIX class in it got only the literal rewrite, which a user
    # meaning Rust's set operation does not want; where what it holds is ASCII it is offered as those characters
    said = _refused_alike(backend, pattern)
    assert f"; write {json.dumps(fix)} for {names} (its characters, as the automaton library reads it), or " in said, said
    assert lmnb_gen_takes(fix)
    alphabet = _ASCII_AND_MORE if length == 1 else "abcx[]-&"
    strings = {"".join(p) for p in itertools.product(alphabet, repeat=length)}
    assert _rust_matches(pattern.rstrip("+"), alphabet, length) == {t for t in strings if re.fullmatch(fix, t)}


@pytest.mark.parametrize("pattern, fix, name", [
    (r"[\w--\d]", r"[^\W\d]", "difference"), (r"[\w&&[^\d]]+", r"[^\W\d]+", "intersection"),
    (r"x[\S&&[^\d]]", r"x[^\s\d]", "intersection"),
])
def test_a_set_operation_of_two_perl_classes_is_offered_as_one_negated_class(backend, pattern, fix, name):
    # [\w--\d] (Unicode letters, é too, and "_" to Rust) got only the literal rewrite: as for two \p{..}
    # classes, A and not B is offered as not (not A or B)
    said = _refused_alike(backend, pattern)
    assert f"; write {json.dumps(fix)} for the set {name}, or " in said, said
    assert lmnb_gen_takes(fix)
    pattern, fix = pattern.lstrip("x").rstrip("+"), fix.lstrip("x").rstrip("+")
    # (but U+001C to U+001F, which Python's \s holds and Rust's does not: the engine reads \s as Python does)
    alphabet = _ASCII_AND_MORE.translate({c: None for c in range(0x1C, 0x20)})
    assert _rust_matches(pattern, alphabet, 1) == {c for c in alphabet if re.fullmatch(fix, c)}


@pytest.mark.parametrize("pattern", [r"[\w--[a-z]]", "[a||b]"])
def test_a_set_operation_with_characters_beyond_ascii_or_a_union_gets_only_the_literal_rewrite(backend, pattern):
    # [\w--[a-z]] holds non-ASCII letters to Rust, by tables the regex package (which the characters are
    # read with) may not share; "||" is a union to that package and two "|" to Rust: no characters offered
    import regex

    rust = _rust_matches(pattern, _ASCII_AND_MORE, 1)
    assert "\u00e9" in rust or rust != {c for c in _ASCII_AND_MORE if regex.fullmatch("(?V1)" + pattern, c)}
    said = _refused_alike(backend, pattern)
    at = said.index(" at position ") + len(" at position ")
    i = int(said[at:].split(" ", 1)[0])
    escaped = pattern[:i] + "\\" + pattern[i] + "\\" + pattern[i + 1] + pattern[i + 2:]
    assert said.endswith(f"; write {json.dumps(escaped)} to mean the characters"), said


def test_a_posix_rewrite_leaves_a_bracket_inside_a_class_as_python_reads_it(backend):
    # Python (and the engine, which respells a class as Python reads it) takes the "[" of "[a[:digit:]]" as a literal,
    # unflagged; only the class it flags, opening with "[:alpha:]", is the ambiguity, and only it is rewritten
    said = _refused_alike(backend, "[[:alpha:]]x[a[:digit:]]")
    assert '; write "[A-Za-z]x[a[:digit:]]" for [:alpha:] (ASCII, as the automaton library reads it), or ' in said, said
    assert lmnb_gen_takes("[A-Za-z]x[a[:digit:]]")


@pytest.mark.parametrize("pattern, at", [(r"^ab\u$", 3), ("^a(b$", 2), ("^ab)$", 3), (r"\Aa|^b)$", 6)])
def test_the_engine_places_a_syntax_error_of_an_anchored_pattern_as_gen_does(backend, pattern, at):
    # Python's error on the pattern less its edge anchors, which the automaton library also refuses,
    # was named with the user's pattern but placed in the trimmed one ("^ab)$": position 2, not 3)
    said = _refused_alike(backend, pattern)
    assert "not a valid regular expression" in said and f" at position {at})" in said, said


@pytest.mark.parametrize("pattern", ["[[:digit:]--&&]", "[[:digit:][&&a]]", "[[:alpha:]&&[&&a]]", "[[:digit:][--a]]"])
def test_a_set_operation_with_an_empty_operand_gets_no_rewrite_read_otherwise_than_the_library_reads_it(backend,
                                                                                                    pattern):
    # the rewrite was computed with the regex package's V1 sets, which read an operator with an empty
    # operand otherwise than Rust, an empty set there: "[[:digit:]--&&]" was offered as "[0-9]", where the
    # library matches no character; only the literal reading is offered now (the flagged "[" escaped)
    import regex

    alphabet = "5a-&:Z"
    try:
        rust = _rust_matches(pattern, alphabet, 1)
    except ValueError as e:  # (an empty set: the library builds no transition)
        assert "Found no transitions" in str(e)
        rust = set()
    assert rust != {c for c in alphabet if regex.fullmatch("(?V1)" + pattern, c)}
    said = _refused_alike(backend, pattern)
    assert said.endswith(f"; write {json.dumps(pattern[0] + chr(92) + pattern[1:])} to mean the characters"), said


@pytest.mark.parametrize("pattern, warning, literal", [
    (r"[\s&&\S]", "set intersection at position 3", r"[\s\&\&\S]"),  # (complements)
    (r"[\p{L}&&\P{L}]", "set intersection at position 6", r"[\p{L}\&\&\P{L}]"),
    (r"x[\w&&[^\w]]+", "set intersection at position 4", r"x[\w\&\&[^\w]]+"),
    (r"[\d--\d]", "set difference at position 3", r"[\d\-\-\d]"),
    ("[[:alpha:]&&[:digit:]]", "nested set at position 1", r"[\[:alpha:]&&[:digit:]]"),  # (disjoint POSIX classes)
])
def test_a_set_operation_that_holds_no_character_is_named_so_not_offered_as_an_empty_class(backend, pattern, warning,
                                                                                         literal):
    # [\s&&\S] was offered as [^\S\s], and [[:alpha:]&&[:digit:]] as [^\x00-\ud7ff\ue000-\U0010ffff], classes of no
    # character, which the engine then refused ("has a part that matches no text")
    cls = re.sub(r"^x|\+$", "", pattern)
    with pytest.raises(ValueError, match="no transitions"):  # (the library itself: no character leads on)
        _rust_matches(cls, _ASCII_AND_MORE, 1)
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)}: Possible {warning} — Python reads it as literal characters, the "
        f"automaton library as a POSIX class or a set operation; the class {cls} matches no character as the automaton "
        f"library reads it (an empty set, which it refuses): remove it, or write the class you meant; write "
        f"{json.dumps(literal)} to mean the characters")
    assert lmnb_gen_takes(literal)


@pytest.mark.parametrize("pattern, said", [
    # Python's class ends at the first "]": the ")" after it closes no group; "[\\[:alpha:]|)]" was offered
    ("[[:alpha:]|)]", 'write "[A-Za-z|)]" for [:alpha:] (ASCII, as the automaton library reads it); read as Python reads '
     'it, its characters literal ("[\\\\[:alpha:]|)]"), it is refused too (unbalanced parenthesis at position 12)'),
    ("x[[:digit:]a](", 'read as Python reads it, its characters literal ("x[\\\\[:digit:]a]("), it is refused too (missing ), '
     "unterminated subpattern at position 14); fix the pattern"),
])
def test_a_literal_reading_python_cannot_read_is_not_offered(backend, pattern, said):
    assert _refused_alike(backend, pattern).endswith(" a set operation; " + said)


_POSIX_PARTS = ["[:alpha:]", "[:digit:]", "[:^alpha:]", "[:punct:]", "a", "|", ")", "(", "]", "-", "^", "&&", "--", "[a]",
                "Z", "\\]", ":"]
_POSIX_ALPHABET = "a1Z[:]|)-^&_é "


def test_every_reading_offered_for_a_posix_class_is_taken_and_means_what_it_says():
    # random classes with POSIX parts beside groups, "]", ranges and set operators: every spelling offered is
    # taken by gen(); the POSIX or members reading matches what the automaton library reads the pattern as,
    # and the literal one what Python's re reads it as (where it reads it: [a--b], a range down from "a" to
    # Python, is offered as its characters). "[[:alpha:]|)]" was offered "[\\[:alpha:]|)]", which Python cannot
    # read, and "([:Z(--])", Python's range from "(" to "-", as "([:Z(\\-\\-])", without ")"
    from lmnb_engine.regex_errors import regex_problem

    def python_matches(pattern, length):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = re.compile(pattern)
        return {"".join(t) for t in itertools.product(_POSIX_ALPHABET, repeat=length) if compiled.fullmatch("".join(t))}

    rng = random.Random(11)
    checked = {"literal": 0, "library": 0}
    for _ in range(400):
        cls = "[" + "^" * (rng.random() < 0.3) + "".join(rng.choice(_POSIX_PARTS) for _ in range(rng.randint(1, 4))) + "]"
        pattern = rng.choice(["", "x", "("]) + cls + rng.choice(["", "x", ")", "|b", "]"])
        said = regex_problem(pattern)
        if "[:" not in cls or said is None or "Possible" not in said:
            continue
        for offer in (json.loads(t) for t in re.findall(r'(?:write |, or )("(?:[^"\\]|\\.)*")', said)):
            assert regex_problem(offer) is None, (pattern, said)
            literal = said.endswith(f"{json.dumps(offer)} to mean the characters")
            for length in (1, 2):
                try:
                    meant = python_matches(pattern, length) if literal else _rust_matches(pattern, _POSIX_ALPHABET, length)
                except (re.error, ValueError):  # (Python's own reading a bad range; no text of this length)
                    break
                assert python_matches(offer, length) == meant, (pattern, offer, length)
                checked["literal" if literal else "library"] += 1
    assert checked["literal"] > 40 and checked["library"] > 10, checked


_CASELESS_PARTS = ["[:alpha:]", "[:^alpha:]", "[:upper:]", "[:^lower:]", "[:lower:]", "[:digit:]", "a", "b-e", "K", "&&", "--",
                   "[a-k]", "[^a]", "[^B]", "s"]
_CASED_ALPHABET = "aAbBeEkKsS\u212a\u017f1_-&é"  # (with the Kelvin sign and the long s, which fold to k and s)


def test_a_class_offered_under_ignorecase_holds_what_the_library_reads_the_class_to_hold():
    # the members reading wrote the shorter of a class and its complement, worked out without (?i), where the
    # library folds each item before negating it: (?i)[[^B]b-e] (every character) was offered as (?i)[^B], which
    # holds neither "b" nor "B", and (?i)[[:^lower:]K] as (?i)[^a-z], which holds no "k"
    from lmnb_engine.regex_errors import regex_problem

    rng = random.Random(5)
    checked = 0
    for _ in range(200):
        pattern = "(?i)[" + "^" * (rng.random() < 0.4) + "".join(rng.choice(_CASELESS_PARTS)
                                                                 for _ in range(rng.randint(1, 3))) + "]"
        said = regex_problem(pattern)
        if said is None or "Possible" not in said:
            continue
        for offer in (json.loads(t) for t in re.findall(r'(?:write |, or )("(?:[^"\\]|\\.)*")', said)):
            if said.endswith(f"{json.dumps(offer)} to mean the characters"):
                continue
            try:
                meant = _rust_matches(pattern, _CASED_ALPHABET, 1)
            except ValueError:  # (a class of no character of this alphabet)
                continue
            assert _rust_matches(automaton_syntax(offer), _CASED_ALPHABET, 1) == meant, (pattern, offer)
            checked += 1
    assert checked > 30


def test_a_stop_regex_literal_reading_python_cannot_read_is_not_offered():
    from lmnb_engine.params import stop_regex_problem

    assert stop_regex_problem("[[:alpha:]|)]").endswith(
        'write "[)A-Za-z\\\\|]" for its ASCII characters; read as Python reads it, its characters literal '
        '("[\\\\[:alpha:]|)]"), it is refused too (unbalanced parenthesis at position 12)')
    assert stop_regex_problem("[)A-Za-z\\|]") is None


@pytest.mark.parametrize("pattern", [r"[\w--\d][a-c&&b]", r"[\p{L}&&\p{Lu}]x[[:alpha:]]", r"[\w--\d][[:alpha:]]"])
def test_no_reading_is_offered_that_gen_refuses(backend, pattern):
    # a difference of two Perl or Unicode classes was offered as one negated class with the pattern's other
    # ambiguous class left as it was ("[^\\W\\d][a-c&&b]"), and the literal reading escaped only the first class
    # ("[\\w\\-\\-\\d][a-c&&b]"): gen() refused each in turn
    said = _refused_alike(backend, pattern)
    assert " for the set " not in said, said
    offers = [json.loads(text) for text in re.findall(r'"(?:[^"\\]|\\.)*"', said)[1:]]  # (after the pattern itself)
    assert offers and all(lmnb_gen_takes(offer) for offer in offers), offers


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("pattern, fix, operator, chars", [
    # the stop matcher (the regex package's version 0) has no set operations: "&&" is two "&"s, so
    # [[:alpha:]&&a] is the letters, "&" and "a" (offered as [a], the version 1 intersection, before), and
    # [[:alpha:]&&[:digit:]] the letters, "&" and the digits (offered only as literal characters before)
    ("[[:alpha:]&&a]", "[\\&A-Za-z]", "&&", _LETTERS + "&"),
    ("[[:alpha:]&&[:digit:]]", "[\\&0-9A-Za-z]", "&&", _LETTERS + "&0123456789"),
    # a "-" beside a POSIX class ends no range: "a", "-" and the digits; "--z" after one is "-" to "z"
    ("[a-[:digit:]]", "[\\-0-9a]", None, "a-0123456789"),
    ("[[:digit:]--z]", "[\\--z]", "--", "".join(map(chr, range(ord("-"), ord("z") + 1)))),
    # in a negated class, "^" first is a literal: all but (not punctuation, or "^"), the punctuation but "^"
    ("[^^[:^punct:]]", "[!-/:-@\\[-\\]_-`{-\\~]", None, "!\"#$%&'()*+,-./:;<=>?@[\\]_`{|}~"),
])
def test_a_stop_regex_posix_class_is_offered_as_the_stop_matcher_reads_the_rest_of_its_class(pattern, fix, operator,
                                                                                            chars):
    from lmnb_engine.stop_matcher import StopRegexes
    from lmnb_engine.params import stop_regex_problem

    told = (f' (the stop matcher has no set operations: it reads "{operator}" in a class as characters)'
            if operator else "")
    at = pattern.index("[:")
    literal = json.dumps(pattern[:at] + chr(92) + pattern[at:])
    # (to Python "[a-[" is a range down from "a": its literal reading, offered before, is no pattern)
    literal = (f"; read as Python reads it, its characters literal ({literal}), it is refused too (bad character range "
               "a-\\[ at position 1)") if pattern == "[a-[:digit:]]" else f", or {literal} to mean the characters"
    assert stop_regex_problem(pattern) == (
        f"{json.dumps(pattern)} holds the POSIX class {pattern[at:pattern.index(':]') + 2]} at position {at}, which "
        "the stop matcher (the regex package) reads as a class of Unicode characters, and Python's re as literal "
        f"characters; write {json.dumps(fix)} for its ASCII characters{told}{literal}")
    # the characters the stop matcher stops on with the offer, of ASCII and some beyond it, are those worked out
    compiled = StopRegexes([fix]).compiled[0]
    sample = [chr(c) for c in range(0x80)] + list("é\u00a0ß\u0663Ωж中\U0001F600\u212a\u017f")
    assert {c for c in sample if compiled.fullmatch(c)} == set(chars)
    assert stop_regex_problem(fix) is None


def lmnb_gen_takes(pattern):
    import lmnb

    return lmnb.gen("x", regex=pattern).params.regex == pattern


@pytest.mark.parametrize("pattern, said", [
    (r"\p{L}[[:alpha:]]", r'regex "\\p{L}[[:alpha:]]": Possible nested set at position 6 — Python reads it as literal '
     r'characters, the automaton library as a POSIX class or a set operation; write "\\p{L}[A-Za-z]" for [:alpha:] (ASCII, '
     r'as the automaton library reads it), or "\\p{L}[\\[:alpha:]]" to mean the characters'),
    (r"[\p{L}&&\p{Ll}]", r'regex "[\\p{L}&&\\p{Ll}]": Possible set intersection at position 6 — Python reads it as literal '
     r'characters, the automaton library as a POSIX class or a set operation; write "[^\\P{L}\\P{Ll}]" for the set '
     r'intersection, or "[\\p{L}\\&\\&\\p{Ll}]" to mean the characters'),
    # (the second class nested, and negated: A and not B)
    (r"[\p{L}&&[^\p{Ll}]]", r'regex "[\\p{L}&&[^\\p{Ll}]]": Possible set intersection at position 6 — Python reads it as '
     r'literal characters, the automaton library as a POSIX class or a set operation; write "[^\\P{L}\\p{Ll}]" for the '
     r'set intersection, or "[\\p{L}\\&\\&[^\\p{Ll}]]" to mean the characters'),
    (r"[\p{L}--[^\p{Ll}]]", r'regex "[\\p{L}--[^\\p{Ll}]]": Possible set difference at position 6 — Python reads it as '
     r'literal characters, the automaton library as a POSIX class or a set operation; write "[^\\P{L}\\P{Ll}]" for the '
     r'set difference, or "[\\p{L}\\-\\-[^\\p{Ll}]]" to mean the characters'),
    # (a set difference to Rust: refused at gen() for "bad character range a--", the a's holding the classes)
    (r"[\p{L}--\p{Ll}]", r'regex "[\\p{L}--\\p{Ll}]": Possible set difference at position 6 — Python reads it as literal '
     r'characters, the automaton library as a POSIX class or a set operation; write "[^\\P{L}\\p{Ll}]" for the set '
     r'difference, or "[\\p{L}\\-\\-\\p{Ll}]" to mean the characters'),
])
def test_an_ambiguous_class_beside_a_unicode_class_is_refused_as_without_one(backend, pattern, said):
    # [[:alpha:]] and [a&&b] were refused by the engine; beside a \p{..} class they ran as Rust's regex reads
    # them, a POSIX class and a set operation, where lmnb documents Python's reading (literal characters)
    from outlines_core import Index, Vocabulary

    assert _refused_alike(backend, pattern) == said
    twin = pattern.replace(r"\p{Ll}", "K" * 6).replace(r"\p{L}", "K" * 5)  # (its twin without classes: the same words)
    plain = _refused_alike(backend, twin)  # (gen() and the cell passed it, with re's FutureWarning, to the engine)
    assert plain.replace(json.dumps(twin), "P").split(" — ")[0] == said.replace(json.dumps(pattern), "P").split(" — ")[0]
    if " for the set " in said:  # the negated class it offers matches what Rust's regex makes of the set operation
        fix = json.loads(said.split("; write ", 1)[1].split(" for the set ")[0])
        backend.compile(regex=fix)
        alphabet = "aA\u01c5\u02b0-&1"  # (a titlecase letter, a modifier letter: letters, not lower-case)
        index = Index(pattern, Vocabulary(99, {c.encode(): [i] for i, c in enumerate(alphabet)}))
        allowed = set(index.get_allowed_tokens(index.get_initial_state()))
        assert {c for i, c in enumerate(alphabet) if i in allowed} == {c for c in alphabet if regex_module.fullmatch(fix, c)}
        assert allowed  # (not a class that matches nothing)


@pytest.mark.parametrize("pattern, cls, shown_range, escaped", [
    (r"[\p{L}-z]+", r"\p{L}", r"\p{L}-z", r"[\\p{L}\\-z]+"),
    (r"x[0a-\p{Lu}]", r"\p{Lu}", r"a-\p{Lu}", r"x[0a\\-\\p{Lu}]"),
    (r"[\pL-\d]", r"\pL", r"\pL-\d", r"[\\pL\\-\\d]"),
])
def test_a_unicode_class_as_an_end_of_a_range_is_refused_early_by_name(backend, pattern, cls, shown_range, escaped):
    # it passed gen() and the cell (read with the class held by a's: a range a-z) and failed in the engine
    # with "cannot be compiled to a token index: Failed to build DFA error building NFA"
    assert not _automaton_builds(pattern)
    assert _automaton_builds(escaped.replace("\\\\", "\\"))  # (the fix it names builds)
    start = pattern.index(shown_range)
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} uses the class {cls} as an end of the range {shown_range} (at position {start}), "
        f'which the automaton library (Rust\'s regex) refuses: a range runs between two characters; write "{escaped}" '
        "for the class, the character and a hyphen, or give the range two characters")


@pytest.mark.parametrize("pattern, shown_range, at", [
    (r"[\x5a-\x41]", r"\x5a-\x41", 1),  # (Z down to A)
    (r"ab[\u005a-\u0041]+", r"\u005a-\u0041", 3),
    (r"[0\U0000005a-\U00000041]", r"\U0000005a-\U00000041", 2),
    (r"(x)[\132-\101]", r"\132-\101", 4),  # (octal: Z down to A)
    (r"[\N{LATIN SMALL LETTER Z}-a]", r"\N{LATIN SMALL LETTER Z}-a", 1),
    (r"x[\w-\x41]", r"\w-\x41", 2),  # (a class at an end, Python's other bad range)
])
def test_a_bad_character_range_is_named_as_written_where_it_starts(backend, pattern, shown_range, at):
    # Python's re shows two characters of each escape ("\x-\x", "\1-\1") and places the range that many
    # characters past its start (position 5 for [\x5a-\x41]); the error quotes the range as the user wrote it
    assert pattern[at:].startswith(shown_range)
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression (bad character range "
        f"{shown_range} at position {at}); fix the pattern")


def test_a_bad_character_range_in_a_stop_regex_is_named_as_written():
    import lmnb

    with pytest.raises(ValueError) as e:
        lmnb.gen("x", stop_regex=r"ab[\x7a-\x61]")
    assert r"(bad character range \x7a-\x61 at position 3); fix the pattern" in str(e.value), str(e.value)


def test_a_hyphen_beside_a_unicode_class_that_makes_no_range_passes(backend):
    import lmnb

    for pattern in [r"[\p{L}-]", r"[-\p{L}]", r"[a-b-\p{L}]", r"[^-\p{L}]", r"[\p{L}\-z]", r"[a\p{L}-]"]:
        assert _automaton_builds(pattern), pattern
        assert lmnb.gen("x", regex=pattern).params.regex == pattern
        backend.compile(regex=pattern)


@pytest.mark.parametrize("pattern, cls, at", [(r"(?P<\p{L}>a)", r"\p{L}", 4), (r"(?P<x\pL>a)", r"\pL", 5),
                                              (r"(a)(?P=\p{L})", r"\p{L}", 7), (r"(?\p{L})", r"\p{L}", 2)])
def test_a_unicode_class_where_no_class_can_stand_is_named_not_what_held_it(backend, pattern, cls, at):
    # (?P<\p{L}>a) passed gen() (a group named "aaaaa") and failed in the engine with "error building NFA";
    # (?\p{L}) was refused for "unknown extension ?a": neither is the user's text
    assert not _automaton_builds(pattern)
    said = _refused_alike(backend, pattern)
    assert said.startswith(f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression (the "
                           f"class {cls} at position {at} stands where no class can"), said
    assert "aaa" not in said and "%" not in said


def test_a_unicode_class_in_a_comment_is_no_class(backend):
    # "(?#\p{)})" was refused for "the class \p{)}" (read across the comment's end): Python's comment ends at the
    # first ")", so the "}" after it is a literal and the last ")" closes no group (position 8, by hand)
    said = _refused_alike(backend, r"(?#\p{)})")
    assert said == (r'regex "(?#\\p{)})" cannot be compiled: it is not a valid regular expression (unbalanced '
                    'parenthesis at position 8); fix the pattern'), said
    for pattern, text in ((r"(?#\p{)}a", "}a"), (r"(?#\p{)\p{Lu}", "A")):  # (taken, and read as Python reads them)
        assert lmnb_gen_takes(pattern)
        assert re.fullmatch(pattern.replace(r"\p{Lu}", "[A-Z]"), text)
        grammar = backend.compile(regex=pattern)
        state = grammar.initial_state
        for b in text.encode():
            state = grammar.next_state(state, int(backend.vocab.byte_token[b]))
        assert state is not None and grammar.is_final(state), pattern


@pytest.mark.parametrize("pattern, text", [
    ("(?x)a  # like \\p{InGreek}\nb", "ab"),  # (a class the library does not build: refused, though no class)
    ("(?x)a  # [\\p{L}-z]\nb", "ab"),  # (a class at a range's end: refused)
    ("(?ix)a # (?#\n\\p{Lu}", "aB"),  # (no (?# comment inside one: the class after the line is one)
])
def test_a_unicode_class_in_a_verbose_comment_is_no_class(backend, pattern, text):
    # under (?x), "#" to the line's end is a comment, as Python reads it and the engine's respelling drops
    # it; a class's text there was read as a class and the pattern refused (the last: the class missed)
    assert lmnb_gen_takes(pattern)
    assert re.fullmatch(pattern.replace("\\p{Lu}", "[A-Z]"), text)
    grammar = backend.compile(regex=pattern)
    state = grammar.initial_state
    for b in text.encode():
        state = grammar.next_state(state, int(backend.vocab.byte_token[b]))
    assert state is not None and grammar.is_final(state), pattern


_EMPTY_FIX = ("; it would only allow an empty output, with no text: give a pattern that matches some text, or no regex "
              "(for no output at all, max_tokens=0)")


@pytest.mark.parametrize("pattern, said", [
    (r"\Z", r'regex "\\Z" is empty once its anchors are dropped (the output matches the whole pattern)' + _EMPTY_FIX),
    ("^$", 'regex "^$" is empty once its anchors are dropped (the output matches the whole pattern)' + _EMPTY_FIX),
    ("", 'regex "" is empty' + _EMPTY_FIX),
    # (what is left matches the empty string only: the engine gave an empty output, "^$" refused)
    ("(?i)^$", 'regex "(?i)^$" matches only the empty string' + _EMPTY_FIX),
    ("^|$", 'regex "^|$" matches only the empty string' + _EMPTY_FIX),
    ("(?:)", 'regex "(?:)" matches only the empty string' + _EMPTY_FIX),
    ("a{0}(?#x)", 'regex "a{0}(?#x)" matches only the empty string' + _EMPTY_FIX),
    (r"\p{L}{0}", r'regex "\\p{L}{0}" matches only the empty string' + _EMPTY_FIX),
])
def test_an_empty_regex_is_refused_at_gen_as_in_the_engine(backend, pattern, said):
    # "regex is empty; it would only allow an empty output", whatever the pattern was; and "" and "\Z" passed
    # gen() and a cell's check, to be refused only by the engine when the gen ran
    assert _refused_alike(backend, pattern) == said
    assert lmnb_gen_takes("^a$") and lmnb_gen_takes("(?:)a")  # (a pattern with text left is taken)
    import lmnb

    assert lmnb.gen("x", max_tokens=0).params.max_new_tokens == 0  # (the fix offered is one gen() takes)


@pytest.mark.parametrize("pattern, where", [("a(b", "missing ), unterminated subpattern at position 1"),
                                            ("x[ab", "unterminated character set at position 1"),
                                            (r"\p{L}(c", "missing ), unterminated subpattern at position 5")])
def test_a_stop_regex_error_is_placed_as_a_regex_error(pattern, where):
    # stop_regex="a(b" said "missing ) at position 3" (the regex package: where it gave up), regex="a(b"
    # "missing ), unterminated subpattern at position 1" (Python's re: where the group opens)
    import lmnb

    with pytest.raises(ValueError) as stop:
        lmnb.gen("x", stop_regex=pattern)
    with pytest.raises(ValueError) as constraint:
        lmnb.gen("x", regex=pattern)
    assert f"({where})" in str(stop.value) and f"({where})" in str(constraint.value), (str(stop.value), str(constraint.value))


@pytest.mark.parametrize("pattern, at, fix, literal, unicode", [
    ("[[:alpha:]]", 1, "[A-Za-z]", r"[\\[:alpha:]]", "é"),
    ("x[a[:^digit:]]+", 3, "x[^0-9]+", r"x[a\\[:^digit:]]+", "xé"),  # (a, or not a digit: not a digit)
])
def test_a_stop_regex_with_a_posix_class_is_refused_as_a_regex_is(backend, pattern, at, fix, literal, unicode):
    # stop_regex="[[:alpha:]]" was taken, and stopped at Unicode letters (the regex package's POSIX class), where
    # Python's re reads literal characters and regex= refuses it for that ambiguity, offering the ASCII class;
    # "x[a[:^digit:]]+": no digit to the regex package (a Unicode class), "x", "a", "[", ":" ... to Python
    import lmnb
    from lmnb.template.options import check_literal
    from lmnb_engine.params import SamplingParams

    name = pattern[at:pattern.index(":]", at) + 2]
    said = (f"{json.dumps(pattern)} holds the POSIX class {name} at position {at}, which the stop matcher (the regex "
            "package) reads as a class of Unicode characters, and Python's re as literal characters; write "
            f"{json.dumps(fix)} for its ASCII characters, or {json.dumps(literal.replace(chr(92) * 2, chr(92)))} to mean "
            "the characters")
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", stop_regex=pattern)
    assert str(at_gen.value) == f"stop_regex={json.dumps(pattern)} is invalid: {said}"
    assert check_literal("gen", "stop_regex", pattern) == str(at_gen.value)
    with pytest.raises(ValueError, match=re.escape(said)):
        SamplingParams(stop_regex=pattern).validate()
    # the three readings the message names, and the fixes taken
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (re's "Possible nested set")
        assert regex_module.search(pattern, unicode) and not re.search(pattern, unicode)
    for taken in (fix, literal.replace(chr(92) * 2, chr(92))):
        assert lmnb.gen("x", stop_regex=taken).params.stop_regex == taken
    assert lmnb_gen_takes(fix)
    assert lmnb.gen("x", stop_regex="[a&&b]").params.stop_regex == "[a&&b]"  # (re and the regex package agree)


def test_a_repeat_count_above_what_python_reads_is_worded_at_gen_not_raised(backend):
    # gen(regex="a{99999999999}") raised re's bare OverflowError ("the repetition number is too large") from
    # inside its parser, and so did a %%lm cell's check; the engine refuses it by its own limit
    import lmnb
    from lmnb.template.options import check_literal

    said = ('regex "x\\\\p{L}a{99999999999}" repeats a part more times than Python\'s re reads (4,294,967,294); use an '
            'unbounded repeat ("+" or "*") and bound the length with max_tokens instead')
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", regex=r"x\p{L}a{99999999999}")
    assert [str(at_gen.value), check_literal("gen", "regex", r"x\p{L}a{99999999999}")] == [said] * 2
    with pytest.raises(GrammarError, match="repeats a part more than 4,294,967,294 times"):
        backend.compile(regex=r"x\p{L}a{99999999999}")


def test_a_schema_pattern_in_another_regex_dialect_is_left_to_the_backend():
    """A ``pattern`` is a regex of the backend's dialect: an OpenAI-compatible API reads ECMA's,
    where ``\\p{Lu}`` is valid. gen() and a %%lm cell, which run before a backend is known, pass
    it on; the engine, which reads Python's, refuses it with its hint. (ECMA's named group, which
    matches what a plain one does, the engine takes: test_constrained_engine.)"""
    import lmnb
    from lmnb.template.options import check_literal

    schema = {"type": "string", "pattern": r"^\p{Lu}"}
    assert lmnb.gen("x", json_schema=schema).params.json_schema is schema
    assert check_literal("gen", "json_schema", schema) is None
    with pytest.raises(GrammarError, match=r"^JSON schema at #/pattern"):
        schema_to_regex(schema)


@pytest.mark.parametrize("pattern, python, kept", [
    (r"^[\uD83D\uDE00-\uD83D\uDE4F]+$", "^[\U0001F600-\U0001F64F]+$", ""),  # (the emoticons, by their surrogate pairs)
    (r"^\u{1F600}\ud83d\ude4f$", "^\U0001F600\U0001F64F$", ""),  # (past U+FFFF: the characters themselves)
    (r"^\\u[\u{41}-\u{5A}]$", r"^\\u[\u0041-\u005A]$", ""),  # (an escaped backslash, then "u")
    # (ECMA's named group kept, which the engine reads and Python's re does not: the words said "both read alike")
    (r"^(?<e>\u{1F600})\u{1F64F}?$", "^(?<e>\U0001F600)\U0001F64F?$",
     " (its named group (?<e>...): ECMA's, which this engine reads and Python's re does not)"),
])
def test_a_schema_patterns_code_point_escapes_get_their_python_spelling_from_the_engine(pattern, python, kept):
    """gen() takes ECMA's code point escapes (the u flag's \\u{1F600}, a surrogate pair), which the
    engine, reading a schema's pattern with Python's re as jsonschema does, refuses: re reads
    \\u{ as an error and a pair as two surrogates ("bad character range" for the emoticons). It said
    only "fix the pattern"; it now gives the pattern with each such escape spelled as both Python's
    re and ECMA with the u flag read it (Python's \\U escape, offered before, is an identity escape
    ECMA refuses), which the engine takes and whose outputs are the code points meant."""
    import lmnb

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})  # (gen() takes it)
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value).endswith(
        "; Python's re, which reads a schema's pattern here (jsonschema checks each output with it), has no ECMA "
        "code point escape (\\u{...}, or a surrogate pair \\uD83D\\uDE00): write each as the character itself, or as "
        f"\\uXXXX up to U+FFFF, which both read alike, the pattern {json.dumps(python, ensure_ascii=False)}{kept}"), str(
        e.value)
    regex = schema_to_regex({"type": "string", "pattern": python})  # (the offer is taken, and means the same)
    assert lmnb.gen("x", json_schema={"type": "string", "pattern": python})  # (and by gen())
    texts = ("\U0001F600", "\U0001F64F", "\U0001F600\U0001F64F", "A", "\\uZ")
    with pytest.raises(re.error) if kept else contextlib.nullcontext():  # (the words' reference: re refuses it)
        re.compile(python)
    matched = [text for text in texts if regex_module.search(python, text)]  # (which reads (?<e> as ECMA does)
    assert matched  # (each offer matches some text, the characters meant)
    for text in texts:
        assert bool(re.fullmatch(regex, json.dumps(text, ensure_ascii=False))) == (text in matched), text


_BOTH_READ = "which both read alike"
# (a named group kept: ECMA and the engine read the offer, Python's re does not: it has no (?<name>)
_NAMES_KEPT = "which ECMA and this engine read alike: Python's re reads [\\s\\S] so too, but not its named group"


@pytest.mark.parametrize("pattern, python, alike, texts", [
    # (ECMA's [^] is any character, newlines too; the texts each pattern matches worked out by hand)
    (r"^[^]{2}$", r"^[\s\S]{2}$", _BOTH_READ, {"ab": True, "\n\t": True, "a": False, "abc": False}),
    (r"^(?<year>\d{4})-[^]$", r"^(?<year>\d{4})-[\s\S]$", f"{_NAMES_KEPT} (?<year>...)",
     {"2024-x": True, "2024-\n": True, "24-x": False, "2024-": False}),
    (r"^(?<y>\d)(?<m>[a-c])[^]$", r"^(?<y>\d)(?<m>[a-c])[\s\S]$", f"{_NAMES_KEPT}s (?<y>...), (?<m>...)",
     {"1a\n": True, "1d\n": False}),
    (r"^[(?<y>][^]$", r"^[(?<y>][\s\S]$", _BOTH_READ, {"<x": True, "y]": True, "z]": False}),  # (no group in a class)
])
def test_a_schema_patterns_ecma_syntax_python_lacks_gets_its_python_spelling_from_the_engine(pattern, python, alike,
                                                                                              texts):
    """ECMA's class of any character [^], valid in JSON Schema and taken by gen(), is refused by
    the engine, which reads a schema's pattern with Python's re as jsonschema does: it said only
    "unterminated character set", "fix the pattern". It now gives the pattern with [\\s\\S],
    which it takes (ECMA's named group beside it kept: the engine reads it as a plain group, and
    the words say that only it and ECMA read that pattern alike, where they said "both": Python's
    re refuses "(?<year>")."""
    import lmnb

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})  # (gen() takes it)
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value).endswith(
        "; it holds syntax of ECMA 262, JSON Schema's dialect, that Python's re, which reads a schema's pattern here "
        "(jsonschema checks each output with it), lacks: [^] (any character); write "
        f"the pattern {json.dumps(python)}, {alike}"), str(e.value)
    try:  # (the words' reference: whether Python's re reads the offer)
        re.compile(python)
        assert alike == _BOTH_READ
    except re.error:
        assert alike != _BOTH_READ
    regex = schema_to_regex({"type": "string", "pattern": python})
    for text, matches in texts.items():
        assert bool(re.fullmatch(regex, json.dumps(text, ensure_ascii=False))) == matches, text


_ANY = ("; it holds syntax of ECMA 262, JSON Schema's dialect, that Python's re, which reads a schema's pattern here "
        "(jsonschema checks each output with it), lacks: [^] (any character); write the pattern ")
_CODE_POINT = ("; Python's re, which reads a schema's pattern here (jsonschema checks each output with it), has no ECMA "
               "code point escape (\\u{...}, or a surrogate pair \\uD83D\\uDE00): write each as the character itself, "
               "or as \\uXXXX up to U+FFFF, which both read alike, the pattern ")


@pytest.mark.parametrize("pattern, python, ending", [
    (r"(?P<y>a)[^]", r"(?P<y>a)[\s\S]", "which Python's re and this engine read alike: ECMA reads [\\s\\S] so too, "
     "but not its (?P<y>...) (Python's)"),
    (r"(?#c)(?s:a)[^]", r"(?#c)(?s:a)[\s\S]", "which Python's re and this engine read alike: ECMA reads [\\s\\S] so "
     "too, but not its (?#c), (?s:...) (Python's)"),
    (r"(?<x>a)(?P<y>b)[^]", r"(?<x>a)(?P<y>b)[\s\S]", "which this engine reads: Python's re reads [\\s\\S] so too, but "
     "not its named group (?<x>...); ECMA reads [\\s\\S] so too, but not its (?P<y>...) (Python's)"),
    (r"(?P<y>a)\u{1F600}", "(?P<y>a)\U0001F600", "(its (?P<y>...): Python's, which this engine reads and ECMA does not)"),
])
def test_a_schema_patterns_offer_keeping_python_syntax_does_not_say_ecma_reads_it(pattern, python, ending):
    """gen() takes the schema pattern (?P<y>a)[^]; the engine offered "(?P<y>a)[\\s\\S]", "which both
    read alike" (Python's re and ECMA), but ECMA has no (?P<y> (nor (?i), (?#c), (?i:...)). The words
    now say which readers read the offer. The reference: Python's re compiles each offer, node's
    RegExp with the u flag (ECMA 262 itself, where at hand) refuses it, and the engine builds it."""
    import shutil
    import subprocess

    import lmnb

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})  # (gen() takes it)
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    lead = _CODE_POINT if "\\u{" in pattern else _ANY
    assert str(e.value).endswith(f"{lead}{json.dumps(python, ensure_ascii=False)}"
                                 f"{' ' if lead is _CODE_POINT else ', '}{ending}"), str(e.value)
    if "(?<x>" not in python:
        re.compile(python)  # (Python's re reads it)
    if shutil.which("node"):  # (ECMA does not)
        run = subprocess.run(["node", "-e", "try { new RegExp(process.argv[1], 'u') } catch (e) { process.exit(3) }",
                              python], capture_output=True)
        assert run.returncode == 3, python
    assert schema_to_regex({"type": "string", "pattern": python})  # (the engine builds the offer)


@pytest.mark.parametrize("pattern, python, ending", [
    # (c(?<=x)[^] and ^a\b[^]$ are refused for the lookbehind and \b first now, with no spelling offered:
    # test_lang_interpreter's test_a_schema_patterns_lookbehind_or_word_boundary_is_refused_at_gen_where_it_stands)
    # (case-insensitive matching, which a schema string cannot have: "(?i)a[\\s\\S]" was offered whole, then refused)
    (r"(?i)a[^]", r"(?i)a[\s\S]", "write [\\s\\S] for each [^], which both read alike"),
    (r"(?i:a)\u{1F600}", "(?i:a)\U0001F600", "or as \\uXXXX up to U+FFFF, which both read alike"),
])
def test_a_schema_patterns_python_spelling_is_not_offered_whole_where_the_engine_refuses_it(pattern, python, ending):
    """The engine offered "c(?<=x)[\\s\\S]" for the schema pattern c(?<=x)[^] (and the character
    itself for a code point escape), which it then refused for the lookbehind. Beside what it
    cannot build it now says how to spell that syntax alone, offering no whole pattern (the
    reference: the engine's own refusal of the pattern offered before)."""
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value).endswith(ending) and 'write "' not in str(e.value) and "the pattern \"" not in str(
        e.value).split("; ", 1)[1], str(e.value)
    with pytest.raises(GrammarError, match="which constrained decoding cannot support|case-insensitive matching"):
        schema_to_regex({"type": "string", "pattern": python})


_NEVER = "so the pattern can never match, and no string passes it"
_EMPTY_CLASS_MEANT = 'write the class you meant ("]" in it escaped, \\])'


def _ecma_u_matches(pattern: str, texts: list) -> list:
    """Those of ``texts`` that node's RegExp with ECMA's u flag finds ``pattern`` in."""
    import subprocess

    run = subprocess.run(["node", "-e", "const r = new RegExp(process.argv[1], 'u'); "
                          "console.log(JSON.stringify(JSON.parse(process.argv[2]).filter(t => r.test(t))))",
                          pattern, json.dumps(texts)], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def _empty_class_words(pattern: str, at: int, never: str, fix: str) -> str:
    """The engine's words for the schema pattern ``pattern`` holding ECMA's empty class at ``at``."""
    return (f"the pattern {json.dumps(pattern)} holds ECMA's empty class [] at position {at}, which matches no "
            "character (Python's re, which reads a schema's pattern here, has no empty class: to it a \"]\" first "
            f"in a class is a member): an empty class can never match, {never}; {fix}")


# (the texts each pattern matches, searched for as JSON Schema does, worked out by hand from ECMA 262's reading:
# [] matches no character)
@pytest.mark.parametrize("pattern, at, never, offer, texts, matched", [
    ("a[]", 1, _NEVER, None, ["a", "a]", "a[]", ""], []),
    ("[]a", 0, _NEVER, None, ["a", "]a", ""], []),
    (r"[]\]", 0, _NEVER, None, ["]", "[]]"], []),
    ("[][]", 0, _NEVER, None, ["[", "]", "[]"], []),  # (re reads it as the class of "[" and "]": the engine built that)
    ("[]|a[]", 0, _NEVER, None, ["a", ""], []),  # (each alternative holds one)
    ("^[]$|^a$", 1, 'so the alternative "^[]$" can never match', "^a$", ["a", "", "b", "ab"], ["a"]),
    ("(a[])?b", 2, 'so the repeat "(a[])?" can only match nothing', "b", ["b", "ab", "a", ""], ["b", "ab"]),
    ("[]|a[]|b", 0, 'so the alternative "[]" can never match', "b", ["b", "ab", "a", ""], ["b", "ab"]),
    ("(?<y>a)|x[]", 9, 'so the alternative "x[]" can never match', "(?<y>a)", ["a", "x", ""], ["a"]),
])
def test_a_schema_patterns_ecma_empty_class_is_named_with_what_it_keeps_from_matching(
        pattern, at, never, offer, texts, matched):
    """ECMA's empty class [] (valid in JSON Schema, which gen() takes) was refused by the engine as
    "not a valid regular expression (unterminated character set ...)", "fix the pattern", Python's
    reading, and [][], two empty classes, was built as the class of "[" and "]". The engine names
    the class, what it keeps from matching and the pattern without that, which it builds and which
    matches what the pattern does (by hand; node's RegExp with the u flag, ECMA 262 itself, where
    at hand)."""
    import shutil

    import lmnb

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})  # (gen() leaves it to the backend)
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    fix = f"write {json.dumps(offer)} without it, or {_EMPTY_CLASS_MEANT}" if offer else _EMPTY_CLASS_MEANT
    assert str(e.value) == "JSON schema at #/pattern: " + _empty_class_words(pattern, at, never, fix)
    if offer:
        assert [t for t in texts if re.search(offer.replace("(?<", "(?P<"), t)] == matched
        assert schema_to_regex({"type": "string", "pattern": offer})  # (the engine builds the offer)
    if shutil.which("node"):
        assert _ecma_u_matches(pattern, texts) == matched


@pytest.mark.parametrize("schema, where", [
    ({"type": "object", "patternProperties": {"a[]{0}b": {"type": "string"}}}, "#"),
    ({"type": "object", "patternProperties": {"a[]": {"type": "integer"}}}, "#"),
    ({"type": "object", "properties": {"o": {"patternProperties": {"[^]": {}}}}}, "#/properties/o"),
])
def test_a_pattern_properties_key_the_engine_alone_refuses_is_refused_for_the_keyword(schema, where):
    """A patternProperties key gen() takes that the engine refused (ECMA's empty class, [^]) was
    named with a fix: a[]{0}b was offered "ab", and the schema so written was then refused for
    patternProperties, which the engine does not enforce. The engine names the keyword first, in
    the words it refuses it in with the key written as offered (a value pattern keeps its words)."""
    import lmnb

    assert lmnb.gen("x", json_schema=schema)
    with pytest.raises(GrammarError) as key:
        schema_to_regex(schema)
    assert str(key.value) == (
        f'JSON schema keyword "patternProperties" at {where} is not supported by constrained decoding (it cannot '
        "be enforced while decoding); remove it. Supported keywords: $defs, $ref, additionalProperties, allOf, anyOf, "
        "const, definitions, enum, exclusiveMaximum, exclusiveMinimum, format, items, maxDigits, maxItems, maxLength, "
        "maximum, minDigits, minItems, minLength, minimum, oneOf, pattern, prefixItems, properties, required, type")
    with pytest.raises(GrammarError) as written:
        schema_to_regex({"type": "object", "patternProperties": {"ab": {"type": "string"}}})
    assert str(written.value) == str(key.value).replace(f"at {where} ", "at # ")
    with pytest.raises(GrammarError) as value:
        schema_to_regex({"type": "object", "properties": {"patternProperties": {"type": "string", "pattern": "a[]"}}})
    assert str(value.value).endswith(f"{_NEVER}; {_EMPTY_CLASS_MEANT}"), str(value.value)


def test_a_schema_patterns_lone_bracket_after_an_empty_class_names_the_class_in_its_fix():
    """[]] has a lone "]" under ECMA's u flag; ECMA reads it without the flag as []\\] (the empty
    class, then "]"), which the engine refused in Python's words, "unterminated character set at
    position 0", "fix the pattern". The refusal, gen()'s and the engine's, names the empty class
    of the pattern so written, which never matches, and says to escape a "]" meant in a class."""
    import lmnb

    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", json_schema={"type": "string", "pattern": "[]]"})
    with pytest.raises(GrammarError) as in_engine:
        schema_to_regex({"type": "string", "pattern": "[]]"})
    assert str(at_gen.value) == str(in_engine.value)
    assert str(in_engine.value).endswith(
        "written to mean, with the flag too, what ECMA reads it as without it, "
        + _empty_class_words(r"[]\]", 0, _NEVER, _EMPTY_CLASS_MEANT)), str(in_engine.value)
    assert re.fullmatch(r"[\]]", "]")  # (the class of "]", escaped as the words say)


_JSON_EMPTY_CLASS = ("which matches no character the engine writes in a JSON string (constrained strings use ASCII for "
                     "\\d, \\w, \\s and their negations, write no U+0080-U+009F for a class or \".\", and UTF-8 text "
                     "holds no surrogates U+D800-U+DFFF): such a class can never match here")


# (the texts each pattern matches, searched for as JSON Schema does, worked out by hand from ECMA 262's reading:
# each class at `at` matches no character of them, ECMA's \D being every character but 0-9)
@pytest.mark.parametrize("pattern, at, end, never, offer, texts, matched", [
    (r"(a[^\s\S])?b", 2, 9, r'so the repeat "(a[^\\s\\S])?" can only match nothing', "b", ["b", "ab", "a", ""],
     ["b", "ab"]),
    (r"[^\d\D]|b", 0, 7, r'so the alternative "[^\\d\\D]" can never match', "b", ["b", "1", "x", ""], ["b"]),
    (r"^a$|^[^\w\W]$", 5, 12, r'so the alternative "^[^\\w\\W]$" can never match', "^a$", ["a", "_", "", "ab"],
     ["a"]),
    (r"a[^\s\S]", 1, 8, "so the pattern can never match here", None, ["a", "a ", "ab", ""], []),
    (r"[^\D0-9]|c", 0, 8, r'so the alternative "[^\\D0-9]" can never match', "c", ["c", "\u0663", "1", ""], ["c"]),
    (r"[\ud800]x|y", 0, 8, r'so the alternative "[\\ud800]x" can never match', "y", ["y", "x", ""], ["y"]),
    # (every character but the surrogates left out, U+10FFFF as itself: the engine built it, a class of none)
    ("[^\\u0000-\\ud7ff\\ue000-\U0010ffff]x|y", 0, 24,
     'so the alternative "[^\\\\u0000-\\\\ud7ff\\\\ue000-\U0010ffff]x" can never match', "y", ["y", "x", "ax", ""], ["y"]),
])
def test_a_schema_patterns_class_that_matches_no_character_is_named_as_a_regexs_is(
        pattern, at, end, never, offer, texts, matched):
    """A schema pattern's class that matches no JSON string character ([^\\s\\S], [^\\D0-9] with the
    engine's ASCII \\d, a lone surrogate; a negated one of every character but surrogates, which the
    engine built as a class of none) was taken by the engine's schema check, then its build
    failed: "has a part no JSON string character can match here ...; widen it", offering nothing,
    where a regex= with the class is offered the pattern without the part it kills. The engine now
    names the class, that part and that pattern (the one a regex= is offered, where Python's re
    reads the class as empty too), which it builds and which matches what the pattern does (by
    hand; node's RegExp with the u flag, ECMA 262 itself, where at hand); gen() leaves the pattern,
    valid JSON Schema, to the backend, as it does ECMA's []."""
    import shutil

    import lmnb
    from lmnb_engine.json_schema import loaded_schema
    from lmnb_engine.regex_empty_class import empty_class_problem

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})
    with pytest.raises(ValueError) as checked:
        loaded_schema({"type": "string", "pattern": pattern}, engine=True)
    with pytest.raises(GrammarError) as built:
        schema_to_regex({"type": "string", "pattern": pattern})
    fix = f"write {json.dumps(offer)} without it, or write the class you meant" if offer else "write the class you meant"
    assert str(checked.value) == str(built.value) == (
        f"JSON schema at #/pattern: the pattern {json.dumps(pattern, ensure_ascii=False)} holds the class "
        f"{pattern[at:end]} at position {at}, {_JSON_EMPTY_CLASS}, {never}; {fix}")
    if offer:
        assert [t for t in texts if re.search(offer, t)] == matched
        assert schema_to_regex({"type": "string", "pattern": offer})
        if "D0-9" not in pattern:  # (re's \D leaves out other scripts' digits: [^\D0-9] holds them)
            assert f"write {json.dumps(offer)} without it" in empty_class_problem(pattern)
    if shutil.which("node"):
        assert _ecma_u_matches(pattern, texts) == matched


_ECMA_EMPTY = ("ECMA's empty class [] at position {at}, which matches no character (Python's re, which reads a schema's "
               'pattern here, has no empty class: to it a "]" first in a class is a member): an empty class can never '
               "match")


# (what each offer matches worked out by hand: each alternative the words name matches nothing)
@pytest.mark.parametrize("pattern, holds, never, fix, texts, matched", [
    (r"[]|[^\s\S]a", [_ECMA_EMPTY.format(at=0), "the class [^\\s\\S] at position 3, " + _JSON_EMPTY_CLASS],
     "so the pattern can never match here", 'write the class you meant for [] ("]" in it escaped, \\]) and the class '
     "you meant for [^\\s\\S]", None, None),
    (r"[]|a[^\s\S]|b", [_ECMA_EMPTY.format(at=0), "the class [^\\s\\S] at position 4, " + _JSON_EMPTY_CLASS],
     'so the alternative "[]" can never match, and the alternative "a[^\\\\s\\\\S]" can never match',
     'write "b" without them, or write the class you meant for [] ("]" in it escaped, \\]) and the class you meant '
     "for [^\\s\\S]", ["b", "a", "ab", ""], ["b", "ab"]),
    (r"[^\s\S]|[]", ["the class [^\\s\\S] at position 0, " + _JSON_EMPTY_CLASS, _ECMA_EMPTY.format(at=8)],
     "so the pattern can never match here", "write the class you meant for [^\\s\\S] and the class you meant for [] "
     '("]" in it escaped, \\])', None, None),
    (r"[]|\uD800|b", [_ECMA_EMPTY.format(at=0), "the lone surrogate U+D800 at position 3, half of a UTF-16 pair and no "
                     "character, which no JSON text written as UTF-8 holds: it can never match here"],
     'so the alternative "[]" can never match, and the alternative "\\\\uD800" can never match',
     'write "b" without them, or write the class you meant for [] ("]" in it escaped, \\]) and the character you '
     "meant for \\uD800 (one past U+FFFF as the character itself)", ["b", "a", ""], ["b"]),
])
def test_a_schema_patterns_empty_class_beside_another_kind_that_matches_nothing_names_both(pattern, holds, never, fix,
                                                                                           texts, matched):
    """A schema pattern mixing ECMA's [] with another class that matches no JSON string character
    (or a lone surrogate) was worded after the first one found only: []|[^\\s\\S]a named [] and
    said "no string passes it", though the other is the engine's reading, and "write the class you
    meant" of [] alone. Each kind's first part is now named, with what each keeps from matching
    and its fix; the offer, the pattern without them, is built and matches what the pattern does
    (by hand; node's RegExp with the u flag where at hand)."""
    import shutil

    from lmnb_engine.json_schema import loaded_schema

    with pytest.raises(ValueError) as checked:
        loaded_schema({"type": "string", "pattern": pattern}, engine=True)
    with pytest.raises(GrammarError) as built:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(checked.value) == str(built.value) == (
        f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} holds {', and '.join(holds)}, {never}; {fix}")
    if texts is not None:
        assert [t for t in texts if re.search("b", t)] == matched
        assert schema_to_regex({"type": "string", "pattern": "b"})
        if shutil.which("node"):
            assert _ecma_u_matches(pattern, texts) == matched


# (a part repeated {0} matches only the empty string, whatever it holds: each pattern matches what `same` does)
@pytest.mark.parametrize("pattern, same", [
    (r"x[^\s\S]{0}", "x"),
    (r"x([^\s\S]a){0}y", "xy"),
    (r"x\uD800{0}", "x"),  # (a lone surrogate)
    (r"(?<n>x)[^\D0-9]{0,0}", "(x)"),  # (ECMA's named group, the engine's ASCII \d)
])
def test_a_schema_patterns_class_of_no_character_repeated_zero_times_is_taken_as_a_regexs_is(pattern, same):
    """A regex= takes x[^\\s\\S]{0}; the engine's schema check named the class and offered "x",
    its build having written the class even repeated zero times. Both now take the pattern as it
    is (ECMA's [] aside, which Python's re cannot read: a[]{0}b is still offered "ab"), built as
    the pattern without that part is."""
    from lmnb_engine.json_schema import loaded_schema

    assert loaded_schema({"type": "string", "pattern": pattern}, engine=True)
    assert schema_to_regex({"type": "string", "pattern": pattern}) == schema_to_regex(
        {"type": "string", "pattern": same})


# (the texts each pattern matches, searched for as JSON Schema does, by hand: a lone surrogate matches no character
# of them, and none of UTF-8 text)
@pytest.mark.parametrize("pattern, at, code, never, offer, texts, matched", [
    (r"\uD800|a", 0, "D800", r'so the alternative "\\uD800" can never match', "a", ["a", "b", ""], ["a"]),
    (r"a\uD800?", 1, "D800", r'so the repeat "\\uD800?" can only match nothing', "a", ["a", "ab", "b"], ["a", "ab"]),
    (r"\u{D800}|a", 0, "D800", r'so the alternative "\\u{D800}" can never match', "a", ["a", "b", ""], ["a"]),
    ("\ud800|a", 0, "D800", 'so the alternative "\\ud800" can never match', "a", ["a", "b", ""], ["a"]),  # (itself)
    (r"x(\uDC00)?y", 2, "DC00", r'so the repeat "(\\uDC00)?" can only match nothing', "xy", ["xy", "x", "y"], ["xy"]),
    (r"a\uD83D", 1, "D83D", "so the pattern can never match here", None, ["a", "a\U0001F600"], []),
])
def test_a_schema_patterns_lone_surrogate_is_named_as_a_class_of_none_is(pattern, at, code, never, offer, texts,
                                                                         matched):
    """A lone surrogate outside a class, which no JSON text written as UTF-8 holds, was met three
    ways: \\uD800|a was built as "a" without a word, a\\uD800? told "has a part no JSON string
    character can match here ...; widen it" with no fix, \\u{D800}|a offered \\uD800|a, while
    [\\uD800]a|b is named as a class that matches no character, with "b" offered
    (test_a_schema_patterns_class_that_matches_no_character_is_named_as_a_regexs_is). The engine
    now names the surrogate, the part it keeps from matching and the pattern without that part,
    which it builds and which matches what the pattern does (by hand; node's RegExp with the u
    flag where at hand); gen() leaves the pattern, valid JSON Schema, to the backend."""
    import shutil

    import lmnb
    from lmnb_engine.json_schema import loaded_schema

    assert lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})
    with pytest.raises(ValueError) as checked:
        loaded_schema({"type": "string", "pattern": pattern}, engine=True)
    with pytest.raises(GrammarError) as built:
        schema_to_regex({"type": "string", "pattern": pattern})
    meant = r"write the character you meant (one past U+FFFF as the character itself)"
    fix = f"write {json.dumps(offer)} without it, or {meant}" if offer else meant
    assert str(checked.value) == str(built.value) == (
        f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} holds the lone surrogate U+{code} at position "
        f"{at}, half of a UTF-16 pair and no character, which no JSON text written as UTF-8 holds: it can never match "
        f"here, {never}; {fix}")
    # the advice holds: the character itself builds, its pair of escapes is refused
    assert schema_to_regex({"type": "string", "pattern": "\U0001F600"})
    with pytest.raises(GrammarError):
        schema_to_regex({"type": "string", "pattern": r"\uD83D\uDE00"})
    if offer:
        assert [t for t in texts if re.search(offer, t)] == matched
        assert schema_to_regex({"type": "string", "pattern": offer})
    if shutil.which("node"):  # (the surrogate itself as its escape, which ECMA reads alike: argv is UTF-8)
        assert _ecma_u_matches(pattern.replace("\ud800", "\\ud800"), texts) == matched


def test_a_schema_patterns_surrogate_pair_in_a_class_is_no_empty_class():
    """ECMA reads the pair \\uD83D\\uDE00 in a class as one character, which re reads as two
    surrogates: the engine keeps offering the character itself, not naming an empty class."""
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": r"[\uD83D\uDE00]"})
    assert "holds the class" not in str(e.value) and str(e.value).endswith('the pattern "[😀]"'), str(e.value)


def test_a_schema_patterns_lone_surrogate_pair_gets_its_python_spelling_from_the_engine():
    """Outside a class, Python's re reads ECMA's surrogate pair \\uD83D\\uDE00 (one code point under
    the u flag) as two surrogates, which no JSON string holds: the engine said to widen the pattern;
    it now gives the pattern with the pair as the character itself, which it takes."""
    pattern, python = r"^a\uD83D\uDE00+$", "^a\U0001F600+$"
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value).endswith(
        "; Python's re, which reads a schema's pattern here (jsonschema checks each output with it), has no ECMA "
        "code point escape (\\u{...}, or a surrogate pair \\uD83D\\uDE00): write each as the character itself, or as "
        f"\\uXXXX up to U+FFFF, which both read alike, the pattern {json.dumps(python, ensure_ascii=False)}"), str(e.value)
    regex = schema_to_regex({"type": "string", "pattern": python})
    assert re.fullmatch(regex, '"a\U0001F600\U0001F600"') and not re.fullmatch(regex, '"a"')


# (what each offer matches worked out by hand: the pair is U+1F600 to ECMA with the u flag)
@pytest.mark.parametrize("pattern, at, offer, texts, matched", [
    (r"\uD83D\uDE00|a", 0, "\U0001F600|a", ["\U0001F600", "a", "b"], ["\U0001F600", "a"]),
    (r"[a\uD83D\uDE00]", 2, "[a\U0001F600]", ["\U0001F600", "a", "b"], ["\U0001F600", "a"]),  # (was built as [a])
])
def test_a_schema_patterns_surrogate_pair_is_named_as_a_pair_by_the_engine(pattern, at, offer, texts, matched):
    """ECMA reads the surrogate pair \\uD83D\\uDE00 as one character, U+1F600, with the u flag;
    Python's re, which the engine reads a schema's pattern with, as two surrogates. The engine's
    build opened with "has a part no JSON string character can match here", as if the pattern
    could not match, before its offer, and built [a\\uD83D\\uDE00] as [a] without a word; its
    schema check now names the pair and gives the pattern with the character itself, which it
    builds and which matches what ECMA reads the pattern to match (by hand; node's RegExp too)."""
    import shutil

    from lmnb_engine.json_schema import loaded_schema

    with pytest.raises(ValueError) as checked:
        loaded_schema({"type": "string", "pattern": pattern}, engine=True)
    with pytest.raises(GrammarError) as built:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(checked.value) == str(built.value) == (
        f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} holds the surrogate pair \\uD83D\\uDE00 at "
        f"position {at}, one character, U+1F600, to ECMA 262 with the u flag JSON Schema asks patterns be read with, "
        "but to this engine two lone surrogates, which no JSON text written as UTF-8 holds; Python's re, which reads "
        "a schema's pattern here (jsonschema checks each output with it), has no ECMA code point escape (\\u{...}, "
        "or a surrogate pair \\uD83D\\uDE00): write each as the character itself, or as \\uXXXX up to U+FFFF, which "
        f"both read alike, the pattern {json.dumps(offer, ensure_ascii=False)}")
    regex = schema_to_regex({"type": "string", "pattern": offer})
    assert [t for t in texts if re.fullmatch(regex, json.dumps(t, ensure_ascii=False))] == matched
    if shutil.which("node"):
        assert _ecma_u_matches(pattern, texts) == matched


def test_a_schema_pattern_with_a_capital_u_escape_is_no_surrogate_pair_to_the_engine():
    """ECMA 262's \\u escape is a lowercase u (its hex digits are of either case): \\UD83D\\UDE00 is
    no surrogate pair (with the u flag JSON Schema asks for, \\U is an error; without it, the
    letter U). The engine read it as one, so it offered the pattern with U+1F600 as the fix of an
    error in a pattern that means no such character; it refuses the identity escape \\U as gen()
    does, in its words, at the escape the user wrote, offering the letters."""
    import lmnb

    pattern = r"^a\UD83D\UDE00+$"
    with pytest.raises(ValueError) as said:
        lmnb.gen("x", json_schema={"type": "string", "pattern": pattern})
    with pytest.raises(GrammarError) as e:
        schema_to_regex({"type": "string", "pattern": pattern})
    assert str(e.value) == str(said.value)
    assert str(e.value).startswith(f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} cannot be read as JSON "
                                   'Schema reads it: it escapes "U" at position 2, an identity escape ECMA 262 refuses')
    assert 'write "^aUD83DUDE00+$"' in str(e.value)


@pytest.mark.parametrize("pattern", ["(?<n>a)b", r"\x{41}b", r"a\u{42}", r"(?<n>\p{Lu})"])
def test_a_pattern_only_rusts_regex_reads_is_refused_by_the_engine_as_by_gen(backend, pattern):
    # the engine reads a regex as Python's re does, as gen() does, but left a pattern Python's parser
    # refuses to the automaton library, which took Rust's own syntax (a named group without the P,
    # a braced escape): a server's client got a constraint gen() refuses
    assert _automaton_builds(pattern)  # (the library reads it)
    said = _refused_alike(backend, pattern)
    assert said.startswith(f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression ("), said


@pytest.mark.parametrize("pattern, at, offer, held, not_held", [
    (r"[\x{41}-\x{5A}]+", 1, r"[\x41-\x5a]+", ["A", "AZ", "Q"], ["a", "@", "["]),
    (r"a\u{3042}b", 1, r"a\u3042b", ["a\u3042b"], ["ab", "au{3042}b"]),
    (r"\u{10330}", 0, r"\U00010330", ["\U00010330"], ["\U00010331", "u"]),
    # (leading zeros past 6 digits, which PCRE, Rust's regex and ECMA take: it was told "fix the pattern")
    (r"\x{00000041}\u{0000000000003042}", 0, r"\x41\u3042", ["A\u3042"], ["x" * 41, "A", "Au{3042}"]),
])
def test_a_braced_code_point_escape_in_a_regex_is_offered_pythons_spelling(backend, pattern, at, offer, held, not_held):
    # PCRE's \x{41} and ECMA's \u{41} (Rust's regex reads both) were told "incomplete escape \x", "fix the
    # pattern": the pattern is offered with each written as Python's re writes that code point, by gen(), a
    # cell and the engine alike; the offer matches the code points the escapes name (hex 41 is "A", 5A "Z",
    # 3042 "あ"), and gen() takes it
    said = _refused_alike(backend, pattern)
    assert said == (f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression (incomplete "
                    f"escape \\{pattern[at + 1]} at position {at}); write {json.dumps(offer)}, each braced escape of a "
                    "code point (PCRE's \\x{...}, ECMA's \\u{...}) as Python's re writes it (\\xHH, \\uHHHH, "
                    "\\UHHHHHHHH)")
    assert [bool(re.fullmatch(offer, t)) for t in held + not_held] == [True] * len(held) + [False] * len(not_held)
    import lmnb

    assert lmnb.gen("x", regex=offer)


@pytest.mark.parametrize("pattern, at, written, escape, char", [
    (r"(?=a)\x{41}", 5, r"(?=a)\x41", r"\x41", "A"),  # (a lookahead, which no backend builds)
    (r"\x{41}(", 0, r"\x41(", r"\x41", "A"),  # (a group left open)
    (r"[\u{3042}-\u{3093}]\1", 1, r"[\u3042-\u3093]\1", r"\u3042", "\u3042"),  # (a reference to no group)
])
def test_a_braced_code_point_escape_in_a_regex_refused_next_names_both_problems(backend, pattern, at, written,
                                                                                 escape, char):
    # (?=a)\x{41} and \x{41}( were told "incomplete escape \x", "fix the pattern", as the pattern with each
    # escape written as Python's re writes it is refused next (for its lookahead, its "("), and was not
    # offered: gen(), a cell and the engine say how to write each escape, then their own words for the
    # pattern so written; the escape so written is the code point meant (hex 41 is "A", 3042 "あ")
    said = _refused_alike(backend, pattern)
    assert said == (f"regex {json.dumps(pattern)} cannot be compiled: it is not a valid regular expression (incomplete "
                    f"escape \\{pattern[at + 1]} at position {at}); write each braced escape of a code point (PCRE's "
                    "\\x{...}, ECMA's \\u{...}) as Python's re writes it (\\xHH, \\uHHHH, \\UHHHHHHHH); then "
                    + _refused_alike(backend, written))
    assert escape in written and re.fullmatch(escape, char)


@pytest.mark.parametrize("pattern, surrogate, code", [(r"\x{d800}", r"\ud800", "D800"),
                                                     (r"a\u{DFFF}b", r"a\udfffb", "DFFF"),
                                                     (r"\x{0000d800}", r"\ud800", "D800")])
def test_a_braced_escape_of_a_surrogate_is_offered_no_surrogate_the_engine_refuses(backend, pattern, surrogate, code):
    # \x{d800} was offered "\ud800", which the engine then refused (no UTF-8 output holds a surrogate; PCRE
    # and Rust's regex refuse \x{D800} themselves); a schema's \x{D800} and Python's \U0000D800 were offered it too
    from lmnb_engine.json_schema import checked_schema

    with pytest.raises(GrammarError, match=f"has the surrogate U\\+{code} outside a class"):
        backend.compile(regex=surrogate)
    said = _refused_alike(backend, pattern)
    assert said.endswith("; fix the pattern") and surrogate not in said, said
    for escape in (r"\x{D800}", r"\U0000D800"):
        with pytest.raises(ValueError) as e:
            checked_schema({"type": "string", "pattern": f"a{escape}"})
        assert "ud800" not in str(e.value).lower() and "writes a code point as another dialect does" not in str(e.value)


@pytest.mark.parametrize("pattern, at, then_at, written, offer", [
    (r"a\x{DBFF}\x{41}", 9, 1, r"a\x{DBFF}\u0041", r"ax\{DBFF\}\u0041"),
    (r"a\x{41}\x{DBFF}", 1, 7, r"a\u0041\x{DBFF}", r"a\u0041x\{DBFF\}"),
])
def test_a_schema_patterns_braced_surrogate_beside_another_braced_code_point_keeps_each_ones_reading(
        pattern, at, then_at, written, offer):
    # a\x{41} alone is offered a\u0041 (PCRE's code point) and a\x{DBFF} alone ax\{DBFF\} (ECMA's reading without the
    # u flag: no character is a surrogate); side by side, both were read as ECMA does without the flag, offered
    # ax\{DBFF\}x{41}, its \x{41} an x 41 times. Each is now read as it is alone (gen(), the engine's check and
    # build alike), the offer matching, by hand and by node's RegExp with the u flag, "ax{DBFF}A" alone
    import shutil

    import lmnb
    from lmnb_engine.json_schema import loaded_schema

    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", json_schema=schema)
    with pytest.raises(ValueError) as checked:
        loaded_schema(schema, engine=True)
    with pytest.raises(GrammarError) as built:
        schema_to_regex(schema)
    assert str(at_gen.value) == str(checked.value) == str(built.value) == (
        f"JSON schema at #/pattern: the pattern {json.dumps(pattern)} writes a code point as another dialect does, "
        f"\\x{{41}} at position {at}, which ECMA 262 (JSON Schema's dialect) reads as other characters without the u "
        "flag and refuses with it; ECMA's escape is \\u{...} or \\uXXXX, but Python's re, which reads a schema's "
        "pattern here, has no \\u{...}: \\uXXXX up to U+FFFF and the character itself past it are read alike by "
        f"both; write each such escape so; then the pattern {json.dumps(written)} cannot be read as JSON Schema reads "
        f"it: it has \\x without its two hex digits at position {then_at}, a syntax error of ECMA 262 with the u flag "
        "JSON Schema asks patterns be read with (2020-12 core, section 6.4); write "
        f"{json.dumps(offer)}, which means, with the flag too, what ECMA reads it as without it")
    texts = ["ax{DBFF}A", "aAx{DBFF}", "ax{DBFF}" + "x" * 41, "a"]
    meant = texts[:1] if pattern.index("DBFF") < pattern.index("41") else texts[1:2]
    regex = schema_to_regex({"type": "string", "pattern": offer})
    assert [t for t in texts if re.fullmatch(regex, json.dumps(t))] == meant
    if shutil.which("node"):
        assert _ecma_u_matches(offer, texts) == meant


@pytest.mark.parametrize("pattern, code", [(r"\ud800", "D800"), (r"a\U0000dfff?", "DFFF"), ("^x\udc00$", "DC00"),
                                           (r"(?x) \ud83d\ude00  # a pair is two surrogates to re", "D83D")])
def test_a_surrogate_outside_a_class_is_refused_by_gen_as_the_engine_refuses_it(backend, pattern, code):
    # gen(regex=r"\ud800") was taken (Python's re reads it) and the engine refused it at compile: gen(), a
    # cell and the engine now refuse it alike, in the engine's words; one in a class or a comment is no such
    # surrogate (a class leaves them out)
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} has the surrogate U+{code} outside a class, which no UTF-8 text holds, so no "
        "output can hold it; remove it (in a class, surrogates are left out)")
    import lmnb
    from lmnb_engine.regex_errors import pattern_problem

    for taken in (r"[^\ud800]", r"(?#\ud800)a", "(?x)a # \ud800", r"\\ud800"):  # (the last: a backslash, "ud800")
        assert pattern_problem(taken) is None and lmnb.gen("x", regex=taken)
        backend.compile(regex=taken)


def test_invalid_regex_syntax_says_what_is_wrong(backend):
    # outlines-core says only "Failed to build DFA error building NFA"; Python's parser names the problem
    with pytest.raises(GrammarError, match=r"not a valid regular expression \(missing \), unterminated subpattern at position 0\)"):
        backend.submit("(ab").result()


# --- bounded numbers ---------------------------------------------------------------------------


def test_integer_ranges_match_exactly_the_integers_in_range():
    rng = random.Random(0)
    for _ in range(60):
        lo = rng.choice([None, rng.randint(-250, 250)])
        hi = rng.choice([None, rng.randint(-250, 250)])
        if lo is not None and hi is not None and lo > hi:
            continue
        rx = re.compile(integer_range_regex(lo, hi))
        for n in range(-1100, 1100):
            inside = (lo is None or n >= lo) and (hi is None or n <= hi)
            assert bool(rx.fullmatch(str(n))) == inside, (lo, hi, n)
        for junk in ("-0", "00", "01", "+1", "", "1.0"):
            assert not rx.fullmatch(junk)


def test_number_ranges_are_sound_and_cover_canonical_decimals():
    samples = [f"{s}{i}{f}" for s in ("", "-") for i in range(0, 13) for f in ("", ".0", ".5", ".25", ".00", ".001")]
    samples = [s for s in samples if not s.startswith("-0") or s.strip("-0.") != ""]  # drop negative zeros
    rng = random.Random(1)
    for _ in range(80):
        lo, hi = rng.choice([None, rng.randint(-12, 12)]), rng.choice([None, rng.randint(-12, 12)])
        lo_x, hi_x = rng.random() < 0.5, rng.random() < 0.5
        try:
            rx = re.compile(number_range_regex(lo, hi, lo_x, hi_x))
        except GrammarError:
            assert lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x)))
            continue
        for s in samples:
            x = Fraction(s)
            inside = (lo is None or (x > lo if lo_x else x >= lo)) and (hi is None or (x < hi if hi_x else x <= hi))
            assert bool(rx.fullmatch(s)) == inside, (lo, hi, lo_x, hi_x, s)


def test_decimal_number_bounds_match_exactly_the_decimals_in_range():
    # outlines-core ignored bounds; lmnb refused fractional ones ("use an integer bound")
    texts = ["0", "-0.5"] + [f"{s}{i}{f}" for s in ("", "-") for i in range(4)
                             for f in ("",) + tuple(f".{d:03d}" for d in range(1000)) + (".05", ".3", ".25", ".0501", ".30")]
    texts = [t for t in texts if not t.startswith("-0") or t.strip("-0.") != ""]  # no negative zeros
    bounds = [None, Decimal("-2.5"), Decimal("-0.05"), Decimal(0), Decimal("0.3"), Decimal("0.05"), Decimal("0.25"),
              Decimal("1.25"), Decimal(2), Decimal("2.999")]
    rng = random.Random(2)
    for _ in range(40):
        lo, hi = rng.choice(bounds), rng.choice(bounds)
        lo_x, hi_x = rng.random() < 0.5, rng.random() < 0.5
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
            with pytest.raises(GrammarError, match="no number x satisfies"):
                number_range_regex(lo, hi, lo_x, hi_x)
            continue
        rx = re.compile(number_range_regex(lo, hi, lo_x, hi_x))
        for t in texts:
            x = Decimal(t)
            inside = (lo is None or (x > lo if lo_x else x >= lo)) and (hi is None or (x < hi if hi_x else x <= hi))
            assert bool(rx.fullmatch(t)) == inside, (lo, hi, lo_x, hi_x, t)


def test_fractional_bounds_in_a_schema_validate_with_jsonschema():
    schema = {"type": "object", "required": ["p", "t", "n"], "properties": {
        "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.95},  # pydantic Field(gt=0, le=0.95)
        "t": {"type": "number", "minimum": -0.5, "exclusiveMaximum": 1.5},
        "n": {"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.0}}}  # integers 1 and 2
    rx = re.compile(schema_to_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    for p in ("0", "0.01", "0.5", "0.95", "0.950", "0.951", "1"):
        for t in ("-0.6", "-0.5", "0", "1.49", "1.5"):
            for n in ("0", "1", "2", "3"):
                text = f'{{"p": {p}, "t": {t}, "n": {n}}}'
                assert bool(rx.fullmatch(text)) == validator.is_valid(json.loads(text)), text
    with pytest.raises(GrammarError, match="spells more than 40 digits"):
        schema_to_regex({"type": "number", "minimum": 1e-300})


@pytest.mark.parametrize("schema", [
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},  # pydantic Field(gt=0, lt=1)
    {"type": "number", "exclusiveMinimum": 0.25, "exclusiveMaximum": 5},
    {"type": "number", "minimum": -100, "exclusiveMaximum": -3},
    {"type": "number", "exclusiveMinimum": 123456.5},
])
def test_values_next_to_an_exclusive_bound_stay_inside_it_as_floats(schema):
    # jsonschema compares floats: 0.99999999999999999 parses to 1.0, which fails exclusiveMaximum 1
    rx = regex_module.compile(schema_to_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(3)
    checked = 0
    for _ in range(1500):
        text = ""
        while True:  # a random walk that leans on 0s and 9s, to run up to the bounds
            options = [c for c in "-0123456789." if rx.fullmatch(text + c, partial=True)]
            if not options or (rx.fullmatch(text) and rng.random() < 0.04):
                break
            text += rng.choice(options + [c for c in options if c in "09"] * 6)
        if rx.fullmatch(text):
            checked += 1
            assert validator.is_valid(json.loads(text)), text
    assert checked > 1000
    for text in ("0.99999999999999999", "0.0000000000000000001", "4.99999999999999999", "0.25000000000000001",
                 "-3.00000000000000001", "123456.50000000000001"):
        assert validator.is_valid(json.loads(text)) or not rx.fullmatch(text), text  # decimal-inside, float-outside
    inclusive = re.compile(number_range_regex(Decimal(0), Decimal(1), False, False))
    assert inclusive.fullmatch("0.99999999999999999")  # 1.0 <= 1: no limit where no bound is exclusive


def test_values_beyond_a_float_s_integer_precision_take_no_fraction():
    # 9007199254740993.5 parses to the float 9007199254740994.0 and 9007199254740993.0 to ...992.0:
    # a fraction there rounds past a bound that an integer (read exactly) does not
    for schema in ({"type": "number", "minimum": 9007199254740993}, {"type": "number", "maximum": -9007199254740993},
                   {"type": "number", "minimum": 2, "maximum": 1e17}):
        rx = regex_module.compile(schema_to_regex(schema))
        validator = jsonschema.Draft202012Validator(schema)
        for text in ("9007199254740993", "9007199254740993.0", "9007199254740994.5", "-9007199254740993.0",
                     "-9007199254740993", "100000000000000000", "99999999999999.5", "1000000000000000.5"):
            assert not rx.fullmatch(text) or validator.is_valid(json.loads(text)), (schema, text)
        for text in random_matches(rx, list("-0123456789."), walks=60):
            assert validator.is_valid(json.loads(text)), (schema, text)
    below = re.compile(number_range_regex(Decimal(0), Decimal(10**17), False, False))
    assert below.fullmatch("99999999999999.5") and below.fullmatch("123456789012345678"[:17])
    assert not below.fullmatch("1000000000000000.5")  # 16 integer digits: a float holds no .5 beside them
    # no number of at most 15 digits lies strictly between 0 and 1e-15 (it matched only the empty text)
    with pytest.raises(GrammarError, match="no number x written with at most 15 digits satisfies 0 < x < 1E-15"):
        schema_to_regex({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-15})


@pytest.mark.parametrize("schema", [
    {"type": "number"}, {"type": ["number", "null"]}, {"type": "number", "minimum": 0},
    {"type": "number", "exclusiveMaximum": 5},
])
def test_numbers_stay_finite_as_floats(schema):
    # 1e+400, or 400 digits, read as a float is infinity: pydantic's FiniteFloat (schema {"type": "number"})
    # refused it, and json.dumps writes it back as 'Infinity', which is no JSON
    from pydantic import BaseModel, FiniteFloat

    class Finite(BaseModel):
        x: FiniteFloat

    rx = regex_module.compile(schema_to_regex(schema))
    for text in ("1e+400", "-2.5E+0370", "1" * 400, "-" + "9" * 309, "1" * 330 + ".5"):
        assert not rx.fullmatch(text), text[:12]
    bounded = "minimum" in schema or "exclusiveMaximum" in schema  # (written without an exponent)
    for text in ("1e+99", "2.5E-7", "1e-400", "-3.25", "4", "1" * 100, "-" + "9" * 100):
        if jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) and not (bounded and "e" in text.lower()):
            assert rx.fullmatch(text), text[:12]
            Finite.model_validate_json(f'{{"x": {text}}}')


def test_bounded_schema_fields_validate_with_jsonschema():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "exclusiveMinimum": -3, "maximum": 40},
            "x": {"type": ["number", "null"], "minimum": 0, "exclusiveMaximum": 2},
        },
        "required": ["n", "x"],
    }
    rx = re.compile(schema_to_regex(schema))
    for n in range(-10, 60):
        for x in ("0", "0.5", "1.999", "2", "2.0", "-0.5", "null", "1"):
            text = f'{{"n": {n}, "x": {x}}}'
            valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
            assert bool(rx.fullmatch(text)) == valid, text


def test_draft_4_boolean_exclusive_bounds_mean_what_draft_4_says():
    """Draft 4 writes an exclusive bound as a flag beside minimum/maximum (later drafts as a number;
    the float check refused the flag). Reference: jsonschema's Draft 4 validator."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "required": ["a", "b", "c"],
              "properties": {"a": {"type": "integer", "minimum": 3, "exclusiveMinimum": True},
                             "b": {"type": "integer", "maximum": 6, "exclusiveMaximum": False},
                             "c": {"enum": [3, 4, 5], "maximum": 5, "exclusiveMaximum": True}}}
    rx = re.compile(schema_to_regex(schema))
    validator = jsonschema.Draft4Validator(schema)
    # a parent's checks read the child with draft 4's meaning too ('[5]' passed the enum filter)
    nested = {"$schema": schema["$schema"], "type": "array", "enum": [[5], [6]],
              "items": {"type": "integer", "minimum": 5, "exclusiveMinimum": True}}
    assert re.fullmatch(schema_to_regex(nested), "[6]") and not re.fullmatch(schema_to_regex(nested), "[5]")
    for n in range(0, 9):
        text = f'{{"a": {n}, "b": {n}, "c": {min(max(n, 3), 5)}}}'
        assert bool(rx.fullmatch(text)) == validator.is_valid(json.loads(text)), text


def test_date_formats_match_exactly_what_the_format_checker_accepts():
    """outlines-core's date grammar took Unicode digits (through \\d), month 13 and 31 February;
    its date-time took years of any length and no time zone. The references: Python's
    ``date.fromisoformat`` (which jsonschema's "date" check uses) and jsonschema's format checker."""

    checker = jsonschema.FormatChecker()
    assert "date-time" in checker.checkers  # rfc3339-validator is installed: the check is real
    date = re.compile(schema_to_regex({"type": "string", "format": "date"}))
    for year in ("0000", "0001", "0004", "0100", "0400", "1900", "2000", "2023", "2024", "9999"):
        for month in range(14):
            for day in range(33):
                text = f"{year}-{month:02d}-{day:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    valid = True
                except ValueError:
                    valid = False
                assert bool(date.fullmatch(json.dumps(text))) == valid == checker.conforms(text, "date"), text
    assert not date.fullmatch(json.dumps("２０２４-01-01")) and not date.fullmatch(json.dumps("12024-01-01"))
    stamp = re.compile(schema_to_regex({"type": ["string", "null"], "format": "date-time"}))
    for text in ("2024-02-29T23:59:59Z", "1999-12-31T00:00:00.123456+05:30", "0001-01-01T12:30:00-00:00",
                 "2023-02-29T00:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T00:00:00", "-2024-01-01T00:00:00Z",
                 "12024-01-01T00:00:00Z", "2024-01-01 00:00:00Z", "2024-01-01T00:60:00Z", "2024-01-01T00:00:00+24:00"):
        assert bool(stamp.fullmatch(json.dumps(text))) == checker.conforms(text, "date-time"), text
    assert stamp.fullmatch("null")
    both = re.compile(schema_to_regex({"type": ["string", "integer"], "format": "date", "minimum": 0}))
    assert both.fullmatch('"2024-02-29"') and both.fullmatch("7") and not both.fullmatch("-7")
    assert not both.fullmatch('"2024-02-30"') and not both.fullmatch('"٢٠٢٤-01-01"')  # with numeric bounds too
    # listed values are filtered by the keywords beside them (jsonschema applies them all)
    for schema, kept, dropped in [({"type": "string", "format": "date", "enum": ["2024-02-30", "2024-01-01"]},
                                   '"2024-01-01"', '"2024-02-30"'),
                                  ({"type": "integer", "minimum": 0, "enum": [-3, 3]}, "3", "-3")]:
        rx = re.compile(schema_to_regex(schema))
        assert rx.fullmatch(kept) and not rx.fullmatch(dropped)
    with pytest.raises(GrammarError, match='const "yesterday", which does not pass its own type, format'):
        schema_to_regex({"type": "string", "format": "date-time", "const": "yesterday"})
    with pytest.raises(GrammarError, match="no enum value passes its own type, minimum"):
        schema_to_regex({"type": "integer", "minimum": 5, "enum": [1, 2]})
    # outlines-core enforced the pattern or length and dropped the format ('"abc"' matched)
    with pytest.raises(GrammarError, match='format "uuid" and a pattern'):
        schema_to_regex({"type": "string", "format": "uuid", "pattern": "^[a-z]+$"})
    fixed = re.compile(schema_to_regex({"type": "string", "format": "date", "maxLength": 10}))  # every date fits
    assert fixed.fullmatch('"2024-02-29"') and not fixed.fullmatch('"2023-02-29"') and not fixed.fullmatch('"ab"')


class TreeNode(pydantic.BaseModel):
    """A recursive pydantic model: a list of itself, optional."""

    v: int
    kids: list["TreeNode"] = []


class Expr(pydantic.BaseModel):
    """A required recursion that ends in null: outlines-core cut it with '{}' (missing 'op')."""

    op: str = pydantic.Field(pattern="^[+*]$")
    left: "Expr | None"


NULL_LIST = {"type": "object", "properties": {"n": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}, "required": ["n"]}


def nested(open_: str, leaf: str, close: str, depth: int) -> str:
    return open_ * depth + leaf + close * depth


@pytest.mark.parametrize("schema, reached, cut", [
    # (schema, values it must produce, values it must not: outlines-core's cut wrote the '{}' in them)
    (NULL_LIST, [nested('{"n": ', "null", "}", d) for d in range(1, MAX_REF_DEPTH + 1)],
     [nested('{"n": ', "{}", "}", d) for d in range(1, MAX_REF_DEPTH + 1)]),
    (Expr, ['{"op": "+", "left": null}', '{"op": "*", "left": {"op": "+", "left": null}}'],
     ['{"op": "+", "left": {}}', '{"op": "+", "left": {"op": "*", "left": {}}}']),
    (TreeNode, ['{"v": 1}', '{"v": 1, "kids": []}', '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}'],
     ['{"v": 1, "kids": [{}]}']),
    # outlines-core refused these two ("Ref recusion limit reached")
    ({"type": "array", "items": {"$ref": "#"}}, ["[]", "[[], [[]]]", nested("[", "", "]", MAX_REF_DEPTH)], []),
    ({"type": "object", "additionalProperties": {"$ref": "#"}}, ["{}", '{"a": {"b": {}}, "c": {}}'], []),
])
def test_recursive_schemas_produce_only_valid_values_to_the_recursion_depth(schema, reached, cut):
    """Soundness by a random walk over the regex's characters (the ``regex`` module's partial
    matching says which extensions can still match; jsonschema validates each value reached), and
    coverage by values of every depth up to ``MAX_REF_DEPTH``."""
    rx = regex_module.compile(schema_to_regex(schema))
    as_dict = schema.model_json_schema() if isinstance(schema, type) else schema
    validator = jsonschema.Draft202012Validator(as_dict)
    for text in reached:
        assert validator.is_valid(json.loads(text)) and rx.fullmatch(text), text
    for text in cut:
        assert not validator.is_valid(json.loads(text)) and not rx.fullmatch(text), text
    for text in random_matches(rx, sorted(set('{}[]":, nul0123+*') | set("".join(reached)))):
        assert validator.is_valid(json.loads(text)), text


def random_matches(rx, alphabet, walks: int = 30) -> list[str]:
    """Full matches of ``rx`` reached by random walks over ``alphabet``: each step takes a
    character after which a match is still possible (the ``regex`` module's partial matching); a
    walk that the alphabet leads into a dead end is dropped."""
    rng = random.Random(0)
    out = []
    for _ in range(walks):
        text = ""
        while not (rx.fullmatch(text) and rng.random() < 0.3):
            options = [c for c in alphabet if rx.fullmatch(text + c, partial=True)]
            if not options:
                break
            text += rng.choice(options)
            assert len(text) < 3000
        if rx.fullmatch(text):
            out.append(text)
    assert len(out) >= walks // 2, out  # the alphabet reaches matches
    return out


@pytest.mark.parametrize("pattern, reached", [
    # outlines-core pasted the pattern between the quotes: '"\x11@\x11"' (not JSON), '"a"b"'
    ("^[^@]+@[^@]+$", ['"a@b"', '"\\"@é"']),
    ('^a"b$', ['"a\\"b"']),
    ("^a\\\\b$", ['"a\\\\b"']),  # a literal backslash: "a\\b" decoded to a backspace
    ("^a.b$", ['"a\\tb"', '"a\\"b"']),
    ("^a\\$$", ['"a$"']),  # an escaped '$' is no anchor
    # Python's \d, \w, \s (jsonschema's) narrowed to ASCII: the automaton's Unicode tables differ
    ("^\\d+$", ['"12"']), ("^[\\w.-]+$", ['"a_b.c-1"']), ("^\\S+$", ['"a\\\\"']), ("^\\s+$", ['" \\n"']),
    ("^(ab|c)*$", ['""', '"abc"']),
    # anchors at the ends of alternatives and groups were refused ("uses a '$' anchor")
    ("^\\d{5}$|^\\d{5}-\\d{4}$", ['"19191"', '"11111-9191"']), ("^a$|^b$", ['"a"', '"b"']),
    ("(^ab$)", ['"ab"']), ("^(?:a|b$)", ['"a"', '"b"']), ("^$|^c$", ['""', '"c"']),
])
def test_string_patterns_hold_on_the_decoded_string_and_output_stays_json(pattern, reached):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=""))
    validator = jsonschema.Draft202012Validator(schema)
    for text in reached:
        assert rx.fullmatch('{"s":' + text + "}"), text
    alphabet = list('{}":sabcnt@.-_$19 \\\x11\n\té٣\u0301½A') + ["\xa0"]
    for text in random_matches(rx, alphabet, walks=40):
        assert validator.is_valid(json.loads(text)), text


def test_patterns_naming_surrogates_compile_and_hold_on_the_decoded_string(tokenizer):
    # [^\ud800] put a surrogate range in the class, which the automaton library refuses ("error
    # building NFA"); a literal surrogate crashed the compile with UnicodeEncodeError
    schema = {"type": "string", "pattern": "^[^\ud800a]+$"}
    regex = schema_to_regex(schema)
    compile_grammar(regex, TokenVocabulary(tokenizer))
    validator = jsonschema.Draft202012Validator(schema)
    for text in random_matches(regex_module.compile(regex), list('"ab\\\u00e9\ud7ff\ue000\U0001f600'), walks=30):
        assert validator.is_valid(json.loads(text)) and "a" not in json.loads(text), text
    with pytest.raises(GrammarError, match=re.escape(  # (named as a lone surrogate: test_a_schema_patterns_lone_surrogate_...)
            'at #/properties/s/pattern: the pattern "^a\\ud800$" holds the lone surrogate U+D800 at position 2,')):
        schema_to_regex({"properties": {"s": {"type": "string", "pattern": "^a\ud800$"}}})


@pytest.mark.parametrize("pattern, min_length, max_length, alphabet", [
    ("^[A-Z][a-z]+$", 0, 4, "Aab"),  # pydantic's Field(pattern=..., max_length=4): [A-Z][a-z]{1,3}
    ("^a(bc)*$", 3, 6, "abc"),  # a repeat of a two-character part: 3 and 5 characters
    ("^(ab|c+)$", 2, 3, "abc"),  # each branch narrowed: ab, cc, ccc
    ("^(a+|b)$", 2, None, "ab"),  # the branch that cannot fit is dropped
    ('^"[ab]*$', 0, 3, '"ab\\'),  # a quote is one character of the string, two of the JSON text
    ("^x[ab]{1,5}y$", 4, 5, "abxy"),  # a counted repeat narrowed from both ends
    ("^(?:ab|cd)$", 0, 2, "abcd"),  # the whole fits already: unchanged
])
def test_lengths_beside_a_pattern_are_folded_into_it(pattern, min_length, max_length, alphabet):
    # outlines-core enforced the length and dropped the pattern ('"7%"' for ^a*$ with minLength 2)
    schema = {"type": "string", "pattern": pattern, "minLength": min_length}
    if max_length is not None:
        schema["maxLength"] = max_length
    rx = regex_module.compile(schema_to_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    matched = 0
    for length in range(8):  # every string of up to 7 characters over the alphabet
        for chars in itertools.product(alphabet, repeat=length):
            text = "".join(chars)
            assert bool(rx.fullmatch(json.dumps(text))) == (validator.is_valid(text) and bool(re.fullmatch(pattern, text))), text
            matched += bool(rx.fullmatch(json.dumps(text)))
    assert matched


def test_an_unanchored_pattern_without_a_whole_match_of_the_length_is_not_called_unsatisfiable(backend):
    # 'ab' validates (JSON Schema searches), yet the message said "no string can validate"
    schema = {"type": "string", "pattern": "b", "minLength": 2, "maxLength": 3}
    assert jsonschema.Draft202012Validator(schema).is_valid("ab")
    with pytest.raises(GrammarError) as info:
        backend.to_regex(json_schema=schema)
    assert "no string can validate" not in str(info.value)
    assert "no whole-string match of 2 to 3 characters" in str(info.value) and "anchor it" in str(info.value)
    # anchored, no string of that length validates, and the message says so
    anchored = {"type": "string", "pattern": "^b$", "minLength": 2}
    assert not jsonschema.Draft202012Validator(anchored).is_valid("bb")
    with pytest.raises(GrammarError, match="no string can validate"):
        backend.to_regex(json_schema=anchored)


def test_pydantic_pattern_and_length_fields_compile(backend):
    class Code(pydantic.BaseModel):
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}-\d+$", min_length=4, max_length=6)

    rx = re.compile(backend.to_regex(json_schema=Code))
    assert rx.fullmatch('{"code": "AB-1"}') and rx.fullmatch('{"code": "AB-123"}')
    assert not rx.fullmatch('{"code": "AB-"}') and not rx.fullmatch('{"code": "AB-1234"}')


_PYDANTIC_TYPE = {"time": datetime.time, "duration": datetime.timedelta, "uuid": uuid.UUID,
                  "uuid4": pydantic.UUID4, "ipv4": ipaddress.IPv4Address, "uri": pydantic.HttpUrl}


@pytest.mark.parametrize("fmt, valid, invalid, alphabet", [
    ("time", ["23:59:59Z", "00:00:00.5+05:30"], ["24:00:00Z", "12:00:00", "12:60:00Z"], "0159:.Z+"),
    # at most 6 digits a part: P9999999W is beyond timedelta's 999999999 days (pydantic refuses it)
    ("duration", ["P1D", "PT5M", "P2DT3H4S", "P3W", "P999999DT999999H999999M999999S"],
     ["P", "PT", "P1H", "P1DT", "1D", "P9999999W"], "P129DTHMSW"),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"], "0a9F-"),
    # pydantic's UUID4: the version digit, and RFC 4122's variant (else uuid.UUID has no version)
    ("uuid4", ["123e4567-e89b-42d3-a456-426614174000"], ["123e4567-e89b-12d3-a456-426614174000",
                                                          "123e4567-e89b-42d3-c456-426614174000"], "0a9F4-"),
    ("email", ["a.b+c@ex-ample.org"], ["a..b@x.org", ".a@x.org", "a@x", "a@x.1", "a b@x.org"], "ab.@-x"),
    # at most 253 characters: four 63-character labels (255) failed the format checker
    ("hostname", ["a", "ex-ample.org", "a1.b2.c3.d4"], ["-a", "a-", "a..b", "a_b", "a.b.c.d.e",
                                                       ".".join(["a" * 63] * 4)], "ab.-1"),
    ("ipv4", ["0.0.0.0", "255.255.255.255", "10.1.20.199"], ["256.0.0.0", "01.2.3.4", "1.2.3", "1.2.3.4.5"], "0125."),
    # URL parsers read a host whose last label is all digits as IPv4 (1.2.3.256, a.1 fail), and
    # ports end at 65535: pydantic's HttpUrl refuses them
    ("uri", ["https://ex.org", "http://a.b:8080/p/q%20r?x=1&y=/z", "http://a:65535"],
     ["ftp://a", "https://", "http://a/%zz", "http://a/ b", 'http://a/"', "http://1.2.3.256", "http://a.1:80",
      "http://a:65536", "http://a:99999"], "htps:/a.b?=%25691"),
])
def test_formats_match_only_what_the_format_checker_accepts(fmt, valid, invalid, alphabet):
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER  # (FormatChecker() mixes in draft 3's "time")
    assert fmt in checker.checkers or fmt in _PYDANTIC_TYPE  # the optional checkers are installed: the checks are real
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"]}
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=""))
    for text in valid:
        assert rx.fullmatch('{"v":' + json.dumps(text) + "}") and checker.conforms(text, fmt), text
    for text in invalid:
        assert not rx.fullmatch('{"v":' + json.dumps(text) + "}"), text
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    for text in random_matches(rx, list('{}":v' + alphabet), walks=40):
        value = json.loads(text)
        assert validator.is_valid(value), text
        if fmt in _PYDANTIC_TYPE:  # what a pydantic model with that field type reads back
            pydantic.TypeAdapter(_PYDANTIC_TYPE[fmt]).validate_python(value["v"])
        if fmt == "email":  # jsonschema only checks for an '@': RFC 5322's dot-atom, by hand
            local, domain = value["v"].split("@")
            assert ".." not in local and not local.startswith(".") and not local.endswith("."), text


def test_an_email_field_with_the_usual_max_length_compiles():
    # pydantic's EmailStr = Field(max_length=255) (FastAPI's template) was refused: the length
    # varied in two places; every address the format writes now fits in 247 characters
    rx = regex_module.compile(schema_to_regex({"type": "string", "format": "email", "maxLength": 255}))
    longest = ".".join(["a" * 20] * 3) + "@" + ".".join(["b" * 40] * 3) + "." + "c" * 61
    assert len(longest) == 247 and rx.fullmatch(json.dumps(longest)) and not rx.fullmatch(json.dumps("x" + longest))


def test_an_email_field_with_a_shorter_max_length_writes_addresses_that_fit():
    # it was refused (the length varies in several places); the format is narrowed to fit instead
    import re._parser as sre_parse

    for n in range(6, 247):  # Python's own width of the whole string regex: 2 quotes + n characters at most
        rx = schema_to_regex({"type": "string", "format": "email", "maxLength": n})
        assert sre_parse.parse(rx).getwidth()[1] <= n + 2, n
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for n, usual in [(6, "a@b.cc"), (20, "ann@gmail.com"), (50, "jane.doe@mail.example.org"),
                     (100, "first.middle.last@dept.example.co.uk")]:
        schema = {"type": "string", "format": "email", "maxLength": n}
        rx = regex_module.compile(schema_to_regex(schema))
        assert rx.fullmatch(json.dumps(usual)), (n, usual)
        validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
        for text in random_matches(rx, list('"ab.@-x_1'), walks=40):
            value = json.loads(text)
            assert validator.is_valid(value) and len(value) <= n, text
            local, _ = value.split("@")
            assert ".." not in local and not local.startswith(".") and not local.endswith("."), text
    with pytest.raises(GrammarError):
        schema_to_regex({"type": "string", "format": "email", "maxLength": 5})


@pytest.mark.parametrize("schema, kept, dropped", [
    # outlines-core failed on these ("Unsupported JSON Schema structure"); bounds alone were refused
    ({"minLength": 2}, ['"ab"', '"abc"'], ['"a"', "7"]),
    ({"items": {"type": "integer"}, "maxItems": 2}, ["[]", "[1,2]"], ["[1,2,3]", '"a"']),
    ({"minimum": 1.5}, ["1.5", "20"], ["1", '"a"']),
    ({"required": ["a"], "properties": {"a": {"const": 1}}}, ['{"a":1}'], ["{}", "1"]),
])
def test_a_schema_without_type_gets_the_type_its_keywords_imply(schema, kept, dropped):
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=""))
    validator = jsonschema.Draft202012Validator(schema)
    for text in kept:
        assert rx.fullmatch(text) and validator.is_valid(json.loads(text)), text
    for text in dropped:  # (those of other types validate too: only the implied type is written)
        assert not rx.fullmatch(text), text
    for text in random_matches(rx, list('{}[]":,a.-1259'), walks=30):
        assert validator.is_valid(json.loads(text)), text
    with pytest.raises(GrammarError, match='no "type" and keywords for string and number values'):
        schema_to_regex({"maxLength": 3, "maximum": 2})


def test_property_names_listing_the_keys_make_a_map_of_those_keys():
    # pydantic's dict[Literal[...], V] and dict[SomeEnum, V]; 'propertyNames' was refused by name
    class Color(str, enum.Enum):
        red = "red"
        blue = "blue"

    class Scores(pydantic.BaseModel):
        by_letter: dict[typing.Literal["x", "y"], int]
        by_color: dict[Color, typing.Annotated[int, pydantic.Field(ge=0, le=9)]]

    schema = Scores.model_json_schema()
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=""))
    validator = jsonschema.Draft202012Validator(schema)
    def in_schema_order(keys, names):  # each key at most once, in the listed order (as keys are written)
        return all(k in names for k in keys) and [names.index(k) for k in keys] == sorted({names.index(k) for k in keys})

    for letters in itertools.product([None, "x", "y", "z"], repeat=2):
        for colors in itertools.product([None, "red", "blue", "green"], repeat=2):
            for value in (3, 12):
                letter_keys, color_keys = [k for k in letters if k], [k for k in colors if k]
                a = ",".join(f'"{k}":{value}' for k in letter_keys)
                b = ",".join(f'"{k}":{value}' for k in color_keys)
                text = f'{{"by_letter":{{{a}}},"by_color":{{{b}}}}}'
                expected = (in_schema_order(letter_keys, ["x", "y"]) and in_schema_order(color_keys, ["red", "blue"])
                            and (value <= 9 or not color_keys))
                assert bool(rx.fullmatch(text)) == expected, text
                assert not expected or validator.is_valid(json.loads(text)), text
    for schema, message in [({"type": "object", "propertyNames": {"pattern": "^a"}}, "only as a list of names"),
                            ({"type": "object", "propertyNames": {"enum": ["a"]}, "properties": {"b": {}}},
                             'the property "b", which its "propertyNames" does not allow')]:
        with pytest.raises(GrammarError, match=message):
            schema_to_regex(schema)


def test_unique_items_over_listed_values_are_subsequences_of_the_list(tokenizer):
    # pydantic's set[Literal[...]], set[Enum], frozenset[bool]; outlines-core ignored uniqueItems ('["a", "a"]')
    class Color(str, enum.Enum):
        red = "red"
        blue = "blue"
        green = "green"

    class Picks(pydantic.BaseModel):
        tags: set[typing.Literal["a", "b", "c"]]
        colors: frozenset[Color] = pydantic.Field(min_length=1, max_length=2)
        flags: typing.Optional[set[bool]]

    schema = Picks.model_json_schema()
    compile_grammar(schema_to_regex(schema), TokenVocabulary(tokenizer))  # the automaton builds
    rx = regex_module.compile(schema_to_regex(schema, whitespace_pattern=""))
    validator = jsonschema.Draft202012Validator(schema)

    def arrays(values):  # every array of up to 3 of the values, repeats and any order included
        return [list(a) for k in range(4) for a in itertools.product(values, repeat=k)]

    def listed_order(array, values):
        return [values.index(v) for v in array] == sorted({values.index(v) for v in array})

    # the schema relates no two properties (no dependencies, no if/then): a value is valid where each of its
    # properties is, each validated once in an object otherwise valid, not once per combination (139k: 30 s)
    valid = {"tags": [], "colors": ["red"], "flags": None}
    assert validator.is_valid(valid)

    def valid_values(key, values):
        return {json.dumps(v): validator.is_valid({**valid, key: v}) for v in values}

    tags_ok = valid_values("tags", arrays(["a", "b", "c", "d"]))
    colors_ok = valid_values("colors", arrays(["red", "blue", "green"]))
    flags_ok = valid_values("flags", [None, *arrays([False, True, 1])])
    for tags in arrays(["a", "b", "c", "d"]):
        for colors in arrays(["red", "blue", "green"]):
            for flags in [None, *arrays([False, True, 1])]:
                value = {"tags": tags, "colors": colors, "flags": flags}
                text = json.dumps(value, separators=(",", ":"))
                expected = (tags_ok[json.dumps(tags)] and colors_ok[json.dumps(colors)] and flags_ok[json.dumps(flags)]
                            and listed_order(tags, ["a", "b", "c"]) and listed_order(colors, ["red", "blue", "green"])
                            and (flags is None or listed_order(flags, [False, True])))
                assert bool(rx.fullmatch(text)) == expected, text
                if expected:
                    Picks.model_validate_json(text)
    # listed values JSON holds equal are written once (1 and 1.0; true is no 1); ones the type rejects are dropped
    rx = regex_module.compile(schema_to_regex({"type": "array", "uniqueItems": True,
                                               "items": {"type": ["number", "boolean"], "enum": [1, 1.0, True, "x"]}}))
    assert {t for t in ("[]", "[1]", "[true]", "[1, true]", "[1.0]", '["x"]', "[1, 1.0]") if rx.fullmatch(t)} == {
        "[]", "[1]", "[true]", "[1, true]"}
    for items, twice in [({"enum": [[1], [1.0]]}, "[[1],[1.0]]"), ({"enum": [{"a": 1}, {"a": 1.0}]}, '[{"a":1},{"a":1.0}]'),
                         ({"const": "a", "enum": ["b"]}, '["a"]')]:  # nested numbers; const and enum both apply
        schema = {"type": "array", "uniqueItems": True, "items": items}
        assert not regex_module.fullmatch(schema_to_regex(schema, whitespace_pattern=""), twice)
        assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(twice))


def test_pydantic_model_class_is_accepted(backend):
    class Item(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=5)
        qty: int = pydantic.Field(ge=1, le=3)

    rx = re.compile(backend.to_regex(json_schema=Item))
    assert rx.fullmatch('{"name": "ab", "qty": 3}')
    assert not rx.fullmatch('{"name": "ab", "qty": 4}')

    class Cat(pydantic.BaseModel):
        kind: typing.Literal["cat"]

    class Dog(pydantic.BaseModel):
        kind: typing.Literal["dog"]
        bark: bool

    class Pet(pydantic.BaseModel):  # a discriminated union: oneOf over $refs, told apart by the Literal tag
        pet: typing.Annotated[typing.Union[Cat, Dog], pydantic.Field(discriminator="kind")]

    rx = re.compile(backend.to_regex(json_schema=Pet))
    assert rx.fullmatch('{"pet": {"kind": "dog", "bark": true}}') and not rx.fullmatch('{"pet": {"kind": "cow"}}')

    class Loose(pydantic.BaseModel):  # typing.Any becomes {"title": "X"}, which outlines-core refused
        x: typing.Any

    rx = re.compile(backend.to_regex(json_schema=Loose))
    for value in ([1, "a"], None, {"k": True}):
        assert rx.fullmatch(json.dumps({"x": value})) and Loose.model_validate_json(json.dumps({"x": value}))


def test_openapi_annotations_from_pydantic_extras_are_accepted(backend):
    # FastAPI's examples put OpenAPI's "example" into the schema; it was refused as a keyword that
    # "cannot be enforced while decoding", though no validator reads it
    class Order(pydantic.BaseModel):
        model_config = {"json_schema_extra": {"example": {"qty": 2}, "externalDocs": {"url": "https://x.org"}}}
        qty: int = pydantic.Field(ge=1, le=3, json_schema_extra={"example": 2, "xml": {"name": "q"}})

    rx = regex_module.compile(backend.to_regex(json_schema=Order))
    assert rx.fullmatch('{"qty": 2}') and not rx.fullmatch('{"qty": 4}')
    validator = jsonschema.Draft202012Validator(Order.model_json_schema())
    for text in random_matches(rx, list('{}":qty 0123456789'), walks=20):
        assert validator.is_valid(json.loads(text)) and Order.model_validate_json(text), text


# --- token bytes ---------------------------------------------------------------------------


def test_token_bytes_spell_what_the_tokenizer_encodes(tokenizer):
    vocab = TokenVocabulary(tokenizer)
    for text in ['{"name": "Paris", "n": 12}', "café naïve 東京 😀 ok", "a\n\tb \\ \" end"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert vocab.text_of(ids) == text.encode("utf-8")
    for i, b in enumerate(vocab.token_bytes):
        if b is not None:
            try:
                assert tokenizer.decode([i]) == b.decode("utf-8")
            except UnicodeDecodeError:
                pass  # part of a character: the tokenizer prints U+FFFD for it
    special = set(tokenizer.added_tokens_decoder)
    assert all(vocab.token_bytes[i] is None for i in special)


def test_prefix_tokens_by_brute_force(tokenizer):
    vocab = TokenVocabulary(tokenizer)
    spelled = {b for b in vocab.token_bytes if b is not None}
    for i, b in enumerate(vocab.token_bytes):
        if b is None or i in vocab.eos_token_ids:
            continue
        expected = any(o != b and o.startswith(b) for o in spelled)
        assert bool(vocab.is_prefix_token[i]) == expected, b


# --- masks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, samples",
    [
        (r"[0-9]{2,4}-(ab|cd)x?", ["12-abx", "1234-cd"]),
        (r'\{"key": "[a-z ]{0,6}", "n": (0|[1-9][0-9]?)\}', ['{"key": "a b", "n": 42}']),
        (r"(the|then|there) (cat|dog)s?", ["there dogs", "the cat"]),
        # a complete match that may go on: outlines-core dropped the tokens that continue it into an
        # incomplete one (no "." after "3", no " " after "yes": dtype=float never wrote a fraction)
        (r"[0-9]+(\.[0-9]+)?", ["3.25", "12"]),
        (r"(yes|no)( please)?", ["yes please", "no"]),
        (REGEX_FLOAT, ["-3.5e+2 ", "7"]),
    ],
)
def test_masks_allow_exactly_the_tokens_that_keep_a_match_possible(backend, pattern, samples):
    grammar = backend.compile(regex=pattern)
    vocab = grammar.vocab
    eos = next(iter(vocab.eos_token_ids))
    for sample in samples:
        ids = backend.vocab.encode(sample)
        matcher = GrammarMatcher(grammar)
        for k in range(len(ids) + 1):
            prefix = vocab.text_of(ids[:k]).decode()
            bits = matcher.bitmask()
            allowed = set(np.flatnonzero(np.unpackbits(bits.numpy().view(np.uint8), bitorder="little")).tolist())
            assert set(grammar.allowed_ids(matcher.state).tolist()) == allowed
            expected = set()
            for t, b in enumerate(vocab.token_bytes):
                if b is None or t in vocab.eos_token_ids:
                    continue
                try:
                    piece = b.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # partial characters cannot match an ASCII pattern
                if regex_module.fullmatch(pattern, prefix + piece, partial=True):
                    expected.add(t)
            if re.fullmatch(pattern, prefix):
                expected.add(eos)
            assert allowed == expected, (sample, prefix)
            if k < len(ids):
                matcher.accept_token(ids[k])
        assert matcher.is_accepting()


def test_apply_token_bitmask_matches_a_dense_mask():
    gen = torch.Generator().manual_seed(0)
    vocab_size = 100
    logits = torch.randn(3, vocab_size, generator=gen)
    dense = torch.rand(3, vocab_size, generator=gen) < 0.3
    dense[1] = True
    bitmask = torch.stack([pack_token_ids(np.flatnonzero(row.numpy()), vocab_size) for row in dense])
    out = apply_token_bitmask_(logits.clone(), bitmask)
    assert torch.equal(out, logits.masked_fill(~dense, float("-inf")))


# --- compressed FSM ------------------------------------------------------------------------


def test_forced_strings_are_the_common_continuation_of_a_finite_language(backend):
    """For a finite set of words, the forced string after a prefix P (not itself a word) is the
    longest common prefix of the words' continuations after P."""
    rng = random.Random(3)
    alphabet = "ab\"{}: é東"
    words = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(3, 9))) for _ in range(6)})
    words += ["prefix-shared-" + w for w in words[:3]]
    grammar = backend.compile(regex="|".join(re.escape(w) for w in words))
    prefixes = {w.encode()[:i] for w in words for i in range(len(w.encode()) + 1)}
    for prefix in sorted(prefixes):
        matcher = GrammarMatcher(grammar)
        for b in prefix:
            matcher.accept_token(int(grammar.vocab.byte_token[b]))
        tails = [w.encode()[len(prefix):] for w in words if w.encode().startswith(prefix)]
        common = 0
        if b"" not in tails:  # a complete word may also end here: nothing is forced
            while all(len(t) > common for t in tails) and len({t[common] for t in tails}) == 1:
                common += 1
        expected = tails[0][:common]
        assert matcher.forced_bytes() == expected, prefix


def test_jump_draft_spells_the_forced_string_in_canonical_tokens(backend, tokenizer):
    grammar = backend.compile(regex=r'\{"name": "[a-z]{1,5}", "city": "(paris|london)"\}')
    matcher = GrammarMatcher(grammar)
    draft = matcher.propose_draft([], max_tokens=50)
    full = tokenizer.encode('{"name": "', add_special_tokens=False)
    spelled = [grammar.vocab.token_bytes[t] for t in range(len(grammar.vocab.token_bytes))]
    last = spelled[full[-1]]
    held_back = any(b is not None and b != last and b.startswith(last) for b in spelled)
    assert draft == (full[:-1] if held_back else full)
    assert matcher.state == grammar.initial_state  # proposing does not move the matcher


def test_a_forced_string_longer_than_the_model_max_length_plans_a_draft_without_a_warning(tiny_llama):
    # transformers warned "Token indices sequence length is longer than the specified maximum ... will
    # result in indexing errors" when jump-forward tokenized a long constant; nothing indexes it
    import logging

    from transformers import AutoTokenizer

    fresh = AutoTokenizer.from_pretrained(str(tiny_llama), model_max_length=16)  # (it warns once per tokenizer)
    constant = "header " * 40
    grammar = compile_grammar(re.escape(constant), TokenVocabulary(fresh, {fresh.eos_token_id}))
    records: list = []
    handler = logging.Handler()
    handler.emit = records.append  # (transformers' own handler writes to the stderr it found at import)
    log = logging.getLogger("transformers.tokenization_utils_base")
    log.addHandler(handler)
    try:
        draft = GrammarMatcher(grammar).propose_draft([], max_tokens=200)
    finally:
        log.removeHandler(handler)
    spelled = b"".join(grammar.vocab.token_bytes[t] for t in draft)
    assert len(draft) > 16 and constant.encode().startswith(spelled)
    assert not [r for r in records if "longer than the specified maximum" in r.getMessage()]


def test_certain_tokens_need_no_model_and_a_terminal_match_ends(backend):
    """'~' has no multi-byte token in the tiny vocabulary, so every position of '~~~~' allows one
    token: the whole draft is certain and the output is complete without a forward pass."""
    vocab = backend.vocab
    assert [b for b in vocab.token_bytes if b and set(b) == {ord("~")}] == [b"~"]
    grammar = backend.compile(regex="~~~~")
    matcher = GrammarMatcher(grammar)
    draft = matcher.propose_draft([], max_tokens=10)
    assert vocab.text_of(draft) == b"~~~~"
    assert matcher.accept_certain(draft) == 4
    assert matcher.is_terminated() and not matcher.finished


def test_draft_verification_keeps_tokens_until_the_first_difference(backend):
    grammar = backend.compile(regex=r"a(bc|dc)[0-9]")
    matcher = GrammarMatcher(grammar)
    a, b, c, d = (int(grammar.vocab.byte_token[ord(x)]) for x in "abcd")
    draft = [a, b]
    assert len(matcher.draft_bitmasks(draft)) == 3
    kept, nxt = matcher.accept_draft(draft, [a, d, c])  # the model disagrees at the second position
    assert (kept, nxt) == (1, d) and matcher.num_tokens == 2  # "a" from the draft, then the model's "d"
    assert matcher.forced_bytes() == b"c"
    with pytest.raises(GrammarError):
        matcher.accept_token(d)  # "add" cannot become a match
    matcher.rollback(1)
    matcher.accept_token(b)
    assert matcher.forced_bytes() == b"c" and matcher.num_tokens == 2


# --- cache ---------------------------------------------------------------------------------


def test_cache_shares_one_compiled_grammar_built_off_the_calling_thread(tokenizer, monkeypatch):
    threads = []
    real = cache_module.compile_grammar

    def spy(regex, vocab, **limits):
        threads.append(threading.current_thread().name)
        return real(regex, vocab, **limits)

    monkeypatch.setattr(cache_module, "compile_grammar", spy)
    cache = GrammarCache()
    a = GrammarBackend(tokenizer, cache=cache)
    b = GrammarBackend(tokenizer, cache=cache)  # a second engine over the same tokenizer
    try:
        g1 = a.compile(json_schema={"type": "object", "properties": {"k": {"enum": ["u", "v"]}}})
        g2 = b.compile(json_schema={"type": "object", "properties": {"k": {"enum": ["u", "v"]}}})
        assert g1 is g2 and cache.hits == 1 and cache.misses == 1
        assert threads == ["lmnb-grammar_0"] and threads[0] != threading.current_thread().name
    finally:
        a.shutdown()
        b.shutdown()


def test_a_compile_that_outlasts_its_wait_fails_the_request_and_holds_up_no_other_pattern(tokenizer, monkeypatch):
    # Deterministic: the slow compiles block on `release` and say when they have started, so no
    # wait here races a worker's start; the waits that must time out are short, and the one that
    # must not wait at all is caught by a spy on the compile's future, not by a clock.
    release = threading.Event()
    started = {"a+": threading.Event(), "a+|x": threading.Event()}
    real = cache_module.compile_grammar

    def slow_for_a(regex, vocab, **limits):  # stands in for a compile that outlasts a request's wait
        if regex in started:
            started[regex].set()
            release.wait(60)
        return real(regex, vocab, **limits)

    monkeypatch.setattr(cache_module, "compile_grammar", slow_for_a)
    # (submitted with a long limit: each compile is killed past the limit it started with, and the
    # real compile after the release must not be)
    backend = GrammarBackend(tokenizer, max_workers=2, cache=GrammarCache(), compile_timeout_s=600.0)
    try:
        slow = backend.submit("a+")
        assert started["a+"].wait(60)  # running: the wait below times out on it, it was not queued
        backend.compile_timeout_s = 0.1
        with pytest.raises(GrammarError, match=r'compiling the constraint "a\+" took longer than 0\.1 s'):
            backend.wait("a+")
        backend.compile_timeout_s = 600.0
        assert backend.wait("b+").regex == "b+"  # the other worker serves other patterns meanwhile
        backend.submit("a+|x")
        assert started["a+|x"].wait(60)  # now both workers are busy with slow patterns
        backend.compile_timeout_s = 0.1
        with pytest.raises(GrammarError, match="compiler is busy: its 2 workers .* this one did not start"):
            backend.wait("c+")  # queued behind them: not blamed for being slow, and cancelled
        assert backend.submit("c+") is not None and backend.cache.misses == 5  # c+ was not left cached
        backend.compile_timeout_s = 600.0
        waited = []
        real_result = slow.result

        def result_spy(timeout=None):  # a wait on the slow compile: let it end, so such a wait returns
            waited.append(timeout)
            release.set()
            return real_result(timeout)

        monkeypatch.setattr(slow, "result", result_spy)
        with pytest.raises(GrammarError, match="took longer than 600 s"):
            backend.wait("a+")  # still compiling: fails at once instead of holding this request too
        assert waited == [] and not release.is_set()
        release.set()
        slow.result(timeout=60)
        assert backend.wait("a+").regex == "a+"  # finished in the background, cached, served
    finally:
        release.set()
        backend.shutdown()


def _arrays_in_arrays(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_schema_whose_regex_doubles_at_each_level_is_refused_before_the_regex_is_built(backend):
    """outlines-core writes an array's items twice (the first and the repeat), so arrays nested d
    deep hold 2**(d + 1) - 1 subschema copies (c(d) = 1 + 2 c(d - 1), c(0) = 1): 20 levels built a
    50 MB regex, 50 levels were killed for their memory while the regex string was built, before
    any compile limit could act (in a server, by one request). Refused, naming the count; a
    dict and a JSON string alike (as a server gets it)."""
    sizes = [len(backend.to_regex(json_schema=_arrays_in_arrays(d))) for d in range(1, 8)]
    # the doubling counted: each level's regex is twice the last one's and a fixed frame
    assert len({b - 2 * a for a, b in zip(sizes, sizes[1:])}) == 1, sizes
    for depth in (20, 50):
        for schema in (_arrays_in_arrays(depth), json.dumps(_arrays_in_arrays(depth))):
            with pytest.raises(GrammarError) as e:
                backend.to_regex(json_schema=schema)
            assert str(e.value).startswith(f"JSON schema is too large to compile: its regex would write its "
                                           f"subschemas about {2 ** (depth + 1) - 1} times, above the limit of "
                                           f"{2 ** 18} (an array writes its items twice")
    assert backend.to_regex(json_schema=_arrays_in_arrays(17))  # 2**18 - 1 copies: at the limit, built
    # definitions that each refer to the next twice: 30 deep, inlining them wrote 2**31 - 1 copies out
    # (18 deep took 1 GB); c(D_i) = 1 + 2 c(D_i+1) as for the arrays, counted before inlining
    defs = {f"D{i}": {"type": "object", "properties": {k: {"$ref": f"#/$defs/D{i + 1}"} for k in "ab"},
                      "required": ["a", "b"]} for i in range(30)}
    with pytest.raises(GrammarError, match=rf"^JSON schema is too large to compile: .* about {2 ** 31 - 1} times"):
        backend.to_regex(json_schema={"$ref": "#/$defs/D0", "$defs": {**defs, "D30": {"type": "integer"}}})
    # an object of 300 optional properties (about 300 * 301 / 2 copies, 2 MB of regex) is no nesting: built
    assert backend.to_regex(json_schema={"type": "object", "properties": {f"p{i}": {"type": "integer"}
                                                                          for i in range(300)}})


def _shared_levels(depth: int) -> dict:
    """Arrays nested ``depth`` deep whose ``items`` and only ``prefixItems`` entry are one object:
    2**depth paths to the innermost schema, from depth + 1 objects."""
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, "prefixItems": [schema]}
    return schema


def _refusal_within(call, seconds: float = 60) -> str:
    """The message of the ValueError ``call`` raises, on a thread given ``seconds`` (a walk that
    visits each path of a shared-object schema ran for hours: a failure, not a hang)."""
    out: list = []

    def run():
        try:
            call()
            out.append("no error")
        except ValueError as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"not refused within {seconds} s"
    assert isinstance(out[0], ValueError), out[0]
    return str(out[0])


def test_a_schema_sharing_one_object_at_each_level_is_refused_at_once_as_its_json_text_is(backend):
    """A schema built in Python may hold one object at two places per level: 30 levels have 2**30
    paths, each checked once (json.dumps, the meta-schema check, numpy's conversion) for hours on
    the caller's thread. Its copies are counted per object, so it is refused at once, with its
    JSON text's words. Copies (outlines-core writes items twice, each prefixItems entry once):
    c(d) = 1 + 3 c(d - 1), c(0) = 1, so c(d) = (3**(d + 1) - 1) / 2. gen(), which runs on any
    backend, leaves that limit to the engine and counts the JSON text's values alone (the object,
    "array", the list and twice the level below): v(d) = 3 + 2 v(d - 1), v(0) = 2, so
    v(d) = 5 * 2**d - 3, from 3 d + 2 distinct ones (each level's object, "array" and list, and
    the innermost object and "string"): 12 levels (20,477) are sent, 30 refused at once."""
    from lmnb.ir import json_schema_value
    from lmnb_engine.json_schema import loaded_schema
    from lmnb_engine.params import SamplingParams

    shared = _shared_levels(12)
    assert json_schema_value(shared) is shared
    assert _refusal_within(lambda: json_schema_value(_shared_levels(30))).startswith(
        f"JSON schema is too large: written out as JSON it would hold {5 * 2 ** 30 - 3} values, above the limit of "
        f"{10 ** 6}, from {3 * 30 + 2} distinct ones: it holds one dict or list at several places")
    for depth in (12, 30):
        schema = _shared_levels(depth)
        words = (f"JSON schema is too large to compile: its regex would write its subschemas about "
                 f"{(3 ** (depth + 1) - 1) // 2} times, above the limit of {2 ** 18} (an array writes")
        calls = [lambda: backend.to_regex(json_schema=schema), lambda: loaded_schema(schema)]
        messages = {_refusal_within(call) for call in calls}
        if depth == 12:  # its JSON text (4096 paths, 160 kB) shares nothing: the same words
            text = json.dumps(schema)
            messages |= {_refusal_within(lambda: backend.to_regex(json_schema=text)),
                         _refusal_within(lambda: loaded_schema(text))}
        assert len(messages) == 1 and messages.pop().startswith(words)
        params = SamplingParams(json_schema=schema)  # (the engine refuses it at submission: to_regex above)
        assert _refusal_within(lambda: (params.validate(), backend.to_regex(json_schema=params.json_schema))).startswith(words)


def test_a_schema_sharing_one_object_under_keywords_the_regex_does_not_write_is_refused_by_its_json_size(backend):
    """One object held under both "not" and "if" at each of 20 levels: the regex copies count
    neither keyword (1 copy), but the JSON text writes 2**20 copies and json.dumps ran for hours.
    Its values, counted once per object: v(0) = 2 (the object and "string"), v(d) = 1 + 2 v(d - 1),
    so v(d) = 3 * 2**d - 1, from d + 1 objects and one string. An enum of 10**6 + 1 numbers is
    refused too, as no sharing; an object of 300 properties (about 600 values) passes."""
    from lmnb.ir import json_schema_value
    from lmnb_engine.json_schema import loaded_schema

    schema = {"type": "string"}
    for _ in range(20):
        schema = {"not": schema, "if": schema}
    words = (f"JSON schema is too large: written out as JSON it would hold {3 * 2 ** 20 - 1} values, above the "
             f"limit of {10 ** 6}, from 22 distinct ones: it holds one dict or list at several places, written "
             "out in full at each (one shared at each level of its nesting doubles the text per level); nest "
             'less deeply, or name the shared subschema once under "$defs" and write {"$ref": "#/$defs/<name>"} '
             "at each place")
    calls = [lambda: backend.to_regex(json_schema=schema), lambda: loaded_schema(schema),
             lambda: json_schema_value(schema)]
    assert [_refusal_within(call) for call in calls] == [words] * 3
    # shares nothing: the object, the list and its 10**6 + 1 numbers
    assert _refusal_within(lambda: loaded_schema({"enum": list(range(10 ** 6 + 1))})) == (
        f"JSON schema is too large: written out as JSON it would hold {10 ** 6 + 3} values, above the limit of "
        f"{10 ** 6}; make it smaller (fewer properties, shorter enums)")
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}}
    assert loaded_schema(wide) == wide and json_schema_value(wide) is wide


def _refers_back(places: int, other: str = "") -> dict:
    """An object of ``places`` required properties, each null or (``$ref``) the object named by
    ``other`` (the root where empty)."""
    ref = {"$ref": f"#/$defs/{other}" if other else "#"}
    return {"type": "object", "properties": {f"p{i}": {"anyOf": [{"type": "null"}, ref]} for i in range(places)},
            "required": [f"p{i}" for i in range(places)]}


def test_a_recursion_that_refers_back_from_many_places_is_refused_before_it_is_written_out(backend):
    """The count before inlining follows a recursion one level; inlining writes it MAX_REF_DEPTH
    levels deep, k**4 copies of an object that refers back from k places at its fifth level: 40
    places (2 kB of JSON) were written out for minutes, gigabytes, before the count after inlining
    could refuse them, and so were two objects that refer to each other from 4 places each (10
    levels). Nodes written for k places, the root open j times: N(5) = 1 + 2 k (each property's
    anyOf and its null; the reference, open 5 times, is dropped), N(j) = 1 + k (2 + N(j + 1)):
    N(1) = 212,676,921 for k = 40, above 2**18; refused once 2**18 are written."""
    words = (f"JSON schema is too large to compile: written out with its $refs inlined, each recursion {MAX_REF_DEPTH} "
             f"levels deep, it holds more than {2 ** 18} subschemas, above the limit of {2 ** 18} on its regex's "
             "subschema copies (each level of a recursion multiplies its subschemas by the number of places that "
             "refer back); refer back from fewer places")

    def written(k: int, j: int = 1) -> int:
        return 1 + 2 * k if j == MAX_REF_DEPTH else 1 + k * (2 + written(k, j + 1))

    assert written(40) == 212676921 > 2 ** 18
    mutual = {"$defs": {"A": _refers_back(4, "B"), "B": _refers_back(4, "A")}, "$ref": "#/$defs/A"}
    for schema in (_refers_back(40), mutual):
        assert _refusal_within(lambda: backend.to_regex(json_schema=schema)) == words
    # refers back from 4 places: 4**4 objects at the fifth level, 1 + 4 (2 + ...) = 3,069 written: built
    assert written(4) == 3069 and backend.to_regex(json_schema=_refers_back(4))


def test_json_chars_counts_what_json_dumps_writes_walking_a_shared_value_once():
    from lmnb_engine.schema_copies import json_chars

    shared = {"enum": ["中", "a\nb", 1.5, 1e100, -3, True, None, [], {}], "t": ("x", "y")}
    for value in ({"a": shared, "b": [shared, shared, "é" * 40]}, [], {}, "", 0, ["\u2028", {"k": {"": [[]]}}]):
        assert json_chars(value) == len(json.dumps(value))


def _refers_twice(depth: int, leaf: dict) -> dict:
    """Definitions D0 .. D{depth - 1} that each refer to the next twice, D{depth} ``leaf``."""
    defs = {f"D{i}": {"type": "object", "properties": {k: {"$ref": f"#/$defs/D{i + 1}"} for k in "ab"},
                      "required": ["a", "b"]} for i in range(depth)}
    return {"$ref": "#/$defs/D0", "$defs": {**defs, f"D{depth}": leaf}}


def test_a_long_value_the_regex_writes_at_many_copies_is_refused_before_the_regex_is_built(backend):
    """The copy count weighs each subschema as one: an enum of 100,000 integers (600 kB of JSON)
    at the end of 8 levels of definitions that each refer to the next twice (256 copies of it,
    511 subschemas in all) was built into a 150 MB regex for 25 s on the submitting thread, 12
    levels ran out of memory; a const of 300,000 characters inside arrays nested 6 deep (64
    copies) too. Each copy now weighs its own JSON text (its keywords but the subschemas counted
    as copies of their own, with its property names): sum of 2**i copies of D_i's text
    ({"type": "object", "required": ["a", "b"]} and "a", "b") and 2**8 of the enum's; sum of 2**j
    copies of {"type": "array"} and 2**6 of the const's."""
    enum = {"enum": list(range(10 ** 5))}
    own = len(json.dumps({"type": "object", "required": ["a", "b"]})) + len('"a""b"')
    const = {"const": "x" * 300_000}
    arrays = const
    for _ in range(6):
        arrays = {"type": "array", "items": arrays}
    for schema, chars in ((_refers_twice(8, enum), sum(2 ** i * own for i in range(8)) + 2 ** 8 * len(json.dumps(enum))),
                          (arrays, sum(2 ** j * len('{"type": "array"}') for j in range(6)) + 2 ** 6 * len(json.dumps(const)))):
        assert _refusal_within(lambda: backend.to_regex(json_schema=schema)) == (
            f"JSON schema is too large to compile: its regex would write about {chars} characters of its subschemas' "
            f"text, above the limit of {2 ** 24} (each subschema is written once per copy: once per $ref to it, twice "
            "as an array's items, so a long enum, const or pattern nested in arrays or definitions that refer to "
            "others is written many times); shorten the long values, or write them at fewer places")
    # 4 levels: 16 copies of the enum, some 11 MB of text, below 2**24: built (a 9 MB regex)
    assert backend.to_regex(json_schema=_refers_twice(4, enum))


@pytest.mark.parametrize("schema, key, where", [
    ({"type": "string", "maxLength": 1001}, "maxLength=1001", "#"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}, "minItems": 5000}}},
     "minItems=5000", "#/properties/a"),
])
def test_schema_counts_above_the_repeat_limit_are_refused_by_name(backend, schema, key, where):
    with pytest.raises(GrammarError, match=f"JSON schema {key} at {where} is above the limit of 1000"):
        backend.to_regex(json_schema=schema)
    assert "{0,1000}" in backend.to_regex(json_schema={"type": "string", "maxLength": 1000})  # at the limit
    # an integral float is the same count (JSON Schema's integers include 5.0); outlines-core dropped it
    assert backend.to_regex(json_schema={"type": "string", "maxLength": 5.0}) == backend.to_regex(
        json_schema={"type": "string", "maxLength": 5})
    with pytest.raises(GrammarError, match="maxLength=5000 at # is above the limit"):
        backend.to_regex(json_schema={"type": "string", "maxLength": 5000.0})


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _compile_children() -> list[int]:
    """Pids of this process's children that run ``index_process.py`` (Linux /proc)."""
    import os

    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and b"index_process.py" in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue  # the process ended while being read
    return pids


def _record_builds(monkeypatch) -> list[tuple[float | None, str | None]]:
    """The compile children's builds, as (their time limit in seconds, the ``IndexBuildError``
    reason they ended with, or None for an index), filled in as each build ends."""
    from lmnb_engine.constrained import grammar, index_process

    builds = []

    def build_index(regex, vocabulary, timeout_s, *args):
        try:
            index = index_process.build_index(regex, vocabulary, timeout_s, *args)
        except index_process.IndexBuildError as e:
            builds.append((timeout_s, e.reason))
            raise
        builds.append((timeout_s, None))
        return index

    monkeypatch.setattr(grammar, "build_index", build_index)
    return builds


def test_an_exploding_automaton_is_killed_at_the_time_limit_and_asking_again_compiles_again(tokenizer, monkeypatch):
    # [a-z]*a[a-z]{N}: the DFA remembers which of the last N+1 letters were an "a" (2**N states, the
    # textbook blowup); at 40 it would run for days. The same bound without the [a-z]* is instant.
    builds = _record_builds(monkeypatch)
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=2.0)
    try:
        slow = r'compiling the constraint "\[a-z\]\*a\[a-z\]\{40\}" took longer than 2 s'
        with pytest.raises(GrammarCompileStopped, match=slow):
            backend.wait("[a-z]*a[a-z]{40}")
        # the compile itself ended, killed at its 2 s limit ("timeout": the child outlived it), rather
        # than running on in the background
        first = backend.submit("[a-z]*a[a-z]{40}")
        assert isinstance(first.exception(timeout=60), GrammarCompileStopped) and _compile_children() == []
        assert builds == [(2.0, "timeout")]
        again = backend.submit("[a-z]*a[a-z]{40}")  # a stopped compile is not cached: it compiles again
        assert again is not first and backend.cache.misses == 2
        assert isinstance(again.exception(timeout=60), GrammarCompileStopped)
        assert builds == [(2.0, "timeout")] * 2
        backend.compile_timeout_s = 30.0  # (a compile that must succeed: not held to 2 s on a loaded machine)
        grammar = backend.wait("[a-z]{40}")
        assert not grammar.is_final(grammar.initial_state)
    finally:
        backend.shutdown()


def test_shutdown_kills_a_running_compile_and_its_request_is_told(tokenizer):
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=120.0)
    fut = backend.submit("[a-z]*a[a-z]{40}")
    deadline = time.monotonic() + 20
    while not _compile_children():  # the child has started
        assert time.monotonic() < deadline
        time.sleep(0.05)
    backend.shutdown()  # it waited out the compile (up to its 120 s limit) before: "took longer than 120 s"
    assert isinstance(fut.exception(timeout=1), GrammarCompileStopped)
    assert "was stopped: the engine shut down" in str(fut.exception()) and _compile_children() == []


def test_shutdown_refuses_a_compile_that_is_about_to_start_and_spares_another_engines_requests(tokenizer):
    cache = GrammarCache()
    a = GrammarBackend(tokenizer, cache=cache, compile_timeout_s=120.0, max_workers=1)
    b = GrammarBackend(tokenizer, cache=cache, compile_timeout_s=120.0)
    try:
        slow = a.submit("[a-z]*a[a-z]{40}")
        queued = a.submit("[0-9]{5}")  # behind it on a's only worker
        served, waiting = {}, threading.Event()
        real_submit = b.submit

        class Watched:  # b's future: says when b's wait reads it (where a sleep of 0.5 s made that likely)
            def __init__(self, fut):
                self._fut = fut

            def __getattr__(self, name):  # (done(), result(), or the state concurrent.futures.wait reads)
                waiting.set()
                return getattr(self._fut, name)

        b.submit = lambda regex: Watched(real_submit(regex))
        waiter = threading.Thread(target=lambda: served.update(g=b.wait("[0-9]{5}")))
        waiter.start()
        assert waiting.wait(30)  # b waits on the compile that a's shutdown cancels
        a.shutdown()  # right after submit: before, a child could start after the kill and be waited out
        assert slow.done() and queued.cancelled()
        # (a compile waited out would end at its 120 s limit: "took longer than 120 s")
        assert "was stopped: the engine shut down" in str(slow.exception())
        waiter.join(30)
        assert served["g"].regex == "[0-9]{5}"  # b compiled it itself instead of failing with a's shutdown
        fresh = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=120.0)
        late = fresh.submit("[a-z]*a[a-z]{40}")
        fresh.shutdown()  # at once after submit
        assert late.cancelled() or "was stopped: the engine shut down" in str(late.exception())
        assert _compile_children() == []
    finally:
        a.shutdown()
        b.shutdown()


def test_shutdown_with_many_requests_waiting_on_queued_compiles_returns_and_tells_each_of_them(tokenizer):
    # The cancels of shutdown ran done-callbacks that took the cache lock while a woken request,
    # holding that lock, submitted to the executor being shut down: a deadlock (from 5 waiters on).
    a = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=120.0, max_workers=1)
    a.submit("[a-z]*a[a-z]{40}")  # keeps the only worker busy
    errors = []

    def ask(i):
        try:
            a.wait(f"[0-9]{{{i + 1}}}x")
        except GrammarCompileStopped as e:
            errors.append(str(e))

    waiters = [threading.Thread(target=ask, args=(i,)) for i in range(30)]
    for t in waiters:
        t.start()
    time.sleep(1.0)
    shut = threading.Thread(target=a.shutdown)
    shut.start()
    shut.join(20)
    assert not shut.is_alive(), "shutdown deadlocked"
    for t in waiters:
        t.join(20)
    assert len(errors) == 30 and all("the engine shut down" in e for e in errors)
    with pytest.raises(GrammarCompileStopped, match="was not compiled: the engine shut down"):
        a.wait("[a-z]{2}")  # after shutdown: a clear error, not "cannot schedule new futures"


def test_a_compile_child_dies_with_its_parent(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time, threading\n"
        "from outlines_core import Vocabulary\n"
        "from lmnb_engine.constrained.index_process import build_index, _ALL\n"
        "v = Vocabulary(3, {b'a': [0], b'b': [1], b'c': [2]})\n"
        "threading.Thread(target=build_index, args=('a[a-c]{40}', v, 300), daemon=True).start()\n"
        "while not _ALL.procs: time.sleep(0.05)\n"
        "print(next(iter(_ALL.procs)).pid, flush=True)\n"
        "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no atexit, no cleanup: only the child's own guard can act
    parent.wait(10)
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, "the orphaned compile kept running"
        time.sleep(0.1)


# The test's own process, as a subreaper (as systemd --user is for a desktop session's programs):
# it starts argv[1], reads the pid of the compile child that one prints, kills it and reaps it,
# prints the child's pid and waits to be killed. The orphaned child then belongs to this process.
_SUBREAPER = """
import ctypes, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
parent = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE, text=True)
child = parent.stdout.readline()
os.kill(parent.pid, signal.SIGKILL)
parent.wait()
print(child, end="", flush=True)
time.sleep(300)
"""


def test_a_compile_child_whose_parent_died_before_it_started_under_a_subreaper_does_not_build(tmp_path):
    """The child took a parent id of 1 for an orphan, the one case its parent-death signal, armed
    as it starts, comes too late for; under a subreaper (systemd --user, ``tini -s``) an orphan's
    parent is the subreaper, and such a child built on, up to its CPU limit of the compile's time
    limit plus 10 s. The child is started here only once its parent is gone (a shell waits for
    that, then runs it), with the request already in its pipe."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, subprocess, threading, time\n"
        "from outlines_core import Vocabulary\n"
        "from lmnb_engine.constrained import index_process\n"
        "real = subprocess.Popen\n"
        "def started_once_this_process_is_gone(argv, **kwargs):\n"
        "    wait = 'while kill -0 \"$0\" 2>/dev/null; do sleep 0.01; done; exec \"$@\"'\n"
        "    return real(['sh', '-c', wait, str(os.getpid()), *argv], **kwargs)\n"
        "index_process.subprocess.Popen = started_once_this_process_is_gone\n"
        "v = Vocabulary(3, {b'a': [0], b'b': [1], b'c': [2]})\n"
        "threading.Thread(target=index_process.build_index, args=('a[a-c]{40}', v, 300), daemon=True).start()\n"
        "while not index_process._ALL.procs: time.sleep(0.01)\n"
        "proc = next(iter(index_process._ALL.procs))\n"
        "while not proc.stdin.closed: time.sleep(0.01)  # (the request is written: it waits in the pipe)\n"
        "print(proc.pid, flush=True)\n"
        "time.sleep(300)\n")
    reaper = subprocess.Popen([sys.executable, "-c", _SUBREAPER, str(script)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(reaper.stdout.readline())
        deadline = time.monotonic() + 30
        while _running(child):
            assert time.monotonic() < deadline, "the orphaned compile kept running under the subreaper"
            time.sleep(0.1)
    finally:
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)
        reaper.kill()
        reaper.wait(10)


def test_without_a_usable_interpreter_the_index_is_built_here_and_a_crash_is_not_cached(tokenizer, monkeypatch):
    import sys

    backend = GrammarBackend(tokenizer, cache=GrammarCache())
    try:
        monkeypatch.setattr(sys, "executable", "/no/such/python")
        with pytest.warns(RuntimeWarning, match="building in this process, without the time and memory limits"):
            assert backend.wait("[0-9]{3}").regex == "[0-9]{3}"
        monkeypatch.setattr(sys, "executable", "/bin/false")  # starts, but is no Python
        with pytest.raises(GrammarCompileStopped, match=r'stopped while compiling "\[a-z\]\+" \(exit status 1\)'):
            backend.wait("[a-z]+")
        monkeypatch.undo()
        assert backend.wait("[a-z]+").regex == "[a-z]+"  # compiled anew, not the cached crash
    finally:
        backend.shutdown()


def test_an_exploding_automaton_stops_at_the_memory_limit(tokenizer):
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_memory_bytes=320 << 20)
    try:
        with pytest.raises(GrammarCompileStopped, match=r'"\[a-z\]\*a\[a-z\]\{40\}" ran out of memory \(limit 320.0 MiB\)'):
            backend.wait("[a-z]*a[a-z]{40}")
        assert backend.wait("[a-z]{3}").regex == "[a-z]{3}"  # the limit leaves room for real patterns
    finally:
        backend.shutdown()


@pytest.mark.parametrize("pattern, inside, done", [('"[^"]*"', '"ab', '"ab"'), ("[^a]*", "", "bc"), (".+", "", "xy")])
def test_a_pattern_that_may_hold_any_character_is_complete_only_where_it_matches(backend, pattern, inside, done):
    # the end marker's token can be read as text where the pattern takes any character: that path
    # must not make a state accepting (EOS in the middle of a JSON string)
    grammar = backend.compile(regex=pattern)
    eos = min(grammar.vocab.eos_token_ids)

    def state_after(text):
        state = grammar.initial_state
        for t in backend.vocab.encode(text) if text else []:
            state = grammar.next_state(state, t)
        return state

    for text in (inside, done):
        accepting = re.fullmatch(pattern, text) is not None
        state = state_after(text)
        assert grammar.is_final(state) == accepting and (eos in grammar.allowed_ids(state)) == accepting, text
        assert grammar.allowed_ids(state).max() < grammar.vocab.vocab_size


@pytest.mark.parametrize("pattern, text", [
    (".*", "\U0010fffdx"),  # (U+10FFFE and U+10FFFF, the markers' characters, are left out)
    ("x(\U0010ffbf\U0010ffbf)?", "x\U0010ffbf\U0010ffbf"),  # eight bytes, all pieces of the markers'
    ("(\U0010fffd)*", "\U0010fffd\U0010fffd"),
    ('[^"]*x?', "\U0010fffdx"),
])
def test_the_mask_and_the_next_state_agree_on_the_markers_bytes(backend, pattern, text):
    # the mask let <BF> through after F4 8F BF where next_state refused it: the request aborted
    grammar = backend.compile(regex=pattern)
    vocab = grammar.vocab
    pieces = [int(vocab.byte_token[b]) for b in b"\xf4\x8f\xbf\xbe"] + [int(vocab.byte_token[ord("x")])]
    seen, todo = {grammar.initial_state}, [(grammar.initial_state, b"")]
    while todo:  # every state the markers' bytes and 'x' reach, up to 8 bytes
        state, spelled = todo.pop()
        allowed = set(grammar.allowed_ids(state).tolist())
        for t in pieces:
            nxt = grammar.next_state(state, t)
            assert (nxt is not None) == (t in allowed), (spelled, t)
            if nxt is not None and len(spelled) < 8 and nxt not in seen:
                seen.add(nxt)
                todo.append((nxt, spelled + vocab.token_bytes[t]))
    def accepts(text):
        state = grammar.initial_state
        for b in text.encode():
            state = None if state is None else grammar.next_state(state, int(vocab.byte_token[b]))
        return state is not None and grammar.is_final(state)

    assert accepts(text) and not accepts("\U0010fffe") and not accepts(text + "\U0010ffff")


@pytest.mark.parametrize("pattern", [".{0,40}", "Name: .{1,100}", "[^\n]{1,60}", "\\S{0,40}", "[\\s\\S]{0,40}",
                                     "\\p{L}.{0,40}"])  # (Python cannot read it: built bare, as before)
def test_a_long_repeat_of_any_character_compiles_within_the_engines_limit(tokenizer, pattern):
    # the start marker is a character '.' matches: each one in the text began another match in the
    # DFA's unanchored half (4 s at .{0,16}, past 20 s at 18); user classes now leave it out
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=30.0)
    try:
        assert backend.compile(regex=pattern).regex == automaton_syntax(pattern)
    finally:
        backend.shutdown()


def test_a_long_json_string_compiles_within_the_engines_limit(tokenizer):
    # pydantic's Field(max_length=...): the automaton's unanchored half doubled with each character
    # ('"' begins the string and recurs inside it as '\\"'); maxLength 20 ran past the 60 s limit
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=30.0)
    try:
        grammar = backend.compile(json_schema={"type": "string", "maxLength": 1000})
        for text, accepted in (('"' + "x" * 1000 + '"', True), ('"' + "x" * 1001 + '"', False)):
            state = grammar.initial_state
            for t in backend.vocab.encode(text):
                state = None if state is None else grammar.next_state(state, t)
            assert (state is not None and grammar.is_final(state)) == accepted
    finally:
        backend.shutdown()


@pytest.mark.parametrize("pattern, count", [("a{1001}", "1001"), ("(ab{100}){11}", "1100"), ("x|y{5,2000}", "2000"),
                                            ("a{5000000000}", "more than 4,294,967,294")])
def test_repeat_counts_above_re2s_limit_are_refused_before_compiling(backend, pattern, count):
    with pytest.raises(GrammarError, match=f"repeats a part {count} times .*above the limit of 1000"):
        backend.to_regex(regex=pattern)
    backend.to_regex(regex="(ab{100}){10}")  # 1000: at the limit
    backend.to_regex(regex="[a-z]{3,}")  # an unbounded repeat counts its minimum


def nested_repeats(depth: int) -> str:
    """``depth`` parentheses, each a group, an alternation, a concatenation and a repeat to the
    automaton library (4 of its 250 nesting levels)."""
    pattern = "a"
    for _ in range(depth):
        pattern = f"(?:b|a{pattern}c)*"
    return pattern


@pytest.mark.parametrize("pattern", ["(" * 150 + "a" + ")" * 150, "(?:" * 1000 + "a" + ")" * 1000,
                                     nested_repeats(61), "(?:b|" * 61 + "a" + ")" * 61])
def test_parentheses_nested_above_the_limit_are_refused_by_name(backend, pattern):
    # 150 groups: a RecursionError from the repeat-count walk; (?: ... ) and alternatives of
    # alternatives (which Python's parser folds away): the library's bare "error building NFA"
    with pytest.raises(GrammarError, match=r"nests parentheses (150|1000|61) levels deep, above the limit of 60"):
        backend.to_regex(regex=pattern)
    if len(pattern) < 3000:  # (1000 levels: the meta-schema check refuses it first, see below)
        with pytest.raises(GrammarError, match=r"^JSON schema at #/pattern: the pattern .* nests parentheses (150|61) levels deep"):
            backend.to_regex(json_schema={"type": "string", "pattern": pattern})


def test_parentheses_nested_to_the_limit_compile_and_match_what_python_matches(backend):
    pattern = nested_repeats(60)
    grammar = backend.compile(regex=pattern)
    for text, accepted in (("", True), ("ac", True), ("abc", True), ("bacb", True), ("aac", False), ("ab", False)):
        state = grammar.initial_state
        for t in backend.vocab.encode(text):
            state = None if state is None else grammar.next_state(state, t)
        assert (state is not None and grammar.is_final(state)) == accepted == bool(re.fullmatch(pattern, text)), text


def test_a_schema_nesting_deeper_than_the_library_builds_says_so(backend):
    deep = {"type": "string", "pattern": "^" + nested_repeats(60) + "$"}  # within the limit as a regex, not in JSON
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"anyOf": [deep, {"type": "integer"}]}}}}
    with pytest.raises(GrammarError, match=r"nests parentheses \d+ levels deep, deeper than the automaton library builds"):
        backend.compile(json_schema=schema)
    with pytest.raises(GrammarError, match="JSON schema nests too deeply to check"):  # re.compile in jsonschema recursed
        backend.to_regex(json_schema={"type": "string", "pattern": "(" * 1000 + "a" + ")" * 1000})


def accepts(grammar, vocab, text: str) -> bool:
    state = grammar.initial_state
    for t in vocab.encode(text):
        state = None if state is None else grammar.next_state(state, t)
    return state is not None and grammar.is_final(state)


@pytest.mark.parametrize("pattern, inside, outside", [
    ("[^\\ud800a]", ["b", "\ud7ff", "\ue000", "😀"], ["a"]),  # each failed with "error building NFA"
    ("[a-\\udfff]", ["a", "é", "\ud7ff"], ["\ue000", "😀"]),
    ("[\\udfff-\\ue001]", ["\ue000", "\ue001"], ["\ud7ff", "\ue002"]),
    ("[\\ud800b]x", ["bx"], ["x", "ax"]),
    ("[^\\ud800-\\udfffb]", ["a", "\ud7ff", "\ue000"], ["b"]),
    # a negated range ending in a surrogate failed with "error building NFA"
    ("[^a-\\udfff]", ["\x00", "`", "\ue000", "😀"], ["a", "é", "\ud7ff"]),
    ("[^\\ud900-\\U0010FFFF]", ["a", "\ud7ff"], ["\ue000", "😀"]),
])
def test_surrogates_in_a_regex_class_are_left_out(backend, pattern, inside, outside):
    grammar = backend.compile(regex=pattern)
    for text in inside:
        assert accepts(grammar, backend.vocab, text) and re.fullmatch(pattern, text), text
    for text in outside:
        assert not accepts(grammar, backend.vocab, text) and not re.fullmatch(pattern, text), text


@pytest.mark.parametrize("pattern", ["\\ud800", "a\udc00", "x|\\udbff"])
def test_a_surrogate_outside_a_class_is_refused_by_name(backend, pattern):
    # '\\U0000d800' (the rewritten pattern) "cannot be compiled to a token index: ... error building
    # NFA"; a literal one: "'utf-8' codec can't encode character"
    with pytest.raises(GrammarError, match=r"has the surrogate U\+D(800|C00|BFF) outside a class, which no UTF-8 text holds"):
        backend.to_regex(regex=pattern)


@pytest.mark.parametrize("pattern, cls, at", [
    ("[^\\s\\S]", "[^\\s\\S]", 0), ("x[^\\w\\W]|y", "[^\\w\\W]", 1), ("(a[^\\d\\D])?b", "[^\\d\\D]", 2),
    ("a[^\\x00-\\U0010FFFF]", "[^\\x00-\\U0010FFFF]", 1),
    # only surrogates, which no text holds: generation wrote 'a\ue000'
    ("a[^\\x00-\\ud7ff\\ue000-\\U0010FFFF]", "[^\\x00-\\ud7ff\\ue000-\\U0010FFFF]", 1),
    ("[^\\x00-\\ud7ffb\\ue000-\\U0010FFFFa]", "[^\\x00-\\ud7ffb\\ue000-\\U0010FFFFa]", 0),
    ("[\\ud800]", "[\\ud800]", 0), ("x[\\U0010fffe]", "[\\U0010fffe]", 1),  # (a surrogate; a marker the engine keeps)
    ("(?i)[^\\x00-\\x60b-\\U0010ffff]", "[^\\x00-\\x60b-\\U0010ffff]", 4),  # ("a" left out, "A" in: none under (?i))
    ("[^\\p{L}\\P{L}]", "[^\\p{L}\\P{L}]", 0),  # (Unicode classes: the automaton library asked)
    # all but U+10FFFE, a marker: the engine's rewrite held "\U0010fffe"'s gap as a character, and built it
    ("x[^\\x00-\\ud7ff\\U0010ffff\\ue000-\\U0010fffd]", "[^\\x00-\\ud7ff\\U0010ffff\\ue000-\\U0010fffd]", 1),
])
def test_a_class_that_matches_nothing_is_refused_by_gen_as_by_the_engine(backend, pattern, cls, at):
    # gen() took these (Python's re reads each as a valid class), and the engine refused them only when
    # compiling ("has a part that matches no text"), or, for the last, built it; what the class keeps
    # from matching, and the pattern without it (test_a_part_an_empty_class_kills_...)
    never, fix = {"x[^\\w\\W]|y": ('the alternative "x[^\\\\w\\\\W]" can never match', 'write "y" without it, or '),
                  "(a[^\\d\\D])?b": ('the repeat "(a[^\\\\d\\\\D])?" can only match nothing', 'write "b" without it, or ')
                  }.get(pattern, ("the pattern can never match", ""))
    assert _refused_alike(backend, pattern) == (
        f"regex {json.dumps(pattern)} holds the class {cls} at position {at}, which matches no character an output may "
        f"hold (surrogates and U+10FFFE-U+10FFFF are none): an empty class can never match, so {never}, and the "
        f"automaton library refuses it; {fix}write the class you meant")
    with pytest.raises(ValueError, match="no transitions"):  # (the library itself, on the engine's spelling)
        _library_builds_class(cls, pattern.startswith("(?i)"))


def _library_builds_class(cls, caseless):
    """Build the automaton of the class ``cls`` as the engine writes it, over every single byte."""
    from outlines_core import Index, Vocabulary

    spelled = automaton_syntax(("(?i)" if caseless else "") + cls)
    Index(f"\\x{{10FFFE}}(?:{spelled})\\x{{10FFFF}}", Vocabulary(256, {bytes([b]): [b] for b in range(256)}))


def test_a_class_that_matches_nothing_in_a_part_repeated_zero_times_is_taken(backend):
    # the automaton library reads x{0} as nothing, so the empty class in it is no dead end
    assert lmnb_gen_takes("x(?:[^\\s\\S]){0}")
    assert accepts(backend.compile(regex="x(?:[^\\s\\S]){0}"), backend.vocab, "x")


_CLASS_ITEMS = ["\\s", "\\S", "\\d", "\\D", "\\w", "\\W", "a", "A", "é", "i", "İ", "ı", "_", "\\x00-\\x60",
                "b-\\U0010ffff", "\\U0010fffe", "\\U0010ffff", "\\ud800", "\\ud800-\\udfff", "\\x00-\\ud7ff",
                "\\ue000-\\U0010fffd", "\\p{L}", "\\P{L}", "\\p{Lu}", "\\P{Lu}", "\\P{Ll}", "\\x00-\\x40",
                "B-\\U0010ffff", "\\x00-h", "j-\\U0010ffff", "\\P{Any}"]


def test_gen_refuses_as_empty_just_the_classes_the_automaton_library_finds_empty():
    # random classes of complementary items, ranges that meet at a letter (and its other case under (?i)),
    # surrogates and the engine's markers: gen() refuses one as empty exactly where the library, given the
    # engine's spelling of it, builds no transition (its own check, not a list of spellings)
    from lmnb_engine.regex_errors import regex_problem

    rng = random.Random(7)
    disagree, empty = [], 0
    for _ in range(150):
        cls = "[" + "^" * (rng.random() < 0.7) + "".join(rng.sample(_CLASS_ITEMS, rng.randint(1, 4))) + "]"
        caseless = rng.random() < 0.4
        problem = regex_problem(("(?i)" if caseless else "") + "x" + cls)
        said_empty = problem is not None and "which matches no character" in problem
        try:
            _library_builds_class(cls, caseless)
            library_empty = False
        except ValueError as e:
            library_empty = "no transitions" in str(e)
        empty += library_empty
        if said_empty != library_empty:
            disagree.append((cls, caseless, problem))
    assert not disagree
    assert 10 < empty < 140  # (both kinds were tried)


@pytest.mark.parametrize("pattern, inside, outside", [
    # [^\d] was written as a nested class, which Python (compile_grammar's may_hold) read as ending
    # early, so the pattern was built bare: after a complete match (here the empty one) every token
    # into a longer character was dropped, and 'é' alone could not be written
    ("[^\\d]{0,2}", ["", "é", "aé", "ǅ—", "\x0bǅ"], ["٣", "a1", "abc"]),
    ("[^\\s\\d]*", ["é", "ab😀"], [" é", "a٣"]),
    ("(?:b|[^\\d])?x", ["éx", "x", "bx"], ["٣x", "bbx"]),
    ("[^\\W_]{0,2}", ["é", "a٣", "½", "ǅ"], ["_", "a_", "-"]),  # word characters but '_'
    ("[^\\D]?", ["", "٣", "7"], ["a", "½"]),
    ("[^\\Wa]+", ["é١", "b"], ["a", "ba"]),
])
def test_categories_in_a_class_keep_multibyte_characters_after_a_complete_match(backend, pattern, inside, outside):
    grammar = backend.compile(regex=pattern)
    assert grammar.marked
    for text in inside:
        assert accepts(grammar, backend.vocab, text) and re.fullmatch(pattern, text), text
    for text in outside:
        assert not accepts(grammar, backend.vocab, text) and not re.fullmatch(pattern, text), text


@pytest.mark.parametrize("schema, candidates", [
    # an optional property whose enum lists no string: left out (it cannot be written validly)
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "enum": [1, 2]}},
      "required": ["a"]},
     ['{"a": 1}', '{"a": 1, "b": 1}', '{"a": 1, "b": "1"}', '{"b": "1"}']),
    # one anyOf branch with no valid const: the other branch is used
    ({"anyOf": [{"type": "string", "const": 1}, {"type": "integer"}]}, ["3", "1", '"1"', '"x"']),
    # the items of an array that may be empty: the array is written empty
    ({"type": "array", "items": {"type": "integer", "minimum": 5, "enum": [1, 2]}}, ["[]", "[1]", "[5]"]),
    # an unused $defs entry constrains nothing
    ({"$defs": {"never": {"type": "string", "enum": []}}, "type": "boolean"}, ["true", "false", '"x"']),
])
def test_a_subschema_with_no_valid_listed_value_is_dropped_where_the_schema_does_without_it(schema, candidates):
    """An enum/const that no value satisfies, where the whole schema is still satisfiable: it was
    refused ("no output could validate"). The reference: jsonschema's verdict on each candidate."""
    rx = re.compile(schema_to_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    for text in candidates:
        assert bool(rx.fullmatch(text)) == validator.is_valid(json.loads(text)), text


def test_a_required_subschema_with_no_valid_listed_value_is_still_refused():
    """Where the schema needs the value (a required property, the only branch), nothing validates."""
    with pytest.raises(GrammarError, match="at #/properties/b: no enum value passes its own type; no output could"):
        schema_to_regex({"type": "object", "properties": {"b": {"type": "string", "enum": [1]}}, "required": ["b"]})
    with pytest.raises(GrammarError, match="at #/anyOf/0 has const 1, which does not pass its own type"):
        schema_to_regex({"anyOf": [{"type": "string", "const": 1}]})
    with pytest.raises(GrammarError, match="at #/items: no enum value passes"):
        schema_to_regex({"type": "array", "minItems": 1, "items": {"type": "string", "enum": [1]}})


def test_the_boolean_schemas_true_and_false_at_the_root():
    """``true`` (a bool or the JSON string) is JSON Schema's any value: the same grammar as ``{}``;
    ``false`` accepts nothing. Both were refused ("must be a dict ..."). The reference for the
    matches: json.loads and jsonschema's verdict on each text."""
    assert schema_to_regex(True) == schema_to_regex("true") == schema_to_regex({})
    rx = re.compile(schema_to_regex(True))
    for text in ['1', '-2.5', '"x"', 'null', 'true', '[]', '[1, {"a": false}]', '{"a": [null, "b"]}']:
        assert jsonschema.Draft202012Validator(True).is_valid(json.loads(text)) and rx.fullmatch(text), text
    for text in ['', 'nul', '[1,', "'x'", '{"a"}']:
        assert not rx.fullmatch(text), text
    for schema in (False, "false"):
        with pytest.raises(GrammarError, match=r"^JSON schema false accepts no value: no output could validate"):
            schema_to_regex(schema)


@pytest.mark.parametrize("max_digits, places", [(4, 2), (3, None), (None, 2), (2, 2), (3, 0), (5, 1)])
def test_a_decimal_pattern_is_what_pydantic_accepts_in_plain_notation(max_digits, places):
    """pydantic (its Decimal validation) is the reference: every canonical plain decimal (no
    exponent, no leading or trailing zeros) matches the pattern exactly when pydantic accepts it."""
    from typing import Annotated

    from lmnb_engine.pydantic_schema import decimal_pattern

    adapter = pydantic.TypeAdapter(Annotated[Decimal, pydantic.Field(max_digits=max_digits, decimal_places=places)])
    rx = re.compile(decimal_pattern(max_digits, places))
    checked = 0
    for whole in ("0", "1", "9", "10", "99", "100", "999", "1000", "12345"):
        for fraction in ("", "5", "05", "25", "125", "001", "0001", "12345"):
            for sign in ("", "-"):
                text = sign + whole + ("." + fraction if fraction else "")
                try:
                    adapter.validate_json(f'"{text}"')
                    accepted = True
                except pydantic.ValidationError:
                    accepted = False
                assert bool(rx.fullmatch(text)) == accepted, text
                checked += accepted
    assert checked > 0


def test_pydantic_decimal_fields_compile_to_what_the_model_validates(backend):
    """pydantic's own schema left a Decimal's string unpatterned ('abc' passed JSON Schema) and
    dropped max_digits/decimal_places."""
    class Price(pydantic.BaseModel):
        amount: Decimal = pydantic.Field(max_digits=5, decimal_places=2)
        rate: Decimal = pydantic.Field(ge=0, le=1)

    rx = re.compile(backend.to_regex(json_schema=Price))
    for text, ok in (('{"amount": "123.45", "rate": 0.5}', True), ('{"amount": "-0.5", "rate": 1}', True),
                     ('{"amount": "abc", "rate": 0.5}', False), ('{"amount": "1234.5", "rate": 0.5}', False),
                     ('{"amount": "1.234", "rate": 0.5}', False), ('{"amount": "1.5", "rate": 1.5}', False),
                     ('{"amount": "1.5", "rate": "0.5"}', False)):
        assert bool(rx.fullmatch(text)) == ok, text
        if ok:
            Price.model_validate_json(text)

    class Both(pydantic.BaseModel):
        amount: Decimal = pydantic.Field(max_digits=5, decimal_places=2, gt=0)

    with pytest.raises(GrammarError, match=r"json_schema Both: field 'amount': a Decimal field with max_digits/decimal_places and gt "
                                           r"cannot be constrained exactly"):
        backend.to_regex(json_schema=Both)

    class Nothing(pydantic.BaseModel):  # the pattern wrote "0", which pydantic refuses (1 digit)
        amount: Decimal = pydantic.Field(max_digits=0)

    with pytest.raises(GrammarError, match=r"json_schema Nothing: field 'amount': a Decimal field with max_digits=0 accepts no value"):
        backend.to_regex(json_schema=Nothing)


def _pydantic_agrees(rx: re.Pattern, model: type, texts) -> None:
    """Each JSON text matches the compiled regex exactly when ``model`` (the reference) accepts it."""
    for text in texts:
        try:
            model.model_validate_json(text)
            accepted = True
        except pydantic.ValidationError:
            accepted = False
        assert bool(rx.fullmatch(text)) == accepted, text


def test_a_pydantic_naive_datetime_is_written_without_an_offset(backend):
    """pydantic's schema gives NaiveDatetime plain date-time, whose strings all carry an offset
    (Z or +hh:mm) that NaiveDatetime refuses: every output failed validation."""
    class Stamp(pydantic.BaseModel):
        at: pydantic.NaiveDatetime

    rx = re.compile(backend.to_regex(json_schema=Stamp))
    _pydantic_agrees(rx, Stamp, [json.dumps({"at": t}) for t in (
        "2024-02-29T10:00:00", "2024-02-29T23:59:59.123456", "2024-02-29T10:00:00Z", "2024-02-29T10:00:00+01:00",
        "2023-02-29T10:00:00", "2024-02-29T24:00:00")])
    from lmnb_engine.pydantic_schema import pydantic_json_schema

    # a plain pattern (no format of lmnb's own), which other backends (OpenAI, a server) read too
    assert set(pydantic_json_schema(Stamp)["properties"]["at"]) == {"type", "pattern", "title"}


@pytest.mark.parametrize("field", [
    pydantic.PastDate, pydantic.FutureDatetime,
    typing.Annotated[datetime.date, pydantic.Field(gt=datetime.date(2020, 1, 1))],
    typing.Annotated[datetime.time, pydantic.Field(lt=datetime.time(3))],
    typing.Annotated[datetime.timedelta, pydantic.Field(gt=datetime.timedelta(0))],
])
def test_bounded_pydantic_dates_and_times_are_refused(backend, field):
    """pydantic's schema drops a temporal field's bounds, so its format wrote "0001-01-01" for a
    date gt 2020-01-01, "P0D" for a positive timedelta, and years to 9999 for a PastDate."""
    model = pydantic.create_model("When", v=(field, ...))
    with pytest.raises(GrammarError, match=r"json_schema When: field 'v': a \w+ field with [\w/]+ bounds cannot be constrained"):
        backend.to_regex(json_schema=model)


def test_pydantic_bytes_with_max_length_count_bytes_not_characters(backend):
    """pydantic reads a bytes field as the UTF-8 of the JSON string and counts its bytes; the schema's
    maxLength counts characters, so "abé" (4 bytes) was written for max_length=3."""
    class Blob(pydantic.BaseModel):
        data: bytes = pydantic.Field(max_length=3)

    rx = re.compile(backend.to_regex(json_schema=Blob))
    for data, written in (("abc", True), ("a\\tb", True), ("", True), ("ab\u00e9", False), ("\U0001F600", False),
                          ("abcd", False)):
        text = '{"data": "%s"}' % data
        assert bool(rx.fullmatch(text)) == written, data
        if written:
            Blob.model_validate_json(text)
        elif len(data) <= 3:  # (the characters fit: only the byte count refuses it)
            with pytest.raises(pydantic.ValidationError, match="at most 3 bytes"):
                Blob.model_validate_json(text)


@pytest.mark.parametrize("field, message", [(pydantic.Json[int], "a Json field holds JSON text inside a string"),
                                            (pydantic.Json, "a Json field holds JSON text inside a string"),
                                            (complex, "a complex field is a string in Python's complex")])
def test_pydantic_fields_parsed_from_any_string_are_refused(backend, field, message):
    """pydantic's schema for Json[int] and complex is a string of any text: "m" was written, which
    neither parses."""
    model = pydantic.create_model("Parsed", v=(field, ...))
    with pytest.raises(GrammarError, match=f"json_schema Parsed: field 'v': {re.escape(message)}"):
        backend.to_regex(json_schema=model)


@pytest.mark.parametrize("config", [{}, {"str_strip_whitespace": True}])
def test_a_stripped_pydantic_str_has_its_min_length_after_stripping(backend, config):
    """pydantic strips a strip_whitespace str (the field's or the model config's) before counting
    min_length, so the two characters of "\\ta" were one: the string now ends in no whitespace."""
    field = pydantic.constr(strip_whitespace=True, min_length=2, max_length=4) if not config else \
        typing.Annotated[str, pydantic.Field(min_length=2, max_length=4)]
    model = pydantic.create_model("Named", __config__=pydantic.ConfigDict(**config), name=(field, ...))
    rx = re.compile(backend.to_regex(json_schema=model))
    for name, written in (("ab", True), ("a b", True), ("a\\nbc", True), ("\\ta", False), ("a ", False),
                          ("\\u00a0a", False), ("  ab", False), ("a", False), ("abcde", False)):
        text = '{"name": "%s"}' % name
        assert bool(rx.fullmatch(text)) == written, name
        if written:
            model.model_validate_json(text)


def test_a_pydantic_field_with_only_alias_path_aliases_is_refused(backend):
    """pydantic's schema names a field whose validation aliases are all AliasPath by its own name,
    which the model then refuses ('Field required'): every output failed validation."""
    class Nested(pydantic.BaseModel):
        x: int = pydantic.Field(validation_alias=pydantic.AliasPath("a", 0))

    with pytest.raises(GrammarError, match=r"json_schema Nested: field 'x' has only AliasPath validation aliases"):
        backend.to_regex(json_schema=Nested)
    with pytest.raises(pydantic.ValidationError, match="Field required"):  # what was written
        Nested.model_validate_json('{"x": 1}')

    class ByName(Nested):  # the field's name is accepted too, or a plain alias beside the path
        model_config = pydantic.ConfigDict(validate_by_name=True)

    class Choices(pydantic.BaseModel):
        x: int = pydantic.Field(validation_alias=pydantic.AliasChoices(pydantic.AliasPath("a", 0), "ex"))

    for model, text in ((ByName, '{"x": 1}'), (Choices, '{"ex": 1}')):
        assert re.fullmatch(backend.to_regex(json_schema=model), text)
        model.model_validate_json(text)


def test_a_pattern_whitespace_class_writes_what_pydantic_reads_as_whitespace(backend):
    """Python's \\s (jsonschema's) holds \\x1c-\\x1f, pydantic's Rust regex's does not: "a\\u001cb"
    was written for pattern ^a\\sb$ and pydantic refused it."""
    class Spaced(pydantic.BaseModel):
        v: str = pydantic.Field(pattern=r"^a\sb$")

    rx = re.compile(backend.to_regex(json_schema=Spaced))
    _pydantic_agrees(rx, Spaced, ['{"v": "a%sb"}' % c for c in (" ", "\\t", "\\n", "\\u000b", "\\f", "\\r", "\\u001c",
                                                                   "\\u001f", "", "x")])


def test_a_pydantic_path_field_takes_any_string(backend):
    """pydantic writes Path as format 'path', which was refused as an unsupported format, though
    pydantic reads any string as a Path."""
    class Saved(pydantic.BaseModel):
        to: Path

    rx = re.compile(backend.to_regex(json_schema=Saved))
    _pydantic_agrees(rx, Saved, ['{"to": "/tmp/x.txt"}', '{"to": ""}', '{"to": "a\\nb"}', '{"to": 3}',
                                 '{"to": null}'])


@pytest.mark.parametrize("field", [pydantic.NewPath, pydantic.FilePath, pydantic.DirectoryPath, pydantic.SocketPath])
def test_pydantic_paths_checked_against_the_disk_are_refused(backend, field):
    """pydantic writes NewPath as plain format 'path' (any string): "" was written, "." exists and
    NewPath refused it; FilePath's 'file-path' was refused only as an unknown format."""
    model = pydantic.create_model("Saved", to=(field, ...))
    with pytest.raises(GrammarError, match=r"json_schema Saved: field 'to': a \w+ path field checks the disk.*use pathlib.Path"):
        backend.to_regex(json_schema=model)


@pytest.mark.parametrize("keys", [int, bool, typing.Literal[1, 2]])
def test_pydantic_dicts_whose_key_type_the_schema_drops_are_refused(backend, keys):
    """pydantic's schema for dict[int, str] is any object of strings: '{"": "x"}' was written and
    the model refused its key."""
    model = pydantic.create_model("Table", v=(dict[keys, str], ...))
    with pytest.raises(pydantic.ValidationError):  # what was written
        model.model_validate_json('{"v": {"x": "y"}}')
    with pytest.raises(GrammarError, match=r"json_schema Table: field 'v': a dict field with \w+ keys cannot be constrained"):
        backend.to_regex(json_schema=model)


def test_pydantic_dicts_with_string_keys_still_compile(backend):
    class Tables(pydantic.BaseModel):
        plain: dict[str, int]
        checked: dict[typing.Annotated[str, pydantic.AfterValidator(str.strip)], int]
        named: dict[typing.Literal["a"], int]

    text = '{"plain": {"x": 1}, "checked": {"y": 2}, "named": {"a": 3}}'
    assert re.fullmatch(backend.to_regex(json_schema=Tables), text)
    Tables.model_validate_json(text)


@pytest.mark.parametrize("config", [{"val_json_bytes": "base64"},
                                    {"val_json_bytes": "base64", "ser_json_bytes": "base64"}])
def test_pydantic_bytes_read_as_base64_are_written_as_padded_base64(backend, config):
    """pydantic's bytes format follows ser_json_bytes, not the val_json_bytes validation reads: with
    val_json_bytes='base64' alone any string ("m") was written, with both the format was refused."""
    model = pydantic.create_model("Blob", __config__=pydantic.ConfigDict(**config), data=(bytes, ...))
    rx = re.compile(backend.to_regex(json_schema=model))
    _pydantic_agrees(rx, model, ['{"data": "%s"}' % b for b in ("", "YQ==", "YWI=", "YWJj", "+/8=", "YWJjYQ==",
                                                                 "YR==", "YWJ=", "m", "Y Q==")])
    limited = pydantic.create_model("Short", __config__=pydantic.ConfigDict(**config),
                                    data=(bytes, pydantic.Field(max_length=2)))
    with pytest.raises(GrammarError, match=r"json_schema Short: field 'data': a bytes field read as base64 .* with min_length/max"):
        backend.to_regex(json_schema=limited)


def _only_what_pydantic_accepts(rx: re.Pattern, model: type, texts) -> int:
    """Every JSON text the compiled regex matches validates with ``model`` (the reference); the
    number that matched."""
    matched = [text for text in texts if rx.fullmatch(text)]
    for text in matched:
        model.model_validate_json(text)
    return len(matched)


def test_a_pydantic_byte_size_is_a_number_and_a_unit_pydantic_reads(backend):
    """pydantic's ByteSize pattern ^\\s*(\\d*\\.?\\d+)\\s*(\\w+)? is unanchored at its end and takes any
    word as the unit, which the validator then looks up: "1kbx" and "1 ki" were written."""
    class Quota(pydantic.BaseModel):
        size: pydantic.ByteSize

    rx = re.compile(backend.to_regex(json_schema=Quota))
    rng = random.Random(0)
    texts = ['{"size": "%s"}' % "".join(rng.choice("0123456789. kKmMgGeEiIbBtTx\\t") for _ in range(rng.randint(0, 7)))
             for _ in range(5000)]
    assert _only_what_pydantic_accepts(rx, Quota, texts) > 200
    for size, written in (("1", True), ("1.5 KiB", True), (".5eb", True), ("12 kbit", True), ("3 EiBit", True),
                          ("1kbx", False), ("1 ki", False), ("1 2", False), ("", False), ("1" * 101, False)):
        assert bool(rx.fullmatch('{"size": "%s"}' % size)) == written, size
    _pydantic_agrees(rx, Quota, ['{"size": 0}', '{"size": 1024}', '{"size": -1}', '{"size": 1.5}'])


def test_a_pydantic_hashable_is_a_json_scalar(backend):
    """pydantic's schema for Hashable is any value: an object or array was written, which reads as
    an unhashable dict or list."""
    class Key(pydantic.BaseModel):
        key: typing.Hashable

    rx = re.compile(backend.to_regex(json_schema=Key))
    _pydantic_agrees(rx, Key, ['{"key": %s}' % v for v in ('"a"', "1", "-2.5", "true", "null", "[]", "[1]", "{}",
                                                          '{"a": 1}')])


def test_pydantic_secret_bytes_with_max_length_count_bytes_not_characters(backend):
    """SecretBytes(max_length=3) counts the UTF-8 bytes, as bytes does: "ab\\u00e9" (4 bytes) was written."""
    class Token(pydantic.BaseModel):
        token: pydantic.SecretBytes = pydantic.Field(max_length=3)

    rx = re.compile(backend.to_regex(json_schema=Token))
    texts = {t: '{"token": "%s"}' % t for t in ("", "abc", "a\\tb", "ab\u00e9", "\u00e9\u00e9", "abcd")}
    assert _only_what_pydantic_accepts(rx, Token, texts.values()) == 3  # (ASCII: then characters are bytes)
    with pytest.raises(pydantic.ValidationError, match="at most 3 items"):  # what was written
        Token.model_validate_json(texts["ab\u00e9"])


@pytest.mark.parametrize("config", [{}, {"str_strip_whitespace": True}])
def test_a_stripped_pydantic_str_with_a_pattern_that_can_touch_whitespace_is_refused(backend, config):
    """pydantic checks a stripped str's pattern and min_length on the stripped text: " a" matched
    ^[a-z ]+$ with min_length=2 and was written; stripped, it is one character."""
    strip = {} if config else {"strip_whitespace": True}
    model = pydantic.create_model("Named", __config__=pydantic.ConfigDict(**config), name=(
        typing.Annotated[str, pydantic.StringConstraints(pattern=r"^[a-z ]+$", min_length=2, **strip)], ...))
    with pytest.raises(pydantic.ValidationError):  # what was written
        model.model_validate_json('{"name": " a"}')
    with pytest.raises(GrammarError, match=r"json_schema Named: field 'name': a str field with strip_whitespace and "
                                           r"the pattern '\^\[a-z \]\+\$', which can begin or end with whitespace"):
        backend.to_regex(json_schema=model)


def test_a_stripped_pydantic_str_with_a_pattern_free_of_edge_whitespace_compiles(backend):
    """A pattern that never begins or ends with whitespace leaves nothing to strip: the written
    text is checked as written."""
    model = pydantic.create_model("Named", name=(pydantic.constr(strip_whitespace=True, pattern=r"^[a-z][a-z ]*[a-z]$",
                                                                 min_length=3, max_length=5), ...))
    rx = re.compile(backend.to_regex(json_schema=model))
    texts = ['{"name": "%s"}' % "".join(p) for n in range(7) for p in itertools.product(("a", " ", "\\t"), repeat=n)]
    assert _only_what_pydantic_accepts(rx, model, texts) == sum(2 ** (n - 2) for n in (3, 4, 5))  # a[a ]*a


def test_pydantic_errors_name_the_field_and_its_class(backend):
    """A refused field was described by its type alone; in a model of many fields (or nested
    classes) nothing said which one."""
    class Inner(pydantic.BaseModel):
        ok: int
        when: pydantic.PastDate

    class Outer(pydantic.BaseModel):
        name: str
        inner: Inner

    with pytest.raises(GrammarError, match=r"json_schema Outer: field 'Inner.when': a date field with past/future"):
        backend.to_regex(json_schema=Outer)


def test_the_pydantic_schema_generator_uses_no_private_pydantic_hook(backend):
    """The generator overrode pydantic's private _get_alias_name and read its private _config: a
    release moving either would break every pydantic json_schema. It now overrides only documented
    per-type methods and reads the config from the core schema; nested classes keep their own."""
    from pydantic.json_schema import GenerateJsonSchema

    generators = []

    class Inner(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(str_strip_whitespace=True)
        word: str = pydantic.Field(min_length=2)

    class Outer(pydantic.BaseModel):  # (not stripped: its own config)
        word: str = pydantic.Field(min_length=2)
        inner: Inner

        @classmethod
        def model_json_schema(cls, *args, **kwargs):
            generators.append(kwargs["schema_generator"])
            return super().model_json_schema(*args, **kwargs)

    rx = re.compile(backend.to_regex(json_schema=Outer))
    for text, written in (('{"word": " a", "inner": {"word": "ab"}}', True),
                          ('{"word": "ab", "inner": {"word": " a"}}', False)):
        assert bool(rx.fullmatch(text)) == written, text
    Outer.model_validate_json('{"word": " a", "inner": {"word": "ab"}}')
    with pytest.raises(pydantic.ValidationError):
        Outer.model_validate_json('{"word": "ab", "inner": {"word": " a"}}')

    private = {name for name in dir(GenerateJsonSchema) if name.startswith("_") and not name.startswith("__")}
    (generator,) = set(generators)
    for name, member in vars(generator).items():
        if name.startswith("__"):
            continue
        assert name.startswith("lmnb_") or (name in dir(GenerateJsonSchema) and name not in private), name
        code = getattr(member, "__code__", None) or getattr(getattr(member, "__wrapped__", None), "__code__", None)
        names = set(code.co_names) if code else set()
        for const in code.co_consts if code else ():  # (nested functions and comprehensions)
            names |= set(getattr(const, "co_names", ()))
        assert not names & private, (name, names & private)


_LONG = "a" * 100_000


@pytest.mark.parametrize("schema, shown", [
    ({"type": "integer", "const": _LONG}, '"' + "a" * 79),  # the const that fails its own type
    ({"enum": _LONG}, '"' + "a" * 79),  # the meta-schema's (jsonschema's) message: enum must be an array
    ({"type": "string", "pattern": "(" + _LONG}, '"(' + "a" * 78),  # not a regex
    ({"type": "object", "properties": {}, "required": [_LONG], "additionalProperties": False}, '"' + "a" * 79),
    ({"$ref": "#/$defs/" + _LONG}, '"#/$defs/' + "a" * 71),  # points at nothing
])
def test_a_schemas_error_shows_a_long_value_cut_after_80_characters(schema, shown):
    """A schema's error message wrote the value it names whole: a const of 100,000 characters
    gave a message of 100,000 characters. It is cut after 80, as a regex's error cuts its pattern."""
    with pytest.raises(ValueError) as e:
        schema_to_regex(schema)
    message = str(e.value)
    assert shown + "…" in message and "a" * 80 not in message, message[:300]


@pytest.mark.parametrize("pattern, text", [(r"\p{L}+(\.[0-9]+)?", "ab.5"), (r"\p{Lu}[a-z]*( \p{Lu}[a-z]*)?", "Ab Cd")])
def test_a_pattern_with_a_unicode_class_lets_a_complete_match_go_on(tokenizer, pattern, text):
    # may_hold could not read \p{L}, so the pattern was built bare, without the markers: the bare
    # index drops a token that continues a complete match into an incomplete one ("." after "ab"),
    # so "ab.5", which the pattern matches (the regex package says so), could never be generated.
    # A Unicode class that cannot hold the start marker (the regex package asked) no longer does.
    import regex

    assert regex.fullmatch(pattern, text)
    vocab = TokenVocabulary(tokenizer)
    grammar = compile_grammar(automaton_syntax(pattern), vocab)
    state = grammar.initial_state
    for ch in text:  # one one-character token at a time
        token = vocab.bytes_to_ids[ch.encode()][0]
        assert token in grammar.allowed_ids(state), (text, ch)
        state = grammar.next_state(state, token)
    assert grammar.is_final(state)


@pytest.mark.parametrize("pattern", [r"[+-/]{2}", r"[,-.]+0", r"a[+-,]?"])
def test_a_class_range_from_plus_or_comma_is_checked_and_compiled(backend, pattern):
    # A range's (low, high) pair from "+" (43) or "," (44) was taken for a repeat node by
    # largest_repeat, whose opcodes MIN_REPEAT and MAX_REPEAT are those ints: check_regex raised a
    # bare TypeError ('cannot unpack non-iterable int object') for a pattern gen() had passed.
    # The engine takes it, and matches what Python's re matches.
    from lmnb_engine.regex_errors import regex_problem

    assert regex_problem(pattern) is None
    backend.to_regex(regex=pattern)
    _assert_automaton_matches_as_python(pattern, "a+,-./0", 3)


@pytest.mark.parametrize("pattern", [r"(?i)[^\Wa]", r"(?i)[^\W\u00e9 %]+", r"x(?i:[^\W_b])", r"(?i)(?-i:[^\Wa])"])
def test_a_class_written_out_as_its_characters_keeps_case_insensitive_exclusions(pattern):
    # A negated class with a negated category ([^\Wa]) is written out as the characters Python's
    # class holds, but was read without the (?i) around it: "A" stayed in the written class (only
    # "a" is named), and the library's (?i) then let "a" back in, where Python's (?i)[^\Wa] leaves
    # out both. Every text is matched by the automaton exactly when Python's re matches it.
    _assert_automaton_matches_as_python(pattern, "aAbBxéÉ1_ %", 2)


@pytest.mark.parametrize("pattern, literal", [
    ("[[:alpha:]][[:digit:]]", r"[\[:alpha:]][\[:digit:]]"),
    ("x[[:^digit:]]y[a[:alpha:]]+", r"x[\[:^digit:]]y[a\[:alpha:]]+"),
    # (the regex package's first class runs to the second "]": one class of two POSIX classes, as Python's
    # first class, with the first "[" escaped, runs to the first "]", so one escape is all)
    ("[[:alpha:][:digit:]]", r"[\[:alpha:][:digit:]]"),
    ("[[:alpha:]]|[[:Script=Greek:]]", r"[\[:alpha:]]|[\[:Script=Greek:]]"),
])
def test_every_reading_offered_for_a_stop_regex_posix_class_is_taken(pattern, literal):
    # the literal reading escaped only the first POSIX class: "[\\[:alpha:]][[:digit:]]", which gen() refused
    # for its second; each "[" the stop matcher reads as opening one is escaped, as Python's re reads them all
    import lmnb
    from lmnb_engine.params import stop_regex_problem

    said = stop_regex_problem(pattern)
    offers = [json.loads(text) for text in re.findall(r'"(?:[^"\\]|\\.)*"', said)[1:]]  # (after the pattern itself)
    assert offers[-1] == literal, said
    assert all(lmnb.gen("x", stop_regex=offer).params.stop_regex == offer for offer in offers), offers
    try:
        from re import _parser
    except ImportError:  # (Python 3.10)
        import sre_parse as _parser

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (re's "Possible nested set")
        assert str(_parser.parse(literal)) == str(_parser.parse(pattern))  # (Python's re reads the two alike)


@pytest.mark.parametrize("pattern", ["[[:alpha:]]*", "x?[[:digit:]]{0,3}", "\\G[[:alpha:]]"])
def test_a_stop_regex_posix_class_is_named_after_what_its_readings_would_be_refused_for(pattern):
    # [[:alpha:]]* was offered [A-Za-z]* and [\[:alpha:]]*, both of which match the empty string, so gen()
    # refused the fix in turn: the checks that every reading fails too (the empty string, \G) come first
    from lmnb_engine.params import stop_regex_problem

    said = stop_regex_problem(pattern)
    if pattern.startswith("\\G"):
        assert said.startswith(f"{json.dumps(pattern)} holds \\G, which matches where a search starts"), said
    else:
        assert regex_module.search(pattern, "") is not None  # (the pattern matches the empty string, as said)
        assert said == (f"{json.dumps(pattern)} matches the empty string, so it would stop the output early, where "
                        "an empty match is met, not where what it looks for is written; make it match at least one character")


@pytest.mark.parametrize("pattern, at, literal, greek", [
    ("[[:Script=Greek:]]", 1, r"[\[:Script=Greek:]]", "α"),
    ("x[a[:^Script=Greek:]]", 3, r"x[a\[:^Script=Greek:]]", "xé"),  # (a, or not Greek)
    ("[[:sc:Greek:]]+", 1, r"[\[:sc:Greek:]]+", "αβ"),
    ("[[:Script = Greek:]]", 1, r"[\[:Script = Greek:]]", "α"),
])
def test_a_stop_regex_property_class_in_posix_form_is_refused(pattern, at, literal, greek):
    # stop_regex="[[:Script=Greek:]]" was taken with no word: the stop matcher (the regex package) reads a
    # property there, Greek letters, and Python's re (an SGLang server's stop matcher) the literal characters
    import lmnb
    from lmnb_engine.params import stop_regex_problem

    name = pattern[at:pattern.index(":]", at) + 2]
    assert stop_regex_problem(pattern) == (
        f"{json.dumps(pattern)} holds the property class {name} at position {at}, which the stop matcher (the regex "
        "package) reads as a class of Unicode characters, and Python's re as literal characters; write "
        f"{json.dumps(literal)} to mean the characters")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert regex_module.search(pattern, greek) and not re.search(pattern, greek)  # (the two readings named)
        assert regex_module.search(literal, greek) is None  # (the literal reading is read alike)
    assert lmnb.gen("x", stop_regex=literal).params.stop_regex == literal
    # a "[:...:]" that the regex package reads as literal characters too, as Python's re does, is taken
    for alike in ("[[:Script=:]]", "[[:é:]]"):
        assert regex_module.fullmatch(alike, "[]") and lmnb.gen("x", stop_regex=alike).params.stop_regex == alike


# Texts to check a pattern against with Python's re: every character below U+3000 alone, and every text
# of up to three of a few characters
_SAMPLE_TEXTS = [chr(c) for c in range(0x3000)] + ["".join(t) for n in range(4)
                                                   for t in itertools.product("abcdefxyB\n", repeat=n)]


def _spans(pattern, module=re):
    """Where ``module`` (Python's re, or the regex package) finds ``pattern`` first in each sample text."""
    compiled = module.compile(pattern)
    return [m.span() if (m := compiled.search(t)) else None for t in _SAMPLE_TEXTS]


@pytest.mark.filterwarnings("ignore:Possible:FutureWarning")  # (nested set, set union: Python reads them as written)
def test_the_classes_read_in_a_pattern_are_those_pythons_parser_reads_in_random_patterns():
    # regex_parts.pattern_parts walks a pattern's text for the empty-class check (regex_empty_class), the part
    # a class kills (regex_dead_part) and the stop regex checks (params). A "#" is a comment under a scoped
    # (?x:...) and under an (?x) after a comment, (?#c)(?x), too: a "[" there was taken to open a class (the empty
    # class after it was then missed, and "(?#c)(?x)a#[" raised IndexError). The reference: Python's parser,
    # on random patterns it reads: each class found, held by a character the pattern lacks, is read as that
    # character (not skipped in a comment), and no class is left in the parse but \d, \s, \w and their negations
    from lmnb_engine.regex_empty_class import _classes
    from lmnb_engine.regex_parts import classes_held
    from lmnb_engine.regex_tree import constants, parser, walk

    pieces = ["a", "|", "(", ")", "(?:", "(?x:", "(?i:", "(?-x:", "(?ix-s:", "(?#", "#", "\n", " ", "[", "[^", "]",
              "\\", "\\d", "\\S", "\\x41", "\\N{SPACE}", "\\p{L}", "{2}", "*", "-", "^", "\\]", "\\[", "\\)", "\\#"]
    heads = ["", "", "(?x)", "(?i)", "(?#c)(?x)", "(?x) (?i)"]
    rng, read = random.Random(5), 0
    while read < 400:
        pattern = rng.choice(heads) + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        try:
            parser.parse(classes_held(pattern))
        except re.error:
            continue
        read += 1
        held = pattern
        for start, end, _ in reversed(list(_classes(pattern))):
            held = held[:start] + "\ue000" + held[end:]
        nodes = list(walk(parser.parse(classes_held(held))))
        assert (sum(op is constants.LITERAL and av == 0xE000 for op, av in nodes) == held.count("\ue000")
                and all(len(av) == 1 and av[0][0] is constants.CATEGORY for op, av in nodes if op is constants.IN)), pattern


@pytest.mark.parametrize("pattern, offer", [
    ("[^\\s\\S]", None), ("x[^\\w\\W]y", None), ("[^\\w\\W]|b", "b"), ("(a[^\\d\\D])?b", "b"),
    ("a(?:b|c[^\\d\\D]d|e)f", "a(?:b|e)f"), ("a[^\\d\\D]{0,2}b", "ab"), ("a[^\\d\\D]*?b", "ab"),
    ("(?i)[^\\d\\D]|B", "(?i)B"), ("[^\\d\\D]|[^\\w\\W]|b", "b"), ("b|x[^\\w\\W]+", "b"),
    ("(?:[^\\d\\D]|b)c", "(?:b)c"), ("[\\ud800]|b", "b"),
    ("x[^\\x00-\\U0010ffff]|b", "b"),
    # ("{}" is two literal characters to Python's re and the regex package, not a repeat: it was offered "x|b")
    ("x[^\\w\\W]{}|b", "b"), ("a[^\\d\\D]{,2}b", "ab"),
])
def test_a_part_an_empty_class_kills_is_named_and_the_pattern_offered_without_it_for_regex_and_stop_regex(
        backend, pattern, offer):
    # stop_regex="[^\s\S]" was taken, and stopped at the first character (the regex package, the stop
    # matcher's reader, reads it as every character); "[^\w\W]|b" was refused by regex= as a whole ("remove
    # it") and taken by stop_regex=. Both refuse each now in the same words, naming what the class keeps
    # from ever matching (an alternative, a repeat that can only match nothing, the whole pattern) and
    # offering the pattern without it. The reference: Python's re over sample texts (the part named never
    # matches, or only matches nothing; the offer finds the same matches; a pattern said never to match
    # matches no text), and the regex package's own reading of the class, which the stop message names
    import lmnb
    from lmnb_engine.params import SamplingParams

    said = _refused_alike(backend, pattern)
    with pytest.raises(ValueError) as at_gen:
        lmnb.gen("x", stop_regex=pattern)
    stop_said = str(at_gen.value).removeprefix(f"stop_regex={json.dumps(pattern)} is invalid: ")
    with pytest.raises(ValueError, match=re.escape(stop_said)):
        SamplingParams(stop_regex=["ok", pattern]).validate()
    misread = ("; the stop matcher (the regex package) reads the class as matching characters, and would stop at "
               "them")
    cls = re.search(r"holds the class (.*?) at position", stop_said).group(1)
    assert (misread in stop_said) == any(regex_module.search(cls, t) for t in _SAMPLE_TEXTS[:0x3000])
    # the same words, but for the markers the engine keeps out of a regex= automaton, and the library
    assert said == "regex " + stop_said.replace(misread, "").replace(
        "(surrogates are none)", "(surrogates and U+10FFFE-U+10FFFF are none)").replace(
        "; ", ", and the automaton library refuses it; ", 1)
    if offer is None:
        assert "so the pattern can never match" in stop_said and stop_said.endswith("; write the class you meant")
        assert _spans(pattern) == [None] * len(_SAMPLE_TEXTS)
        return
    assert stop_said.endswith(f"; write {json.dumps(offer)} without it, or write the class you meant")
    assert _spans(pattern) == _spans(offer) and lmnb_gen_takes(offer) and lmnb.gen("x", stop_regex=offer)
    part = json.loads(re.search(r'so the (?:alternative|repeat) ("(?:[^"\\]|\\.)*")', stop_said).group(1))
    if "the repeat" in stop_said:
        assert {span[1] - span[0] for span in _spans(part) if span} <= {0}, part
    else:
        assert _spans(part) == [None] * len(_SAMPLE_TEXTS), part


@pytest.mark.parametrize("pattern, offer", [
    (r"a(?<=[^\s\S])b|c", "c"), (r"(?=a)[^\w\W]|b", "b"), (r"x\b[^\d\D]|y", "y"), (r"a^[^\s\S]|c", "c"),
])
def test_an_empty_class_in_a_part_the_engine_cannot_build_is_named_alike_by_gen_a_cell_and_the_engine(backend, pattern,
                                                                                                      offer):
    # gen("x", regex=r"a(?<=[^\s\S])b|c") and a %%lm cell named the empty class and offered "c", the engine said
    # "uses a lookbehind, which constrained decoding cannot support": it checked its own refusals first. The engine
    # asks for the empty class first now, as gen() does, so the three say one thing, and the offer is one the engine
    # builds. The reference: Python's re over sample texts (the offer finds the pattern's matches)
    said = _refused_alike(backend, pattern)
    assert said.startswith(f"regex {json.dumps(pattern)} holds the class ") and "constrained decoding" not in said
    assert said.endswith(f"; write {json.dumps(offer)} without it, or write the class you meant"), said
    assert _spans(pattern) == _spans(offer)
    backend.compile(regex=offer)


@pytest.mark.parametrize("pattern, without", [
    (r"c(?<=c)[^\s\S]?", "c(?<=c)"), (r"(?<=a)b|[^\s\S]", "(?<=a)b"), (r"(a)\1|x[^\d\D]", r"(a)\1"),
    (r"^a\b|[^\w\W]$", r"^a\b"), (r"a(?<=[^\s\S])b|c(?<!d)", "c(?<!d)"),
])
def test_an_empty_class_beside_a_part_the_engine_cannot_build_offers_no_pattern_the_engine_refuses(backend, pattern,
                                                                                                  without):
    # gen("x", regex=r"c(?<=c)[^\s\S]?"), a %%lm cell and the engine offered "c(?<=c)", the pattern without the
    # empty class, which gen() takes and the engine then refuses for its lookbehind. No such pattern is offered:
    # the fix says to remove the part, and what the engine says of the pattern without it (the reference: the
    # engine's own refusal of that pattern, the one offered before)
    said = _refused_alike(backend, pattern)
    with pytest.raises(GrammarError) as refused:
        backend.compile(regex=without)
    assert said.endswith(f"; remove it, or write the class you meant; but without it, {refused.value}"), said
    assert "without it, or" not in said


def test_quiet_parse_reads_a_pattern_without_warnings_and_none_that_python_cannot():
    """regex_tree.quiet_parse, the one parse the schema's back-reference check, the grammar's
    may-hold check and the empty-class check share: Python's own parser's result for a pattern it
    reads ("[[a]" too, silently: re warns of a possible nested set), None for one it refuses or
    cannot hold (a repeat count above 2**32 - 2, parentheses nested past its recursion)."""
    import warnings

    from lmnb_engine.regex_tree import parser, quiet_parse

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parsed = quiet_parse("[[a]b")
    with pytest.warns(FutureWarning, match="nested set"):
        assert str(parsed) == str(parser.parse("[[a]b"))
    assert [quiet_parse(p) for p in ("a(", "a{99999999999}", "(" * 5000 + ")" * 5000)] == [None, None, None]


@pytest.mark.parametrize("schema, where, said", [
    ({"type": "string", "maxLength": -1}, "#/maxLength", "-1, a number of characters below 0; give 0 or more, or "
                                                          "leave maxLength out"),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}, "#/properties/a/maxLength",
     "-1, a number of characters below 0; give 0 or more, or leave maxLength out"),
    ({"type": "array", "items": {"type": "array", "minItems": -2}}, "#/items/minItems",
     "-2, a number of items below 0; give 0 or more, or leave minItems out"),
])
def test_a_negative_count_keyword_at_any_depth_is_named_in_lmnbs_words(schema, where, said):
    """A nested "maxLength": -1 got jsonschema's "-1 is less than the minimum of 0", which names neither
    what is counted nor the fix; a count keyword below 0 is refused in lmnb's words wherever it is."""
    from lmnb_engine.json_schema import checked_schema

    for engine in (True, False):
        with pytest.raises(ValueError) as e:
            checked_schema(schema, engine=engine)
        assert str(e.value) == f"JSON schema at {where} is {said}"


@pytest.mark.parametrize("engine", [False, True])
def test_a_schema_patterns_repeat_count_of_more_digits_than_python_reads_is_refused_in_lmnbs_words(engine):
    """A schema's pattern "a{" + 5001 nines + "}" raised Python's "Exceeds the limit (4300 digits)
    for integer string conversion" from jsonschema's regex format check (re's parser reads a count
    with int()), where gen(regex=...) refuses it as a count above the limit of 1000. It is that
    refusal, named as a schema's pattern; one long only by its leading zeros is told to drop them."""
    import lmnb

    from lmnb_engine.json_schema import checked_schema

    cases = [
        ({"type": "string", "pattern": "a{" + "9" * 5001 + "}"},  # 10**5001 - 1: 9.999e+5000, 5001 digits
         'JSON schema at #/pattern: the pattern "a{999', "repeats a part 9.999e+5000 (an integer of 5001 digits) "
         "times (nested repeats multiplied), above the limit of 1000"),
        ({"type": "object", "properties": {"x": {"type": "string", "pattern": "b{0" + "0" * 5000 + "5}"}}},
         'JSON schema at #/properties/x/pattern: the pattern "b{000', "writes a repeat count in 5002 digits, "
         "more digits than Python reads as an integer (at most 4300); write it without its leading zeros"),
    ]
    for schema, start, words in cases:
        with pytest.raises(ValueError) as e:
            checked_schema(schema, engine=engine) if engine else lmnb.gen("a", json_schema=schema)
        assert str(e.value).startswith(start) and words in str(e.value), str(e.value)[:400]
