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
    ``/v1/completions`` encodes a prompt: ``Engine.prompt_ids``, which leaves out the tokenizer's
    BOS where the text writes its own), both indexing ``text``, read token by token along it: a
    token whose bytes as the decoder reads them (``raw_bytes``) come next in ``text`` is its
    ``token_text`` (``bytes:\\xNN`` for part of a character), at the start of the character its
    first byte is in, as the detokenizer places it; another is the characters the tokenizer's
    offsets say it stands for that no token before it took (none where they did: the "▁" a
    normalizer prepends), and the last token, if one of these, the rest of ``text`` too (the
    spaces GPT-2's offsets leave out); one of no characters (a BOS the tokenizer adds) is its
    ``token_text`` with no width. So the tokens' bytes join into ``text`` but for a BOS. None where
    the decoder reads ``ids`` back to ``text`` (then the decoder's tokens and offsets are these) or
    the tokenizer gives no offsets of these ids (a slow tokenizer)."""
    if engine.decode(ids, skip_special_tokens=True) == text:
        return None
    try:
        enc = engine.tokenizer(text, return_offsets_mapping=True, verbose=False)
    except (NotImplementedError, TypeError, ValueError):  # (a slow tokenizer gives no offsets)
        return None
    spans, encoded = enc.get("offset_mapping"), list(enc["input_ids"])
    if spans is not None and encoded[1:] == list(ids):
        spans = spans[1:]  # (the tokenizer's BOS, left out where the text writes its own: Engine.prompt_ids)
    elif spans is None or encoded != list(ids):
        return None
    data = text.encode()
    starts = list(itertools.accumulate((len(c.encode()) for c in text), initial=0))  # each character's byte
    tokens, offsets, at, taken = [], [], 0, False  # at: bytes of text read; taken: the last token's are characters
    for tid, (start, end) in zip(ids, spans):
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
