"""Stop strings and stop regexes matched across tokens (``lmnb_engine.stop_matcher``), and the bounds on them."""

from __future__ import annotations

import functools
import itertools
import json
import random
import re

import pytest

from lmnb_engine.stop_matcher import StopStringMatcher


@pytest.fixture
def searches(monkeypatch) -> list[tuple[str, str, tuple, float]]:
    """The stop searches of the patterns compiled while the test runs, as they are made: (the
    method, the pattern, the arguments after the text, the ``timeout`` given, in seconds). Only
    the calls given a timeout: those the search budget covers (not the automaton's one-character
    class checks)."""
    import regex

    made, compile_ = [], regex.compile

    class Recorded:
        def __init__(self, rx):
            self._rx = rx

        def __getattr__(self, attr):
            found = getattr(self._rx, attr)
            if not callable(found):
                return found

            def call(text, *args, **kwargs):
                if "timeout" in kwargs:
                    made.append((attr, self._rx.pattern, args, kwargs["timeout"]))
                return found(text, *args, **kwargs)

            return call

    monkeypatch.setattr(regex, "compile", lambda *a, **k: Recorded(compile_(*a, **k)))
    return made


def stream(m: StopStringMatcher, pieces: list[str], ended: bool = False) -> tuple[str, tuple | None, list[str]]:
    """Feed ``pieces`` as the scheduler does: (the text up to the first stop, the stop found or
    None, the text that was safe to show after each piece before it). ``ended``: the output ends
    after them (its max tokens, an EOS), where the scheduler checks once more (``at_end``)."""
    text, checked, shown, hit = "", 0, [], None
    for piece in pieces:
        text += piece
        hit = m.find(text, checked)
        checked = len(text)
        if hit:
            break
        shown.append(text[: m.safe_len(text)])
    if ended and hit is None:
        hit = m.find(text, checked, at_end=True)
    return text, hit, shown


def random_output(rng: random.Random, alphabet: str) -> tuple[str, list[str]]:
    """A random text of 1 to 8 characters of ``alphabet``, and a random split of it into pieces."""
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
    return text, [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]


def assert_stream_stops_at(stops: list[str], regexes: list[str], text: str, pieces: list[str], ended: bool,
                           want: tuple[int, str] | None) -> None:
    """Feed ``text`` split as ``pieces`` and character by character (the output ending after it
    where ``ended``): the matcher meets ``want`` and shows nothing past where it begins."""
    final = text if want is None else text[: want[0]]
    for split in (pieces, list(text)):
        _, hit, shown = stream(StopStringMatcher(stops, regexes), split, ended)
        assert hit == want and all(final.startswith(t) for t in shown), (stops, regexes, split, ended)


def assert_streams_to_the_stop_by_definition(regex_: str, text: str, splits: tuple[list[str], ...]) -> tuple[int, str]:
    """Feed ``text`` to a matcher of ``regex_`` split each way of ``splits``, the output ending
    after it: it stops where a check after each character does (``first_regex_stop_by_definition``),
    showing nothing of the stop before; returns that stop."""
    hit = first_regex_stop_by_definition([regex_], text, ended=True)
    assert hit is not None
    for pieces in splits:
        _, got, shown = stream(StopStringMatcher([], [regex_]), pieces, ended=True)
        assert got == hit, (regex_, pieces)
        assert all(len(s) <= hit[0] for s in shown), (regex_, pieces, shown)  # the stop never shown
    return hit


def test_stop_string_found_across_chunks_and_held_back():
    m = StopStringMatcher(["o w", "STOP", ""])
    text, hit, shown = stream(m, ["Hel", "lo", " w", "orld"])
    assert hit == (4, "o w")
    # "Hello" ends with "o", a prefix of "o w": the "o" was never shown before the match
    assert shown == ["Hel", "Hell"]
    assert text[: hit[0]] == "Hell"


def test_stop_matcher_without_stops_and_first_ending_match():
    assert StopStringMatcher([]).find("anything", 0) is None
    assert StopStringMatcher([]).safe_len("abc") == 3
    m = StopStringMatcher(["cd", "bcd", "x"])
    assert m.find("abcdx", 0) == (2, "cd")  # "cd" and "bcd" both end at "d": the first listed
    assert StopStringMatcher(["bcd", "cd", "x"]).find("abcdx", 0) == (1, "bcd")
    assert m.safe_len("zzb") == 2 and m.safe_len("zbc") == 1 and m.safe_len("zz") == 2


def test_overlapping_stops_in_one_token_end_where_a_character_by_character_check_would():
    # Worked by hand, the text checked in one piece as when one token brings it all:
    # - "ab" ends at index 3 of "xabcd", "bc" at 4: "ab" ends first, whatever the list order
    #   (SGLang, taking its list in order over one token "abc", would stop at "bc": "xa")
    # - "bc" and "abc" both end at 4: the first listed wins, as in SGLang for any tokenization
    # - "c" ends at 4, "abcd" at 5: "c" is met first, though "abcd" starts earlier
    for stops, hit in [(["bc", "ab"], (1, "ab")), (["ab", "bc"], (1, "ab")), (["bc", "abc"], (2, "bc")),
                       (["abc", "bc"], (1, "abc")), (["c", "abcd"], (3, "c")), (["abcd", "c"], (3, "c"))]:
        assert StopStringMatcher(stops).find("xabcd", 0) == hit, stops
        assert stream(StopStringMatcher(stops), list("xabcd"))[1] == hit, stops  # character by character
    # a stop string and a stop regex: the regex's match "EN" ends before "xEND"; at one end, strings first
    assert StopStringMatcher(["xEND"], [r"EN"]).find("xEND!", 0) == (1, "EN")
    assert StopStringMatcher(["END"], [r"N\w"]).find("xEND!", 0) == (1, "END")


def _random_tokenizations(seed: int, patterns: list, alphabet: str, runs: int, ended: bool = False):
    """``runs`` random cases of stop strings (over "ab"), 1-2 of ``patterns`` as stop regexes and a
    text of up to 9 characters of ``alphabet`` split into random pieces: yields ((stops, regexes,
    pieces), the stop met reading the text character by character, the one met reading the pieces),
    ``ended``: the output ending after the text (``stream``)."""
    rng = random.Random(seed)
    for _ in range(runs):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 2))]
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        yield ((stops, regexes, pieces), stream(StopStringMatcher(stops, regexes), list(text), ended)[1],
               stream(StopStringMatcher(stops, regexes), pieces, ended)[1])


def test_a_stop_regex_match_that_reads_the_texts_end_is_met_once_what_follows_settles_it_whatever_the_tokens():
    """An end anchor, a word boundary or a negative lookahead reads the end of the text so far:
    "a$" matches "Wha" but not "What". A check after each character took the end of the text so
    far for the end, and stopped at that "a" (and "\\bEND\\b" at the "END" of "ENDING"); such a
    match is now met only once the next character settles it, or where the output ends there
    (``ended``; language.md), whatever the tokens. Worked by hand."""
    for regex, text, ended, cut in [(r"a$", "What", True, None), (r"a$", "Wha", False, None), (r"a$", "Wha", True, (2, "a")),
                                    (r"a$", "Wha\n", True, (2, "a")), (r"a\b", "island is", True, None),
                                    (r"a\b", "a is", False, (0, "a")), (r"a(?!\w)", "Whatever", True, None),
                                    (r"a(?!\w)", "Wha!", False, (2, "a")), (r"\d\b", "12a", True, None),
                                    (r"\d\b", "12 a", False, (1, "2")), (r"\d\b", "12", False, None),
                                    (r"\d\b", "12", True, (1, "2")), (r"a(?!bc)", "xab", False, None),
                                    (r"a(?!bc)", "xabc", True, None), (r"a(?!bc)", "xabd", False, (1, "a")),
                                    (r"a(?!bc)", "xab", True, (1, "a"))]:
        assert stream(StopStringMatcher([], [regex]), list(text), ended)[1] == cut, (regex, text)  # character by character
        assert stream(StopStringMatcher([], [regex]), [text], ended)[1] == cut, (regex, text)  # one token
        assert first_regex_stop_by_definition([regex], text, "abc !\n", ended) == cut, (regex, text)
    patterns = [r"a$", r"b\b", r"ab?(?!a)", r"\bba", r"(?m)a$", r"a+\B"]
    for ended in (False, True):
        for case, by_char, by_piece in _random_tokenizations(5, patterns, "ab \n", 1000, ended):
            assert by_piece == by_char, case


def test_a_new_users_stop_regexes_stop_where_the_whole_output_matches_and_stream_only_what_stays():
    """A new user's cases, worked by hand against the whole output (Python's re over the final
    text, "$" and "\\b" reading the real next character): each stops where that match is, or
    not at all, whatever the tokens, and what was streamed before is a start of the final text
    (the text before the stop). They stopped at the "END" of "ENDING", inside " Udrin" (at "Ud"),
    at the first space (``\\s+$``) and at "12." of "12.5"."""
    cases = [(r"\bEND\b", ["THE", " ENDING", " END", " here"], False, (11, "END")),
             (r"[A-Z][a-z]+\b", [" U", "dr", "in", " said"], False, (1, "Udrin")),
             (r"\s+$", ["a", " ", " b", " c"], True, None),  # spaces with text after them: no stop
             (r"\s+$", ["a", " ", " b", "  "], True, (4, "  ")),  # trailing ones where the output ends
             (r"\s+$", ["a", " ", " b", "  "], False, None),  # ... not before it ends
             (r"\d+\.$", ["12", ".", "5"], True, None), (r"\d+\.$", ["x 12", "."], True, (2, "12."))]
    for pattern, pieces, ended, want in cases:
        text = "".join(pieces)
        ref = re.search(pattern, text)  # the reference: the whole output, with its real end
        assert (ref and (ref.start(), ref.group())) == want or not ended, (pattern, pieces)
        for split in (pieces, list(text), [text]):
            _, hit, shown = stream(StopStringMatcher([], [pattern]), split, ended)
            assert hit == want, (pattern, split)
            final = text if hit is None else text[: hit[0]]
            assert all(final.startswith(t) for t in shown), (pattern, split, shown)
    # the stop string "\n" and \bEND\b are both met once "\n" comes: the match that ends first wins
    assert stream(StopStringMatcher(["\n"], [r"\bEND\b"]), ["x END", "\n"])[1] == (2, "END")
    assert StopStringMatcher(["y"], [r"x(?=y)"]).find("axy", 0) == (1, "x")


def test_an_unbounded_stop_regex_reading_the_texts_end_stops_at_the_earliest_start_a_final_match_has():
    """An unbounded repeat before a negative lookahead ("x[ab]*(?!c)|a"): on "xa" the match "xa"
    from 0 may still be undone ("c" next) but "x" from 0 is final ("a" follows it), so the stop
    starts at 0, as Python's re over the final text says. Only the ends within the pattern's reach
    were tried for a shorter final match, none where it was unbounded, so the later start's "a"
    won and the text before it, "x", part of re's match, was streamed (and "a\\w*(?! )|b" on
    "ab c" stopped at "b"). Against re's start and the brute-force reference, whatever the tokens."""
    for pattern, text in [(r"x[ab]*(?!c)|a", "xa "), (r"x[ab]*(?!c)|a", "xaaa "), (r"a\w*(?! )|b", "ab c"),
                          (r"\d+(?!\.)", "1234567 "), (r"[ab]+(?! )", "bb\n")]:
        want = first_regex_stop_by_definition([pattern], text, ended=True)
        assert want[0] == re.search(pattern, text).start(), pattern  # re over the final text: its start
        for split in (list(text), [text]):
            _, hit, shown = stream(StopStringMatcher([], [pattern]), split, ended=True)
            assert hit == want and all(len(t) <= want[0] for t in shown), (pattern, split)
    patterns = [r"x[ab]*(?!c)|a", r"a\w*(?! )|b", r"b[a ]*\b|a", r"a+(?!b)|b", r"(?:a|b)+$|b", r"x[ab]*\b|b"]
    rng = random.Random(11)
    for _ in range(400):
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text, pieces = random_output(rng, "abx \n")
        for ended in (False, True):
            assert_stream_stops_at([], regexes, text, pieces, ended, first_regex_stop_by_definition(regexes, text, "abxc \n", ended))


def test_a_negative_lookahead_opening_with_a_lookbehind_is_settled_by_the_text_it_reads():
    """a\\w*(?!(?<=a)\\w) on "b\\n  bab": the match "ab" from 5 reads no "a" before the text's end,
    so (?<=a) fails and the lookahead holds whatever comes: a stop once "b" comes, where a check
    after each character (the brute-force reference) meets it. It was met only where the output
    ended or one more character came (the regex package's partial match from the text's end says
    partial without reading the lookbehind: "(?<=a)\\w" from the end of "ab"). Whatever the tokens,
    for it and random texts of patterns with such lookaheads."""
    pattern, pieces = r"a\w*(?!(?<=a)\w)", ["b\n  ba", "b"]
    text = "".join(pieces)
    assert first_regex_stop_by_definition([pattern], text) == (5, "ab")
    assert_stream_stops_at([], [pattern], text, pieces, False, (5, "ab"))
    # (so too a shorter match from the same start was taken for the final one: "b", not "ba", of
    # [ab]+(?!(?<=b) ) on "xba", where the regex package's match from 1 is "ba")
    assert first_regex_stop_by_definition([r"[ab]+(?!(?<=b) )"], "xba") == (1, "ba")
    assert_stream_stops_at([], [r"[ab]+(?!(?<=b) )"], "xba", ["x", "b", "a"], False, (1, "ba"))
    patterns = [r"a\w*(?!(?<=a)\w)", r"b[ab]*(?!(?<!a) )", r"x(?!(?<=x)a)", r"[ab]+(?!(?<=b)a)|x"]
    rng = random.Random(32)
    for _ in range(300):
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text, pieces = random_output(rng, "abx \n")
        for ended in (False, True):
            assert_stream_stops_at([], regexes, text, pieces, ended,
                                   first_regex_stop_by_definition(regexes, text, "abx \n", ended))


def test_a_lookahead_reading_to_the_texts_end_is_settled_as_language_md_says():
    """docs/language.md's stop_regex rules for a lookahead that reads to the text's end, worked by
    hand. a(?=[ab]*(?!b)): its "a" is a match whatever follows ([ab]* takes every "b"), but the
    (?!b) the lookahead reaches at the end of "abbb" is read on its own, so the match is held there
    and met once "c" comes or the output ends; over "aba" the (?!b) before the second "a" settles it. Patterns these checks do not rewrite: (?x: a )\\b is
    settled two characters past its match, (?w)a(?!b), whose lookahead's reach is not known under
    (?w), only where the output ends."""
    def hit(pattern: str, text: str, ended: bool = False) -> tuple[int, str] | None:
        return stream(StopStringMatcher([], [pattern]), list(text), ended)[1]

    assert hit(r"a(?=[ab]*(?!b))", "abbb") is None
    assert hit(r"a(?=[ab]*(?!b))", "abbb", ended=True) == (0, "a")
    assert hit(r"a(?=[ab]*(?!b))", "abc") == (0, "a")
    # (over "aba" the repeat may stop before the second "a", which settles (?!b): met there)
    assert hit(r"a(?=[ab]*(?!b))", "ab") is None
    assert hit(r"a(?=[ab]*(?!b))", "aba") == (0, "a")
    assert hit(r"(?x: a )\b", "a ") is None
    assert hit(r"(?x: a )\b", "a c") == (0, "a")
    assert hit(r"(?w)a(?!b)", "a c d") is None
    assert hit(r"(?w)a(?!b)", "a c d", ended=True) == (0, "a")


def test_a_stop_regex_match_that_a_later_alternative_makes_final_is_met_with_its_last_character():
    """\\w(?!a)|x on "x": the second alternative's "x" is a match whatever follows, but the first
    one's (?!a), read at the text's end, may still be undone, and the regex package's partial match
    took that way and hid the other: the stop was met one character later, or where the output
    ended. Now every way to the match's end is tried: it is met with the "x" itself. Worked by
    hand: whatever comes next, Python's re over the final text matches there (and so does the
    brute-force check after each character)."""
    for pattern, text, want in [(r"\w(?!a)|x", "x", (0, "x")), (r"a\b|a", "a", (0, "a")),
                                (r"\d+(?!\.)|\d", "1", (0, "1")), (r"[ab]\B|(?:x|b)", "yb", (1, "b"))]:
        for after in ("", "a", " ", ".5", "ab"):
            ref = re.search(pattern, text + after)
            assert (ref.start(), ref.group()) == want, (pattern, after)
        assert first_regex_stop_by_definition([pattern], text) == want, pattern
        assert StopStringMatcher([], [pattern]).find(text, 0) == want, pattern  # one token
        assert stream(StopStringMatcher([], [pattern]), list(text))[1] == want, pattern  # character by character


def test_an_empty_stop_regex_match_that_an_alternative_makes_final_is_met_with_the_character_it_reads():
    """a(?!\\w)|(?=a) on " a": the empty match at 1, from (?=a), holds whatever follows, but the
    regex package's match there, "a", reads on with (?!\\w); of the shorter matches from that start
    the empty one was never tried, so the stop was met one character later, as "a", or, where a
    word character came next (" abbb"), not at all until the output ended. So too \\b(?:a(?!a))*
    on "a" (\\b then no repeat, at 0). Worked by hand: the text read so far holds what each empty
    match's assertions read (the "a" (?=a) and \\b read), so no text after it can undo it;
    Python's re over the final text starts its match there whatever follows, and the brute-force
    check after each character meets the empty match."""
    for pattern, text, want in [(r"a(?!\w)|(?=a)", " a", (1, "")), (r"\b(?:a(?!a))*", "a", (0, ""))]:
        for after in ("", "a", " ", "b", "bbb"):
            assert re.search(pattern, text + after).start() == want[0], (pattern, after)
            assert first_regex_stop_by_definition([pattern], text + after) == want, (pattern, after)
            assert_stream_stops_at([], [pattern], text + after, [text, after] if after else [text], False, want)


