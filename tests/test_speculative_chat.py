"""API speculative execution on chat models (``lmnb.speculative``: ``spec_role_check``,
``spec_role_end``): what one call per assistant role gives each of the role's gens, and what it
refuses. More of its tests are in test_lang_interpreter.py (``test_api_speculative_execution_*``,
``test_a_speculated_chat_*``)."""

from __future__ import annotations

import contextlib
import json

import pytest

import lmnb as sgl
from lmnb.chat_template import get_chat_template

from helpers_lang import ScriptedBackend, send, serve_http

CHATML = get_chat_template("chatml")
_PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _refusal(backend) -> str:
    """The refusal of a chat role whose later gen has its own temperature, run on ``backend``
    (before any call: the backends below are never reached)."""

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Describe a person.")
        s += sgl.assistant("Name: " + sgl.gen("name", stop="\n") + "\nAge: " + sgl.gen("age", temperature=0.9))

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=backend, temperature=0).text()
    return str(e.value)


_SAID = ("gen 'age' has temperature=0.9 where gen 'name', the first gen of its assistant role, has temperature=0: "
         "under API speculative execution (num_api_spec_tokens) a chat model writes the whole assistant message in "
         "one call, with the first gen's sampling parameters, ")


def test_a_speculated_chat_refusal_on_a_server_that_can_continue_a_reply_names_continue_final_message():
    """The refusal said "a chat API cannot continue a half-written assistant message", and its fixes
    kept speculation; a vLLM, SGLang or lmnb serve server can continue one (continue_final_message):
    without speculation each gen is then a call of its own, continuing the reply, and the program
    runs as written. The fix names it as the Python API and a notebook's %lm connect write it."""
    said = _refusal(sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1"))
    assert _SAID + (
        "and speculation makes no call of its own to continue the half-written assistant message for gen 'age' "
        "(a vLLM, SGLang or lmnb serve server can continue it, with continue_final_message); give the role's gens "
        "the same temperature, or put gen 'age' in an assistant role of its own, or, on such a server, run without "
        "API speculative execution (@function without num_api_spec_tokens) and with OpenAI(..., "
        "continue_final_message=True) (in a notebook %lm connect URL --openai MODEL --continue-final-message): each "
        "gen then continues the reply in a call of its own") in said


def test_a_speculated_chat_refusal_on_a_backend_that_continues_replies_says_to_run_without_speculation():
    said = _refusal(sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1", continue_final_message=True))
    assert _SAID + (
        "and speculation makes no call of its own to continue the half-written assistant message for gen 'age' "
        "(this backend can continue it: continue_final_message=True); give the role's gens the same temperature, "
        "or put gen 'age' in an assistant role of its own, or run without API speculative execution (@function "
        "without num_api_spec_tokens): each gen then continues the reply in a call of its own") in said


@pytest.mark.parametrize("backend", [
    lambda: sgl.OpenAI("gpt-4o", api_key="sk-test"),  # OpenAI's own API has no continue_final_message
    lambda: ScriptedBackend(is_chat_model=True, chat_template=CHATML),
])
def test_a_speculated_chat_refusal_on_a_chat_api_that_cannot_continue_a_reply_offers_no_continue_final_message(
        backend):
    said = _refusal(backend())
    assert _SAID + ("and a chat API cannot continue a half-written assistant message to draw gen 'age' with its own; "
                    "give the role's gens the same temperature, or put gen 'age' in an assistant role of its "
                    "own") in said
    assert said.endswith("or put gen 'age' in an assistant role of its own") and "continue_final" not in said


# A reply as the role "Name:" + gen("name", stop="\n") + "\nAge:" + gen("age", stop="\n") wants it, in its
# tokens: name's share " Carol Ann" is tokens 2-3 and its stop "\n" token 4; age's " 41" tokens 7-8, "\n" 9.
_PIECES = ["Name", ":", " Carol", " Ann", "\n", "Age", ":", " 4", "1", "\n"]


def _entry(i: int) -> list:
    return [-(i + 1) / 8, 100 + i, _PIECES[i]]


class _Tokens(ScriptedBackend):
    """A chat model whose reply is ``_PIECES``, with each token's logprob entry (and a second top
    alternative) where the call asks for logprobs, and the call's completion_tokens."""

    def generate(self, prompt, params, rid):
        from lmnb.backend.base import Completion

        self._record("generate", (prompt, params))
        meta = {"id": rid, "finish_reason": {"type": "stop"}, "completion_tokens": len(_PIECES)}
        if params.return_logprob:
            meta["output_token_logprobs"] = [_entry(i) for i in range(len(_PIECES))]
            if params.top_logprobs_num:
                meta["output_top_logprobs"] = [[_entry(i), [-4.0, 99, "x"]][:params.top_logprobs_num]
                                               for i in range(len(_PIECES))]
        return [Completion("".join(_PIECES), meta)]


def _role(name: dict, age: dict):
    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Describe a person.")
        s += sgl.assistant("Name:" + sgl.gen("name", stop="\n", **name) + "\nAge:" + sgl.gen("age", stop="\n", **age))

    return prog




@pytest.mark.parametrize("name_max, age_max, want", [
    # (each gen's tokens counted from the first after the fill; the stop's token counts, as without speculation)
    (1, 1, {"name": (" Carol", "length", 1), "age": (" 4", "length", 1)}),
    # age writes " 4" and "1", its max_tokens, before the "\n" that would stop it: its text whole, cut by length
    (8, 2, {"name": (" Carol Ann", "stop", 3), "age": (" 41", "length", 2)}),
    (8, 3, {"name": (" Carol Ann", "stop", 3), "age": (" 41", "stop", 3)}),
])
def test_a_speculated_chat_gens_share_is_cut_at_its_own_max_tokens(name_max, age_max, want):
    """A chat role's gens took their whole share of the one call's reply whatever their
    max_tokens (the call's is num_api_spec_tokens): gen("age", max_tokens=1) was " 41". Each share
    is now cut at its gen's max_tokens tokens, found from the reply's token texts, which the call
    asks for where a gen's max_tokens is under num_api_spec_tokens, as the completion-model path
    cuts; finish_reason "length" there. Reference: _PIECES counted by hand."""
    be = _Tokens(chat_template=CHATML, is_chat_model=True)
    st = _role(dict(max_tokens=name_max), dict(max_tokens=age_max)).run(backend=be)
    [(_, (_, params))] = be.calls
    assert (params.max_new_tokens, params.return_logprob, params.return_text_in_logprobs) == (32, True, True)
    limits = {"name": name_max, "age": age_max}
    got = {k: (st[k], st.get_meta_info(k)["finish_reason"]["type"], st.get_meta_info(k)["completion_tokens"])
           for k in ("name", "age")}
    assert got == want
    for k in ("name", "age"):
        finish = st.get_meta_info(k)["finish_reason"]
        assert finish == ({"type": "length", "length": limits[k]} if want[k][1] == "length"
                          else {"type": "stop", "matched": "\n"})
        assert "output_token_logprobs" not in st.get_meta_info(k)  # (asked for by the call only, to count by)
    assert st.messages()[-1] == {"role": "assistant", "content": f"Name:{want['name'][0]}\nAge:{want['age'][0]}"}
    assert st.get_meta_info("name")["speculative_call"] == {"completion_tokens": 10, "finish_reason": {"type": "stop"}}


def test_a_speculated_chat_roles_last_gen_is_where_the_sampled_text_ends():
    """A gen's text is recorded as ending in a token sampled and not yet run
    (StreamExecutor.sampled_end, read by %lm tree's lmnb_kernel.tree_paths); a chat role's
    speculated gens were not: sampled_end stayed None. It is now the end of the role's last
    gen's text, before the role's end (CHATML's "<|im_end|>\n", which follows it)."""
    be = _Tokens(chat_template=CHATML, is_chat_model=True)
    st = _role(dict(max_tokens=8), dict(max_tokens=3)).run(backend=be)
    assert st["age"] == " 41"
    assert st.text().endswith("\nAge: 41<|im_end|>\n")
    assert st.stream_executor.sampled_end == len(st.text()) - len("<|im_end|>\n")


def test_a_speculated_chat_gen_that_asks_for_logprobs_gets_its_own_tokens():
    """A later gen of a chat role with return_logprob got none, and the first gen got the whole
    reply's: each now gets its share's tokens' entries (the stop's token too, as without
    speculation), its own top_logprobs_num of alternatives (the call asks for the most any gen
    asks for) and token texts only where it asks for them. Reference: _PIECES by hand."""
    be = _Tokens(chat_template=CHATML, is_chat_model=True)
    st = _role(dict(return_logprob=True),
               dict(return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=True)).run(backend=be)
    [(_, (_, params))] = be.calls
    assert (params.return_logprob, params.top_logprobs_num) == (True, 2)
    name, age = st.get_meta_info("name"), st.get_meta_info("age")
    assert name["output_token_logprobs"] == [[-3 / 8, 102, None], [-4 / 8, 103, None], [-5 / 8, 104, None]]
    assert "output_top_logprobs" not in name and name["completion_tokens"] == 3
    assert age["output_token_logprobs"] == [_entry(7), _entry(8), _entry(9)] and age["completion_tokens"] == 3
    assert age["output_top_logprobs"] == [[_entry(i), [-4.0, 99, "x"]] for i in (7, 8, 9)]


def test_a_speculated_chat_gen_asking_for_logprobs_where_the_reply_has_no_token_texts_is_refused():
    """Where the reply comes without token texts, which of its logprobs are a later gen's is not
    known: it got none, silently. It is refused, naming the fixes."""
    be = ScriptedBackend(lambda p, params: "Name: Carol\nAge: 41\n", chat_template=CHATML, is_chat_model=True)
    with pytest.raises(sgl.ProgramError) as e:
        _role({}, dict(return_logprob=True)).run(backend=be).text()
    assert ("gen 'age' asks for return_logprob, but the reply of its assistant role's one call (API speculative "
            "execution, num_api_spec_tokens) came without token texts that add up to it, so which of its logprobs "
            "are the gen's is not known; drop the gen's return_logprob, or run it without API speculative execution "
            "(@function without num_api_spec_tokens), at the start of an assistant message or where the backend "
            "continues one (continue_final_message)") in str(e.value)


def test_a_speculated_chat_gen_whose_share_is_the_whole_reply_has_the_calls_logprobs_without_token_texts():
    # (its tokens are all the call's: nothing to find, so no refusal)
    from lmnb.backend.base import Completion

    entries = [[-0.5, 1, None], [-0.25, 2, None]]

    class NoTexts(ScriptedBackend):
        def generate(self, prompt, params, rid):
            self._record("generate", (prompt, params))
            return [Completion("Hi there", {"id": rid, "finish_reason": {"type": "stop"}, "completion_tokens": 2,
                                            "output_token_logprobs": entries})]

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Hello.")
        s += sgl.assistant(sgl.gen("x", return_logprob=True))

    st = prog.run(backend=NoTexts(chat_template=CHATML, is_chat_model=True))
    meta = st.get_meta_info("x")
    assert (st["x"], meta["output_token_logprobs"], meta["completion_tokens"]) == ("Hi there", entries, 2)


@pytest.mark.parametrize("written, want", [
    (None, " Car"),  # tokens not known: 4 characters stand in for 4 tokens (the completion path's rule, SGLang's)
    (20, " Car"),
    (3, " Carol Ann"),  # the whole call wrote 3 tokens: the share, less, fits in 4
])
def test_a_speculated_chat_gens_share_without_token_texts_is_cut_by_characters_unless_the_call_fits(written, want):
    from lmnb.backend.base import Completion

    class NoTexts(ScriptedBackend):
        def generate(self, prompt, params, rid):
            self._record("generate", (prompt, params))
            meta = {"id": rid, "finish_reason": {"type": "stop"}}
            if written is not None:
                meta["completion_tokens"] = written
            return [Completion("Name: Carol Ann\nAge: 41\n", meta)]

    st = _role(dict(max_tokens=4), {}).run(backend=NoTexts(chat_template=CHATML, is_chat_model=True))
    assert (st["name"], st["age"]) == (want, " 41")
    assert st.get_meta_info("name")["finish_reason"]["type"] == ("length" if want == " Car" else "stop")


def _constraint_keeping_backend() -> ScriptedBackend:
    """A chat model whose reply follows the call's constraint, as a server's constrained decoding
    does: "42" (all the int regex lets it write) under a regex, '{"name": "Ann"}' under a JSON schema,
    else a reply with every fill the tests' roles hold."""
    def reply(prompt, params):
        if params.regex is not None:
            return "42"
        if params.json_schema is not None:
            return '{"name": "Ann"}'
        return 'Answer: 42 and 7 thanks\n{"name": "Bo"}'

    return ScriptedBackend(reply, chat_template=CHATML, is_chat_model=True)


@pytest.mark.parametrize("body, constrained", [
    # two gens of one dtype: the call's int regex held the whole reply, "42 and 7" could not be written
    (lambda: sgl.gen("a", dtype=int) + " and " + sgl.gen("b", dtype=int), "gen 'a' has dtype=int"),
    # text before the gen, which the reply must write too
    (lambda: "Answer: " + sgl.gen("a", regex=r"[0-9]+"), "gen 'a' has regex='[0-9]+'"),
    # text after it (told at the role's end, before its call)
    (lambda: sgl.gen("a", json_schema=_PERSON) + " thanks", "gen 'a' has json_schema="),
    # a later gen without the constraint (refused before as one whose regex differs, whose fix
    # "give the role's gens the same regex" then met the first case)
    (lambda: sgl.gen("a", regex=r"[0-9]+", stop=" ") + " and " + sgl.gen("b"), "gen 'a' has regex='[0-9]+'"),
    # the same schema on both (its one call could write one object, not two and the text between)
    (lambda: sgl.gen("a", json_schema=_PERSON, stop="\n") + "\n" + sgl.gen("b", json_schema=json.dumps(_PERSON)),
     "gen 'a' has json_schema="),
    # an unnamed gen, constrained after an unconstrained one
    (lambda: sgl.gen("a", stop=" ") + " " + sgl.gen(dtype=int), "the role's unnamed gen #2 has dtype=int"),
    # whitespace alone counts as text: the reply is split at the fill, so '{"name": "Ann"}' gave a '{"name":'
    (lambda: sgl.gen("a", json_schema=_PERSON) + " ", "gen 'a' has json_schema="),
    # (and one the constraint cannot write: 3 calls, then "does not follow the assistant role's pattern")
    (lambda: "\n" + sgl.gen("a", regex=r"[0-9]+"), "gen 'a' has regex='[0-9]+'"),
])
def test_a_constrained_gen_in_a_speculated_chat_role_with_more_in_it_is_refused_before_the_call(body, constrained):
    """One call writes the whole assistant message with the first gen's options, so a regex, JSON
    schema or dtype held the whole reply, the role's text and other gens too, to one gen's pattern:
    a server that keeps it writes "42" for "{a:int} and {b:int}", which the role's pattern never
    matches (3 calls, then "does not follow the assistant role's pattern"). Refused before any call."""
    be = _constraint_keeping_backend()

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Say it.")
        s += sgl.assistant(body())

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=be).text()
    said = str(e.value)
    assert constrained in said
    assert ("in an assistant role that also holds" in said and "constrains the whole assistant message" in said
            and "put the gen alone in an assistant role of its own, or run without API speculative execution "
                "(@function without num_api_spec_tokens)" in said)
    assert be.kinds() == []  # (no call made)


_NO_SPEC = "or run without API speculative execution (@function without num_api_spec_tokens)"
_CONTINUING = (" and with OpenAI(..., continue_final_message=True) (in a notebook %lm connect URL --openai MODEL "
               "--continue-final-message): each gen then continues the reply in a call of its own")


@pytest.mark.parametrize("body, backend, fix", [
    # a gen after text: without speculation this backend refuses it ("can only generate at the start of an
    # assistant message ... use @function(num_api_spec_tokens=N)"), so the fix is to continue the reply
    (lambda: "Answer: " + sgl.gen("a", regex=r"[0-9]+"), lambda: sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1"),
     "put the gen alone in an assistant role of its own, or, on such a server, " + _NO_SPEC[3:] + _CONTINUING),
    # a later gen after the constrained one: the same
    (lambda: sgl.gen("a", dtype=int) + " and " + sgl.gen("b"), lambda: sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1"),
     "put the gen alone in an assistant role of its own, or, on such a server, " + _NO_SPEC[3:] + _CONTINUING),
    # a backend that continues replies: running without speculation does
    (lambda: "Answer: " + sgl.gen("a", regex=r"[0-9]+"),
     lambda: sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1", continue_final_message=True),
     "put the gen alone in an assistant role of its own, " + _NO_SPEC + ": each gen then continues the reply in a "
     "call of its own"),
    # OpenAI's own API continues no reply: its own role is the one fix
    (lambda: "Answer: " + sgl.gen("a", json_schema=_PERSON), lambda: sgl.OpenAI("gpt-4o", api_key="sk-test"),
     "put the gen alone in an assistant role of its own"),
    # the gen first and text alone after it: without speculation the gen is at the reply's start, which runs
    (lambda: sgl.gen("a", json_schema=_PERSON) + " thanks", lambda: sgl.OpenAI("gpt-4o", api_key="sk-test"),
     "put the gen alone in an assistant role of its own, " + _NO_SPEC),
])
def test_a_constrained_gen_refusal_offers_running_without_speculation_only_as_the_backend_can(body, backend, fix):
    """The refusal said to run without num_api_spec_tokens where lmnb.OpenAI's chat model then refuses
    the gen after text ("can only generate at the start of an assistant message"), whose fix is
    @function(num_api_spec_tokens=N): each error sent the user to the other. Without speculation such
    a role runs only where the server continues the reply (continue_final_message)."""

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Say it.")
        s += sgl.assistant(body())

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=backend()).text()
    assert str(e.value).endswith(fix)


