"""Launch configurations of the Triton attention kernels, timed on the GPU (issue 9).

    python benches/gpu_kernels.py                  # on a GPU: Llama-2-7B and Llama-3-8B heads, bf16
    python benches/gpu_kernels.py --smoke          # CPU interpreter, tiny shapes (checks it runs)

The first H200 run (``results/2026-12-04-nvidia-h200.md``) missed prefill (38.7k tok/s against
45k) and Llama-2-7B decode at batch 32 (4325 tok/s against 4500), where the KV cache read by
decode attention is about 40 % of the bytes a step moves. This script times each kernel alone
over a set of launch configurations (tiles, warps, software-pipelining stages; for decode also
the number of key splits) so the next change to ``extend_config`` / ``decode_config`` rests on
measurements. Llama-3-8B's extend cases try only the default and the two fastest of Llama-2-7B's
prefill (each config compiles anew for another GQA group), to fit gpu_check.sh's time.

- extend ``prefill``: 4 requests x 2048 new tokens, no cached prefix (the suite's prefill);
  ``prefix``: 4 x 512 new tokens over 1536 cached ones. Rate: TFLOP/s, counting 4·D FLOPs per
  visible (query, key) pair per query head. torch's SDPA (causal flash attention) and torch's
  own varlen FlashAttention-2 (``varlen_attn``, which "auto" weighs against the Triton kernel
  at engine start) on the same prefill are timed as bars;
- decode ``b1`` and ``b32``: 1 and 32 requests of 576 tokens (the suite's decode at its
  midpoint): at batch 32 each config at the engine's split grid, and for both the default config
  also at 0, 1/2, 2 and 4 times that grid (a grid of 1: the merge-free direct kernel). Rate: GB/s of K/V read (2·Hkv·D·2 bytes per token), against a device-to-device copy
  of 1 GiB (read + write) timed here;
- ``gemv/*``: an experimental Triton GEMV (``gemv_kernel.py``) against cuBLAS (``F.linear`` of one
  row, what the engine runs now) on each of Llama-2-7B's weight matrices, for batch-1 decode
  (MBU 0.71 on the first run). Rate: GB/s of weights and vectors moved.

Every configuration's output is compared with the default configuration's: one that differs by
more than bf16 rounding allows, or holds a NaN or an infinity, is reported ``wrong`` and never
chosen. The configuration the
engine uses now (for a GEMV, cuBLAS) is marked ``default``; the fastest correct one per case ``best``.
Writes ``<out-dir>/<date>-<machine>-kernels.json`` (after every case) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when not installed

# (block_m, block_n, num_warps, num_stages) and (block_n, num_warps, num_stages) tried on a GPU
EXTEND_CONFIGS = [(128, 64, 8, 1), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 1),
                  (64, 64, 4, 2), (64, 64, 4, 3)]
# Llama-3-8B's extend cases (another GQA group: every config compiles anew, ~4 s each) try only
# the default and the fastest of Llama-2-7B's prefill
RERUN_BEST = 2
DECODE_CONFIGS = [(32, 4, 1), (32, 4, 2), (32, 4, 3), (64, 4, 1), (64, 4, 2), (64, 4, 3), (128, 4, 1),
                  (128, 4, 2), (128, 4, 3), (64, 8, 2), (128, 8, 2)]
SPLIT_FACTORS = (0, 0.5, 1, 2, 4)  # the decode grid's splits, times these (at least 1: the direct,
# merge-free kernel; at most max_kv_splits)
# (block_n, block_k, num_warps, num_stages) of the experimental Triton GEMV (gemv_kernel.py)
GEMV_CONFIGS = [(4, 1024, 4, 2), (8, 256, 4, 2), (8, 512, 4, 2), (8, 512, 4, 3), (8, 1024, 8, 3), (16, 256, 4, 2),
                (16, 512, 8, 2), (32, 128, 4, 3)]
# Llama-2-7B's matrices a batch-1 decode step multiplies by (N rows x K): qkv, o, gate_up, down, LM head
GEMV_SHAPES = [("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096), ("down", 4096, 11008),
               ("lm_head", 32000, 4096)]
SMOKE_GEMV = [(8, 32, 4, 1), (16, 16, 4, 1)]
SMOKE_GEMV_SHAPES = [("odd", 45, 70)]
# (name, query heads, KV heads, head_dim) of the models timed
MODELS = [("llama-2-7b", 32, 32, 128), ("llama-3-8b", 32, 8, 128)]
SMOKE_MODELS = [("tiny", 2, 2, 16), ("tiny-gqa", 4, 2, 16)]
SMOKE_EXTEND = [(16, 16, 4, 1), (32, 16, 4, 1)]
SMOKE_DECODE = [(16, 4, 1), (32, 4, 1)]
TOLERANCE = 2e-2  # max |out - default out| / max |default out|: bf16 rounding, not a wrong result
NOISE = 0.02  # a tuned configuration may be this much slower than the default in one case: timing noise


def _timer(smoke: bool):
    """ms per call of ``fn``: ``triton.testing.do_bench`` (mean, L2 flushed) on a GPU; one
    wall-clock call in the interpreter."""
    if smoke:
        def timed(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return timed
    import triton.testing

    return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="mean")


def _pool(n_tokens: int, hkv: int, d: int, dtype, device):
    """K and V pool buffers [n_tokens + 1, Hkv, D] with random contents (slot 0 is padding)."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    shape = (n_tokens + 1, hkv, d)
    return (torch.randn(shape, generator=g, device=device).to(dtype),
            torch.randn(shape, generator=g, device=device).to(dtype))


