"""Where a step's GPU time goes, kernel by kernel (issue 9): the profile behind the suite's MBU and MFU.

    python benches/gpu_profile.py                  # on a GPU: Llama-2-7B shape, random bf16 weights
    python benches/gpu_profile.py --smoke          # on a CPU: a tiny checkpoint, CPU ops (checks it runs)

The suite (``gpu_suite.py``) measures decode tok/s and prefill tok/s; the first H200 run
(``results/2026-12-04-nvidia-h200.md``) left batch-1 decode at MBU 0.71 with the host adding only
0.06 ms to a 4.5 ms CUDA graph, so the gap is inside the graph. This script runs the same
micro-benchmarks once under ``torch.profiler`` (CUPTI reports the kernels a CUDA-graph replay
launches like any others) and sums each kernel's device time by name:

- ``decode_b1`` / ``decode_b32``: 512-token prompts (prefilled first), 32 new tokens, CUDA graphs;
- ``decode_b1_eager``: the same without the graphs (the runner's graphs set aside), for the launch
  gaps the graph removes;
- ``prefill``: 4 prompts of 2048 tokens, one new token.

For each: wall time, summed kernel time per step, and the kernels that take most of it (name, calls,
ms, share), with a coarse class (matmul, attention, norm, rope, activation, kv store, sampling,
other) summed too; and, where operators run (eager forwards, prefill), each linear layer's time
and bandwidth by shape, against the suite's measured copy bandwidth (4.17 TB/s read + write on the
first H200). Writes ``<out-dir>/<date>-<machine>-profile.json`` and prints the tables.
Run separately from the suite (``gpu_check.sh`` runs it last): a profiler fault cannot cost the
suite's figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, when not installed

TOP = 15
# Kernel name -> class, first match wins (cuBLAS/CUTLASS GEMM names vary by library version).
CLASSES = [
    ("attention", r"extend|decode|flash|attn"),
    ("kv store", r"kv_store|store_kv|kv_write|index_put|scatter"),
    ("matmul", r"gemm|gemv|cutlass|xmma|nvjet|sm\d+_|cublas|matmul|addmm|\bmm\b|linear"),
    ("norm", r"rms|norm"),
    ("rope", r"rope|rotary"),
    ("activation", r"silu|gelu|act_and_mul|swiglu"),
    ("sampling", r"argmax|softmax|sort|topk|multinomial|log_softmax|max"),
]


def classify(name: str) -> str:
    """The coarse class of a kernel (or, on CPU, an operator) name; "other" if none matches."""
    low = name.lower()
    return next((cls for cls, pat in CLASSES if re.search(pat, low)), "other")


def profile_call(fn, device: str, elt_bytes: int = 2) -> dict:
    """Run ``fn`` once under torch.profiler (after one unprofiled warm-up call) and sum the device
    time of each kernel by name (on CPU: the self time of each operator).

    Also, per shape of ``nn.Linear`` call (``aten::linear`` with ``record_shapes``), the time of
    the kernels it launched and the bandwidth that makes: bytes = ``elt_bytes`` x (M·K input +
    N·K weight + M·N output). Eager forwards only: a CUDA-graph replay runs no operator, so its
    kernels have no shapes (they are still in ``top``).

    Returns:
        {"wall_ms", "kernel_ms" (the sum over all kernels), "top": [{"name", "class", "calls", "ms",
        "share"}, ...] (the ``TOP`` largest), "by_class": {class: ms}, "linears": [{"m", "k", "n",
        "calls", "us_per_call", "gbps"}, ...] (largest total first)}; times in milliseconds unless
        named otherwise, bandwidth in GB/s.
    """
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # the engine's forwards run on its scheduler thread: operators are recorded there only with
    # profile_all_threads (torch >= 2.7; CUPTI records the GPU's kernels from every thread anyway)
    try:
        from torch._C._profiler import _ExperimentalConfig

        extra = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        extra = {}
    t = time.perf_counter()
    with profile(activities=activities, record_shapes=True, **extra) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t
    rows = []
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue  # CPU-side operators: their kernels are listed themselves
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append({"name": e.key, "class": classify(e.key), "calls": e.count, "ms": us / 1e3})
    total = sum(r["ms"] for r in rows)
    rows.sort(key=lambda r: -r["ms"])
    by_class: dict[str, float] = {}
    for r in rows:
        by_class[r["class"]] = by_class.get(r["class"], 0.0) + r["ms"]
        r["share"] = round(r["ms"] / total, 4) if total else 0.0
        r["ms"] = round(r["ms"], 3)
    linears = []  # (total microseconds, record)
    for e in prof.key_averages(group_by_input_shape=True):
        shapes = e.input_shapes
        if e.key != "aten::linear" or len(shapes) < 2 or len(shapes[0]) != 2 or len(shapes[1]) != 2:
            continue
        (m, k), (n, _) = shapes[0], shapes[1]
        us = e.device_time_total if cuda else e.cpu_time_total
        if us > 0:
            moved = elt_bytes * (m * k + n * k + m * n) * e.count
            linears.append((us, {"m": m, "k": k, "n": n, "calls": e.count, "us_per_call": round(us / e.count, 2),
                                 "gbps": round(moved / (us * 1e-6) / 1e9, 1)}))
    linears.sort(key=lambda pair: -pair[0])
    return {"wall_ms": round(wall * 1e3, 2), "kernel_ms": round(total, 3), "top": rows[:TOP],
            "by_class": {k: round(v, 3) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "linears": [record for _, record in linears]}


def scenarios(engine, smoke: bool):
    """(name, steps, setup, graphs) for each profiled run: ``setup()`` prefills what the run needs
    and returns ``fn``, which runs the one measured generate call."""
    from lmnb_engine import SamplingParams

    vocab = engine.loaded.config.vocab_size
    import torch

    g = torch.Generator().manual_seed(7)

    def tokens(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=g).tolist()

    greedy = dict(temperature=0.0, ignore_eos=True)
    prompt_len, new = (16, 4) if smoke else (512, 32)
    n_seq, seq = (2, 32) if smoke else (4, 2048)

    def decode(bs: int):
        prompts = [tokens(prompt_len) for _ in range(bs)]
        engine.generate(prompts, SamplingParams(max_new_tokens=0))  # prefilled: the run is decode

        def run():
            engine.generate(prompts, SamplingParams(max_new_tokens=new, **greedy))
        return run

    def prefill():
        engine.flush_cache()
        engine.generate([tokens(seq) for _ in range(n_seq)], SamplingParams(max_new_tokens=1, **greedy))

    return [("decode_b1", new, lambda: decode(1), True), ("decode_b1_eager", new, lambda: decode(1), False),
            ("decode_b32", new, lambda: decode(4 if smoke else 32), True), ("prefill", 1, lambda: prefill, True)]


def tuned_in_effect(engine) -> dict:
    """The tuned kernel configurations the engine's GPU runs with ({} on CPU: nothing imported)."""
    if engine.runner.device.type != "cuda":
        return {}
    from lmnb_engine.attention.triton_ops.tuned import table_in_effect

    return table_in_effect(engine.runner.device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny checkpoint on CPU (checks the script runs)")
    ap.add_argument("--model", default="llama-2-7b", help="shape preset (random bf16 weights)")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # CUPTI torn down after one profile and set up again for the next failed (crashes, or no GPU
    # events) with CUDA graphs captured before it (pytorch#112507, kineto#1554): keep it up
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from gpu_suite import machine_name
    from lmnb_engine import Engine

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --smoke on a CPU")
    device = "cpu" if args.smoke else "cuda"
    machine = machine_name(device)
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            from lmnb_engine.testing import make_tiny_checkpoint

            model = str(make_tiny_checkpoint(tmp, num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                             num_attention_heads=4, num_key_value_heads=2))
            engine = Engine(model, device="cpu", max_total_tokens=4096)
        else:
            model = args.model
            engine = Engine(model, random_weights=True, device="cuda", dtype="bfloat16")
        res = {"meta": {"date": datetime.date.today().isoformat(), "machine": machine,
                        "model": "tiny-llama (smoke)" if args.smoke else args.model,
                        "torch": torch.__version__, "attention_backend": engine.runner.attn.name,
                        "cuda_graphs": engine.runner.graph_runner is not None,
                        "triton_configs": tuned_in_effect(engine)}, "runs": {}, "errors": []}
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{res['meta']['date']}-{machine}-profile{'-smoke' if args.smoke else ''}.json"
        try:
            for name, steps, setup, graphs in scenarios(engine, args.smoke):
                runner = engine.runner
                saved = runner.graph_runner
                if not graphs:
                    runner.graph_runner = None  # eager forwards: what the graph saves, kernel by kernel
                try:
                    r = profile_call(setup(), device, elt_bytes=4 if args.smoke else 2)
                    if not r["top"]:  # (a profiler that recorded nothing must not pass for a profile)
                        raise RuntimeError("the profiler recorded no kernel")
                except Exception as exc:  # noqa: BLE001 - one failed profile must not lose the others
                    res["errors"].append({"run": name, "error": f"{type(exc).__name__}: {exc}"})
                    path.write_text(json.dumps(res, indent=1))
                    continue
                finally:
                    runner.graph_runner = saved
                r.update(steps=steps, kernel_ms_per_step=round(r["kernel_ms"] / steps, 3),
                         wall_ms_per_step=round(r["wall_ms"] / steps, 3))
                res["runs"][name] = r
                path.write_text(json.dumps(res, indent=1))
                print(report(name, r), flush=True)
        finally:
            engine.shutdown()
        path.write_text(json.dumps(res, indent=1))
    for e in res["errors"]:
        print(f"ERROR {e['run']}: {e['error']}")
    print(f"profile: {path}")
    return 1 if res["errors"] else 0


def report(name: str, r: dict) -> str:
    lines = [f"== {name}: wall {r['wall_ms_per_step']} ms/step, kernels {r['kernel_ms_per_step']} ms/step "
             f"({r['steps']} steps)",
             "   by class: " + ", ".join(f"{k} {v:.2f} ms" for k, v in r["by_class"].items())]
    lines += [f"   {t['share']:6.1%} {t['ms']:9.3f} ms {t['calls']:6d}x  [{t['class']}] {t['name'][:100]}"
              for t in r["top"]]
    lines += [f"   linear [{x['m']}x{x['k']}] x [{x['k']}x{x['n']}]: {x['calls']}x {x['us_per_call']} us, {x['gbps']} GB/s"
              for x in r["linears"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
