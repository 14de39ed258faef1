"""``select`` through ``lmnb serve`` vs in process: cached tokens per ``SCORE_WINDOW``.

``RuntimeEndpoint`` scores a choice by asking the server for prompt logprobs from
``n_prompt - SCORE_WINDOW`` on; the server must compute every token from there (it needs their
logits), so each scoring request recomputes about ``SCORE_WINDOW`` prompt tokens that the
in-process backend (which starts at the first token where prompt and prompt + choice differ)
takes from the cache. A choice whose tokens differ from the prompt's at or before the window's
first token is scored again, with the prompt alone, from ``RESCORE_WINDOW`` tokens further back (one
request), then from token 0 if they differ there too.

Two parts:

1. Hit rate: a select-heavy program (few-shot multiple choice over the demo model's world, several
   selects per program, choices with and without a leading space) run in process and through
   ``RuntimeEndpoint`` against ``lmnb serve`` (same process, its own engine) for each window;
   the engine's ``cache_stats`` (cached / prompt tokens, as ``%lm stats`` shows) after a flush.
2. Refetches: for prompt endings x choices (space / no space, punctuation, digits, unicode), with
   the demo model's tokenizer and the tiny test checkpoint's, how often the first difference lies
   at or before the window's first token (a refetch), and how often it lies before it while the
   window's tokens still agree (a miss: scored from the wrong token).

    OMP_NUM_THREADS=1 python benches/bench_select_window.py --windows 8 2 1
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time

import lmnb as sgl
import lmnb.backend.runtime_endpoint as rt
from lmnb.choices import first_difference

PEOPLE = ["Fenna", "Oskar", "Mira", "Tobin", "Lena", "Pavel"]
COLORS = [" red", " blue", " green", " yellow"]
FEW_SHOT = "Q: What is 3 + 5?\nA: 8\n\nQ: What is 2 + 2?\nA: 4\n\n"


@sgl.function
def quiz(s, person):
    """Four selects on one growing prompt: leading-space choices, bare choices, digits, yes/no."""
    s += FEW_SHOT + f"Q: What is the favourite colour of {person}?\nA:"
    s += sgl.select("colour", choices=COLORS)
    s += f"\n\nQ: Is {person} a person or an object?\nA: "
    s += sgl.select("kind", choices=["person", "object", "city"])
    s += "\n\nQ: What is 4 + 3?\nA: "
    s += sgl.select("sum", choices=["7", "6", "12"])
    s += "\n\nQ: Sure? Answer:" + sgl.select("sure", choices=[" yes", " no", " yes, sure."])


def hit_rates(model: str, windows: list[int]) -> list[tuple]:
    """(backend, window, prompt tokens, cached, recomputed, hit rate, seconds) per run."""
    import threading

    import uvicorn

    from lmnb_engine import Engine
    from lmnb_engine.http_server import create_app

    engine = Engine(model=model, max_total_tokens=32768)
    app = create_app(engine, served_model_name="bench")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    rows = []
    try:
        local, remote = sgl.Engine(engine=engine), sgl.RuntimeEndpoint(url)
        runs = [("in-process", None, local)] + [("http", w, remote) for w in windows]
        for name, window, backend in runs:
            if window is not None:
                rt.SCORE_WINDOW = window
            engine.flush_cache()
            t = time.perf_counter()
            states = quiz.run_batch([{"person": p} for p in PEOPLE], backend=backend, num_threads=1)
            secs = time.perf_counter() - t
            assert all(st.error() is None for st in states), [st.error() for st in states]
            st = engine.cache_stats()
            p, c = st["prompt_tokens"], st["cached_tokens"]
            rows.append((name, window, p, c, p - c, c / p, secs))
    finally:
        server.should_exit = True
        thread.join(10)
        engine.shutdown()
    return rows


PROMPTS = ["Q: What colour is it?\nA:", "Q: What colour is it?\nA: ", "Which one fits? It is", "Answer:",
           "The word is \"", "3 + 5 =", "3 + 5 = ", "Name it (one word):", "List: apple,", "Der Preis ist 5",
           "She said", "Options: a; b; c\nA:", "x" * 3, "Hello\n", "The city of Mü"]
CHOICES = [" yes", "yes", "Yes", " no", " the red one", "red", ".", "!", ",", "?\n", " 8", "8", "12", "é",
           " é", "ünchen", "日本", " 日本", "\n", "'s", "-", " (a)", "s", "ing"]


def refetches(encode, windows: list[int]) -> dict:
    """{window: (pairs, refetches, misses, too short)} over PROMPTS x CHOICES, as ``_score_choices``
    decides; too short: prompt + choice has fewer tokens than the window's start (the server
    refuses it, and every choice is scored from token 0)."""
    out = {}
    for w in windows:
        pairs = refetch = miss = short = 0
        for p, c in itertools.product(PROMPTS, CHOICES):
            p_ids, ids = encode(p), encode(p + c)
            start = max(len(p_ids) - w, 0)
            d = first_difference(p_ids, ids)
            rel = first_difference(p_ids[start:], ids[start:])
            pairs += 1
            short += len(ids) < start
            if rel == 0 and start > 0:
                refetch += 1
            elif d < start:
                miss += 1
        out[w] = (pairs, refetch, miss, short)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[8, 2, 1])
    args = ap.parse_args()
    from lmnb_engine import model_loader
    from lmnb_engine.testing import make_tiny_checkpoint
    from transformers import AutoTokenizer

    demo = str(model_loader.DEMO_MODEL_PATH)
    tiny = str(make_tiny_checkpoint(tempfile.mkdtemp(), arch="llama"))
    for label, model in (("demo model", demo), ("tiny test checkpoint", tiny)):
        tok = AutoTokenizer.from_pretrained(model)
        enc = lambda t: tok(t, add_special_tokens=True)["input_ids"]  # noqa: E731 (the engine adds BOS too)
        print(f"\n## {label}: refetches over {len(PROMPTS)} prompts x {len(CHOICES)} choices")
        print("| window | pairs | refetch (scored again from further back) | miss (differs before the window, unseen) "
              "| too short |")
        print("|---|---|---|---|---|")
        for w, (n, r, m, short) in refetches(enc, args.windows).items():
            print(f"| {w} | {n} | {r} | {m} | {short} |")
        print(f"\n## {label}: hit rate of quiz x {len(PEOPLE)} (4 selects each)")
        print("| backend | window | prompt tokens | cached | recomputed | hit rate | seconds |")
        print("|---|---|---|---|---|---|---|")
        for name, w, p, c, r, h, s in hit_rates(model, args.windows):
            print(f"| {name} | {'-' if w is None else w} | {p} | {c} | {r} | {h:.4f} | {s:.1f} |")


if __name__ == "__main__":
    main()
