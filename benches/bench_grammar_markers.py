"""Grammar compile with and without the start/end markers (``lmnb_engine.constrained.grammar``).

For a top-level JSON string with ``maxLength`` N (pydantic's ``Field(max_length=N)``): seconds to
build outlines-core's index of the bare regex (in the engine's child process, stopped at 60 s)
against ``compile_grammar``, which builds it between the markers; and, for SGLang's float dtype
regex, the tokens each allows after ``3`` (the bare index drops the ``.``: no fraction can follow).
Demo vocabulary (939 tokens).

    OMP_NUM_THREADS=2 python benches/bench_grammar_markers.py --out benches/results/DATE-cpu-grammar-markers.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/ is not a package

from cpu_bench import add_out_argument, cpu_name, write_report  # noqa: E402

LIMIT_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out_argument(parser)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from lmnb.ir import REGEX_FLOAT
    from lmnb_engine.constrained import compile_grammar, schema_to_regex
    from lmnb_engine.constrained.index_process import IndexBuildError, build_index
    from lmnb_engine.constrained.vocab import TokenVocabulary
    from lmnb_engine.model_loader import DEMO_MODEL_PATH

    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_PATH)
    vocab = TokenVocabulary(tokenizer)
    rows = []
    for n in (8, 12, 14, 16, 20, 100, 1000):
        regex = schema_to_regex({"type": "string", "maxLength": n})
        start = time.perf_counter()
        try:
            build_index(regex, vocab.outlines_vocabulary(), LIMIT_S)
            bare = f"{time.perf_counter() - start:.2f}"
        except IndexBuildError as e:
            bare = f"stopped ({e.reason}) after {time.perf_counter() - start:.0f}"
        start = time.perf_counter()
        compile_grammar(regex, vocab, LIMIT_S)
        rows.append(f"| {n} | {bare} | {time.perf_counter() - start:.2f} |")

    from lmnb_engine.constrained.regex_syntax import automaton_syntax

    user_rows = []  # user regexes whose classes take any character: the markers must cost nothing there
    for pattern in (".{0,16}", ".{0,40}", "Name: .{1,100}", "[^\\n]{1,60}"):
        start = time.perf_counter()
        build_index(pattern, vocab.outlines_vocabulary(), LIMIT_S)
        bare = time.perf_counter() - start
        start = time.perf_counter()
        compile_grammar(automaton_syntax(pattern), vocab, LIMIT_S)
        user_rows.append(f"| `{pattern}` | {bare:.2f} | {time.perf_counter() - start:.2f} |")

    three = vocab.encode("3")
    bare_index = build_index(REGEX_FLOAT, vocab.outlines_vocabulary(), LIMIT_S)
    state = bare_index.get_initial_state()
    for t in three:
        state = bare_index.get_next_state(state, t)
    bare_after = sorted({vocab.token_bytes[t] for t in bare_index.get_allowed_tokens(state) if t < vocab.vocab_size
                         and vocab.token_bytes[t] is not None})
    grammar = compile_grammar(REGEX_FLOAT, vocab, LIMIT_S)
    state = grammar.initial_state
    for t in three:
        state = grammar.next_state(state, t)
    marked_after = sorted({vocab.token_bytes[t] for t in grammar.allowed_ids(state) if vocab.token_bytes[t] is not None})
    lines = [
        f"# Grammar compile with the start/end markers ({datetime.date.today()})", "",
        f"- machine: {cpu_name()}, nproc {os.cpu_count()} (shared machine: other jobs ran)",
        "- vocabulary: the demo model's (939 tokens); the bare index is built in the engine's child process, "
        f"stopped at {LIMIT_S:g} s",
        "- command: `OMP_NUM_THREADS=2 python benches/bench_grammar_markers.py`", "",
        '| `{"type": "string", "maxLength": N}`, N | bare index (s) | compile_grammar, markers (s) |',
        "|---|---|---|", *rows, "",
        "| `gen(regex=...)` | bare index (s) | compile_grammar, markers (s) |", "|---|---|---|", *user_rows, "",
        f"Tokens allowed after `3` under the float dtype regex `{REGEX_FLOAT}`:", "",
        f"- bare index: {len(bare_after)}: {', '.join(repr(b.decode()) for b in bare_after)}",
        f"- with the markers: {len(marked_after)}: {', '.join(repr(b.decode()) for b in marked_after)}",
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