@pytest.mark.parametrize("gen, reply, value, constraint", [
    (lambda: sgl.gen("a", dtype=int), "42", 42, (r"[-+]?[0-9]+[ \n]*", None)),  # (lmnb.ir.REGEX_INT, SGLang's)
    (lambda: sgl.gen("a", regex=r"[0-9]+"), "42", "42", (r"[0-9]+", None)),
    (lambda: sgl.gen("a", json_schema=_PERSON), '{"name": "Ann"}', '{"name": "Ann"}', (None, _PERSON)),
])
def test_a_constrained_gen_alone_in_a_speculated_chat_role_sends_its_constraint_with_the_call(gen, reply, value,
                                                                                               constraint):
    """Alone in its role, the gen's share is the whole reply: the constraint the call sends is the gen's."""
    be = _constraint_keeping_backend()

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Say it.")
        s += sgl.assistant(gen())

    st = prog.run(backend=be)
    assert st["a"] == value and st.text().endswith(f"<|im_start|>assistant\n{reply}<|im_end|>\n")
    [(kind, (_, params))] = be.calls
    assert kind == "generate" and params.max_new_tokens == 32
    assert (params.regex, params.json_schema) == constraint


def test_a_pick_after_a_speculated_chat_roles_held_text_and_gens_is_refused_before_any_call():
    """A select (gen(choices=...)) after the fills and gens that speculation holds for the role's one
    call was scored at once, on a prompt without them, and its choice written before them: the
    assistant message read "yesName: Carol ok? " (a chat backend that scores choices; OpenAI's
    chat API refuses a pick anyway)."""
    be = ScriptedBackend(lambda p, params: "Name: Carol ok? ", chat_template=CHATML, is_chat_model=True,
                         choice_scores=lambda p, c: ([-1.0] if c == "yes" else [-2.0], [0.0]))

    @sgl.function(num_api_spec_tokens=16)
    def prog(s):
        s += sgl.user("q")
        s += sgl.assistant("Name: " + sgl.gen("name", stop=" ") + " ok? " + sgl.gen("a", choices=["yes", "no"]))

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=be).text()
    assert ("the pick 'a' (select or gen(choices=...)) follows text or gens of its assistant role that API "
            "speculative execution (num_api_spec_tokens) of a chat model holds for one call at the role's "
            "end") in str(e.value)
    assert "put the pick in an assistant role of its own, or run without num_api_spec_tokens" in str(e.value)
    assert be.kinds() == []

    @sgl.function(num_api_spec_tokens=16)
    def alone(s):  # (a role of its own: nothing held before it)
        s += sgl.user("q")
        s += sgl.assistant(sgl.gen("a", choices=["yes", "no"]))

    st = alone.run(backend=be)
    assert st["a"] == "yes" and st.messages()[-1] == {"role": "assistant", "content": "yes"} and be.kinds() == ["score"]


