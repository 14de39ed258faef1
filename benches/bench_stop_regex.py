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

``--threads`` measures instead patterns whose automaton keeps many threads that never merge, so
that its states seldom repeat and most characters miss its transition cache (``a.{250}b`` over a
text of "a" and "c": a thread per "a" among the last 250 characters), each read by its automaton
and searched by the ``regex`` package (automaton disabled), one pattern at a time with no stop
strings: the median over ``--repeats`` runs of each run's mean microseconds per token.

``--fallback`` measures instead stop regexes the automaton does not take (word boundaries), alone
with no stop strings, at each output length as the default run does, in the cases of
``FALLBACK_CASES``: a bounded pattern (``regex_reach``) whose whole match lies in the first
``min_new_tokens`` (let through: the search's floor stays at it), a bounded one with a match open
at the end of each token's text, an unbounded one whose match stays open from the output's
start, unbounded ones with a lookbehind after their start (word boundaries or not), and one whose
match from every start stays open until the output ends (``[\s\S]+\Z``).

``--run`` measures instead stop regexes whose match stays open over a long run of letters with no
space (``RUN_CASES``: from every start of the run a match that a word boundary or an end anchor
ends, none final until a non-letter comes, or one a lookahead for a letter not in the run ends), fed 4 letters a token, alone: milliseconds per token
at each of ``RUN_LENGTHS`` characters (each token's least of ``--repeats`` runs, over the 10
tokens ending there), "given up" past the length where a search ran over ``REGEX_TIMEOUT_S``.

``--ends`` measures instead stop regexes the regex package searches whose match stays open over a
long run, where what the match must end with never comes (``ENDS_CASES``: patterns ending in a
lookbehind, ``\w+(?<=ing)``, and long bounded repeats, ``a{1,500}b``), alone, as ``--run`` does at
each of ``ENDS_LENGTHS`` characters.

    python benches/bench_stop_regex.py [--threads | --fallback | --run | --ends] [--out benches/results/<date>-cpu-stop-regex.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmnb_engine.stop_matcher import StopStringMatcher  # noqa: E402

STOPS = ["</answer>", "Observation:", "\n\nQuestion:"]
REGEXES = [r"BEGIN[\s\S]*?END", r"Answer: \d+\.", r"\bZZ\d+"]
# token texts: none holds a letter of "END", "Answer", "Observation", "Question" or "ZZ" in a way
# that completes a stop; "\n" and " " start partial matches of the stop strings now and then
PIECES = [" the", " a", " cat", " sat", " on", " mat", " with", " it", ",", ".", "\n", " 42", " 7",
          " is", " was", " big", " small", " to", " go", " up", "\n\n", " Q", " An", " <", "/"]
LENGTHS = (500, 1000, 2000, 4000, 8000)
# --threads: (pattern, alphabet of its text); the text is random over the alphabet, 4 characters a token
THREAD_CASES = [
    (r"a.{250}b", "ac"),  # ~125 threads of 252 positions, states never repeat
    (r"a.{100}b", "ac"),
    (r"a.{30}b", "ac"),
    (r"a.{8}b", "ac"),  # 2**8 states: the cache holds them all
    (r"(?:ab|ac|ad){10}e", ["ab", "ac", "ad"]),  # a thread per "a" among the last 20 characters
    (r"(?:ab|ac|ad){40}e", ["ab", "ac", "ad"]),
    (r"(?:ab|ac|ad){100}e", ["ab", "ac", "ad"]),  # 100 threads, few states; the search backtracks
    (r"[a-d]{100}e", "abcd"),  # a thread per start among the last 100 characters, one state
    (r"[a-d]{200}e", "abcd"),
]
THREAD_TOKENS = 2000
# --fallback: (name, pattern, first token text, min_new_tokens)
FALLBACK_CASES = [
    ("bounded, whole match in min_new_tokens", r"\bZZ\d{1,3}\b", "ZZ1", 2),
    ("bounded, open at each token's end", r"\b(?:the|a) (?:dog|fox)\b", None, 0),
    ("unbounded, open from the start", r"\bBEGIN\b[\s\S]*?\bEND\b", "BEGIN", 0),
    ("unbounded, a lookbehind after its start", r"\w+(?<=ing)\b", None, 0),
    ("unbounded, a negative lookbehind after its start", r"<\w+(?<!br)>", None, 0),
    ("unbounded, every match at the output's end", r"[\s\S]+\Z", None, 0),
]

# --run: patterns whose match stays open over a run of letters, and the run's lengths measured
RUN_CASES = [r"\w+\b", r"(?m)\w+$", r"[a-z]+\b(?!-)", r"a\w*(?!\w)", r"\w+(?<=ing)\b", r"\w+\b|x", r"a[^z]*(?=z)"]
RUN_LENGTHS = (250, 500, 1000, 2000, 4000, 8000)
# --ends: (pattern, the first token's text, every later token's text), none of whose matches the run
# holds, and the run's lengths measured
ENDS_CASES = [(r"\w+(?<=ing)", "abcd", "abcd"), (r"[a-z]+(?<=zz)", "abcd", "abcd"), (r"a.*(?<!a)", "aaaa", "aaaa"),
              (r"x[a-z]*(?<=q)", "xabc", "abcd"), (r"a{1,500}b", "aaaa", "aaaa"), (r"a{1,1000}b", "aaaa", "aaaa"),
              (r"[a-z]{1,300}[0-9]", "abcd", "abcd"), (r"[a-z]{1,200}(?<=zz)", "abcd", "abcd")]
ENDS_LENGTHS = (200, 800, 3200, 12800, 51200)


def pieces(n: int, first: str | None) -> list[str]:
    """``n`` token texts, deterministic; ``first`` replaces the first one."""
    rng = random.Random(0)
    out = [rng.choice(PIECES) for _ in range(n)]
    if first is not None:
        out[0] = first
    return out


def run(tokens: list[str], regexes: list[str], stops: list[str] = STOPS, min_new_tokens: int = 0) -> list[float]:
    """Seconds the matcher took for each token, fed as ``Scheduler._append_token`` does."""
    matcher = StopStringMatcher(stops, regexes)
    text, times = "", []
    clock = time.perf_counter
    for k, piece in enumerate(tokens, 1):
        t = clock()
        checked = len(text)
        text += piece
        hit = matcher.find(text, checked) if k >= min_new_tokens else None
        matcher.safe_len(text)
        times.append(clock() - t)
        assert hit is None, hit  # the synthetic text never stops
    return times


def measure(tokens: list[str], regexes: list[str], window: int, repeats: int, stops: list[str] = STOPS,
            min_new_tokens: int = 0) -> dict[int, float]:
    """Microseconds per token over the ``window`` tokens ending at each of ``LENGTHS``: each token's
    least time over ``repeats`` runs (a run on this shared machine is now and then interrupted for
    tens of microseconds, which alone would double a window's mean), averaged."""
    runs = [run(tokens, regexes, stops, min_new_tokens) for _ in range(repeats)]
    least = [min(ts) for ts in zip(*runs)]
    return {n: sum(least[n - window:n]) / window * 1e6 for n in LENGTHS}


def thread_tokens(alphabet, seed: int) -> list[str]:
    """``THREAD_TOKENS`` token texts of 4 characters (or alphabet items) drawn from ``alphabet``."""
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(4 if isinstance(alphabet, str) else 2))
            for _ in range(THREAD_TOKENS)]


