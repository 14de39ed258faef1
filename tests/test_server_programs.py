"""The same programs on the in-process engine and through ``RuntimeEndpoint`` against a live
``lmnb serve`` give identical greedy results; the official ``openai`` client talks to the server;
shared prefixes show up as cached tokens; streaming is incremental."""

from __future__ import annotations

import contextlib
import json
import re

import openai
import pytest

import lmnb as sgl
from helpers_lang import live_server, pace_stream
from lmnb.backend.base import BackendError, finish_reason_dict
from lmnb.choices import first_difference

FEW_SHOT = (
    "Answer each question with one word.\n\n"
    "Q: What color is the sky?\nA: blue\n\n"
    "Q: What animal says woof?\nA: dog\n\n"
    "Q: Which city is the capital of France?\nA: paris\n\n"
)


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=6, stop="\n")


@sgl.function
def multi_turn_chat(s, first, second):
    s += sgl.system("You are a terse assistant.")
    s += sgl.user(first)
    s += sgl.assistant(sgl.gen("reply1", max_tokens=8))
    s += sgl.user(second)
    s += sgl.assistant(sgl.gen("reply2", max_tokens=8))


@sgl.function
def tips_with_fork(s, topic):
    """Skeleton of thought: an outline of two tips, each expanded in its own branch."""
    s += f"Two tips about {topic}: 1. start small. 2. keep notes.\n\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Expand tip {i + 1} in one sentence:" + sgl.gen("detail", max_tokens=8, stop="\n\n")
    s += "Tip 1:" + forks[0]["detail"] + "\nTip 2:" + forks[1]["detail"] + "\nIn short:"
    s += sgl.gen("summary", max_tokens=6)


@sgl.function
def judge_branch_solve_merge(s, answer):
    """Branch-solve-merge: three judges score one dimension each, then one verdict."""
    s += "Question: name a color.\nAnswer: " + answer + "\n"
    dims = ["relevance", "brevity", "accuracy"]
    forks = s.fork(len(dims))
    forks += lambda i: f"Judge the {dims[i]} in a few words:" + sgl.gen("judgement", max_tokens=6)
    forks.join()
    s += "Judgements: " + "; ".join(s["judgement"]) + "\nVerdict:" + sgl.gen("verdict", max_tokens=4)


@sgl.function
def pick_choices(s):
    s += "Which one fits? It is" + sgl.select("common", choices=[" the red one", " the red two", " the blue"])
    s += ". Sure? Answer:" + sgl.select("prefix", choices=[" yes", " yes indeed", " no"])


PROGRAMS = [
    (few_shot_qa, {"question": "What is two plus two?"}, ["answer"]),
    (multi_turn_chat, {"first": "Name a fruit.", "second": "And a city?"}, ["reply1", "reply2"]),
    (tips_with_fork, {"topic": "learning"}, ["summary"]),
    (judge_branch_solve_merge, {"answer": "blue"}, ["judgement", "verdict"]),
    (pick_choices, {}, ["common", "prefix"]),
]


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """Two engines on the same checkpoint: one in process, one behind the server."""
    from lmnb_engine import Engine

    local = Engine(model=str(tiny_llama), max_total_tokens=16384)
    remote = Engine(model=str(tiny_llama), max_total_tokens=16384)
    yield local, remote
    local.shutdown()
    remote.shutdown()


@pytest.fixture(scope="module")
def backends(engines):
    local, remote = engines
    with live_server(remote, served_model_name="tiny") as url:
        yield sgl.Engine(engine=local), sgl.RuntimeEndpoint(url), url



def test_backends_answer_sglangs_get_model_name_and_flush_cache_argument(backends, tiny_llama):
    # SGLang's RuntimeEndpoint has get_model_name() (the server's model_path) and
    # flush_cache(empty_cache=True); lmnb's backends had neither the method nor the argument.
    import os

    local, remote, _ = backends
    for backend in (local, remote):
        assert os.path.realpath(backend.get_model_name()) == os.path.realpath(str(tiny_llama))
        assert backend.flush_cache(empty_cache=False) is True


def test_cache_prefix_takes_sglangs_one_argument_call(backends, engines):
    # SGLang: runtime.cache_prefix(prefix) / RuntimeEndpoint.cache_prefix(prefix_str), one argument;
    # lmnb's backends also required a request id (TypeError).
    local, remote, _ = backends
    prefix = "A shared instruction prefix for every request of the batch. " * 3
    for backend, engine in zip((local, remote), engines):
        meta = backend.cache_prefix(prefix)
        assert meta["prompt_tokens"] == len(engine.encode(prefix))
        assert backend.cache_prefix(prefix)["cached_tokens"] == meta["prompt_tokens"] - 1  # all but the last

@pytest.mark.parametrize("program,kwargs,names", PROGRAMS, ids=[p[0].__name__ for p in PROGRAMS])
def test_same_greedy_results_in_process_and_over_http(backends, program, kwargs, names):
    local, remote, _ = backends
    a = program.run(backend=local, temperature=0, **kwargs)
    b = program.run(backend=remote, temperature=0, **kwargs)
    assert a.text() == b.text()
    assert a.messages() == b.messages()
    for name in names:
        assert a[name] == b[name]


def test_run_batch_of_32_is_identical_and_hits_the_shared_prefix(backends, engines):
    local, remote, _ = backends
    questions = [{"question": f"What is item number {i} in the list?"} for i in range(32)]
    a = few_shot_qa.run_batch(questions, backend=local, temperature=0, num_threads=8)
    b = few_shot_qa.run_batch(questions, backend=remote, temperature=0, num_threads=8)
    assert [s["answer"] for s in a] == [s["answer"] for s in b]
    assert [s.text() for s in a] == [s.text() for s in b]
    prefix_ids = engines[0].encode(FEW_SHOT + "Q: ")
    for st, kw in zip(a + b, questions + questions):
        full = engines[0].encode(FEW_SHOT + "Q: " + kw["question"] + "\nA:")
        shared = first_difference(prefix_ids, full)  # tokens every item has in common
        assert shared > 40
        assert st.get_meta_info("answer")["cached_tokens"] >= shared - 1


def test_fork_branches_hit_the_prefilled_prefix(backends, engines):
    _, remote, _ = backends
    st = judge_branch_solve_merge.run(answer="green", backend=remote, temperature=0)
    prefix = engines[0].encode("Question: name a color.\nAnswer: green\n")
    for meta in st.get_meta_info("judgement"):
        assert meta["cached_tokens"] >= len(prefix) - 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_server_says_which_characters_of_the_prompt_were_cached(backends, engines, stream):
    # a notebook connected to lmnb serve shaded no cached span: it has no tokenizer to map
    # cached_tokens onto its text; the server now says cached_chars, as the in-process backend does
    _, remote, _ = backends
    local = engines[0]
    first, second = ("ink", "tar") if stream else ("grass", "snow")  # prompts no other test sent
    few_shot_qa.run(question=f"What color is {first}?", backend=remote, temperature=0)
    st = few_shot_qa.run(question=f"What color is {second}?", backend=remote, temperature=0, stream=stream)
    meta = st.get_meta_info("answer")
    prompt = FEW_SHOT + f"Q: What color is {second}?\nA:"
    ids = local.encode(prompt)
    assert meta["cached_chars"] == len(local.decode(ids[:meta["cached_tokens"]], skip_special_tokens=True))
    shared = len(FEW_SHOT + "Q: What color is ")  # the first prompt's text up to where they differ
    assert shared - 12 <= meta["cached_chars"] <= shared  # the cached tokens end at a token boundary in it


def test_cached_chars_count_the_special_tokens_a_chat_prompt_writes(backends, engines):
    # the chat markers (<|user|>, <|assistant|>) are text of the prompt: skipping them when the
    # cached tokens were decoded back said 3 characters for the 6 cached tokens of this prompt
    import httpx

    _, _, url = backends
    text = "<s><|user|>hi there<|end|>\n<|assistant|>"
    body = {"text": text, "sampling_params": {"max_new_tokens": 0}}
    httpx.post(f"{url}/generate", json=body, timeout=60)
    meta = httpx.post(f"{url}/generate", json=body, timeout=60).json()["meta_info"]
    assert meta["cached_tokens"] == meta["prompt_tokens"] - 1  # all but the last token, <|assistant|>
    assert meta["cached_chars"] == len(text) - len("<|assistant|>")


def test_every_streamed_chunk_of_generate_carries_the_prompt_counts_as_sglangs_do(backends, engines):
    # SGLang's stream chunks each hold prompt_tokens and cached_tokens; lmnb's had them only in
    # the last chunk, so a client stopped mid-stream never learned its prompt's size
    import json

    import httpx

    _, _, url = backends
    text = "Once upon a time a fox"
    body = {"text": text, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    httpx.post(f"{url}/generate", json=body, timeout=60)  # now all but its last token is cached
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and line != "data: [DONE]"]
    n = len(engines[0].encode(text))
    assert len(chunks) > 1
    assert [(c["meta_info"]["prompt_tokens"], c["meta_info"]["cached_tokens"]) for c in chunks] == [(n, n - 1)] * len(chunks)


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
def test_a_streamed_batch_interleaves_its_prompts_as_they_generate(backends, engines, path, monkeypatch):
    """SGLang streams a batch's prompts as they generate, each chunk with its index; lmnb streamed
    them one after another, the second's first text only once the first had finished. The engine
    starts the streamed batch once its three prompts are queued: on a loaded machine the first
    one's 24 tokens could come before the route had submitted the second."""
    import threading

    import httpx

    _, _, url = backends
    remote = engines[1]
    prompts = ["The river", "Once upon a time", "A fox and a"]
    if path == "/generate":
        body = {"text": prompts, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    else:
        body = {"model": "tiny", "prompt": prompts, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(url + path, json=body, timeout=60).json()
    if path != "/generate":
        body["stream_options"] = {"include_usage": True}
    queued, submitted, submit = threading.Event(), [], remote.submit

    def submit_noted(*args, **kwargs):
        handle = submit(*args, **kwargs)
        submitted.append(handle)
        if len(submitted) == len(prompts):
            queued.set()
        return handle

    monkeypatch.setattr(remote, "submit", submit_noted)
    remote.scheduler.call(lambda: queued.wait(60))  # (the loop waits between steps until then)
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and line != "data: [DONE]"]
    if path == "/generate":
        order = [c["index"] for c in chunks]
        texts = {c["index"]: c["text"] for c in chunks}  # (each chunk: the sample's text so far)
        assert [texts[i] for i in range(3)] == [w["text"] for w in whole]
    else:
        order = [c["choices"][0]["index"] for c in chunks if c["choices"]]
        texts = ["".join(c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i)
                 for i in range(3)]
        assert texts == [c["text"] for c in whole["choices"]]
        assert chunks[-1]["usage"] == whole["usage"]
    assert order.index(1) < len(order) - 1 - order[::-1].index(0)  # the second began before the first ended


def test_streamed_usage_counts_each_prompts_cached_tokens_as_the_unstreamed_reply_does(backends):
    """A prompt's n samples may report different cached tokens (the first prefilled the prompt the
    others found cached); the streamed usage took each prompt's sample that finished first."""
    import httpx

    _, _, url = backends
    body = {"model": "tiny", "prompt": ["Hello there my friend how are you", "The quick brown fox jumps"],
            "max_tokens": 30, "temperature": 1.0, "n": 4, "seed": 3, "stop": ["e"]}  # (samples end apart)
    usages = []
    for stream in (False, True, True, True):
        httpx.post(url + "/flush_cache", timeout=60)
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        with httpx.stream("POST", url + "/v1/completions", json={**body, **extra}, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line.startswith(("data:", "{"))]
        usage = json.loads(lines[-2][5:] if stream else "".join(lines))["usage"]
        usages.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert usages[1:] == [usages[0]] * 3


def test_streaming_over_http_yields_chunks_before_the_end(backends, monkeypatch):
    local, remote, _ = backends

    @sgl.function
    def story(s):
        s += "Once upon a time in a city" + sgl.gen("rest", max_tokens=10)

    want = story.run(backend=local, temperature=0)["rest"]
    taken = pace_stream(remote, monkeypatch)
    st = story.run(backend=remote, temperature=0, stream=True)
    chunks = []
    for chunk in st.text_iter("rest"):
        taken.set()
        chunks.append(chunk)
    assert len(chunks) > 1 and "".join(chunks) == want


def test_official_openai_client_chat_completion_and_streaming(backends, engines):
    _, _, url = backends
    local = engines[0]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["tiny"]

    messages = [{"role": "user", "content": "Say something short."}]
    prompt_text = local.apply_chat_template(messages, add_generation_prompt=True)
    from lmnb_engine import SamplingParams

    want = local.generate(local.encode(prompt_text, add_special_tokens=False), SamplingParams(max_new_tokens=6, temperature=0))
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True)
    assert chat.choices[0].message.content == want.text
    assert chat.usage.completion_tokens == 6 and len(chat.choices[0].logprobs.content) == 6

    comp = client.completions.create(model="tiny", prompt="The river", max_tokens=5, temperature=0)
    assert comp.choices[0].text == local.generate("The river", SamplingParams(max_new_tokens=5, temperature=0)).text

    deltas = [
        c.choices[0].delta.content
        for c in client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True)
        if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 1 and "".join(deltas) == want.text
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt="The river", max_tokens=5, temperature=0, stream=True)]
    assert "".join(pieces) == comp.choices[0].text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_logprob_bytes_join_into_the_reply_when_tokens_split_characters(backends, stream):
    """OpenAI's ``bytes`` are each token's own bytes, so that tokens holding parts of one character
    join into it; every byte token of 'é🙂' said [239, 191, 189], the bytes of U+FFFD."""
    _, _, url = backends
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=0,
              logprobs=True, top_logprobs=1, extra_body={"regex": "é🙂"})
    if stream:
        chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        text = "".join(c.delta.content or "" for c in chunks)
        content = [t for c in chunks if c.logprobs for t in c.logprobs.content]
        # each chunk carries the logprobs of the tokens whose text it carries: under jump-forward one
        # event holds several tokens, and a trailing byte token rode ahead of its character
        for c in chunks:
            assert bytes(b for t in (c.logprobs.content if c.logprobs else []) for b in t.bytes) == \
                (c.delta.content or "").encode()
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, content = choice.message.content, choice.logprobs.content
    assert text == "é🙂"
    assert len(content) > 2  # the tiny vocabulary spells them in byte tokens
    assert bytes(b for t in content for b in t.bytes) == "é🙂".encode()
    assert all(b"\xef\xbf\xbd" not in bytes(x.bytes) for t in content for x in t.top_logprobs)


