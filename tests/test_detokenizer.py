"""Incremental detokenization (no broken UTF-8, same text as a one-shot decode)."""

from __future__ import annotations

import random

import pytest

from lmnb_engine.detokenizer import IncrementalDetokenizer
from tests.helpers_engine import utf8_whole_characters


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


@pytest.mark.parametrize("text, cut", [("ok 中文", -1), ("ok 中文", -2), ("ok 中文", -4), ("café", -1), ("é", -1)])
def test_incomplete_bytes_at_the_end_are_left_out(tokenizer, text, cut):
    # a cut inside a character (its last byte tokens missing; "caf" + "fÃ" holds a whole "f" and
    # half an "é") leaves the character out of the text, flushed or streamed, as vLLM does
    ids = tokenizer.encode(text, add_special_tokens=False)[:cut]
    assert tokenizer.decode(ids).endswith("\ufffd")  # (the cut does fall inside a character)
    detok = IncrementalDetokenizer(tokenizer, [])
    streamed = "".join(detok.add(t) for t in ids)
    assert streamed + detok.flush() == detok.text == utf8_whole_characters(tokenizer, ids)
    assert "\ufffd" not in detok.text and detok.num_tokens == len(ids)


def test_the_bytes_of_a_cut_character_are_read_with_the_tokenizers_family_read_once(tokenizer, monkeypatch):
    # reading the family serializes the whole tokenizer (0.16 s for 150,000 tokens): once per
    # tokenizer, not once per request that ends inside a character
    from lmnb_engine import detokenizer_bytes

    calls = []
    real = detokenizer_bytes._decoder_types
    monkeypatch.setattr(detokenizer_bytes, "_decoder_types", lambda tok: calls.append(tok) or real(tok))
    ids = tokenizer.encode("ok 中", add_special_tokens=False)[:-1]
    for _ in range(3):
        detok = IncrementalDetokenizer(tokenizer, [])
        assert "".join(detok.add(t) for t in ids) + detok.flush() == "ok "
    assert len(calls) <= 1


def test_bytes_that_never_form_a_character_stay_replacement_characters(tokenizer):
    lead = tokenizer.encode("中", add_special_tokens=False)[0]  # a lead byte followed by ASCII: invalid for good
    ids = [lead] + tokenizer.encode("ok", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(detok.add(t) for t in ids) + detok.flush() == utf8_whole_characters(tokenizer, ids) == "\ufffdok"
    # and at the end: a lone continuation byte (the second of "中") can begin no character
    ids = tokenizer.encode("ok", add_special_tokens=False) + tokenizer.encode("中", add_special_tokens=False)[1:2]
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(detok.add(t) for t in ids) + detok.flush() == utf8_whole_characters(tokenizer, ids) == "ok\ufffd"


def test_stray_bytes_stream_as_they_come_with_byte_level_bpe(tokenizer, decoded):
    # byte-level BPE decodes a stray continuation byte (0x80 alone) to a U+FFFD no later byte
    # changes; so a lead byte followed by another lead byte (E4 E4), and the first byte of "é"
    # followed by "f" (the token "fÃ", f C3, repeated). add held back any text ending in U+FFFD,
    # so it held such bytes for good: the window grew with them, decoded twice a token (4000 stray
    # bytes: 0.7 s, time quadratic in the run). Now the text is streamed up to a character cut at
    # its end: each stray byte's U+FFFD as it comes, each E4's when the next E4 shows it begins no
    # character, each "f" + U+FFFD when the next "f" does. Counted in ids decoded; the text is the
    # one-shot decode.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    char = bytes_to_unicode()
    ok, space_ok = (tokenizer.encode(t, add_special_tokens=False) for t in ("ok", " ok"))
    f_c3 = tokenizer.convert_tokens_to_ids("f" + char[0xC3])
    assert tokenizer.convert_ids_to_tokens(f_c3) == "fÃ"
    runs = tokenizer.convert_tokens_to_ids([char[0x80]] * 600 + [char[0xE4]] * 600) + [f_c3] * 600
    ids = ok + runs + space_ok
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("the answer", add_special_tokens=False))
    deltas = [detok.add(t) for t in ids]
    stray, lead, split = (deltas[len(ok) + k : len(ok) + k + 600] for k in (0, 600, 1200))
    assert stray == ["\ufffd"] * 600 and lead == [""] + ["\ufffd"] * 599 and split == ["\ufffd"] + ["f\ufffd"] * 599
    want = "ok" + "\ufffd" * 1200 + "f\ufffd" * 600 + " ok"
    assert "".join(deltas) + detok.flush() == detok.text == tokenizer.decode(ids) == want
    assert sum(decoded) <= 6 * len(ids), sum(decoded)