def first_stop_with_a_regex_by_definition(stops: list[str], regex_: str, text: str, ended: bool = False) -> tuple[int, str] | None:
    """The stop a check after each character meets among ``stops`` and one stop regex, by brute
    force: at the first prefix ``text[:k]`` where a stop string ends or the regex has a match no
    text after it can undo (``first_regex_stop_by_definition``), the one that ends first, a stop
    string before the regex at one end; where none is and the output ends with ``text``
    (``ended``), the regex's leftmost match in ``text`` (Python's re over the final text)."""
    for k in range(1, len(text) + 1):
        cands = [(k, rank, k - len(s), s) for rank, s in enumerate(stops) if text[:k].endswith(s)]
        if (hit := first_regex_stop_by_definition([regex_], text[:k], "ab \n")) is not None:
            cands.append((hit[0] + len(hit[1]), len(stops), *hit))
        if cands:
            return min(cands)[2:]
    m = re.search(regex_, text) if ended else None
    return m and (m.start(), m.group())


def test_a_multiline_end_anchor_before_a_newline_is_settled_by_that_newline():
    """In multiline mode "$" holds before any newline, so "(?m)\\.$" on "Done.\\n" matches "." whatever
    follows the newline: a stop once the newline comes. It was read as outside that mode, where "$"
    before a newline holds only if that newline ends the text, and waited for one more character:
    with the stop string "\\n" too, the newline was met first and the request stopped at it, showing
    "Done." (Python's re over the final text "Done.\\nNext" matches "." at 4). Without the flag the
    anchor still waits. Against re and the brute-force reference, whatever the tokens."""
    for stops, pattern, text, ended, want in [(["\n"], r"(?m)\.$", "Done.\nNext", False, (4, ".")),
                                              ([], r"(?m)a$", "xa\n", False, (1, "a")),
                                              ([], r"(?m)a$", "xa", False, None), ([], r"(?m)a$", "xab", True, None),
                                              (["\n"], r"\.$", "Done.\nNext", False, (5, "\n"))]:
        assert first_stop_with_a_regex_by_definition(stops, pattern, text, ended) == want, (pattern, text)
        if want is not None and want[1] != "\n":
            assert re.search(pattern, text).start() == want[0], pattern  # re over the final text
        for split in (list(text), [text], [text[:4], text[4:]]):
            _, hit, shown = stream(StopStringMatcher(stops, [pattern]), split, ended)
            assert hit == want and all(len(t) <= (want or (len(text),))[0] for t in shown), (pattern, split)
    patterns = [r"(?m)a$", r"(?m)\n$", r"(?m)^b|a$", r"a\w*(?! )|b", r"a$", r"(?m)b\b$"]
    rng = random.Random(13)
    for _ in range(400):
        stops = rng.sample(["\n", "b", "a\n", " "], rng.randint(0, 2))
        pattern = rng.choice(patterns)
        text, pieces = random_output(rng, "ab \n")
        for ended in (False, True):
            want = first_stop_with_a_regex_by_definition(stops, pattern, text, ended)
            assert_stream_stops_at(stops, [pattern], text, pieces, ended, want)


def test_a_stop_regex_reading_the_texts_end_open_from_every_start_of_a_long_run_stops_where_it_ends():
    """"\\w+\\b" over a run of 600 letters has a match from every start, none final until a
    non-letter comes: the run stops at the space, where Python's re over the final text matches,
    and shows nothing before. (Each start was tried after each token, and past ~600 to 900 characters the
    search ran over its 50 ms budget and the request was aborted; now one search says no match ends
    whole near the text's end. That cost is timed in benches/, not here: this test keeps the
    file's raised budget, as a loaded machine may take longer.)"""
    for pattern in [r"\w+\b", r"(?m)\w+$"]:
        text = "a" * 600 + "\n b"
        m = StopStringMatcher([], [pattern])
        _, hit, shown = stream(m, [text[i:i + 4] for i in range(0, len(text), 4)])
        ref = re.search(pattern, text)
        assert m.problem is None and hit == (ref.start(), ref.group()), pattern
        assert all(t == "" for t in shown), pattern


class Counted:
    """A compiled regex of a stop regex's (its window, its partial form) whose searches are counted
    (``searches``)."""

    def __init__(self, rx):
        self.rx, self.searches = rx, 0

    def search(self, *args, **kwargs):
        self.searches += 1
        return self.rx.search(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.rx, name)


def test_a_stop_regex_ending_in_assertions_open_over_a_long_run_is_not_window_searched_from_every_start():
    """\\w+\\b over a run of letters: whether a match near the text's end is final was told by one
    search of the pattern's window after each character, which read every start of the run to its
    end (a cost growing with the square of the run: past the 50 ms budget at ~1000 to 2000
    letters, the request aborted; timed in benches/, not here). The pattern's matches all end in
    its assertions, so those alone are searched first over the places a match may end; none
    holds inside the run, and the window is searched only at the run's start. So too the search of
    the pattern itself for where the earliest match begins (once a token), which read every start
    to the run's end where none matched (x\\w*(?<=ING)\\b). The stop, once a non-letter comes, is
    where Python's re over the final text matches, nothing shown before."""
    from lmnb_engine import stop_matcher

    for pattern in [r"\w+\b", r"(?m)\w+$", r"[a-z]+\b(?!-)", r"a\w*(?!\w)", r"(?i)x\w*(?<=ING)\b"]:
        shared = stop_matcher.StopRegexes([pattern])
        shared.windows[0] = counted = Counted(shared.windows[0])
        shared.compiled[0] = whole = Counted(shared.compiled[0])
        run = "x" + "ab" * 300
        _, hit, shown = stream(StopStringMatcher([], shared), [run[i:i + 4] for i in range(0, len(run), 4)])
        # (searched only while the run's start, a word boundary, is among the last places)
        assert hit is None and all(len(t) <= 1 for t in shown) and counted.searches <= 3, (pattern, counted.searches)
        if "(?<=" in pattern:  # (where a match may begin, for the stream: none, as (?<=ING)\b holds nowhere)
            assert whole.searches == 0, whole.searches
        text = run + "ing\n b"
        ref = re.search(pattern, text)
        _, hit, shown = stream(StopStringMatcher([], [pattern]), [text[i:i + 4] for i in range(0, len(text), 4)])
        assert hit == (ref.start(), ref.group()) and all(len(t) <= ref.start() for t in shown), pattern


class CountedScans(Counted):
    """A ``Counted`` whose scans from every start (``finditer``, ``StopStringMatcher.find``'s search
    for a new match) count as searches too."""

    def finditer(self, *args, **kwargs):
        self.searches += 1
        return self.rx.finditer(*args, **kwargs)


def test_a_stop_regex_ending_in_a_lookahead_open_over_a_long_run_is_not_searched_from_every_start():
    """a[^c]*(?=c) over a run of "a": a match may begin at every "a" and none holds until a "c"
    comes. Its automaton with the assertions left out (a[^c]*) matched at once, so each token's
    check searched the pattern from every start of the run, each to the text's end (time growing
    with the square of the run, per token: 88 ms a token at 1600 letters; benches/
    bench_stop_regex.py --run). That automaton reads a lookahead ending the pattern as its text
    consumed (a[^c]*c), which no text of "a"s holds: the pattern is not searched at all until a
    "c" comes, and then stops where Python's re over the final text matches, nothing shown before."""
    from lmnb_engine import stop_matcher

    for pattern in [r"a[^c]*(?=c)", r"(?:x|a[^c]*(?=c))", r"(?i)A\w*(?=C)"]:
        shared = stop_matcher.StopRegexes([pattern])
        shared.compiled[0] = whole = CountedScans(shared.compiled[0])
        run = "a" * 600
        _, hit, shown = stream(StopStringMatcher([], shared), [run[i:i + 4] for i in range(0, len(run), 4)])
        assert hit is None and whole.searches == 0 and all(t == "" for t in shown), (pattern, whole.searches)
        text = run + "c b"
        ref = re.search(pattern, text)
        _, hit, shown = stream(StopStringMatcher([], [pattern]), [text[i:i + 4] for i in range(0, len(text), 4)])
        assert hit == (ref.start(), ref.group()) and all(t == "" for t in shown), pattern


def _random_tail_pattern(rng: random.Random) -> str:
    """A stop regex whose top level is a sequence ending in 1 or 2 assertions (StopRegexes.tails)."""
    head = "".join(rng.choice(["a", "b", "x", "[ab]", r"\w", ".", " ", "(?:a|b )", "a*", r"\w+", "[ab]+?", "x?",
                               r"\b", "(?!a)", "(?<=b)", "(?:a|b)"]) for _ in range(rng.randint(1, 3)))
    ends = [r"\b", r"\B", "$", "(?!a)", "(?!ab)", r"(?!\w)", "(?! )", "(?=a)", "(?<=a)", "(?<!b)", "(?=[ab]*(?!b))",
            r"(?!a\b)", r"(?=\w\b)"]
    flags = rng.choice(["", "", "(?m)", "(?i)", "(?s)"])
    return flags + head + "".join(rng.choice(ends) for _ in range(rng.randint(1, 2)))


def _refused_or_unread(pattern: str) -> bool:
    """Whether the regex package cannot read ``pattern`` or it matches the empty string, which
    SamplingParams refuses: a random pattern so is left out."""
    import regex

    try:
        return regex.search(pattern, "") is not None
    except regex.error:
        return True


def _assert_streams_alike(pattern: str, shared, without, text: str, pieces: list[str], ended: bool) -> None:
    """The matcher on ``shared`` (a ``StopRegexes``) stops and streams as on ``without`` (the same,
    a search left out), over ``pieces`` and over ``text`` a character at a time."""
    for split in (pieces, list(text)):
        assert (stream(StopStringMatcher([], shared), split, ended)
                == stream(StopStringMatcher([], without), split, ended)), (pattern, split, ended)


def test_a_stop_regex_ending_in_assertions_stops_as_its_window_search_alone_says_for_random_patterns():
    """The search of a pattern's ending assertions alone (StopRegexes.tails) says "no match ends
    here" only where its window search (or its own search, for the form as written) says so too,
    and the matcher stops and streams exactly as without it, whatever the tokens: random patterns
    ending in assertions, random texts split at random, the output ending or not, against the matcher with those searches left out."""
    from lmnb_engine.stop_matcher import StopRegexes

    rng = random.Random(33)
    checked = 0
    for _ in range(600):
        pattern = _random_tail_pattern(rng)
        if _refused_or_unread(pattern):
            continue
        shared = StopRegexes([pattern])
        tail, window, after = shared.tails[0], shared.windows[0], shared.assertion_reach[0]
        text, pieces = random_output(rng, "abx \n")
        if tail is not None:
            checked += 1
            for floor, end in itertools.combinations(range(len(text) + 1), 2):
                if tail.window.search(text, max(floor, end - after), end) is None:
                    assert window.search(text, floor, end) is None, (pattern, text, floor, end)
                if tail.plain.search(text, floor, end) is None:
                    assert shared.compiled[0].search(text, floor, end) is None, (pattern, text, floor, end)
        without = StopRegexes([pattern])
        without.tails = [None]
        for ended in (False, True):
            _assert_streams_alike(pattern, shared, without, text, pieces, ended)
    assert checked > 200  # (most random patterns get a tail search)


def test_a_stop_regex_of_alternatives_one_ending_in_assertions_is_not_window_searched_from_every_start():
    """\\w+\\b|x over a run of letters: its window (the relaxed pattern, ending near the text's end)
    was searched after each character, reading every start of the run to its end, as \\w+\\b's was
    before it was checked by its ending assertions first (a cost growing with the square of the run:
    ~172 ms a token at 1000 letters; timed in benches/, not here): the top-level "|" kept the
    pattern from that check. Now each alternative is searched alone (StopRegexes.branches), \\w+\\b
    by its \\b first, x by its own window, which does not read the run. The searches that may read
    the run from a start (the pattern's window and \\w+\\b's) are counted: 601 before, at most 3 now.
    The stop, once a non-letter or an "x" comes, is where Python's re over the final text matches,
    nothing shown before."""
    from lmnb_engine import stop_matcher

    for pattern, end in [(r"\w+\b|x", "ing\n b"), (r"x|[a-z]+\b(?!-)", "ing-x")]:
        shared = stop_matcher.StopRegexes([pattern])
        counted = [Counted(shared.windows[0])]
        shared.windows[0] = counted[0]
        if shared.branches[0] is not None:  # (the alternative that may read the run: its window counted)
            counted += [Counted(b.window) for b in shared.branches[0] if b.tail is not None]
            shared.branches[0] = tuple(b._replace(window=counted[-1]) if b.tail is not None else b
                                       for b in shared.branches[0])
        run = "y" + "ab" * 300
        _, hit, shown = stream(StopStringMatcher([], shared), [run[i:i + 4] for i in range(0, len(run), 4)])
        searches = sum(c.searches for c in counted)
        assert hit is None and all(len(t) <= 1 for t in shown) and searches <= 3, (pattern, searches)
        text = run + end
        ref = re.search(pattern, text)
        _, hit, shown = stream(StopStringMatcher([], [pattern]), [text[i:i + 4] for i in range(0, len(text), 4)])
        assert hit == (ref.start(), ref.group()) and all(len(t) <= ref.start() for t in shown), pattern


def test_a_stop_regex_of_alternatives_stops_as_its_window_search_says_for_random_patterns():
    """Each top-level alternative searched alone (StopRegexes.branches: its ending assertions
    first where it has them, then its window) finds a match near the text's end exactly where the
    pattern's window does, and the earliest start of theirs is the pattern's leftmost match's; the
    matcher stops and streams exactly as without them, whatever the tokens and min_new_tokens:
    random alternatives, some ending in assertions, over random texts and floors."""
    from lmnb_engine.stop_matcher import StopRegexes

    rng = random.Random(34)
    plain = ["x", "ab", " b", r"\w\w", "[ab]x", "b(?=a)", r"\bx", "a(?!b)", "(?<=a)b", "x$"]
    checked = 0
    for _ in range(300):
        alternatives = [_random_tail_pattern(rng) if rng.random() < 0.5 else rng.choice(plain)
                        for _ in range(rng.randint(2, 3))]
        pattern = rng.choice(["", "", "(?m)", "(?i)"]) + "|".join(re.sub(r"^(?:\(\?[mis]\))+", "", a)
                                                                  for a in alternatives)
        if _refused_or_unread(pattern):
            continue
        shared = StopRegexes([pattern])
        parts, window, after = shared.branches[0], shared.windows[0], shared.assertion_reach[0]
        text, pieces = random_output(rng, "abx \n")
        if parts is not None:
            checked += 1
            for floor, end in itertools.combinations_with_replacement(range(len(text) + 1), 2):
                found = any((b.tail is None or b.tail.window.search(text, max(floor, end - after), end) is not None)
                            and b.window.search(text, floor, end) is not None for b in parts)
                assert found == (window.search(text, floor, end) is not None), (pattern, text, floor, end)
                starts = [m.start() for b in parts if (m := b.plain.search(text, floor, end)) is not None]
                m = shared.compiled[0].search(text, floor, end)
                assert (min(starts) if starts else None) == (m and m.start()), (pattern, text, floor, end)
        without = StopRegexes([pattern])
        without.branches = [None]
        for ended in (False, True):
            _assert_streams_alike(pattern, shared, without, text, pieces, ended)
            unchecked = rng.randint(0, len(pieces))
            assert (feed_unchecked(StopStringMatcher([], shared), pieces, unchecked, ended)
                    == feed_unchecked(StopStringMatcher([], without), pieces, unchecked, ended)), (pattern, pieces)
    assert checked > 100  # (most random patterns are split)


def test_where_a_match_may_begin_at_the_floor_safe_len_reads_that_start_alone_not_every_later_one():
    """\\w+\\b over a run of letters: a match may begin at the run's start (it ends at a non-letter,
    none yet), so nothing is shown. safe_len's partial search said so only after trying every later
    start for a whole match, each to the text's end (the regex package prefers a whole match to a
    partial one before it), a cost growing with the square of the run (timed in benches/, not here);
    now a partial match from the floor itself ends it, with no search. What is shown and found is
    as before: nothing of the run, the stop (once a newline ends the run) where Python's re over
    the final text matches."""
    from lmnb_engine import stop_matcher

    for pattern in [r"\w+\b", r"(?m)\w+$", r"[a-z]+\b(?!-)"]:
        shared = stop_matcher.StopRegexes([pattern])
        shared.partial[0] = counted = Counted(shared.partial[0])
        run = "ab" * 100
        _, hit, shown = stream(StopStringMatcher([], shared), [run[i:i + 4] for i in range(0, len(run), 4)])
        assert hit is None and all(t == "" for t in shown) and counted.searches == 0, (pattern, counted.searches)
        text = run + "\n b"
        ref = re.search(pattern, text)
        _, hit, shown = stream(StopStringMatcher([], [pattern]), [text[i:i + 4] for i in range(0, len(text), 4)])
        assert hit == (ref.start(), ref.group()) and all(t == "" for t in shown), pattern


def test_a_stop_regex_ending_in_a_one_character_negative_lookahead_is_not_checked_start_by_start_over_a_long_run(
        monkeypatch):
    """a\\w*(?!\\w) over a run of letters has a match from every start of the run, none final until
    a non-letter comes (\\w may follow). The window search that says so for \\w+\\b (6f8484b) held a
    whole match here (its relaxed (?!\\w) holds at the text's end), so each start was checked on
    its own after each token (_final), a cost growing with the run: given up at ~850 letters, its
    request aborted. Now the window asks for a character after such a lookahead and finds none:
    no start is checked in the run. The stop is where Python's re over the final text matches,
    nothing shown before, for it and one more with a negative lookahead of one character."""
    from lmnb_engine import stop_matcher

    checks = []
    final = stop_matcher.StopStringMatcher._final
    monkeypatch.setattr(stop_matcher.StopStringMatcher, "_final", lambda *args: checks.append(1) or final(*args))
    for pattern in [r"a\w*(?!\w)", r"x[ab]*(?![ab])|c"]:
        run = "x" + "ab" * 150
        pieces = [run[i:i + 4] for i in range(0, len(run), 4)]
        m, checks[:] = StopStringMatcher([], [pattern]), []
        _, hit, shown = stream(m, pieces)
        assert hit is None and checks == [] and all(len(t) <= 1 for t in shown), pattern
        _, hit, shown = stream(StopStringMatcher([], [pattern]), pieces + [" b"])
        ref = re.search(pattern, run + " b")
        assert hit == (ref.start(), ref.group()) and all(len(t) <= ref.start() for t in shown), pattern


