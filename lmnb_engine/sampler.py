"""Next-token sampling over a batch of rows, each with its own ``SamplingParams``.

Order of operations per row (SGLang's ``Sampler`` and penalizers; HF's logits processors for the
repetition penalty):
1. penalties on the raw logits: CTRL repetition penalty over prompt + output tokens (divide
   positive logits, multiply negative ones), OpenAI frequency/presence penalties over output tokens;
   then the row's ``logit_bias`` is added (OpenAI's; SGLang adds it as a dense [B, V] vector, here
   one scatter-add of the biased rows' entries: ``apply_logit_bias``);
2. masks (after the bias, so that a masked token stays masked): EOS and stop token ids while fewer than ``min_new_tokens`` exist; the row's grammar mask
   (constrained decoding hook, ``Req.grammar``);
3. greedy rows (temperature 0 or top_k 1) take the argmax;
4. other rows: divide by temperature, softmax, sort, drop by top_k / top_p / min_p (as SGLang's
   ``top_k_top_p_min_p_sampling_from_probs_torch``: top_p on the un-renormalised sorted probs), then
   draw by inverse CDF with one uniform number from the row's own ``torch.Generator``, so a seeded
   request samples the same tokens whatever else is in the batch.
Returned logprobs are ``log_softmax`` of the raw model logits (before penalties, ``logit_bias`` and
temperature), as in vLLM's default (its ``raw_logprobs`` mode) and SGLang's ``return_logprob``:
they say what the model thinks of the token, whatever steered its choice. OpenAI's API reports
them after the bias instead; a client that wants those adds the bias and renormalises.

Rows whose raw logits are not all finite (NaN or +inf from a forward pass that overflowed, a broken
kernel or checkpoint; or every logit -inf) are flagged in ``SampleOutput.bad_rows``: any token drawn
from them is noise (softmax over +inf is NaN everywhere), so the scheduler fails those requests
instead of streaming it. SGLang's ``enable_nan_detection`` logs and replaces NaN logits; failing
the request is our choice, as the output would be meaningless either way. The flag rides along
with the sampled ids (no extra host sync).

Rows whose masks leave no token (a grammar that allows only the stop token ids or EOS that
``min_new_tokens`` still bans) are flagged in ``SampleOutput.blocked_rows`` the same way, and the
scheduler aborts those requests with ``blocked_reason``: SGLang and vLLM define nothing here (their
sampling then runs on all -inf logits). A grammar that is complete (nothing but EOS can follow)
before ``min_new_tokens`` output tokens exist is the same conflict, met one step earlier: the
scheduler ends such a request itself, without sampling, and ``grammar_end_reason`` aborts it the
same way (``field`` ``min_new_tokens``) where it would otherwise stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from lmnb_engine.outputs import FinishReason, TokenLogprob
from lmnb_engine.request import Req, sample_draw


@dataclass
class SampleOutput:
    """``token_ids``: one sampled id per row; ``logprobs``: per row, a ``TokenLogprob`` when the
    row's request asked for logprobs, else None; ``bad_rows``: the rows whose raw logits were not
    finite (their token is meaningless); ``blocked_rows``: the other rows whose grammar and
    ``min_new_tokens`` masks together allowed no token (their token is meaningless too)."""

    token_ids: list[int]
    logprobs: list[Optional[TokenLogprob]]
    bad_rows: frozenset[int] = frozenset()
    blocked_rows: frozenset[int] = frozenset()


def _padded(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), pad, dtype=torch.int64)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
    return out.to(device)


def apply_penalties(logits: torch.Tensor, reqs: Sequence[Req]) -> None:
    """Apply repetition / frequency / presence penalties in place (logits float32 [B, V])."""
    b, vocab = logits.shape
    dev = logits.device
    out_ids = _padded([r.output_ids for r in reqs], vocab, dev)
    counts = torch.zeros((b, vocab + 1), dtype=logits.dtype, device=dev)
    counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=logits.dtype))
    counts = counts[:, :vocab]
    freq = torch.tensor([r.params.frequency_penalty for r in reqs], dtype=logits.dtype, device=dev)
    pres = torch.tensor([r.params.presence_penalty for r in reqs], dtype=logits.dtype, device=dev)
    logits -= freq[:, None] * counts + pres[:, None] * (counts > 0).to(logits.dtype)
    rep = torch.tensor([r.params.repetition_penalty for r in reqs], dtype=logits.dtype, device=dev)
    if bool((rep != 1).any()):
        prompt_ids = _padded([r.origin_input_ids for r in reqs], vocab, dev)
        seen = torch.zeros((b, vocab + 1), dtype=torch.bool, device=dev)
        seen.scatter_(1, prompt_ids, True)
        seen = seen[:, :vocab] | (counts > 0)
        # A tiny penalty (1e-40) overflowed positive logits to inf, and softmax over inf is NaN: the
        # quotient is capped at the dtype's largest value. Zero logits multiply (equal to HF's
        # division), as a penalty below float32's range is 0 there and 0 / 0 is NaN.
        penalized = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
        penalized.clamp_(max=torch.finfo(logits.dtype).max)
        logits.copy_(torch.where(seen, penalized, logits))


def apply_logit_bias(logits: torch.Tensor, reqs: Sequence[Req]) -> None:
    """Add each request's ``logit_bias`` to its row of ``logits`` (float32 [B, V]) in place: one
    ``index_put_`` with accumulation of the (row, token id, bias) entries of the rows that have
    one (``Req.logit_bias``, moved to the logits' device once per request), so the cost grows
    with the entries, not with the vocabulary, and rows without a bias are not touched."""
    rows = [i for i, r in enumerate(reqs) if r.logit_bias is not None]
    if not rows:
        return
    dev = logits.device
    for i in rows:
        if reqs[i].logit_bias[0].device != dev:  # (kept there: a later step copies nothing of it)
            reqs[i].logit_bias = tuple(t.to(dev) for t in reqs[i].logit_bias)
    ids = torch.cat([reqs[i].logit_bias[0] for i in rows])
    bias = torch.cat([reqs[i].logit_bias[1] for i in rows])
    counts = [len(reqs[i].logit_bias[0]) for i in rows]
    at = torch.repeat_interleave(torch.tensor(rows, device=dev), torch.tensor(counts, device=dev),
                                 output_size=sum(counts))  # (its size given: no wait for the device)
    logits.index_put_((at, ids), bias.to(logits.dtype), accumulate=True)


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """bool [B]: rows of ``logits`` [B, V] holding a NaN or +inf, or -inf everywhere (no token can
    be chosen). A raw -inf logit elsewhere is a model's own mask and fine. One reduction: ``amax``
    propagates NaN (torch documents it), so the row maximum is finite exactly for the good rows."""
    return ~torch.isfinite(logits.amax(dim=-1))


def _constraint(req: Req) -> str:
    """What constrained ``req``'s tokens, as its messages name it."""
    return "the regex" if req.params.regex is not None else "the JSON schema" if req.grammar else "the model"


def min_new_tokens_conflict(constraint: str, m: int, out: int, stop_ids: bool, ended: bool = False) -> str:
    """Why ``constraint`` (as the message names it: "the regex", "the JSON schema") and
    ``min_new_tokens=m`` leave no token after ``out`` output tokens, with the fix: the words of every
    such conflict (the engine's refusal at the first token, the sampler's abort midway, the end of a
    match that came too soon). ``stop_ids``: tokens the constraint allows there are stop token ids
    (not EOS), which removing them from ``stop_token_ids`` frees; else only EOS is banned, and
    the constraint must let the output go on. ``ended``: the match is complete, so only EOS can
    follow."""
    banned = "EOS, as nothing can follow the match" if ended else "the stop token ids / EOS" if stop_ids else "EOS"
    lower = "set min_new_tokens=0" if out == 0 else f"lower min_new_tokens to at most {out}"
    other = "remove those stop_token_ids" if stop_ids else f"let {constraint} match longer output"
    return (f"{constraint} allows only tokens that min_new_tokens={m} bans until {m} "
            f"token{'s are' if m != 1 else ' is'} out: {banned}; {lower} or {other}")


def _min_new_tokens_abort(req: Req, at: str, out: int, stop_ids: bool, ended: bool = False) -> FinishReason:
    """The abort of ``req`` whose constraint allows, ``at`` this point (``out`` output tokens), only
    tokens that ``min_new_tokens`` still bans (``min_new_tokens_conflict``): the caller's settings
    (``field``)."""
    return FinishReason("abort", field="min_new_tokens", message=f"{at}: " + min_new_tokens_conflict(
        _constraint(req), req.params.min_new_tokens, out, stop_ids, ended))


def blocked_reason(req: Req) -> FinishReason:
    """The abort of ``req``, for which no token was allowed (a ``SampleOutput.blocked_rows`` row):
    its message says why, with the fix; its ``field`` is ``min_new_tokens`` where that banned them
    (the stop token ids the request set, or only EOS where it set none)."""
    n = len(req.output_ids)
    at = f"no token was allowed at output token {n + 1}"
    if n < req.params.min_new_tokens:
        return _min_new_tokens_abort(req, at, n, stop_ids=bool(req.params.stop_token_ids))
    return FinishReason("abort", message=f"{at}: {_constraint(req)} allows only tokens whose logits the model set "
                                         "to -inf")


def grammar_eos(tokenizer: Any, eos_token_ids: frozenset[int]) -> Optional[int]:
    """The EOS id that a complete grammar's ``FinishReason.matched`` names (``grammar_end_reason``):
    the engine ends it without sampling one, where SGLang's ``matched_stop`` names the EOS its
    grammar took. The tokenizer's own EOS where it is one of the model's, else the smallest of
    them; None for a model without EOS."""
    primary = getattr(tokenizer, "eos_token_id", None)
    return primary if primary in eos_token_ids else min(eos_token_ids, default=None)


def grammar_end_reason(req: Req, eos_token_id: Optional[int] = None) -> FinishReason:
    """How ``req`` ends when its grammar is complete (``is_terminated``): nothing but EOS can
    follow, and the engine ends it without sampling one. ``stop`` with ``matched`` the
    ``eos_token_id`` the grammar allowed (SGLang samples that EOS, and its ``matched`` names it;
    None for a model without EOS), unless fewer than ``min_new_tokens`` output tokens exist then
    (jump-forward's unverified draft not counted): that EOS is banned, and the request aborts as
    ``blocked_reason`` would at the next token."""
    n = len(req.output_ids) - req.num_speculative
    if n >= req.params.min_new_tokens:
        return FinishReason("stop", matched=eos_token_id)
    return _min_new_tokens_abort(req, f"output token {n} completed the match", n, stop_ids=False, ended=True)


def _apply_masks(logits: torch.Tensor, reqs: Sequence[Req], eos_token_ids: frozenset[int], grammar: bool) -> None:
    vocab = logits.shape[1]
    for i, r in enumerate(reqs):
        if len(r.output_ids) < r.params.min_new_tokens:
            banned = set(r.stop_token_ids) | (set() if r.params.ignore_eos else set(eos_token_ids))
            banned_ids = [t for t in banned if t < vocab]
            if banned_ids:
                logits[i, banned_ids] = float("-inf")
        if grammar and r.grammar is not None:
            allowed = r.grammar.allowed_token_mask(vocab)
            if allowed is not None:
                logits[i].masked_fill_(~allowed.to(logits.device), float("-inf"))


def _sample_rows(logits: torch.Tensor, reqs: Sequence[Req], positions: Sequence[int]) -> torch.Tensor:
    """Sample one id per row of ``logits`` (float32 [b, V]) with temperature/top_k/top_p/min_p;
    row i is output token ``positions[i]`` of ``reqs[i]``."""
    dev = logits.device
    temp = torch.tensor([r.params.temperature for r in reqs], dtype=logits.dtype, device=dev)
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[1]
    # top_k above the vocabulary keeps all of it (and 2**63 would not fit the tensor)
    top_k = torch.tensor([min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in reqs], device=dev)
    top_p = torch.tensor([r.params.top_p for r in reqs], dtype=logits.dtype, device=dev)
    min_p = torch.tensor([r.params.min_p for r in reqs], dtype=logits.dtype, device=dev)
    ranks = torch.arange(vocab, device=dev)[None, :]
    drop = ranks >= top_k[:, None]
    drop |= (probs_sort.cumsum(dim=-1) - probs_sort) > top_p[:, None]
    drop |= probs_sort < min_p[:, None] * probs_sort[:, :1]
    drop[:, 0] = False  # the most likely token always survives
    # The draw walks the kept tokens in vocabulary order, not in sorted order: two near-tied
    # tokens swap places in the sort under float noise (a prompt recomputed after a retraction
    # moves logprobs by ~1e-6), and the same draw then lands on the other one; in vocabulary
    # order it moves only when it falls within that noise of a boundary.
    kept = torch.zeros_like(probs).scatter_(1, probs_idx, probs_sort.masked_fill(drop, 0.0))
    cdf = kept.cumsum(dim=-1)
    # one uniform draw per row, a function of the request's seed and the token's position
    u = torch.tensor([sample_draw(r.seed, j) for r, j in zip(reqs, positions)], dtype=torch.float64)
    target = u.to(dev, logits.dtype) * cdf[:, -1]
    pick = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    last_kept = (kept > 0).to(torch.int32).cumsum(dim=-1).argmax(dim=-1)  # a rounding of u * total up
    return torch.minimum(pick, last_kept)


def _logprob_entries(token_ids: list[int], chosen: list[float], top_vals, top_ids, top_k: Sequence[int]) -> list[TokenLogprob]:
    out = []
    for i, (t, lp) in enumerate(zip(token_ids, chosen)):
        top: tuple = ()
        if top_k[i] > 0:
            top = tuple(zip(top_ids[i][: top_k[i]], top_vals[i][: top_k[i]]))
        out.append(TokenLogprob(int(t), float(lp), top))
    return out


def _logprob_tensors(logprobs: torch.Tensor, token_ids: torch.Tensor, top_k: Sequence[int]):
    """(chosen [L], top values [L, k], top ids [L, k]) on the logprobs' device (k may be 0: None)."""
    chosen = logprobs.gather(1, token_ids[:, None].to(logprobs.device)).squeeze(1)
    k_max = min(max(top_k, default=0), logprobs.shape[-1])
    if k_max > 0:
        top_vals, top_ids = logprobs.topk(k_max, dim=-1)
        return chosen, top_vals, top_ids
    return chosen, None, None


def token_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, top_k: Sequence[int]) -> list[TokenLogprob]:
    """``TokenLogprob`` per row: ``logprobs`` float32 [L, V] (log_softmax), ``token_ids`` int64 [L],
    ``top_k[i]`` alternatives for row i (0 = none)."""
    chosen, top_vals, top_ids = _logprob_tensors(logprobs, token_ids, top_k)
    return _logprob_entries(token_ids.tolist(), chosen.tolist(), None if top_vals is None else top_vals.tolist(),
                            None if top_ids is None else top_ids.tolist(), top_k)


