"""Held-out eval of the demo model (multiple choice, few-shot exact match, chat EOS).

    python benches/eval_demo_model.py                       # HF transformers, bundled checkpoint
    python benches/eval_demo_model.py --backend engine      # lmnb's Engine on the same checkpoint
    python benches/eval_demo_model.py --model DIR --json-out benches/results/demo_model_eval.json

Items come from ``lmnb_engine.demo.corpus.heldout_items(seed)``; the tasks are defined in
``lmnb_engine.demo.eval``. Prints one JSON object (scores, per-kind scores, a few examples,
machine, seconds).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


def make_backend(kind: str, model: str, threads: int):
    """An eval ``Backend`` of ``kind`` ("hf" or "engine") over checkpoint directory ``model``."""
    from lmnb_engine.demo.eval import EngineBackend, HFBackend

    if kind == "hf":
        return HFBackend(model, threads=threads)
    if kind == "engine":
        import torch

        from lmnb_engine.engine import Engine

        torch.set_num_threads(threads)
        return EngineBackend(Engine(model, device="cpu", max_total_tokens=16384))
    raise ValueError(f"unknown backend {kind!r}; use 'hf' or 'engine'")


def main(argv: list[str] | None = None) -> int:
    from lmnb_engine.demo.eval import run_eval
    from lmnb_engine.model_loader import DEMO_MODEL_PATH

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(DEMO_MODEL_PATH), help="checkpoint directory")
    p.add_argument("--backend", choices=["hf", "engine"], default="hf")
    p.add_argument("--seed", type=int, default=0, help="corpus seed the checkpoint was built with")
    p.add_argument("--n-mc", type=int, default=400)
    p.add_argument("--n-fewshot", type=int, default=300)
    p.add_argument("--n-chat", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    a = p.parse_args(argv)

    t0 = time.time()
    backend = make_backend(a.backend, a.model, a.threads)
    report = run_eval(backend, a.seed, a.n_mc, a.n_fewshot, a.n_chat)
    out = {
        "model": a.model, "backend": a.backend, "seed": a.seed, **report.to_dict(),
        "seconds": round(time.time() - t0, 1), "threads": a.threads,
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "date": time.strftime("%Y-%m-%d"),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
