"""GPU correctness of the Triton path against the torch path (issue 9), before any timing.

    python benches/gpu_check.py            # on a CUDA GPU (part of benches/gpu_check.sh)
    python benches/gpu_check.py --smoke    # on a CPU, tiny shapes, kernels interpreted

1. Kernels: the Triton backend vs the torch backend (padded SDPA) on random pools of realistic
   shapes (Llama-3-8B heads: 32 query / 8 KV heads of 128; Llama-2-7B: 32 / 32), bf16 and fp32:
   extend over cached prefixes up to 2k tokens with ragged new parts, and decode over sequences
   up to 4k tokens split into many pieces. Pass: ||triton - torch|| / ||torch|| below 1e-2
   (bf16) or 1e-4 (fp32).
2. The fused layer kernels (RMSNorm with the residual add, RoPE, SiLU-and-mul) against the torch
   forwards of the same layers on Llama-3-8B-sized inputs in bf16: the residual sum, RoPE and
   SiLU-and-mul bit-identical (they round where torch rounds), the norm within one bf16 step
   before the weight multiply rounds it again (its sum runs in another order; ``norm_close``).
3. Greedy output of whole engines: torch backend vs Triton (eager) vs Triton with CUDA graphs, on
   a small random checkpoint: fp32, with its peaked logits (weights std 0.2), identical tokens;
   bf16, with random weights of std 0.02 in its shapes (``tiny_engine_load``), identical or
   first differences on near-ties only (as in 4). The Triton engines run the fused
   layer kernels too; the torch engine is all torch. Overlapped decoding (the default) against
   step-by-step: bit-identical tokens and logprobs.
4. Llama-2-7B shape, random bf16 weights: torch vs Triton + CUDA graphs, greedy tokens and their
   logprobs. Pass: tokens identical, or the first difference falls on a near-tie (top-2 logprob
   gap under 0.25 in the torch run, which bf16 rounding may flip) and the logprobs before it
   agree within 0.25 (``TOL_7B``: a few bf16 steps at this model's logit magnitudes).

Prints one line per check and a verdict; exits 1 if any check fails. Writes ``--out``/check.json.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (see tests/test_triton_attention.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from lmnb_engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from lmnb_engine.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode  # noqa: E402
from lmnb_engine.kv_pool import TokenToKVPool  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
RESULTS: list[dict] = []
ENV: dict = {}
OUT_DIR: Path | None = None
FLASH = None  # the flash-attns the GPU has, if any (set in main)


def record(name: str, ok: bool, **info) -> None:
    """Print a check's verdict and rewrite check.json (so a run cut short keeps what it found)."""
    RESULTS.append({"check": name, "ok": bool(ok), **info})
    detail = ", ".join(f"{k}={v}" for k, v in info.items() if k != "trace")
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    if OUT_DIR is not None:
        (OUT_DIR / "check.json").write_text(json.dumps({"env": ENV, "checks": RESULTS}, indent=1))