def _table(seq_lens: list[int], device):
    """req_to_token int32 [B, W] giving each request a contiguous run of slots from 1 (as a
    fresh prefill gets them), and req_pool_indices int64 [B]. W is the longest request rounded up
    to a multiple of 16, as the engine's table is: Triton compiles another specialization of a
    kernel for a row stride of 1 (or one not divisible by 16), which the engine never runs."""
    import torch

    width = -(-max(seq_lens) // 16) * 16
    table = torch.zeros((len(seq_lens), width), dtype=torch.int32, device=device)
    start = 1
    for i, n in enumerate(seq_lens):
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32, device=device)
        start += n
    return table, torch.arange(len(seq_lens), device=device)


def _rel_err(out, ref) -> float | None:
    """max |out - ref| / max |ref|; None when either holds a NaN or an infinity (a wrong result)."""
    import torch

    if not (torch.isfinite(out).all() and torch.isfinite(ref).all()):
        return None
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def _check(rec: dict, out, ref) -> None:
    """Record ``out``'s error against the default's output ``ref`` and whether it is wrong."""
    rec["rel_err"] = _rel_err(out, ref)
    rec["wrong"] = rec["rel_err"] is None or rec["rel_err"] > TOLERANCE


def _measure(rec: dict, run, ref, timed, amount: float, rate: str, unit: float) -> dict:
    """Check one configuration's output (``run()``) against ``ref``, then time it: ``rec`` gets
    ``rel_err``, ``wrong``, ``ms`` and ``rate`` (``amount`` per second, in ``unit``s), or the
    ``error`` of a configuration that does not compile or run (a result too)."""
    try:
        _check(rec, run(), ref)
        rec["ms"] = round(timed(run), 4)
        rec[rate] = round(amount / (rec["ms"] * 1e-3) / unit, 1)
    except Exception as exc:  # noqa: BLE001 - the other configurations still run
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return rec


def extend_cases(models, smoke: bool):
    """(case name, model, Hq, Hkv, D, prefix_lens, extend_lens) timed for extend."""
    cases = []
    for name, hq, hkv, d in models:
        if smoke:
            cases += [(f"{name}/prefill", name, hq, hkv, d, [0, 0], [40, 24]),
                      (f"{name}/prefix", name, hq, hkv, d, [20, 9], [12, 17])]
        else:
            cases += [(f"{name}/prefill", name, hq, hkv, d, [0] * 4, [2048] * 4),
                      (f"{name}/prefix", name, hq, hkv, d, [1536] * 4, [512] * 4)]
    return cases


