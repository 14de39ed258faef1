"""Stop strings that are the text of a special token.

The output text leaves special tokens out (``skip_special_tokens``, the default), so a stop string
that is one's text (a chat template's end of message: the tiny test model's ``<|end|>``, chatml's
``<|im_end|>`` on a base model, Llama-3's ``<|eot_id|>`` where the generation config lists only
``<|end_of_text|>`` as EOS) is never in the text the stop matcher reads when the model samples that
token. SGLang's ``Req.check_finished`` reads stop strings in the output's tail decoded with special
tokens, so it stops there; lmnb stops there too by treating such a token as a stop token of the
request (``Req.special_stops``), its finish reason ``matched`` naming the stop string, as SGLang's.
A stop string in which a special token's text is one part among other text is still read in the
output text only, where it matches only where the model spells the whole string out.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

# tokenizer -> {text: ids of the tokens of that text that a decode skipping special tokens leaves
# out}: read once per tokenizer (Llama-3 has 256 reserved special tokens, each decoded here)
_SKIPPED: "weakref.WeakKeyDictionary[Any, dict[str, tuple[int, ...]]]" = weakref.WeakKeyDictionary()


def skipped_tokens(tokenizer: Any) -> dict[str, tuple[int, ...]]:
    """``{text: token ids}`` of the added and special tokens that ``tokenizer.decode(...,
    skip_special_tokens=True)`` leaves out of the text, and that decode to that text where special
    tokens are kept. Tokens are read from ``added_tokens_decoder`` and ``all_special_ids`` (what a
    Hugging Face tokenizer has; a tokenizer without them has none)."""
    try:
        found = _SKIPPED.get(tokenizer)
    except TypeError:  # (not weakly referable: read each time)
        found = None
    if found is not None:
        return found
    ids = set(getattr(tokenizer, "added_tokens_decoder", None) or {})
    ids.update(getattr(tokenizer, "all_special_ids", None) or ())
    by_text: dict[str, list[int]] = {}
    for i in sorted(ids):
        text = tokenizer.decode([i], skip_special_tokens=False)
        if text and tokenizer.decode([i], skip_special_tokens=True) == "":
            by_text.setdefault(text, []).append(i)
    found = {text: tuple(found_ids) for text, found_ids in by_text.items()}
    try:
        _SKIPPED[tokenizer] = found
    except TypeError:
        pass
    return found


def special_stops(tokenizer: Any, stops: Sequence[str], skip_special_tokens: bool) -> dict[int, str]:
    """``{token id: stop string}`` for each of ``stops`` that is the whole text of a token the output
    text leaves out (``skipped_tokens``); empty where ``skip_special_tokens`` is False, since the
    text then holds the token's text and the stop matcher finds it there."""
    if not skip_special_tokens or not stops:
        return {}
    skipped = skipped_tokens(tokenizer)
    return {i: stop for stop in stops for i in skipped.get(stop, ())}
