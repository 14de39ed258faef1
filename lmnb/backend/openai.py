"""The OpenAI-compatible backend: programs call ``/v1/chat/completions`` or ``/v1/completions``
of OpenAI, ``lmnb serve``, vLLM, SGLang, ... through the official ``openai`` client.

Chat models receive the program's chat messages and can generate only at the start of an
assistant message — unless the program uses API speculative execution
(``@function(num_api_spec_tokens=N)``, paper §2/§6; the interpreter defers the role's gens to one
call), or the server continues a partial reply (``OpenAI(..., continue_final_message=True)``:
vLLM's, SGLang's and lmnb serve's extension field of that name, which OpenAI's API lacks).
Constraints are never dropped silently (SGLang drops them, ``research/features.md`` §4.2):
``json_schema`` goes out as ``response_format``, ``regex`` as the ``regex`` extension field that
SGLang and lmnb servers read, and the official OpenAI API gets a clear error for what it lacks.
A server that ignores the ``regex`` field (vLLM reads ``guided_regex``) is caught by checking the
output against the pattern.
[issue 10] ``image()``/``video()`` reach chat models as OpenAI vision ``image_url`` parts (base64
data URLs, ``lmnb.backend.media.data_url``; a video as its sampled frames) where the image stood
in the message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import json
import numbers
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Sequence

from lmnb.backend.base import (
    DROPPED_ERRORS, DROPPED_FIX, MAX_BATCH_PROMPTS, AbortedIds, BackendAuthError, BackendCannotRun, BackendError,
    BackendUnreachable, BaseBackend,
    Completion, GuessedTemplate, Prompt, aborted_reason, check_api_key, check_sendable, check_timeout, check_utf8, given,
    key_advice, refused_choice,
    tell_guessed_template,
)
from lmnb.backend.media import data_url, frames
from lmnb.chat_template import ChatTemplate, get_chat_template, get_chat_template_by_model_path
from lmnb.choices import ChoiceLogprobs, first_difference
from lmnb.ir import GenParams

KEY_ENV = "OPENAI_API_KEY"  # (where the openai client, and so lmnb.OpenAI, reads its key)
AZURE_KEY_ENV = "AZURE_OPENAI_API_KEY"  # (where openai.AzureOpenAI reads its key: lmnb.OpenAI(is_azure=True))
# Completion-only models of the official API (SGLang's INSTRUCT_MODEL_NAMES, extended).
COMPLETION_MODEL_NAMES = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")
# What a call that abort() stopped returns (not None: a server may answer null).
_ABORTED = object()
# The event loop that every lmnb.OpenAI backend's calls that are not streamed run on, on a daemon
# thread of its own (one for all backends: a notebook that made many had a thread per backend).
_loop_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_thread: Optional[threading.Thread] = None
# The errors of the tries the openai client made again in the current call (_noting_failed_tries):
# the client raises the last one's only, and a call whose server crashed was then "nothing answers".
_failed_tries: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("lmnb_openai_failed_tries",
                                                                               default=None)


@dataclasses.dataclass
class TokenUsage:
    """The tokens a backend's requests used, as the API's answers count them (SGLang's
    ``OpenAI(...).token_usage``): to compare programs, e.g. with and without API speculative
    execution. Answers that carry no usage add nothing."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def reset(self) -> None:
        """Count from zero again."""
        self.prompt_tokens = self.completion_tokens = 0


# Every live backend: in a process made by os.fork, each makes new clients (_after_fork_in_child).
_backends: "weakref.WeakSet[OpenAI]" = weakref.WeakSet()


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop of every backend's calls that are not streamed, started with the first of
    them, and again in a process made by ``os.fork``, which has no thread running the parent's."""
    global _loop, _loop_thread
    with _loop_lock:
        if _loop_thread is None or not _loop_thread.is_alive():
            _loop = asyncio.new_event_loop()
            _loop_thread = threading.Thread(target=_loop.run_forever, name="lmnb-openai", daemon=True)
            _loop_thread.start()
        return _loop


class ContinueFinalMessageRefused(ValueError):
    """``OpenAI(..., continue_final_message=True)`` where it cannot apply: a completion model, or
    OpenAI's own API (``official``). ``why`` says why without the Python API's words, for a front
    end that names its own option and fix (``%lm connect --continue-final-message``)."""

    def __init__(self, message: str, why: str, official: bool):
        super().__init__(message)
        self.why = why
        self.official = official


