"""Bad input, aborts, internal errors and shutdown: clear exceptions, no leaked KV, engine usable."""

from __future__ import annotations

import json
import math
import re
import threading
import time

import pytest
import torch

from lmnb_engine import Engine, SamplingParams
from lmnb_engine.forward_batch import ForwardMode
from tests.helpers_engine import HFReference, assert_idle_accounting, nan_embedding, unused_token

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
# A request that a test aborts (or shuts down) while it runs, on an engine of tiny_llama_long: it cannot
# end first, however long the test's thread is held up (16000 tokens take over a minute to decode;
# the 300-450 of before took under 2 s on a loaded machine, and then the abort found nothing to end).
LONG = SamplingParams(max_new_tokens=16000, temperature=0.0, ignore_eos=True)
LONG_KV = 16100  # KV slots for one request of LONG and its prompt
# the abort of a request the engine had accepted when it shut down
SHUT_DOWN = "aborted: the engine shut down (Engine.shutdown, or the Engine was dropped) before the request finished"


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return HFReference(tiny_llama)


def failing_at_call(fn, k: int, message: str):
    """``fn``, except that its ``k``-th call raises ``RuntimeError(message)`` (a simulated failure)."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == k:
            raise RuntimeError(message)
        return fn(*args, **kwargs)

    return wrapped


@pytest.fixture()
def engine(tiny_llama):
    with Engine(str(tiny_llama), max_total_tokens=1024) as eng:
        yield eng


@pytest.fixture()
def long_engine(tiny_llama_long):
    """An engine on ``tiny_llama_long`` whose KV pool holds two requests of ``LONG`` beside short ones."""
    with Engine(str(tiny_llama_long), max_total_tokens=2 * LONG_KV + 1024) as eng:
        yield eng


def test_bad_model_paths_and_settings_raise_clear_errors(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        Engine(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="schedule_policy"):
        Engine(str(tiny_llama), max_total_tokens=256, schedule_policy="random-ish")
    with pytest.raises(ValueError, match="max_total_tokens"):
        Engine(str(tiny_llama), max_total_tokens=1)
    # option types are checked before anything loads (the missing path is never reached)
    with pytest.raises(TypeError, match=r"Engine\(max_total_tokens='4096'\): max_total_tokens must be an int"):
        Engine(str(tmp_path / "missing"), max_total_tokens="4096")
    with pytest.raises(TypeError, match=r"Engine\(max_running_requests=8.0\): max_running_requests must be an int"):
        Engine(str(tmp_path / "missing"), max_running_requests=8.0)
    with pytest.raises(TypeError, match=r"Engine\(disable_radix_cache='no'\): disable_radix_cache must be True or False"):
        Engine(str(tmp_path / "missing"), disable_radix_cache="no")
    with pytest.raises(TypeError, match=r"mem_fraction must be a number"):
        Engine(str(tmp_path / "missing"), mem_fraction="0.5")
    with pytest.raises(TypeError, match=r"Engine\(cuda_graph_max_bs=2.5\): cuda_graph_max_bs must be an int"):
        Engine(str(tmp_path / "missing"), cuda_graph_max_bs=2.5)
    # a negative size was accepted (and meant off, as 0); only None and 0 are documented
    with pytest.raises(ValueError, match=re.escape("cuda_graph_max_bs=-1 must be >= 0 (0 = no CUDA graphs, None: "
                                                   "the default)")):
        Engine(str(tmp_path / "missing"), cuda_graph_max_bs=-1)
    # scheduler settings too: found after a tensor-parallel start, they left its worker and the
    # process group behind, and no later tensor-parallel engine could start in the process
    import multiprocessing

    import torch.distributed as dist

    for bad, words in [(dict(schedule_policy="nope"), "unknown schedule_policy 'nope'"),
                       (dict(chunked_prefill_size=0), "chunked_prefill_size=0 must be >= 1"),  # was: the default
                       (dict(chunked_prefill_size=-1), "chunked_prefill_size=-1 must be >= 1")]:
        with pytest.raises(ValueError, match=words):
            Engine(str(tmp_path / "missing"), tp_size=2, device="cpu", **bad)
    assert not multiprocessing.active_children() and not dist.is_initialized()


@pytest.mark.parametrize(
    "prompt,params,match",
    [
        ("", GREEDY, "empty prompt"),
        ([], GREEDY, "empty prompt"),
        ([1, 2, 10**6], GREEDY, "outside the vocabulary"),
        ([5] * 10, GREEDY.copy(stop_token_ids=[3, 10**6]), r"stop_token_ids \[1000000\] are outside the vocabulary"),
        # (lmnb had no logit_bias): a key past the 512 tokens of the model, named, with the fix
        ([5] * 10, GREEDY.copy(logit_bias={3: 1, 512: -5}), r"^SamplingParams\.logit_bias is invalid: token id 512 is "
                                                            r"outside this model's vocabulary \[0, 512\); remove it, or "
                                                            r"take the ids from this model's tokenizer$"),
        ([5] * 10, GREEDY.copy(logit_bias={"600": 1, 10**6: -5}), r"token ids 600, 1000000 are outside"),
        ([5] * 10, GREEDY.copy(extra={"whitespace": " "}), r"extra=.* whose only key is 'whitespace_pattern'"),
        ([5] * 10, GREEDY.copy(json_schema={"type": "object"}, extra={"whitespace_pattern": "(["}),
         r'whitespace_pattern "\(\[" is not a valid regular expression \(unterminated character set'),
        # either fix alone, each with its number (it said "shorten the prompt or lower max_new_tokens"):
        # 500 + 20 - 512 = 8 tokens too many, 512 - 500 = 12 new tokens fit
        ([5] * 500, GREEDY.copy(max_new_tokens=20), r"^prompt of 500 tokens \+ max_new_tokens=20 exceeds the model's "
                                                    r"context length of 512 tokens; shorten the prompt by at least 8 "
                                                    r"tokens or lower max_new_tokens to at most 12$"),
        ([5] * 511, GREEDY.copy(max_new_tokens=2), r"length of 512 tokens; shorten the prompt by at least 1 token or "
                                                   r"lower max_new_tokens to at most 1$"),
        # a prompt too long alone (a select's or fork's prefill asks for no new tokens): the fix is
        # not "lower max_new_tokens=0", and it comes with its number (it said "shorten the prompt"):
        # 600 - 512 = 88 tokens too many
        ([5] * 600, GREEDY.copy(max_new_tokens=0),
         r"^prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten the prompt by at least 88 "
         r"tokens$"),
        # beside new tokens, so that the shortened prompt fits beside them too (it met a second
        # refusal): 600 + 20 - 512 = 108 tokens, 88 + max_new_tokens, one fix (it added "or lower
        # max_new_tokens to N and shorten the prompt by at least 88 + N tokens", the same); 88 + 1 beside one
        ([5] * 600, GREEDY.copy(max_new_tokens=20),
         r"^prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten the prompt by at least 88 "
         r"\+ max_new_tokens tokens \(108 with max_new_tokens=20\)$"),
        ([5] * 600, GREEDY.copy(max_new_tokens=1), r"length of 512 tokens; shorten the prompt by at least 89 tokens$"),
        ([5] * 10, GREEDY.copy(max_new_tokens=600), "context length"),
        ([5], GREEDY.copy(max_new_tokens=600), r"^prompt of 1 token \+ max_new_tokens=600 exceeds"),
        # a max_new_tokens no prompt fits beside, but a prompt that fills the context: not "at most 0",
        # and not "shorten the prompt or lower max_new_tokens" (either alone fits nothing): both
        ([5] * 512, GREEDY.copy(max_new_tokens=512), r"length of 512 tokens; shorten the prompt and lower max_new_tokens, "
                                                     r"so that the prompt's tokens and max_new_tokens together fit 512$"),
        # a prompt that fills the context beside a max_new_tokens a shorter prompt fits: lowering it
        # alone fits only at 0 new tokens, no fix; shortening by it is (it said "shorten the prompt or
        # lower"), by fewer beside a lower one (it said the first alone, as if no lower one helped)
        ([5] * 512, GREEDY.copy(max_new_tokens=3), r"^prompt of 512 tokens \+ max_new_tokens=3 exceeds the model's "
                                                   r"context length of 512 tokens; shorten the prompt by at least "
                                                   r"max_new_tokens tokens \(3 with max_new_tokens=3\)$"),
        ([5] * 512, GREEDY.copy(max_new_tokens=1), r"length of 512 tokens; shorten the prompt by at least 1 token$"),
        # a prompt past the context beside such a max_new_tokens: both at once (it named the prompt
        # alone, and the shortened prompt met a second refusal)
        ([5] * 600, GREEDY.copy(max_new_tokens=512),
         r"^prompt of 600 tokens exceeds the model's context length of 512 tokens, and max_new_tokens=512 leaves no room "
         r"for any prompt; shorten the prompt and lower max_new_tokens, so that the prompt's tokens and max_new_tokens "
         r"together fit 512$"),
        ([5] * 600, GREEDY.copy(max_new_tokens=511),  # (600 + 511 - 512 = 599: a prompt of 1 token is left)
         r"^prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten the prompt by at least 88 "
         r"\+ max_new_tokens tokens \(599 with max_new_tokens=511\)$"),
        ([5] * 10, GREEDY.copy(temperature=-1.0), "temperature"),
        ([5] * 10, GREEDY.copy(top_p=0.0), "top_p"),
        ([5] * 10, GREEDY.copy(n=0), "SamplingParams.n"),
        ([5] * 10, GREEDY.copy(top_k=0), "top_k"),
        ([5] * 10, GREEDY.copy(logprob_start_len=11), "logprob_start_len"),
    ],
)
def test_bad_requests_raise_and_the_engine_stays_usable(engine, hf, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(prompt, params)
    p = engine.encode("the cat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)
    assert_idle_accounting(engine)


def test_a_prompt_that_fills_the_context_is_told_how_much_to_shorten_and_that_fits(engine):
    """A prompt of the context's length beside max_new_tokens=3 was told "shorten the prompt or
    lower max_new_tokens", where only 0 new tokens fit; the shortening it is told now fits, and so
    does the lower max_new_tokens beside the prompt shortened by as many tokens."""
    with pytest.raises(ValueError, match=r"shorten the prompt by at least max_new_tokens tokens \(3 with "
                                         r"max_new_tokens=3\)$"):
        engine.generate([5] * engine.context_len, SamplingParams(max_new_tokens=3, ignore_eos=True))
    for cut in (3, 2):
        out = engine.generate([5] * (engine.context_len - cut), SamplingParams(max_new_tokens=cut, ignore_eos=True))
        assert len(out.token_ids) == cut


def test_a_prompt_past_the_context_is_told_how_much_to_shorten_and_each_fix_fits(engine):
    """A prompt of 600 tokens (context 512) beside max_new_tokens=20 was told "shorten the prompt"
    with no size, and a prompt shortened to fit alone met a second refusal for its max_new_tokens:
    it is told to cut 108 = 600 + 20 - 512 tokens, or 88 + N beside N new tokens (88 = 600 - 512),
    and each fits where one token less cut does not (N = 5: a prompt of 600 - 93 = 507 tokens)."""
    with pytest.raises(ValueError) as e:
        engine.generate([5] * 600, SamplingParams(max_new_tokens=20, ignore_eos=True))
    assert str(e.value) == ("prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten the prompt "
                            "by at least 88 + max_new_tokens tokens (108 with max_new_tokens=20)")
    assert len(engine.generate([5] * 492, SamplingParams(max_new_tokens=20, ignore_eos=True)).token_ids) == 20
    assert len(engine.generate([5] * 507, SamplingParams(max_new_tokens=5, ignore_eos=True)).token_ids) == 5
    for prompt, new in ((493, 20), (508, 5)):
        with pytest.raises(ValueError, match="exceeds the model's context length"):
            engine.generate([5] * prompt, SamplingParams(max_new_tokens=new, ignore_eos=True))


def test_a_prompt_that_leaves_some_room_is_told_both_fixes_and_each_fits(engine):
    """A prompt of 500 tokens beside max_new_tokens=20 (context 512) was told "shorten the prompt or
    lower max_new_tokens", with no sizes; it is told each fix's number (8 = 500 + 20 - 512 tokens
    to cut, 12 = 512 - 500 new tokens that fit), and each fits where one token less does not."""
    with pytest.raises(ValueError) as e:
        engine.generate([5] * 500, SamplingParams(max_new_tokens=20, ignore_eos=True))
    assert str(e.value) == ("prompt of 500 tokens + max_new_tokens=20 exceeds the model's context length of 512 "
                            "tokens; shorten the prompt by at least 8 tokens or lower max_new_tokens to at most 12")
    assert len(engine.generate([5] * 492, SamplingParams(max_new_tokens=20, ignore_eos=True)).token_ids) == 20
    assert len(engine.generate([5] * 500, SamplingParams(max_new_tokens=12, ignore_eos=True)).token_ids) == 12
    for prompt, new in ((493, 20), (500, 13)):
        with pytest.raises(ValueError, match="exceeds the model's context length"):
            engine.generate([5] * prompt, SamplingParams(max_new_tokens=new, ignore_eos=True))


def test_a_max_new_tokens_of_thousands_of_digits_is_refused_with_its_size_not_a_valueerror_of_python(engine):
    """max_new_tokens=10**5000, which validate takes (an int >= 0), failed in the engine's own refusal
    with Python's "Exceeds the limit (4300 digits) for integer string conversion" (Engine.generate,
    and a gen's max_tokens or run()'s max_new_tokens on lmnb.Engine), and 10**100 was written with
    all 101 digits; both are shown as validate shows a huge number, with the fix. Worked out by hand:
    10**5000 is 1 and 5000 zeros, 5001 digits; 25 * 10**99 is 2.5e100, 101 digits; 2 (or 10) tokens
    of the 512 leave 510 (502)."""
    import lmnb
    from lmnb_engine.tokenizer import max_token_bytes

    for m, shown in ((10**5000, "1.000e+5000 (an integer of 5001 digits)"),
                     (25 * 10**99, "2.500e+100 (an integer of 101 digits)")):
        with pytest.raises(ValueError) as e:
            engine.generate([5, 6], SamplingParams(max_new_tokens=m))
        assert str(e.value) == (f"prompt of 2 tokens + max_new_tokens={shown} exceeds the model's context length of "
                                "512 tokens; lower max_new_tokens to at most 510")
        text = "a" * (512 * max_token_bytes(engine.tokenizer) + 1)  # (refused uncounted, beside both fixes)
        with pytest.raises(ValueError) as e:
            engine.generate(text, SamplingParams(max_new_tokens=m))
        assert str(e.value) == (f"prompt of at least 513 tokens ({len(text)} characters, counted without encoding "
                                f"them) exceeds the model's context length of 512 tokens, and max_new_tokens={shown} "
                                "leaves no room for any prompt; shorten the prompt and lower max_new_tokens, so that "
                                "the prompt's tokens and max_new_tokens together fit 512")

        @lmnb.function
        def prog(s, n):
            s += "w" * 10 + lmnb.gen("x", max_tokens=n)

        @lmnb.function
        def default(s):
            s += "w" * 10 + lmnb.gen("x")

        said = (f"Gen('x') failed: ValueError: prompt of 10 tokens + max_tokens={shown} exceeds the model's context "
                "length of 512 tokens; lower max_tokens to at most 502")
        assert str(prog.run(n=m, backend=lmnb.Engine(engine=engine)).error()) == said
        assert str(default.run(backend=lmnb.Engine(engine=engine), max_new_tokens=m).error()) == (
            f"{said} (the gen has no max_tokens of its own and took run(max_new_tokens={shown}): give it its own "
            "max_tokens=N, or lower that)")
    with pytest.raises(ValueError) as e:
        default.run(backend=lmnb.Engine(engine=engine), max_new_tokens=-(10**5000))
    assert str(e.value) == ("run(max_new_tokens=-1.000e+5000 (an integer of 5001 digits)) is invalid: must be an "
                            "integer >= 0")
    assert_idle_accounting(engine)


def test_more_samples_than_lmnb_serve_takes_are_refused_in_process_too(engine):
    """n had no upper bound in process (lmnb serve refused above 128): n=10**6 queued a million
    requests and grew to 4.3 GB. submit, stream and generate refuse what the server refuses, at
    once, with nothing queued; 128 samples, the bound (OpenAI's too), are still taken."""
    message = "SamplingParams.n={} is invalid: at most 128 samples per request; send several requests for more"
    for n in (129, 10**6):
        for call in (engine.submit, engine.stream, engine.generate):
            with pytest.raises(ValueError) as e:
                call([5, 6], GREEDY.copy(max_new_tokens=1, n=n))
            assert str(e.value) == message.format(n)
        assert_idle_accounting(engine)
    results = engine.generate([5, 6], GREEDY.copy(max_new_tokens=1, n=128))
    assert len(results) == 128 and len({tuple(r.token_ids) for r in results}) == 1  # (greedy: one answer)
    assert_idle_accounting(engine)


def test_hundreds_of_requests_at_once_keep_their_rids_until_each_ends(engine):
    """The engine's table of handles by rid is pruned of finished ones only now and then (pruning
    it at every submit read every handle, quadratic for a select of 10,000 choices). With
    hundreds running at once, a running request's rid is refused; once it has ended, abort(rid)
    is False and its rid is free for a new request, before and after the table is pruned again.
    (abort waits for the loop, held here: the abort tests below take a running one.)"""
    from lmnb_engine.outputs import rid_in_use

    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: nothing ends meanwhile
    try:
        handles = [engine.submit([5, 6], GREEDY.copy(max_new_tokens=1), rid=f"many-{i}") for i in range(300)]
        for i in (0, 150, 299):
            with pytest.raises(ValueError) as e:
                engine.submit([5], GREEDY, rid=f"many-{i}")
            assert str(e.value) == rid_in_use(f"many-{i}")
    finally:
        gate.set()
    assert [h.result().finish_reason.type for h in handles] == ["length"] * 300
    assert not engine.abort("many-7") and not engine.abort("many-100")
    again = [engine.submit([5, 6], GREEDY.copy(max_new_tokens=1), rid=f"many-{i}") for i in range(0, 300, 3)]
    assert [len(h.result().token_ids) for h in again] == [1] * 100
    assert_idle_accounting(engine)


def test_a_text_longer_than_the_model_is_refused_by_the_engine_alone(engine, monkeypatch):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(engine.tokenizer, "model_max_length", 16)
    with CaptureLogger(hf_logging.get_logger("transformers.tokenization_utils_base")) as log:
        ids = engine.encode("the cat sat on the mat " * 20)
    assert len(ids) > 16 and "Token indices sequence length" not in log.out  # transformers' warning
    with pytest.raises(ValueError, match="context length of 512"):
        engine.generate("the cat sat on the mat " * 200, GREEDY)


def test_a_text_certainly_longer_than_the_context_is_refused_without_encoding_it(engine, monkeypatch):
    """A 20 MB prompt took 20 s to encode before its refusal; no token of this tokenizer stands for
    more than max_token_bytes bytes, so a longer text is refused by its size alone. It was told
    "shorten the prompt" with no amount; its lower bound (513 tokens) says at least how much, as
    a counted prompt is told: by hand, at most 512 - 8 = 504 tokens fit beside max_new_tokens=8,
    so at least 513 - 504 = 9 tokens go, or 1 + N beside max_new_tokens=N; 513 - 1 = 512 beside
    511. Its fix names max_new_tokens, so its reason is DOES_NOT_FIT (a gen on the run's default
    max_tokens is told where that came from)."""
    from lmnb_engine.params import DOES_NOT_FIT
    from lmnb_engine.tokenizer import max_token_bytes

    text = "a" * (512 * max_token_bytes(engine.tokenizer) + 1)
    monkeypatch.setattr(engine, "encode", lambda *a, **k: pytest.fail("encoded a text that cannot fit"))
    with pytest.raises(ValueError) as e:
        engine.generate(text, GREEDY)
    said = (f"prompt of at least 513 tokens ({len(text)} characters, counted without encoding them) exceeds the "
            "model's context length of 512 tokens")
    assert str(e.value) == f"{said}; shorten the prompt by at least 1 + max_new_tokens tokens (9 with max_new_tokens=8)"
    assert e.value.reason == DOES_NOT_FIT
    # beside a max_new_tokens that leaves no room for any prompt (512 + 1 > 512): both at once, as a
    # counted prompt is told (test_bad_requests_raise_and_the_engine_stays_usable); it named the prompt alone, and
    # the shortened prompt met a second refusal
    both = (f"{said}, and max_new_tokens=512 leaves no room for any prompt; shorten the prompt and lower "
            "max_new_tokens, so that the prompt's tokens and max_new_tokens together fit 512")
    for call in (lambda: engine.generate(text, GREEDY.copy(max_new_tokens=512)),
                 lambda: engine.submit(text, GREEDY.copy(max_new_tokens=512))):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == both and e.value.reason == DOES_NOT_FIT
    with pytest.raises(ValueError) as e:  # a batch's params, one per prompt: the prompt's own
        engine.generate([[5, 6], text], [GREEDY.copy(max_new_tokens=512), GREEDY.copy(max_new_tokens=512)])
    assert str(e.value) == f"prompt 1 of the batch: {both}"
    with pytest.raises(ValueError) as e:
        engine.generate([[5, 6], text], [GREEDY.copy(max_new_tokens=512), GREEDY.copy(max_new_tokens=511)])
    assert str(e.value) == (f"prompt 1 of the batch: {said}; shorten the prompt by at least 1 + max_new_tokens tokens "
                            "(512 with max_new_tokens=511)")
    with pytest.raises(ValueError) as e:  # (a call that samples one token: shortening is the one fix)
        engine.generate(text, GREEDY.copy(max_new_tokens=1))
    assert str(e.value) == f"{said}; shorten the prompt by at least 2 tokens" and getattr(e.value, "reason", None) is None
    monkeypatch.undo()
    assert engine.generate("the cat", GREEDY).token_ids  # still serving


def test_an_id_or_value_of_over_4300_digits_is_named_in_scientific_form_by_the_engine(engine):
    """A token id (of the prompt, of stop_token_ids), a rid, a logprob_start_len or a json_schema's
    value of 10**5000 failed in the engine's refusal in Python's words ("Exceeds the limit (4300
    digits) for integer string conversion"), the schema's as the grammar cache wrote its key; each
    is named as validate names a huge number (by hand: 1 and 5000 zeros, 5001 digits)."""
    big, shown = 10**5000, "1.000e+5000 (an integer of 5001 digits)"
    vocab = engine.model_info()["vocab_size"]
    for call, kind, said in (
            (lambda: engine.generate([1, big, 10**9], GREEDY), ValueError,
             f"prompt token ids [{shown}, 1000000000] are outside the vocabulary [0, {vocab})"),
            (lambda: engine.generate([5, 6], GREEDY.copy(stop_token_ids=[big])), ValueError,
             f"stop_token_ids [{shown}] are outside the vocabulary [0, {vocab})"),
            (lambda: engine.generate([5, 6], GREEDY.copy(logprob_start_len=big)), ValueError,
             f"logprob_start_len={shown} is past the prompt's 2 tokens; give at most 2 (0: the logprobs of every "
             "prompt token; -1, the default: none)"),
            (lambda: engine.submit([5, 6], GREEDY, rid=big), TypeError,
             f"rid={shown} must be a string (or None for a random one)"),
            (lambda: engine.generate([5, 6], GREEDY.copy(json_schema={"type": "integer", "maximum": big})), ValueError,
             f"JSON schema at #/maximum holds {shown}, more digits than Python writes as an integer (at most 4300); "
             "give a smaller number")):
        with pytest.raises(kind) as e:
            call()
        assert str(e.value) == said
    assert_idle_accounting(engine)


def test_a_logprob_start_len_past_the_prompt_names_the_starts_it_may_take(engine):
    """``logprob_start_len`` past the prompt was refused as "logprob_start_len=3 is past the
    prompt's 2 tokens", without the fix (lmnb serve's 400 the same): a start from 0 to the prompt's
    length (2 here, which scores no prompt token), or -1 for none; the start of 2 runs."""
    with pytest.raises(ValueError) as e:
        engine.generate([5, 6], GREEDY.copy(max_new_tokens=1, logprob_start_len=3))
    assert str(e.value) == ("logprob_start_len=3 is past the prompt's 2 tokens; give at most 2 (0: the logprobs of "
                            "every prompt token; -1, the default: none)")
    assert engine.generate([5, 6], GREEDY.copy(max_new_tokens=1, logprob_start_len=2)).token_ids
    assert_idle_accounting(engine)


def test_a_gen_on_the_default_max_tokens_past_the_context_is_told_where_that_number_came_from(engine):
    """A prompt past the context was refused without DOES_NOT_FIT, so a gen without max_tokens of
    its own, whose refusal offers to lower max_tokens and names numbers made of lmnb's default
    of 128, was not told where 128 came from (a prompt that fits but not beside it was). By
    hand: 600 tokens in a context of 512 beside 128 new ones: at most 384 fit, so 216 go, or
    88 + N beside max_tokens=N; a text of at least 513 tokens (counted without encoding it):
    513 - 384 = 129, or 1 + N. A gen's own max_tokens=1 offers no lower one: no note."""
    import lmnb
    from lmnb_engine.tokenizer import max_token_bytes

    @lmnb.function
    def default(s, text):
        s += text + lmnb.gen("x")

    @lmnb.function
    def own(s, text):
        s += text + lmnb.gen("x", max_tokens=1)

    backend = lmnb.Engine(engine=engine)
    note = ("(the gen has no max_tokens of its own and took lmnb's default of 128: give it its own max_tokens=N, or "
            "set run(max_new_tokens=N))")
    assert str(default.run(text="w" * 600, backend=backend).error()) == (
        "Gen('x') failed: ValueError: prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten "
        f"the prompt by at least 88 + max_tokens tokens (216 with max_tokens=128) {note}")
    huge = "w" * (512 * max_token_bytes(engine.tokenizer) + 1)
    assert str(default.run(text=huge, backend=backend).error()) == (
        f"Gen('x') failed: ValueError: prompt of at least 513 tokens ({len(huge)} characters, counted without "
        "encoding them) exceeds the model's context length of 512 tokens; shorten the prompt by at least 1 + "
        f"max_tokens tokens (129 with max_tokens=128) {note}")
    assert str(own.run(text="w" * 600, backend=backend).error()) == (
        "Gen('x') failed: ValueError: prompt of 600 tokens exceeds the model's context length of 512 tokens; shorten "
        "the prompt by at least 89 tokens")
    assert_idle_accounting(engine)


def _kv_bytes_per_token(checkpoint) -> int:
    """Bytes of K and V one token of ``checkpoint`` (float32 on CPU) takes, from its config.json:
    both, for each layer and KV head, ``hidden_size / num_attention_heads`` dims of 4 bytes."""
    c = json.loads((checkpoint / "config.json").read_text())
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 4


@pytest.mark.parametrize("n, shown", [
    (0, "0 B"), (1000, "1000 B"), (1023, "1023 B"),
    (1024, "1.0 KiB"), (1536, "1.5 KiB"), (8704, "8.5 KiB"),  # (8704 / 1024 = 8.5)
    (1_000_000, "976.6 KiB"),  # (10**6 / 1024 = 976.5625)
    (2**20 - 52, "1023.9 KiB"), (2**20 - 1, "1.0 MiB"),  # (1023.999 KiB rounds to 1024.0: the next unit)
    (320 << 20, "320.0 MiB"), (3 * 2**30 // 2, "1.5 GiB"),
    (5 * 2**40, "5120.0 GiB"),  # (GiB at most)
    (1023.6, "1.0 KiB"), (-2048, "-2.0 KiB"),
])
def test_byte_size_writes_each_size_in_the_largest_binary_unit_it_fills(n, shown):
    """Memory errors gave sizes in GiB alone: 2048 bytes read "(0.0 GiB)"."""
    from lmnb_engine.byte_size import byte_size

    assert byte_size(n) == shown


def test_weights_past_free_gpu_memory_are_said_in_units_that_show_them(monkeypatch):
    """The model loader's refusal of weights that do not fit said "need 0.0 GiB ... only 0.0 GiB
    of memory is free" for a small model on a nearly full GPU. (No GPU is needed: the check reads
    the free memory from ``torch.cuda.mem_get_info``, faked here.)"""
    from types import SimpleNamespace

    from lmnb_engine import model_loader

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 2**30))
    net = torch.nn.Linear(16, 16)  # (16 x 16 weights + 16 biases = 272 float32s: 1088 bytes, 1.0625 KiB)
    config = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)
    with pytest.raises(ValueError) as e:
        model_loader._check_fits(net, config)
    assert str(e.value) == ("the model's weights need 1.1 KiB in float32 but only 1000 B of memory is free on cuda; "
                            "free the GPU, choose a smaller model, or use bfloat16/float16 instead of float32")


