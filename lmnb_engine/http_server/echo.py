"""The echoed prompt's logprob tokens and ``text_offset`` of ``/v1/completions`` (``echo``), read
from the prompt as given where the tokenizer's decoder does not read its tokens back to it.

The reply's text begins with the prompt as given (OpenAI's and vLLM's echo), while the tokens and
offsets of the rest of the reply follow the decoder (``CompletionLogprobs``). The two differ where
the decoder does not give the prompt back: a special token's text written in the prompt ("<s>hi":
its decode without special tokens is "hi", so every later offset was 3 short), an added token the
decoder misreads ("café" added to a byte-level BPE reads c a f E9, "caf" + U+FFFD: its token was
``bytes:caf\\xe9`` in a text that says "café"), a normalizer's change. There the prompt's tokens
are read along it: each its decoder's bytes where they come next in it, else the characters the
tokenizer's own offsets of the token (``return_offsets_mapping``) say it stands for.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Optional

from lmnb_engine.token_text import raw_bytes, token_text


def echoed_prompt(engine: Any, text: str, ids: list[int]) -> Optional[tuple[list[str], list[int]]]:
    """``(tokens, text_offset)`` of the prompt ``ids`` encoded from ``text`` (with special tokens, as
    ``/v1/completions`` encodes a prompt), both indexing ``text``, read token by token along it: a
    special token of no characters (a BOS the tokenizer adds) is its ``token_text`` with no width,
    though its text comes next in ``text`` (the prompt "<s>" is the BOS, then the "<s>" written: it
    was the BOS over the written one's characters, then an empty token); another token whose bytes as the decoder reads them (``raw_bytes``) come next in ``text`` is its
    ``token_text`` (``bytes:\\xNN`` for part of a character), at the start of the character its
    first byte is in, as the detokenizer places it; another is the characters the tokenizer's
    offsets say it stands for that no token before it took (none where they did: the "▁" a
    normalizer prepends), and the last token, if one of these, the rest of ``text`` too (the
    spaces GPT-2's offsets leave out); another of no characters is its ``token_text`` with no width
    too. So the tokens' bytes join into ``text`` but for a BOS. None where the decoder reads ``ids``
    back to ``text`` (then the decoder's tokens and offsets are these) or the tokenizer gives no
    offsets of these ids (a slow tokenizer)."""
    if engine.decode(ids, skip_special_tokens=True) == text:
        return None
    try:
        enc = engine.tokenizer(text, return_offsets_mapping=True, verbose=False)
    except (NotImplementedError, TypeError, ValueError):  # (a slow tokenizer gives no offsets)
        return None
    spans = enc.get("offset_mapping")
    if spans is None or list(enc["input_ids"]) != list(ids):
        return None
    data = text.encode()
    starts = list(itertools.accumulate((len(c.encode()) for c in text), initial=0))  # each character's byte
    tokens, offsets, at, taken = [], [], 0, False  # at: bytes of text read; taken: the last token's are characters
    added = set(getattr(engine.tokenizer, "all_special_ids", ()))
    for tid, (start, end) in zip(ids, spans):
        if start == end and tid in added:
            # a special token the tokenizer adds (a BOS) stands for no text, even where the prompt
            # spells it next: "<s>" written after the BOS is the next token's (it took the BOS's)
            tokens.append(token_text(engine, tid))
            offsets.append(bisect.bisect_right(starts, at) - 1)
            taken = False
            continue
        raw = raw_bytes(engine, tid)
        if raw and data.startswith(raw, at):
            tokens.append(token_text(engine, tid))
            offsets.append(bisect.bisect_right(starts, at) - 1)
            at, taken = at + len(raw), False
            continue
        first = bisect.bisect_left(starts, at)  # (the first character not read, whole)
        offsets.append(first)
        taken = end > start
        if taken:
            tokens.append(text[first:end])
            at = max(at, starts[max(first, end)])
        else:
            tokens.append(token_text(engine, tid))
    if taken and at < len(data):
        tokens[-1] += text[bisect.bisect_left(starts, at):]  # (trim_offsets: spaces no offsets hold)
    return tokens, offsets
