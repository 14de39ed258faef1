"""RoPE on q and k in place, one program per token (the "rotate half" layout of HF checkpoints).

For each head, with ``x1, x2`` the two halves of the head dimension and ``c, s`` the token's cos
and sin: ``[x1*c - x2*s, x2*c + x1*s]``. Each product and the sum are rounded to the activation
dtype, as torch computes ``x * cos + rotate_half(x) * sin`` (``layers.rotary.apply_rotary``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support


@triton.jit
def _rotate_heads(X, stride_h, n_heads, offs_h, offs_d, d_valid, c, s, HALF: tl.constexpr):
    valid = (offs_h < n_heads)[:, None] & d_valid[None, :]
    ptr = X + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr, mask=valid, other=0.0)
    x2 = tl.load(ptr + HALF, mask=valid, other=0.0)
    dt = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    x1c = (x1 * c).to(dt).to(tl.float32)
    x2s = (x2 * s).to(dt).to(tl.float32)
    x2c = (x2 * c).to(dt).to(tl.float32)
    x1s = (x1 * s).to(dt).to(tl.float32)
    tl.store(ptr, (x1c - x2s).to(dt), mask=valid)
    tl.store(ptr + HALF, (x2c + x1s).to(dt), mask=valid)


@triton.jit
def _rotary_kernel(
    Q, K, Cos, Sin,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    n_q_heads, n_k_heads,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HALF
    c = tl.load(Cos + t * stride_ct + offs_d, mask=d_valid, other=0.0).to(tl.float32)[None, :]
    s = tl.load(Sin + t * stride_st + offs_d, mask=d_valid, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(Q + t * stride_qt, stride_qh, n_q_heads, tl.arange(0, BLOCK_HQ), offs_d, d_valid, c, s, HALF)
    _rotate_heads(K + t * stride_kt, stride_kh, n_k_heads, tl.arange(0, BLOCK_HK), offs_d, d_valid, c, s, HALF)


def apply_rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by cos, sin [T, D] (in the activation dtype;
    both halves of a row equal, as ``RotaryEmbedding.cos_sin`` makes them: only the first half
    is read). Any strides with a contiguous last dimension (views of a fused qkv output).

    Raises ``ValueError`` for an odd head dimension or a non-contiguous last dimension."""
    T, _, d = q.shape
    if d % 2 or any(x.stride(-1) != 1 for x in (q, k, cos, sin)):
        raise ValueError("apply_rotary_ needs an even head_dim and contiguous last dimensions")
    if not T:
        return
    half = d // 2
    block_d, block_hq = triton.next_power_of_2(half), triton.next_power_of_2(q.shape[1])
    # 8 warps once a program holds more than 1024 query elements per half: with 4, Llama's 32
    # heads of 128 spill registers on sm_90 (lmnb_engine.testing.triton_compile)
    warps = 1 if triton_support.device_arch(q.device) is None else (4 if block_hq * block_d <= 1024 else 8)
    _rotary_kernel[(T,)](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        q.shape[1], k.shape[1],
        HALF=half, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        num_warps=warps, enable_fp_fusion=False,
    )