def test_streamed_logprobs_wait_with_text_held_back_for_a_stop_string(backends):
    """Text that may begin a stop string is held back; the logprobs of its tokens went out a chunk
    ahead of it. Each chunk's logprob tokens spell its text."""
    _, _, url = backends
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    kw = dict(model="tiny", prompt="The river", max_tokens=16, temperature=0, logprobs=0,
              extra_body={"regex": "[a-z ]+"})  # (whole characters: a random model writes stray bytes)
    full = client.completions.create(**kw).choices[0].text
    stops = [full[j : j + 2] + "\x07" for j in range(0, len(full) - 2, 3)][:4]  # never completed (OpenAI: 4)
    chunks = [c.choices[0] for c in client.completions.create(stream=True, stop=stops, **kw)]
    assert "".join(c.text for c in chunks) == full and chunks[-1].finish_reason == "length"
    for c in chunks:
        assert b"".join(_token_bytes(t) for t in (c.logprobs.tokens if c.logprobs else [])) == c.text.encode()
    assert len(chunks) < 16  # some of the 16 tokens waited for the next one


def _token_bytes(token: str) -> bytes:
    """The bytes an OpenAI logprob token stands for: ``bytes:`` tokens escape the bytes of partial
    characters as ``\\xNN``."""
    if not token.startswith("bytes:"):
        return token.encode()
    parts = re.split(r"(\\x[0-9a-f]{2})", token[6:])
    return b"".join(bytes([int(p[2:], 16)]) if re.fullmatch(r"\\x[0-9a-f]{2}", p) else p.encode() for p in parts)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_byte_tokens_are_written_as_their_bytes(backends, engines, stream):
    """A token holding part of a character is ``bytes:\\xNN`` (OpenAI's form), not U+FFFD, which
    every such token read: the tokens spell the reply's bytes, and distinct byte tokens are
    distinct keys of top_logprobs (a dict keyed by token text)."""
    _, _, url = backends
    # (closed: its connection was left to the garbage collector, "ResourceWarning: unclosed <socket.socket ...>")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        kw = dict(model="tiny", prompt="hi", max_tokens=12, temperature=0, logprobs=5, extra_body={"regex": "é🙂"})
        if stream:
            chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
            tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
            for c in chunks:  # each chunk with the logprobs of the tokens whose text it carries
                assert b"".join(_token_bytes(t) for t in (c.logprobs.tokens if c.logprobs else [])) == c.text.encode()
        else:
            tokens = client.completions.create(**kw).choices[0].logprobs.tokens
        assert len(tokens) > 2 and all("\ufffd" not in t for t in tokens)
        assert b"".join(_token_bytes(t) for t in tokens) == "é🙂".encode()
        tok = engines[0].tokenizer  # the same text for two different byte tokens before
        byte_ids = [i for i in range(len(tok)) if tok.decode([i]) == "\ufffd"][:8]
        lp = client.completions.create(model="tiny", prompt=byte_ids, max_tokens=1, echo=True, logprobs=0)
        assert len(set(lp.choices[0].logprobs.tokens[:len(byte_ids)])) == len(byte_ids) > 1


def test_echoed_completion_text_offsets_index_the_returned_text(backends, engines):
    _, _, url = backends
    local = engines[0]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    bos = local.tokenizer.bos_token_id  # as a tokenizer that adds BOS would put it (this one does not)
    words = "The river runs"
    prompt = [bos] + local.encode(words)
    comp = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=1)
    text, lp = comp.choices[0].text, comp.choices[0].logprobs
    assert text.startswith(words)  # the BOS is listed, but not in the text
    assert lp.tokens[0] == local.tokenizer.bos_token and lp.text_offset[:2] == [0, 0]
    for tok, off in list(zip(lp.tokens, lp.text_offset))[1:]:  # before, each was 3 (len "<s>") too far
        assert text[off:off + len(tok)] == tok or tok.startswith("bytes:")  # (a byte token of a character)
    assert lp.text_offset[-1] + len(lp.tokens[-1]) == len(text) or lp.tokens[-1].startswith("bytes:")
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    [streamed] = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert streamed.model_dump() == lp.model_dump()  # the prompt's logprobs too (before: the completion's only)
    # byte tokens: "é" is two byte-level tokens that decode alone to U+FFFD each
    accented = local.encode("hé river")
    comp = client.completions.create(model="tiny", prompt=accented, max_tokens=1, temperature=0, echo=True,
                                     logprobs=0)
    text, lp = comp.choices[0].text, comp.choices[0].logprobs
    assert text.startswith("hé river")
    expected = [len(local.decode(accented[:i], skip_special_tokens=True).rstrip("\ufffd"))
                for i in range(len(accented))]  # the text before each token, whole characters only
    assert lp.text_offset[:len(accented)] == expected
    assert text[expected[-1]:].startswith(lp.tokens[len(accented) - 1])
    # a special token written in a text prompt is echoed as written: the offsets after it were 3 short
    # (the decoder, which skips it, reads "The river" where the text says "<s>The river")
    for stream in (False, True):
        kw = dict(model="tiny", prompt="<s>" + words, max_tokens=2, temperature=0, echo=True, logprobs=0,
                  extra_body={"regex": "[a-z ]+"})  # (whole characters: a random model writes stray bytes)
        if stream:
            chunks = list(client.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].text for c in chunks)
            [lp] = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
        else:
            choice = client.completions.create(**kw).choices[0]
            text, lp = choice.text, choice.logprobs
        assert text.startswith("<s>" + words) and "".join(lp.tokens) == text
        assert lp.tokens[0] == "<s>" and lp.text_offset[1] == 3
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_completion_top_logprobs_always_hold_the_sampled_token(backends, engines, stream):
    """OpenAI's legacy completions: ``logprobs=N`` gives the N most likely tokens and always the
    sampled one, so N or N+1 entries; ``logprobs=0`` the sampled token alone. Before, a sampled
    token outside the top N was missing (temperature 3: most of them) and ``logprobs=0`` gave nulls.
    The top N are /generate's ``output_top_logprobs`` for the same seeded sample."""
    _, _, url = backends
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    kw = dict(model="tiny", prompt="The river", max_tokens=30, temperature=3.0, seed=7)

    def logprobs(n):
        if not stream:
            return client.completions.create(logprobs=n, **kw).choices[0].logprobs
        parts = [c.choices[0].logprobs for c in client.completions.create(logprobs=n, stream=True, **kw)]
        return {key: [x for p in parts if p is not None for x in getattr(p, key)] for key in ("tokens", "token_logprobs",
                                                                                          "top_logprobs")}

    def field(lp, key):
        return lp[key] if isinstance(lp, dict) else getattr(lp, key)

    import httpx

    from lmnb_engine.token_text import token_text as _token  # (a byte token's text: bytes:\xNN)

    gen = httpx.post(f"{url}/generate", timeout=60, json={
        "text": "The river", "return_logprob": True, "top_logprobs_num": 1,
        "sampling_params": {"max_new_tokens": 30, "temperature": 3.0, "seed": 7}}).json()
    want_top = [_token(engines[1], top[0][1]) for top in gen["meta_info"]["output_top_logprobs"]]
    one = logprobs(1)
    tokens, values, tops = field(one, "tokens"), field(one, "token_logprobs"), field(one, "top_logprobs")
    assert len(tokens) == len(tops) == 30
    outside = 0
    for token, value, top, best in zip(tokens, values, tops, want_top):
        assert top[token] == pytest.approx(value, abs=1e-5)  # the sampled token, always
        assert best in top and top[best] >= value - 1e-5  # the most likely one
        assert len(top) == (1 if token == best else 2)
        outside += token != best
    assert outside > 0  # (at temperature 3 the sample leaves the top token: the case that was missing)
    zero = logprobs(0)
    assert field(zero, "tokens") == tokens
    assert field(zero, "top_logprobs") == [{t: pytest.approx(v, abs=1e-5)} for t, v in zip(tokens, values)]


