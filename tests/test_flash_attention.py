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
from lmnb_engine.attention.flash_backend import FlashAttentionBackend, FlashAttn, find_flash_attn  # noqa: E402
from lmnb_engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402


def make_varlen(calls: list, top_left: bool = False, contiguous_only: bool = False, broken: tuple = ()):
    """``flash_attn_varlen_func`` per its contract; ``top_left`` = flash-attn < 2.1's mask;
    ``contiguous_only`` = a build that refuses strided q/k/v; raises while ``broken`` is non-empty."""

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, causal=False):
        if broken:
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        for t in (cu_seqlens_q, cu_seqlens_k):
            assert t.dtype == torch.int32 and t.is_contiguous() and t.dim() == 1
        assert q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype == q.dtype
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        if contiguous_only and not all(x.is_contiguous() for x in (q, k, v)):
            raise RuntimeError("q, k, v must be contiguous")
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


def stand_in(calls, label="stand-in", **kw) -> FlashAttn:
    return FlashAttn(make_varlen(calls, **kw), label)


def flash_backend(calls, dtype, hq, hkv, d, **kw) -> FlashAttentionBackend:
    backend = FlashAttentionBackend([stand_in(calls, **kw)], strict=True)
    backend.prepare(hq, hkv, d, dtype, "cpu")
    calls.clear()  # the start-up check's calls
    return backend


CASES = {
    # name: (prefix_lens, extend_lens, Hq, Hkv, head_dim). flash-attn runs an extend whose new
    # tokens are at least as many as its cached ones; the others stay on the Triton kernel.
    "cached-prefixes-gqa2": ([0, 1, 15, 16], [5, 16, 1, 33], 4, 2, 32),
    "cold-batch-mha": ([0, 0], [17, 4], 2, 2, 24),
    "single-cold-prefill": ([0], [37], 4, 1, 16),
    "as-many-cached-as-new": ([4, 0], [2, 2], 4, 2, 16),  # the boundary: a prompt's second chunk
    "prefix-dominated-gqa2": ([0, 1, 15, 16, 40], [5, 16, 1, 33, 9], 4, 2, 32),
    "mixed-decode-rows-gqa4": ([3, 20, 7], [12, 1, 1], 8, 2, 16),
}


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a contract violation would otherwise fall back to Triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_extend_matches_reference_on_flash_attn_or_triton(case, dtype):
    prefix, ext, hq, hkv, d = CASES[case]
    pool, batch, q, k, v = setup_batch(prefix, ext, hq, hkv, d, dtype=dtype, seed=2)
    twin = clone_pool(pool)
    calls: list = []
    out = run_backend(flash_backend(calls, dtype, hq, hkv, d), pool, batch, q, k, v)
    run_backend(TorchAttentionBackend(), twin, batch, q, k, v)
    tol = 3e-3 if dtype == torch.float16 else 2e-2
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=tol, rtol=tol)
    # one flash-attn call over whole sequences (keys gathered from the pool when there is a
    # prefix, the new tokens alone for a cold batch), or none when the prefix dominates
    on_flash = sum(prefix) <= sum(ext)
    assert calls == ([{"q_lens": ext, "k_lens": [p + e for p, e in zip(prefix, ext)]}] if on_flash else [])
    # the new K/V are in the pool at out_cache_loc, exactly as the torch backend writes them
    assert torch.equal(pool.k_buffer[0], twin.k_buffer[0]) and torch.equal(pool.v_buffer[0], twin.v_buffer[0])