def test_a_kv_pool_past_free_memory_is_refused_with_its_bytes_before_any_allocation(tiny_llama, monkeypatch):
    """max_total_tokens=10**20 failed in torch's words ("Overflow when unpacking long long", with a
    C++ stack); 10**12 in its allocator's, cut mid-number. The pool's bytes (one padding slot with
    it) are weighed against the free memory first, the figure the engine itself measured."""
    import lmnb_engine.model_runner as model_runner

    per_token = _kv_bytes_per_token(tiny_llama)
    assert per_token == 512  # (2 layers x 2 KV heads x 16 dims x 4 bytes x K and V)
    measure, measured = model_runner._free_memory_bytes, []
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: measured.append(measure(device)) or measured[-1])
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), max_total_tokens=10**20)
    free, = measured
    need = (10**20 + 1) * per_token
    # (each size in the largest unit it fills: the machine's free RAM in GiB, or MiB on a small one)
    free_shown = f"{free / 2**30:.1f} GiB" if free >= 2**30 else f"{free / 2**20:.1f} MiB"
    assert str(e.value) == (
        f"a KV pool of 100000000000000000000 tokens needs {need} bytes ({need / 2**30:.1f} GiB): 512 bytes a token "
        "(2 layers x 2 KV heads x 16 dims x 4-byte float32, K and V), one padding token included; cpu has "
        f"{free} bytes ({free_shown}) free; pass max_total_tokens={free // 512 - 1} or less, or leave "
        "max_total_tokens unset to size the pool from free memory")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**6)
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), max_total_tokens=10**5000)
    assert str(e.value) == (
        "a KV pool of 1.000e+5000 (an integer of 5001 digits) tokens needs 5.120e+5002 (an integer of 5003 digits) "
        "bytes: 512 bytes a token (2 layers x 2 KV heads x 16 dims x 4-byte float32, K and V), one padding token "
        # (10**6 // 512 = 1953 slots, one of them padding; 10**6 / 1024 = 976.5625 KiB)
        "included; cpu has 1000000 bytes (976.6 KiB) free; pass max_total_tokens=1952 or less, or leave "
        "max_total_tokens unset to size the pool from free memory")
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    with pytest.raises(ValueError) as e:  # (no size of 2 or more fits: the fix that is left)
        Engine(str(tiny_llama), max_total_tokens=3)
    # (it said "2048 bytes (0.0 GiB)" and "1000 bytes (0.0 GiB)": 2048 bytes are 2 KiB, and under 1 KiB
    # the bytes alone are the size)
    assert str(e.value) == (
        "a KV pool of 3 tokens needs 2048 bytes (2.0 KiB): 512 bytes a token (2 layers x 2 KV heads x 16 dims x "
        "4-byte float32, K and V), one padding token included; cpu has 1000 bytes free; leave "
        "max_total_tokens unset to size the pool from free memory")


def test_mem_fraction_1_sizes_a_pool_that_fits_beside_its_request_to_token_table(tiny_llama, monkeypatch):
    """mem_fraction=1.0 (documented as allowed) gave every free byte to KV tokens, and the check of
    the pools against free memory, which counts the request-to-token table and the padding slot
    too, refused it every time. The table (64 rows on CPU x the context length x 4 bytes) and the
    padding slot now come out of the share first; 0.5 gives half the bytes, the table still whole."""
    import json

    import lmnb_engine.model_runner as model_runner

    free = 50 * 2**20
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: free)
    context_len = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    table = 64 * context_len * 4
    for fraction, share in ((1.0, free), (0.5, free // 2)):
        engine = Engine(str(tiny_llama), mem_fraction=fraction)
        try:
            assert engine.context_len == context_len
            assert engine.cache_stats()["pool_size"] == (share - table) // 512 - 1  # (512 bytes a token, as above)
        finally:
            engine.shutdown()


def test_a_pool_sized_from_free_memory_is_not_refused_when_free_memory_drops_after(tiny_llama, monkeypatch):
    """The pool was sized from one read of the free memory and checked against a second: on CPU
    MemAvailable moves between reads, and mem_fraction=1.0's pool, sized to all of the first, was
    refused by a second read a byte lower. Sizing and the check weigh one figure now."""
    import json

    import lmnb_engine.model_runner as model_runner

    free = 50 * 2**20
    reads = iter([free] + [free - 1] * 10)  # (the RAM falls by a byte after the first read)
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: next(reads))
    context_len = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    table = 64 * context_len * 4  # (64 rows on CPU; the pool fills the rest to the byte: 512 divides it)
    assert (free - table) % 512 == 0
    engine = Engine(str(tiny_llama), mem_fraction=1.0)
    try:
        assert engine.cache_stats()["pool_size"] == (free - table) // 512 - 1
    finally:
        engine.shutdown()


def test_a_kv_pool_that_fits_the_free_memory_but_fails_to_allocate_names_its_option(tiny_llama, monkeypatch):
    """Memory another process takes between the check and the allocation (or a GPU's in pieces):
    the allocator's first line was cut at 120 characters, inside the number of bytes it named, and
    both max_total_tokens and mem_fraction were to be lowered, though only one sized the pool."""
    import lmnb_engine.model_runner as model_runner

    said = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 8704 bytes. Error code 12 (Cannot allocate memory)")

    def refused(*args, **kwargs):
        raise RuntimeError(said + "\nException raised from ...")

    monkeypatch.setattr(model_runner, "TokenToKVPool", type("Pool", (), {
        "__init__": refused, "bytes_per_token": staticmethod(model_runner.TokenToKVPool.bytes_per_token)}))
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), max_total_tokens=16)
    # (16 tokens and the padding slot, 512 bytes each: 8704 bytes, 8.5 KiB)
    assert str(e.value) == (f"a KV pool of 16 tokens needs 8704 bytes (8.5 KiB) on cpu, and allocating it failed "
                            f"({said}); lower max_total_tokens, or free some memory")
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), mem_fraction=0.001)
    assert str(e.value).endswith(f"and allocating it failed ({said}); lower mem_fraction, or free some memory")


def test_a_request_table_that_fits_the_free_memory_but_fails_to_allocate_names_its_option(tiny_llama, monkeypatch):
    """As a KV pool's: the table's allocation failing (memory another process took since the check,
    at start-up or in the recovery after an internal error) raised the allocator's own error from
    deep in the runner, naming no option."""
    import lmnb_engine.model_runner as model_runner

    said = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 8192 bytes. Error code 12 (Cannot allocate memory)")

    def refused(*args, **kwargs):
        raise RuntimeError(said + "\nException raised from ...")

    monkeypatch.setattr(model_runner, "ReqToTokenPool", refused)
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), max_total_tokens=16, max_running_requests=4)
    # 4 rows x 512 positions x 4 bytes = 8192 bytes (8.0 KiB)
    assert str(e.value) == (
        "the request-to-token table of 4 rows x 512 positions (the context length) needs 8192 bytes (8.0 KiB) on "
        f"cpu, and allocating it failed ({said}); lower max_running_requests, or free some memory")


def test_a_request_table_past_free_memory_names_the_max_running_requests_that_fit(tiny_llama, monkeypatch):
    """max_running_requests is capped at max_total_tokens, but each row of the request-to-token
    table takes 4 bytes for every position of the context: 10**7 rows of a 32768-token model's
    table are 1.3 TB, allocated without a word. Refused with the rows that fit beside the pool."""
    import lmnb_engine.model_runner as model_runner

    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 100_000)
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), max_total_tokens=100, max_running_requests=10**20)
    # 100 rows (the cap) x 512 positions x 4 bytes = 204800; the pool 101 x 512 = 51712; and
    # (100000 - 51712) // (512 x 4) = 23 rows fit beside it; in KiB: 204800 / 1024 = 200,
    # 51712 / 1024 = 50.5, 100000 / 1024 = 97.66 (each said "0.0 GiB")
    assert str(e.value) == (
        "the request-to-token table of 100 rows x 512 positions (the context length) needs 204800 bytes (200.0 KiB) "
        "at 4 bytes a position, beside the 51712 bytes (50.5 KiB) of a KV pool of 100 tokens; cpu has 100000 bytes "
        "(97.7 KiB) free; pass max_running_requests=23 or less, or lower max_total_tokens")
    with Engine(str(tiny_llama), max_total_tokens=100, max_running_requests=23) as eng:  # (23 x 2048 + 51712 fit)
        assert eng.model_info()["max_running_requests"] == 23


def test_on_a_gpu_the_request_tables_host_copy_past_the_available_ram_is_refused(monkeypatch):
    """On CUDA the request-to-token table has a copy in RAM too (the scheduler's), which only the
    GPU's free memory was weighed for: a table past the RAM was zero-filled into swap, or the
    process was killed. The runner is given a stand-in CUDA model (its sizes alone are read before
    the pools are made), plenty of GPU memory, and a host with little RAM; the device start-up
    (backend, pools, graphs), which needs a GPU, is left out."""
    import contextlib
    from types import SimpleNamespace

    import psutil

    import lmnb_engine.model_runner as model_runner

    started = []
    monkeypatch.setattr(model_runner.ModelRunner, "_start_on_device", lambda self, *args: started.append(self))
    monkeypatch.setattr(model_runner, "_current_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**9)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=100_000))
    config = SimpleNamespace(device="cuda", num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                             context_len=512)
    loaded = SimpleNamespace(model=None, config=config)
    with pytest.raises(ValueError) as e:
        model_runner.ModelRunner(loaded, max_total_tokens=100, max_running_requests=64)
    # 64 rows x 512 positions x 4 bytes = 131072 bytes (128 KiB); 100000 // 2048 = 48 rows fit
    assert str(e.value) == (
        "the request-to-token table's host copy (the one the scheduler reads, beside the one on cuda) of 64 rows x "
        "512 positions (the context length) needs 131072 bytes (128.0 KiB) of RAM at 4 bytes a position; the host "
        "has 100000 bytes (97.7 KiB) available; pass max_running_requests=48 or less, or free some RAM")
    assert started == []
    runner = model_runner.ModelRunner(loaded, max_total_tokens=100, max_running_requests=48)  # (98304 bytes fit)
    assert started == [runner] and runner.max_running_requests == 48


def test_a_recovery_whose_request_tables_host_copy_no_longer_fits_the_ram_is_refused(monkeypatch):
    """The host-RAM check of the request-to-token table's host copy was made at start-up alone: the
    rebuild after an internal error (``reset_pools``) made a new copy whatever RAM was left, into
    swap. It is weighed there too, against the RAM available once the old copy is freed. A
    stand-in model on the meta device (neither CPU, whose one table is weighed with the KV pool,
    nor a GPU, which this test needs none of) takes the GPU's place; its pools cost no memory."""
    from types import SimpleNamespace

    import psutil

    import lmnb_engine.model_runner as model_runner

    monkeypatch.setattr(model_runner.ModelRunner, "_start_on_device", lambda self, *args: None)
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 10**9)
    ram = SimpleNamespace(available=100_000)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: ram)
    config = SimpleNamespace(device="meta", num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32,
                             context_len=512)
    runner = model_runner.ModelRunner(SimpleNamespace(model=None, config=config), max_total_tokens=100,
                                      max_running_requests=48)  # (48 x 512 x 4 = 98304 bytes fit)
    runner.graph_runner = None
    runner.reset_pools()
    old = runner.req_to_token_pool
    assert old.host.shape == (48, 512)
    ram.available = 50_000
    with pytest.raises(ValueError) as e:
        runner.reset_pools()
    # 50000 // 2048 = 24 rows fit
    assert str(e.value) == (
        "the request-to-token table's host copy (the one the scheduler reads, beside the one on meta) of 48 rows x "
        "512 positions (the context length) needs 98304 bytes (96.0 KiB) of RAM at 4 bytes a position; the host "
        "has 50000 bytes (48.8 KiB) available; pass max_running_requests=24 or less, or free some RAM")
    assert runner.req_to_token_pool is old and old.host.numel() == 0 and runner.kv_pool is None


