"""An experiment, not engine code: a Triton GEMV for batch-1 decode, timed against cuBLAS by
``gpu_kernels.py`` (issue 9).

Batch-1 decode of Llama-2-7B on the H200 ran at MBU 0.71 (``results/2026-12-04-nvidia-h200.md``):
its step is almost all matrix-vector products, which torch sends to cuBLAS. Whether a kernel of
our own could read the weights faster, and so be worth wiring in (and fusing the RMSNorm or
SiLU-and-mul before it), is what the timings are for. ``y = W @ x`` for one token: each program
takes ``BLOCK_N`` rows of ``W`` and walks ``K`` in ``BLOCK_K`` steps, loading whole row segments
(contiguous in memory) and keeping float32 partial products, summed once at the end.

Importing this module imports triton (``gpu_kernels.py`` imports it only once ``TRITON_INTERPRET``
is decided).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(X, W, Y, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid = rows < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_valid = cols < K
        x = tl.load(X + cols, mask=col_valid, other=0.0).to(tl.float32)
        w = tl.load(W + rows[:, None] * stride_wn + cols[None, :], mask=row_valid[:, None] & col_valid[None, :],
                    other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=row_valid)


def gemv(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """``w @ x``: x [K], w [N, K] with a contiguous last dimension -> [N] in x's dtype (float32
    accumulation). Raises ValueError on shapes that do not match."""
    (K,) = x.shape
    N = w.shape[0]
    if w.shape[1] != K or w.stride(1) != 1 or x.stride(0) != 1:
        raise ValueError(f"gemv: w {tuple(w.shape)} and x {tuple(x.shape)} do not match (or are not contiguous)")
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, block_n),)](x, w, y, N, K, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                             num_warps=num_warps, num_stages=num_stages)
    return y
