"""SiLU-gated feed-forward block (SwiGLU, Shazeer 2020) with gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``.

    ``gate_up_proj.weight`` is ``[2 * intermediate, hidden]``: rows ``[:intermediate]`` are the
    checkpoint's ``gate_proj``, rows ``[intermediate:]`` its ``up_proj`` (one GEMM instead of two).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