def test_a_stop_regex_whose_every_match_ends_at_the_texts_end_stops_at_the_outputs_end_over_a_long_output():
    """A pattern whose match from every start stays open until the output ends (.+\\Z, [\\s\\S]+$:
    each ends in an assertion of the text's end, which any character more undoes) was searched
    from every start after each character: past ~1000 characters the search ran past its 50 ms
    budget and the request was aborted for backtracking. Over ~3000 characters it stops where
    Python's re over the whole output finds the match, the output ending there, whatever the
    tokens, with nothing of the match streamed before. (The cost is timed in bench_stop_regex
    --fallback, not here: this test keeps the file's raised budget.)"""
    rng = random.Random(3)
    words = [" the", " cat", " sat", ",", ".", " 42", "!", " on", " mat"]
    pieces = [rng.choice(words) for _ in range(900)]
    pieces[500] = "\n"  # (.+\Z matches the last line only)
    for pattern in [r".+\Z", r"[\s\S]+$", r"\w[\s\S]*\Z", r"\d[^\n]*\Z"]:
        text = "".join(pieces)
        ref = re.search(pattern, text)  # the reference: the whole output, with its real end
        m = StopStringMatcher([], [pattern])
        _, hit, shown = stream(m, pieces, ended=True)
        assert m.problem is None and hit == (ref.start(), ref.group()), pattern
        assert all(text[: ref.start()].startswith(t) for t in shown), pattern
        assert stream(StopStringMatcher([], [pattern]), pieces)[1] is None, pattern  # (not before the end)
    # such patterns on short texts, against the brute-force reference, the output ending or not
    patterns = [r"a+$", r"[ab]b?\Z", r"(?:ab|b)\Z", r"a[\s\S]*$", r"b.\Z", r"\ba\w*$", r"(?:a|b\n)$"]
    rng = random.Random(7)
    for _ in range(150):
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text, pieces = random_output(rng, "ab \n")
        for ended in (False, True):
            assert_stream_stops_at([], regexes, text, pieces, ended, first_regex_stop_by_definition(regexes, text, "ab \n", ended))


def test_a_bounded_verbose_stop_regex_stops_where_its_non_verbose_twin_does():
    """A verbose pattern (?x) had no known reach (regex_reach read no verbose pattern) and was not
    relaxed (stop_relaxed.relax read none), so a match reading past its end was final only where
    the output ended: (?x) a (?!b) over "a c d" did not stop at "a c", where a(?!b) does. Python's
    parser reads (?x) as the regex package does, but for a space other than " \\t\\n\\r\\v\\f" (the
    regex package skips "\\xa0", Python's parser keeps it) and an escaped newline (a "#" comment
    goes on past it in Python's parser only): those are left unread. Over random streams, ended or
    not, each verbose pattern (a "#" comment, one ending the pattern with no newline after it too,
    which the reference's _ending_at closed inside the comment, a space in a class [ ], verbose in
    a group only or but in a group, which relax leaves unread and the reach settles) stops where the brute-force
    reference says and where its non-verbose twin does (with the reach alone, (?x) \\b a [b ]{1,2}
    (?!a) over "abb" met "abb" a character late, not the final "ab" that the relaxed form finds)."""
    from lmnb_engine.regex_reach import assertion_reach, reach

    assert stream(StopStringMatcher([], [r"(?x) a (?!b)"]), list("a c d"))[1] == (0, "a")  # (None before)
    twins = [(r"(?x) a (?!b)", r"a(?!b)"),
             ("(?x) a [ ] b \\b  # a, a space, b (\\b: then no letter)\n", r"a[ ]b\b"),
             ("(?x) \\b a # an a, then (one or two of b and a space) $\n [b ]{1,2} (?!a)", r"\ba[b ]{1,2}(?!a)"),
             (r"(?x) (?<= \s) a b? (?= [ ]c | $ )", r"(?<=\s)ab?(?=[ ]c|$)"),
             (r"(?x: a \s )b (?!\ a)", r"a\sb (?! a)"),  # (verbose in its group only)
             (r"(?x) a (?-x:b c) (?!a)", r"ab c(?!a)"),
             (r"(?x) a b? (?!a)  # ends in a comment, no newline after it", r"ab?(?!a)")]
    for verbose, twin in twins:  # (the reach and the assertions' reach are the twin's, which reads alike)
        assert (reach(verbose), assertion_reach(verbose)) == (reach(twin), assertion_reach(twin)) != (None, None), verbose
    assert reach("(?x)a\xa0b") is None and reach("(?x)a#\\\nb") is None  # (read otherwise by the two parsers)
    rng = random.Random(17)
    for _ in range(150):
        verbose, twin = rng.choice(twins)
        text, pieces = random_output(rng, "ab c")
        for ended in (False, True):
            want = first_regex_stop_by_definition([verbose], text, "ab c", ended)
            assert want == first_regex_stop_by_definition([twin], text, "ab c", ended), (verbose, text)
            assert_stream_stops_at([], [verbose], text, pieces, ended, want)
            assert_stream_stops_at([], [twin], text, pieces, ended, want)


def test_a_greedy_stop_regex_is_met_where_its_first_match_ends_not_where_its_longest_does():
    # Worked by hand: on "x 123" read character by character, r"\d+" matches once "x 1" is read
    # (its match "1" ends at 3) and "2" only ends at 4, so the text is cut at 2, before the
    # number. The regex's greedy match over the whole token, "123", ends at 5: ranked by that end,
    # "2" won and the cut fell at 3 ("x 1"), a cut no tokenization of the text gives one by one.
    for stops, regexes, text, cut in [(["2"], [r"\d+"], "x 123", 2), (["q"], [r"a.*z"], " a z q z", 1)]:
        assert stream(StopStringMatcher(stops, regexes), list(text))[1][0] == cut  # character by character
        assert StopStringMatcher(stops, regexes).find(text, 0)[0] == cut, (stops, regexes)
        assert stream(StopStringMatcher(stops, regexes), [text[:2], text[2:]])[1][0] == cut
    # random stops, regexes (none reading past its match's end) and tokenizations: the cut is the
    # one a check after each character gives (this found 24 splits that moved it)
    patterns = [r"a+", r"ab+", r"b[ab]*a", r"(ab|b)", r"a.b", r"ba?"]
    for case, by_char, by_piece in _random_tokenizations(3, patterns, "abc", 3000):
        assert (by_piece and by_piece[0]) == (by_char and by_char[0]), case
    # a match of no characters (a lookbehind) is met where it stands, at the end of the text read
    assert stream(StopStringMatcher([], [r"(?<=b)"]), ["a", "b"])[1] == (2, "")


def test_a_stop_regex_is_cut_at_the_match_a_check_after_each_character_meets():
    # Worked by hand: r"ab*c|b" on "xabbc" read character by character holds no match after "xa",
    # and after "xab" the match "b" at 2 (the branch "ab*c" waits for its "c"): cut at 2, "b".
    # Over the whole text the leftmost match is "abbc" at 1: one token "xabbc" was cut at 1.
    # Likewise r"\d+" on "x 123" is met as "1", whatever "23" the token brings after it.
    for regex, text, hit in [(r"ab*c|b", "xabbc", (2, "b")), (r"\d+", "x 123", (2, "1"))]:
        for pieces in ([text], list(text), [text[:2], text[2:]], [text[:3], text[3:]]):
            assert stream(StopStringMatcher([], [regex]), pieces)[1] == hit, pieces
    from lmnb.ir import GenParams  # API speculative execution cuts the whole text by the same rule

    assert GenParams(stop_regex=r"ab*c|b").first_stop_match("xabbc") == (2, "b")
    # random regexes whose leftmost match over all of the text is not the one met first, and
    # random tokenizations: the stop (cut and matched text) is the one met character by character
    rng = random.Random(5)
    patterns = [r"ab*c|b", r"a[ab]*c|ba", r"\d+", r"a+b|a"]
    for _ in range(2000):
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text = "".join(rng.choice("abc1") for _ in range(rng.randint(1, 9)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        by_char = stream(StopStringMatcher([], regexes), list(text))[1]
        assert stream(StopStringMatcher([], regexes), pieces)[1] == by_char, (regexes, pieces)


def first_stop_by_definition(stops: list[str], text: str) -> tuple[int, str] | None:
    """The stop a check after each character finds first: the earliest end at which any stop
    ends, and there the first in the list."""
    for end in range(1, len(text) + 1):
        for s in stops:
            if text[:end].endswith(s):
                return end - len(s), s
    return None


def test_the_stop_found_does_not_depend_on_how_the_text_is_split_into_tokens():
    rng = random.Random(1)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 10)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, max(0, len(text) - 1)))) if len(text) > 1 else []
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        assert stream(StopStringMatcher(stops), pieces)[1] == first_stop_by_definition(stops, text), (stops, pieces)



def held_back_by_definition(stops: list[str], text: str) -> int:
    """safe_len's stop-string rule as its docstring states it, checked suffix by suffix: the text
    minus its longest suffix (shorter than the longest stop) that begins some stop."""
    longest = max(map(len, stops))
    return next((len(text) - k for k in range(min(longest - 1, len(text)), 0, -1)
                 if any(s.startswith(text[-k:]) for s in stops)), len(text))


def test_safe_len_agrees_with_the_suffix_rule_on_growing_and_rewritten_texts():
    # the automaton reads each text from where the last one ended; a text that does not extend
    # the last (a detokenizer's rewrite, a test's jump) is read again from its start
    rng = random.Random(0)
    for _ in range(2000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        m, text = StopStringMatcher(stops), ""
        for _ in range(12):
            if rng.random() < 0.15:
                text = text[: rng.randint(0, len(text))]
            text += "".join(rng.choice("abc") for _ in range(rng.randint(0, 3)))
            assert m.safe_len(text) == held_back_by_definition(stops, text), (stops, text)

def test_a_stop_ending_before_the_new_text_is_not_found_again():
    # a short stop was looked for as far back as the longest one: "\n" ending before the new
    # text ("xyz") was found there, after min_new_tokens had let it through
    m = StopStringMatcher(["\n", "</s>"])
    assert m.find("ab\nxyz", 4) is None
    assert m.find("ab\nxyz", 3) is None and m.find("ab\nxyz", 2) == (2, "\n")  # it is the new text's first character
    assert m.find("ab</s", 3) is None and m.find("ab</s>", 5) == (2, "</s>")  # a long one across the boundary


def test_stop_regex_found_across_chunks_with_what_may_match_held_back():
    # SGLang's stop_regex: the first match in the output ends it; text that could still begin a
    # match is not streamed ("Answer: 4" may become "Answer: 42.")
    m = StopStringMatcher([], [r"\d+\.", r"END"])
    _, hit, shown = stream(m, ["Answer", ": 4", "2", ".", " more"])
    assert hit == (8, "42.")
    assert shown == ["Answer", "Answer: ", "Answer: "]  # "4" and "42" may begin a match
    assert m.find("x END 1.", 0) == (2, "END")  # the earliest of the stops
    assert m.find("1. later", 2) is None  # a match ending in checked text was let through (min_new_tokens)
    assert m.safe_len("1. and 3") == 7  # ... and does not hold back the text after it
    both = StopStringMatcher(["</s"], [r"[A-Z]{3}"])
    assert both.find("ab</s XYZ", 0) == (2, "</s") and both.safe_len("ab</") == 2 and both.safe_len("abXY") == 2


def feed_unchecked(m: StopStringMatcher, pieces: list[str], unchecked: int,
                   ended: bool = False) -> tuple[tuple | None, int]:
    """Feed ``pieces`` as the scheduler does with ``min_new_tokens=unchecked`` (one piece a token):
    (the stop found or None, the most text shown before it). ``ended``: the output ends after
    them (``stream``)."""
    text, checked, shown, hit = "", 0, 0, None
    for k, piece in enumerate(pieces, 1):
        text += piece
        if k >= unchecked and (hit := m.find(text, checked)) is not None:
            break
        checked = len(text)
        shown = max(shown, m.safe_len(text))
    if ended and hit is None and len(pieces) >= unchecked:
        hit = m.find(text, checked, at_end=True)
    return hit, shown


def test_a_stop_regex_match_straddling_the_min_new_tokens_is_a_stop_as_a_stop_strings_is():
    # "ab" within min_new_tokens is let through; "bc" (or "abc") that the next token completes
    # began there and ends after: a stop string's is one, the regex's search passed over it
    for pattern, stops, pieces in [("ab|bc", ["ab", "bc"], ["x", "ab", "c"]), ("ab|abc", ["ab", "abc"], ["ab", "c"]),
                                   ("a|ab", ["a", "ab"], ["a", "b"])]:
        want = feed_unchecked(StopStringMatcher(stops), pieces, len(pieces))
        got = feed_unchecked(StopStringMatcher([], [pattern]), pieces, len(pieces))
        assert want[0] is not None and got[0] == want[0], pattern
        assert got[1] <= want[0][0], pattern  # the stop's text was never shown
    # literal alternatives read as a regex stop where the same stop strings do, whatever the
    # min_new_tokens, and nothing of a stop was shown before it
    rng = random.Random(5)
    for _ in range(400):
        stops = sorted({"".join(rng.choice("abc") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3))})
        pieces = ["".join(rng.choice("abcx") for _ in range(rng.randint(1, 3))) for _ in range(8)]
        unchecked = rng.randint(0, 6)
        want = feed_unchecked(StopStringMatcher(stops), pieces, unchecked)
        got = feed_unchecked(StopStringMatcher([], ["|".join(stops)]), pieces, unchecked)
        end = (lambda hit: hit and hit[0] + len(hit[1]))  # (several stops ending at one character: cut apart)
        assert end(got[0]) == end(want[0]), (stops, pieces, unchecked)
        assert got[0] is None or got[1] <= got[0][0], (stops, pieces, unchecked)


def _first_stop(pattern: str, pieces: list[str], unchecked: int) -> tuple[int, str] | None:
    """Brute force with Python's re: the first match to end after the text of the first
    ``unchecked - 1`` pieces (the text not checked), found where it ends, at its leftmost start."""
    rx, text = re.compile(pattern), ""
    for k, piece in enumerate(pieces, 1):
        before, text = len(text), text + piece
        for end in range(before + 1, len(text) + 1) if k >= unchecked else ():
            starts = [s for s in range(end) if rx.fullmatch(text, s, end)]
            if starts:
                return starts[0], text[starts[0]:end]
    return None


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    """A pattern of a, b, c and x without assertions: classes, alternatives, greedy and lazy repeats."""
    r = rng.random()
    if depth > 2 or r < 0.35:
        return rng.choice(["a", "b", "c", "x", "ab", "[ab]", "[^a]", "[bc]", ".", "(?:a|bc)"])
    if r < 0.55:
        return _random_pattern(rng, depth + 1) + _random_pattern(rng, depth + 1)
    if r < 0.7:
        return f"(?:{_random_pattern(rng, depth + 1)}|{_random_pattern(rng, depth + 1)})"
    return f"(?:{_random_pattern(rng, depth + 1)})" + rng.choice(["*", "+", "?", "{1,2}", "*?", "+?", "??", "{2}"])


def test_a_stop_regex_is_found_where_brute_force_finds_it_and_no_text_of_it_is_shown_before():
    # "xbc|b": the whole match "b" lies in the text not checked, and a partial search prefers it
    # to the partial "xb" before it, so "x" was shown, then "xbc" became the stop
    hit, shown = feed_unchecked(StopStringMatcher([], ["xbc|b"]), ["x", "b", "c"], 3)
    assert hit == _first_stop("xbc|b", ["x", "b", "c"], 3) == (0, "xbc") and shown == 0
    rng = random.Random(1)
    for _ in range(1500):
        pattern = _random_pattern(rng)
        if re.fullmatch(pattern, ""):
            continue  # (refused by SamplingParams)
        pieces = ["".join(rng.choice("abcx") for _ in range(rng.randint(1, 3))) for _ in range(6)]
        unchecked = rng.randint(0, 5)
        hit, shown = feed_unchecked(StopStringMatcher([], [pattern]), pieces, unchecked)
        assert hit == _first_stop(pattern, pieces, unchecked), (pattern, pieces, unchecked)
        assert hit is None or shown <= hit[0], (pattern, pieces, unchecked)


def _may_still_begin_a_stop(pattern: str, text: str, width: int) -> int:
    """Brute force with Python's re, for a pattern of at most ``width`` characters and no
    assertions: where the first start lies from which some longer text (up to ``width`` more
    characters of a, b, c or x) matches past the text's end, ``len(text)`` where none does: what
    safe_len holds back, nothing in front of it being able to become a stop."""

    rx = re.compile(pattern)
    more = ["".join(w) for n in range(1, width + 1) for w in itertools.product("abcx", repeat=n)]
    return next((s for s in range(len(text)) if any(rx.fullmatch(text[s:] + w) for w in more)), len(text))


def test_a_whole_stop_regex_match_in_text_not_checked_is_shown_where_no_stop_can_grow_from_it():
    # "ab" within min_new_tokens ends the text: no later text makes a stop of it (a match from
    # its start cannot end later), so it is shown at once, as the stop string "ab" is; it was
    # held back until the next token came. "ab|abc" and \d+ may still grow into a stop: held back
    for pattern, kept in [("ab", 3), ("ab|abc", 1), (r"\d+", 1), (r"a+b|ab", 3), (r"a[bc]*d|ab", 1)]:
        text = "x" + ("12" if "d+" in pattern else "ab")
        m = StopStringMatcher([], [pattern])
        assert m.safe_len("x") == 1 and m.safe_len(text) == kept, pattern
    assert StopStringMatcher(["ab"]).safe_len("xab") == 3
    # random patterns of bounded length, fed as the scheduler does with min_new_tokens: after each
    # token, exactly what brute force says more text may still make a stop of is held back
    from re import _parser

    rng = random.Random(3)
    tried = 0
    while tried < 300:
        pattern = _random_pattern(rng)
        width = _parser.parse(pattern).getwidth()[1]
        if re.fullmatch(pattern, "") or width > 5:
            continue
        tried += 1
        m, text, checked, unchecked = StopStringMatcher([], [pattern]), "", 0, rng.randint(0, 6)
        for token in range(1, 7):
            text += "".join(rng.choice("abcx") for _ in range(rng.randint(1, 3)))
            if token >= unchecked and m.find(text, checked) is not None:
                break
            checked = len(text)
            assert m.safe_len(text) == _may_still_begin_a_stop(pattern, text, width), (pattern, text, unchecked)


