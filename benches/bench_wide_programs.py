"""Time programs that are wide: ``fork(N)`` and its join, and a ``select`` of N choices.

On the in-process engine with the tiny test checkpoint (``make_tiny_checkpoint``'s defaults, a
KV pool of 8192 tokens), one program per size, each in a process of its own so the peak memory
(max RSS) is the run's: ``s.fork(N)`` after a short prompt, then ``join`` (no gen: the cost of
the branches themselves), and ``s += prompt + select("x", choices=[f"c{i}" ...])``. Prints wall
and CPU seconds of the run (the engine's start left out): the CPU time of the process is the
steadier figure on a shared machine, whose load stretches wall time. Results:
``results/2026-12-06-cpu-wide-programs.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_one(checkpoint: str, what: str, n: int) -> dict:
    """One program of ``what`` ("fork" or "select") of width ``n``; its timings and max RSS."""
    import lmnb as sgl
    from lmnb_engine import Engine

    engine = Engine(model=checkpoint, max_total_tokens=8192)
    sgl.set_default_backend(sgl.Engine(engine=engine))

    @sgl.function
    def forks(s, n):
        s += "hello there"
        s.fork(n).join()

    @sgl.function
    def pick(s, choices):
        s += "pick one:" + sgl.select("x", choices=choices)

    wall, cpu = time.perf_counter(), time.process_time()
    state = forks.run(n=n) if what == "fork" else pick.run(choices=[f"c{i}" for i in range(n)])
    state.sync()
    out = {"what": what, "n": n, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
           "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
    engine.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fork", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--select", type=int, nargs="*", default=[1_000, 10_000])
    parser.add_argument("--one", nargs=3, metavar=("CHECKPOINT", "WHAT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # (the child: one program, its figures as JSON)
        print(json.dumps(run_one(args.one[0], args.one[1], int(args.one[2]))))
        return
    from lmnb_engine.testing import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = str(make_tiny_checkpoint(Path(tmp) / "ckpt"))
        print("| program | N | wall s | CPU s | max RSS MB |\n|---|---|---|---|---|")
        for what, sizes in (("fork", args.fork), ("select", args.select)):
            for n in sizes:
                done = subprocess.run([sys.executable, __file__, "--one", checkpoint, what, str(n)],
                                      capture_output=True, text=True, check=True, env=os.environ)
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {what} | {n} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['max_rss_mb']} |")


if __name__ == "__main__":
    main()
