"""find skips the search of a stop regex where no new match can end: the characters a match may end
with (regex_last) and the lookbehinds that end every match (StopRegexes.back_tails)."""

from __future__ import annotations

import pytest

from lmnb_engine import stop_matcher
from lmnb_engine.regex_last import last_characters
from lmnb_engine.stop_matcher import StopStringMatcher


@pytest.mark.parametrize("pattern, ends, not_ends", [
    (r"a{1,500}b", "b", "a\n"),
    (r"[a-z]{1,300}[0-9]", "05", "a "),
    (r"a+(?:b|c)?", "abc", "d"),  # (the group may consume nothing: "a" may end a match too)
    (r"a(?<=a)\b", "a", "b"),  # (assertions consume nothing)
    (r"x[^a]", "b\n", "a"),
    (r"(?s)x.", "\n", ""),
    (r"x.", "b", "\n"),
    (r"(?i)xa", "aA", "b"),
    (r"(?:ab)*?c", "c", "ab"),
])
def test_the_characters_a_match_may_end_with(pattern, ends, not_ends):
    # Worked by hand from each pattern's last consuming items
    last = last_characters(pattern)
    assert all(last.fullmatch(c) for c in ends) and not any(last.fullmatch(c) for c in not_ends)


@pytest.mark.parametrize("pattern", [r"a?", r"(a)\1", r"b(?i:a)", r"(?>ab|a)", r"a++"])
def test_no_characters_where_a_match_may_be_empty_or_end_otherwise(pattern):
    # the empty match ends with no character; a backreference, a scoped flag, an atomic group and a
    # possessive repeat are not read
    assert last_characters(pattern) is None


def _counted(monkeypatch) -> list:
    calls = []
    search = stop_matcher._new_match

    def counting(*args, **kwargs):
        calls.append(args[2])
        return search(*args, **kwargs)

    monkeypatch.setattr(stop_matcher, "_new_match", counting)
    return calls


@pytest.mark.parametrize("pattern, run, last, stop", [
    # a{1,500}b: the "b" ends the match of the 500 "a"s before it, from 1202 - 501
    (r"a{1,500}b", "a", "ab", (701, "a" * 500 + "b")),
    # a lookbehind ends each match: it holds only once "ing" comes, and the whole run matches
    (r"\w+(?<=ing)", "abcd", "ing", (0, "abcd" * 300 + "ing")),
    (r"[a-z]+(?<=zz)", "abcd", "zz", (0, "abcd" * 300 + "zz")),
])
def test_an_open_run_where_no_match_can_end_is_not_searched_and_the_stop_is_met_where_it_ends(monkeypatch, pattern,
                                                                                               run, last, stop):
    # Over the run, no character a match may end with comes (or its lookbehind holds nowhere): find
    # searched each token from the run's start, each start to its end (a cost per token growing
    # with the run; the lookbehind ones given up at ~1100 characters); now it searches nothing
    calls = _counted(monkeypatch)
    m, text = StopStringMatcher([], [pattern]), ""
    for _ in range(1200 // len(run)):
        checked, text = len(text), text + run
        assert m.find(text, checked) is None
        m.safe_len(text)
    assert calls == [] and m.problem is None
    checked, text = len(text), text + last
    assert m.find(text, checked) == stop and calls


@pytest.mark.parametrize("pattern, held, pieces, stop", [
    # a match that ends in the text not checked (the first min_new_tokens) is no stop; one ending
    # past it is, straddling it or not (worked by hand)
    (r"a{1,5}b", "ab", ["ab"], (2, "ab")),
    (r"a{1,5}b", "aa", ["ab"], (0, "aaab")),
    (r"\w+(?<=ab)", "xab", ["c", "ab"], (0, "xabcab")),
    (r"x\w*(?<=yz)", "xy", ["z"], (0, "xyz")),
    (r"x\w*(?<=yz)", "xyz", ["a", "b"], None),
])
def test_matches_that_end_in_or_past_the_text_not_checked(pattern, held, pieces, stop):
    m, text, hit = StopStringMatcher([], [pattern]), held, None
    for piece in pieces:
        checked, text = len(text), text + piece
        if (hit := m.find(text, checked)) is not None:
            break
    assert hit == stop