def test_a_stop_regexs_reach_is_what_matching_at_a_start_reads():
    import regex
    from re import _parser

    from lmnb_engine.regex_reach import reach

    # worked by hand: the longest match, plus 2 for an end or boundary assertion ("$" also holds
    # before a final newline) and a lookahead's own reach; unknown where unbounded, a
    # backreference, a class Python's re does not read (\p{L}) or a fuzzy constraint
    assert [reach(p) for p in ["ab", r"x(?=y)", r"a$", r"(?<=a)b", r"\bZZ\d{1,3}\b", r"a(?=bc(?=d))", "x{,3}"]] == \
        [2, 2, 3, 1, 7, 4, 3]
    assert [reach(p) for p in [r"\d+", r"a{2,}", r"(\w)\1", r"\p{L}", "(?:abc){e<=1}", r"(?<=a\b)c", "(?x)a\xa0b",
                               r"(a)(?<=(?(1)\b|c))"]] == [None] * 8
    rng = random.Random(2)
    for _ in range(300):  # without assertions: the longest match, as Python's own parser measures it
        pattern = _random_pattern(rng)
        width = _parser.parse(pattern).getwidth()[1]
        assert reach(pattern) == (None if width >= _parser.MAXREPEAT - 1 else width), pattern
    # with assertions: whether and what the regex package matches at a start does not change,
    # whatever text follows the start's first reach characters
    assertions = [r"\b", r"\B", "$", r"(?=a)", r"(?!b\b)", r"(?<=x)", r"(?<!a)", r"(?=[ab]{2})"]
    tried = 0
    while tried < 400:
        pattern = "".join(rng.choice([_random_pattern(rng, 2), rng.choice(assertions)]) for _ in range(rng.randint(2, 4)))
        if (r := reach(pattern)) is None:
            continue
        tried += 1
        rx = regex.compile(pattern)
        for _ in range(10):
            start = rng.randint(0, 3)
            head = "".join(rng.choice("abx \n") for _ in range(start + r))
            want = rx.match(head, start)
            for _ in range(5):
                got = rx.match(head + "".join(rng.choice("abx \n") for _ in range(rng.randint(1, 4))), start)
                assert (got and got.span()) == (want and want.span()), (pattern, head, start)


def test_a_stop_regex_with_a_lookahead_in_a_conditional_in_a_lookbehind_is_held_back_and_found():
    import regex

    # the lookbehind's conditional looks ahead past the match's start: "a" is a stop once "b"
    # follows it. Its reach was taken as 1 (the assertions in a conditional were not seen), so
    # "xa" was shown and the stop never found
    pattern, text = r"(a)(?<=(?(1)a(?=b)|c))", "xab"
    want = regex.search(pattern, text)
    m, shown, found = StopStringMatcher([], [pattern]), 0, None
    for end in range(1, len(text) + 1):  # a character a token
        if (found := m.find(text[:end], end - 1)) is not None:
            break
        shown = max(shown, m.safe_len(text[:end]))
    assert found == (want.start(), want.group()) == (1, "a")
    assert shown <= want.start()


def test_a_bounded_stop_regex_is_searched_over_the_texts_last_reach_characters_only():
    import regex

    # a whole match in the text not checked ("ZZ1" within min_new_tokens) kept the search's floor
    # where it was, so every later token searched the pattern (no automaton: word boundaries)
    # from there, over the whole output; what more text can make a stop begins in the last
    # reach - 1 characters (regex_reach), and the searches start there
    pattern = r"\bZZ\d{1,3}\b"
    m = StopStringMatcher([], [pattern])
    starts: list[int] = []
    for name in ("_regexes", "partial"):  # (find searches the one, safe_len the other)
        spied = getattr(m, name) if name == "_regexes" else m._shared.partial
        real = spied[0]

        class Spy:
            def search(self, text, pos=0, *a, real=real, **k):
                starts.append(len(text) - pos)
                return real.search(text, pos, *a, **k)

            def finditer(self, text, pos=0, *a, real=real, **k):
                starts.append(len(text) - pos)
                return real.finditer(text, pos, *a, **k)

            def __getattr__(self, attr, real=real):
                return getattr(real, attr)

        spied[0] = Spy()
    text = "ZZ1 "
    assert m.safe_len(text) == len(text)  # (min_new_tokens: not checked)
    for _ in range(300):
        checked, text = len(text), text + "word 12 "
        assert m.find(text, checked) is None
        assert m.safe_len(text) == len(text)
    assert starts and max(starts) <= 7 + len("word 12 ")
    # bounded patterns with boundaries, end anchors and lookarounds, random texts: the stop is the
    # brute-force one where every token is checked, and with min_new_tokens the one that a
    # search from where the last search began finds (reach unused: the search before), and none
    # of its text was shown before it
    from lmnb_engine.stop_matcher import StopRegexes

    rng = random.Random(6)
    assertions = [r"\b", r"\B", "$", r"(?<=x)", r"(?<!a)", r"(?=a)", r"(?!b\b)"]
    tried = 0
    while tried < 600:
        pattern = "".join(rng.choice([_random_pattern(rng, 2), rng.choice(assertions)]) for _ in range(rng.randint(2, 4)))
        if regex.fullmatch(pattern, "") or re.search(r"[*+]|\{\d*,\}", pattern):
            continue
        tried += 1
        pieces = ["".join(rng.choice("abx \n") for _ in range(rng.randint(1, 3))) for _ in range(8)]
        unchecked = rng.choice([0, 0, rng.randint(2, 6)])
        hit, shown = feed_unchecked(StopStringMatcher([], [pattern]), pieces, unchecked)
        unbounded = StopRegexes([pattern])
        unbounded.reach = [None]
        assert hit == feed_unchecked(StopStringMatcher([], unbounded), pieces, unchecked)[0], (pattern, pieces, unchecked)
        if not unchecked:
            assert hit == first_regex_stop_by_definition([pattern], "".join(pieces)), (pattern, pieces)
        assert hit is None or shown <= hit[0], (pattern, pieces, unchecked)


def test_stop_regex_with_a_lookahead_stops_once_the_lookahead_text_comes():
    # the match ("x", or nothing before "STOP") ends before the text that completes it; it was
    # taken for a match in checked text and let through, so the output ran on past it
    m = StopStringMatcher([], [r"x(?=y)", r"(?=STOP)"])
    text, hit, shown = stream(m, ["ab", "x", "y", "zz"])
    assert hit == (2, "x") and shown == ["ab", "ab"]
    text, hit, shown = stream(m, ["ab", "ST", "OP", "q"])
    assert hit == (2, "") and shown == ["ab", "ab"]
    assert stream(StopStringMatcher([], [r"(?=a)"]), ["a", "b"])[1] == (0, "")  # at the very start
    assert m.find("1x y", 2) is None  # no match at all: still none


def test_stop_regex_searches_only_where_a_match_may_still_begin():
    # each token searched the whole output again in partial mode: a 3000-token output with
    # r"\w+@\w+\.com" spent 70 s in the matcher (quadratic); now each search starts where a match
    # may still begin, and the answers are a fresh matcher's over the whole text
    import random

    # (\p{L}: a pattern stop_automaton does not represent, so the regex package searches it)
    pattern = r"\p{L}+@\w+\.com"
    m = StopStringMatcher([], [pattern])
    starts: list[int] = []
    real = m._regexes[0]

    class Spy:
        def search(self, text, pos=0, *a, **k):
            starts.append(pos)
            return real.search(text, pos, *a, **k)

        def __getattr__(self, name):
            return getattr(real, name)

    m._regexes[0] = m._shared.partial[0] = Spy()  # (find searches the one, safe_len the other)
    text = ""
    for _ in range(300):
        text += "word a "
        assert m.find(text, len(text) - 7) is None
        starts.clear()
        assert m.safe_len(text) == len(text)
        assert starts == [len(text) - 7]  # where the last text ended (its empty partial match), not 0
    rng = random.Random(0)
    for trial in range(200):  # appended and rolled back (jump-forward) text, as in the scheduler
        m, text, checked = StopStringMatcher(["x@"], [pattern, r"b(?=a@)", r"(?m)^c"]), "", 0
        for _ in range(30):
            if text and rng.random() < 0.2:
                text = text[: rng.randrange(len(text))]
                checked = min(checked, len(text))
            text += "".join(rng.choice("ab@.c\n ") for _ in range(rng.randint(1, 3)))
            fresh = StopStringMatcher(["x@"], [pattern, r"b(?=a@)", r"(?m)^c"])
            assert m.find(text, checked) == fresh.find(text, checked)
            checked = len(text)
            assert m.safe_len(text) == fresh.safe_len(text)


def test_a_match_in_text_not_checked_leaves_where_a_later_match_may_begin():
    # during min_new_tokens only safe_len runs; a whole match there moved the floor past where a
    # match could still begin: the partial search gave "x" (9) for r"BEGIN[\s\S]*?END|x" though
    # "BEGIN" (0) was open, so "BEGIN ab x y END" did not stop. The answers are a fresh matcher's
    m, text = StopStringMatcher([], [r"BEGIN[\s\S]*?END|x"]), ""
    for piece in ["BEGIN", " ab", " x", " y"]:  # min_new_tokens = 5: not checked
        text += piece
        m.safe_len(text)
    assert m.find(text + " END", len(text)) == (0, "BEGIN ab x y END")
    rng = random.Random(0)
    choices = [r"BEGIN[\s\S]*?END|x", r"a[\s\S]*?E|a", r"a.*?E|c", r"ab*c|b", r"\d+\.", r"b(?=a@)"]
    for _ in range(500):
        patterns = rng.sample(choices, rng.randint(1, 3))
        m, text, checked, unchecked = StopStringMatcher([], patterns), "", 0, rng.randint(0, 6)
        for token in range(25):  # as the scheduler: find from min_new_tokens on, safe_len always
            if text and rng.random() < 0.1:  # rolled back (jump-forward)
                text = text[: rng.randrange(len(text))]
                checked = min(checked, len(text))
            text += "".join(rng.choice("abcxE1.@\n ") for _ in range(rng.randint(1, 3)))
            fresh = StopStringMatcher([], patterns)
            if token >= unchecked:
                hit = m.find(text, checked)
                assert hit == fresh.find(text, checked), (patterns, text, checked)
                if hit is not None:
                    break
            checked = len(text)
            assert m.safe_len(text) == fresh.safe_len(text), (patterns, text)



def test_stops_beyond_the_bounds_are_refused_with_their_count_not_their_text():
    from lmnb_engine import SamplingParams

    SamplingParams(stop=["x"] * 512).validate()
    SamplingParams(stop=["x" * 32768]).validate()
    # the message names the one limit exceeded: it said "the limit of 512 strings and 32768 characters"
    # of 513 one-character stops
    with pytest.raises(ValueError) as e:
        SamplingParams(stop=["x"] * 513).validate()
    assert str(e.value).startswith("SamplingParams.stop is invalid: 513 strings, above the limit of 512 strings (")
    assert "characters" not in str(e.value) and len(str(e.value)) < 400
    with pytest.raises(ValueError) as e:
        SamplingParams(stop=["y" * 16384, "z" * 16385]).validate()
    assert str(e.value).startswith("SamplingParams.stop is invalid: 2 strings of 32769 characters in all, above the "
                                   "limit of 32768 characters (")
    assert "512" not in str(e.value) and "yyy" not in str(e.value)
    with pytest.raises(ValueError, match=r"1 string of 32769 characters in all"):
        SamplingParams(stop="y" * 32769).validate()


def test_an_empty_stop_string_is_refused_by_the_engine_and_the_language():
    # every text holds "": SGLang stopped after one token, lmnb dropped it; neither is what was asked
    import lmnb as sgl
    from lmnb_engine import SamplingParams

    for stop, where in (("", ""), ([""], " (item 0)"), (["\n", "", "x"], " (item 1)")):
        with pytest.raises(ValueError) as e:
            SamplingParams(stop=stop).validate()
        assert str(e.value) == (f"SamplingParams.stop is invalid: an empty string{where} names no place to stop: "
                                "every text holds it; remove it (leave stop out for no stop string)")
        with pytest.raises(ValueError, match=rf"^stop is invalid: an empty string{re.escape(where)} names no place"):
            sgl.gen("x", stop=stop)
    SamplingParams(stop=["\n", " "]).validate()
    assert sgl.gen("x", stop=" ") is not None


def test_a_stop_regex_with_the_search_start_anchor_is_refused_naming_it():
    # \G matches where a search starts; the stop matcher searches from where a match may still
    # begin (and tries every start), so "\Ga" on tokens "b", "a" stopped at "a" (and "\Gb|x\Ga"
    # on "xb" at "b"), though a search of the whole text finds no match: refused, with the fix
    from lmnb_engine import SamplingParams
    from lmnb_engine.params import stop_regex_problem

    for pattern in [r"\Ga", r"\Gb|x\Ga", r"(?:\\\Ga)"]:
        with pytest.raises(ValueError) as e:
            SamplingParams(stop_regex=["ok", pattern]).validate()
        assert r"\G" in str(e.value) and r"use \A" in str(e.value), pattern
    # an escaped backslash before G is the two characters, not the anchor
    assert stop_regex_problem(r"\\G") is None and stop_regex_problem(r"[\\]G") is None


def test_stop_regexes_beyond_their_bound_are_refused_with_their_count():
    from lmnb_engine import SamplingParams
    from lmnb_engine.params import stop_regex_problem

    SamplingParams(stop_regex=[f"x{i}" for i in range(32)]).validate()
    with pytest.raises(ValueError) as e:
        SamplingParams(stop_regex=[f"x{i}" for i in range(33)]).validate()
    assert str(e.value) == ("SamplingParams.stop_regex is invalid: 33 patterns, above the limit of 32 (each is "
                            "searched in the output on every token); join alternatives into one pattern with |")
    # the language's gen(stop_regex=...) and the cell parser ask the same question, where they are written
    import lmnb as sgl

    with pytest.raises(ValueError) as e:
        sgl.gen("x", stop_regex=["a"] * 33)
    assert str(e.value).startswith("stop_regex is invalid: 33 patterns, above the limit of 32 (")
    assert stop_regex_problem(("a",) * 33).startswith("33 patterns, above the limit of 32")
    # one pattern is never too many, however long
    assert stop_regex_problem("|".join(f"x{i}" for i in range(100))) is None


def test_a_linear_stop_regex_over_a_long_output_is_never_given_up(searches):
    # a per-sample budget summed the searches: '\\{[^{}]*\\}\\s*\\n\\nDONE', searched again from the open
    # brace on every token, was aborted as "catastrophic backtracking" after 3400 tokens (found by a
    # review helper); each search is timed alone now: given the whole budget, what the ones before took
    # not taken off it
    from lmnb_engine import stop_matcher

    m, text = StopStringMatcher([], [r"\{[^{}]*\}\s*\n\nDONE"]), "{"
    for _ in range(5000):
        checked = len(text)
        text += "word "
        assert m.find(text, checked) is None and m.safe_len(text) == 0
    assert m.problem is None
    assert m.find(text + "}\n\nDONE", len(text)) == (0, text + "}\n\nDONE")
    assert len(searches) > 5000 and {timeout for *_, timeout in searches} == {stop_matcher.REGEX_TIMEOUT_S}


def test_a_regex_given_up_by_one_sample_leaves_the_others_searching_the_rest(monkeypatch):
    # the first version stopped every regex search of every sample once one timed out: a sibling's
    # "END" was never found and its sample was aborted with the stop text in it (found by a review helper)
    from lmnb_engine import stop_matcher
    from lmnb_engine.stop_matcher import StopRegexes

    monkeypatch.setattr(stop_matcher, "REGEX_TIMEOUT_S", 0.01)
    # (a lookbehind: searched, not read by an automaton, and the loosened one, (x|x)+x, matches "xx";
    # a match ends with an "x", which the text holds, and not in the lookbehind: find searches it)
    shared = StopRegexes(["END", "(x|x)+(?<=y)x"])
    first, second = StopStringMatcher([], shared), StopStringMatcher([], shared)
    assert first.find("x" * 40, 39) is None and '"(x|x)+(?<=y)x" took over 0.01 s' in first.problem
    assert second.problem == first.problem and shared.given_up == {1}
    assert second.find("abc END", 6) == (4, "END")
    assert second.safe_len("abc EN") == 0  # the given-up pattern might match anywhere it was not yet searched


def _final_spans(pattern: str, text: str, spans: set, alphabet: str, ahead: int = 3) -> set:
    """Those of ``spans`` (matches of ``pattern`` in ``text``, as ``_spans``) that no text after
    ``text`` can undo, by brute force: each is a match in ``text`` followed by each string of up
    to ``ahead`` characters of ``alphabet`` too (the patterns tested read at most that far past a
    match; "followed by nothing" is ``spans``' own reading)."""
    more = _texts_after(alphabet, ahead)
    return {(s, e) for s, e in spans
            if all(_ending_at(pattern, len(text) + len(w) - e).match(text + w, pos=s) for w in more)}


@functools.lru_cache(maxsize=8)
def _texts_after(alphabet: str, ahead: int) -> tuple[str, ...]:
    """Every string of 1 to ``ahead`` characters of ``alphabet`` (16k for a 25-character
    alphabet: built once per text's alphabet, not once per prefix of the text)."""
    return tuple("".join(t) for n in range(1, ahead + 1) for t in itertools.product(alphabet, repeat=n))


