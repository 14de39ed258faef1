"""Programs on the in-process engine (tiny random Llama): select scores equal an independent
Hugging Face computation, streaming is incremental, states continue with their cache."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch

import lmnb as sgl
from helpers_lang import pace_stream


@pytest.fixture(scope="module")
def backend(tiny_engine):
    return sgl.Engine(engine=tiny_engine)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    return tok, model


def hf_scores(hf, prompt: str, choice: str, context_ids=None) -> tuple[int, list[float]]:
    """(d, logprobs of tokens(prompt+choice)[d:]) by a plain HF forward pass, where d is the first
    token index at which tokens(prompt+choice) differs from tokens(prompt); with ``context_ids``
    those scored tokens are re-scored after that context instead (unconditional likelihood)."""
    tok, model = hf
    p, ids = tok(prompt).input_ids, tok(prompt + choice).input_ids
    d = next((i for i, (a, b) in enumerate(zip(p, ids)) if a != b), min(len(p), len(ids)))
    d = max(d, 1)
    scored = ids[d:]
    seq = (context_ids + scored) if context_ids is not None else ids
    first = len(context_ids) if context_ids is not None else d
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)
    return d, [logp[j - 1, seq[j]].item() for j in range(first, len(seq))]


@pytest.mark.parametrize(
    "prompt,choices",
    [
        ("Which one? It is", [" the red one", " the red two", " the blue"]),  # common prefix
        ("Is it true? Answer:", [" yes", " yes indeed", " no"]),  # one choice a prefix of another
        ("The color of the sky is ", ["blue", "red", "green tree"]),  # healing at the trailing space
    ],
)
def test_select_scores_each_choice_like_hf_prompt_logprobs(backend, hf, prompt, choices):
    @sgl.function
    def pick(s, method):
        s += prompt + sgl.select("c", choices=choices, choices_method=method)

    expected = [hf_scores(hf, prompt, c) for c in choices]
    st = pick.run(method=sgl.token_length_normalized, backend=backend)
    meta = st.get_meta_info("c")
    for (d, want), got, start in zip(expected, meta["input_token_logprobs"], meta["prefix_len"]):
        assert start == d
        assert [x[0] for x in got] == pytest.approx(want, abs=1e-4)
    means = [sum(v) / len(v) for _, v in expected]
    assert st["c"] == choices[max(range(len(choices)), key=lambda i: means[i])]
    assert st.text() == prompt + st["c"]

    ctx = hf[0]("Answer:").input_ids
    gains = []
    for c, (_, cond) in zip(choices, expected):
        _, unc = hf_scores(hf, prompt, c, context_ids=ctx)
        gains.append(sum(a - b for a, b in zip(cond, unc)) / len(cond))
    st = pick.run(method=sgl.unconditional_likelihood_normalized, backend=backend)
    assert st["c"] == choices[max(range(len(choices)), key=lambda i: gains[i])]


def test_a_select_of_hundreds_of_choices_scores_each_as_hf_does_alone(tiny_llama, hf):
    """A select of 10,000 choices took 59 s: each choice is a request, and the scheduler's queue,
    the engine's table of handles and the radix cache's eviction each read every one of them once
    per request or step. With more choices waiting than the scheduler matches (it serves them
    first come, first served) and a KV pool small enough that the cache evicts all the while, every
    choice's scores are still HF's for that choice alone, and the pick is the best of them."""
    from lmnb_engine import Engine
    from lmnb_engine.schedule_policy import LPM_MAX_QUEUE

    prompt = "Name the thing in the tree:"
    words = ["red", "blue", "cat", "dog", "tree", "river", "bird", "stone", "sky", "leaf"]
    choices = [f" {words[i % 10]} {words[i // 10 % 10]} {i}" for i in range(300)]
    choices += [f" {w}" for w in words]
    assert len(choices) > 2 * LPM_MAX_QUEUE
    engine = Engine(model=str(tiny_llama), max_total_tokens=1024)
    try:
        @sgl.function
        def pick(s):
            s += prompt + sgl.select("c", choices=choices)

        st = pick.run(backend=sgl.Engine(engine=engine))
        assert engine.cache_stats()["evicted_tokens"] > 0  # (the pool filled: leaves were evicted meanwhile)
        engine.check_invariants()
    finally:
        engine.shutdown()
    meta = st.get_meta_info("c")
    expected = [hf_scores(hf, prompt, c) for c in choices]
    for (d, want), got, start in zip(expected, meta["input_token_logprobs"], meta["prefix_len"], strict=True):
        assert start == d
        assert [x[0] for x in got] == pytest.approx(want, abs=1e-4)
    means = [sum(v) / len(v) for _, v in expected]
    assert st["c"] == choices[max(range(len(choices)), key=lambda i: means[i])]


def test_token_healing_scores_from_the_merged_token(backend, hf):
    tok = hf[0]
    prompt = "The color of the sky is "
    d, _ = hf_scores(hf, prompt, "blue")
    assert d < len(tok(prompt).input_ids)  # the trailing space merged into the choice's token

    @sgl.function
    def pick(s):
        s += prompt + sgl.select("c", choices=["blue", "red"])

    assert pick.run(backend=backend).get_meta_info("c")["prefix_len"][0] == d


def test_select_prefills_the_prompt_once_and_choices_hit_the_cache(backend, tiny_engine):
    prompt = "A long shared question about the color of a bird in the tree near the river:"

    @sgl.function
    def pick(s):
        s += prompt + sgl.select("c", choices=[" red", " blue", " green"])

    meta = pick.run(backend=backend).get_meta_info("c")
    n_prompt = len(tiny_engine.encode(prompt))
    for cached, start in zip(meta["cached_tokens"], meta["prefix_len"]):
        assert cached >= min(start, n_prompt) - 1


def test_streaming_is_incremental_and_equals_the_plain_run(backend, monkeypatch):
    @sgl.function
    def story(s):
        s += "Once upon a time" + sgl.gen("rest", max_tokens=12)

    plain = story.run(backend=backend, temperature=0)
    taken = pace_stream(backend, monkeypatch)
    st = story.run(backend=backend, temperature=0, stream=True)
    chunks = []
    for chunk in st.text_iter("rest"):
        taken.set()
        chunks.append(chunk)
    assert len(chunks) > 1
    assert "".join(chunks) == plain["rest"] == st["rest"]


def test_continuing_a_state_reuses_its_cached_prefix(backend, tiny_engine):
    @sgl.function
    def turn(s, q):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("a", max_tokens=6))

    st = turn.run(q="first question about the green river", backend=backend, temperature=0)
    first_text, first_prompt = st.text(), st.get_meta_info("a")["prompt_tokens"]
    same = turn.run(q="second one", state=st, temperature=0)
    assert same is st and st.text().startswith(first_text)
    assert st.messages()[2] == {"role": "user", "content": "second one"}
    # at least the first turn's prompt comes from the cache (the random model's reply may not
    # re-tokenize to the same ids, so the reply itself is not counted on)
    assert st.get_meta_info("a")["cached_tokens"] >= first_prompt - 1


def test_a_select_after_a_gen_hits_the_gen_prompt_and_output_in_the_cache():
    """A finished gen leaves its prompt and output tokens in the radix cache, all but its last
    sampled token, whose KV is never computed (SGLang's cache_finished_req inserts
    (prompt + output)[:kv_committed_len]); the next request, the state's text encoded again, hits
    all of them where that text encodes to the gen's own tokens: a plain gen and a JSON-schema gen
    with jump-forward drafts alike. Counted by hand from the tokenizer, on the demo model, whose
    outputs here are its canonical tokens: the select's prompt prefill hits len(tokens of the text
    up to the gen's end) - 1, and each choice all of that prompt but its last token, whose logits
    score the choice's first token."""
    record = {"type": "object", "properties": {k: {"type": "string"} for k in ("name", "kind", "city")},
              "required": ["name", "kind", "city"]}

    def plain(s):
        s += "Q: Where does Arvel live?\nA:" + sgl.gen("a", max_tokens=4)
        s += "\nIs that right?" + sgl.select("c", choices=[" yes", " no"])

    def schema(s):  # an assistant turn: no space ends the prompt (one would fuse with the JSON's "{" re-encoded)
        s += sgl.user("Give me the record of Arvel as JSON.") + sgl.assistant_begin()
        s += sgl.gen("a", json_schema=record) + "\nIs that right?" + sgl.select("c", choices=[" yes", " no"])

    backend = sgl.Engine()
    try:
        for prog in (plain, schema):
            st = sgl.function(prog).run(backend=backend, temperature=0)
            text = st.text()
            through_gen = text[: text.index("\nIs that right?")]
            gen_prompt = through_gen[: len(through_gen) - len(st["a"])]
            ids, prompt_ids = backend.engine.encode(through_gen), backend.engine.encode(gen_prompt)
            gen, pick = st.get_meta_info("a"), st.get_meta_info("c")
            # (the case: the text re-encodes to the gen's prompt and then as many tokens as it generated)
            assert ids[: len(prompt_ids)] == prompt_ids and gen["completion_tokens"] == len(ids) - len(prompt_ids) > 2
            n = len(backend.engine.encode(through_gen + "\nIs that right?"))
            prefill = pick["prompt_prefill"]
            assert (prefill["prompt_tokens"], prefill["cached_tokens"]) == (n, len(ids) - 1), prog.__name__
            assert pick["prefix_len"] == [n, n] and pick["cached_tokens"] == [n - 1, n - 1]
        assert gen["jumped_tokens"] > 0  # (the JSON gen's forced keys were drafted)
    finally:
        backend.shutdown()


def own(state, name: str) -> tuple:
    """A gen's own completion_tokens and finish_reason."""
    meta = state.get_meta_info(name)
    return meta["completion_tokens"], meta["finish_reason"]


