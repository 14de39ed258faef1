"""Root-mean-square layer norm (Zhang & Sennrich 2019), computed as transformers' ``LlamaRMSNorm``,
optionally fused with the residual add that precedes it in a pre-norm block."""

from __future__ import annotations

import torch
from torch import nn

from lmnb_engine.layers.kernel_op import KernelOp


class RMSNorm(KernelOp):
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last dimension.

    The statistic is taken in float32 and the result cast back before the weight multiply, as
    transformers does, so bf16 outputs round the same way as the reference.

    Args:
        dim: size of the normalized (last) dimension.
        eps: added to the mean square.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward_torch(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x: [..., dim] of any float dtype -> same shape and dtype. With ``residual`` (x's
        shape): the norm of ``x + residual``, returned with that sum: ``(normed, x + residual)``."""
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """As ``forward_torch``, in one kernel (x: [N, dim] or [N, H, dim])."""
        from lmnb_engine.layers.triton_ops import rms_norm

        return rms_norm(x, self.weight, self.eps, residual)