def batch_on_pool(prefix_lens, extend_lens, hq, hkv, d, dtype, seed):
    """A pool of random K/V, the requests' positions on shuffled slots, the batch, and q/k/v."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    size = sum(seq_lens) + 64
    pool = TokenToKVPool(size, 1, hkv, d, dtype, DEV)
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape, generator=g))
    pool.v_buffer[0].copy_(torch.randn(pool.v_buffer[0].shape, generator=g))
    table = torch.zeros((len(seq_lens) + 1, max(seq_lens) + 8), dtype=torch.int32)
    slots = torch.randperm(size, generator=g) + 1
    off, new = 0, []
    for row, (p, n) in enumerate(zip(prefix_lens, seq_lens)):
        table[row, :n] = slots[off:off + n].int()
        new.append(slots[off + p:off + n])
        off += n
    T = sum(extend_lens)
    mode = ForwardMode.DECODE if all(e == 1 for e in extend_lens) else ForwardMode.EXTEND
    batch = ForwardBatch.build(mode, [0] * T, torch.cat(new), table.to(DEV), list(range(len(seq_lens))),
                               list(prefix_lens), list(extend_lens), device=DEV)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(DEV, dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return pool, batch, q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)


def run_backend(backend, pool, batch, q, k, v):
    backend.init_forward(batch)
    out = backend.forward(q, k, v, 0, batch, pool, q.shape[-1] ** -0.5)
    if DEV == "cuda":
        torch.cuda.synchronize()
    return out


def against_torch(backend, pool, batch, q, k, v) -> tuple[float, bool]:
    """(relative error, all finite) of ``backend``'s output against the torch backend's on the
    same batch, each writing the new K/V into its own copy of ``pool``."""
    twin = TokenToKVPool.__new__(TokenToKVPool)
    twin.__dict__.update(pool.__dict__)
    twin.k_buffer, twin.v_buffer = [pool.k_buffer[0].clone()], [pool.v_buffer[0].clone()]
    out = run_backend(backend, pool, batch, q, k, v).float()
    ref = run_backend(TorchAttentionBackend(), twin, batch, q, k, v).float()
    return float((out - ref).norm() / ref.norm()), bool(torch.isfinite(out).all())


def check_kernels(prefix: str = "", flash: bool = True) -> None:
    if SMOKE:
        extend = ([0, 3, 17], [5, 20, 1])
        decode = [0, 9, 40]
        heads = [(4, 2, 16), (2, 2, 16)]
    else:
        extend = ([0, 1, 100, 1000, 2047, 63], [1, 17, 300, 64, 513, 2048])
        decode = [0, 69, 512, 2047, 3999, 1]
        heads = [(32, 8, 128), (32, 32, 128)]
    half = torch.bfloat16  # the dtype the engine runs on GPUs (interpreted: dots in float32)
    for dtype, tol in ((half, 1e-2), (torch.float32, 1e-4)):
        for hq, hkv, d in heads:
            # the decode split grid follows the SM count: these three pin it to the default's, 16
            # splits (as on a GPU with many more SMs) and one (the split kernel writing the output
            # itself, as Llama-2-7B's batch 32 runs on 132 SMs)
            for name, (pre, ext), kw in (("extend", extend, {}),
                                         ("decode", (decode, [1] * len(decode)), {}),
                                         ("decode, 16 splits", (decode, [1] * len(decode)),
                                          dict(max_kv_splits=16, min_split_tokens=16, sm_count=1024)),
                                         ("decode, one split (direct)", (decode, [1] * len(decode)),
                                          dict(max_kv_splits=1))):
                pool, batch, q, k, v = batch_on_pool(pre, ext, hq, hkv, d, dtype, seed=hq + hkv)
                rel, finite = against_torch(TritonAttentionBackend(**kw), pool, batch, q, k, v)
                record(f"{prefix}kernel {name} {str(dtype)[6:]} Hq={hq} Hkv={hkv} D={d}", finite and rel < tol,
                       rel_err=f"{rel:.2e}", tol=tol, tokens=batch.num_tokens)
            if flash and dtype == half:  # flash-attn runs 16-bit models only
                check_flash_extend(hq, hkv, d, dtype, tol, extend)


def _reference_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal):
    """flash-attn's ``flash_attn_varlen_func`` in float32 torch: the --smoke stand-in for one."""
    from lmnb_engine.attention.flash_backend import _reference_extend

    q_lens, k_lens = cu_seqlens_q.diff().tolist(), cu_seqlens_k.diff().tolist()
    return _reference_extend(q, k, v, q_lens, k_lens, softmax_scale).to(q.dtype)


