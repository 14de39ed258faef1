"""Stop strings that hold the text of a special token.

The output text leaves special tokens out (``skip_special_tokens``, the default), so a stop string
holding one's text (a chat template's end of message: the tiny test model's ``<|end|>``, chatml's
``<|im_end|>`` on a base model, Llama-3's ``<|eot_id|>`` where the generation config lists only
``<|end_of_text|>`` as EOS) is never in the text the stop matcher reads when the model samples that
token. SGLang's ``Req.check_finished`` reads stop strings in the output's tail decoded with special
tokens kept (``tokenizer.decode``'s default), so it stops there, its finish reason ``matched``
naming the stop string; lmnb stops there too:

- a stop string that is a special token's whole text: sampling the token is the stop, as a stop
  token of the request (``special_stops``, ``Req.special_stops``);
- a stop string in which a special token's text is one part among other text (``"\\n<|end|>"``,
  ``"Human:<|end|>"``, ``"<|end|>\\nUser:"``): it is read in the output text with each special
  token's text put back where the model sampled it (``SpecialTextStops``; what the tokenizer's
  decode keeping special tokens gives, but for a decoder that reads text around a special token
  otherwise, such as a space it strips at the start of a decode). Where a request has such a stop,
  its stop strings that are a special token's whole text are read there too, so that among stops
  ending at one character the first listed wins, as ``StopStringMatcher.find`` rules.

The returned text is the output text (special tokens left out, as ever) up to where the stop
string begins: ``"\\n<|end|>"`` after "Hi\\n" gives "Hi", matched ``"\\n<|end|>"``. SGLang's
detokenizer cuts its text at the matched stop's first occurrence in the text without special
tokens, where it never occurs: it returns the whole text, "Hi\\n", the stop's own text kept. A
stop that begins inside a special token's text cuts before that token. A stop string with no special
token's text is matched by ``stop_matcher`` alone, as before, and one holding a special token's text
among other text by ``SpecialTextStops`` alone: written out in plain tokens it is met where that
text holds it, but not where the model sampled a skipped special token inside it, whose text breaks
it there as in SGLang's text (``stop_request`` routes each stop string to one reader). A stop
string that is a special token's whole text, where no stop holds one among other text, is met by
the token's id and in the output text by ``stop_matcher``, which passes over an occurrence written
out in plain tokens with a skipped special token sampled inside it (the detokenizer's marks, read
only where such a stop occurs), likewise. Where the
text before a special token is held back (the bytes of a character, a run of SentencePiece byte
tokens, which a skipped special token does not end), a stop reading that text is met once the text
comes: one token later, or at the output's end (``Scheduler._stop_at_end``), as a stop string in
the output text is.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from typing import Any, Optional, Sequence

from lmnb_engine.stop_matcher import StopStringMatcher

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


class SpecialTextStops:
    """The stop strings of one request that hold a special token's text, matched on the output text
    with each such token's text put back where the model sampled it (the module docstring).

    Args:
        stops: the request's stop strings that hold a special token's text (in list order).
        listed: all of the request's stop strings (``SamplingParams.stop_strings``), whose order
            ranks stops ending at one character.
        texts: ``{token id: text}`` of the tokens the output text leaves out (``skipped_tokens``);
            the detokenizer records where each of them sits (``IncrementalDetokenizer.marks``).
    """

    def __init__(self, stops: Sequence[str], listed: Sequence[str], texts: dict[int, str]) -> None:
        self.texts = texts
        self._rank: dict[str, int] = {}
        for i, s in enumerate(listed):
            self._rank.setdefault(s, i)
        # (in list order: the matcher ranks stops ending at one character by it)
        self._matcher = StopStringMatcher(sorted(stops, key=self._rank.__getitem__))
        # of the stop the last find returned, where it was one of these: (where it ends in the output
        # text, how many leading output tokens it reads: through the last whose text it reads put
        # back); None where it returned none or ``hit``
        self.met: Optional[tuple[int, int]] = None
        self._reset()

    def _reset(self) -> None:
        self._text = ""  # the output text read into ``_shown``
        self._used: list[tuple[int, int, int]] = []  # the marks whose token's text is put back there
        self._shown = ""  # the output text with those tokens' text put back
        # per mark used: where its token's text begins in _shown, and the length of all the tokens'
        # text put back up to and with it
        self._starts: list[int] = []
        self._shift: list[int] = []

    def _read(self, text: str, marks: Sequence[tuple[int, int, int]]) -> str:
        """``_shown`` for the output text ``text`` and the detokenizer's ``marks``: each marked token's
        text put back where it sits, one sitting past ``text``'s end (text held back before it)
        once the text gets there. Read on from the last call where ``text`` and ``marks`` extend
        what it read (the cost of the new text and marks), again from the start after a rollback."""
        if not text.startswith(self._text) or list(marks[: len(self._used)]) != self._used:
            self._reset()
        pos, pieces, length = len(self._text), [self._shown], len(self._shown)
        for mark in marks[len(self._used):]:
            place = max(mark[2], pos)  # (a token sits where the text stood as it came, or after)
            if place > len(text):
                break
            pieces.append(text[pos:place])
            length += place - pos
            added = self.texts[mark[1]]
            self._starts.append(length)
            self._shift.append((self._shift[-1] if self._shift else 0) + len(added))
            self._used.append(mark)
            pieces.append(added)
            length += len(added)
            pos = place
        pieces.append(text[pos:])
        self._text, self._shown = text, "".join(pieces)
        return self._shown

    def _place(self, at: int) -> int:
        """The place in the output text of ``at``, a place in ``_shown``: in a token's text put back,
        where that token sits."""
        j = bisect_left(self._starts, at) - 1  # the last token's text beginning before ``at``
        if j < 0:
            return at
        before = self._shift[j - 1] if j else 0
        return self._starts[j] - before if at < self._starts[j] + self._shift[j] - before else at - self._shift[j]

    def find(self, text: str, marks: Sequence[tuple[int, int, int]], checked: int, newest: int,
             hit: Optional[tuple[int, str]] = None) -> Optional[tuple[int, str]]:
        """The stop that ends first in the output ``text`` after its first ``checked`` characters,
        ``(where it begins in text, the stop string)``, or None: the first to end of ``hit`` (the
        stop ``StopStringMatcher.find`` found in ``text``, or None) and of these stops, read with
        the marked tokens' text put back (``marks``, of which those of tokens before ``newest``, the
        newest output token's index, sitting at ``checked`` or before it were read before); between
        stops ending at one place the first listed, stop regexes after stop strings. A stop
        beginning in a token's text put back begins where that token sits. Sets ``met`` (where the
        stop returned ends in ``text``, and the leading output tokens through the last whose text
        put back it reads) where that stop is one of these, else None."""
        self.met = None
        shown = self._read(text, marks)
        new_from = checked + sum(len(self.texts[i]) for k, i, place in self._used if k < newest and place <= checked)
        found = self._matcher.find(shown, new_from)
        if found is None:
            return hit
        start, stop = found
        own = (self._place(start + len(stop)), self._rank[stop], self._place(start), stop)
        best = own
        if hit is not None:
            best = min(best, (hit[0] + len(hit[1]), self._rank.get(hit[1], len(self._rank)), hit[0], hit[1]))
        if best is own:
            read = bisect_left(self._starts, start + len(stop))  # (the tokens whose text begins before its end)
            self.met = own[0], (self._used[read - 1][0] + 1 if read else 0)
        return best[2], best[3]

    def safe_len(self, text: str, marks: Sequence[tuple[int, int, int]]) -> int:
        """Length of the prefix of the output ``text`` that cannot become part of one of these stops
        (``StopStringMatcher.safe_len`` of the text with the marked tokens' text put back)."""
        return self._place(self._matcher.safe_len(self._read(text, marks)))

