"""Checks of OpenAI-style chat messages (``{"role": ..., "content": ...}``), and their text as a
chat template reads it, and of a request's extra template variables (``chat_template_kwargs``),
shared by the server's ``/v1/chat/completions`` and ``Engine.apply_chat_template`` so both refuse
a bad message alike and render a good one alike.
Importing it loads nothing heavy."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any, Iterable, Optional

from lmnb_engine.json_schema import json_value

# The start of the error of a conversation the chat template itself refused (its raise_exception,
# e.g. "roles must alternate"), the same from Engine.apply_chat_template and the server's 400.
TEMPLATE_REJECTED = "the chat template rejected the messages"

# The keys OpenAI's chat API defines for a message (of any role). Other keys are kept and not read,
# as vLLM and SGLang ignore them (OpenAI itself answers 400); one close to a key the message's role
# takes is taken as a misspelling of it, which would be lost without a word
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio")

# The keys besides role and content that OpenAI's API defines for a message of each role (its
# ChatCompletionMessageParam types). A role not here (a template's own, "ipython") takes them all
ROLE_KEYS = {
    "system": ("name",),
    "developer": ("name",),
    "user": ("name",),
    "assistant": ("name", "tool_calls", "function_call", "refusal", "audio"),
    "tool": ("tool_call_id",),
    "function": ("name",),
}


def misspelt_key(index: int, message: dict) -> Optional[str]:
    """Why message ``index`` (an OpenAI-style dict) looks misspelt, or None: a key that is none of
    ``MESSAGE_KEYS`` but close to one its role takes (``ROLE_KEYS``; difflib's
    ``get_close_matches``, as ``did_you_mean`` picks): ``"rol"`` for a missing role, ``"nmae"`` for
    ``"name"``. Only where the message lacks the key it is close to: beside ``"content"``,
    ``"context"`` is a key of its own (a client's extra, kept unread), not a misspelling. Only keys of
    its own role count: a tool message's ``"tool_name"`` (Ollama's name of the tool that answered)
    is not a misspelt ``"tool_calls"``, which only an assistant message takes. A message without a
    role is looked at for a misspelt role only. A key close to a missing ``"content"``
    (``"contents"``) is left to ``missing_content``, which names it."""
    role = message.get("role")
    takes = ("role", "content", *ROLE_KEYS.get(role, MESSAGE_KEYS[2:])) if isinstance(role, str) else ("role",)
    for key in message:
        close = [] if key in MESSAGE_KEYS else difflib.get_close_matches(str(key), takes, n=1)
        if not close or close[0] in message or close[0] == "content":
            continue
        if close[0] == "role":
            return (f'messages[{index}] has no role (it has {json_value(key, 40)}; did you mean "role"?): give it as '
                    '"role": "user" (or "system", "assistant", ...)')
        return (f"messages[{index}] has the unknown field {json_value(key, 40)} (did you mean "
                f"{json_value(close[0])}?); a message of role {json_value(role, 40)} takes {json_value(list(takes))}")
    return None


def missing_content(index: int, role: Any, content: Any, other_keys: Iterable[str]) -> Optional[str]:
    """Why message ``index`` (its ``role``, its ``content``, None when left out, and the names of its
    keys other than role, content and name) cannot be rendered, or None when it can.

    A message without content would be rendered as empty text, losing what was meant (often a key
    misspelt, ``"contents"``: OpenAI answers 400 there). Only an assistant message that carries
    ``tool_calls`` or ``function_call`` may leave content out, as OpenAI's API allows. An empty
    list of parts is no content either (OpenAI answers 400: "empty array").
    """
    if isinstance(content, list) and not content:
        return (f'messages[{index}].content is an empty list: give its text as "content": "..." (a string, or a '
                "list of one or more text parts)")
    others = list(other_keys)
    if content is not None or (role == "assistant" and ("tool_calls" in others or "function_call" in others)):
        return None
    has = f" (it has {', '.join(map(json_value, others))})" if others else ""
    return (f'messages[{index}] has no content{has}: give its text as "content": "..." (a string, or a '
            "list of text parts)")


def with_call_arguments(index: int, message: dict) -> dict:
    """Message ``index`` with each of its ``tool_calls``' ``function.arguments`` that is a string
    (OpenAI's form: the call's JSON object as text) read into the object, as SGLang and vLLM hand
    them to a chat template (transformers' form for tool-use templates: Llama 3.1's and Qwen2.5's
    ``arguments | tojson`` wrote the text as one JSON string, escaped, ``"{\\"city\\": ...}"``);
    blank text is no arguments, ``{}``. ``message`` itself is left as it is (a new dict where a call
    changed); a message without a list of ``tool_calls`` is returned as it is.

    Raises:
        ValueError: an ``arguments`` string that is no JSON, naming the call and the fix.
    """
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    read = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        text = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(text, str):
            read.append(call)
            continue
        try:
            arguments = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"messages[{index}].tool_calls[{j}].function.arguments is not JSON ({e.msg} at "
                             f"character {e.pos}): {json_value(text, 40)}; give the call's arguments as the text of a "
                             'JSON object, "arguments": "{\\"city\\": \\"Paris\\"}"') from None
        read.append({**call, "function": {**function, "arguments": arguments}})
    return {**message, "tool_calls": read}


def message_dicts(messages: Any) -> list[dict]:
    """``messages`` (a list of chat messages) as dicts, as ``text_message`` reads them: a dict as it
    is, another mapping copied, a pydantic model (the OpenAI SDK's ``ChatCompletionMessage``, a
    reply's ``choices[0].message``, which its SDK takes back in ``messages``) dumped without its None
    fields (as the SDK sends it: a null ``tool_calls`` is none), a dataclass by its fields.

    Raises:
        TypeError: ``messages`` is a string or one message rather than a list of them, or a message is
            none of these (a string, a tuple): naming the message and the shape to give.
    """
    one = isinstance(messages, (str, bytes, Mapping)) or hasattr(messages, "model_dump")  # (both iterable)
    if one or not isinstance(messages, Iterable):
        raise TypeError(f"messages is {_kind(messages)}, not a list of messages: give "
                        '[{"role": "user", "content": "..."}, ...]')
    return [_message_dict(i, m) for i, m in enumerate(messages)]


def _message_dict(index: int, message: Any) -> dict:
    """Message ``index`` as a dict (see ``message_dicts``)."""
    if isinstance(message, dict):
        return message
    if isinstance(message, Mapping):
        return dict(message)
    if callable(getattr(message, "model_dump", None)):  # pydantic v2 (the OpenAI SDK's types)
        return message.model_dump(exclude_none=True)
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return dataclasses.asdict(message)
    raise TypeError(f"messages[{index}] is {_kind(message)}: give each message as a dict, "
                    '{"role": "user", "content": "..."} (or a pydantic model or dataclass with those fields)')


def _kind(value: Any) -> str:
    """``value`` named for an error: a string shown (cut short), else its type's name."""
    return f"the string {json_value(value, 40)}" if isinstance(value, str) else f"a {type(value).__name__}"


def template_role(role: str) -> str:
    """The role a chat template knows for ``role``: OpenAI's newer "developer" (its o1 and later
    models' name for the system message) is "system"; others are kept."""
    return "system" if role == "developer" else role


def text_message(index: int, message: dict) -> dict:
    """Message ``index`` (an OpenAI-style dict) as a chat template reads it, as the server's
    ``/v1/chat/completions`` renders it: a list of text parts joined into one string, content left
    out of an assistant's tool call as "", "developer" as "system", a tool call's arguments text
    read into its object (``with_call_arguments``); other keys are kept.

    Raises:
        ValueError: the message has a misspelt key (``misspelt_key``), no role, no content
            (``missing_content``), a content that is neither a string nor a list of text parts, or
            a part that is not ``{"type": "text", "text": "..."}`` (an image part: render the text yourself, or send it to the server),
            or a tool call's arguments text that is no JSON (``with_call_arguments``).
    """
    problem = misspelt_key(index, message)
    if problem is not None:
        raise ValueError(problem)
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str):  # (a template writes a missing role as an empty marker: "<||>")
        got = "has no role" if role is None else f"has role {json_value(role, 40)}"
        raise ValueError(f'messages[{index}] {got}: give it as "role": "user" (or "system", "assistant", ...)')
    problem = missing_content(index, role, content, [k for k in message if k not in ("role", "content", "name")])
    if problem is not None:
        raise ValueError(problem)
    if isinstance(content, list):  # (a template wrote the list itself, "[{'type': 'text', ...}]", as text)
        content = "".join(_part_text(index, j, part) for j, part in enumerate(content))
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"messages[{index}].content is {json_value(content, 40)}: give a string, or a list of "
                         'text parts ({"type": "text", "text": "..."})')
    return {**with_call_arguments(index, message), "role": template_role(role), "content": content or ""}