def test_api_speculative_execution_gives_the_same_gens_as_without_it():
    """Greedy: one speculative call cut at each gen's max_tokens (by the engine's per-token texts)
    gives exactly what separate calls give. On the demo model, whose tokens are whole characters
    (a random model's byte tokens do not add up to the text: characters then stand in)."""
    def prog(s):
        s += "Q: Where does Arvel live?\nA:" + sgl.gen("a", max_tokens=2)
        s += sgl.gen("b", max_tokens=3)
        s += sgl.gen("c", max_tokens=4)

    def more(s):  # a constrained gen is not served from unconstrained leftovers; a stop comes after max_tokens
        s += "Q: Where does Arvel live?\nA:" + sgl.gen("a", max_tokens=1)
        s += sgl.gen("b", regex="[0-9]+", max_tokens=2)
        s += "\nQ:" + sgl.gen("c", max_tokens=2, stop="?")
        s += sgl.gen("d", max_tokens=0)
        s += sgl.select("e", choices=[" yes", " no"])  # its own call: the leftover is stale after it
        s += sgl.gen("f", max_tokens=20, stop="?")
        s += "\nQ:" + sgl.gen("g", max_tokens=20, stop_regex=r"[?.]")  # cut from the leftover as the engine cuts

    backend = sgl.Engine()
    try:
        runs = {f: (sgl.function(f).run(backend=backend, temperature=0),
                    sgl.function(num_api_spec_tokens=16)(f).run(backend=backend, temperature=0)) for f in (prog, more)}
    finally:
        backend.shutdown()
    plain, spec = runs[prog]
    assert [spec[k] for k in "abc"] == [plain[k] for k in "abc"]
    assert spec.text() == plain.text()
    assert [spec.get_meta_info(k)["speculative"] for k in "abc"] == [True] * 3
    # each gen's meta is its share of the call (the call's 16 tokens and finish reason were a's)
    assert [own(spec, k) for k in "abc"] == [own(plain, k) for k in "abc"]
    assert spec.get_meta_info("a")["speculative_call"]["completion_tokens"] == 16  # b and c came from it
    plain, spec = runs[more]
    assert [spec[k] for k in "abcdefg"] == [plain[k] for k in "abcdefg"] and spec["d"] == ""
    assert [own(spec, k) for k in "acfg"] == [own(plain, k) for k in "acfg"]  # (c and g cut by a stop)
    assert "speculative" not in spec.get_meta_info("b")  # it made its own, constrained call


def test_api_speculative_gens_with_byte_tokens_on_the_engine_are_cut_as_without_speculation_with_their_logprobs(backend):
    """The engine (as SGLang's native API) writes a token holding part of a character as U+FFFD,
    so a speculative call's token texts did not add up to its text and characters stood in for
    tokens: gen("a", max_tokens=1) got " " (one character), with no completion_tokens and the
    whole call's 16 logprobs; and a gen served from the call's leftover had no logprobs at all.
    Reference: the same program without speculation, "a" and "b" (served from the call's leftover,
    the one request's text up to the stop, also where "a" ends before or inside a character: a
    first byte, left out of its text, which the plain run's "b" generates again; after a lone
    first byte's U+FFFD "b" calls again)."""
    def whole(s):
        s += "A fruit:" + sgl.gen("ab", max_tokens=16, return_logprob=True, return_text_in_logprobs=True)

    ref = sgl.function(whole).run(backend=backend, temperature=0)
    entries, text = ref.get_meta_info("ab")["output_token_logprobs"], ref["ab"]
    assert any("\ufffd" in t[2] for t in entries[:6])  # (the case: byte tokens among the first few)
    stop = entries[12][2]  # a stop the call writes late, where "b" ends
    assert text.index(stop) > len("".join(t[2] for t in entries[:8]))
    for k in range(1, 7):
        def body(s):
            s += "A fruit:" + sgl.gen("a", max_tokens=k, return_logprob=True)
            s += sgl.gen("b", stop=stop, return_logprob=True)

        spec = sgl.function(num_api_spec_tokens=16)(body).run(backend=backend, temperature=0)
        plain = sgl.function(body).run(backend=backend, temperature=0)
        a, want = spec.get_meta_info("a"), plain.get_meta_info("a")
        assert spec["a"] == plain["a"] and a["completion_tokens"] == want["completion_tokens"] == k, k
        assert [t[1] for t in a["output_token_logprobs"]] == [t[1] for t in want["output_token_logprobs"]]
        b, want = spec.get_meta_info("b"), plain.get_meta_info("b")
        assert spec["b"] == plain["b"] and b["completion_tokens"] == want["completion_tokens"], k
        if k < 6:
            assert "prompt_tokens" not in b  # (served from the leftover: no call of its own)
            assert spec["a"] + spec["b"] == text[: text.index(stop)]
        else:  # a's "\ufffd 4", the engine's text of a lone first byte, is tokenized anew: "b" calls again
            assert "\ufffd" in spec["a"] and "speculative_call" in b
        want = want["output_token_logprobs"]
        assert [t[1] for t in b["output_token_logprobs"]] == [t[1] for t in want]
        assert [t[0] for t in b["output_token_logprobs"]] == pytest.approx([t[0] for t in want], abs=1e-4)


def test_a_state_ending_in_api_speculated_gens_text_ends_in_a_sampled_token(backend):
    """A state ending in a gen's text ends in a token sampled and never run through the model
    (StreamExecutor.sampled_end, read by %lm tree: "last token not run yet"). A speculated gen's
    text was not recorded so: the state read as if it ended in a fill. Here "a" takes 3 of the
    call's 8 tokens, "b" (served from the leftover, no call of its own) the other 5, ending where
    the call's output ends; reference: the same program without speculation, which ends so too."""
    from lmnb_kernel.tree_paths import ends_in_sampled_token

    def body(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=3)
        s += sgl.gen("b", max_tokens=5)

    plain = sgl.function(body).run(backend=backend, temperature=0, ignore_eos=True)
    spec = sgl.function(num_api_spec_tokens=8)(body).run(backend=backend, temperature=0, ignore_eos=True)
    assert spec.text() == plain.text()
    assert "prompt_tokens" not in spec.get_meta_info("b")  # (the case: b was served from a's call)
    assert spec.get_meta_info("a")["speculative_call"]["completion_tokens"] == 8
    assert ends_in_sampled_token(plain) and ends_in_sampled_token(spec)
    assert spec.stream_executor.sampled_end == len(spec.text())


def test_api_speculative_gens_give_token_texts_in_their_logprobs_only_when_asked(backend):
    """The speculative call asks for token texts (it cuts its text by them), and its gens kept
    them: gen("a", return_logprob=True) got [logprob, id, " red"] where without speculation it gets
    [logprob, id, None], in output_top_logprobs too. Reference: the same program without
    speculation, entry for entry; and with return_text_in_logprobs=True the texts stay."""
    for texts in (None, True):
        def body(s):
            s += "A fruit:" + sgl.gen("a", max_tokens=3, return_logprob=True, top_logprobs_num=2,
                                      return_text_in_logprobs=texts)
            s += sgl.gen("b", max_tokens=4, return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=texts)

        spec = sgl.function(num_api_spec_tokens=16)(body).run(backend=backend, temperature=0)
        plain = sgl.function(body).run(backend=backend, temperature=0)
        assert "prompt_tokens" not in spec.get_meta_info("b")  # (the case: b is served from a's call)
        for k in "ab":
            got, want = spec.get_meta_info(k), plain.get_meta_info(k)
            assert {e[2] is None for e in want["output_token_logprobs"]} == {texts is None}  # (the reference)
            for key in ("output_token_logprobs", "output_top_logprobs"):
                assert _ids_texts(got[key]) == _ids_texts(want[key]), (texts, k, key)


def _ids_texts(entries: list) -> list:
    """Logprob entries (or top-logprob positions) less their logprobs, which speculation computes
    in another batch (equal to about 1e-4, as the tests above check)."""
    return [e[1:] if not isinstance(e[0], list) else [t[1:] for t in e] for e in entries]


def test_api_speculative_gens_after_a_stop_or_a_fill_keep_the_first_byte_of_a_character(backend):
    """The leftover after a stop or a fill dropped the tokens that add no text that came right after
    it (the tiny model's first byte \xc4 of "ć" after the stop "\x0b"): gen("b", max_tokens=1)
    got "ć" with the logprob of its second byte, where without speculation it gets "" (the first
    byte), and gen("c") the next gen's tokens. Reference: the same program without speculation."""
    def body(s):
        s += "A fruit:" + sgl.gen("a", stop="\x0b", return_logprob=True) + "\x0b"
        s += sgl.gen("b", max_tokens=1, return_logprob=True) + sgl.gen("c", max_tokens=2, return_logprob=True)

    plain = sgl.function(body).run(backend=backend, temperature=0)
    spec = sgl.function(num_api_spec_tokens=16)(body).run(backend=backend, temperature=0)
    assert (plain["a"], plain["b"], plain["c"]) == (" red", "", "ć")  # (the case: b writes a first byte)
    for k in "abc":
        got, want = spec.get_meta_info(k), plain.get_meta_info(k)
        assert (spec[k], got["completion_tokens"], got["finish_reason"]) == \
            (plain[k], want["completion_tokens"], want["finish_reason"]), k
        assert [t[1] for t in got["output_token_logprobs"]] == [t[1] for t in want["output_token_logprobs"]], k
        assert [t[0] for t in got["output_token_logprobs"]] == pytest.approx(
            [t[0] for t in want["output_token_logprobs"]], abs=1e-4)
    assert not any("prompt_tokens" in spec.get_meta_info(k) for k in "bc")  # (served from a's call)


def test_api_speculative_execution_serves_a_gen_with_stops_from_a_leftover_holding_its_max_tokens():
    """A gen with stops (on the demo model every gen: its chat template's "</s>") was served from the
    leftover only if that held one of them, so gen("b", max_tokens=3) after gen("a", max_tokens=2)
    made its own call; a leftover holding its max_tokens tokens now serves it, as SGLang serves a gen
    with stops from any leftover. Reference: the same program without speculation."""
    def prog(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=3, return_logprob=True)

    backend = sgl.Engine()
    try:
        plain, spec = (sgl.function(prog).run(backend=backend, temperature=0),
                       sgl.function(num_api_spec_tokens=16)(prog).run(backend=backend, temperature=0))
    finally:
        backend.shutdown()
    assert (spec["a"], spec["b"]) == (plain["a"], plain["b"]) and own(spec, "b") == own(plain, "b")
    ids = [[t[1] for t in st.get_meta_info("b")["output_token_logprobs"]] for st in (spec, plain)]
    assert ids[0] == ids[1]
    assert "prompt_tokens" not in spec.get_meta_info("b")  # (served from a's call)


def test_api_speculative_gen_cut_at_max_tokens_inside_a_stop_is_cut_as_without_speculation():
    """A stop that starts within a gen's max_tokens tokens but ends after them cut the gen at its
    start: gen("b", max_tokens=1, stop=" harbor.") got "" (finish stop, 2 tokens) where without
    speculation it gets " harbor" (finish length, 1 token): the engine meets a stop only once its
    last character is written. Reference: the same program without speculation."""
    def prog(s):  # the demo model writes " see the", " harbor", "."
        s += "A fruit:" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=1, stop=" harbor.")
        s += sgl.gen("c", max_tokens=2, stop=" harbor.")  # ". Travel": the stop's start is past

    backend = sgl.Engine()
    try:
        plain, spec = (f.run(backend=backend, temperature=0)
                       for f in (sgl.function(prog), sgl.function(num_api_spec_tokens=16)(prog)))
    finally:
        backend.shutdown()
    assert plain["b"] == " harbor" and own(plain, "b") == (1, {"type": "length", "length": 1})  # (the case)
    assert [(spec[k], own(spec, k)) for k in "abc"] == [(plain[k], own(plain, k)) for k in "abc"]
    assert not any("prompt_tokens" in spec.get_meta_info(k) for k in "bc")  # (served from a's call)


