"""Pick the attention backend for a device: Triton on NVIDIA GPUs when importable, torch otherwise.

flash-attn is not needed by any backend: the Triton kernels cover extend and decode over the
token-level pool. ``LMNB_ATTENTION_BACKEND`` (``auto``/``torch``/``triton``) overrides the default.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.triton_support import interpreting

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """True if the ``triton`` package can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _triton_imported_interpreted() -> bool:
    """True if triton was imported with ``TRITON_INTERPRET`` set: it decides at import, for its
    own library functions (which kernels call), whether they run interpreted."""
    import triton.language.standard as standard

    return type(standard.cdiv).__name__ == "InterpretedFunction"


def select_attention_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """A new backend for ``device``.

    Args:
        device: where the model runs.
        name: "auto" (default; also from ``LMNB_ATTENTION_BACKEND``): Triton on CUDA when
            ``triton`` imports, else torch; "torch"; or "triton" (CUDA, or any device under
            ``TRITON_INTERPRET=1``, the CPU interpreter used by the tests).
    Raises:
        ValueError: an unknown name, or "triton" on a device it cannot run on.
        ImportError: "triton" asked for but the package is missing (the message says how to install).
    """
    name = (name or os.environ.get("LMNB_ATTENTION_BACKEND") or "auto").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    dev = torch.device(device)
    if name == "auto":
        name = "triton" if dev.type == "cuda" and triton_available() else "torch"
    if name == "torch":
        from lmnb_engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if not triton_available():
        raise ImportError("attention backend 'triton' needs the triton package: pip install triton "
                          "(Linux x86-64/aarch64), or use attention_backend='torch'")
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"the Triton attention backend runs on CUDA devices, not {dev.type!r} (set "
                         "TRITON_INTERPRET=1 to interpret it on CPU, slowly, for tests); use 'torch'")
    from lmnb_engine.attention.triton_backend import TritonAttentionBackend

    if dev.type != "cuda" and not _triton_imported_interpreted():
        raise ValueError("TRITON_INTERPRET=1 was set after triton was imported, so the kernels were built "
                         "for a GPU; set it before anything imports triton (in the shell, or first in the script)")

    return TritonAttentionBackend()
