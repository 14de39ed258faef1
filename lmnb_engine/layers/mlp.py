"""SiLU-gated feed-forward block (SwiGLU, Shazeer 2020) with gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmnb_engine.layers.kernel_op import KernelOp


class SiluAndMul(KernelOp):
    """``silu(x[:, :I]) * x[:, I:]`` for x [T, 2 * I] -> [T, I] (the gate|up halves of one GEMM)."""

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` over the two halves of the last dimension, in torch."""
        gate, up = x.split(x.shape[-1] // 2, dim=-1)
        return F.silu(gate) * up

    def forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        """The same, as one Triton kernel."""
        from lmnb_engine.layers.triton_ops import silu_and_mul

        return silu_and_mul(x)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``.

    ``gate_up_proj.weight`` is ``[2 * intermediate, hidden]``: rows ``[:intermediate]`` are the
    checkpoint's ``gate_proj``, rows ``[intermediate:]`` its ``up_proj`` (one GEMM instead of two).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.act = SiluAndMul()
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        return self.down_proj(self.act(self.gate_up_proj(x)))
