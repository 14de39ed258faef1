"""One generation request as the scheduler sees it.

A request is a token sequence ``origin_input_ids + output_ids`` of which the first
``kv_committed_len`` positions have KV in the pool. Every step computes the positions
``[kv_committed_len:]``, so a prefill, a later chunk of a long prompt, a decode step (one new
token) and a forced jump-forward string are all the same operation ("extend"). This is SGLang's
``Req`` (``managers/schedule_batch.py``: ``origin_input_ids``, ``output_ids``, ``prefix_indices``,
``last_node``) reduced to what lmnb needs.

KV bookkeeping (positions of the request's row in ``req_to_token``):
``[0, cache_protected_len)`` are the prefix cache's slots, locked through ``last_node``;
``[cache_protected_len, kv_allocated_len)`` are the request's own; ``kv_committed_len <=
kv_allocated_len`` marks what a finished forward has actually written.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Hashable, Optional, Protocol, Sequence

import torch

from lmnb_engine.detokenizer import IncrementalDetokenizer
from lmnb_engine.outputs import FinishReason, TokenLogprob
from lmnb_engine.params import SamplingParams
from lmnb_engine.stop_matcher import StopRegexes
from lmnb_engine.stop_request import RequestStops


class TokenGrammar(Protocol):
    """Hook for constrained decoding (paper §4); ``Req.grammar`` holds one or None.

    The sampler calls ``allowed_token_mask`` before sampling a row (bool [vocab_size], True =
    allowed; None = no constraint this step) and ``accept_token`` with the sampled id. The
    scheduler ends the request with finish reason ``stop`` (``matched``: the model's EOS id) once
    ``is_terminated()`` is True (an abort with ``field`` ``min_new_tokens`` if fewer output tokens
    exist: ``sampler.grammar_end_reason``).
    """

    def allowed_token_mask(self, vocab_size: int) -> Optional[torch.Tensor]:
        """A bool mask over the vocabulary of the tokens allowed next, or None for no constraint."""

    def accept_token(self, token_id: int) -> None:
        """Advance by one sampled token."""

    def is_terminated(self) -> bool:
        """Whether the output is complete (nothing but EOS can extend it)."""


_MASK64 = 0xFFFFFFFFFFFFFFFF


def _mix64(z: int) -> int:
    """SplitMix64's step and finalizer (Steele et al., 2014): a 64-bit bijection that scrambles
    every input bit into every output bit."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seed_32(seed: int) -> int:
    """A 32-bit digest of a 64-bit request ``seed`` (mod 2**64): the high half of SplitMix64's
    finalizer, so seeds that differ anywhere (0, 2**32, 5 * 2**40) differ here too (up to chance
    collisions among 2**32)."""
    return _mix64(seed & _MASK64) >> 32


def sample_draw(seed: int, position: int) -> float:
    """The uniform draw in [0, 1) that samples output token ``position`` (0-based) of a request
    seeded ``seed``.

    A function of the position, not the next value of a stream: a token that is chosen without a
    draw (a jump-forward string's certain tokens), or a draw made for a draft position that is
    then rejected, must not shift the draws of later tokens, or sampled output would depend on
    ``disable_jump_forward`` (and on which drafts were proposed)."""
    z = _mix64((_mix64(seed & _MASK64) + position) & _MASK64)
    return (z >> 11) / float(1 << 53)  # the top 53 bits: every float64 step of [0, 1) is reachable


def kv_to_finish(prompt_len: int, max_new_tokens: int) -> int:
    """KV slots a request of ``prompt_len`` tokens holds once it has sampled ``max_new_tokens``:
    one per token but the last sampled, which is never fed back (the prompt alone where it
    samples none). The engine refuses a request by it (``Engine._check``) as the scheduler
    admits one (``Req.kv_to_finish``), so the two agree."""
    return prompt_len + max(max_new_tokens - 1, 0)


class ReqStatus(enum.Enum):
    """Where a request is in the scheduler."""
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Req:
    """A request (one sample of a prompt; ``SamplingParams.n`` samples are ``n`` requests).

    Args:
        rid: request id (samples of one prompt share the handle's rid; ``index`` tells them apart).
        index: sample index in ``[0, n)``.
        input_ids: the prompt token ids.
        params: validated sampling parameters.
        tokenizer: for incremental detokenization.
        emit: callback receiving this request's ``StreamEvent``s (called on the scheduler thread).
        input_key: optional cache key per prompt position (default: the ids themselves); lets a
            multimodal prompt put an image's hash where its placeholder tokens are.
        seed: seed of this request's sampling draws (``sample_draw``).
        mm_inputs: [issue 10] the images of a multimodal prompt
            (``lmnb_engine.multimodal.MultimodalInputs``), handed to the model with each forward.
        stop_regexes: the request's compiled ``stop_regex`` (``StopRegexes``), shared by its samples;
            default: compiled from ``params`` for this sample alone.
    """

    def __init__(
        self,
        rid: str,
        index: int,
        input_ids: Sequence[int],
        params: SamplingParams,
        tokenizer: Any,
        emit: Callable[[Any], None],
        seed: int,
        input_key: Optional[Sequence[Hashable]] = None,
        mm_inputs: Optional[Any] = None,
        stop_regexes: Optional[StopRegexes] = None,
    ) -> None:
        self.rid = rid
        self.index = index
        self.origin_input_ids = list(input_ids)
        self.origin_input_key = list(input_key) if input_key is not None else None
        self.mm_inputs = mm_inputs  # [issue 10]
        self.output_ids: list[int] = []
        self.params = params
        self.emit = emit
        self.counted = True  # in the hit-rate figures of cache_stats (False: a pin's prefill, a cache action)
        # how the request ends as it reaches the scheduler (SGLang's to_abort): a listener's submit
        # found its grammar could not be used once compiled (an Engine.abort before then ends it at once)
        self.to_abort: Optional[FinishReason] = None
        self.status = ReqStatus.WAITING
        self.finish_reason: Optional[FinishReason] = None
        self.grammar: Optional[TokenGrammar] = None

        # KV state (see module docstring)
        self.req_pool_idx: Optional[int] = None
        self.last_node: Any = None
        self.cache_protected_len = 0
        self.kv_committed_len = 0
        self.kv_allocated_len = 0

        # sampling state
        self.seed = seed  # output token j is sampled with ``sample_draw(seed, j)``
        self.stop_token_ids = frozenset(params.stop_token_ids or ())
        # the validated logit_bias as tensors (ids int64 [k], biases float32 [k]), made once: the
        # sampler moves them to the logits' device once and adds them to this request's row every
        # step (``sampler.apply_logit_bias``)
        self.logit_bias: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        if params.logit_bias:
            self.logit_bias = (torch.tensor(list(params.logit_bias), dtype=torch.int64),
                               torch.tensor(list(params.logit_bias.values()), dtype=torch.float32))

        # output state
        # the stop strings and regexes, each stop string read by one reader (``stop_request``); the
        # detokenizer records where the tokens its stops holding a special token's text read sit
        self.stops = RequestStops(tokenizer, params, stop_regexes)
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.origin_input_ids, params.skip_special_tokens,
                                                  self.stops.marked)
        self.sent_text_len = 0  # characters of detokenizer.text already streamed
        self.sent_token_len = 0  # output ids already streamed
        self.final_text: Optional[str] = None
        # output tokens the result keeps where a stop cut the output (SGLang's finished_len): those
        # wholly past the stop are dropped (``Scheduler._cut_at_stop``); None: all
        self.finished_len: Optional[int] = None
        self.output_logprobs: list[TokenLogprob] = []
        self.next_token_logprob: Optional[TokenLogprob] = None  # max_new_tokens=0 with return_logprob
        self.prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
        self.prompt_logprobs_done = params.logprob_start_len < 0

        # accounting
        self.cached_tokens: Optional[int] = None  # prompt tokens served by the cache (1st admission)
        self.forward_passes = 0
        self.jumped_tokens = 0
        self.num_speculative = 0  # unverified jump-forward draft tokens ending output_ids
        self.arrival = 0  # submission order, for fcfs and tie-breaks

    # --- sequence views ------------------------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        """Number of prompt tokens."""
        return len(self.origin_input_ids)

    @property
    def kept_len(self) -> int:
        """Output tokens the result holds (ids, logprobs, ``completion_tokens``): all, or those
        through a stop (``finished_len``)."""
        return len(self.output_ids) if self.finished_len is None else min(self.finished_len, len(self.output_ids))

    @property
    def seq_len(self) -> int:
        """Prompt plus output tokens."""
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def kv_to_finish(self) -> int:
        """KV slots the request holds once it has sampled ``max_new_tokens`` (module ``kv_to_finish``)."""
        return kv_to_finish(self.prompt_len, self.params.max_new_tokens)

    @property
    def fill_ids(self) -> list[int]:
        """All tokens of the sequence: prompt then output."""
        return self.origin_input_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """``fill_ids[start:end]`` without building the whole sequence."""
        p = len(self.origin_input_ids)
        if start >= p:
            return self.output_ids[start - p : end - p]
        if end <= p:
            return self.origin_input_ids[start:end]
        return self.origin_input_ids[start:] + self.output_ids[: end - p]

    @property
    def extend_len(self) -> int:
        """Tokens the next step has to compute."""
        return self.seq_len - self.kv_committed_len

    def cache_key(self, end: int) -> list[Hashable]:
        """Prefix-cache key of positions ``[0, end)``."""
        if self.origin_input_key is None:
            return self.token_slice(0, end)
        prompt = self.origin_input_key
        if end <= len(prompt):
            return prompt[:end]
        return prompt + self.output_ids[: end - len(prompt)]

    def max_prefix_len(self) -> int:
        """How much of the sequence a cache match may cover: at least one token is recomputed so
        there are logits, and prompt logprobs need the logits from ``logprob_start_len - 1`` on."""
        limit = self.seq_len - 1 - self.num_speculative  # a jump-forward draft needs its logits
        if not self.prompt_logprobs_done:
            limit = min(limit, max(self.params.logprob_start_len - 1, 0))
        return max(limit, 0)

    @property
    def finished(self) -> bool:
        """Whether the request has a finish reason."""
        return self.finish_reason is not None

    # --- output edits (constrained decoding / jump-forward) -------------------------------------
    def truncate_output(self, num_kept: int) -> None:
        """Drop output tokens after the first ``num_kept`` (their logprobs and text too).

        KV slots are not touched here; ``Scheduler.rollback`` frees them and lowers
        ``kv_committed_len``. Text already streamed cannot be unsent: callers should only roll
        back tokens whose replacement decodes to the same text (retokenization).
        """
        if not 0 <= num_kept <= len(self.output_ids):
            raise ValueError(f"cannot keep {num_kept} of {len(self.output_ids)} output tokens")
        del self.output_ids[num_kept:]
        del self.output_logprobs[num_kept:]
        self.detokenizer.rollback(min(num_kept, self.detokenizer.num_tokens))
        self.sent_token_len = min(self.sent_token_len, num_kept)

    def append_forced(self, token_ids: Sequence[int]) -> None:
        """Append tokens chosen without sampling (a jump-forward string); the next step extends
        them. They count as output and are detokenized, but carry no logprob (NaN)."""
        for t in token_ids:
            self.output_ids.append(int(t))
            self.detokenizer.add(int(t))
            if self.params.return_logprob:
                self.output_logprobs.append(TokenLogprob(int(t), float("nan")))
        self.jumped_tokens += len(token_ids)
