"""How ``select`` turns per-token logprobs of each choice into a decision.

The three methods and their names are SGLang's (``python/sglang/lang/choices.py``). What they are
fed differs from SGLang on purpose (see ``research/features.md`` §4.1): each backend scores exactly
the tokens of ``prompt + choice`` from the first token that differs from ``prompt``'s own
tokenization (token healing: a choice may merge with the prompt's last token), conditioned on
everything before it, and keeps logprobs that are exactly 0.0.
"""

from __future__ import annotations

import collections
import collections.abc
import math
import random
import reprlib
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from lmnb.ir import _python_value, shown_value


def choice_list(choices: Any, source: str = "choices") -> Any:
    """``choices`` as ``select`` (and ``gen(choices=...)``) reads them: a numpy array of choices
    (``df.label.unique()``) as the Python strings it holds; any other iterable but a string, bytes
    or a mapping (a pandas Series, a generator, a dict's ``keys()`` or ``values()``) as the list of
    its items, a set's sorted, since its order changes from run to run (strings' hashes are salted)
    and with it ties, a seeded sample and the meta info's order. A ``%%lm`` cell reads a kernel
    variable's choices with it too, so that a cell takes what ``lmnb.select`` takes. Any other value
    is returned as it is, for the caller to refuse.

    Raises:
        TypeError: ``choices`` is a mapping (a dict), which would give its keys where its values may
            be meant (SGLang's select takes a list of strings; ``{fork x in d}`` refuses a dict too);
            the message names both spellings, with ``choices`` written ``source`` (a cell's
            expression).
    """
    problem = mapping_choices_problem(choices, source)
    if problem:
        raise TypeError(problem)
    choices = _python_value(choices)  # (numpy scalars and arrays as Python values)
    if isinstance(choices, (set, frozenset)):
        choices = sorted(choices, key=str)
    if isinstance(choices, collections.abc.Iterable) and not isinstance(choices, (str, bytes, list, tuple)):
        choices = _python_value(list(choices))
    return choices


def mapping_choices_problem(choices: Any, source: str = "choices") -> Optional[str]:
    """Why ``choices`` cannot be a ``select``'s when it is a mapping (a dict), naming both spellings
    of what may be meant with ``choices`` written ``source`` (a cell's expression), or None for any
    other value. ``choice_list`` (a value) and a ``%%lm`` cell's parser (a literal dict) ask it."""
    if not isinstance(choices, collections.abc.Mapping):
        return None
    return (f"choices is a {type(choices).__name__}, whose keys or values may be meant; pass "
            f"list({source}) for its keys or list({source}.values()) for its values")


def select_temperature_problem(temperature: Any) -> Optional[str]:
    """Why ``temperature`` cannot be a ``select``'s (a Python value; numpy scalars read first), or
    None: a finite number >= 0, 0 taking the likeliest choice. NaN compared as not > 0 and was
    picked greedily, and True sampled at temperature 1, so both are refused. ``select()``,
    ``gen(choices=...)`` and a ``%%lm`` cell's parser (of a literal on ``{select}``) ask it."""
    from lmnb_engine.params import finite_number  # torch-free (an int past float's range is no temperature)

    if not (finite_number(temperature) and temperature >= 0):
        return f"temperature must be a finite number >= 0 (0 picks the likeliest), got {shown_value(temperature)}"
    return None


