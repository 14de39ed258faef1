"""Time aborting many waiting samples on the scheduler thread (what ``lmnb serve`` does when a
client of a big batch disconnects: one abort per prompt).

Usage: python benches/bench_abort_batch.py PROMPTS N  (PROMPTS prompts, each with N samples)
"""
import sys
import time

from lmnb_engine import Engine, SamplingParams


def main(prompts: int, n: int) -> None:
    """Submit ``prompts`` requests of ``n`` samples on the demo model, then abort every one in a
    single pause between steps, and print how long the scheduler thread took."""
    with Engine() as eng:
        handles = [eng.submit("hello there", SamplingParams(max_new_tokens=8, n=n)) for _ in range(prompts)]
        start = time.perf_counter()
        eng.scheduler.call(lambda: [eng._abort_here(h.rid) for h in handles]).result()
        took = time.perf_counter() - start
        assert all(h.done for h in handles)
        print(f"{prompts} prompts x n={n} ({prompts * n} samples): aborting them all took {took:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
