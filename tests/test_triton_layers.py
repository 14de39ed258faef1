"""The fused Triton layer kernels (RMSNorm with the residual add, RoPE in place with the KV-pool
write, SiLU-and-mul, KV store), run by Triton's CPU interpreter, against the torch forwards of the same layers (which
``test_model_parity`` pins to transformers), and whole engines on the Triton path against the
torch path for every architecture family.

fp32 and fp16 are compared exactly where the kernel makes the same roundings as torch (RoPE,
the residual add, SiLU-and-mul in fp16, the KV copy) and within float32 rounding where it
cannot (the norm's sum, in another order; ``exp``). bf16 is compared within one bf16 step per rounding the
kernel chains: the interpreter converts float32 to bf16 by truncation, where GPUs (and torch) round to nearest
(``test_interpreter_truncates_bf16`` shows it), so exact bf16 agreement is checked on the GPU
(``benches/gpu_check.py``)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (see test_triton_attention)

import pytest  # noqa: E402
import torch  # noqa: E402

from lmnb_engine.layers.kernel_op import KernelOp, use_triton_kernels  # noqa: E402
from lmnb_engine.layers.mlp import SiluAndMul  # noqa: E402
from lmnb_engine.layers.rmsnorm import RMSNorm  # noqa: E402
from lmnb_engine.layers.rotary import RotaryStoreKV  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _both(op: KernelOp, *args):
    """(torch result, Triton result) of ``op`` on clones of ``args`` (RoPE works in place)."""
    op.triton = False
    ref = op(*[a.clone() for a in args])
    op.triton = True
    try:
        got = op(*[a.clone() for a in args])
    finally:
        op.triton = False
    return ref, got


def _assert_match(got: torch.Tensor, ref: torch.Tensor, exact: bool, casts: int = 2, operands: float = 0.0) -> None:
    """``casts``: roundings to the activation dtype chained in the kernel; under the interpreter
    each bf16 one may land one step (2**-7 relative) off torch's, relative to the larger of the
    result and the rounded intermediates (``operands``: their magnitude, where a difference of
    products cancels)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if ref.dtype == torch.bfloat16:
        step = casts * 2**-7
        torch.testing.assert_close(got.float(), ref.float(), rtol=step, atol=max(step * operands, 1e-6))
    elif exact:
        assert torch.equal(got, ref), f"max difference {(got.float() - ref.float()).abs().max()}"
    else:
        torch.testing.assert_close(got, ref, rtol=2e-6 if ref.dtype == torch.float32 else 1e-3, atol=1e-6)