def test_openai_backend_top_logprobs_are_the_top_n_without_the_sampled_token(backends, engines):
    """The OpenAI backend's ``output_top_logprobs`` are SGLang's: the N most likely tokens, most
    likely first, without the sampled token OpenAI's completions add beside them when it is not
    among them (N+1 entries), and the same as the in-order top N the server sends: the reference
    is /generate's ``output_top_logprobs`` for the same seeded sample."""
    import httpx

    from lmnb_engine.token_text import token_text as _token  # (a byte token's text: bytes:\\xNN)

    _, _, url = backends
    backend = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    @sgl.function
    def prog(s):
        s += "The river" + sgl.gen("x", max_tokens=30, return_logprob=True, top_logprobs_num=2)

    meta = prog.run(backend=backend, temperature=3.0, seed=7).get_meta_info("x")
    gen = httpx.post(f"{url}/generate", timeout=60, json={
        "text": "The river", "return_logprob": True, "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 30, "temperature": 3.0, "seed": 7}}).json()
    want = [[(_token(engines[1], t), v) for v, t, *_ in top] for top in gen["meta_info"]["output_top_logprobs"]]
    sampled = [e[2] for e in meta["output_token_logprobs"]]
    tops = meta["output_top_logprobs"]
    assert len(tops) == 30 and all(len(top) == 2 for top in tops)
    assert [[(t, pytest.approx(v, abs=1e-5)) for v, _, t in top] for top in tops] == want
    assert any(t not in [e[2] for e in top] for top, t in zip(tops, sampled))  # (the lists the sample was added to)


def test_chat_top_logprobs_hold_exactly_the_top_n_and_the_sample_its_own_logprob(backends):
    """Chat's ``top_logprobs`` are the N most likely tokens, the sampled one or not (OpenAI's chat
    API); the sampled token's logprob is the content item's own ``logprob``."""
    _, _, url = backends
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    content = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something."}], max_tokens=20, temperature=3.0,
        seed=7, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    assert len(content) == 20
    assert all(len(t.top_logprobs) == 2 for t in content)
    assert any(t.token not in [x.token for x in t.top_logprobs] for t in content)
    for t in content:  # most likely first; the sample, where among them, with its own logprob, else below them
        values = [x.logprob for x in t.top_logprobs]
        assert values == sorted(values, reverse=True)
        listed = {x.token: x.logprob for x in t.top_logprobs}
        if t.token in listed:
            assert listed[t.token] == pytest.approx(t.logprob, abs=1e-5)
        else:
            assert t.logprob <= values[-1] + 1e-5


def test_streamed_logprobs_come_with_their_chunks_and_add_up_to_the_unstreamed_ones(backends):
    """OpenAI and vLLM stream each chunk's tokens' logprobs with it (before: all in the last chunk)."""
    _, _, url = backends
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    messages = [{"role": "user", "content": "Say something."}]
    kw = dict(model="tiny", max_tokens=12, temperature=0)
    whole = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=2, **kw).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(
        messages=messages, logprobs=True, top_logprobs=2, stream=True, **kw) if c.choices]
    with_lps = [c for c in chunks if c.logprobs is not None and c.logprobs.content]
    assert len(with_lps) > 1  # not one block at the end
    streamed = [t for c in with_lps for t in c.logprobs.content]  # (the second request hits the cache:
    assert [t.token for t in streamed] == [t.token for t in whole.logprobs.content]  # float noise only)
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in whole.logprobs.content], abs=1e-4)
    assert [[a.token for a in t.top_logprobs] for t in streamed] == \
        [[a.token for a in t.top_logprobs] for t in whole.logprobs.content]
    for c in with_lps:  # each chunk's tokens spell its text (none of them is a byte of a split character)
        if not any(t.token.startswith("bytes:") for t in c.logprobs.content):
            assert "".join(t.token for t in c.logprobs.content) == c.delta.content

    whole = client.completions.create(prompt="The river", logprobs=2, **kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(prompt="The river", logprobs=2, stream=True, **kw)]
    with_lps = [c.logprobs for c in chunks if c.logprobs is not None]
    assert len(with_lps) > 1
    for key in ("tokens", "text_offset"):  # offsets index the whole text
        assert [x for lp in with_lps for x in getattr(lp, key)] == getattr(whole.logprobs, key), key
    assert [x for lp in with_lps for x in lp.token_logprobs] == pytest.approx(whole.logprobs.token_logprobs, abs=1e-4)
    assert [list(t) for lp in with_lps for t in lp.top_logprobs] == [list(t) for t in whole.logprobs.top_logprobs]


@pytest.mark.parametrize("kind", ["runtime", "openai-chat", "openai-completion"])
def test_text_async_iter_meta_data_ends_with_the_finish_reason_over_http(backends, kind):
    """A streamed gen's last meta info (its finish reason) reaches ``text_async_iter(var,
    return_meta_data=True)``; over the OpenAI API the finish reason comes in a chunk with no text,
    and no yielded chunk carried it (the last one's was None)."""
    import asyncio

    _, remote, url = backends
    backend = remote if kind == "runtime" else sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=kind == "openai-chat")

    @sgl.function
    def prog(s):
        s += sgl.user("The bird in the tree") if kind == "openai-chat" else "The bird in the tree"
        s += sgl.assistant(sgl.gen("x", max_tokens=5)) if kind == "openai-chat" else sgl.gen("x", max_tokens=5)

    whole = prog.run(backend=backend, temperature=0).get_meta_info("x")["finish_reason"]
    assert whole is not None

    async def pairs():
        st = prog.run(backend=backend, temperature=0, stream=True)
        return [(c, m) async for c, m in st.text_async_iter("x", return_meta_data=True)], st

    got, st = asyncio.run(pairs())
    assert "".join(c for c, _ in got) == st["x"]
    assert got[-1][1]["finish_reason"] == whole
    assert got[-1][1] == st.get_meta_info("x")  # the gen's final meta info (usage too)


def test_top_logprobs_num_without_return_logprob_is_refused_alike_on_every_backend(backends):
    """The engine and lmnb serve refuse top_logprobs_num without return_logprob; the OpenAI backend
    dropped it without a word (and an SGLang server does), so one program got alternatives on no
    backend, an error on two, in two wordings. The gen's count is refused so; run()'s is a default
    for the gens that ask for logprobs, as in SGLang (below)."""
    local, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    chat = sgl.OpenAI("tiny", base_url=f"{url}/v1")
    refused = ("top_logprobs_num=2 is invalid: the top alternatives come only with the logprobs: also ask for "
               "return_logprob, or leave top_logprobs_num out")

    @sgl.function
    def ask(s, options, plain):
        if plain:  # (the completion model has no chat template known to lmnb: plain text)
            s += "A fruit:" + sgl.gen("reply", max_tokens=3, **options)
            return
        s += sgl.user("Name a fruit.")
        s += sgl.assistant(sgl.gen("reply", max_tokens=3, **options))

    for backend in (local, remote, completion, chat):
        # (the gen's options, run()'s)
        for gen, run in [({"top_logprobs_num": 2}, {}),
                         ({"top_logprobs_num": 2, "return_logprob": False}, {"return_logprob": True})]:
            state = ask.run(gen, backend is completion, backend=backend, temperature=0, **run)
            assert isinstance(state.error().__cause__, ValueError) and str(state.error().__cause__) == refused
        # with the logprobs asked for (by the gen, or by run() under the gen's count), it runs
        for gen, run in [({"top_logprobs_num": 2, "return_logprob": True}, {}),
                         ({"top_logprobs_num": 2}, {"return_logprob": True})]:
            state = ask.run(gen, backend is completion, backend=backend, temperature=0, **run)
            assert state.error() is None
            assert [len(top) for top in state.get_meta_info("reply")["output_top_logprobs"]] == [2] * 3


def test_run_top_logprobs_num_is_a_default_for_the_gens_that_ask_for_logprobs(backends):
    """SGLang's run(top_logprobs_num=N) sets the count once; the gens with return_logprob=True get N
    alternatives per token and the others no logprobs. lmnb refused the whole program at the first
    gen without return_logprob (top_logprobs_num=2 is invalid: ... also ask for return_logprob), on
    every backend."""
    local, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    @sgl.function
    def two(s):
        s += "A fruit:" + sgl.gen("plain", max_tokens=3) + " A tree:" + sgl.gen("scored", max_tokens=3,
                                                                                return_logprob=True)

    for backend in (local, remote, completion):
        state = two.run(backend=backend, temperature=0, top_logprobs_num=2)
        assert state.error() is None, backend
        assert not any("logprobs" in key for key in state.get_meta_info("plain")), backend
        assert [len(top) for top in state.get_meta_info("scored")["output_top_logprobs"]] == [2] * 3, backend


def test_openai_backend_runs_a_chat_program_against_lmnb_serve(backends):
    _, remote, url = backends
    chat = sgl.OpenAI("tiny", base_url=f"{url}/v1")

    @sgl.function
    def ask(s):
        s += sgl.system("You are a terse assistant.")
        s += sgl.user("Name a fruit.")
        s += sgl.assistant(sgl.gen("reply", max_tokens=8))

    via_openai = ask.run(backend=chat, temperature=0)["reply"]
    via_native = ask.run(backend=remote, temperature=0)
    # the server renders the messages with the model's template; the native program renders the
    # same template's markers itself, so the model sees the same tokens
    assert via_openai == via_native["reply"]


def test_openai_completion_backend_selects_like_the_native_endpoint(backends):
    _, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    a = pick_choices.run(backend=remote)
    b = pick_choices.run(backend=completion)
    for name in ("common", "prefix"):
        assert a[name] == b[name]
        want = a.get_meta_info(name)["normalized_prompt_logprobs"]
        assert b.get_meta_info(name)["normalized_prompt_logprobs"] == pytest.approx(want, abs=1e-4)


def test_a_select_of_more_choices_than_lmnb_serve_takes_in_one_request_is_scored_in_several(backends, monkeypatch):
    """lmnb serve refuses a request of more than MAX_REQUEST_SAMPLES samples (400), and
    RuntimeEndpoint sent a select's prompt and all its choices (and their unconditional scores) in
    one /generate request, the OpenAI backend in one /v1/completions request: a select of more
    choices failed. With the bounds cut to 3 here, seven choices are scored in several requests,
    to the in-process backend's scores."""
    from lmnb.backend import base, openai, runtime_endpoint
    from lmnb_engine.http_server import app

    assert base.MAX_BATCH_PROMPTS == app.MAX_REQUEST_SAMPLES  # (lmnb does not import the server)
    local, remote, url = backends
    monkeypatch.setattr(app, "MAX_REQUEST_SAMPLES", 3)
    for module in (runtime_endpoint, openai):
        monkeypatch.setattr(module, "MAX_BATCH_PROMPTS", 3)
    choices = [" red", " green", " blue", " yellow", " black", " white", " a colour of its own"]

    @sgl.function
    def pick(s, method):
        s += "The sky on a clear day is" + sgl.select("c", choices=choices, choices_method=method)

    for method in (sgl.token_length_normalized, sgl.unconditional_likelihood_normalized):
        want, got = pick.run(backend=local, method=method), pick.run(backend=remote, method=method)
        assert got.error() is None and got["c"] == want["c"]
        w, g = want.get_meta_info("c"), got.get_meta_info("c")
        assert g["normalized_prompt_logprobs"] == pytest.approx(w["normalized_prompt_logprobs"], abs=1e-4)
        assert [[t[1] for t in e] for e in g["input_token_logprobs"]] == [
            [t[1] for t in e] for e in w["input_token_logprobs"]]
        for key in ("input_token_logprobs", "unconditional_token_logprobs"):
            assert [[t[0] for t in e] for e in g.get(key) or []] == [
                pytest.approx([t[0] for t in e], abs=1e-4) for e in w.get(key) or []]
        assert (g.get("unconditional_token_logprobs") is None) == (method is sgl.token_length_normalized)
    # the OpenAI backend's select (a completion model: its prompt and choices echoed) too
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    want, got = pick.run(backend=local, method=sgl.token_length_normalized), pick.run(
        backend=completion, method=sgl.token_length_normalized)
    assert got.error() is None and got["c"] == want["c"]
    assert got.get_meta_info("c")["normalized_prompt_logprobs"] == pytest.approx(
        want.get_meta_info("c")["normalized_prompt_logprobs"], abs=1e-4)