def first_regex_stop_by_definition(regexes: list[str], text: str, alphabet: str | None = None,
                                   ended: bool = False) -> tuple[int, str] | None:
    """The stop a check after each character meets, by brute force: the shortest prefix
    ``text[:k]`` in which some regex has a match that no text after it can undo (``_final_spans``),
    each regex's leftmost such match (of those from there, the one the regex package matches in
    ``text[:k]`` where it is such, else the shortest), and of those the one that ends first, then
    the first listed (docs/language.md). Where the output ends with ``text`` (``ended``), a match
    that reads its end is one too: of each regex's leftmost match in ``text``, the one that ends
    first, then the first listed. ``alphabet``: what may follow (by default the characters of
    ``text``, a letter, a space and a newline)."""
    import regex

    alphabet = alphabet or "".join(sorted(set(text + "a \n")))
    for k in range(1, len(text) + 1):
        hits = []  # (where the match ends, list rank, where it starts)
        for rank, p in enumerate(regexes):
            final = _final_spans(p, text[:k], _spans(p, text[:k]), alphabet)
            if final:
                s = min(final)[0]
                m = regex.match(p, text[:k], pos=s)
                e = m.end() if m is not None and (s, m.end()) in final else min(e for t, e in final if t == s)
                hits.append((e, rank, s))
        if hits:
            e, _, s = min(hits)
            return s, text[s:e]
    ends = [(m.end(), rank, m.start(), m.group())
            for rank, p in enumerate(regexes if ended else ()) if (m := regex.search(p, text)) is not None]
    return min(ends)[2:] if ends else None


def test_stop_regexes_met_at_one_character_stop_at_the_match_that_ends_first_then_the_first_listed():
    """docs/language.md: among stops met at one character, the match that ends first wins, then
    the first listed; so too where the output's end meets them. Worked by hand: "\\n" and
    \\bEND\\b are both met at the newline of "END\\n", "END" ending first; b$ and a(?=b*$) on "ab",
    and [ab]+$ and a(?=b+$) on "aab", only where the output ends there, "a" ending first (the brute-force
    reference took the first listed regex's match: "b", "aab"); b\\b and ab\\b on "xab" end at one
    character, the first listed wins. The reference and the matcher, whatever the tokens, agree
    with these."""
    # (regexes, text, whether the output ends with it, the stop; whether the list reversed has it too)
    for regexes, text, ended, want, either_order in [(["\n", r"\bEND\b"], "END\n", False, (0, "END"), True),
                                                     ([r"b$", r"a(?=b*$)"], "ab", True, (0, "a"), True),
                                                     ([r"[ab]+$", r"a(?=b+$)"], "aab", True, (1, "a"), True),
                                                     ([r"b\b", r"ab\b"], "xab", True, (2, "b"), False),
                                                     ([r"ab\b", r"b\b"], "xab", True, (1, "ab"), False)]:
        for listed in [regexes, regexes[::-1]] if either_order else [regexes]:
            assert first_regex_stop_by_definition(listed, text, ended=ended) == want, listed
            for split in (list(text), [text]):
                assert stream(StopStringMatcher([], listed), split, ended)[1] == want, (listed, split)


def test_a_stop_regex_whose_end_assertion_fails_only_because_the_text_ends_is_held_back():
    # Worked by hand: r"a\B" on "a" does not match ("\B" fails at the text's end) but on "ab" it
    # matches "a". The regex package's partial search dropped the start 0 of "a" as if no text
    # could follow, so safe_len showed "a" and moved its floor past it: tokens "a", "b" never
    # stopped (shown "a", "ab"), where one token "ab" stopped at (0, "a").
    for regex_, text in [(r"a\B", "ab"), (r"a(?!$)", "ax"), (r"a(?!\Z)", "ax"), (r"a(?!\b)", "ab"), (r"\w\B", "ab"),
                         (r"a[^x]*x\B", "ayyxb"), (r"b \b", "b a")]:
        assert_streams_to_the_stop_by_definition(regex_, text, (list(text), [text]))
    # random patterns whose match may depend on text after the end, random texts and tokenizations:
    # the stop is the brute-force one, and no text shown before it reaches into it
    patterns = [r"a\B", r"a(?!$)", r"a(?!\Z)", r"a(?!\b)", r"\w\B", r"b \b", r"a[^x]*x\B", r"(?m)a(?!$)",
                r"a(?!b\b)", r"\w\B\w\B", r"a$", r"b\b", r"(?<!a)b\B", r"ab?(?!a)", r"\ba\B"]
    rng = random.Random(7)
    for _ in range(3000):
        regexes = rng.sample(patterns, rng.randint(1, 2))
        text = "".join(rng.choice("abx \n") for _ in range(rng.randint(1, 9)))
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, len(text) - 1)))
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        hit = first_regex_stop_by_definition(regexes, text, "abx \n")
        _, got, shown = stream(StopStringMatcher([], regexes), pieces)
        assert got == hit, (regexes, pieces)
        assert hit is None or all(len(s) <= hit[0] for s in shown), (regexes, pieces, shown)


def test_a_stop_regex_whose_lookaround_condition_undoes_its_match_once_text_comes_is_met_where_it_holds():
    # Worked by hand: r"x(?(?=y)q|)" matches "x" in the text "x" (the lookahead fails at the end,
    # the empty "no" branch matches) but nowhere in "xy". A check after each character meets it;
    # one token "xy" found nothing, as the pattern was not read as end-sensitive: the stop
    # depended on the tokenization. Same with a negative condition, and after a longer prefix
    # Now such a match is met only once the output ends there (language.md): "xy" holds none, "x"
    # ending the output does
    for regex_, text, at_end in [(r"x(?(?=y)q|)", "xy", (0, "x")), (r"x(?(?!y)|q)", "xy", (0, "x")),
                                 (r"ab(?(?=c)d|)", "zabc", (1, "ab")), (r"b(?(?<=ab)(?(?=c)q|)|w)", "abc", (1, "b"))]:
        for pieces in (list(text), [text], [text[:-1], text[-1]]):
            assert stream(StopStringMatcher([], [regex_]), pieces, ended=True)[1] is None, (regex_, pieces)
        assert assert_streams_to_the_stop_by_definition(regex_, text[:-1], (list(text[:-1]), [text[:-1]])) == at_end


def test_a_stop_regex_whose_atomic_group_takes_more_once_text_comes_is_met_where_it_holds():
    # Worked by hand: r"[ab](?>a*)(?<=b)" matches "b" in the text "b" (the atomic group takes
    # nothing, the lookbehind sees "b") but nowhere in "ba": the atomic group takes the "a" and
    # gives nothing back, so the lookbehind fails. A check after each character meets it; one
    # token "ba" found nothing. A possessive repeat reads so too
    # ... and so do a grapheme cluster \X, a line break \R ("\r\n" whole, once the "\n" comes) and
    # the backtracking verbs (*PRUNE) and (*SKIP) (no going back past them)
    import regex

    for regex_, text in [(r"[ab](?>a*)(?<=b)", "ba"), (r"\wa*+(?<!a)", "ba"), (r"[ab](?>a*)(?=(?<!a))", "x ba"),
                         (r"b(?>a?)(?<!a)x?", "bax"), (r"\X(?<=e)", "e\u0301"), (r"\R(?<=\r)", "\r\n"),
                         (r"a\X(?<!\u0301)", "ae\u0301"), (r"[ab]a*(*PRUNE)(?<=b)", "ba"), (r"[ab]a*(*SKIP)(?<=b)", "ba")]:
        # (such a match is met as the text so far reads: an atomic group's end is no assertion's, and
        # the stop matcher reads what the atomic group takes there as final; language.md)
        hit = next((m.start(), m.group()) for k in range(1, len(text) + 1) if (m := regex.search(regex_, text[:k])))
        for pieces in (list(text), [text], [text[:-1], text[-1]]):
            _, got, shown = stream(StopStringMatcher([], [regex_]), pieces)
            assert got == hit and all(len(t) <= hit[0] for t in shown), (regex_, pieces)


def test_a_stop_regex_with_a_lookbehind_after_a_repeat_holds_back_where_a_match_may_begin():
    # Worked by hand: r"a.*?(?<!a)" on "aa" has no match, and one may begin at 0 ("aab"), but the
    # regex package's partial search reports its partial match at 1 only (the lookbehind failing at
    # the text's end is taken as final), so "a" was shown and the search for the stop started
    # there: tokens "a", "a", "b" stopped at (1, "ab") with "a" of the stop "aab" shown
    for regex_, text in [(r"a.*?(?<!a)", "aab"), (r"[ab][ab]{0,3}?(?<=ab)", "aaab"), (r"a.+?(?=(?<!a))", "aaab"),
                         (r"\w.*?(?<=b)[ax]", "aaaaba")]:
        assert assert_streams_to_the_stop_by_definition(regex_, text, (list(text), [text[:-1], text[-1]]))[0] == 0
    # with min_new_tokens=3: the whole match "b" of "ba" is let through, and "baax" from the same
    # start ends after it, a stop; "ba" was shown of it (its partial fullmatch at 0 missed it too)
    assert feed_unchecked(StopStringMatcher([], [r"[ab].*?(?<!a)"]), ["b", "a", "a", "x"], 3) == ((0, "baax"), 0)


def test_a_lookbehind_opening_a_stop_regex_after_a_version_flag_holds_back_only_where_a_stop_may_begin():
    # Worked by hand: (?<=z)ab may still begin a stop only at an "a" after a "z" that ends the
    # text. A version flag, (?V0) or (?V1), reads no text, so the lookbehind after it still opens
    # the pattern; the flag (a digit in it) was not read as one, the lookbehind was taken as coming
    # after other text, and all the text was held back
    for flag in ("", "(?V0)", "(?V1)", "(?iV1)"):
        got = [StopStringMatcher([], [flag + "(?<=z)ab"]).safe_len(text) for text in ("zzzz", "zza", "zzaz", "zaza")]
        assert got == [4, 2, 4, 3], flag


def _spans(pattern: str, text: str, starts=None, ends=None) -> set[tuple[int, int]]:
    """Brute force with the regex package: every (start, end) at which ``pattern`` matches in
    ``text``, its assertions reading all of it (the match forced to end at ``end`` by a lookahead
    for exactly the characters after it); from ``starts`` and to ``ends`` only where given."""
    return {(s, e) for s in (range(len(text) + 1) if starts is None else starts)
            for e in (range(s, len(text) + 1) if ends is None else ends)
            if _ending_at(pattern, len(text) - e).match(text, pos=s)}


@functools.lru_cache(maxsize=4096)
def _ending_at(pattern: str, after: int):
    """``pattern`` compiled by the regex package to match only where exactly ``after`` characters
    follow its match, which its assertions read (a lookahead for them). Compiled once: looking it
    up in the regex package's own cache, at each of the brute force's millions of matches, took
    most of their time. A verbose pattern may end in a "#" comment, which a newline ends before
    the group closes (else the comment took the rest in)."""
    import regex

    flags = re.match(r"(?:\(\?[a-zA-Z]+\))*", pattern).group()
    end = "\n" if regex.compile(pattern).flags & regex.VERBOSE else ""
    return regex.compile(f"{flags}(?:{pattern[len(flags):]}{end})(?=[\\s\\S]{{{after}}}\\Z)")


def _new_matches_met_first(pattern: str, pieces: list[str], unchecked: int, ended: bool = False,
                           alphabet: str | None = None) -> tuple[int, set] | None:
    """The stop a check after each character meets, by brute force, with ``min_new_tokens=unchecked``
    (the text of the first ``unchecked - 1`` pieces not checked): (the first end k of a checked
    text ``text[:k]`` that holds a match the text not checked did not and that no text after it
    can undo (``_final_spans``, over ``alphabet``: by default the text's characters, a letter, a
    space and a newline), those matches) or None; where the output ends after the pieces
    (``ended``), then the matches of all the text that the text not checked did not hold."""
    text, old = "", None
    alphabet = alphabet or "".join(sorted(set("".join(pieces) + "a \n")))
    for k, piece in enumerate(pieces, 1):
        before, text = len(text), text + piece
        if k < unchecked:
            continue
        if old is None:
            old = _spans(pattern, text[:before])
        for end in range(before + 1, len(text) + 1):
            if new := _final_spans(pattern, text[:end], _spans(pattern, text[:end]) - old, alphabet):
                return end, new
    if ended and old is not None and (new := _spans(pattern, text) - old):
        return len(text), new
    return None


def _stops_as_by_definition(pattern: str, pieces: list[str], unchecked: int, alphabet: str | None = None) -> bool:
    """Feed ``pieces`` to a matcher of stop regex ``pattern`` with ``min_new_tokens=unchecked``,
    the output ending after them, and assert that its stop is the brute-force one
    (``_new_matches_met_first``: the first end by which the text holds a match the text not
    checked did not and no later text can undo, at its least start), or none where there is none,
    and that no text of the stop was shown before it. True if it stopped."""
    hit, shown = feed_unchecked(StopStringMatcher([], [pattern]), pieces, unchecked, ended=True)
    want = _new_matches_met_first(pattern, pieces, unchecked, True, alphabet)
    if want is None:
        assert hit is None, (pattern, pieces, unchecked)
        return False
    assert hit is not None and (hit[0], hit[0] + len(hit[1])) in want[1] and hit[0] == min(want[1])[0], (
        pattern, pieces, unchecked, want, hit)
    assert shown <= hit[0], (pattern, pieces, unchecked)
    return True


def _may_still_begin_a_new_match(pattern: str, text: str, alphabet: str, width: int) -> int:
    """Brute force: the first start at which some longer text (up to ``width`` more characters of
    ``alphabet``) holds a match that ``text``, checked all through, did not; ``len(text)`` if none."""

    old, first = _spans(pattern, text), len(text)
    for n in range(1, width + 1):
        for more in itertools.product(alphabet, repeat=n):
            if new := _spans(pattern, text + "".join(more)) - old:
                first = min(first, min(s for s, _ in new))
    return first


def test_a_stop_regex_with_a_lookbehind_after_its_start_streams_what_no_match_can_begin():
    # Worked by hand: r"\w+(?<=ing)\b" after "go sat on" may still match from "on" ("oning"), not
    # before ("go " and "sat " are whole words that do not end in "ing"); r"<\w+(?<!br)>" after
    # "a <br> c <" may match from the last "<" only. Such a pattern was never searched (the regex
    # package's partial search misses starts past a lookbehind), so nothing was streamed until a
    # match or the output's end: shown "" after each token
    for pattern, pieces, hit, shown in [(r"\w+(?<=ing)\b", ["go", " sat", " on", " sin", "g"], (10, "sing"),
                                         ["", "go ", "go sat ", "go sat on ", "go sat on "]),
                                        (r"<\w+(?<!br)>", ["a <b", "r> c <", "i>"], (9, "<i>"), ["a ", "a <br> c "])]:
        assert stream(StopStringMatcher([], [pattern]), pieces, ended=True)[1:] == (hit, shown), pattern
    # ... but not where leaving the lookbehinds out may match less (an atomic group: "(?>a|ab)c" fails
    # on "xyabc", "(?>a(?<=xa)|ab)c" matches "abc"): its partial search would show "xyab"
    _, hit, shown = stream(StopStringMatcher([], [r"(?>a(?<=xa)|ab)c"]), ["xy", "ab", "c"])
    assert hit == (2, "abc") and all(len(s) <= 2 for s in shown), shown
    # random patterns of a head, a repeat and lookbehinds, random tokens and min_new_tokens: the stop is
    # the brute-force one (the first end by which the text holds a match the text not checked did
    # not, at its least start), no text of it was shown before it, and where every token is checked
    # no text was shown from which a longer text makes a match (brute force over 3 more characters)
    rng = random.Random(11)
    heads, repeats = ["a", "b", "x", "[ab]", r"\w", "ab"], ["a*", "[ab]*?", ".*?", r"\w+", "(?:ab)*", ".+?", "b?"]
    looks, tails = ["(?<=a)", "(?<!a)", "(?<=ab)", "(?<!b)", "(?<=x)", "(?<= )"], ["", "b", "[ax]", "x?", r"\b"]
    for run in range(500):
        middle = rng.choice(looks) + (rng.choice(repeats) + rng.choice(looks) if rng.random() < 0.3 else "")
        pattern = rng.choice(heads) + rng.choice(repeats) + middle + rng.choice(tails)
        pieces = ["".join(rng.choice("abx ") for _ in range(rng.randint(1, 3))) for _ in range(5)]
        unchecked = rng.choice([0, 0, rng.randint(2, 4)])
        if not _stops_as_by_definition(pattern, pieces, unchecked):
            continue
        if run % 5 == 0 and not unchecked:
            m, text = StopStringMatcher([], [pattern]), ""
            for piece in pieces:
                checked, text = len(text), text + piece
                if m.find(text, checked) is not None:
                    break
                assert m.safe_len(text) <= _may_still_begin_a_new_match(pattern, text, "abx ", 3), (pattern, text)


def test_a_stop_regex_with_a_lookbehind_after_its_start_is_held_back_from_its_automatons_reading(monkeypatch):
    # \w+(?<=ing) over a run of letters with no "ing": a match may still begin at the run's start
    # (more letters, then "ing"), so the whole run is held back; where it may begin is read from the
    # run of the pattern's loosened automaton, \w+, a character at a time. The partial search of
    # \w+ from the run's start to its end ran after every token instead (time growing with the
    # square of the run: ~0.5 ms a token at 51,200 characters, benches/bench_stop_regex.py --ends)
    from lmnb_engine import stop_matcher

    searched = []
    live_start = stop_matcher._live_start
    monkeypatch.setattr(stop_matcher, "_live_start", lambda *args: searched.append(args) or live_start(*args))
    m, text = StopStringMatcher([], [r"\w+(?<=ing)"]), "go "
    for _ in range(100):
        checked, text = len(text), text + "abcd"
        assert m.find(text, checked) is None
        assert m.safe_len(text) == 3  # ("go " holds no match, and none can begin in it)
    assert searched == []
    # " " ends the run: no match can begin in it any more, and "go " + the run is shown
    checked, text = len(text), text + " "
    assert m.find(text, checked) is None and m.safe_len(text) == len(text)
    # Worked by hand: .*?(?<=a)b after "\nb \n": a match needs "b" right after "a", and "." does
    # not cross a newline, so one from 1 or 2 ends by 3, in the text, which holds none; from 3,
    # "\n" is no "." and the lookbehind there reads " ". Only a start past the text may begin one:
    # all 4 characters are shown. The partial search, whose whole match "b" at 1 might have
    # been extended for all it knew, held back from 1
    m = StopStringMatcher([], [r".*?(?<=a)b"])
    assert m.find("\nb \n", 0) is None and m.safe_len("\nb \n") == 4


