"""Incremental detokenizer cost over long runs of byte tokens, against the run's length.

Feeds ``IncrementalDetokenizer`` an output one token at a time, as the scheduler does, and prints
the seconds the whole output took (the least of ``--repeats`` runs), with tokenizers built offline
(those of tests/test_detokenizer.py). Cases:

- ``start``: Llama 2's form of tokenizer (BPE with SentencePiece byte fallback; decoder
  ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``, ``Strip``), no prompt context, the output a
  space byte then N - 1 byte tokens of "中" (E4 B8 AD repeated, cut after N), then ``▁ok``:
  ``add`` then ``newest_text_start`` each token, as ``lmnb serve``'s ``/v1/completions`` works
  ``text_offset`` when ``logprobs`` is asked for.
- ``metaspace``: the same with the decoder ``Metaspace("▁")``, ``ByteFallback``, ``Fuse`` (the form of
  transformers' TIPSv2 tokenizer), no prompt context.
- ``stray``: byte-level BPE (the test checkpoints' tokenizer, ``train_tiny_tokenizer``), prompt
  "the answer", the output "ok", N tokens of the stray continuation byte 0x80, then " ok": ``add``.
- ``lead``: the same with N tokens of the lead byte E4 (each begins no character: the next is E4).
- ``split``: the same with N tokens "fÃ" ("f" then C3, the first byte of "é", which the next "f"
  shows begins no character).
- ``cjk``: the same tokenizer, text with no invalid byte ("東京 café 😀 and 中文 ok " repeated,
  multi-byte characters split across tokens) cut to N tokens: the cost of holding back a cut
  character in ordinary text.

Each case checks its text against the tokenizer's one-shot decode of the ids (less the U+FFFD of
a character cut at the end; and prints the last three text starts of ``start``), so a run before
and after a change shows the same output.

    python benches/bench_detokenizer_runs.py [--sizes 1000 4000] [--cases start metaspace stray lead split cjk] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def case_start(n: int):
    """(tokenizer, prompt, output ids, whether to ask newest_text_start each token) of ``start``."""
    from lmnb_engine.testing.byte_fallback import byte_fallback_tokenizer

    tok = byte_fallback_tokenizer()
    ids = ([1 + 0x20] + [1 + b for b in "中".encode()] * n)[:n] + [tok.convert_tokens_to_ids("▁ok")]
    return tok, [], ids, True


def case_metaspace(n: int):
    """``start`` with the decoder ``Metaspace("▁")``, ``ByteFallback``, ``Fuse``."""
    from tokenizers import decoders

    tok, prompt, ids, starts_too = case_start(n)
    tok.backend_tokenizer.decoder = decoders.Sequence(
        [decoders.Metaspace(replacement="▁", prepend_scheme="always"), decoders.ByteFallback(), decoders.Fuse()])
    return tok, prompt, ids, starts_too


def byte_level_tokenizer():
    """The byte-level BPE tokenizer of the test checkpoints (``tiny_checkpoint.train_tiny_tokenizer``)."""
    from transformers import PreTrainedTokenizerFast

    from lmnb_engine.testing.tiny_checkpoint import train_tiny_tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=train_tiny_tokenizer())


def _byte_run(token: bytes):
    def case(n: int):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        tok = byte_level_tokenizer()
        run = tok.convert_tokens_to_ids(["".join(bytes_to_unicode()[b] for b in token)] * n)
        ids = tok.encode("ok", add_special_tokens=False) + run + tok.encode(" ok", add_special_tokens=False)
        return tok, tok.encode("the answer", add_special_tokens=False), ids, False

    return case


def case_cjk(n: int):
    tok = byte_level_tokenizer()
    ids = tok.encode("東京 café 😀 and 中文 ok " * (n // 8 + 1), add_special_tokens=False)[:n]
    return tok, tok.encode("the answer", add_special_tokens=False), ids, False


CASES = {"start": case_start, "metaspace": case_metaspace, "stray": _byte_run(b"\x80"), "lead": _byte_run(b"\xe4"),
         "split": _byte_run(b"f\xc3"), "cjk": case_cjk}


def run(case: str, n: int, repeats: int) -> tuple[float, list[int]]:
    """(least seconds of ``repeats`` runs, the last three text starts) of ``case`` at size ``n``."""
    from lmnb_engine.detokenizer import IncrementalDetokenizer

    tok, prompt, ids, starts_too = CASES[case](n)
    best, starts = float("inf"), []
    for _ in range(repeats):
        d = IncrementalDetokenizer(tok, prompt)
        t0 = time.perf_counter()
        for i in ids:
            d.add(i)
            if starts_too:
                starts.append(d.newest_text_start())
        d.flush()
        best = min(best, time.perf_counter() - t0)
        want = tok.decode(ids, skip_special_tokens=True)
        assert d.text in (want, want[:-1]), (case, n, d.text[-10:], want[-10:])  # (less a cut character)
    return best, starts[-3:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    lines = [f"{datetime.date.today()} {platform.python_implementation()} {platform.python_version()}",
             "", "| case | N tokens | seconds | last text starts |", "|---|---:|---:|---|"]
    for case in args.cases:
        for n in args.sizes:
            secs, starts = run(case, n, args.repeats)
            lines.append(f"| {case} | {n} | {secs:.3f} | {starts or '-'} |")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
