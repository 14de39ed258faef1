"""Grammar compile cost: outlines-core's token index built in this process vs in the child process
the engine uses (``lmnb_engine.constrained.index_process``), and how an exploding automaton ends.

The child costs a Python start, a pickled ``Vocabulary`` in and a pickled ``Index`` out; it buys a
compile that is killed at its time limit and capped in memory. Measured on the demo vocabulary
(939 tokens) and on a synthetic 128,256-token byte vocabulary (Llama-3's size; random words over
JSON's characters), for a JSON schema of a small record; then ``[a-z]*a[a-z]{N}``, whose DFA
doubles with each N, under a 2 s limit. Both builds must give the same transitions.

    OMP_NUM_THREADS=2 python benches/bench_grammar_compile.py --out benches/results/DATE-cpu-grammar-compile.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/ is not a package

from cpu_bench import add_out_argument, cpu_name, write_report  # noqa: E402

RECORD = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"enum": ["Tessaly", "Orvane", "Mirwick"]}},
    "required": ["name", "age", "city"],
}


def synthetic_vocabulary(size: int, seed: int = 0):
    """An ``outlines_core.Vocabulary`` of every single byte plus random 2-8 byte words."""
    from outlines_core import Vocabulary

    rng = random.Random(seed)
    tokens: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256)}
    chars = b'abcdefghijklmnopqrstuvwxyz {}":,0123456789ABCDEFG'
    while len(tokens) < size - 1:
        tokens.setdefault(bytes(rng.choice(chars) for _ in range(rng.randint(2, 8))), [len(tokens)])
    return Vocabulary(size - 1, tokens)  # the last id is EOS


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out_argument(parser)
    args = parser.parse_args()
    from outlines_core import Index
    from transformers import AutoTokenizer

    from lmnb_engine.constrained import GrammarBackend, GrammarCache, GrammarError
    from lmnb_engine.constrained.index_process import build_index
    from lmnb_engine.constrained.schema import schema_to_regex
    from lmnb_engine.constrained.vocab import TokenVocabulary
    from lmnb_engine.model_loader import DEMO_MODEL_PATH

    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_PATH)
    regex = schema_to_regex(RECORD)
    rows = []
    for label, vocab in (("demo (939 tokens)", TokenVocabulary(tokenizer).outlines_vocabulary()),
                         ("synthetic (128,256 tokens)", synthetic_vocabulary(128256))):
        same = Index(regex, vocab).get_transitions() == build_index(regex, vocab, 120).get_transitions()
        inside = best_of(lambda: Index(regex, vocab))
        child = best_of(lambda: build_index(regex, vocab, 120))
        rows.append(f"| {label} | {inside * 1000:.0f} | {child * 1000:.0f} | {(child - inside) * 1000:+.0f} | {same} |")
    backend = GrammarBackend(tokenizer, cache=GrammarCache(), compile_timeout_s=2.0)
    blowup = []
    for n in (12, 14, 16, 40):
        start = time.perf_counter()
        try:
            backend.wait(f"[a-z]*a[a-z]{{{n}}}")
            outcome = "compiled"
        except GrammarError as e:
            outcome = "GrammarError: " + str(e).split(",")[0]
        blowup.append(f"| [a-z]*a[a-z]{{{n}}} | {time.perf_counter() - start:.2f} | {outcome} |")
    backend.shutdown()
    lines = [
        f"# Grammar compile: in-process vs child-process index build ({datetime.date.today()})", "",
        f"- machine: {cpu_name()}, nproc {os.cpu_count()} (shared machine: other jobs ran)",
        f"- regex: the JSON schema of a 3-field record ({len(regex)} chars); best of 3",
        "- command: `OMP_NUM_THREADS=2 python benches/bench_grammar_compile.py`", "",
        "| vocabulary | in this process (ms) | child process (ms) | difference (ms) | same transitions |",
        "|---|---|---|---|---|", *rows, "",
        "Exploding automaton (the DFA doubles per repeat), compile_timeout_s = 2 (demo vocabulary):", "",
        "| pattern | seconds to the answer | outcome |", "|---|---|---|", *blowup,
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
