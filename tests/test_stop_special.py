"""lmnb_engine.stop_special: which stop strings stop at a special token."""

from __future__ import annotations

import pytest

from tests.helpers_scripted import run_streamed, scripted


def test_the_stops_that_are_a_skipped_tokens_text_map_to_its_id(tiny_llama):
    """The tiny tokenizer's special tokens (tiny_checkpoint.SPECIAL_TOKENS, ids 0-6 in that order)
    are the ones a decode skipping special tokens leaves out; an added token that is not special
    stays in the text (the stop matcher finds it there), and a string holding a special token's
    text among other text is no token's."""
    from transformers import AutoTokenizer

    from lmnb_engine.stop_special import skipped_tokens, special_stops
    from lmnb_engine.testing.tiny_checkpoint import SPECIAL_TOKENS

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    tok.add_tokens(["<plain>"])  # (special=False: decoded in the text)
    plain = tok.convert_tokens_to_ids("<plain>")
    assert skipped_tokens(tok) == {text: (i,) for i, text in enumerate(SPECIAL_TOKENS)}
    stops = ["<|end|>", "x<|end|>", "<plain>", "</s>", "end"]
    assert special_stops(tok, stops, skip_special_tokens=True) == {6: "<|end|>", 1: "</s>"}
    assert special_stops(tok, stops, skip_special_tokens=False) == {}
    assert tok.decode([plain], skip_special_tokens=True) == "<plain>"


# --- stop strings holding a special token's text among other text ---------------------------------

_END, _USER = "<|end|>", "<|user|>"
_TEXTS = {6: _END, 4: _USER}  # (the tiny tokenizer's ids of these two: tiny_checkpoint.SPECIAL_TOKENS)


def test_special_text_stops_read_the_text_with_the_tokens_text_put_back_and_cut_before_the_stop():
    """Hand-made output: "Hi\\n", then <|end|> (token 3) sitting at 3, then "ok" (token 4). The
    text read is "Hi\\n<|end|>ok"; "\\n<|end|>" begins at 2 of the output text, and ends at 3 (the
    token's place); the first listed of two stops ending there wins, and a stop beginning inside a
    token's text begins where the token sits."""
    from lmnb_engine.stop_special import SpecialTextStops

    marks = [(3, 6, 3)]
    stops = SpecialTextStops(["\n<|end|>"], ["\n<|end|>"], _TEXTS)
    assert stops.find("Hi\n", [], 2, 2) is None
    assert stops.safe_len("Hi\n", []) == 2  # ("\n" may begin the stop)
    assert stops.find("Hi\n", marks, 3, 3) == (2, "\n<|end|>")
    # the plain matcher's stop "Hi" ends first; one ending at the same place ranks by list order
    assert stops.find("Hi\n", marks, 3, 3, hit=(0, "Hi")) == (0, "Hi")
    listed = ["\n", "\n<|end|>"]
    assert SpecialTextStops(["\n<|end|>"], listed, _TEXTS).find("Hi\n", marks, 3, 3, hit=(2, "\n")) == (2, "\n")
    both = SpecialTextStops(["<|end|>", "\n<|end|>"], ["\n<|end|>", "<|end|>"], _TEXTS)
    assert both.find("Hi\n", marks, 3, 3) == (2, "\n<|end|>")
    both = SpecialTextStops(["<|end|>", "\n<|end|>"], ["<|end|>", "\n<|end|>"], _TEXTS)
    assert both.find("Hi\n", marks, 3, 3) == (3, "<|end|>")
    # after the token: "<|end|>ok" begins at the token's place; "d|>o" inside its text, there too
    after = SpecialTextStops(["<|end|>ok"], ["<|end|>ok"], _TEXTS)
    assert after.safe_len("Hi\n", marks) == 3 and after.safe_len("Hi\no", marks) == 3
    assert after.safe_len("Hi\nox", marks) == 5  # (all of it)
    inside = SpecialTextStops(["d|>o"], ["d|>o"], _TEXTS)
    assert inside.find("Hi\no", marks, 3, 4) == (3, "d|>o")
    assert after.find("Hi\nok", marks, 4, 4) == (3, "<|end|>ok")
    # a stop met in text read before (the first `checked` characters, older tokens' text) is not new
    assert after.find("Hi\nok", marks, 5, 5) is None


