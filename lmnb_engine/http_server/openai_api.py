"""OpenAI-compatible routes of ``lmnb serve``: ``/v1/models`` (and ``/v1/models/{model}``),
``/v1/completions``, ``/v1/chat/completions``.

Request and response shapes are the OpenAI API's (what the official ``openai`` client sends and
parses), with the sampling extensions SGLang's and vLLM's OpenAI servers accept (``top_k``,
``min_p``, ``min_tokens``, ``repetition_penalty``, ``ignore_eos``, ``stop_token_ids``,
``stop_regex``, ``skip_special_tokens``, ``regex``, ``json_schema``), and on chat their
``chat_template_kwargs``, extra variables for the chat template (``_template_kwargs``), and
``add_generation_prompt`` / ``continue_final_message``: the prompt ends with a new assistant turn's
header, with neither, or inside the last message, an assistant's partial reply that the model
continues, its reply's content the continuation alone (``_prompt_end``), or with vLLM's ``echo``
that partial reply and the continuation (``_echoed``).
``response_format`` ``json_schema`` / ``json_object`` and ``regex`` reach the engine's
``SamplingParams`` unchanged. Unknown fields are rejected with a 400 naming them rather than
ignored; fields OpenAI defines that leave the reply unchanged here (``store``, ``metadata``,
``user``, ``verbosity``...: ``ChatRequest.IGNORED``) are accepted and ignored, and those asking for
what lmnb does not do (tools, audio, web search) are refused by name. ``logit_bias`` (its keys
token ids as strings, as OpenAI's API has them; biases in [-100, 100]) reaches
``SamplingParams.logit_bias``, which reads the keys as ints; the logprobs of a biased reply are
the model's own, before the bias (``lmnb_engine.sampler``), where OpenAI reports them after it. A response's
``id`` is its request's rid, as in SGLang: ``POST /abort_request {"rid": id}`` aborts its choices,
which end with finish reason ``abort`` (and lmnb's ``finish_message``: ``_finish``). A client names
the rid itself with SGLang's ``rid`` field (a non-empty string), so that it can abort a request that
is not streamed before its response brings the id; a rid still in use by a running request is a 400.
The engine rid of one prompt is the rid itself (its ``n`` choices share it); of prompt k of several,
``<rid>-<k>`` (SGLang's per-sample rids are ``<rid>_<i>``): either way ``/abort_request`` with the
rid aborts every choice.
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from typing import Any, AsyncIterator, ClassVar, Literal, Optional, Sequence, Union, get_args, get_origin

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from lmnb_engine.chat_messages import (
    TEMPLATE_REJECTED, missing_content, misspelt_key, template_kwargs, template_role, with_call_arguments,
)
from lmnb_engine.detokenizer import IncrementalDetokenizer
from lmnb_engine.http_server.app import (
    SSE_DONE,
    EventStream,
    ServerContext,
    check_rid,
    check_samples,
    encode_prompt,
    entry_error,
    field_place,
    not_an_object,
    response_rids,
    rid_clash,
    sse,
)
from lmnb_engine.http_server.echo import echoed_prompt
from lmnb_engine.http_server.protocol import (
    ABORTED_BY_SHUTDOWN,
    RequestError,
    RequestFailed,
    client_message,
    did_you_mean,
    finite,
    refused_field,
    refused_value,
    served_message,
    wire_message,
)
from lmnb_engine.json_schema import json_value
from lmnb_engine.multimodal.inputs import MultimodalPrompt
from lmnb_engine.params import (DOES_NOT_FIT, MAX_TOP_LOGPROBS, SamplingParams, SamplingParamsError,
                                in_front_end_names, past_context_refusal, shorten_fix)
from lmnb_engine.token_text import token_bytes, token_text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    """``stream_options`` of an OpenAI request."""
    include_usage: Optional[StrictBool] = False
    continuous_usage_stats: Optional[StrictBool] = False  # vLLM's and SGLang's; only false (the default) is served


class JsonSchemaSpec(BaseModel):
    """``response_format.json_schema``: the schema under ``schema``, with OpenAI's name, description
    and strict."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[dict] = Field(default=None, alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(_Strict):
    """``response_format``: ``text``, ``json_object`` or ``json_schema``."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None


class _SamplingRequest(_Strict):
    # Optional, as on SGLang's server (its default "default") and vLLM's: curl and scripts written
    # for them leave it out, and there is one model to serve; OpenAI's API requires it
    model: str = "default"
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    user: Optional[str] = None
    # {token id as a string: bias}; Any values, so that SamplingParams' check names a bad one's key
    logit_bias: Optional[dict[str, Any]] = None
    response_format: Optional[ResponseFormat] = None
    # extensions (SGLang / vLLM names)
    top_k: int = -1
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    ignore_eos: StrictBool = False
    stop_token_ids: Optional[list[StrictInt]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    skip_special_tokens: StrictBool = True
    regex: Optional[str] = None
    json_schema: Optional[Union[str, dict]] = None
    rid: Optional[str] = None  # SGLang's: the response id, for /abort_request (module docstring)

    IGNORED: ClassVar[tuple] = ("user",)  # OpenAI's fields accepted and ignored (ChatRequest.IGNORED)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """A top-level null is the field's default: the OpenAI API marks its optional fields
        nullable (``"n": null``, ``"stream": null``, ``"presence_penalty": null``), and clients send
        null for a Python None (the official one for ``n=None``); OpenAI, vLLM and SGLang serve them."""
        if not isinstance(data, dict):
            return data
        # (a required field's null stays, refused as null: "prompt: Field required" was said of "prompt": null)
        return {k: v for k, v in data.items() if v is not None or k in cls.model_fields and
                cls.model_fields[k].is_required()}


class CompletionRequest(_SamplingRequest):
    """The body of ``POST /v1/completions``."""
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: StrictBool = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_prompt_form(cls, value: Any, handler: Any) -> Any:
        """The prompt's form is read from its first item (a string, a token id, a list of ids) and
        a wrong item is named in its place (``prompt[1]``, ``prompt[1][0]``): pydantic's union
        message blamed the first alternative it tried, so ``[5, true]`` was refused for its good id
        5. A bool is no token id."""
        if isinstance(value, str) or (isinstance(value, list) and not value):
            return value  # ([] is refused as an empty prompt by the route)
        if not isinstance(value, list):
            raise _prompt_error("", f"it is {json_value(value, 40)}")
        if isinstance(value[0], str):
            bad = next((i for i, x in enumerate(value) if not isinstance(x, str)), None)
            if bad is not None:
                raise _prompt_error(f"[{bad}]", f"{json_value(value[bad], 40)} is not a string, in a list of strings")
            return value
        if not isinstance(value[0], list):
            return _token_ids(value, "")
        for i, x in enumerate(value):
            if not isinstance(x, list):
                raise _prompt_error(f"[{i}]", f"{json_value(x, 40)} is not a list of token ids, in a list of them")
            _token_ids(x, f"[{i}]")
        return value


def _token_ids(items: list, at: str) -> list:
    """``items`` (the prompt's list of ids at ``at``) if each is an int (a JSON integer, not true
    or false), else the error naming the first that is not."""
    for i, t in enumerate(items):
        if type(t) is not int:
            raise _prompt_error(f"{at}[{i}]", f"{json_value(t, 40)} is not a token id")
    return items


def _prompt_error(at: str, what: str) -> PydanticCustomError:
    """The prompt's error ``what`` about its item ``at`` (``[1][0]``; "" for the prompt itself),
    which the server's validation-error handler appends to the field's place."""
    # (the text goes in as context: a template would read braces in the value as its fields)
    return PydanticCustomError("prompt", "{msg}", {"msg": f"{what}; {_PROMPT_FORMS}", "at": at})


_PROMPT_FORMS = "a prompt is a string, a list of strings, a list of token ids (ints) or a list of such lists"


class ContentPart(BaseModel):
    """One part of a chat message's content (``text`` or ``image_url``)."""
    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    """One chat message: role and content (a string or parts)."""
    model_config = ConfigDict(extra="allow")
    role: str
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None


