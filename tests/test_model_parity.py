"""The native model + torch attention backend reproduce transformers exactly (fp32).

Reference: HF ``generate(do_sample=False)`` and HF forward logits on the same checkpoint.
"""

from __future__ import annotations

import pytest
import torch

from helpers_model import ManualRunner, hf_greedy, hf_logits, hf_model
from lmnb_engine.forward_batch import ForwardMode
from lmnb_engine.model_loader import load_model

PROMPTS = [
    "the cat is red",
    "Hello world! What is the capital of paris?",
    '{"key": "value", "n": 42} and then a list of seven animals: dog bird',
]
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "qwen3"])
def arch_pair(request, tiny_checkpoint_factory):
    path = tiny_checkpoint_factory(request.param)
    return load_model(path, device="cpu"), hf_model(path)


def test_greedy_tokens_and_logits_match_hf_generate(arch_pair):
    lm, hf = arch_pair
    prompts = [lm.tokenizer(p).input_ids for p in PROMPTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # the batch is really ragged
    ours, last_logits = ManualRunner(lm).greedy(prompts, NEW_TOKENS)
    for prompt, got in zip(prompts, ours):
        assert got == hf_greedy(hf, prompt, NEW_TOKENS)
    # Logits of the last decode step against HF's forward over prompt + all but the last token.
    for i, (prompt, got) in enumerate(zip(prompts, ours)):
        ref = hf_logits(hf, prompt + got[:-1])[-1]
        torch.testing.assert_close(last_logits[i], ref, atol=1e-4, rtol=0)


def test_extend_over_cached_prefix_equals_cold_prefill(arch_pair):
    lm, hf = arch_pair
    ids = lm.tokenizer(PROMPTS[2]).input_ids
    r = ManualRunner(lm)
    cold = r.run(ForwardMode.EXTEND, [(r.new_request(), ids)], all_logits=True)
    warm_row = r.new_request()
    k = 7
    r.run(ForwardMode.EXTEND, [(warm_row, ids[:k])])  # the prefix' KV, from an earlier pass
    warm = r.run(ForwardMode.EXTEND, [(warm_row, ids[k:])], all_logits=True)
    torch.testing.assert_close(warm, cold[k:], atol=1e-5, rtol=0)
    torch.testing.assert_close(cold, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_ragged_batch_equals_each_request_alone(tiny_checkpoint_factory):
    lm = load_model(tiny_checkpoint_factory("qwen3"), device="cpu")
    ids = lm.tokenizer(PROMPTS[1] + " " + PROMPTS[2]).input_ids
    # (prefix length already cached, new tokens) per request: cold, warm, single token, long.
    shapes = [(0, 5), (4, 9), (11, 1), (2, 20)]

    def run(group: list[tuple[int, int]]) -> list[torch.Tensor]:
        r = ManualRunner(lm)
        rows = [r.new_request() for _ in group]
        for row, (p, _) in zip(rows, group):
            if p:
                r.run(ForwardMode.EXTEND, [(row, ids[:p])])
        logits = r.run(ForwardMode.EXTEND, [(row, ids[p : p + n]) for row, (p, n) in zip(rows, group)],
                       all_logits=True)
        return list(logits.split([n for _, n in group]))

    batched = run(shapes)
    for shape, got in zip(shapes, batched):
        torch.testing.assert_close(got, run([shape])[0], atol=1e-5, rtol=0)


def test_decode_batch_of_different_lengths_equals_each_alone(tiny_checkpoint_factory):
    lm = load_model(tiny_checkpoint_factory("llama"), device="cpu")
    prompts = [lm.tokenizer(p).input_ids for p in PROMPTS]
    batched, _ = ManualRunner(lm).greedy(prompts, 8)
    for prompt, got in zip(prompts, batched):
        assert got == ManualRunner(lm).greedy([prompt], 8)[0][0]


def test_logits_indices_pick_rows_in_order(tiny_checkpoint_factory):
    from lmnb_engine.forward_batch import ForwardBatch

    lm = load_model(tiny_checkpoint_factory("llama"), device="cpu")
    ids = lm.tokenizer(PROMPTS[1]).input_ids
    r = ManualRunner(lm)
    full = r.run(ForwardMode.EXTEND, [(r.new_request(), ids)], all_logits=True)
    row = r.new_request()
    slots = r.kv.alloc(len(ids))
    r.r2t.req_to_token[row, : len(ids)] = slots.to(torch.int32)
    batch = ForwardBatch.build(ForwardMode.EXTEND, ids, slots, r.r2t.req_to_token, [row], [0], [len(ids)],
                               logits_indices=[3, 0, len(ids) - 1])
    picked = lm.model(batch, r.attn, r.kv)
    assert picked.dtype == torch.float32 and picked.shape == (3, lm.config.vocab_size)
    torch.testing.assert_close(picked, full[[3, 0, len(ids) - 1]], atol=1e-5, rtol=0)
