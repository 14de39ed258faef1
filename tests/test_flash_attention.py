"""The flash-attn backend, with flash-attn's varlen contract played by a stand-in module.

flash-attn has no CPU build, so ``flash_attn_varlen_func`` is written out here from its documented
contract (FlashAttention-2 >= 2.1: packed ``[total, heads, dim]`` tensors, int32 contiguous
``cu_seqlens``, fp16/bf16 only, GQA by head groups, a causal mask aligned at the bottom right),
in float64, checking the arguments the real one checks. That tests everything lmnb does around
the call: the packed metadata, the prefix gather, the KV write, when flash-attn runs and when
the Triton kernels do, and the start-up check that refuses a build with the old top-left mask.
The decode and KV-store kernels run under Triton's interpreter.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton (see test_triton_attention)

import importlib.machinery  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers_attention import clone_pool, naive_attention, run_backend, setup_batch  # noqa: E402

from lmnb_engine.attention import select_attention_backend  # noqa: E402
from lmnb_engine.attention.flash_backend import FlashAttentionBackend, FlashAttn, load_flash_attn  # noqa: E402
from lmnb_engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402


def make_varlen(calls: list, top_left: bool = False):
    """``flash_attn_varlen_func`` per its contract; ``top_left`` = flash-attn < 2.1's mask."""

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False):
        for t in (cu_seqlens_q, cu_seqlens_k):
            assert t.dtype == torch.int32 and t.is_contiguous() and t.dim() == 1
        assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        assert q.shape[0] == cu_seqlens_q[-1] and k.shape[0] == v.shape[0] == cu_seqlens_k[-1]
        assert q.shape[1] % k.shape[1] == 0 and dropout_p == 0.0
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        lq, lk = [b - a for a, b in zip(cq, cq[1:])], [b - a for a, b in zip(ck, ck[1:])]
        assert max(lq) == max_seqlen_q and max(lk) == max_seqlen_k
        calls.append({"q_lens": lq, "k_lens": lk})
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        group = q.shape[1] // k.shape[1]
        out = torch.empty(q.shape, dtype=torch.float64)
        for i, (nq, nk) in enumerate(zip(lq, lk)):
            qi = q[cq[i]:cq[i + 1]].double().transpose(0, 1)  # [H, nq, D]
            ki, vi = (x[ck[i]:ck[i + 1]].double().repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))
            scores = qi @ ki.transpose(1, 2) * scale
            if causal:
                shift = 0 if top_left else nk - nq
                keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + shift
                scores = scores.masked_fill(~keep, float("-inf"))
            out[cq[i]:cq[i + 1]] = (scores.softmax(-1) @ vi).transpose(0, 1)
        return out.to(q.dtype)

    return flash_attn_varlen_func