class ChatRequest(_SamplingRequest):
    """The body of ``POST /v1/chat/completions``."""
    messages: list[ChatMessage]
    max_completion_tokens: Optional[int] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[int] = None
    tools: Optional[list] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[StrictBool] = None
    # vLLM's and SGLang's extra variables for the chat template; Any, so that a value that is no
    # object gets template_kwargs' message. reasoning_effort (OpenAI's) is one more (_template_kwargs)
    chat_template_kwargs: Optional[Any] = None
    reasoning_effort: Optional[str] = None
    # vLLM's and SGLang's: how the prompt ends, a new assistant turn or the last message continued
    # (_prompt_end); add_generation_prompt's default (None) is true unless continue_final_message is
    add_generation_prompt: Optional[bool] = None  # (_validate takes only true, false and null)
    continue_final_message: StrictBool = False
    # vLLM's: the reply's content starts with the last message's, where that is the assistant's (_echoed)
    echo: StrictBool = False
    functions: Optional[list] = None  # (OpenAI's deprecated tool calling: refused as tools are)
    function_call: Optional[Any] = None
    # OpenAI's fields that ask for what lmnb serve cannot give: refused when set (_refuse_unserved)
    modalities: Optional[list] = None  # only ["text"] is served
    audio: Optional[Any] = None
    web_search_options: Optional[Any] = None
    # OpenAI's fields that leave the reply unchanged here: accepted and ignored (IGNORED)
    store: Optional[Any] = None
    metadata: Optional[Any] = None
    # OpenAI's tiers (its API reference; the openai package's CompletionCreateParams adds "fast"):
    # another value is a 400 there, and here (pydantic's literal_error, in app.pydantic_message's words)
    service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority", "fast"]] = None
    prediction: Optional[Any] = None
    safety_identifier: Optional[Any] = None
    prompt_cache_key: Optional[Any] = None
    prompt_cache_retention: Optional[Any] = None
    verbosity: Optional[Any] = None

    # OpenAI's chat fields that lmnb serve accepts and ignores: storage and tracking (``store``,
    # ``metadata``, ``user``, ``safety_identifier``), OpenAI's own scheduling and caching
    # (``service_tier``, whose reply names the tier used, ``_served_tier``; ``prompt_cache_key``,
    # ``prompt_cache_retention``), ``prediction`` (a speed-up
    # that leaves the output as it is), and ``verbosity``, a hint to OpenAI's reasoning models that
    # chat templates do not read; vLLM and SGLang accept them too. The unknown-field error leaves them
    # out of the fields it lists, and the OpenAI fields only there to be refused (UNSERVED).
    IGNORED: ClassVar[tuple] = ("metadata", "prediction", "prompt_cache_key", "prompt_cache_retention",
                                "safety_identifier", "service_tier", "store", "user", "verbosity")
    UNSERVED: ClassVar[tuple] = ("audio", "function_call", "functions", "modalities", "web_search_options")


def _refuse_unserved(req: ChatRequest) -> None:
    """Refuse a chat request that asks for what lmnb serve does not do, naming the field and the
    fix: tool calling (``tools``, ``tool_choice`` other than ``"none"``, the deprecated
    ``functions`` / ``function_call``), audio output (``audio``, ``modalities`` beyond ``["text"]``)
    and web search (``web_search_options``). Ignoring them would answer a different request
    without a word: a reply with no tool call, no audio, no search."""
    if req.tools or req.tool_choice not in (None, "none"):
        raise RequestError('tool calling is not supported by lmnb serve; leave out tools and tool_choice (or send '
                           'tool_choice "none")', param="tools")
    if req.functions or req.function_call not in (None, "none"):
        raise RequestError('function calling is not supported by lmnb serve; leave out functions and function_call '
                           '(or send function_call "none")', param="functions" if req.functions else "function_call")
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise RequestError(f"modalities {json_value(req.modalities, 40)} is not supported by lmnb serve: it replies "
                           'with text only; leave modalities out (or send ["text"])', param="modalities")
    for field in ("audio", "web_search_options"):
        if getattr(req, field) is not None:
            raise RequestError(f"{field} is not supported by lmnb serve; leave it out", param=field)


def _reply_limit(req: ChatRequest) -> Optional[int]:
    """Chat request ``req``'s limit on the reply's tokens: ``max_completion_tokens`` (OpenAI's name)
    or ``max_tokens`` (its deprecated one), None where neither is given. Both with one value is that
    value; with two values, vLLM and SGLang take ``max_completion_tokens`` without a word, which cuts
    a reply at a length the client may not have meant; OpenAI refuses the two together.

    Raises:
        RequestError: both are given, with different values.
    """
    if req.max_completion_tokens is not None and req.max_tokens is not None \
            and req.max_completion_tokens != req.max_tokens:
        raise RequestError(f"max_tokens={req.max_tokens} and max_completion_tokens={req.max_completion_tokens} "
                           "disagree; give one of them (max_completion_tokens is OpenAI's current name, max_tokens "
                           "the deprecated one)", param="max_tokens")
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def _template_kwargs(req: ChatRequest) -> dict:
    """The chat template's extra variables of chat request ``req``: its ``chat_template_kwargs``
    (checked by ``chat_messages.template_kwargs``) and its top-level ``reasoning_effort`` as the
    variable of that name, which templates of reasoning models read (gpt-oss's), as vLLM passes it.
    Where both name a reasoning effort they must agree: vLLM lets the top-level one win without a
    word, SGLang's call fails on the second value; here it is a 400 naming both.

    Raises:
        RequestError: ``chat_template_kwargs`` is no object or sets a reserved variable, or its
            ``reasoning_effort`` differs from the top-level one.
    """
    try:
        kwargs = template_kwargs(req.chat_template_kwargs)
    except (TypeError, ValueError) as e:
        raise RequestError(str(e), param="chat_template_kwargs") from None
    if req.reasoning_effort is not None:
        given = kwargs.setdefault("reasoning_effort", req.reasoning_effort)
        if given != req.reasoning_effort:
            raise RequestError(f"reasoning_effort {json_value(req.reasoning_effort, 40)} and chat_template_kwargs' "
                               f"reasoning_effort {json_value(given, 40)} differ; both set the chat template's "
                               "reasoning_effort: send one of them", param="reasoning_effort")
    return kwargs