def _pick_then_gen(s):
    s += sgl.user("q")
    s += sgl.assistant(sgl.gen("a", choices=["yes", "no"]) + ", because " + sgl.gen("why", stop="\n"))


def _picking(reply: str, **attrs) -> ScriptedBackend:
    """A chat backend that scores choices ("yes" the likelier) and replies ``reply``; ``attrs`` set
    on it (``continue_final_message``)."""
    be = ScriptedBackend(lambda p, params: reply, chat_template=CHATML, is_chat_model=True,
                         choice_scores=lambda p, c: ([-1.0] if c == "yes" else [-2.0], [0.0]))
    for name, value in attrs.items():
        setattr(be, name, value)
    return be


def test_a_gen_after_a_pick_in_a_speculated_chat_role_is_refused_before_the_call():
    """A pick is scored and written at once, so the role's one call at its end went out with the
    pick's "yes" as a half-written assistant message (role_text), which a chat API cannot continue:
    it answers a new message, split as if it followed "yes". Refused before that call (the pick's
    scoring is made), naming the gen, the text and the fixes."""
    be = _picking(", because it rains\n")
    with pytest.raises(sgl.ProgramError) as e:
        sgl.function(num_api_spec_tokens=16)(_pick_then_gen).run(backend=be).text()
    assert ("gen 'why' follows 'yes', which a pick (select or gen(choices=...)) wrote in its assistant role: under "
            "API speculative execution (num_api_spec_tokens) a chat model writes the role's gens in one call at the "
            "role's end, which would have to continue the half-written assistant message, and this chat backend "
            "cannot continue one; put the pick in an assistant role of its own and gen 'why' in the next, or use a "
            "backend that continues a half-written assistant message (continue_final_message=True)") in str(e.value)
    assert be.kinds() == ["score"]


