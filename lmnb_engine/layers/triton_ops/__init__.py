"""Fused Triton kernels of the decoder layer's elementwise work (the GPU path of ``layers``):
RMSNorm with the residual add, RoPE on q and k in place with the KV-pool write, SiLU-and-multiply.

Unfused, a Llama layer launches about 35 kernels per forward, most of them tiny elementwise ones;
at decode batch 1 of a 7B model their fixed cost (a few microseconds each, CUDA graph or not) is
of the order of the 3 ms the weights take to stream. Fused, a layer launches 9 or 10. Each kernel
rounds its intermediates to the activation dtype where the torch reference (and transformers)
does, so bf16 outputs match the torch path except for the reduction order inside the norm.

Importing this package imports ``triton``.
"""

from lmnb_engine.layers.triton_ops.activation import silu_and_mul
from lmnb_engine.layers.triton_ops.rmsnorm import rms_norm
from lmnb_engine.layers.triton_ops.rotary import rotary_store_kv_

__all__ = ["rms_norm", "rotary_store_kv_", "silu_and_mul"]