@pytest.mark.parametrize("choices", [["ab", "bc"], ["nnu\U0001F642", "q\u00e9b\u4e2d"], ["ab", "a"]])
def test_openai_completion_select_after_an_empty_prompt_scores_or_fails_as_in_process(backends, choices):
    """The OpenAI backend sent the empty prompt among the prompts to echo, which the server refuses
    (HTTP 400 'prompt[0]: empty prompt'): every select first in a program failed, in other words
    than in process. Each choice is now scored from its second token (its first has no context),
    and a one-token choice fails with the in-process backend's words."""
    local, _, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    @sgl.function
    def pick(s):
        s += sgl.select("c", choices=choices)

    want, got = pick.run(backend=local), pick.run(backend=completion)
    if want.error() is not None:
        assert str(got.error().__cause__) == str(want.error().__cause__)
        assert str(want.error().__cause__) == "select choice 'a' leaves no token to score after the prompt ''"
        return
    assert got.error() is None and got["c"] == want["c"]
    w, g = want.get_meta_info("c"), got.get_meta_info("c")
    assert g["normalized_prompt_logprobs"] == pytest.approx(w["normalized_prompt_logprobs"], abs=1e-4)
    assert [len(e) for e in g["input_token_logprobs"]] == [len(e) for e in w["input_token_logprobs"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_regex_of_gen_and_run_ends_the_output_at_its_first_match_on_every_backend(backends, stream):
    """SGLang's gen(stop_regex=...) and run(stop_regex=...) were TypeErrors (the engine and the
    server had it, the language did not)."""
    local, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    @sgl.function
    def prog(s, pattern=None):  # (a parameter named stop_regex would be refused beside run(stop_regex=...))
        s += "The bird in the tree" + sgl.gen("x", max_tokens=16, stop_regex=pattern)

    full = prog.run(backend=local, temperature=0)["x"]
    char = next(c for c in full[2:] if c.isascii() and c.isalnum())  # a character the greedy output holds
    want = full[:full.index(char)]  # the text before its first occurrence
    for backend in (local, remote, completion):
        state = prog.run(f"[{char}]", backend=backend, temperature=0, stream=stream)
        assert state["x"] == want
        # (lmnb.OpenAI dropped the server's matched_stop: the finish reason was {"type": "stop"} only)
        assert finish_reason_dict(state.get_meta_info("x")) == {"type": "stop", "matched": char}
        assert prog.run(backend=backend, temperature=0, stream=stream, stop_regex=["QQQ", f"[{char}]"])["x"] == want


def test_a_url_with_or_without_v1_given_to_the_wrong_backend_says_which_url_to_give(backends):
    """RuntimeEndpoint(<url>/v1) and OpenAI(base_url=<url>) said only "HTTP 404: Not Found"."""
    _, _, url = backends
    with pytest.raises(sgl.BackendError) as e:
        sgl.RuntimeEndpoint(f"{url}/v1")
    # (the server's 404 names the path and its routes: "Not Found" before)
    assert str(e.value).startswith(f"GET {url}/v1/get_model_info: HTTP 404: the server has no route "
                                   "/v1/get_model_info (did you mean GET /get_model_info?); its routes: GET /health")
    assert str(e.value).endswith(
        "POST /v1/chat/completions; RuntimeEndpoint takes the server's root URL "
        "(http://HOST:PORT), where SGLang's native routes are: drop the /v1, or use lmnb.OpenAI(model, "
        "base_url=...) for the OpenAI API it serves")
    # a route's URL given for the server's (the hint ended "where SGLang's native routes are", no fix)
    with pytest.raises(sgl.BackendError) as e:
        sgl.RuntimeEndpoint(f"{url}/generate/")
    assert str(e.value).startswith(f"GET {url}/generate/get_model_info: HTTP 404: the server has no route ")
    assert str(e.value).endswith("POST /v1/chat/completions; RuntimeEndpoint takes the server's root URL "
                                 f"(http://HOST:PORT), where SGLang's native routes are: drop the /generate ({url})")
    for chat in (False, True):  # (a template named: the roles' format is not what this test is about)
        backend = sgl.OpenAI("tiny", base_url=url, is_chat_model=chat, max_retries=0,
                             chat_template=sgl.get_chat_template("chatml"))
        state = multi_turn_chat.run("a", "b", backend=backend)
        route = "/chat/completions" if chat else "/completions"
        assert f"HTTP 404: the server has no route {route} (did you mean POST /v1{route}?); its routes: " in str(
            state.error().__cause__)
        assert str(state.error().__cause__).endswith(
            "POST /v1/chat/completions; OpenAI-compatible servers (lmnb serve, SGLang, vLLM) serve this API under "
            f"/v1: base_url='{url}/v1'")
    # a route's URL given for the API's: the hint appended /v1 to it (".../v1/chat/completions/v1")
    backend = sgl.OpenAI("tiny", base_url=f"{url}/v1/chat/completions", is_chat_model=True, max_retries=0,
                         chat_template=sgl.get_chat_template("chatml"))
    state = multi_turn_chat.run("a", "b", backend=backend)
    assert str(state.error().__cause__).endswith(f"serve this API under /v1: base_url='{url}/v1'")
    # a 404 of the /v1 API itself names its own cause only
    state = multi_turn_chat.run("a", "b", backend=sgl.OpenAI("nope", base_url=f"{url}/v1", max_retries=0))
    assert str(state.error().__cause__).endswith('HTTP 404: model "nope" is not served here; use "tiny"')


def test_an_invalid_n_is_refused_alike_whichever_backend_runs_it(backends):
    # the OpenAI backend dropped n=0 (falsy) and generated one sample, where the others refused it
    # once sent; gen() refuses it itself now, where it is called (an empty stop_regex too)
    local, remote, url = backends

    @sgl.function
    def prog(s):
        s += "The bird" + sgl.gen("x", max_tokens=3, n=0)

    for backend in (local, remote, sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)):
        with pytest.raises(ValueError, match=r"^n must be an integer >= 1, got 0$"):
            prog.run(backend=backend)["x"]


def test_gen_logprobs_agree_in_process_and_over_http(backends):
    local, remote, _ = backends

    @sgl.function
    def prog(s):
        s += "The bird in the tree" + sgl.gen("x", max_tokens=4, return_logprob=True, top_logprobs_num=2)

    a = prog.run(backend=local, temperature=0).get_meta_info("x")
    b = prog.run(backend=remote, temperature=0).get_meta_info("x")
    assert [e[1] for e in a["output_token_logprobs"]] == [e[1] for e in b["output_token_logprobs"]]
    assert [e[0] for e in a["output_token_logprobs"]] == pytest.approx([e[0] for e in b["output_token_logprobs"]], abs=1e-4)
    assert len(b["output_top_logprobs"][0]) == 2


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_backend_gen_logprobs_agree_with_in_process_streamed_or_not(backends, chat, stream):
    """The OpenAI backend's gen logprobs and top logprobs are the in-process engine's (a streamed
    gen dropped them all; top logprobs were dropped always)."""
    local, _, url = backends
    backend = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=chat)

    @sgl.function
    def prog(s):
        if chat:
            s += sgl.user("The bird in the tree")
            s += sgl.assistant(sgl.gen("x", max_tokens=4, return_logprob=True, top_logprobs_num=2))
        else:
            s += "The bird in the tree" + sgl.gen("x", max_tokens=4, return_logprob=True, top_logprobs_num=2)

    local_state = prog.run(backend=local, temperature=0)
    want, want_text = local_state.get_meta_info("x"), local_state["x"]
    state = prog.run(backend=backend, temperature=0, stream=stream)
    assert "".join(state.text_iter("x")) == want_text
    got = state.get_meta_info("x")
    assert [e[0] for e in got["output_token_logprobs"]] == pytest.approx([e[0] for e in want["output_token_logprobs"]], abs=1e-4)
    assert [e[0] for top in got["output_top_logprobs"] for e in top] == pytest.approx(
        [e[0] for top in want["output_top_logprobs"] for e in top], abs=1e-4)
    assert [len(top) for top in got["output_top_logprobs"]] == [2] * len(want["output_token_logprobs"])


def test_native_select_rescores_from_the_whole_prompt_when_the_window_misses(backends, monkeypatch):
    import lmnb.backend.runtime_endpoint as rt

    _, remote, _ = backends
    want = pick_choices.run(backend=remote)
    monkeypatch.setattr(rt, "SCORE_WINDOW", 0)  # every difference now lies before the window
    got = pick_choices.run(backend=remote)
    for name in ("common", "prefix"):
        assert got[name] == want[name]
        g, w = got.get_meta_info(name), want.get_meta_info(name)
        assert g["prefix_len"] == w["prefix_len"]
        for gc, wc in zip(g["input_token_logprobs"], w["input_token_logprobs"]):
            assert [e[1] for e in gc] == [e[1] for e in wc]
            assert [e[0] for e in gc] == pytest.approx([e[0] for e in wc], abs=1e-4)


def test_native_select_recomputes_two_prompt_tokens_per_choice(backends, engines):
    """Each choice is scored with logprob_start_len = n - 2 (SGLang's own window), so the server
    may take at most n - 3 prompt tokens from the cache (it needs the logits of token n - 3 on);
    with a window of 8 it took n - 9. In process, the scoring starts at the first differing token."""
    local, remote, _ = backends
    prompt = "Is the bird in the tree green? Answer:"

    @sgl.function
    def pick(s):
        s += prompt + sgl.select("c", choices=[" yes", " no"])

    n = len(engines[1].encode(prompt))
    d = first_difference(engines[0].encode(prompt), engines[0].encode(prompt + " yes"))
    assert d == n  # (" yes" does not merge with ":")
    assert pick.run(backend=remote).get_meta_info("c")["cached_tokens"] == [n - 3, n - 3]
    assert pick.run(backend=local).get_meta_info("c")["cached_tokens"] == [n - 1, n - 1]


def _select_through_both(backends, monkeypatch, prompt, choices):
    """(starts of RuntimeEndpoint's scoring requests, remote state, in-process state) of one select;
    asserts the two agree on the pick, prefix_len and every scored token's id and logprob."""
    import lmnb.backend.runtime_endpoint as rt

    local, remote, _ = backends

    @sgl.function
    def pick(s):
        s += prompt + sgl.select("c", choices=choices)

    starts = []
    window = rt.RuntimeEndpoint._window
    monkeypatch.setattr(rt.RuntimeEndpoint, "_window",
                        lambda self, texts, start, *a, **k: starts.append(start) or window(self, texts, start, *a, **k))
    got, want = pick.run(backend=remote), pick.run(backend=local)
    assert got.error() is None
    assert got["c"] == want["c"]
    g, w = got.get_meta_info("c"), want.get_meta_info("c")
    assert g["prefix_len"] == w["prefix_len"]
    for gc, wc in zip(g["input_token_logprobs"], w["input_token_logprobs"]):
        assert [e[1] for e in gc] == [e[1] for e in wc]
        assert [e[0] for e in gc] == pytest.approx([e[0] for e in wc], abs=1e-4)
    return starts


# The tiny tokenizer writes " questio" as five tokens (" ", "q", "uest", "i", "o") and " question" as
# one: a choice starting with "n" changes the prompt's last five tokens.
QUESTIO = "Which one fits? It is questio"


def test_native_select_rescores_a_choice_that_retokenizes_the_window(backends, engines, monkeypatch):
    """"n mark" differs from the prompt before the window's first token (n - 2), so RuntimeEndpoint
    scores it again, with the prompt alone, from RESCORE_WINDOW (8) tokens further back (n - 10),
    where their tokens agree up to the difference; it was scored again from token 0, in two
    requests that recompute the whole prompt."""
    from lmnb.backend.runtime_endpoint import RESCORE_WINDOW

    n = len(engines[1].encode(QUESTIO))
    assert first_difference(engines[1].encode(QUESTIO), engines[1].encode(QUESTIO + "n mark")) == n - 5
    assert len(engines[1].encode(QUESTIO + "n mark")) > n - 2  # (its window is not empty)
    assert RESCORE_WINDOW == 8 and n > 10
    assert _select_through_both(backends, monkeypatch, QUESTIO, ["n mark", " mark"]) == [n - 2, n - 10]


# The tiny tokenizer writes " on" as two tokens and " one" as one: "e" turns the prompt's last two
# tokens into one, a difference at the window's first token (n - 2)
COUNT_ON = "How many birds are in the tree? Count: on"