def case_key(kind: str, case: tuple, dtype, sm_count: int = 0) -> str:
    """The tuned-file key (``tuned.config_key``) of an extend or decode ``case``: its head_dim,
    GQA group and dtype; for decode also whether the engine's split grid for it is one (the
    direct kernel) or more."""
    from lmnb_engine.attention.triton_backend import DEFAULT_MAX_KV_SPLITS, decode_split_grid
    from lmnb_engine.attention.triton_ops.tuned import config_key

    _, _, hq, hkv, d = case[:5]
    if kind == "extend":
        return config_key(d, hq // hkv, dtype)
    direct = decode_split_grid(len(case[-1]), hkv, 1, sm_count, DEFAULT_MAX_KV_SPLITS) == 1
    return config_key(d, hq // hkv, dtype, "direct" if direct else "split")


def run_extend(case, configs, timed, device, dtype) -> dict:
    """Time ``extend_attention_fwd`` on one case under each configuration."""
    import torch

    from lmnb_engine.attention.triton_ops.extend_attention import ExtendConfig, extend_attention_fwd, extend_config

    name, _, hq, hkv, d, prefix, ext = case
    T = sum(ext)
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn((T, hq, d), generator=g, device=device).to(dtype)
    k = torch.randn((T, hkv, d), generator=g, device=device).to(dtype)
    v = torch.randn((T, hkv, d), generator=g, device=device).to(dtype)
    rows_per_req = [max(p, 1) for p in prefix]  # a table row even for no prefix (never read)
    k_pool, v_pool = _pool(sum(rows_per_req), hkv, d, dtype, device)
    table, rows = _table(rows_per_req, device)
    prefix_t = torch.tensor(prefix, device=device)
    ext_t = torch.tensor(ext, device=device)
    starts = torch.cumsum(ext_t, 0) - ext_t
    pairs = sum(p * e + e * (e + 1) // 2 for p, e in zip(prefix, ext))  # visible (query, key) pairs
    flops = 4 * d * hq * pairs
    default = extend_config(q.device, d, dtype, tuned=False)  # the built-in one, whatever a tuned file says

    def call(cfg):
        out = torch.empty_like(q)
        extend_attention_fwd(q, k, v, out, k_pool, v_pool, table, rows, prefix_t, ext_t, starts, max(ext),
                             d**-0.5, config=cfg)
        return out

    ref = call(default)
    rows_out = []
    for c in dict.fromkeys([tuple(default)] + list(configs)):  # the default first, each once
        cfg = ExtendConfig(*c)
        rec = {"config": cfg._asdict(), "default": cfg == default}
        rows_out.append(_measure(rec, lambda: call(cfg), ref, timed, flops, "tflops", 1e12))
    res = {"case": name, "key": case_key("extend", case, dtype), "pairs": pairs, "flops": flops, "configs": rows_out}
    if prefix == [0] * len(prefix) and device.type == "cuda":
        from lmnb_engine.attention.flash_backend import torch_varlen

        if len(set(ext)) == 1:
            res["sdpa"] = _bar(_sdpa_call(q, k, v, len(ext), ext[0]), timed, flops)
        builtin = torch_varlen()  # what "auto" weighs against the Triton kernel at engine start
        if builtin is not None:
            cu = torch.nn.functional.pad(torch.cumsum(ext_t, 0, dtype=torch.int32), (1, 0))
            res["varlen"] = _bar(lambda: builtin.varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(ext),
                                                        max_seqlen_k=max(ext), softmax_scale=d**-0.5, causal=True),
                                 timed, flops)
    return _mark_best(res)


def _sdpa_call(q, k, v, batch: int, seq: int):
    """torch SDPA's causal attention on the same prefill (requests of equal length, no prefix)."""
    import torch.nn.functional as F

    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    qb = q.view(batch, seq, hq, d).transpose(1, 2)
    kb = k.view(batch, seq, hkv, d).transpose(1, 2)
    vb = v.view(batch, seq, hkv, d).transpose(1, 2)
    return lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=hq != hkv)


def _bar(fn, timed, flops: int) -> dict:
    """A comparison bar: ``fn``'s time and TFLOP/s on the case, or the error it raised."""
    try:
        ms = timed(fn)
        return {"ms": round(ms, 4), "tflops": round(flops / (ms * 1e-3) / 1e12, 1)}
    except Exception as exc:  # noqa: BLE001 - a bar is optional
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def decode_cases(models, smoke: bool):
    """(case name, model, Hq, Hkv, D, seq_lens) timed for decode: Llama-2-7B's, where it was short."""
    name, hq, hkv, d = models[0]
    if smoke:
        return [(f"{name}/b1", name, hq, hkv, d, [70]), (f"{name}/b4", name, hq, hkv, d, [70, 33, 90, 5])]
    return [(f"{name}/b1", name, hq, hkv, d, [576]), (f"{name}/b32", name, hq, hkv, d, [576] * 32)]


def run_decode(case, configs, timed, device, dtype, sm_count: int) -> dict:
    """Time ``decode_attention_fwd`` on one case under each configuration and split grid."""
    import torch

    from lmnb_engine.attention.triton_backend import DEFAULT_MAX_KV_SPLITS, DEFAULT_MIN_SPLIT_TOKENS, decode_split_grid
    from lmnb_engine.attention.triton_ops.decode_attention import (
        DecodeConfig, decode_attention_fwd, decode_config, decode_workspace)

    name, _, hq, hkv, d, seq_lens = case
    B = len(seq_lens)
    g = torch.Generator(device=device).manual_seed(2)
    q = torch.randn((B, hq, d), generator=g, device=device).to(dtype)
    k_pool, v_pool = _pool(sum(seq_lens), hkv, d, dtype, device)
    table, rows = _table(seq_lens, device)
    seq_t = torch.tensor(seq_lens, device=device)
    kv_bytes = 2 * hkv * d * k_pool.element_size() * sum(seq_lens)
    grid = decode_split_grid(B, hkv, 1, sm_count, DEFAULT_MAX_KV_SPLITS)
    default = decode_config(q.device, dtype, d, hq // hkv, direct=grid == 1, tuned=False)
    ws = decode_workspace(B, hq, d, DEFAULT_MAX_KV_SPLITS, device)

    wanted = (seq_t + DEFAULT_MIN_SPLIT_TOKENS - 1) // DEFAULT_MIN_SPLIT_TOKENS  # as the backend splits
    per_req: dict[int, object] = {}  # splits -> int32 [B], made before the timing (not timed)

    def call(cfg, splits: int):
        out = torch.empty_like(q)
        decode_attention_fwd(q, k_pool, v_pool, out, table, rows, seq_t, per_req[splits], splits,
                             d**-0.5, workspace=ws, config=cfg)
        return out

    variants = [(tuple(default), grid)] + [(c, grid) for c in configs]
    variants += [(tuple(default), max(1, min(int(grid * f), DEFAULT_MAX_KV_SPLITS))) for f in SPLIT_FACTORS]
    for _, splits in variants:
        per_req[splits] = torch.clamp(wanted, 1, splits).to(torch.int32)
    ref = call(default, grid)
    rows_out = []
    for c, splits in dict.fromkeys(variants):
        cfg = DecodeConfig(*c)
        rec = {"config": cfg._asdict(), "splits": splits, "default": cfg == default and splits == grid}
        rows_out.append(_measure(rec, lambda: call(cfg, splits), ref, timed, kv_bytes, "gbps", 1e9))
    return _mark_best({"case": name, "key": case_key("decode", case, dtype, sm_count), "kv_bytes": kv_bytes,
                       "grid_splits": grid, "configs": rows_out})


def run_gemv(shape, configs, timed, device, dtype) -> dict:
    """Time the Triton GEMV of ``gemv_kernel.py`` against cuBLAS (``F.linear`` of one row, what
    the engine runs) on one weight matrix; cuBLAS is the row marked ``default``."""
    import torch
    import torch.nn.functional as F

    from gemv_kernel import gemv

    name, n, k = shape
    g = torch.Generator(device=device).manual_seed(3)
    w = (torch.randn((n, k), generator=g, device=device) * k**-0.5).to(dtype)
    x = torch.randn((k,), generator=g, device=device).to(dtype)
    moved = (n * k + n + k) * w.element_size()
    ref = F.linear(x[None, :], w)[0]
    rows_out = [_measure({"config": {"cublas": True}, "default": True}, lambda: F.linear(x[None, :], w)[0], ref,
                         timed, moved, "gbps", 1e9)]
    for c in configs:
        rec = {"config": dict(zip(("block_n", "block_k", "num_warps", "num_stages"), c)), "default": False}
        rows_out.append(_measure(rec, lambda: gemv(x, w, *c), ref, timed, moved, "gbps", 1e9))
    return _mark_best({"case": f"gemv/{name}", "n": n, "k": k, "bytes": moved, "configs": rows_out})


def _mark_best(res: dict) -> dict:
    timed_ok = [r for r in res["configs"] if "ms" in r and not r["wrong"]]
    if timed_ok:
        best = min(timed_ok, key=lambda r: r["ms"])
        best["best"] = True
        default = next((r for r in timed_ok if r["default"]), None)
        if default:
            res["best_speedup"] = round(default["ms"] / best["ms"], 3)
    return res


def tuned_table(res: dict, device_name: str, triton_version: str, incomplete: frozenset = frozenset()) -> dict:
    """The tuned file (``lmnb_engine.attention.triton_ops.tuned``) these timings support. For each
    kind and key (head_dim, GQA group, dtype; decode: direct or split kernel) whose cases all ran
    (none of them in ``incomplete``, the keys of cases not yet run or failed): a configuration
    run correctly in every case beside the default (decode: at the engine's split grid), slower
    than the default in none beyond ``NOISE``, is kept if its total time is at least
    ``TUNED_MARGIN`` below the default's (the least such total per key). A prefill-only gain is
    not enough: with flash-attn running prefills, Triton runs the prefix-heavy extends."""
    from lmnb_engine.attention.triton_ops.tuned import TUNED_MARGIN

    table: dict = {"device": device_name, "triton": triton_version, "extend": {}, "decode": {}}
    for kind in ("extend", "decode"):
        by_key: dict = {}
        for r in res[kind]:
            by_key.setdefault(r["key"], []).append(r)
        for key, cases in by_key.items():
            if key in incomplete:
                continue
            pairs: dict = {}  # config (its values) -> [(ms, the default's ms), one per case]
            fields = None
            for r in cases:
                rows = [x for x in r["configs"] if x.get("splits") == r.get("grid_splits")]
                default = next((x for x in rows if x["default"] and "ms" in x and not x["wrong"]), None)
                for x in rows:
                    if default is not None and not x["default"] and "ms" in x and not x["wrong"]:
                        fields = tuple(x["config"])
                        pairs.setdefault(tuple(x["config"].values()), []).append((x["ms"], default["ms"]))
            kept = [(sum(a for a, _ in v) / sum(b for _, b in v), cfg) for cfg, v in pairs.items()
                    if len(v) == len(cases) and all(a <= (1 + NOISE) * b for a, b in v)]
            if kept and min(kept)[0] <= 1 - TUNED_MARGIN:
                table[kind][key] = dict(zip(fields, min(kept)[1]))
    return table


def fastest(results: list[dict], case: str, n: int) -> list[tuple]:
    """The configurations (tuples) of the ``n`` fastest correct runs of ``case`` in ``results``."""
    rows = next((r["configs"] for r in results if r["case"] == case), [])
    ok = sorted((r for r in rows if "ms" in r and not r["wrong"]), key=lambda r: r["ms"])
    return [tuple(r["config"].values()) for r in ok[:n]]


def report(res: dict, rate: str) -> str:
    lines = [f"== {res['case']}" + (f"  (best / default: {res['best_speedup']}x)" if "best_speedup" in res else "")]
    for r in res["configs"]:
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items()) + (f" splits={r['splits']}" if "splits" in r else "")
        mark = " ".join(word for word, on in (("default", r["default"]), ("BEST", r.get("best")),
                                               ("WRONG", r.get("wrong"))) if on)
        err = "not finite" if r.get("rel_err", 0) is None else f"{r.get('rel_err', 0):.1e}"
        body = r["error"] if "error" in r else f"{r['ms']:9.4f} ms {r[rate]:8.1f} {rate}  err {err}"
        lines.append(f"   {cfg:48s} {body}  {mark}")
    for key, label in (("sdpa", "torch SDPA (causal)"), ("varlen", "torch varlen_attn (FlashAttention-2)")):
        if key in res:
            s = res[key]
            body = s["error"] if "error" in s else f"{s['ms']:.4f} ms {s['tflops']} tflops"
            lines.append(f"   {label} {body}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in the CPU interpreter (checks the script runs)")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--write-tuned", metavar="PATH",
                    help="also write the tuned configurations (kept where >= 5%% faster) as a file for "
                         "$LMNB_TRITON_CONFIGS or lmnb_engine/attention/triton_ops/configs/ (they are in the JSON too)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    from gpu_suite import copy_gbps, machine_name

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --smoke on a CPU")
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16  # the interpreter's dots are float32 anyway
    machine = machine_name(device.type)
    sm_count = 4 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    device_name = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(0)
    timed = _timer(args.smoke)
    models = SMOKE_MODELS if args.smoke else MODELS
    res = {"meta": {"date": datetime.date.today().isoformat(), "machine": machine, "torch": torch.__version__,
                    "dtype": str(dtype)[6:], "tolerance": TOLERANCE},
           "extend": [], "decode": [], "gemv": [], "errors": []}
    import triton

    res["meta"]["triton"] = triton.__version__
    if not args.smoke:
        res["meta"]["copy_gbps"] = round(copy_gbps("cuda", 1 << 30, lambda fn: timed(fn) * 1e-3), 1)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{res['meta']['date']}-{machine}-kernels{'-smoke' if args.smoke else ''}.json"
    # decode first, the batched case before batch 1: gpu_check.sh gives this script a fixed time
    # (the JSON is written after each case), so Llama-3-8B's extend cases come last. The configs
    # are tried on the batched case only, where decode attention reads ~40 % of a step's bytes (at
    # batch 1, ~2 %: there only the split grid is worth a look).
    decode_configs = SMOKE_DECODE if args.smoke else DECODE_CONFIGS
    jobs = [("decode", c, lambda c=c: run_decode(c, decode_configs if len(c[-1]) > 1 else [], timed, device, dtype,
                                                 sm_count)) for c in decode_cases(models, args.smoke)[::-1]]
    first_model = models[0][0]

    def extend_configs(case) -> list:
        if case[1] == first_model:
            return SMOKE_EXTEND if args.smoke else EXTEND_CONFIGS
        return fastest(res["extend"], f"{first_model}/prefill", RERUN_BEST)

    extend_jobs = [("extend", c, lambda c=c: run_extend(c, extend_configs(c), timed, device, dtype))
                   for c in extend_cases(models, args.smoke)]
    gemv_jobs = [("gemv", (f"gemv/{s[0]}",), lambda s=s: run_gemv(s, SMOKE_GEMV if args.smoke else GEMV_CONFIGS,
                                                                 timed, device, dtype))
                 for s in (SMOKE_GEMV_SHAPES if args.smoke else GEMV_SHAPES)]
    jobs += extend_jobs[:2] + gemv_jobs + extend_jobs[2:]  # the GEMVs (8 quick compiles) before the second model
    # a key is tuned only once all its cases ran: a run cut short must not tune on half the cases
    keys = [case_key(kind, case, dtype, sm_count) if kind != "gemv" else None for kind, case, _ in jobs]
    failed: set = set()
    for i, (kind, case, job) in enumerate(jobs):
        try:
            r = job()
        except Exception as exc:  # noqa: BLE001 - one failed case must not lose the others
            res["errors"].append({"case": case[0], "error": f"{type(exc).__name__}: {exc}"})
            failed.add(keys[i])
        else:
            res[kind].append(r)
            print(report(r, "tflops" if kind == "extend" else "gbps"), flush=True)
        res["tuned"] = tuned_table(res, device_name, triton.__version__, frozenset(keys[i + 1:]) | failed)
        for out, text in ((path, json.dumps(res, indent=1)),
                          (Path(args.write_tuned) if args.write_tuned else None, json.dumps(res["tuned"], indent=1))):
            if out is not None:
                tmp = out.with_suffix(".tmp")  # whole or not at all, should `timeout` end the script here
                tmp.write_text(text)
                tmp.replace(out)
    if "copy_gbps" in res["meta"]:
        print(f"device copy: {res['meta']['copy_gbps']} GB/s (read + write)")
    for e in res["errors"]:
        print(f"ERROR {e['case']}: {e['error']}")
    print(f"tuned (>= 5% faster than the built-in configuration): {json.dumps(res['tuned'])}")
    print(f"kernels: {path}")
    return 1 if res["errors"] or not (res["extend"] and res["decode"] and res["gemv"]) else 0


if __name__ == "__main__":
    sys.exit(main())
