"""The bundled demo model: corpus determinism and split, loading through the engine's loader,
greedy parity with transformers, and a small held-out eval slice well above chance.

References: ``transformers`` generate/forward on the same checkpoint; the corpus' own templates
(every way a held-out fact can be asked) for the split.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers_model import hf_model
from lmnb_engine.demo import corpus
from lmnb_engine.demo.eval import EngineBackend, chat_reply, encode_chat, encode_plain, pick_choice
from lmnb_engine.model_loader import DEMO_MODEL_PATH, load_model
from lmnb_engine.params import SamplingParams

_SUMMARY = json.loads((DEMO_MODEL_PATH / "training_summary.json").read_text())
N_DOCS, SEED = _SUMMARY["n_docs"], _SUMMARY["seed"]


def _doc_text(d: corpus.Document) -> str:
    return d.text or "\n".join(m["content"] for m in d.messages)


def test_corpus_same_seed_same_text_and_other_seed_differs():
    a = corpus.training_documents(seed=3, n_docs=400)
    b = corpus.training_documents(seed=3, n_docs=400)
    c = corpus.training_documents(seed=4, n_docs=400)
    assert [_doc_text(d) for d in a] == [_doc_text(d) for d in b]
    assert [_doc_text(d) for d in a] != [_doc_text(d) for d in c]
    assert corpus.heldout_items(3, 50, 50, 50) == corpus.heldout_items(3, 50, 50, 50)


def test_corpus_text_does_not_depend_on_the_process(tmp_path):
    """Another interpreter with another string-hash seed writes the same corpus (no set order leaks)."""
    code = (
        "import hashlib, sys; from lmnb_engine.demo import corpus\n"
        "docs = corpus.training_documents(seed=3, n_docs=400)\n"
        "text = '\\0'.join(d.text or '\\n'.join(m['content'] for m in d.messages) for d in docs)\n"
        "print(hashlib.sha256(text.encode()).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": h},
                       capture_output=True, text=True, check=True).stdout.strip()
        for h in ("1", "2")
    }
    here = "\0".join(_doc_text(d) for d in corpus.training_documents(seed=3, n_docs=400))
    assert digests == {hashlib.sha256(here.encode()).hexdigest()}


@pytest.fixture(scope="module")
def training_text() -> str:
    """All text of the committed checkpoint's training corpus, documents separated by NUL."""
    return "\0".join(_doc_text(d) for d in corpus.training_documents(SEED, N_DOCS))


def test_heldout_facts_are_told_but_never_asked_in_training(training_text):
    world = corpus.build_world(SEED)
    assert world.heldout and set(world.heldout) < set(world.facts)
    for fact in world.heldout_facts:
        rel = corpus.RELATIONS[fact.relation]
        for template in rel["ask"] + rel["chat"]:
            assert corpus.phrase(template, fact) not in training_text, fact
        # ... yet the fact itself is stated in training, so the question is answerable.
        assert any(corpus.phrase(t, fact) in training_text for t in rel["tell"]), fact


def test_heldout_items_are_disjoint_from_training(training_text):
    items = corpus.heldout_items(SEED)
    questions = [i.question for i in items.mc + items.fewshot + items.chat]
    assert len(questions) == 900
    leaked = [q for q in questions if q in training_text]
    assert leaked == []


@pytest.fixture(scope="module")
def engine():
    from lmnb_engine.engine import Engine

    eng = Engine(device="cpu", max_total_tokens=8192)  # no model argument: the demo checkpoint
    yield eng
    eng.shutdown()


def _hf_generate(hf, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers greedy ``generate`` with the checkpoint's generation_config (stops at its EOS)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def reference_model():
    return hf_model(DEMO_MODEL_PATH)


def test_default_model_is_the_demo_checkpoint_with_chat_eos():
    lm = load_model(None, device="cpu")
    assert lm.path == DEMO_MODEL_PATH
    # The token the chat template puts after an assistant turn is what generation stops at.
    tok = lm.tokenizer
    prefix = encode_chat(tok, [{"role": "user", "content": "Hello!"}], add_generation_prompt=True)
    full = encode_chat(tok, [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi!"}],
                       add_generation_prompt=False)
    assert full[: len(prefix)] == prefix and full[0] == tok.bos_token_id
    assert full[-1] in lm.eos_token_ids
    gen_cfg = json.loads((DEMO_MODEL_PATH / "generation_config.json").read_text())
    assert full[-1] == gen_cfg["eos_token_id"]


def test_engine_greedy_matches_transformers_on_demo_checkpoint(engine, reference_model):
    tok = engine.tokenizer
    items = corpus.heldout_items(SEED, n_mc=0, n_fewshot=2, n_chat=2)
    prompts = [encode_plain(tok, it.prompt) for it in items.fewshot]
    prompts += [encode_chat(tok, list(c.messages)) for c in items.chat]
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    for prompt in prompts:
        ours = engine.generate(prompt, params)
        assert ours.token_ids == _hf_generate(reference_model, prompt, 32)
        assert ours.finish_reason.type == "stop"  # the replies are short: both stopped at EOS


def test_multiple_choice_slice_well_above_chance_through_engine(engine):
    items = corpus.heldout_items(SEED, n_mc=40, n_fewshot=0, n_chat=0).mc
    backend = EngineBackend(engine)
    correct = sum(pick_choice(backend, it) == it.answer for it in items)
    assert correct / len(items) >= 0.70, f"{correct}/{len(items)} held-out multiple-choice items right"


def test_chat_slice_replies_end_with_eos_through_engine(engine):
    backend = EngineBackend(engine)
    items = corpus.heldout_items(SEED, n_mc=0, n_fewshot=0, n_chat=10).chat
    ended = sum(chat_reply(backend, c).eos for c in items)
    assert ended >= 9, f"only {ended}/10 held-out chat replies ended with EOS within 64 tokens"
