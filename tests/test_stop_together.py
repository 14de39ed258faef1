"""stop_together: which stop regexes are tried by every text that may follow, and over what."""

from __future__ import annotations

import pytest

from lmnb_engine.stop_together import Together, together


def test_a_pattern_two_ways_may_settle_together_is_tried_over_one_character_of_each_kind():
    # Worked by hand: a(?:\B|(?!\w)) names "a" and reads \w (and, as every pattern, \d, \s and the
    # newline are told apart): the kinds are "a", another word character, a digit, a space other
    # than the newline, the newline, and none of these; characters outside ASCII add no kind. Its
    # assertions read 2 characters past a match (\B's: the next character and whether one follows)
    how = together(r"a(?:\B|(?!\w))")
    assert how is not None and how.ahead == 2
    kinds = sorted(("a" if c == "a" else "newline" if c == "\n" else "digit" if c.isdigit() else
                    "word" if c.isalnum() or c == "_" else "space" if c.isspace() else "other") for c in how.alphabet)
    assert kinds == ["a", "digit", "newline", "other", "space", "word"]
    # [a-c] and "x" split the letters: "a", "b" or "c" alike, "x", another letter
    assert len(together(r"[a-c](?:\B|(?!x))").alphabet) == 7
    assert isinstance(how, Together)


@pytest.mark.parametrize("pattern, why", [
    (r"a\b", "one way only: no alternative or repeat"),
    (r"a(?:b|c)", "no assertion that reads forward"),
    (r"(?i)a(?:\B|(?!\w))", "case-insensitive"),
    ("\u00e9(?:\\B|(?!\\w))", "a character outside ASCII"),
    (r"(a)(?:\B|(?!\1))", "a backreference"),
])
def test_patterns_not_tried_by_every_text_that_may_follow(pattern, why):
    assert together(pattern) is None, why


def test_a_pattern_that_reaches_without_bound_from_a_start_is_tried():
    # a+ and \w* read on without bound, but \B and (?!\w) read 2 characters past a match, as in
    # a(?:\B|(?!\w)); a{1,63} reads 65 characters from a start. The reach from a start was capped
    # at 64, so these matches were met a character late
    for pattern in (r"a+(?:\B|(?!\w))", r"\w*b(?:\B|(?!\w))", r"a{1,63}(?:\B|(?!\w))", r"\w+(?:\b|x)"):
        how = together(pattern)
        assert how is not None and how.ahead == 2, pattern


def test_an_open_run_that_one_character_leaves_unsettled_is_not_checked_start_by_start(monkeypatch):
    # \w{1,60}(?:\b|(?=x)) over a run of letters: every match near the text's end is undone by a
    # word character other than "x" that follows (\b fails, (?=x) too), so none is final; one search
    # per check tells so (stop_together.undone_by_one). Trying every text that may follow, each
    # start and end of the run was checked through _final after each character instead (~20 times
    # the matcher's time a token over the run). The stop then comes where the run ends
    from lmnb_engine.stop_matcher import StopStringMatcher

    checked_one_by_one = []
    final = StopStringMatcher._final

    def counting(self, *args):
        checked_one_by_one.append(args)
        return final(self, *args)

    monkeypatch.setattr(StopStringMatcher, "_final", counting)
    m, text = StopStringMatcher([], [r"\w{1,60}(?:\b|(?=x))"]), ""
    for _ in range(50):
        checked, text = len(text), text + "abcd"
        assert m.find(text, checked) is None
        assert m.safe_len(text) <= max(0, len(text) - 60)  # (the last 60 letters may begin a stop)
    assert checked_one_by_one == []
    # " " settles \b after the run: the leftmost match that holds, from 140, the 60 letters before it
    assert m.find(text + " ", len(text)) == (140, text[140:])
