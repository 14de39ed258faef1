"""Sampler: greedy, penalties (vs HF logits processors / hand arithmetic), top-k/top-p/min-p
support and frequencies, per-request seeds, min_new_tokens, the grammar hook and logprobs."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from lmnb_engine.params import SamplingParams
from lmnb_engine.request import Req
from lmnb_engine.sampler import apply_penalties, sample

PROBS = [0.5, 0.3, 0.1, 0.06, 0.04]


def req(seed: int = 0, prompt=(0,), output=(), **params) -> Req:
    r = Req("r", 0, list(prompt), SamplingParams(**params), tokenizer=None, emit=lambda e: None, seed=seed)
    r.output_ids = list(output)
    return r


def test_greedy_takes_the_argmax_per_row():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 2.9, 0.0]])
    out = sample(logits, [req(temperature=0.0), req(top_k=1, temperature=0.7)], frozenset())
    assert out.token_ids == [1, 0]


def test_a_top_k_above_the_vocabulary_keeps_all_of_it():
    """2**70 overflowed the top_k tensor, and the step failed for every request in the batch."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    off = sample(logits, [req(seed=i, top_k=-1) for i in range(3)], frozenset()).token_ids
    assert sample(logits, [req(seed=i, top_k=2**70) for i in range(3)], frozenset()).token_ids == off
    assert sample(logits, [req(seed=i, top_k=50) for i in range(3)], frozenset()).token_ids == off


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1e-7])
def test_a_temperature_below_sglangs_epsilon_is_greedy(temperature):
    """logits / 1e-300 overflowed to inf and softmax made NaN: the 'sample' was noise."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    out = sample(logits, [req(seed=i, temperature=temperature) for i in range(4)], frozenset())
    assert out.token_ids == logits.argmax(-1).tolist() and not out.bad_rows


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(2, 12)
    prompts, outputs = [[1, 2, 3], [4]], [[3, 5], [7, 7, 8]]
    rows = [req(prompt=p, output=o, temperature=0.0, repetition_penalty=1.7) for p, o in zip(prompts, outputs)]
    expected = torch.cat([
        RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([p + o]), logits[i : i + 1].clone())
        for i, (p, o) in enumerate(zip(prompts, outputs))
    ])
    penalised = logits.clone()
    apply_penalties(penalised, rows)
    torch.testing.assert_close(penalised, expected)
    # and the sampler uses it: token 2 (logit 1.0, seen in the prompt) drops to 0.01 < 0.5
    strong = torch.tensor([[0.5, 0.0, 1.0, 0.0]])
    assert sample(strong, [req(prompt=[2], temperature=0.0, repetition_penalty=100.0)], frozenset()).token_ids == [0]


@pytest.mark.parametrize("penalty", [1e-40, 1e-300])
def test_a_tiny_repetition_penalty_keeps_the_logits_finite(penalty):
    """1e-40 overflowed a seen token's positive logit to inf in float32 (1e-300, 0 in float32, also
    made a zero logit 0 / 0 = NaN): softmax was NaN and every draw took token 0. The seen token
    with the positive logit now holds float32's largest value, so every draw takes it."""
    logits = torch.tensor([[1.0, 0.5, 3.0, 0.0, -1.0]])
    rows = [req(seed=s, prompt=[2, 3, 4], temperature=1.0, repetition_penalty=penalty) for s in range(6)]
    penalised = logits.clone()
    apply_penalties(penalised, rows[:1])
    assert penalised[0, :4].tolist() == [1.0, 0.5, torch.finfo(torch.float32).max, 0.0]
    assert -1e-30 < penalised[0, 4].item() <= 0.0
    assert sample(logits.expand(6, 5), rows, frozenset()).token_ids == [2] * 6


def test_repetition_penalty_is_in_sglangs_range():
    for ok in (1e-300, 0.5, 2.0):
        SamplingParams(repetition_penalty=ok).validate()
    for bad in (0.0, -1.0, 2.5, float("inf")):
        with pytest.raises(ValueError, match=re.escape(f"SamplingParams.repetition_penalty={bad!r} is invalid: must "
                                                       "be in (0, 2]")):
            SamplingParams(repetition_penalty=bad).validate()


FIELDS = ("max_new_tokens, min_new_tokens, temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty, "
          "repetition_penalty, stop, stop_token_ids, ignore_eos, skip_special_tokens, seed, n, return_logprob, "
          "top_logprobs_num, logprob_start_len, regex, json_schema, stop_regex, extra, logit_bias")


