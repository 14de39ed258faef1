"""``chat_template_kwargs`` (vLLM's and SGLang's chat extension: extra variables for the chat
template) and the top-level ``reasoning_effort`` reach the template, in process
(``Engine.apply_chat_template``) and over ``/v1/chat/completions``: the prompt is the one
transformers' ``apply_chat_template(..., **kwargs)`` renders on the same tokenizer. A value that is
no object, a key the render sets itself and two different reasoning efforts are 400s."""

from __future__ import annotations

import shutil

import httpx
import pytest

from helpers_lang import live_server

# A template reading variables as Qwen3's (enable_thinking) and gpt-oss's (reasoning_effort) do
TEMPLATE = (
    "{{ bos_token }}"
    "{% if reasoning_effort is defined %}<|system|>effort: {{ reasoning_effort }}<|end|>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "the cat is red"}]


@pytest.fixture(scope="module")
def ckpt(tiny_llama, tmp_path_factory):
    """``tiny_llama`` with ``TEMPLATE`` as its chat template."""
    import transformers

    path = tmp_path_factory.mktemp("kwargs-template") / "ckpt"
    shutil.copytree(tiny_llama, path)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def hf_tok(ckpt):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(ckpt))


@pytest.fixture(scope="module")
def engine(ckpt):
    from lmnb_engine import Engine

    with Engine(str(ckpt), max_total_tokens=2048) as eng:
        yield eng


class _Rendering:
    """``engine`` as the server sees it, keeping each prompt its ``apply_chat_template`` renders."""

    def __init__(self, engine):
        self._engine, self.rendered = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def apply_chat_template(self, *args, **kwargs):
        text = self._engine.apply_chat_template(*args, **kwargs)
        self.rendered.append(text)
        return text


@pytest.fixture(scope="module")
def served(engine):
    spy = _Rendering(engine)
    with live_server(spy, served_model_name="tiny") as url:
        yield spy, url


def _reference(hf_tok, **kwargs) -> str:
    return hf_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)


KWARGS = [{"enable_thinking": False}, {"reasoning_effort": "low", "enable_thinking": True}, {"unread": [1, {"a": 2}]}]


@pytest.mark.parametrize("kwargs", KWARGS, ids=["enable_thinking", "reasoning_effort", "unread"])
def test_engine_renders_chat_template_kwargs_as_transformers(engine, hf_tok, kwargs):
    want = _reference(hf_tok, **kwargs)
    assert engine.apply_chat_template(MESSAGES, True, kwargs) == want
    assert engine.apply_chat_template(MESSAGES, chat_template_kwargs=kwargs) == want
    if "unread" not in kwargs:  # (the variables change the prompt: the comparison above is no empty one)
        assert want != _reference(hf_tok)


@pytest.mark.parametrize("kwargs,error,said", [
    ([("enable_thinking", False)], TypeError, "chat_template_kwargs is an object of template variables"),
    ({1: True}, TypeError, "with string names"),
    ({"add_generation_prompt": False}, ValueError, "may not set 'add_generation_prompt'"),
    ({"messages": [], "tools": []}, ValueError, "may not set 'messages', 'tools'"),
    # names of transformers' own parameters: a second value for them was its TypeError ('got
    # multiple values for argument 'self''), not a word of chat_template_kwargs
    ({"self": 1}, ValueError, "may not set 'self'"),
    ({"conversations": []}, ValueError, "may not set 'conversations'"),
])
def test_engine_refuses_chat_template_kwargs_that_are_no_dict_or_set_the_renders_own(engine, kwargs, error, said):
    with pytest.raises(error, match=said):
        engine.apply_chat_template(MESSAGES, True, kwargs)


def _chat(url, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1, "temperature": 0, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


@pytest.mark.parametrize("fields,kwargs", [
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"enable_thinking": False}),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, {"reasoning_effort": "low"}),
    ({"reasoning_effort": "high"}, {"reasoning_effort": "high"}),
    ({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "high", "enable_thinking": False}},
     {"reasoning_effort": "high", "enable_thinking": False}),
    ({"chat_template_kwargs": {}}, {}),
    ({"chat_template_kwargs": None}, {}),
], ids=["enable_thinking", "kwargs-effort", "top-level-effort", "both-efforts-agree", "empty", "null"])
def test_chat_completions_renders_chat_template_kwargs_as_transformers(served, hf_tok, fields, kwargs):
    spy, url = served
    r = _chat(url, **fields)
    assert r.status_code == 200, r.text
    want = _reference(hf_tok, **kwargs)
    assert spy.rendered[-1] == want
    # the engine was given that prompt: its token count (the template wrote the BOS)
    assert r.json()["usage"]["prompt_tokens"] == len(hf_tok.encode(want, add_special_tokens=False))


@pytest.mark.parametrize("fields,param,said", [
    ({"chat_template_kwargs": [{"enable_thinking": False}]}, "chat_template_kwargs",
     'chat_template_kwargs is an object of template variables with string names (e.g. {"enable_thinking": false}), '
     'got [{"enable_thinking": false}]'),
    ({"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs", 'got "enable_thinking=false"'),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs",
     "chat_template_kwargs may not set 'add_generation_prompt': the chat template gets it from the request itself"),
    ({"chat_template_kwargs": {"continue_final_message": True, "add_generation_prompt": False}},
     "chat_template_kwargs",
     "chat_template_kwargs may not set 'add_generation_prompt', 'continue_final_message': the chat template gets it "
     "from the request itself (the messages, and a generation prompt for the reply); leave it out of "
     "chat_template_kwargs (add_generation_prompt and continue_final_message are the request's own parameters, "
     "beside messages: set them there)"),
    ({"chat_template_kwargs": {"messages": [], "chat_template": "x"}}, "chat_template_kwargs",
     "may not set 'chat_template', 'messages'"),
    ({"chat_template_kwargs": {"self": 1}}, "chat_template_kwargs", "chat_template_kwargs may not set 'self'"),
    ({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}, "reasoning_effort",
     "reasoning_effort \"high\" and chat_template_kwargs' reasoning_effort \"low\" differ"),
    ({"reasoning_effort": 5}, "reasoning_effort", "reasoning_effort: Input should be a valid string (got 5)"),
], ids=["list", "string", "add_generation_prompt", "the-requests-own-fields", "messages-chat_template", "self", "efforts-differ", "effort-no-string"])
def test_chat_completions_refuses_bad_chat_template_kwargs_with_a_400(served, fields, param, said):
    spy, url = served
    before = len(spy.rendered)
    r = _chat(url, **fields)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and said in err["message"], err
    assert len(spy.rendered) == before  # refused before the template ran
