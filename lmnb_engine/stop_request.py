"""The stop checks of one request, each stop string read by one reader.

A request's stops are read three ways: a stop string that is a special token's whole text, which
the output text leaves out, by the token's id (``special_stops``: sampling it is the stop); the
stop strings holding a special token's text among other text, in the output text with the skipped
tokens' text put back (``stop_special.SpecialTextStops``, which then reads the whole-text ones too,
so that list order ranks them); every other stop string and the stop regexes in the output text
(``stop_matcher.StopStringMatcher``). ``RequestStops`` routes each stop string to one of them and
answers the scheduler's three questions (is there a stop after this token; how much text may be
streamed; is there one where the output ends) in one call each.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

from lmnb_engine.detokenizer import IncrementalDetokenizer
from lmnb_engine.params import SamplingParams
from lmnb_engine.stop_matcher import StopRegexes, StopStringMatcher
from lmnb_engine.stop_special import SpecialTextStops, skipped_tokens, special_stops


class StopHit(NamedTuple):
    """A stop met in a request's output text."""

    start: int  # where it begins in the output text: the text returned ends there
    matched: str  # the stop string, or the stop regex's matched text (``FinishReason.matched``)
    # the leading output tokens through the one whose text ends the stop (a token that straddles its
    # end too; that a skipped special token's text ends it: that token): those after it are dropped
    # from the result, as SGLang stops at that token
    tokens: int


class RequestStops:
    """The stop strings and stop regexes of one request (one sample of it), each stop string read
    by one reader (the module docstring).

    Args:
        tokenizer: the model's tokenizer (its skipped tokens: ``stop_special.skipped_tokens``).
        params: the request's sampling parameters (``stop_strings``, ``stop_regexes``,
            ``skip_special_tokens``).
        regexes: the request's compiled stop regexes, shared by its samples (``StopRegexes``);
            None: compiled from ``params.stop_regexes`` for this sample alone.

    Attributes:
        special_stops: ``{token id: stop string}``, the stop strings that are a skipped token's
            whole text, where the request has no stop holding one among other text (else read by
            ``special_text``; empty then).
        special_text: the ``SpecialTextStops`` of the stops holding a skipped token's text, where
            one holds it among other text; else None.
        marked: the ids of the tokens whose place in the output text the detokenizer must record
            (``IncrementalDetokenizer.marks``): for ``special_text``, or where the request has
            ``special_stops``, every skipped token, for the plain matcher (a stop that is a skipped
            token's whole text written out in plain tokens around one is no stop).
    """

    def __init__(self, tokenizer: Any, params: SamplingParams, regexes: Optional[StopRegexes] = None) -> None:
        stops = params.stop_strings
        skipped = skipped_tokens(tokenizer) if params.skip_special_tokens and stops else {}
        holding = [s for s in stops if any(t in s for t in skipped)]
        self.special_text: Optional[SpecialTextStops] = None
        self.special_stops: dict[int, str] = {}
        if any(s not in skipped for s in holding):
            self.special_text = SpecialTextStops(holding, stops, {i: t for t, ids in skipped.items() for i in ids})
            # (a stop string holding a special token's text is read there alone: a skipped token
            # inside its text written out in plain tokens makes it no stop, as in SGLang's text,
            # which keeps special tokens)
            plain = [s for s in stops if s not in holding]
            self.marked = frozenset(self.special_text.texts)
            whole = frozenset()
        else:
            # (a stop that is a token's whole text is also met written out in plain tokens, where the
            # output text holds it, but not with a skipped token sampled inside it, whose text breaks
            # it there as in SGLang's text: the skipped tokens' places are marked for the plain
            # matcher, which reads them only where such a stop occurs)
            self.special_stops = special_stops(tokenizer, stops, params.skip_special_tokens)
            plain = list(stops)
            whole = frozenset(self.special_stops.values())
            self.marked = frozenset(i for ids in skipped.values() for i in ids) if whole else frozenset()
        self._matcher = StopStringMatcher(plain, regexes or params.stop_regexes, whole)

    @property
    def problem(self) -> Optional[str]:
        """Why the stop regexes were given up (``StopStringMatcher.problem``), or None."""
        return self._matcher.problem

    @property
    def reads_end(self) -> bool:
        """Whether ``find`` must be asked where the output ends though no text came with its end: a
        stop regex's match may read the text's end, or a stop holding a special token's text may
        read one put back past the text."""
        return self._matcher.reads_end or self.special_text is not None

    def find(self, detokenizer: IncrementalDetokenizer, checked: int, newest: int,
             at_end: bool = False) -> Optional[StopHit]:
        """The stop that ends first in the output text (``detokenizer.text``) after its first
        ``checked`` characters, or None (``StopStringMatcher.find``, ``SpecialTextStops.find``,
        which reads ``detokenizer.marks``: ``newest`` is the index of the newest output token whose
        text was read, ``at_end`` whether the output ends with the text). A stop regex search that
        runs too long is given up, not raised (``problem``)."""
        text = detokenizer.text
        hit = self._matcher.find(text, checked, at_end=at_end, marks=detokenizer.marks)
        met = None
        if self.special_text is not None:
            hit = self.special_text.find(text, detokenizer.marks, checked, newest, hit)
            met = self.special_text.met
        if hit is None:
            return None
        if met is None:
            return StopHit(hit[0], hit[1], detokenizer.tokens_through(hit[0] + len(hit[1])))
        return StopHit(hit[0], hit[1], max(detokenizer.tokens_through(met[0]), met[1]))

    def safe_len(self, text: str, marks: Sequence[tuple[int, int, int]]) -> int:
        """Length of the prefix of the output ``text`` that cannot become part of a stop (the least
        of the readers' ``safe_len``)."""
        safe = self._matcher.safe_len(text)
        if self.special_text is not None:
            safe = min(safe, self.special_text.safe_len(text, marks))
        return safe
