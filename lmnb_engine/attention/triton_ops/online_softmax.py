"""The step every attention kernel here repeats: one block of keys through the online softmax.

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
