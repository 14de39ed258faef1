"""SiLU-and-multiply of a fused gate|up projection (SwiGLU): ``silu(gate) * up`` in one pass.

``silu`` is computed as torch computes it, ``g / (1 + exp(-g))`` in float32, rounded to the
activation dtype before the multiply (torch runs ``F.silu`` and ``*`` as two rounded ops). On a
GPU torch's kernel calls CUDA's ``expf`` and divides with IEEE rounding; Triton's ``tl.exp`` and
``/`` compile to approximations (``ex2.approx``, ``div.full``) a few float32 ulps off, which now
and then flip an element's bf16 rounding (benches/gpu_check.py compares 4M of them bit for
bit). So the kernel calls libdevice's ``exp`` (the same CUDA math library code) and ``div_rn``;
the CPU interpreter, which runs no libdevice calls, keeps ``tl.exp`` (numpy's, as before).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from lmnb_engine import triton_support


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, n_cols, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < n_cols
    gate = tl.load(X + row * stride_x + cols, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n_cols + cols, mask=valid, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    act = tl.math.div_rn(gate, 1.0 + e).to(Out.dtype.element_ty).to(tl.float32)
    tl.store(Out + row * n_cols + cols, (act * up).to(Out.dtype.element_ty), mask=valid)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * I] with gate in ``[:, :I]`` and up in ``[:, I:]`` (last dimension contiguous)
    -> [T, I] in x's dtype. Raises ``ValueError`` for an odd or non-contiguous last dimension."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"silu_and_mul needs [T, 2*I] with a contiguous last dimension, got {tuple(x.shape)}")
    n = x.shape[1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    if x.shape[0] and n:
        gpu = triton_support.device_arch(x.device) is not None
        block = min(triton.next_power_of_2(n), 1024 if gpu else 256)
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(n, block))](
            x, out, x.stride(0), n, BLOCK=block, LIBDEVICE=gpu, num_warps=4 if gpu else 1, enable_fp_fusion=False,
        )
    return out