def test_native_select_rescores_a_choice_differing_at_the_windows_first_token_from_a_little_further_back(
        backends, engines, monkeypatch):
    """The window (from n - 2) cannot tell a choice that differs at its first token from one that
    differs before it: "e so" was scored again from token 0 (starts [n - 2, 0, 0]: two requests
    that recompute the whole prompt), and is now scored again from n - 10, which tells them apart."""
    n = len(engines[1].encode(COUNT_ON))
    assert first_difference(engines[1].encode(COUNT_ON), engines[1].encode(COUNT_ON + "e so")) == n - 2
    assert _select_through_both(backends, monkeypatch, COUNT_ON, ["e so", " two"]) == [n - 2, n - 10]


def test_native_select_rescores_from_token_0_when_the_choice_differs_further_back_still(
        backends, engines, monkeypatch):
    """A difference before the rescoring window too (RESCORE_WINDOW set to 2: "n mark" differs at
    n - 5, before n - 4) is scored from token 0, with the prompt alone, as in process."""
    import lmnb.backend.runtime_endpoint as rt

    monkeypatch.setattr(rt, "RESCORE_WINDOW", 2)
    n = len(engines[1].encode(QUESTIO))
    assert _select_through_both(backends, monkeypatch, QUESTIO, ["n mark", " mark"]) == [n - 2, n - 4, 0]


def test_native_select_scores_40_random_prompt_endings_and_choices_as_in_process(backends, monkeypatch):
    """Prompts cut at a random character of a sentence (often inside a word) and choices that go on
    with the cut word, start a new one, or are a bare fragment: whatever the window, the rescoring
    window or token 0 scores, the pick, prefix_len and every scored token's id and logprob are the
    in-process backend's (seeded; cases where the first difference lies before the window occur)."""
    import random

    rng = random.Random(26)
    words = ["question", "one", "the", "green", "birds", "tree", "count", "maybe", "answer", "sure", "true"]
    starts_seen = []
    for _ in range(40):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 9)))
        prompt = sentence[:rng.randint(len(sentence) // 2, len(sentence))]
        choices = list(dict.fromkeys(
            rng.choice([w[rng.randint(0, len(w) - 1):], " " + w, w[:rng.randint(1, len(w))] + " " + rng.choice(words)])
            for w in rng.sample(words, 3)))
        starts_seen.append(_select_through_both(backends, monkeypatch, prompt, choices))
        monkeypatch.undo()  # (each case counts its own requests' starts)
    assert any(len(starts) > 1 for starts in starts_seen)  # (some choice was scored again, from further back)


def test_native_select_scores_from_token_0_when_a_choice_is_shorter_than_the_window_start(
        backends, engines, monkeypatch):
    """QUESTIO + "n" is n - 4 tokens, fewer than the window's start (n - 2), which the server refuses
    (logprob_start_len past the prompt's end); the select scores every choice from token 0 instead
    of failing."""
    n = len(engines[1].encode(QUESTIO))
    assert len(engines[1].encode(QUESTIO + "n")) == n - 4
    assert _select_through_both(backends, monkeypatch, QUESTIO, ["n", " mark"]) == [n - 2, 0]


@pytest.mark.parametrize("kind", ["runtime", "openai"])
def test_a_select_choice_too_long_for_the_context_is_named_over_http(backends, engines, kind):
    """A choice that takes the prompt past the model's context length: lmnb serve refuses its
    scoring prompt, which the backends said in the server's words alone, naming "text[2]"
    (RuntimeEndpoint's /generate) or "prompt[2]" (a completion model's /v1/completions): the
    third prompt of the scoring request (the prompt, then each choice), which the program never
    wrote. They name the choice now, as the in-process engine does; the counts are the server's
    (worked from the tokenizer here), and the program's next select runs."""
    local, remote, url = backends
    backend = remote if kind == "runtime" else sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    context = engines[1].model_info()["context_len"]
    prompt, fits = "Is the bird green? Answer:", " yes"
    long_choice = " maybe" * context  # (each " maybe" at least one token: past the context alone)

    @sgl.function
    def pick(s, choices):
        s += prompt + sgl.select("c", choices=choices)

    n = len(engines[1].encode(prompt + long_choice))
    assert n > context
    err = pick.run(choices=[fits, long_choice], backend=backend).error()
    assert err is not None
    assert str(err).startswith(f"Select('c', choices=[{fits!r}, {long_choice[:20]!r}"[:-1])
    field, where = ("text", f"POST {url}/generate") if kind == "runtime" else ("prompt", f"{url}/v1/completions")
    assert str(err).split("]) failed: ", 1)[1] == (
        f"BackendError: select choice {long_choice[:30]!r}...: the server refused its scoring {field} (the prompt, "
        f"then the choice): {where}: HTTP 400: prompt of {n} tokens exceeds the model's context length of {context} "
        f"tokens; shorten the {field} by at least {n - context} tokens")
    assert pick.run(choices=[fits, " no"], backend=backend).error() is None
    if backend is not remote:
        backend.shutdown()


@pytest.mark.parametrize("choices", [["bq", "u b"], ["nnu\U0001F642", "q\u00e9b\u4e2d"], ["ab", "abc", "a b"]])
def test_native_select_after_an_empty_prompt_matches_in_process(backends, monkeypatch, choices):
    """A select with nothing before it scores each choice from its second token (its first has no
    context), as in process; RuntimeEndpoint sent the empty prompt among the texts to score, which
    the server refuses (HTTP 400 'empty prompt'), so every such select failed."""
    assert _select_through_both(backends, monkeypatch, "", choices) == [0]


def test_unconditional_select_through_the_server_matches_in_process(backends):
    """``unconditional_likelihood_normalized`` re-scores each choice after the context "Answer:",
    whose ids ``RuntimeEndpoint`` reads from the server's ``input_token_logprobs`` (token 0's
    entry names its id, as SGLang's server does)."""
    local, remote, _ = backends

    @sgl.function
    def pick(s):
        s += "Is the sky green? Answer:" + sgl.select(
            "c", choices=[" yes", " no", " maybe so"], choices_method=sgl.unconditional_likelihood_normalized)

    a, b = pick.run(backend=local), pick.run(backend=remote)
    assert a["c"] == b["c"]
    ma, mb = a.get_meta_info("c"), b.get_meta_info("c")
    for ua, ub in zip(ma["unconditional_token_logprobs"], mb["unconditional_token_logprobs"]):
        assert [e[1] for e in ua] == [e[1] for e in ub]
        assert [e[0] for e in ua] == pytest.approx([e[0] for e in ub], abs=1e-4)


@pytest.mark.parametrize("prompt", [[-1], [[5], [10**20]], [5, 512]])
def test_completion_token_ids_outside_the_vocabulary_are_a_400(backends, engines, prompt):
    import httpx

    url = backends[2]
    assert engines[1].loaded.config.vocab_size == 512
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text  # a negative or huge id was a 500 OverflowError from the tokenizer
    assert "are outside the vocabulary [0, 512)" in r.json()["error"]["message"]
    assert httpx.get(url + "/health").status_code == 200


@pytest.mark.parametrize("path,body,param", [
    ("/generate", '{"text": "aCHARb", "sampling_params": {"max_new_tokens": 2}}', "text"),
    ("/v1/completions", '{"model": "tiny", "prompt": "aCHARb", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "CHAR"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/generate", '{"text": "a", "sampling_params": {"max_new_tokens": 2, "stop": ["x", "CHAR"]}}',
     "sampling_params.stop[1]"),
])
def test_a_lone_surrogate_escape_is_a_400_naming_its_field(backends, path, body, param):
    import httpx

    url = backends[2]
    headers = {"content-type": "application/json"}
    # JSON's "\ud800" parses to a lone surrogate, which no tokenizer takes: it was a 500 TypeError
    # ("TextEncodeInput must be ...") on the OpenAI routes and a 400 naming no field on /generate
    for lone in ("\\ud800", "\\udfff", "\\ud83d"):
        r = httpx.post(url + path, content=body.replace("CHAR", lone), headers=headers, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "lone UTF-16 surrogate" in err["message"]
    paired = body.replace("CHAR", "\\ud83d\\ude00")  # a pair is U+1F600, a character
    assert httpx.post(url + path, content=paired, headers=headers, timeout=60).status_code == 200


def test_openai_errors_name_the_requests_own_length_fields(backends, engines):
    # the engine's words were "... + max_new_tokens=N exceeds ...; lower max_new_tokens", a field
    # the OpenAI API does not have (its names: max_tokens, max_completion_tokens, min_tokens)
    import httpx

    url, ctx_len = backends[2], engines[1].context_len
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/completions", {"prompt": "hi", "max_tokens": ctx_len}, "max_tokens"),
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": ctx_len}, "max_tokens"),
        ("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": ctx_len}, "max_completion_tokens"),
    ]
    # a max_tokens no prompt fits beside (the context's length or more) is the field's error, as
    # OpenAI's "max_tokens is too large" (param max_tokens): it was "param": "messages" and "shorten the
    # messages or lower max_tokens" (a new user's find); the fix is what fits after this prompt
    for path, body, name in cases:
        r = httpx.post(url + path, json={"model": "tiny", **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
        said = re.fullmatch(rf"prompt of (\d+) tokens \+ {name}={ctx_len} exceeds the model's context length of "
                            rf"{ctx_len} tokens; lower {name} to at most (\d+)", r.json()["error"]["message"])
        assert said and int(said[2]) == ctx_len - int(said[1]), r.text  # (a chat prompt: the template's)
    n = len(engines[1].encode("hi"))
    assert httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 10**6},
                      timeout=60).json()["error"]["message"].endswith(f"; lower max_tokens to at most {ctx_len - n}")
    # one that fits beside shorter messages, past the context with these: the messages', as OpenAI's
    # context_length_exceeded; but one that no messages fit beside, since the chat template's own tokens
    # stay (its prompt for an empty message), is the field's: it was told to shorten the messages too
    chat = len(engines[1].encode(engines[1].apply_chat_template(msgs), add_special_tokens=False))
    template = len(engines[1].encode(engines[1].apply_chat_template([{"role": "user", "content": ""}]),
                                     add_special_tokens=False))
    assert 1 < template < chat
    for max_tokens, param, fix in [
            # (chat + ctx_len - template - ctx_len tokens too many, ctx_len - chat new ones fit)
            (ctx_len - template, "messages", f"; shorten the messages by at least {chat - template} token"
             f"{'s' * (chat - template != 1)} or lower max_tokens to at most {ctx_len - chat}"),
            (ctx_len - template + 1, "max_tokens", f"; lower max_tokens to at most {ctx_len - chat} (the chat template "
             f"alone takes {template} of the prompt's tokens, so no shorter messages make room for "
             f"{ctx_len - template + 1})"),
            (ctx_len - 1, "max_tokens", f"; lower max_tokens to at most {ctx_len - chat} (the chat template alone "
             f"takes {template} of the prompt's tokens, so no shorter messages make room for {ctx_len - 1})")]:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": max_tokens},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert r.json()["error"]["message"] == (f"prompt of {chat} tokens + max_tokens={max_tokens} exceeds the model's "
                                                f"context length of {ctx_len} tokens{fix}"), r.text
    # messages past the context beside a max_tokens that leaves no room for them: both at once (it named the
    # messages alone, and the shorter ones met a second refusal), counted, or (a text certainly too long) not
    both = ("leaves no room for {}; shorten the {} and lower max_tokens, so that the prompt's tokens and max_tokens "
            f"together fit {ctx_len}")
    long, huge = "hi " * ctx_len, "x" * 50 * ctx_len
    counted, uncounted = r"\d+ tokens", r"at least \d+ tokens \(\d+ characters, counted without encoding them\)"
    for path, body, param, size, room in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}, "messages", counted,
             f"the messages (the chat template alone takes {template} tokens)"),
            ("/v1/completions", {"prompt": long}, "prompt", counted, "any prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}, "messages", uncounted,
             f"the messages (the chat template alone takes {template} tokens)"),
            ("/v1/completions", {"prompt": huge}, "prompt", uncounted, "any prompt")]:
        r = httpx.post(url + path, json={"model": "tiny", "max_tokens": ctx_len, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert re.fullmatch(rf"prompt of {size} exceeds the model's context length of {ctx_len} tokens, and "
                            rf"max_tokens={ctx_len} " + re.escape(both.format(room, param)), r.json()["error"]["message"]), r.text
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "min_tokens": 3})
    assert r.json()["error"]["message"] == "min_tokens=3 is invalid: must not exceed max_tokens=2"


