"""Triton attention kernels, run by Triton's CPU interpreter (``TRITON_INTERPRET=1``), against
the torch backend (padded SDPA over the same pool) and a float64 per-request softmax: extend
over cached prefixes of several lengths with ragged new tokens, GQA and MHA, decode with many
key splits (empty splits included), and a whole engine's greedy output with each backend."""

from __future__ import annotations

import os

# Triton reads TRITON_INTERPRET when it decorates a kernel (its own library functions included, at
# `import triton`), so it is set before anything imports triton and left set for this process.
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from lmnb_engine.attention import select_attention_backend  # noqa: E402
from lmnb_engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from lmnb_engine.forward_batch import ForwardMode  # noqa: E402
from helpers_attention import clone_pool, naive_attention, run_backend, setup_batch  # noqa: E402


def _ops():
    """The kernel modules, decorated as interpreted functions."""
    from triton.runtime.interpreter import InterpretedFunction

    from lmnb_engine.attention import triton_backend
    from lmnb_engine.attention.triton_ops import decode_attention, extend_attention

    assert isinstance(extend_attention._extend_kernel, InterpretedFunction), (
        "triton was imported before TRITON_INTERPRET=1 was set; run this test file in its own process"
    )
    return decode_attention, extend_attention, triton_backend


DECODE_OPS, EXTEND_OPS, BACKEND = _ops()


EXTEND_CASES = {
    # name: (prefix_lens, extend_lens, Hq, Hkv, head_dim)
    "prefixes-0-1-15-16-17-40-gqa2": ([0, 1, 15, 16, 17, 40], [5, 16, 1, 33, 2, 9], 4, 2, 32),
    "gqa4-long-new-part": ([3, 0], [47, 20], 4, 1, 16),
    "mha-odd-head-dim": ([9, 31, 0], [12, 1, 3], 2, 2, 24),
    "single-cold-prefill": ([0], [37], 4, 2, 16),
}


@pytest.mark.parametrize("case", EXTEND_CASES)
def test_extend_matches_torch_backend(case):
    prefix, ext, hq, hkv, d = EXTEND_CASES[case]
    pool, batch, q, k, v = setup_batch(prefix, ext, hq, hkv, d)
    twin = clone_pool(pool)
    out = run_backend(BACKEND.TritonAttentionBackend(), pool, batch, q, k, v)
    ref = run_backend(TorchAttentionBackend(), twin, batch, q, k, v)
    assert out.shape == ref.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-5, rtol=1e-4)
    # the new tokens' K/V went to the pool at out_cache_loc, as the torch backend put them
    assert torch.equal(pool.k_buffer[0], twin.k_buffer[0]) and torch.equal(pool.v_buffer[0], twin.v_buffer[0])


# GPU-shaped tiles: a query tile of several key blocks, so a tile's causal range has whole blocks
# (unmasked) before its diagonal blocks (masked), as 128x64 tiles do on a GPU; tiles are taken
# heaviest first. Lengths straddle the block and tile edges.
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (64, 16), (32, 32)])
def test_extend_with_gpu_shaped_tiles_matches_float64(block_m, block_n):
    config = EXTEND_OPS.ExtendConfig(block_m, block_n, 4, 2)
    for prefix, ext in (([0, 17, 48, 5], [100, 33, 64, 1]), ([31, 0], [15, 129])):
        pool, batch, q, k, v = setup_batch(prefix, ext, 4, 2, 16, seed=5)
        pool.set_kv(0, batch.out_cache_loc, k, v)
        out = torch.full(q.shape, float("nan"))
        starts = torch.cumsum(torch.tensor([0] + ext[:-1]), 0)
        EXTEND_OPS.extend_attention_fwd(q, k, v, out, pool.k_buffer[0], pool.v_buffer[0], batch.req_to_token,
                                        batch.req_pool_indices, torch.tensor(prefix), torch.tensor(ext), starts,
                                        max(ext), 16**-0.5, config=config)
        torch.testing.assert_close(out.double(), naive_attention(pool, batch, q, k, v), atol=2e-5, rtol=1e-4)