def test_api_speculative_gen_whose_stop_regex_reads_the_end_stops_where_its_output_ends_as_without_speculation():
    """A stop_regex match that reads the text's end (a$) is a stop only once what follows settles
    it, or where the output ends there, not where max tokens cut it (language.md): gen("a",
    max_tokens=2, stop_regex="the$") gets " see the", finish length, with speculation as without
    (both once got " see ", stop "the"; before that speculation alone got " see the"), and a gen whose call ended on EOS right after "Yarrow." with stop_regex
    "\\w\\.$" took all of it (finish the EOS) where without speculation it stops at "w.", made the
    call or served from a leftover; a match the text settles is cut as before. Reference: the same
    program without speculation (the demo model writes " see the harbor. Travel west to reach
    Yarrow." then EOS)."""
    def cut(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=2, stop_regex=r"the$")

    def first(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=64, stop_regex=r"\w\.$")

    def served(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=64, stop_regex=r"\w\.$")

    def settled(s):
        s += "A fruit:" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=64, stop_regex=r"Yarrow\.")

    backend = sgl.Engine()
    try:
        runs = {f: [g.run(backend=backend, temperature=0) for g in (sgl.function(f), sgl.function(num_api_spec_tokens=16)(f))]
                for f in (cut, first, served, settled)}
    finally:
        backend.shutdown()
    plain, spec = runs[cut]
    assert plain["a"] == " see the" and own(plain, "a") == (2, {"type": "length", "length": 2})  # (the case)
    assert (spec["a"], own(spec, "a")) == (plain["a"], own(plain, "a"))
    plain, spec = runs[first]
    assert plain.get_meta_info("a")["finish_reason"] == {"type": "stop", "matched": "w."}  # (the case)
    assert (spec["a"], own(spec, "a")) == (plain["a"], own(plain, "a"))
    for f in (served, settled):
        plain, spec = runs[f]
        assert [spec[k] for k in "ab"] == [plain[k] for k in "ab"], f.__name__
        assert [spec.get_meta_info(k)["finish_reason"] for k in "ab"] == [plain.get_meta_info(k)["finish_reason"] for k in "ab"]
        assert "prompt_tokens" not in spec.get_meta_info("b")  # (served from a's call)
    assert own(spec, "b") == own(plain, "b")  # (settled: the tokens up to the stop)


def test_a_dollar_in_a_stop_regex_is_the_end_of_the_whole_output_as_language_md_says():
    """language.md's stop_regex examples on the demo model: ``$`` outside ``(?m)`` is the end of the
    whole output, as Python's re.search over the finished output reads it, not the end of the text
    so far (which the "." after "harbor" ends once): such a stop ends no gen sooner, and where the
    EOS ends the output it cuts a match ending there, its finish reason ``stop``. Where max tokens
    cut the output, the end a match reads is the cut's, no stop: the finish reason stays ``length``
    and the text is the gen's without the regex (it was " see the ", finish reason ``stop``).
    Reference: the same gens without stop_regex, cut where Python's re finds the match in their
    whole text."""
    def prog(s, stop_regex, max_tokens):
        s += "A fruit:" + sgl.gen("a", max_tokens=max_tokens, stop_regex=stop_regex)

    backend = sgl.Engine()
    try:
        runs = {(pattern, n): sgl.function(prog).run(pattern, n, backend=backend, temperature=0)
                for pattern, n in [(None, 64), (None, 3), (r"\.$", 64), (r"\.", 64), (r"harbor$", 3)]}
    finally:
        backend.shutdown()
    whole, three = runs[None, 64], runs[None, 3]
    assert whole["a"] == " see the harbor. Travel west to reach Yarrow." and own(whole, "a")[1]["type"] == "stop"  # (EOS)
    assert three["a"] == " see the harbor" and own(three, "a") == (3, {"type": "length", "length": 3})
    ends = runs[r"\.$", 64]
    assert ends["a"] == whole["a"][:re.search(r"\.$", whole["a"]).start()] == " see the harbor. Travel west to reach Yarrow"
    # (the tokens through the ".", not the EOS after it, which the output's end needed to meet it)
    assert own(ends, "a") == (own(whole, "a")[0] - 1, {"type": "stop", "matched": "."})
    assert runs[r"\.", 64]["a"] == " see the harbor"  # (without $: the first ".")
    cut = runs["harbor$", 3]
    assert cut["a"] == three["a"] == " see the harbor" and own(cut, "a") == (3, {"type": "length", "length": 3})


def test_api_speculative_execution_keeps_special_tokens_after_a_fill_for_the_next_gen():
    """On the demo model: the leftover after a fill dropped the "</s>" "<s>" right after it under
    ignore_eos (the text skips them), so gen("b", max_tokens=1) got "Q" where without speculation
    it gets "" (the "</s>", which the plain run's next gen generates again). Reference: the same
    program without speculation."""
    def prog(s):  # the 40 tokens: " 6\n\nQ: What is 2 plus 4?\nA: 6" twice, then "</s>" "<s>" "Q:"
        s += "Q: What is 2 plus 4?\nA:" + sgl.gen("a", max_tokens=35, ignore_eos=True) + "6"
        s += sgl.gen("b", max_tokens=1, ignore_eos=True) + sgl.gen("c", max_tokens=3, ignore_eos=True)

    backend = sgl.Engine()
    try:
        plain, spec = (f.run(backend=backend, temperature=0, return_logprob=True)
                       for f in (sgl.function(prog), sgl.function(num_api_spec_tokens=40)(prog)))
    finally:
        backend.shutdown()
    assert plain["a"].endswith("A: ") and (plain["b"], plain["c"]) == ("", "Q")  # (the case)
    for k in "abc":
        got, want = spec.get_meta_info(k), plain.get_meta_info(k)
        assert (spec[k], own(spec, k)) == (plain[k], own(plain, k)), k
        assert [t[1] for t in got["output_token_logprobs"]] == [t[1] for t in want["output_token_logprobs"]], k
    assert not any("prompt_tokens" in spec.get_meta_info(k) for k in "bc")  # (served from a's call)


def test_api_speculative_execution_with_ignore_eos_or_min_tokens_gives_the_same_gens_as_without_it():
    """max_tokens went by characters (' 6\n\nQ: What is 2 plu' for 20 tokens): the speculative
    call's token texts hold the "</s>"/"<s>" the text skips (ignore_eos), so no token boundary was
    kept. A gen with min_tokens cut the leftover at its first stop, ' 6', where without
    speculation the stop is held off for min_tokens tokens. And a gen without ignore_eos took
    the text another's call wrote past EOS, where it would have stopped."""
    question = "Q: What is 2 plus 4?\nA:"

    def prog(s):  # the 40 tokens span the special tokens, "b" starts after them
        s += question + sgl.gen("a", max_tokens=40, ignore_eos=True)
        s += sgl.gen("b", max_tokens=5, ignore_eos=True)

    def held(s):
        s += question + sgl.gen("a", max_tokens=8, min_tokens=6, stop="\n")

    def past_eos(s):  # the leftover after "a": "A: 6", EOS, "Q: What is 2 plus 4?..."
        s += question + sgl.gen("a", max_tokens=32, ignore_eos=True)
        s += sgl.gen("b", max_tokens=20, stop="?")

    backend = sgl.Engine()
    try:
        runs = {f: (sgl.function(f).run(backend=backend, temperature=0),
                    sgl.function(num_api_spec_tokens=64)(f).run(backend=backend, temperature=0))
                for f in (prog, held, past_eos)}
    finally:
        backend.shutdown()
    plain, spec = runs[prog]
    assert len(plain["a"]) > 40  # (the demo model's tokens are words and characters)
    assert (spec["a"], spec["b"]) == (plain["a"], plain["b"])
    assert [own(spec, k) for k in "ab"] == [own(plain, k) for k in "ab"]  # not the call's 64 tokens
    assert spec.get_meta_info("a")["speculative_call"]["completion_tokens"] == 64
    plain, spec = runs[held]
    assert spec["a"] == plain["a"] and "\n" in plain["a"]  # (the stop came within the 6 tokens)
    assert "speculative" not in spec.get_meta_info("a")  # it made its own call
    plain, spec = runs[past_eos]
    assert (spec["a"], spec["b"]) == (plain["a"], plain["b"]) and "?" not in plain["b"]  # (it stopped at EOS)
    assert own(spec, "b") == own(plain, "b") and "prompt_tokens" in spec.get_meta_info("b")  # a call of its own


def test_abort_reaches_fork_branches(backend, monkeypatch):
    import threading

    forked, holder, aborted = threading.Event(), [], threading.Event()
    streams = backend.generate_stream

    def held_after_the_first_text(prompt, params, rid):
        # each branch's gen reads no more of its stream until the abort is sent: it cannot end first
        # (its 400 tokens took 1.5-2.4 s more than the wait for both branches on a loaded machine)
        for delta, meta in streams(prompt, params, rid):
            yield delta, meta
            if delta:
                aborted.wait(60)

    monkeypatch.setattr(backend, "generate_stream", held_after_the_first_text)

    @sgl.function
    def prog(s):
        s += "Many words:"
        forks = s.fork(2)
        forks += sgl.gen("w", max_tokens=400, ignore_eos=True)
        holder.append(forks)
        forked.set()

    st = prog.run(backend=backend, stream=True)
    try:
        assert forked.wait(30)
        deadline = time.monotonic() + 60
        while any(f.stream_executor.text_ == "Many words:" for f in holder[0]):  # until both branches streamed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        st.abort()
    finally:
        aborted.set()
    for f in holder[0]:
        with pytest.raises(sgl.ProgramAborted):
            f["w"]
    # the root's error keeps each branch's partial text (it is not in the root's text until a join)
    err = st.error()
    assert err.partial_text == "Many words:"
    assert [b.branch for b in err.branches] == [(0,), (1,)]
    for b, f in zip(err.branches, holder[0]):
        assert b is f.error() and b.partial_text.startswith("Many words:") and len(b.partial_text) > len("Many words:")


@pytest.mark.timeout(120)
def test_aborting_a_state_whose_request_release_fails_still_aborts_every_branch(tiny_llama_long, monkeypatch):
    """The engine raising from abort (a request whose release failed) raised out of s.abort(): the
    state's other fork branches were never aborted, and the ProgramAborted listed none of them."""
    from lmnb_engine import Engine

    from tests.helpers_engine import assert_idle_accounting

    # (every branch must still run at the abort: with 400 tokens a branch could end before the
    # last one began on a loaded machine, and the wait for 3 running requests below never ended)
    with Engine(str(tiny_llama_long), max_total_tokens=3 * 16100) as eng:
        release = eng.scheduler._release
        calls = []

        def fail_first(req):
            calls.append(req.rid)
            if len(calls) == 1:
                raise RuntimeError("simulated leak")
            return release(req)

        @sgl.function
        def prog(s):
            s += "Q:"
            forks = s.fork(3)
            forks += sgl.gen("x", max_tokens=16000, ignore_eos=True)
            forks.join()

        st = prog.run(backend=sgl.Engine(engine=eng), stream=True, temperature=0)
        while eng.cache_stats()["running_requests"] < 3:  # (every branch's request is decoding)
            time.sleep(0.01)
        monkeypatch.setattr(eng.scheduler, "_release", fail_first)
        st.abort()
        err = st.error()
        # (a branch may have failed first with the memory reset that follows the failed release)
        assert type(err) is sgl.ProgramAborted and [e.branch for e in err.branches] == [(0,), (1,), (2,)]
        while eng.cache_stats()["running_requests"]:  # (the branches' requests end)
            time.sleep(0.01)
        assert_idle_accounting(eng)