def _to_host(x: torch.Tensor | None) -> torch.Tensor | None:
    """Start copying a device tensor into pinned host memory (no wait); host tensors as they are."""
    if x is None or x.device.type == "cpu":
        return x
    out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    return out.copy_(x, non_blocking=True)


class PendingSample:
    """A batch's sampling, launched on the device; ``result()`` waits for it and finishes on the
    host (ids as ints, ``TokenLogprob`` entries, each grammar told its token).

    Everything the host needs is copied into pinned memory right after the sampling kernels, and
    a CUDA event marks the end of those copies: work queued after them (the next forward, under
    overlapped scheduling) does not delay ``result()``.

    Attributes:
        token_ids: int64 [B] sampled ids on the logits' device (the next decode step's input).
    """

    def __init__(self, reqs: Sequence[Req], token_ids: torch.Tensor, bad: torch.Tensor, lp_rows: list[int],
                 lp_parts: tuple, top_k: list[int], tell_grammar: bool, blocked: Optional[torch.Tensor] = None) -> None:
        self.reqs = reqs
        self.token_ids = token_ids
        self._ids = _to_host(token_ids)
        self._bad = _to_host(bad)
        self._blocked = _to_host(blocked)
        self._lp_rows = lp_rows
        self._lp = tuple(_to_host(x) for x in lp_parts)
        self._top_k = top_k
        self._tell_grammar = tell_grammar
        self._event = None
        if token_ids.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()
        self._out: SampleOutput | None = None

    def result(self) -> SampleOutput:
        """The sampled ids (and logprobs), waiting for the device copy if it is still running."""
        if self._out is not None:
            return self._out
        if self._event is not None:
            self._event.synchronize()
        ids = self._ids.tolist()
        bad_rows = frozenset(i for i, bad in enumerate(self._bad.tolist()) if bad)
        blocked = [] if self._blocked is None else self._blocked.tolist()
        blocked_rows = frozenset(i for i, b in enumerate(blocked) if b and i not in bad_rows)
        logprobs: list[Optional[TokenLogprob]] = [None] * len(self.reqs)
        if self._lp_rows:
            chosen, top_vals, top_ids = (None if x is None else x.tolist() for x in self._lp)
            entries = _logprob_entries([ids[i] for i in self._lp_rows], chosen, top_vals, top_ids, self._top_k)
            for i, e in zip(self._lp_rows, entries):
                logprobs[i] = e
        if self._tell_grammar:
            for i, (r, t) in enumerate(zip(self.reqs, ids)):
                if r.grammar is not None and i not in bad_rows | blocked_rows:  # failed, not advanced
                    r.grammar.accept_token(t)
        self._out = SampleOutput(ids, logprobs, bad_rows, blocked_rows)
        return self._out