def install(monkeypatch, name: str, fn, version: str = "2.7.4") -> None:
    """Put a module ``name`` with ``flash_attn_varlen_func = fn`` where importlib finds it."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__version__ = version
    mod.flash_attn_varlen_func = fn
    monkeypatch.setitem(sys.modules, name, mod)


def flash_backend(calls, dtype, hq, hkv, d, **kw) -> FlashAttentionBackend:
    backend = FlashAttentionBackend(FlashAttn(make_varlen(calls, **kw), "stand-in"), strict=True)
    backend.prepare(hq, hkv, d, dtype, "cpu")
    calls.clear()  # the start-up check's call
    return backend


CASES = {
    # name: (prefix_lens, extend_lens, Hq, Hkv, head_dim)
    "cached-prefixes-gqa2": ([0, 1, 15, 16, 40], [5, 16, 1, 33, 9], 4, 2, 32),
    "mixed-decode-rows-gqa4": ([3, 20, 7], [12, 1, 1], 8, 2, 16),
    "cold-batch-mha": ([0, 0], [17, 4], 2, 2, 24),
    "single-cold-prefill": ([0], [37], 4, 1, 16),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_extend_runs_on_flash_attn_and_matches_reference(case, dtype):
    prefix, ext, hq, hkv, d = CASES[case]
    pool, batch, q, k, v = setup_batch(prefix, ext, hq, hkv, d, dtype=dtype, seed=2)
    twin = clone_pool(pool)
    calls: list = []
    out = run_backend(flash_backend(calls, dtype, hq, hkv, d), pool, batch, q, k, v)
    run_backend(TorchAttentionBackend(), twin, batch, q, k, v)
    tol = 3e-3 if dtype == torch.float16 else 2e-2
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=tol, rtol=tol)
    # one flash-attn call over whole sequences: keys gathered from the pool when there is a
    # prefix, the new tokens alone for a cold batch (their lengths are the same then)
    assert calls == [{"q_lens": ext, "k_lens": [p + e for p, e in zip(prefix, ext)]}]
    # the new K/V are in the pool at out_cache_loc, exactly as the torch backend writes them
    assert torch.equal(pool.k_buffer[0], twin.k_buffer[0]) and torch.equal(pool.v_buffer[0], twin.v_buffer[0])


def test_decode_and_float32_stay_on_triton():
    calls: list = []
    pool, batch, q, k, v = setup_batch([4, 40, 9], [1, 1, 1], 4, 2, 16, dtype=torch.bfloat16, seed=1)
    twin = clone_pool(pool)
    out = run_backend(flash_backend(calls, torch.bfloat16, 4, 2, 16), pool, batch, q, k, v)
    assert calls == []  # split-KV Triton decode, which reads the pool in place
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)

    backend = FlashAttentionBackend(FlashAttn(make_varlen(calls), "stand-in"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an fp32 model is not a fault: no warning, Triton runs it
        backend.prepare(4, 2, 16, torch.float32, "cpu")
    assert not backend.active and calls == []
    pool, batch, q, k, v = setup_batch([6], [9], 4, 2, 16, seed=4)
    twin = clone_pool(pool)
    out = run_backend(backend, pool, batch, q, k, v)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-5, rtol=1e-4)
    with pytest.raises(RuntimeError, match="float16/bfloat16 models, not float32.*attention_backend='triton'"):
        FlashAttentionBackend(FlashAttn(make_varlen(calls), "stand-in"), strict=True).prepare(
            4, 2, 16, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="head_dim <= 256"):
        FlashAttentionBackend(FlashAttn(make_varlen(calls), "stand-in"), strict=True).prepare(
            2, 2, 512, torch.float16, "cpu")


def test_start_up_check_refuses_a_top_left_causal_mask():
    """flash-attn < 2.1 aligned the causal mask at the top left: right for prefills, silently
    wrong after a cached prefix. The check finds it; by name it is an error, under "auto" a
    warning and the Triton kernels, whose output is then right."""
    calls: list = []
    old = FlashAttn(make_varlen(calls, top_left=True), "flash_attn 2.0.9")
    with pytest.raises(RuntimeError, match=r"flash_attn 2\.0\.9 .*differs from the reference.*top left"):
        FlashAttentionBackend(old, strict=True).prepare(4, 2, 16, torch.bfloat16, "cpu")
    backend = FlashAttentionBackend(old)
    with pytest.warns(RuntimeWarning, match="the Triton kernels run it instead"):
        backend.prepare(4, 2, 16, torch.bfloat16, "cpu")
    assert not backend.active
    calls.clear()
    pool, batch, q, k, v = setup_batch([8, 0], [5, 6], 4, 2, 16, dtype=torch.bfloat16, seed=5)
    twin = clone_pool(pool)
    out = run_backend(backend, pool, batch, q, k, v)
    assert calls == []
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)


def test_start_up_check_reports_an_incompatible_api():
    def varlen_without_keywords(q, k, v, cu_q, cu_k, max_q, max_k):
        raise AssertionError("not reached")

    with pytest.raises(RuntimeError, match=r"flash_attn_varlen_func failed \(TypeError"):
        FlashAttentionBackend(FlashAttn(varlen_without_keywords, "odd"), strict=True).prepare(
            4, 2, 16, torch.float16, "cpu")


def test_loading_prefers_flash_attention_3_and_skips_a_broken_build(monkeypatch, tmp_path):
    broken = tmp_path / "flash_attn_interface"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c10...')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list = []
    install(monkeypatch, "flash_attn", make_varlen(calls))
    loaded = load_flash_attn()
    assert loaded.label == "flash_attn 2.7.4"  # the broken FlashAttention-3 build was skipped
    monkeypatch.delitem(sys.modules, "flash_attn")
    assert load_flash_attn() is None
    install(monkeypatch, "flash_attn_interface", make_varlen(calls), version="3.0.0b1")
    install(monkeypatch, "flash_attn", make_varlen(calls))
    assert load_flash_attn().label == "flash_attn_interface 3.0.0b1"
    assert load_flash_attn(("flash_attn",)).label == "flash_attn 2.7.4"


def test_selector(monkeypatch):
    from lmnb_engine.attention import selector

    with pytest.raises(ImportError, match=r"needs flash-attn.*lmnb\[flash\].*attention_backend='triton'"):
        select_attention_backend("cpu", "flash_attn")
    install(monkeypatch, "flash_attn", make_varlen([]))
    backend = select_attention_backend("cpu", "flash_attn")
    assert isinstance(backend, FlashAttentionBackend) and backend.strict and backend.triton_kernels
    assert backend.supports_cuda_graph  # decode is the Triton kernel's
    assert isinstance(select_attention_backend("cpu", "auto"), TorchAttentionBackend)  # auto: CUDA only
    for cap, modules in (((9, 0), ("flash_attn_interface", "flash_attn")), ((8, 6), ("flash_attn",)), ((7, 5), ())):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev, cap=cap: cap)
        assert selector.flash_modules(torch.device("cuda", 0)) == modules


def test_engine_greedy_output_same_as_torch_path(tiny_checkpoint_factory, monkeypatch):
    """bf16 engines: prompts sharing a cached prefix, then decode steps; flash-attn runs the
    extends (with a prefix gather for the cache hits), Triton the decodes."""
    from lmnb_engine import Engine, SamplingParams

    calls: list = []
    install(monkeypatch, "flash_attn", make_varlen(calls))
    path = tiny_checkpoint_factory("llama", num_hidden_layers=2)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    outputs = {}
    for name in ("torch", "flash_attn"):
        with Engine(str(path), max_total_tokens=1024, attention_backend=name, dtype="bfloat16") as eng:
            assert isinstance(eng.runner.attn, FlashAttentionBackend) == (name == "flash_attn")
            base = eng.encode("a red fox and a blue bird sat on")
            prompts = [base + eng.encode(t, add_special_tokens=False) for t in (" the hill", " a wall")]
            eng.generate(base, SamplingParams(max_new_tokens=0))
            results = eng.generate(prompts, params)
            assert all(r.meta.cached_tokens >= len(base) - 1 for r in results)
            outputs[name] = [r.token_ids for r in results]
    assert outputs["flash_attn"] == outputs["torch"]
    assert any(sum(c["k_lens"]) > sum(c["q_lens"]) for c in calls)  # an extend after a cached prefix
