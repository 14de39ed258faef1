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
    from lmnb_engine.constrained import vocab

    calls = []
    real = vocab._decoder_types
    monkeypatch.setattr(vocab, "_decoder_types", lambda tok: calls.append(tok) or real(tok))
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


@pytest.fixture(scope="module")
def byte_fallback():
    """Llama 2's tokenizer form, built offline: BPE with byte fallback (a character outside the
    vocabulary is its UTF-8 bytes, one ``<0xNN>`` token each), spaces written "▁", and the decoder
    ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``, ``Strip`` of one leading space."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "o", "k", "ok", "▁a", "▁ok", "é"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("o", "k"), ("▁", "a"), ("▁", "ok")], byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", normalized=False), AddedToken("</s>", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


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
    # random outputs of pieces, byte-spelled characters, bytes that never form one and a cut inside
    # a character, each prefix flushed: the text is the tokenizer's decode of the ids less the
    # bytes of the character cut (found by _incomplete_tail), after the prompt's. (A byte-spelled character is
    # followed by a piece: were invalid bytes to follow it in one run of byte tokens, the tokenizer
    # would read it as U+FFFD too, though it was streamed; see the next test.)
    pieces = [tok.convert_tokens_to_ids(p) for p in ("▁", "a", "b", "ok", "▁a", "▁ok", "é")]
    chars = [b"\xe4\xb8\xad", b"\xf0\x9f\x98\x80", b"\xc3\x9f"]  # 中 😀 ß
    invalid = [b"\xff", b"\xc0", b"\xe4\xb8", b"\xf0\x9f\x98"]  # invalid for good before a lead byte or piece
    rng = random.Random(0)
    prompt = tok.encode("a b", add_special_tokens=False)
    for _ in range(300):
        ids, after_piece = [], True
        for _ in range(rng.randint(1, 8)):
            kind = rng.choice(["piece", "char", "invalid", "continuation" if after_piece else "piece"])
            if kind == "piece":
                ids.append(rng.choice(pieces))
            elif kind == "char":
                ids += byte(*rng.choice(chars)) + [rng.choice(pieces)]
            else:
                ids += byte(*(rng.choice(invalid) if kind == "invalid" else rng.choice([b"\xad", b"\x80"])))
            after_piece = kind in ("piece", "char")
        if rng.random() < 0.6:  # a cut inside a character
            c = rng.choice(chars)
            ids += byte(*c[: rng.randint(1, len(c) - 1)])
        for n in range(1, len(ids) + 1):
            out = ids[:n]
            k = 0
            while k < len(out) and tok.convert_ids_to_tokens(out[len(out) - 1 - k]).startswith("<0x"):
                k += 1  # the run of byte tokens at the end
            tail = _incomplete_tail(bytes(i - 1 for i in out[len(out) - k:]))
            detok = IncrementalDetokenizer(tok, prompt)
            streamed = "".join(detok.add(t) for t in out) + detok.flush()
            assert streamed == detok.text == tok.decode(prompt + out[: len(out) - tail])[len(tok.decode(prompt)):], out


def test_bytes_that_spoil_a_run_of_byte_tokens_read_alone_after_the_characters_streamed(byte_fallback):
    # "中" as byte tokens is streamed at once; a stray <0xFF> after it makes the run invalid, and
    # the tokenizer then reads all four bytes as U+FFFD. The "中" streamed stays, and the new
    # tokens read as the tokenizer reads them alone: one U+FFFD (a slice by length gave three)
    tok, byte = byte_fallback, (lambda *bs: [1 + b for b in bs])
    ok = tok.convert_tokens_to_ids("▁ok")
    for tail in ([ok], byte(0xE4, 0xB8, 0xE4)):  # text after it, or invalid bytes and a cut at the end
        ids = [ok] + byte(0xE4, 0xB8, 0xAD) + byte(0xFF) + tail
        detok = IncrementalDetokenizer(tok, [])
        deltas = [detok.add(t) for t in ids] + [detok.flush()]
        assert deltas[:4] == ["ok", "", "", "中"]
        cut = 3 if tail != [ok] else 0  # (the incomplete "E4" at the end is left out)
        want = tok.decode(ids[:4]) + tok.decode(ids[4 : len(ids) - (cut and 1)])
        assert "".join(deltas) == detok.text == want, tail
    assert want == "ok中\ufffd\ufffd\ufffd"


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