def _prompt_end(req: ChatRequest) -> dict:
    """How chat request ``req``'s prompt ends, as ``Engine.apply_chat_template``'s keyword arguments
    (transformers' ``apply_chat_template``'s): with the assistant's header, for a new reply
    (``add_generation_prompt``, vLLM's and SGLang's field, true by default), or inside the last
    message, an assistant's partial reply that the model continues (``continue_final_message``:
    "prefill"; the reply's content is the continuation alone, as vLLM's and SGLang's). vLLM wants
    ``add_generation_prompt`` sent false beside it (transformers refuses the two); SGLang's clients
    send ``continue_final_message`` alone, and here that means the same. A last message of another
    role is refused: vLLM continues it as the assistant's reply, SGLang answers a new turn without a word.

    Raises:
        RequestError: both are sent true; or ``continue_final_message`` with a last message that is
            not the assistant's (``req.messages`` is not empty: the route checks that first).
    """
    if not req.continue_final_message:
        return {"add_generation_prompt": req.add_generation_prompt is not False, "continue_final_message": False}
    if req.add_generation_prompt:
        raise RequestError("continue_final_message continues the last message, and add_generation_prompt starts a "
                           "new assistant turn after it; send add_generation_prompt false (or leave it out) with "
                           "continue_final_message", param="add_generation_prompt")
    last = len(req.messages) - 1
    if req.messages[last].role != "assistant":
        raise RequestError(f"continue_final_message continues the last message as the assistant's reply, and "
                           f"messages[{last}] is a {json_value(req.messages[last].role, 40)} message; end the messages "
                           'with the start of the reply, {"role": "assistant", "content": "..."}, or leave '
                           "continue_final_message out for a new reply", param="messages")
    return {"add_generation_prompt": False, "continue_final_message": True}


def _echoed(req: ChatRequest, messages: list) -> str:
    """The text each choice's content of chat request ``req`` starts with: with vLLM's ``echo``, the
    last message's content (``messages``, as the template got them: text parts joined) where that
    message is the assistant's, the reply's role, so that a prefilled reply
    (``continue_final_message``) comes back whole; "" otherwise. vLLM echoes a last message of the
    reply's role with a new turn too (``add_generation_prompt``), and so does this; every choice
    (``n``) starts with it."""
    last = messages[-1] if req.echo else None
    return last["content"] if last is not None and last["role"] == "assistant" else ""


def _constraint(req: _SamplingRequest) -> dict:
    """``regex`` / ``json_schema`` for SamplingParams from the request (at most one source)."""
    found = {}
    rf = req.response_format
    if rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise RequestError("response_format json_schema needs json_schema.schema", param="response_format")
        found["json_schema"] = rf.json_schema.schema_
    elif rf is not None and rf.type == "json_object":
        found["json_schema"] = {"type": "object"}
    if req.json_schema is not None:
        if found:
            raise RequestError("give either response_format or json_schema, not both", param="json_schema")
        found["json_schema"] = req.json_schema
    if req.regex is not None:
        if found:
            raise RequestError("give at most one of regex, json_schema and response_format", param="regex")
        found["regex"] = req.regex
    return found


def _max_name(req: _SamplingRequest) -> str:
    """The request's name for the reply's length: chat's ``max_completion_tokens`` when it was sent."""
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"


def _api_names(message: str, req: _SamplingRequest, value: Any = None) -> str:
    """An engine or ``SamplingParams`` ``message`` in the request's own field names: the engine's
    ``max_new_tokens`` / ``min_new_tokens`` are ``max_tokens`` (or ``max_completion_tokens``) /
    ``min_tokens`` here, and a client told to "lower max_new_tokens" finds no such field; its
    ``json_schema`` is the field that sent the schema (``response_format``, ``_param``); and in
    JSON's words, ``value`` (the field's) as JSON (``wire_message``)."""
    names = {"max_new_tokens": _max_name(req), "min_new_tokens": "min_tokens",
             "json_schema": _param(req, "json_schema")}
    if isinstance(req, ChatRequest):  # (a chat client sent no prompt: the template made it of the messages)
        message = message.replace("shorten the prompt", "shorten the messages")
    return wire_message(in_front_end_names(message, names), value)


def _param(req: _SamplingRequest, field: str) -> str:
    """The request's field for ``SamplingParams`` field ``field`` (an error's ``param``)."""
    constraint = "regex" if req.regex is not None else "json_schema" if req.json_schema is not None else "response_format"
    return {"max_new_tokens": _max_name(req), "min_new_tokens": "min_tokens", "return_logprob": "logprobs",
            "top_logprobs_num": "top_logprobs" if isinstance(req, ChatRequest) else "logprobs",
            "logprob_start_len": "echo", "regex": constraint, "json_schema": constraint}.get(field, field)


def _refused_param(req: _SamplingRequest, field: Optional[str]) -> str:
    """The request's field that an engine's refusal is about, given its engine ``field``
    (``refused_field``): a parameter, the constraint (a grammar that does not compile), else (None)
    the prompt (too long, ids outside the vocabulary)."""
    if field is not None:
        return _param(req, field)
    return "messages" if isinstance(req, ChatRequest) else "prompt"


async def _submit(ctx: ServerContext, req: _SamplingRequest, prompts: list, params: list, rid: str,
                  rids: list, request: Any) -> list:
    """``ctx.submit_response`` of the response ``rid``'s prompts as engine rids ``rids``
    (``ServerContext.holding_response``, which the caller holds). The engine's refusal (a prompt
    too long for ``max_tokens``...) is worded in the request's field names (``_api_names``) and
    names the field as ``param``, a prompt of a list by its entry (``prompt[1]``, ``entry_error``,
    ``_per_prompt``)."""
    per_prompt = _per_prompt(req)

    def refused(e: Exception, k: int) -> RequestError:
        field = refused_field(e, params[k])
        if field == "rid" and len(rids) > 1:
            return rid_clash(rid, rids, k)
        message = _api_names(client_message(e), req, refused_value(e, field, rids[k]))
        error = RequestError(message, param=_refused_param(req, field), reason=getattr(e, "reason", None))
        return entry_error(error, k, per_prompt)

    return await ctx.submit_response(rid, prompts, params, rids, refused, request)