def _part_text(index: int, j: int, part: Any) -> str:
    """The text of part ``j`` of message ``index``'s content list (see ``text_message``)."""
    where = f"messages[{index}].content[{j}]"
    if not isinstance(part, dict) or part.get("type") != "text":
        kind = json_value(part.get("type"), 40) if isinstance(part, dict) else json_value(part, 40)
        raise ValueError(f"{where} is a {kind} part: only text parts are rendered here "
                         '({"type": "text", "text": "..."}); send images to lmnb serve\'s /v1/chat/completions')
    if not isinstance(part.get("text"), str):
        raise ValueError(f'{where}.text is missing: a text part holds its text, {{"type": "text", "text": "..."}}')
    return part["text"]


# The names a chat template's render already binds, which ``chat_template_kwargs`` must not set:
# the template's own variables (``messages``, ``tools``, ``documents``, ``add_generation_prompt``),
# transformers' ``apply_chat_template`` parameters (a key among them would change how it renders or
# what it returns, or be a second value for one it is given: TypeError; so would ``self`` and
# ``conversations``, the names of its own first parameter and of render_jinja_template's) and the
# template's helper functions. vLLM refuses ``chat_template`` and ``tokenize`` and overrides
# ``add_generation_prompt``; SGLang's call fails on a second ``tools`` or ``add_generation_prompt``; here each is a clear refusal.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "conversation", "conversations", "self", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "chat_template", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "raise_exception", "strftime_now",
})