def choices_problem(choices: Any) -> Optional[str]:
    """Why ``choices`` (as ``choice_list`` reads them) cannot be a ``select``'s, or None: they must
    be a non-empty list (or tuple) of non-empty strings, each listed once. ``select()``,
    ``gen(choices=...)`` (after their own name) and a ``%%lm`` cell's parser ask it, for one wording
    (the first bad choice is named by its place, as a cell's reader finds it)."""
    # (select("x", "yes no") reads as one choice or its letters, b"yes no" as its byte values: neither is meant)
    if isinstance(choices, (str, bytes, bytearray)):
        return (f"choices must be a non-empty list of strings, not a {type(choices).__name__} "
                f"({reprlib.repr(choices)}); list the choices, e.g. ['yes', 'no']")
    if not isinstance(choices, (list, tuple)) or not choices:
        return "choices must be a non-empty list of strings"
    bad = next(((i, c) for i, c in enumerate(choices, start=1) if not isinstance(c, str) or not c), None)
    if bad is not None:
        return f"choices must be non-empty strings: choice {bad[0]} of {len(choices)} is {shown_value(bad[1])}"
    return repeated_choices_problem(choices)


def repeated_choices_problem(choices: Sequence[str]) -> Optional[str]:
    """Why ``choices`` cannot be a ``select``'s, naming the repeated ones, or None. SGLang accepts
    repeats; the pick and its scores would not say which of the equal entries won."""
    repeated = [c for c, count in collections.Counter(choices).items() if count > 1]
    if not repeated:
        return None
    return (f"choices must differ; {', '.join(map(repr, repeated))} {'is' if len(repeated) == 1 else 'are'} "
            "listed more than once: drop the repeats")


@dataclass(frozen=True)
class ChoiceLogprobs:
    """The scored tokens of one choice.

    token_ids: ``tokens(prompt + choice)[d:]`` where ``d`` is the first index at which they differ
        from ``tokens(prompt)`` (non-empty; ids, or token strings from APIs that give no ids).
    logprobs: natural-log probability of each of those tokens given all tokens before it (float).
    prefix_len: ``d``, the number of tokens the choice's scores are conditioned on.
    cached_tokens: how many of the scoring request's prompt tokens came from the prefix cache.
    unconditional_logprobs: the same tokens' logprobs with the prompt replaced by a neutral
        context (only for ``unconditional_likelihood_normalized``).
    prompt_meta: meta_info (prompt_tokens, cached_tokens, ...) of the request that prefilled the
        prompt alone before the choices were scored, when the backend made one (the same dict on
        every choice); lets views count that request and shade the prompt by it.
    """

    token_ids: list
    logprobs: list[float]
    prefix_len: int
    cached_tokens: int = 0
    unconditional_logprobs: Optional[list[float]] = None
    prompt_meta: Optional[dict] = None


@dataclass(frozen=True)
class ChoicesDecision:
    """The chosen string and what the method saw (``meta_info`` is what ``get_meta_info`` shows)."""

    decision: str
    meta_info: dict = field(default_factory=dict)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first position where token lists ``a`` and ``b`` differ (or the shorter length)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


