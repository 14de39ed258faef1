"""Attention backends behind one seam (``AttentionBackend``): torch on CPU, Triton on NVIDIA GPUs."""

from lmnb_engine.attention.base import AttentionBackend

__all__ = ["AttentionBackend"]
