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