def test_a_prompt_that_fills_the_context_is_told_to_shorten_by_its_max_tokens(backends, engines):
    """A prompt (the messages' prompt) of the context's length beside a max_tokens a shorter prompt
    fits was told to "shorten the prompt (messages) or lower max_tokens", and only 0 fits beside
    it: now to shorten it by max_tokens' tokens, or by fewer beside a lower max_tokens, in the
    request's own words."""
    import httpx

    url, engine = backends[2], engines[1]
    ctx_len = engine.context_len
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [5] * ctx_len, "max_tokens": 3}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        f"prompt of {ctx_len} tokens + max_tokens=3 exceeds the model's context length of {ctx_len} tokens; shorten "
        "the prompt by at least max_tokens tokens (3 with max_tokens=3)"), r.text

    def chat_len(content: str) -> int:
        text = engine.apply_chat_template([{"role": "user", "content": content}])
        return len(engine.encode(text, add_special_tokens=False))

    content = next(c for k in range(ctx_len) if chat_len(c := "hi " * k) == ctx_len)  # (messages that fill it)
    for name in ("max_tokens", "max_completion_tokens"):
        r = httpx.post(url + "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": content}], name: 3}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"] == (
            f"prompt of {ctx_len} tokens + {name}=3 exceeds the model's context length of {ctx_len} tokens; shorten "
            f"the messages by at least {name} tokens (3 with {name}=3)"), r.text


def test_a_prompt_past_the_context_is_told_by_how_much_to_shorten_it_in_each_routes_words(backends, engines):
    """A counted prompt past the context was told "shorten the prompt" (the messages) with no size,
    and one shortened to fit alone met a second refusal for its max_tokens: it is told by how much
    beside its max_tokens, or beside a lower one, as the engine API is (test_engine_errors). A
    prompt of 600 ids beside max_tokens=20: 600 + 20 - 512 = 108 tokens, or 88 + N (600 - 512);
    messages whose prompt is 8 tokens past the context beside max_completion_tokens=5: 13, or 8 + N."""
    import httpx

    url, engine = backends[2], engines[1]
    assert engine.context_len == 512
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [5] * 600, "max_tokens": 20}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten the prompt by at least 88 + "
        "max_tokens tokens (108 with max_tokens=20)"), r.text
    assert r.json()["error"]["reason"] == "does_not_fit"  # (its fix names max_tokens: lmnb's clients say where it came from)

    def chat_len(content: str) -> int:
        text = engine.apply_chat_template([{"role": "user", "content": content}])
        return len(engine.encode(text, add_special_tokens=False))

    content = next(c for k in range(600) if chat_len(c := "hi " * k) == 520)  # (8 tokens past the context)
    r = httpx.post(url + "/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": content}], "max_completion_tokens": 5}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "prompt of 520 tokens exceeds the model's context length of 512 tokens; shorten the messages by at least 8 + "
        "max_completion_tokens tokens (13 with max_completion_tokens=5)"), r.text
    assert r.json()["error"]["reason"] == "does_not_fit"