def test_a_longer_stop_regex_match_that_a_later_character_makes_is_a_stop_whatever_the_tokens():
    # Worked by hand, min_new_tokens=2 (the text "ab" not checked): r"a.*?\B" matches "a" there and
    # "ab" from 0 only once "c" comes (\B before "c"), which a check after each character meets
    # as a match the text not checked did not hold (as "x" of r"x(?=y)" once "y" comes): a stop.
    # Tokens "c", "d" found no stop at all (and r"a[bc]*?\B" showed "abc d"), one token "cd"
    # stopped at "abc": the longest match from 0 was taken as new only where it ended after the
    # text already checked
    for pattern, pieces, want in [(r"a.*?\B", ["ab", "c", "d"], (0, "ab")), (r"a.*?\B", ["ab", "cd"], (0, "ab")),
                                  (r"a[bc]*?\B", ["ab", "c", " d"], (0, "ab")),
                                  (r"a.*?\B", ["a", "b", "cd"], (0, "a"))]:  # ("a" made a match by "b")
        hit, shown = feed_unchecked(StopStringMatcher([], [pattern]), pieces, 2)
        assert hit == want and shown == 0, (pattern, pieces)


def test_a_multiline_stop_regex_with_a_line_start_after_a_lazy_repeat_holds_back_where_a_match_may_begin():
    # Worked by hand: r"(?m)a[\s\S]*?^b" on "xaa" has no match, and one may begin at 1 ("xaa\nb"),
    # but the regex package's partial search reports its partial match at 2 only (the lazy repeat
    # reaching the text's end, "^" failing there), so "xa" was shown and the search's floor moved
    # past 1: tokens "x", "a", "a", "\n", "b" stopped at (2, "a\nb"), the brute-force stop being
    # (1, "aa\nb")
    pieces = ["x", "a", "a", "\n", "b"]
    assert first_regex_stop_by_definition([r"(?m)a[\s\S]*?^b"], "".join(pieces)) == (1, "aa\nb")
    assert feed_unchecked(StopStringMatcher([], [r"(?m)a[\s\S]*?^b"]), pieces, 0) == ((1, "aa\nb"), 1)
    # random patterns with a repeat then "^", random tokens with newlines and min_new_tokens: the stop
    # is the brute-force one, and no text of it was shown before it (in a scratch run of this kind,
    # 23 of 389 failed before)
    rng = random.Random(0)
    for _ in range(300):
        parts = [_random_pattern(rng, 1), rng.choice([r"[\s\S]*?", "[^b]*?", r"\s*?", ".*?\n", r"[\s\S]*"]), "^",
                 _random_pattern(rng, 2)]
        pattern = "(?m)" + ("^" if rng.random() < 0.3 else "") + "".join(parts)
        if re.fullmatch(pattern, ""):
            continue
        pieces = ["".join(rng.choice("abx\n") for _ in range(rng.randint(1, 3))) for _ in range(5)]
        unchecked = rng.choice([0, 0, rng.randint(2, 4)])
        _stops_as_by_definition(pattern, pieces, unchecked)


def test_a_match_the_text_not_checked_did_not_hold_is_a_stop_whatever_its_length():
    # Worked by hand, min_new_tokens=2 (the text "abb" or "aab" not checked), then "c":
    # - a|abb|ab(?=bc) held "a" and "abb" from 0; "ab" from 0 is a match once "c" comes: a stop.
    #   Only the first match from a start ("a") and the longest ("abb") were asked whether they were
    #   new, and both were there before: no stop at all
    # - aa|a(?=[ab]*c) held "aa" from 0; "a" from 0 and from 1 are matches once "c" comes: the stop
    #   is the one from 0, where it was cut at 1, "a" of the stop shown
    for pattern, pieces, want in [("a|abb|ab(?=bc)", ["abb", "c"], (0, "ab")), ("aa|a(?=[ab]*c)", ["aab", "c"], (0, "a"))]:
        assert feed_unchecked(StopStringMatcher([], [pattern]), pieces, 2) == (want, 0), pattern
    # only ends within the assertions' reach of the text not checked are tried; worked by hand: a
    # lookahead's own reach (nested ones in it counted), 2 for an end or boundary assertion, 0 for
    # none; unknown where a lookahead is unbounded or a lookbehind holds an assertion
    from lmnb_engine.regex_reach import assertion_reach

    assert [assertion_reach(p) for p in ["abc", "a|abb|ab(?=bc)", "a(?=b(?=cde))", "a$", r"x\b", "a(?!bcd)",
                                         "aa|a(?=[ab]*c)", "(?<=a(?=b))c"]] == [0, 2, 4, 2, 2, 3, None, None]
    # random alternatives of which one reads past its match's end, random tokens (the text not checked
    # made of their letters): the stop is the brute-force one, nothing of it shown before it
    rng = random.Random(0)

    def word() -> str:
        return "".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))

    for _ in range(1000):
        alternatives = [word() for _ in range(rng.randint(1, 2))] + [
            word() + rng.choice([f"(?={word()})", r"\B", r"\b", f"(?!{word()})", "(?=[ab]*c)"])]
        rng.shuffle(alternatives)
        pattern = "|".join(alternatives)
        pieces = ["".join(rng.choice("ab") for _ in range(rng.randint(2, 4)))] + [
            "".join(rng.choice("abc ") for _ in range(rng.randint(1, 2))) for _ in range(3)]
        _stops_as_by_definition(pattern, pieces, 2)


def test_a_stop_regex_match_ending_where_the_text_not_checked_ends_and_reading_past_it_is_a_stop():
    """Worked by hand, min_new_tokens=3 (tokens "b", " ", "a"; the text "b " not checked): "b " from 0
    matches b[a ]*\b|a once "a" follows it (the boundary reads it) and did not in "b " alone, so it
    is new, final and met first; Python's re over the final text "b a" starts its match at 0 too.
    Only ends after the text not checked were tried for a final match from that start, so "b " was
    passed over and the stop was "a" at 2, "b " streamed. Random texts in two tokens, the first not
    checked, for patterns whose greedy match reads on to the text's end: the brute-force stop."""
    for stops in ([], ["aa"]):
        hit, shown = feed_unchecked(StopStringMatcher(stops, [r"b[a ]*\b|a"]), ["b", " ", "a"], 3)
        assert hit == (0, "b ") and shown == 0, stops
        assert re.search(r"b[a ]*\b|a", "b a").start() == hit[0]
    patterns = [r"b[a ]*\b|a", r"x[ab ]*\b|b", r"a[b ]*(?!b)|b", r"x[ab]*(?![ab])|a"]
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("abx ") for _ in range(rng.randint(2, 6)))
        cut = rng.randint(1, len(text) - 1)
        _stops_as_by_definition(rng.choice(patterns), [text[:cut], text[cut:]], 2, "abcx \n")


# Stop regexes that lmnb_engine.stop_automaton reads (no anchor, lookaround, backreference):
# lazy and greedy repeats, bounded ones, alternation, classes, negated sets, flags, Unicode
AUTOMATON_PATTERNS = [r"BEGIN[\s\S]*?END", r"B[\s\S]*E", r"ab*c|b", r"a[ab]*c|ba", r"\d+\.", r"a+b|a",
                      r"(?:ab|ba){2,3}?c", r"[^\Wb]{2}x", r"(?i)é+[ß-ü]", r"(?i)STRASSE|straße", r"[ä-ö]\w*ü",
                      r"\s+\n", r"(a|ab)(c|bcd)", r"x.{0,3}y", r"(?s)x.+?y", r"[^a\n]+\n", r"東京|京都",
                      r"😀+\d", r"(?i:É)[^\d\s]", r"(x|x)+y", r"a{2}(?:b|)c?"]
# ... and lazy repeats of a class that some character ends, which the regex package's partial search
# still reports as open when that character is the text's last (safe_len held back one token more)
LAZY_CLASS_PATTERNS = [r"[ä-ö]\w*?ü", r"x.+?y", r"a\d*?b"]
# what their texts are made of: their own characters, and words that complete them
AUTOMATON_ALPHABET = list("abcxyBEND1.é ÉßüÜöä\n東京都😀S") + ["BEGIN", "END", "straße", "STRASSE", "京都"]


def _searched_only(patterns: list[str]):
    """The request's StopRegexes with no automaton: every pattern searched by the regex package,
    as before stop_automaton (the reference)."""
    from lmnb_engine.stop_matcher import StopRegexes

    shared = StopRegexes(patterns)
    shared.automata = [None] * len(patterns)
    return shared


@pytest.mark.parametrize("give_up", [False, True])
def test_stop_regexes_read_by_an_automaton_stop_and_hold_back_as_searched_ones_do(give_up, monkeypatch):
    # Differential: a matcher reading its regexes with automata and one searching them are fed as
    # the scheduler feeds them (random texts and tokenizations, the first tokens not checked as
    # with min_new_tokens, rollbacks as with jump-forward): the same stop (cut and matched text),
    # also the brute-force one where every token was checked; the same safe length after every
    # token, but for a lazy class repeat's extra token (longer, never shorter), and no text shown
    # that the stop then cut off. With give_up, each run gives up its automaton (as where its
    # transitions keep missing the cache: AutomatonRun.given_up) after a read with chance 1/8, at
    # random points of the output: the search that takes over mid-request gives the same results.
    from lmnb_engine.stop_automaton import AutomatonRun, automaton

    if give_up:
        chance = random.Random(4)

        def count(run, read, missed):
            run.given_up = chance.random() < 1 / 8

        monkeypatch.setattr(AutomatonRun, "_count", count)
    assert all(automaton(p) is not None for p in AUTOMATON_PATTERNS + LAZY_CLASS_PATTERNS)
    rng = random.Random(11)
    hits = longer = passed = fallbacks = 0
    for _ in range(1500):
        patterns = rng.sample(AUTOMATON_PATTERNS + LAZY_CLASS_PATTERNS, rng.randint(1, 3))
        stops = rng.sample(["ab", "ü\n", "x1", "都"], rng.randint(0, 1))
        read, searched = StopStringMatcher(stops, patterns), StopStringMatcher(stops, _searched_only(patterns))
        text, checked, unchecked, rolled, shown = "", 0, rng.choice([0, 0, 0, 2, 5]), False, 0
        for token in range(30):
            if text and rng.random() < 0.05:
                text, rolled = text[: rng.randrange(len(text))], True
                checked = min(checked, len(text))
            text += "".join(rng.choice(AUTOMATON_ALPHABET) for _ in range(rng.randint(1, 3)))
            if token >= unchecked:
                hit = read.find(text, checked)
                assert hit == searched.find(text, checked), (patterns, stops, text, checked)
                if hit is not None:
                    hits += 1
                    if not (stops or unchecked or rolled):
                        assert hit == first_regex_stop_by_definition(patterns, text), (patterns, text)
                    assert rolled or shown <= hit[0], (patterns, stops, text, shown)
                    break
            checked = len(text)
            safe, reference = read.safe_len(text), searched.safe_len(text)
            if safe != reference:
                assert safe > reference, (patterns, stops, text)
                # (or the text holds a whole match, in the text not checked, which the automaton
                # says no longer match goes on from, StopAutomaton.extends, where the search alone
                # keeps it back unless the pattern's reach rules that out)
                if StopStringMatcher([], _searched_only(patterns)).find(text, 0) is not None:
                    passed += 1
                else:
                    assert set(patterns) & set(LAZY_CLASS_PATTERNS), (patterns, stops, text)
                    longer += 1
            shown = max(shown, safe)
        fallbacks += sum(run is None for run in read._runs)  # (every pattern here has an automaton)
    assert hits > 500 and 0 < longer < 200  # (the cases reach stops, not only open matches)
    assert passed > 0
    assert fallbacks == 0 if not give_up else fallbacks > 1000


@pytest.mark.parametrize("pattern, python_differs", [
    (r"(?i)i", True), (r"(?i)[^ix]", True), (r"(?i)[h-j]", True), (r"(?i)ı", True), (r"(?i:İ)", True),
    (r"(?i)I", True), (r"(?i)k", False), (r"(?i)[^kx]", False), (r"(?i)[r-t]", False), (r"x(?i:ſ)", False),
])
def test_a_stop_automaton_folds_case_as_the_regex_package_does(pattern, python_differs):
    # the automaton asks the regex package what each position takes, so under (?i) a stop regex
    # folds case as the package's search does (the Kelvin sign with "k", "ſ" with "s"; "ı" with
    # none of i, I, İ), not as Python's re, which folds i, I, ı and İ all together
    import regex

    from lmnb_engine.stop_automaton import automaton

    assert automaton(pattern) is not None
    for ch in "iIıİkK\u212asSſ":
        read, searched = StopStringMatcher([], [pattern]), StopStringMatcher([], _searched_only([pattern]))
        m = regex.search(pattern, "x" + ch)
        want = m and (m.start(), m.group())
        assert read.find("x" + ch, 0) == searched.find("x" + ch, 0) == want, (pattern, ch)
    body = pattern.removeprefix("x")
    assert any(bool(re.fullmatch(body, c)) != bool(regex.fullmatch(body, c)) for c in "iIıİ") == python_differs


def test_a_lazy_class_repeat_holds_back_only_what_may_still_begin_a_match():
    # Worked by hand: r"a\d*?b" on "a1x": no text makes a match begin at 0 ("x" is neither a digit
    # nor "b"), nor at 1 or 2, so nothing is held back. The regex package's partial search still
    # reports a partial match at 0 while "x" is the text's last character (not once "y" follows),
    # so the searched matcher held "a1x" back one token more.
    import regex

    assert regex.search(r"a\d*?b", "a1x", partial=True).partial  # (the package's answer, 2026.12)
    assert StopStringMatcher([], [r"a\d*?b"]).safe_len("a1x") == 3
    assert StopStringMatcher([], [r"a\d*?b"]).safe_len("a1") == 0
    assert StopStringMatcher([], _searched_only([r"a\d*?b"])).safe_len("a1xy") == 4


def test_an_open_stop_regex_match_is_not_searched_again_on_every_token():
    # Each token searched r"BEGIN[\s\S]*?END" twice from "BEGIN" (find, then safe_len) while its
    # match stayed open: time linear in the output per token (benches/results/
    # 2026-12-05-cpu-stop-regex.md). The automaton reads each new character once; the regex package
    # is called only for the match, once its end is known.
    m = StopStringMatcher([], [r"BEGIN[\s\S]*?END"])
    calls: list[str] = []
    real = m._regexes[0]

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    m._regexes[0] = m._shared.partial[0] = Spy()
    text = "x BEGIN"
    assert m.find(text, 0) is None and m.safe_len(text) == 2
    for _ in range(300):
        checked, text = len(text), text + " word"
        assert m.find(text, checked) is None and m.safe_len(text) == 2
    assert calls == []
    assert m.find(text + " END!", len(text)) == (2, text[2:] + " END")
    assert calls == ["finditer"]


def test_a_stop_regexs_automaton_is_given_up_where_its_transitions_keep_missing_the_cache():
    # r"a.{30}b" on a text of "a" and "c" keeps a thread per "a" among the last 31 characters: its
    # states (which "a"s) never repeat, so every character built a new transition, 3x the search's
    # time per token (benches/results/2026-12-05-cpu-stop-regex-many-threads.md). Its run gives up
    # after stop_automaton._MISS_BLOCK characters and the regex package searches it from there, with
    # the same results as searching it all along. An open BEGIN[\s\S]*?END over text of many
    # distinct characters (each one's transitions built once) keeps its automaton.
    rng = random.Random(3)
    pieces = ["".join(rng.choice("ac") for _ in range(4)) for _ in range(600)] + ["a" + "c" * 30 + "b"]
    read, searched = StopStringMatcher([], [r"a.{30}b"]), StopStringMatcher([], _searched_only([r"a.{30}b"]))
    text = ""
    for piece in pieces:
        checked, text = len(text), text + piece
        hit = read.find(text, checked)
        assert hit == searched.find(text, checked)
        if hit is not None:
            break
        assert read.safe_len(text) == searched.safe_len(text)
    assert read._runs == [None]
    assert hit == (len(text) - 32, "a" + "c" * 30 + "b")  # (none before: no "b" in the text)

    m = StopStringMatcher([], [r"BEGIN[\s\S]*?END"])
    text = "BEGIN"
    for i in range(3000):  # (3000 distinct CJK characters)
        checked, text = len(text), text + chr(0x4E00 + i)
        assert m.find(text, checked) is None and m.safe_len(text) == 0
    assert m._runs[0] is not None


def test_a_stop_regex_the_automaton_reads_is_not_given_up_for_backtracking():
    # r"(x|x)+y" on 40 x's backtracks ~2**40 steps: its search was given up past REGEX_TIMEOUT_S
    # and the request aborted, though the pattern is a plain one ("x+y"); read by the automaton it
    # is never backtracked over, and stops at its match as a search does
    m = StopStringMatcher([], [r"(x|x)+y"])
    assert m.find("x" * 40, 39) is None and m.safe_len("x" * 40) == 0 and m.problem is None
    assert m.find("x" * 40 + "y", 40) == (0, "x" * 40 + "y")


@pytest.mark.parametrize(("pattern", "text"), [
    (r"x(?ai:σ)", "a xΣ b"),  # the regex package folds case fully in a scoped (?a) group
    (r"(?i)x(?a:k)", "a x\u212a b"),  # ... and reads the Kelvin sign as k there
    (r"(?i)x(?-i:σ)|xΣ", "a xΣ b"),
])
def test_a_stop_regex_with_scoped_flags_stops_where_the_regex_package_matches(pattern, text):
    # The automaton decided each character with the scoped group's flags made global, which the
    # regex package reads otherwise: (?ai:σ) matches "Σ", the global (?ai)σ does not. So a stop
    # the regex package matches (the reference, worked out by first_regex_stop_by_definition) was
    # never met, and the text was streamed past it.
    want = first_regex_stop_by_definition([pattern], text)
    assert want is not None
    m = StopStringMatcher([], [pattern])
    got, shown = None, 0
    for end in range(1, len(text) + 1):
        if (got := m.find(text[:end], end - 1)) is not None:
            break
        shown = m.safe_len(text[:end])
    assert got == want and shown <= want[0]


