"""The steps every attention kernel here repeats: one block of keys through the online softmax,
and the loads of a K/V block (from the pool through a request's ``req_to_token`` row, or from
packed rows).

Flash attention's running-max rescaling (Dao et al. 2022, Algorithm 1; Milakov & Gimelshein 2018):
the scores of a new key block update the running max ``m_i``, the running sum ``l_i`` and the
unnormalized output ``acc`` so that ``acc / l_i`` is the softmax-weighted sum of all values seen.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(q, k, v, visible, acc, l_i, m_i, sm_scale, MASKED: tl.constexpr, F32_DOT: tl.constexpr):
    """Fold one key/value block into the running softmax state.

    q: [M, D] queries; k: [D, N] keys (transposed); v: [N, D] values; visible: bool [M, N] (or
    broadcastable) — False keys get zero weight; read only when ``MASKED`` (a block that every
    query sees whole skips the select); acc: fp32 [M, D]; l_i, m_i: fp32 [M]; sm_scale:
    softmax scale. ``F32_DOT`` does both matmuls in IEEE fp32: for float32 inputs, and for every
    input under the CPU interpreter, whose dot of bf16 blocks multiplies their raw bits
    (``triton_support.f32_dot``). Returns the updated ``(acc, l_i, m_i)``.
    """
    if F32_DOT:
        qk = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
    else:
        qk = tl.dot(q, k.to(q.dtype))
    if MASKED:
        qk = tl.where(visible, qk * sm_scale, float("-inf"))
    else:
        qk = qk * sm_scale
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp(qk - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    if F32_DOT:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    return acc * alpha[:, None] + pv, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def kv_block(K, V, rows, stride_kt, stride_vt, kv_k, kv_v, n_valid, offs_d, d_valid, MASKED: tl.constexpr):
    """K [BLOCK_D, BLOCK_N] (transposed) and V [BLOCK_N, BLOCK_D] of buffer ``rows`` (one KV
    head's: ``kv_k``/``kv_v`` are its offsets); with ``MASKED``, rows where ``n_valid`` is False
    read as zeros (unmasked, every row is read)."""
    if MASKED:
        k_mask = n_valid[None, :] & d_valid[:, None]
        v_mask = n_valid[:, None] & d_valid[None, :]
    else:
        k_mask = d_valid[:, None]
        v_mask = d_valid[None, :]
    k = tl.load(K + kv_k + rows[None, :] * stride_kt + offs_d[:, None], mask=k_mask, other=0.0)
    v = tl.load(V + kv_v + rows[:, None] * stride_vt + offs_d[None, :], mask=v_mask, other=0.0)
    return k, v


@triton.jit
def pool_block(K_pool, V_pool, slot_row, n0, limit, kv_k, kv_v, stride_kpt, stride_vpt, offs_n, offs_d, d_valid,
               MASKED: tl.constexpr):
    """``kv_block`` of a request's positions ``n0 + offs_n``, gathered from the pool at the slots
    its ``req_to_token`` row (``slot_row``) gives; with ``MASKED``, positions from ``limit`` on
    read as zeros (a last, partial block). Returns ``(k, v, n_valid)``."""
    pos = n0 + offs_n
    n_valid = pos < limit
    if MASKED:
        slots = tl.load(slot_row + pos, mask=n_valid, other=0).to(tl.int64)
    else:
        slots = tl.load(slot_row + pos).to(tl.int64)
    k, v = kv_block(K_pool, V_pool, slots, stride_kpt, stride_vpt, kv_k, kv_v, n_valid, offs_d, d_valid, MASKED=MASKED)
    return k, v, n_valid
