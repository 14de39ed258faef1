"""Incremental detokenization for streamed output.

The detokenizer decodes a sliding window of ids and emits only the text that the newest token
added, holding it back while it ends in U+FFFD (an incomplete UTF-8 sequence) and, with
SentencePiece byte fallback, while a run of byte tokens is open (``_run_holders``). The window starts
a few prompt tokens back so tokenizers that drop a leading space at the start of a decode
(SentencePiece) still produce the right first word. This is the scheme of vLLM's
``detokenize_incrementally`` and SGLang's ``DetokenizerManager`` (``surr_offset``/``read_offset``).
Stop strings and regexes are matched on its text by ``stop_matcher``.
"""

from __future__ import annotations

import bisect
import codecs
import json
import re
import weakref
from typing import Any, Callable, Sequence

# Prompt tokens decoded in front of the output so the first word keeps its leading space
# (SGLang: INIT_INCREMENTAL_DETOKENIZATION_OFFSET).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``ids -> text`` as ``tokenizer.decode(ids, skip_special_tokens=...)`` gives it.

    A fast (Rust) tokenizer is called directly: transformers' ``decode`` adds ~10 us of Python
    per call around the same ``tokenizers.Tokenizer.decode``, and detokenizing costs two decodes
    per token per request on the scheduler's thread. Its one extra step, cleaning up spaces
    before punctuation, is kept by falling back to ``decode`` when the tokenizer asks for it.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


# tokenizer -> its _run_holders, special tokens skipped and not: reading the decoder costs a
# serialization (of the decoder alone), once per tokenizer rather than per request
_HOLDERS: "weakref.WeakKeyDictionary[Any, dict[bool, frozenset[int]]]" = weakref.WeakKeyDictionary()


def _run_holders(tokenizer: Any, skip_special_tokens: bool) -> frozenset[int]:
    """The ids after which the text of a run of byte tokens is held back: with a ``ByteFallback``
    decoder (SentencePiece byte fallback: Llama 2, Mistral), its ``<0xNN>`` tokens, and the special
    tokens where they are skipped (a skipped token never reaches the decoder, so the run goes on
    past it); no ids for other tokenizers, whose decoders read each byte once.

    ``ByteFallback`` reads a run of byte tokens as one string where the run is valid UTF-8 and as
    one U+FFFD per byte where it is not, so a later byte of the run (a stray ``<0xFF>`` after the
    bytes of "中") turns the characters already there into U+FFFD: the run's text is final only
    once a token the decoder reads as text ends it, or the output ends."""
    try:
        holders = _HOLDERS.get(tokenizer)
    except TypeError:  # (not weakly referable: read each time)
        holders = None
    if holders is None:
        holders = _new_run_holders(tokenizer)
        try:
            _HOLDERS[tokenizer] = holders
        except TypeError:
            pass
    return holders[skip_special_tokens]


