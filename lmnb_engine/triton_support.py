"""Where the Triton kernels run: on a CUDA GPU of some architecture, or in the CPU interpreter.

Every kernel wrapper chooses its tiles from ``device_arch`` (one place, so that
``lmnb_engine.testing.triton_compile`` can ask the same wrappers for the launches they would make
on another GPU and compile those on a machine without one). Importing this module does not
import triton.
"""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to run kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def device_arch(device: torch.device | str) -> int | None:
    """Compute capability of a CUDA device as one int (80 A100, 86 A10G, 89 L4, 90 H100/H200);
    None for any other device, where kernels run interpreted (and get small tiles)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def f32_dot(x: torch.Tensor) -> bool:
    """Whether attention kernels take their dot products in IEEE float32 for inputs like ``x``:
    for float32 inputs (tensor cores would round them to tf32), and always under the CPU
    interpreter, whose ``tl.dot`` of bf16 blocks multiplies their raw bits (wrong values)."""
    return x.dtype == torch.float32 or device_arch(x.device) is None