def check_flash_extend(hq, hkv, d, dtype, tol, extend) -> None:
    """Each flash-attn the GPU has (torch's own too) running extend in ``FlashAttentionBackend``,
    against the torch backend: on new prompts, and on a batch whose cached prefixes are no longer
    than its new tokens, so the backend gathers the prefix K/V from the pool for flash-attn (a
    batch mostly of cached tokens goes to Triton). Under --smoke a float32 reference stands in."""
    from lmnb_engine.attention.flash_backend import FlashAttentionBackend, FlashAttn

    flashes = FLASH or ([FlashAttn(_reference_varlen, "float32 reference (smoke stand-in)")] if SMOKE else [])
    prefixed = ([0, 2, 10, 1], [9, 3, 12, 20]) if SMOKE else ([0, 100, 500, 63, 1000], [300, 200, 513, 2048, 1000])
    for cand in flashes:
        calls = []
        counted = FlashAttn(lambda *a, _f=cand.varlen, **kw: calls.append(1) or _f(*a, **kw), cand.label)
        backend = FlashAttentionBackend([counted], strict=True)
        try:
            backend.prepare(hq, hkv, d, dtype, DEV)
        except (RuntimeError, ValueError) as exc:
            record(f"kernel extend on {cand.label} Hq={hq} Hkv={hkv} D={d}", False, error=str(exc)[:400])
            continue
        for name, (pre, ext) in (("new prompts", ([0] * len(extend[1]), extend[1])), ("cached prefixes", prefixed)):
            pool, batch, q, k, v = batch_on_pool(pre, ext, hq, hkv, d, dtype, seed=hq + hkv + 1)
            before = len(calls)
            rel, finite = against_torch(backend, pool, batch, q, k, v)
            ran = len(calls) > before and backend.flash is not None  # (not a fallback to Triton)
            record(f"kernel extend on {cand.label}, {name}, {str(dtype)[6:]} Hq={hq} Hkv={hkv} D={d}",
                   ran and finite and rel < tol, rel_err=f"{rel:.2e}", tol=tol, flash_ran=ran,
                   tokens=batch.num_tokens)


def norm_close(ref: torch.Tensor, got: torch.Tensor) -> tuple[bool, float]:
    """Whether a 16-bit RMSNorm output ``got`` is as close to ``ref`` as rounding allows, and the
    largest relative difference. The row statistic, summed in another order, is a few float32
    ulps off, which now and then flips the rounding of the normalized value by one step (2**-7
    relative in bf16); each output then multiplies that by the weight and rounds again (half a
    step each): 2**-6 in all. One step alone fails a few outputs of a Llama-sized batch."""
    rel = (ref.float() - got.float()).abs() / ref.float().abs().clamp_min(1e-6)
    worst = float(rel.max())
    return worst <= 2**-6, worst


@torch.inference_mode()
def check_layer_kernels() -> None:
    from lmnb_engine.layers.mlp import SiluAndMul
    from lmnb_engine.layers.rmsnorm import RMSNorm
    from lmnb_engine.kv_pool import TokenToKVPool
    from lmnb_engine.layers.rotary import RotaryEmbedding, RotaryStoreKV

    dtype = torch.float16 if SMOKE else torch.bfloat16  # the interpreter truncates bf16 (tests/test_triton_layers)
    name = str(dtype)[6:]
    T, hidden, inter, hq, hkv, d = (5, 64, 96, 4, 2, 16) if SMOKE else (300, 4096, 14336, 32, 8, 128)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(DEV, dtype)

    def both(op, *args):
        op.triton = False
        ref = op(*[a.clone() for a in args])
        op.triton = True
        got = op(*[a.clone() for a in args])
        op.triton = False
        return ref, got

    norm = RMSNorm(hidden, 1e-5).to(DEV, dtype)
    norm.weight.data = rand(hidden, scale=0.2) + 1
    (ref_n, ref_s), (got_n, got_s) = both(norm, rand(T, hidden, scale=3), rand(T, hidden))
    close, worst = norm_close(ref_n, got_n)
    record(f"fused add + RMSNorm ({name})", torch.equal(ref_s, got_s) and close,
           residual_identical=torch.equal(ref_s, got_s), norm_max_rel_diff=f"{worst:.2e}")
    ref, got = both(SiluAndMul(), rand(T, 2 * inter, scale=4))
    record(f"SiLU-and-mul ({name})", torch.equal(ref, got), max_diff=f"{float((ref.float() - got.float()).abs().max()):.2e}")
    qkv = rand(T, (hq + 2 * hkv) * d, scale=2)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    from types import SimpleNamespace

    rope_cfg = SimpleNamespace(rope_type="default", head_dim=d, rope_theta=500000.0)
    cos, sin = RotaryEmbedding(rope_cfg).to(DEV).cos_sin(torch.randint(0, 8000, (T,), generator=g).to(DEV), dtype)
    loc = (torch.randperm(T, generator=g) + 1).to(DEV)
    rope, pools = RotaryStoreKV(), [TokenToKVPool(T, 1, hkv, d, dtype, DEV) for _ in range(2)]
    (rq, rk), (gq, gk) = (
        rope.forward_torch(q.clone().view(T, hq, d), k.clone().view(T, hkv, d), v.view(T, hkv, d), cos, sin,
                           pools[0], 0, loc),
        rope.forward_triton(q.clone().view(T, hq, d), k.clone().view(T, hkv, d), v.view(T, hkv, d), cos, sin,
                            pools[1], 0, loc))
    pool_same = all(torch.equal(a, b) for a, b in zip(pools[0].k_buffer + pools[0].v_buffer,
                                                      pools[1].k_buffer + pools[1].v_buffer))
    record(f"RoPE in place with the KV-pool write ({name})", torch.equal(rq, gq) and torch.equal(rk, gk) and pool_same,
           pool_identical=pool_same,
           max_diff=f"{float(max((rq.float() - gq.float()).abs().max(), (rk.float() - gk.float()).abs().max())):.2e}")