def _per_prompt(req: _SamplingRequest) -> tuple:
    """The fields an OpenAI request gives per prompt (``entry_error``): ``prompt`` when it is a list
    of prompts (strings, or lists of token ids), one of them too: its entry is then ``prompt[0]``, as
    /generate names ``text[0]`` of a batch of one."""
    prompt = getattr(req, "prompt", None)
    return ("prompt",) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else ()


def _response_id(req: _SamplingRequest, prefix: str) -> str:
    """The request's ``rid``, else a new id starting with ``prefix`` (OpenAI's ``cmpl-``, ``chatcmpl-``)."""
    if req.rid is None:
        return f"{prefix}{uuid.uuid4().hex}"
    check_rid(req.rid)
    return req.rid


def _sampling(req: _SamplingRequest, max_tokens: int, logprobs: bool, top: int, start: int = -1) -> SamplingParams:
    if req.stream_options is not None and not req.stream:  # (OpenAI's and vLLM's 400 too: it would do nothing)
        raise RequestError("stream_options is only allowed with stream=true; drop it, or stream the reply",
                           param="stream_options")
    if req.stream_options is not None and req.stream_options.continuous_usage_stats:
        raise RequestError("stream_options.continuous_usage_stats is not supported by lmnb serve; leave it out: "
                           "usage comes in the last chunk (include_usage)", param="stream_options")
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        name = _param(req, "top_logprobs_num")  # the field that asked for them
        raise RequestError(f"{name}={top} is out of range: give 0 to {MAX_TOP_LOGPROBS} top logprobs per token",
                           param=name)
    try:
        params = SamplingParams(
            max_new_tokens=max_tokens,
            min_new_tokens=req.min_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            repetition_penalty=req.repetition_penalty,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            stop_regex=req.stop_regex,
            ignore_eos=req.ignore_eos,
            skip_special_tokens=req.skip_special_tokens,
            seed=req.seed,
            n=req.n,
            return_logprob=logprobs,
            top_logprobs_num=top,
            logprob_start_len=start,
            logit_bias=req.logit_bias,
            **_constraint(req),
        )
        params.validate()
    except SamplingParamsError as e:
        raise RequestError(_api_names(str(e), req, e.value), param=_param(req, e.field)) from None
    return params


def _finish(result, req: _SamplingRequest) -> dict:
    """A choice's finish fields.

    ``finish_reason``: ``stop``, ``length``, or ``abort`` for an abort that was asked for
    (/abort_request) or that the request's own parameters caused midway (``FinishReason.field``: a
    grammar allowing only tokens ``min_tokens`` bans, or complete before ``min_tokens`` tokens, so
    that only the EOS it bans could follow; a ``stop_regex`` backtracking past its time limit), as
    SGLang's OpenAI routes report a graceful abort and /generate ends that entry alone, the other
    choices going on. An abort for an error (NaN logits, shutdown) is a ``RequestFailed``: not the
    client's doing, it fails the request (SGLang's error response).

    ``matched_stop`` (SGLang's): the stop string, stop token id or EOS token id that ended the
    choice (``FinishReason.matched``; a ``stop_regex``'s matched text; for a grammar's completion,
    which lmnb's engine ends without sampling an EOS, the model's EOS id, as SGLang names the EOS
    its grammar took), null for ``length`` and ``abort``. Streamed, the chunk with the finish
    reason carries it, the chunks before null, as SGLang's do.

    ``finish_message`` (lmnb's, only where ``FinishReason`` has a message): that message in the
    request's field names (``_finish_message``): why an ``abort`` ("aborted by /abort_request", or
    what in the request to change); for ``length``, what the cut left undone ("incomplete: the token
    limit was reached before the output matched its response_format", which a client must know
    before it parses the truncated JSON; a cut by the context length is a cut by ``max_tokens`` here,
    which a request without one gets as what the context leaves). OpenAI's choices have no
    field for it and SGLang's lose it; /generate's ``meta_info`` carries it as
    ``finish_reason.message``. Clients ignore fields they do not know; the official ``openai``
    client keeps both among a choice's extra fields (``choice.model_extra``)."""
    fr = result.finish_reason
    if fr.type == "abort" and not fr.requested_abort and fr.field is None:
        message = served_message(fr, None)
        raise RequestFailed(f"the request was aborted: {message or 'no reason given'}",
                            503 if message == ABORTED_BY_SHUTDOWN else 500)
    finish = {"finish_reason": fr.type, "matched_stop": fr.matched}
    return finish if fr.message is None else {**finish, "finish_message": _finish_message(fr, req)}


def _finish_message(fr: Any, req: _SamplingRequest) -> str:
    """A choice's ``FinishReason`` message as the client reads it (``served_message``), in the
    request's field names (``_api_names``); the engine's names of a grammar ("the JSON schema
    allows only tokens ...", "matched its regex / JSON schema") are the field the client sent it
    in (the ``response_format``), as ``_api_names`` names the field ``json_schema``."""
    value = None if fr.field is None else getattr(req, _param(req, fr.field))
    message = served_message(fr, _param(req, "regex")).replace("the JSON schema", f"the {_param(req, 'json_schema')}")
    return _api_names(message, req, value)


# A choice's finish fields before it ends (every chunk but its last one carries them, null).
_UNFINISHED = {"finish_reason": None, "matched_stop": None}


def _usage(results: list) -> dict:
    prompt = results[0].meta.prompt_tokens if results else 0
    completion = sum(r.meta.completion_tokens for r in results)
    cached = results[0].meta.cached_tokens if results else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _chat_logprobs(engine: Any, lps: Optional[list]) -> Optional[dict]:
    """A chat choice's ``logprobs`` of ``lps``. It decodes every token (and may read the vocabulary
    once), so routes call it on a worker thread, off the event loop."""
    if lps is None:
        return None
    content = []
    for lp in lps:
        tok = token_text(engine, lp.token_id)
        content.append({
            "token": tok,
            "logprob": finite(lp.logprob),
            "bytes": token_bytes(engine, lp.token_id, tok),
            "top_logprobs": [
                {"token": (t := token_text(engine, tid)), "logprob": finite(v), "bytes": token_bytes(engine, tid, t)}
                for tid, v in lp.top
            ],
        })
    return {"content": content}