def measure_threads(repeats: int) -> list[str]:
    """The ``--threads`` table: per pattern, us per token read by its automaton and searched."""
    from lmnb_engine import stop_automaton, stop_matcher

    lines = [f"{THREAD_TOKENS} tokens of random text, no stop strings; us per token: median of {repeats} runs "
             "(each run's mean), min in brackets; a fresh matcher each run, the shared automaton's cache kept",
             "", "| pattern | text | positions | automaton | searched | automaton / searched |", "|---|---|---:|---:|---:|---:|"]
    for pattern, alphabet in THREAD_CASES:
        tokens = thread_tokens(alphabet, 0)
        a = stop_automaton.automaton(pattern)
        assert a is not None, pattern
        per = {"automaton": [], "searched": []}
        for _ in range(repeats):  # (interleaved: the shared machine's load falls on both alike)
            for how in per:
                stop_matcher.automaton = stop_automaton.automaton if how == "automaton" else (lambda p, loosened=False: None)
                per[how].append(sum(run(tokens, [pattern], [])) / len(tokens) * 1e6)
        stop_matcher.automaton = stop_automaton.automaton
        med = {how: statistics.median(ts) for how, ts in per.items()}
        cells = " | ".join(f"{med[h]:.1f} ({min(per[h]):.1f})" for h in per)
        lines.append(f"| `{pattern}` | {'/'.join(alphabet)} | {len(a._leaves)} | {cells} | "
                     f"{med['automaton'] / med['searched']:.2f} |")
        print(lines[-1], flush=True)
    return lines


