"""API speculative execution on chat models (``lmnb.speculative``: ``spec_role_check``,
``spec_role_end``): what one call per assistant role gives each of the role's gens, and what it
refuses. More of its tests are in test_lang_interpreter.py (``test_api_speculative_execution_*``,
``test_a_speculated_chat_*``)."""

from __future__ import annotations

import json

import pytest

import lmnb as sgl
from lmnb.chat_template import get_chat_template

from helpers_lang import ScriptedBackend

CHATML = get_chat_template("chatml")
_PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize("first, later", [
    (_PERSON, json.dumps(_PERSON)),
    (json.dumps(_PERSON), _PERSON),
    # (the same schema: its keys in another order, other whitespace)
    (json.dumps(_PERSON), json.dumps(_PERSON, indent=2)),
    (_PERSON, '{"required": ["name"],\n "properties": {"name": {"type": "string"}}, "type": "object"}'),
])
def test_a_speculated_chat_roles_json_schema_written_as_a_dict_and_as_a_string_is_one_schema(first, later):
    """The same JSON schema, once a dict and once its JSON text, was two different options: the
    later gen was refused ("gen 'b' has json_schema='{"type": ...' where gen 'a' ... has
    json_schema={'type': ...}"), though the one call draws both gens' text under that schema."""
    be = ScriptedBackend(lambda p, params: '{"name": "Ann"}\n{"name": "Bo"}', chat_template=CHATML,
                         is_chat_model=True)

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Two people.")
        s += sgl.assistant(sgl.gen("a", json_schema=first, stop="\n") + "\n" + sgl.gen("b", json_schema=later))

    st = prog.run(backend=be)
    assert (st["a"], st["b"]) == ('{"name": "Ann"}', '{"name": "Bo"}') and be.kinds() == ["generate"]


def test_a_speculated_chat_gen_with_another_json_schema_is_still_refused():
    """(The canonical form compares schemas, not their spelling: one that allows other output is
    another option.)"""
    be = ScriptedBackend(lambda p, params: '{"name": "Ann"}\n{"name": "Bo"}', chat_template=CHATML,
                         is_chat_model=True)
    other = json.dumps({**_PERSON, "required": []})

    @sgl.function(num_api_spec_tokens=32)
    def prog(s):
        s += sgl.user("Two people.")
        s += sgl.assistant(sgl.gen("a", json_schema=_PERSON, stop="\n") + "\n" + sgl.gen("b", json_schema=other))

    with pytest.raises(sgl.ProgramError, match="gen 'b' has json_schema=.* where gen 'a', the first gen of its "
                                               "assistant role, has json_schema="):
        prog.run(backend=be).text()
    assert be.kinds() == []


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
