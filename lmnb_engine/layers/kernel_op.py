"""Layers with two implementations: plain torch (the CPU path and the reference) and fused Triton
kernels (the GPU path, ``layers.triton_ops``).

As SGLang's ``CustomOp`` (``forward_native`` / ``forward_cuda``), but the choice is made per model
by the engine rather than by the platform: the model runner turns the Triton kernels on together
with the Triton attention backend (``use_triton_kernels``), so an engine built with
``attention_backend="torch"`` on a GPU is the all-torch reference the GPU path is checked against.
"""

from __future__ import annotations

from torch import nn


class KernelOp(nn.Module):
    """Dispatches ``forward`` to ``forward_torch`` or, once ``use_triton_kernels`` switched it,
    ``forward_triton`` (same arguments and results; subclasses implement both)."""

    triton = False

    def forward(self, *args, **kwargs):
        """``forward_triton`` when switched to Triton, else ``forward_torch``."""
        return self.forward_triton(*args, **kwargs) if self.triton else self.forward_torch(*args, **kwargs)

    def forward_torch(self, *args, **kwargs):
        """The plain torch implementation (CPU, reference)."""
        raise NotImplementedError

    def forward_triton(self, *args, **kwargs):
        """The fused Triton implementation (GPU)."""
        raise NotImplementedError


def use_triton_kernels(model: nn.Module, enabled: bool = True) -> int:
    """Switch every ``KernelOp`` of ``model`` to its Triton (True) or torch (False) forward;
    returns how many were switched. Needs ``triton`` (imported on first use) when enabled."""
    ops = [m for m in model.modules() if isinstance(m, KernelOp)]
    if enabled and ops:
        import lmnb_engine.layers.triton_ops  # noqa: F401 - fail here, not inside the first forward
    for m in ops:
        m.triton = enabled
    return len(ops)