def test_random_byte_level_outputs_stream_their_one_shot_decode(tokenizer):
    # Byte-level BPE, random outputs of vocabulary tokens (merges such as "fÃ": a whole "f" and
    # the first byte of "é"), bytes that spell characters, stray continuation bytes, lead bytes
    # that begin no character, a surrogate's ED A0, U+FFFD itself and EOS, cut anywhere, after a
    # prompt and none, with rollbacks: the text streamed is at every token a start of the final
    # text, which is the whole characters of the output's bytes (utf8_whole_characters): the
    # tokenizer's one-shot decode (EOS skipped) less the U+FFFD of a character cut at the end.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    char = bytes_to_unicode()
    eos = tokenizer.convert_tokens_to_ids("</s>")
    vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.added_tokens_decoder]  # (chat markers aside)
    spelled = [b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\xa9", b"\xef\xbf\xbd", b"a", b" "]
    invalid = [b"\x80", b"\xbf", b"\xe4", b"\xe4\xb8", b"\xed\xa0", b"\xf0\x9f", b"\xff", b"\xc0", b"\xf4\x90"]
    rng = random.Random(0)

    def output():
        ids = []
        for _ in range(rng.randint(1, 8)):
            kind = rng.choice(["vocab", "vocab", "spelled", "invalid", "eos"])
            if kind == "vocab":
                ids.append(rng.choice(vocab))
            elif kind == "eos":
                ids.append(eos)
            else:
                ids += tokenizer.convert_tokens_to_ids([char[b] for b in rng.choice(spelled if kind == "spelled" else invalid)])
        return ids

    prompts = [tokenizer.encode("the answer is", add_special_tokens=False), []]
    for n in range(300):
        detok, ids, texts = IncrementalDetokenizer(tokenizer, rng.choice(prompts)), output(), []
        while detok.num_tokens < len(ids):
            detok.add(ids[detok.num_tokens])
            texts.append(detok.text)
            if rng.random() < 0.05:
                keep = rng.randint(0, detok.num_tokens)
                detok.rollback(keep)
                del texts[keep:]
                ids[keep:] = output()
        detok.flush()
        out = [i for i in ids if i != eos]
        want = utf8_whole_characters(tokenizer, out)
        assert detok.text == want and all(want.startswith(t) for t in texts), (n, ids)
        assert tokenizer.decode(out) in (want, want + "\ufffd")  # (the cut character's U+FFFD)


def test_added_tokens_read_as_the_decoder_reads_their_text(tiny_llama, byte_fallback):
    # The tokenizers library runs added tokens' text through the decoder with the rest: ByteLevel
    # reads "café" as c a f E9 (the characters of its byte table), "caf" + U+FFFD, whose E9 the
    # next bytes B8 AD complete: "caf鸭". The detokenizer read an added token as no bytes, so
    # it streamed "caf" + U+FFFD and the final text read "caf" + three U+FFFD, and flush dropped
    # the text after a lead byte that an added token ending in U+FFFD followed ("ok" for "ok" +
    # C3 + "x\ufffd"). The text is now the one-shot decode, less a character cut at the end.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))  # (its own: add_tokens changes it)
    contents = ["café", "xä", "<added>", "x\ufffd", "中ä"]
    tok.add_tokens(contents)
    tok.add_special_tokens({"additional_special_tokens": ["<sä>"]})
    char = bytes_to_unicode()
    cafe, x_a, added, x_fffd, cjk_a, special = tok.convert_tokens_to_ids(contents + ["<sä>"])
    byte = (lambda *bs: tok.convert_tokens_to_ids([char[b] for b in bs]))
    ok = tok.encode("ok", add_special_tokens=False)
    # worked by hand from ByteLevel's rule (the decode below agrees): a cut character left out
    cases = [([cafe], True, "caf"), ([cafe] + byte(0xB8, 0xAD), True, "caf鸭"), ([x_a] + byte(0xB8), True, "x"),
             (ok + byte(0xC3) + [x_fffd], True, "ok\ufffdx\ufffd"),
             (byte(0xE4) + [added] + byte(0xB8), True, "\ufffd<added>\ufffd"),
             (byte(0xE4) + [special] + byte(0xB8), True, ""),  # (skipped: E4 B8, a cut character)
             (byte(0xE4) + [special] + byte(0xB8), False, "\ufffd<s\ufffd>\ufffd"),
             ([cjk_a] + byte(0xB8), True, "中ä\ufffd")]  # ("中" is not in the table: its UTF-8 bytes)
    for ids, skip, want in cases:
        assert tok.decode(ids, skip_special_tokens=skip) in (want, want + "\ufffd"), ids
        detok = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
        assert "".join(detok.add(t) for t in ids) + detok.flush() == detok.text == want, (ids, skip)
    # random outputs of added tokens, bytes and vocabulary tokens, ended by "ok" (no cut): each
    # text streamed is a start of the final text, which is the one-shot decode
    spelled = [b"\xe4\xb8\xad", b"\xc3\xa9", b"\xb8\xad", b"\xa9", b"\x80", b"\xe4", b"\xc3", b"\xf0\x9f"]
    pool = [[cafe], [x_a], [added], [x_fffd], [cjk_a], [special]] + [byte(*b) for b in spelled] + [ok]
    rng = random.Random(0)
    for n in range(300):
        ids = [i for _ in range(rng.randint(1, 8)) for i in rng.choice(pool)] + ok
        skip = rng.random() < 0.5
        want = tok.decode(ids, skip_special_tokens=skip)
        detok, texts = IncrementalDetokenizer(tok, rng.choice([[], ok]), skip_special_tokens=skip), []
        for t in ids:
            detok.add(t)
            texts.append(detok.text)
        assert detok.flush() == "" and detok.text == want and all(want.startswith(t) for t in texts), (n, ids, skip)
    # SentencePiece byte fallback: flush dropped the text after a cut byte there too ("ok")
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(byte_fallback.backend_tokenizer.to_str()),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.add_tokens(["x\ufffd"])
    ids = [tok.convert_tokens_to_ids("▁ok"), 1 + 0xC3, tok.convert_tokens_to_ids("x\ufffd")]
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(detok.add(t) for t in ids) + detok.flush() == tok.decode(ids) == "ok\ufffd x\ufffd"


@pytest.mark.parametrize("tail, cut", [((0xED, 0xA0), False), ((0xED, 0xBF), False), ((0xED,), True), ((0xED, 0x9F), True)])
def test_a_surrogates_first_bytes_at_the_end_read_as_the_tokenizer_decodes_them(tokenizer, byte_fallback, tail, cut):
    # ED A0..BF would begin a UTF-16 surrogate, which UTF-8 never encodes: no byte completes them,
    # and the tokenizer's decode reads them as two U+FFFD. Python's incremental decoder holds them
    # back all the same (for its "surrogatepass" handler), so flush left them out as a cut
    # character: "ok" where the one-shot decode reads "ok" + two U+FFFD. ED alone and ED 9F (the
    # start of U+D7C0) are cut characters, left out as before.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    char = bytes_to_unicode()
    for tok, ids in ((tokenizer, tokenizer.encode("ok", add_special_tokens=False)
                      + tokenizer.convert_tokens_to_ids([char[b] for b in tail])),
                     (byte_fallback, [byte_fallback.convert_tokens_to_ids("▁ok")] + [1 + b for b in tail])):
        want = tok.decode(ids[: len(ids) - len(tail)] if cut else ids)
        assert want == ("ok" if cut else "ok" + "\ufffd" * len(tail))
        detok = IncrementalDetokenizer(tok, [])
        assert "".join(detok.add(t) for t in ids) + detok.flush() == detok.text == want, (tok, tail)
    # the text start of a byte token after them in a run (completions' text_offset): past their
    # two U+FFFD, as the decode up to it reads them
    ids = [byte_fallback.convert_tokens_to_ids("▁ok")] + [1 + b for b in tail] + [1 + ord("A")]
    detok = IncrementalDetokenizer(byte_fallback, [])
    for t in ids:
        detok.add(t)
    assert detok.newest_text_start() == len(byte_fallback.decode(ids[:-1])) - (len(tail) if cut else 0)


@pytest.fixture(scope="module")
def byte_fallback():
    """Llama 2's tokenizer form, built offline (``lmnb_engine.testing.byte_fallback``)."""
    from lmnb_engine.testing.byte_fallback import byte_fallback_tokenizer

    return byte_fallback_tokenizer()


def _metaspace_form(byte_fallback):
    """``byte_fallback`` with the decoder ``Metaspace("▁")``, ``ByteFallback``, ``Fuse`` (the form of
    transformers' TIPSv2 tokenizer): each token's "▁" read as a space (dropped in the first), then
    the bytes."""
    from tokenizers import Tokenizer, decoders
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(byte_fallback.backend_tokenizer.to_str())
    backend.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _incomplete_tail(raw: bytes) -> int:
    """How many bytes at the end of ``raw`` begin a character that more bytes would complete (0
    if none), by trying completions: the tail plus 1-3 continuation bytes (from a set that meets
    every lead byte's range of second bytes) decodes as exactly one character."""
    import itertools

    for k in (3, 2, 1):
        tail = raw[-k:] if len(raw) >= k else None
        for n in range(1, 4) if tail else ():
            for more in itertools.product((0x80, 0x90, 0xA0, 0xBF), repeat=n):
                try:
                    if len((tail + bytes(more)).decode("utf-8")) == 1:
                        return k
                except UnicodeDecodeError:
                    pass
    return 0


def _byte_fallback_reference(tok, prompt, out):
    """What the detokenizer's text of ``out`` after ``prompt`` must be, worked from the tokenizer's
    one-shot decode: ``out`` with its skipped special tokens and the bytes of a character cut at
    its end (``_incomplete_tail``) left out, decoded after a piece ("a", the text's one-shot
    decode then being the rest of the whole decode) where the prompt is not empty (its own bytes
    at its end, if any, would read with the output's), else alone."""
    special = set(tok.all_special_ids)
    out = [i for i in out if i not in special]
    k = 0
    while k < len(out) and tok.convert_ids_to_tokens(out[len(out) - 1 - k]).startswith("<0x"):
        k += 1  # the run of byte tokens at the end
    out = out[: len(out) - _incomplete_tail(bytes(i - 1 for i in out[len(out) - k:]))]
    if not prompt:
        return tok.decode(out)
    head = tok.encode("a", add_special_tokens=False)
    return tok.decode(head + out)[len(tok.decode(head)):]


def test_a_byte_fallback_output_reads_as_the_tokenizer_decodes_it_less_a_cut_character(byte_fallback):
    # Worked with the tokenizers library's ByteFallback decoder: a run of byte tokens that is not
    # valid UTF-8 reads as one U+FFFD per byte, so "ok" + <0xE4><0xB8> (a "中" missing its last
    # byte, invalid for good once <0xE4> follows) + <0xE4> cut there is "ok" + two U+FFFD. Python's
    # "replace" reads E4 B8 as one U+FFFD, which the stream gave.
    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [ok] + byte(0xE4, 0xB8, 0xE4)
    assert tok.decode(ids[:-1]) == "ok\ufffd\ufffd"
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(detok.add(t) for t in ids) + detok.flush() == detok.text == "ok\ufffd\ufffd"
    # random outputs of pieces, byte-spelled characters, bytes that never form one (also right
    # after a character, in one run with it), skipped special tokens inside runs and a cut inside
    # a character, each prefix flushed, after prompts ending in a piece, in the bytes of a
    # character and inside one, and no prompt: the text is the tokenizer's one-shot decode of the
    # ids less the bytes of the character cut (_byte_fallback_reference)
    pieces = [tok.convert_tokens_to_ids(p) for p in ("▁", "a", "b", "ok", "▁a", "▁ok", "é")]
    chars = [b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\x9f", b"A"]  # 中 😀 ß, and an ASCII byte
    invalid = [b"\xff", b"\xc0", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xad", b"\x80"]  # invalid before a piece
    rng = random.Random(0)
    head = tok.encode("a b", add_special_tokens=False)
    prompts = [head, head + byte(0xC3, 0x9F), head + byte(0xE4, 0xB8) + [tok.eos_token_id], []]
    for _ in range(400):
        ids = []
        for _ in range(rng.randint(1, 8)):
            kind = rng.choice(["piece", "char", "invalid", "eos"])
            if kind == "piece":
                ids.append(rng.choice(pieces))
            elif kind == "eos":
                ids.append(tok.eos_token_id)
            else:
                ids += byte(*rng.choice(chars if kind == "char" else invalid))
        if rng.random() < 0.6:  # a cut inside a character
            c = rng.choice(chars[:3])
            ids += byte(*c[: rng.randint(1, len(c) - 1)])
        prompt = rng.choice(prompts)
        for n in range(1, len(ids) + 1):
            out = ids[:n]
            detok = IncrementalDetokenizer(tok, prompt)
            streamed = "".join(detok.add(t) for t in out) + detok.flush()
            assert streamed == detok.text == _byte_fallback_reference(tok, prompt, out), (prompt, out)


@pytest.mark.parametrize("bytes_, after, want", [
    ((0xE4, 0xB8, 0xAD), True, "ok中 ok"),  # one character split across three tokens
    ((0xE4, 0xB8, 0xAD, 0xFF), True, "ok" + "\ufffd" * 4 + " ok"),  # a spoilt run: each byte U+FFFD
    ((0xE4, 0xB8, 0xAD, 0xFF), False, "ok" + "\ufffd" * 4),  # the same, ending the output
    ((0xE4, 0xB8, 0xAD, 0xAD), True, "ok" + "\ufffd" * 4 + " ok"),  # a stray continuation byte spoils it too
    ((0xFF, 0xE4, 0xB8, 0xAD), True, "ok" + "\ufffd" * 4 + " ok"),  # invalid, then valid: one run
    ((0xE4, 0xB8, 0xAD, 0xE4, 0xB8), False, "ok中"),  # a run cut at the end: the cut character left out
    ((0xFF, 0xE4, 0xB8), False, "ok\ufffd"),
])
def test_a_run_of_byte_tokens_streams_as_the_tokenizer_decodes_the_whole_output(byte_fallback, bytes_, after, want):
    # The tokenizers library's ByteFallback decoder reads a run of byte tokens at once: valid
    # UTF-8 as its characters, else one U+FFFD per byte, so a stray byte after the bytes of "中"
    # turns that "中" into U+FFFD too. The run's text is held back until a piece ends it (or the
    # output does), so the text streamed is what the tokenizer's one-shot decode gives (wanted
    # texts worked by hand from that rule; before, "中" was streamed as soon as its last byte
    # came, and the text read "ok中" + "\ufffd" where the decode read four U+FFFD).
    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [ok] + byte(*bytes_) + ([ok] if after else [])
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == detok.text == want
    assert deltas[1 : 1 + len(bytes_)] == [""] * len(bytes_)  # (nothing of the run before it ends)
    cut = 2 if bytes_[-1] == 0xB8 else 0
    assert want == tok.decode(ids[: len(ids) - cut])  # the one-shot decode, less a cut character's bytes
    # a skipped special token (an EOS inside the run) does not end it; one kept does
    eos = tok.eos_token_id
    ids = [ok] + byte(0xE4, 0xB8, 0xAD) + [eos] + byte(0xFF) + [ok]
    for skip, want in ((True, "ok" + "\ufffd" * 4 + " ok"), (False, "ok中</s>\ufffd ok")):
        detok = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
        assert "".join(detok.add(t) for t in ids) + detok.flush() == want == tok.decode(ids, skip_special_tokens=skip)


def test_other_families_never_end_inside_a_character_and_keep_a_real_replacement_character():
    # WordPiece, and Unigram with a Metaspace decoder and no byte fallback, decode token strings,
    # which are whole characters: every output, a "\ufffd" token at its end included, streams as
    # the tokenizer decodes it (flush's docstring). (This held before; it pins the claim.)
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["a", "b", "中", "\ufffd", "😀"]
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, **{p: 1 + i for i, p in enumerate(pieces)},
                                            **{"##" + p: 6 + i for i, p in enumerate(pieces)}}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0)] + [(p, -1.0) for p in pieces] + [("▁" + p, -1.0) for p in pieces],
                                       unk_id=0))
    unigram.decoder = decoders.Metaspace()
    rng = random.Random(0)
    for backend in (wordpiece, unigram):
        tok = PreTrainedTokenizerFast(tokenizer_object=backend)
        for _ in range(200):
            ids = [rng.randrange(backend.get_vocab_size()) for _ in range(rng.randint(1, 6))]
            detok = IncrementalDetokenizer(tok, [])
            assert "".join(detok.add(t) for t in ids) + detok.flush() == tok.decode(ids), ids


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


