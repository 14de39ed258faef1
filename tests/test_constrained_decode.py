"""Constrained decoding over the corpus (``constrained_corpus``, 47 regexes and JSON schemas).

Every test runs twice (issue 5: "on random-weight and demo models"): on a tiny random-weight Llama
and on the bundled demo model (``lmnb_engine/demo_model``, trained, with its own BPE tokenizer, so
the masks, the forced strings and the retokenization windows all differ from the random model's).

* a random walk over the masks (any allowed token) always ends in a full match;
* the engine's greedy output with jump-forward is byte-identical to the engine without it, and
  token-identical to plain masked greedy decoding written here with the Hugging Face model (the
  independent reference: one token per full forward, no cache, no jump-forward);
* jump-forward saves forward passes on every entry with long forced strings;
* sampled outputs (temperature 1, three seeds) all match / validate;
* a grammar-cache hit and a radix-cache hit decode the same output as cold runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from constrained_corpus import MAX_NEW_TOKENS, check_output, corpus, has_constant_runs
from lmnb_engine import Engine, SamplingParams
from lmnb_engine.constrained import GrammarMatcher, apply_token_bitmask_
from lmnb_engine.model_loader import DEMO_MODEL_PATH
from tests.helpers_engine import assert_idle_accounting

CORPUS = corpus()
PROMPT = "Answer in the required format:"


def constraint(kind, source) -> dict:
    if kind == "regex":
        return {"regex": source}
    return {"json_schema": source.model_json_schema() if isinstance(source, type) else source}


def params_for(kind, source, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=MAX_NEW_TOKENS, **constraint(kind, source), **kw)


@pytest.fixture(scope="module", params=["random-weight", "demo"])
def model_path(request) -> str:
    """The checkpoint every test of this module runs on (module-scoped: pytest runs all tests on
    one model, then all on the other, so only one pair of engines is alive at a time)."""
    if request.param == "demo":
        return str(DEMO_MODEL_PATH)
    return str(request.getfixturevalue("tiny_llama"))


@pytest.fixture(scope="module")
def engines(model_path):
    with Engine(model_path, max_total_tokens=16384) as on, Engine(
        model_path, max_total_tokens=16384, disable_jump_forward=True
    ) as off:
        yield on, off


def grammar_of(engine, kind, source):
    return engine._grammar(params_for(kind, source))


@torch.no_grad()
def hf_masked_greedy(model, grammar, prompt_ids) -> list[int]:
    """Plain masked greedy decoding with the HF model, one full forward per token; the ids end
    with EOS when EOS was sampled (as ``GenerateResult.token_ids`` do)."""
    matcher = GrammarMatcher(grammar)
    out: list[int] = []
    while len(out) < MAX_NEW_TOKENS and not matcher.is_terminated():
        logits = model(torch.tensor([prompt_ids + out])).logits[0, -1:].float()
        apply_token_bitmask_(logits, matcher.bitmask()[None])
        token = int(logits.argmax(-1))
        matcher.accept_token(token)
        out.append(token)
    return out


@pytest.mark.parametrize("kind, source", [(k, s) for k, s, _ in CORPUS], ids=[i for _, _, i in CORPUS])
def test_random_walks_over_the_masks_end_in_full_matches(engines, kind, source):
    engine = engines[0]
    grammar = grammar_of(engine, kind, source)
    eos = min(grammar.vocab.eos_token_ids)
    rng = np.random.default_rng(0)
    for _ in range(4):
        matcher = GrammarMatcher(grammar)
        out: list[int] = []
        while not matcher.is_terminated():
            assert len(out) < 2000, "random walk did not finish"
            allowed = grammar.allowed_ids(matcher.state)
            token = eos if eos in allowed and rng.random() < 0.3 else int(rng.choice(allowed[allowed != eos]))
            matcher.accept_token(token)
            if token != eos:
                out.append(token)
        check_output(kind, source, engine.decode(out))


def test_greedy_output_is_identical_with_jump_forward_and_saves_passes(engines, model_path):
    import transformers

    on, off = engines
    batch = [params_for(k, s, temperature=0.0) for k, s, _ in CORPUS]
    # one batch per engine: jump-forward extends and plain decode rows share forward passes
    with_jump = [on.submit(PROMPT, p) for p in batch]
    without = [off.submit(PROMPT, p) for p in batch]
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompt_ids = on.encode(PROMPT)
    total_on = total_off = 0
    for (kind, source, name), h_on, h_off in zip(CORPUS, with_jump, without):
        a, b = h_on.result(), h_off.result()
        assert a.finish_reason.type == "stop", (name, a.finish_reason)
        check_output(kind, source, a.text)
        assert a.text == b.text and a.token_ids == b.token_ids, name
        assert a.token_ids == hf_masked_greedy(model, grammar_of(on, kind, source), prompt_ids), name
        assert a.meta.forward_passes <= b.meta.forward_passes, name
        if has_constant_runs(kind, source):
            assert a.meta.forward_passes < b.meta.forward_passes and a.meta.jumped_tokens > 0, name
        assert b.meta.jumped_tokens == 0
        total_on += a.meta.forward_passes
        total_off += b.meta.forward_passes
    assert total_on < 0.8 * total_off
    assert_idle_accounting(on)
    assert_idle_accounting(off)


def test_sampled_outputs_match_for_several_seeds(engines):
    on = engines[0]
    handles = [
        (kind, source, name, seed, on.submit(PROMPT, params_for(kind, source, temperature=1.0, seed=seed)))
        for kind, source, name in CORPUS
        for seed in range(3)
    ]
    for kind, source, name, seed, h in handles:
        r = h.result()
        assert r.finish_reason.type == "stop", (name, seed, r.finish_reason)
        check_output(kind, source, r.text)
    assert_idle_accounting(on)


def test_cache_hits_decode_the_same_output_as_cold_runs(engines):
    on = engines[0]
    kind, source, _ = CORPUS[-1]
    p = params_for(kind, source, temperature=0.0)
    prompt = "A spell, as JSON:"
    first = on.generate(prompt, p)  # the prompt and this output enter the radix cache
    hit = on.generate(prompt, p)  # grammar-cache hit and radix-cache hit
    on._grammar_backend.cache.clear()
    assert on.flush_cache()
    cold = on.generate(prompt, p)  # both compiled / computed from scratch
    assert hit.meta.cached_tokens > 0 and cold.meta.cached_tokens == 0
    assert first.text == hit.text == cold.text and first.token_ids == hit.token_ids == cold.token_ids
    assert_idle_accounting(on)