def test_decode_and_float32_stay_on_triton():
    calls: list = []
    pool, batch, q, k, v = setup_batch([4, 40, 9], [1, 1, 1], 4, 2, 16, dtype=torch.bfloat16, seed=1)
    twin = clone_pool(pool)
    out = run_backend(flash_backend(calls, torch.bfloat16, 4, 2, 16), pool, batch, q, k, v)
    assert calls == []  # split-KV Triton decode, which reads the pool in place
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)

    backend = FlashAttentionBackend([stand_in(calls)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an fp32 model is not a fault: no warning, Triton runs it
        backend.prepare(4, 2, 16, torch.float32, "cpu")
    assert not backend.active and calls == []
    pool, batch, q, k, v = setup_batch([6], [9], 4, 2, 16, seed=4)
    twin = clone_pool(pool)
    out = run_backend(backend, pool, batch, q, k, v)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="float16/bfloat16 models, not float32. Use dtype='bfloat16' .*"
                                           "attention_backend='triton'"):
        FlashAttentionBackend([stand_in(calls)], strict=True).prepare(
            4, 2, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="head_dim <= 256"):
        FlashAttentionBackend([stand_in(calls)], strict=True).prepare(
            2, 2, 512, torch.float16, "cpu")


def test_start_up_check_refuses_a_top_left_causal_mask():
    """flash-attn < 2.1 aligned the causal mask at the top left: right for prefills, silently
    wrong after a cached prefix. The check finds it; by name it is an error, under "auto" a
    warning and the Triton kernels, whose output is then right."""
    calls: list = []
    old = stand_in(calls, "flash_attn 2.0.9", top_left=True)
    with pytest.raises(RuntimeError, match=r"flash_attn 2\.0\.9: its output differs from the reference.*top left"):
        FlashAttentionBackend([old], strict=True).prepare(4, 2, 16, torch.bfloat16, "cpu")
    backend = FlashAttentionBackend([old])
    with pytest.warns(RuntimeWarning, match="The Triton kernels run it instead"):
        backend.prepare(4, 2, 16, torch.bfloat16, "cpu")
    assert not backend.active
    calls.clear()
    pool, batch, q, k, v = setup_batch([2, 0], [5, 6], 4, 2, 16, dtype=torch.bfloat16, seed=5)
    twin = clone_pool(pool)
    out = run_backend(backend, pool, batch, q, k, v)
    assert calls == []
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)


def test_start_up_check_calls_as_the_model_does_and_the_next_candidate_is_tried():
    """The check passes q (and a cold batch's k, v) as strided views of the fused qkv output,
    as real calls do: a build that only takes contiguous tensors fails it rather than every
    later prefill. A flash-attn that fails (or returns the wrong dtype) gives way to the next."""
    calls: list = []
    strided_refused = stand_in(calls, "flash_attn_interface 3.0.0b1", contiguous_only=True)

    def returns_float32(*args, **kw):
        return make_varlen(calls)(*args, **kw).float()

    good = stand_in(calls, "flash_attn 2.7.4")
    backend = FlashAttentionBackend([strided_refused, FlashAttn(returns_float32, "odd"), good], strict=True)
    with pytest.warns(RuntimeWarning, match=r"flash_attn_interface 3\.0\.0b1: flash_attn_varlen_func failed.*"
                                            r"odd: it returned.*flash_attn 2\.7\.4 runs it instead"):
        backend.prepare(4, 2, 16, torch.float16, "cpu")  # the broken builds passed over are named
    assert backend.flash is good
    # an installed build that fails is named even when torch's own (optional) runs instead
    with pytest.warns(RuntimeWarning, match=r"contiguous.*torch varlen_attn runs it instead"):
        backend = FlashAttentionBackend([strided_refused, FlashAttn(make_varlen(calls), "torch varlen_attn",
                                                                    optional=True)])
        backend.prepare(4, 2, 16, torch.float16, "cpu")
    assert backend.flash.label == "torch varlen_attn"
    with pytest.raises(RuntimeError) as err:
        FlashAttentionBackend([strided_refused, FlashAttn(returns_float32, "odd")], strict=True).prepare(
            4, 2, 16, torch.float16, "cpu")
    assert "flash_attn_interface 3.0.0b1: flash_attn_varlen_func failed (RuntimeError: q, k, v must be contiguous)" \
        in str(err.value)
    assert "odd: it returned ((8, 4, 16), torch.float32" in str(err.value)

    def varlen_without_keywords(q, k, v, cu_q, cu_k, max_q, max_k):
        raise AssertionError("not reached")

    with pytest.raises(RuntimeError, match=r"flash_attn_varlen_func failed \(TypeError"):
        FlashAttentionBackend([FlashAttn(varlen_without_keywords, "odd")], strict=True).prepare(
            4, 2, 16, torch.float16, "cpu")