def test_direct_rust_decode_gives_what_transformers_decode_gives(tiny_llama):
    """The detokenizer calls the fast tokenizer's Rust ``decode`` itself; random id sequences
    (special ids included) decode as ``PreTrainedTokenizerFast.decode`` does, both ways of
    ``skip_special_tokens``, and a tokenizer that cleans up spaces keeps its cleanup."""
    import random

    from transformers import AutoTokenizer

    from lmnb_engine.detokenizer import _decoder

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))]
        for skip in (True, False):
            assert _decoder(tok, skip)(ids) == tok.decode(ids, skip_special_tokens=skip)
    # a tokenizer that asks for the cleanup step goes through transformers' decode, whose rules
    # for it vary with the version and the tokenizer model
    tok.clean_up_tokenization_spaces = True
    ids = tok.encode("red , blue .", add_special_tokens=False)
    calls, decode = [], tok.decode
    tok.decode = lambda ids, **kw: calls.append(ids) or decode(ids, **kw)
    assert _decoder(tok, True)(ids) == decode(ids, skip_special_tokens=True) and calls == [ids]


@pytest.mark.parametrize("bytes_", [(0xE4, 0xB8, 0xAD, 0xE4, 0xB8, 0xAD), (0xE4, 0xB8, 0xAD, 0xFF), (0xFF, 0xE4, 0xB8, 0xAD),
                                    (0xE4, 0xB8), (0xFF,)])
