"""Attention backends behind one seam (``AttentionBackend``): torch on CPU, Triton on NVIDIA GPUs.

``select_attention_backend(device, name)`` picks one; importing this package imports neither
Triton nor a backend module.
"""

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.attention.selector import select_attention_backend, triton_available

__all__ = ["AttentionBackend", "select_attention_backend", "triton_available"]