def test_cuda_graphs_are_captured_up_to_the_running_requests_at_most(tiny_llama, monkeypatch):
    """cuda_graph_max_bs=10**20 captured a graph of 10**20 rows (its static tensors failed in
    torch's words); a decode batch holds at most max_running_requests rows, so no larger graph is
    ever replayed. The runner is a stand-in here (graphs need CUDA): the size it is asked for."""
    import lmnb_engine.cuda_graph_runner as cuda_graph_runner

    asked = []

    class Recorder:
        def __init__(self, runner, max_batch_size):
            asked.append(max_batch_size)

        def capture(self):
            pass

        def release(self):
            pass

        def can_run(self, batch):
            return False

    monkeypatch.setattr(cuda_graph_runner, "CudaGraphRunner", Recorder)
    for max_bs in (10**20, 3):
        with Engine(str(tiny_llama), max_total_tokens=64, max_running_requests=4, cuda_graph_max_bs=max_bs):
            pass
    assert asked == [4, 3]


def test_a_kv_pool_too_small_names_the_engine_arguments_that_fix_it(tiny_llama, monkeypatch):
    """The Python API's load errors name Engine's keyword arguments; the command lines' tests
    (test_magics, test_server_cli, test_export_batch) check their own options for the same errors."""
    import lmnb_engine.model_runner as model_runner

    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), device="cpu", max_total_tokens=1)
    assert str(e.value) == "a KV pool of 1 token is too small; pass max_total_tokens=2 or more"
    monkeypatch.setattr(model_runner, "_free_memory_bytes", lambda device: 1000)
    with pytest.raises(ValueError) as e:
        Engine(str(tiny_llama), device="cpu", mem_fraction=0.5)
    assert str(e.value) == ("the KV pool's share of free memory on cpu (0.5) leaves room for only 0 KV tokens "
                            "(512 bytes each); raise mem_fraction, or pass max_total_tokens, or free some memory")


def test_a_request_too_large_for_the_kv_pool_names_the_engine_arguments_that_fix_it(tiny_llama):
    """The Python API's words: Engine's keyword max_total_tokens, SamplingParams' max_new_tokens
    (in a program, gen's max_tokens); test_magics, test_export_batch and test_server_protocol check
    the same refusals where the pool is sized by an option, or not by the client at all."""
    import lmnb

    with Engine(str(tiny_llama), max_total_tokens=32) as eng:
        with pytest.raises(ValueError) as e:
            eng.generate([5] * 40, GREEDY.copy(max_new_tokens=1))
        # (each fix with its number: 40 slots, 8 = 40 - 32 too many)
        assert str(e.value) == ("prompt of 40 tokens does not fit the KV pool of 32 tokens; raise max_total_tokens to "
                                "at least 40, or shorten the prompt by at least 8 tokens")
        with pytest.raises(ValueError) as e:
            eng.generate([5] * 10, GREEDY.copy(max_new_tokens=30))
        # (10 + 29 = 39 slots, the last new token takes none: 7 too many; 32 - 10 + 1 = 23 new tokens fit)
        assert str(e.value) == ("prompt of 10 tokens + max_new_tokens=30 does not fit the KV pool of 32 tokens; raise "
                                "max_total_tokens to at least 39, or shorten the prompt by at least 7 tokens or lower "
                                "max_new_tokens to at most 23")

        @lmnb.function
        def prog(s):
            s += "w" * 10 + lmnb.gen("x", max_tokens=30)

        assert str(prog.run(backend=lmnb.Engine(engine=eng)).error()) == (
            "Gen('x') failed: ValueError: prompt of 10 tokens + max_tokens=30 does not fit the KV pool of 32 tokens; "
            "raise max_total_tokens to at least 39, or shorten the prompt by at least 7 tokens or lower max_tokens to "
            "at most 23")

        @lmnb.function
        def default(s):
            s += "w" * 10 + lmnb.gen("x")

        # a gen without max_tokens: the 30 is the run's, which the message says, as for the context length
        assert str(default.run(backend=lmnb.Engine(engine=eng), max_new_tokens=30).error()) == (
            "Gen('x') failed: ValueError: prompt of 10 tokens + max_tokens=30 does not fit the KV pool of 32 tokens; "
            "raise max_total_tokens to at least 39, or shorten the prompt by at least 7 tokens or lower max_tokens to "
            "at most 23 (the gen has no max_tokens of its own and took "
            "run(max_new_tokens=30): give it its own max_tokens=N, or lower that)")


def test_a_request_that_fills_the_kv_pool_exactly_is_accepted_and_finishes(tiny_llama, hf):
    """A request holds a KV slot per token but the last it samples, which is never fed back
    (Req.kv_to_finish, by which the scheduler admits it): 80 prompt tokens + 21 new need 80 + 20 = 100
    slots, which a 100-token pool has, and a 100-token prompt that samples one token its 100. The
    engine refused both, counting one slot more than the request uses ("prompt of 80 tokens +
    max_new_tokens=21 does not fit the KV pool of 100 tokens"); a slot more than the pool is still
    refused."""
    prompt = [3 + (7 * i) % 500 for i in range(80)]
    expected = hf.greedy(prompt, 21)
    assert len(expected) == 21 and hf.eos not in expected  # (so the engine, too, samples all 21)
    with Engine(str(tiny_llama), device="cpu", max_total_tokens=100) as eng:
        r = eng.generate(prompt, GREEDY.copy(max_new_tokens=21))
        assert (r.token_ids, r.finish_reason.type) == (expected, "length")
        long_prompt = [3 + (7 * i) % 500 for i in range(100)]
        assert len(eng.generate(long_prompt, GREEDY.copy(max_new_tokens=1)).token_ids) == 1
        with pytest.raises(ValueError) as e:
            eng.generate(prompt, GREEDY.copy(max_new_tokens=22))  # 80 + 21 = 101 slots
        assert str(e.value) == ("prompt of 80 tokens + max_new_tokens=22 does not fit the KV pool of 100 tokens; raise "
                                "max_total_tokens to at least 101, or shorten the prompt by at least 1 token or lower "
                                "max_new_tokens to at most 21")
        with pytest.raises(ValueError) as e:
            eng.generate(long_prompt + [3], GREEDY.copy(max_new_tokens=1))
        assert str(e.value) == ("prompt of 101 tokens does not fit the KV pool of 100 tokens; raise max_total_tokens to "
                                "at least 101, or shorten the prompt by at least 1 token")
        assert_idle_accounting(eng)

def test_a_request_too_large_for_the_kv_pool_is_told_each_fixs_number_and_each_fits(tiny_llama):
    """The pool's refusals gave no numbers ("raise max_total_tokens, or lower max_new_tokens"), as
    the context's did before: each fix has its number now, worked out as the pool counts slots, one
    per token but the last sampled. A pool of 100 and 80 prompt tokens + 30 new need 80 + 29 = 109
    slots: 9 too many, and 100 - 80 + 1 = 21 new tokens fit; each fix fits where one token less
    does not. A prompt of 120 needs 120 + 29 = 149: 49 too many, or 19 + N beside N new tokens
    (120 - 100 - 1 = 19: 100 tokens beside one new one fit). Beside 200 new tokens, which fit beside
    no prompt, shortening is no fix, and lowering them is the request's one (its ``field``, which
    lmnb serve's error names), or with a prompt too long itself the two together."""
    with Engine(str(tiny_llama), device="cpu", max_total_tokens=100) as eng:
        def refused(n, m):
            with pytest.raises(ValueError) as e:
                eng.generate([5] * n, SamplingParams(max_new_tokens=m, ignore_eos=True))
            return e.value

        def fits(n, m):
            return len(eng.generate([5] * n, SamplingParams(max_new_tokens=m, ignore_eos=True)).token_ids) == m

        e = refused(80, 30)
        assert str(e) == ("prompt of 80 tokens + max_new_tokens=30 does not fit the KV pool of 100 tokens; raise "
                          "max_total_tokens to at least 109, or shorten the prompt by at least 9 tokens or lower "
                          "max_new_tokens to at most 21")
        assert e.reason == "does_not_fit" and getattr(e, "field", None) is None
        assert fits(71, 30) and fits(80, 21)
        for n, m in ((72, 30), (80, 22)):
            refused(n, m)
        e = refused(120, 30)
        assert str(e) == ("prompt of 120 tokens does not fit the KV pool of 100 tokens; raise max_total_tokens to at "
                          "least 149, or shorten the prompt by at least 19 + max_new_tokens tokens (49 with "
                          "max_new_tokens=30)")
        # (its fix names max_new_tokens, as one past the context's: a gen on the run's default is told so)
        assert e.reason == "does_not_fit" and getattr(e, "field", None) is None
        assert fits(71, 30) and fits(100, 1) and fits(95, 6)
        for n, m in ((101, 1), (96, 6)):
            refused(n, m)
        assert getattr(refused(101, 1), "reason", None) is None  # (shortening is its one fix: nothing else to say)
        e = refused(40, 200)
        assert str(e) == ("prompt of 40 tokens + max_new_tokens=200 does not fit the KV pool of 100 tokens; raise "
                          "max_total_tokens to at least 239, or lower max_new_tokens to at most 61")
        assert (e.reason, e.field) == ("does_not_fit", "max_new_tokens")
        assert fits(40, 61)
        refused(40, 62)
        assert str(refused(120, 200)) == (
            "prompt of 120 tokens does not fit the KV pool of 100 tokens; raise max_total_tokens to at least 319, or "
            "lower max_new_tokens to N and shorten the prompt by at least 19 + N tokens")
        assert_idle_accounting(eng)
    with Engine(str(tiny_llama), device="cpu", max_total_tokens=109) as eng:  # the pool it is told to take
        assert len(eng.generate([5] * 80, SamplingParams(max_new_tokens=30, ignore_eos=True)).token_ids) == 30
        with pytest.raises(ValueError, match="raise max_total_tokens to at least 110"):
            eng.generate([5] * 80, SamplingParams(max_new_tokens=31, ignore_eos=True))


def test_a_lower_max_new_tokens_below_min_new_tokens_is_told_to_lower_both(engine, tiny_llama):
    """A request told to "lower max_new_tokens to at most 12" (500 + 20 - 512 tokens past the
    context; 80 + 29 slots of a pool of 100: 21) whose min_new_tokens is more was refused again for
    doing so (min_new_tokens=15 must not exceed max_new_tokens=12): it is told to lower both, as the
    scheduler's abort of a request pins keep out says it, and that fits; a min_new_tokens that is
    not more is left out. A gen is told its own names, max_tokens and min_tokens."""
    import lmnb

    def refusal(eng, n, m, least):
        with pytest.raises(ValueError) as e:
            eng.generate([5] * n, SamplingParams(max_new_tokens=m, min_new_tokens=least))
        return str(e.value)

    assert refusal(engine, 500, 20, 15) == (
        "prompt of 500 tokens + max_new_tokens=20 exceeds the model's context length of 512 tokens; shorten the prompt "
        "by at least 8 tokens or lower max_new_tokens and min_new_tokens to at most 12")
    assert refusal(engine, 500, 20, 12).endswith("; shorten the prompt by at least 8 tokens or lower max_new_tokens to "
                                                 "at most 12")
    assert refusal(engine, 10, 600, 550).endswith("; lower max_new_tokens and min_new_tokens to at most 502")
    assert len(engine.generate([5] * 500, SamplingParams(max_new_tokens=12, min_new_tokens=12)).token_ids) == 12

    @lmnb.function
    def prog(s):
        s += "w" * 10 + lmnb.gen("x", max_tokens=600, min_tokens=550)

    assert str(prog.run(backend=lmnb.Engine(engine=engine)).error()) == (
        "Gen('x') failed: ValueError: prompt of 10 tokens + max_tokens=600 exceeds the model's context length of 512 "
        "tokens; lower max_tokens and min_tokens to at most 502")
    with Engine(str(tiny_llama), device="cpu", max_total_tokens=100) as eng:
        assert refusal(eng, 80, 30, 25) == (
            "prompt of 80 tokens + max_new_tokens=30 does not fit the KV pool of 100 tokens; raise max_total_tokens to "
            "at least 109, or shorten the prompt by at least 9 tokens or lower max_new_tokens and min_new_tokens to at "
            "most 21")
        assert refusal(eng, 80, 30, 21).endswith("or lower max_new_tokens to at most 21")
        assert len(eng.generate([5] * 80, SamplingParams(max_new_tokens=21, min_new_tokens=21)).token_ids) == 21


def test_a_load_error_survives_pickling_with_its_fixes(tiny_llama):
    """(A tensor-parallel worker's error crosses a process boundary.)"""
    import pickle

    from lmnb_engine.cli_options import in_option_syntax

    with pytest.raises(ValueError) as e:
        Engine("llama-3-8b", device="cpu")
    copy = pickle.loads(pickle.dumps(e.value))
    assert str(copy) == str(e.value)
    assert in_option_syntax(copy, {"random_weights"}) == ("'llama-3-8b' is a shape preset without weights; pass "
                                                          "--random-weights, or give a checkpoint directory or hub id")


def test_max_running_requests_is_capped_at_the_kv_pool_size(tiny_llama):
    # each running request holds a KV slot: 10**5 rows (of a 512-token table: 200 MB) could never
    # run beside a 64-token pool; 10**7 took 20 GB before any request came
    with Engine(str(tiny_llama), max_total_tokens=64, max_running_requests=10**5) as eng:
        assert eng.model_info()["max_running_requests"] == 64
        assert eng.runner.req_to_token_pool.host.shape[0] == 64


def test_prompt_plus_output_beyond_the_pool_is_rejected(tiny_llama):
    with Engine(str(tiny_llama), max_total_tokens=64) as eng:
        with pytest.raises(ValueError, match="KV pool of 64 tokens"):
            eng.generate([5] * 40, GREEDY.copy(max_new_tokens=30))
        with pytest.raises(TypeError, match="string or a list of token ids"):
            eng.generate(12345, GREEDY)  # type: ignore[arg-type]


def test_params_that_are_not_sampling_params_raise_a_clear_type_error(engine):
    # an SGLang habit: sampling_params as a dict; it used to fail with "'dict' object has no attribute 'validate'"
    for call in (engine.generate, engine.submit, engine.stream):
        with pytest.raises(TypeError, match=r"SamplingParams\(\*\*d\)"):
            call("the cat", {"max_new_tokens": 2, "temperature": 0})
        # an empty one too (submit read it as no params, the defaults, where a fuller one was refused)
        with pytest.raises(TypeError, match=r"^params must be a lmnb_engine.SamplingParams, got dict"):
            call("the cat", {})
    assert engine.generate("the cat", GREEDY).finish_reason.type in ("length", "stop")
    assert_idle_accounting(engine)


def test_prompt_ids_of_mixed_int_types_are_read_and_bools_refused(engine, hf):
    """Plain ints take a fast path (exact type); a list that mixes in numpy ints still reads as
    one prompt, and a bool (an int subclass) is refused by both paths, naming its place."""
    import numpy as np

    ids = engine.encode("the red cat")
    mixed = [ids[0], np.int64(ids[1])] + ids[2:]
    assert engine.generate(mixed, GREEDY).token_ids == engine.generate(tuple(ids), GREEDY).token_ids == hf.greedy(ids, 8)
    for bad in ([ids[0], True] + ids[2:], [np.int64(ids[0]), True]):
        with pytest.raises(TypeError, match=r"list of token ids \(ints\); item 1 is True"):
            engine.generate(bad, GREEDY)
    # an id list with a stray item is one bad prompt, named by its place (it was read as a batch
    # and refused as "a prompt is ..., got int", blaming the good first id)
    for bad, shown in (([ids[0], 6.0], "6.0"), ([ids[0], ids[1], "x"], "'x'"), ([ids[0], [ids[1]]], r"\[\d+\]")):
        with pytest.raises(TypeError, match=rf"list of token ids \(ints\); item {len(bad) - 1} is {shown}"):
            engine.generate(bad, GREEDY)
    # a list that starts with any number, numpy's bool too, is one prompt (np.True_ was read as a
    # batch and refused as "prompt 0 of the batch: ..., got bool")
    for bad, shown in (([np.True_, ids[0]], "(np.)?True_?"), ([6.0, ids[0]], "6.0")):
        with pytest.raises(TypeError, match=rf"^a prompt is a string or a list of token ids \(ints\); item 0 is {shown}$"):
            engine.generate(bad, GREEDY)
    # a bad prompt of a batch is named by its place in the batch too, and keeps its error type
    with pytest.raises(TypeError, match=r"^prompt 2 of the batch: .*\(ints\); item 0 is 7\.0$"):
        engine.generate([[5], [6], [7.0]], GREEDY)
    with pytest.raises(ValueError, match=r"^prompt 1 of the batch: empty prompt"):
        engine.generate([[5, 6], []], GREEDY)
    # an empty list: it was "empty prompt: give at least one token", to a caller who meant a batch
    for empty in ([], ()):
        with pytest.raises(ValueError) as e:
            engine.generate(empty, GREEDY)
        assert str(e.value) == ("empty prompt: an empty list is read as one prompt of no token ids; give at least "
                                "one token id, or for a batch at least one prompt")
    with pytest.raises(TypeError, match=r"^prompt 1 of the batch: a prompt is a string or a list of token ids, got int"):
        engine.generate(["a", 5], GREEDY)
    assert_idle_accounting(engine)


def test_encode_and_decode_refuse_what_they_cannot_read_by_name(engine):
    """decode([10**9]) was "" and decode([-1]) an OverflowError from the tokenizer; encode(None) was
    the tokenizer's error listing batch forms that encode does not take."""
    import numpy as np

    vocab = engine.model_info()["vocab_size"]
    for ids in ([5, vocab], [-1], np.array([vocab + 7])):
        with pytest.raises(ValueError, match=rf"^token ids \[{ids[-1]}\] are outside the vocabulary \[0, {vocab}\)$"):
            engine.decode(ids)
    with pytest.raises(TypeError, match=r"^decode takes token ids \(ints\); item 1 is 'x'$"):
        engine.decode([5, "x"])
    with pytest.raises(TypeError, match=r"^decode takes token ids \(a list of ints\), got str$"):
        engine.decode("the cat")
    for text in (None, 5, ["the cat"]):
        with pytest.raises(TypeError, match=rf"^encode takes a text \(a string\), got {type(text).__name__}$"):
            engine.encode(text)
    ids = engine.encode("the cat")
    assert engine.decode(np.array(ids)) == engine.decode(ids) == engine.tokenizer.decode(ids)


def test_a_timeout_that_is_not_a_number_of_seconds_is_refused_up_front(engine):
    """result(timeout="5") failed with a TypeError from inside Python's threading code; NaN waited
    in a loop that never ended. Both are refused before any wait, for a finished request too."""
    h = engine.submit([5, 6], GREEDY.copy(max_new_tokens=2))
    for bad in ("5", True):
        message = f"timeout={bad!r} is not a number of seconds; give one (e.g. timeout=5.0), or None to wait for the end"
        with pytest.raises(TypeError) as e:
            h.result(timeout=bad)
        assert str(e.value) == message
        with pytest.raises(TypeError) as e:
            h.events(timeout=bad)
        assert str(e.value) == message
    with pytest.raises(ValueError, match=r"^timeout=nan is not a number of seconds"):
        h.result(timeout=float("nan"))
    assert len(h.result(timeout=60).token_ids) == 2 and h.result(timeout=0).token_ids == h.result().token_ids
    assert [t for ev in h.events(timeout=1) for t in ev.token_ids] == h.result().token_ids
    assert_idle_accounting(engine)