def test_the_newest_tokens_text_start_is_past_the_whole_characters_before_it(byte_fallback, bytes_):
    # completions' text_offset: a byte token begins after the whole characters before it (the
    # output so far less a cut character's bytes, _byte_fallback_reference), and the piece ending
    # a run where its own text (" ok", read after "a") begins in the decode of the output up to
    # it. Before, text_offset was worked from a second detokenizer that streamed "中" before a
    # stray byte spoilt it: the piece after "ok" E4 B8 AD FF was put at 5 of the returned text,
    # "ok" + four U+FFFD + " ok", inside the U+FFFD (6 is the space).
    from types import SimpleNamespace

    from lmnb_engine.http_server.openai_api import CompletionLogprobs

    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [ok] + byte(*bytes_) + [ok]
    a = tok.encode("a", add_special_tokens=False)
    own_ok = len(tok.decode(a + [ok])) - len(tok.decode(a))  # " ok": 3
    want = [len(_byte_fallback_reference(tok, [], ids[:i])) if tok.convert_ids_to_tokens(t).startswith("<0x")
            else len(tok.decode(ids[: i + 1])) - (own_ok if i else 2) for i, t in enumerate(ids)]
    detok = IncrementalDetokenizer(tok, [])
    starts = []
    for t in ids:
        detok.add(t)
        starts.append(detok.newest_text_start())
    assert starts == want
    engine = SimpleNamespace(tokenizer=tok, decode=lambda ids, skip_special_tokens=False: tok.decode(ids))
    lps = [SimpleNamespace(token_id=t, logprob=-1.0, top=None) for t in ids]
    assert CompletionLogprobs(engine, 10, None, []).add(lps)["text_offset"] == [10 + w for w in want]


