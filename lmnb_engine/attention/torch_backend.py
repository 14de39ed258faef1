"""Attention in plain torch: gather each request's KV from the pool, one padded SDPA per layer.

The CPU path and the reference the GPU kernels are checked against. Like SGLang's
``torch_native_backend`` it reads the KV of request ``i`` at ``req_to_token[req_pool_indices[i],
:seq_lens[i]]``, but instead of a Python loop per request per layer it pads the batch once: queries
to ``[B, max_extend_len]``, keys to ``[B, max_seq_len]``, with an explicit mask that lets the query
at absolute position ``p`` see keys ``0..p`` of its own sequence (a causal mask offset by the
cached prefix; SDPA's ``is_causal`` aligns a non-square Q/K at the top left, which is wrong here).
Index tensors and the mask are built once per batch in ``init_forward``.

A single request with no cached prefix (a cold prefill) is the one case where Q and K are square
and aligned: it skips the pool gather and uses ``is_causal``, which lets SDPA skip masked blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.forward_batch import ForwardBatch
from lmnb_engine.kv_pool import TokenToKVPool

# SDPA grew native grouped-query attention in torch 2.5; before that the KV heads are repeated.
_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class _Meta:
    q_index: torch.Tensor  # int64 [B, max_q]: packed row of each padded query (clamped for padding)
    kv_slots: torch.Tensor  # int64 [B * max_kv]: pool slot of each key position (0 past seq_len)
    allowed: torch.Tensor  # bool [B, 1, max_q, max_kv]: True where the query may attend the key
    out_index: torch.Tensor  # int64 [T]: row of the flattened [B * max_q] output for each token
    bias: torch.Tensor | None = None  # additive form of ``allowed`` in the activation dtype


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, **kw) -> torch.Tensor:
    """SDPA with grouped-query attention. q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D]."""
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True, **kw)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)


class TorchAttentionBackend(AttentionBackend):
    """``AttentionBackend`` on torch ``scaled_dot_product_attention`` (any device, any float dtype).

    Works for EXTEND (ragged new tokens after any cached prefix) and DECODE alike. Padded query
    rows attend key 0 only, so no row of the mask is empty (an all-masked softmax is NaN); their
    outputs are dropped. On CPU the gathered K/V go into workspace buffers kept across layers and
    batches (grow-only), because a fresh multi-megabyte allocation per layer costs more in page
    faults than the gather itself.
    """

    def __init__(self) -> None:
        self._cold_single: bool | None = None  # one request, no cached prefix: causal SDPA on k, v
        self._meta: _Meta | None = None
        self._k_work: torch.Tensor | None = None
        self._v_work: torch.Tensor | None = None

    def init_forward(self, batch: ForwardBatch) -> None:
        """Build the padded index tensors and the mask for ``batch`` (reused by every layer)."""
        self._cold_single = batch.batch_size == 1 and batch.extend_prefix_lens_cpu[0] == 0
        if self._cold_single:
            self._meta = None  # needs no metadata
            return
        dev = batch.input_ids.device
        max_q, max_kv = max(batch.extend_seq_lens_cpu), max(batch.seq_lens_cpu)
        ar_q = torch.arange(max_q, device=dev)
        ar_kv = torch.arange(max_kv, device=dev)
        q_index = (batch.extend_start_loc[:, None] + ar_q[None, :]).clamp_(max=batch.num_tokens - 1)
        kv_slots = batch.req_to_token[batch.req_pool_indices, :max_kv].long()
        kv_slots = kv_slots.masked_fill_(ar_kv[None, :] >= batch.seq_lens[:, None], 0)
        q_pos = batch.extend_prefix_lens[:, None] + ar_q[None, :]  # absolute position of each query
        allowed = ar_kv[None, None, :] <= q_pos[:, :, None]
        tok_req = torch.repeat_interleave(
            torch.arange(batch.batch_size, device=dev), batch.extend_seq_lens, output_size=batch.num_tokens
        )
        tok_off = torch.arange(batch.num_tokens, device=dev) - batch.extend_start_loc[tok_req]
        self._meta = _Meta(
            q_index=q_index,
            kv_slots=kv_slots.reshape(-1),
            allowed=allowed[:, None],
            out_index=tok_req * max_q + tok_off,
        )

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
        """Write k, v at ``batch.out_cache_loc`` (``save_kv``), then attend; see ``AttentionBackend.forward``.

        q: [T, Hq, D]; k, v: [T, Hkv, D] -> [T, Hq, D] in q's dtype.
        """
        if self._cold_single is None:
            raise RuntimeError("TorchAttentionBackend.forward called before init_forward(batch)")
        if save_kv:
            kv_pool.set_kv(layer_id, batch.out_cache_loc, k, v)
        if self._cold_single:
            qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))  # [1, H, T, D]
            return sdpa_gqa(qt, kt, vt, scale, is_causal=True)[0].transpose(0, 1)
        meta = self._meta
        num_q_heads, head_dim = q.shape[1:]
        if meta.bias is None or meta.bias.dtype != q.dtype:
            # Additive mask built once per batch: SDPA would otherwise convert a bool mask per layer.
            meta.bias = torch.zeros(meta.allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~meta.allowed, float("-inf")
            )
        B, max_q = meta.q_index.shape
        kp = self._gather(kv_pool.k_buffer[layer_id], meta.kv_slots, "_k_work")
        vp = self._gather(kv_pool.v_buffer[layer_id], meta.kv_slots, "_v_work")
        kp, vp = (x.view(B, -1, *x.shape[1:]).transpose(1, 2).to(q.dtype) for x in (kp, vp))  # [B, Hkv, max_kv, D]
        qp = q[meta.q_index].transpose(1, 2)  # [B, Hq, max_q, D]
        out = sdpa_gqa(qp, kp, vp, scale, attn_mask=meta.bias)
        return out.transpose(1, 2).reshape(B * max_q, num_q_heads, head_dim)[meta.out_index]

    def _gather(self, buf: torch.Tensor, slots: torch.Tensor, attr: str) -> torch.Tensor:
        """``buf[slots]`` ([n, Hkv, D]); on CPU written into the grow-only workspace ``attr``.

        Accelerators have caching allocators (no page faults to save), and a workspace there would
        hold memory the KV-pool budget does not know about.
        """
        if buf.device.type != "cpu":
            return buf.index_select(0, slots)
        n = slots.numel()
        work = getattr(self, attr)
        # An inference-mode tensor cannot be written outside inference mode (and vice versa
        # would leak one into autograd-tracked code), so the workspace follows the caller's mode.
        if (work is None or work.shape[0] < n or work.shape[1:] != buf.shape[1:] or work.dtype != buf.dtype
                or work.is_inference() != torch.is_inference_mode_enabled()):
            work = torch.empty((n, *buf.shape[1:]), dtype=buf.dtype)
            setattr(self, attr, work)
        return torch.index_select(buf, 0, slots, out=work[:n])