def test_dtype_int_ends_at_the_first_space_or_newline_and_keeps_it_out_of_the_text(backend, tiny_engine):
    # SGLang's int regex allows trailing whitespace and adds the stops " " and "\n"; the reference
    # is the same regex decoded with no stops at all, cut where the first stop occurs.
    from lmnb.ir import REGEX_INT
    from lmnb_engine import SamplingParams

    @sgl.function
    def prog(s):
        s += "The answer is" + sgl.gen_int("v", max_tokens=24) + "|"

    full = tiny_engine.generate("The answer is", SamplingParams(max_new_tokens=24, temperature=0, regex=REGEX_INT))
    cut = min(i for i in (full.text.find(" "), full.text.find("\n"), len(full.text)) if i >= 0)
    assert 0 < cut < len(full.text)  # the greedy number does end in whitespace within the budget
    state = prog.run(temperature=0, backend=backend)
    assert state["v"] == int(full.text[:cut])
    assert state.text() == "The answer is" + full.text[:cut] + "|"
    assert state.get_meta_info("v")["finish_reason"]["type"] == "stop"


def test_dtype_cut_by_max_tokens_says_so_and_bad_stops_are_named(backend):
    @sgl.function
    def prog(s):
        s += "Is it? Answer:" + sgl.gen("b", dtype=bool, max_tokens=1)

    state = prog.run(temperature=0, backend=backend)
    assert "dtype=bool ran out of tokens after" in str(state.error()) and "raise max_tokens" in str(state.error())
    @sgl.function
    def number(s):
        s += "The answer is" + sgl.gen("v", dtype=int, max_tokens=8)

    full = number.run(temperature=0, backend=backend)["v"]  # 678117 on this checkpoint

    @sgl.function
    def first_token(s):
        s += "The answer is" + sgl.gen("v", dtype=int, max_tokens=1)

    # a number cut by max_tokens is refused though its first digits parse: "678117" cut to "6" was 6
    assert str(full)[0].isdigit() and len(str(full)) > 1
    err = str(first_token.run(temperature=0, backend=backend).error())
    assert f"dtype=int ran out of tokens after {str(full)[0]!r}, before its value was known to be complete" in err
    cut = str(full)[0]  # a stop string that leaves no number: stops apply to constrained output now
    err = number.run(temperature=0, stop=cut, backend=backend).error()
    assert f"dtype=int was cut by the stop string {cut!r} after ''" in str(err)
    with pytest.raises(TypeError, match=r"stop=5 is invalid: give a string or a list of strings"):
        sgl.gen("x", stop=5)
    with pytest.raises(TypeError, match=r"stop=\[1\] is invalid"):
        prog.run(stop=[1], backend=backend)
    # a pattern written as JSON, cut after 80 characters, as the engine's and the server's regex errors write it
    with pytest.raises(ValueError) as e:
        sgl.gen("x", stop_regex="(")
    assert str(e.value) == ('stop_regex="(" is invalid: "(" is not a valid regular expression (missing ), '
                            "unterminated subpattern at position 0); fix the pattern")  # (placed as regex="(" places it)
    with pytest.raises(ValueError) as e:
        sgl.gen("x", stop_regex="(" + "a" * 100)
    long = '"(' + "a" * 78 + "\u2026"
    assert str(e.value) == (f"stop_regex={long} is invalid: {long} is not a valid regular expression (missing ), "
                            "unterminated subpattern at position 0); fix the pattern")
    with pytest.raises(ValueError, match=re.escape('"x?" matches the empty string, so it would stop the output early, '
                                                   "where an empty match is met, not where what it looks for is written")):
        sgl.gen("x", stop_regex=["y", "x?"])
    with pytest.raises(ValueError, match=r"^stop_regex=5 is invalid: must be a regular expression"):
        sgl.gen("x", stop_regex=5)


def test_an_engine_refusal_names_gens_max_tokens_not_the_engines_max_new_tokens(backend, hf, tiny_engine):
    """The engine refused a gen too long for the context in its own words, "lower
    max_new_tokens", a name gen() does not have: the program is told max_tokens (min_tokens too)."""
    n = len(hf[0].encode("Hello"))  # (the prompt's tokens, BOS included)
    limit = tiny_engine.context_len

    @sgl.function
    def prog(s, **kw):
        s += "Hello" + sgl.gen("x", **kw)

    err = prog.run(max_tokens=limit, backend=backend).error()  # (no prompt fits beside it: shortening is no fix)
    assert str(err) == (f"Gen('x') failed: ValueError: prompt of {n} tokens + max_tokens={limit} exceeds the model's "
                        f"context length of {limit} tokens; lower max_tokens to at most {limit - n}")
    err = prog.run(max_tokens=limit - 1, backend=backend).error()
    assert n == 2 and str(err) == (  # (2 + 511 - 512 = 1 token too many)
        f"Gen('x') failed: ValueError: prompt of 2 tokens + max_tokens={limit - 1} exceeds the model's context length "
        f"of {limit} tokens; shorten the prompt by at least 1 token or lower max_tokens to at most {limit - 2}")
    # (the max_tokens the run's: gen() itself refuses a min_tokens above its own max_tokens)
    err = prog.run(max_new_tokens=2, min_tokens=3, backend=backend).error()
    assert str(err) == "Gen('x') failed: ValueError: min_tokens=3 is invalid: must not exceed max_tokens=2"


