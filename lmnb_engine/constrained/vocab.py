"""The tokenizer as constrained decoding sees it: the bytes each token id stands for.

The grammar runs on bytes (outlines-core walks each token's bytes through a byte-level DFA), so
every token id needs its exact bytes, including tokens that hold part of a UTF-8 character. Two
tokenizer families are read, as outlines and xgrammar do (``detokenizer_bytes.byte_reader``, which
the detokenizer reads the output's bytes with):

* byte-level BPE (GPT-2, Llama 3, Qwen): token strings are bytes spelled with GPT-2's
  byte→unicode table (``transformers.convert_slow_tokenizer.bytes_to_unicode``);
* SentencePiece-style BPE with byte fallback (Llama 2, Mistral): ``<0xNN>`` is the byte NN and
  ``▁`` is a space.

Added and special tokens (BOS, role markers, ...) have no bytes: the grammar never allows them;
EOS is allowed separately, in accepting states only.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np

from lmnb_engine.constrained.errors import GrammarError
from lmnb_engine.detokenizer_bytes import byte_reader

def _id_bytes(tokenizer: Any) -> tuple[Callable[[int, str], bytes | None], str]:
    """(``(id, token) -> bytes | None``, family name): the bytes of a vocabulary token, None for an
    added or special token (``added_tokens_decoder``) or one that spells no bytes, read by
    ``detokenizer_bytes.byte_reader``'s reader.

    Raises:
        GrammarError: the tokenizer is not a fast tokenizer of a supported family.
    """
    try:
        to_bytes, family = byte_reader(tokenizer)
    except ValueError as e:
        raise GrammarError(f"constrained decoding {e}") from None
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def id_bytes(i: int, token: str) -> bytes | None:
        return None if i in added else to_bytes(token) or None

    return id_bytes, family


def token_bytes_table(tokenizer: Any, vocab_size: int) -> tuple[list[bytes | None], str]:
    """(bytes of every id in ``range(vocab_size)`` — None for added/special/unused ids, family name).

    Raises:
        GrammarError: the tokenizer is not a fast tokenizer of a supported family.
    """
    id_bytes, family = _id_bytes(tokenizer)
    table: list[bytes | None] = [None] * vocab_size
    for token, i in tokenizer.get_vocab().items():
        if 0 <= i < vocab_size:
            table[i] = id_bytes(i, token)
    return table, family


def token_bytes(tokenizer: Any, ids: list[int]) -> list[bytes | None]:
    """The bytes of each of ``ids`` (None for an added or special token), as ``token_bytes_table``
    reads them, without reading the whole vocabulary.

    Raises:
        GrammarError: the tokenizer is not a fast tokenizer of a supported family.
    """
    id_bytes, _ = _id_bytes(tokenizer)
    return [id_bytes(i, t) for i, t in zip(ids, tokenizer.convert_ids_to_tokens(ids))]


# The markers around a compiled regex (``grammar.compile_grammar``): it is built as START ``(?:R)``
# END, each marker spelled by a token of its own (``start_marker_id``, ``end_marker_id``: past the
# logits, never sampled). Noncharacters: text never holds them, so no real token does.
START_MARKER, END_MARKER = "\U0010fffe", "\U0010ffff"
_MARKER_BYTES = (START_MARKER.encode(), END_MARKER.encode())


class TokenVocabulary:
    """Token bytes, EOS ids and derived lookup arrays of one tokenizer, for one logits width.

    Attributes:
        vocab_size: logits width (int); ids at or past the tokenizer's size have no bytes.
        token_bytes: list[bytes | None], one per id.
        eos_token_ids: frozenset[int] allowed in accepting states only.
        first_byte: int16 [vocab_size] first byte of each token, -1 for tokens without bytes.
        byte_token: int64 [256] an id whose bytes are exactly that one byte, -1 if none.
        is_prefix_token: bool [vocab_size] the token's bytes are a strict prefix of another token's
            (the jump-forward hold-back rule, mlc-llm PR #2551).
        fingerprint: hex digest of all of the above; the compiled-grammar cache key.
        encode: ``str -> list[int]`` without special tokens, for jump-forward retokenization.
        end_marker_id: the id of the ``END_MARKER`` token in the outlines-core vocabulary (past
            ``vocab_size``: never sampled); start_marker_id likewise for ``START_MARKER``.
            marker_piece_ids: ids whose bytes hold the markers' first byte or are a piece of
            their bytes (byte-fallback tokens can spell them): the only tokens that can lead into
            a marker's path.
    """

    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int] | set[int] | None = None, vocab_size: int | None = None):
        self.vocab_size = int(vocab_size if vocab_size is not None else len(tokenizer))
        self.token_bytes, self.family = token_bytes_table(tokenizer, self.vocab_size)
        if eos_token_ids is None:
            eos_token_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids if 0 <= int(i) < self.vocab_size)
        # verbose=False: a forced string longer than the model's max length (a long constant in a
        # schema) made transformers warn of "indexing errors" in the notebook; nothing indexes it
        self.encode: Callable[[str], list[int]] = lambda text: tokenizer.encode(text, add_special_tokens=False,
                                                                               verbose=False)

        self.first_byte = np.full(self.vocab_size, -1, dtype=np.int16)
        self.byte_token = np.full(256, -1, dtype=np.int64)
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b is None or i in self.eos_token_ids:
                continue
            self.first_byte[i] = b[0]
            by_bytes.setdefault(b, []).append(i)
            if len(b) == 1 and self.byte_token[b[0]] < 0:
                self.byte_token[b[0]] = i
        self.bytes_to_ids = by_bytes
        self.is_prefix_token = np.zeros(self.vocab_size, dtype=bool)
        ordered = sorted(by_bytes)
        for a, b in zip(ordered, ordered[1:]):  # any extension of a sorts right after a
            if b.startswith(a):
                for i in by_bytes[a]:
                    self.is_prefix_token[i] = True
        digest = hashlib.sha256()
        digest.update(json.dumps([self.family, self.vocab_size, sorted(self.eos_token_ids)]).encode())
        for b in ordered:
            digest.update(len(b).to_bytes(4, "little") + b + json.dumps(by_bytes[b]).encode())
        self.fingerprint = digest.hexdigest()
        self.end_marker_id = self.vocab_size + 1  # (vocab_size itself may stand in for a missing EOS)
        self.start_marker_id = self.vocab_size + 2
        self.marker_piece_ids = frozenset(i for b, ids in by_bytes.items() for i in ids
                                          if any(b in m for m in _MARKER_BYTES) or _MARKER_BYTES[0][:1] in b)
        self._outlines = None

    @property
    def byte_complete(self) -> bool:
        """Every byte value has a one-byte token, so token paths reach every DFA state bytes can."""
        return bool((self.byte_token >= 0).all())

    def outlines_vocabulary(self):
        """The ``outlines_core.Vocabulary`` (built once), with the markers' tokens. Its EOS id
        is the smallest EOS id, or ``vocab_size`` as a never-sampled stand-in when the tokenizer
        has none."""
        if self._outlines is None:
            from outlines_core import Vocabulary

            eos = min(self.eos_token_ids) if self.eos_token_ids else self.vocab_size
            tokens = dict(self.bytes_to_ids)
            for marker, token in zip(_MARKER_BYTES, (self.start_marker_id, self.end_marker_id)):
                tokens[marker] = tokens.get(marker, []) + [token]
            self._outlines = Vocabulary(eos, tokens)
        return self._outlines

    @property
    def outlines_eos(self) -> int:
        """The EOS id given to outlines-core: the smallest EOS id, or ``vocab_size`` when there is none."""
        return min(self.eos_token_ids) if self.eos_token_ids else self.vocab_size

    def text_of(self, ids: list[int]) -> bytes:
        """Concatenated bytes of ``ids`` (ids without bytes contribute nothing)."""
        return b"".join(self.token_bytes[i] or b"" for i in ids)
