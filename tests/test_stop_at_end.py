"""Stops in the text the detokenizer held back until the output's end (Scheduler._stop_at_end).

Llama 2's form of tokenizer writes "\\n" (and each character outside its vocabulary) as byte tokens,
whose run the detokenizer holds back until a token read as text ends it: a run that ends the output
(its EOS next, or max_new_tokens) comes out only when the output ends, and a stop in it is met
there, as where the run ends earlier: the text cut where the stop begins, finish reason the stop.
"""

from __future__ import annotations

import pytest

from tests.helpers_scripted import run_streamed, scripted


@pytest.fixture(scope="module")
def engine(tiny_llama2_bytes):
    from lmnb_engine.engine import Engine

    # (each step sampled once the last one's token is in: the scripted sampler reads the output's length)
    with Engine(str(tiny_llama2_bytes), max_total_tokens=1024, disable_overlap_schedule=True) as eng:
        yield eng


def _ids(engine, *tokens: str) -> list[int]:
    return engine.tokenizer.convert_tokens_to_ids(list(tokens))


def test_a_stop_string_in_byte_tokens_that_end_the_output_is_met_there_as_where_text_follows(engine, monkeypatch):
    """" ok" <0x0A> then the EOS: the "\\n" was held back at <0x0A> and came out only at the end,
    unread, so stop "\\n" kept it, " ok\\n" with finish reason the EOS id. Now met there: " ok",
    matched "\\n", as where " ok" follows the "\\n" (the run then ends a token later); the ids end
    with <0x0A>, whose text ends the stop (test_the_tokens_wholly_past_a_stop_are_dropped)."""
    ok, newline = _ids(engine, "▁ok", "<0x0A>")
    script = scripted(engine, monkeypatch, [ok, newline, ok])
    r, _ = run_streamed(engine, "\n")
    assert r.token_ids == script[:2] and r.text == " ok"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n"}
    script = scripted(engine, monkeypatch, [ok, newline])
    r, deltas = run_streamed(engine, "\n")
    assert r.token_ids == script[:2] and r.text == " ok"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n"}
    assert deltas[-1] == ""  # (the last chunk sends none of the stop: " ok" went out before)
    # a stop beginning in the text read before: "k\\n" holds "k" back from the stream, then cuts it
    r, deltas = run_streamed(engine, ["x", "k\n"])
    assert r.text == " o" and r.finish_reason.matched == "k\n" and "k" not in "".join(deltas)


def test_a_stop_in_byte_tokens_cut_by_max_new_tokens_is_met_there(engine, monkeypatch):
    """max_new_tokens 2 ends " ok" <0x0A> " ok" after <0x0A>: the finish reason was length, the text
    " ok\\n"; now the stop "\\n", the text " ok" (the ids are the two)."""
    ok, newline = _ids(engine, "▁ok", "<0x0A>")
    script = scripted(engine, monkeypatch, [ok, newline, ok])
    r, _ = run_streamed(engine, "\n", max_new_tokens=2)
    assert r.token_ids == script[:2] and r.text == " ok"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n"}


def test_a_character_of_byte_tokens_ending_the_output_meets_a_stop_string_and_a_stop_regex(engine, monkeypatch):
    """"中" is outside the vocabulary: its UTF-8 bytes E4 B8 AD, three byte tokens, held back until the
    output's end after " ok". The stop string "中", a stop regex matching it (read in text after a
    character, no end assertion: ``reads_end`` False), and a stop string holding a special token's
    text beside it (``stop_special``, whose own end check read that stop only) each meet it there."""
    ok, *han = _ids(engine, "▁ok", "<0xE4>", "<0xB8>", "<0xAD>")
    script = scripted(engine, monkeypatch, [ok, *han])
    assert engine.tokenizer.decode(script[:-1]) == "ok中"
    r, deltas = run_streamed(engine, "中")
    assert r.token_ids == script[:-1] and r.text == " ok"  # (through the last byte of "中", not the EOS) and r.finish_reason.matched == "中" and deltas[-1] == ""
    r, _ = run_streamed(engine, stop_regex=r"k[^a-z ]")
    assert r.text == " o" and r.finish_reason.to_dict() == {"type": "stop", "matched": "k中"}
    r, _ = run_streamed(engine, ["\n<s>", "中"])
    assert r.text == " ok" and r.finish_reason.matched == "中"
    # where no stop is met, the whole text, the EOS the finish reason, as before
    r, _ = run_streamed(engine, "x")
    assert r.text == " ok中" and r.finish_reason.matched == script[-1]