@pytest.mark.parametrize("keywords, said", [
    (["max_tokens"], "; did you mean 'max_new_tokens'? (OpenAI's max_tokens is max_new_tokens here, as in SGLang)"),
    (["temprature"], "; did you mean 'temperature'?"),
    (["max_new_token", "temprature"], "; did you mean 'max_new_token' → 'max_new_tokens', 'temprature' → 'temperature'?"),
    (["bogus"], ""),
    # peers' names for stop strings: 'stop' (difflib offered 'stop_regex', or for stop_words 'stop_token_ids')
    (["stop_str"], "; did you mean 'stop'?"),
    (["stop_strings"], "; did you mean 'stop'?"),
    (["stop_words"], "; did you mean 'stop'?"),
    (["num_return_sequences"], "; did you mean 'n'?"),  # (HF generate's name)
])
def test_an_unknown_keyword_names_the_field_meant_and_the_fields(keywords, said):
    """It was Python's bare "__init__() got an unexpected keyword argument 'max_tokens'", then
    "... 'temprature' (did you mean 'temperature'?); its fields: ...", naming the first keyword
    alone, where gen() names each and ends "; did you mean 'temperature'?": the same form now
    (suggest.did_you_mean), after the fields."""
    import lmnb

    with pytest.raises(TypeError) as e:
        SamplingParams(**{keyword: 3 for keyword in keywords})
    named = (f"an unexpected keyword argument {keywords[0]!r}" if len(keywords) == 1 else
             f"unexpected keyword arguments {', '.join(map(repr, keywords))}")
    assert str(e.value) == f"SamplingParams() got {named}; its fields: {FIELDS}{said}"
    if keywords == ["temprature"]:  # (a name both have: gen()'s refusal ends alike)
        with pytest.raises(TypeError) as at_gen:
            lmnb.gen("x", temprature=3)
        assert str(at_gen.value) == f"gen() got {named}{said}"
    assert SamplingParams(7, top_k=2).max_new_tokens == 7  # (positional and known keywords as before)


def test_frequency_and_presence_penalties_by_hand():
    # token 0: logit 1.0, generated twice -> 1.0 - 2*0.4 - 0.3 = -0.1; token 1: 0.5, unseen -> 0.5
    logits = torch.tensor([[1.0, 0.5, 0.0]])
    r = req(output=[0, 0], temperature=0.0, frequency_penalty=0.4, presence_penalty=0.3)
    assert sample(logits, [r], frozenset()).token_ids == [1]
    r = req(output=[0, 0], temperature=0.0, frequency_penalty=0.1, presence_penalty=0.1)  # 1-.2-.1 = .7
    assert sample(logits, [r], frozenset()).token_ids == [0]


@pytest.mark.parametrize(
    "params,support",
    [
        (dict(top_k=3), {0, 1, 2}),
        (dict(top_p=0.7), {0, 1}),  # sorted cumulative mass before each token: 0, .5, .8, ...
        (dict(top_p=0.85), {0, 1, 2}),
        (dict(min_p=0.25), {0, 1}),  # threshold 0.25 * 0.5
        (dict(), {0, 1, 2, 3, 4}),
    ],
)
def test_filters_keep_the_right_support_with_renormalised_frequencies(params, support):
    logits = torch.log(torch.tensor([PROBS]))
    draws = 4000
    counts = [0] * 5
    rows = [req(seed=s, temperature=1.0, **params) for s in range(draws)]
    for t in sample(logits.expand(draws, 5), rows, frozenset()).token_ids:
        counts[t] += 1
    assert {t for t, c in enumerate(counts) if c} == support
    mass = sum(PROBS[t] for t in support)
    for t in support:
        expected = PROBS[t] / mass
        assert abs(counts[t] / draws - expected) < 4 * math.sqrt(expected * (1 - expected) / draws) + 1e-9