class CompletionLogprobs:
    """OpenAI's completions ``logprobs`` objects of one choice, token by token (``add`` per
    streamed chunk, or once for the whole reply). ``first_id`` names prompt token 0 (echo), which
    has no context and hence a null logprob. ``text_offset`` indexes the returned text from
    ``offset``: the tokens are decoded in sequence (after ``context``, the prompt ids when it is not
    echoed), so special tokens (a BOS) take no width and the byte tokens of one character share
    its offset."""

    def __init__(self, engine: Any, offset: int, first_id: Optional[int] = None, context: Sequence[int] = ()):
        self.engine, self.offset, self.first_id = engine, offset, first_id
        # (the engine's tokenizer, as the returned text's detokenizer reads the tokens)
        self.text = IncrementalDetokenizer(engine.tokenizer, context, skip_special_tokens=True)

    def add(self, lps: list) -> dict:
        """The object for ``lps`` (``TokenLogprob``s, None for prompt token 0), the next tokens."""
        engine = self.engine
        tokens, values, tops, offsets = [], [], [], []
        for lp in lps:
            tid = self.first_id if lp is None else lp.token_id
            tokens.append("" if tid is None else token_text(engine, tid))
            values.append(None if lp is None else finite(lp.logprob))
            tops.append(None if lp is None else _completion_top(engine, lp, tokens[-1], values[-1]))
            start = len(self.text.text)  # where the text this token adds (or completes) begins
            if tid is not None:
                self.text.add(tid)
                start = self.text.newest_text_start()  # (past the text of tokens held back before it)
            offsets.append(self.offset + start)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _completion_top(engine: Any, lp: Any, token: str, value: Optional[float]) -> dict:
    """A completions ``top_logprobs`` entry of ``lp`` (a ``TokenLogprob``; ``token`` / ``value`` its
    own text and logprob): its ``logprobs=N`` most likely tokens, then the token itself when it is
    not among them. OpenAI's legacy completions API "will always return the logprob of the sampled
    token, so there may be up to logprobs+1 elements" (and ``logprobs=0`` gives the sampled token
    alone), as vLLM does; before, a sampled token outside the top N was missing and ``logprobs=0``
    gave null entries. Entries are keyed by text, and two tokens may read alike (a byte-fallback
    ``<0x41>`` and ``A``): the more likely one's logprob is kept (``lp.top`` is most likely first),
    where a less likely token of the same text overwrote it."""
    top: dict = {}
    for t, v in lp.top or ():  # (the token itself as ``token`` writes it: an echoed prompt's own text)
        top.setdefault(token if t == lp.token_id else token_text(engine, t), finite(v))
    top.setdefault(token, value)  # (a top token of the same text already holds its place)
    return top


def _choice_logprobs(engine: Any, req: Any, result: Any, prompt_text: str, prompt_ids: list) -> Optional[dict]:
    """A completion choice's ``logprobs`` (None unless asked for): with ``echo``, the prompt's
    tokens first and offsets from 0; else offsets after ``prompt_text``. It decodes each token
    (and twice more for its offset), so routes call it on a worker thread, off the event loop.
    The echoed prompt's tokens and offsets are read from ``prompt_text`` where the decoder does not
    read its tokens back to it (``echo.echoed_prompt``), as the reply's text begins with it."""
    if req.logprobs is None:
        return None
    head = list(result.prompt_logprobs or []) if req.echo else []
    echoed = echoed_prompt(engine, prompt_text, prompt_ids) if head and len(head) == len(prompt_ids) else None
    if echoed is not None:
        rest = CompletionLogprobs(engine, len(prompt_text), None, prompt_ids).add(list(result.logprobs or []))
        values = [None if lp is None else finite(lp.logprob) for lp in head]
        tops = [None if lp is None else _completion_top(engine, lp, t, v) for lp, t, v in zip(head, echoed[0], values)]
        return {"tokens": echoed[0] + rest["tokens"], "token_logprobs": values + rest["token_logprobs"],
                "top_logprobs": tops + rest["top_logprobs"], "text_offset": echoed[1] + rest["text_offset"]}
    return CompletionLogprobs(engine, 0 if req.echo else len(prompt_text), prompt_ids[0] if prompt_ids else None,
                              () if req.echo else prompt_ids).add(head + list(result.logprobs or []))


def _holds(annotation: Any, kinds: tuple) -> bool:
    """Whether a field of this type (``int``, ``Optional[float]``, ``bool``...) holds one of ``kinds``."""
    args = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) is Union else [annotation]
    return len(args) == 1 and args[0] in kinds


def _validate(model: type, body: Any, path: str) -> Any:
    """``model.model_validate(body)``; an unknown top-level field is refused by name with the
    fields ``path`` takes (as ``/generate`` does), not with pydantic's "Extra inputs" line. A
    number field given true or false is refused too: pydantic reads them as 1 and 0, so the chat
    API's ``"logprobs": false`` sent to /v1/completions asked for logprobs (``logprobs=0``). So is
    a string (``"max_tokens": "2"``), which OpenAI's API and /generate refuse, and a flag given
    anything but true or false (pydantic read ``"stream": "on"`` and ``"echo": 1`` as true); the
    flags of nested objects are ``StrictBool`` for that."""
    if not isinstance(body, dict):
        raise not_an_object(body)
    unknown = sorted(k for k in body if k not in model.model_fields)
    if unknown:  # (it lists the fields it uses; the one meant may be one it ignores)
        key, unlisted = unknown[0], getattr(model, "IGNORED", ()) + getattr(model, "UNSERVED", ())
        names = sorted(f for f in model.model_fields if f not in unlisted)
        raise RequestError(f"unknown field {json_value(key, 40)}{did_you_mean(key, sorted(model.model_fields))}; "
                           f"{path} takes {json_value(names)}", param=key)
    for key, value in body.items():
        annotation = model.model_fields[key].annotation
        if isinstance(value, (bool, str)) and _holds(annotation, (int, float)):
            shown = json_value(value) if isinstance(value, bool) else f"the string {json_value(value, 40)}"
            raise RequestError(f"{key} must be a number, not {shown}; leave it out for the default",
                               param=key)
        if value is not None and not isinstance(value, bool) and _holds(annotation, (bool,)):
            raise RequestError(f"{key} must be true or false, not {json_value(value, 40)}", param=key)
    try:
        return model.model_validate(body)
    except ValidationError as e:  # (with the body: the error's place is named by it, field_place)
        raise RequestValidationError([_with_guess(model, err, body) for err in e.errors()], body=body) from None