def test_generate_names_a_text_too_long_to_encode_and_a_max_new_tokens_no_prompt_fits_beside(backends, engines):
    """/generate with a text certainly past the context (refused before it is encoded) beside a
    max_new_tokens the context's length: it was told "...; shorten the prompt" alone, and the
    shortened prompt met a second refusal; now both at once, as a counted prompt is told, whether
    the engine refuses it (Engine._to_ids) or the server does (logprobs from the first token),
    naming the field sent, text, either way (the engine's refusal said "the prompt"). Beside a
    smaller max_new_tokens it was told "shorten the text" with no amount: its lower bound of B
    tokens says at least B - ctx_len + max_new_tokens (at most ctx_len - max_new_tokens fit), or
    B - ctx_len + N beside max_new_tokens=N. Both name max_new_tokens: "reason": "does_not_fit"."""
    import httpx

    url, ctx_len = backends[2], engines[1].context_len
    huge = "x" * 50 * ctx_len
    for extra in ({}, {"return_logprob": True, "logprob_start_len": 0}):
        for max_new_tokens in (ctx_len, ctx_len - 1):
            r = httpx.post(url + "/generate", json={"text": huge, "sampling_params": {"max_new_tokens": max_new_tokens},
                                                    **extra}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text
            assert r.json()["error"]["reason"] == "does_not_fit", r.text
            said = re.fullmatch(rf"prompt of at least (\d+) tokens \({len(huge)} characters, counted without encoding "
                                rf"them\) exceeds the model's context length of {ctx_len} tokens(.*)",
                                r.json()["error"]["message"])
            assert said, r.text
            over = int(said[1]) - ctx_len
            assert said[2] == (
                f", and max_new_tokens={ctx_len} leaves no room for any prompt; shorten the text and lower "
                f"max_new_tokens, so that the prompt's tokens and max_new_tokens together fit {ctx_len}"
                if max_new_tokens == ctx_len else
                f"; shorten the text by at least {over} + max_new_tokens tokens ({over + max_new_tokens} with "
                f"max_new_tokens={max_new_tokens})"), r.text


def test_generate_names_the_prompt_field_sent_in_the_engines_refusals(backends, engines):
    """/generate's refusal of a prompt too long said "shorten the text" where the server encoded
    the text (logprobs from its first token) and "shorten the prompt" where the engine did, of
    the same field, text; each now names the field sent, text or input_ids, with each fix's
    number (512 - 500 = 12 new tokens fit; 500 + 20 - 512 = 8 tokens too many)."""
    import httpx

    url, engine = backends[2], engines[1]
    assert engine.context_len == 512
    text = "x " * 250  # (two tokens each: 500)
    assert len(engine.encode(text)) == 500 and len(engine.encode(text * 2)) == 1000
    fits = "prompt of 500 tokens + max_new_tokens=20 exceeds the model's context length of 512 tokens; shorten the {} " \
           "by at least 8 tokens or lower max_new_tokens to at most 12"
    for prompt, field in (({"text": text}, "text"), ({"input_ids": engine.encode(text)}, "input_ids")):
        r = httpx.post(url + "/generate", json={**prompt, "sampling_params": {"max_new_tokens": 20}}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert r.json()["error"]["message"] == fits.format(field), r.text
    for extra in ({}, {"return_logprob": True, "logprob_start_len": 0}):  # (the engine's count, the server's)
        r = httpx.post(url + "/generate", json={"text": text * 2, "sampling_params": {"max_new_tokens": 20}, **extra},
                       timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text
        # (by how much: 1000 - 512 = 488 + N beside N new ones, 488 + 20 = 508 here)
        assert r.json()["error"]["message"] == ("prompt of 1000 tokens exceeds the model's context length of 512 "
                                                "tokens; shorten the text by at least 488 + max_new_tokens tokens "
                                                "(508 with max_new_tokens=20)"), r.text


def test_a_servers_refusal_of_a_gen_names_gens_max_tokens(backends, engines):
    """Through RuntimeEndpoint the server's words reached the program: "lower max_new_tokens", a
    name the program's gen(max_tokens=...) does not have (SGLang's server parameter)."""
    _, remote, _ = backends
    ctx_len = engines[1].context_len

    @sgl.function
    def prog(s):
        s += "hi" + sgl.gen("x", max_tokens=ctx_len)

    n = len(engines[1].encode("hi"))
    for stream in (False, True):
        message = str(prog.run(backend=remote, stream=stream).error())
        assert f"+ max_tokens={ctx_len} exceeds the model's context length of {ctx_len} tokens" in message
        assert message.endswith(f"lower max_tokens to at most {ctx_len - n}") and "new_tokens" not in message


def test_a_servers_refusal_of_the_default_max_tokens_says_it_is_the_default(backends, engines):
    """A gen without max_tokens refused by the server for "max_tokens=128", a number the program
    never wrote: the message says it is the default, as the in-process engine's does."""
    _, remote, _ = backends
    ctx_len = engines[1].context_len
    prompt = "x " * ((ctx_len - 100) // 2)
    n = len(engines[1].encode(prompt))
    assert n + 128 > ctx_len > n  # the prompt fits; the prompt and 128 new tokens do not
    assert (n, ctx_len) == (412, 512)  # (412 + 128 - 512 = 28 tokens too many; 512 - 412 = 100 fit)

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("x")

    for stream in (False, True):
        err = prog.run(backend=remote, stream=stream).error()
        assert isinstance(err.__cause__, BackendError)
        assert str(err).endswith(
            "prompt of 412 tokens + max_tokens=128 exceeds the model's context length of 512 tokens; shorten the prompt "
            "by at least 28 tokens or lower max_tokens to at most 100 (the gen has no max_tokens of its own and took "
            "lmnb's default of 128: give it its own max_tokens=N, or set run(max_new_tokens=N))")
    # run(max_new_tokens=128) given: the same number, which the user set (it was read as lmnb's default)
    assert str(prog.run(backend=remote, max_new_tokens=128).error()).endswith(
        "lower max_tokens to at most 100 (the gen has no max_tokens of its own and took run(max_new_tokens=128): give "
        "it its own max_tokens=N, or lower that)")


def test_a_refusal_of_the_runs_max_new_tokens_names_it(backends, engines):
    """run(max_new_tokens=30) and a gen without max_tokens too long for the context: the message
    called 30 "the default of a gen without max_tokens", as if it were lmnb's own 128."""
    local, remote, url = backends
    ctx_len = engines[1].context_len
    prompt = "x " * ((ctx_len - 20) // 2)
    n = len(engines[1].encode(prompt))
    assert n + 30 > ctx_len > n
    assert (n, ctx_len) == (492, 512)  # (492 + 30 - 512 = 10 tokens too many; 512 - 492 = 20 fit)

    @sgl.function
    def prog(s):
        s += prompt + sgl.gen("x")

    for backend in (local, remote):
        assert str(prog.run(backend=backend, max_new_tokens=30).error()).endswith(
            "prompt of 492 tokens + max_tokens=30 exceeds the model's context length of 512 tokens; shorten the prompt "
            "by at least 10 tokens or lower max_tokens to at most 20 (the gen has no max_tokens of its own and took "
            "run(max_new_tokens=30): give it its own max_tokens=N, or lower that)")
    # lmnb.OpenAI on lmnb serve's /v1 routes reads the same reason in their error
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    assert str(prog.run(backend=completion, max_new_tokens=30).error()).endswith(
        "+ max_tokens=30 exceeds the model's context length of 512 tokens; shorten the prompt by at least 10 tokens "
        "or lower max_tokens to at most 20 (the gen has no max_tokens of its own and took run(max_new_tokens=30): "
        "give it its own max_tokens=N, or lower that)")


def test_gen_stop_regex_cuts_alike_in_process_native_and_openai(backends):
    """gen(stop_regex=...) reaches every backend: the output is the free greedy output cut before
    the first occurrence of a character picked from it (a one-character pattern completes where it
    first occurs, so the cut is found by str.find), and the matched text is that character."""
    import regex

    local, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    prompt = "The bird in the tree said"

    @sgl.function
    def free(s):
        s += prompt + sgl.gen("x", max_tokens=16)

    whole = free.run(backend=local, temperature=0)["x"]
    k = next(i for i, c in enumerate(whole) if i >= 3 and whole.find(c) == i and c.strip())
    pattern = regex.escape(whole[k])

    @sgl.function
    def cut(s):
        s += prompt + sgl.gen("x", max_tokens=16, stop_regex=["never here", pattern])

    for backend in (local, remote, completion):
        st = cut.run(backend=backend, temperature=0)
        assert st["x"] == whole[:k], backend
        assert st.text() == prompt + whole[:k]
    finish = cut.run(backend=local, temperature=0).get_meta_info("x")["finish_reason"]
    assert finish == {"type": "stop", "matched": whole[k]}


def test_runtime_endpoint_streams_from_a_server_with_incremental_output_as_from_one_without(engines, backends):
    # an incremental server's events each carry only the new text and logprobs; read as the
    # whole text so far, a repeated piece ("x" after "x") passed for no new text and was lost
    _, remote = engines
    _, cumulative, _ = backends

    @sgl.function
    def prog(s):
        s += "The bird in the tree" + sgl.gen("x", max_tokens=12, return_logprob=True, top_logprobs_num=2)

    want = prog.run(backend=cumulative, temperature=0, stream=True)
    want_text = "".join(want.text_iter("x"))
    # (each endpoint shut down: their connections were left to the garbage collector, "ResourceWarning:
    # unclosed <socket.socket ...>" in a later test, probing's in a cycle through its _request)
    with live_server(remote, incremental_streaming_output=True) as url, contextlib.ExitStack() as endpoints:
        backend = sgl.RuntimeEndpoint(url)
        endpoints.callback(backend.shutdown)
        got = prog.run(backend=backend, temperature=0, stream=True)
        pieces = list(got.text_iter("x"))
        assert backend.get_server_info()["incremental_streaming_output"] is True
        # a probe that got no answer is asked again, not remembered as "not incremental" for good
        probing = sgl.RuntimeEndpoint(url)
        endpoints.callback(probing.shutdown)
        request, failed = probing._request, []

        def once_unanswered(method, path, *args, **kw):
            if path == "/get_server_info" and not failed:
                failed.append(path)
                raise BackendError(f"GET {url}/get_server_info timed out")
            return request(method, path, *args, **kw)

        probing._request = once_unanswered
        assert (probing._incremental_output(), probing._incremental_output()) == (False, True) and failed
    assert "".join(pieces) == want_text == got["x"]
    a, b = want.get_meta_info("x"), got.get_meta_info("x")
    assert [e[1] for e in b["output_token_logprobs"]] == [e[1] for e in a["output_token_logprobs"]]
    assert [[e[1] for e in top] for top in b["output_top_logprobs"]] == \
        [[e[1] for e in top] for top in a["output_top_logprobs"]]
    assert len(a["output_token_logprobs"]) == a["completion_tokens"] > 1


def test_the_engines_own_refusals_on_generate_name_the_field_as_sent(backends, engines):
    """The real engine's refusals of a /generate prompt (a grammar whose first tokens min_new_tokens
    bans, a rid still running) came back with a null param and Python's SamplingParams name; they
    name the field as the client sent it, with the entry of a batch."""
    import httpx

    from lmnb_engine import SamplingParams

    url = backends[2]
    remote = engines[1]
    digits = [remote.encode(str(d), add_special_tokens=False)[-1] for d in range(10)]
    conflict = {"max_new_tokens": 5, "min_new_tokens": 2, "regex": "[0-9]", "stop_token_ids": digits}
    r = httpx.post(url + "/generate", json={"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, conflict]},
                   timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "sampling_params[1].min_new_tokens", err
    assert err["message"].startswith("sampling_params[1].min_new_tokens=2 conflicts with the regex: at output token 1 "
                                     "the regex allows only tokens that min_new_tokens=2 bans"), err
    running = remote.submit("a", SamplingParams(max_new_tokens=remote.context_len - 8, ignore_eos=True), rid="held")
    try:
        r = httpx.post(url + "/generate", json={"text": "a", "rid": "held"}, timeout=60)
    finally:
        running.abort()
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "rid", err
    assert err["message"] == ('rid="held" is already in use by a running request; give another rid, or wait for that '
                              "request to end")


def test_an_openai_choice_blocked_by_its_own_min_tokens_is_a_400_or_ends_with_abort(backends, engines):
    """A grammar with min_tokens it cannot satisfy: refused at the first token, a 400 naming
    min_tokens; found midway (a digit, then only "a", which min_tokens bans), a 500 for the whole
    request; that choice now ends with finish_reason "abort", as /generate ends that entry."""
    import httpx

    url = backends[2]
    remote = engines[1]
    a = remote.encode("a", add_special_tokens=False)[-1]
    digits = [remote.encode(str(d), add_special_tokens=False)[-1] for d in range(10)]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 5, "min_tokens": 2, "regex": "[0-9]", "stop_token_ids": digits}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "min_tokens", err
    assert err["message"].startswith("min_tokens=2 conflicts with the regex"), err
    midway = {**body, "prompt": "Digits:", "regex": "[0-9]a", "stop_token_ids": [a], "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=midway, timeout=60)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "abort" and len(choice["text"]) == 1 and choice["text"] in "0123456789"
    # a grammar complete before min_tokens (three digits, one token each) ended with "stop": now "abort" too
    short = {"model": "tiny", "prompt": "Digits:", "max_tokens": 10, "min_tokens": 8, "regex": "[0-9]{3}", "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=short, timeout=60)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "abort" and re.fullmatch("[0-9]{3}", choice["text"]), choice
    assert choice["finish_message"] == (
        "output token 3 completed the match: the regex allows only tokens that min_tokens=8 bans until 8 tokens are "
        "out: EOS, as nothing can follow the match; lower min_tokens to at most 3 or let the regex match longer output")
    r = httpx.post(url + "/v1/completions", json={**short, "min_tokens": 3}, timeout=60)
    [choice] = r.json()["choices"]
    assert choice["finish_reason"] == "stop" and re.fullmatch("[0-9]{3}", choice["text"]), choice


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_an_openai_choice_ended_by_a_stop_token_names_it_in_matched_stop(backends, engines, chat):
    """SGLang's choices carry matched_stop, the stop token id (or string) that ended them; lmnb's
    had none. With the greedy first token as a stop token id, the choice stops there and names it;
    at max_tokens it is null."""
    import httpx

    from lmnb_engine import SamplingParams

    url, remote = backends[2], engines[1]
    path, body = (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}) if chat
                  else ("/v1/completions", {"prompt": "x"}))
    prompt = remote.apply_chat_template([{"role": "user", "content": "x"}], True) if chat else "x"
    ids = remote.encode(prompt, add_special_tokens=not chat)
    first = remote.generate(ids, SamplingParams(max_new_tokens=1, temperature=0, ignore_eos=True)).token_ids[0]
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0, **body}
    [choice] = httpx.post(url + path, json={**body, "stop_token_ids": [first]}, timeout=60).json()["choices"]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", first), choice
    [choice] = httpx.post(url + path, json={**body, "ignore_eos": True}, timeout=60).json()["choices"]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("length", None), choice


def test_an_openai_choice_cut_before_its_grammar_matched_says_so_in_finish_message(backends):
    """The engine's message for output the token limit cut before it matched its regex / JSON schema
    did not reach the OpenAI routes, whose choices said only "length": a client parsed a truncated
    JSON unwarned. The choice's finish_message says so, naming the constraint as it was sent; a
    choice the limit cut without a grammar has no such field."""
    import httpx

    url = backends[2]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}
    [choice] = httpx.post(url + "/v1/chat/completions", json=chat, timeout=60).json()["choices"]
    assert (choice["finish_reason"], choice["finish_message"]) == (
        "length", "incomplete: the token limit was reached before the output matched its response_format"), choice
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0, "regex": "[0-9]{40}"}
    [choice] = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"]
    assert (choice["finish_reason"], choice["finish_message"]) == (
        "length", "incomplete: the token limit was reached before the output matched its regex"), choice
    [choice] = httpx.post(url + "/v1/completions", json={**body, "regex": None, "ignore_eos": True},
                          timeout=60).json()["choices"]
    assert choice["finish_reason"] == "length" and "finish_message" not in choice, choice
    # lmnb.OpenAI keeps it as SGLang's meta_info does, in the finish reason's message
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    @sgl.function
    def digits(s):
        s += "x" + sgl.gen("x", max_tokens=3, regex="[0-9]{40}")

    for stream in (False, True):
        state = digits.run(backend=completion, temperature=0, stream=stream)
        assert finish_reason_dict(state.get_meta_info("x")) == {
            "type": "length", "message": "incomplete: the token limit was reached before the output matched its regex"}


def test_speculative_gens_finish_reasons_read_as_without_speculation_on_each_backend(backends):
    """A speculative gen cut at its max_tokens said {"type": "length", "length": 2} over the OpenAI
    API, whose gens without speculation say {"type": "length"} (a choice's finish_reason; SGLang's
    OpenAI backend gives no finish reason at all). Reference: the same program without
    speculation, gen by gen, on the in-process engine, RuntimeEndpoint (both write SGLang's
    "length": N) and the OpenAI API."""
    local, remote, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)

    def body(s):
        # (the tiny model's 6 tokens after it hold no byte token, which RuntimeEndpoint's native API
        # writes as U+FFFD: its speculation then counts characters, as SGLang's does)
        s += "hello world" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=3) + sgl.gen("c", max_tokens=1)

    for backend in (local, remote, completion):
        spec = sgl.function(num_api_spec_tokens=6)(body).run(backend=backend, temperature=0, ignore_eos=True)
        plain = sgl.function(body).run(backend=backend, temperature=0, ignore_eos=True)
        assert all(spec.get_meta_info(k)["speculative"] for k in "abc")
        assert [(spec[k], finish_reason_dict(spec.get_meta_info(k))) for k in "abc"] == \
            [(plain[k], finish_reason_dict(plain.get_meta_info(k))) for k in "abc"], backend
    assert finish_reason_dict(plain.get_meta_info("a")) == {"type": "length"}  # (the case: over the OpenAI API)


def test_a_gen_after_a_speculative_gens_lone_byte_u_fffd_is_the_same_as_without_speculation(backends):
    """A gen whose text holds a U+FFFD for bytes that are no character (a lone byte token of the
    tiny model) was followed by a gen served from what the call wrote after it, where without
    speculation the next gen reads the text tokenized again, U+FFFD as its own bytes EF BF BD, and
    writes something else: gen("b") after gen("a", max_tokens=1) got "\\ufffdve t\\ufffd\\ufffd" where
    it gets "\\x14\\ufffd%j". Now such a gen leaves nothing over and the next gen calls again.
    Reference: the same program without speculation, on the in-process engine and over the OpenAI
    API."""
    local, _, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    for backend in (local, completion):
        for k in (1, 4, 6):
            def body(s):
                s += "Q: What color is the sky?\nA:" + sgl.gen("a", max_tokens=k) + sgl.gen("b", max_tokens=4)

            spec = sgl.function(num_api_spec_tokens=16)(body).run(backend=backend, temperature=0, ignore_eos=True)
            plain = sgl.function(body).run(backend=backend, temperature=0, ignore_eos=True)
            assert plain["a"].endswith("\ufffd"), (backend, k)  # (the case)
            assert (spec["a"], spec["b"]) == (plain["a"], plain["b"]), (backend, k)
            assert "speculative_call" in spec.get_meta_info("b")  # (its own call)


def test_speculative_gens_with_byte_tokens_in_the_call_are_cut_as_the_same_gens_without_speculation(backends):
    """A speculative call whose tokens hold part of a character (bytes:\\xNN in the OpenAI API's
    logprobs, which the tiny model's output has) made characters stand in for tokens for every gen
    cut from it: gen("a", max_tokens=1) got " ", a few characters, and the whole call's logprobs.
    Reference: the same program without speculation, gen by gen (text, token count, logprobs)."""
    _, _, url = backends
    completion = sgl.OpenAI("tiny", base_url=f"{url}/v1", is_chat_model=False)
    for k in range(1, 7):
        def body(s):
            s += "A fruit:" + sgl.gen("a", max_tokens=k, return_logprob=True) + " and" + sgl.gen("b", max_tokens=3)

        spec = sgl.function(num_api_spec_tokens=16)(body).run(backend=completion, temperature=0)
        plain = sgl.function(body).run(backend=completion, temperature=0)
        assert spec.get_meta_info("a")["speculative"] and spec.get_meta_info("b")["speculative"]
        call = spec.get_meta_info("a")["speculative_call"]
        assert call["completion_tokens"] == 16
        assert (spec["a"], spec["b"]) == (plain["a"], plain["b"]), k
        got, want = spec.get_meta_info("a"), plain.get_meta_info("a")
        assert got["completion_tokens"] == want["completion_tokens"] == k
        assert [t[2] for t in got["output_token_logprobs"]] == [t[2] for t in want["output_token_logprobs"]]
    first = sgl.function(num_api_spec_tokens=16)(body).run(backend=completion, temperature=0, return_logprob=True)
    assert any(t[2].startswith("bytes:") for t in first.get_meta_info("a")["output_token_logprobs"])  # (the case)


def test_a_text_that_writes_its_own_bos_runs_as_the_same_ids_whatever_is_asked_of_it():
    """On a tokenizer that adds a BOS (the demo model's), "<s>Is the sky blue? Answer:" ran as 13
    tokens (the tokenizer's BOS left out: the text writes its own) on /generate, but as 14 where its
    prompt logprobs from token 0 were asked (the server encoded it up front, with both BOS), and on
    /v1/completions; so RuntimeEndpoint's select (prompt_tokens of a plain request) and the
    in-process one (which encodes the choices itself) scored it apart; and its cached_chars were
    counted from the ids with both BOS. Every text prompt runs as Engine.prompt_ids now: the
    tokenizer's ids less its BOS (worked from the tokenizer here)."""
    import httpx

    from lmnb_engine import Engine

    engine = Engine(device="cpu", max_total_tokens=8192)  # no model: the demo checkpoint
    try:
        text = "<s>Is the sky blue? Answer:"
        encoded = engine.encode(text)
        bos = engine.tokenizer.bos_token_id
        assert encoded[:2] == [bos, bos]  # (the case: the tokenizer adds one, the text writes one)
        want = encoded[1:]
        with live_server(engine) as url:
            plain = httpx.post(f"{url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}})
            scored = httpx.post(f"{url}/generate", json={
                "text": text, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0})
            assert plain.json()["meta_info"]["prompt_tokens"] == len(want)
            assert [e[1] for e in scored.json()["meta_info"]["input_token_logprobs"]] == want
            echo = httpx.post(f"{url}/v1/completions", json={"prompt": text, "max_tokens": 0, "echo": True,
                                                              "logprobs": 0}).json()
            assert echo["usage"]["prompt_tokens"] == len(want)
            # the echo: the text's own "<s>" is the one BOS, the tokens after it where the text has them
            lp = echo["choices"][0]["logprobs"]
            assert lp["tokens"][0] == "<s>" and lp["text_offset"][:2] == [0, 3]
            assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]

            @sgl.function
            def pick(s):
                s += text + sgl.select("c", choices=[" yes", " no"])

            remote, local = pick.run(backend=sgl.RuntimeEndpoint(url)), pick.run(backend=sgl.Engine(engine=engine))
            g, w = remote.get_meta_info("c"), local.get_meta_info("c")
            assert g["prefix_len"] == w["prefix_len"] == [len(want)] * 2
            assert g["normalized_prompt_logprobs"] == pytest.approx(w["normalized_prompt_logprobs"], abs=1e-4)
            # the cached tokens, all but ":", cover the text but ":" (the text's "<s>" too: 22 before)
            again = httpx.post(f"{url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}})
            assert again.json()["meta_info"]["cached_tokens"] == len(want) - 1
            assert again.json()["meta_info"]["cached_chars"] == len(text) - 1
        assert engine.prompt_ids(text) == want
    finally:
        engine.shutdown()


@sgl.function
def prefilled_answer(s):
    s += sgl.user("What is two plus two?")
    s += sgl.assistant("The answer is " + sgl.gen("x", max_tokens=4))


@sgl.function
def two_gens_in_one_reply(s):
    s += sgl.user("What is two plus two?")
    s += sgl.assistant("The answer is " + sgl.gen("x", max_tokens=3) + ", so" + sgl.gen("y", max_tokens=3,
                                                                                         ignore_eos=True))


def _continued(engine, hf_tok, messages, **sampling):
    """The in-process engine's greedy continuation of ``messages`` (the last a partial assistant
    reply) as transformers renders them with continue_final_message=True, and that prompt's ids."""
    from lmnb_engine import SamplingParams

    ids = hf_tok.apply_chat_template(messages, tokenize=True, return_dict=False, continue_final_message=True)
    return engine.generate(ids, SamplingParams(temperature=0, **sampling)).text, ids


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
def test_openai_chat_backend_continues_a_partial_assistant_reply_with_continue_final_message(
        backends, engines, tiny_llama, stream):
    """A gen after text inside an assistant message was refused on every OpenAI chat model
    (BackendCannotRun), though vLLM's, SGLang's and lmnb serve's continue_final_message field lets
    the server continue a partial reply. With OpenAI(..., continue_final_message=True) the gen's
    request ends with that partial reply and the field: the value is the in-process engine's greedy
    continuation of the prompt transformers' apply_chat_template(continue_final_message=True)
    renders (its text checked by hand), and the message holds the text and the gen's value."""
    from transformers import AutoTokenizer

    local, _, url = backends
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    chat = sgl.OpenAI("tiny", base_url=f"{url}/v1", continue_final_message=True)
    partial = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "The answer is "}]
    want, ids = _continued(engines[0], hf_tok, partial, max_new_tokens=4)
    assert hf_tok.decode(ids) == "<s><|user|>What is two plus two?<|end|>\n<|assistant|>The answer is "
    state = prefilled_answer.run(backend=chat, temperature=0, stream=stream)
    if stream:
        assert "".join(state.text_iter("x")) == want
    assert state.error() is None and state["x"] == want and want
    assert state.get_meta_info("x")["prompt_tokens"] == len(ids)
    assert state.messages()[-1] == {"role": "assistant", "content": "The answer is " + want}
    chat.shutdown()


