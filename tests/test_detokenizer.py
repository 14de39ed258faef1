"""Incremental detokenization (no broken UTF-8, same text as a one-shot decode) and stop strings."""

from __future__ import annotations

import pytest

from lmnb_engine.detokenizer import IncrementalDetokenizer, StopStringMatcher


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


TEXTS = ["hello world, the cat is red", "café naïve 東京 😀 and 🎉🎉 ok", "json {\"key\": 12}\n\n3 plus 4"]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_one_shot_decode_and_never_breaks_utf8(tokenizer, text):
    prompt = tokenizer.encode("the answer is", add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add(t) for t in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == tokenizer.decode(ids)
    if any(ord(c) > 0x7FF for c in text):  # multi-byte characters span several byte-level tokens
        assert any(d == "" for d in deltas[:-1])


def test_incomplete_bytes_at_the_end_are_flushed(tokenizer):
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte token is missing
    detok = IncrementalDetokenizer(tokenizer, [])
    streamed = "".join(detok.add(t) for t in cut)
    assert "\ufffd" not in streamed
    assert streamed + detok.flush() == tokenizer.decode(cut)


def test_rollback_restores_the_exact_state(tokenizer):
    ids = tokenizer.encode("the blue bird 東京 flew", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    for t in ids:
        detok.add(t)
    full = detok.text
    for keep in (0, 2, len(ids) - 1):
        detok.rollback(keep)
        assert detok.num_tokens == keep
        again = "".join(detok.add(t) for t in ids[keep:])
        assert detok.text == full and full.endswith(again)
    with pytest.raises(ValueError, match="cannot keep"):
        detok.rollback(len(ids) + 1)


def test_special_tokens_are_skipped_or_kept(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("</s>")
    ids = tokenizer.encode("red", add_special_tokens=False) + [eos]
    for skip, expected in ((True, "red"), (False, "red</s>")):
        detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        assert "".join(detok.add(t) for t in ids) + detok.flush() == expected


def test_stop_string_found_across_chunks_and_held_back():
    m = StopStringMatcher(["o w", "STOP", ""])
    text, checked = "", 0
    shown = []
    for piece in ["Hel", "lo", " w", "orld"]:
        text += piece
        hit = m.find(text, checked)
        checked = len(text)
        if hit:
            break
        shown.append(text[: m.safe_len(text)])
    assert hit == (4, "o w")
    # "Hello" ends with "o", a prefix of "o w": the "o" was never shown before the match
    assert shown == ["Hel", "Hell"]
    assert text[: hit[0]] == "Hell"


def test_stop_matcher_without_stops_and_earliest_match():
    assert StopStringMatcher([]).find("anything", 0) is None
    assert StopStringMatcher([]).safe_len("abc") == 3
    m = StopStringMatcher(["cd", "bcd", "x"])
    assert m.find("abcdx", 0) == (1, "bcd")
    assert m.safe_len("zzb") == 2 and m.safe_len("zbc") == 1 and m.safe_len("zz") == 2
