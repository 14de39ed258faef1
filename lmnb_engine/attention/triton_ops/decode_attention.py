"""Decode attention: one new query per request over its whole sequence in the KV pool.

Split-KV "flash-decoding" (Dao et al. 2023; SGLang ``triton_ops/decode_attention.py``, research
runtime_bench §3), in two kernels:

1. ``_decode_split_kernel``, grid ``(B, Hkv * head_blocks, max_splits)``: each program takes one
   contiguous slice of one request's positions (``num_kv_splits[b]`` slices of
   ``ceil(seq_len / num_kv_splits[b])`` tokens), gathers the slice's K/V from the pool through
   ``req_to_token``, and runs an online softmax for a *group* of query heads that share one KV
   head (GQA: K and V are loaded once per group, and the scores are one small matrix product).
   It stores the slice's normalized partial output and its log-sum-exp (LSE).
2. ``_decode_merge_kernel``, grid ``(B, Hq)``: combines the slices, weighting each partial output
   by ``exp(lse - max_lse)``.

With one split per request (a batch large enough to fill the GPU without splitting:
``max_kv_splits == 1``) the split kernel writes the output itself and the merge is not launched:
a kernel launch less per layer, and the same values (merging one slice multiplies it by 1).

Splitting the keys lets a small batch still fill the GPU: parallelism comes from the sequence
length, not only from batch x heads. Everything the kernels read is on the device (no host sync),
so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support
from lmnb_engine.attention.triton_ops.online_softmax import online_softmax_step, pool_block
from lmnb_engine.attention.triton_ops.tuned import config_key, tuned_config


class DecodeConfig(NamedTuple):
    """One launch configuration of the split kernel: key block ``block_n``, ``num_warps``, and
    ``num_stages`` (the depth of Triton's software pipelining of the key loop)."""

    block_n: int
    num_warps: int
    num_stages: int


@triton.jit
def _decode_split_kernel(
    Q, K_pool, V_pool, Req_to_token, Req_idx, Seq_len, Num_splits, Mid_o, Mid_lse, O,
    sm_scale,
    stride_qb, stride_qh, stride_kpt, stride_kph, stride_vpt, stride_vph, stride_req,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
    GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr, DIRECT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // HEAD_BLOCKS
    hb = tl.program_id(1) % HEAD_BLOCKS
    split = tl.program_id(2)

    in_group = hb * BLOCK_H + tl.arange(0, BLOCK_H)  # index within the KV head's query group
    h_valid = in_group < GROUP
    heads = kvh * GROUP + in_group
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    seq_len = tl.load(Seq_len + b).to(tl.int32)
    n_splits = tl.load(Num_splits + b).to(tl.int32)
    req = tl.load(Req_idx + b).to(tl.int64)
    split_len = tl.cdiv(seq_len, n_splits)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)  # lo >= hi for splits past the request's count

    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_valid[:, None] & d_valid[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)  # finite: see extend_attention
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        k, v, n_valid = pool_block(K_pool, V_pool, Req_to_token + req * stride_req, n0, hi, kvh * stride_kph,
                                   kvh * stride_vph, stride_kpt, stride_vpt, offs_n, offs_d, d_valid, MASKED=True)
        acc, l_i, m_i = online_softmax_step(q, k, v, n_valid[None, :], acc, l_i, m_i, sm_scale,
                                            MASKED=True, F32_DOT=F32_DOT)

    if DIRECT:  # the only split (seq_len >= 1, so l > 0): the output itself
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_i[:, None]).to(O.dtype.element_ty), mask=h_valid[:, None] & d_valid[None, :])
    else:
        # An empty split writes nothing; the merge skips it. (lo is broadcast to a vector first: the
        # CPU interpreter turns `bool vector & bool scalar` into integers, which masks reject.)
        written = h_valid & ((lo + tl.zeros([BLOCK_H], dtype=tl.int32)) < hi)
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # l == 0 only in empty splits, whose stores are masked
        tl.store(Mid_o + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :],
                 acc / l_safe[:, None], mask=written[:, None] & d_valid[None, :])
        tl.store(Mid_lse + b * stride_mlb + heads * stride_mlh + split, m_i + tl.log(l_safe), mask=written)


