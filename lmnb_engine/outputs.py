"""What the engine returns: finished results and streamed events.

Mirrors SGLang's ``meta_info`` (prompt_tokens, cached_tokens, completion_tokens, finish_reason)
as typed, frozen records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

FinishType = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class FinishReason:
    """Why a request ended.

    type: ``"stop"`` (EOS, a stop token id or a stop string; ``matched`` holds it),
    ``"length"`` (max_new_tokens or the context length was reached), ``"abort"`` (``Engine.abort``,
    shutdown or an error; ``message`` says which).
    """

    type: FinishType
    matched: str | int | None = None
    message: str | None = None

    def to_dict(self) -> dict:
        """SGLang's ``finish_reason`` JSON: ``type``, and ``matched``/``message`` when set."""
        d: dict = {"type": self.type}
        if self.matched is not None:
            d["matched"] = self.matched
        if self.message is not None:
            d["message"] = self.message
        return d


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob (natural log, float) of one token and, if asked, the top alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestMeta:
    """Token accounting of one request (counts of tokens).

    cached_tokens: prompt tokens whose KV came from the radix cache (paper §3 hit-rate numerator).
    forward_passes / jumped_tokens: filled by constrained decoding with jump-forward (paper §4).
    """

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    forward_passes: int = 0
    jumped_tokens: int = 0

    def to_dict(self) -> dict:
        """The fields as a dict (the ``meta_info`` counts of ``/generate``)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class GenerateResult:
    """A finished request.

    text: detokenized completion (stop string removed); token_ids: generated ids (list[int]);
    logprobs: one ``TokenLogprob`` per generated token when ``return_logprob``; prompt_logprobs:
    one per prompt token from ``logprob_start_len`` (the first prompt token has ``None``).
    """

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    meta: RequestMeta
    logprobs: Optional[list[TokenLogprob]] = None
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
    index: int = 0  # sample index when SamplingParams.n > 1


@dataclass(frozen=True)
class StreamEvent:
    """One streamed step of a request: new text and ids since the previous event.

    ``finished`` is True on the last event of the request, which carries ``result``.
    ``text_delta`` is always valid UTF-8 (bytes of an unfinished character are held back).
    ``logprobs``: one ``TokenLogprob`` per id in ``token_ids`` when the request asked for
    ``return_logprob`` (NaN for tokens forced by jump-forward, which were not sampled), else None.
    """

    rid: str
    text_delta: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    result: Optional[GenerateResult] = None
    index: int = 0
    logprobs: Optional[list[TokenLogprob]] = None
