"""Few-shot workload on CPU: lmnb with the radix cache vs lmnb without it vs HF ``generate``.

The shape of the paper's MMLU 5-shot benchmark (§6, Fig. 5): one shared few-shot prefix, many
short questions after it, one output token each. Prompts are random token ids (seeded) over a
small random-weight Llama built on the fly (``make_tiny_checkpoint`` with larger dimensions), so
nothing is downloaded. Reported per system: wall time, requests/s, prompt tokens/s; for lmnb with
the cache: achieved hit rate (cached prompt tokens / prompt tokens, paper §3) and the optimal hit
rate of the workload (1 - distinct prefix positions / prompt tokens, paper A.3). HF runs
``generate`` in left-padded batches with no reuse across prompts: the baseline RadixAttention
replaces.

    OMP_NUM_THREADS=2 python benches/bench_fewshot_cpu.py --out benches/results/DATE-cpu-fewshot.md
"""

from __future__ import annotations

import argparse
import datetime
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/ is not a package

from cpu_bench import add_out_argument, llama_dims, machine_line, set_torch_threads, write_report  # noqa: E402


def optimal_hit_rate(prompts: list[list[int]]) -> float:
    """1 - (number of distinct prefixes) / (total prompt tokens): each distinct prefix position is
    computed once by an ideal cache."""
    seen: set = set()
    for p in prompts:
        for i in range(1, len(p) + 1):
            seen.add(tuple(p[:i]))
    return 1.0 - len(seen) / sum(len(p) for p in prompts)


def make_workload(vocab: int, prefix_len: int, questions: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low = 10  # keep clear of the special tokens at the start of the vocabulary
    prefix = [rng.randrange(low, vocab) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(low, vocab) for _ in range(rng.randint(36, 44))] for _ in range(questions)]


def run_lmnb(path: str, prompts, disable_radix_cache: bool, warmup) -> dict:
    from lmnb_engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    with Engine(path, max_total_tokens=16384, disable_radix_cache=disable_radix_cache) as eng:
        eng.generate(warmup, params)
        eng.flush_cache()
        t0 = time.perf_counter()
        results = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        stats = eng.cache_stats()
    return {"wall": wall, "tokens": [r.token_ids[0] for r in results], "hit_rate": stats["hit_rate"]}


def run_hf(path: str, prompts, batch_size: int, warmup) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def generate(batch):
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), 2, dtype=torch.long)  # 2 = <pad>
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):  # left padding, as decoder-only generate expects
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=2)
        return out[:, -1].tolist()

    generate(warmup)
    t0 = time.perf_counter()
    tokens = []
    for i in range(0, len(prompts), batch_size):
        tokens += generate(prompts[i : i + batch_size])
    return {"wall": time.perf_counter() - t0, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hf-batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    add_out_argument(ap)
    args = ap.parse_args()

    from lmnb_engine.testing import make_tiny_checkpoint

    threads = set_torch_threads()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(make_tiny_checkpoint(
            tmp, arch="llama", seed=args.seed, **llama_dims(args.hidden_size, args.layers)
        ))
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(path).vocab_size
        prompts = make_workload(vocab, args.prefix_len, args.questions, args.seed)
        warmup = make_workload(vocab, 64, 4, args.seed + 1)
        radix = run_lmnb(path, prompts, False, warmup)
        nocache = run_lmnb(path, prompts, True, warmup)
        hf = run_hf(path, prompts, args.hf_batch_size, warmup)

    n = len(prompts)
    prompt_tokens = sum(len(p) for p in prompts)
    optimal = optimal_hit_rate(prompts)
    same = radix["tokens"] == nocache["tokens"] == hf["tokens"]
    rows = [("lmnb, radix cache", radix), ("lmnb, cache disabled", nocache), ("HF generate, no reuse", hf)]
    lines = [
        f"# CPU few-shot benchmark ({datetime.date.today().isoformat()})",
        "",
        machine_line(threads),
        f"- model: random-weight Llama, hidden {args.hidden_size}, {args.layers} layers, vocab {vocab}, float32",
        f"- workload: shared prefix of {args.prefix_len} tokens + {n} questions of 36-44 tokens, 1 output token "
        f"each ({prompt_tokens} prompt tokens); HF batch size {args.hf_batch_size}",
        f"- command: `OMP_NUM_THREADS={threads} python benches/bench_fewshot_cpu.py`",
        "",
        "| system | wall (s) | requests/s | prompt tokens/s | speed-up vs HF |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['wall']:.2f} | {n / r['wall']:.2f} | {prompt_tokens / r['wall']:.0f} | "
            f"{hf['wall'] / r['wall']:.2f}x |"
        )
    lines += [
        "",
        f"- hit rate with the radix cache: achieved {radix['hit_rate']:.4f}, optimal {optimal:.4f} "
        f"({radix['hit_rate'] / optimal:.1%} of optimal)",
        f"- same output tokens in all three systems: {same}",
        "- goals (issue 2): >= 3x over HF without reuse; hit rate >= 97% of optimal",
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