def test_interpreter_truncates_bf16():
    """Why bf16 is compared within one step here: 1 + 3/512 lies between bf16 1.0 and 1.0078125,
    nearer the latter; torch rounds to it, the interpreter's conversion truncates to 1.0."""
    import triton
    import triton.language as tl

    @triton.jit
    def to_bf16(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i).to(tl.bfloat16))

    x = torch.tensor([1 + 3 / 512, -(1 + 3 / 512)], dtype=torch.float32)
    y = torch.empty(2, dtype=torch.bfloat16)
    to_bf16[(1,)](x, y, N=2)
    assert x.to(torch.bfloat16).tolist() == [1.0078125, -1.0078125]
    assert y.tolist() == [1.0, -1.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_with_and_without_residual(dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-5).to(dtype)
    norm.weight.data = (1 + 0.3 * torch.randn(96, generator=g)).to(dtype)
    x = (3 * torch.randn(7, 96, generator=g)).to(dtype)
    residual = torch.randn(7, 96, generator=g).to(dtype)
    ref, got = _both(norm, x)
    _assert_match(got, ref, exact=False)
    (ref_n, ref_sum), (got_n, got_sum) = _both(norm, x, residual)
    _assert_match(got_sum, ref_sum, exact=True, casts=1)  # the new residual stream: one rounded add
    _assert_match(got_n, ref_n, exact=False, casts=3)
    torch.testing.assert_close(ref_sum, x + residual, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_per_head_on_strided_views(dtype):
    """Qwen3's q/k norm: [T, H, D] head views of a wider projection output (not contiguous)."""
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(32, 1e-6).to(dtype)
    norm.weight.data = (1 + 0.3 * torch.randn(32, generator=g)).to(dtype)
    wide = torch.randn(5, 3 * 32 * 2, generator=g).to(dtype)
    heads = wide[:, 32:128].view(5, 3, 32)
    assert not heads.is_contiguous()
    ref, got = _both(norm, heads)
    assert got.is_contiguous()
    _assert_match(got, ref, exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(dtype):
    g = torch.Generator().manual_seed(2)
    x = (4 * torch.randn(6, 2 * 300, generator=g)).to(dtype)  # 300: several column blocks, ragged end
    ref, got = _both(SiluAndMul(), x)
    _assert_match(got, ref, exact=dtype == torch.float16)
    gate, up = x.double().split(300, dim=-1)
    torch.testing.assert_close(got.double(), gate * torch.sigmoid(gate) * up, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("dtype, pool_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
                         ids=str)
def test_rotary_in_place_on_qkv_views_writes_kv_into_the_pool(dtype, pool_dtype):
    """q, k, v as views of one fused qkv output (GQA: 4 query heads, 2 KV heads), as the model
    splits them; the Triton op rotates q and k in place, leaves v alone, and writes the rotated k
    and v into layer 1's pool buffers at ``loc`` (cast to the pool's dtype) and nowhere else."""
    from lmnb_engine.kv_pool import TokenToKVPool
    from lmnb_engine.layers.rotary import apply_rotary

    g = torch.Generator().manual_seed(3)
    T, d = 9, 24
    qkv = torch.randn(T, (4 + 2 + 2) * d, generator=g).to(dtype)
    positions = torch.tensor([0, 1, 2, 7, 30, 31, 100, 511, 4000], dtype=torch.float32)
    freqs = positions[:, None] * (10000.0 ** (-torch.arange(0, d, 2) / d))[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q, k, v = qkv.split([4 * d, 2 * d, 2 * d], dim=-1)
    q, k, v = q.view(T, 4, d), k.view(T, 2, d), v.view(T, 2, d)
    v_before = v.clone()
    magnitude = float(qkv.abs().max())  # of the products that cancel in x1*c - x2*s
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    pool = TokenToKVPool(40, 2, 2, d, pool_dtype, "cpu")
    loc = torch.tensor([5, 39, 1, 17, 2, 30, 8, 9, 22])
    op = RotaryStoreKV()
    op.triton = True
    got_q, got_k = op(q, k, v, cos, sin, pool, 1, loc)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    _assert_match(got_q, want_q, exact=True, operands=magnitude)
    _assert_match(got_k, want_k, exact=True, operands=magnitude)
    assert torch.equal(v, v_before)
    want_k_pool, want_v_pool = torch.zeros_like(pool.k_buffer[1]), torch.zeros_like(pool.v_buffer[1])
    want_k_pool[loc], want_v_pool[loc] = got_k.to(pool_dtype), v_before.to(pool_dtype)
    assert torch.equal(pool.k_buffer[1], want_k_pool) and torch.equal(pool.v_buffer[1], want_v_pool)
    assert not pool.k_buffer[0].any() and not pool.v_buffer[0].any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_store_kv_writes_the_slots_of_strided_views(dtype):
    from lmnb_engine.attention.triton_ops import store_kv

    g = torch.Generator().manual_seed(4)
    T, heads, d = 6, 3, 20
    kv = torch.randn(T, 2 * heads * d + 8, generator=g).to(dtype)
    k, v = kv[:, : heads * d].view(T, heads, d), kv[:, heads * d : 2 * heads * d].view(T, heads, d)
    k_pool = torch.zeros(40, heads, d, dtype=dtype)
    v_pool = torch.zeros(40, heads, d, dtype=dtype)
    loc = torch.tensor([5, 39, 1, 17, 2, 30])
    store_kv(k, v, k_pool, v_pool, loc)
    want_k, want_v = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    want_k[loc], want_v[loc] = k, v
    assert torch.equal(k_pool, want_k) and torch.equal(v_pool, want_v)
    with pytest.raises(ValueError, match="do not match"):
        store_kv(k, v, k_pool[:, :2], v_pool, loc)


def test_bad_inputs_name_the_problem():
    from lmnb_engine.layers.triton_ops import rms_norm, rotary_store_kv_, silu_and_mul

    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(torch.randn(4, 8).t(), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="weight shape"):
        rms_norm(torch.randn(4, 8), torch.ones(5), 1e-5)
    with pytest.raises(ValueError, match=r"\[T, 2\*I\]"):
        silu_and_mul(torch.randn(4, 7))
    q, k, pool = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.zeros(10, 2, 8)
    cos = torch.randn(3, 8)
    with pytest.raises(ValueError, match="do not match"):
        rotary_store_kv_(q, k, k[:2], cos, cos, pool, pool, torch.arange(3))
    with pytest.raises(ValueError, match="even head_dim"):
        rotary_store_kv_(q[..., :7], k[..., :7], k[..., :7], cos[:, :7], cos[:, :7], pool[..., :7], pool[..., :7],
                         torch.arange(3))


def test_runner_switches_layers_with_the_backend(tiny_llama):
    """Triton attention -> every KernelOp on Triton; torch attention -> all back on torch."""
    from lmnb_engine.model_loader import load_model
    from lmnb_engine.model_runner import ModelRunner

    loaded = load_model(str(tiny_llama), device="cpu")
    ops = [m for m in loaded.model.modules() if isinstance(m, KernelOp)]
    layers = loaded.config.num_layers
    assert len(ops) == 4 * layers + 1  # 2 norms, RoPE, SiLU-and-mul per layer; the final norm
    ModelRunner(loaded, max_total_tokens=64, attention_backend="triton")
    assert all(m.triton for m in ops)
    ModelRunner(loaded, max_total_tokens=64, attention_backend="torch")
    assert not any(m.triton for m in ops)
    assert use_triton_kernels(loaded.model, True) == len(ops)


@pytest.mark.parametrize("arch,dtype", [("llama", "float32"), ("qwen2", "float32"), ("qwen3", "float32"),
                                        ("llama", "bfloat16")])
def test_engine_greedy_same_on_triton_path(tiny_checkpoint_factory, arch, dtype):
    """Whole engines: torch path vs Triton path (attention + fused layers, interpreted): same
    greedy tokens, logprobs within float32 rounding (bf16: within bf16 rounding), with radix hits
    and decode steps. qwen2 has qkv biases, qwen3 the per-head q/k norms; bf16 checks that the
    interpreted attention takes its dots in float32 (its bf16 dots multiply raw bits)."""
    from lmnb_engine import Engine, SamplingParams

    path = tiny_checkpoint_factory(arch, num_hidden_layers=2)
    params = SamplingParams(max_new_tokens=5, temperature=0.0, return_logprob=True)
    outputs = {}
    for name in ("torch", "triton"):
        with Engine(str(path), max_total_tokens=1024, attention_backend=name, dtype=dtype) as eng:
            base = eng.encode("a red fox and a blue bird sat on")
            prompts = [base + eng.encode(t, add_special_tokens=False) for t in (" the hill", " a wall")]
            eng.generate(base, SamplingParams(max_new_tokens=0))
            results = eng.generate(prompts, params)
            assert all(r.meta.cached_tokens >= len(base) - 1 for r in results)
            outputs[name] = results
    # bf16: the peaked test logits (magnitude ~10) carry ~2**-8 relative rounding each, and the
    # interpreter truncates where torch rounds
    tol = 1e-4 if dtype == "float32" else 0.3
    for ref, got in zip(outputs["torch"], outputs["triton"]):
        assert got.token_ids == ref.token_ids
        diffs = [abs(a.logprob - b.logprob) for a, b in zip(ref.logprobs, got.logprobs)]
        assert max(diffs) < tol, diffs


def test_the_runner_starts_its_backend_and_pools_with_the_model_device_current(tiny_llama, monkeypatch):
    """Triton launches on CUDA's current device, not the tensors' one: a model on cuda:1 ran its
    backend's start-up check and graph capture on cuda:0 (the main thread's current device)."""
    import contextlib

    import lmnb_engine.model_runner as mr
    from lmnb_engine.model_loader import load_model

    events = []

    @contextlib.contextmanager
    def recording(device):
        events.append(("enter", str(device)))
        yield
        events.append(("exit", str(device)))

    class RecordingPool(mr.TokenToKVPool):
        def __init__(self, *args, **kwargs):
            events.append("pool")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(mr, "_current_device", recording)
    monkeypatch.setattr(mr, "TokenToKVPool", RecordingPool)
    mr.ModelRunner(load_model(str(tiny_llama), device="cpu"), max_total_tokens=64, attention_backend="triton")
    assert events == [("enter", "cpu"), "pool", ("exit", "cpu")]
    monkeypatch.undo()
    assert isinstance(mr._current_device(torch.device("cuda:1")), torch.cuda.device)
    assert mr._current_device(torch.device("cuda:1")).idx == 1
    assert isinstance(mr._current_device(torch.device("cpu")), contextlib.nullcontext)