def test_a_gen_after_a_pick_in_a_speculated_chat_role_continues_the_message_where_the_backend_can():
    """A backend that continues a half-written assistant message (continue_final_message, as
    lmnb.OpenAI's) gets the role's one call with the pick's text as the message's start, and its
    reply, the continuation, is split along the role's fills and gens after the pick."""
    be = _picking(", because it rains\n", continue_final_message=True)
    st = sgl.function(num_api_spec_tokens=16)(_pick_then_gen).run(backend=be)
    assert (st["a"], st["why"]) == ("yes", "it rains")
    assert st.messages()[-1] == {"role": "assistant", "content": "yes, because it rains"}
    assert be.kinds() == ["score", "generate"]
    prompt, params = be.calls[1][1]
    assert (prompt.role, prompt.role_text, params.max_new_tokens) == ("assistant", "yes", 16)


@pytest.mark.parametrize("pick", [lambda: sgl.gen("a", choices=["yes", "no"]), lambda: sgl.select("a", ["yes", "no"])])
def test_a_pick_after_a_speculated_chat_roles_held_text_on_an_openai_chat_model_is_told_chat_apis_score_none(pick):
    """On lmnb.OpenAI's chat model the refusal said to put the pick in an assistant role of its own,
    or to run without num_api_spec_tokens: each then failed with "select() needs prompt logprobs,
    which chat APIs do not return". That refusal, whose fixes run (a completion model, another
    backend, a json_schema enum), now comes first, before any call (127.0.0.1:9 answers nothing)."""

    @sgl.function(num_api_spec_tokens=16)
    def prog(s):
        s += sgl.user("q")
        s += sgl.assistant("Name: " + sgl.gen("name", stop=" ") + " ok? " + pick())

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1")).text()
    said = str(e.value)
    assert "BackendCannotRun: select() needs prompt logprobs, which chat APIs do not return; use a completion model" \
        in said and "json_schema {'enum': [...]}" in said
    assert "assistant role of its own" not in said