def test_a_timeout_past_what_threading_can_wait_waits_for_the_end(engine):
    """result(timeout=math.inf) (or 1e300), on a request not finished yet, failed inside Python's
    threading code with OverflowError "timestamp out of range for platform time_t"; such a timeout
    waits without limit, as None does."""
    for timeout in (math.inf, 1e300, threading.TIMEOUT_MAX * 2):
        gate = threading.Event()
        engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: the request is not finished when waited on
        h = engine.submit([5, 6], GREEDY.copy(max_new_tokens=2))
        threading.Timer(0.3, gate.set).start()
        assert len(h.result(timeout=timeout).token_ids) == 2
        gate.clear()
        engine.scheduler.call(lambda: gate.wait(120))
        h = engine.submit([5, 6], GREEDY.copy(max_new_tokens=2))
        threading.Timer(0.3, gate.set).start()
        assert [t for ev in h.events(timeout=timeout) for t in ev.token_ids] == h.result().token_ids
        assert len(h.result().token_ids) == 2
    assert_idle_accounting(engine)


def test_a_timeout_of_zero_or_less_does_not_wait_as_a_futures_does(engine):
    """result(timeout=-1) and events(timeout=-1) do what concurrent.futures does with it (a handle
    is a future's peer): no wait, so TimeoutError at once on a request not finished yet, and the
    result (the events there are) of a finished one. Checked against Future and as_completed."""
    from concurrent.futures import Future, as_completed

    pending, finished = Future(), Future()
    finished.set_result(7)
    for timeout in (-1, -0.5, 0):
        with pytest.raises(TimeoutError):
            pending.result(timeout=timeout)
        with pytest.raises(TimeoutError):
            list(as_completed([pending], timeout=timeout))
        assert finished.result(timeout=timeout) == 7
        assert list(as_completed([finished], timeout=timeout)) == [finished]
        gate = threading.Event()
        engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: the request is not finished when waited on
        h = engine.submit([5, 6], GREEDY.copy(max_new_tokens=2))
        # (the messages said "did not finish within -1 s", a wait that was never made)
        fix = "give a positive number of seconds to wait, or None to wait for the end"
        with pytest.raises(TimeoutError) as e:
            h.result(timeout=timeout)
        assert str(e.value) == (f"request {h.rid} did not finish yet, and timeout={timeout!r} does not wait (0 or "
                                f"less gives only a finished request's result); {fix}")
        with pytest.raises(TimeoutError) as e:
            next(h.events(timeout=timeout))
        assert str(e.value) == (f"no event for request {h.rid} yet, and timeout={timeout!r} does not wait (0 or "
                                f"less gives only the events there are); {fix}")
        with pytest.raises(TimeoutError) as e:  # (a wait that is made is named as one)
            h.result(timeout=0.01)
        assert str(e.value) == f"request {h.rid} did not finish within 0.01 s"
        gate.set()
        result = h.result()
        assert len(result.token_ids) == 2
        assert h.result(timeout=timeout) is result
        assert [t for ev in h.events(timeout=timeout) for t in ev.token_ids] == result.token_ids
    assert_idle_accounting(engine)


def test_a_list_of_prompts_where_one_prompt_is_taken_is_named_as_such(engine):
    """submit(["the cat", "a dog"]) (or stream, score, pin_prefix) said "a prompt is a string or a
    list of token ids (ints); item 0 is 'the cat'", as if the first prompt were a bad token id."""
    batch = "^one prompt is taken here .*, got a list of 2 prompts; pass them one at a time"
    for call in (engine.submit, engine.stream, lambda p: engine.score(p, 1), engine.pin_prefix):
        for prompts in (["the cat", "a dog"], [[5, 6], [7, 8]], iter(["the cat", "a dog"])):
            with pytest.raises(TypeError, match=batch):
                call(prompts)
    with pytest.raises(TypeError, match="^prompt 1 of the batch: one prompt is taken here"):
        engine.generate([[5, 6], [[7, 8], [9]]], GREEDY)
    assert_idle_accounting(engine)


def test_numpy_token_ids_are_a_prompt_not_a_batch(engine, hf):
    # a list of numpy integers (a tokenizer's array turned into a list) used to be read as a batch
    # of prompts and refused with "a prompt is a string or a list of token ids, got int64"
    import numpy as np

    ids = engine.encode("the red cat")
    np_ids = list(np.array(ids, dtype=np.int64))
    assert engine.generate(np_ids, GREEDY).token_ids == hf.greedy(ids, 8)
    assert engine.score(np_ids, 1) == pytest.approx(hf.token_logprobs(ids), abs=1e-4)
    batch = engine.generate([np_ids, [np.int32(t) for t in ids[:2]]], GREEDY)
    assert [r.token_ids for r in batch] == [hf.greedy(ids, 8), hf.greedy(ids[:2], 8)]
    with pytest.raises(ValueError, match=r"outside the vocabulary"):
        engine.generate([np.int64(10**6)], GREEDY)
    assert_idle_accounting(engine)


def test_score_pin_prefix_and_match_node_take_a_prompt_as_generate_does(engine, hf):
    """A text is encoded (score's was read one character per "id": "item 0 is 'h'"), any iterable
    of ids is read, and a number or a stray item is refused by name (they were raw "'int' object is
    not iterable" and int() errors)."""
    import numpy as np

    text = "the red cat"
    ids = engine.encode(text)
    want = hf.token_logprobs(ids)
    arrays = (np.array(ids), torch.tensor(ids), np.array(ids, dtype=np.uint32))
    for prompt in (text, ids, tuple(ids), iter(ids)) + arrays:
        assert engine.score(prompt, 1) == pytest.approx(want, abs=1e-4)
    assert engine.score(range(5, 9), 2) == pytest.approx(hf.token_logprobs([5, 6, 7, 8])[1:], abs=1e-4)
    for prompt in arrays:  # generate takes a 1-D array as one prompt of ids too
        assert engine.generate(prompt, GREEDY).token_ids == hf.greedy(ids, 8)
    # and a list of a tensor's 0-d items (it was "item 0 is tensor(5)"); a 0-d bool or float is no id
    assert engine.generate(list(torch.tensor(ids)), GREEDY).token_ids == hf.greedy(ids, 8)
    for bad, shown in ((torch.tensor(True), r"tensor\(True\)"), (torch.tensor(5.0), r"tensor\(5\.\)")):
        with pytest.raises(TypeError, match=rf"\(ints\); item 1 is {shown}$"):
            engine.generate([ids[0], bad], GREEDY)
    # a number, a 0-d array, bytes and sets are no id sequences (bytes were read as character codes,
    # a set in no order, a 0-d array raised numpy's "iteration over a 0-d array")
    for bad, name in ((5, "int"), (np.array(5), "a 0-d ndarray"), (torch.tensor(5), "a 0-d Tensor"), (b"hello", "bytes"),
                      ({ids[0], ids[1]}, "set"),
                      (np.array([ids, ids]), r"a 2-d ndarray; for a batch, pass a list of prompts \(list\(array\)\)")):
        for call in (lambda: engine.score(bad, 1), lambda: engine.pin_prefix(bad), lambda: engine.generate(bad)):
            with pytest.raises(TypeError, match=rf"^a prompt is a string or a list of token ids, got {name}$"):
                call()
    for bad in ([ids[0], "a"], np.array([1.0, 2.0])):
        with pytest.raises(TypeError, match=r"\(ints\); item [01] is ('a'|1\.0)$"):
            engine.score(bad, 1)
    for start in ("1", None, True, 1.0):
        with pytest.raises(TypeError, match=r"^start=.* must be an int"):
            engine.score(ids, start)
    with pytest.raises(ValueError, match=r"^score needs a prompt of at least 2 tokens: the first token has no logprob"):
        engine.score(ids[:1], 1)  # (it was "start=1 must be in [1, 1)", which no start fits)
    with pytest.raises(ValueError, match=r"^start=3 must be in \[1, 3\) for a prompt of 3 tokens$"):
        engine.score([5, 6, 7], 3)
    engine.flush_cache()
    handle = engine.pin_prefix(np.array(ids))
    node, cached = engine.match_node(np.array(ids))
    assert cached == len(ids) and engine.pinned_node_ids() == [node]
    assert engine.match_node([ids[0], np.int64(ids[1])])[1] == 2
    assert engine.match_node(torch.tensor(ids[:3]))[1] == 3
    with pytest.raises(TypeError, match=r"\(ints\); item 1 is 'a'$"):
        engine.match_node([ids[0], "a"])
    for bad, name in ((text, "str"), (5, "int"), (b"ab", "bytes"), (np.array(5), "ndarray")):
        with pytest.raises(TypeError, match=rf"match_node takes token ids .*, got {name}; for a text pass engine.encode"):
            engine.match_node(bad)
    engine.unpin(handle)
    assert_idle_accounting(engine)


def test_numpy_sampling_values_are_read_as_the_numbers_they_hold(engine, hf):
    # np.int64(3) was refused as "must be an integer >= 0", np.float32(0.0) as "must be a finite number"
    import numpy as np

    ids = engine.encode("the red cat")
    ref = hf.greedy(ids, 8)
    params = SamplingParams(temperature=np.float32(0.0), max_new_tokens=np.int64(5), seed=np.int64(2**62),
                            ignore_eos=np.bool_(False), stop_token_ids=[np.int64(ref[3])], top_k=np.int32(-1))
    r = engine.generate(ids, params)
    assert r.token_ids == ref[: ref.index(ref[3]) + 1] and r.finish_reason.matched == ref[3]
    with pytest.raises(ValueError, match=r"max_new_tokens=-1 is invalid"):
        engine.generate(ids, SamplingParams(max_new_tokens=np.int64(-1)))
    assert_idle_accounting(engine)


def test_numpy_scalars_inside_a_json_schema_are_read_as_the_values_they_hold(engine):
    """A numpy scalar inside a json_schema dict ("maximum": np.int64(4), an enum item np.str_("x"))
    was refused: "json_schema holds a value JSON cannot represent (Object of type int64 is not JSON
    serializable)". It is now read as the Python value it holds (params.python_value, at any depth),
    as every other field's numpy scalars are."""
    import numpy as np

    from lmnb_engine.params import python_value

    schema = {"type": "object", "required": ["n", "c"],
              "properties": {"n": {"type": "integer", "minimum": np.int64(3), "maximum": np.int64(4)},
                             "c": {"enum": [np.str_("x"), np.bool_(True)]}}}
    plain = {"type": "object", "required": ["n", "c"],
             "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 4}, "c": {"enum": ["x", True]}}}
    read = python_value(schema)
    assert read == plain and type(read["properties"]["n"]["maximum"]) is int
    assert type(read["properties"]["c"]["enum"][1]) is bool and python_value(plain) is plain  # (nothing to change)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, json_schema=schema)
    r = engine.generate("x", params)
    assert r.finish_reason.type == "stop", r
    value = json.loads(r.text)
    assert value["n"] in (3, 4) and value["c"] in ("x", True), value
    assert r.text == engine.generate("x", params.copy(json_schema=plain)).text
    assert_idle_accounting(engine)


def test_a_json_schema_dict_nested_too_deeply_is_refused_by_name_not_with_a_recursion_error(engine):
    """python_value, which reads numpy scalars at any depth, recursed per level: a dict schema some
    thousands of levels deep escaped Engine.generate as a RecursionError. It is refused at the
    call, in the words gen() and the server refuse it with (json_schema.TOO_DEEP)."""
    from lmnb_engine.params import SamplingParamsError

    deep, stops = {}, "x"
    for _ in range(3000):  # (built iteratively: a recursive build would recurse itself)
        deep, stops = {"not": deep}, [stops]
    too_deep = "JSON schema nests too deeply to check (a pattern's parentheses, or the schema itself); flatten it"
    for params, said in [
        (GREEDY.copy(json_schema=deep), f"SamplingParams.json_schema is invalid: {too_deep}"),
        (GREEDY.copy(stop=stops), "SamplingParams.stop is invalid: nests too deeply to read; flatten it"),
    ]:
        with pytest.raises(SamplingParamsError) as e:
            engine.generate("x", params)
        assert str(e.value) == said and e.value.field == said.split(".")[1].split(" ")[0]
    assert_idle_accounting(engine)
    assert engine.generate("x", GREEDY).token_ids  # still serving


def test_a_bad_prompt_in_a_batch_queues_nothing(engine):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate(["fine", ""], GREEDY)
    assert engine.cache_stats()["prompt_tokens"] == 0


def test_a_bad_option_of_one_prompt_of_a_batch_is_named_by_its_place_and_queues_nothing(engine, monkeypatch):
    from lmnb_engine.constrained import GrammarError
    from lmnb_engine.params import SamplingParamsError

    each = [GREEDY, GREEDY.copy(regex="[ab]{3}"), GREEDY.copy(top_p=0.0)]
    with pytest.raises(SamplingParamsError, match=r"^prompt 2 of the batch: SamplingParams.top_p=0.0 is invalid") as e:
        engine.generate(["the cat", "a dog", "one two"], each)
    assert e.value.field == "top_p"  # (a front end names its own field by it)
    too_long = [GREEDY, GREEDY.copy(max_new_tokens=engine.context_len)]
    with pytest.raises(ValueError, match=r"^prompt 1 of the batch: prompt of 2 tokens \+ max_new_tokens=512 exceeds"):
        engine.generate([[5, 6], [7, 8]], too_long)
    # a compile's failure is cached: the grammar cache raises the same error object for each request
    failed = GrammarError("the regex '[cd]{3}' cannot be completed by this vocabulary")

    def grammar(params, abandoned=None):
        if params.regex == "[cd]{3}":
            raise failed
        return None

    monkeypatch.setattr(engine, "_grammar", grammar)
    for _ in range(2):
        with pytest.raises(GrammarError) as e:
            engine.generate([[5, 6], [7, 8]], [GREEDY, GREEDY.copy(regex="[cd]{3}")])
        assert str(e.value) == "prompt 1 of the batch: the regex '[cd]{3}' cannot be completed by this vocabulary"
    assert str(failed) == "the regex '[cd]{3}' cannot be completed by this vocabulary"
    assert engine.cache_stats()["prompt_tokens"] == 0
    assert_idle_accounting(engine)


def test_a_lone_surrogate_is_refused_by_name_wherever_the_engine_takes_text(engine):
    """Each of these failed in the tokenizer's words ("TextEncodeInput must be Union[...]", a
    TypeError), and a stop string or stop_regex holding one was taken and could never match."""
    at = ("at position 1, which is no Unicode character (text decoded with errors='surrogateescape', or half of "
          "a \\ud83d\\ude00 pair); fix the text, e.g. text.encode('utf-8', 'replace').decode()")
    why = f"holds the lone surrogate '\\ud800' {at}"
    text = "a\ud800b"
    calls = {
        "encode": lambda: engine.encode(text),
        "generate": lambda: engine.generate(text, GREEDY),
        "stream": lambda: engine.stream(text, GREEDY),
        "submit": lambda: engine.submit(text, GREEDY),
        "score": lambda: engine.score(text, 1),
        "pin_prefix": lambda: engine.pin_prefix(text),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == f"the text 'a\\ud800b' {why}", name
    with pytest.raises(ValueError) as e:
        engine.generate(["fine", text], GREEDY)
    assert str(e.value) == f"prompt 1 of the batch: the text 'a\\ud800b' {why}"
    for params, said in [
        (GREEDY.copy(stop="x\ud800"), f"SamplingParams.stop is invalid: the stop string 'x\\ud800' {why}"),
        (GREEDY.copy(stop=["a", "x\ud800"]), f"SamplingParams.stop is invalid: the stop string (item 1) 'x\\ud800' {why}"),
        # a pattern is written as JSON, as the value before it and every other stop_regex error write it
        (GREEDY.copy(stop_regex="x\ud800"),
         f'SamplingParams.stop_regex="x\\ud800" is invalid: "x\\ud800" holds the lone surrogate "\\ud800" {at}'),
    ]:
        with pytest.raises(ValueError) as e:
            engine.generate("the cat", params)
        assert str(e.value) == said
    assert engine.cache_stats()["prompt_tokens"] == 0
    assert engine.generate("the cat", GREEDY).token_ids  # still serving


def test_abort_mid_decode_frees_everything(long_engine, hf):
    engine = long_engine
    h = engine.submit("the dog", LONG)
    events = h.events(timeout=60)
    for _ in range(3):
        next(events)
    assert h.abort()
    r = h.result(timeout=60)
    assert r.finish_reason.type == "abort" and "abort" in r.finish_reason.message
    assert 3 <= len(r.token_ids) < 16000
    assert not h.abort()  # already finished
    assert_idle_accounting(engine)
    p = engine.encode("the dog")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)
    assert_idle_accounting(engine)


def test_an_abort_given_no_rid_string_raises_and_names_the_fix(long_engine):
    """abort(handle), a handle passed for its rid, returned False (no such rid) and the request ran on
    to its end; abort(["x"]) raised "unhashable type: 'list'" from the scheduler thread."""
    engine = long_engine
    h = engine.submit("the dog", LONG)
    with pytest.raises(TypeError, match=r"^abort takes a request's rid, a string; got RequestHandle; call "
                                        r"handle.abort\(\), or abort\(handle.rid\)$"):
        engine.abort(h)
    for rid in (["x"], 5, None):
        with pytest.raises(TypeError, match=rf"^abort takes a request's rid, a string; got {type(rid).__name__}$"):
            engine.abort(rid)
    assert engine.abort(h.rid) is True
    assert h.result(timeout=60).finish_reason.type == "abort"
    assert_idle_accounting(engine)


def test_queue_abort_given_no_rid_string_raises_and_names_the_fix_as_abort_does(engine):
    """queue_abort(handle) (a handle passed for its rid) said only "got RequestHandle", without the
    fix abort names (call handle.abort(), or abort(handle.rid)); it checks its rid as abort does."""
    h = engine.submit("the dog", SamplingParams(max_new_tokens=4, temperature=0.0))
    with pytest.raises(TypeError, match=r"^abort takes a request's rid, a string; got RequestHandle; call "
                                        r"handle.abort\(\), or abort\(handle.rid\)$"):
        engine.queue_abort(h)
    for rid in (["x"], 5, None):
        with pytest.raises(TypeError, match=rf"^abort takes a request's rid, a string; got {type(rid).__name__}$"):
            engine.queue_abort(rid)
    assert h.result(timeout=60).finish_reason.type in ("length", "stop")  # (the request ran on)
    assert_idle_accounting(engine)


def test_closing_a_stream_early_aborts_the_request(long_engine):
    # (a request that ended before the close would leave the engine idle without any abort)
    engine = long_engine
    stream = engine.stream("a bird", LONG)
    next(stream)
    stream.close()
    assert_idle_accounting(engine)


def test_a_stream_interrupted_while_it_waits_ends_its_request_as_interrupted(long_engine):
    """Ctrl-C in a ``for ev in engine.stream(...)`` loop ended the request with "aborted by
    Engine.abort", which the caller never called; it ends as generate's interrupted wait does."""
    from lmnb_engine.outputs import ABORT_INTERRUPTED

    engine = long_engine
    stream = engine.stream("a bird", LONG)
    next(stream)
    handle = stream._handle

    def interrupted():
        raise KeyboardInterrupt  # (where a Ctrl-C lands: in the wait for the next event)
        yield

    stream._events = interrupted()
    with pytest.raises(KeyboardInterrupt):
        next(stream)
    r = handle.result(timeout=60)
    assert (r.finish_reason.type, r.finish_reason.message) == ("abort", ABORT_INTERRUPTED)
    assert_idle_accounting(engine)


def test_closing_or_dropping_a_stream_before_its_first_event_aborts_the_request(long_engine):
    # a generator's clean-up runs only once it has started: a stream closed or dropped before
    # the first next() left its request running to max_new_tokens
    engine, params = long_engine, LONG
    engine.stream("a bird", params).close()
    assert_idle_accounting(engine)
    stream = engine.stream("a fish", params)
    del stream
    assert_idle_accounting(engine)


def test_a_stream_collected_on_the_scheduler_thread_mid_step_aborts_it_after_the_step(engine, hf, monkeypatch):
    """The garbage collector may finalize a dropped, unclosed stream on the scheduler thread (the
    stream in a reference cycle, say through a stored exception's traceback), in the middle of a
    step. Its abort ran inline there: admitted and then freed inside the admission, the request
    failed the step ("internal error") and its KV slots leaked for good."""
    params = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    streams: list = []
    start = engine.scheduler._start

    def start_then_collect(req, match):  # the collection strikes right after the admission
        start(req, match)
        if streams:
            streams.pop().__del__()

    monkeypatch.setattr(engine.scheduler, "_start", start_then_collect)
    streams.append(engine.stream("a bird", params))
    handle = streams[0]._handle
    result = handle.result(timeout=60)
    assert result.finish_reason.type == "abort"
    assert result.finish_reason.message == "aborted by Engine.abort"
    assert_idle_accounting(engine)  # every slot free or evictable again
    monkeypatch.undo()
    p = engine.encode("the dog")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)


