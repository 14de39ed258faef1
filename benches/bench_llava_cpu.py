"""LLaVA-bench-shaped workload on CPU: images/s of lmnb with the radix cache, without it, and HF.

The shape of the paper's LLaVA-bench experiment (§6, "1.15 vs 0.18 images/s" for LLaVA-v1.5-7B):
several questions about each image, each question its own request. Images are random (seeded);
the model is a random-weight LLaVA-1.5 built on the fly (``make_tiny_llava_checkpoint`` with a
larger CLIP tower and language model), so nothing is downloaded. Systems:

- lmnb, radix cache: image tokens keyed by the pixel hash, so questions 2..k about an image reuse
  its KV (and its vision features);
- lmnb, radix cache off: every question prefills the image tokens again (vision features still
  come from the encoder cache);
- lmnb, no caches: radix cache off and encoder cache off (every question runs the vision tower);
- HF ``LlavaForConditionalGeneration.generate``, one request at a time (the paper's baseline);
  lmnb with the radix cache one request at a time too, to separate reuse from batching.

lmnb gets all requests at once (continuous batching) unless a row says "one at a time".

images/s = distinct images / wall time of the whole workload (all questions answered).

    OMP_NUM_THREADS=2 python benches/bench_llava_cpu.py --out benches/results/DATE-cpu-llava.md
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/ is not a package

from cpu_bench import add_out_argument, llama_dims, machine_line, set_torch_threads, write_report  # noqa: E402

SYSTEM = "<|system|>Answer the question about the picture in a few words.<|end|>\n"
QUESTIONS = [
    "what is the main color of the picture?", "how many animals are there?", "is it day or night?",
    "what is the dog doing?", "where was this taken?", "describe the picture in one sentence.",
]


def make_workload(num_images: int, per_image: int, seed: int) -> list[tuple[str, object]]:
    """(prompt text, PIL image) per request, image-major as llava-bench lists them."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    out = []
    for i in range(num_images):
        w, h = rng.randint(120, 400, size=2)
        img = Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8))
        for q in range(per_image):
            question = QUESTIONS[(i + q) % len(QUESTIONS)]
            out.append((f"{SYSTEM}<|user|><image>\n{question}<|end|>\n<|assistant|>", img))
    return out


def run_lmnb(path: str, work, max_new_tokens: int, radix: bool, encoder_cache: bool, serial: bool = False) -> dict:
    from lmnb_engine import Engine, SamplingParams
    from lmnb_engine.multimodal import MultimodalPrompt

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    with Engine(path, max_total_tokens=32768, disable_radix_cache=not radix) as eng:
        if not encoder_cache:
            eng.loaded.model.encoder_cache.max_bytes = 0
        eng.generate(MultimodalPrompt(work[0][0], [work[0][1].rotate(90)]), params)  # warm-up, other pixels
        eng.flush_cache()
        cache = eng.loaded.model.encoder_cache
        cache.clear()
        misses = cache.misses
        t0 = time.perf_counter()
        prompts = [MultimodalPrompt(text, [img]) for text, img in work]
        results = [eng.generate(p, params) for p in prompts] if serial else eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        stats = eng.cache_stats()
        encoded = cache.misses - misses
    return {"wall": wall, "tokens": [r.token_ids for r in results], "hit_rate": stats["hit_rate"],
            "encoded": encoded}


def run_hf(path: str, work, max_new_tokens: int) -> dict:
    import torch
    import transformers

    model = transformers.LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    proc = transformers.AutoProcessor.from_pretrained(path)

    def generate(text, img):
        inputs = proc(text=text, images=img, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                 do_sample=False)
        return out[0, inputs["input_ids"].shape[1]:].tolist()

    generate(work[0][0], work[0][1].rotate(90))
    t0 = time.perf_counter()
    tokens = [generate(text, img) for text, img in work]
    return {"wall": time.perf_counter() - t0, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--questions-per-image", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=168)
    ap.add_argument("--patch-size", type=int, default=14)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vision-hidden-size", type=int, default=256)
    ap.add_argument("--vision-layers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    add_out_argument(ap)
    args = ap.parse_args()

    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    threads = set_torch_threads()
    work = make_workload(args.images, args.questions_per_image, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        vh = args.vision_hidden_size
        path = str(make_tiny_llava_checkpoint(
            tmp, seed=args.seed, image_size=args.image_size, patch_size=args.patch_size,
            vision_overrides=dict(hidden_size=vh, intermediate_size=vh * 4, num_hidden_layers=args.vision_layers,
                                  num_attention_heads=max(1, vh // 64), projection_dim=vh),
            **llama_dims(args.hidden_size, args.layers),
        ))
        rows = [
            ("lmnb, radix cache", run_lmnb(path, work, args.max_new_tokens, True, True)),
            ("lmnb, radix cache, one at a time", run_lmnb(path, work, args.max_new_tokens, True, True, serial=True)),
            ("lmnb, radix cache off", run_lmnb(path, work, args.max_new_tokens, False, True)),
            ("lmnb, no caches", run_lmnb(path, work, args.max_new_tokens, False, False)),
            ("HF generate, one at a time", run_hf(path, work, args.max_new_tokens)),
        ]
    hf = rows[-1][1]
    n_img, n_req = args.images, len(work)
    per_image = (args.image_size // args.patch_size) ** 2
    same = all(r["tokens"] == hf["tokens"] for _, r in rows)
    lines = [
        f"# CPU LLaVA-bench-shaped benchmark ({datetime.date.today().isoformat()})",
        "",
        machine_line(threads),
        f"- model: random-weight LLaVA-1.5 (pad preprocessing), CLIP {args.vision_layers} layers hidden "
        f"{args.vision_hidden_size} at {args.image_size}px / patch {args.patch_size} ({per_image} image tokens), "
        f"Llama {args.layers} layers hidden {args.hidden_size}, float32",
        f"- workload: {n_img} random images x {args.questions_per_image} questions = {n_req} requests, "
        f"{args.max_new_tokens} output tokens each (ignore_eos)",
        f"- command: `OMP_NUM_THREADS={threads} python benches/bench_llava_cpu.py`",
        "",
        "| system | wall (s) | images/s | requests/s | images through the vision tower | speed-up vs HF |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        encoded = r.get("encoded", n_req)
        lines.append(f"| {name} | {r['wall']:.2f} | {n_img / r['wall']:.3f} | {n_req / r['wall']:.2f} | {encoded} | "
                     f"{hf['wall'] / r['wall']:.2f}x |")
    lines += [
        "",
        f"- radix-cache hit rate (cached / prompt tokens): {rows[0][1]['hit_rate']:.3f}",
        f"- same output tokens in all systems: {same}",
        "- paper (§6, LLaVA-v1.5-7B on an A10G): 1.15 images/s with SGLang vs 0.18 with the HF implementation",
    ]
    write_report(lines, args.out)


if __name__ == "__main__":
    main()