def test_a_scoped_ascii_flag_is_searched_as_the_regex_package_reads_it():
    # The regex package reads a scoped (?a) by where it stands: "(?i)(?a:[^\w])" matches "é",
    # "(?i)(?a:x?[^\w])" does not. The automaton, deciding [^\w] alone, met a match at "é" that the
    # regex package then did not find, and find raised AttributeError (None.start()) in the
    # scheduler's step. Such a pattern is searched; the stop is the brute-force one (none here).
    import regex

    pattern = r"(?i)(?a:x?[^\w])"
    assert regex.search(pattern, "aéb") is None and regex.search(r"(?i)(?a:[^\w])", "é")
    m = StopStringMatcher([], [pattern])
    assert m.find("aé", 1) is None and m.find("aéb", 2) is None
    assert m.find("aéb!", 3) == first_regex_stop_by_definition([pattern], "aéb!") == (3, "!")


def test_where_the_automaton_and_the_regex_package_disagree_the_regex_package_decides():
    # An automaton that meets a match the regex package does not find (here one of "a" read for
    # the pattern "ab") must not end the output, nor crash find (it raised AttributeError): the
    # pattern is then searched, and stops where the regex package matches.
    from lmnb_engine.stop_automaton import automaton
    from lmnb_engine.stop_matcher import StopRegexes

    shared = StopRegexes(["ab"])
    shared.automata = [automaton("a")]
    m = StopStringMatcher([], shared)
    assert m.find("xa", 1) is None
    assert m.find("xab", 2) == (1, "ab")
    # ... nor say, past its match in the text not checked, that no stop can begin there: "a" of
    # "xa" may begin "ab" (the regex package finds no match in "xa": it is searched)
    held = StopStringMatcher([], shared)
    assert held.safe_len("xa") == 1 and held.safe_len("xa c") == 4


def test_a_stop_automatons_cached_transitions_hold_a_bounded_number_of_threads():
    # r"a.{250}b" on a text of "a" and "c" keeps a thread per "a" among the last 250 characters,
    # and the states (which "a"s) almost never repeat: the cache, bounded only by its number of
    # transitions (8192), grew to hundreds of MB for one shared automaton (114 MB at 3800
    # transitions). The threads of the states its transitions go from and to stay under _CACHE_THREADS.
    from lmnb_engine.stop_automaton import AutomatonRun, StopAutomaton

    a = StopAutomaton(r"a.{250}b")
    run = AutomatonRun(a)
    rng = random.Random(5)
    text = "".join(rng.choice("ac") for _ in range(3000))
    for end in range(1, len(text) + 1):
        run.read(text[:end])
    assert run.first_end is None and run.live_start(len(text)) == text.index("a", len(text) - 251)
    held = sum(len(state.threads) for state in a._held)
    assert all(hit[0].held for state in a._held for hit in state.next.values())
    assert 0 < held <= 1 << 15  # (stop_automaton._CACHE_THREADS)


def test_a_stop_regex_of_nested_repeats_of_empty_groups_gets_no_automaton_at_once():
    # Repeats of an empty group add no position, so MAX_POSITIONS never stopped writing them out:
    # (?:(?:(?:(?:){250}){250}){250}){250}x is 250**4 empty sequences (hours) before the one
    # position "x", built as the request is submitted. It is searched instead, as "x" is.
    import threading

    from lmnb_engine.stop_automaton import automaton

    pattern = r"(?:(?:(?:(?:){250}){250}){250}){250}x"
    built: list = []
    worker = threading.Thread(target=lambda: built.append(automaton(pattern)), daemon=True)
    worker.start()
    worker.join(60)  # (a generous bound: the parts read stop at a few thousand)
    assert built == [None]
    assert StopStringMatcher([], [pattern]).find("abxc", 2) == (2, "x")


def test_a_stop_regex_with_a_fuzzy_constraint_is_searched_not_read_by_an_automaton():
    # Python's parser reads "{e<=1}" as characters, the regex package as "up to one error": the
    # automaton built from the first never met "axc" for (?:abc){e<=1}, and the output ran past it
    import regex

    from lmnb_engine.stop_automaton import automaton

    for pattern, text in [(r"(?:abc){e<=1}", "zz axc"), (r"ab{i<=1}c", "xabxc"), (r"(?:stop){s<=1,e<=1}", "a stap")]:
        want = regex.search(pattern, text)
        assert want is not None and automaton(pattern) is None, pattern
        assert StopStringMatcher([], [pattern]).find(text, 0) == (want.start(), want.group()), pattern
    assert automaton(r"a{2,3}b{,2}c{4}") is not None  # (repeat counts are read)


def _searched_without_loosened_automata(patterns: list[str]):
    """The request's StopRegexes searched as before the loosened automata: from where the last
    search left the floor, over the rest of the text, on every token (the reference)."""
    from lmnb_engine.stop_matcher import StopRegexes

    shared = StopRegexes(patterns)
    shared.loosened = [None] * len(patterns)
    return shared


def test_a_searched_stop_regex_is_not_searched_while_it_has_no_match_without_its_assertions():
    # r"\bBEGIN\b[\s\S]*?\bEND\b" (no automaton: word boundaries) open from the output's start was
    # searched from there once per new character by find and once by safe_len, each over the whole
    # open match: milliseconds per token at 8000 tokens. Without its assertions it is
    # BEGIN[\s\S]*?END, whose automaton finds no match: find searches nothing
    import regex

    m = StopStringMatcher([], [r"\bBEGIN\b[\s\S]*?\bEND\b"])
    real, calls = m._regexes[0], []

    class Spy:
        def finditer(self, *a, **k):
            calls.append(a)
            return real.finditer(*a, **k)

        def __getattr__(self, attr):
            return getattr(real, attr)

    m._regexes[0] = Spy()
    text = "BEGIN"
    for _ in range(300):
        checked, text = len(text), text + " word EN"
        assert m.find(text, checked) is None
        assert m.safe_len(text) == 0
    assert calls == []
    checked, text = len(text), text + "D."
    assert m.find(text, checked) == (0, text[:-1]) and calls
    # random patterns with assertions (bounded or not), texts, tokenizations and min_new_tokens: the
    # stop is that of the search on every token, and the brute-force one where every token is
    # checked; no text of it was shown before it; no more is held back than the search holds
    rng = random.Random(9)
    assertions = [r"\b", r"\B", "$", r"(?<=x)", r"(?<!a)", r"(?=a)", r"(?!b\b)", r"(?m)^"]
    tried = differ = hits = 0
    while tried < 800:
        pattern = "".join(rng.choice([_random_pattern(rng, 1), rng.choice(assertions)]) for _ in range(rng.randint(2, 4)))
        if "(?m)" in pattern[1:]:
            pattern = "(?m)" + pattern.replace("(?m)", "")
        try:
            if regex.fullmatch(pattern, "") is not None:
                continue
        except regex.error:
            continue
        tried += 1
        m, reference = StopStringMatcher([], [pattern]), StopStringMatcher([], _searched_without_loosened_automata([pattern]))
        text, checked, unchecked, shown = "", 0, rng.choice([0, 0, rng.randint(2, 6)]), 0
        for token in range(1, 9):
            text += "".join(rng.choice("abx \n") for _ in range(rng.randint(1, 3)))
            if token >= unchecked:
                hit = m.find(text, checked)
                assert hit == reference.find(text, checked), (pattern, text, checked)
                if hit is not None:
                    if not unchecked:
                        assert hit == first_regex_stop_by_definition([pattern], text), (pattern, text)
                    assert shown <= hit[0], (pattern, text, unchecked)
                    hits += 1
                    break
            checked = len(text)
            safe, held = m.safe_len(text), reference.safe_len(text)
            assert safe >= held, (pattern, text, unchecked)
            differ += safe != held
            shown = max(shown, safe)
    assert hits > 200 and differ < tried  # (where the loosened automaton has no open match, the search is
    # skipped; the regex package's partial search holds back a start it cannot rule out:
    # "$(?<=x)a*[bc]" on "xa\n" at "\n", which no later text makes a match)


def test_past_a_whole_match_in_text_not_checked_an_automaton_says_where_a_stop_may_begin(searches):
    # "x" * 200 + "z" within min_new_tokens: r"x[^z]*w|z" matches "z" (let through), and safe_len
    # searched from its floor, then tried every start before "z" with a partial fullmatch, each
    # reading to the "z": 200 fullmatches over ~100 characters each, on every later token too
    # (quadratic in the open region). Its automaton reads on past the match and says where a
    # match that more text may complete or extend begins: nowhere before the new text here
    m = StopStringMatcher([], [r"x[^z]*w|z"])
    real, calls = m._shared.partial[0], []

    class Spy:
        def fullmatch(self, *a, **k):
            calls.append(a[1:2])
            return real.fullmatch(*a, **k)

        def __getattr__(self, attr):
            return getattr(real, attr)

    m._shared.partial[0] = Spy()
    text = "x" * 200 + "z"
    assert m.safe_len(text) == len(text)
    for piece in [" a", " xa", "b", " c"]:  # ("xab" may still become a stop: held back)
        checked, text = len(text), text + piece
        assert m.find(text, checked) is None
        assert m.safe_len(text) == (text.index("xa") if "xa" in text else len(text))
    assert calls == []
    # 8000 of them: the searches took seconds, past REGEX_TIMEOUT_S, and the request was aborted
    # as if the (linear) pattern backtracked catastrophically: a search of the x's tried every start
    # in them (quadratic), where the automaton read them once. None searches them now
    m, text = StopStringMatcher([], [r"x[^z]*w|z"]), "x" * 8000 + "z"
    searches.clear()
    assert m.safe_len(text) == len(text)
    assert m.find(text + " ab", len(text)) is None and m.safe_len(text + " ab") == len(text) + 3
    assert m.problem is None
    assert searches and all(args[0] >= 8000 for _, _, args, _ in searches), searches


def test_a_floor_past_a_whole_match_does_not_hide_it_from_a_find_after_a_rollback():
    # safe_len's floor may lie past a whole match in the text not checked (the reach, or an
    # automaton's open start, rules out any later stop before it); after a rollback (jump-forward)
    # and the same text again, find checks from before that match's end, and must meet it as a
    # fresh matcher does: it found nothing
    for pattern, text, checked in [(r"(?m)^c", "a\nc", 2), ("ab", "xab", 1), (r"\bab", " ab", 1), (r"ab|x[^z]*w", "xab", 1)]:
        m = StopStringMatcher([], [pattern])
        m.safe_len(text)  # (within min_new_tokens), then rolled back to text[:checked] and the rest again
        assert m.find(text, checked) == StopStringMatcher([], [pattern]).find(text, checked) == (checked, text[checked:])


def test_a_stop_regex_with_a_lookbehind_in_a_lookahead_holds_back_where_a_match_may_begin():
    # Worked by hand: r"a(?=.*?(?<!a))" on "aa" has no match ("a" then a place not after an "a":
    # none yet), and "aab" matches "a" from 0 (the place after "b"). Its partial search left the
    # lookbehind out, as one after the start is, and read "a(?=.*?)": a whole match "a" from 0 that
    # reads nothing past its end, passed over as one no more text makes new, so "a" was shown
    # (safe_len 1) and the stop (0, "a") came after it
    pieces = ["a", "a", "b"]
    assert first_regex_stop_by_definition([r"a(?=.*?(?<!a))"], "aab") == (0, "a")
    assert feed_unchecked(StopStringMatcher([], [r"a(?=.*?(?<!a))"]), pieces, 0) == ((0, "a"), 0)
    # random patterns of a head, a repeat and a lookahead holding a lookbehind, random tokens and
    # min_new_tokens: the stop is the brute-force one, and no text of it was shown before it (in a
    # scratch run of these 300, 4 failed before)
    rng = random.Random(5)
    heads, repeats = ["a", "b", "x", "[ab]", r"\w"], ["", "a*", "[ab]*?", ".*?", r"\w+?", "b?"]
    looks = ["(?=.*?(?<!a))", "(?=[ab]*?(?<=b))", "(?=a|(?<=b))", "(?=.*?(?<!ab)x)", "(?=(?:.(?<!x))*?b)"]
    for _ in range(300):
        pattern = rng.choice(heads) + rng.choice(repeats) + rng.choice(looks) + rng.choice(["", "a", "[bx]"])
        pieces = ["".join(rng.choice("aabx") for _ in range(rng.randint(1, 3))) for _ in range(4)]
        unchecked = rng.choice([0, 0, rng.randint(2, 4)])
        hit, shown = feed_unchecked(StopStringMatcher([], [pattern]), pieces, unchecked)
        want = _new_matches_met_first(pattern, pieces, unchecked)
        if want is None:
            assert hit is None, (pattern, pieces, unchecked)
            continue
        assert (hit[0], hit[0] + len(hit[1])) in want[1] and hit[0] == min(want[1])[0], (pattern, pieces, unchecked)
        assert shown <= hit[0], (pattern, pieces, unchecked)


@pytest.mark.parametrize("pattern, kind", [(r"(?r)ab(?=c)", "(?r)"), (r"(?r:ab)", "(?r)"), (r"x(?ri)b", "(?r)"),
                                           (r"a\Kb", r"\K"), (r"a.*?\Kb|c", r"\K")])
def test_a_reverse_stop_regex_or_one_with_keep_out_is_refused_naming_it(pattern, kind):
    # (?r) matches leftwards: "(?r)ab(?=c)" fed "a", "b", "c" never stopped (the stop is "ab" from
    # 0) and showed "ab". \K drops the text before it from the match: "a.*?\Kb" on "ba", "xb" found
    # no stop (the text holds "b" after "ax") and showed it all. Both refused where the call is made
    # (SamplingParams, so the server; gen(); a cell's option), naming the fix; "\\K" is no \K
    import lmnb as sgl
    from lmnb_engine import SamplingParams
    from lmnb_engine.params import stop_regex_problem

    fix = "remove (?r)" if kind == "(?r)" else "(?<=...), instead"
    with pytest.raises(ValueError) as e:
        SamplingParams(stop_regex=["ok", pattern]).validate()
    assert kind in str(e.value) and fix in str(e.value), str(e.value)
    with pytest.raises(ValueError, match=r"^stop_regex=.* is invalid: .*" + re.escape(fix)):
        sgl.gen("x", stop_regex=pattern)
    assert stop_regex_problem(pattern).startswith(json.dumps(pattern)) and fix in stop_regex_problem(pattern)
    assert stop_regex_problem(r"a\\Kb") is None and stop_regex_problem(r"[\\]K") is None


@pytest.mark.parametrize("pattern, escape", [
    (r"a(?#\K)b", r"\K"), ("(?x)a # \\K\nb", r"\K"), ("a(?x: # \\K\n)b", r"\K"), (r"a(?#x\)\K)b", r"\K"),
    (r"a(?#\G)b", r"\G"), ("(?x)a # \\G\nb", r"\G"),
    # where the escape is read: a "#" is no comment without (?x), nor in a class; a (?x:...)'s comment may hold ")"
    (r"a#\Kb", r"\K"), (r"(?x)a[#]\Kb", r"\K"), ("(?x:a#)\n\\Kb)", r"\K"), ("(?x)(?-x:a#\\Kb)", r"\K"),
    (r"x(?#)\Ga", r"\G"), ("a(?V1x: # \\K\n)b", r"\K"),  # (a flag group with a version: its "x" was not read)
])
def test_a_stop_regex_is_refused_for_a_keep_out_or_search_start_only_where_it_is_read_not_in_a_comment(pattern, escape):
    # "a(?#\K)b" and "(?x)a # \K" hold \K only in a comment, which the regex package skips: they
    # were refused for it. The reference: the regex package itself, whether the escape changes a
    # match (its span, searched from each start) against the pattern with the escape taken out
    import regex

    from lmnb_engine.params import stop_regex_problem

    def spans(p: str) -> list:
        compiled = regex.compile(p)
        return [m and m.span() for t in ["ab", "xab", "a#b", "a # b", "a#xab", "ba"] for pos in range(len(t))
                for m in [compiled.search(t, pos)]]

    at = pattern.index(escape)
    read = spans(pattern) != spans(pattern[:at] + pattern[at + 2:])
    problem = stop_regex_problem(pattern)
    assert (problem is not None and f"holds {escape}" in problem) == read, (pattern, problem)