def test_abort_of_a_waiting_request(tiny_llama_long):
    with Engine(str(tiny_llama_long), max_total_tokens=LONG_KV + 1024, max_running_requests=1) as eng:
        first = eng.submit("one", LONG)  # (runs on: the second waits)
        second = eng.submit("two", GREEDY)
        assert second.abort()
        assert second.result(timeout=60).finish_reason.type == "abort"
        assert second.result().token_ids == []
        first.abort()
        assert_idle_accounting(eng)


class _ScanCountingList(list):
    """A waiting queue that counts the passes over it (membership tests, removals, iterations,
    concatenations): each is a scan of every request waiting."""
    scans = 0

    def __contains__(self, item):
        type(self).scans += 1
        return super().__contains__(item)

    def remove(self, item):
        type(self).scans += 1
        super().remove(item)

    def __iter__(self):
        type(self).scans += 1
        return super().__iter__()

    def __add__(self, other):
        type(self).scans += 1
        return list(self) + other


def test_aborting_waiting_samples_scans_the_waiting_queue_at_most_once(tiny_llama_long):
    # an abort scanned the waiting queue once to find the rid's samples and twice more per sample
    # (``in``, ``remove``): a server aborting each prompt of a disconnected client's batch of 5000
    # prompts at n=128 spent most of an hour on the scheduler thread, every other request waiting
    with Engine(str(tiny_llama_long), max_total_tokens=LONG_KV + 1024, max_running_requests=1) as eng:
        first = eng.submit("one", LONG)  # (runs on: the others wait)
        many = eng.submit("two", SamplingParams(max_new_tokens=8, n=40))
        other = eng.submit("three", GREEDY)
        scheduler = eng.scheduler

        def abort_counting() -> tuple[int, int, bool]:
            waiting = [r for r in scheduler.waiting if r.rid == many.rid]
            scheduler.waiting = _ScanCountingList(scheduler.waiting)
            _ScanCountingList.scans = 0
            live = eng._abort_here(many.rid)
            return len(waiting), _ScanCountingList.scans, live

        waiting, scans, live = eng.scheduler.call(abort_counting).result(timeout=60)
        assert waiting == 40 and live  # all 40 samples were waiting (one request runs at a time)
        assert scans <= 1, f"{scans} passes over the waiting queue to abort {waiting} samples"
        assert [r.finish_reason.type for r in many.result(timeout=60)] == ["abort"] * 40
        assert eng.cache_stats()["waiting_requests"] == 1  # the other request waits on, alone
        assert not many.abort()  # ended: a second abort finds nothing live
        first.abort()
        assert other.result(timeout=60).finish_reason.type != "abort"  # the request waiting beside them runs
        assert_idle_accounting(eng)


def test_flush_cache_right_after_an_abort_of_waiting_requests_flushes(tiny_llama):
    # An abort leaves the waiting requests it ends in the queue, finished, until the loop drops
    # them after its commands; a flush_cache among those commands saw them as waiting and did
    # nothing (False), though nothing waited or ran: here the add, the abort and the flush all
    # come in one pause of the loop, as a client's abort and flush do when the loop is busy
    with Engine(str(tiny_llama), max_total_tokens=1024) as eng:
        gate = threading.Event()
        eng.scheduler.call(lambda: gate.wait(120))  # the loop waits: the commands below queue up
        try:
            h = eng.submit("one", SamplingParams(max_new_tokens=4, n=3))
            aborted = eng.scheduler.call(lambda: eng._abort_here(h.rid))
            flushed: list = []
            flusher = threading.Thread(target=lambda: flushed.append(eng.flush_cache()))
            flusher.start()
            deadline = time.monotonic() + 60
            while eng.scheduler._inbox.qsize() < 3 and time.monotonic() < deadline:  # add, abort, flush
                time.sleep(0.01)
        finally:
            gate.set()
        flusher.join(60)
        assert aborted.result(timeout=60) is True
        assert [r.finish_reason.type for r in h.result(timeout=60)] == ["abort"] * 3
        assert flushed == [True]
        assert eng.cache_stats()["waiting_requests"] == 0
        assert_idle_accounting(eng)


def test_an_error_inside_a_step_fails_that_step_only(engine, hf, monkeypatch):
    monkeypatch.setattr(engine.runner, "forward", failing_at_call(engine.runner.forward, 2, "simulated kernel failure"))
    r = engine.generate("the cat", GREEDY)
    assert r.finish_reason.type == "abort"
    assert "simulated kernel failure" in r.finish_reason.message
    assert_idle_accounting(engine)
    p = engine.encode("the cat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)
    assert_idle_accounting(engine)


def test_a_failure_binding_a_request_to_its_table_row_gives_back_the_row_and_the_prefix_lock(engine, hf, monkeypatch):
    """The write of a cached prefix into a new request's table row raised: the request stayed
    waiting with the row taken and its prefix locked (neither released by recovery, the request
    being in no row of the step), and was started again on a second row the next step."""
    pool = engine.scheduler.req_to_token_pool
    rows = pool.available_size()
    engine.generate("the cat", GREEDY)  # cached: the next prompt's prefix is written into its row
    monkeypatch.setattr(pool, "write", failing_at_call(pool.write, 1, "simulated table write failure"))
    r = engine.generate("the cat sat", GREEDY)
    assert r.finish_reason.type == "abort"
    assert r.finish_reason.message == "internal error: RuntimeError: simulated table write failure"
    assert pool.available_size() == rows
    assert_idle_accounting(engine)  # (protected_tokens 0: no lock left on the cached prefix)
    p = engine.encode("the cat sat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)
    assert pool.available_size() == rows
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
def test_a_failed_prefill_does_not_fail_the_requests_decoding_beside_it(engine, hf, monkeypatch):
    """A step's failure aborted every request running when the step began, though a step that
    admits requests runs their prefill alone: a decoding request died of another one's prefill.
    ``b`` is submitted by ``a``'s listener at ``a``'s second event (the scheduler thread, the loop
    held until the listener is on), so ``b``'s prefill fails while ``a`` decodes, however slow
    this thread is (``a`` of 300 tokens could end before a ``b`` submitted from here came)."""
    real_forward = engine.runner.forward
    params = SamplingParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)
    heard = {"events": 0, "tokens": 0}  # a's, as its listener heard them
    b = []
    failed_at = []  # a's tokens, and whether a was done, when b's prefill failed

    def failing_prefill(batch):
        if b and not failed_at and batch.mode is ForwardMode.EXTEND:  # (b's: a decodes by then)
            failed_at.append((heard["tokens"], a.done))
            raise RuntimeError("simulated prefill failure")
        return real_forward(batch)

    def listener(ev):
        heard["events"] += 1
        heard["tokens"] += len(ev.token_ids)
        if heard["events"] == 2:
            b.append(engine.submit("a prompt about birds", params))

    monkeypatch.setattr(engine.runner, "forward", failing_prefill)
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: a's first event comes after subscribe
    a_ids = engine.encode("the cat sat on the mat")
    a = engine.submit(a_ids, params)
    a.subscribe(listener)
    gate.set()
    ra = a.result(timeout=60)
    rb = b[0].result(timeout=60)
    assert rb.finish_reason.type == "abort" and "simulated prefill failure" in rb.finish_reason.message
    assert len(failed_at) == 1 and 0 < failed_at[0][0] < 300 and failed_at[0][1] is False, failed_at  # mid-decode
    assert ra.finish_reason.type == "length" and ra.token_ids == hf.greedy_ignore_eos(a_ids, 300)
    assert_idle_accounting(engine)


def test_nan_logits_fail_that_request_only(engine, hf, monkeypatch):
    """A forward pass that yields NaN logits for one row (an fp16 overflow, say) aborts that row's
    request with a message naming the cause; the other request of the batch decodes as HF does."""
    real_forward = engine.runner.forward
    calls = {"decode": 0}

    def poisoned(batch):
        logits = real_forward(batch)
        if batch.mode is ForwardMode.DECODE and batch.batch_size == 2:
            calls["decode"] += 1
            if calls["decode"] == 3:
                logits = logits.clone()
                logits[0] = float("nan")
        return logits

    monkeypatch.setattr(engine.runner, "forward", poisoned)
    prompts = [engine.encode("the cat"), engine.encode("a dog ran")]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    # one submission: two submit() calls let the first request decode alone while this thread
    # waited for the CPU, and with no two-row decode step nothing was poisoned
    results = engine.generate(prompts, params)
    failed = [i for i, r in enumerate(results) if r.finish_reason.type == "abort"]
    assert len(failed) == 1, [r.finish_reason for r in results]
    bad, good = results[failed[0]], results[1 - failed[0]]
    n = len(bad.token_ids)  # the tokens before the poisoned step stand, as HF decodes them
    assert 3 <= n < 8 and bad.token_ids == hf.greedy_ignore_eos(prompts[failed[0]], 8)[:n]
    assert f"NaN or infinite logits at output token {n + 1} (model dtype float32)" in bad.finish_reason.message
    assert good.token_ids == hf.greedy_ignore_eos(prompts[1 - failed[0]], 8)
    assert_idle_accounting(engine)
    monkeypatch.setattr(engine.runner, "forward", real_forward)
    assert engine.generate(prompts[0], GREEDY).token_ids == hf.greedy(prompts[0], 8)
    assert_idle_accounting(engine)


def test_nan_prompt_logprobs_fail_the_request(engine, hf, monkeypatch):
    """``select`` scores choices by prompt logprobs: a NaN there would pick a choice at random."""
    real_forward = engine.runner.forward

    def poisoned(batch):
        logits = real_forward(batch)
        if batch.mode is ForwardMode.EXTEND:
            logits = logits.clone()
            logits[1] = float("nan")  # the row scoring the prompt's third token
        return logits

    monkeypatch.setattr(engine.runner, "forward", poisoned)
    prompt = engine.encode("the cat sat on the mat")
    r = engine.generate(prompt, GREEDY.copy(max_new_tokens=1, return_logprob=True, logprob_start_len=0))
    assert r.finish_reason.type == "abort"
    assert "NaN or infinite logits while scoring the prompt (model dtype float32)" in r.finish_reason.message
    assert r.token_ids == []
    assert_idle_accounting(engine)
    monkeypatch.setattr(engine.runner, "forward", real_forward)
    r = engine.generate(prompt, GREEDY.copy(return_logprob=True, logprob_start_len=0))
    assert r.finish_reason.type != "abort" and r.token_ids == hf.greedy(prompt, 8)
    assert_idle_accounting(engine)


def test_nonfinite_kv_of_a_failed_request_is_dropped_from_the_cache(engine, hf):
    """A NaN embedding row poisons every request containing that token. Its KV must not stay in
    the radix tree: attention spreads a NaN at one position to the others computed with it, and a
    clean request sharing the prefix would match that KV and fail too. KV computed earlier by a
    clean request stays cached."""
    system = engine.encode("the red cat and the blue dog sat in the house by the tree")
    good = system + engine.encode("a bird")
    ref = hf.greedy_ignore_eos(good, 6)
    poison = unused_token(engine, good, ref)
    bad = system + [poison] + engine.encode("ran")
    params = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    with nan_embedding(engine, poison):
        engine.flush_cache()  # cold: the failed request computes the shared prefix itself
        assert engine.generate(bad, params).finish_reason.type == "abort"
        r = engine.generate(good, params)
        assert r.finish_reason.type == "length" and r.token_ids == ref
        # warm: the prefix comes from the clean request, the failed one computes only its tail
        r = engine.generate(bad, params)
        assert r.finish_reason.type == "abort" and r.meta.cached_tokens == len(system)
        r = engine.generate(good, params)
        assert r.token_ids == ref and r.meta.cached_tokens == len(good) - 1  # the clean prefix stayed
        assert_idle_accounting(engine)


def test_a_prompt_chunk_with_nonfinite_kv_fails_before_it_is_shared(tiny_llama, hf):
    """Chunked prefill shares each chunk's KV at once. A chunk holding a NaN token fails its
    request right after that chunk (no logits would tell until the last one), so a request
    admitted meanwhile with the same clean start reads only clean KV."""
    with Engine(str(tiny_llama), max_total_tokens=1024, chunked_prefill_size=8) as eng:
        ids = eng.encode("the red cat and the blue dog sat in the house by the tree one two three four five six")
        clean = ids[:9] + eng.encode(" yes no")
        params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        ref = hf.greedy_ignore_eos(clean, 4)
        poison = unused_token(eng, ids, clean, ref)
        bad = (ids[:10] + [poison] + ids[10:])[:28]  # the NaN token in the second chunk (positions 8..15)
        real_forward, extends, late = eng.runner.forward, [0], []

        def forward(batch):
            if batch.mode is ForwardMode.EXTEND:
                extends[0] += 1
                if extends[0] == 2:  # while the second chunk runs: admitted once it is done
                    late.append(eng.submit(clean, params))
            return real_forward(batch)

        eng.runner.forward = forward
        with nan_embedding(eng, poison):
            r = eng.generate(bad, params)
        assert r.finish_reason.type == "abort"
        assert "NaN or infinite keys/values at positions 8..15 (model dtype float32)" in r.finish_reason.message
        c = late[0].result(timeout=60)
        assert c.finish_reason.type == "length" and c.token_ids == ref
        assert c.meta.cached_tokens == 8  # the clean first chunk stayed cached
        assert_idle_accounting(eng)


def test_a_prefill_only_request_with_nonfinite_kv_fails_and_leaves_no_kv(engine, hf):
    """max_new_tokens=0 (fork's prefix prefill, pin_prefix) samples nothing; its KV is checked."""
    ids = engine.encode("the red cat and the blue dog sat in the house")
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    poison = unused_token(engine, ids, hf.greedy_ignore_eos(ids, 4))
    bad = ids[:5] + [poison] + ids[5:]
    engine.flush_cache()
    with nan_embedding(engine, poison):
        r = engine.generate(bad, SamplingParams(max_new_tokens=0))
        assert r.finish_reason.type == "abort"
        assert f"keys/values at positions 0..{len(bad) - 1}" in r.finish_reason.message
        with pytest.raises(RuntimeError, match="could not compute the prefix to pin: the model produced NaN"):
            engine.pin_prefix(bad)
        # a cached clean prefix plus the NaN token alone: the check reads exactly the new slot
        assert engine.generate(ids, SamplingParams(max_new_tokens=0)).finish_reason.type == "length"
        r = engine.generate(ids + [poison], SamplingParams(max_new_tokens=0))
        assert r.meta.cached_tokens == len(ids) and r.finish_reason.type == "abort"
        assert f"keys/values at positions {len(ids)}..{len(ids)}" in r.finish_reason.message
    r = engine.generate(bad, params)  # the model is fine again, and nothing non-finite was kept
    assert r.finish_reason.type == "length" and r.token_ids == hf.greedy_ignore_eos(bad, 4)
    assert_idle_accounting(engine)


def test_a_constrained_request_failed_on_its_prompt_finishes_once(engine, monkeypatch):
    """A regex with a forced prefix drafts tokens (jump-forward) in the same step as the prompt's
    logprobs; a request failed on the latter is not verified, appended to or finished again."""
    real_forward = engine.runner.forward

    def poisoned(batch):
        logits = real_forward(batch)
        if batch.mode is ForwardMode.EXTEND:
            logits = logits.clone()
            logits[1] = float("nan")
        return logits

    monkeypatch.setattr(engine.runner, "forward", poisoned)
    h = engine.submit("the cat sat on the mat", SamplingParams(
        max_new_tokens=40, temperature=0, regex=r'\{"name": "[a-z]+", "age": [0-9]+\}',
        return_logprob=True, logprob_start_len=0))
    r = h.result(timeout=60)
    engine.scheduler.call(lambda: None).result(timeout=60)  # the step that failed it is over
    assert r.finish_reason.type == "abort" and "while scoring the prompt" in r.finish_reason.message
    assert [e.finished for e in h.events(timeout=5)] == [True] and r.token_ids == []
    monkeypatch.setattr(engine.runner, "forward", real_forward)
    assert_idle_accounting(engine)


def test_a_failed_jump_forward_on_arrival_fails_that_request_only(engine, monkeypatch):
    """A forced prefix is drafted when a constrained request arrives; a failure there was raised
    into the submission's future, which nobody reads: the batch's later requests were never
    queued and generate() waited forever."""
    real = engine.scheduler._jump_forward
    monkeypatch.setattr(engine.scheduler, "_jump_forward", failing_at_call(real, 1, "simulated grammar failure"))
    params = SamplingParams(max_new_tokens=12, temperature=0, regex=r'\{"a": [0-9]\}')
    results = []
    batch = threading.Thread(target=lambda: results.extend(engine.generate(["the cat", "the dog"], params)), daemon=True)
    batch.start()
    batch.join(60)
    assert not batch.is_alive(), "the batch's requests were never answered"
    first, second = results
    assert first.finish_reason.type == "abort" and "simulated grammar failure" in first.finish_reason.message
    assert re.fullmatch(r'\{"a": [0-9]\}', second.text)
    monkeypatch.setattr(engine.scheduler, "_jump_forward", real)
    assert_idle_accounting(engine)


def test_a_request_posted_while_the_engine_stops_is_aborted_not_left_waiting(tiny_llama):
    """The liveness check and the queueing of a command were not atomic with the stop: a command
    queued just after the stop had drained the queue was never answered (its caller waited forever).
    The late thread is held between its check and its put until the stop is queued (an event, where
    a sleep of 0.5 s made that order likely)."""
    import threading

    eng = Engine(str(tiny_llama), max_total_tokens=512)
    inbox = eng.scheduler._inbox

    entered, stop_queued = threading.Event(), threading.Event()

    class SlowInbox:  # holds the late thread's put until the stop is in the queue, before it
        def put(self, item):
            if threading.current_thread().name == "late":
                entered.set()
                assert stop_queued.wait(30)
            inbox.put(item)
            if item[0] == "stop":
                stop_queued.set()

        def get(self, *a, **k):
            return inbox.get(*a, **k)

        def get_nowait(self):
            return inbox.get_nowait()

    eng.scheduler._inbox = SlowInbox()
    out = {}
    late = threading.Thread(name="late", target=lambda: out.update(h=eng.submit([5, 6, 7], GREEDY)))
    late.start()
    assert entered.wait(30)  # the late thread has passed the check and waits before its put
    eng.shutdown()
    late.join(10)
    r = out["h"].result(timeout=10)
    assert r.finish_reason.type == "abort" and r.finish_reason.message == SHUT_DOWN


def test_shutdown_aborts_pending_work_and_is_idempotent(tiny_llama_long):
    eng = Engine(str(tiny_llama_long), max_total_tokens=LONG_KV)
    h = eng.submit("long", LONG)
    next(h.events(timeout=60))
    eng.shutdown()
    assert h.result(timeout=10).finish_reason.type == "abort"
    eng.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        eng.generate("x", GREEDY)
    # the handle's request ended with the shutdown: nothing left to abort (it raised RuntimeError)
    assert h.abort() is False


def _watch_inbox(sched, *kinds: str) -> dict:
    """Replace the scheduler's inbox by one that sets an event when a command of one of ``kinds``
    (``"stop"``, ``"add"``, ``"call"``: an abort is a call) is queued; returns the events by kind.
    With the loop held, it handles none meanwhile."""
    inbox, queued = sched._inbox, {kind: threading.Event() for kind in kinds}

    class WatchedInbox:
        def put(self, item):
            inbox.put(item)
            if item[0] in queued:
                queued[item[0]].set()

        def get(self, *a, **k):
            return inbox.get(*a, **k)

        def get_nowait(self):
            return inbox.get_nowait()

    sched._inbox = WatchedInbox()
    return queued


def _shutdown_queued_behind_a_held_loop(eng, command: str):
    """Start a long request (``LONG``) on ``eng`` (of ``tiny_llama_long``), hold the scheduler loop between two of its steps, and queue
    the engine's shutdown (on a thread of its own) behind the hold. Returns ``(running, gate,
    queued, stopper)``: the request's handle, the event that lets the loop go on, events set when
    the loop's inbox gets a ``"stop"`` (already set) or a ``command`` (e.g. ``"call"``, ``"add"``),
    and the shutdown's thread."""
    sched = eng.scheduler
    running = eng.submit("the cat", LONG)
    next(running.events(timeout=60))
    gate, held = threading.Event(), threading.Event()
    sched.call(lambda: (held.set(), gate.wait(120)))  # the loop waits here, between two steps
    assert held.wait(60)
    queued = _watch_inbox(sched, "stop", command)
    stopper = threading.Thread(target=eng.shutdown, daemon=True)
    stopper.start()
    assert queued["stop"].wait(60)
    return running, gate, queued, stopper


@pytest.mark.timeout(180)
def test_a_handle_abort_that_the_shutdown_overtakes_does_not_raise(tiny_llama_long):
    """RequestHandle.abort() asked while the engine shut down (the server's response that ended
    aborts its other requests as the server stops) raised the shutdown's RuntimeError, which
    `lmnb serve` logged as "Exception in ASGI application": the abort was queued behind the stop,
    which ended the request itself and failed the queued abort. The shutdown aborts the request, so
    the handle's abort returns False (nothing left for it to abort), as after the shutdown."""
    eng = Engine(str(tiny_llama_long), max_total_tokens=LONG_KV + 1024)
    running, gate, queued, stopper = _shutdown_queued_behind_a_held_loop(eng, "call")
    outcome = []

    def abort():
        try:
            outcome.append(running.abort())
        except Exception as e:  # noqa: BLE001 - the outcome under test
            outcome.append(e)

    aborter = threading.Thread(target=abort, daemon=True)
    aborter.start()
    assert queued["call"].wait(60)  # the abort is queued, behind the stop
    gate.set()
    stopper.join(60)
    aborter.join(60)
    assert not stopper.is_alive() and not aborter.is_alive()
    assert outcome == [False], outcome
    assert running.result(timeout=10).finish_reason.message == SHUT_DOWN


@pytest.mark.timeout(180)
def test_a_generate_accepted_just_before_the_shutdown_is_aborted_naming_the_shutdown(tiny_llama_long):
    """A generate queued behind another thread's stop (accepted: the stop not yet handled) ended
    with the bare message "engine shut down", where a later call raised "the engine is shut down;
    create a new Engine". It ends as the running request does, with an abort whose message says
    the engine shut down before the request finished; a call after the shutdown raises."""
    eng = Engine(str(tiny_llama_long), max_total_tokens=LONG_KV + 1024)
    running, gate, queued, stopper = _shutdown_queued_behind_a_held_loop(eng, "add")
    late = []
    caller = threading.Thread(target=lambda: late.append(eng.generate("a dog", GREEDY)), daemon=True)
    caller.start()
    assert queued["add"].wait(60)  # accepted, behind the stop
    gate.set()
    stopper.join(60)
    caller.join(60)
    assert not stopper.is_alive() and not caller.is_alive()
    assert late[0].finish_reason.type == "abort" and late[0].finish_reason.message == SHUT_DOWN
    assert late[0].token_ids == []
    assert running.result(timeout=10).finish_reason.message == SHUT_DOWN
    with pytest.raises(RuntimeError, match=r"^the engine is shut down; create a new Engine$"):
        eng.generate("a dog", GREEDY)


def test_a_constrained_generate_after_the_shutdown_raises_the_shutdown_error(tiny_llama):
    """A regex not compiled yet was compiled for an engine already shut down (a compiler started
    for nothing, never stopped), and one whose compiler had stopped raised GrammarCompileStopped
    (a ValueError: "bad input") where every other call raised the shutdown's RuntimeError."""
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    eng.shutdown()
    with pytest.raises(RuntimeError, match=r"^the engine is shut down; create a new Engine$"):
        eng.generate("the cat", SamplingParams(max_new_tokens=4, regex="[ab]{3}"))
    assert eng._grammar_backend is None  # no compiler started

    eng = Engine(str(tiny_llama), max_total_tokens=512)
    assert re.fullmatch("[ab]{3}", eng.generate("the cat", SamplingParams(max_new_tokens=4, regex="[ab]{3}")).text)
    eng.shutdown()
    with pytest.raises(RuntimeError, match=r"^the engine is shut down; create a new Engine$"):
        eng.generate("the cat", SamplingParams(max_new_tokens=4, regex="[cd]{3}"))


@pytest.mark.timeout(180)
def test_a_second_shutdown_waits_for_the_first_and_later_calls_raise(tiny_llama):
    """Engine.shutdown called while another thread's shutdown was still stopping the engine
    returned at once (the finalizer it calls was spent), with the engine still running: that
    thread's next generate was accepted and came back aborted, where a call after the shutdown
    raises RuntimeError."""
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    gate, held = threading.Event(), threading.Event()
    eng.scheduler.call(lambda: (held.set(), gate.wait(120)))  # the loop waits: the first stop is not handled yet
    assert held.wait(60)
    first = threading.Thread(target=eng.shutdown, daemon=True)
    first.start()
    while eng._finalizer.alive:  # (until the first shutdown has begun)
        first.join(0.01)
    raised = []

    def second():
        eng.shutdown()
        try:
            eng.generate("the cat", GREEDY)
        except RuntimeError as e:
            raised.append(str(e))

    caller = threading.Thread(target=second, daemon=True)
    caller.start()
    caller.join(0.5)
    assert caller.is_alive()  # it waits for the stop, as the first does
    gate.set()
    first.join(60)
    caller.join(60)
    assert not first.is_alive() and not caller.is_alive()
    assert raised == ["the engine is shut down; create a new Engine"]


@pytest.mark.timeout(180)
def test_calls_after_a_shutdown_made_by_a_listener_raise_the_shutdown_error(tiny_llama):
    """Engine.shutdown on the scheduler thread (a listener) only queued the stop, and the engine
    still counted as running until the step ended: the same listener's submit was accepted (to be
    aborted), and a constrained generate started a grammar compiler for the dead engine (its
    thread outlived it) and raised the refusal to wait on the scheduler thread."""
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    gate = threading.Event()
    # the loop waits until subscribe: an event that came before would be replayed to the listener on
    # this thread, whose shutdown then stops the engine here and which then waits out go_on
    eng.scheduler.call(lambda: gate.wait(120))
    h = eng.submit("the cat", SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True))
    raised, stopped, go_on = [], threading.Event(), threading.Event()

    def listener(ev):
        if raised:
            return
        eng.shutdown()
        for call in (lambda: eng.submit("a dog", GREEDY),
                     lambda: eng.generate("a dog", SamplingParams(max_new_tokens=4, regex="[ab]{3}"))):
            try:
                call()
            except Exception as e:  # noqa: BLE001 - what it raised is the test
                raised.append((type(e), str(e)))
        stopped.set()
        go_on.wait(120)  # the step goes on

    h.subscribe(listener)
    gate.set()
    assert stopped.wait(60)
    # a shutdown from another thread now (the listener's, spent) waits for the loop to end as well
    other = threading.Thread(target=eng.shutdown, daemon=True)
    other.start()
    other.join(0.5)
    assert other.is_alive()
    go_on.set()
    other.join(60)
    assert not other.is_alive() and not eng.scheduler._thread.is_alive() and h.done
    r = h.result(timeout=0)
    assert raised == [(RuntimeError, "the engine is shut down; create a new Engine")] * 2
    assert r.finish_reason.type == "abort" and r.finish_reason.message == SHUT_DOWN
    assert eng._grammar_backend is None  # no compiler started