def install_torch_varlen(monkeypatch, calls: list, version: str = "2.11") -> None:
    """Put a ``torch.nn.attention.varlen`` whose ``varlen_attn`` has the signature of ``version``
    and computes as flash-attn does: 2.11 takes ``scale`` and the causal ``window_size=(-1, 0)``;
    2.12 on also ``enable_gqa``, without which it refuses fewer KV heads than query heads; 2.10
    takes ``is_causal`` and no scale."""
    ref = make_varlen(calls)

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        assert return_aux is None and window_size in ((-1, 0), (-1, -1))
        return ref(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, softmax_scale=scale,
                   causal=window_size == (-1, 0))

    def varlen_attn_2_13(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                         window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        if not enable_gqa and query.shape[1] != key.shape[1]:
            raise ValueError("Expect query and key/value to have the same number of heads. Try setting enable_gqa")
        return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux=return_aux, scale=scale,
                           window_size=window_size)

    def varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        raise AssertionError("not reached")

    mod = types.ModuleType("torch.nn.attention.varlen")
    mod.varlen_attn = {"2.11": varlen_attn, "2.13": varlen_attn_2_13, "2.10": varlen_attn_2_10}[version]
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", mod)
    monkeypatch.setattr(torch.nn.attention, "varlen", mod, raising=False)


@pytest.mark.parametrize("version", ["2.11", "2.13"])
def test_torchs_own_flash_attention_is_called_as_flash_attn(monkeypatch, version):
    """torch's ``varlen_attn`` takes the causal mask as ``window_size=(-1, 0)``, the scale as
    ``scale`` and (2.12 on) GQA only with ``enable_gqa``: mapped wrong, the start-up check
    (causal, cached prefixes, 4 query heads on 2 KV heads, and 2 on 2) would fail. The 2.10 one
    (``is_causal``, no scale) is not used."""
    from lmnb_engine.attention.flash_backend import torch_varlen

    calls: list = []
    install_torch_varlen(monkeypatch, calls, version)
    builtin = torch_varlen()
    assert builtin.optional and builtin.label == f"torch {torch.__version__} varlen_attn"
    for hq in (4, 2):
        backend = FlashAttentionBackend([builtin], strict=True)
        backend.prepare(hq, 2, 16, torch.float16, "cpu")
        assert backend.flash is builtin
    assert len(calls) == 4  # the check's two batches, twice
    install_torch_varlen(monkeypatch, calls, version="2.10")
    assert torch_varlen() is None


def test_extend_candidates_add_torchs_own_after_the_installed_ones_on_sm80_and_later(monkeypatch):
    from lmnb_engine.attention import selector

    install_torch_varlen(monkeypatch, [])
    install(monkeypatch, "flash_attn", make_varlen([]))
    for arch, labels in ((90, ["flash_attn 2.7.4", f"torch {torch.__version__} varlen_attn"]),
                         (80, ["flash_attn 2.7.4", f"torch {torch.__version__} varlen_attn"]), (75, [])):
        monkeypatch.setattr(selector, "device_arch", lambda dev, arch=arch: arch)
        assert [c.label for c in selector.extend_candidates(torch.device("cuda", 0))[0]] == labels