def test_a_refusal_of_the_default_max_tokens_says_it_is_the_default(backend, hf, tiny_engine):
    """A gen without max_tokens on a long prompt was refused for "max_tokens=128", a number the user
    never wrote: the message now says it is the default and that the gen can give its own; a
    run(max_new_tokens=128) the user did write is named as that."""
    limit = tiny_engine.context_len
    prompt = "x " * ((limit - 100) // 2)  # (two tokens each)
    n = len(hf[0].encode(prompt))
    assert n + 128 > limit >= n  # the prompt fits; the prompt and 128 new tokens do not
    assert (n, limit) == (412, 512)  # (412 + 128 - 512 = 28 tokens too many; 512 - 412 = 100 fit)

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("x")

    refusal = ("Gen('x') failed: ValueError: prompt of 412 tokens + max_tokens=128 exceeds the model's context "
               "length of 512 tokens; shorten the prompt by at least 28 tokens or lower max_tokens to at most 100")
    for stream in (False, True):
        err = prog.run(backend=backend, stream=stream).error()
        assert str(err) == (f"{refusal} (the gen has no max_tokens of its own and took lmnb's default of 128: give it "
                            "its own max_tokens=N, or set run(max_new_tokens=N))")
    # run(max_new_tokens=128) given: the same number, but the run's, not lmnb's default (it was
    # read as the default because it equals DEFAULT_MAX_NEW_TOKENS)
    err = prog.run(backend=backend, max_new_tokens=128).error()
    assert str(err) == (f"{refusal} (the gen has no max_tokens of its own and took run(max_new_tokens=128): give it "
                        "its own max_tokens=N, or lower that)")
    assert err.__cause__.reason == "does_not_fit"  # (kept by the rewording, for front ends that read it)


def test_a_prompt_that_fills_the_context_beside_the_default_max_tokens_is_told_both_ways_to_fit(backend, hf,
                                                                                                  tiny_engine):
    """A gen without max_tokens after a prompt that fills the context was told "shorten the prompt
    by at least 128 tokens (the gen ... took lmnb's default of 128 ...)", which read as if a lower
    max_tokens did not help, where each token less of it is one less to cut: it is told both ways,
    and the second fits (16 new tokens beside the prompt 16 tokens shorter)."""
    limit = tiny_engine.context_len
    assert len(hf[0].encode("x " * 256)) == limit == 512  # (two tokens each)

    @sgl.function
    def prog(s, cut=0, **kw):
        s += "x " * (256 - cut // 2) + sgl.gen("x", **kw)

    for stream in (False, True):
        assert str(prog.run(backend=backend, stream=stream).error()) == (
            "Gen('x') failed: ValueError: prompt of 512 tokens + max_tokens=128 exceeds the model's context length of "
            "512 tokens; shorten the prompt by at least max_tokens tokens (128 with max_tokens=128) (the gen has no max_tokens of its own and took lmnb's default of 128: give it its own "
            "max_tokens=N, or set run(max_new_tokens=N))")
    st = prog.run(cut=16, max_tokens=16, ignore_eos=True, backend=backend)
    assert st.error() is None and st.get_meta_info("x")["completion_tokens"] == 16


def test_a_speculative_call_refused_for_num_api_spec_tokens_is_not_blamed_on_the_default(backend, hf, tiny_engine):
    """Under API speculative execution a gen without max_tokens asks for max(its 128,
    num_api_spec_tokens) tokens: refused for num_api_spec_tokens=200, the error said the gen
    "took lmnb's default of 128" and told it to give its own max_tokens, which changes nothing
    (the call would still ask for 200)."""
    limit = tiny_engine.context_len
    prompt = "x " * ((limit - 150) // 2)  # (two tokens each)
    n = len(hf[0].encode(prompt))
    assert n + 200 > limit >= n + 128  # the prompt and 128 new tokens fit; with 200 they do not
    assert (n, limit) == (362, 512)  # (362 + 200 - 512 = 50 tokens too many; 512 - 362 = 150 fit)

    @sgl.function(num_api_spec_tokens=200)
    def prog(s):
        s += prompt + sgl.gen("x")

    # the gen never wrote max_tokens=200: the refusal says where it came from, and the fix
    spec = "(API speculative execution asked for num_api_spec_tokens=200 tokens, more than the gen's max_tokens={}: " \
           "lower @function(num_api_spec_tokens=N))"
    assert str(prog.run(backend=backend).error()) == (
        "Gen('x') failed: ValueError: prompt of 362 tokens + max_tokens=200 exceeds the model's context length of "
        f"512 tokens; shorten the prompt by at least 50 tokens or lower max_tokens to at most 150 {spec.format(128)}")

    @sgl.function(num_api_spec_tokens=200)
    def own(s):  # a gen's own max_tokens under it: the call asks for 200 all the same
        s += prompt + sgl.gen("x", max_tokens=5)

    assert str(own.run(backend=backend).error()) == (
        "Gen('x') failed: ValueError: prompt of 362 tokens + max_tokens=200 exceeds the model's context length of "
        f"512 tokens; shorten the prompt by at least 50 tokens or lower max_tokens to at most 150 {spec.format(5)}")


def test_a_batch_whose_constant_prefix_cannot_be_prefilled_runs_and_each_item_reports_it(backend, hf, tiny_engine):
    """The prefill of the traced prefix (a hint) raised out of run_batch when the prefix alone was too
    long for the context: no item ran, where a failing item does not stop a batch."""
    prefix = "x " * 600
    n = len(hf[0].encode(prefix + "a"))  # (the items' prompts, "a" and "b" each one token after it)

    @sgl.function
    def prog(s, q):
        s += prefix
        s += q + sgl.gen("a", max_tokens=2)

    states = prog.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    # (by how much, beside the gen's 2 new tokens: 1200 + 2 - 512 = 690, or 1200 - 512 = 688 + N beside N)
    assert (n, tiny_engine.context_len) == (1200, 512)
    assert [str(st.error()) for st in states] == [
        "Gen('a') failed: ValueError: prompt of 1200 tokens exceeds the model's context length of 512 tokens; shorten "
        "the prompt by at least 688 + max_tokens tokens (690 with max_tokens=2)"] * 2


def test_cache_of_a_prefix_too_long_for_the_model_says_prefix(backend, hf, tiny_engine):
    """prog.cache() passed on the engine's words for its prefill request, "prompt of N tokens ...;
    shorten the prompt", for the program's constant prefix, which the caller never called a prompt."""
    prefix = "x " * 600
    n = len(hf[0].encode(prefix))

    @sgl.function
    def prog(s, q):
        s += prefix
        s += q + sgl.gen("a", max_tokens=2)

    with pytest.raises(ValueError) as e:
        prog.cache(backend=backend)
    # (a prefill samples no token: by 1200 - 512 = 688 tokens)
    assert (n, tiny_engine.context_len) == (1200, 512)
    assert str(e.value) == ("cache() could not prefill the program's constant prefix: prefix of 1200 tokens exceeds "
                            "the model's context length of 512 tokens; shorten the prefix by at least 688 tokens")


def test_a_sampled_select_is_reproducible_with_the_run_seed(backend):
    @sgl.function
    def prog(s):
        s += "Pick one:" + sgl.select("c", choices=[" red", " blue", " green", " gold"], temperature=50.0)

    picks = {seed: [prog.run(seed=seed, backend=backend)["c"] for _ in range(3)] for seed in range(12)}
    assert all(len(set(p)) == 1 for p in picks.values())  # it drew from the global random module before
    assert len({p[0] for p in picks.values()}) > 1  # nearly uniform at this temperature: seeds differ


def test_an_image_on_a_text_only_model_fails_where_it_is_added(backend):
    @sgl.function
    def prog(s):
        s += "Look:" + sgl.image("nope.png")  # no gen follows: it finished "done" before

    err = prog.run(backend=backend).error()
    assert err is not None and "image() and video() need a vision-language model, and LlamaForCausalLM is a " \
        "text-only model; load a LLaVA checkpoint" in str(err)

    @sgl.function
    def with_video(s):
        s += "Look:" + sgl.video("nope.mp4", 2)

    err = with_video.run(backend=backend).error()  # it spoke of images only
    assert err is not None and "video() need a vision-language model" in str(err)
    # the program cannot run on this model whatever its input: a batch job's summary says so, where
    # it said "fix the input and run again" (a plain ValueError reads as the row's fault)
    from lmnb.backend.base import BackendCannotRun

    assert isinstance(err.__cause__, BackendCannotRun)


@pytest.mark.parametrize("stream", [False, True])
def test_input_logprobs_from_token_0_name_its_id_like_the_server(backend, hf, stream):
    # SGLang's (and lmnb serve's) input_token_logprobs entry for prompt token 0 is
    # [None, its id, text]; the in-process backend wrote [None, None, None].
    tok, _ = hf
    prompt = "The color of the sky is"

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("a", max_tokens=2, return_logprob=True, logprob_start_len=0,
                              return_text_in_logprobs=True)

    entries = prog.run(backend=backend, temperature=0, stream=stream).get_meta_info("a")["input_token_logprobs"]
    ids = tok(prompt).input_ids
    assert [e[1] for e in entries] == ids
    assert entries[0][0] is None and entries[0][2] == tok.decode(ids[:1])


def test_flush_cache_says_when_requests_keep_it_from_flushing(backend, tiny_engine):
    from lmnb_engine import SamplingParams

    tiny_engine.generate("a prefix to be cached", SamplingParams(max_new_tokens=1))
    handle = tiny_engine.submit("Many words:", SamplingParams(max_new_tokens=400, ignore_eos=True))
    try:
        with pytest.raises(sgl.BackendError, match="not flushed: requests are running"):  # it returned False
            sgl.flush_cache(backend)
    finally:
        handle.abort()
        handle.result()
    assert sgl.flush_cache(backend) is True
    assert tiny_engine.cache_stats()["evictable_tokens"] == 0  # nothing left cached


def test_the_run_seed_gives_fork_branches_distinct_reproducible_samples(backend):
    # every branch got the run's seed with the same prompt, so all of them wrote the same sample
    @sgl.function
    def ideas(s, own_seed):
        s += "Many words:"
        forks = s.fork(3)
        forks += sgl.gen("w", max_tokens=12, temperature=1.0, ignore_eos=True, seed=own_seed)
        forks.join()

    first = ideas.run(None, seed=7, backend=backend)["w"]
    assert len(set(first)) == 3
    assert ideas.run(None, seed=7, backend=backend)["w"] == first
    assert ideas.run(None, seed=8, backend=backend)["w"] != first
    assert len(set(ideas.run(5, seed=7, backend=backend)["w"])) == 1  # a gen's own seed is kept as given


def test_a_gen_of_0_tokens_with_logprobs_gives_the_next_tokens_top_logprobs(backend, hf):
    # SGLang's cot_decoding example reads the top-k first tokens from
    # gen(max_tokens=0, return_logprob=True, top_logprobs_num=k)["output_top_logprobs"][0]:
    # SGLang's prefill scores the next token even when none is generated. lmnb gave [].
    prompt = "The color of the sky is"

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("a", max_tokens=0, return_logprob=True, top_logprobs_num=3,
                              return_text_in_logprobs=True)

    st = prog.run(backend=backend, temperature=0)
    meta = st.get_meta_info("a")
    assert st["a"] == "" and meta["completion_tokens"] == 0
    tok, model = hf
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([tok(prompt).input_ids])).logits[0, -1].float(), dim=-1)
    values, ids = logp.topk(3)
    (top,) = meta["output_top_logprobs"]
    assert [t[1] for t in top] == ids.tolist()
    assert [t[0] for t in top] == pytest.approx(values.tolist(), abs=1e-3)
    assert top[0][2] == tok.decode(ids[:1])
    assert meta["output_token_logprobs"] == [top[0]]  # the greedy next token


def test_streamed_chunks_carry_the_logprobs_so_far_like_sglangs_stream(backend, monkeypatch):
    # SGLang streams each chunk's meta_info with the output logprobs so far (and finish_reason
    # None until the end), so `async for chunk, meta in s.text_async_iter(v, return_meta_data=True)`
    # can read meta["output_token_logprobs"]; lmnb's chunks before the last had only id and count.
    import asyncio

    @sgl.function
    def prog(s):
        s += "Q: name three animals\nA:" + sgl.gen("a", max_tokens=6, return_logprob=True, top_logprobs_num=2,
                                                   return_text_in_logprobs=True)

    whole = prog.run(backend=backend, temperature=0).get_meta_info("a")
    taken = pace_stream(backend, monkeypatch)

    async def chunks():
        st = prog.run(backend=backend, temperature=0, stream=True)
        got = []
        async for c, m in st.text_async_iter("a", return_meta_data=True):
            taken.set()
            got.append((c, m))
        return got

    got = asyncio.run(chunks())
    assert len(got) > 1
    final = got[-1][1]
    assert [e[1:] for e in final["output_token_logprobs"]] == [e[1:] for e in whole["output_token_logprobs"]]
    assert [e[0] for e in final["output_token_logprobs"]] == pytest.approx(
        [e[0] for e in whole["output_token_logprobs"]], abs=1e-4)
    text = ""
    for chunk, meta in got:
        text += chunk
        n = meta["completion_tokens"]
        assert meta["output_token_logprobs"] == final["output_token_logprobs"][:n]
        assert meta["output_top_logprobs"] == final["output_top_logprobs"][:n]
        assert "".join(e[2] for e in meta["output_token_logprobs"]).startswith(text) or n == 0
        assert meta["finish_reason"] in (None, whole["finish_reason"])  # None until the last token
        assert (meta["prompt_tokens"], meta["cached_tokens"]) == (final["prompt_tokens"], final["cached_tokens"])
    assert final["finish_reason"] == whole["finish_reason"]


def test_a_loop_of_streamed_gens_gives_each_gens_end_before_the_next_gen_starts(backend, monkeypatch):
    # gens in a loop writing one variable: text_async_iter(var, return_meta_data=True) held a gen's
    # last text (it came with the finish reason) until the next gen streamed, then yielded it with
    # that gen's text and meta info. Here each gen after the first starts only once the reader
    # has its predecessor's finish reason (or 10 s on), and says whether it had.
    import asyncio

    @sgl.function
    def prog(s):
        for i in range(3):
            s += f"\nQ{i}:" + sgl.gen("x", max_tokens=3)

    plain = prog.run(backend=backend, temperature=0).text()
    ended = threading.Event()
    had_the_end: list[bool] = []  # for each gen after the first
    calls = []
    real = backend.generate_stream

    def generate_stream(*args, **kwargs):
        if calls:
            had_the_end.append(ended.wait(10))
            ended.clear()
        calls.append(args)
        yield from real(*args, **kwargs)

    monkeypatch.setattr(backend, "generate_stream", generate_stream)

    async def pairs():
        st = prog.run(backend=backend, temperature=0, stream=True)
        got = []
        async for c, m in st.text_async_iter("x", return_meta_data=True):
            got.append((c, m))
            if m["finish_reason"] is not None:
                ended.set()
        return got

    got = asyncio.run(pairs())
    assert had_the_end == [True, True]
    # one run of pairs per gen: one request id, the finish reason on its last pair only
    gens = []
    for c, m in got:
        if not gens or gens[-1][-1][1]["finish_reason"] is not None:
            gens.append([])
        gens[-1].append((c, m))
    assert len(gens) == 3 and len({g[0][1]["id"] for g in gens}) == 3
    for g in gens:
        assert {m["id"] for _, m in g} == {g[0][1]["id"]}
        assert [m["finish_reason"] is None for _, m in g] == [True] * (len(g) - 1) + [False]
    # each gen's text is what the plain (greedy) run wrote after its prompt
    assert "".join(f"\nQ{i}:" + "".join(c for c, _ in g) for i, g in enumerate(gens)) == plain


def test_runtime_gives_the_models_tokenizer_as_sglangs_get_tokenizer_does(hf, tiny_engine):
    # SGLang's Runtime.get_tokenizer() (used to count a gen's tokens, e.g. against min_tokens) was
    # an AttributeError on lmnb.Runtime / lmnb.Engine
    tok = sgl.Runtime(engine=tiny_engine).get_tokenizer()
    text = "What is the capital of France? Paris."
    assert tok(text).input_ids == hf[0](text).input_ids
    assert tok.decode(hf[0](text).input_ids, skip_special_tokens=True) == text


def test_runtime_endpoint_chat_template_can_be_read_and_replaced_as_in_sglang(tiny_engine):
    # SGLang's LLaVA examples write `runtime.endpoint.chat_template = get_chat_template("...")`
    # (and read `.chat_template.name`); lmnb's Runtime had no `endpoint` and the backends no
    # `chat_template` attribute, so the program silently kept the model's template.
    from lmnb.backend.engine import Runtime

    runtime = Runtime(engine=tiny_engine)
    assert runtime.endpoint is runtime
    assert runtime.endpoint.chat_template.name == "model"
    runtime.endpoint.chat_template = sgl.get_chat_template("chatml")
    assert runtime.get_chat_template().name == "chatml"

    @sgl.function
    def prog(s):
        s += sgl.user("hi")

    assert prog.run(backend=runtime).text() == "<|im_start|>user\nhi<|im_end|>\n"


def test_runtime_refuses_sglangs_server_arguments_naming_what_it_takes():
    # SGLang's sgl.Runtime(model_path=..., port=30000, log_level=...) starts a server; lmnb's runs the
    # engine in-process, and Python's message named Engine.__init__, not the Runtime the user called.
    with pytest.raises(TypeError) as e:
        sgl.Runtime(model_path="unused", port=30000, mem_fraction_static=0.8)
    msg = str(e.value)
    assert msg.startswith("lmnb.Runtime / lmnb.Engine got 'port', 'mem_fraction_static', which lmnb_engine.Engine "
                          "does not take")
    assert "model (or model_path), device, dtype, max_total_tokens," in msg  # the engine's own order
    assert "closest to mem_fraction" in msg and "run `lmnb serve`" in msg
    # SGLang's chat_template server argument was refused without naming lmnb's chat_template_name
    with pytest.raises(TypeError, match=r"got 'chat_template', .*; SGLang's chat_template \(a registered template's "
                                        r"name\) is chat_template_name here"):
        sgl.Runtime(model_path="unused", chat_template="chatml")


def test_engine_takes_sglangs_offline_generate_call(backend, tiny_engine):
    # SGLang's sgl.Engine is also its offline engine: examples/frontend_language/usage/srt_engine.py
    # calls llm.generate(prompts, {"temperature": 0.8, "top_p": 0.95}) and reads output["text"];
    # lmnb's Engine raised "generate() missing 1 required positional argument: 'rid'".
    import numpy as np

    from lmnb_engine import SamplingParams

    prompts = ["Hello, my name is", "The capital of France is"]
    outs = backend.generate(prompts, {"temperature": 0, "max_new_tokens": 5})
    assert [o["text"] for o in outs] == [tiny_engine.generate(p, SamplingParams(temperature=0, max_new_tokens=5)).text
                                         for p in prompts]
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [5, 5]
    one = backend.generate(prompts[0], {"temperature": 0, "max_new_tokens": 3}, return_logprob=True,
                           top_logprobs_num=2)
    assert isinstance(one, dict) and len(one["meta_info"]["output_top_logprobs"]) == 3
    ids = tiny_engine.encode(prompts[1])
    assert backend.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 5})["text"] == outs[1]["text"]
    # text as input_ids was encoded as if it were the prompt
    for text in (prompts[0], prompts, [np.str_(p) for p in prompts], {"text": prompts[0], "images": []}):
        with pytest.raises(TypeError, match=r"^input_ids takes token ids .*; pass a text \(or a prompt with images\) as prompt=$"):
            backend.generate(input_ids=text, sampling_params={"max_new_tokens": 1})
    # a numpy string array is a batch of texts (np.str_ was read as a number: one bad prompt)
    assert [o["text"] for o in backend.generate(list(np.array(prompts)), {"temperature": 0, "max_new_tokens": 5})] == [
        o["text"] for o in outs]