def test_each_gen_inside_one_assistant_reply_is_its_own_continue_final_message_call(backends, engines, tiny_llama):
    """Two gens in one assistant message (the second with ignore_eos, an extension field that goes
    in the same extra_body): each is a call of its own, continuing the reply written so far, the
    first gen's value in the second's prompt; the values are the in-process engine's greedy
    continuations of transformers' renderings."""
    from transformers import AutoTokenizer

    _, _, url = backends
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    chat = sgl.OpenAI("tiny", base_url=f"{url}/v1", continue_final_message=True)
    user = {"role": "user", "content": "What is two plus two?"}
    x, x_ids = _continued(engines[0], hf_tok, [user, {"role": "assistant", "content": "The answer is "}],
                          max_new_tokens=3)
    y, y_ids = _continued(engines[0], hf_tok, [user, {"role": "assistant", "content": f"The answer is {x}, so"}],
                          max_new_tokens=3, ignore_eos=True)
    state = two_gens_in_one_reply.run(backend=chat, temperature=0)
    assert state.error() is None and (state["x"], state["y"]) == (x, y)
    assert [state.get_meta_info(n)["prompt_tokens"] for n in ("x", "y")] == [len(x_ids), len(y_ids)]
    assert state.get_meta_info("y")["completion_tokens"] == 3
    assert chat.token_usage.prompt_tokens == len(x_ids) + len(y_ids)  # (two calls, no more)
    assert state.messages()[-1] == {"role": "assistant", "content": f"The answer is {x}, so{y}"}
    chat.shutdown()


def test_a_gen_after_text_in_an_assistant_reply_without_continue_final_message_names_the_option(backends):
    """Without the option the gen is refused, as before, and the refusal now names
    continue_final_message (and the notebook's flag) for vLLM, SGLang and lmnb serve servers; a gen
    outside an assistant message, which the option does not help, is refused without it."""
    from lmnb.backend.base import BackendCannotRun

    _, _, url = backends
    start = ("an OpenAI chat model can only generate at the start of an assistant message (s += assistant(gen(...)); "
             "in a %%lm cell {assistant}{gen x}{/assistant}); to fill text and several gens inside one reply use "
             "@function(num_api_spec_tokens=N), run without stream=True (a %%lm cell cannot: write the program in a "
             "Python cell as an @lmnb.function(num_api_spec_tokens=N) and call its .run()), or use a completion model "
             "(OpenAI(..., is_chat_model=False); in a notebook %lm connect URL --openai MODEL --completion)")

    @sgl.function
    def in_the_question(s):
        s += sgl.user("Two plus two is " + sgl.gen("x", max_tokens=2))

    for backend in (sgl.OpenAI("tiny", base_url=f"{url}/v1"),
                    sgl.OpenAI("tiny", base_url=f"{url}/v1", continue_final_message=True)):
        state = in_the_question.run(backend=backend, temperature=0)
        assert isinstance(state.error().__cause__, BackendCannotRun) and str(state.error().__cause__) == start
        backend.shutdown()
    chat = sgl.OpenAI("tiny", base_url=f"{url}/v1")
    state = prefilled_answer.run(backend=chat, temperature=0)
    assert isinstance(state.error().__cause__, BackendCannotRun)
    assert str(state.error().__cause__) == start + (
        " — or, inside a reply on a vLLM, SGLang or lmnb serve server, have it continue the reply's text: "
        "OpenAI(..., continue_final_message=True); in a notebook %lm connect URL --openai MODEL "
        "--continue-final-message")
    chat.shutdown()


def test_continue_final_message_leaves_chat_api_speculation_as_it_was(backends):
    """Under @function(num_api_spec_tokens=N) the assistant role's fills and gens go out as one call
    at the role's end, with no partial reply: the option changes nothing there, the same reply in
    one call of the same prompt."""
    _, _, url = backends

    @sgl.function(num_api_spec_tokens=16)
    def spec(s):
        s += sgl.user("What is two plus two?")
        s += sgl.assistant(sgl.gen("x", max_tokens=4))

    runs = []
    for option in (False, True):
        chat = sgl.OpenAI("tiny", base_url=f"{url}/v1", continue_final_message=option)
        state = spec.run(backend=chat, temperature=0)
        runs.append((state.text(), state.error() is None and state.get_meta_info("x")["speculative"],
                     chat.token_usage.prompt_tokens))
        chat.shutdown()
    assert runs[0] == runs[1]
    assert runs[0][1] is True


def test_continue_final_message_is_refused_where_it_cannot_apply():
    """A flag that is no bool, a completion model (its gens go anywhere already) and OpenAI's own
    API (no such field) are refused when the backend is made, naming the fix."""
    cases = [
        (lambda: sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1", continue_final_message="yes"), TypeError,
         "lmnb.OpenAI continue_final_message must be True or False; got 'yes' (str)"),
        (lambda: sgl.OpenAI("m", False, base_url="http://127.0.0.1:9/v1", continue_final_message=True), ValueError,
         "lmnb.OpenAI continue_final_message=True is for chat models, and 'm' is used as a completion model, whose "
         "gens go anywhere in the text already: leave it out"),
        (lambda: sgl.OpenAI("gpt-4o-mini", api_key="k", continue_final_message=True), ValueError,
         "lmnb.OpenAI continue_final_message=True: OpenAI's API has no continue_final_message field (vLLM, SGLang "
         "and lmnb serve servers take it); leave it out, and generate at the start of assistant messages or use "
         "@function(num_api_spec_tokens=N)"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind) as e:
            make()
        assert str(e.value) == message
