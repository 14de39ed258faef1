"""Triton attention kernels over the token-level KV pool (page size 1): extend, decode, KV store.

Importing this package imports ``triton``; the Triton backend does so only when selected.
"""

from lmnb_engine.attention.triton_ops.decode_attention import decode_attention_fwd, decode_workspace
from lmnb_engine.attention.triton_ops.extend_attention import extend_attention_fwd
from lmnb_engine.attention.triton_ops.kv_store import store_kv

__all__ = ["decode_attention_fwd", "decode_workspace", "extend_attention_fwd", "store_kv"]