def test_engine_offline_generate_takes_a_list_of_sampling_params_one_per_prompt(backend, tiny_engine):
    """SGLang's offline Engine.generate takes sampling_params as a list of dicts, one per prompt;
    lmnb's refused it with the server's "sampling_params must be a JSON object"."""
    from lmnb_engine import SamplingParams

    prompts = ["Hello, my name is", "The capital of France is"]
    outs = backend.generate(prompts, [{"temperature": 0, "max_new_tokens": 2}, {"temperature": 0, "max_new_tokens": 4}])
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 4]
    assert [o["text"] for o in outs] == [tiny_engine.generate(p, SamplingParams(temperature=0, max_new_tokens=k)).text
                                         for p, k in zip(prompts, (2, 4))]
    ids = [tiny_engine.encode(p) for p in prompts]
    assert [o["text"] for o in backend.generate(input_ids=ids, sampling_params=[
        {"temperature": 0, "max_new_tokens": 2}, {"temperature": 0, "max_new_tokens": 4}])] == [o["text"] for o in outs]
    with pytest.raises(ValueError, match=r"^a list of sampling_params gives one dict per prompt: 1 for 2 prompts; "):
        backend.generate(prompts, [{"max_new_tokens": 1}])
    # one prompt with a list of one dict: "1 for one prompt" read as the count asked for, not the fix
    with pytest.raises(ValueError) as e:
        backend.generate(prompts[0], [{"max_new_tokens": 1}])
    assert str(e.value) == ("a list of sampling_params goes with a list of prompts, one dict per prompt; this is one "
                            "prompt, not in a list: pass its dict alone (sampling_params={...}), or the prompt in a list")
    with pytest.raises(ValueError, match=r"^sampling_params 1 of the batch: .*colour"):
        backend.generate(prompts, [{"max_new_tokens": 1}, {"colour": 1}])


def test_engine_streams_sglangs_offline_generate_and_async_generate(backend, tiny_engine):
    # SGLang's offline engine: `for chunk in llm.generate(p, sp, stream=True)` yields dicts whose
    # "text" is the whole text so far, and `await llm.async_generate(...)` (with stream=True, an
    # async iterator). lmnb's Engine refused stream= and had no async_generate.
    import asyncio

    from lmnb_engine import SamplingParams

    sp = {"temperature": 0, "max_new_tokens": 6}
    want = tiny_engine.generate("Hello, my name is", SamplingParams(temperature=0, max_new_tokens=6)).text
    chunks = list(backend.generate("Hello, my name is", sp, stream=True))
    texts = [c["text"] for c in chunks]
    assert texts[-1] == want and all(want.startswith(t) for t in texts)
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6 and len(chunks[-1]["output_ids"]) == 6

    async def go():
        whole = await backend.async_generate(["Hello, my name is"], sp)
        streamed = await backend.async_generate("Hello, my name is", sp, stream=True)
        return whole, [c["text"] async for c in streamed]

    whole, async_texts = asyncio.run(go())
    assert [w["text"] for w in whole] == [want] and async_texts == texts
    with pytest.raises(ValueError, match="streams one prompt"):
        backend.generate(["a", "b"], sp, stream=True)
    # token ids as numpy integers (a tokenizer's array, listed) are one prompt, as the engine reads
    # them; the stream refused them as a batch
    import numpy as np

    ids = tiny_engine.encode("Hello, my name is")
    np_chunks = list(backend.generate(input_ids=list(np.array(ids)), sampling_params=sp, stream=True))
    assert np_chunks[-1]["output_ids"] == tiny_engine.generate(ids, SamplingParams(temperature=0,
                                                                                   max_new_tokens=6)).token_ids


def test_cancelling_an_async_generate_stream_is_a_cancellation_and_aborts_the_request(backend, tiny_engine):
    # the stream's cleanup closed its generator while a worker thread was inside next() on it:
    # "ValueError: generator already executing" instead of the task's CancelledError
    import asyncio

    sp = {"max_new_tokens": 400, "ignore_eos": True}

    async def go():
        first = asyncio.Event()

        async def consume():
            async for _ in await backend.async_generate("Once", sp, stream=True):
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()  # (streaming: a worker thread waits in next() for the next chunk)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    stats = tiny_engine.cache_stats()
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0  # (aborted, not run to 400)


def test_runtime_add_request_streams_new_text_pieces_as_sglangs_and_aborts_when_left(tiny_engine):
    # SGLang's Runtime.add_request (its async_generate's other name) is an async generator of the
    # output's new text pieces; lmnb's Runtime had no add_request (AttributeError).
    import asyncio

    from lmnb_engine import SamplingParams

    runtime = sgl.Runtime(engine=tiny_engine)
    sp = {"temperature": 0, "max_new_tokens": 6}
    want = tiny_engine.generate("Hello, my name is", SamplingParams(temperature=0, max_new_tokens=6)).text
    texts = [c["text"] for c in runtime.generate("Hello, my name is", sp, stream=True)]
    deltas = [b[len(a):] for a, b in zip([""] + texts, texts) if b != a]

    async def collect():
        return [piece async for piece in runtime.add_request("Hello, my name is", sp)]

    async def leave_after_one_piece():
        stream = runtime.add_request("Once", {"max_new_tokens": 400, "ignore_eos": True})
        await stream.__anext__()
        await stream.aclose()
        return tiny_engine.cache_stats()  # (read before asyncio.run's own clean-up closes anything)

    pieces = asyncio.run(collect())
    assert "".join(pieces) == want and pieces == deltas
    stats = asyncio.run(leave_after_one_piece())
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0  # (aborted, not run to 400)


def test_the_run_seed_gives_every_fork_of_a_state_its_own_samples(backend):
    # a second fork (or copy()) of the same state got the first one's seeds: branch k wrote what
    # branch k of the first fork wrote
    @sgl.function
    def twice(s):
        s += "Many words:"
        samples = []
        for _ in range(2):
            forks = s.fork(2)
            forks += sgl.gen("w", max_tokens=12, temperature=1.0, ignore_eos=True)
            samples += [f["w"] for f in forks]
        with s.copy() as c:
            c += sgl.gen("w", max_tokens=12, temperature=1.0, ignore_eos=True)
            samples.append(c["w"])
        s["samples"] = samples

    first = twice.run(seed=7, backend=backend)["samples"]
    assert len(set(first)) == 5
    assert twice.run(seed=7, backend=backend)["samples"] == first


