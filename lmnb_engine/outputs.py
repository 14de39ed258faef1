"""What the engine returns: finished results and streamed events.

Mirrors SGLang's ``meta_info`` (prompt_tokens, cached_tokens, completion_tokens, finish_reason)
as typed, frozen records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

FinishType = Literal["stop", "length", "abort"]
# The message of an abort that was asked for (``Engine.abort``: a client's /abort_request, one that
# left), as against one for an error (NaN logits, an internal error, shutdown): the OpenAI routes
# report the first as the choice's finish reason and the second as a failure, as SGLang tells its
# graceful aborts from those with an error status.
ABORT_REQUESTED = "aborted by Engine.abort"
# The message of every request the engine had accepted (running, waiting, or queued just before the
# stop) when it shut down; a call made after the shutdown raises RuntimeError instead.
ABORT_SHUTDOWN = "aborted: the engine shut down (Engine.shutdown, or the Engine was dropped) before the request finished"
# The message of a request whose submitting call (submit, generate) was interrupted (Ctrl-C's
# KeyboardInterrupt) once it may have queued it: no caller holds its handle, so it is ended.
ABORT_INTERRUPTED = "aborted: the call that submitted it was interrupted (Ctrl-C, a KeyboardInterrupt) before it returned"
# The Python API's fix that ends the error of a call made once the engine has stopped (the
# scheduler's ``shut_down_error``); a server's clients cannot act on it, so the server leaves it out.
NEW_ENGINE_FIX = "; create a new Engine"


def rid_in_use(rid: str, prompts: int = 1, k: int = 0) -> str:
    """The refusal of a new request whose ``rid`` a running request holds (``Engine.submit``, and
    the OpenAI routes for a rid the engine has not seen yet: prompt k of several runs as <rid>-<k>).
    Of a request of ``prompts`` > 1 prompts, it says that prompt ``k``'s rid, <rid>-<k>, is the
    one in use: the client sent only <rid>."""
    taken = f"rid={rid!r}"
    if prompts > 1:
        taken += f" names its {prompts} prompts {f'{rid}-0'!r} to {f'{rid}-{prompts - 1}'!r}, and {f'{rid}-{k}'!r}"
    return f"{taken} is already in use by a running request; give another rid, or wait for that request to end"


@dataclass(frozen=True)
class FinishReason:
    """Why a request ended.

    type: ``"stop"`` (EOS, a stop token id or a stop string; ``matched`` holds it: for a regex /
    JSON schema that is complete, which the engine ends without sampling an EOS, the model's EOS
    id (its tokenizer's, where it has several), as SGLang names the EOS its grammar took),
    ``"length"`` (max_new_tokens or the context length was reached; ``length`` holds the output
    tokens then), ``"abort"`` (``Engine.abort``, shutdown or an error; ``message`` says which).
    field: for an abort that the request's own parameters caused (a grammar that, midway, allows
    only tokens ``min_new_tokens`` still bans, or is complete before ``min_new_tokens`` output
    tokens, so that only its banned EOS could follow; a ``stop_regex`` that backtracks past its time
    limit), the ``SamplingParams`` field to change: the caller's mistake, not the engine's
    failure, which front ends report as such.
    """

    type: FinishType
    matched: str | int | None = None
    message: str | None = None
    length: int | None = None
    field: str | None = None

    @property
    def requested_abort(self) -> bool:
        """Whether this is an abort that was asked for (``Engine.abort``), not an error's."""
        return self.type == "abort" and self.message == ABORT_REQUESTED

    def to_dict(self) -> dict:
        """SGLang's ``finish_reason`` JSON: ``type``, and ``matched``/``length``/``message`` when set
        (SGLang's ``FINISH_LENGTH`` says ``{"type": "length", "length": N}``)."""
        d: dict = {"type": self.type}
        if self.matched is not None:
            d["matched"] = self.matched
        if self.length is not None:
            d["length"] = self.length
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

    text: detokenized completion (stop string removed); token_ids: generated ids (list[int]; where a
    stop cut the output, those through the token whose text ends it, the tokens wholly after it
    dropped: docs/engine.md); logprobs: one ``TokenLogprob`` per id of ``token_ids`` when ``return_logprob``; prompt_logprobs:
    one per prompt token from ``logprob_start_len`` (the first prompt token has ``None``);
    next_token_logprob: with ``max_new_tokens=0`` and ``return_logprob``, the greedy next token
    after the prompt with its top alternatives, generated by no one (SGLang reports it as the one
    output logprob of such a request): the model's own most likely token, as every logprob is the
    model's own, no ``logit_bias`` or grammar mask applied (they act on tokens drawn, and none is).
    """

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    meta: RequestMeta
    logprobs: Optional[list[TokenLogprob]] = None
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
    index: int = 0  # sample index when SamplingParams.n > 1
    next_token_logprob: Optional[TokenLogprob] = None


@dataclass(frozen=True)
class StreamEvent:
    """One streamed step of a request: new text, and the ids whose text it completes.

    ``finished`` is True on the last event of the request, which carries ``result``.
    ``text_delta`` is always valid UTF-8 (bytes of an unfinished character are held back, as is
    text that may turn into a stop string). Ids and text go in step: an event carries whole
    tokens, ids (and logprobs) with their text, as OpenAI and vLLM stream logprobs; the last event
    carries every id left that the result keeps, e.g. a stop token's or those of a stop string's text.
    ``logprobs``: one ``TokenLogprob`` per id in ``token_ids`` when the request asked for
    ``return_logprob`` (NaN for tokens forced by jump-forward, which were not sampled), else None.
    ``prompt_tokens`` / ``cached_tokens``: the request's prompt length and how much of it the radix
    cache served (fixed at its first admission), on every event as SGLang's stream chunks carry
    them, so a request stopped mid-stream still reports its prompt.
    """

    rid: str
    text_delta: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    result: Optional[GenerateResult] = None
    index: int = 0
    logprobs: Optional[list[TokenLogprob]] = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