def _newest_text_start_by_decoding(detok):
    """``newest_text_start`` as it was worked before a held run was read from its bytes (the
    reference): a token held after held tokens begins after the text ``flush`` would give them,
    decoded; a token that ends a hold, after the held tokens' text in the decode up to it."""
    prefix, read, start = detok._history[-2]
    ids = detok._ids
    if read >= len(ids) - 1:
        return start
    if detok._history[-1][2] == start:
        newest = ids.pop()
        try:
            return start + len(detok._pending_text())
        finally:
            ids.append(newest)
    window_before, held = detok._decode(ids[prefix:read]), detok._decode(ids[prefix:-1])
    if held.startswith(window_before) and detok._decode(ids[prefix:]).startswith(held):
        return start + len(held) - len(window_before)
    return start


def test_text_starts_inside_random_runs_of_byte_tokens_are_the_decoded_ones(byte_fallback):
    # newest_text_start reads a held run of byte tokens from its bytes (_RunLength) where it
    # decoded the whole run for each of its tokens; the starts are those the decodes give
    # (_newest_text_start_by_decoding), and for a token that adds no text, the length of the
    # output before it as the tokenizer's one-shot decode reads it less a cut character
    # (_byte_fallback_reference). Random outputs of long runs: characters split into byte tokens,
    # spaces and ASCII as bytes, bytes that spoil a run, EOS inside runs (skipped and kept), runs
    # cut at the end; after prompts ending in a piece, in bytes, and none (nothing decoded before
    # the run: decoded as before); with rollbacks; with a decoder that strips each string
    # before joining them (" A" spelled in bytes reads "A": not read from the bytes); and with
    # TIPSv2's decoder, Metaspace before ByteFallback (read from the bytes, as Llama 2's).
    from tokenizers import Tokenizer, decoders
    from transformers import PreTrainedTokenizerFast

    from lmnb_engine.detokenizer import _run_bytes

    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Strip(" ", 1, 0),
                                         decoders.Fuse()])
    strips_each = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    metaspace = _metaspace_form(tok)
    assert _run_bytes(tok) is not None and _run_bytes(strips_each) is None and _run_bytes(metaspace) is not None
    pieces = [tok.convert_tokens_to_ids(p) for p in ("▁", "a", "ok", "▁ok", "é")]
    chars = [b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\x9f", b"A", b" ", b"\xef\xbf\xbd"]  # 中 😀 ß A, space, U+FFFD
    invalid = [b"\xff", b"\xc0", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xad", b"\x80", b"\xed\xa0", b"\xf4\x90"]
    head = tok.encode("a b", add_special_tokens=False)
    prompts = [head, head + byte(0xC3, 0x9F), head + byte(0xE4, 0xB8) + [tok.eos_token_id], []]
    rng = random.Random(0)

    def output():
        ids = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.choice(["piece", "run", "run", "eos"])
            if kind == "piece":
                ids.append(rng.choice(pieces))
            elif kind == "eos":
                ids.append(tok.eos_token_id)
            for _ in range(rng.randint(1, 12) if kind == "run" else 0):
                ids += [tok.eos_token_id] if rng.random() < 0.05 else byte(
                    *rng.choice(invalid if rng.random() < 0.08 else chars))
        if rng.random() < 0.5:  # cut inside a character
            c = rng.choice(chars[:3])
            ids += byte(*c[: rng.randint(1, len(c) - 1)])
        return ids

    checked = 0
    for n in range(600):
        t, skip, prompt = rng.choice([tok, tok, strips_each, metaspace]), rng.random() < 0.8, rng.choice(prompts)
        detok = IncrementalDetokenizer(t, prompt, skip_special_tokens=skip)
        ids = output()
        while detok.num_tokens < len(ids):
            i = detok.num_tokens
            added = detok.add(ids[i])
            start = detok.newest_text_start()
            assert start == _newest_text_start_by_decoding(detok), (n, prompt, ids[: i + 1], skip)
            if added == "" and skip and t is not strips_each:
                assert start == len(_byte_fallback_reference(t, prompt, ids[:i])), (n, prompt, ids[: i + 1])
                checked += 1
            if rng.random() < 0.03:  # rollback, and go on with other tokens
                keep = rng.randint(0, detok.num_tokens)
                detok.rollback(keep)
                ids[keep:] = output()
    assert checked > 9000, checked


@pytest.fixture
def decoded(monkeypatch) -> list:
    """The number of ids of each decode the detokenizer makes from now on (its ``_decoder`` counted)."""
    from lmnb_engine import detokenizer

    lengths = []
    real = detokenizer._decoder
    monkeypatch.setattr(detokenizer, "_decoder", lambda tok, skip: (
        lambda ids, decode=real(tok, skip): lengths.append(len(ids)) or decode(ids)))
    return lengths


@pytest.mark.parametrize("form", ["llama2", "metaspace"])
def test_the_text_start_of_each_token_of_a_long_run_costs_no_decode(byte_fallback, decoded, form):
    # newest_text_start decoded the whole held run for each of its tokens (three decodes, and
    # read the run's token bytes): /v1/completions text_offset over 4000 byte tokens of "中" took
    # 19.1 s, time quadratic in the run. It now reads each token's byte once and decodes only at
    # the token that ends the run. Counted in decode calls and ids decoded. With TIPSv2's decoder
    # (Metaspace, ByteFallback, Fuse) it still decoded the run for each token: 3.8 s for 4000.
    tok = byte_fallback if form == "llama2" else _metaspace_form(byte_fallback)
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [1 + b for b in "中".encode()] * 200 + [1 + 0xE4, tok.eos_token_id, ok]
    d = IncrementalDetokenizer(tok, [ok])
    starts = []
    for i in ids:
        d.add(i)
        starts.append(d.newest_text_start())
    # (each byte after the whole characters before it; " ok" after the run, which the cut "中" spoils)
    assert starts == [k // 3 for k in range(601)] + [200, 601]
    # (two decodes in add(" ok"), three in its newest_text_start: 1,608 calls and 304,317 ids before)
    assert len(decoded) <= 5 and sum(decoded) <= 4 * len(ids), (len(decoded), sum(decoded))


def test_the_text_start_of_each_token_of_a_long_run_at_the_start_of_the_output_costs_no_decode(byte_fallback, decoded):
    # The same with no prompt context, the run the output's first tokens: newest_text_start
    # decoded the whole held run for each of its tokens there (1000 byte tokens of "中": 4.4 s),
    # where the decoder's Strip may cut the run's leading space. The run here begins with a space
    # byte, which the one-shot decode strips while the run is valid and keeps as U+FFFD once the
    # cut E4 spoils it (worked from the tokenizer's decode of each prefix).
    tok = byte_fallback
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [1 + 0x20] + [1 + b for b in "中".encode()] * 200 + [1 + 0xE4, tok.eos_token_id, ok]
    d = IncrementalDetokenizer(tok, [])
    starts = []
    for i in ids:
        d.add(i)
        starts.append(d.newest_text_start())
    whole = tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids[:4]) == "中" and whole == "\ufffd" * 602 + " ok"
    assert starts == [0] + [(k - 1) // 3 for k in range(1, 601)] + [200, 200, 602]
    assert d.text == whole
    assert len(decoded) <= 5 and sum(decoded) <= 4 * len(ids), (len(decoded), sum(decoded))


def test_a_slow_sentencepiece_tokenizer_leaves_a_cut_character_out_as_a_fast_one_does(tmp_path):
    # A checkpoint whose tokenizer_config names a SentencePiece-only class (GPTSw3Tokenizer) loads
    # as a slow (Python) tokenizer, whose decode reads a character cut at the end as one U+FFFD
    # per byte: "ok" + <0xE4><0xB8> flushed as "ok" + two U+FFFD, where a fast tokenizer's text
    # leaves the cut character out (flush's docstring). Its decode reads invalid bytes one U+FFFD
    # each and keeps the valid characters of the run ("中" then <0xFF> is "中" + U+FFFD), so the
    # text streamed, less the cut character, is its one-shot decode (worked by hand below).
    import sentencepiece as spm  # (a dev dependency: pyproject.toml)
    from lmnb_engine.tokenizer import load_tokenizer

    text = ["hello world ok the cat is red", "ok ok a b ab okay", "the answer is ok"] * 50
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(tmp_path / "spiece"), vocab_size=300,
                                   model_type="bpe", byte_fallback=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
                                   minloglevel=2)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "GPTSw3Tokenizer"}')
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    tok = load_tokenizer(tmp_path)
    assert getattr(tok, "backend_tokenizer", None) is None  # (slow)
    ok, byte = tok.convert_tokens_to_ids("▁ok"), (lambda *bs: tok.convert_tokens_to_ids([f"<0x{b:02X}>" for b in bs]))
    cases = [([ok] + byte(0xE4, 0xB8), "ok"), ([ok] + byte(0xE4, 0xB8, 0xAD, 0xE4), "ok中"),
             ([ok] + byte(0xFF, 0xE4, 0xB8), "ok\ufffd"), ([ok] + byte(0xE4, 0xB8, 0xAD, 0xFF) + [ok], "ok中\ufffd ok"),
             ([ok] + byte(0xE4, 0xB8) + [ok], "ok\ufffd\ufffd ok")]
    for ids, want in cases:
        detok = IncrementalDetokenizer(tok, [])
        assert "".join(detok.add(t) for t in ids) + detok.flush() == detok.text == want, ids
    assert tok.decode(cases[0][0]) == "ok\ufffd\ufffd" and tok.decode(cases[3][0]) == cases[3][1]


def test_logprob_tokens_of_sentencepiece_pieces_keep_their_leading_space(byte_fallback):
    # The tokenizer's decode of "▁ok" alone strips its space ("ok", as at the start of a text), so
    # completions' tokens read "ok" for "▁ok" and "ok" alike: their top_logprobs collided under
    # "ok" (the less likely one lost), and a token did not read as the text at its text_offset.
    # The token's text is now its own bytes from the vocabulary (" ok"), as vLLM puts the space back.
    from types import SimpleNamespace

    from lmnb_engine.http_server.openai_api import CompletionLogprobs, _completion_top
    from lmnb_engine.token_text import token_text as _token
    from lmnb_engine.outputs import TokenLogprob

    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    engine = SimpleNamespace(tokenizer=tok, decode=lambda ids, skip_special_tokens=False: tok.decode(ids))
    spaced, bare = tok.convert_tokens_to_ids("▁ok"), tok.convert_tokens_to_ids("ok")
    assert tok.decode([spaced]) == tok.decode([bare]) == "ok"  # (the collision)
    assert [_token(engine, i) for i in (spaced, bare, tok.eos_token_id)] == [" ok", "ok", "</s>"]
    assert [_token(engine, i) for i in byte(0xE4, 0x41)] == ["bytes:\\xe4", "A"]
    top = ((spaced, -0.5), (bare, -1.0))
    assert _completion_top(engine, TokenLogprob(bare, -1.0, top), "ok", -1.0) == {" ok": -0.5, "ok": -1.0}
    # each token reads as the returned text at its offset (the text after the prompt "a b")
    prompt = tok.encode("a b", add_special_tokens=False)
    ids = [spaced, bare, tok.convert_tokens_to_ids("▁a"), spaced]
    detok = IncrementalDetokenizer(tok, prompt)
    text = "".join(detok.add(t) for t in ids) + detok.flush()
    assert text == " okok a ok"
    lps = [SimpleNamespace(token_id=t, logprob=-1.0, top=None) for t in ids]
    got = CompletionLogprobs(engine, 0, None, prompt).add(lps)
    assert [text[o : o + len(t)] for t, o in zip(got["tokens"], got["text_offset"])] == got["tokens"]


def test_an_engines_stream_adds_up_to_the_tokenizers_decode_with_byte_fallback(byte_fallback, tmp_path):
    # A random model over the byte-fallback tokenizer (nearly all of whose ids are byte tokens)
    # samples runs of bytes that spoil characters before them, cuts and EOS: the streamed deltas
    # add up to the result's text, which is the tokenizer's one-shot decode of the output less a
    # cut character (_byte_fallback_reference). Before, 6 of these 12 outputs did not.
    import torch
    import transformers

    from lmnb_engine import Engine, SamplingParams
    from lmnb_engine.testing.tiny_checkpoint import _config, randomize_weights_

    tok = byte_fallback
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": None}  # (not bytes)
    model = transformers.AutoModelForCausalLM.from_config(_config("llama", len(tok), ids))
    randomize_weights_(model)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    engine = Engine(model=str(tmp_path), max_total_tokens=4096)
    try:
        prompt = tok.encode("a b", add_special_tokens=False)
        for seed in range(12):
            events = list(engine.stream(prompt, SamplingParams(max_new_tokens=24, temperature=1.0, seed=seed)))
            result = events[-1].result
            assert "".join(e.text_delta for e in events) == result.text
            assert result.text == _byte_fallback_reference(tok, prompt, result.token_ids), (seed, result.token_ids)
    finally:
        engine.shutdown()


def test_a_long_run_of_byte_tokens_is_decoded_once_not_once_a_token(byte_fallback, decoded):
    # the detokenizer holds a run of byte tokens back, and decoded the whole held window for each
    # of its tokens: 4000 byte tokens of "中" cost 3.8 s on the scheduler's thread (0.06 s before
    # runs were held), time quadratic in the run; a token that holds the run back decodes
    # nothing. Counted in ids decoded; the text is the tokenizer's one-shot decode
    ok = byte_fallback.convert_tokens_to_ids("▁ok")
    ids = [1 + b for b in "中".encode()] * 200 + [ok]  # (<0xE4><0xB8><0xAD> 200 times, then " ok")
    d = IncrementalDetokenizer(byte_fallback, [ok])
    text = "".join(d.add(i) for i in ids[:-1])
    assert text == ""  # (the run is held until the token that ends it)
    text += d.add(ids[-1]) + d.flush()
    assert d.text == text == byte_fallback.decode([ok] + ids)[len("ok"):] == "中" * 200 + " ok"
    assert sum(decoded) <= 4 * len(ids), sum(decoded)


def test_marked_tokens_record_where_they_sit_in_the_text_and_a_rollback_drops_theirs(byte_fallback):
    """A marked token (a skipped special token, for stop_special) sits past the whole characters
    before it, text still held back there too: "ok" <0x0A> </s> " ok" puts </s> at 3, after "ok\\n",
    while the text is still "ok" (the byte run goes on past the skipped token); a rollback forgets
    the marks of the tokens it drops, and adding them again records them again."""
    tok = byte_fallback
    ok, newline, eos = tok.convert_tokens_to_ids(["▁ok", "<0x0A>", "</s>"])
    detok = IncrementalDetokenizer(tok, [], marked=frozenset({eos}))
    for t in (ok, newline, eos):
        detok.add(t)
    assert detok.text == "ok" and detok.marks == [(2, eos, 3)]
    detok.add(ok)
    assert detok.text == "ok\n ok" and detok.marks == [(2, eos, 3)]
    detok.rollback(2)
    assert detok.marks == []
    detok.add(eos)
    assert detok.marks == [(2, eos, 3)]


def test_the_tokens_through_a_stop_late_in_a_long_run_cost_no_decode_per_token(byte_fallback, decoded):
    # tokens_through (the tokens a stop's output keeps) read a held run of byte tokens that came at
    # once by decoding the window up to each of its tokens in turn: time quadratic in the run, on
    # the scheduler's thread (a stop "\n" after 1000 "中" in byte tokens, one run of 3001: 1.7 s;
    # 9001: 13.5 s). It now reads the run's bytes (_RunLength), as newest_text_start does. The
    # "\n" is output character 1001 and token 3001 (three byte tokens per "中").
    tok = byte_fallback
    ok = tok.convert_tokens_to_ids("▁ok")
    ids = [1 + b for b in "中".encode()] * 1000 + [1 + 0x0A, ok]
    d = IncrementalDetokenizer(tok, [ok])
    for i in ids:
        d.add(i)
    assert d.text == "中" * 1000 + "\n ok"
    decoded.clear()
    assert d.tokens_through(1001) == 3001 and d.tokens_through(1000) == 3000 and d.tokens_through(1) == 3
    assert len(decoded) <= 6 and sum(decoded) <= 6 * len(ids), (len(decoded), sum(decoded))


def test_the_tokens_through_a_place_in_random_byte_runs_are_the_fewest_whose_decode_reaches_it(byte_fallback):
    # tokens_through(n): the fewest output tokens whose text, as the tokenizer's one-shot decode
    # gives it less a cut character (_byte_fallback_reference), reaches n characters; random outputs
    # of runs of valid characters in byte tokens, skipped EOS inside them, pieces, a cut character at
    # the end; after a prompt and none (the decoder's Strip then reads the run's first space).
    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    pieces = [tok.convert_tokens_to_ids(p) for p in ("▁", "a", "ok", "▁ok", "é")]
    chars = [b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\x9f", b"A", b" ", b"\n"]
    rng = random.Random(1)
    checked = 0
    for n in range(150):
        ids = []
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.3:
                ids.append(rng.choice(pieces))
            for _ in range(rng.randint(0, 8)):
                ids += [tok.eos_token_id] if rng.random() < 0.05 else byte(*rng.choice(chars))
        ids += byte(*b"\xe4\xb8\xad"[: rng.randint(0, 2)])
        prompt = rng.choice([tok.encode("a b", add_special_tokens=False), []])
        d = IncrementalDetokenizer(tok, prompt)
        for i in ids:
            d.add(i)
        d.flush()
        texts = [_byte_fallback_reference(tok, prompt, ids[:k]) for k in range(len(ids) + 1)]
        assert texts[-1] == d.text, (n, ids)
        for place in range(1, len(d.text) + 1):
            want = next(k for k, t in enumerate(texts) if len(t) >= place)
            assert d.tokens_through(place) == want, (n, prompt, ids, place)
            checked += 1
    assert checked > 1500, checked