@pytest.mark.parametrize("rid,error,match", [
    ("", ValueError, r"^rid='' must hold a character other than whitespace"),
    (" \t", ValueError, r"^rid=' \\t' must hold a character other than whitespace"),
    (7, TypeError, r"^rid=7 must be a string"),
])
def test_submit_refuses_a_rid_abort_could_not_name(engine, rid, error, match):
    # an empty rid was replaced by a random one, so abort("") never found the request
    with pytest.raises(error, match=match):
        engine.submit("the cat", SamplingParams(max_new_tokens=2), rid=rid)
    assert_idle_accounting(engine)


def test_a_submit_whose_grammar_fails_after_the_checks_leaves_its_rid_free(engine, monkeypatch):
    """submit takes the rid before it compiles the grammar (so that an abort meanwhile finds the
    request); a compile that fails then (a busy compiler: a transient error, "retry later") must
    give the rid back, or every retry with it is refused as in use by a running request, for good."""
    from lmnb_engine.constrained import GrammarCompileStopped

    params = SamplingParams(max_new_tokens=4, temperature=0.0, regex="[ab]{3}")
    engine.generate("the cat", params)  # (compiled and cached)
    backend, calls = engine._grammar_backend, []
    real_wait = backend.wait

    def wait(regex, source=None, abandoned=None):  # the first submission's compile fails
        calls.append(regex)
        if len(calls) == 1:
            raise GrammarCompileStopped("the grammar compiler is busy; retry later", transient=True)
        return real_wait(regex, source=source, abandoned=abandoned)

    monkeypatch.setattr(backend, "wait", wait)
    with pytest.raises(GrammarCompileStopped, match="busy"):
        engine.submit("the cat", params, rid="mine")
    r = engine.submit("the cat", params, rid="mine").result(timeout=60)
    assert r.rid == "mine" and re.fullmatch("[ab]{3}", r.text)
    assert engine.abort("mine") is False


def _submit_held_in_its_compile(engine, monkeypatch, rid: str):
    """Start ``engine.submit`` of a regex request with ``rid`` on a thread and return once it is
    compiling the grammar, held there until ``go`` is set: (the list its handle is appended to,
    ``go``, the thread)."""
    engine.generate("the cat", SamplingParams(max_new_tokens=2, regex="[ab]{3}"))  # (the compiler runs)
    backend = engine._grammar_backend
    real_wait, compiling, go = backend.wait, threading.Event(), threading.Event()

    def held_wait(regex, source=None, abandoned=None):
        compiling.set()
        assert go.wait(60)
        return real_wait(regex, source=source, abandoned=abandoned)

    monkeypatch.setattr(backend, "wait", held_wait)
    late = []
    params = SamplingParams(max_new_tokens=200, temperature=0.0, regex="[ab]{150}")
    submitter = threading.Thread(target=lambda: late.append(engine.submit("the cat", params, rid=rid)), daemon=True)
    submitter.start()
    assert compiling.wait(60)
    return late, go, submitter


@pytest.mark.timeout(180)
def test_an_abort_while_another_threads_submit_compiles_its_grammar_ends_the_request(engine, monkeypatch):
    """submit took the rid only once the regex had compiled: Engine.abort from another thread during
    the compile knew no such request, returned False, and the request then ran to its end."""
    late, go, submitter = _submit_held_in_its_compile(engine, monkeypatch, "late")
    returned = engine.abort("late")
    go.set()
    submitter.join(60)
    assert returned is True and len(late) == 1
    r = late[0].result(timeout=60)
    assert (r.finish_reason.type, r.finish_reason.message, r.token_ids) == ("abort", "aborted by Engine.abort", [])
    assert engine.abort("late") is False
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
def test_a_rid_aborted_while_its_submit_compiles_is_free_at_once_and_the_late_compile_queues_nothing(
        engine, monkeypatch):
    """The abort ended the request only once its compile was over and it reached the scheduler: till
    then a new submit with the same rid was refused as a duplicate, though abort had returned True.
    Now the abort ends it at once (as SGLang's ends a request waiting in its grammar queue); the
    late compile's post comes while the new request of that rid waits, and neither runs the old
    request nor touches the new one."""
    reference = engine.generate("a dog", GREEDY)
    late, go, submitter = _submit_held_in_its_compile(engine, monkeypatch, "same")
    assert engine.abort("same") is True
    blocked, hold = threading.Event(), threading.Event()
    engine.scheduler.call(lambda: (blocked.set(), hold.wait(60)))  # (the new request waits, queued, below)
    assert blocked.wait(60)
    new = engine.submit("a dog", GREEDY, rid="same")  # the aborted rid is free while its compile runs on
    go.set()
    submitter.join(60)  # the late compile's requests are posted behind the new request's
    hold.set()
    r = new.result(timeout=60)
    assert (r.rid, r.token_ids, r.text, r.finish_reason.type) == ("same", reference.token_ids, reference.text, "length")
    old = late[0]
    assert old is not new and old.rid == "same" and old.done
    ends = [e for e in old.events(timeout=60) if e.finished]
    assert len(ends) == 1 and len(list(old.events(timeout=60))) == 1  # one event: its abort, nothing run
    assert (old.result().finish_reason.type, old.result().finish_reason.message, old.result().token_ids) == (
        "abort", "aborted by Engine.abort", [])
    assert engine.abort("same") is False
    assert_idle_accounting(engine)


@pytest.mark.timeout(240)
def test_a_submit_aborted_while_its_grammar_compiles_returns_before_the_compile_ends(engine, monkeypatch):
    """The abort freed the rid at once, but the submit's caller stayed in the compile's wait until the
    compile ended (up to grammar_compile_timeout_s). Now it returns at once with the ended handle; the
    compile (held here) goes on, and its grammar, once there, serves the next request of the pattern."""
    from concurrent.futures import Future

    engine.generate("the cat", SamplingParams(max_new_tokens=2, regex="[ab]{3}"))  # (the compiler runs)
    backend = engine._grammar_backend
    monkeypatch.setattr(backend, "compile_timeout_s", 600)  # (the old wait outlasts the join below)
    real_submit, held, asked = backend.submit, Future(), threading.Event()

    def held_submit(regex):
        asked.set()
        return held

    monkeypatch.setattr(backend, "submit", held_submit)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, regex="[ab]{6}")
    late = []
    submitter = threading.Thread(target=lambda: late.append(engine.submit("the cat", params, rid="slow")),
                                 daemon=True)
    submitter.start()
    assert asked.wait(60)
    assert engine.abort("slow") is True
    submitter.join(60)
    assert not submitter.is_alive() and not held.done()  # back while the compile still runs
    r = late[0].result(timeout=0)
    assert (r.rid, r.finish_reason.type, r.finish_reason.message, r.token_ids) == (
        "slow", "abort", "aborted by Engine.abort", [])
    held.set_result(real_submit(backend.to_regex("[ab]{6}")).result(timeout=120))  # the compile ends late
    monkeypatch.setattr(backend, "submit", real_submit)
    again = engine.submit("the cat", params, rid="slow").result(timeout=60)
    assert again.finish_reason.type != "abort" and re.fullmatch("[ab]{6}", again.text)
    assert engine.abort("slow") is False
    assert_idle_accounting(engine)


@pytest.mark.parametrize("outcome", ["fails", "stops", "outlasted an earlier wait"])
def test_a_submit_aborted_as_its_compile_ends_returns_the_ended_handle_not_the_compiles_error(engine, monkeypatch,
                                                                                           outcome):
    """An abort that comes as the compile ends (both done by the time the wait looks) ended the
    request; its submit raised the compile's failure all the same, to a caller whose request was
    aborted (the docstring: it returns the ended handle). Here the abort comes from inside the
    compile's submission, and the compile has failed (a GrammarError) or stopped (a compile that
    outlasted its wait: GrammarCompileStopped) by the time the wait looks, or still runs after it
    outlasted an earlier request's wait (which fails a wait at once)."""
    from concurrent.futures import Future

    from lmnb_engine.constrained import GrammarCompileStopped, GrammarError

    engine.generate("the cat", SamplingParams(max_new_tokens=2, regex="[ab]{3}"))  # (the compiler runs)
    backend = engine._grammar_backend
    compiling = Future()
    if outcome == "fails":
        compiling.set_exception(GrammarError("no output of this vocabulary completes it"))
    elif outcome == "stops":
        compiling.set_exception(GrammarCompileStopped("the compile took too long", transient=True))

    def aborted_as_it_ends(regex):
        if outcome == "outlasted an earlier wait":
            backend._timed_out.add(regex)
            compiling.add_done_callback(lambda _: backend._timed_out.discard(regex))  # (as the wait adds it)
        assert engine.abort("late") is True
        return compiling

    monkeypatch.setattr(backend, "submit", aborted_as_it_ends)
    handle = engine.submit("the cat", SamplingParams(max_new_tokens=8, regex="[ab]{5}"), rid="late")
    r = handle.result(timeout=0)
    assert (r.rid, r.finish_reason.type, r.finish_reason.message, r.token_ids) == (
        "late", "abort", "aborted by Engine.abort", [])
    assert engine.abort("late") is False
    assert_idle_accounting(engine)
    compiling.cancel()  # (the engine is shared: its compile of the pattern is no longer outlasting a wait)


@pytest.mark.parametrize("call", ["submit", "generate"])
def test_an_interrupt_once_the_request_is_queued_ends_it_and_leaves_the_engine_idle(long_engine, monkeypatch, call):
    """A KeyboardInterrupt that came after the scheduler's post had queued the request, but before
    submit returned its handle (or generate began to wait), unregistered the handle: the request ran
    on to its end with no one able to read it or abort it by its handle, and its rid was free for a
    second request while it ran."""
    from lmnb_engine.outputs import ABORT_INTERRUPTED

    engine = long_engine  # (the request runs while the interrupt's abort is posted: it must not end first)
    real_submit, queued = engine.scheduler.submit, []

    def submit_then_interrupted(reqs):  # (Ctrl-C lands just after the requests went in)
        real_submit(reqs)
        queued.append(engine._handles[reqs[0].rid])
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.scheduler, "submit", submit_then_interrupted)
    params = LONG
    with pytest.raises(KeyboardInterrupt):
        if call == "submit":
            engine.submit("the cat", params, rid="ctrl-c")
        else:
            engine.generate("the cat", params)
    monkeypatch.undo()
    (handle,) = queued
    assert handle.done  # ended before the interrupt left the call
    r = handle.result()
    assert (r.finish_reason.type, r.finish_reason.message) == ("abort", ABORT_INTERRUPTED)
    assert len(r.token_ids) < 16000
    assert_idle_accounting(engine)
    assert len(engine.submit("the cat", GREEDY, rid=handle.rid).result(timeout=60).token_ids) == 8  # its rid is free


@pytest.mark.parametrize("call", ["submit", "generate"])
@pytest.mark.parametrize("at", ["_make_reqs", "_register"])
def test_an_interrupt_before_the_post_leaves_nothing_registered(engine, monkeypatch, call, at):
    """A KeyboardInterrupt just after _make_reqs had registered the handle (as _make_reqs returned,
    before submit's try, or before generate's list took it) left the handle registered and unfinished
    for good: nothing was queued to end it, and its rid stayed "in use". The registration is now the
    first step of the try that withdraws it (_register); an interrupt just after it unregisters it."""
    real, made = getattr(engine, at), []

    def then_interrupted(*args, **kwargs):  # (Ctrl-C lands just after the step)
        out = real(*args, **kwargs)
        made.append(out[0] if at == "_make_reqs" else args[0][0])
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, at, then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        if call == "submit":
            engine.submit("the cat", GREEDY, rid="ctrl-c")
        else:
            engine.generate("the cat", GREEDY)
    monkeypatch.undo()
    (handle,) = made
    assert not handle.done and engine.abort(handle.rid) is False  # never queued, and not found
    assert engine.cache_stats()["prompt_tokens"] == 0
    assert_idle_accounting(engine)
    assert len(engine.submit("the cat", GREEDY, rid=handle.rid).result(timeout=60).token_ids) == 8  # its rid is free