def test_special_text_stops_wait_for_text_held_back_before_a_token_and_read_again_after_a_rollback():
    """A token sitting past the text's end (the text before it held back: SentencePiece byte tokens
    of "\\n" before <|end|>, which a skipped token does not end) is put back once the text gets
    there; another special token between the parts is no match; a rollback is read again."""
    from lmnb_engine.stop_special import SpecialTextStops

    stops = SpecialTextStops(["\n<|end|>"], ["\n<|end|>"], _TEXTS)
    held = [(3, 6, 3)]  # "\n" of tokens 1-2 held: <|end|> (token 3) sits at 3 of "Hi\n"
    assert stops.find("Hi", held, 2, 3) is None
    assert stops.safe_len("Hi", held) == 2
    assert stops.find("Hi\n", held, 2, 4) == (2, "\n<|end|>")  # (the text came with token 4)
    between = [(3, 4, 3), (4, 6, 3)]  # "Hi\n<|user|><|end|>"
    assert stops.find("Hi\n", between, 3, 4) is None and stops.safe_len("Hi\n", between) == 3
    # rolled back to "Hi\n" and <|end|>: read anew, not as an extension of the last text
    assert stops.find("Hi\n", held, 3, 3) == (2, "\n<|end|>")


@pytest.fixture(scope="module")
def engine(tiny_llama):
    from lmnb_engine.engine import Engine

    # (each step sampled once the last one's token is in: the scripted sampler reads the output's length)
    with Engine(str(tiny_llama), max_total_tokens=2048, disable_overlap_schedule=True) as eng:
        yield eng


def _run(engine, stop, **options):
    return run_streamed(engine, stop, **options)[0]


def test_a_stop_string_holding_a_special_tokens_text_among_other_text_ends_the_output_before_it(engine, monkeypatch):
    """The tiny model's <|end|> (id 6) is a special token the output text leaves out, so "\\n<|end|>"
    was never in the text read and the output ran on to its EOS ("Hi\\nmore" read, finish reason
    the EOS id). It is now read in the text with <|end|> put back, "Hi\\n<|end|>more": the stop is
    met at <|end|>, the text returned (and streamed) is the text before the stop, "Hi", and the
    finish reason names it, as SGLang's (which reads stops in its output's tail decoded with special
    tokens kept)."""
    end = engine.tokenizer.convert_tokens_to_ids(_END)
    assert end == 6
    script = scripted(engine, monkeypatch, ["Hi", "\n", end, "more"])
    k = script.index(end)
    r = _run(engine, "\n<|end|>")
    assert r.token_ids == script[: k + 1] and r.text == "Hi"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n<|end|>"}
    r = _run(engine, ["Hi\n<|end|>"])  # (from the output's start)
    assert r.token_ids == script[: k + 1] and r.text == "" and r.finish_reason.matched == "Hi\n<|end|>"
    # with the stop that is the token's text: the first listed of two ending at <|end|> wins
    r = _run(engine, ["\n<|end|>", "<|end|>"])
    assert r.token_ids == script[: k + 1] and r.text == "Hi" and r.finish_reason.matched == "\n<|end|>"
    r = _run(engine, ["<|end|>", "\n<|end|>"])
    assert r.token_ids == script[: k + 1] and r.text == "Hi\n" and r.finish_reason.matched == "<|end|>"
    # a stop string without a special token's text ending first still wins, as before
    r = _run(engine, ["\n<|end|>", "\n"])
    assert r.token_ids == script[:k] and r.text == "Hi" and r.finish_reason.matched == "\n"
    # with special tokens kept, the output text holds the stop, found there as before
    r = _run(engine, "\n<|end|>", skip_special_tokens=False)
    assert r.token_ids == script[: k + 1] and r.text == "Hi" and r.finish_reason.matched == "\n<|end|>"


