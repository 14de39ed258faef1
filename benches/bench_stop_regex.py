"""Stop-string / stop-regex matcher cost per output token, against the output's length.

Feeds ``StopStringMatcher`` a long synthetic output one token's text at a time, as the scheduler's
``_append_token`` does (``find(text, checked)``, then ``safe_len(text)`` for the stream), with a
few stop strings and stop regexes, and prints the matcher's microseconds per token around each
output length (the mean over the ``--window`` tokens ending there of each token's least time in
``--repeats`` runs).
Cases:

- ``strings``: stop strings only (each search is bounded to the new token's text);
- ``regexes``: the same plus stop regexes that never match, one of which (``BEGIN[\\s\\S]*?END``)
  never even partially matches this text;
- ``open``: the same, but the output starts with "BEGIN", so that regex's match stays open (a
  partial match from the output's start): the text that may still stop grows with the output.

    python benches/bench_stop_regex.py [--out benches/results/<date>-cpu-stop-regex.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmnb_engine.detokenizer import StopStringMatcher  # noqa: E402

STOPS = ["</answer>", "Observation:", "\n\nQuestion:"]
REGEXES = [r"BEGIN[\s\S]*?END", r"Answer: \d+\.", r"\bZZ\d+"]
# token texts: none holds a letter of "END", "Answer", "Observation", "Question" or "ZZ" in a way
# that completes a stop; "\n" and " " start partial matches of the stop strings now and then
PIECES = [" the", " a", " cat", " sat", " on", " mat", " with", " it", ",", ".", "\n", " 42", " 7",
          " is", " was", " big", " small", " to", " go", " up", "\n\n", " Q", " An", " <", "/"]
LENGTHS = (500, 1000, 2000, 4000, 8000)


def pieces(n: int, first: str | None) -> list[str]:
    """``n`` token texts, deterministic; ``first`` replaces the first one."""
    rng = random.Random(0)
    out = [rng.choice(PIECES) for _ in range(n)]
    if first is not None:
        out[0] = first
    return out


def run(tokens: list[str], regexes: list[str]) -> list[float]:
    """Seconds the matcher took for each token, fed as ``Scheduler._append_token`` does."""
    matcher = StopStringMatcher(STOPS, regexes)
    text, times = "", []
    clock = time.perf_counter
    for piece in tokens:
        t = clock()
        checked = len(text)
        text += piece
        hit = matcher.find(text, checked)
        matcher.safe_len(text)
        times.append(clock() - t)
        assert hit is None, hit  # the synthetic text never stops
    return times


def measure(tokens: list[str], regexes: list[str], window: int, repeats: int) -> dict[int, float]:
    """Microseconds per token over the ``window`` tokens ending at each of ``LENGTHS``: each token's
    least time over ``repeats`` runs (a run on this shared machine is now and then interrupted for
    tens of microseconds, which alone would double a window's mean), averaged."""
    runs = [run(tokens, regexes) for _ in range(repeats)]
    least = [min(ts) for ts in zip(*runs)]
    return {n: sum(least[n - window:n]) / window * 1e6 for n in LENGTHS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    import regex

    n = max(LENGTHS)
    cases = {
        "strings": (pieces(n, None), []),
        "regexes": (pieces(n, None), REGEXES),
        "open": (pieces(n, "BEGIN"), REGEXES),
    }
    rows = {name: measure(toks, rx, args.window, args.repeats) for name, (toks, rx) in cases.items()}
    lines = [
        f"python {platform.python_version()}, regex {regex.__version__}, {platform.machine()}; "
        f"stops {STOPS!r}, regexes {REGEXES!r}; us per token over the {args.window} tokens ending at "
        f"each length, each token's least of {args.repeats} runs",
        "",
        "| case | " + " | ".join(str(n) for n in LENGTHS) + " | 8000 / 500 |",
        "|---|" + "---:|" * (len(LENGTHS) + 1),
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[n]:.1f}" for n in LENGTHS)
                     + f" | {row[LENGTHS[-1]] / row[LENGTHS[0]]:.1f}x |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(f"<!-- {datetime.date.today()} -->\n" + report + "\n")


if __name__ == "__main__":
    main()
