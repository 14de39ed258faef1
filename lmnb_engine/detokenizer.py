"""Incremental detokenization for streamed output.

The detokenizer decodes a sliding window of ids and emits only the text that the newest token
added, holding back a character cut at its end (the text ends in U+FFFD: the tokens' bytes tell
an incomplete UTF-8 sequence from invalid bytes, ``_final_end``, read by ``detokenizer_bytes``)
and, with SentencePiece byte fallback, a run of byte tokens while it is open (``_run_holders``).
The window starts a few prompt tokens back so tokenizers that drop a leading space at the start
of a decode (SentencePiece) still produce the right first word. This is the scheme of vLLM's
``detokenize_incrementally`` and SGLang's ``DetokenizerManager`` (``surr_offset``/``read_offset``).
Stop strings and regexes are matched on its text by ``stop_matcher``.
"""

from __future__ import annotations

import bisect
import codecs
import json
import weakref
from typing import Any, Callable, Sequence

from lmnb_engine.detokenizer_bytes import before_cut, cut_bytes, decoded_bytes, known_bytes

# Prompt tokens decoded in front of the output so the first word keeps its leading space
# (SGLang: INIT_INCREMENTAL_DETOKENIZATION_OFFSET).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


def _decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``ids -> text`` as ``tokenizer.decode(ids, skip_special_tokens=...)`` gives it.

    A fast (Rust) tokenizer is called directly: transformers' ``decode`` adds ~10 us of Python
    per call around the same ``tokenizers.Tokenizer.decode``, and detokenizing costs up to three
    decodes per token per request on the scheduler's thread (``IncrementalDetokenizer.add``: two,
    and a third where the text is streamed up to a character cut at its end). Its one extra step,
    cleaning up spaces before punctuation, is kept by falling back to ``decode`` when the
    tokenizer asks for it.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


_Runs = tuple[dict[bool, frozenset[int]], dict[int, bytes] | None, str]

# tokenizer -> its _run_holders (special tokens skipped and not), _run_bytes and _run_strip: reading
# the decoder costs a serialization (of the decoder alone), once per tokenizer rather than per request
_RUNS: "weakref.WeakKeyDictionary[Any, _Runs]" = weakref.WeakKeyDictionary()


def _runs(tokenizer: Any) -> _Runs:
    """``(_run_holders's answers by skip_special_tokens, _run_bytes's answer, _run_strip's)``, read
    once per tokenizer."""
    try:
        found = _RUNS.get(tokenizer)
    except TypeError:  # (not weakly referable: read each time)
        found = None
    if found is None:
        found = _new_runs(tokenizer)
        try:
            _RUNS[tokenizer] = found
        except TypeError:
            pass
    return found


def _run_holders(tokenizer: Any, skip_special_tokens: bool) -> frozenset[int]:
    """The ids after which the text of a run of byte tokens is held back: with a ``ByteFallback``
    decoder (SentencePiece byte fallback: Llama 2, Mistral), its ``<0xNN>`` tokens, and the special
    tokens where they are skipped (a skipped token never reaches the decoder, so the run goes on
    past it); no ids for other tokenizers, whose decoders read each byte once.

    ``ByteFallback`` reads a run of byte tokens as one string where the run is valid UTF-8 and as
    one U+FFFD per byte where it is not, so a later byte of the run (a stray ``<0xFF>`` after the
    bytes of "中") turns the characters already there into U+FFFD: the run's text is final only
    once a token the decoder reads as text ends it, or the output ends."""
    return _runs(tokenizer)[0][skip_special_tokens]