def test_temperature_sharpens_the_distribution():
    logits = torch.log(torch.tensor([[0.6, 0.4]]))
    draws = 4000
    rows = [req(seed=s, temperature=0.5) for s in range(draws)]
    share = sum(t == 0 for t in sample(logits.expand(draws, 2), rows, frozenset()).token_ids) / draws
    expected = 0.36 / (0.36 + 0.16)  # p^(1/T) renormalised
    assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / draws)


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 50)

    def run(batch_rows, seeds):
        outs = []
        for j in range(5):  # output positions 0..4
            reqs = [req(seed=s, temperature=1.0, output=[7] * j) for s in seeds]
            outs.append(sample(logits[batch_rows], reqs, frozenset()).token_ids[0])
        return outs

    alone = run([2], [42])
    in_batch = run([2, 0, 1, 3], [42, 1, 2, 3])
    assert alone == in_batch
    assert len(set(alone)) > 1  # each output position has its own draw


def test_a_draw_depends_on_the_output_position_not_on_earlier_draws():
    """Sampling token j uses ``sample_draw(seed, j)`` however many rows were sampled before (a
    rejected jump-forward draft position samples a row that is then thrown away)."""
    from lmnb_engine.request import sample_draw

    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25]])
    r = req(seed=9, temperature=1.0, output=[5, 5, 5])
    for _ in range(3):  # draws for discarded rows
        sample(probs.log(), [r], frozenset(), positions=[1])
    picked = sample(probs.log(), [r], frozenset()).token_ids[0]
    assert picked == int(sample_draw(9, 3) * 4)  # uniform over 4 tokens: bucket of the draw
    assert [sample_draw(9, j) for j in range(3)] != [sample_draw(10, j) for j in range(3)]
    assert all(0.0 <= sample_draw(s, j) < 1.0 for s in (0, -1, 2**70) for j in range(50))


def test_a_seeded_draw_does_not_flip_between_near_tied_tokens_under_float_noise():
    """Two tokens of ~0.5 each, their order swapped by a 1e-6 change (as after a retraction's
    recompute): the same seed must pick the same token. With the draw over sorted probabilities
    it picked the other one whenever it fell in the first half."""
    base = torch.full((1, 20), -30.0)
    a, b = base.clone(), base.clone()
    a[0, 3], a[0, 7] = 0.0, 1e-6
    b[0, 3], b[0, 7] = 1e-6, 0.0
    picks_a = [sample(a, [req(seed=s, temperature=1.0)], frozenset()).token_ids[0] for s in range(40)]
    picks_b = [sample(b, [req(seed=s, temperature=1.0)], frozenset()).token_ids[0] for s in range(40)]
    assert picks_a == picks_b
    assert set(picks_a) == {3, 7}  # both are drawn (about half each)


def test_min_new_tokens_masks_eos_and_stop_token_ids():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])  # 0 = EOS, 1 = stop token id
    r = req(output=[3], temperature=0.0, min_new_tokens=2, stop_token_ids=[1])
    assert sample(logits, [r], frozenset({0})).token_ids == [2]
    r.output_ids = [3, 3]
    assert sample(logits, [r], frozenset({0})).token_ids == [0]


def test_grammar_hook_masks_and_accepts():
    class OnlyOdd:
        accepted: list[int] = []

        def allowed_token_mask(self, vocab_size):
            return torch.arange(vocab_size) % 2 == 1

        def accept_token(self, token_id):
            self.accepted.append(token_id)

        def is_terminated(self):
            return False

    logits = torch.tensor([[9.0, 1.0, 8.0, 2.0], [9.0, 1.0, 8.0, 2.0]])
    g = OnlyOdd()
    constrained, free = req(temperature=0.0), req(temperature=0.0)
    constrained.grammar = g
    assert sample(logits, [constrained, free], frozenset()).token_ids == [3, 0]
    assert g.accepted == [3]


def test_a_row_whose_grammar_allows_only_tokens_min_new_tokens_bans_is_blocked_not_advanced():
    """The grammar mask and the min_new_tokens ban left every logit -inf: argmax took token 0 and
    the grammar, told it, raised. The row is flagged instead, and its grammar is not told."""
    class OnlyOne:
        def __init__(self):
            self.accepted = []

        def allowed_token_mask(self, vocab_size):
            return torch.arange(vocab_size) == 1

        def accept_token(self, token_id):
            self.accepted.append(token_id)

    logits = torch.tensor([[5.0, 4.0, 3.0], [5.0, 4.0, 3.0]])
    rows = [req(temperature=0.0, min_new_tokens=2, stop_token_ids=[1]), req(temperature=0.7, min_new_tokens=2)]
    grammars = [OnlyOne(), OnlyOne()]
    for r, g in zip(rows, grammars):
        r.grammar = g
    out = sample(logits, rows, frozenset({0}))
    assert out.blocked_rows == {0} and out.bad_rows == frozenset() and out.token_ids[1] == 1
    assert [g.accepted for g in grammars] == [[], [1]]


