"""Many concurrent streams against ``lmnb serve`` on CPU: do open streams bound the server?

Each open stream used to hold one of the server's ``MAX_WAITING_THREADS`` (512) pool threads while
it waited for its next event; past 512 open streams every later request, a one-token probe
included, waited for a stream to end before its submit could even run. Streams now wait on the
event loop (``RequestHandle.subscribe``). This bench opens ``--streams`` streamed ``/generate``
requests at once on a tiny random Llama checkpoint (built here, nothing downloaded), then sends a
non-streamed one-token probe once they are all open, and reports: wall time, time to each
stream's first chunk (p50/p99), the probe's latency, and the most threads the client saw in the
server process (``/proc/PID/status``).

    python benches/bench_server_streams.py --streams 600 --out benches/results/<date>-cpu-server-streams.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


@contextlib.contextmanager
def serve(model: Path, max_total_tokens: int):
    """``lmnb serve`` of ``model`` on a free port, in its own process (a client in this one would
    share the server's GIL): yields its URL and process id."""
    cmd = [sys.executable, "-c", "from lmnb_kernel.cli import main; main()", "serve", "--model", str(model),
           "--port", "0", "--device", "cpu", "--max-total-tokens", str(max_total_tokens), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            m = re.search(r"serving .* on (http://\S+)", line)
            if m:
                threading.Thread(target=proc.stderr.read, daemon=True).start()  # (keep the pipe drained)
                yield m.group(1), proc.pid
                break
        else:
            raise RuntimeError(f"lmnb serve exited ({proc.wait()}) without serving")
    finally:
        proc.terminate()
        proc.wait(30)


def threads_of(pid: int) -> int:
    """The number of threads process ``pid`` has now (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))


async def run_load(url: str, pid: int, streams: int, tokens: int) -> dict:
    """Open ``streams`` streams at once, probe once all are open; per-stream and probe timings (s),
    and the most threads server process ``pid`` had meanwhile."""
    import httpx

    body = {"text": "The river runs", "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                                         "ignore_eos": True}, "stream": True}
    opened = asyncio.Event()
    n_open = 0
    firsts: list[float] = []
    peak_threads = threads_of(pid)
    t0 = time.perf_counter()

    async def one(client) -> None:
        nonlocal n_open
        async with client.stream("POST", url + "/generate", json=body) as r:
            n_open += 1
            if n_open == streams:
                opened.set()
            first = None
            async for line in r.aiter_lines():
                if line.startswith("data:") and first is None:
                    first = time.perf_counter() - t0
            firsts.append(first)

    async def probe(client) -> float:
        await opened.wait()
        start = time.perf_counter()
        r = await client.post(url + "/generate", json={"text": "A", "sampling_params": {"max_new_tokens": 1}})
        r.raise_for_status()
        return time.perf_counter() - start

    async def sample() -> None:
        nonlocal peak_threads
        while True:
            peak_threads = max(peak_threads, threads_of(pid))
            await asyncio.sleep(0.05)

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    sampler = asyncio.ensure_future(sample())
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        results = await asyncio.gather(probe(client), *(one(client) for _ in range(streams)))
    sampler.cancel()
    wall = time.perf_counter() - t0
    firsts.sort()
    return {"streams": streams, "tokens": tokens, "wall_s": wall, "probe_s": results[0],
            "first_chunk_p50_s": statistics.median(firsts), "first_chunk_p99_s": firsts[int(0.99 * (len(firsts) - 1))],
            "peak_threads": peak_threads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=600)
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per stream")
    ap.add_argument("--out", type=Path, help="write the figures here (markdown) as well")
    args = ap.parse_args()

    from lmnb_engine.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(Path(tempfile.mkdtemp()), arch="llama", seed=0)
    with serve(path, 65536) as (url, pid):
        fig = asyncio.run(run_load(url, pid, args.streams, args.tokens))
    fig["python"] = platform.python_version()
    print(json.dumps(fig, indent=1))
    if args.out:
        args.out.write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    main()