class ChoicesSamplingMethod:
    """Base: ``scores(choices, logprobs) -> one float per choice`` (higher is better). A subclass
    written for SGLang, which defines ``__call__`` instead (SGLang's calling form, returning a
    ``ChoicesDecision``), decides by it."""

    requires_unconditional_logprobs = False

    def scores(self, scored: Sequence[ChoiceLogprobs]) -> list[float]:
        """One score per choice of ``scored`` (higher is better); a subclass's method."""
        raise NotImplementedError(f"{type(self).__name__} defines neither scores(scored) (lmnb's form of a choices "
                                  "method) nor __call__(*, choices, normalized_prompt_logprobs, ...) (SGLang's)")

    def method_meta(self, scored: Sequence[ChoiceLogprobs], values: list[float]) -> dict:
        """Meta info keys of this method alone (SGLang's names)."""
        return {}

    def given_scores(self, scored: Sequence[ChoiceLogprobs], normalized_prompt_logprobs: Sequence[float]) -> list[float]:
        """The scores of SGLang's calling form (``__call__``), which also passes each choice's
        normalized prompt logprob: by default ``scores(scored)``."""
        return self.scores(scored)

    def __call__(self, *, choices: Sequence[str], normalized_prompt_logprobs: Sequence[float],
                 input_token_logprobs: Sequence[list], output_token_logprobs: Optional[Sequence[list]] = None,
                 unconditional_token_logprobs: Optional[Sequence[list]] = None) -> ChoicesDecision:
        """SGLang's calling form (``sglang.lang.choices``): decide from a backend's
        ``[logprob, token_id, text]`` entries per choice (to test a method, or rescore a select's
        meta info). A ``None`` logprob (a token with no context) counts as 0.0, as in SGLang."""
        def values(entries):
            return [0.0 if e[0] is None else float(e[0]) for e in entries]

        scored = [
            ChoiceLogprobs([e[1] for e in entries], values(entries), 0, unconditional_logprobs=(
                None if unconditional_token_logprobs is None else values(unconditional_token_logprobs[i])))
            for i, entries in enumerate(input_token_logprobs)
        ]
        decision = self.decide(choices, scored, values=self.given_scores(scored, normalized_prompt_logprobs))
        decision.meta_info["normalized_prompt_logprobs"] = list(normalized_prompt_logprobs)
        if output_token_logprobs is not None:
            decision.meta_info["output_token_logprobs"] = list(output_token_logprobs)
        return decision

    def decide(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs], temperature: float = 0.0,
               rng: random.Random | None = None, values: Optional[list[float]] = None) -> ChoicesDecision:
        """The decision: argmax of ``scores`` (first on ties) when ``temperature`` is 0, else a
        sample from ``softmax(scores / temperature)`` (an lmnb extension; SGLang asserts 0) drawn
        with ``rng`` (default: the ``random`` module's generator). The meta info has SGLang's keys
        and entry shapes (``[logprob, token_id, None]`` per scored token) plus ``method_meta``'s.
        ``values``: the scores, when the caller has them already.

        Raises:
            ValueError: a method of SGLang's form (its own ``__call__``) with a ``temperature`` > 0
                (it gives no scores to sample from), or deciding on a string not among ``choices``.
        """
        if values is None and type(self).__call__ is not ChoicesSamplingMethod.__call__:
            return self._decide_by_call(choices, scored, temperature)
        values = self.scores(scored) if values is None else list(values)
        if temperature > 0:
            top = max(values)
            weights = [math.exp((v - top) / temperature) for v in values]
            index = (rng or random).choices(range(len(choices)), weights=weights)[0]
        else:
            index = max(range(len(values)), key=lambda i: (values[i], -i))
        meta = _meta(choices, scored)
        meta["scores"] = values
        meta.update(self.method_meta(scored, values))
        return ChoicesDecision(decision=choices[index], meta_info=meta)

    def _decide_by_call(self, choices: Sequence[str], scored: Sequence[ChoiceLogprobs],
                        temperature: float) -> ChoicesDecision:
        """The decision of a method of SGLang's form: its ``__call__`` given SGLang's arguments;
        the meta info is ``decide``'s (no ``scores``) with the method's own on top."""
        name = type(self).__name__
        if temperature > 0:
            raise ValueError(f"choices_method {name} decides by __call__ (SGLang's form) and gives no scores to "
                             "sample from at temperature > 0: use temperature=0, or define scores(scored) instead")
        meta = _meta(choices, scored)
        decision = self(choices=list(choices), normalized_prompt_logprobs=meta["normalized_prompt_logprobs"],
                        input_token_logprobs=meta["input_token_logprobs"],
                        output_token_logprobs=meta["output_token_logprobs"],
                        unconditional_token_logprobs=meta.get("unconditional_token_logprobs"))
        picked = getattr(decision, "decision", None)
        if picked not in choices:
            raise ValueError(f"choices_method {name} returned {shown_value(decision)}, not a ChoicesDecision whose decision is "
                             f"one of the choices {list(choices)!r}")
        meta.update(decision.meta_info or {})
        return ChoicesDecision(decision=picked, meta_info=meta)