def measure_run(repeats: int, cases: list[tuple[str, str, str]] | None = None,
                lengths: tuple[int, ...] = RUN_LENGTHS) -> list[str]:
    """The ``--run`` table: per pattern, ms per token at each of ``lengths`` characters of a run;
    ``cases``: (pattern, first token's text, later tokens' text), each ``RUN_CASES`` over "abcd"
    tokens where not given (``--ends``)."""
    cases = cases or [(p, "abcd", "abcd") for p in RUN_CASES]
    lines = [f"a run, 4 characters a token, no stop strings; ms per token over the 10 tokens ending at each "
             f"length, each token's least of {repeats} runs", "",
             "| pattern | run | " + " | ".join(str(n) for n in lengths) + " |", "|---|---|" + "---:|" * len(lengths)]
    for pattern, first, later in cases:
        tokens = [first] + [later] * (max(lengths) // 4 - 1)
        runs = []
        for _ in range(repeats):
            matcher, text, times = StopStringMatcher([], [pattern]), "", []
            for piece in tokens:
                t = time.perf_counter()
                checked, text = len(text), text + piece
                hit = matcher.find(text, checked)
                matcher.safe_len(text)
                times.append(None if matcher.problem else time.perf_counter() - t)
                assert hit is None, hit  # (no match in the run is final)
                if matcher.problem:
                    break
            runs.append(times + [None] * (len(tokens) - len(times)))
        least = [None if None in ts else min(ts) for ts in zip(*runs)]
        cells = []
        for n in lengths:
            window = least[n // 4 - 10:n // 4]
            cells.append("given up" if None in window else f"{sum(window) / len(window) * 1e3:.2f}")
        cell = pattern.replace("|", r"\|")  # (a "|" would end the table's cell)
        lines.append(f"| `{cell}` | {first}{later}... | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", action="store_true", help="the many-threads patterns, automaton vs searched")
    ap.add_argument("--fallback", action="store_true", help="patterns the automaton does not take")
    ap.add_argument("--run", action="store_true", help="patterns whose match stays open over a run of letters")
    ap.add_argument("--ends", action="store_true",
                    help="patterns ending in a lookbehind, and long bounded repeats, open over a run")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args()
    import regex

    if args.fallback:
        n = max(LENGTHS)
        lines = [f"python {platform.python_version()}, regex {regex.__version__}, {platform.machine()}; no stop "
                 f"strings; us per token over the {args.window} tokens ending at each length, each token's least "
                 f"of {args.repeats} runs", "",
                 "| case | pattern | " + " | ".join(str(n) for n in LENGTHS) + " | 8000 / 500 |",
                 "|---|---|" + "---:|" * (len(LENGTHS) + 1)]
        for name, pattern, first, min_new in FALLBACK_CASES:
            row = measure(pieces(n, first), [pattern], args.window, args.repeats, [], min_new)
            lines.append(f"| {name} | `{pattern}` | " + " | ".join(f"{row[n]:.1f}" for n in LENGTHS)
                         + f" | {row[LENGTHS[-1]] / row[LENGTHS[0]]:.1f}x |")
            print(lines[-1], flush=True)
        if args.out:
            args.out.write_text(f"<!-- {datetime.date.today()} -->\n" + "\n".join(lines) + "\n")
        return
    if args.run or args.threads or args.ends:
        table = (measure_run(args.repeats) if args.run else measure_run(args.repeats, ENDS_CASES, ENDS_LENGTHS)
                 if args.ends else measure_threads(args.repeats))
        report = "\n".join([f"python {platform.python_version()}, regex {regex.__version__}, {platform.machine()}; "]
                           + table)
        if args.out:
            args.out.write_text(f"<!-- {datetime.date.today()} -->\n" + report + "\n")
        return

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