def test_a_stop_regex_with_an_empty_class_is_refused_naming_what_it_keeps_from_matching_and_others_taken():
    # "[^\s\S]" was taken as a stop regex, and the regex package reads it as every character: the output
    # ended at its first. A conditional's branch, or a verbose pattern's repeat, is named with no rewrite
    # offered (the reference: Python's re, by which each still matches "b"); a class in a part repeated
    # zero times, or of U+10FFFE, a character an output may hold (the engine keeps it out of regex= only),
    # is taken, and matches as Python's re says
    import regex

    from lmnb_engine.params import stop_regex_problem

    text, hit, _ = stream(StopStringMatcher([], [r"[^\s\S]"]), ["he", "llo"])  # (what the stop matcher would do)
    assert hit == (0, "h") and regex.search(r"[^\s\S]", "h") and re.search(r"[^\s\S]", "h") is None
    assert "so the pattern can never match" in stop_regex_problem(r"[^\s\S]")
    for pattern, part in [(r"(a)?(?(1)[^\d\D]|b)", 'the branch of the conditional "(?(1)[^\\\\d\\\\D]|b)" that holds it '
                                                   "can never match"),
                          (r"(?x) [^\d\D] ? b", 'the repeat "[^\\\\d\\\\D] ?" can only match nothing')]:
        assert re.search(pattern, "b"), pattern
        problem = stop_regex_problem(pattern)
        assert f"so {part};" in problem and problem.endswith("; remove it, or write the class you meant"), problem
    # a "[" in a comment opens no class where the verbose flag holds in a group (?x:...) or globally after a
    # comment, (?#c)(?x): the empty class after it was read as part of one from that "[", and taken
    for pattern in ["(?x:a#[\n)[^\\s\\S]|b", "(?#c)(?x)a#[\n[^\\s\\S]|b"]:
        assert re.search(pattern, "ah") is None and regex.search(pattern, "ah"), pattern
        problem = stop_regex_problem(pattern)
        assert problem and "holds the class [^\\s\\S] at position" in problem and "the alternative" in problem, problem
    # ... nor, there, a "[" alone in a comment, which was read as a class of no item: an IndexError, for regex= too
    from lmnb_engine.regex_errors import pattern_problem

    assert re.fullmatch("(?#c)(?x)a#[", "a") and regex.fullmatch("(?#c)(?x)a#[", "a")
    assert stop_regex_problem("(?#c)(?x)a#[") is None and pattern_problem("(?#c)(?x)a#[") is None
    for pattern, text, stop in [(r"x(?:[^\s\S]){0}y", "axyb", "xy"), ("x[\U0010fffe]", "ax\U0010fffe", "x\U0010fffe")]:
        assert stop_regex_problem(pattern) is None and re.search(pattern, text).group() == stop
        assert stream(StopStringMatcher([], [pattern]), [text])[1] == (1, stop)


def _short_texts() -> list[str]:
    """Every text of up to 4 characters from word and non-word ones, a newline among them."""

    return ["".join(t) for n in range(5) for t in itertools.product("ab \n-é", repeat=n)]


def _matches_some(pattern: str, texts: list[str]) -> bool:
    import regex

    compiled = regex.compile(pattern)
    return any(compiled.search(t) for t in texts)


@pytest.mark.parametrize("pattern, part", [
    ("(?!)", "the negative lookaround (?!) at position 0"), ("x(?!a*)", "the negative lookaround (?!a*) at position 1"),
    ("(?<!)a", "the negative lookaround (?<!) at position 0"),
    (r"a\bb", r"the word boundary \b at position 1"), (r" \b-", r"the word boundary \b at position 1"),
    (r"(?i)[a-z]\bé", r"the word boundary \b at position 9"), (r"(x\w\b\w)+", r"the word boundary \b at position 4"),
    (r"a\B ", r"\B at position 1"), (r"a\Ab", r"\A at position 1"), ("a^b", "^ at position 1"),
    ("(?m)a^b", "^ at position 5"), (r"a\Z\n", r"\Z at position 1"), ("$a", "$ at position 0"),
    ("(?m:a$b)", "$ at position 5"), (r"(?=a\bb)", r"the word boundary \b at position 4"),
    # (beside other assertions and lookarounds, which consume nothing; a lookaround's character)
    ("(?m)a$^b", "$ at position 5"), ("(?m)a^$b", "^ at position 5"), (r"a(?=b)\b", r"the word boundary \b at position 6"),
    (r"(?<=a)\bb", r"the word boundary \b at position 6"), (r"a(?!x)\B-", r"\B at position 6"),
])
def test_a_stop_regex_that_an_assertion_keeps_from_ever_matching_is_refused_naming_it(pattern, part):
    # "a\bb", "$a", "(?!)" were taken and never matched: the output ran to its max tokens and the
    # user never learned why; so were "(?m)a$^b", "a(?=b)\b", their assertion beside another
    # assertion or a lookaround. The reference: the regex package (the stop matcher's reader) finds no
    # match in any text of up to 4 characters of word, non-word and newline ones
    import lmnb as sgl
    from lmnb_engine import SamplingParams
    from lmnb_engine.params import stop_regex_problem

    assert not _matches_some(pattern, _short_texts())
    problem = stop_regex_problem(pattern)
    assert problem and problem.startswith(json.dumps(pattern, ensure_ascii=False) + " can never match") and part in problem, problem
    with pytest.raises(ValueError, match=re.escape(part)):
        SamplingParams(stop_regex=["ok", pattern]).validate()
    with pytest.raises(ValueError, match=r"^stop_regex=.* is invalid: .*can never match"):
        sgl.gen("x", stop_regex=pattern)


def test_a_stop_regex_whose_assertion_may_hold_or_may_be_done_without_is_taken():
    # an alternative, an optional part or a negative lookaround lets the pattern match without the
    # assertion; "$" before "\n", "^" after it, "\b" beside a character of either kind, or beside a
    # group: each matches one of the short texts (the regex package's own search), and is taken
    from lmnb_engine.params import stop_regex_problem

    texts = _short_texts()
    for pattern in [r"a\bb|b", r"(a\bb)?b", r"(a\bb)*b", r"a(?!a\bb)", "a$\n", "(?m)\n^b", r".\b.", r"\Ba\B",
                    r"a\b-", r"a\b(?:-)", r"(a)\bb|\n", r"a(?!(?=a))", r"a(?!b?)|b", "a\\b\\b-"]:
        assert _matches_some(pattern, texts), pattern
        assert stop_regex_problem(pattern) is None, pattern


def test_no_stop_regex_refused_for_an_assertion_matches_any_short_text():
    # soundness, over random patterns of characters, classes, assertions, groups, repeats and
    # alternatives: every one refused as never matching matches none of the short texts (a false
    # refusal would turn a working stop away); and some are refused
    import random

    from lmnb_engine.regex_never import never_problem

    rng = random.Random(7)
    atoms = ["a", "b", " ", "-", r"\n", "é", ".", r"\w", r"\W", "[a ]", r"[^\n]", r"\s"]
    asserts = [r"\b", r"\B", r"\A", r"\Z", "^", "$", "(?!)", "(?<!)", "(?!a?)", "(?!b)", "(?=a)", "(?<=a)", "(?<= )",
               r"(?=\n)", r"(?<=\n)", "(?=-|a)"]
    texts, refused = _short_texts(), 0
    for _ in range(400):
        items = [rng.choice(atoms + asserts) for _ in range(rng.randint(2, 5))]
        if rng.random() < 0.3:
            at = rng.randrange(len(items))
            items[at] = f"(?:{items[at]}{rng.choice(atoms)}){rng.choice(['', '?', '+', '*'])}"
        pattern = rng.choice(["", "(?m)", "(?i)", "(?s)"]) + "".join(items) + rng.choice(["", "|b", "|(?!)"])
        if never_problem(pattern):
            refused += 1
            assert not _matches_some(pattern, texts), pattern
    assert refused > 50


def _least_stop_start(pattern: str, text: str, alphabet: str, longest: int = 2, checked: bool = False) -> int:
    """Where the first stop that a text extending ``text`` by up to ``longest`` characters of
    ``alphabet``, the output ending there, may hold begins, by the matcher's own ``find`` of each
    (a stop met before the output's end is met there either way), ``text`` being checked
    (``checked``: find met no stop in it) or not (the first min_new_tokens); ``len(text)`` where
    none does: what may be shown of ``text`` is the text before it."""
    from lmnb_engine.stop_matcher import StopRegexes

    shared = StopRegexes([pattern])  # (read once for every matcher here, as a request's samples share it)
    least = len(text)
    for n in range(0, longest + 1):
        for more in itertools.product(alphabet, repeat=n):
            m = StopStringMatcher([], shared)
            if checked:
                m.find(text, 0)
            hit = m.find(text + "".join(more), len(text), at_end=True)
            least = min(least, hit[0]) if hit else least
    return least


@pytest.mark.parametrize("pattern", [r"a$", r"(?m)a$", r"a\n?$", r"a\b", r"ab\b", r"\ba\b", r" \b", r"a\Z",
                                     r"(?m)^a$", r"(?<=a)b$", r"a$|ab"])
def test_text_before_a_stop_regex_ending_in_an_end_assertion_is_shown_once_no_stop_can_begin_in_it(pattern):
    # "xa" of a$ in the first min_new_tokens (not checked; "a" a match there is passed over), then
    # " ": "a " was held back, though no text after it makes a stop begin in it ($ after "a" fails
    # once " " follows), until the next token; a$ on "aa" held it all, "a\b" on "a" the "a". Now
    # what is shown is all before where a stop may yet begin, by the definition: the least start of
    # a stop that find meets in any text extending it by up to 2 characters (as far as these
    # patterns read past a match), each text being checked (a stop not found in it) or not
    alphabet = "ab \n"

    for text in ["".join(t) for n in range(1, 4) for t in itertools.product(alphabet, repeat=n)]:
        want = _least_stop_start(pattern, text, alphabet)
        assert StopStringMatcher([], [pattern]).safe_len(text) == want, (pattern, text)
        checked = StopStringMatcher([], [pattern])
        if checked.find(text, 0) is None:
            assert checked.safe_len(text) == _least_stop_start(pattern, text, alphabet, checked=True), (pattern, text)


def test_no_text_a_stop_regex_may_yet_begin_a_stop_in_is_shown_for_random_patterns_with_end_assertions():
    # soundness of the starts safe_len now passes over at the text's end, over random patterns of
    # characters, classes, anchors, boundaries and lookbehinds: nothing shown lies at or past where
    # a stop may begin in a text longer by up to 3 characters (_least_stop_start: more than a start
    # passed over for its matches all ending in the text needs, whose stop 2 would show), each
    # text checked or not

    rng = random.Random(11)
    atoms = ["a", " ", r"\n", ".", r"\w", r"\W", "[a ]", "a?", "(?:a |a)", "[a ]{1,2}"]
    asserts = [r"\b", r"\B", r"\Z", "$", "^", r"\A", "(?<=a)", "(?<! )"]
    texts = ["".join(t) for n in range(1, 4) for t in itertools.product("a \n", repeat=n)]
    for _ in range(25):
        items = [rng.choice(atoms + asserts) for _ in range(rng.randint(1, 3))]
        pattern = rng.choice(["", "(?m)"]) + "".join(items) + rng.choice(asserts) + rng.choice(["", "|a$"])
        if re.search(pattern, ""):
            continue
        for text in texts:
            want = _least_stop_start(pattern, text, "a \n", longest=3)
            assert StopStringMatcher([], [pattern]).safe_len(text) <= want, (pattern, text)
            checked = StopStringMatcher([], [pattern])
            if checked.find(text, 0) is None:
                assert checked.safe_len(text) <= _least_stop_start(pattern, text, "a \n", 3, True), (pattern, text)


def test_an_open_stop_regex_match_after_its_head_is_not_searched_again_and_streams_as_the_search_said(monkeypatch):
    # \bBEGIN\b[\s\S]*?\bEND\b after "BEGIN": safe_len searched the open match to the text's end on
    # every token (linear in its length, quadratic over the output); now a head matched whole
    # before a repeat of any character keeps the match open with no search. What is shown and
    # found is the search's (the reference: the same matcher with no head, which searches), over
    # random streams, min_new_tokens or not
    from lmnb_engine import stop_matcher

    rng = random.Random(3)
    for pattern in [r"\bBEGIN\b[\s\S]*?\bEND\b", r"\ba[\s\S]*?b\b", r"(?s)a.*?b$", r"a[ab]?[\s\S]+?b",
                    r"(?<= )a[\d\D]*?b", r"(?m)^a[\s\S]*?^b", r"a[\s\S]*?(?!b)c", r"a\B[\s\S]*?\bb"]:
        assert stop_matcher._open_head(pattern) is not None, pattern
        for _ in range(60):
            pieces = ["".join(rng.choice("aab \nBEGIN") for _ in range(rng.randint(1, 3))) for _ in range(12)]
            unchecked = rng.choice([0, rng.randint(1, 12)])
            new, searched = StopStringMatcher([], [pattern]), StopStringMatcher([], [pattern])
            searched._shared.open_heads = [None]
            assert feed_unchecked(new, pieces, unchecked) == feed_unchecked(searched, pieces, unchecked), (pattern, pieces)
    for pattern in ["a|b[\\s\\S]*", "(a[\\s\\S]*)b", "x[\\s\\S]*+y", "(?x)a [\\s\\S]*b", r"\[\s\S]*b", "ab.*c"]:
        assert stop_matcher._open_head(pattern) is None, pattern  # (an alternative, a group, possessive, ...)
    # an open match over 500 tokens: the search runs only until the head is matched
    calls = []
    live_start = stop_matcher._live_start
    monkeypatch.setattr(stop_matcher, "_live_start", lambda *args, **kwargs: calls.append(1) or live_start(*args, **kwargs))
    m, text = StopStringMatcher([], [r"\bBEGIN\b[\s\S]*?\bEND\b"]), "x BEGIN"
    for _ in range(500):
        text += " word"
        assert m.find(text, len(text) - 5) is None and m.safe_len(text) == 2
    assert calls == []


def test_a_stop_regex_given_up_names_a_lookahead_that_reads_on_without_bound():
    # "a[\s\S]*?(?=[^z]*z)|a" after 200 "a"s in min_new_tokens, then one more, was given up for
    # "catastrophic backtracking, as in a repeat of overlapping alternatives" it does not hold: its
    # lookahead reads to the output's end from each start (cubic work per token). The message now
    # names that lookahead where the pattern has one, as written, outside classes and comments
    import regex

    from lmnb_engine.regex_reach import unbounded_lookahead

    for pattern, named in [(r"a[\s\S]*?(?=[^z]*z)|a", "(?=[^z]*z)"), (r"a(?!b*c)", "(?!b*c)"), (r"(x|x)+y", None),
                           (r"a(?=b{1,3})", None), (r"[(?=a*)]x", None), (r"a(?#(?=b*)c", None), (r"(?<=a*)b", None)]:
        assert unbounded_lookahead(pattern) == named, pattern
        m = StopStringMatcher([], [pattern])
        m._timed_out(0, regex.compile(pattern), "a" * 201)
        assert m.problem.startswith(f"stop_regex {json.dumps(pattern)} took over ") and "(x|x)+" in m.problem
        assert (f"or the lookahead {named}, which reads on without bound" in m.problem) == (named is not None), m.problem


def test_a_stop_regex_given_up_names_a_long_open_stretch_as_a_cause_and_bounded_repeats_as_a_fix():
    # a linear pattern left open over a long run (a\w*(?!\w) over ~850 letters without a space,
    # searched again after each token) was given up as "catastrophic backtracking" alone, naming
    # a cause it does not have; the message names both and their fixes (forced, as above)
    import regex

    pattern = r"a\w*(?!\w)"
    m = StopStringMatcher([], [pattern])
    m._timed_out(0, regex.compile(pattern), "a" * 856)
    assert m.problem.startswith(f"stop_regex {json.dumps(pattern)} took over ") and "856 characters" in m.problem
    for words in ["a long stretch where a match may still begin or end", "catastrophic backtracking",
                  r"bound its repeats (\w{1,64} for \w*) or use a stop string"]:
        assert words in m.problem, words


def test_a_one_character_item_is_written_back_as_a_pattern_matching_the_same_characters():
    # the stop automaton and the never-matching check (regex_never) write a literal, a negated one,
    # "." and a class back as a pattern (one writer, regex_tree.one_character); the reference: the
    # regex package's own reading of the item as written, over characters of every kind
    import regex

    from lmnb_engine.regex_tree import one_character
    from lmnb_engine.regex_tree import parser as sre

    characters = "aZé_1 \n\t-]^\\[\U0001f600\u212a"
    for item in ["a", "é", "]", "\\^", "[^a]", ".", "[a-c\\d_]", "[^\\s\\W]", "[\\S\\D-]", "[\\]\\\\^]", "[^\\n]"]:
        (op, av), = sre.parse(item)
        written = regex.compile(one_character(op.name, av))
        want = regex.compile(item)
        assert [bool(written.fullmatch(c)) for c in characters] == [bool(want.fullmatch(c)) for c in characters], item
    assert one_character("AT", None) is None and one_character("IN", sre.parse(r"[\x00-\x7f\w]")[0][1]) is not None
    (op, av), = sre.parse("(?u:[\\w])")[0][1][3]
    assert one_character(op.name, av) == "[\\w]"


def test_the_never_matching_check_searches_each_class_beside_a_word_boundary_once(monkeypatch):
    # "\w\b\W" 40 times searched all 1.1 million characters an output may hold 4 times per \b
    # (160 searches, 4 s for a 240-character stop_regex, in gen(), SamplingParams and the engine
    # each); a class is searched for once (cached), a literal not at all (it is its one character).
    # The reference for the answers: the regex package's own search of a text the pattern matches,
    # or of every short text for one refused
    import regex

    from lmnb_engine import regex_empty_class
    from lmnb_engine.regex_never import never_problem

    searches = []
    every = regex_empty_class._text_characters
    monkeypatch.setattr(regex_empty_class, "_text_characters", lambda: searches.append(1) or every())
    for pattern, text, most in [("q" + r"\w\b\W" * 40, "q" + "a-" * 40, 4), ("q" + r"a\b-é\Bb" * 30, "q" + "a-éb" * 30, 0),
                                (r"(?m)[ab]\b[ab]", None, 4)]:
        searches.clear()
        problem = never_problem(pattern)
        if text is None:
            assert problem is not None and not _matches_some(pattern, _short_texts())
        else:
            assert problem is None and regex.search(pattern, text)
        assert len(searches) <= most, (pattern, len(searches))


def test_ending_by_matches_where_that_many_characters_follow_and_raises_on_a_pattern_that_does_not_compile():
    """stop_relaxed.ending_by, worked by hand: a+ in "aaab" with at least one character after it,
    leftmost-longest, is "aaa"; with exactly two, "aa"; a|ab on "ab" with none after, "ab"; a
    verbose pattern ending in a comment still takes the lookahead. A pattern that does not compile
    itself raises regex.error (its docstring said None): callers pass compiled patterns only."""
    import regex

    from lmnb_engine.stop_relaxed import ending_by

    assert ending_by("a+", 1).match("aaab").group() == "aaa"
    assert ending_by("a+", 2, exact=True).match("aaab").group() == "aa"
    assert ending_by("a|ab", 0).match("ab").group() == "ab"
    assert ending_by("(?x) a+ # c", 1).match("aab").group() == "aa"
    with pytest.raises(regex.error):
        ending_by("(", 0)
