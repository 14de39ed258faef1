"""Incremental detokenizer cost over long runs of byte tokens, against the run's length.

Feeds ``IncrementalDetokenizer`` an output one token at a time, as the scheduler does, and prints
the seconds the whole output took (the least of ``--repeats`` runs), with tokenizers built offline
(those of tests/test_detokenizer.py). Cases:

- ``start``: Llama 2's form of tokenizer (BPE with SentencePiece byte fallback; decoder
  ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``, ``Strip``), no prompt context, the output a
  space byte then N - 1 byte tokens of "中" (E4 B8 AD repeated, cut after N), then ``▁ok``:
  ``add`` then ``newest_text_start`` each token, as ``lmnb serve``'s ``/v1/completions`` works
  ``text_offset`` when ``logprobs`` is asked for.

Each case checks its text against the tokenizer's one-shot decode of the ids (and prints the last
three text starts), so a run before and after a change shows the same output.

    python benches/bench_detokenizer_runs.py [--sizes 1000 4000] [--cases start] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def byte_fallback_tokenizer():
    """Llama 2's form of tokenizer: the ``byte_fallback`` fixture of tests/test_detokenizer.py."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "o", "k", "ok", "▁a", "▁ok", "é"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("o", "k"), ("▁", "a"), ("▁", "ok")], byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken("<s>", normalized=False), AddedToken("</s>", normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def case_start(n: int):
    """(tokenizer, prompt, output ids, whether to ask newest_text_start each token) of ``start``."""
    tok = byte_fallback_tokenizer()
    ids = ([1 + 0x20] + [1 + b for b in "中".encode()] * n)[:n] + [tok.convert_tokens_to_ids("▁ok")]
    return tok, [], ids, True


CASES = {"start": case_start}


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
        assert d.text == want, (case, n, d.text[-10:], want[-10:])
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
            lines.append(f"| {case} | {n} | {secs:.3f} | {starts} |")
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