@pytest.mark.parametrize("stream", [True, False])
def test_a_gen_stopped_by_an_abort_still_reports_its_prompt(backend, tiny_engine, stream, monkeypatch):
    # A stopped gen set no variable, so views and batch records never heard of its request: the
    # notebook's summary said prompt 0 / cached 0 and its prompt was not shaded. It is now reported
    # as an unnamed gen's `var` event carrying the prompt counts and an abort finish reason.
    prompt = "Count slowly:"
    events = []

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("long", max_tokens=480, ignore_eos=True)  # (the context is 512)

    submitted = threading.Event()
    submit = tiny_engine.submit

    def submit_and_tell(*args, **kwargs):
        handle = submit(*args, **kwargs)
        submitted.set()
        return handle

    monkeypatch.setattr(tiny_engine, "submit", submit_and_tell)
    def abort_once_submitted():  # (a run without stream returns when done: abort from elsewhere)
        assert submitted.wait(60)  # far from its 480th token
        [executor] = [e.value for e in events if e.kind == "state"]
        executor.abort()

    with sgl.observe(events.append):
        if stream:
            st = prog.run(backend=backend, temperature=0, stream=True)
            next(iter(st.text_iter("long")))
            st.stream_executor.abort()
        else:
            stopper = threading.Thread(target=abort_once_submitted)
            stopper.start()
            st = prog.run(backend=backend, temperature=0)
            stopper.join()
        with pytest.raises(sgl.ProgramAborted):
            st.sync()
    [stopped] = [e for e in events if e.kind == "var"]
    meta = stopped.meta_info
    assert stopped.name is None and meta["finish_reason"]["type"] == "abort"
    assert meta["prompt_tokens"] == len(tiny_engine.encode(prompt))  # BOS and the prompt's tokens
    assert 0 <= meta["cached_tokens"] < meta["prompt_tokens"]
    assert 0 <= meta["completion_tokens"] < 480
    if stream:  # the tokens of the text the state kept: greedy decoding of that many spells it
        from lmnb_engine import SamplingParams

        kept = st.error().partial_text[len(prompt):]
        greedy = tiny_engine.generate(prompt, SamplingParams(max_new_tokens=meta["completion_tokens"], temperature=0,
                                                             ignore_eos=True)).text
        assert kept and greedy.startswith(kept) and greedy[len(kept):].strip("\ufffd ") == ""


def test_an_abort_while_a_select_prefills_its_prompt_scores_no_choice(backend, tiny_engine, monkeypatch):
    # the prompt's prefill ran without the select's request id: an abort (Ctrl-C) landing then
    # reached no request, and every choice was scored after it
    events, scored = [], []
    submit = tiny_engine.submit

    def submit_and_abort_at_the_prefill(ids, params, rid=None):
        handle = submit(ids, params, rid=rid)
        if params.logprob_start_len >= 0:
            scored.append(rid)
        elif params.max_new_tokens == 0:  # the prefill: the abort is queued behind it, before any step
            [executor] = [e.value for e in events if e.kind == "state"]
            executor.abort()
        return handle

    @sgl.function
    def prog(s):
        s += "Pick one:" + sgl.select("x", choices=["alpha beta", "delta"])

    monkeypatch.setattr(tiny_engine, "submit", submit_and_abort_at_the_prefill)
    with sgl.observe(events.append):
        st = prog.run(backend=backend)
    assert isinstance(st.error(), sgl.ProgramAborted) and scored == []


def test_an_abort_before_a_select_submits_its_prompt_scores_no_choice(backend, tiny_engine, monkeypatch):
    # an abort landing while the select encodes its prompt (or prepares its images), before the
    # prefill is submitted, reached no request: the prefill and every choice ran after it
    events, submitted = [], []
    encode = tiny_engine.encode
    submit = tiny_engine.submit

    def encode_and_abort(text, *a, **k):
        if not submitted and text == "Pick one:":
            [executor] = [e.value for e in events if e.kind == "state"]
            executor.abort()
        return encode(text, *a, **k)

    def record(ids, params, rid=None):
        submitted.append(rid)
        return submit(ids, params, rid=rid)

    @sgl.function
    def prog(s):
        s += "Pick one:" + sgl.select("x", choices=["alpha beta", "delta"])

    monkeypatch.setattr(tiny_engine, "encode", encode_and_abort)
    monkeypatch.setattr(tiny_engine, "submit", record)
    with sgl.observe(events.append):
        st = prog.run(backend=backend)
    assert isinstance(st.error(), sgl.ProgramAborted) and submitted == []


def test_the_runtime_engine_given_as_a_backend_is_refused_with_its_wrapper_named(tiny_engine):
    # it failed deep in the run: "'Engine' object has no attribute 'get_chat_template'" (found by a review helper)
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("a", max_tokens=2)

    want = ("backend= is an lmnb_engine.Engine, the inference runtime, not a language backend; wrap it: "
            "lmnb.Engine(engine=that_engine)")
    for call in (lambda: prog.run(backend=tiny_engine), lambda: prog.run_batch([{}], backend=tiny_engine),
                 lambda: sgl.set_default_backend(tiny_engine)):
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == want
    assert prog.run(temperature=0, backend=sgl.Engine(engine=tiny_engine)).error() is None


def test_an_anchored_regex_as_sglang_programs_write_it_constrains_the_whole_output(backend):
    # regex=r"^\d{3}$" was refused ("uses a '^' anchor"); xgrammar, SGLang's grammar backend, drops edge anchors
    @sgl.function
    def prog(s):
        s += "Code:" + sgl.gen("c", regex=r"^\d{3}$", max_tokens=8) + " or " + sgl.gen("d", regex=r"^yes$|^no$")

    st = prog.run(temperature=0, backend=backend)
    assert st.error() is None and re.fullmatch(r"\d{3}", st["c"]) and st["d"] in ("yes", "no")


def test_a_select_choice_that_overflows_the_context_is_named_not_the_prompt(backend, hf, tiny_engine):
    # "prompt of 540 tokens exceeds the model's context length": the prompt fit, the choice did not
    limit, encode = tiny_engine.context_len, hf[0].encode
    prompt = next(p for k in range(limit, 0, -1) if len(encode(p := "x " * k)) <= limit - 2)
    long = "y z " * 20

    @sgl.function
    def prog(s):
        s += prompt + sgl.select("c", choices=["a", long])

    err = str(prog.run(backend=backend).error())
    # (by how much: what the prompt and the choice hold past the context, 590 - 512 = 78 tokens)
    assert (len(encode(prompt)), len(encode(prompt + long)), limit) == (510, 590, 512)
    assert (f"select choice {long[:30]!r}... makes the prompt 590 tokens (510 without it), more than the model's "
            "context length of 512 tokens; shorten the prompt or the choice, by at least 78 tokens between them") in err


def test_a_kv_pool_too_small_for_a_default_gen_is_refused_and_its_engine_shut_down(tiny_llama):
    """lmnb.Engine(max_total_tokens=10) was taken, and every gen without a small max_tokens failed.
    Expected: a ValueError naming the least pool, 1 (a one-character prompt, one token in the tiny
    checkpoint's tokenizer) + 128 (lmnb's default max_tokens) - 1 (the last sampled token takes no
    KV slot); the engine it made shut down, its
    scheduler thread gone, not left running behind the error."""
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ValueError) as e:
        sgl.Engine(str(tiny_llama), device="cpu", max_total_tokens=10)
    assert str(e.value) == ("a KV pool of 10 tokens cannot hold one gen of lmnb's default max_tokens (128) after a "
                            "one-character prompt (1 token); pass max_total_tokens=128 or more, or pass "
                            "engine=lmnb_engine.Engine(..., max_total_tokens=10) for a pool this small on purpose")
    assert [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("lmnb")] == []


def test_a_kv_pool_too_small_for_a_default_gen_is_had_on_purpose_by_passing_the_engine(tiny_llama):
    """The refusal's way round, which it did not name (a user who wants a tiny pool, every gen with a
    small max_tokens, had no word of it): an lmnb_engine.Engine passed as engine= is taken as it is,
    and a gen that fits its pool runs there (1 prompt token + 3 new <= 10)."""
    from lmnb_engine import Engine as RuntimeEngine

    with RuntimeEngine(str(tiny_llama), device="cpu", max_total_tokens=10) as runtime:
        backend = sgl.Engine(engine=runtime)
        assert backend.engine.model_info()["max_total_tokens"] == 10

        @sgl.function
        def prog(s):
            s += "a" + sgl.gen("x", max_tokens=3, ignore_eos=True)

        st = prog.run(backend=backend, temperature=0)
        assert st.get_meta_info("x")["completion_tokens"] == 3


def test_a_schema_above_the_engines_regex_limit_is_refused_by_the_engine_when_the_gen_runs(backend):
    """gen() leaves the limit on regex copies to the backend that builds the regex (an
    OpenAI-compatible API takes such a schema: test_lang_server_responses); the in-process engine
    refuses it when the gen runs, in its own words. Arrays nested 20 deep: c(d) = 1 + 2 c(d - 1),
    c(0) = 1, so 2**21 - 1 copies, above 2**18."""
    schema = {"type": "integer"}
    for _ in range(20):
        schema = {"type": "array", "items": schema}

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("v", max_tokens=4, json_schema=schema)

    error = prog.run(backend=backend).error()
    assert isinstance(error, sgl.ProgramError)
    assert str(error).startswith(f"Gen('v') failed: GrammarError: JSON schema is too large to compile: its regex "
                                   f"would write its subschemas about {2 ** 21 - 1} times, above the limit of {2 ** 18}")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind, max_tokens", [("regex", 2), ("regex", 5), ("json_schema", 3), ("json_schema", 6)])
def test_a_constrained_gen_cut_inside_a_character_keeps_whole_characters(backend, tiny_engine, kind, max_tokens,
                                                                         stream):
    # the tiny tokenizer spells "中" and "文" with three byte tokens each: max_tokens cuts inside
    # one; the variable held U+FFFD, which the regex / schema never allows. It keeps the whole
    # characters (its tokens' own bytes, decoded up to the incomplete one), streamed the same
    from tests.helpers_engine import utf8_whole_characters

    constraint = {"regex": "中{4}"} if kind == "regex" else {"json_schema": '{"enum": ["中文"]}'}

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("v", max_tokens=max_tokens, return_logprob=True, **constraint)

    st = prog.run(backend=backend, temperature=0, stream=stream)
    chunks = list(st.text_iter("v")) if stream else None
    meta = st.get_meta_info("v")
    ids = [e[1] for e in meta["output_token_logprobs"]]
    expected = utf8_whole_characters(tiny_engine.tokenizer, ids)
    assert len(ids) == max_tokens and tiny_engine.tokenizer.decode(ids).endswith("\ufffd")  # (a cut inside one)
    assert st["v"] == expected and "\ufffd" not in expected
    assert ("中文" if kind == "json_schema" else "中" * 4).startswith(expected.strip('"'))
    assert meta["finish_reason"]["type"] == "length" and "incomplete" in meta["finish_reason"]["message"]
    if stream:
        assert "".join(chunks) == expected


