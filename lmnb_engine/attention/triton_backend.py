"""``AttentionBackend`` on the Triton kernels of ``triton_ops``: the GPU path.

EXTEND batches (new prompts, chunks, jump-forward drafts, mixed batches) run the extend kernel
over each request's cached prefix in the pool plus its new tokens; DECODE batches (one new token
per request) run split-KV flash-decoding. Both read the pool through ``req_to_token`` exactly as
``TorchAttentionBackend`` does, which is the reference they are tested against
(``tests/test_triton_attention.py``, under ``TRITON_INTERPRET=1`` on CPU).

Decode metadata is computed on the device with no host sync, and the split kernel's workspace is
reserved ahead (``reserve_decode``), so a decode forward can be captured in a CUDA graph
(``lmnb_engine.cuda_graph_runner``).
"""

from __future__ import annotations

import torch

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.attention.triton_ops import decode_attention_fwd, decode_workspace, extend_attention_fwd, store_kv
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.kv_pool import TokenToKVPool

DEFAULT_MAX_KV_SPLITS = 16
# One 64-key tile per split at least: a shorter split adds a merge term without saving a tile.
DEFAULT_MIN_SPLIT_TOKENS = 64


def decode_split_grid(batch_size: int, num_kv_heads: int, head_blocks: int, sm_count: int, max_kv_splits: int) -> int:
    """Splits per request the decode grid has room for: enough that the split kernel's
    ``batch_size x num_kv_heads x head_blocks`` programs become about two per multiprocessor,
    within ``[1, max_kv_splits]``. It depends on the batch size and the model alone, so one CUDA
    graph per batch size fixes it."""
    programs = batch_size * num_kv_heads * head_blocks
    return max(1, min(max_kv_splits, -(-2 * sm_count // programs)))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the CPU interpreter: its "SMs" are simulated one program at a time


class TritonAttentionBackend(AttentionBackend):
    """Triton extend and decode attention over the token-level KV pool.

    Args:
        max_kv_splits: most key splits per request in decode (sizes the split workspace).
        min_split_tokens: fewest keys per split; a request of ``n`` tokens gets at most
            ``ceil(n / min_split_tokens)`` splits.
        sm_count: multiprocessors the decode grid aims to fill (default: the device's count).
    Raises:
        ValueError: a bound below 1.
    """

    supports_cuda_graph = True  # decode metadata is device-side (see CudaGraphRunner)
    triton_kernels = True

    def __init__(self, max_kv_splits: int = DEFAULT_MAX_KV_SPLITS,
                 min_split_tokens: int = DEFAULT_MIN_SPLIT_TOKENS, sm_count: int | None = None) -> None:
        if max_kv_splits < 1 or min_split_tokens < 1:
            raise ValueError(f"max_kv_splits={max_kv_splits} and min_split_tokens={min_split_tokens} must be >= 1")
        self.max_kv_splits = max_kv_splits
        self.min_split_tokens = min_split_tokens
        self._mode: ForwardMode | None = None
        self._max_extend_len = 0
        self._grid_splits = 1
        self._num_splits: torch.Tensor | None = None
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self._sms = sm_count

    def reserve_decode(self, max_batch_size: int, num_q_heads: int, head_dim: int, device: torch.device | str) -> None:
        """Allocate the decode workspace for up to ``max_batch_size`` requests now (before a CUDA
        graph capture, during which no allocation may depend on later batches)."""
        self._workspace = decode_workspace(max_batch_size, num_q_heads, head_dim, self.max_kv_splits, device)

    def _decode_splits(self, batch: ForwardBatch, num_kv_heads: int, head_blocks: int) -> None:
        """Choose the split grid (``decode_split_grid``) and each request's split count (device
        ops only, no host sync): ``ceil(seq_len / min_split_tokens)`` splits, clamped to
        ``[1, grid]``."""
        if self._sms is None:
            self._sms = _num_sms(batch.seq_lens.device)
        self._grid_splits = decode_split_grid(batch.batch_size, num_kv_heads, head_blocks, self._sms,
                                              self.max_kv_splits)
        splits = torch.div(batch.seq_lens + (self.min_split_tokens - 1), self.min_split_tokens, rounding_mode="floor")
        self._num_splits = splits.clamp_(1, self._grid_splits).to(torch.int32)

    def init_forward(self, batch: ForwardBatch) -> None:
        """Per-batch metadata: the longest extend (EXTEND); DECODE split counts are chosen at the
        first layer, which knows the head counts."""
        self._mode = batch.mode
        self._num_splits = None
        self._max_extend_len = max(batch.extend_seq_lens_cpu, default=0)

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
        if self._mode is None:
            raise RuntimeError("TritonAttentionBackend.forward called before init_forward(batch)")
        k_pool, v_pool = kv_pool.k_buffer[layer_id], kv_pool.v_buffer[layer_id]
        if save_kv:
            store_kv(k, v, k_pool, v_pool, batch.out_cache_loc)
        return self._attend(q, k, v, k_pool, v_pool, batch, scale)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
                v_pool: torch.Tensor, batch: ForwardBatch, scale: float) -> torch.Tensor:
        """The attention of ``forward``, once the new K/V are in ``k_pool``/``v_pool`` (one
        layer's buffers): split-KV decode, or extend over the pool plus the new tokens."""
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if self._mode is ForwardMode.DECODE:
            B, num_q_heads, head_dim = q.shape
            if self._num_splits is None:
                group = num_q_heads // k.shape[1]
                self._decode_splits(batch, k.shape[1], -(-group // 64))  # the kernel's head blocks are <= 64 wide
            ws = self._workspace
            if ws is None:
                self.reserve_decode(B, num_q_heads, head_dim, q.device)
                ws = self._workspace
            elif ws[0].shape[0] < B or ws[0].shape[1] != num_q_heads or ws[0].shape[3] != head_dim:
                # a batch larger than the reservation (an eager decode above cuda_graph_max_bs)
                # gets a workspace of its own: CUDA graphs captured over the reserved one keep
                # writing into it, so freeing it for a bigger one would corrupt whatever next
                # takes its memory
                ws = decode_workspace(B, num_q_heads, head_dim, self.max_kv_splits, q.device)
            return decode_attention_fwd(
                q, k_pool, v_pool, out, batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
                self._num_splits, self._grid_splits, scale, workspace=ws,
            )
        return extend_attention_fwd(
            q, k, v, out, k_pool, v_pool, batch.req_to_token, batch.req_pool_indices,
            batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc, self._max_extend_len, scale,
        )