def _run_bytes(tokenizer: Any) -> dict[int, bytes] | None:
    """The byte of each ``<0xNN>`` token (id -> one byte) where the decoder is Llama 2's or
    Gemma's: ``Replace("▁", " ")`` (or ``Metaspace("▁")``, as transformers' TIPSv2 tokenizer has it,
    or none), ``ByteFallback``, ``Fuse``, then at most a ``Strip`` of one leading character. That decoder writes a run of byte tokens after other text (the
    decoded text of at least one token that is not a byte token) as ``ByteFallback`` reads the run
    alone, so the run's text is known from its bytes (``_RunLength``). None for other decoders
    (another step could rewrite the run's text), and where ``decoded_bytes``, which
    ``_whole_characters`` reads, reads a byte token otherwise."""
    return _runs(tokenizer)[1]


def _run_strip(tokenizer: Any) -> str:
    """The character the ``Strip`` of a ``_run_bytes`` decoder cuts off the start of the whole text
    (Llama 2's: a space), "" where it has none: a run of byte tokens with no text before it reads
    as ``ByteFallback`` reads the run, less that character where the run's text begins with it."""
    return _runs(tokenizer)[2]


def _new_runs(tokenizer: Any) -> _Runs:
    """``_runs``'s answer, read from the tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    spec = json.loads(decoder.__getstate__()) if decoder is not None else {}
    found, stack = set(), [spec] if spec else []
    while stack:
        d = stack.pop()
        found.add(d.get("type"))
        stack.extend(d.get("decoders") or [])
    if "ByteFallback" not in found:
        return {True: frozenset(), False: frozenset()}, None, ""
    byte_of = {backend.token_to_id(f"<0x{b:02X}>"): bytes([b]) for b in range(256)}
    byte_of.pop(None, None)
    byte_ids = frozenset(byte_of)
    special = {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if t.special}
    holders = {True: byte_ids | special, False: byte_ids}
    strip = _writes_runs_as_read(spec)
    if strip is None or not _read_alike(tokenizer, byte_of):
        return holders, None, ""
    return holders, byte_of, strip


def _writes_runs_as_read(spec: dict) -> str | None:
    """Whether the decoder ``spec`` (its JSON) is ``_run_bytes``'s: before ``ByteFallback`` at most a
    ``Replace("▁", " ")`` or a ``Metaspace("▁")``, which read each token alone and find no "▁" in a
    byte token's ``<0xNN>``; after it only
    ``Fuse`` joins the strings, and a ``Strip`` after it cuts at most one character off the start
    of the whole text, which a run after other text never begins. That character (``_run_strip``;
    "" for none) where it is, else None."""
    chain = list(spec.get("decoders") or []) if spec.get("type") == "Sequence" else [spec]
    if chain and chain[0].get("type") == "Replace":  # ("▁" never occurs in "<0xNN>")
        if chain[0].get("pattern") != {"String": "\u2581"} or chain[0].get("content") != " ":
            return None
        chain.pop(0)
    elif chain and chain[0].get("type") == "Metaspace":  # (per token, before the bytes are read: as Replace)
        if chain[0].get("replacement") != "\u2581":
            return None
        chain.pop(0)
    if [d.get("type") for d in chain[:2]] != ["ByteFallback", "Fuse"]:
        return None
    strip = chain[2:]
    if not strip:
        return ""
    if (len(strip) == 1 and strip[0].get("type") == "Strip" and strip[0].get("start", 0) <= 1
            and strip[0].get("stop") == 0 and len(strip[0].get("content", "")) == 1):
        return strip[0]["content"] if strip[0].get("start", 0) else ""
    return None


def _read_alike(tokenizer: Any, byte_of: dict[int, bytes]) -> bool:
    """Whether ``decoded_bytes``, which ``_whole_characters`` reads, reads each byte token as its byte."""
    return decoded_bytes(tokenizer, known_bytes(tokenizer, False), list(byte_of), False) == list(byte_of.values())


class _RunLength:
    """The length of the text ``_pending_text`` gives for a run of byte tokens ``ids[read:end]``
    held, read a token's bytes at a time (``_run_bytes``): ``ByteFallback``'s text of the run less a
    character cut at its end (``cut_bytes`` of those Python's incremental UTF-8 decoder holds at
    the end, as ``_whole_characters`` reads them), that is the characters of the bytes before the
    cut where they are valid UTF-8, else one U+FFFD per byte. (Where the run is not valid before
    the cut, the strict decoder has failed, or holds bytes no byte completes: the bytes it failed
    on lie before those held.) Those characters
    less ``strip`` (``_run_strip``) where they begin with it and no text comes before the run (the
    output's first tokens, no prompt context): the decoder's ``Strip`` cuts it off the whole text.
    ``_pending_text`` decodes the whole run for it, and ``newest_text_start`` asked for it for every
    token of a run, which cost time quadratic in the run."""

    def __init__(self, read: int, strip: str = "") -> None:
        self.read = self.end = read
        self._strict = codecs.getincrementaldecoder("utf-8")()  # (until the run is spoilt)
        self._lossy = codecs.getincrementaldecoder("utf-8")("replace")  # (its state: the cut bytes)
        self._bytes = self._chars = 0
        self._valid = True
        self._strip, self._stripped = strip, 0  # (1 where the run's text begins with ``strip``)

    def add(self, raw: bytes) -> None:
        """Read the next token of the run, whose bytes are ``raw`` (none for a skipped special token)."""
        self.end += 1
        self._bytes += len(raw)
        self._lossy.decode(raw)
        if self._valid:
            try:
                text = self._strict.decode(raw)
            except UnicodeDecodeError:
                self._valid = False
            else:
                if not self._chars and text:
                    self._stripped = int(text[0] == self._strip)
                self._chars += len(text)

    def __len__(self) -> int:
        held = self._lossy.getstate()[0]
        cut = cut_bytes(held)
        if self._valid and cut == held:
            return self._chars - self._stripped
        return self._bytes - len(cut)


class IncrementalDetokenizer:
    """Decodes output token ids one at a time into ``text`` (always complete characters).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode(ids, skip_special_tokens=...)``).
        prompt_ids: the prompt (only its last few ids are used, as decoding context).
        skip_special_tokens: passed to ``decode``.
        marked: ids whose place in ``text`` is recorded in ``marks`` as they are added (the special
            tokens ``text`` leaves out, for ``stop_special.SpecialTextStops``); none by default.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], skip_special_tokens: bool = True,
                 marked: frozenset[int] = frozenset()) -> None:
        self._tokenizer = tokenizer
        self._marked = marked
        # (output token index, token id, where in ``text`` it sits: newest_text_start as it was
        # added) per token of ``marked``, in order; rollback drops those of the tokens it forgets
        self.marks: list[tuple[int, int, int]] = []
        self._decode_ids = _decoder(tokenizer, skip_special_tokens)
        self._holders = _run_holders(tokenizer, skip_special_tokens)
        # (a decode that cleans up spaces may rewrite a run's text: its bytes do not tell it)
        cleans_up = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._byte_of = None if cleans_up else _run_bytes(tokenizer)
        self._strip = _run_strip(tokenizer)
        self._skip = skip_special_tokens
        self._known = known_bytes(tokenizer, skip_special_tokens)  # (the tokens' bytes, read as they are held)
        self._run: _RunLength | None = None  # the held run's text read so far, for newest_text_start
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
        """Append one output token; return the text it completes ("" while bytes are pending).

        Decodes nothing for a token that holds a run of byte tokens back (``_run_holders``), else
        the window before and with the token (two decodes), and a third time up to a character
        cut at the window's end where the held tokens' text before it is final (``_final_end``);
        one more, of the new tokens alone, where a decode that cleans up spaces rewrote the
        window's end (``_new_text``)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        delta = ""
        # (a token holding a run's text back adds none, so nothing is decoded: the window grows with
        # the run, and decoding it for each of the run's tokens cost time quadratic in the run)
        if token_id not in self._holders:
            window_before = self._decode(self._ids[self._prefix : self._read])
            window_now = self._decode(self._ids[self._prefix :])
            end = len(self._ids)
            if window_now.endswith(_REPLACEMENT):
                end = self._final_end()
                if self._read < end < len(self._ids):
                    window_now = self._decode(self._ids[self._prefix : end])
            if end > self._read and len(window_now) > len(window_before):
                delta = self._new_text(window_before, window_now, end)
                self.text += delta
                self._prefix, self._read = self._read, end
        self._history.append((self._prefix, self._read, len(self.text)))
        if token_id in self._marked:
            self.marks.append((self.num_tokens - 1, token_id, self.newest_text_start()))
        return delta

    def _final_end(self) -> int:
        """Where the output's final text ends (an index into ``ids``, at least ``read``) when the
        held tokens' text ends in U+FFFD: after them all where that U+FFFD is no character cut at
        the end (invalid bytes, a stray continuation byte, which no later byte changes, or U+FFFD
        itself), else before the cut character (``before_cut``). Holding back the whole text
        while it ended in U+FFFD held it for good after invalid bytes, so the window grew with
        the output: thousands of stray bytes in a row cost time quadratic in them. ``read``
        (nothing final) where the tokens' bytes cannot be read, and with SentencePiece byte
        fallback where a character is cut (the rest of its run may rewrite the text before it)."""
        raw = self._held_bytes()
        if raw is None:
            return self._read
        k, _ = before_cut(raw)
        return self._read if k < len(raw) and self._holders else self._read + k

    def _held_bytes(self) -> list[bytes] | None:
        """The bytes of the tokens after ``read`` (``decoded_bytes``), None where they cannot be read."""
        raw = decoded_bytes(self._tokenizer, self._known, self._ids[self._read :], self._skip)
        if raw is None:
            self._known = None  # (not asked again)
        return raw

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
        its end (found from the tokens' own bytes, ``decoded_bytes``, by ``before_cut``):
        the tokenizer's text of the pending tokens before the first that holds a byte of it, then,
        where it begins inside a token (byte-level BPE), that token's bytes before it, read as the
        ``ByteLevel`` decoder reads bytes (``String::from_utf8_lossy``: Python's "replace").
        ``delta`` itself where nothing is incomplete (a real or an invalid byte's U+FFFD) or the
        tokenizer's bytes cannot be read (an unsupported family, or a slow tokenizer other than
        SentencePiece's). ``window_before``: the text of ``ids[prefix:read]``."""
        raw = self._held_bytes()
        if raw is None:
            return delta
        k, rest = before_cut(raw)
        if k == len(raw):
            return delta
        end = self._read + k
        text = self._new_text(window_before, self._decode(self._ids[self._prefix : end]), end)
        return text + rest.decode("utf-8", "replace")

    def newest_text_start(self) -> int:
        """Where in ``text`` the newest token's own text begins (a character index), for offsets
        into the text such as completions' ``text_offset``. After tokens held back (the bytes of a
        character, a run of byte tokens), that is past the whole characters they spell: where the
        newest token ended the hold, its ``add`` returned their text with its own; where it is
        held too, its bytes begin after them. A token whose bytes complete a character begun by
        held tokens shares that character's start. Costs no decode where none was held before it
        or it is held in a run of byte tokens (``_run_length``: a token's bytes read per token), else
        up to three decodes of the held tokens (once per run where it ends one).

        Raises:
            ValueError: no token was added."""
        if len(self._history) < 2:
            raise ValueError("no token added")
        prefix, read, start = self._history[-2]
        if read >= len(self._ids) - 1:  # (none held before it)
            return start
        if self._history[-1][2] == start:  # held too: after the whole characters of those before it
            run = self._run_length(len(self._ids) - 1)
            if run is not None:
                return start + run
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

    def _run_length(self, end: int) -> int | None:
        """``len(self._pending_text())`` were the output ``ids[:end]``, read from the bytes of the
        held tokens (``_RunLength``, kept from the last call while the same run is held) where they
        are byte tokens and skipped special tokens and ``_run_bytes`` holds; None elsewhere (a held
        token is read as text). With no token before the run in the window (``ids[prefix:read]``
        empty) the decoder's ``Strip`` may cut the run's first character (``_run_strip``)."""
        if self._byte_of is None:
            return None
        run = self._run
        if run is None or run.read != self._read or run.end > end:
            run = self._run = _RunLength(self._read, self._strip if self._prefix == self._read else "")
        for i in self._ids[run.end : end]:
            raw = self._run_bytes_of(i)
            if raw is None:
                self._run = None
                return None
            run.add(raw)
        return len(run)

    def _run_bytes_of(self, token: int) -> bytes | None:
        """What a held run of byte tokens adds for ``token`` (``_RunLength.add``): its byte (a
        ``<0xNN>`` token, ``_run_bytes``), nothing (``b""``) for a skipped special token (the run goes
        on past it, ``_run_holders``), None where the decoder reads it as text (it ends the run).
        Only where ``_run_bytes`` holds (``self._byte_of`` is not None)."""
        return self._byte_of.get(token, b"" if token in self._holders else None)

    def whole_tokens(self, num_chars: int) -> tuple[int, int]:
        """``(n, length)``: the most leading output tokens whose text all lies in
        ``text[:num_chars]``, and the length of their text (``<= num_chars``). A token whose bytes
        end inside a character, or that adds no text of its own (a skipped special token), counts
        only with the later token that completes the text. A stream cut there sends ids and text
        in step."""
        k = bisect.bisect_right(self._history, num_chars, key=lambda h: h[2]) - 1
        _, read, length = self._history[k]
        return read - self._n_context, length

    def tokens_through(self, num_chars: int) -> int:
        """The fewest leading output tokens whose text reaches ``num_chars`` characters of ``text``
        (``num_tokens`` where it is shorter): where the text of several tokens came at once (a run
        of byte tokens held back, the bytes of a character), each is read in turn, up to the first
        whose text, decoded with those before it, reaches there with whole characters. Tokens after
        it that add no text (a skipped special token, a byte token of the next character) are not
        counted. Used to drop the output tokens that lie wholly past a stop's end. A held run of
        byte tokens is read from its bytes (``_RunLength``, as ``newest_text_start`` reads it):
        decoding the window up to each of its tokens cost time quadratic in the run (1.7 s for a
        stop after a run of 3000)."""
        k = bisect.bisect_left(self._history, num_chars, key=lambda h: h[2])
        if k >= len(self._history):
            return self.num_tokens
        if k == 0:
            return 0
        prefix, read, length = self._history[k - 1]
        end = self._history[k][1]
        run = _RunLength(read, self._strip if prefix == read else "") if self._byte_of is not None else None
        before = None
        for m in range(read + 1, end):
            if run is not None:  # (while the tokens read are the run's: byte tokens, skipped ones)
                raw = self._run_bytes_of(self._ids[m - 1])
                if raw is not None:
                    run.add(raw)
                    if length + len(run) >= num_chars:
                        return m - self._n_context
                    continue
                run = None
            if before is None:
                before = self._decode(self._ids[prefix:read])
            window = self._decode(self._ids[prefix:m])
            if window.endswith(_REPLACEMENT):  # (a character not yet whole)
                continue
            added = len(window) - len(before) if window.startswith(before) else len(self._decode(self._ids[read:m]))
            if length + added >= num_chars:
                return m - self._n_context
        return end - self._n_context

    def rollback(self, num_kept: int) -> None:
        """Forget output tokens after the first ``num_kept`` (jump-forward / retokenization)."""
        if not 0 <= num_kept <= self.num_tokens:
            raise ValueError(f"cannot keep {num_kept} of {self.num_tokens} detokenized tokens")
        del self._ids[self._n_context + num_kept :]
        del self._history[num_kept + 1 :]
        self._run = None  # (it read tokens that may be gone)
        self._prefix, self._read, text_len = self._history[-1]
        self.text = self.text[:text_len]
        while self.marks and self.marks[-1][0] >= num_kept:
            self.marks.pop()