def test_a_stop_string_beginning_with_a_special_tokens_text_ends_the_output_at_that_token(engine, monkeypatch):
    """"<|end|>\\nUser:" in "Hi" <|end|> "\\nUser: x": met at ":", the text before <|end|>, "Hi";
    "\\nUse" after the token was held back from the stream meanwhile (it may begin the stop). A special
    token between the parts is no match (the text read is "Hi<|user|><|end|>\\nUser: x" for
    "<|user|>\\nUser:"... and "Hi<|end|><|user|>\\nUser: x" for the stop "<|end|>\\nUser:"): the output
    runs on to its EOS, its text "Hi\\nUser: x"."""
    tok = engine.tokenizer
    end, user = tok.convert_tokens_to_ids(_END), tok.convert_tokens_to_ids(_USER)
    script = scripted(engine, monkeypatch, ["Hi", end, "\nUser:", " x"])
    r = _run(engine, "<|end|>\nUser:")
    assert r.token_ids == script[: script.index(tok.convert_tokens_to_ids(":")) + 1] and r.text == "Hi"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "<|end|>\nUser:"}
    script = scripted(engine, monkeypatch, ["Hi", end, user, "\nUser:", " x"])
    r = _run(engine, "<|end|>\nUser:")
    assert r.token_ids == script and r.text == "Hi\nUser: x" and r.finish_reason.matched == script[-1]
    r = _run(engine, "<|end|><|user|>\nUser:")
    assert r.text == "Hi" and r.finish_reason.matched == "<|end|><|user|>\nUser:"


def test_a_stop_reading_text_held_back_before_a_special_token_is_met_once_the_text_comes(tiny_llama2_bytes, monkeypatch):
    """Llama 2's tokenizer form writes "\\n" as the byte token <0x0A>, whose run a skipped special
    token does not end: at <s> (a special token here) the "\\n" is still held back, so "\\n<s>" is met
    one token later, as the text comes (" ok" <0x0A> <s> " ok": the text " ok", the ids through <s>,
    which ends the stop, the " ok" after it dropped), or where the output ends before then (its EOS
    next: the ids through <s>, the EOS dropped too, and the text " ok", where the EOS's own id was
    the finish reason and the text " ok\\n")."""
    from transformers import AutoTokenizer

    from lmnb_engine.engine import Engine

    tok = AutoTokenizer.from_pretrained(str(tiny_llama2_bytes))
    ok, newline, bos = tok.convert_tokens_to_ids(["▁ok", "<0x0A>", "<s>"])
    assert tok.decode([ok, newline, bos, ok], skip_special_tokens=False) == "ok\n<s> ok"
    with Engine(str(tiny_llama2_bytes), max_total_tokens=1024, disable_overlap_schedule=True) as engine:
        script = scripted(engine, monkeypatch, [ok, newline, bos, ok])
        r = _run(engine, "\n<s>")
        assert r.token_ids == script[:3] and r.text == " ok" and r.finish_reason.matched == "\n<s>"
        script = scripted(engine, monkeypatch, [ok, newline, bos])
        r = _run(engine, "\n<s>")
        assert r.token_ids == script[:3] and r.text == " ok" and r.finish_reason.matched == "\n<s>"


def test_a_stop_string_holding_the_eos_tokens_text_among_other_text_yields_to_the_eos(engine, monkeypatch):
    """"\\n</s>" on "Hi" "\\n" </s>, where </s> is the model's EOS (a chat template's end of message
    often is: Phi-3's <|end|>, Qwen's <|im_end|>): the EOS id is checked first, as SGLang's
    Req.check_finished does, so the output ends there with the EOS id as its finish reason and the
    text before the token, "Hi\\n", the newline kept. Under ignore_eos the EOS ends nothing and the
    stop string is met at that token: "Hi", matched "\\n</s>" (what docs/language.md says)."""
    eos = engine.tokenizer.convert_tokens_to_ids("</s>")
    assert engine.tokenizer.eos_token_id == eos
    script = scripted(engine, monkeypatch, ["Hi", "\n"])
    assert script[-1] == eos
    r = _run(engine, "\n</s>")
    assert r.token_ids == script and r.text == "Hi\n" and r.finish_reason.to_dict() == {"type": "stop", "matched": eos}
    r = _run(engine, "\n</s>", ignore_eos=True)
    assert r.token_ids == script and r.text == "Hi"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "\n</s>"}