def test_auto_keeps_the_triton_kernel_where_flash_attn_is_not_clearly_faster(monkeypatch, caplog):
    """Under "auto" a flash-attn that passes its check runs extend only if the timed prefill
    (``_extend_times``: flash-attn ms, Triton ms; None: nothing to compare) shows it at least 5 %
    faster; one that fails while timed is dropped like one that fails its check (a warning for
    an installed one); by name it is used as asked, untimed."""
    from lmnb_engine.attention import flash_backend

    calls: list = []
    times: list = [(0.97, 1.0)]

    def extend_times(flash, hq, hkv, d, dtype, device):
        assert (hq, hkv, d, dtype) == (4, 2, 16, torch.float16)
        if isinstance(times[0], Exception):
            raise times[0]
        return times[0]

    monkeypatch.setattr(flash_backend, "_extend_times", extend_times)
    caplog.set_level("INFO", logger=flash_backend.__name__)
    slow, fast = stand_in(calls, "flash_attn_interface 3.0.0b1"), stand_in(calls, "flash_attn 2.7.4")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # passing a slower kernel over is not a fault
        backend = FlashAttentionBackend([slow])
        backend.prepare(4, 2, 16, torch.float16, "cpu")
    assert not backend.active
    assert ("flash_attn_interface 3.0.0b1: it is not 5% faster than the Triton extend kernel on a 2 x 2048-token "
            "prefill of this model's heads (0.970 ms against 1.000 ms); the Triton kernels run it instead") in caplog.text
    times[0] = RuntimeError("FlashAttention only supports Ampere GPUs or newer")
    with pytest.warns(RuntimeWarning, match=r"it failed on a timed prefill \(RuntimeError: FlashAttention only"):
        backend.prepare(4, 2, 16, torch.float16, "cpu")
    assert not backend.active
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # torch's own, not installed by the user: logged
        optional = FlashAttentionBackend([FlashAttn(make_varlen(calls), "torch varlen_attn", optional=True)])
        optional.prepare(4, 2, 16, torch.float16, "cpu")
    assert not optional.active
    for t in ((0.9, 1.0), None):  # 10 % faster; nothing to compare (off CUDA, Triton failed, out of memory)
        times[0] = t
        backend = FlashAttentionBackend([slow, fast])
        backend.prepare(4, 2, 16, torch.float16, "cpu")
        assert backend.flash is slow
    times[0] = (2.0, 1.0)
    backend = FlashAttentionBackend([slow], strict=True)  # by name: not timed
    backend.prepare(4, 2, 16, torch.float16, "cpu")
    assert backend.flash is slow


def test_the_timed_race_alternates_so_a_rising_clock_favours_neither_kernel():
    """A GPU clock still rising after the warm-ups makes the first timings 4x, then 2x as slow as
    at speed. Timed in turn, each kernel's best timing is at speed (1.0 and 0.9 ms); one kernel's
    three timings before the other's would have given flash-attn 2.0 ms, twice its cost."""
    from lmnb_engine.attention import flash_backend

    slowdown = iter([4.0, 4.0, 2.0, 2.0] + [1.0] * 100)
    cost = {"flash": 1.0, "triton": 0.9}
    assert flash_backend._alternating_ms(["flash", "triton"], lambda fn: cost[fn] * next(slowdown), rounds=3) == [1.0, 0.9]


def test_a_failing_call_falls_back_to_triton_without_losing_the_batch():
    calls: list = []
    broken: list = []
    backend = flash_backend(calls, torch.bfloat16, 4, 2, 16, broken=broken)
    pool, batch, q, k, v = setup_batch([3, 0], [9, 6], 4, 2, 16, dtype=torch.bfloat16, seed=6)
    twin = clone_pool(pool)
    out = run_backend(backend, pool, batch, q, k, v)
    assert len(calls) == 1
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)
    broken.append(True)  # e.g. a build without kernels for this GPU, found on a later shape
    pool, batch, q, k, v = setup_batch([3, 0], [9, 6], 4, 2, 16, dtype=torch.bfloat16, seed=7)
    twin = clone_pool(pool)
    with pytest.warns(RuntimeWarning, match="stand-in failed on an extend batch .*no kernel image.*from now on"):
        out = run_backend(backend, pool, batch, q, k, v)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=2e-2, rtol=2e-2)
    run_backend(TorchAttentionBackend(), twin, batch, q, k, v)  # the new K/V, written once, as torch writes them
    assert torch.equal(pool.k_buffer[0], twin.k_buffer[0]) and torch.equal(pool.v_buffer[0], twin.v_buffer[0])
    assert not backend.active


