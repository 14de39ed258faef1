"""Token-level KV-cache memory: the slot pool and the request→token table.

Design from SGLang (``mem_cache/memory_pool.py``, ``allocator/token.py``; paper §3): one slot per
token (page size 1), per-layer K and V buffers preallocated once, a free list of slots, and no
refcounts — a slot is owned either by the radix tree or by exactly one running request. Slot 0 is a
padding slot that is never handed out (padded rows of a batch write there harmlessly).
"""

from __future__ import annotations

import torch


class KVPoolExhausted(RuntimeError):
    """Raised when more KV slots are asked for than are free (after eviction)."""


class TokenToKVPool:
    """Per-layer K/V buffers of shape [size + 1, num_kv_heads, head_dim] and a slot allocator.

    Args:
        size: usable token slots (the pool's capacity in tokens, ``max_total_tokens``).
        num_layers, num_kv_heads, head_dim: model geometry.
        dtype, device: storage of the buffers.
    """

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if size < 1:
            raise ValueError(f"KV pool size must be >= 1 token, got {size}")
        self.size = size
        self.device = torch.device(device)
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = torch.arange(1, size + 1, dtype=torch.int64)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of KV one token occupies across all layers (K and V)."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def available_size(self) -> int:
        """Number of free slots."""
        return int(self._free.numel())

    def alloc(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots (int64 [n], on CPU). Raises ``KVPoolExhausted`` if fewer are free."""
        if n > self._free.numel():
            raise KVPoolExhausted(
                f"KV pool exhausted: need {n} token slots, {self._free.numel()} free of {self.size}"
            )
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Return slots (int64 [k]) to the free list. Slot 0 must never be freed."""
        if slots.numel():
            self._free = torch.cat([self._free, slots.to(device="cpu", dtype=torch.int64)])

    def nonfinite_slots(self, slots: torch.Tensor, last_layer_only: bool = False) -> torch.Tensor:
        """bool [k] (CPU): which of ``slots`` (int64 [k]) hold a NaN or inf in K or V of any layer
        (``last_layer_only``: of the last layer, a cheaper test for KV written in one forward pass,
        where attention carries a non-finite value in any layer into the last layer's KV of the
        same or a later position)."""
        idx = slots.to(self.device)
        bad = torch.zeros(idx.numel(), dtype=torch.bool, device=self.device)
        layers = slice(-1, None) if last_layer_only else slice(None)
        for k, v in zip(self.k_buffer[layers], self.v_buffer[layers]):
            bad |= ~torch.isfinite(k[idx]).flatten(1).all(1) | ~torch.isfinite(v[idx]).flatten(1).all(1)
        return bad.cpu()

    def set_kv(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v ([T, num_kv_heads, head_dim]) of layer ``layer`` at slots ``loc`` (int64 [T])."""
        self.k_buffer[layer][loc] = k.to(self.k_buffer[layer].dtype)
        self.v_buffer[layer][loc] = v.to(self.v_buffer[layer].dtype)


class ReqToTokenPool:
    """Table ``req_to_token[max_reqs, max_context_len]`` (int32) of KV slots per request row.

    A running request holds one row; position ``j`` of its sequence has its KV at slot
    ``req_to_token[row, j]``.

    The scheduler and the prefix cache read and write the host copy ``host``, so finding a
    request's slots never waits for the device; ``req_to_token`` is the table on the model's
    device that the attention kernels read, kept equal to ``host`` by ``write`` and ``write_spans``
    (one host-to-device copy per call). On a CPU device the two are one tensor.
    """

    def __init__(self, max_reqs: int, max_context_len: int, device: torch.device | str) -> None:
        self.host = torch.zeros((max_reqs, max_context_len), dtype=torch.int32)
        device = torch.device(device)
        self.req_to_token = self.host if device.type == "cpu" else torch.zeros_like(self.host, device=device)
        self._free_rows = list(range(max_reqs))

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Positions ``[start, start + len(slots))`` of ``row`` get ``slots`` (int [n], host)."""
        end = start + slots.numel()
        self.host[row, start:end] = slots
        if self.req_to_token is not self.host:
            self.req_to_token[row, start:end].copy_(self.host[row, start:end], non_blocking=True)

    def write_spans(self, spans: list[tuple[int, int, int]], slots: torch.Tensor) -> None:
        """For each ``(row, start, n)`` of ``spans`` in turn, positions ``[start, start + n)`` of
        ``row`` get the next ``n`` of ``slots`` (int [sum of n], host)."""
        if not spans:
            return
        index = span_index(spans)
        self.host[index[0], index[1]] = slots.to(torch.int32)
        if self.req_to_token is not self.host:
            packed = torch.cat([index, slots.to(torch.int64)[None, :]]).to(self.req_to_token.device, non_blocking=True)
            self.req_to_token[packed[0], packed[1]] = packed[2].to(torch.int32)

    def available_size(self) -> int:
        """Free request rows."""
        return len(self._free_rows)

    def alloc(self) -> int:
        """Take a free request row; raises ``KVPoolExhausted`` when none is left."""
        if not self._free_rows:
            raise KVPoolExhausted("no free request rows: too many running requests")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        """Return ``row`` to the free rows."""
        self._free_rows.append(row)


def span_index(spans: list[tuple[int, int, int]]) -> torch.Tensor:
    """int64 [2, sum of n]: the (row, position) of every table entry that the ``(row, start, n)``
    spans cover, span by span. A decode step's one-position spans are listed in Python (cheaper
    than tensor ops for a few dozen); any other step's are made by a fixed number of tensor ops,
    whatever the spans' count and lengths (Python lists as long as a 4 x 2048 prefill took 1.5 ms
    on a 2-core VM; a tensor op per span, 0.6 ms for 255 decodes beside one prefill chunk)."""
    if all(n == 1 for _, _, n in spans):
        return torch.tensor([[r for r, _, _ in spans], [p for _, p, _ in spans]], dtype=torch.int64)
    rows, starts, counts = torch.tensor(spans, dtype=torch.int64).T
    # entry i of the result lies in span s: its position is start[s] + (i - entries before span s)
    shift = torch.repeat_interleave(starts - (torch.cumsum(counts, 0) - counts), counts)
    return torch.stack([torch.repeat_interleave(rows, counts), torch.arange(shift.numel()) + shift])
