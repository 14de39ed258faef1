"""A token's own text and bytes, as OpenAI's logprobs write them (``lmnb serve``'s ``/v1`` routes)
and as API speculative execution reads a call's tokens (``lmnb.backend.Engine.token_text``).

A token's decode alone loses what the tokenizer's decoder adds or strips in context: a SentencePiece
word piece's leading space, and a byte token's bytes (every part of a character decodes to U+FFFD).
These read the token's bytes from the vocabulary (``constrained.vocab.token_bytes_table``) instead.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

REPLACEMENT = "\ufffd"  # what a byte token that is not a whole character decodes to


def token_text(engine: Any, token_id: int) -> str:
    """Token ``token_id``'s text in logprobs (``engine``: an ``lmnb_engine.Engine``, or anything with
    its ``tokenizer`` and ``decode(ids)``): its own bytes from the vocabulary (``raw_bytes``) where they are
    whole characters, so a SentencePiece word piece keeps its leading space (``▁ok`` is " ok",
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


_RAW_BYTES: "weakref.WeakKeyDictionary[Any, Optional[list]]" = weakref.WeakKeyDictionary()  # tokenizer -> table
_RAW_BYTES_LOCK = threading.Lock()


def raw_bytes(engine: Any, token_id: int) -> Optional[bytes]:
    """The bytes token ``token_id`` stands for, from the tokenizer's vocabulary (``<0xNN>`` byte
    tokens, byte-level BPE); None where the tokenizer's family is not one constrained decoding reads."""
    from lmnb_engine.constrained.errors import GrammarError
    from lmnb_engine.constrained.vocab import token_bytes_table

    tok = engine.tokenizer
    with _RAW_BYTES_LOCK:
        if tok not in _RAW_BYTES:
            try:
                _RAW_BYTES[tok] = token_bytes_table(tok, len(tok))[0]
            except (GrammarError, TypeError, AttributeError):
                _RAW_BYTES[tok] = None
        table = _RAW_BYTES[tok]
    return table[token_id] if table is not None and 0 <= token_id < len(table) else None


def token_bytes(engine: Any, token_id: int, text: str) -> list[int]:
    """OpenAI's ``bytes`` of a token whose ``token_text`` is ``text``: the token's own UTF-8 bytes. A
    token holding part of a character has them from the vocabulary (its text is ``bytes:...``), so
    a client joining a reply's ``bytes`` gets the reply's text."""
    if text.startswith("bytes:") or REPLACEMENT in text:
        raw = raw_bytes(engine, token_id)
        if raw is not None:
            return list(raw)
    return list(text.encode("utf-8"))