def test_rows_with_nonfinite_logits_are_flagged_and_their_grammar_is_not_advanced():
    class Recording:
        def __init__(self):
            self.accepted = []

        def allowed_token_mask(self, vocab_size):
            return None

        def accept_token(self, token_id):
            self.accepted.append(token_id)

    nan, inf = float("nan"), float("inf")
    logits = torch.tensor([[1.0, nan, 0.0], [0.0, 2.0, 1.0], [nan, nan, nan], [0.5, 0.1, 3.0],
                           [0.2, inf, 0.1], [-inf, -inf, -inf], [-inf, 0.5, 0.1]])
    rows = [req(temperature=0.0), req(temperature=0.0), req(temperature=0.8, seed=3), req(temperature=0.9),
            req(temperature=0.7), req(temperature=0.0), req(temperature=0.0)]
    grammars = [Recording() for _ in rows]
    for r, g in zip(rows, grammars):
        r.grammar = g
    out = sample(logits, rows, frozenset())
    # NaN, +inf (softmax over it is NaN everywhere) and all -inf are flagged; a raw -inf is a mask
    assert out.bad_rows == {0, 2, 4, 5}
    assert out.token_ids[1] == 1 and out.token_ids[6] == 1
    assert [g.accepted for g in grammars] == [[], [1], [], [out.token_ids[3]], [], [], [1]]
    # -inf from masking is fine: a row with every token but one masked samples that token
    masked = torch.tensor([[float("-inf"), 0.3, float("-inf")]])
    out = sample(masked, [req(temperature=1.0)], frozenset())
    assert out.bad_rows == frozenset() and out.token_ids == [1]


def test_logprobs_are_raw_log_softmax_with_top_alternatives():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    r = req(temperature=0.0, return_logprob=True, top_logprobs_num=2, repetition_penalty=3.0, prompt=[0])
    lp = sample(logits, [r], frozenset()).logprobs[0]
    z = math.log(math.exp(2.0) + math.exp(1.0) + 1.0)
    assert lp.token_id == 1  # the penalty turned token 0's logit 2 into 2/3 < 1
    # ... but the reported logprob is that of the raw logits
    assert lp.logprob == pytest.approx(1.0 - z, abs=1e-6)
    assert [t for t, _ in lp.top] == [0, 1]
    assert lp.top[0][1] == pytest.approx(2.0 - z, abs=1e-6)


@pytest.mark.parametrize("pattern, said", [
    ("^", "at the output's start, where no stop is looked for (the output is checked after each token), so it would "
          "stop nothing"),
    (r"\A", "at the output's start, where no stop is looked for (the output is checked after each token), so it "
            "would stop nothing"),
    (r"\Z", "at the output's end, so it would cut nothing"),
    ("$", "at the output's end, so it would cut nothing but a final line break, before which $ matches too"),
    (r"\A|\Z", "at the output's start or end, so it would cut nothing"),
])
def test_a_stop_regex_of_the_outputs_start_or_end_alone_is_refused_for_what_it_would_do(pattern, said):
    """stop_regex="$" (\\Z, ^, \\A) was refused as one that "would stop before the first token";
    the stop matcher (the reference: an output read token by token, then its end) never meets ^
    or \\A, and meets \\Z or $ only at the end, where it cuts nothing (the whole output is kept), or
    $ before a final line break, which it cuts. The refusal stands, worded so."""
    from lmnb_engine.params import stop_regex_problem
    from lmnb_engine.stop_matcher import StopStringMatcher

    assert stop_regex_problem(pattern) == (
        f"{json.dumps(pattern)} matches only the empty string {said}; remove it, or make it match at least one "
        "character")
    for output in ("ab", "ab\n"):
        matcher, text, met = StopStringMatcher([], [pattern]), "", None
        for token in output:  # (one character a token)
            checked, text = len(text), text + token
            met = met or matcher.find(text, checked)
        met = met or matcher.find(text, len(text), at_end=True)
        kept = None if met is None else text[:met[0]]
        if "start" in said and "end" not in said:
            assert met is None
        elif "line break" in said and output.endswith("\n"):
            assert kept == output[:-1]
        else:
            assert kept == output


