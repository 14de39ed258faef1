"""RMSNorm, optionally fused with the residual add before it (vLLM/SGLang ``fused_add_rms_norm``).

One program per row (a token, or a (token, head) pair for the per-head q/k norm of Qwen3). With a
residual: ``s = x + residual`` rounded to the activation dtype (as torch's add), stored as the new
residual, then normalized. The statistic is taken in float32 and the normalized value is rounded
before the weight multiply, as transformers' ``LlamaRMSNorm`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmnb_engine import triton_support


@triton.jit
def _rms_norm_kernel(
    X, Residual, W, Out, Res_out,
    stride_x0, stride_x1, stride_r0, stride_r1,
    n_cols, eps,
    INNER: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    outer, inner = row // INNER, row % INNER
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    x = tl.load(X + outer * stride_x0 + inner * stride_x1 + cols, mask=valid, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Residual + outer * stride_r0 + inner * stride_r1 + cols, mask=valid, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(Out.dtype.element_ty)
        tl.store(Res_out + row * n_cols + cols, x, mask=valid)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * inv_rms).to(Out.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=valid, other=0.0).to(tl.float32)
    tl.store(Out + row * n_cols + cols, (normed * w).to(Out.dtype.element_ty), mask=valid)


def _rows(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, INNER, stride0, stride1) of a [N, C] or [N, H, C] tensor read row by row."""
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    return x.shape[0] * x.shape[1], x.shape[1], x.stride(0), x.stride(1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last dimension, on the GPU (or interpreted).

    Args:
        x: [N, C] or [N, H, C], float dtype, last dimension contiguous (other strides free, so
            head views of a fused qkv output work).
        weight: [C]; eps: added to the mean square.
        residual: same shape as x, or None. When given, the norm is of ``x + residual``.
    Returns:
        The normalized tensor (contiguous, x's shape and dtype); with ``residual``, also
        ``x + residual`` (the new residual stream): ``(normed, summed)``.
    Raises:
        ValueError: a non-contiguous last dimension, or mismatched shapes.
    """
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("rms_norm needs the last dimension contiguous")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x shape {tuple(x.shape)}")
    n_cols = x.shape[-1]
    if weight.shape != (n_cols,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match the last dimension {n_cols}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    rows, inner, sx0, sx1 = _rows(x)
    r = residual if residual is not None else x
    _, _, sr0, sr1 = _rows(r)
    if rows:
        block = triton.next_power_of_2(n_cols)
        warps = 1 if triton_support.device_arch(x.device) is None else min(max(block // 256, 1), 16)
        _rms_norm_kernel[(rows,)](
            x, r, weight, out, res_out, sx0, sx1, sr0, sr1, n_cols, eps,
            INNER=inner, HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=warps, enable_fp_fusion=False,
        )
    return (out, res_out) if residual is not None else out
