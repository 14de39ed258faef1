"""Attention-backend test helpers: a KV pool with random contents and a batch over it, and a
float64 reference (softmax per request and head, written out, not through any backend)."""

from __future__ import annotations

import torch

from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.kv_pool import TokenToKVPool


def setup_batch(prefix_lens, extend_lens, hq, hkv, d, dtype=torch.float32, seed=0):
    """A pool with random K/V, each request's positions on random slots, and its batch tensors."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    size = sum(seq_lens) + 7
    pool = TokenToKVPool(size, 1, hkv, d, dtype, "cpu")
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape, generator=g))
    pool.v_buffer[0].copy_(torch.randn(pool.v_buffer[0].shape, generator=g))
    table = torch.zeros((len(seq_lens) + 2, max(seq_lens) + 5), dtype=torch.int32)
    slots = torch.randperm(size, generator=g) + 1  # slot 0 is the padding slot
    rows = list(range(len(seq_lens)))[::-1]  # rows out of order, as a busy pool hands them out
    off, new_slots = 0, []
    for row, p, n in zip(rows, prefix_lens, seq_lens):
        table[row, :n] = slots[off : off + n].int()
        new_slots.append(slots[off + p : off + n])
        off += n
    T = sum(extend_lens)
    mode = ForwardMode.DECODE if all(e == 1 for e in extend_lens) else ForwardMode.EXTEND
    batch = ForwardBatch.build(mode, [0] * T, torch.cat(new_slots), table, rows, list(prefix_lens), list(extend_lens))
    # q, k, v as views of one fused projection output, like the model's split of qkv_proj.
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return pool, batch, q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)


def clone_pool(pool: TokenToKVPool) -> TokenToKVPool:
    twin = TokenToKVPool.__new__(TokenToKVPool)
    twin.__dict__.update(pool.__dict__)
    twin.k_buffer = [b.clone() for b in pool.k_buffer]
    twin.v_buffer = [b.clone() for b in pool.v_buffer]
    return twin


def run_backend(backend, pool, batch, q, k, v):
    backend.init_forward(batch)
    return backend.forward(q, k, v, 0, batch, pool, q.shape[-1] ** -0.5)


def naive_attention(pool, batch, q, k, v):
    """float64 softmax(q k^T) v per request and head: prefix keys from the pool, then the new ones."""
    hq, hkv = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(batch.batch_size):
        p, e, s = batch.extend_prefix_lens_cpu[i], batch.extend_seq_lens_cpu[i], int(batch.extend_start_loc[i])
        slots = batch.req_to_token[batch.req_pool_indices[i], :p].long()
        keys = torch.cat([pool.k_buffer[0][slots], k[s : s + e]]).double()
        vals = torch.cat([pool.v_buffer[0][slots], v[s : s + e]]).double()
        for h in range(hq):
            scores = q[s : s + e, h].double() @ keys[:, h // (hq // hkv)].T * q.shape[-1] ** -0.5
            visible = torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]
            out[s : s + e, h] = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vals[:, h // (hq // hkv)]
    return out