def test_logit_bias_shifts_the_greedy_argmax_of_its_own_rows_only():
    """lmnb had no logit_bias. Row 0: token 0's 0.1 + 5 = 5.1 beats token 1's 2.0; row 1 has no
    bias (argmax 0); row 2: token 2's 3.0 - 100 leaves token 1's 2.0 the largest; row 3 biases
    two tokens, one of them down, one up: 1.0 + 1.5 = 2.5 > 2.0. The caller's logits are kept."""
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 2.9, 0.0], [1.0, 2.0, 3.0], [1.0, 2.0, 0.0]])
    kept = logits.clone()
    rows = [req(temperature=0.0, logit_bias={0: 5.0}), req(temperature=0.0),
            req(temperature=0.0, logit_bias={2: -100.0}), req(top_k=1, logit_bias={1: -0.5, 0: 1.5})]
    assert sample(logits, rows, frozenset()).token_ids == [0, 0, 1, 0]
    assert torch.equal(logits, kept)


def test_logit_bias_draws_as_from_the_biased_logits():
    """A sampled row with a bias draws what the same seeds draw from logits with the bias added
    by hand (temperature, top_p after the bias); +100 on one token of five equal ones takes every draw."""
    torch.manual_seed(3)
    logits = torch.randn(1, 30)
    bias = {4: 2.0, 17: -1.5, 29: 3.0}
    by_hand = logits.clone()
    for t, b in bias.items():
        by_hand[0, t] += b
    biased = [req(seed=s, temperature=0.8, top_p=0.9, logit_bias=bias) for s in range(64)]
    plain = [req(seed=s, temperature=0.8, top_p=0.9) for s in range(64)]
    drawn = sample(logits.expand(64, 30), biased, frozenset()).token_ids
    assert drawn == sample(by_hand.expand(64, 30), plain, frozenset()).token_ids
    assert drawn != sample(logits.expand(64, 30), plain, frozenset()).token_ids
    forced = [req(seed=s, temperature=1.0, logit_bias={3: 100.0}) for s in range(20)]
    assert sample(torch.zeros(20, 5), forced, frozenset()).token_ids == [3] * 20


def test_a_masked_token_stays_masked_whatever_its_logit_bias():
    """+100 on EOS while min_new_tokens bans it, and on a token the grammar forbids: neither is
    taken (-inf plus a bias is -inf); the next best allowed token is."""
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])  # 0 = EOS
    r = req(output=[3], temperature=0.0, min_new_tokens=2, logit_bias={0: 100.0})
    assert sample(logits, [r], frozenset({0})).token_ids == [1]

    class OnlyOdd:
        def allowed_token_mask(self, vocab_size):
            return torch.arange(vocab_size) % 2 == 1

        def accept_token(self, token_id):
            pass

    constrained = req(temperature=0.0, logit_bias={2: 100.0, 3: 0.5})
    constrained.grammar = OnlyOdd()
    assert sample(logits, [constrained], frozenset()).token_ids == [1]  # 4.0 > 0.0 + 0.5; 2 masked
    out = sample(logits, [constrained], frozenset(), grammar_bitmask=torch.tensor([[0b1010]], dtype=torch.int32))
    assert out.token_ids == [1]  # (jump-forward verification's bitmask: the same)


def test_logprobs_with_a_logit_bias_are_the_models_own():
    """The bias chose token 2, but its reported logprob, and the top alternatives, are those of
    the raw logits, as with the penalties and temperature (module docstring)."""
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    r = req(temperature=0.0, return_logprob=True, top_logprobs_num=1, logit_bias={2: 10.0})
    lp = sample(logits, [r], frozenset()).logprobs[0]
    z = math.log(math.exp(2.0) + math.exp(1.0) + 1.0)
    assert lp.token_id == 2
    assert lp.logprob == pytest.approx(0.0 - z, abs=1e-6)
    assert lp.top[0][0] == 0 and lp.top[0][1] == pytest.approx(2.0 - z, abs=1e-6)


