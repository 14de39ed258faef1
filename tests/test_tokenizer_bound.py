"""A prompt certainly longer than the context is refused without encoding it: a token stands for at
most ``max_token_bytes`` bytes of text, for the tokenizers where that bound holds, and for no other."""

from __future__ import annotations

import random
import unicodedata

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lmnb_engine.testing import train_tiny_tokenizer
from lmnb_engine.tokenizer import NFC_SHRINK, max_token_bytes, min_prompt_tokens, text_too_long


def _fast(tok: Tokenizer, **kw) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


@pytest.fixture(scope="module")
def byte_level():
    return _fast(train_tiny_tokenizer(), bos_token="<s>")


def _sentencepiece(**changes) -> Tokenizer:
    """Llama 2's form: BPE with byte fallback, a "▁" prepended and spaces written as "▁"."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ("▁", "▁▁", "▁▁▁▁", "a", "b", "ab", "é", "abé", "▁ab"):
        vocab[piece] = len(vocab)
    merges = [("▁", "▁"), ("▁▁", "▁▁"), ("a", "b"), ("ab", "é"), ("▁", "ab")]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=changes.pop("byte_fallback", True)))
    tok.normalizer = changes.pop("normalizer", normalizers.Sequence([normalizers.Prepend("▁"),
                                                                    normalizers.Replace(" ", "▁")]))
    tok.add_special_tokens([AddedToken("<s>", normalized=False)])
    return tok


def test_the_bound_of_a_byte_level_tokenizer_is_its_longest_token_and_is_reached(byte_level):
    vocab = byte_level.get_vocab()
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    longest = max(vocab, key=lambda t: len(bytes(to_byte[c] for c in t)) if all(c in to_byte for c in t) else 0)
    size = len(bytes(to_byte[c] for c in longest))
    assert size > 3 and max_token_bytes(byte_level) == size
    text = bytes(to_byte[c] for c in longest).decode("utf-8") * 50  # 50 tokens of `size` bytes each
    ids = byte_level.encode(text, add_special_tokens=False)
    assert len(ids) == 50 and min_prompt_tokens(text, byte_level, 0) == 50  # the bound, reached exactly


def test_the_bound_holds_for_random_and_repetitive_texts(byte_level):
    rng = random.Random(0)
    alphabet = "ab cd\n\té漢😀0123456789<s>"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400))) for _ in range(200)]
    texts += [" " * 1000, "😀" * 300, "<s>" * 100, "0" * 500]
    sp = _fast(_sentencepiece(), bos_token="<s>")
    for tok in (byte_level, sp):
        for text in texts:
            assert len(tok.encode(text, add_special_tokens=False)) >= min_prompt_tokens(text, tok, 0), (tok, text)


def test_the_bound_of_a_byte_fallback_tokenizer_counts_a_metaspace_as_the_character_a_text_may_hold():
    sp = _fast(_sentencepiece(), bos_token="<s>")
    # "▁▁▁▁" is 4 spaces of text, or 4 "▁" characters (12 bytes), which the tokenizer reads alike;
    # "abé" is 4 bytes, "<s>" 3, a byte token 1
    assert max_token_bytes(sp) == 12
    for text in ("    " * 30, "▁▁▁▁" * 30):
        ids = sp.encode(text, add_special_tokens=False)
        assert len(ids) >= 30 and len(ids) >= min_prompt_tokens(text, sp, 0)
    assert min_prompt_tokens("▁▁▁▁" * 30, sp, 0) == 30  # (the bound reached: 30 tokens of 12 bytes)
    # NFC may turn 7 bytes into 2 (U+1FBE U+0308 U+0341 is U+0390): the bound allows for it
    nfc = _fast(_sentencepiece(normalizer=normalizers.NFC()), bos_token="<s>")
    assert max_token_bytes(nfc) == 12 * NFC_SHRINK


@pytest.mark.parametrize("why,tok", [
    # an <unk> may stand for a run of text, a dropped space for none
    ("no byte fallback", lambda: _sentencepiece(byte_fallback=False)),
    ("NFKC turns 4 bytes into 1", lambda: _sentencepiece(normalizer=normalizers.NFKC())),
    ("lowercasing", lambda: _sentencepiece(normalizer=normalizers.Lowercase())),
    ("a replacement shorter than what it replaces", lambda: _sentencepiece(normalizer=normalizers.Replace("abc", "a"))),
    ("a pre-tokenizer that drops spaces", lambda: _with(_sentencepiece(), pre_tokenizer=pre_tokenizers.Whitespace())),
    ("a WordPiece model", lambda: Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))),
])
def test_no_bound_where_a_token_may_stand_for_unboundedly_much_text(why, tok):
    t = _fast(tok())
    assert max_token_bytes(t) is None, why
    assert min_prompt_tokens("x" * 10**6, t, 10) == 0


def test_no_bound_where_an_added_token_takes_the_whitespace_beside_it():
    tok = _sentencepiece()
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    assert max_token_bytes(_fast(tok)) is None


def _with(tok: Tokenizer, **attrs) -> Tokenizer:
    for k, v in attrs.items():
        setattr(tok, k, v)
    return tok


def test_nfc_turns_at_most_nfc_shrink_bytes_into_one():
    # Each input character's bytes are shared among the characters of its decomposition; each
    # character of NFC's output is the composition of its own decomposition: the bytes it can stand
    # for are at most the most its decomposition's characters can carry.
    carry: dict[str, float] = {}
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for c in chars:
        d = unicodedata.normalize("NFD", c)
        for x in d:
            carry[x] = max(carry.get(x, 0), len(c.encode()) / len(d))
    worst = max(sum(carry.get(x, len(x.encode())) for x in unicodedata.normalize("NFD", o)) / len(o.encode())
                for o in chars if unicodedata.normalize("NFC", o) == o)
    assert worst == 3.5 and worst <= NFC_SHRINK
    assert len("\u1fbe\u0308\u0341".encode()) == 7 and unicodedata.normalize("NFC", "\u1fbe\u0308\u0341") == "\u0390"


def test_a_text_certainly_too_long_is_named_with_its_count_and_a_short_one_is_not_measured(byte_level, monkeypatch):
    size = max_token_bytes(byte_level)
    text = "a" * (100 * size + 1)
    assert text_too_long(text, byte_level, 100) == (
        f"prompt of at least 101 tokens ({len(text)} characters, counted without encoding them) exceeds the "
        "model's context length of 100 tokens", 101)
    assert text_too_long("a" * (100 * size), byte_level, 100) is None  # 100 tokens may fit
    from lmnb_engine import tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "max_token_bytes", lambda tok: pytest.fail("measured a short text"))
    assert min_prompt_tokens("a" * 100, byte_level, 100) == 0
