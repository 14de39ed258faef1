"""Time the schedule policy's FCFS order of a long waiting queue, once per scheduler step: the sort
by arrival it did before (``sorted(waiting, key=ARRIVAL)``) against ``order()`` now that the
scheduler keeps the queue in arrival order (the queue itself, no copy), with a copy of the queue
for scale, and a retraction's insertion in its place.

Usage: python benches/bench_schedule_order.py [QUEUE_LENGTH ...]  (default 16384 640000: the most
samples one ``lmnb serve`` request queues, and the 5000 prompts x n=128 that led to that bound)
"""
import bisect
import sys
import timeit

from lmnb_engine.params import SamplingParams
from lmnb_engine.prefix_cache import NoPrefixCache
from lmnb_engine.request import Req
from lmnb_engine.schedule_policy import ARRIVAL, SchedulePolicy


def main(lengths: list[int]) -> None:
    """Print, per queue length, the time per order() call before and now, per copy of the queue,
    and per retraction."""
    policy = SchedulePolicy("fcfs", NoPrefixCache(None, None))
    params = SamplingParams()
    for n in lengths:
        waiting = []
        for i in range(n):
            r = Req(f"r{i}", 0, [1, 2, 3], params, tokenizer=None, emit=lambda e: None, seed=0)
            r.arrival = i
            waiting.append(r)
        reps = max(3, 2_000_000 // n)
        before = min(timeit.repeat(lambda: sorted(waiting, key=ARRIVAL), number=reps, repeat=3)) / reps
        now = min(timeit.repeat(lambda: policy.order(waiting), number=reps, repeat=3)) / reps
        copy = min(timeit.repeat(lambda: list(waiting), number=reps, repeat=3)) / reps
        back = waiting.pop(n // 2)  # a retracted request goes back among those that came after it

        def retract():
            bisect.insort(waiting, back, key=ARRIVAL)
            waiting.pop(n // 2)

        insort = min(timeit.repeat(retract, number=reps, repeat=3)) / reps
        print(f"queue {n}: sort {before * 1e3:.3f} ms, order() now {now * 1e6:.2f} us per step "
              f"(a copy of the queue: {copy * 1e3:.3f} ms); a retraction's insort and pop {insort * 1e3:.3f} ms")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16384, 640000])
