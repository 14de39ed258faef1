"""Role markers derived from Jinja chat templates reproduce ``transformers``'
``apply_chat_template`` exactly; templates that cannot be markers fall back with a warning."""

from __future__ import annotations

import pytest

import lmnb as sgl
from helpers_lang import ScriptedBackend
from lmnb.chat_template import from_jinja
from lmnb_engine.testing.tiny_checkpoint import CHAT_TEMPLATE as TINY

CHATML_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a careful helper.<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HEADER_TRIM = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = m['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + m['content'] + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# System text folded into the first user message: not expressible as fixed per-role markers.
FOLDED_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns = m['content'] %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' }}{% if loop.index0 == 1 %}{{ '<<SYS>>' + messages[0]['content'] + '<</SYS>> ' }}{% endif %}"
    "{{ m['content'] + ' [/INST]' }}{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + ' </s>' }}{% endif %}{% endfor %}"
)
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


CONVERSATIONS = [
    [("user", "Hi there")],
    [("system", "Be terse."), ("user", "Hi"), ("assistant", "Hello."), ("user", "Name a color")],
    [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four")],
]


@pytest.mark.parametrize("template", [TINY, CHATML_DEFAULT_SYSTEM, HEADER_TRIM], ids=["tiny", "chatml-default-system", "header-trim"])
def test_markers_reproduce_apply_chat_template(hf_tokenizer, template):
    tmpl = from_jinja(template, SPECIAL)
    for conv in CONVERSATIONS:
        msgs = [{"role": r, "content": c} for r, c in conv]
        for gen in (False, True) if conv[-1][0] == "user" else (False,):
            want = hf_tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=gen)
            assert tmpl.render(msgs, gen) == want


def test_default_system_prompt_is_found_and_inserted_by_programs(hf_tokenizer):
    tmpl = from_jinja(CHATML_DEFAULT_SYSTEM, SPECIAL)
    assert tmpl.default_system_prompt == "You are a careful helper."
    be = ScriptedBackend(lambda p, params: "blue", chat_template=tmpl)

    @sgl.function
    def chat(s):
        s += sgl.user("Name a color")
        s += sgl.assistant(sgl.gen("c"))
        s += sgl.user("Another")

    st = chat.run(backend=be)
    msgs = [{"role": "user", "content": "Name a color"}, {"role": "assistant", "content": "blue"}, {"role": "user", "content": "Another"}]
    want = hf_tokenizer.apply_chat_template(msgs, chat_template=CHATML_DEFAULT_SYSTEM, tokenize=False)
    assert st.text() == want
    assert st.messages()[0] == {"role": "system", "content": "You are a careful helper."}


def test_template_without_system_role_raises_for_system_only(hf_tokenizer):
    tmpl = from_jinja(NO_SYSTEM, SPECIAL)
    assert "system" not in tmpl.role_prefix_and_suffix
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert tmpl.render(msgs) == hf_tokenizer.apply_chat_template(msgs, chat_template=NO_SYSTEM, tokenize=False)
    with pytest.raises(ValueError, match="role 'system' is not supported"):
        tmpl.get_prefix_and_suffix("system")


def test_unexpressible_template_falls_back_with_a_warning():
    with pytest.warns(UserWarning, match="cannot be used as per-role markers"):
        tmpl = from_jinja(FOLDED_SYSTEM, SPECIAL, model_path="my-org/Qwen-tiny")
    assert tmpl.name == "qwen"
    assert from_jinja(None, SPECIAL, "meta-llama/Llama-3.1-8B-Instruct").name == "llama-3-instruct"
    with pytest.raises(ValueError, match="unknown chat template"):
        sgl.get_chat_template("nope")