def test_the_json_schema_enum_fix_of_a_chat_models_pick_says_where_the_gen_runs_and_it_runs_there():
    """The refusal of a pick on a chat model offered "constrain a gen with json_schema {'enum': [...]}"
    alone; put where the pick was, after text in its speculated role, that gen was refused in turn
    ("has json_schema=... in an assistant role that also holds text"), and its value is the choice
    quoted, '"yes"', not 'yes'. The refusal says where the gen runs, and what its value is; so
    placed, it runs."""

    @sgl.function(num_api_spec_tokens=16)
    def picking(s):
        s += sgl.user("q")
        s += sgl.assistant("Name: " + sgl.gen("name", stop=" ") + " ok? " + sgl.select("a", ["yes", "no"]))

    with pytest.raises(sgl.ProgramError) as e:
        picking.run(backend=sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1")).text()
    assert ("constrain a gen with json_schema {'enum': [...]} at the start of an assistant message (alone in it under "
            "num_api_spec_tokens), whose value is the choice as JSON, quoted ('\"yes\"')") in str(e.value)

    @sgl.function(num_api_spec_tokens=16)
    def fixed(s):
        s += sgl.user("q")
        s += sgl.assistant("Name: " + sgl.gen("name", stop=" ") + " ok?")
        s += sgl.assistant(sgl.gen("a", json_schema={"enum": ["yes", "no"]}))

    be = ScriptedBackend(lambda p, params: "Name: Ann ok?" if params.json_schema is None else '"yes"',
                         chat_template=CHATML, is_chat_model=True)
    st = fixed.run(backend=be)
    assert (st["name"], st["a"]) == ("Ann", '"yes"')


@pytest.mark.parametrize("gen", [lambda: sgl.gen("a", regex=r"[0-9]+"), lambda: sgl.gen("a", dtype=int),
                                 lambda: sgl.gen("a", json_schema=_PERSON)])
def test_a_constrained_chat_gen_after_text_without_speculation_is_not_told_to_speculate(gen):
    """Without num_api_spec_tokens, lmnb.OpenAI's chat model refused a gen after text in its reply with
    the fix "use @function(num_api_spec_tokens=N)", which refuses a regex, JSON schema or dtype gen
    beside text in its role (the call's constraint would hold the whole reply). For such a gen the
    fixes are the others: a completion model, or continue_final_message (before any call: 127.0.0.1:9
    answers nothing)."""

    @sgl.function
    def prog(s):
        s += sgl.user("Say it.")
        s += sgl.assistant("Answer: " + gen())

    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1")).text()
    said = str(e.value)
    assert ("an OpenAI chat model can only generate at the start of an assistant message (s += assistant(gen(...)); "
            "in a %%lm cell {assistant}{gen x}{/assistant}); use a completion model (OpenAI(..., is_chat_model=False); "
            "in a notebook %lm connect URL --openai MODEL --completion) — or, inside a reply on a vLLM, SGLang or "
            "lmnb serve server, have it continue the reply's text: OpenAI(..., continue_final_message=True)") in said
    assert "num_api_spec_tokens" not in said


@pytest.mark.parametrize("chat", [True, False])
def test_a_speculated_program_run_with_stream_is_refused_naming_the_fixes(chat):
    """run(stream=True) of a program with num_api_spec_tokens failed at its first gen with "API
    speculative execution (num_api_spec_tokens) does not work with stream=True", naming no way out."""
    be = ScriptedBackend(lambda p, params: "Carol", chat_template=CHATML, is_chat_model=chat)

    @sgl.function(num_api_spec_tokens=16)
    def prog(s):
        s += sgl.user("q")
        s += sgl.assistant(sgl.gen("a", max_tokens=4))

    with pytest.raises(sgl.ProgramError) as e:
        "".join(prog.run(backend=be, stream=True).text_iter("a"))
    said = str(e.value)
    assert "API speculative execution (num_api_spec_tokens) does not work with stream=True" in said
    assert said.endswith("run the program without stream=True, or stream it from a program without "
                         "num_api_spec_tokens")
    assert be.kinds() == []


@pytest.mark.parametrize("a, b, want", [
    # _PIECES by hand: "Name" ":" " Carol" | " Ann" "\n" | "Age" ":" " 4" "1" "\n" (the call's end: its finish)
    (dict(max_tokens=3), dict(max_tokens=2), {"a": ("Name: Carol", {"type": "length", "length": 3}, 3),
                                              "b": (" Ann\n", {"type": "length", "length": 2}, 2),
                                              "c": ("Age: 41\n", {"type": "stop"}, 5)}),
    # a stop that a's max_tokens end before: without speculation a writes "Name" alone, b goes on from there
    (dict(max_tokens=1, stop="\n"), dict(max_tokens=2), {"a": ("Name", {"type": "length", "length": 1}, 1),
                                                         "b": (": Carol", {"type": "length", "length": 2}, 2),
                                                         "c": (" Ann\nAge: 41\n", {"type": "stop"}, 7)}),
    # the stop is whole within a's max_tokens: it ends a there, as before; b's share starts with the stop's
    # text, its first token " Carol" (a's last too: it wrote the stop), as without speculation b writes it anew
    (dict(max_tokens=8, stop=" "), dict(max_tokens=2), {"a": ("Name:", {"type": "stop", "matched": " "}, 3),
                                                        "b": (" Carol Ann", {"type": "length", "length": 2}, 2),
                                                        "c": ("\nAge: 41\n", {"type": "stop"}, 6)}),
])
def test_a_speculated_chat_gen_right_before_another_ends_at_its_own_max_tokens(a, b, want):
    """gen("a", max_tokens=3) + gen("b", max_tokens=2) + gen("c") in one assistant role was refused
    after 3 calls ("gen 'a' met no stop ..., and no fill comes before gen 'b' to end it"), though
    each share is cut at its gen's max_tokens: the reply is split there where its tokens are known,
    the text after a's tokens b's, as without speculation each gen writes its tokens and the next
    goes on (the engine gives the same on the demo model). One call."""
    be = _Tokens(chat_template=CHATML, is_chat_model=True)

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Describe a person.")
        s += sgl.assistant(sgl.gen("a", **a) + sgl.gen("b", **b) + sgl.gen("c"))

    st = prog.run(backend=be)
    got = {k: (st[k], st.get_meta_info(k)["finish_reason"], st.get_meta_info(k)["completion_tokens"]) for k in "abc"}
    assert got == want
    assert st.messages()[-1] == {"role": "assistant", "content": "".join(want[k][0] for k in "abc")}
    assert be.kinds() == ["generate"]


@pytest.mark.parametrize("continues, fix", [
    (False, "; or, on a vLLM, SGLang or lmnb serve server, run without API speculative execution (@function without "
            "num_api_spec_tokens) and with OpenAI(..., continue_final_message=True) (in a notebook %lm connect URL "
            "--openai MODEL --continue-final-message): each gen then continues the reply in a call of its own"),
    (True, "; or run without API speculative execution (@function without num_api_spec_tokens): each gen then "
           "continues the reply in a call of its own"),
])
def test_a_speculated_chat_reply_off_the_pattern_on_openai_names_a_way_off_speculation_that_runs(continues, fix):
    """gen("a", max_tokens=100) + gen("b", max_tokens=3) on lmnb serve's demo model (its reply 'Arvel
    lives in Udrin.' and an EOS) was refused with "give gen 'a' a stop; or turn API speculative
    execution off (@function without num_api_spec_tokens)"; on lmnb.OpenAI's chat model, that
    program without num_api_spec_tokens was refused in turn ("an OpenAI chat model can only generate
    at the start of an assistant message ... use @function(num_api_spec_tokens=N)"), a loop. The
    refusal now names the way off speculation the backend runs: with continue_final_message
    (each gen a call of its own, which ran on lmnb serve), and none on OpenAI's own API."""
    from lmnb.backend.base import Completion

    class Replying(sgl.OpenAI):
        def generate(self, prompt, params, rid):
            return [Completion("Arvel lives in Udrin.", {"id": rid, "finish_reason": {"type": "stop"}})]

    @sgl.function(num_api_spec_tokens=8)
    def prog(s):
        s += sgl.user("Where does Arvel live?")
        s += sgl.assistant(sgl.gen("a", max_tokens=100) + sgl.gen("b", max_tokens=3))

    be = Replying("m", base_url="http://127.0.0.1:9/v1", api_key="k", continue_final_message=continues)
    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=be).text()
    assert str(e.value).endswith("and no fill comes before gen 'b' to end it: give gen 'a' a stop" + fix)
    official = Replying("gpt-4o", api_key="k")  # (OpenAI's own API continues no reply: no way off speculation is offered)
    with pytest.raises(sgl.ProgramError) as e:
        prog.run(backend=official).text()
    assert str(e.value).endswith("and no fill comes before gen 'b' to end it: give gen 'a' a stop")