def _new_run_holders(tokenizer: Any) -> dict[bool, frozenset[int]]:
    """``_run_holders``'s answers (skip_special_tokens -> ids), read from the tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    found, stack = set(), [json.loads(decoder.__getstate__())] if decoder is not None else []
    while stack:
        d = stack.pop()
        found.add(d.get("type"))
        stack.extend(d.get("decoders") or [])
    if "ByteFallback" not in found:
        return {True: frozenset(), False: frozenset()}
    byte_ids = frozenset({backend.token_to_id(f"<0x{b:02X}>") for b in range(256)} - {None})
    special = {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if t.special}
    return {True: byte_ids | special, False: byte_ids}


def _slow_sentencepiece_bytes(tokenizer: Any, ids: list[int]) -> list[bytes] | None:
    """The bytes of ``ids`` for a slow (Python) SentencePiece tokenizer (one with an ``sp_model``:
    a checkpoint whose tokenizer_config names a SentencePiece-only class, such as
    ``GPTSw3Tokenizer``), read as ``constrained.vocab`` reads a fast one's, which needs the Rust
    tokenizer: ``<0xNN>`` is the byte NN, other pieces their text with "▁" a space, special tokens
    none. None for other tokenizers. (Its decode reads a character cut at the end as one U+FFFD
    per byte, as the fast one does.)"""
    if getattr(tokenizer, "sp_model", None) is None:
        return None
    special = set(getattr(tokenizer, "all_special_ids", ()))
    raw = []
    for i, token in zip(ids, tokenizer.convert_ids_to_tokens(ids)):
        m = _BYTE_TOKEN.fullmatch(token)
        if i in special:
            raw.append(b"")
        else:
            raw.append(bytes([int(m.group(1), 16)]) if m else token.replace("\u2581", " ").encode())
    return raw


class IncrementalDetokenizer:
    """Decodes output token ids one at a time into ``text`` (always complete characters).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode(ids, skip_special_tokens=...)``).
        prompt_ids: the prompt (only its last few ids are used, as decoding context).
        skip_special_tokens: passed to ``decode``.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._decode_ids = _decoder(tokenizer, skip_special_tokens)
        self._holders = _run_holders(tokenizer, skip_special_tokens)
        # (a run of byte tokens ending the prompt would read as one run with the output's first
        # bytes: the context ends before it)
        end = len(prompt_ids)
        while end and int(prompt_ids[end - 1]) in self._holders:
            end -= 1
        self._ids = [int(i) for i in prompt_ids[max(0, end - _CONTEXT_TOKENS) : end]]
        self._n_context = len(self._ids)
        self._prefix = 0  # window start (ids[prefix:read] is already turned into text)
        self._read = self._n_context
        self.text = ""
        # state after each output token, so rollback(k) restores it exactly
        self._history: list[tuple[int, int, int]] = [(self._prefix, self._read, 0)]

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ids(ids)

    @property
    def num_tokens(self) -> int:
        """Output tokens added so far."""
        return len(self._ids) - self._n_context

    def add(self, token_id: int) -> str:
        """Append one output token; return the text it completes ("" while bytes are pending)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        delta = ""
        # (a token holding a run's text back adds none, so nothing is decoded: the window grows with
        # the run, and decoding it for each of the run's tokens cost time quadratic in the run)
        if token_id not in self._holders:
            window_before = self._decode(self._ids[self._prefix : self._read])
            window_now = self._decode(self._ids[self._prefix :])
            if len(window_now) > len(window_before) and not window_now.endswith(_REPLACEMENT):
                delta = self._new_text(window_before, window_now)
                self.text += delta
                self._prefix, self._read = self._read, len(self._ids)
        self._history.append((self._prefix, self._read, len(self.text)))
        return delta

    def _new_text(self, window_before: str, window: str, end: int | None = None) -> str:
        """The text that ``ids[read:end]`` adds to ``window_before`` (the text of ``ids[prefix:read]``),
        ``window`` being the text of ``ids[prefix:end]``.

        That is ``window`` past ``window_before``, unless ``window`` does not begin with it: a
        decode that cleans up spaces, " ," to ",", may rewrite the end of ``window_before`` (the
        slice dropped the "," there; read alone, it is kept). The new tokens are then read as the
        tokenizer reads them alone. (With SentencePiece byte fallback a run of byte tokens would
        rewrite the characters of the run before it, "中" into three U+FFFD after a stray byte:
        no window ends inside a run, ``_run_holders``.)"""
        if window.startswith(window_before):
            return window[len(window_before) :]
        return self._decode(self._ids[self._read : end])

    def flush(self) -> str:
        """At the end of generation: return the pending text, less the bytes of a character that
        the output ended inside (a ``max_tokens`` cut between the byte tokens of "中"), whatever
        ended it. ``text`` then holds whole characters only, as streamed: vLLM's result, whose
        detokenizer never emits those bytes (SGLang's adds a U+FFFD for them). vLLM also holds back
        bytes before them that form no character (it never emits a trailing U+FFFD); here they are
        shown, as the tokenizer's decode of the whole output shows them: the text is then as often
        a start of that decode, and fewer characters off it. The rest reads as
        the tokenizer decodes the output without that character's tokens: bytes that cannot form
        a character are U+FFFD, one per byte with SentencePiece byte fallback (its ``ByteFallback``
        decoder's rule) and one per maximal invalid sequence with byte-level BPE (its ``ByteLevel``
        decoder's, and Python's "replace"), as they are before more text.

        Only those two families can end inside a character: the token strings of every other
        decoder (WordPiece, Metaspace without byte fallback, Unigram, ...) are whole characters,
        so a U+FFFD that ends their text is the character itself, and stays."""
        if self._read == len(self._ids):
            return ""
        delta = self._pending_text()
        self.text += delta
        self._prefix = self._read = len(self._ids)
        self._history[-1] = (self._prefix, self._read, len(self.text))
        return delta

    def _pending_text(self) -> str:
        """The text ``flush`` adds now, nothing changed (the held tokens' whole characters)."""
        window_before = self._decode(self._ids[self._prefix : self._read])
        delta = self._new_text(window_before, self._decode(self._ids[self._prefix :]))
        return self._whole_characters(delta, window_before) if delta.endswith(_REPLACEMENT) else delta

    def _whole_characters(self, delta: str, window_before: str) -> str:
        """``delta``, the pending tokens' text ending in U+FFFD, up to the incomplete character at
        its end (found from the tokens' own bytes, read as constrained decoding reads them):
        the tokenizer's text of the pending tokens before the first that holds a byte of it, then,
        where it begins inside a token (byte-level BPE), that token's bytes before it, read as the
        ``ByteLevel`` decoder reads bytes (``String::from_utf8_lossy``: Python's "replace").
        ``delta`` itself where nothing is incomplete (a real or an invalid byte's U+FFFD) or the
        tokenizer's bytes cannot be read (an unsupported family, or a slow tokenizer other than
        SentencePiece's). ``window_before``: the text of ``ids[prefix:read]``."""
        from lmnb_engine.constrained.errors import GrammarError
        from lmnb_engine.constrained.vocab import token_bytes

        pending = self._ids[self._read :]
        try:
            raw = [b or b"" for b in token_bytes(self._tokenizer, pending)]
        except (GrammarError, AttributeError, TypeError):
            raw = _slow_sentencepiece_bytes(self._tokenizer, pending)
            if raw is None:
                return delta
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        whole = 0  # pending tokens that end on a character boundary
        for k, b in enumerate(raw, 1):
            utf8.decode(b)
            if not utf8.getstate()[0]:
                whole = k
        incomplete = utf8.getstate()[0]
        if not incomplete:
            return delta
        first, held = len(raw), 0  # the pending tokens from ``first`` on hold the incomplete bytes
        while held < len(incomplete):
            first -= 1
            held += len(raw[first])
        end = self._read + (first if held == len(incomplete) else whole)
        text = self._new_text(window_before, self._decode(self._ids[self._prefix : end]), end)
        if held == len(incomplete):  # it begins where a token does (always so with byte fallback)
            return text
        rest = b"".join(raw[whole:])
        return text + rest[: len(rest) - len(incomplete)].decode("utf-8", "replace")

    def newest_text_start(self) -> int:
        """Where in ``text`` the newest token's own text begins (a character index), for offsets
        into the text such as completions' ``text_offset``. After tokens held back (the bytes of a
        character, a run of byte tokens), that is past the whole characters they spell: where the
        newest token ended the hold, its ``add`` returned their text with its own; where it is
        held too, its bytes begin after them. A token whose bytes complete a character begun by
        held tokens shares that character's start. Costs up to three decodes where tokens were
        held, none otherwise.

        Raises:
            ValueError: no token was added."""
        if len(self._history) < 2:
            raise ValueError("no token added")
        prefix, read, start = self._history[-2]
        if read >= len(self._ids) - 1:  # (none held before it)
            return start
        if self._history[-1][2] == start:  # held too: after the whole characters of those before it
            newest = self._ids.pop()
            try:
                return start + len(self._pending_text())
            finally:
                self._ids.append(newest)
        window_before = self._decode(self._ids[prefix:read])
        held = self._decode(self._ids[prefix:-1])
        if held.startswith(window_before) and self._decode(self._ids[prefix:]).startswith(held):
            return start + len(held) - len(window_before)
        return start  # (the held text is not final without it: it completes their character)

    def whole_tokens(self, num_chars: int) -> tuple[int, int]:
        """``(n, length)``: the most leading output tokens whose text all lies in
        ``text[:num_chars]``, and the length of their text (``<= num_chars``). A token whose bytes
        end inside a character, or that adds no text of its own (a skipped special token), counts
        only with the later token that completes the text. A stream cut there sends ids and text
        in step."""
        k = bisect.bisect_right(self._history, num_chars, key=lambda h: h[2]) - 1
        _, read, length = self._history[k]
        return read - self._n_context, length

    def rollback(self, num_kept: int) -> None:
        """Forget output tokens after the first ``num_kept`` (jump-forward / retokenization)."""
        if not 0 <= num_kept <= self.num_tokens:
            raise ValueError(f"cannot keep {num_kept} of {self.num_tokens} detokenized tokens")
        del self._ids[self._n_context + num_kept :]
        del self._history[num_kept + 1 :]
        self._prefix, self._read, text_len = self._history[-1]
        self.text = self.text[:text_len]