def test_extend_refuses_a_tile_that_is_not_whole_key_blocks():
    pool, batch, q, k, v = setup_batch([0], [4], 2, 2, 16)
    with pytest.raises(ValueError, match="block_m must be a multiple of block_n"):
        EXTEND_OPS.extend_attention_fwd(q, k, v, torch.empty_like(q), pool.k_buffer[0], pool.v_buffer[0],
                                        batch.req_to_token, batch.req_pool_indices, torch.tensor([0]),
                                        torch.tensor([4]), torch.tensor([0]), 4, 0.25,
                                        config=EXTEND_OPS.ExtendConfig(48, 32, 4, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_extend_and_decode_match_float64(dtype):
    """bf16 included: the interpreter's dot of bf16 blocks multiplies raw bits, so interpreted
    kernels take their dots in float32 (``triton_support.f32_dot``)."""
    tol = 3e-3 if dtype == torch.float16 else 2e-2
    for prefix, ext in (([6, 18], [11, 4]), ([6, 30, 0], [1, 1, 1])):
        pool, batch, q, k, v = setup_batch(prefix, ext, 4, 2, 16, dtype=dtype, seed=3)
        twin = clone_pool(pool)
        out = run_backend(BACKEND.TritonAttentionBackend(max_kv_splits=4, min_split_tokens=4), pool, batch, q, k, v)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=tol, rtol=tol)


DECODE_CASES = {
    # name: (prefix_lens = seq_len - 1, Hq, Hkv, head_dim)
    "gqa4-many-splits": ([0, 1, 16, 63, 99], 8, 2, 32),
    "mha": ([4, 40, 70], 2, 2, 16),
    "gqa-group-8-one-kv-head": ([25, 50], 8, 1, 16),
}


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_matches_torch_backend(case):
    prefix, hq, hkv, d = DECODE_CASES[case]
    pool, batch, q, k, v = setup_batch(prefix, [1] * len(prefix), hq, hkv, d, seed=1)
    assert batch.mode is ForwardMode.DECODE
    twin = clone_pool(pool)
    # up to 8 splits of >= 4 keys; a grid sized for a 132-SM GPU, so small batches split
    backend = BACKEND.TritonAttentionBackend(max_kv_splits=8, min_split_tokens=4, sm_count=132)
    out = run_backend(backend, pool, batch, q, k, v)
    expected_splits = [min(-(-(p + 1) // 4), backend._grid_splits) for p in prefix]
    assert backend._num_splits.tolist() == expected_splits and max(expected_splits) > 1
    ref = run_backend(TorchAttentionBackend(), twin, batch, q, k, v)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-5, rtol=1e-4)
    assert torch.equal(pool.k_buffer[0], twin.k_buffer[0])


def test_decode_split_grid_aims_at_two_programs_per_sm():
    """132 SMs: Llama-2-7B at batch 1 (32 KV heads) needs ceil(264 / 32) = 9 splits; at batch 32,
    1024 programs already fill the GPU (1); 2 requests x 8 KV heads would want 17, capped at 16."""
    grid = BACKEND.decode_split_grid
    assert [grid(1, 32, 1, 132, 16), grid(32, 32, 1, 132, 16), grid(2, 8, 1, 132, 16)] == [9, 1, 16]


def test_decode_kernel_with_empty_splits_and_one_split():
    """seq 5 in 4 splits of 2 leaves the last split empty; seq 1 in 8 splits leaves 7 empty."""
    prefix = [4, 0, 30]
    pool, batch, q, k, v = setup_batch(prefix, [1, 1, 1], 4, 2, 16, seed=2)
    pool.set_kv(0, batch.out_cache_loc, k, v)
    out = torch.full(q.shape, float("nan"))
    splits = torch.tensor([4, 8, 1], dtype=torch.int32)
    DECODE_OPS.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], out, batch.req_to_token,
                                    batch.req_pool_indices, batch.seq_lens, splits, 8, 16**-0.5)
    ref = naive_attention(pool, batch, q, k, v)  # pool already holds k, v; the reference reads them from k, v
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_with_one_split_writes_the_output_without_the_merge(dtype):
    """A grid of one split (``max_kv_splits == 1``, a batch that fills the GPU): the split kernel
    writes ``out`` and leaves the workspace alone; the values are exactly those of the two-kernel
    path when every request has one split (merging one slice multiplies it by exp(0) = 1).
    Sequences of 32 and 64 fill whole 16-key blocks, 5 and 1 part of one."""
    prefix = [4, 0, 70, 31, 63]
    B = len(prefix)
    pool, batch, q, k, v = setup_batch(prefix, [1] * B, 8, 2, 16, dtype=dtype, seed=8)
    pool.set_kv(0, batch.out_cache_loc, k, v)
    one = torch.ones(B, dtype=torch.int32)
    args = (pool.k_buffer[0], pool.v_buffer[0])
    table = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, one)
    workspace = DECODE_OPS.decode_workspace(B, 8, 16, 2, "cpu")
    for t in workspace:
        t.fill_(float("nan"))
    direct = DECODE_OPS.decode_attention_fwd(q, *args, torch.full_like(q, float("nan")), *table, 1, 16**-0.5,
                                             workspace=workspace)
    assert all(t.isnan().all() for t in workspace)
    merged = DECODE_OPS.decode_attention_fwd(q, *args, torch.full_like(q, float("nan")), *table, 2, 16**-0.5,
                                             workspace=workspace)
    assert torch.equal(direct, merged)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(direct.double(), naive_attention(pool, batch, q, k, v), atol=tol, rtol=tol)