def tiny_checkpoint(full: bool = not SMOKE) -> str:
    """A small random checkpoint (weights std 0.2): the GPU run's shapes if ``full``."""
    from lmnb_engine.testing import make_tiny_checkpoint

    tmp = tempfile.mkdtemp(prefix="lmnb-check-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    dims = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2) if not full else \
        dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=6, num_attention_heads=16,
             num_key_value_heads=4)
    return str(make_tiny_checkpoint(tmp, max_position_embeddings=4096, **dims))


def greedy(model: str, backend: str, graphs: bool, prompts, new: int, top: int = 0, overlap: bool = True, **load):
    from lmnb_engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True, return_logprob=True,
                            top_logprobs_num=top)
    with Engine(model, device=DEV, attention_backend=backend, max_total_tokens=32768,
                cuda_graph_max_bs=(8 if graphs and DEV == "cuda" else 0),  # <= 6 prompts: 4 graphs
                disable_overlap_schedule=not overlap, **load) as eng:
        assert (eng.runner.graph_runner is not None) == (graphs and DEV == "cuda"), "CUDA graphs not as asked"
        eng.generate(prompts[0], SamplingParams(max_new_tokens=0))  # a shared prefix in the cache first
        results = eng.generate(prompts, params)
    return [r.token_ids for r in results], [r.logprobs for r in results]


def make_prompts(vocab: int, n: int, base_len: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(10, vocab, (base_len,), generator=g).tolist()
    out = [base]
    for i in range(1, n):  # prefixes of the base of several lengths + own suffixes: radix hits
        cut = base_len * i // n
        out.append(base[:cut] + torch.randint(10, vocab, (5 + 7 * i,), generator=g).tolist())
    return out


def compare_greedy(ref, ref_lp, got, got_lp, tie_gap: float = 0.05) -> dict:
    """How two greedy runs agree: prompts with identical tokens, the largest logprob difference
    before the first differing token, and whether every first difference falls on a near-tie
    (top-2 logprob gap under ``tie_gap`` in ``ref``, which bf16 rounding may flip)."""
    worst, on_ties, identical = 0.0, True, 0
    for r, g, rl, gl in zip(ref, got, ref_lp, got_lp):
        j = next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None)
        upto = len(r) if j is None else j
        worst = max([worst] + [abs(a.logprob - b.logprob) for a, b in zip(rl[:upto], gl[:upto])])
        if j is None:
            identical += 1
        else:
            on_ties &= rl[j].top[0][1] - rl[j].top[1][1] < tie_gap
    return {"identical": identical, "prompts": len(ref), "max_logprob_diff": worst, "on_ties": on_ties}