def _meta(choices: Sequence[str], scored: Sequence[ChoiceLogprobs]) -> dict:
    """A select's meta info: SGLang's keys and entry shapes (``[logprob, token_id, None]`` per
    scored token), and where each choice's scoring began."""
    meta = {
        "choices": list(choices),
        "normalized_prompt_logprobs": [_mean(s.logprobs) for s in scored],
        "input_token_logprobs": [
            [[lp, tid, None] for lp, tid in zip(s.logprobs, s.token_ids)] for s in scored
        ],
        "output_token_logprobs": [[] for _ in scored],  # SGLang's key: scoring generates nothing
        "prefix_len": [s.prefix_len for s in scored],
        "cached_tokens": [s.cached_tokens for s in scored],
    }
    if scored and scored[0].unconditional_logprobs is not None:
        meta["unconditional_token_logprobs"] = [
            [[lp, tid, None] for lp, tid in zip(s.unconditional_logprobs or [], s.token_ids)] for s in scored
        ]
    if scored and scored[0].prompt_meta is not None:
        meta["prompt_prefill"] = dict(scored[0].prompt_meta)
    return meta


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Mean token logprob of each choice (SGLang's default)."""

    def scores(self, scored):
        """The mean logprob of each choice's tokens."""
        return [_mean(s.logprobs) for s in scored]

    def given_scores(self, scored, normalized_prompt_logprobs):
        """SGLang's calling form decides by the normalized logprobs it is given."""
        return [float(v) for v in normalized_prompt_logprobs]


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token: keep the choices whose logprob at position j is the highest among those
    still kept, until one remains. Shorter choices are padded with their own mean logprob (SGLang).
    The score of a choice is the position at which it was eliminated (the winner gets the most)."""

    @staticmethod
    def _matrix(scored) -> list[list[float]]:
        width = max(len(s.logprobs) for s in scored)
        return [list(s.logprobs) + [_mean(s.logprobs)] * (width - len(s.logprobs)) for s in scored]

    def method_meta(self, scored, values):
        return {"greedy_logprob_matrix": self._matrix(scored)}

    def scores(self, scored):
        """The position where each choice was eliminated; the survivors score above all of them (on a
        tie the earliest choice highest)."""
        rows = self._matrix(scored)
        width = len(rows[0])
        alive = list(range(len(rows)))
        out = [0.0] * len(rows)
        for j in range(width):
            best = max(rows[i][j] for i in alive)
            for i in alive:
                if rows[i][j] != best:
                    out[i] = float(j)
            alive = [i for i in alive if rows[i][j] == best]
            if len(alive) == 1:
                break
        for rank, i in enumerate(alive):  # ties: the earliest choice wins
            out[i] = float(width + len(alive) - rank)
        return out


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Mean of (conditional − unconditional) token logprobs: how much the prompt raises each
    choice's likelihood (the EleutherAI normalization SGLang cites)."""

    requires_unconditional_logprobs = True

    def method_meta(self, scored, values):
        return {"normalized_unconditional_prompt_logprobs": list(values)}

    def scores(self, scored):
        """The mean of conditional minus unconditional logprobs of each choice."""
        out = []
        for s in scored:
            if s.unconditional_logprobs is None:
                raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
            out.append(_mean([c - u for c, u in zip(s.logprobs, s.unconditional_logprobs)]))
        return out


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()


def choices_method_problem(method: Any) -> Optional[str]:
    """Why ``method`` cannot be a ``select``'s ``choices_method``, or None: it must be an instance
    of ``ChoicesSamplingMethod`` (SGLang's three, or a subclass of one's own). ``select()``,
    ``gen(choices=...)`` and a ``%%lm`` cell's parser (of a literal: ``choices_method="x"``) ask it."""
    if isinstance(method, ChoicesSamplingMethod):
        return None
    return ("choices_method must be one of lmnb.token_length_normalized, lmnb.greedy_token_selection, "
            "lmnb.unconditional_likelihood_normalized, or an instance of a lmnb.choices.ChoicesSamplingMethod "
            f"subclass; got {shown_value(method)}")