def _refuse_misspelt_message_keys(body: Any) -> None:
    """Refuse a chat request whose message has a key close to one OpenAI defines (``misspelt_key``):
    pydantic only said ``messages[0].role: Field required`` for ``"rol"``, and kept ``"nmae"``
    among the extra keys without a word. A body of another shape is left to ``_validate``."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        problem = misspelt_key(i, m) if isinstance(m, dict) else None
        if problem is not None:
            raise RequestError(problem, param=f"messages[{i}]")


def _with_guess(model: type, error: dict, body: Any) -> dict:
    """A pydantic ``error``, one of an unknown field of a nested object (``stream_options``,
    ``response_format``: ``extra_forbidden``) said as the top-level fields and /generate's
    sampling parameters say one: the field meant (``did_you_mean``) and the fields the object
    takes, where pydantic said only "Extra inputs are not permitted"."""
    if error.get("type") != "extra_forbidden":
        return error
    loc = error.get("loc", ())
    names = _field_names(model, loc[:-1])
    if not (names and loc):
        return error
    return {**error, "type": "unknown_field", "msg": f"unknown field{did_you_mean(loc[-1], names)}; "
            f"{field_place(loc[:-1], body)} takes {json_value(sorted(names))}"}


def _field_names(model: Any, loc: Sequence) -> list[str]:
    """The field names (as the client spells them: aliases) of the object at ``loc`` inside
    ``model``; [] where the place is not one object model (a list's item is its list's)."""
    for key in loc:
        if isinstance(key, int):
            continue
        field = next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)
        inner = [] if field is None else [a for a in (field.annotation, *get_args(field.annotation))
                                          if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(inner) != 1:
            return []
        model = inner[0]
    return [f.alias or n for n, f in model.model_fields.items()]


def add_openai_routes(app: Any, ctx: ServerContext, json_body) -> None:
    """Register the /v1 routes on ``app``."""
    engine = ctx.engine

    def check_model(model: str) -> None:
        if model not in (ctx.model_name, engine.model_path, "default"):
            raise RequestError(f"model {json_value(model, 40)} is not served here; use {json_value(ctx.model_name)}",
                               404, "model")

    # "created" is when the model came to be served here, the same in every answer (it was each
    # answer's own second, so /v1/models and /v1/models/{id} read a second apart disagreed)
    served_since = int(time.time())

    def model_card() -> dict:
        return {"id": ctx.model_name, "object": "model", "created": served_since, "owned_by": "lmnb",
                "max_model_len": engine.context_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")  # :path, as the default name is a checkpoint path
    async def retrieve_model(model: str):
        check_model(model)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _validate(CompletionRequest, await json_body(request), "/v1/completions")
        check_model(req.model)
        if req.suffix:
            raise RequestError("suffix is not supported by lmnb serve; leave it out", param="suffix")
        if req.best_of not in (None, 1, req.n):
            raise RequestError(f"best_of={req.best_of} is not supported by lmnb serve: it must equal n ({req.n}); "
                               "leave it out", param="best_of")
        p = req.prompt
        if isinstance(p, str):
            prompts = [p]
        elif p and all(isinstance(x, int) for x in p):
            prompts = [p]
        else:
            prompts = list(p)
        if not prompts:
            raise RequestError("prompt is an empty list; give at least one prompt: a string, or a list of token ids",
                               param="prompt")
        top = req.logprobs or 0
        params = _sampling(req, 16 if req.max_tokens is None else req.max_tokens, req.logprobs is not None, top,
                           0 if req.echo and req.logprobs is not None else -1)
        check_samples([params] * len(prompts), "prompt")
        rid, created = _response_id(req, "cmpl-"), int(time.time())
        rids = response_rids(rid, len(prompts))
        with ctx.holding_response(rid, rids):
            # token ids up front, so echoed logprobs can name the first prompt token too
            ids = []
            fix = functools.partial(past_context_refusal, max_new_tokens=params.max_new_tokens,
                                    context_len=engine.context_len, field="max_tokens")
            for k, x in enumerate(prompts):
                try:
                    ids.append(await ctx.run(encode_prompt, engine, x, "prompt", True, fix) if isinstance(x, str)
                               else list(x))
                except RequestError as e:  # (a prompt too long to encode, of a list: prompt[k])
                    raise entry_error(e, k, _per_prompt(req)) from None
            handles = await _submit(ctx, req, ids, [params] * len(ids), rid, rids, request)  # checks the ids
        # as the completion text: without special tokens (a BOS among prompt ids is listed, not echoed);
        # off the event loop, as the prompts' encoding (a batch of long prompts of ids)
        texts = await ctx.run(lambda: [x if isinstance(x, str) else engine.decode(x, skip_special_tokens=True)
                                       for x in prompts])
        if req.stream:
            return EventStream(ctx, _stream(ctx, handles, rid, created, "text_completion", req, texts=texts, prompt_ids=ids),
                               handles)
        choices, results = [], []
        for k, res in enumerate(await ctx.results(handles, request)):
            for r in res if isinstance(res, list) else [res]:
                results.append(r)
                lp = await ctx.run(_choice_logprobs, engine, req, r, texts[k], ids[k])  # decodes every token
                choices.append({
                    "index": len(choices), "text": (texts[k] if req.echo else "") + r.text,
                    "logprobs": lp, **_finish(r, req),
                })
        return {"id": rid, "object": "text_completion", "created": created, "model": ctx.model_name,
                "choices": choices, "usage": _usage_total(results, len(handles))}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await json_body(request)
        _refuse_misspelt_message_keys(body)
        req = _validate(ChatRequest, body, "/v1/chat/completions")
        check_model(req.model)
        _refuse_unserved(req)
        max_tokens = _reply_limit(req)
        extra = _template_kwargs(req)
        if not req.messages:
            # (in the engine's words, Engine.apply_chat_template: it said only "messages is empty")
            raise RequestError('messages is empty: give at least one message, [{"role": "user", "content": "..."}]',
                               param="messages")
        if not engine.chat_template:
            raise RequestError("this model has no chat template; use /v1/completions", param="messages")
        how = {"chat_template_kwargs": extra, **_prompt_end(req)}  # (Engine.apply_chat_template's keywords)
        images: list = []  # [issue 10] image_url parts, in order; each left an image token in its message
        messages = [_plain_message(m, i, images, ctx) for i, m in enumerate(req.messages)]
        rid, created = _response_id(req, "chatcmpl-"), int(time.time())
        rids = response_rids(rid, 1)
        with ctx.holding_response(rid, rids):  # (from before the template and the images: a slow prepare)
            try:
                text = await ctx.run(functools.partial(engine.apply_chat_template, messages, **how))
            except Exception as e:  # the template's own checks (e.g. roles must alternate)
                said = str(e) if str(e).startswith(TEMPLATE_REJECTED) else f"{TEMPLATE_REJECTED}: {e}"
                raise RequestError(said, param="messages") from None
            # add_special_tokens=False: the template wrote any BOS
            fix = functools.partial(_chat_past_context, engine, messages, how, _max_name(req), max_tokens)
            ids = await ctx.run(encode_prompt, engine, text, "messages", False, fix)
            mm = ctx.multimodal
            token = mm.image_token if mm is not None else None
            stray = sum(1 for t in ids if t == mm.image_token_id) - len(images) if token else 0
            if stray:  # [issue 10] the engine's message names MultimodalPrompt and image_data, not chat's image parts
                raise RequestError(f"the messages' text holds the image token {json_value(token)} {stray} time(s); it "
                                   "stands for an image, and images come as image_url content parts: remove it from the "
                                   "text",
                                   param="messages")
            prompt = ids
            if images:  # [issue 10] decode, hash and preprocess off the event loop; bad images -> 400
                try:
                    prompt = await ctx.run(mm.prepare, MultimodalPrompt(ids, images))
                except ValueError as e:
                    raise RequestError(str(e), param="messages") from None
            if max_tokens is None:
                # what the context leaves, or a smaller KV pool (SGLang's max_req_len clamps so): a pool
                # smaller than the context refused every request without max_tokens, naming one no one set
                room = engine.context_len - len(prompt)
                where = f"the model's context length of {engine.context_len} tokens"
                pool = ctx.kv_pool_tokens
                # (the pool holds a slot per token but the last sampled, as the engine counts them,
                # request.kv_to_finish: P + 1 - n new tokens fit a pool of P, one more than P - n)
                if pool is not None and pool + 1 - len(prompt) < room:
                    room, where = pool + 1 - len(prompt), f"the server's KV cache of {pool} tokens"
                if room < 1:  # else the engine's message names a max_new_tokens no one set
                    # (1 - room tokens fewer leave room for one new token, where the template's own fit)
                    floor = await ctx.run(_template_tokens, engine, messages, how)
                    fix = (shorten_fix(-room, 1, "messages") if len(prompt) - (1 - room) >= floor else
                           f"no messages fit: the chat template alone takes {floor} tokens")
                    raise RequestError(f"the chat prompt is {len(prompt)} tokens, which leaves no room for a reply "
                                       f"in {where}; {fix}", param="messages")
                if req.min_tokens > room:  # (the engine's "must not exceed max_tokens=N" names one no one set)
                    over = req.min_tokens - room  # (messages shorter by that leave room for min_tokens,
                    # where the chat template's own tokens stay within what is left)
                    shorten = len(prompt) - over >= await ctx.run(_template_tokens, engine, messages, how)
                    raise RequestError(
                        f"the chat prompt is {len(prompt)} tokens, which leaves room for {room} new "
                        f"token{'s' * (room != 1)} in {where}, fewer than min_tokens={req.min_tokens}; lower min_tokens "
                        f"to at most {room}" + f", or shorten the messages by at least {over} token{'s' * (over != 1)}" * shorten,
                        param="min_tokens")
                max_tokens = room
            elif 0 < max_tokens and len(prompt) + max_tokens > engine.context_len:
                await ctx.run(_refuse_past_the_template, engine, messages, how, len(prompt), _max_name(req),
                              max_tokens, req.min_tokens)
            if req.top_logprobs and not req.logprobs:
                raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
            params = _sampling(req, max_tokens, req.logprobs, req.top_logprobs or 0)
            handles = await _submit(ctx, req, [prompt], [params], rid, rids, request)
        echoed = _echoed(req, messages)
        if req.stream:
            return EventStream(ctx, _stream(ctx, handles, rid, created, "chat.completion.chunk", req, texts=[echoed]),
                               handles)
        [res] = await ctx.results(handles, request)
        results = res if isinstance(res, list) else [res]
        choices = [{
            "index": r.index,
            "message": {"role": "assistant", "content": echoed + r.text},
            "logprobs": await ctx.run(_chat_logprobs, engine, r.logprobs) if req.logprobs else None,
            **_finish(r, req),
        } for r in results]
        return {"id": rid, "object": "chat.completion", "created": created, "model": ctx.model_name,
                "choices": choices, "usage": _usage(results), **_served_tier(req)}


def _template_tokens(engine: Any, messages: list, how: dict) -> int:
    """The tokens of the chat prompt for ``messages`` (plain, as the template takes them) with
    every content empty, rendered as ``how`` says (``Engine.apply_chat_template``'s keyword
    arguments: the template's variables, how the prompt ends): what the chat template takes around
    them alone, which no shortening of their text goes below; 1 (as a plain prompt's shortest)
    where the template refuses them so."""
    try:
        text = engine.apply_chat_template([{**m, "content": ""} for m in messages], **how)
    except ValueError:  # (TEMPLATE_REJECTED: the template's own checks)
        return 1
    return max(1, len(engine.encode(text, False)))


def _chat_past_context(engine: Any, messages: list, how: dict, name: str, max_tokens: Optional[int],
                       said: str, prompt_len: Optional[int] = None) -> tuple[str, Optional[str]]:
    """``params.past_context_refusal`` for a chat prompt (what ``said`` says of it, of at least
    ``prompt_len`` tokens where known) past the context: the request's ``name`` (``max_tokens``
    or ``max_completion_tokens``) is to be lowered too where it leaves no room for the chat
    template's own tokens (``_template_tokens``)."""
    floor = _template_tokens(engine, messages, how) if isinstance(max_tokens, int) else 1
    return past_context_refusal(said, max_tokens, engine.context_len, "messages", name, floor, prompt_len)


def _refuse_past_the_template(engine: Any, messages: list, how: dict, n: int, name: str, max_tokens: int,
                              min_tokens: int) -> None:
    """Refuse a chat request whose ``n``-token prompt and ``max_tokens`` (past the context together)
    leave no room for the chat template's own tokens, so that no shorter messages fit: the
    engine's "shorten the messages or lower max_tokens" offered a fix that fits no messages.
    Returns where shorter messages would fit, and where ``max_tokens`` is the context's length or
    more beside a prompt that fits (the engine's refusal stands then: lower it to what fits).

    Raises:
        RequestError: naming ``name`` and the most that fits beside this prompt (and ``min_tokens``
            where it is more: a ``max_tokens`` below it is refused), or (a prompt that fills the
            context itself) the messages and ``name`` both.
    """
    context = engine.context_len
    if max_tokens >= context > n:
        return
    floor = _template_tokens(engine, messages, how)
    if max_tokens + floor <= context:
        return
    if n >= context:  # (at most 0 is no fix: the messages must shrink too)
        said = f"prompt of {n} tokens {'exceeds' if n > context else 'fills'} the model's context length of {context} tokens"
        message, reason = past_context_refusal(said, max_tokens, context, "messages", name, floor)
        raise RequestError(message, param="messages", reason=reason)
    both = " and min_tokens" if min_tokens > context - n else ""  # (as the engine's _lower_max_new_tokens)
    raise RequestError(f"prompt of {n} tokens + {name}={max_tokens} exceeds the model's context length of {context} "
                       f"tokens; lower {name}{both} to at most {context - n} (the chat template alone takes {floor} "
                       f"of the prompt's tokens, so no shorter messages make room for {max_tokens})",
                       param=name, reason=DOES_NOT_FIT)


def _served_tier(req: Any) -> dict:
    """The ``service_tier`` field of a reply (and of each of its stream's chunks) to ``req``: OpenAI's
    reply names the tier that served a request that set one ("the response body will include the
    service_tier value based on the processing mode actually used", its API reference), and here
    every request is served alike, as OpenAI's ``"default"`` tier; none where the request set none
    (as a completions request, which has no such field, never does)."""
    return {"service_tier": "default"} if getattr(req, "service_tier", None) is not None else {}


def _usage_total(results: list, n_prompts: int) -> dict:
    """Usage over several prompts: prompt and cached tokens counted once per prompt."""
    per_prompt = len(results) // max(n_prompts, 1)
    firsts = results[::per_prompt] if per_prompt else []
    prompt = sum(r.meta.prompt_tokens for r in firsts)
    completion = sum(r.meta.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.meta.cached_tokens for r in firsts)},
    }