def test_a_stop_holding_a_special_tokens_text_written_out_in_plain_tokens_is_read_with_skipped_tokens_put_back(
        engine, monkeypatch):
    """"<|end|>\\nUser:" written out by plain tokens ("<|en", "d|>", ...; not the special token) is in
    the text SGLang reads (the output's tail decoded keeping special tokens), so it stops there:
    "Hi", matched the stop. With the special token <|user|> sampled inside it ("<|en" <|user|>
    "d|>\\nUser:"), that text is "Hi<|en<|user|>d|>\\nUser: x", which holds no stop: the output runs
    on to its EOS, its text the output text (special tokens left out), "Hi<|end|>\\nUser: x". Its
    stop strings holding a special token's text were read in the output text too, without the
    skipped token, so it stopped there ("Hi")."""
    tok = engine.tokenizer
    user = tok.convert_tokens_to_ids(_USER)
    script = scripted(engine, monkeypatch, ["Hi", "<|en", "d|>", "\nUser:", " x"])
    assert _END not in tok.convert_ids_to_tokens(script)  # (written out, not the special token)
    r = _run(engine, "<|end|>\nUser:")
    assert r.token_ids == script[: script.index(tok.convert_tokens_to_ids(":")) + 1] and r.text == "Hi"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": "<|end|>\nUser:"}
    script = scripted(engine, monkeypatch, ["Hi", "<|en", user, "d|>", "\nUser:", " x"])
    r = _run(engine, "<|end|>\nUser:")
    assert r.token_ids == script and r.text == "Hi<|end|>\nUser: x"
    assert r.finish_reason.to_dict() == {"type": "stop", "matched": script[-1]}


def test_a_stop_that_is_a_special_tokens_whole_text_written_out_in_plain_tokens_around_a_skipped_token_is_no_stop(
        engine, monkeypatch):
    """"<|end|>" (the special token's whole text, met by its id) written out by plain tokens ("<|en",
    "d|>"; not the special token) is in the text SGLang reads (the output's tail decoded keeping
    special tokens), so it stops there: "Hi", matched "<|end|>". With the special token <|user|>
    sampled inside it ("<|en" <|user|> "d|>"), that text is "Hi<|en<|user|>d|> x", which holds no
    stop: the output runs on to its EOS, its text the output text (special tokens left out),
    "Hi<|end|> x". The plain matcher read that stop in the output text, without the skipped token,
    so it stopped there ("Hi"). A stop listed beside it that holds no special token's text is met
    in the output text as ever."""
    tok = engine.tokenizer
    user = tok.convert_tokens_to_ids(_USER)

    def run(pieces, stop, through):
        """The result of ``pieces`` scripted under ``stop``, checked to keep the tokens of the first
        ``through`` pieces (None: all, the EOS too)."""
        script = scripted(engine, monkeypatch, pieces)
        assert _END not in tok.convert_ids_to_tokens(script)  # (written out, not the special token)
        r = _run(engine, stop)
        ids = [i for p in pieces[:through] for i in ([p] if isinstance(p, int) else tok.encode(p, add_special_tokens=False))]
        assert r.token_ids == (script if through is None else ids)
        return r, script

    r, _ = run(["Hi", "<|en", "d|>", " x"], _END, 3)
    assert r.text == "Hi" and r.finish_reason.to_dict() == {"type": "stop", "matched": _END}
    r, script = run(["Hi", "<|en", user, "d|>", " x"], _END, None)
    assert r.text == "Hi<|end|> x" and r.finish_reason.to_dict() == {"type": "stop", "matched": script[-1]}
    # <|user|> sampled before and after the stop's plain tokens: it is met
    r, _ = run(["Hi", user, "<|en", "d|>", user, " x"], _END, 4)
    assert r.text == "Hi" and r.finish_reason.to_dict() == {"type": "stop", "matched": _END}
    # a second occurrence after the broken one is met; a stop with no special token's text, as ever
    r, _ = run(["Hi", "<|en", user, "d|>", " x", "<|en", "d|>", " y"], _END, 7)
    assert r.text == "Hi<|end|> x" and r.finish_reason.to_dict() == {"type": "stop", "matched": _END}
    r, _ = run(["Hi", "<|en", user, "d|>", " x"], [_END, "|> x"], 5)
    assert r.text == "Hi<|end" and r.finish_reason.to_dict() == {"type": "stop", "matched": "|> x"}