@pytest.mark.parametrize("made", [False, True])
def test_an_interrupt_as_pin_prefix_posts_its_pin_leaves_no_pin_behind(engine, monkeypatch, made):
    """A KeyboardInterrupt that came once pin_prefix had posted its pin to the scheduler, but before
    its wait for the pin began (as Scheduler.call returned), left the pin made with no caller
    holding its handle: a prefix never evictable again. ``made``: the interrupt comes once the
    scheduler has made the pin, or (the scheduler held in a step meanwhile) before."""
    real_call, gate = engine.scheduler.call, threading.Event()

    def pin_call_then_interrupted(fn):  # (Ctrl-C lands just after the pin's post)
        if not fn.__qualname__.startswith("Engine._pin."):
            return real_call(fn)
        if not made:
            real_call(lambda: gate.wait(30))
        future = real_call(fn)
        if made:
            future.result(60)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.scheduler, "call", pin_call_then_interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.pin_prefix("the cat sat on the mat")
    finally:
        gate.set()
    monkeypatch.undo()
    engine.scheduler.call(lambda: None).result(60)  # (after the pin, and the release a caller posted)
    assert engine.cache_stats()["pinned_prefixes"] == 0
    assert_idle_accounting(engine)


@pytest.fixture()
def marked_ctrl_c():
    """``interrupt_main_when`` with ``marked_only`` (the SIGINT marked for Python to act on, as one
    is that lands while the main thread is on its way into a wait), under Python's own SIGINT
    handler, which raises ``KeyboardInterrupt``."""
    import signal

    from helpers_lang import interrupt_main_when

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda ready: interrupt_main_when(ready, marked_only=True)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("call", ["result", "events", "cache_stats", "pin_prefix"])
def test_a_ctrl_c_that_lands_as_a_wait_for_the_scheduler_begins_stops_the_wait_at_once(engine, marked_ctrl_c,
                                                                                         monkeypatch, call):
    """A SIGINT that lands while the main thread is on its way into a lock's wait is only marked,
    and Python acts on it when the wait ends. A handle's result(), a loop over its events, and a
    call the scheduler answers between its steps (Engine._call: cache_stats, %lm stats,
    flush_cache, ...; pin_prefix's wait for its pin) each waited in one lock wait, so such a stop
    came only once the scheduler had answered: here once a step held for 30 s had ended (a long
    prefill's, a first kernel compile's). Those waits now wake every
    lmnb_engine.waits.MARKED_STOP_POLL_S to act on a marked stop."""
    from helpers_lang import in_a_threading_wait, main_thread_blocked_in

    real_call, gate, held, ended = engine.scheduler.call, threading.Event(), threading.Event(), threading.Event()

    def hold_the_scheduler():
        held.set()
        gate.wait(30)
        ended.set()

    def held_before_the_pin(fn):
        if fn.__qualname__.startswith("Engine._pin."):
            real_call(hold_the_scheduler)
        return real_call(fn)

    if call == "pin_prefix":
        monkeypatch.setattr(engine.scheduler, "call", held_before_the_pin)
    else:
        real_call(hold_the_scheduler)
        assert held.wait(30)
    handle = engine.submit("the cat", GREEDY) if call in ("result", "events") else None  # (queued behind the step)
    try:
        with marked_ctrl_c(lambda: held.is_set() and main_thread_blocked_in(in_a_threading_wait)):
            with pytest.raises(KeyboardInterrupt):
                if call == "result":
                    handle.result()
                elif call == "events":
                    for _ in handle.events():
                        pass
                elif call == "cache_stats":
                    engine.cache_stats()
                else:
                    engine.pin_prefix("the cat sat on the mat")
        assert not ended.is_set()  # stopped while the scheduler was still in its step
    finally:
        gate.set()
    monkeypatch.undo()
    if handle is not None:
        assert len(handle.result(timeout=60).token_ids) == 8  # (the stopped wait left the request as it was)
    engine.scheduler.call(lambda: None).result(60)  # (after the step, the pin, and its release)
    assert engine.cache_stats()["pinned_prefixes"] == 0
    assert_idle_accounting(engine)


@pytest.mark.parametrize("call", ["generate", "submit"])
def test_a_ctrl_c_that_lands_as_a_wait_for_a_grammar_compile_begins_stops_the_wait_at_once(engine, marked_ctrl_c,
                                                                                             monkeypatch, call):
    """As the scheduler's waits: a regex request's wait for its grammar's compile (up to
    grammar_compile_timeout_s, 60 s) stopped for a SIGINT that landed as it began only once the
    compile had ended (here it ends, cancelled, after 30 s), and submit's (which also ends early
    for an abort) too. It is now waited for in slices."""
    from concurrent.futures import Future

    from helpers_lang import in_a_threading_wait, main_thread_blocked_in

    engine.generate("the cat", SamplingParams(max_new_tokens=2, regex="[ab]{3}"))  # (the compiler runs)
    compiling, finished = Future(), threading.Event()

    def end_the_compile():  # (after 30 s, which the old wait outlasted, or once the test is done)
        finished.wait(30)
        compiling.cancel()

    monkeypatch.setattr(engine._grammar_backend, "submit", lambda regex: compiling)
    watchdog = threading.Thread(target=end_the_compile, daemon=True)
    watchdog.start()
    params = SamplingParams(max_new_tokens=8, regex="[ab]{5}")
    try:
        with marked_ctrl_c(lambda: main_thread_blocked_in(in_a_threading_wait)):
            with pytest.raises(KeyboardInterrupt):
                if call == "generate":
                    engine.generate("the cat", params)
                else:
                    engine.submit("the cat", params, rid="compiling")
        assert not compiling.done()  # stopped while the compile still ran
    finally:
        finished.set()
        watchdog.join()
    monkeypatch.undo()
    assert engine.abort("compiling") is False  # nothing was queued, nor left registered
    assert_idle_accounting(engine)


def test_a_second_ctrl_c_while_the_first_ones_abort_waits_behind_a_step_stops_that_wait_at_once(engine, marked_ctrl_c,
                                                                                                monkeypatch):
    """A Ctrl-C stops generate's wait for its result at once; generate then waits for the scheduler
    to end its requests (Engine._withdraw), which comes only between steps. A second Ctrl-C during
    that wait, landing as it began, was acted on only when the step had ended (here one held for
    30 s: a long prefill's, a first kernel compile's), the notebook's stop button dead meanwhile.
    That wait is now sliced: the second press stops it at once, and the requests still end,
    aborted, once the step is over (the abort was posted before the wait), leaving the engine
    idle and serving."""
    from lmnb_engine import engine as engine_module

    from helpers_lang import called_from, in_a_threading_wait, main_thread_blocked_in

    gate, held, ended = threading.Event(), threading.Event(), threading.Event()

    def hold_the_scheduler():
        held.set()
        gate.wait(30)
        ended.set()

    def in_the_withdraw(stack) -> bool:
        return called_from(stack, "_withdraw", engine_module.__file__)

    registered = []
    real_register = engine._register
    monkeypatch.setattr(engine, "_register", lambda handles: (registered.extend(handles), real_register(handles))[1])
    engine.scheduler.call(hold_the_scheduler)
    assert held.wait(30)
    first = lambda: main_thread_blocked_in(lambda f: in_a_threading_wait(f) and not in_the_withdraw(f))  # noqa: E731
    second = lambda: main_thread_blocked_in(lambda f: in_a_threading_wait(f) and in_the_withdraw(f))  # noqa: E731
    try:
        with marked_ctrl_c(second), marked_ctrl_c(first):
            with pytest.raises(KeyboardInterrupt):
                engine.generate("the cat", GREEDY)
        assert not ended.is_set()  # stopped while the scheduler was still in its step
    finally:
        gate.set()
    monkeypatch.undo()
    _ended_by_the_interrupt(engine, registered)
    assert len(engine.generate("the cat", GREEDY).token_ids) == 8


@pytest.mark.parametrize("call", ["generate", "submit", "stream"])
def test_a_second_ctrl_c_just_before_the_first_ones_abort_is_posted_still_ends_the_requests(engine, marked_ctrl_c,
                                                                                           monkeypatch, call):
    """A Ctrl-C in generate's wait (or a stream's, or in submit once it may have queued its
    request) has it post the end of its requests (Engine._withdraw). A second Ctrl-C that came
    before that post (a double press, microseconds apart) raised out of the clean-up before the
    post: the request, queued, ran to its end for no one (submit's caller never got its handle).
    The second press is now held until the end is posted, then raised (it skips the wait for the
    end). It is sent just before the post (signal.raise_signal: Python's handler runs at once);
    the first once the request is queued (generate, submit) or once the main thread waits for its
    events; the scheduler is held meanwhile, so that the request cannot have ended by itself."""
    import signal

    from helpers_lang import in_a_threading_wait, main_thread_blocked_in

    gate, held = threading.Event(), threading.Event()
    engine.scheduler.call(lambda: (held.set(), gate.wait(30)))
    assert held.wait(30)
    registered = []
    real_register, real_submit, real_call = engine._register, engine.scheduler.submit, engine.scheduler.call
    monkeypatch.setattr(engine, "_register", lambda handles: (registered.extend(handles), real_register(handles))[1])

    def submit_then_ctrl_c(reqs):
        real_submit(reqs)
        signal.raise_signal(signal.SIGINT)  # the first press, once the request is queued

    def ctrl_c_then_call(fn):
        monkeypatch.setattr(engine.scheduler, "call", real_call)
        signal.raise_signal(signal.SIGINT)  # the second, as the first one's end is about to be posted
        return real_call(fn)

    try:
        if call in ("generate", "submit"):
            monkeypatch.setattr(engine.scheduler, "submit", submit_then_ctrl_c)
            monkeypatch.setattr(engine.scheduler, "call", ctrl_c_then_call)
            with pytest.raises(KeyboardInterrupt):  # (Python's handler: marked_ctrl_c's)
                getattr(engine, call)("the cat", GREEDY)
        else:
            events = engine.stream("the cat", GREEDY)
            monkeypatch.setattr(engine.scheduler, "call", ctrl_c_then_call)
            with marked_ctrl_c(lambda: main_thread_blocked_in(in_a_threading_wait)), pytest.raises(KeyboardInterrupt):
                next(events)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (put back)
    finally:
        gate.set()
    monkeypatch.undo()
    assert _ended_by_the_interrupt(engine, registered).token_ids == []  # (ended before the held scheduler ran it)


def _ended_by_the_interrupt(engine, registered: list):
    """The one request ``registered`` (its handle), once it ended: aborted as interrupted, the
    engine idle after it, every KV slot and lock back (``assert_idle_accounting``)."""
    from lmnb_engine.outputs import ABORT_INTERRUPTED

    (handle,) = registered
    r = handle.result(timeout=60)
    assert (r.finish_reason.type, r.finish_reason.message) == ("abort", ABORT_INTERRUPTED)
    engine.scheduler.call(lambda: None).result(60)  # (after the step and the requests' end)
    assert_idle_accounting(engine)
    return r


def test_later_interrupts_held_passes_every_press_to_a_handler_there_before_that_does_not_raise():
    """LaterInterruptsHeld holds the presses after one its handler there before raised for; one
    that records a press and returns (a kernel's, lmnb's held_interrupts') gets every press, and
    is put back after; with Python's own, the second press is held, then raised by release()."""
    import signal

    from lmnb_engine.later_interrupts import LaterInterruptsHeld

    calls = []
    record = lambda signum, frame: calls.append(signum)  # noqa: E731
    previous = signal.signal(signal.SIGINT, record)
    try:
        with LaterInterruptsHeld() as hold:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            hold.release()  # (nothing held: nothing raised)
        assert calls == [signal.SIGINT, signal.SIGINT] and signal.getsignal(signal.SIGINT) is record
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with LaterInterruptsHeld() as hold:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # (held)
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            with pytest.raises(KeyboardInterrupt):
                hold.release()
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("where", ["__enter__", "__exit__"])
def test_a_first_ctrl_c_that_lands_as_later_interrupts_held_begins_or_ends_still_puts_the_handler_back(where):
    """A first press that landed as the block ended (Python runs a pending handler as __exit__
    starts, and in signal.signal's own check) raised out of __exit__ before the handler was put
    back; one that landed in __enter__ once the hold's handler was set raised out of __enter__, and
    a with statement whose __enter__ raised runs no __exit__. Either way LaterInterruptsHeld's
    handler stayed, armed to hold presses, and swallowed every later Ctrl-C of the process. A
    trace function raises the signal as __exit__ starts, or at __enter__'s last line (its handler
    set), as a press pending there is run."""
    import signal
    import sys

    from lmnb_engine.later_interrupts import LaterInterruptsHeld

    code = getattr(LaterInterruptsHeld, where).__code__
    last_line = max(line for _, _, line in code.co_lines() if line is not None)

    def press(frame):
        sys.settrace(None)
        frame.f_trace = None
        signal.raise_signal(signal.SIGINT)

    def in_enter(frame, event, arg):
        if event == "line" and frame.f_lineno == last_line:
            press(frame)
        return in_enter

    def trace(frame, event, arg):
        if event != "call" or frame.f_code is not code:
            return None
        if where == "__exit__":
            press(frame)
            return None
        return in_enter

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sys.settrace(trace)
            with LaterInterruptsHeld():
                pass
        sys.settrace(None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):  # (a later Ctrl-C raises, as Python's handler does)
            signal.raise_signal(signal.SIGINT)
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, previous)


def test_a_batch_whose_later_prompt_cannot_be_made_leaves_nothing_registered(engine, monkeypatch):
    """generate made the batch's requests prompt by prompt; when a later prompt's failed (here the
    tensor-parallel check found a worker rank dead), the call raised, but the earlier prompts'
    handles stayed registered and unfinished, for good."""

    class RankDiesMidBatch:  # (a TensorParallelGroup's check, alive for the first prompt only)
        calls = 0

        def check_alive(self) -> None:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("tensor-parallel rank 1 has exited: this engine cannot run; shut it down "
                                   "and create a new Engine")

    with monkeypatch.context() as m:
        m.setattr(engine, "_tp_group", RankDiesMidBatch())
        with pytest.raises(RuntimeError, match="^tensor-parallel rank 1 has exited"):
            engine.generate(["the cat", "a dog", "one two"], GREEDY)
    assert engine.cache_stats()["prompt_tokens"] == 0  # nothing of the batch was queued
    assert_idle_accounting(engine)
    assert len(engine.generate(["the cat", "a dog"], GREEDY)) == 2


def test_a_batch_made_as_the_engine_shuts_down_raises_and_leaves_nothing_registered(tiny_llama, monkeypatch):
    """The shutdown came between making a batch's requests and queueing them: generate raised the
    shutdown's error, but the batch's handles stayed registered, unfinished."""
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    real_make, made = eng._make_reqs, []

    def make_then_shut_down(*args, **kwargs):  # (the last prompt made, another thread's shutdown comes)
        made.append(real_make(*args, **kwargs))
        if len(made) == 2:
            eng.shutdown()
        return made[-1]

    monkeypatch.setattr(eng, "_make_reqs", make_then_shut_down)
    with pytest.raises(RuntimeError, match="^the engine is shut down; create a new Engine$"):
        eng.generate(["the cat", "a dog"], GREEDY)
    assert len(made) == 2 and [h for h in eng._handles.values() if not h.done] == []


@pytest.mark.timeout(180)
def test_a_constrained_generate_whose_compile_the_shutdown_stops_raises_the_shutdown_error(tiny_llama):
    eng = Engine(str(tiny_llama), max_total_tokens=512)
    eng.generate("the cat", SamplingParams(max_new_tokens=4, regex="[ab]{3}"))  # (the compiler runs)
    backend = eng._grammar_backend
    real_wait, entered, go = backend.wait, threading.Event(), threading.Event()

    def held_wait(regex, source=None, abandoned=None):  # the compile of the call below outlasts the shutdown
        entered.set()
        go.wait(120)
        return real_wait(regex, source=source, abandoned=abandoned)

    backend.wait = held_wait
    raised = []

    def call():
        try:
            eng.generate("the cat", SamplingParams(max_new_tokens=4, regex="[cd]{3}"))
        except Exception as e:  # noqa: BLE001 - what it raised is the test
            raised.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert entered.wait(60)
    eng.shutdown()
    go.set()
    caller.join(60)
    assert not caller.is_alive() and len(raised) == 1
    assert type(raised[0]) is RuntimeError and str(raised[0]) == "the engine is shut down; create a new Engine"


@pytest.mark.timeout(180)
def test_a_listener_that_aborts_its_request_at_its_first_event_ends_it(engine, hf):
    """A listener runs on the scheduler thread, where Engine.abort ran at once, in the middle of the
    step: at the request's first event (sent before the step puts the request among the running
    ones) it found nothing to abort, returned False, and the request ran on to its end."""
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: the first event comes after subscribe
    other = engine.submit("a dog", GREEDY)
    h = engine.submit("the cat", SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True))
    returned = []

    def listener(ev):
        if not returned:
            with engine._lock:  # (as when the garbage collector closes a dropped stream inside a listener's submit)
                returned.append((threading.current_thread() is engine.scheduler._thread, h.abort()))

    h.subscribe(listener)
    gate.set()
    r = h.result(timeout=60)
    assert returned == [(True, True)]
    assert r.finish_reason.type == "abort" and r.finish_reason.message == "aborted by Engine.abort"
    assert len(r.token_ids) < 200
    p = engine.encode("a dog")
    assert other.result(timeout=60).token_ids == hf.greedy(p, 8)  # the other request, untouched
    assert h.abort() is False and engine.abort(h.rid) is False
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["listener", "thread"])
def test_an_abort_of_a_request_another_thread_is_submitting_ends_it(engine, where):
    """Engine.abort of a request whose submit was under way on another thread (its rid taken, its
    requests not yet queued): from a listener it returned True, but the abort it queued came
    before the requests and found nothing, so the request ran on to its end; from another thread
    it returned False, the request running on too. Both now end the request as it arrives."""
    registered, go = threading.Event(), threading.Event()
    post = engine.scheduler.submit

    def held_post(reqs):  # the submitting thread, stopped between taking the rid and queueing
        if reqs[0].rid == "late":
            registered.set()
            assert go.wait(60)
        post(reqs)

    engine.scheduler.submit = held_post
    late = []
    submitter = threading.Thread(target=lambda: late.append(engine.submit(
        "the cat", SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True), rid="late")), daemon=True)
    submitter.start()
    assert registered.wait(60)
    returned = []
    if where == "listener":
        gate = threading.Event()
        engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: the first event comes after subscribe
        other = engine.submit("a dog", GREEDY)

        def listener(ev):
            if not returned:
                returned.append(engine.abort("late"))
                go.set()  # (its abort is queued now: the requests come after it)

        other.subscribe(listener)
        gate.set()
        assert other.result(timeout=60).finish_reason.type != "abort"
    else:
        returned.append(engine.abort("late"))
        go.set()
    submitter.join(60)
    r = late[0].result(timeout=60)
    assert returned == [True]
    assert (r.finish_reason.type, r.finish_reason.message, r.token_ids) == ("abort", "aborted by Engine.abort", [])
    assert engine.abort("late") is False
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
def test_flush_cache_from_a_listener_at_the_first_event_refuses_while_the_request_runs(engine, hf):
    """A listener runs on the scheduler thread, mid-step; at a request's first event the step's
    new requests are in no queue yet, so flush_cache flushed (True) while that request ran."""
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: the first event comes after subscribe
    p = engine.encode("the cat")
    h = engine.submit(p, GREEDY)
    flushed = []
    h.subscribe(lambda ev: flushed.append(engine.flush_cache()) if not flushed else None)
    gate.set()
    assert h.result(timeout=60).token_ids == hf.greedy(p, 8)
    assert flushed == [False]
    assert engine.flush_cache() is True  # idle: it flushes
    assert_idle_accounting(engine)