def _plain_message(m: ChatMessage, i: int, images: list, ctx: ServerContext) -> dict:
    """A message with string content (text parts joined), its other keys kept for the template
    (``with_call_arguments``: a tool call's arguments text read into its object, a 400 if no JSON,
    as SGLang hands them over). [issue 10] An ``image_url`` part
    (OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}``) becomes
    the model's image token in the text and its URL is appended to ``images``; other parts are
    rejected (an image part too, where the model takes no images: ``ServerContext.refuse_images``)."""
    content = m.content
    # (read as "" and answered 200, so a misspelt key, "contents", lost the message; OpenAI answers 400)
    problem = missing_content(i, m.role, content, m.model_extra or {})
    if problem is not None:
        raise RequestError(problem, param=f"messages[{i}].content")
    if isinstance(content, list):
        bad = [p.type for p in content if p.type not in ("text", "image_url")]
        if bad:
            raise RequestError(f"messages[{i}] has {json_value(bad[0], 40)} content: lmnb serves text and image_url "
                               "parts",
                               param="messages")
        pieces = []
        for j, p in enumerate(content):
            if p.type == "text":
                if p.text is None:  # (OpenAI's 400 too: a part without its text is a client's mistake)
                    where = f"messages[{i}].content[{j}].text"
                    raise RequestError(f"{where} is missing: a text part holds its text, "
                                       '{"type": "text", "text": "..."}', param=where)
                pieces.append(p.text)
                continue
            if ctx.multimodal is None:
                ctx.refuse_images(RequestError(f"messages[{i}] has an image_url part, but the served model is "
                                               "text-only; serve a LLaVA checkpoint to send images", param="messages"))
            url = (p.model_extra or {}).get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise RequestError(f"messages[{i}] has an image_url part without image_url.url", param="messages")
            from lmnb_engine.multimodal.image_io import is_data_url

            if not is_data_url(url):  # a path would be read from the server's own disk
                raise RequestError(f"messages[{i}] image_url.url must be a data: URL "
                                   "(data:image/png;base64,...); the server reads no files and fetches no URLs",
                                   param="messages")
            pieces.append(ctx.multimodal.image_token)
            images.append(url)
        content = "".join(pieces)
    # the message's other keys go to the template as SGLang hands them: an assistant's tool_calls (their
    # arguments read into objects), a tool message's tool_call_id; they were left out, so a template
    # that renders a tool call (Llama 3.1's, Qwen2.5's) got an empty assistant turn
    out = {**(m.model_extra or {}), "role": template_role(m.role), "content": content or ""}
    if m.name:
        out["name"] = m.name
    try:
        return with_call_arguments(i, out)
    except ValueError as e:
        raise RequestError(str(e), param=f"messages[{i}].tool_calls") from None


