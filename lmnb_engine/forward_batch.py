"""The contract between the scheduler and the model runner: one forward pass over a ragged batch.

Token layout follows SGLang's ``ForwardBatch``: the new tokens of all requests are packed into one
flat dimension ``T``; request ``i`` owns rows ``extend_start_loc[i] : extend_start_loc[i] +
extend_seq_lens[i]``. Its KV for positions ``[0, seq_lens[i])`` lives in the KV pool at slots
``req_to_token[req_pool_indices[i], :seq_lens[i]]``; the first ``extend_prefix_lens[i]`` of
those were computed earlier (radix cache hit, earlier chunk, or earlier decode steps), the rest are
written by this pass at ``out_cache_loc``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    """What a forward pass computes: an extend (prefill) or a decode step."""
    EXTEND = "extend"  # prefill of new tokens after a (possibly empty) cached prefix
    DECODE = "decode"  # exactly one new token per request


@dataclass
class ForwardBatch:
    """One model forward (all tensors on the model's device unless suffixed ``_cpu``).

    Attributes:
        mode: EXTEND or DECODE.
        input_ids: int64 [T] new token ids, packed.
        positions: int64 [T] absolute position of each new token in its sequence.
        out_cache_loc: int64 [T] KV-pool slot each new token's K/V is written to.
        req_to_token: int32 [max_reqs, max_context_len] the request→slot table (shared, not copied).
        req_pool_indices: int64 [B] row of ``req_to_token`` for each request.
        seq_lens: int64 [B] prefix + new tokens per request.
        extend_prefix_lens: int64 [B] tokens already in the pool before this pass.
        extend_seq_lens: int64 [B] new tokens per request (all 1 in DECODE).
        extend_start_loc: int64 [B] offset of each request's first new token in ``T``.
        logits_indices: int64 [L] rows of ``T`` whose logits the model returns, in order.
        seq_lens_cpu, extend_prefix_lens_cpu, extend_seq_lens_cpu: the same as Python lists, so
            backends that loop per request need no device sync.
        mm_inputs: [issue 10] per request, its ``lmnb_engine.multimodal.MultimodalInputs`` (image
            placeholder offsets, pixels, content hashes) or None; None for an all-text batch.
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    mm_inputs: list | None = None  # [issue 10]

    @property
    def batch_size(self) -> int:
        """Number of requests in the batch."""
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        """Number of new tokens in the batch (packed over requests)."""
        return int(self.input_ids.shape[0])

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        input_ids: list[int],
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        req_pool_indices: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        logits_indices: list[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> "ForwardBatch":
        """Build a batch from per-request Python lists.

        ``input_ids`` is the packed list of new tokens (``sum(extend_lens)`` ids); ``out_cache_loc``
        their slots (int [T], best on the host). ``logits_indices`` defaults to the last new
        token of each request. All index tensors reach ``device`` in one copy (views of it).
        """
        assert len(input_ids) == sum(extend_lens), "input_ids must hold sum(extend_lens) tokens"
        assert len(req_pool_indices) == len(prefix_lens) == len(extend_lens)
        starts, positions, off = [], [], 0
        for p, e in zip(prefix_lens, extend_lens):
            starts.append(off)
            positions.extend(range(p, p + e))
            off += e
        if logits_indices is None:
            logits_indices = [s + e - 1 for s, e in zip(starts, extend_lens)]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        parts = (input_ids, positions, req_pool_indices, seq_lens, prefix_lens, extend_lens, starts, logits_indices)
        host = torch.tensor([x for part in parts for x in part], dtype=torch.int64)
        packed = torch.cat([host, out_cache_loc.to(device="cpu", dtype=torch.int64)]).to(device, non_blocking=True)
        (ids, pos, req_idx, lens, prefix, ext, start, logits_idx, loc) = packed.split(
            [len(p) for p in parts] + [out_cache_loc.numel()])
        return cls(
            mode=mode,
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            req_to_token=req_to_token,
            req_pool_indices=req_idx,
            seq_lens=lens,
            extend_prefix_lens=prefix,
            extend_seq_lens=ext,
            extend_start_loc=start,
            logits_indices=logits_idx,
            seq_lens_cpu=seq_lens,
            extend_prefix_lens_cpu=list(prefix_lens),
            extend_seq_lens_cpu=list(extend_lens),
        )