class _TokensThenEos(_Tokens):
    """_Tokens with an EOS after the reply's text: a token the text skips, as the engine's chat reply ends."""

    def generate(self, prompt, params, rid):
        [out] = super().generate(prompt, params, rid)
        out.meta_info["output_token_logprobs"].append([-0.1, 2, "</s>"])
        out.meta_info["completion_tokens"] += 1
        out.meta_info["finish_reason"] = {"type": "stop", "matched": 2}
        return [out]


def test_a_speculated_chat_gen_right_before_another_whose_max_tokens_end_with_the_text_leaves_the_eos_to_it():
    """gen("a", max_tokens=10) + gen("b"), the reply's 10 tokens of text then an EOS (_PIECES by hand):
    without speculation a writes the 10 (length) and b the EOS alone ("", stop); the split was refused
    ("gen 'a' met no stop ...")."""
    be = _TokensThenEos(chat_template=CHATML, is_chat_model=True)

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Describe a person.")
        s += sgl.assistant(sgl.gen("a", max_tokens=10, return_logprob=True) + sgl.gen("b"))

    st = prog.run(backend=be)
    a, b = st.get_meta_info("a"), st.get_meta_info("b")
    assert (st["a"], a["finish_reason"], a["completion_tokens"]) == ("".join(_PIECES), {"type": "length", "length": 10},
                                                                      10)
    assert [e[2] for e in a["output_token_logprobs"]] == [None] * 10
    assert (st["b"], b["finish_reason"], b["completion_tokens"]) == ("", {"type": "stop", "matched": 2}, 1)