async def _stream(ctx: ServerContext, handles: list, rid: str, created: int, kind: str, req: Any,
                  texts: Optional[list] = None, prompt_ids: Optional[list] = None) -> AsyncIterator[str]:
    """SSE chunks of a streamed completion or chat completion (OpenAI's chunk format). Each chunk
    carries the logprobs of the tokens whose text it carries (the engine's events send a token
    with the last of its text: ``StreamEvent``), as OpenAI and vLLM stream them; with
    ``echo``, a choice's logprobs all come with its last chunk, the prompt's first, as in the
    unstreamed reply (the prompt's are known only at the end). ``texts``: each prompt's text
    (completions) or, for chat, the one text its choices' content starts with (``_echoed``), sent
    as a chunk of its own after the role chunks where not empty. The prompts of a batch stream
    interleaved, as they generate (SGLang's and vLLM's order); ``EventStream`` aborts them all if
    the stream ends early (client gone, an error)."""
    engine = ctx.engine
    chat = kind == "chat.completion.chunk"

    with_usage = req.stream_options is not None and req.stream_options.include_usage

    def chunk(choices: list, usage: Optional[dict] = None) -> str:
        body = {"id": rid, "object": kind, "created": created, "model": ctx.model_name, "choices": choices,
                **_served_tier(req)}
        if with_usage:  # OpenAI: every chunk has the field, null until the final usage-only chunk
            body["usage"] = usage
        return sse(body)

    results: list[list] = [[] for _ in handles]  # per prompt, as _usage_total counts them
    bases = list(itertools.accumulate((h.n for h in handles), initial=0))  # index of each prompt's first choice
    # Logprobs go with the chunk that carries their tokens' text, except with echo: the prompt's
    # come first in a choice's logprobs and are known only at the end.
    streamed = bool(req.logprobs) if chat else req.logprobs is not None and not req.echo
    offsets: dict[int, CompletionLogprobs] = {}  # choice -> its completions logprobs so far
    try:
        for k, h in enumerate(handles):
            if chat:
                for i in range(h.n):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  **_UNFINISHED}])
                # (the echoed message, a chunk of its own after the roles, as vLLM sends it)
                for i in range(h.n if texts[k] else 0):
                    yield chunk([{"index": i, "delta": {"content": texts[k]}, "logprobs": None, **_UNFINISHED}])
            elif req.echo:
                for i in range(h.n):
                    yield chunk([{"index": bases[k] + i, "text": texts[k], "logprobs": None, **_UNFINISHED}])
        async for k, ev in ctx.events(handles):
            i = bases[k] + ev.index
            done = ev.finished and ev.result is not None
            if not ev.text_delta and not done:  # (an event carries no ids before their text)
                continue
            lp = None
            if done:
                results[k].append(ev.result)
            lps = ev.logprobs if streamed else None
            if lps and chat:
                lp = await ctx.run(_chat_logprobs, engine, lps)
            elif lps:
                so_far = offsets.setdefault(i, CompletionLogprobs(engine, len(texts[k]), None, prompt_ids[k]))
                lp = await ctx.run(so_far.add, lps)
            elif done and not chat and req.logprobs is not None and req.echo:
                lp = await ctx.run(_choice_logprobs, engine, req, ev.result, texts[k], prompt_ids[k])
            finish = _finish(ev.result, req) if done else _UNFINISHED
            if chat:
                delta = {"content": ev.text_delta} if ev.text_delta else {}
                yield chunk([{"index": i, "delta": delta, "logprobs": lp, **finish}])
            else:
                yield chunk([{"index": i, "text": ev.text_delta, "logprobs": lp, **finish}])
        if with_usage:
            # (in sample order, as unstreamed: a prompt's samples may report different cached tokens)
            ordered = [r for rs in results for r in sorted(rs, key=lambda r: r.index)]
            yield chunk([], _usage_total(ordered, len(handles)))
    except Exception as e:  # noqa: BLE001 - the status line is sent; report in the stream
        from lmnb_engine.http_server.app import error_body

        failed = isinstance(e, RequestFailed)
        yield sse(error_body(str(e) if failed else f"{type(e).__name__}: {e}", e.status if failed else 500))
    yield SSE_DONE