@triton.jit
def _decode_merge_kernel(
    Mid_o, Mid_lse, Seq_len, Num_splits, O,
    stride_mob, stride_moh, stride_mos, stride_mlb, stride_mlh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(Seq_len + b).to(tl.int32)
    n_splits = tl.load(Num_splits + b).to(tl.int32)
    split_len = tl.cdiv(seq_len, n_splits)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_valid = offs_s * split_len < seq_len  # the same test that decided what the splits wrote
    d_valid = offs_d < HEAD_DIM
    lse = tl.load(Mid_lse + b * stride_mlb + h * stride_mlh + offs_s, mask=s_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(s_valid, tl.exp(lse - m), 0.0)
    o = tl.load(Mid_o + b * stride_mob + h * stride_moh + offs_s[:, None] * stride_mos + offs_d[None, :],
                mask=s_valid[:, None] & d_valid[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_valid)


def decode_workspace(batch_size: int, num_q_heads: int, head_dim: int, max_kv_splits: int,
                     device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel's outputs: float32 partial outputs [B, Hq, S, D] and LSEs [B, Hq, S]."""
    return (torch.empty((batch_size, num_q_heads, max_kv_splits, head_dim), dtype=torch.float32, device=device),
            torch.empty((batch_size, num_q_heads, max_kv_splits), dtype=torch.float32, device=device))


def decode_config(device: torch.device, dtype: torch.dtype, head_dim: int = 128, group: int = 1,
                  direct: bool = False, tuned: bool = True) -> DecodeConfig:
    """The split kernel's launch configuration for ``device``: one tuned on this GPU model for
    these heads (``group`` query heads per KV head) and this form of the kernel (``direct``: one
    split, no merge) where there is one (``tuned.tuned_config``; ``tuned=False`` leaves it out,
    for the tuner), else 64-token blocks with 4 warps on GPUs
    (SGLang's choice) and two pipeline stages; 32-token blocks for float32, whose blocks of
    64 overflow the 99 KB of shared memory of sm_86/89 at head_dim 256 and spill at 128
    (``lmnb_engine.testing.triton_compile``); 16 under the CPU interpreter."""
    if triton_support.device_arch(device) is None:
        return DecodeConfig(16, 4, 2)
    key = config_key(head_dim, group, dtype, "direct" if direct else "split")
    found = tuned_config("decode", torch.device(device), key, DecodeConfig) if tuned else None
    if found is not None:
        return found
    return DecodeConfig(32, 4, 2) if dtype == torch.float32 else DecodeConfig(64, 4, 2)


def decode_attention_fwd(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Attention of one query per request over positions ``[0, seq_lens[b])``; writes ``out``.

    Args:
        q: [B, Hq, D] queries (last dimension contiguous); out: [B, Hq, D] written in place.
        k_pool, v_pool: [slots, Hkv, D] one layer's pool buffers; the current token's K/V must
            already be written there.
        req_to_token: int32 [max_reqs, max_context_len]; req_pool_indices: int64 [B];
            seq_lens: int64 [B], each >= 1.
        num_kv_splits: int32/int64 [B], each in ``[1, max_kv_splits]``: slices per request.
        max_kv_splits: upper bound on ``num_kv_splits`` (host int: it sizes the grid).
        sm_scale: softmax scale.
        workspace: ``decode_workspace(B', Hq, D, S', ...)`` with ``B' >= B`` and ``S' >=
            max_kv_splits`` (allocated here if None; pass a fixed one under CUDA-graph capture).
            Unused when ``max_kv_splits`` is 1: the split kernel then writes ``out`` directly.
        config: the split kernel's launch configuration (default ``decode_config`` for the
            device; the kernel tuner, ``benches/gpu_kernels.py``, passes others).
    Returns:
        ``out``.
    Raises:
        ValueError: Hq not a multiple of Hkv, a non-contiguous last dimension, a workspace too small.
    """
    B, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    for name, x in (("q", q), ("out", out), ("k_pool", k_pool), ("v_pool", v_pool)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")
    if B == 0:
        return out
    direct = max_kv_splits == 1
    if direct:  # the split kernel writes ``out``; ``out`` stands in for the workspace it never touches
        mid_o = mid_lse = out
        ws_strides = (0,) * 5
    else:
        if workspace is None:
            workspace = decode_workspace(B, num_q_heads, head_dim, max_kv_splits, q.device)
        mid_o, mid_lse = workspace
        if (mid_o.shape[0] < B or mid_o.shape[1] != num_q_heads or mid_o.shape[2] < max_kv_splits
                or mid_o.shape[3] != head_dim):
            raise ValueError(f"decode workspace {tuple(mid_o.shape)} is too small for batch {B}, {num_q_heads} "
                             f"heads, {max_kv_splits} splits, head_dim {head_dim}")
        ws_strides = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    group = num_q_heads // num_kv_heads
    block_h = max(16, min(triton.next_power_of_2(group), 64))  # tl.dot needs >= 16 rows
    head_blocks = triton.cdiv(group, block_h)
    cfg = config or decode_config(q.device, q.dtype, head_dim, group, direct)
    block_d = triton.next_power_of_2(max(head_dim, 16))
    _decode_split_kernel[(B, num_kv_heads * head_blocks, max_kv_splits)](
        q, k_pool, v_pool, req_to_token, req_pool_indices, seq_lens, num_kv_splits, mid_o, mid_lse, out,
        sm_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        req_to_token.stride(0), *ws_strides, out.stride(0), out.stride(1),
        GROUP=group, HEAD_BLOCKS=head_blocks, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_H=block_h, BLOCK_N=cfg.block_n, F32_DOT=triton_support.f32_dot(q), DIRECT=direct,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True,
    )
    if direct:
        return out
    _decode_merge_kernel[(B, num_q_heads)](
        mid_o, mid_lse, seq_lens, num_kv_splits, out, *ws_strides, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=triton.next_power_of_2(max_kv_splits),
        num_warps=4, enable_fp_fusion=True,
    )
    return out
