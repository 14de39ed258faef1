"""The attention-backend contract.

A backend computes, for every new token of a ``ForwardBatch``, causal attention over its own
sequence: the cached prefix read from the KV pool through ``req_to_token`` plus the new tokens.
It also writes the new tokens' K/V into the pool, unless the caller already did (``save_kv=False``:
the models' RoPE kernel writes them, ``layers.rotary.RotaryStoreKV``). Backends are interchangeable: the torch backend
is the CPU path and the reference the Triton kernels are tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from lmnb_engine.forward_batch import ForwardBatch
from lmnb_engine.kv_pool import TokenToKVPool


class AttentionBackend(ABC):
    """Computes attention for one layer of one batch.

    ``init_forward`` is called once per forward pass, before the first layer, to build per-batch
    metadata (masks, index tensors) that every layer reuses.

    ``triton_kernels``: True for a backend of the Triton (GPU) path; the model runner then runs
    the model's other layers on their fused Triton kernels too (``layers.use_triton_kernels``).
    """

    triton_kernels = False

    @property
    def name(self) -> str:
        """What runs the attention, for ``Engine.model_info`` (e.g. "torch", "triton")."""
        return type(self).__name__.removesuffix("AttentionBackend").lower()

    def prepare(self, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device | str) -> None:
        """Called once by the model runner, before any forward, with the model's attention shape
        (this rank's heads under tensor parallelism). Nothing to do by default."""

    @abstractmethod
    def init_forward(self, batch: ForwardBatch) -> None:
        """Prepare per-batch metadata (lengths, offsets) once before the layers' ``forward`` calls."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        kv_pool: TokenToKVPool,
        scale: float,
        save_kv: bool = True,
    ) -> torch.Tensor:
        """Attention output for the new tokens.

        Args:
            q: [T, num_q_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] (the new tokens,
                already rotated). GQA: query head h reads kv head h // (num_q_heads // num_kv_heads).
            layer_id: index of the layer whose pool buffers to use.
            scale: softmax scale (usually head_dim ** -0.5).
            save_kv: write k, v into the pool at ``batch.out_cache_loc`` first (False: the
                caller has written them there already, as SGLang's ``save_kv_cache``).
        Returns:
            [T, num_q_heads, head_dim], same dtype as q.
        """