def test_a_stop_regex_match_that_only_the_max_tokens_cut_ends_is_no_stop(engine, monkeypatch):
    """``ok$`` on " ok" " ok" cut there by max_new_tokens 2: its match reads the output's end, which
    the cut made, so the output was cut, not stopped: the finish reason is ``length`` and the text
    the whole output, " ok ok", as without the regex (it was a stop, the text " ok " cut before
    "ok"). Where the EOS ends the same output the end is the output's own: a stop, " ok ", matched
    "ok" (Python's re.search over the finished text), the ids through the second " ok" (the EOS after
    the stop dropped); a match settled by text that came (``\\bok\\b``
    at the first "ok", a space after it) stops the cut output too, as before."""
    ok = _ids(engine, "▁ok")[0]
    script = scripted(engine, monkeypatch, [ok, ok])
    r, _ = run_streamed(engine, stop_regex="ok$", max_new_tokens=2)
    assert r.token_ids == script[:2] and r.text == " ok ok"
    assert r.finish_reason.to_dict() == {"type": "length", "length": 2}
    r, _ = run_streamed(engine, stop_regex="ok$")
    assert r.token_ids == script[:2] and r.text == " ok " and r.finish_reason.to_dict() == {"type": "stop", "matched": "ok"}
    r, _ = run_streamed(engine, stop_regex=r"\bok\b", max_new_tokens=2)
    assert r.text == " " and r.finish_reason.to_dict() == {"type": "stop", "matched": "ok"}


def test_the_tokens_wholly_past_a_stop_are_dropped(engine, monkeypatch):
    """The ids, logprobs and completion_tokens of a stop's output end with the token whose text ends
    the stop, as SGLang's, which checks after each token and stops there: " ok" <0x0A> " ok" then
    the EOS with stop "\\n" (the "\\n", held back at <0x0A>, came with the second " ok") kept the
    three ids, now the two ids of " ok" and <0x0A> (the text " ok"), with two logprobs and
    completion_tokens 2; the same with the EOS next (it kept the EOS). A token whose text straddles
    the stop's end stays: stop " o" in " ok" keeps " ok" (text "")."""
    ok, newline = _ids(engine, "▁ok", "<0x0A>")
    for pieces in ([ok, newline, ok], [ok, newline]):
        scripted(engine, monkeypatch, pieces)
        r, _ = run_streamed(engine, "\n", return_logprob=True)
        assert (r.token_ids, r.text, r.meta.completion_tokens) == ([ok, newline], " ok", 2)
        assert [lp.token_id for lp in r.logprobs] == [ok, newline]
    scripted(engine, monkeypatch, [ok, ok])
    r, _ = run_streamed(engine, " o", return_logprob=True)
    assert (r.token_ids, r.text, r.meta.completion_tokens, len(r.logprobs)) == ([ok], "", 1, 1)


def test_a_stop_regex_met_empty_at_the_outputs_start_keeps_the_token_it_was_met_after(engine, monkeypatch):
    """(?= ok) matches the empty string before " ok": with " ok" the first token, the stop begins
    and ends at 0, so the tokens through its end are none; the output keeps the token after which
    it was met (text "", one id, completion_tokens 1), as SGLang keeps the tokens it read and cuts
    only the text, and as a stop string inside the first token keeps it (" o" above). Without the
    floor of one token in Scheduler._cut_at_stop, the result had no ids, completion_tokens 0."""
    ok = _ids(engine, "▁ok")[0]
    scripted(engine, monkeypatch, [ok, ok])
    r, _ = run_streamed(engine, stop_regex="(?= ok)", return_logprob=True)
    assert (r.token_ids, r.text, r.meta.completion_tokens, len(r.logprobs)) == ([ok], "", 1, 1)
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": ""}


def test_a_stop_met_late_keeps_min_new_tokens_tokens(engine, monkeypatch):
    """A stop is read from the min_new_tokens-th token on, so the tokens a check first ran after
    stay, as in SGLang (its first check is there): " ok" <0x0A> " ok" " ok" with stop "\n" and
    min_new_tokens=3 meets the "\n" (held back at <0x0A>) as the third token comes, and keeps the
    three ids, three logprobs and completion_tokens 3 (not the two through <0x0A>: fewer tokens than
    min_new_tokens), the text " ok" as before."""
    ok, newline = _ids(engine, "▁ok", "<0x0A>")
    scripted(engine, monkeypatch, [ok, newline, ok, ok])
    r, _ = run_streamed(engine, "\n", min_new_tokens=3, return_logprob=True)
    assert (r.token_ids, r.text, r.meta.completion_tokens) == ([ok, newline, ok], " ok", 3)
    assert [lp.token_id for lp in r.logprobs] == [ok, newline, ok]
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n"}