@pytest.mark.parametrize("bias, said", [
    ([1, 2], "must be a dict mapping token ids to biases, e.g. {1234: -100}; got a list"),
    ({"abc": 1}, "the key 'abc' is not a token id: keys are token ids (ints >= 0, or their decimal text as in "
                 "OpenAI's API, \"1234\"); to bias a word, give its token ids from the model's own tokenizer: "
                 "tokenizer.encode(word, add_special_tokens=False), where tokenizer is lmnb.Engine(...).get_tokenizer() "
                 "or lmnb_engine.Engine(...).tokenizer in process, or transformers.AutoTokenizer.from_pretrained(the "
                 "model's path or hub id) for a served model (for OpenAI's own models, "
                 "tiktoken.encoding_for_model(name).encode(word))"),
    ({-1: 1}, "the key -1 is not a token id"),
    ({"-1": 1}, "the key '-1' is not a token id"),
    ({True: 1}, "the key True is not a token id"),
    ({5: 100.5}, "the bias of token 5, 100.5, is outside [-100, 100]: give a number from -100 (bans the token in "
                 "effect) to 100 (forces it in effect)"),
    ({"5": -101}, "the bias of token 5, -101, is outside [-100, 100]"),
    ({5: float("nan")}, "the bias of token 5, nan, is not a finite number"),
    ({5: float("-inf")}, "the bias of token 5, -inf, is not a finite number"),
    ({5: "1"}, "the bias of token 5, '1', is not a number"),
    ({5: True}, "the bias of token 5, True, is not a number"),
    # (it said "as 5 and as another key naming the same id", naming one key: "05" beside "5" is hard to see)
    ({"5": 1, 5: 2}, "token 5 is given twice, as the keys '5' and 5; give each token one bias"),
    ({"05": 1, "5": 2}, "token 5 is given twice, as the keys '05' and '5'; give each token one bias"),
])
def test_a_bad_logit_bias_is_refused_naming_the_key_and_the_fix(bias, said):
    with pytest.raises(ValueError) as e:
        SamplingParams(logit_bias=bias).validate()
    assert str(e.value).startswith("SamplingParams.logit_bias is invalid: " + said)
    assert e.value.field == "logit_bias"


@pytest.mark.parametrize("key, shown", [(-1, "-1"), ("-1", "'-1'"), (True, "True"), (5.0, "5.0")])
def test_a_logit_bias_key_that_is_a_number_or_bool_is_not_told_how_to_bias_a_word(key, shown):
    """A key of no token id that is a number or a bool (-1, "-1", True, 5.0) was told the way to
    bias a word (the model's tokenizer, tiktoken...), which it is not; only a word as key is."""
    with pytest.raises(ValueError) as e:
        SamplingParams(logit_bias={key: 1}).validate()
    assert str(e.value) == (f"SamplingParams.logit_bias is invalid: the key {shown} is not a token id: keys are token "
                            "ids (ints >= 0, or their decimal text as in OpenAI's API, \"1234\")")


def test_a_logit_bias_key_of_more_digits_than_python_reads_is_an_id_past_the_vocabulary():
    """A key written as 5000 digits ("1" and 4999 zeros: 10**4999, past Python's 4300-digit limit)
    was refused as "not a token id"; it is one, past every model's vocabulary (as the int 10**4999
    is told by the engine), so the fix is to remove it. Leading zeros are no digits of the id:
    "+", 5000 zeros and "7" is 7 (it was "the key 7 is not a token id"), as "07" is."""
    with pytest.raises(ValueError) as e:
        SamplingParams(logit_bias={"1" + "0" * 4999: 1}).validate()
    assert str(e.value) == ("SamplingParams.logit_bias is invalid: the key 1.000e+4999 (an integer of 5000 digits) is "
                            "a token id past every model's vocabulary; remove it, or take the ids from the model's "
                            "tokenizer")
    assert e.value.field == "logit_bias"
    with pytest.raises(ValueError, match=r"^SamplingParams.logit_bias is invalid: the key -1.000e\+4999 \(an integer "
                                         r"of 5000 digits\) is not a token id: keys are token ids \(ints >= 0"):
        SamplingParams(logit_bias={"-1" + "0" * 4999: 1}).validate()  # (negative: no id, as "-1")
    p = SamplingParams(logit_bias={"+" + "0" * 5000 + "7": -100, "0" * 5000: 1})
    p.validate()
    assert p.logit_bias == {7: -100.0, 0: 1.0}


def test_a_logit_bias_of_token_id_text_becomes_int_ids():
    import numpy as np

    p = SamplingParams(logit_bias={"7": -100, 3: 2.5, np.int64(4): np.float32(1.5), "+0": 0})
    p.validate()
    assert p.logit_bias == {7: -100.0, 3: 2.5, 4: 1.5, 0: 0.0}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