def test_running_out_of_memory_runs_that_batch_on_triton_and_keeps_flash_attn():
    calls: list = []
    backend = flash_backend(calls, torch.float16, 4, 2, 16)

    def out_of_memory(*args, **kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    backend.flash = FlashAttn(out_of_memory, "stand-in")
    pool, batch, q, k, v = setup_batch([2], [9], 4, 2, 16, dtype=torch.float16, seed=8)
    twin = clone_pool(pool)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "from now on" warning: memory is not flash-attn's fault
        out = run_backend(backend, pool, batch, q, k, v)
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=3e-3, rtol=3e-3)
    assert backend.active  # the next batch tries flash-attn again


def test_a_wrong_result_after_start_up_falls_back_like_a_failure():
    """A build that passed the check but returns the wrong dtype (or shape) on another batch
    would break the model after it; it is treated as a failed call."""
    calls: list = []
    backend = flash_backend(calls, torch.float16, 4, 2, 16)
    good = backend.flash.varlen
    backend.flash = FlashAttn(lambda *a, **kw: good(*a, **kw).float(), "stand-in")
    pool, batch, q, k, v = setup_batch([0, 0], [9, 6], 4, 2, 16, dtype=torch.float16, seed=9)
    twin = clone_pool(pool)
    wrong = r"stand-in returned a wrong result .*: it returned \(\(15, 4, 16\), torch.float32.*from now on"
    with pytest.warns(RuntimeWarning, match=wrong):
        out = run_backend(backend, pool, batch, q, k, v)
    assert out.dtype == torch.float16 and not backend.active
    torch.testing.assert_close(out.double(), naive_attention(twin, batch, q, k, v), atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("rows", ["all", "one"])
def test_start_up_check_refuses_nan(rows):
    calls: list = []
    good = make_varlen(calls)

    def with_nan(q, *a, **kw):
        out = good(q, *a, **kw)
        if rows == "all":
            out.fill_(float("nan"))
        else:
            out[-1, 0, 0] = float("nan")
        return out

    with pytest.raises(RuntimeError, match="differs from the reference by nan"):
        FlashAttentionBackend([FlashAttn(with_nan, "odd")], strict=True).prepare(4, 2, 16, torch.float16, "cpu")


def test_finding_prefers_flash_attention_3_and_reports_broken_builds(monkeypatch, tmp_path):
    broken = tmp_path / "flash_attn_interface"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c10...')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list = []
    install(monkeypatch, "flash_attn", make_varlen(calls))
    found, problems = find_flash_attn()
    assert [f.label for f in found] == ["flash_attn 2.7.4"]
    assert problems == ["flash_attn_interface is installed but does not import (ImportError: undefined symbol: "
                        "_ZN3c10...)"]
    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_varlen_func", None)
    no_varlen = "flash_attn 2.7.4 has no flash_attn_varlen_func (flash-attn 1.x?)"
    assert find_flash_attn(("flash_attn",)) == ([], [no_varlen])
    monkeypatch.setattr(sys.modules["flash_attn"], "__spec__", None)  # find_spec raises ValueError then
    assert "ValueError" in find_flash_attn(("flash_attn",))[1][0]
    monkeypatch.delitem(sys.modules, "flash_attn")
    assert find_flash_attn(("flash_attn",)) == ([], [])
    install(monkeypatch, "flash_attn_interface", make_varlen(calls), version="3.0.0b1")
    install(monkeypatch, "flash_attn", make_varlen(calls))
    assert [f.label for f in find_flash_attn()[0]] == ["flash_attn_interface 3.0.0b1", "flash_attn 2.7.4"]


def test_selector(monkeypatch, tmp_path):
    from lmnb_engine.attention import flash_backend, selector

    with pytest.raises(ImportError, match=r"needs flash-attn.*none is installed.*lmnb\[flash\].*backend='triton'"):
        select_attention_backend("cpu", "flash_attn")
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("import flash_attn_2_cuda\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=r"flash_attn is installed but does not import .*flash_attn_2_cuda"):
        select_attention_backend("cpu", "flash_attn")
    install(monkeypatch, "flash_attn", make_varlen([]))
    backend = select_attention_backend("cpu", "flash_attn")
    assert isinstance(backend, FlashAttentionBackend) and backend.strict and backend.triton_kernels
    assert backend.supports_cuda_graph  # decode is the Triton kernel's
    assert isinstance(select_attention_backend("cpu", "auto"), TorchAttentionBackend)  # auto: CUDA only
    for cap, modules in (((9, 0), ("flash_attn_interface", "flash_attn")), ((10, 0), ("flash_attn",)),
                         ((8, 6), ("flash_attn",)), ((7, 5), ())):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev, cap=cap: cap)
        assert selector.flash_modules(torch.device("cuda", 0)) == modules
    # by name on a GPU its build does not cover: the message says so (simulated sm_86, FA3 only)
    monkeypatch.delitem(sys.modules, "flash_attn")
    monkeypatch.setattr(selector, "flash_modules", lambda dev: ("flash_attn",))
    monkeypatch.setattr(selector, "device_arch", lambda dev: 86)
    monkeypatch.setattr(flash_backend, "torch_varlen", lambda: None)  # a torch older than 2.11
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    install(monkeypatch, "flash_attn_interface", make_varlen([]), version="3.0.0b1")
    with pytest.raises(ImportError, match="flash_attn_interface is installed but not built for this GPU .sm_86."):
        select_attention_backend("cpu", "flash_attn")


def test_tensor_parallel_refuses_a_model_flash_attn_cannot_run_before_spawning(tiny_llama, monkeypatch):
    from lmnb_engine import Engine

    install(monkeypatch, "flash_attn", make_varlen([]))
    with pytest.raises(ValueError, match="'flash_attn' cannot run this model: .*not float32"):
        Engine(str(tiny_llama), tp_size=2, device="cpu", dtype="float32", attention_backend="flash_attn")


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_engine_greedy_output_same_as_torch_path(tiny_checkpoint_factory, monkeypatch):
    """fp16 engines (in bf16 the tiny model's logits have near-ties that rounding flips): a
    short cached prefix then long continuations (flash-attn with a prefix gather), short
    continuations of a long cached prefix (the Triton extend kernel), then decode steps
    (Triton): the same greedy tokens as the torch path."""
    from lmnb_engine import Engine, SamplingParams

    calls: list = []
    install(monkeypatch, "flash_attn", make_varlen(calls))
    path = tiny_checkpoint_factory("llama", num_hidden_layers=2)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    outputs = {}
    for name in ("torch", "flash_attn"):
        with Engine(str(path), max_total_tokens=1024, attention_backend=name, dtype="float16") as eng:
            assert isinstance(eng.runner.attn, FlashAttentionBackend) == (name == "flash_attn")
            assert eng.model_info()["attention_backend"] == {"torch": "torch",
                                                             "flash_attn": "flash_attn 2.7.4 (extend) + triton"}[name]
            short = eng.encode("a red fox")
            long_tail = eng.encode(" and a blue bird sat on the hill by the sea, and the dog ran",
                                   add_special_tokens=False)
            eng.generate(short, SamplingParams(max_new_tokens=0))
            first = eng.generate([short + long_tail, short + long_tail[::-1]], params)
            second = eng.generate([short + long_tail + eng.encode(t, add_special_tokens=False) for t in (" up", " on")],
                                  params)
            assert all(r.meta.cached_tokens >= len(short) - 1 for r in first)
            assert all(r.meta.cached_tokens >= len(short + long_tail) - 1 for r in second)
            outputs[name] = [r.token_ids for r in first + second]
    assert outputs["flash_attn"] == outputs["torch"]
    assert any(sum(c["k_lens"]) > sum(c["q_lens"]) for c in calls)  # an extend after a cached prefix