_LOGPROBS_REFUSALS = {
    # OpenAI's o-series reasoning models: the field named in the error's param
    "param": {"message": "Unsupported parameter: 'logprobs' is not supported with this model.",
              "type": "invalid_request_error", "param": "logprobs", "code": "unsupported_parameter"},
    # a host that names the field in its message only
    "message": {"message": "This model does not support the parameter `logprobs`.", "type": "invalid_request_error",
                "param": None, "code": None},
}


@contextlib.contextmanager
def _refusing_logprobs(refusal: dict, reply: str = "Name: Carol Ann\nAge: 41"):
    """An OpenAI-compatible server on 127.0.0.1 that answers HTTP 400 ``refusal`` (an OpenAI error
    object) to a request with a ``logprobs`` field and ``reply`` (9 tokens) to one without (a chat
    completion, or a completion on /v1/completions); yields its /v1 URL and the list of the
    request bodies it got."""
    from http.server import BaseHTTPRequestHandler

    bodies: list = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if "logprobs" in body:
                send(self, 400, json.dumps({"error": refusal}).encode())
                return
            chat = self.path.endswith("/chat/completions")
            choice = {"message": {"role": "assistant", "content": reply}} if chat else {"text": reply}
            send(self, 200, json.dumps({
                "id": "c1", "object": "chat.completion" if chat else "text_completion", "created": 0,
                "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop", **choice}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}).encode())

    with serve_http(Handler) as url:
        yield f"{url}/v1", bodies


