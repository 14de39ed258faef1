"""Host time per decode step outside the model forward: what a GPU waits for between steps.

On a GPU the scheduler's Python work (choosing rows, building the ``ForwardBatch``, sampling's
host side, detokenizing, stop checks, events) runs while the GPU is idle, since each step ends
with the sampled ids coming back to the host. At batch 1 of a 7B model a forward takes ~3.2 ms
on an H200 (research runtime_bench §6), so every 100 us of host time costs ~3% of decode speed.
This bench measures that host time on a CPU, with a model so small that its forward is cheap,
and splits each step into the forward (``ModelRunner.forward``) and the rest; and the same for a
4 x 2048-token prefill (the suite's), whose host part the GPU's prefill figure includes. With
overlapped decoding (the default) the rest would run while the GPU computes the next step; on a
CPU nothing runs concurrently, so here it is the host work itself, overlapped or not.

    python benches/bench_step_overhead.py [--out benches/results/<date>-cpu-step-overhead.md]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import cpu_bench  # noqa: E402


class _Timer:
    """Wraps a callable and sums the wall time spent inside it."""

    def __init__(self, fn) -> None:
        self.fn, self.total, self.calls = fn, 0.0, 0

    def __call__(self, *a, **kw):
        t = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.total += time.perf_counter() - t
            self.calls += 1


def measure(engine, batch: int, new_tokens: int, repeats: int) -> dict:
    """Per-step host figures (microseconds) of ``repeats`` decode runs of ``batch`` requests."""
    from lmnb_engine import SamplingParams

    sched = engine.scheduler
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    prompts = [[5 + (i * 7 + j) % 400 for j in range(24)] for i in range(batch)]
    engine.generate(prompts, SamplingParams(max_new_tokens=0))  # prefill cached: the runs are decode
    steps, fwd = [], []
    for _ in range(repeats):
        forward = _Timer(sched.runner.forward)
        step = _Timer(sched._step)
        sched.runner.forward, sched._step = forward, step
        try:
            engine.generate(prompts, params)
        finally:
            del sched.runner.forward, sched._step
        steps.append(step.total / forward.calls * 1e6)  # per forward: a step may launch the next
        fwd.append(forward.total / forward.calls * 1e6)
    best = min(range(repeats), key=lambda i: steps[i])  # the run least disturbed by other load
    return {"batch": batch, "step_us": steps[best], "forward_us": fwd[best], "host_us": steps[best] - fwd[best]}


def measure_prefill(engine, n_seq: int, seq: int, repeats: int) -> dict:
    """Host time (ms) of one ``generate`` of ``n_seq`` random ``seq``-token prompts (1 new token,
    cache flushed first) outside ``ModelRunner.forward``: the caller's prompt checks, admission,
    batch building, sampling, events (gpu_suite's prefill figure counts all of it)."""
    import torch

    from lmnb_engine import SamplingParams

    runner = engine.scheduler.runner
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    runs = []
    for _ in range(repeats):
        prompts = [torch.randint(10, 400, (seq,), generator=g).tolist() for _ in range(n_seq)]
        engine.flush_cache()
        forward = _Timer(runner.forward)
        runner.forward = forward
        try:
            t = time.perf_counter()
            engine.generate(prompts, params)
            total = time.perf_counter() - t
        finally:
            del runner.forward
        runs.append((total - forward.total) * 1e3)
    return {"prompts": f"{n_seq} x {seq}", "host_ms": min(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    cpu_bench.add_out_argument(ap)
    args = ap.parse_args()
    threads = cpu_bench.set_torch_threads()
    from lmnb_engine import Engine
    from lmnb_engine.testing import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_checkpoint(tmp, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1)
        rows = []
        with Engine(str(path), device="cpu", max_total_tokens=8192, attention_backend="torch") as eng:
            for batch in (1, 8, 32):
                rows.append(measure(eng, batch, args.new_tokens, args.repeats))
        long_path = make_tiny_checkpoint(f"{tmp}/long", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
        with Engine(str(long_path), device="cpu", max_total_tokens=16384, chunked_prefill_size=8192,
                    attention_backend="torch") as eng:
            prefill = measure_prefill(eng, 4, 2048, args.repeats)
    lines = [f"# Host time per decode step, {datetime.date.today().isoformat()}", "",
             cpu_bench.machine_line(threads),
             "- model: random Llama, 1 layer, hidden 64 (its forward stands in for a GPU's launch work)",
             f"- {args.new_tokens} greedy tokens per request, best of {args.repeats} runs; microseconds per step", "",
             "| batch | step | forward | host: scheduling, batch building, sampling, detokenizing, events |",
             "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['step_us']:.0f} | {r['forward_us']:.0f} | {r['host_us']:.0f} |")
    lines += ["", f"Prefill of {prefill['prompts']} tokens (one forward, 1 new token), host time outside the "
              f"forward, caller's prompt checks included: {prefill['host_ms']:.1f} ms"]
    cpu_bench.write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
