"""RoPE on q and k in place, and the new K/V written into the KV pool, one program per token (the
"rotate half" layout of HF checkpoints).

For each head, with ``x1, x2`` the two halves of the head dimension and ``c, s`` the token's cos
and sin: ``[x1*c - x2*s, x2*c + x1*s]``. Each product and the sum are rounded to the activation
dtype, as torch computes ``x * cos + rotate_half(x) * sin`` (``layers.rotary.apply_rotary``).

The pool write rides along because the program already holds the rotated k: a separate store
kernel would be one more launch per layer, a fixed few microseconds that at decode batch 1 adds
up over the layers (the attention backend is then called with ``save_kv=False``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support


@triton.jit
def _load_halves(Src, stride_h, offs_h, offs_d, valid, HALF: tl.constexpr):
    """A token's heads at ``Src`` as their two halves of the head dimension."""
    ptr = Src + offs_h[:, None] * stride_h + offs_d[None, :]
    return tl.load(ptr, mask=valid, other=0.0), tl.load(ptr + HALF, mask=valid, other=0.0)


@triton.jit
def _store_halves(Dst, stride_h, offs_h, offs_d, x1, x2, valid, HALF: tl.constexpr):
    """Stores a token's heads, given as two halves, at ``Dst`` (cast to its dtype)."""
    ptr = Dst + offs_h[:, None] * stride_h + offs_d[None, :]
    tl.store(ptr, x1.to(Dst.dtype.element_ty), mask=valid)
    tl.store(ptr + HALF, x2.to(Dst.dtype.element_ty), mask=valid)


@triton.jit
def _rotate_heads(X, stride_h, n_heads, offs_h, offs_d, d_valid, c, s, HALF: tl.constexpr):
    """Rotates one token's heads of X in place; returns the rotated halves and their mask."""
    valid = (offs_h < n_heads)[:, None] & d_valid[None, :]
    x1, x2 = _load_halves(X, stride_h, offs_h, offs_d, valid, HALF)
    dt = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    x1c = (x1 * c).to(dt).to(tl.float32)
    x2s = (x2 * s).to(dt).to(tl.float32)
    x2c = (x2 * c).to(dt).to(tl.float32)
    x1s = (x1 * s).to(dt).to(tl.float32)
    r1, r2 = (x1c - x2s).to(dt), (x2c + x1s).to(dt)
    _store_halves(X, stride_h, offs_h, offs_d, r1, r2, valid, HALF)
    return r1, r2, valid


@triton.jit
def _rotary_kernel(
    Q, K, V, Cos, Sin, K_pool, V_pool, Loc,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
    stride_kpt, stride_kph, stride_vpt, stride_vph,
    n_q_heads, n_k_heads,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HALF
    c = tl.load(Cos + t * stride_ct + offs_d, mask=d_valid, other=0.0).to(tl.float32)[None, :]
    s = tl.load(Sin + t * stride_st + offs_d, mask=d_valid, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(Q + t * stride_qt, stride_qh, n_q_heads, tl.arange(0, BLOCK_HQ), offs_d, d_valid, c, s, HALF)
    offs_hk = tl.arange(0, BLOCK_HK)
    k1, k2, valid = _rotate_heads(K + t * stride_kt, stride_kh, n_k_heads, offs_hk, offs_d, d_valid, c, s, HALF)
    slot = tl.load(Loc + t).to(tl.int64)
    _store_halves(K_pool + slot * stride_kpt, stride_kph, offs_hk, offs_d, k1, k2, valid, HALF)
    v1, v2 = _load_halves(V + t * stride_vt, stride_vh, offs_hk, offs_d, valid, HALF)
    _store_halves(V_pool + slot * stride_vpt, stride_vph, offs_hk, offs_d, v1, v2, valid, HALF)


def rotary_store_kv_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     k_pool: torch.Tensor, v_pool: torch.Tensor, loc: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by cos, sin [T, D] (in the activation dtype;
    both halves of a row equal, as ``RotaryEmbedding.cos_sin`` makes them: only the first half
    is read), then write the rotated k and v [T, Hk, D] into one layer's pool buffers
    ``k_pool``/``v_pool`` [slots, Hk, D] at ``loc`` (int64 [T], distinct slots), cast to the pool
    dtype: ``TokenToKVPool.set_kv`` fused into the RoPE kernel, as SGLang's
    ``fused_set_kv_buffer``. Any strides with a contiguous last dimension (views of a fused qkv
    output).

    Raises ``ValueError`` for an odd head dimension, a non-contiguous last dimension, or shapes
    that do not match."""
    T, _, d = q.shape
    if d % 2 or any(x.stride(-1) != 1 for x in (q, k, v, cos, sin, k_pool, v_pool)):
        raise ValueError("rotary_store_kv_ needs an even head_dim and contiguous last dimensions")
    if (k.shape[0] != T or v.shape != k.shape or k_pool.shape[1:] != k.shape[1:] or v_pool.shape[1:] != k.shape[1:]
            or loc.shape != (T,)):
        raise ValueError(f"rotary_store_kv_: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, pools "
                         f"{tuple(k_pool.shape)}/{tuple(v_pool.shape)} and loc {tuple(loc.shape)} do not match")
    if not T:
        return
    half = d // 2
    block_d, block_hq = triton.next_power_of_2(half), triton.next_power_of_2(q.shape[1])
    # 8 warps once a program holds more than 1024 query elements per half: with 4, Llama's 32
    # heads of 128 spill registers on sm_90 (lmnb_engine.testing.triton_compile)
    warps = 1 if triton_support.device_arch(q.device) is None else (4 if block_hq * block_d <= 1024 else 8)
    _rotary_kernel[(T,)](
        q, k, v, cos, sin, k_pool, v_pool, loc,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        q.shape[1], k.shape[1],
        HALF=half, BLOCK_D=block_d, BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        num_warps=warps, enable_fp_fusion=False,
    )