@pytest.mark.timeout(180)
def test_check_invariants_from_a_listener_mid_step_counts_the_steps_new_requests(engine, hf):
    """A listener runs on the scheduler thread, mid-step; at a request's first event the step's new
    requests are not among the running ones yet, so their KV was counted nowhere and
    check_invariants raised "KV accounting broken" (free + evictable + protected + held short of
    the pool size by their slots) while nothing was."""
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: both requests start in one step
    ps = [engine.encode("the cat"), engine.encode("a dog sat on the mat")]
    hs = [engine.submit(p, GREEDY) for p in ps]
    checked = []

    def listener(ev):
        try:
            engine.check_invariants()
            checked.append(engine.cache_stats()["held_tokens"] > 0)
        except AssertionError as e:
            checked.append(str(e))

    for h in hs:
        h.subscribe(listener)
    gate.set()
    assert [h.result(timeout=60).token_ids for h in hs] == [hf.greedy(p, 8) for p in ps]
    assert checked[0] is True and set(checked) <= {True, False}  # (every event: no broken accounting)
    assert_idle_accounting(engine)


@pytest.mark.timeout(240)
def test_a_stream_collected_while_the_scheduler_thread_posts_a_command_does_not_wedge_it(engine, hf):
    """The garbage collector can run on the scheduler thread at any allocation, also inside
    Scheduler._post (a listener's abort or submit), under its lock; a dropped stream it finalizes
    there aborts its request by posting too, and waited for that lock, held by its own thread:
    the engine froze. (The stream's close is called where the collector would call it.)"""
    gate = threading.Event()
    engine.scheduler.call(lambda: gate.wait(120))  # the loop waits: both requests start together
    long = SamplingParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)
    dropped = engine.stream("a dog", long)
    target = engine.submit("a cat", long)
    p = engine.encode("the cat")
    h = engine.submit(p, GREEDY)
    sched, inbox = engine.scheduler, engine.scheduler._inbox

    class CollectingInbox:  # the collector finalizes the dropped stream inside the listener's post
        def put(self, item):
            if sched.on_loop_thread and item[0] == "call":
                sched._inbox = inbox
                dropped.close()
            inbox.put(item)

        def get(self, *a, **k):
            return inbox.get(*a, **k)

        def get_nowait(self):
            return inbox.get_nowait()

    aborted = []
    h.subscribe(lambda ev: aborted.append(engine.abort(target.rid)) if not aborted else None)
    sched._inbox = CollectingInbox()
    gate.set()
    assert h.result(timeout=60).token_ids == hf.greedy(p, 8)
    assert aborted == [True]
    for other in (target, dropped._handle):
        r = other.result(timeout=60)
        assert r.finish_reason.type == "abort" and r.finish_reason.message == "aborted by Engine.abort"
    assert_idle_accounting(engine)


def test_a_failed_clean_up_rebuilds_the_kv_memory_and_the_engine_goes_on(engine, hf, monkeypatch):
    """When a failed step's requests cannot even be released, the pools are rebuilt empty: every
    request that held KV fails, and the engine serves the next request correctly."""
    monkeypatch.setattr(engine.runner, "forward", failing_at_call(engine.runner.forward, 2, "simulated kernel failure"))
    monkeypatch.setattr(engine.scheduler, "_release", failing_at_call(engine.scheduler._release, 1, "simulated leak"))
    r = engine.generate("the cat", GREEDY)
    assert r.finish_reason.type == "abort" and "simulated kernel failure" in r.finish_reason.message
    monkeypatch.undo()
    assert_idle_accounting(engine)
    assert engine.runner.kv_pool.available_size() == engine.runner.max_total_tokens  # a fresh, empty pool
    p = engine.encode("the cat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)


def test_a_finished_request_whose_clean_up_fails_is_answered_and_the_memory_rebuilt(engine, hf, monkeypatch):
    """A request's own release failing as it finished (finish reason set, KV not returned) was
    skipped by the recovery as finished: its handle waited forever and its KV leaked."""
    monkeypatch.setattr(engine.scheduler, "_release", failing_at_call(engine.scheduler._release, 1, "simulated leak"))
    r = engine.submit("the cat", GREEDY).result(timeout=60)
    assert r.finish_reason.type == "abort" and "simulated leak" in r.finish_reason.message
    monkeypatch.undo()
    assert_idle_accounting(engine)
    assert engine.runner.kv_pool.available_size() == engine.runner.max_total_tokens  # rebuilt, empty
    p = engine.encode("the cat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)


def test_an_abort_whose_clean_up_fails_still_ends_the_handle(long_engine, monkeypatch):
    """Engine.abort raised the release's error, but the request, already marked finished and out
    of the running list, was never answered: its handle waited forever, even after shutdown."""
    engine = long_engine
    h = engine.submit("the cat", LONG)
    next(h.events(timeout=60))
    monkeypatch.setattr(engine.scheduler, "_release", failing_at_call(engine.scheduler._release, 1, "simulated leak"))
    with pytest.raises(RuntimeError, match="simulated leak"):
        h.abort()
    r = h.result(timeout=10)
    assert r.finish_reason.type == "abort" and "simulated leak" in r.finish_reason.message


def test_an_abort_whose_clean_up_fails_for_one_sample_still_aborts_the_others(long_engine, monkeypatch):
    """The abort stopped at the first sample whose release raised: the request's other sample ran
    on until the memory rebuild failed it with "KV memory was reset", not with the abort asked for."""
    engine = long_engine
    h = engine.submit("the cat", LONG.copy(temperature=0.8, n=2))
    next(h.events(timeout=60))
    monkeypatch.setattr(engine.scheduler, "_release", failing_at_call(engine.scheduler._release, 1, "simulated leak"))
    with pytest.raises(RuntimeError, match="simulated leak"):
        h.abort()
    monkeypatch.undo()
    messages = sorted(r.finish_reason.message for r in h.result(timeout=60))
    assert messages == ["aborted by Engine.abort", "internal error: RuntimeError: simulated leak"]
    assert_idle_accounting(engine)


def test_an_abort_whose_clean_up_fails_rebuilds_the_kv_memory_and_the_engine_goes_on(long_engine, hf, monkeypatch):
    """The aborted request's KV, neither returned nor held by anyone, leaked: idle, free +
    evictable + protected fell short of the pool by its tokens (the prompt and those generated). It is
    rebuilt as after a failed step: the other running request fails with the reset, the pools start empty."""
    engine, params = long_engine, LONG
    h, other = engine.submit("the cat", params), engine.submit("a dog", params)
    next(h.events(timeout=60))
    next(other.events(timeout=60))
    monkeypatch.setattr(engine.scheduler, "_release", failing_at_call(engine.scheduler._release, 1, "simulated leak"))
    with pytest.raises(RuntimeError, match="simulated leak"):
        h.abort()
    monkeypatch.undo()
    reset = other.result(timeout=60).finish_reason
    assert_idle_accounting(engine)
    assert reset.message == "internal error: KV memory was reset"
    assert engine.runner.kv_pool.available_size() == engine.runner.max_total_tokens  # rebuilt, empty
    p = engine.encode("the cat")
    assert engine.generate(p, GREEDY).token_ids == hf.greedy(p, 8)


def test_a_release_failing_at_shutdown_still_stops_the_engine(tiny_llama_long, monkeypatch):
    """A request's release raising while shutdown aborted everyone lost the stop command: shutdown
    waited forever, the loop ran on, and that request was never answered."""
    eng = Engine(str(tiny_llama_long), max_total_tokens=2 * LONG_KV + 1024)  # (two run, the third waits)
    hs = [eng.submit(f"the cat {i}", LONG) for i in range(3)]
    next(hs[0].events(timeout=60))
    monkeypatch.setattr(eng.scheduler, "_release", failing_at_call(eng.scheduler._release, 1, "simulated leak"))
    stopper = threading.Thread(target=eng.shutdown, daemon=True)
    stopper.start()
    stopper.join(20)
    assert not stopper.is_alive() and not eng.scheduler.alive
    for h in hs:
        r = h.result(timeout=10)
        assert r.finish_reason.type == "abort" and r.finish_reason.message == SHUT_DOWN


@pytest.mark.timeout(120)
def test_an_abort_whose_clean_up_fails_and_no_new_pools_can_be_made_stops_the_engine(long_engine, monkeypatch):
    """The rebuild after a failed abort is the failed step's: tried once more, then the engine
    stops, answering everyone, rather than running on over pools it could not make."""
    engine, params = long_engine, LONG
    h, other = engine.submit("the cat", params), engine.submit("a dog", params)
    next(h.events(timeout=60))
    next(other.events(timeout=60))
    sched, tries = engine.scheduler, []

    def out_of_memory():
        tries.append(1)
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(sched, "_release", failing_at_call(sched._release, 1, "simulated leak"))
    monkeypatch.setattr(engine.runner, "reset_pools", out_of_memory)
    with pytest.raises(RuntimeError, match="simulated leak"):
        h.abort()
    sched._thread.join(30)
    assert not sched.alive and len(tries) == 2
    assert other.result(timeout=10).finish_reason.message == "internal error: KV memory was reset"


def test_the_recovery_frees_the_old_pools_before_it_makes_new_ones(engine, monkeypatch):
    """The rebuild after a failed clean-up (``Scheduler._rebuild_memory``) made the new
    request-to-token table while the old one still stood (the runner and the scheduler's prefix
    cache referred to it; in the recovery after a failed step, its traceback to the step's batch
    too): two tables at once (on a GPU, two device copies and two host copies), where memory is
    tight enough for the recovery to fail. Each new pool is made only once the old pools' tensors
    hold no memory, though something still refers to them (here the test); the engine runs on."""
    import lmnb_engine.model_runner as model_runner

    runner, made = engine.runner, []
    first = engine.generate("the cat", GREEDY)
    old = [runner.req_to_token_pool.host, runner.req_to_token_pool.req_to_token,
           *runner.kv_pool.k_buffer, *runner.kv_pool.v_buffer]
    assert all(t.untyped_storage().nbytes() > 0 for t in old)

    def recording(pool_class):
        class Recording(pool_class):
            def __init__(self, *args):
                made.append((pool_class.__name__, sum(t.untyped_storage().nbytes() for t in old)))
                super().__init__(*args)
        return Recording

    monkeypatch.setattr(model_runner, "TokenToKVPool", recording(model_runner.TokenToKVPool))
    monkeypatch.setattr(model_runner, "ReqToTokenPool", recording(model_runner.ReqToTokenPool))
    engine.scheduler.call(engine.scheduler._rebuild_memory).result(timeout=30)
    assert made == [("TokenToKVPool", 0), ("ReqToTokenPool", 0)]
    assert engine.generate("the cat", GREEDY).token_ids == first.token_ids


def test_a_recovery_that_cannot_make_new_pools_stops_the_engine_and_answers_everyone(tiny_llama, monkeypatch):
    """Out of memory while rebuilding the pools (a GPU whose memory another process took) killed
    the loop thread: requests waiting behind the failed one were never answered."""
    eng = Engine(str(tiny_llama), max_total_tokens=512, max_running_requests=1)
    try:
        runner, sched = eng.runner, eng.scheduler
        monkeypatch.setattr(runner, "forward", failing_at_call(runner.forward, 2, "simulated kernel failure"))
        monkeypatch.setattr(sched, "_release", failing_at_call(sched._release, 1, "simulated leak"))
        monkeypatch.setattr(runner, "reset_pools", failing_at_call(runner.reset_pools, 1, "CUDA out of memory"))
        gate = threading.Event()
        eng.scheduler.call(lambda: gate.wait(60))  # both queued before the first's failing step (else a race)
        first = eng.submit("the cat", GREEDY)
        second = eng.submit("the dog", GREEDY)  # waits: one running request at a time
        gate.set()
        r1, r2 = first.result(timeout=60), second.result(timeout=60)
        assert "simulated kernel failure" in r1.finish_reason.message
        assert r2.finish_reason.type == "abort"
        assert r2.finish_reason.message == (
            "internal error, and the engine could not recover: RuntimeError: CUDA out of memory")
        sched._thread.join(10)
        assert not sched.alive
        with pytest.raises(RuntimeError, match=r"shut down \(internal error, and the engine could not recover: "
                                               r"RuntimeError: CUDA out of memory\); create a new Engine"):
            eng.generate("x", GREEDY)
    finally:
        eng.shutdown()


def test_a_stop_regex_that_backtracks_catastrophically_aborts_its_own_request(engine, monkeypatch):
    # "(x|x)+(?<=y)x" searched on n x's takes ~2**n steps (a lookbehind: stop_automaton does not read it;
    # a match ends with an "x", which each token is, so find searches it);
    # it was searched on the scheduler's thread on every token, which stalled every request for
    # seconds, then hours (found by a review helper).
    # The first search past the limit aborts every sample of the request (they share the pattern).
    from lmnb_engine import stop_matcher

    monkeypatch.setattr(stop_matcher, "REGEX_TIMEOUT_S", 0.02)
    params = SamplingParams(max_new_tokens=24, temperature=0.0, regex="x{24}", stop_regex="(x|x)+(?<=y)x", n=3)
    results = engine.generate("the cat", params)
    for r in results:
        assert r.finish_reason.type == "abort"
        assert 'stop_regex "(x|x)+(?<=y)x" took over 0.02 s' in r.finish_reason.message  # (as JSON, as its refusals)
        assert "catastrophic backtracking" in r.finish_reason.message
        assert r.finish_reason.field == "stop_regex"  # (the caller's pattern: the OpenAI routes end the choice)
        assert 0 < len(r.token_ids) < 24  # given up part-way, not at the end
        assert r.text == ""  # what was streamed: all was held back, as the pattern might match from the start
    assert engine.generate("the cat", GREEDY).finish_reason.type in ("length", "stop")
    assert_idle_accounting(engine)


def test_a_stop_regex_whose_search_at_the_outputs_end_runs_too_long_aborts_its_request(engine, monkeypatch):
    # A match of "[\s\S]+\Z" is a stop only where the output ends (here at a stop token: the end a
    # max tokens cut makes is none a match reads), so it is searched there, after the last token
    # (Scheduler._stop_at_end). Where that search ran past REGEX_TIMEOUT_S (made to here: the regex
    # package's search raises TimeoutError), the request finished with all of its text, the part
    # held back as a possible stop too; now it is aborted naming the pattern, its text cut where
    # the stream stood, as a search that runs too long at a token does.
    from lmnb_engine import stop_matcher

    real_find = stop_matcher.StopStringMatcher.find

    def find(self, text, new_from, at_end=False, marks=()):
        if not at_end:
            return real_find(self, text, new_from, marks=marks)

        def timing_out(*args, **kwargs):
            raise TimeoutError

        with monkeypatch.context() as patch:
            patch.setattr(stop_matcher, "_new_match", timing_out)
            return real_find(self, text, new_from, at_end=True, marks=marks)

    # (the greedy output's first token after the first that is no earlier one: the stop token)
    ids = engine.generate("the cat", SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)).token_ids
    k = next(k for k in range(1, 6) if ids[k] not in ids[:k])
    monkeypatch.setattr(stop_matcher.StopStringMatcher, "find", find)
    params = SamplingParams(max_new_tokens=6, temperature=0.0, stop_regex=r"[\s\S]+\Z", stop_token_ids=[ids[k]],
                            ignore_eos=True)
    r = engine.generate("the cat", params)
    assert r.finish_reason.type == "abort" and r.finish_reason.field == "stop_regex"
    assert r.finish_reason.message.startswith('stop_regex "[\\\\s\\\\S]+\\\\Z" took over')
    assert r.token_ids == ids[: k + 1]
    assert r.text == ""  # all was held back: the match may begin at the first character
    assert_idle_accounting(engine)


@pytest.mark.parametrize("pattern, constraint", [
    (r"a{e<=1}b", "{e<=1}"), (r"(?:color){e<=1}", "{e<=1}"), (r"x(?:ab){i<=1,d<=1}", "{i<=1,d<=1}"),
    (r"(?e)ab{e<=1}", "{e<=1}"), (r"z(?:abc){2i+2d+1s<=4}y", "{2i+2d+1s<=4}"), (r"q(?:ab){e}", "{e}"),
    (r"(?:stop){e<=1:[a-z]}", "{e<=1:[a-z]}"), ("(?x)a{ e <= 1 }b", "{e<=1}"), ("(?x:a{ e<=1\n})b", "{e<=1}"),
    # (a "#" outside the (?x:...) is a literal, which the constraint follows: "(?x:" anywhere made every "#" a comment)
    ("(?x:a)b#{e<=1}", "{e<=1}"),
])
def test_a_stop_regex_with_a_fuzzy_constraint_is_refused_naming_it(pattern, constraint):
    # The regex package picks a fuzzy match by its own best-match rule, not leftmost as the output
    # grows: for a{e<=1}b the matcher showed the "x" of "xa", which "xab" makes the start of a stop
    # ("xb" matches with one substitution), and with (?e) it missed stops (found by a helper's fuzz).
    # Under the VERBOSE flag a constraint may hold spaces, { e <= 1 }, and is still one (it was taken).
    # Refused where the call is made (SamplingParams, so the server; gen(); a cell's option)
    import regex

    import lmnb as sgl
    from lmnb_engine.params import stop_regex_problem

    # (that it is fuzzy, by the regex package: the pattern matches a text one edit off its exact one)
    exact = {r"a{e<=1}b": "ab", r"(?:color){e<=1}": "color", r"x(?:ab){i<=1,d<=1}": "xab", r"(?e)ab{e<=1}": "ab",
             r"z(?:abc){2i+2d+1s<=4}y": "zabcy", r"q(?:ab){e}": "qab", r"(?:stop){e<=1:[a-z]}": "stop",
             "(?x)a{ e <= 1 }b": "ab", "(?x:a{ e<=1\n})b": "ab", "(?x:a)b#{e<=1}": "ab#"}[pattern]
    assert regex.fullmatch(pattern, exact) and regex.fullmatch(pattern, exact[:-1] + "q" + exact[-1:]) is not None
    with pytest.raises(ValueError) as e:
        SamplingParams(stop_regex=["ok", pattern]).validate()
    assert f"holds the fuzzy constraint {constraint}," in str(e.value) and "alternatives" in str(e.value)
    with pytest.raises(ValueError, match=re.escape(f"holds the fuzzy constraint {constraint},")):
        sgl.gen("x", stop_regex=pattern)
    assert stop_regex_problem(pattern).startswith(json.dumps(pattern))


@pytest.mark.parametrize("pattern", [r"\{e<=1\}", r"[{e}]x", r"a{2,3}", r"x{ e }", r"[]{e}]x", r"ab\{e\}",
                                     "(?#{e<=1})ab", "(?x)ab # {e<=1}\n", "(?x)a{2, 3}", r"a(?#\){e<=1})b",
                                     "(?x:a)b{ e<=1 }"])
def test_a_stop_regex_with_braces_that_are_no_fuzzy_constraint_is_taken(pattern):
    # (a comment's braces, (?#...) or after # under VERBOSE, constrain nothing; a "\)" does not end a comment, so
    # "a(?#\){e<=1})b" was refused for a constraint in its comment; spaced braces outside a (?x:...) are literal
    # text, which "(?x:a)b{ e<=1 }" was refused for)
    import regex

    from lmnb_engine.params import stop_regex_problem

    compiled = regex.compile(pattern)  # (no error tolerance: a text one character off does not match)
    exact = next(t for t in ["{e<=1}", "{x", "aa", "x{ e }", "]x", "ab{e}", "ab", "a{2,3}", "ab{ e<=1 }"]
                 if compiled.fullmatch(t))
    assert compiled.fullmatch("Q" + exact[1:]) is None
    assert stop_regex_problem(pattern) is None