def sample(
    logits: torch.Tensor,
    reqs: Sequence[Req],
    eos_token_ids: frozenset[int],
    grammar_bitmask: Optional[torch.Tensor] = None,
    positions: Optional[Sequence[int]] = None,
) -> SampleOutput:
    """Choose the next token of every row (``sample_async(...).result()``).

    Args:
        logits: float32 [B, V] raw model logits, row i belonging to ``reqs[i]``.
        reqs: the requests (their params, output so far, generator and grammar are used; each
            grammar's ``accept_token`` is called with the chosen id).
        eos_token_ids: the model's EOS ids (masked while ``min_new_tokens`` is not reached).
        grammar_bitmask: int32 [B, ceil(V/32)] packed grammar masks chosen by the caller, for rows
            that are not the request's next token (jump-forward verification: one request, one
            row per draft position). When given, ``Req.grammar`` is neither asked for a mask nor
            told the sampled ids.
        positions: the output position each row samples (default ``len(req.output_ids)``, the
            next token); it picks the row's draw (``request.sample_draw``).
    Returns:
        ``SampleOutput`` with B ids, optional logprobs and the rows whose logits were not finite.
    """
    return sample_async(logits, reqs, eos_token_ids, grammar_bitmask, positions).result()


def sample_async(
    logits: torch.Tensor,
    reqs: Sequence[Req],
    eos_token_ids: frozenset[int],
    grammar_bitmask: Optional[torch.Tensor] = None,
    positions: Optional[Sequence[int]] = None,
) -> PendingSample:
    """``sample`` without waiting for the device: penalties, masks, the draws and the logprobs are
    launched, and the ``PendingSample`` finishes them. Arguments as ``sample``."""
    assert logits.shape[0] == len(reqs)
    x = logits.float()
    if any(r.params.repetition_penalty != 1 or r.params.frequency_penalty or r.params.presence_penalty for r in reqs):
        x = x.clone()
        apply_penalties(x, reqs)
    if any(r.logit_bias is not None for r in reqs):
        x = x.clone() if x is logits else x
        apply_logit_bias(x, reqs)
    if grammar_bitmask is not None:
        from lmnb_engine.constrained.masks import apply_token_bitmask_

        x = x.clone() if x is logits else x
        apply_token_bitmask_(x, grammar_bitmask)
    use_grammar = grammar_bitmask is None
    blocked = None
    if any((use_grammar and r.grammar is not None) or len(r.output_ids) < r.params.min_new_tokens for r in reqs):
        x = x.clone() if x is logits else x
        _apply_masks(x, reqs, eos_token_ids, use_grammar)
        blocked = nonfinite_rows(x)  # every logit -inf after the masks (or NaN already in bad rows)

    next_ids = x.argmax(dim=-1)
    rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if rows:
        idx = torch.tensor(rows, device=x.device)
        at = positions if positions is not None else [len(r.output_ids) for r in reqs]
        next_ids[idx] = _sample_rows(x[idx], [reqs[i] for i in rows], [at[i] for i in rows])

    lp_rows = [i for i, r in enumerate(reqs) if r.params.return_logprob]
    top_k = [reqs[i].params.top_logprobs_num for i in lp_rows]
    lp_parts: tuple = ()
    if lp_rows:
        idx = torch.tensor(lp_rows, device=x.device)
        lp_parts = _logprob_tensors(torch.log_softmax(logits[idx].float(), dim=-1), next_ids[idx], top_k)
    return PendingSample(reqs, next_ids, nonfinite_rows(logits), lp_rows, lp_parts, top_k, use_grammar, blocked)