@pytest.mark.parametrize("block_n", [16, 64])
def test_decode_with_other_block_sizes_matches_float64(block_n):
    """The tuner's configurations: 64-key blocks (the GPU's) over splits shorter than a block."""
    prefix = [4, 90, 200]
    pool, batch, q, k, v = setup_batch(prefix, [1, 1, 1], 8, 2, 16, seed=6)
    pool.set_kv(0, batch.out_cache_loc, k, v)
    out = torch.full(q.shape, float("nan"))
    DECODE_OPS.decode_attention_fwd(q, pool.k_buffer[0], pool.v_buffer[0], out, batch.req_to_token,
                                    batch.req_pool_indices, batch.seq_lens, torch.tensor([1, 3, 5]), 5, 16**-0.5,
                                    config=DECODE_OPS.DecodeConfig(block_n, 4, 1))
    torch.testing.assert_close(out.double(), naive_attention(pool, batch, q, k, v), atol=2e-5, rtol=1e-4)


def test_decode_larger_than_reserved_keeps_the_reserved_workspace():
    """CUDA graphs are captured over the workspace ``reserve_decode`` made; an eager decode of a
    larger batch (above ``cuda_graph_max_bs``) must not replace it, or the graphs' later replays
    would write their partial outputs into freed memory."""
    prefix = [4, 40, 17, 9]
    pool, batch, q, k, v = setup_batch(prefix, [1] * len(prefix), 4, 2, 16, seed=4)
    twin = clone_pool(pool)
    backend = BACKEND.TritonAttentionBackend(max_kv_splits=4, min_split_tokens=4)
    backend.reserve_decode(2, 4, 16, "cpu")  # as CudaGraphRunner.capture does for its largest graph
    reserved = backend._workspace
    out = run_backend(backend, pool, batch, q, k, v)
    assert backend._workspace is reserved
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-5, rtol=1e-4)


def test_selector_picks_torch_on_cpu_and_refuses_bad_names(monkeypatch):
    monkeypatch.delenv("LMNB_ATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert isinstance(select_attention_backend("cpu"), TorchAttentionBackend)
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        select_attention_backend("cpu", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert isinstance(select_attention_backend("cpu", "triton"), BACKEND.TritonAttentionBackend)  # interpreted
    with pytest.raises(ValueError, match="unknown attention backend 'flash'; choose"):
        select_attention_backend("cpu", "flash")
    monkeypatch.setenv("LMNB_ATTENTION_BACKEND", "garbage")  # a name from the environment says so
    with pytest.raises(ValueError, match="'garbage' .from the environment variable LMNB_ATTENTION_BACKEND.; choose"):
        select_attention_backend("cpu")
    assert isinstance(select_attention_backend("cpu", "torch"), TorchAttentionBackend)  # an explicit name wins


def test_interpreting_asked_for_after_triton_was_imported_is_refused():
    """Triton decides at import whether its library runs interpreted: TRITON_INTERPRET set later
    would fail inside the first forward; the selector says what to do instead."""
    import subprocess
    import sys

    code = ("import os, triton; os.environ['TRITON_INTERPRET'] = '1'\n"
            "from lmnb_engine.attention import select_attention_backend\n"
            "select_attention_backend('cpu', 'triton')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "set after triton was imported" in proc.stderr


def test_engine_greedy_output_same_with_triton_backend(tiny_llama, monkeypatch):
    """Prompts sharing a prefix (radix hits: extend after a cached prefix), then decode steps."""
    from lmnb_engine import Engine, SamplingParams

    monkeypatch.setenv("TRITON_INTERPRET", "1")

    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    outputs = {}
    for name in ("torch", "triton"):
        with Engine(str(tiny_llama), max_total_tokens=2048, attention_backend=name) as eng:
            base = eng.encode("the cat is red and the dog is blue, what color")
            prompts = [base + eng.encode(t, add_special_tokens=False) for t in (" is the cat", " is the dog?")]
            eng.generate(base, SamplingParams(max_new_tokens=0))  # cache the shared prefix first
            results = eng.generate(prompts, params)
            assert all(r.meta.cached_tokens >= len(base) - 1 for r in results)
            outputs[name] = [r.token_ids for r in results]
    assert outputs["triton"] == outputs["torch"]