@pytest.mark.parametrize("pool", [1, 0])
def test_a_kv_pool_below_the_engines_own_floor_names_lmnbs_least_pool(tiny_llama, pool):
    """max_total_tokens=1 said 'pass max_total_tokens=2 or more' (lmnb_engine's floor), and 2 was then
    refused for 'pass 129 or more': lmnb's least pool, said at once: 1 (the one token of a one-character
    prompt in the tiny checkpoint's tokenizer) + 128 (the default max_tokens) - 1 (the last sampled
    token takes no KV slot)."""
    with pytest.raises(ValueError) as e:
        sgl.Engine(str(tiny_llama), device="cpu", max_total_tokens=pool)
    assert str(e.value) == (f"a KV pool of {pool} token{'s' * (pool != 1)} cannot hold one gen of lmnb's default "
                            "max_tokens (128) after a one-character prompt (1 token); pass max_total_tokens=128 or "
                            "more, or pass engine=lmnb_engine.Engine(..., max_total_tokens=2) for a pool this small "
                            "on purpose")  # (2: the engine's own least pool)


@pytest.mark.parametrize("option", ["stop_token_ids", "logit_bias"])
def test_api_speculative_gen_with_its_own_stop_token_ids_or_logit_bias_gets_what_it_gets_without_speculation(option):
    """A gen with stop_token_ids, or its own logit_bias, served from the leftover of an earlier
    gen's call took text drawn without them: gen("b", max_tokens=6, stop_token_ids=[" Travel"'s
    id]) after gen("a", max_tokens=1) got " the harbor. Travel west to" (finish length) where
    without speculation it gets " the harbor." (finish stop at that id); with a -100 bias on
    " Travel" it would get " Travel" all the same (and a gen without a bias, text drawn with the
    caller's). Such a gen makes its own call. Reference: the same program without speculation."""
    travel = []

    def prog(s):  # the demo model writes " see", " the", " harbor", ".", " Travel", " west", " to", ...
        own_option = {"stop_token_ids": travel} if option == "stop_token_ids" else {
            "logit_bias": dict.fromkeys(travel, -100)}
        s += "A fruit:" + sgl.gen("a", max_tokens=1) + sgl.gen("b", max_tokens=6, **own_option)
        s += sgl.gen("c", max_tokens=2)

    backend = sgl.Engine()
    try:
        travel.extend(backend.engine.tokenizer.encode(" Travel", add_special_tokens=False)[-1:])
        plain, spec = (f.run(backend=backend, temperature=0)
                       for f in (sgl.function(prog), sgl.function(num_api_spec_tokens=16)(prog)))
    finally:
        backend.shutdown()
    if option == "stop_token_ids":
        assert plain["b"] == " the harbor." and own(plain, "b") == (4, {"type": "stop", "matched": travel[0]})
    else:
        assert plain["b"].startswith(" the harbor.") and " Travel" not in plain["b"]
    assert [(spec[k], own(spec, k)) for k in "abc"] == [(plain[k], own(plain, k)) for k in "abc"]


def test_gen_logit_bias_on_the_engine_steers_greedy_tokens_as_the_hf_logits_say(backend, hf, tiny_engine):
    """gen() had no logit_bias. On the tiny model, +100 on a token makes it each of the gen's
    greedy tokens; -100 on the greedy first token makes the first token the second best of HF's
    logits there, and its reported logprob is HF's raw one (logprobs are the model's own, before
    the bias)."""
    tok, model = hf
    prompt = "the cat is red"
    ids = tiny_engine.prompt_ids(prompt)
    with torch.no_grad():
        lps = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
    best, second = lps.topk(2).indices.tolist()
    forced = tok.encode(" dog", add_special_tokens=False)[-1]
    assert forced != best

    @sgl.function
    def prog(s):
        s += prompt
        s += sgl.gen("up", max_tokens=3, ignore_eos=True, logit_bias={forced: 100})

    @sgl.function
    def ban(s):
        s += prompt + sgl.gen("down", max_tokens=1, ignore_eos=True, logit_bias={str(best): -100}, return_logprob=True)

    state = prog.run(backend=backend, temperature=0)
    assert state["up"] == tiny_engine.decode([forced] * 3, skip_special_tokens=True)
    [(logprob, token, _)] = ban.run(backend=backend, temperature=0).get_meta_info("down")["output_token_logprobs"]
    assert token == second and logprob == pytest.approx(lps[second].item(), abs=1e-4)


def test_a_word_as_a_logit_bias_key_is_refused_naming_tokenizers_whose_ids_bias_it(backend, tiny_engine, tiny_llama):
    """A word as a key was refused with "encode it to its token ids first", though the language has
    no encoder of its own: the refusal names where the model's tokenizer comes from. Each one it
    names gives the same ids (the HF tokenizer loaded from the checkpoint is the reference), and
    +100 on the word's last id makes the gen write it, as the message promises."""
    from transformers import AutoTokenizer

    with pytest.raises(ValueError) as e:
        sgl.gen("x", logit_bias={" dog": 100})
    assert str(e.value).startswith("logit_bias is invalid: the key ' dog' is not a token id: ")
    assert ("to bias a word, give its token ids from the model's own tokenizer: tokenizer.encode(word, "
            "add_special_tokens=False), where tokenizer is lmnb.Engine(...).get_tokenizer() or "
            "lmnb_engine.Engine(...).tokenizer in process, or transformers.AutoTokenizer.from_pretrained(the "
            "model's path or hub id) for a served model") in str(e.value)
    ids = [tok.encode(" dog", add_special_tokens=False)
           for tok in (backend.get_tokenizer(), tiny_engine.tokenizer, AutoTokenizer.from_pretrained(tiny_llama))]
    assert ids[0] == ids[1] == ids[2] and ids[0]

    @sgl.function
    def prog(s):
        s += "the cat is red" + sgl.gen("up", max_tokens=2, ignore_eos=True, logit_bias={ids[0][-1]: 100})

    assert prog.run(backend=backend, temperature=0)["up"] == tiny_engine.decode([ids[0][-1]] * 2, skip_special_tokens=True)


def test_a_logit_bias_id_longer_than_python_reads_gets_one_refusal_as_an_int_or_as_text(backend, tiny_engine):
    """An int key of 5001 digits reached the in-process engine, which said it is "outside this model's
    vocabulary [0, 512)", where its decimal text was refused by gen() as "past every model's
    vocabulary" (and a server backend said a third thing: too long to send). Both are refused by gen()
    in one message, which the engine's SamplingParams gives too (its own name for the field). By
    hand: 10**5000 is 1 and 5000 zeros, 5001 digits, 1.000e+5000."""
    from lmnb_engine.params import SamplingParams

    said = ("logit_bias is invalid: the key 1.000e+5000 (an integer of 5001 digits) is a token id past every "
            "model's vocabulary; remove it, or take the ids from the model's tokenizer")
    for key in (10**5000, "1" + "0" * 5000):
        with pytest.raises(ValueError) as e:
            sgl.gen("x", logit_bias={key: 1})
        assert str(e.value) == said

        @sgl.function
        def prog(s):
            s += "the cat is red" + sgl.gen("up", max_tokens=2, logit_bias={key: 1})

        with pytest.raises(ValueError) as e:
            prog.run(backend=backend)
        assert str(e.value) == said
        with pytest.raises(ValueError) as e:
            tiny_engine.generate("the cat", SamplingParams(max_new_tokens=2, logit_bias={key: 1}))
        assert str(e.value) == f"SamplingParams.{said}"


def test_a_gen_under_the_models_chat_template_ends_at_its_end_of_message_token(backend, tiny_engine):
    """The tiny model's own chat template ends a message with "<|end|>", a special token that is not
    the model's EOS; the template adds it to every unconstrained gen's stops, but the engine read
    stops in the output text, which leaves the token out, so an assistant gen ran on past the end of
    its message (to max_tokens, the next turns' text in its value). It now ends at the token: its
    tokens end with it, its value is the text before it, and the finish reason names the stop (as
    SGLang's). A gen with ignore_eos, which asks to go past the end of the message, has no such stop."""
    tok = tiny_engine.tokenizer
    end = tok.convert_tokens_to_ids("<|end|>")
    assert backend.chat_template.stop_str == ("<|end|>",) and end not in tiny_engine.eos_token_ids

    @sgl.function
    def chat(s, seed_, ignore_eos_):
        s += sgl.user("hello")
        s += sgl.assistant(sgl.gen("a", max_tokens=40, temperature=1.0, seed=seed_, ignore_eos=ignore_eos_,
                                   return_logprob=True))

    def ids(state):
        return [t[1] for t in state.get_meta_info("a")["output_token_logprobs"]]

    for seed in range(200):
        ref = ids(chat.run(seed_=seed, ignore_eos_=True, backend=backend))  # (no end-of-message stop)
        if end in ref[1:] and tiny_engine.eos_token_ids.isdisjoint(ref[: ref.index(end)]):
            break
    else:
        raise AssertionError("no seed below 200 samples <|end|>")
    k = ref.index(end)
    state = chat.run(seed_=seed, ignore_eos_=False, backend=backend)
    assert ids(state) == ref[: k + 1]
    assert state["a"] == tok.decode(ref[:k], skip_special_tokens=True)
    assert state.get_meta_info("a")["finish_reason"] == {"type": "stop", "matched": "<|end|>"}


def test_ctrl_c_in_run_does_not_wait_for_the_engines_step_to_abort(backend, tiny_engine):
    # Ctrl-C's clean-up aborts the requests with the next press held (lmnb.interrupt.held_interrupts),
    # so it must not wait: the abort used to wait for the scheduler's answer, i.e. for the end of the
    # step it was running (a long prefill, a first kernel compile; a wedged one never), and every
    # press meanwhile was swallowed. Here the scheduler is held in a "step" that only ends once run()
    # has raised (or after 30 s, which is the failure), and the gen's request waits behind it: the
    # abort is queued, and ends the request at the scheduler's next pause.
    from helpers_lang import in_a_threading_wait, interrupt_main_when, main_thread_blocked_in

    gate, held, ended = threading.Event(), threading.Event(), threading.Event()

    def hold_the_scheduler():
        held.set()
        gate.wait(30)
        ended.set()

    @sgl.function
    def prog(s):
        s += "Many words:"
        s += sgl.gen("w", max_tokens=400, ignore_eos=True)

    try:
        tiny_engine.scheduler.call(hold_the_scheduler)
        assert held.wait(30)
        # (once the gen's submit waits, and run() is blocked waiting for the gen: a SIGINT that came
        # on its way there took effect only when the held step ended)
        ready = lambda: tiny_engine.scheduler._inbox.qsize() > 0 and main_thread_blocked_in(in_a_threading_wait)  # noqa: E731
        with interrupt_main_when(ready):
            with pytest.raises(KeyboardInterrupt, match="^run was stopped"):
                prog.run(backend=backend)
        assert not ended.is_set()  # it raised while the scheduler was still in its step
    finally:
        gate.set()
    assert tiny_engine.cache_stats()["running_requests"] == 0  # (the queued abort came before this call)
    assert prog.run(backend=backend, max_new_tokens=4)["w"]  # the engine runs the next call
