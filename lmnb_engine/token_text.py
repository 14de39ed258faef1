"""A token's own text and bytes, as OpenAI's logprobs write them (``lmnb serve``'s ``/v1`` routes)
and as API speculative execution reads a call's tokens (``lmnb.backend.Engine.token_text``).

A token's decode alone loses what the tokenizer's decoder adds or strips in context: a SentencePiece
word piece's leading space, and a byte token's bytes (every part of a character decodes to U+FFFD).
These read the token's bytes as the decoder reads them (``detokenizer_bytes.decoded_bytes``) instead.
"""

from __future__ import annotations

from typing import Any, Optional


def token_text(engine: Any, token_id: int) -> str:
    """Token ``token_id``'s text in logprobs (``engine``: an ``lmnb_engine.Engine``, or anything with
    its ``tokenizer`` and ``decode(ids)``): its own bytes as the decoder reads them (``raw_bytes``)
    where they are whole characters, so a SentencePiece word piece keeps its leading space (``▁ok`` is " ok",
    which the tokenizer's decode of the token alone strips, as at the start of a text; vLLM puts
    it back likewise), else its decode. A token holding part of a character decodes alone to
    U+FFFD; it is written as OpenAI writes one, ``bytes:`` then its own bytes with those that are
    not whole characters escaped (``bytes:\\xf0\\x9f``). So tokens of different bytes read apart:
    completions' ``top_logprobs`` are keyed by this text, and byte tokens, which all read U+FFFD,
    and " ok" and "ok", which both read "ok", collided."""
    raw = raw_bytes(engine, token_id)
    if raw is None:
        return engine.decode([token_id])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + raw.decode("utf-8", "backslashreplace")


def raw_bytes(engine: Any, token_id: int) -> Optional[bytes]:
    """The bytes token ``token_id`` stands for as the tokenizer's decoder reads them
    (``detokenizer_bytes.decoded_bytes``: ``<0xNN>`` byte tokens, byte-level BPE, added and special
    tokens alike, so "café" added to a byte-level BPE is c a f E9, as its decode reads it); None
    where the tokenizer's family is not one read there, or the id is past the tokenizer's
    vocabulary (a padded logits width)."""
    from lmnb_engine.detokenizer_bytes import decoded_bytes, known_bytes

    tok = engine.tokenizer
    try:
        if not 0 <= token_id < len(tok):
            return None
    except TypeError:  # (a tokenizer without a length: decoded_bytes says whether it reads it)
        pass
    found = decoded_bytes(tok, known_bytes(tok, False), [token_id], False)
    return None if found is None else found[0]


def token_bytes(engine: Any, token_id: int, text: str) -> list[int]:
    """OpenAI's ``bytes`` of a token whose ``token_text`` is ``text``: the bytes the decoder reads from
    the token (``raw_bytes``), so a client joining a reply's ``bytes`` gets the reply's text (read as
    UTF-8, U+FFFD for bytes that are no character), a character split between tokens (an added
    token's too) whole; else ``text``'s UTF-8. One difference stays: a SentencePiece byte-fallback
    decoder writes a U+FFFD for every byte of a run of ``<0xNN>`` tokens that is not UTF-8 as a
    whole, its whole characters too (``<0x6E>``, ``<0x8F>`` decode to two U+FFFD, their bytes read
    "n" and one), and OpenAI's bytes are the token's own."""
    raw = raw_bytes(engine, token_id)
    return list(raw if raw is not None else text.encode("utf-8"))