class OpenAI(BaseBackend):
    """Run programs on an OpenAI-compatible API.

    The positional order is SGLang's, ``OpenAI(model_name, is_chat_model, chat_template,
    is_azure)``; SGLang hands ``base_url`` and ``api_key`` to the openai client as keywords, and
    so does lmnb.

    Args:
        model_name: the ``model`` of every request.
        is_chat_model: None = chat unless ``model_name`` is a known completion model.
        chat_template: role markers for the program text (completion models); default chosen
            from the model name. When no name matches, the generic ``default`` format is used and
            the first prompt with chat roles warns (``UserWarning``) naming the fixes.
        is_azure: use ``openai.AzureOpenAI``, whose key defaults from ``$AZURE_OPENAI_API_KEY``.
        base_url: the API's root URL, ``/v1`` included: ``http://127.0.0.1:30000/v1`` for
            ``lmnb serve`` or SGLang, ``http://localhost:1234/v1`` for LM Studio; None = the official
            API. The openai client puts each route right after it (``BASE_URL/chat/completions``)
            and adds no ``/v1``, so a server's bare root (``http://localhost:1234``) is answered
            404, and that error names the URL with ``/v1``.
        api_key: default ``$OPENAI_API_KEY`` (with ``is_azure``, ``$AZURE_OPENAI_API_KEY``, and no
            ``"EMPTY"``: Azure takes an Azure AD token instead, ``azure_ad_token``); servers that
            need none get ``"EMPTY"``.
        continue_final_message: a chat model on a vLLM, SGLang or ``lmnb serve`` server, which take
            the extension field of that name: a gen after text inside an assistant message
            (``assistant("The answer is " + gen("x"))``) sends the messages with that partial reply
            last (its text up to the gen, leading whitespace dropped, as the message will hold it)
            and ``continue_final_message: true, add_generation_prompt: false`` (vLLM refuses the first
            without the second), so the model continues the reply and the answer is the
            continuation alone; each such gen is a call of its own. Off by default, where such a gen
            is refused (``BackendCannotRun``): OpenAI's own API refuses the field.
        **client_kwargs: passed to ``openai.OpenAI`` (timeout, max_retries, ...); a ``timeout`` in
            seconds is at most ``threading.TIMEOUT_MAX``, None or ``math.inf`` no limit; an
            ``httpx.Timeout`` (httpx's or the client's own transport's) has each of its connect,
            read, write and pool checked so, and becomes ``openai.Timeout``. A streamed gen
            fails once the read timeout passes with no chunk: keep-alive comments and empty lines,
            which reset httpx's read timeout, do not count. With ``http_client`` (an
            ``httpx.Client``) a call that is not streamed cannot be aborted.

    A backend made before ``os.fork`` (multiprocessing's "fork" start method) works in the child
    process, which gets clients of its own; an ``http_client`` given stays shared with the parent,
    so give each process its own.

    A request the server refuses for its API key (HTTP 401) raises ``BackendAuthError``, its
    message ending with ``key_fix``: how to give the key (``api_key=``, ``$OPENAI_API_KEY``), or
    that the key sent was refused. A front end that made the backend sets its own words there
    (``%lm connect``'s ``--api-key``, a job's).

    Raises:
        ImportError: the ``openai`` package is missing (``pip install openai``).
        ValueError: the client refused its arguments, e.g. the official API (no ``base_url``)
            without an API key; ``continue_final_message=True`` with a completion model (which
            generates anywhere in the text already) or with OpenAI's own API (which has no such field):
            ``ContinueFinalMessageRefused``, a ``ValueError``.
        TypeError: an ``api_key`` that is no string (``check_api_key``), a ``continue_final_message``
            that is not True or False.
    """

    length_in_finish_reason = False  # (a choice's finish_reason is only "length")

    def __init__(self, model_name: str, is_chat_model: Optional[bool] = None,
                 chat_template: Optional[ChatTemplate] = None, is_azure: bool = False,
                 base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 continue_final_message: bool = False, **client_kwargs: Any):
        try:
            import openai
        except ImportError:
            raise ImportError("lmnb.OpenAI needs the openai package: pip install openai") from None
        import httpx  # (the openai client's transport)

        self._openai = openai
        self._httpx = httpx
        _check_arguments(model_name, is_chat_model, chat_template, base_url, client_kwargs, httpx, openai)
        check_api_key("lmnb.OpenAI", api_key)
        if not isinstance(continue_final_message, bool):  # (a truthy "no" would send the field)
            raise TypeError(f"lmnb.OpenAI continue_final_message must be True or False; got "
                            f"{given(continue_final_message)}")
        # (the server's words are for an HTTP client: "send Authorization: Bearer <key>"). Azure's
        # key is in a variable of its own: the OpenAI one's, or "EMPTY", went out in its place, and
        # a 401 told to set $OPENAI_API_KEY
        key_env = AZURE_KEY_ENV if is_azure else KEY_ENV
        self.key_fix = "; " + key_advice("the api_key given" if api_key else None, key_env,
                                         f"lmnb.OpenAI(..., api_key=KEY), or set ${key_env}")
        api_key = api_key or os.environ.get(key_env) or ("EMPTY" if base_url and not is_azure else None)
        # (an httpx.URL as its text: openai 3's client, on httpx2, refused httpx's class in its own words)
        base_url = str(base_url) if isinstance(base_url, httpx.URL) else base_url
        self._client_args = (is_azure, dict(base_url=base_url, api_key=api_key, **client_kwargs))
        self._clients: Optional[tuple] = None  # (the openai client, its async twin or None)
        # The clients a backend dropped without shutdown() leaves open: its finalizer closes them
        # (a keep-alive connection was left to the garbage collector, which warned of an unclosed
        # socket and transport, ResourceWarning). Not at exit: the process's end closes them.
        self._unclosed: list = []
        weakref.finalize(self, _close_dropped, self._unclosed).atexit = False
        try:
            self._open_clients()
        except openai.OpenAIError as e:  # not a ValueError: callers (an exported job) showed its traceback
            fix = "" if api_key else (" Give the API key: api_key= (an exported job's --api-key KEY, "
                                      f"%lm connect --api-key KEY) or ${key_env}.")
            raise ValueError(f"the openai client did not start: {e}{fix}") from None
        self.model_name = model_name
        self.is_chat_model = model_name not in COMPLETION_MODEL_NAMES if is_chat_model is None else is_chat_model
        self.chat_template = chat_template or get_chat_template_by_model_path(model_name)
        # the generic template chosen because no name matched: said once, when a program's roles use it
        self._guessed = GuessedTemplate(self.chat_template) if chat_template is None and self.chat_template.name == "default" else None
        # A front end that says the guess in its own words and with its own fixes (%lm connect, a
        # batch job) sets this: called once with what was guessed, instead of the UserWarning
        self.on_guessed_template: Optional[Callable[[str], None]] = None
        host = str(self.client.base_url)
        self.is_official = "api.openai.com" in host or is_azure
        self.continue_final_message = continue_final_message
        self.token_usage = TokenUsage()
        self._forget_requests()
        if continue_final_message and (not self.is_chat_model or self.is_official):
            self.shutdown()  # (its clients are made: closed now, not left to the garbage collector)
            if not self.is_chat_model:
                why = f"{model_name!r} is used as a completion model, whose gens go anywhere in the text already"
                raise ContinueFinalMessageRefused(f"lmnb.OpenAI continue_final_message=True is for chat models, and "
                                                  f"{why}: leave it out", why, official=False)
            why = "OpenAI's API has no continue_final_message field (vLLM, SGLang and lmnb serve servers take it)"
            raise ContinueFinalMessageRefused(f"lmnb.OpenAI continue_final_message=True: {why}; leave it out, and "
                                              "generate at the start of assistant messages or use "
                                              "@function(num_api_spec_tokens=N)", why, official=True)
        _backends.add(self)

    def _open_clients(self) -> tuple:
        is_azure, kwargs = self._client_args
        cls = self._openai.AzureOpenAI if is_azure else self._openai.OpenAI
        async_cls = self._openai.AsyncAzureOpenAI if is_azure else self._openai.AsyncOpenAI
        # Calls that are not streamed run on the async client, on an event loop (shared): a
        # blocking call cannot be stopped (its response's headers come with the whole answer),
        # while a cancelled one closes its connection, so the server sees its client leave, and is
        # not tried again. An httpx.Client given is for blocking calls only.
        self._clients = (_noting_failed_tries(cls)(**kwargs),
                         None if "http_client" in kwargs else _noting_failed_tries(async_cls)(**kwargs))
        self._unclosed[:] = [] if "http_client" in kwargs else [self._clients]  # (one given is the caller's)
        return self._clients

    @property
    def client(self) -> Any:
        """The openai client of blocking calls and streams."""
        return (self._clients or self._open_clients())[0]

    @property
    def _async_client(self) -> Any:
        return (self._clients or self._open_clients())[1]

    @property
    def _route(self) -> str:
        """The URL this backend's requests go to (``.../v1/chat/completions`` for a chat model,
        ``.../v1/completions`` else, select's scoring too), which its errors name: they named the
        API's root, ``.../v1/``, where no request went."""
        root = str(self.client.base_url).rstrip("/")  # (a base_url with no path has no "/" to end it)
        return f"{root}/{'chat/completions' if self.is_chat_model else 'completions'}"

    def _forget_requests(self) -> None:
        # request id -> its open stream, or the future of its call that is not streamed, which
        # abort() closes or cancels (None while it starts: an abort() meanwhile removes it)
        self._requests: dict[str, Any] = {}
        self._aborted = AbortedIds()  # ids aborted before a call of theirs began
        self._requests_lock = threading.Lock()
        self._async_used = False  # a call ran on the async client (shutdown closes it)

    def _after_fork(self) -> None:
        """In a process made by ``os.fork``: clients of its own, made at their first use (not
        here: a fork that runs ``exec`` next needs none). The parent's pooled connections are the
        parent's sockets (a request on one would read the parent's answers), and the async
        client's are bound to the parent's event loop, which no thread runs here; the parent's
        calls in flight, and its lock, are not this process's, nor are its connections: the
        finalizer does not close them (an HTTP/2 close would write to the parent's socket)."""
        self._clients = None
        self._unclosed.clear()
        self._forget_requests()

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template if not self.is_chat_model else get_chat_template("default")

    def check_images(self) -> None:
        """[issue 10] Chat models take images (a text-only one answers with the server's error).

        Raises:
            BackendCannotRun: a completion model; the completions API has no images.
        """
        if not self.is_chat_model:
            raise BackendCannotRun(
                "image() and video() need a chat model here: the OpenAI completions API takes no images. Use "
                "OpenAI(<vision chat model>), lmnb.RuntimeEndpoint(<lmnb serve URL>) or lmnb.Engine(<LLaVA checkpoint>)"
            )

    def _messages(self, prompt: Prompt) -> list:
        """``prompt.messages`` with [issue 10] each image placeholder made ``image_url`` parts.

        Raises:
            BackendCannotRun: an image outside every chat message (chat APIs have nowhere to put it).
        """
        if not prompt.images:
            return prompt.messages
        token = self.get_chat_template().image_token
        inputs = iter(prompt.images)
        out = []
        for m in prompt.messages:
            pieces = m["content"].split(token) if isinstance(m.get("content"), str) else [m.get("content")]
            if len(pieces) == 1:
                out.append(m)
                continue
            parts: list = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
            for piece in pieces[1:]:
                media = next(inputs, None)
                if media is None:
                    raise ValueError(f"the messages hold more {token!r} placeholders than image()/video() inputs; "
                                     f"do not write {token} as text in a program that uses image()/video()")
                parts += [{"type": "image_url", "image_url": {"url": data_url(x)}} for x in frames(media)]
                if piece:
                    parts.append({"type": "text", "text": piece})
            out.append({**m, "content": parts})
        if next(inputs, None) is not None:
            raise BackendCannotRun("a chat model gets images inside chat messages; put image()/video() inside a "
                                   "role, e.g. s += user(image(path) + question); in a %%lm cell {user}{image photo} "
                                   "question{/user}")
        return out

    def __repr__(self) -> str:
        """The backend as messages name it (``set_default_backend``'s warning, ``%lm stats``):
        ``lmnb.OpenAI('MODEL')``, with the ``base_url`` given, if one was."""
        base_url = self._client_args[1]["base_url"]
        where = f", base_url={str(base_url)!r}" if base_url is not None else ""
        return f"lmnb.OpenAI({self.model_name!r}{where})"

    # -- request building

    def _kwargs(self, params: GenParams) -> dict:
        """OpenAI request arguments of ``params``; lmnb/SGLang extensions go in ``extra_body``.

        Raises:
            ValueError: a number no request can carry (``check_sendable``)."""
        check_sendable(params)  # (the openai client's JSON of it failed in Python's words)
        kw: dict[str, Any] = {"model": self.model_name}
        if params.max_new_tokens is not None:
            kw["max_tokens"] = params.max_new_tokens
        for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed"):
            if getattr(params, key) is not None:
                kw[key] = getattr(params, key)
        if params.stop_list:
            kw["stop"] = params.stop_list
        if params.logit_bias:  # (the API's own field: its keys are the ids as strings)
            kw["logit_bias"] = {str(t): b for t, b in params.logit_bias.items()}
        if params.n is not None and params.n != 1:  # n=0 too: the server refuses it, as the other backends do
            kw["n"] = params.n
        extra: dict[str, Any] = {}
        neutral = {"top_k": -1, "min_p": 0.0, "min_new_tokens": 0, "ignore_eos": False}
        names = {"min_new_tokens": "min_tokens"}
        for key, off in neutral.items():
            value = getattr(params, key)
            if value is not None and value != off:
                extra[names.get(key, key)] = value
        if params.stop_token_ids:
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.stop_regexes:
            if self.is_official:
                raise BackendCannotRun("the OpenAI API has no stop_regex; use stop strings, or an lmnb/SGLang "
                                       "server (RuntimeEndpoint, or OpenAI(base_url=...))")
            extra["stop_regex"] = params.stop_regexes
        if params.regex is not None:
            if self.is_official:
                raise BackendCannotRun(
                    "the OpenAI API has no regex-constrained generation; use json_schema with a chat "
                    "model, or an lmnb/SGLang server (RuntimeEndpoint, or OpenAI(base_url=...))"
                )
            extra["regex"] = params.regex
        if params.json_schema is not None:
            schema = json.loads(params.json_schema) if isinstance(params.json_schema, str) else params.json_schema
            fmt = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
            if self.is_chat_model:
                kw["response_format"] = fmt
            elif self.is_official:
                raise BackendCannotRun("the OpenAI completions API has no structured output; use a chat model")
            else:
                extra["response_format"] = fmt
        if extra and self.is_official:
            raise BackendCannotRun(f"the OpenAI API does not support {sorted(extra)}; leave them unset")
        if extra:
            kw["extra_body"] = extra
        if params.return_logprob:
            if self.is_chat_model:
                kw["logprobs"] = True
                if params.top_logprobs_num:
                    kw["top_logprobs"] = params.top_logprobs_num
            else:
                kw["logprobs"] = params.top_logprobs_num or 0
        return kw

    def _warn_guessed_template(self, prompt: Prompt) -> None:
        """Tell once (``tell_guessed_template``) when a completion model's prompt has chat roles
        written in the generic ``default`` format because no template matched the model name."""
        if self.is_chat_model or self._guessed is None or not (prompt.messages or prompt.role):
            return
        if not self._guessed.take(self.chat_template):
            return
        what = (f"no chat template is known for the model name {self.model_name!r}, so the program's roles go "
                "out in the generic 'default' format ('USER:...\\nASSISTANT:'), which the model may not be "
                "trained on")
        tell_guessed_template(
            self.on_guessed_template, what,
            f"lmnb.OpenAI({self.model_name!r}, is_chat_model=False): {what}. Give its format: OpenAI(..., "
            "chat_template=lmnb.get_chat_template('chatml')) (or another registered name); or, on an lmnb serve "
            "or SGLang server, connect to its root URL (no /v1) with lmnb.RuntimeEndpoint(URL), which uses the "
            "model's own template; or use it as a chat model (leave out is_chat_model=False), so the server "
            "applies its template")

    def _prompt_kwargs(self, prompt: Prompt, constrained: bool = False) -> dict:
        """The request's ``prompt`` (a completion model) or ``messages`` (a chat model), and for a gen
        after text inside an assistant message (``continue_final_message``) the fields that have the
        server continue that partial reply, in ``extra_body``. ``constrained``: the gen has a regex
        or JSON schema (a dtype's too), which API speculative execution refuses beside text in its
        role (``speculative.spec_role_constraint_check``), so the refusal does not offer it.

        Raises:
            BackendCannotRun: a chat model's gen outside an assistant message, or after text inside
                one without ``continue_final_message``."""
        if not self.is_chat_model:
            self._warn_guessed_template(prompt)
            return {"prompt": prompt.text}
        if prompt.role == "assistant" and not prompt.role_text.strip():
            return {"messages": self._messages(prompt)}
        if prompt.role == "assistant" and self.continue_final_message:
            # (lstripped as the role's end writes the message: the server continues the text it will hold)
            partial = {"role": "assistant", "content": prompt.role_text.lstrip()}
            messages = self._messages(dataclasses.replace(prompt, messages=[*prompt.messages, partial]))
            return {"messages": messages, "extra_body": {"continue_final_message": True, "add_generation_prompt": False}}
        inside = (" — or, inside a reply on a vLLM, SGLang or lmnb serve server, have it continue the reply's text: "
                  "OpenAI(..., continue_final_message=True); in a notebook %lm connect URL --openai MODEL "
                  "--continue-final-message") if prompt.role == "assistant" else ""
        # (a %%lm cell has no option for it, and streams, which speculation refuses: the cell's way is
        # a Python cell, said here, where the message's other fixes name a cell's words too)
        speculate = "" if constrained else (
            "to fill text and several gens inside one reply use @function(num_api_spec_tokens=N), run without "
            "stream=True (a %%lm cell cannot: write the program in a Python cell as an "
            "@lmnb.function(num_api_spec_tokens=N) and call its .run()), or ")
        raise BackendCannotRun(
            "an OpenAI chat model can only generate at the start of an assistant message "
            "(s += assistant(gen(...)); in a %%lm cell {assistant}{gen x}{/assistant}); "
            f"{speculate}use a completion model "
            f"(OpenAI(..., is_chat_model=False); in a notebook %lm connect URL --openai MODEL --completion){inside}"
        )

    def _request(self, prompt: Prompt, params: GenParams) -> dict:
        """The keyword arguments of a gen's request: ``_prompt_kwargs`` and ``_kwargs``, their
        ``extra_body`` fields merged."""
        kw = self._prompt_kwargs(prompt, params.regex is not None or params.json_schema is not None)
        sampling = self._kwargs(params)
        extra = {**kw.pop("extra_body", {}), **sampling.pop("extra_body", {})}
        return {**kw, **sampling, **({"extra_body": extra} if extra else {})}

    def _call(self, rid: Optional[str] = None, **kw):
        """The client's answer to a request of ``kw``; with ``rid`` (a call that is not streamed),
        ``_ABORTED`` once ``abort(rid)`` stopped it.

        Raises:
            BackendError: the server refused the request, did not answer, or sent no JSON;
                ``BackendAuthError`` for its API key (HTTP 401), the message ending with ``key_fix``.
        """
        failed: list = []  # the errors of the tries the client made again (_noting_failed_tries)
        token = _failed_tries.set(failed)
        try:
            if rid is not None and self._async_client is not None:
                return self._abortable_call(rid, kw)
            if rid is not None:  # (a blocking call: only one not begun can be stopped)
                with self._requests_lock:
                    if self._aborted.take(rid):
                        return _ABORTED
            if self.is_chat_model:
                return self.client.chat.completions.create(**kw)
            return self.client.completions.create(**kw)
        except self._openai.APIStatusError as e:
            # e.message repeats the status ("Error code: 400 - {...}"); the server's own words are in body
            body = e.body if isinstance(e.body, dict) else {}
            message = body.get("message") if isinstance(body.get("message"), str) else e.message
            if isinstance(e.body, str) and e.body.strip():  # (a body that is not JSON: an HTML error page)
                message = f"{message}: {e.body.strip()[:300]}"
            root = str(self.client.base_url).rstrip("/")
            if e.status_code == 404 and not self.is_official and not root.endswith("/v1"):
                # the server's root URL given as base_url: its OpenAI routes are one level down
                message += (f"; OpenAI-compatible servers (lmnb serve, SGLang, vLLM) serve this API under /v1: "
                            f"base_url={_api_root(root)!r}")
            reason = body.get("reason") if isinstance(body.get("reason"), str) else None  # (lmnb serve's DOES_NOT_FIT)
            param = body.get("param") if isinstance(body.get("param"), str) else None  # (the field refused)
            if e.status_code == 401:
                auth = BackendAuthError(f"{self._route}: HTTP 401: {message}{self.key_fix}", reason, param, 401)
                auth.key_fix = self.key_fix
                raise auth from None
            raise BackendError(f"{self._route}: HTTP {e.status_code}: {message}", reason, param,
                               e.status_code) from None
        except self._openai.APITimeoutError as e:
            if connect_timed_out(e):  # (a firewalled host that never answers: no server was reached)
                raise self._connect_timeout_error(self._route, self.client.max_retries + 1) from None
            raise self._timeout_error(self._route, self.client.max_retries + 1) from None
        except self._openai.APIConnectionError as e:  # (not a timeout: caught above) refused, unknown host, ...
            raise self._connection_error(self._route, e, self.client.max_retries + 1, failed) from None
        except self._openai.APIError as e:
            raise BackendError(f"{self._route}: {type(e).__name__}: {e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # (the client's json.loads of the body)
            raise BackendError(f"{self._route} returned a body that is not UTF-8 JSON "
                               f"({type(e).__name__}: {e})") from None
        finally:
            _failed_tries.reset(token)

    def _begin(self, rid: str) -> bool:
        """Register the call of request ``rid`` as starting, for ``abort``; False if ``abort(rid)``
        came before it (the call must send nothing)."""
        with self._requests_lock:
            if self._aborted.take(rid):
                return False
            self._requests[rid] = None  # (starting: an abort() meanwhile removes it)
            return True

    def _started(self, rid: str, request: Any) -> bool:
        """Keep ``rid``'s open stream or pending future for ``abort``; False if ``abort(rid)``
        came while the call started (the caller closes or cancels ``request``)."""
        with self._requests_lock:
            if rid not in self._requests:
                return False
            self._requests[rid] = request
            return True

    def _abortable_call(self, rid: str, kw: dict) -> Any:
        """The async client's answer to ``kw``, waited for here; ``_ABORTED`` if ``abort(rid)``
        cancelled it."""
        from lmnb_engine.waits import future_result  # torch-free (import lmnb loads no engine)

        if not self._begin(rid):
            return _ABORTED
        api = self._async_client.chat.completions if self.is_chat_model else self._async_client.completions
        self._async_used = True
        future = asyncio.run_coroutine_threadsafe(api.create(**kw), _shared_loop())
        if not self._started(rid, future):  # aborted while the call was made
            future.cancel()
        try:
            return future_result(future)  # (in slices: a Ctrl-C that landed as the wait began stops it)
        except concurrent.futures.CancelledError:
            return _ABORTED
        except KeyboardInterrupt:  # (a call on the main thread) no one will read its answer
            future.cancel()
            raise
        finally:
            with self._requests_lock:
                self._requests.pop(rid, None)

    def _choices(self, ret: Any) -> list:
        """The choices of a response, in index order, each with the text its kind of model has.

        Raises:
            BackendError: a response of another shape (the client builds whatever JSON came).
        """
        choices = getattr(ret, "choices", None)
        field = "message.content" if self.is_chat_model else "text"
        if not isinstance(choices, list) or not all(isinstance(_text(c, self.is_chat_model), (str, type(None)))
                                                    for c in choices):
            raise BackendError(f"{self._route} returned {_shown(ret)}, not an OpenAI response (a 'choices' "
                               f"list, each with a '{field}' string); is it an OpenAI-compatible API?")
        return sorted(choices, key=lambda c: getattr(c, "index", 0) or 0)

    def _read_timeout(self) -> Optional[float]:
        """The client's read timeout in seconds (``timeout=``, a number or an ``httpx.Timeout``),
        or None for none."""
        seconds = getattr(self.client.timeout, "read", self.client.timeout)
        return float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None

    def _timeout_error(self, where: str, tries: int, stream: bool = False) -> BackendError:
        """The error for a call that timed out after ``tries`` tries (the client's "Request timed
        out." said neither how long it waited nor that it tried again: 600 s and 3 tries by
        default, half an hour; a stream is not tried again once it has begun). For a ``stream``
        that began, the timeout counts from its last chunk: keep-alive comments and empty lines
        do not count."""
        seconds = getattr(self.client.timeout, "read", self.client.timeout)
        what = "chunk (keep-alive comments and empty lines do not count)" if stream else "answer"
        return BackendError(f"{where}: no {what} within the read timeout of {seconds} s"
                            f"{f', in {tries} tries' if tries > 1 else ''}; check that the server is not stuck or "
                            "overloaded, or change the limits with OpenAI(..., timeout=SECONDS, max_retries=N)")

    def _connect_timeout_error(self, where: str, tries: int) -> BackendUnreachable:
        """The error for a call that got no connection within the client's connect timeout in
        ``tries`` tries (it said "no answer within the read timeout of 600 s", blaming a server it
        never reached)."""
        seconds = getattr(self.client.timeout, "connect", self.client.timeout)
        return BackendUnreachable(f"{where}: no connection within the connect timeout of {seconds} s"
                                  f"{f', in {tries} tries' if tries > 1 else ''}; is the server running at that URL, "
                                  "and are the host and port right (a firewall that drops the connection looks the "
                                  "same)?")

    def _connection_error(self, where: str, e: BaseException, tries: int, failed: Sequence[BaseException] = ()
                          ) -> BackendError:
        """The error for a call whose connection failed, ``e`` (an ``openai.APIConnectionError``), in
        ``tries`` tries, the tries before the last having failed with ``failed`` (httpx's errors, as
        ``_noting_failed_tries`` notes them): the client's own words, "Connection error.", said
        neither that nothing answers at the URL nor why (its cause: httpx's ``ConnectError``,
        "Connection refused" or an unknown host), as ``RuntimeEndpoint``'s does; nor, where the
        server took the connection and dropped it (a crash mid-request: ``RemoteProtocolError``,
        ``ReadError``), that it did and what to do, and where nothing answered the tries after such
        a drop, the last words blamed the host and port of a server that was there.

        Returns:
            ``BackendUnreachable`` where nothing answers (the last try's connection was refused),
            else a ``BackendError`` (the server was reached), as ``RuntimeEndpoint``'s."""
        cause = e.__cause__
        of_tries = f"; {tries} tries" if tries > 1 else ""
        said = f" ({type(cause).__name__}: {cause}{of_tries})" if cause else ""
        if not _caused_by(e, "ConnectError"):  # (a connection the server took, then dropped)
            if not _dropped(cause):  # (a proxy's refusal, a scheme the transport lacks, ...)
                return BackendUnreachable(f"{where}: {type(e).__name__}: {e}{said}")
            return BackendError(f"{where}: the server dropped the connection before its answer was complete{said}; "
                                f"{DROPPED_FIX}")
        drop = next((x for x in failed if _dropped(x)), None)
        if drop is not None:  # (it answered, then went: the host and port were right)
            return BackendUnreachable(f"{where}: the server dropped the connection before its answer was complete "
                                      f"({type(drop).__name__}: {drop}), and nothing answers there since{said}; it "
                                      "stopped or crashed (see its log): start it again, then run the call again")
        return BackendUnreachable(f"{where}: nothing answers there{said}; is the server running, and are the host "
                                  "and port right?")

    def _count_usage(self, usage: Any) -> None:
        prompt, completion = (getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens"))
        with self._requests_lock:  # (calls of a batch or of forks end on several threads)
            if isinstance(prompt, int):
                self.token_usage.prompt_tokens += prompt
            if isinstance(completion, int):
                self.token_usage.completion_tokens += completion

    @staticmethod
    def _usage_meta(ret_id: str, usage: Any) -> dict:
        meta: dict[str, Any] = {"id": ret_id}
        if usage is not None:
            meta["prompt_tokens"] = usage.prompt_tokens
            meta["completion_tokens"] = usage.completion_tokens
            details = getattr(usage, "prompt_tokens_details", None)
            meta["cached_tokens"] = getattr(details, "cached_tokens", None) or 0
        return meta

    def _logprobs(self, choice: Any, params: GenParams) -> dict:
        """SGLang's ``output_token_logprobs`` (and ``output_top_logprobs`` when ``params`` asks for
        top logprobs) of a choice or of a streamed chunk's choice: ``[[logprob, None, token], ...]``,
        the API naming no token ids. Empty when the choice carries no logprobs."""
        lp = getattr(choice, "logprobs", None)
        if lp is None:
            return {}
        if self.is_chat_model:
            content = lp.content or []
            out = {"output_token_logprobs": [[t.logprob, None, t.token] for t in content]}
            tops = [[[x.logprob, None, x.token] for x in (t.top_logprobs or [])] for t in content]
        else:
            tokens = lp.tokens or []
            out = {"output_token_logprobs": [[v, None, t] for t, v in zip(tokens, lp.token_logprobs or [])]}
            tops = [_top_n(top, params.top_logprobs_num) for top in (lp.top_logprobs or [None] * len(tokens))]
        if params.top_logprobs_num:
            out["output_top_logprobs"] = tops
        return out

    def _check_regex(self, text: str, finish: Optional[str], params: GenParams) -> None:
        """Raise ``BackendError`` when an output that ended on its own (finish reason ``stop``, no
        stop string or stop regex that could have cut it) does not match ``params.regex``: the
        server ignored the ``regex`` extension field. The check is Python's ``regex`` with DOTALL,
        at least as permissive as the constrained decoder; a pattern too slow to match is let be."""
        if params.regex is None or finish != "stop" or params.stop_list or params.stop_regexes:
            return
        import regex  # torch-free; the engine's matcher uses the same package

        try:
            matched = regex.fullmatch(params.regex, text, flags=regex.DOTALL, timeout=1.0) is not None
        except (regex.error, TimeoutError):
            return
        if not matched:
            raise BackendError(
                f"{self._route} returned {text!r}, which does not match the regex {params.regex!r} "
                "it was to follow: the server ignores the 'regex' field (lmnb and SGLang servers read it; "
                "vLLM reads guided_regex); use such a server, or lmnb.RuntimeEndpoint"
            )

    # -- BaseBackend

    def generate(self, prompt: Prompt, params: GenParams, rid: str) -> list[Completion]:
        ret = self._call(rid, **self._request(prompt, params))
        if ret is _ABORTED:
            return [Completion("", {"finish_reason": aborted_reason()})
                    for _ in range(params.n or 1)]
        choices = self._choices(ret)
        self._count_usage(ret.usage)
        if len(choices) != (params.n or 1):  # (the executor reads one sample per asked one)
            raise BackendError(f"{self._route} returned {len(choices)} choices for n={params.n or 1}")
        out = []
        for choice in choices:
            text = check_utf8(_text(choice, self.is_chat_model) or "", self._route)
            self._check_regex(text, choice.finish_reason, params)
            meta = self._usage_meta(ret.id, ret.usage)
            meta["finish_reason"] = _finish_reason(choice)
            meta.update(self._logprobs(choice, params))
            out.append(Completion(text, meta))
        return out

    def generate_stream(self, prompt: Prompt, params: GenParams, rid: str) -> Iterator[tuple[str, dict]]:
        meta: dict[str, Any] = {"finish_reason": None}  # None until the last, as RuntimeEndpoint's chunks have it
        text = ""
        where = f"{self._route} stream"
        if not self._begin(rid):
            yield "", {"finish_reason": aborted_reason()}
            return
        try:
            stream = self._call(**self._request(prompt, params), stream=True, stream_options={"include_usage": True})
        except BaseException:
            with self._requests_lock:
                self._requests.pop(rid, None)
            raise
        if not self._started(rid, stream):  # aborted while the request was made
            stream.close()
            yield "", {"finish_reason": aborted_reason()}
            return
        error: Optional[Exception] = None
        watch: Optional[_StallWatch] = None
        try:
            seconds = self._read_timeout()
            if seconds is not None:
                watch = _StallWatch(stream, seconds)
            for chunk in stream:
                if watch is not None:
                    watch.pause()  # (a chunk came; the consumer's time below is not the server's)
                if getattr(chunk, "usage", None) is not None:
                    self._count_usage(chunk.usage)
                    meta.update(self._usage_meta(chunk.id, chunk.usage))
                for choice in self._chunk_choices(chunk, where):
                    delta = check_utf8((choice.delta.content if self.is_chat_model else choice.text) or "", where)
                    if choice.finish_reason is not None:
                        meta["finish_reason"] = _finish_reason(choice)
                    for key, lps in self._logprobs(choice, params).items():  # each chunk: its tokens'
                        meta[key] = meta.get(key, []) + lps
                    if delta:
                        text += delta
                        yield delta, dict(meta, id=chunk.id)
                if watch is not None:
                    watch.resume()
        except Exception as e:  # (also where abort() or the watch closed the stream under the loop)
            error = e
        finally:
            if watch is not None:
                watch.stop()
            with self._requests_lock:
                aborted = self._requests.pop(rid, None) is None
            stream.close()  # (a consumer that stopped early too: the server sees its client leave)
        if aborted:  # abort() closed the stream: what came is not the whole output
            yield "", dict(meta, finish_reason=aborted_reason())
            return
        if watch is not None and watch.stalled:  # (whatever the close made the loop raise, or none)
            raise self._timeout_error(where, 1, stream=True) from None
        if error is not None:
            raise self._stream_failure(error, where) from None
        if meta["finish_reason"] is None:  # the connection closed mid-output: what came would pass for all of it
            raise BackendError(f"{where} ended after {len(text)} characters with no finish reason: the connection "
                               "was cut mid-output; run it again")
        self._check_regex(text, meta["finish_reason"]["type"], params)
        yield "", meta

    def _stream_failure(self, e: Exception, where: str) -> Exception:
        """The error to raise for ``e``, raised while a stream was read (``where``: its server)."""
        if isinstance(e, self._openai.APITimeoutError):
            return self._timeout_error(where, 1, stream=True)
        if isinstance(e, self._openai.APIError):
            return BackendError(f"{where}: {type(e).__name__}: {e}")
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):  # (the client's json.loads of an event)
            return BackendError(f"{where} sent an event that is not UTF-8 JSON ({type(e).__name__}: {e})")
        if isinstance(e, self._httpx.HTTPError):  # (the client wraps errors of the request, not of its stream)
            return BackendError(f"{where} failed: {type(e).__name__}: {e}")
        return e

    def _chunk_choices(self, chunk: Any, where: str) -> list:
        """The choices of a streamed chunk (none in a usage-only chunk).

        Raises:
            BackendError: a chunk of another shape.
        """
        choices = getattr(chunk, "choices", None) or []
        if not hasattr(chunk, "id") or not isinstance(choices, list) or not all(
                hasattr(c, "delta" if self.is_chat_model else "text") for c in choices):
            raise BackendError(f"{where} sent {_shown(chunk)}, not an OpenAI stream chunk; is it an "
                               "OpenAI-compatible API?")
        return choices

    def abort(self, rid: str) -> None:
        """Close the stream of request ``rid`` (a streamed gen), or cancel its call that is not
        streamed, so that the server sees its client leave and stops (left open, it would
        generate, and a hosted API bill, every token to the end). Only a call made with an
        ``http_client`` of the caller's, which blocks, cannot be stopped; it ends on its own."""
        with self._requests_lock:
            if rid in self._requests:
                request = self._requests.pop(rid)
            else:  # its call has not begun (or has ended): one that begins is not sent
                request = None
                self._aborted.add(rid)
        if isinstance(request, concurrent.futures.Future):
            request.cancel()
        elif request is not None:  # (None: still starting, and now marked aborted)
            request.close()

    def check_picks(self) -> None:
        """Chat models score no choices.

        Raises:
            BackendCannotRun: a chat model: chat APIs return no prompt logprobs.
        """
        if self.is_chat_model:
            raise BackendCannotRun(
                "select() needs prompt logprobs, which chat APIs do not return; use a completion model "
                "(OpenAI(..., is_chat_model=False); in a notebook %lm connect URL --openai MODEL --completion), "
                "lmnb.Engine or lmnb.RuntimeEndpoint, or constrain a gen with json_schema {'enum': [...]} at the "
                "start of an assistant message (alone in it under num_api_spec_tokens), whose value is the choice "
                "as JSON, quoted ('\"yes\"')"
            )  # (after text in a reply, or beside it in a speculated role, such a gen is refused in turn)

    def score_choices(self, prompt: Prompt, choices, unconditional: bool, rid: str) -> list[ChoiceLogprobs]:
        """Completion models: one ``echo=True, max_tokens=0, logprobs=0`` request (several of
        ``MAX_BATCH_PROMPTS`` prompts each, in order, for more choices) returns the prompt
        logprobs of ``prompt`` and of every ``prompt + choice`` (servers that support echo: lmnb,
        vLLM, SGLang); tokens are then compared as strings to find where each choice starts
        (``lmnb.choices``). SGLang's OpenAI backend instead walks tokens with ``logit_bias``."""
        self.check_picks()
        if unconditional:
            raise BackendCannotRun(
                "unconditional_likelihood_normalized needs token ids, which OpenAI-compatible APIs do "
                "not return; use token_length_normalized, lmnb.Engine or lmnb.RuntimeEndpoint"
            )
        self._warn_guessed_template(prompt)
        # (an empty prompt has no tokens to compare with, and servers refuse an empty prompt)
        head = [prompt.text] if prompt.text else []
        texts = head + [prompt.text + c for c in choices]
        rows = []
        for at in range(0, len(texts), MAX_BATCH_PROMPTS):  # (in order: the prompt first, then its choices)
            part = texts[at:at + MAX_BATCH_PROMPTS]
            try:
                ret = self._call(rid, model=self.model_name, prompt=part, echo=True, max_tokens=0, logprobs=0,
                                 temperature=0)
            except BackendError as e:
                raise refused_choice(e, "prompt", choices, len(head) - at) or e from None
            if ret is _ABORTED:
                raise BackendError(f"{self._route}: the scoring request of select() was aborted")
            got = self._choices(ret)
            self._count_usage(ret.usage)
            if len(got) != len(part):
                raise BackendError(f"{self._route} returned {len(got)} choices for {len(part)} prompts; "
                                   "it cannot run select()")
            rows += got
        if any(r.logprobs is None or not r.logprobs.tokens or len(r.logprobs.token_logprobs or ()) != len(r.logprobs.tokens)
               for r in rows):  # (zip below would drop the tokens beyond the logprobs)
            raise BackendError(f"{self._route} returned no echoed prompt logprobs (a token_logprobs entry "
                               "per token); it cannot run select()")
        p_tokens = rows[0].logprobs.tokens if head else []
        out = []
        for c, row in zip(choices, rows[len(head):]):
            tokens, lps = row.logprobs.tokens, row.logprobs.token_logprobs
            first = max(first_difference(p_tokens, tokens), 1)  # (token 0 has no context to be scored in)
            if first >= len(tokens) or any(v is None for v in lps[first:]):
                raise ValueError(f"select choice {c!r} leaves no token to score after the prompt {prompt.text[-40:]!r}")
            out.append(ChoiceLogprobs(list(tokens[first:]), [float(v) for v in lps[first:]], first))
        return out

    def shutdown(self) -> None:
        """Close the clients' connections (the shared event loop runs on for other backends). In a
        process made by ``os.fork`` where the backend made no client (``_after_fork``: none used
        yet), there is none to close, and none is made only to be closed."""
        if self._clients is None:
            return
        self._unclosed.clear()  # (closed here: the finalizer has none left to close)
        self.client.close()
        with self._requests_lock:
            used, self._async_used = self._async_used, False
        if used:
            asyncio.run_coroutine_threadsafe(self._async_client.close(), _shared_loop()).result()


def _close_dropped(unclosed: list) -> None:
    """The finalizer of a backend dropped without ``shutdown()``: close the clients in
    ``unclosed`` (none, or the openai client and its async twin or None). It runs wherever the
    garbage collector runs, the shared loop's thread too, so it takes no lock and waits for
    nothing: the async client's close is handed to the shared loop, which holds it until done
    (a loop that never ran has made no connection to close)."""
    if not unclosed:
        return
    client, async_client = unclosed.pop()
    client.close()
    loop, thread = _loop, _loop_thread
    if async_client is not None and loop is not None and thread is not None and thread.is_alive():
        asyncio.run_coroutine_threadsafe(async_client.close(), loop)


def _after_fork_in_child() -> None:
    """Start the shared loop anew (its thread is the parent's; the parent may have held its lock
    at the fork) and have every backend make clients of its own: a backend made before
    ``os.fork`` (multiprocessing's "fork" start method) works in the child."""
    global _loop_lock, _loop, _loop_thread
    _loop_lock, _loop, _loop_thread = threading.Lock(), None, None
    for backend in list(_backends):
        backend._after_fork()


if hasattr(os, "register_at_fork"):  # (POSIX; Windows has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def serves_unlisted(client: Any, model: str) -> bool:
    """Whether the OpenAI-compatible server of ``client`` (an ``openai.OpenAI``) serves ``model``
    though its ``GET /models`` list lacks it: its ``GET /models/{model}`` answers. ``lmnb serve``
    and SGLang serve their model as ``"default"`` too, which they do not list (a connect check of
    the list alone refused ``--openai default``, which every request takes); a server that serves no
    such name answers 404, or has no such route. False where it does not answer."""
    try:
        client.with_options(timeout=10, max_retries=0).models.retrieve(model)
    except Exception:
        return False
    return True


def connect_timed_out(error: BaseException) -> bool:
    """Whether ``error``, an ``openai.APITimeoutError``, is a connect timeout (a host that never
    answered) rather than a server that took the connection and did not answer in time: its cause
    is httpx's ``ConnectTimeout``, or httpx2's, which newer openai clients send requests with."""
    return _caused_by(error, "ConnectTimeout")


def _caused_by(error: BaseException, kind: str) -> bool:
    """Whether the cause of ``error`` (an openai error) is httpx's (or httpx2's) exception ``kind``."""
    return _is(error.__cause__, kind)


def _is(error: Any, *kinds: str) -> bool:
    """Whether ``error`` is one of httpx's (or httpx2's) exceptions ``kinds``."""
    classes = tuple(getattr(m, k) for m in map(sys.modules.get, ("httpx", "httpx2")) if m is not None for k in kinds)
    return isinstance(error, classes)


def _dropped(error: Any) -> bool:
    """Whether ``error`` (httpx's) is of a connection the server took, then dropped mid-exchange (a
    server that stopped or crashed resets the requests it was reading), as ``RuntimeEndpoint`` reads it."""
    return _is(error, *DROPPED_ERRORS)


@functools.lru_cache(maxsize=None)
def _noting_failed_tries(cls: type) -> type:
    """``cls`` (an openai client class) noting the error of each try it makes again in the list
    ``_failed_tries`` holds in the calling context (a call on the shared loop runs in a copy of its
    caller's, the same list): the client raises the last try's error only. Its retry loop calls
    ``_sleep_for_retry`` within the except clause of the failed try, where ``sys.exc_info`` is its
    error; a client without that method (openai before 1.7x) is ``cls`` itself, and notes none."""
    sleep = getattr(cls, "_sleep_for_retry", None)
    if sleep is None:
        return cls

    def note() -> None:
        failed, error = _failed_tries.get(), sys.exc_info()[1]
        if failed is not None and error is not None:
            failed.append(error)

    if asyncio.iscoroutinefunction(sleep):
        async def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
            note()
            return await sleep(self, *args, **kwargs)
    else:
        def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
            note()
            return sleep(self, *args, **kwargs)
    return type(cls.__name__, (cls,), {"_sleep_for_retry": _sleep_for_retry, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def _top_n(top: Optional[dict], n: int) -> list:
    """SGLang's ``output_top_logprobs`` entry (``[[logprob, None, token], ...]``, most likely
    first) of a completions ``top_logprobs`` entry ``top`` (token text -> logprob): its ``n`` most
    likely tokens. OpenAI's legacy completions add the sampled token when it is not among them
    (``logprobs+1`` entries), which SGLang's top logprobs do not hold."""
    ranked = sorted((top or {}).items(), key=lambda kv: -kv[1] if kv[1] is not None else float("inf"))
    return [[v, None, t] for t, v in ranked[:n]]


def _finish_reason(choice: Any) -> dict:
    """A choice's finish reason as SGLang's ``meta_info`` writes one: its ``type``, and where the
    server sent them (fields beyond OpenAI's), ``matched`` from SGLang's ``matched_stop`` (the stop
    string or token id; lmnb serve's too) and ``message`` from lmnb serve's ``finish_message``."""
    out = {"type": choice.finish_reason}
    extra = choice.model_extra or {}
    for key, field in (("matched", "matched_stop"), ("message", "finish_message")):
        if extra.get(field) is not None:
            out[key] = extra[field]
    return out


class _StallWatch:
    """Closes a stream whose server sent no chunk for ``seconds`` while it was read: bytes reset
    httpx's read timeout, and the openai client drops SSE comments, so a stalled stream that
    sends only keep-alive comments (a proxy's, a server's) would never time out. A thread of its
    own waits; the reader then fails at the next bytes that come (or at the read timeout), and
    ``stalled`` says why. The time the consumer holds a chunk (``pause`` to ``resume``) does not
    count: that is not the server's."""

    def __init__(self, stream: Any, seconds: float):
        self.stream = stream
        self.seconds = seconds
        self.stalled = False
        self._since: Optional[float] = time.monotonic()  # when the reader began waiting; None: paused
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="lmnb-openai-stall-watch").start()

    def pause(self) -> None:
        with self._lock:
            self._since = None

    def resume(self) -> None:
        with self._lock:
            self._since = time.monotonic()

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                left = self.seconds if self._since is None else self._since + self.seconds - time.monotonic()
                if left <= 0:
                    self.stalled = True
                    break
            if self._done.wait(left):
                return
        self.stream.close()  # (as abort() does: the server sees its client leave)


def _check_arguments(model_name: Any, is_chat_model: Any, chat_template: Any, base_url: Any, client_kwargs: dict,
                     httpx: Any, openai: Any) -> None:
    """Refuse ``lmnb.OpenAI`` arguments of the wrong type before the openai client is made: a model
    name that is no string failed as "'int' object has no attribute 'lower'" (the chat template's
    lookup), a ``base_url`` or ``timeout`` in the client's own words, with a traceback of its
    internals and a warning from its half-made client's finalizer; an ``is_chat_model`` of "no"
    counted as true, a ``chat_template`` of another type failed at the first program.

    Raises:
        TypeError: naming the argument, what was given (and its type) and what is expected.
        ValueError: a ``timeout`` (or a part of one, ``_client_timeout``) that is not positive, or
            longer than the platform's waits take (``check_timeout``); ``math.inf`` becomes None in
            ``client_kwargs``, the client's no limit."""
    if not isinstance(model_name, str):
        raise TypeError(f"lmnb.OpenAI model_name must be a string, the API's model name (e.g. 'gpt-4o-mini'); "
                        f"got {given(model_name)}")
    if is_chat_model is not None and not isinstance(is_chat_model, bool):
        raise TypeError(f"lmnb.OpenAI is_chat_model must be True, False, or None to tell by the model name; got "
                        f"{given(is_chat_model)}")
    if chat_template is not None and not isinstance(chat_template, ChatTemplate):
        raise TypeError(f"lmnb.OpenAI chat_template must be a ChatTemplate (e.g. lmnb.get_chat_template('chatml')), "
                        f"or None to choose one by the model name; got {given(chat_template)}")
    if base_url is not None and not isinstance(base_url, (str, httpx.URL)):
        raise TypeError(f"lmnb.OpenAI base_url must be a string, the API's URL (e.g. 'http://127.0.0.1:30000/v1'), "
                        f"or None for OpenAI's; got {given(base_url)}")
    if isinstance(base_url, str):
        _check_base_url(base_url)
    if "timeout" in client_kwargs:
        client_kwargs["timeout"] = _client_timeout(client_kwargs["timeout"], openai)


def _check_base_url(base_url: str) -> None:
    """Refuse a ``base_url`` string that is no http(s) URL of the API: a host and port without
    ``http://`` failed each call as "APIConnectionError: Connection error. (UnsupportedProtocol:
    ...)", a query or fragment had the routes' paths put after it, and an empty one went to
    OpenAI's own API (the client reads "" as no URL), to fail for its key.

    Raises:
        ValueError: naming the URL and one to give."""
    scheme, sep, rest = base_url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        example = f"'http://{base_url}'" if not sep and base_url.strip() else "'http://HOST:PORT/v1'"
        raise ValueError(f"lmnb.OpenAI base_url must be the API's http(s) URL, e.g. {example}, or None for OpenAI's; "
                         f"got {base_url!r}")
    if "?" in rest or "#" in rest:
        raise ValueError(f"lmnb.OpenAI base_url must be the API's URL without a query or fragment, e.g. "
                         f"{_api_root(base_url)!r}; got {base_url!r}")


def _api_root(url: str) -> str:
    """The ``/v1`` URL of the OpenAI-compatible API that ``url`` (a server's root, or a route's URL
    under its /v1) points into: ``http://h:8000/v1/chat/completions`` is ``http://h:8000/v1``."""
    url = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    head, v1, _ = url.partition("/v1/")
    return head + "/v1" if v1 else url if url.endswith("/v1") else url + "/v1"


# The waits of an httpx.Timeout, in its constructor's order.
_TIMEOUT_PARTS = ("connect", "read", "write", "pool")


def _client_timeout(timeout: Any, openai: Any) -> Any:
    """``lmnb.OpenAI``'s ``timeout`` as the openai client takes it: seconds (``check_timeout``), or
    an ``httpx.Timeout`` made ``openai.Timeout`` with each part checked the same way. The client
    takes its own transport's class only (openai 3 is on httpx2, and refused an ``httpx.Timeout``
    in its internals' words); a part of 0, -1 or NaN failed every request, and a tuple passed
    unchecked, its parts unnamed (httpx reads (connect, read, write, pool); a requests user writes
    (connect, read)), and lmnb's own waits read no read timeout from it.

    Raises:
        TypeError: neither a number, None nor an ``httpx.Timeout`` (a tuple: the fix spells it).
        ValueError: a number, or a part, out of ``check_timeout``'s range."""
    if timeout is None or isinstance(timeout, (str, bytes, numbers.Real)):
        return check_timeout("lmnb.OpenAI", timeout, " (or an httpx.Timeout)")
    if isinstance(timeout, (tuple, list)) or not all(hasattr(timeout, part) for part in _TIMEOUT_PARTS):
        fix = (f"; a {type(timeout).__name__} does not say which wait each number is: give httpx.Timeout(SECONDS, "
               "connect=SECONDS), or name each of connect, read, write and pool") if isinstance(timeout, (tuple, list)) else ""
        raise TypeError(f"lmnb.OpenAI timeout must be a positive number of seconds (or an httpx.Timeout), or None "
                        f"for no limit; got {given(timeout)}{fix}")
    parts = {part: check_timeout("lmnb.OpenAI", getattr(timeout, part), name=f"timeout.{part}")
             for part in _TIMEOUT_PARTS}
    return openai.Timeout(**parts)


def _text(choice: Any, chat: bool) -> Any:
    """A response choice's text: ``message.content`` (chat) or ``text``; ``0`` (not a string) where
    the choice has neither."""
    if chat:
        return getattr(getattr(choice, "message", None), "content", 0)
    return getattr(choice, "text", 0)


def _shown(value: Any) -> str:
    """A response object (a pydantic model of the openai client, or raw JSON) in an error message:
    its start, on one line."""
    dump = getattr(value, "model_dump_json", None)
    text = dump(exclude_none=True, warnings=False) if callable(dump) else json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "..."
