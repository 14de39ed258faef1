"""Write the new tokens' K and V into one layer's pool buffers in one launch.

``TokenToKVPool.set_kv`` does the same with two indexed copies (and a cast when the dtypes
differ); this kernel reads the k/v views of the fused qkv output in place, one program per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support


@triton.jit
def _store_kv_kernel(
    K, V, K_pool, V_pool, Loc,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_kpt, stride_kph, stride_vpt, stride_vph,
    n_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    valid = (offs_h < n_heads)[:, None] & (offs_d < head_dim)[None, :]
    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=valid)
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=valid)
    tl.store(K_pool + slot * stride_kpt + offs_h[:, None] * stride_kph + offs_d[None, :],
             k.to(K_pool.dtype.element_ty), mask=valid)
    tl.store(V_pool + slot * stride_vpt + offs_h[:, None] * stride_vph + offs_d[None, :],
             v.to(V_pool.dtype.element_ty), mask=valid)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, loc: torch.Tensor) -> None:
    """``k_pool[loc] = k; v_pool[loc] = v`` (cast to the pool dtype).

    Args:
        k, v: [T, Hkv, D], last dimension contiguous; k_pool, v_pool: [slots, Hkv, D] one
            layer's buffers; loc: int64 [T] slots (distinct, as the allocator hands them out).
    Raises:
        ValueError: shapes that do not match, or a non-contiguous last dimension.
    """
    T, heads, d = k.shape
    if v.shape != k.shape or k_pool.shape[1:] != (heads, d) or v_pool.shape[1:] != (heads, d) or loc.shape != (T,):
        raise ValueError(f"store_kv: k {tuple(k.shape)}, v {tuple(v.shape)}, pools {tuple(k_pool.shape)}/"
                         f"{tuple(v_pool.shape)} and loc {tuple(loc.shape)} do not match")
    if any(x.stride(-1) != 1 for x in (k, v, k_pool, v_pool)):
        raise ValueError("store_kv needs the last (head_dim) dimension contiguous")
    if not T:
        return
    gpu = triton_support.device_arch(k.device) is not None
    _store_kv_kernel[(T,)](
        k, v, k_pool, v_pool, loc,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        heads, d,
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(d), num_warps=4 if gpu else 1,
        enable_fp_fusion=False,
    )
