"""Time the batch job's CSV reader (``lmnb.batch.inputs.read_rows``) on a file of 200k rows.

The rows: an id, a question, and a context that is now plain, now quoted with a comma, with
doubled quotes, or over two lines (the file is written by Python's csv, so every row is good).
Prints the least and median of ``--repeats`` readings, in the process's CPU time (on a shared
machine its wall time swings with the other processes' load; the reading is single-threaded).
Results: ``results/2026-12-05-cpu-batch-csv.md``.
"""

from __future__ import annotations

import argparse
import csv
import random
import tempfile
import time
from pathlib import Path

from lmnb.batch.inputs import read_rows


def write_rows(path: Path, n: int) -> None:
    """``n`` rows and a header, CSV as Python's csv writes it (CRLF line ends; LF inside a value)."""
    rng = random.Random(0)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "question", "context"])
        for i in range(n):
            question = f"What is {rng.randint(0, 10**6)} plus {rng.randint(0, 99)}?"
            writer.writerow([i, question, rng.choice(["short", "a, with comma", 'say "hi"', "multi\nline text"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.csv"
        write_rows(path, args.rows)
        times = []
        for _ in range(args.repeats):
            start = time.process_time()
            count = sum(1 for row in read_rows(path) if row.error is None)
            times.append(time.process_time() - start)
    print(f"{count} rows of {args.rows} read: CPU time least {min(times):.3f} s, "
          f"median {sorted(times)[len(times) // 2]:.3f} s of {args.repeats}")


if __name__ == "__main__":
    main()