def template_kwargs(kwargs: Any) -> dict:
    """``kwargs`` (a chat request's ``chat_template_kwargs``, vLLM's and SGLang's extension: extra
    variables for the chat template, e.g. Qwen3's ``{"enable_thinking": False}``) checked, as a
    new dict; None is ``{}``.

    Raises:
        TypeError: ``kwargs`` is not a mapping with string keys.
        ValueError: a key is one the template's render sets itself (``RESERVED_TEMPLATE_KWARGS``:
            ``messages``, ``add_generation_prompt``, ``tools``...), naming it and what to do.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        shown = json_value(kwargs, 40) if isinstance(kwargs, (str, int, float, list)) else f"a {type(kwargs).__name__}"
        raise TypeError(f"chat_template_kwargs is an object of template variables with string names (e.g. "
                        f'{{"enable_thinking": false}}), got {shown}')
    clash = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if clash:
        # (these two are fields of the request itself, which a user moving them in would look for)
        fields = [k for k in clash if k in ("add_generation_prompt", "continue_final_message")]
        moved = (f" ({' and '.join(fields)} {'are' if len(fields) > 1 else 'is'} the request's own "
                 f"parameter{'s' if len(fields) > 1 else ''}, beside messages: set {'them' if len(fields) > 1 else 'it'} "
                 "there)" if fields else "")
        raise ValueError(f"chat_template_kwargs may not set {', '.join(map(repr, clash))}: the chat template "
                         "gets it from the request itself (the messages, and a generation prompt for the "
                         f"reply); leave it out of chat_template_kwargs{moved}")
    return dict(kwargs)
