"""Root-mean-square layer norm (Zhang & Sennrich 2019), computed as transformers' ``LlamaRMSNorm``."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] of any float dtype -> same shape and dtype."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