@pytest.mark.parametrize("refusal", list(_LOGPROBS_REFUSALS))
def test_a_speculated_chat_role_on_a_server_that_refuses_logprobs_is_cut_by_characters(refusal):
    """The role's call asks for logprobs where a gen's max_tokens is under num_api_spec_tokens (to
    find its tokens); a server that refuses the field (HTTP 400 naming logprobs: OpenAI's o-series
    models, some hosts) failed the role, which ran before the call asked. The call is now made again
    without logprobs and each share cut at max_tokens characters (the fallback where tokens are not
    known); the backend's model is remembered, so the next role asks no more. By hand: the reply
    "Name: Carol Ann\\nAge: 41" (9 tokens, more than name's 4) splits into " Carol Ann" (stop "\\n")
    and " 41"; name's 4 characters are " Car"."""
    with _refusing_logprobs(_LOGPROBS_REFUSALS[refusal]) as (url, bodies):
        be = sgl.OpenAI("m", base_url=url, api_key="k", chat_template=CHATML)
        try:
            prog = _role(dict(max_tokens=4), {})
            st = prog.run(backend=be)
            assert (st["name"], st["age"]) == (" Car", " 41")
            assert st.get_meta_info("name")["finish_reason"] == {"type": "length"}
            assert ["logprobs" in b for b in bodies] == [True, False]
            assert bodies[1]["max_tokens"] == 32
            again = prog.run(backend=be)
            assert (again["name"], again["age"]) == (" Car", " 41")
            assert ["logprobs" in b for b in bodies] == [True, False, False]  # (not asked again)
        finally:
            be.shutdown()


def test_a_speculated_chat_role_whose_gen_asks_for_logprobs_on_a_server_that_refuses_them_fails_with_its_refusal():
    # (the gen's own logprobs cannot be dropped: the server's refusal is the gen's error, after one request)
    with _refusing_logprobs(_LOGPROBS_REFUSALS["param"]) as (url, bodies):
        be = sgl.OpenAI("m", base_url=url, api_key="k", chat_template=CHATML)
        try:
            with pytest.raises(sgl.ProgramError, match="HTTP 400: Unsupported parameter: 'logprobs' is not supported "
                               "with this model.; this server gives no logprobs for model 'm': drop return_logprob "
                               "\\(and top_logprobs_num\\) from the gen"):
                _role(dict(max_tokens=4), dict(return_logprob=True)).run(backend=be).text()
            assert len(bodies) == 1
        finally:
            be.shutdown()


@pytest.mark.parametrize("path", ["/v1", "/logprobs-proxy/v1"])
def test_a_speculated_chat_role_refused_for_another_field_is_not_called_again(path):
    # (a server under a path with the word logprobs, which the error's route names, was taken for a
    # refusal of them, and called again)
    refusal = {"message": "temperature must be at most 2", "type": "invalid_request_error", "param": "temperature"}
    with _refusing_logprobs(refusal) as (url, bodies):
        be = sgl.OpenAI("m", base_url=url.removesuffix("/v1") + path, api_key="k", chat_template=CHATML)
        try:
            with pytest.raises(sgl.ProgramError, match="HTTP 400: temperature must be at most 2"):
                _role(dict(max_tokens=4), {}).run(backend=be).text()
            assert len(bodies) == 1
        finally:
            be.shutdown()


def test_a_reworded_refusal_of_logprobs_is_still_one():
    """backend.base.reworded (which adds a note to a server's error: the speculation's token count,
    a run's max_tokens) kept the error's reason alone: its param and HTTP status went, and a
    refusal of logprobs reworded so was no longer known as one."""
    from lmnb.backend.base import BackendError, reworded
    from lmnb.speculative import refuses_logprobs

    e = BackendError("http://h/v1/chat/completions: HTTP 400: Unsupported parameter: 'logprobs'", "r", "logprobs", 400)
    again = reworded(e, f"{e} (a note)")
    assert (str(again), again.reason, again.param, again.status) == (f"{e} (a note)", "r", "logprobs", 400)
    assert refuses_logprobs(again)


def test_a_speculated_completion_gen_on_a_server_that_refuses_logprobs_runs_on_the_calls_text():
    """The completion path's call always asks for logprobs (to find the gen's tokens): a server that
    refuses the field failed the gen. The call is now made again without them, as the chat role's
    is (the shares cut by characters where max_tokens comes first), and not asked again. By hand:
    the call's text " Carol Ann\nAge: 41\n" gives name " Carol Ann" (its stop "\n" within 16
    characters), the fill "\nAge:" matches, and age takes " 41" of the leftover: one call."""
    with _refusing_logprobs(_LOGPROBS_REFUSALS["param"], reply=" Carol Ann\nAge: 41\n") as (url, bodies):
        be = sgl.OpenAI("m", base_url=url, api_key="k", is_chat_model=False)
        try:
            @sgl.function(num_api_spec_tokens=32)
            def person(s):
                s += "Name:" + sgl.gen("name", stop="\n", max_tokens=16)
                s += "\nAge:" + sgl.gen("age", stop="\n")

            st = person.run(backend=be)
            assert (st["name"], st["age"]) == (" Carol Ann", " 41")
            assert ["logprobs" in b for b in bodies] == [True, False] and bodies[1]["max_tokens"] == 32
            assert person.run(backend=be)["name"] == " Carol Ann"
            assert ["logprobs" in b for b in bodies] == [True, False, False]  # (not asked again)
        finally:
            be.shutdown()