def tiny_engine_load(dtype: str) -> dict:
    """How ``check_tiny_engine`` loads the small checkpoint in ``dtype``. In bf16 its own weights
    (std 0.2: peaked logits, for fp32's identical tokens) make a chaotic network: rounding noise
    grows through the layers into logits ~0.4 apart (two correct bf16 attentions, Triton's and
    torch's, measured on CPU: 2 of 6 prompts identical, first differences at top-2 gaps up to
    0.75). Random weights of std 0.02 in the same shapes keep it at the logits' own rounding."""
    return dict(dtype=dtype, random_weights=dtype == "bfloat16")


def agree(c: dict, strict: bool) -> bool:
    """Whether ``compare_greedy``'s ``c`` passes: identical tokens, or (not ``strict``) first
    differences on near-ties only and logprobs within 0.05 before them."""
    return c["identical"] == c["prompts"] or (not strict and c["on_ties"] and c["max_logprob_diff"] < 0.05)


def check_tiny_engine() -> None:
    """fp32: tokens must be identical. bf16: identical, or first differences on near-ties only."""
    path = tiny_checkpoint()
    prompts = make_prompts(500, 6, 40 if SMOKE else 300)
    new = 6 if SMOKE else 24
    for dtype in ("float32",) if SMOKE else ("float32", "bfloat16"):
        load = tiny_engine_load(dtype)
        ref, ref_lp = greedy(path, "torch", False, prompts, new, top=2, **load)
        for label, graphs in (("triton eager", False), ("triton + CUDA graphs", True)):
            if graphs and SMOKE:
                continue
            got, got_lp = greedy(path, "triton", graphs, prompts, new, **load)
            c = compare_greedy(ref, ref_lp, got, got_lp)
            record(f"greedy, small checkpoint ({dtype}): {label} vs torch", agree(c, dtype == "float32"),
                   prompts_identical=f"{c['identical']}/{c['prompts']}", max_logprob_diff=f"{c['max_logprob_diff']:.3g}",
                   divergences_on_near_ties=c["on_ties"], new_tokens=new)
        if dtype == "bfloat16" and FLASH is not None:  # flash-attn runs 16-bit models only
            label = f"greedy, small checkpoint ({dtype}): flash-attn extend + triton decode vs torch"
            try:  # by name, an engine whose flash-attn fails its start-up check refuses to start
                got_f, got_flp = greedy(path, "flash_attn", True, prompts, new, **load)
            except (RuntimeError, ValueError) as exc:  # a failed check, and the overlap check below still runs
                record(label, False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
            else:
                c = compare_greedy(ref, ref_lp, got_f, got_flp)
                record(label, agree(c, False), prompts_identical=f"{c['identical']}/{c['prompts']}",
                       max_logprob_diff=f"{c['max_logprob_diff']:.3g}",
                       divergences_on_near_ties=c["on_ties"], new_tokens=new)
        # overlapped decoding reorders host work only: bit-identical to one step at a time
        step_by_step, lps = greedy(path, "triton", not SMOKE, prompts, new, overlap=False, **load)
        same = step_by_step == got and [[x.logprob for x in r] for r in lps] == [[x.logprob for x in r] for r in got_lp]
        record(f"greedy, small checkpoint ({dtype}): overlapped vs step-by-step decoding", same, new_tokens=new)


# The 7B check's bound on logprob differences and near-tie gaps: Llama-2-7B's bf16 logits reach
# magnitudes of 4-8, where one bf16 step is 0.03-0.06, and two correct attentions (Triton's, torch's
# SDPA) round differently through 32 layers, so a few steps apart is agreement; 0.05 failed a
# 32-layer stand-in with no bug in sight of its bound (measured on CPU: 0.016 there, the real
# model's logits ~3x larger). A wrong kernel moves logprobs by whole units and changes tokens.
TOL_7B = 0.25


def check_7b() -> None:
    if SMOKE:
        print("   (check_7b: a GPU-only check, not run by --smoke)", flush=True)
        return
    prompts = make_prompts(32000, 4, 600)
    new = 32
    load = dict(random_weights=True, dtype="bfloat16")
    t = time.perf_counter()
    ref, ref_lp = greedy("llama-2-7b", "torch", False, prompts, new, top=2, **load)
    got, got_lp = greedy("llama-2-7b", "triton", True, prompts, new, **load)
    c = compare_greedy(ref, ref_lp, got, got_lp, tie_gap=TOL_7B)
    ok = (c["identical"] == c["prompts"] or c["on_ties"]) and c["max_logprob_diff"] < TOL_7B
    record("greedy, Llama-2-7B shape bf16: triton + CUDA graphs vs torch", ok,
           prompts_identical=f"{c['identical']}/{c['prompts']}", max_logprob_diff=f"{c['max_logprob_diff']:.3g}",
           divergences_on_near_ties=c["on_ties"], seconds=round(time.perf_counter() - t, 1))


def check_tuned() -> int:
    """The attention kernel checks again, where the engine now takes its launch configurations
    from a tuned file (``$LMNB_TRITON_CONFIGS``, written by ``gpu_kernels.py``, which compared
    each only on its own few cases): before a benchmark runs with them. Adds to check.json."""
    from lmnb_engine.attention.triton_ops.tuned import table_in_effect

    path = OUT_DIR / "check.json"
    if path.is_file():
        old = json.loads(path.read_text())
        ENV.update(old.get("env", {}))
        RESULTS.extend(old.get("checks", []))
    tuned = table_in_effect(torch.device(DEV)) if DEV == "cuda" else {}
    ENV["tuned_triton_configs"] = tuned
    if not (tuned.get("extend") or tuned.get("decode")) and not SMOKE:
        print("gpu_check --tuned: no tuned configuration in effect; nothing to check", flush=True)
        return 0
    before = len(RESULTS)
    try:
        check_kernels(prefix="tuned configs: ", flash=False)
    except Exception as exc:  # noqa: BLE001 - recorded like the other checks
        record("tuned configs: check_kernels", False, error=f"{type(exc).__name__}: {exc}",
               trace=traceback.format_exc()[-1500:])
    failed = [r["check"] for r in RESULTS[before:] if not r["ok"]]
    print(f"gpu_check --tuned: {len(RESULTS) - before - len(failed)}/{len(RESULTS) - before} passed"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, TRITON_INTERPRET=1")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for check.json")
    ap.add_argument("--tuned", action="store_true",
                    help="only the attention kernel checks, run again with the tuned configurations of "
                         "$LMNB_TRITON_CONFIGS, their results added to check.json")
    args = ap.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA device; run with --smoke on a CPU", file=sys.stderr)
        return 2
    global OUT_DIR
    OUT_DIR = Path(args.out)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if args.tuned:
        return check_tuned()
    ENV.update(torch=torch.__version__, device=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu")
    try:
        import triton

        ENV["triton"] = triton.__version__
    except ImportError as e:
        ENV["triton"] = f"missing: {e}"
    global FLASH
    if DEV == "cuda":
        from lmnb_engine.attention.selector import extend_candidates

        found, problems = extend_candidates(torch.device(DEV))  # torch 2.11+'s own FlashAttention-2 too
        FLASH = found or None
        ENV["flash_attn_problems"] = problems
    ENV["flash_attn"] = [f.label for f in FLASH] if FLASH else "not installed (extend runs on Triton)"
    print(f"gpu_check: {ENV}", flush=True)
    for fn in (check_kernels, check_layer_kernels, check_tiny_engine, check_7b):
        t = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a crash is a failed check, the rest still runs
            record(fn.__name__, False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-1500:])
        print(f"   ({fn.__name__}: {time.perf_counter() - t:.1f} s)", flush=True)
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(f"gpu_check: {len(RESULTS) - len(failed)}/{len(RESULTS)} passed" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
