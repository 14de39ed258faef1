"""Extend (prefill) attention over a cached prefix in the KV pool plus ragged new tokens.

Algorithm after SGLang's ``triton_ops/extend_attention.py`` (paper §3; research runtime_bench §3):
one program per (request, query head, tile of ``BLOCK_M`` new tokens) keeps an online softmax
(FlashAttention-2 style running max ``m``, denominator ``l`` and accumulator) over two key ranges:

1. the request's cached prefix, positions ``[0, prefix_len)``, whose K/V live in the pool at the
   slots ``req_to_token[req, pos]`` (a gather; every prefix key is visible to every new token);
2. the request's new tokens, contiguous rows of the packed ``k``/``v``, under the causal mask
   ``key index <= query index`` (within the new part), stopping at the tile's last query.

As in FlashAttention-2 (§3.1.1, causal masking), only the blocks that need a mask pay for one:
the last, partial block of the prefix and the blocks on the tile's diagonal; every other block is
visible whole.
The grid's tiles run heaviest first (a tile's causal range grows with its index, and the grid's
last dimension is launched last), so the short programs fill the tail of the launch.

GQA: query head ``h`` reads KV head ``h // (Hq // Hkv)``. The new tokens' K/V are read from the
packed inputs, not the pool, so the pool write (``TokenToKVPool.set_kv``) can run before or after.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support
from lmnb_engine.attention.triton_ops.online_softmax import kv_block, online_softmax_step, pool_block
from lmnb_engine.attention.triton_ops.tuned import config_key, tuned_config


class ExtendConfig(NamedTuple):
    """One launch configuration of the extend kernel: query tile ``block_m`` and key block
    ``block_n`` (``block_m`` a multiple of ``block_n``), ``num_warps``, and ``num_stages`` (the
    depth of Triton's software pipelining of the key loops)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@triton.jit
def _extend_kernel(
    Q, K_new, V_new, O, K_pool, V_pool, Req_to_token,
    Req_idx, Prefix_len, Extend_len, Start_loc,
    sm_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kpt, stride_kph, stride_vpt, stride_vph, stride_req,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the diagonal starts on a key-block boundary
    b = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)  # heaviest first (see the module docstring)
    kvh = h // GROUP
    ext_len = tl.load(Extend_len + b).to(tl.int32)
    # Tiles past this request's new tokens (the grid is sized for the longest) do no work: their
    # loops get empty ranges and every store is masked. (No early return, to keep the control
    # flow the simplest the compiler handles.)
    active = (tile * BLOCK_M < ext_len).to(tl.int32)
    prefix_len = tl.load(Prefix_len + b).to(tl.int32) * active
    start = tl.load(Start_loc + b).to(tl.int64)
    req = tl.load(Req_idx + b).to(tl.int64)

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the new tokens
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < ext_len
    d_valid = offs_d < HEAD_DIM
    q = tl.load(Q + (start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)

    # A finite floor instead of -inf: a row whose whole block is masked then gives exp(-inf) = 0
    # rather than exp(-inf - -inf) = NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Stage 1: the cached prefix, gathered from the pool through req_to_token; whole blocks
    # unmasked, then the partial last block (if any) masked.
    slot_row = Req_to_token + req * stride_req
    kv_k = kvh * stride_kph
    kv_v = kvh * stride_vph
    whole = prefix_len - prefix_len % BLOCK_N
    for n0 in range(0, whole, BLOCK_N):
        k, v, n_valid = pool_block(K_pool, V_pool, slot_row, n0, prefix_len, kv_k, kv_v, stride_kpt, stride_vpt,
                                   offs_n, offs_d, d_valid, MASKED=False)
        acc, l_i, m_i = online_softmax_step(q, k, v, n_valid[None, :], acc, l_i, m_i, sm_scale,
                                            MASKED=False, F32_DOT=F32_DOT)
    for n0 in range(whole, prefix_len, BLOCK_N):
        k, v, n_valid = pool_block(K_pool, V_pool, slot_row, n0, prefix_len, kv_k, kv_v, stride_kpt, stride_vpt,
                                   offs_n, offs_d, d_valid, MASKED=True)
        acc, l_i, m_i = online_softmax_step(q, k, v, n_valid[None, :], acc, l_i, m_i, sm_scale,
                                            MASKED=True, F32_DOT=F32_DOT)

    # Stage 2: the new tokens, causal. Keys before the tile's first query are visible to all of
    # its queries (no mask); the diagonal blocks, up to the tile's last query, are masked.
    kn_k = kvh * stride_kh
    kn_v = kvh * stride_vh
    diagonal = tile * BLOCK_M * active
    for n0 in range(0, diagonal, BLOCK_N):
        kn = n0 + offs_n
        k, v = kv_block(K_new, V_new, start + kn, stride_kt, stride_vt, kn_k, kn_v, kn < ext_len, offs_d, d_valid,
                        MASKED=False)
        acc, l_i, m_i = online_softmax_step(q, k, v, kn[None, :] < ext_len, acc, l_i, m_i, sm_scale,
                                            MASKED=False, F32_DOT=F32_DOT)
    end = tl.minimum(ext_len, (tile + 1) * BLOCK_M) * active
    for n0 in range(diagonal, end, BLOCK_N):
        kn = n0 + offs_n
        n_valid = kn < ext_len
        k, v = kv_block(K_new, V_new, start + kn, stride_kt, stride_vt, kn_k, kn_v, n_valid, offs_d, d_valid,
                        MASKED=True)
        visible = n_valid[None, :] & (offs_m[:, None] >= kn[None, :])
        acc, l_i, m_i = online_softmax_step(q, k, v, visible, acc, l_i, m_i, sm_scale,
                                            MASKED=True, F32_DOT=F32_DOT)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l == 0 only in inactive tiles (stores masked)
    tl.store(O + (start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


def extend_config(device: torch.device, head_dim: int, dtype: torch.dtype, group: int = 1,
                  tuned: bool = True) -> ExtendConfig:
    """The launch configuration for ``device``: one tuned on this GPU model for these heads
    (``group`` query heads per KV head) where there is one (``tuned.tuned_config``; ``tuned=False``
    leaves it out, for the tuner), else the built-in one, chosen so that the kernel compiles without
    register spills and within the architecture's shared memory (``lmnb_engine.testing.
    triton_compile`` checks every GPU it serves: sm_80, 86, 89, 90).

    - 16-bit inputs: 128x64 tiles with 8 warps (SGLang's Hopper choice; its 128x128 for Ampere
      spills here), 64x32 for heads wider than 128. Two pipeline stages on sm_90, whose 227 KB
      of shared memory hold a second K/V block in flight; one elsewhere (a second stage spills
      registers on sm_80 at head_dim 128, and sm_86/89 have 99 KB).
    - float32 (a checking mode on a GPU): 32x16 tiles, 4 warps, one stage; its full-precision
      dots hold twice the registers (a few bytes may spill).
    - the CPU interpreter: 16x16, where every program is simulated and big tiles only cost time.
    """
    arch = triton_support.device_arch(device)
    if arch is None:
        return ExtendConfig(16, 16, 4, 1)
    found = tuned_config("extend", torch.device(device), config_key(head_dim, group, dtype), ExtendConfig) \
        if tuned else None
    if found is not None:
        return found
    if dtype == torch.float32:
        return ExtendConfig(32, 16, 4, 1)
    stages = 2 if arch == 90 else 1
    if head_dim > 128:
        return ExtendConfig(64, 32, 8, stages)
    return ExtendConfig(128, 64, 8, stages)


def extend_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    config: ExtendConfig | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens over their cached prefix and themselves; writes ``out``.

    Args:
        q: [T, Hq, D] new queries, packed (request ``i`` owns rows ``extend_start_loc[i]`` ...
            ``+ extend_lens[i]``); k, v: [T, Hkv, D] the new tokens' keys and values. Any float
            dtype; the last dimension must be contiguous (other strides are free, so views of a
            fused qkv output work).
        out: [T, Hq, D] written in place (its dtype is the output dtype).
        k_pool, v_pool: [slots, Hkv, D] one layer's KV pool buffers (the prefix is read there).
        req_to_token: int32 [max_reqs, max_context_len]; req_pool_indices, prefix_lens,
            extend_lens, extend_start_loc: int64 [B].
        max_extend_len: max of ``extend_lens`` (host int: it sizes the launch grid).
        sm_scale: softmax scale.
        config: the launch configuration (default ``extend_config`` for the device; the kernel
            tuner, ``benches/gpu_kernels.py``, passes others).
    Returns:
        ``out``.
    Raises:
        ValueError: Hq not a multiple of Hkv, a non-contiguous last dimension, or a config whose
            ``block_m`` is not a multiple of its ``block_n``.
    """
    T, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("k_pool", k_pool), ("v_pool", v_pool)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")
    cfg = config or extend_config(q.device, head_dim, q.dtype, num_q_heads // num_kv_heads)
    if cfg.block_m % cfg.block_n:
        raise ValueError(f"extend config {cfg}: block_m must be a multiple of block_n")
    B = req_pool_indices.shape[0]
    if B == 0 or T == 0:
        return out
    grid = (B, num_q_heads, triton.cdiv(max_extend_len, cfg.block_m))
    _extend_kernel[grid](
        q, k, v, out, k_pool, v_pool, req_to_token,
        req_pool_indices, prefix_lens, extend_lens, extend_start_loc,
        sm_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1), req_to_token.stride(0),
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(max(head_dim, 16)),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, F32_DOT=triton_support.f32_dot(q),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True,
    )
    return out
