"""The bytes a tokenizer's decoder reads from output token ids, and where in them a character is
cut, for the detokenizer (``detokenizer.IncrementalDetokenizer``). ``byte_reader`` reads a token
string's bytes by the tokenizer's family; constrained decoding reads the vocabulary with it.

Byte-level BPE and SentencePiece byte fallback can end a text inside a character, which the
tokenizer's decode ends in U+FFFD, as it ends invalid bytes. The detokenizer tells the two apart
from the tokens' bytes: ``decoded_bytes`` reads them as the decoder does (once per id per tokenizer,
``known_bytes``), ``before_cut`` finds the tokens before a character cut at their end, reading bytes
as the ``ByteLevel`` and ``ByteFallback`` decoders do (``String::from_utf8_lossy``: Python's
"replace"), and ``cut_bytes`` leaves out the first bytes of a UTF-16 surrogate, which Python's
incremental UTF-8 decoder holds though no byte completes them.
"""

from __future__ import annotations

import codecs
import json
import re
import weakref
from typing import Any, Callable

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decoder_types(tokenizer: Any) -> set[str]:
    """The ``type`` names in the fast tokenizer's decoder (nested ``Sequence`` flattened).

    Raises:
        ValueError: ``tokenizer`` is no fast tokenizer (``byte_reader``'s wording).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"needs a fast (Rust-backed) Hugging Face tokenizer; got {type(tokenizer).__name__}")
    spec = json.loads(backend.to_str()).get("decoder") or {}
    found, stack = set(), [spec]
    while stack:
        d = stack.pop()
        found.add(d.get("type"))
        stack.extend(d.get("decoders") or [])
    return found


# tokenizer -> byte_reader's answer (or its ValueError's message): reading the decoder's type
# serializes the whole tokenizer (0.16 s for 150,000 tokens), and token bytes are read per request
_READERS: "weakref.WeakKeyDictionary[Any, tuple[Callable[[str], bytes | None], str] | str]" = (
    weakref.WeakKeyDictionary())


def byte_reader(tokenizer: Any) -> tuple[Callable[[str], bytes | None], str]:
    """(token string -> its bytes or None, family name) for ``tokenizer``'s family, read once per
    tokenizer from its decoder: byte-level BPE (GPT-2, Llama 3, Qwen: token strings are bytes spelled
    with GPT-2's byte-to-character table ``bytes_to_unicode``, read backwards; None for a string
    with a character outside it), family "byte-level"; SentencePiece-style BPE with byte fallback
    (Llama 2, Mistral: ``<0xNN>`` is the byte NN, "▁" a space, other pieces their UTF-8), family
    "sentencepiece". Constrained decoding reads the vocabulary's bytes with it
    (``constrained.vocab``), the detokenizer the output's (``decoded_bytes``).

    Raises:
        ValueError: the tokenizer is no fast tokenizer, or of neither family; its message says
            what reading the bytes needs, worded to follow the reader's name ("constrained
            decoding needs a fast ...").
    """
    try:
        found = _READERS.get(tokenizer)
    except TypeError:  # (not weakly referable: read each time)
        found = None
    if found is None:
        try:
            found = _new_byte_reader(tokenizer)
        except ValueError as e:
            found = str(e)
        try:
            _READERS[tokenizer] = found
        except TypeError:
            pass
    if isinstance(found, str):
        raise ValueError(found)
    return found


def _new_byte_reader(tokenizer: Any) -> tuple[Callable[[str], bytes | None], str]:
    """``byte_reader``'s answer, read from the tokenizer's decoder.

    Raises:
        ValueError: the tokenizer is no fast tokenizer, or its decoder is of neither family.
    """
    kinds = _decoder_types(tokenizer)
    if "ByteLevel" in kinds:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        char_to_byte = {c: b for b, c in bytes_to_unicode().items()}

        def to_bytes(s: str) -> bytes | None:
            try:
                return bytes(char_to_byte[c] for c in s)
            except KeyError:
                return None

        return to_bytes, "byte-level"
    if kinds & {"ByteFallback", "Metaspace", "Replace"}:

        def to_bytes(s: str) -> bytes | None:
            m = _BYTE_TOKEN.fullmatch(s)
            return bytes([int(m.group(1), 16)]) if m else s.replace("\u2581", " ").encode("utf-8")

        return to_bytes, "sentencepiece"
    raise ValueError(
        f"cannot read token bytes from a tokenizer whose decoder is "
        f"{sorted(k for k in kinds if k)}; supported: byte-level BPE and SentencePiece byte-fallback"
    )


def _slow_sentencepiece_bytes(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> list[bytes] | None:
    """The bytes of ``ids`` for a slow (Python) SentencePiece tokenizer (one with an ``sp_model``:
    a checkpoint whose tokenizer_config names a SentencePiece-only class, such as
    ``GPTSw3Tokenizer``), read as ``byte_reader`` reads a fast one's, which needs the Rust
    tokenizer: ``<0xNN>`` is the byte NN, other pieces (added tokens too) their text with "▁" a
    space, special tokens none where they are skipped. None for other tokenizers. (Its decode reads
    a character cut at the end as one U+FFFD per byte, as the fast one does.)"""
    if getattr(tokenizer, "sp_model", None) is None:
        return None
    special = set(getattr(tokenizer, "all_special_ids", ())) if skip_special_tokens else set()
    raw = []
    for i, token in zip(ids, tokenizer.convert_ids_to_tokens(ids)):
        m = _BYTE_TOKEN.fullmatch(token)
        if i in special:
            raw.append(b"")
        else:
            raw.append(bytes([int(m.group(1), 16)]) if m else token.replace("\u2581", " ").encode())
    return raw


def _read_bytes(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> list[bytes] | None:
    """The bytes the decoder of a fast tokenizer joins for each of ``ids`` before reading them as
    UTF-8: the token's string read by its family's reader (``byte_reader``: byte-level
    BPE's byte-to-character table where each of its characters is in it, else its UTF-8 bytes, as
    ``ByteLevel`` reads a token; SentencePiece's ``<0xNN>`` and "▁"), added and special tokens
    alike, for the tokenizers library decodes their text with the rest ("café" added to a
    byte-level BPE reads c a f E9, "caf" + U+FFFD, whose E9 the next tokens' bytes may complete);
    b"" for a special token where those are skipped. The slow SentencePiece tokenizer's
    (``_slow_sentencepiece_bytes``) where the tokenizer is one; None where neither reads them
    (another family, or a slow tokenizer other than SentencePiece's)."""
    try:
        to_bytes, _ = byte_reader(tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(ids)
    except (ValueError, AttributeError, TypeError):
        return _slow_sentencepiece_bytes(tokenizer, ids, skip_special_tokens)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    skipped = {i for i in ids if i in added and added[i].special} if skip_special_tokens else set()
    return [b"" if i in skipped else to_bytes(t) or t.encode() for i, t in zip(ids, tokens)]


# tokenizer -> {skip_special_tokens: {id: the token's bytes}} as decoded_bytes reads them, filled as
# ids are met (None: not readable): add reads the held tokens' bytes each time their text ends in U+FFFD
_BYTES: "weakref.WeakKeyDictionary[Any, dict[bool, dict[int, bytes]] | None]" = weakref.WeakKeyDictionary()


def known_bytes(tokenizer: Any, skip_special_tokens: bool) -> dict[int, bytes] | None:
    """``tokenizer``'s bytes of the ids read so far (``decoded_bytes``) where special tokens are
    skipped or not, None where they cannot be read."""
    try:
        found = _BYTES.setdefault(tokenizer, {True: {}, False: {}})
    except TypeError:  # (not weakly referable: read each time)
        return {}
    return None if found is None else found[skip_special_tokens]


def decoded_bytes(tokenizer: Any, known: dict[int, bytes] | None, ids: list[int],
                  skip_special_tokens: bool) -> list[bytes] | None:
    """The bytes the decoder reads from each of ``ids`` (``_read_bytes``), b"" for a token that
    spells none (a skipped special token), kept in ``known`` (``known_bytes``), a token's read
    once; None where they cannot be read (another family, or a slow tokenizer other than
    SentencePiece's)."""
    if known is None:
        return None
    try:
        return [known[i] for i in ids]
    except KeyError:
        pass
    missing = list(dict.fromkeys(i for i in ids if i not in known))
    raw = _read_bytes(tokenizer, missing, skip_special_tokens)
    if raw is None:
        try:
            _BYTES[tokenizer] = None
        except TypeError:
            pass
        return None
    known.update(zip(missing, raw))
    return [known[i] for i in ids]


def cut_bytes(held: bytes) -> bytes:
    """The bytes of a character cut at the end of a text's bytes, of those Python's incremental
    UTF-8 decoder holds there (``held``, its state): all of them, but none where they begin a UTF-16
    surrogate (ED then A0 to BF), which that decoder holds for a third byte (the "surrogatepass"
    error handler's) though no byte makes them a character. Those are invalid for good: one U+FFFD
    per byte in the tokenizer's decode (``ByteLevel``'s ``String::from_utf8_lossy``,
    ``ByteFallback``) and in Python's final decode, as before more bytes."""
    return b"" if held[:1] == b"\xed" and held[1:2] >= b"\xa0" else held


def cut_at_end(data: bytes) -> bytes:
    """The bytes of a character cut at the end of ``data`` (``cut_bytes`` of those Python's UTF-8
    decoder holds there), read from its last three bytes: a cut character has at most three, the
    first a lead byte, at which the decoder begins a character wherever it stands."""
    tail = data[-3:]
    return cut_bytes(tail[codecs.utf_8_decode(tail, "replace", False)[1] :])


def _begins_here(data: bytes, end: int) -> bool:
    """Whether the decoder begins a character or an invalid byte's U+FFFD at ``data[end]``
    (``end < len(data)``): nothing is open before it, or what is open cannot go on with it (the
    first byte of "é" before "f": one U+FFFD, ended there)."""
    open_ = cut_at_end(data[max(0, end - 3) : end])
    if not open_:
        return True
    try:
        codecs.utf_8_decode(open_ + data[end : end + 1], "strict", False)
    except UnicodeDecodeError:
        return True
    return False


def before_cut(raw: list[bytes]) -> tuple[int, bytes]:
    """``(k, rest)`` for tokens whose bytes are ``raw``, read as the ``ByteLevel`` and
    ``ByteFallback`` decoders read bytes (``String::from_utf8_lossy``: Python's "replace"), where
    they end inside a character (``cut_at_end``): the first ``k`` tokens come before it, those before
    the first token that holds a byte of it where it begins where a token does (always so with
    byte fallback), else those up to the last token end before it where the decoder begins a
    character (``_begins_here``), and ``rest`` is then the bytes after them before it (b""
    otherwise). ``(len(raw), b"")`` where no character is cut. No later byte changes the first
    ``k`` tokens' text: the decoder begins a character or an invalid byte's U+FFFD after them
    whatever follows, and a byte after them only adds to the text."""
    data = b"".join(raw)
    cut = cut_at_end(data)
    if not cut:
        return len(raw), b""
    first, held = len(raw), 0  # the tokens from ``first`` on hold the cut bytes
    while held < len(cut):
        first -= 1
        held += len(raw[first])
    if held == len(cut):
        return first, b""
    k = start = end = 0
    for n, b in enumerate(raw[:first], 1):
        end += len(b)
        if _begins_here(data, end):
            k, start = n, end
    return k, data[start : len(data) - len(cut)]
