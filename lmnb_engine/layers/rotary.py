"""Rotary position embedding (RoPE, Su et al. 2021) in the "rotate half" layout of HF checkpoints.

Inverse frequencies (and YaRN's attention factor on cos/sin) come from transformers' own RoPE
init functions for scaled variants (linear, llama3, yarn), so they match the reference bit for bit; cos/sin are computed in float32 from the
absolute positions of the batch and then cast to the activation dtype, as ``LlamaRotaryEmbedding``
does.
"""

from __future__ import annotations

import torch
from torch import nn

from lmnb_engine.layers.kernel_op import KernelOp
from lmnb_engine.model_config import ModelConfig


def _inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """float32 [head_dim // 2] inverse frequencies and the cos/sin scale factor."""
    if config.rope_type == "default":
        dim = config.head_dim
        return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[config.rope_type](config.hf_config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for a batch of positions (``RotaryStoreKV`` then rotates q and k).

    Args:
        config: supplies ``head_dim``, ``rope_type``, ``rope_theta`` and the HF config.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq, self.scaling = _inv_freq(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int64 [T] -> (cos, sin), each [T, head_dim] in ``dtype``."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:  # (YaRN's attention factor) x * 1.0 is x: two launches less a step
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, head_dim] -> rotated x, same shape and dtype."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RotaryStoreKV(KernelOp):
    """RoPE on a layer's queries and keys, and the new tokens' K/V written into the KV pool:
    ``(q, k, v, cos, sin, kv_pool, layer_id, loc) -> (q_rotated, k_rotated)``.

    q: [T, Hq, D]; k, v: [T, Hk, D]; cos, sin: [T, D] from ``RotaryEmbedding.cos_sin``; the
    rotated k and v go to ``kv_pool``'s buffers of ``layer_id`` at slots ``loc`` (int64 [T]),
    as ``TokenToKVPool.set_kv`` writes them; the attention backend is then called with
    ``save_kv=False``. The Triton forward does it all in one kernel (SGLang's
    ``fused_set_kv_buffer``), rotating q and k in place (views of the fresh qkv projection).
    """

    def forward_torch(self, q, k, v, cos, sin, kv_pool, layer_id, loc):
        """Apply RoPE to q and k, then write k and v into the pool, in torch."""
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        kv_pool.set_kv(layer_id, loc, k, v)
        return q, k

    def forward_triton(self, q, k, v, cos, sin, kv_pool, layer_id, loc):
        """Apply RoPE to q and k and write k and v into the pool with one Triton kernel."""
        from lmnb_engine.layers.triton_ops import rotary_store_kv_

        rotary_store_kv_(q, k, v, cos, sin, kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id], loc)
        return q, k
