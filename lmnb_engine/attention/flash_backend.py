"""``AttentionBackend`` that runs extend attention on flash-attn when it is installed.

flash-attn is an optional extra (``pip install lmnb[flash]``, or a Hopper build of FlashAttention-3
that provides ``flash_attn_interface``); nothing requires it. What it is used for, and why:

- EXTEND batches (prefills, chunks, cache-hit extends, mixed batches) call its variable-length
  kernel, ``flash_attn_varlen_func``, with ``causal=True``. Since flash-attn 2.1 a causal mask of
  a non-square block is aligned at the bottom right, so a request's ``n`` new queries at the end
  of a ``p + n`` key sequence see exactly keys ``0..p+i``: the extend semantics. A batch with no
  cached prefix passes the new K/V as they are; otherwise each request's keys are gathered from
  the pool into one packed buffer first, because FlashAttention-2's paged mode takes only pages
  of 256 tokens and lmnb's pool has 1-token pages (RadixAttention's granularity).
- DECODE batches stay on the Triton split-KV kernel (``TritonAttentionBackend``): it reads the
  pool in place, where a flash-attn call would need the whole KV gathered every step, and it is
  what the CUDA graphs capture. fp32 models, or shapes flash-attn does not take, stay on Triton too.

flash-attn's contract is checked against a reference when the engine starts (``prepare``): one
small ragged batch with a cached prefix, GQA as the model has it. A build that fails it (a
flash-attn older than 2.1 aligns the causal mask at the top left and would be silently wrong)
is not used: with ``strict`` (the backend asked for by name) that is an error, otherwise a
warning and the Triton kernels.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lmnb_engine.attention.torch_backend import sdpa_gqa
from lmnb_engine.attention.triton_backend import TritonAttentionBackend
from lmnb_engine.attention.triton_ops import store_kv
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.kv_pool import TokenToKVPool

log = logging.getLogger(__name__)

FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# The modules that provide ``flash_attn_varlen_func``, in order of preference: FlashAttention-3
# (Hopper) and FlashAttention-2.
MODULES = ("flash_attn_interface", "flash_attn")


@dataclass(frozen=True)
class FlashAttn:
    """One importable flash-attn: its ``flash_attn_varlen_func`` and a label for messages."""

    varlen: Callable
    label: str


def load_flash_attn(modules: tuple[str, ...] = MODULES) -> Optional[FlashAttn]:
    """The first of ``modules`` that imports and has ``flash_attn_varlen_func``, or None.

    A module that is present but fails to import (a build for another CUDA or torch) counts as
    absent, with the reason logged: flash-attn is never required.
    """
    for name in modules:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here"
            log.warning("%s is installed but does not import (%s); not using it", name, exc)
            continue
        fn = getattr(mod, "flash_attn_varlen_func", None)
        if fn is not None:
            version = getattr(mod, "__version__", None)
            return FlashAttn(fn, f"{name} {version}" if version else name)
    return None


def _reference_extend(q, k, v, q_lens, k_lens, scale):
    """Float32 attention per request with the bottom-right causal mask, ``q``: [Tq, Hq, D]."""
    out, qo, ko = [], 0, 0
    for nq, nk in zip(q_lens, k_lens):
        qi, ki, vi = (x.float().transpose(0, 1) for x in (q[qo:qo + nq], k[ko:ko + nk], v[ko:ko + nk]))
        allowed = torch.arange(nk)[None, :] <= torch.arange(nk - nq, nk)[:, None]
        out.append(sdpa_gqa(qi[None], ki[None], vi[None], scale, attn_mask=allowed.to(qi.device))[0].transpose(0, 1))
        qo, ko = qo + nq, ko + nk
    return torch.cat(out)


class FlashAttentionBackend(TritonAttentionBackend):
    """flash-attn for extend attention, the Triton kernels for decode and everything else.

    Args:
        flash: the flash-attn to call (``load_flash_attn()``).
        strict: raise, instead of warning and using Triton, when flash-attn cannot run this
            model (fp32, head_dim over 256) or fails its start-up check.
        other arguments: as ``TritonAttentionBackend``.
    """

    def __init__(self, flash: FlashAttn, strict: bool = False, **triton_kwargs) -> None:
        super().__init__(**triton_kwargs)
        self.flash = flash
        self.strict = strict
        self.active = False  # set by ``prepare``: flash-attn passed its check for this model
        self._meta: Optional[tuple] = None

    def prepare(self, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device | str) -> None:
        """Decide whether extend runs on flash-attn for this model: a supported dtype and head
        size, and a correct result on a small ragged batch with a cached prefix.

        Raises:
            RuntimeError: ``strict`` and flash-attn cannot be used (the message says why).
        """
        unsupported = broken = None
        if dtype not in FLASH_DTYPES:
            unsupported = f"it runs float16/bfloat16 models, not {str(dtype).replace('torch.', '')}"
        elif head_dim > MAX_HEAD_DIM or head_dim % 8:
            unsupported = f"it takes head_dim <= {MAX_HEAD_DIM} in multiples of 8, not {head_dim}"
        else:
            broken = self._self_check(num_q_heads, num_kv_heads, head_dim, dtype, torch.device(device))
        self.active = unsupported is None and broken is None
        if self.active:
            return
        msg = f"{self.flash.label} cannot run extend attention for this model: {unsupported or broken}"
        if self.strict:
            raise RuntimeError(f"{msg}; use attention_backend='triton'")
        if broken:  # a model flash-attn does not take is expected; a build that fails its check is not
            warnings.warn(f"{msg}; the Triton kernels run it instead", RuntimeWarning, stacklevel=2)
        else:
            log.info("%s; the Triton kernels run it instead", msg)

    def _self_check(self, hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> Optional[str]:
        """None if flash-attn matches the float32 reference on a small case, else what went wrong."""
        g = torch.Generator().manual_seed(0)
        q_lens, k_lens = [3, 1, 5], [7, 4, 5]  # cached prefixes of 4, 3 and 0 tokens
        q = torch.randn(sum(q_lens), hq, d, generator=g).to(device, dtype)
        k, v = (torch.randn(sum(k_lens), hkv, d, generator=g).to(device, dtype) for _ in range(2))
        cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
              for n in (q_lens, k_lens)]
        scale = d ** -0.5
        try:
            out = self._call(q, k, v, cu[0], cu[1], max(q_lens), max(k_lens), scale)
        except Exception as exc:  # noqa: BLE001 - an unusable build is reported, not raised deep inside
            return f"flash_attn_varlen_func failed ({type(exc).__name__}: {exc})"
        want = _reference_extend(q, k, v, q_lens, k_lens, scale)
        err = (out.float() - want).abs().max().item() if out.shape == want.shape else float("inf")
        if not err <= 2 ** -6:  # a few 16-bit rounding steps on outputs of size ~1; NaN fails too
            return (f"its output differs from the reference by {err:.3g} on a batch with cached prefixes "
                    "(flash-attn < 2.1 aligns the causal mask at the top left)")
        return None

    def _call(self, q, k, v, cu_q, cu_k, max_q, max_k, scale) -> torch.Tensor:
        out = self.flash.varlen(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                                max_seqlen_k=max_k, softmax_scale=scale, causal=True)
        return out[0] if isinstance(out, tuple) else out  # some FlashAttention-3 builds add the LSE

    def init_forward(self, batch: ForwardBatch) -> None:
        """As ``TritonAttentionBackend``; an EXTEND batch's flash-attn metadata waits for its
        first layer (a batch the Triton kernels run needs none)."""
        super().init_forward(batch)
        self._meta = None

    def _extend_meta(self, batch: ForwardBatch) -> tuple:
        """(cu_seqlens_q, cu_seqlens_k, max_q, max_k, kv_slots or None), built once per batch.

        ``kv_slots`` (int64 [sum(seq_lens)]) lists each request's pool slots ``0..seq_len`` in
        order; None when no request has a cached prefix (the new K/V are the whole keys).
        """
        if self._meta is None:
            dev = batch.input_ids.device
            q_lens, k_lens = batch.extend_seq_lens_cpu, batch.seq_lens_cpu
            cu_host = torch.tensor([[0] * 2, *zip(q_lens, k_lens)], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            cu = cu_host.t().contiguous().to(dev)  # flash-attn takes contiguous int32 offsets
            slots = None
            if any(batch.extend_prefix_lens_cpu):
                total_k = int(cu_host[-1, 1])
                tok_req = torch.repeat_interleave(torch.arange(batch.batch_size, device=dev), batch.seq_lens,
                                                  output_size=total_k)
                pos = torch.arange(total_k, device=dev) - cu[1, :-1].long()[tok_req]
                slots = batch.req_to_token[batch.req_pool_indices[tok_req], pos].long()
            self._meta = (cu[0], cu[1], max(q_lens), max(k_lens), slots)
        return self._meta

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch,
                kv_pool: TokenToKVPool, scale: float) -> torch.Tensor:
        """``AttentionBackend.forward``: an EXTEND batch on flash-attn (after ``prepare`` found it
        usable), anything else on the Triton kernels."""
        if not self.active or self._mode is not ForwardMode.EXTEND:
            return super().forward(q, k, v, layer_id, batch, kv_pool, scale)
        k_pool, v_pool = kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id]
        store_kv(k, v, k_pool, v_pool, batch.out_cache_loc)
        cu_q, cu_k, max_q, max_k, slots = self._extend_meta(batch)
        if slots is not None:
            k, v = k_pool.index_select(0, slots), v_pool.index_select(0, slots)
        return self._call(q, k, v, cu_q, cu_k, max_q, max_k, scale)
