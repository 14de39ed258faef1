"""The SGLang native HTTP backend: programs talk to ``lmnb serve`` or an SGLang server.

Speaks SGLang's protocol as its frontend's ``RuntimeEndpoint`` does (``lang/backend/
runtime_endpoint.py``): ``POST /generate`` with ``text`` (or ``input_ids``), ``sampling_params``,
``return_logprob``, ``logprob_start_len``, ``stream`` (SSE, cumulative text per event);
``GET /get_model_info``; ``POST /flush_cache``; ``POST /abort_request``. ``select`` is scored as
``lmnb.choices`` describes, which fixes SGLang's off-by-one and None handling
(``research/features.md`` §4.1). [issue 10] ``image()``/``video()`` inputs go out as SGLang's
``image_data``: one base64 data URL per image (``lmnb.backend.media.data_url``), a video as its
sampled frames, each with an image token of its own in the text (SGLang's frontend sends one image).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import threading
import time
import uuid
import weakref
from typing import Any, Iterator, Optional, Sequence

from lmnb.backend.base import (
    DROPPED_ERRORS, DROPPED_FIX, MAX_BATCH_PROMPTS, AbortedIds, AssignableChatTemplate, BackendAuthError,
    BackendCannotRun, BackendError,
    BackendUnreachable, BaseBackend, Completion, Prompt, aborted_reason, check_sendable, check_utf8, finish_reason_dict,
    check_api_key, check_timeout, in_gen_names, key_advice, refused_choice,
)
from lmnb.backend.media import data_url, expand_frames, per_input
from lmnb.chat_template import ChatTemplate, from_jinja, get_chat_template
from lmnb.choices import ChoiceLogprobs, first_difference
from lmnb.ir import GenParams

UNCONDITIONAL_CONTEXT = "Answer:"  # same context as the in-process backend
# Prompt tokens returned before the prompt's end when scoring choices. The server recomputes every
# token from the window's first on (it needs their logits), so each choice costs SCORE_WINDOW + 1
# prompt tokens the in-process backend takes from the cache. Token healing changes only the last
# token or two, so the first difference almost always falls after the window's first token (if it
# does not, that choice is scored again from further back: RESCORE_WINDOW). 2 is
# SGLang's own (``logprob_start_len = max(prompt_len - 2, 0)``); 1 would score again every choice
# that merges with the prompt's last token (benches/results/2026-12-05-cpu-select-score-window.md).
SCORE_WINDOW = 2
# Tokens further back from the window's start that a choice differing at the window's first token
# (or before it) is scored again from, with the prompt alone, before falling back to the whole
# prompt. Its window cannot say whether the difference lies at its first token or before it: a
# choice that turns the prompt's last two tokens into one ("... on" + "e": " on" is two tokens,
# " one" one) differs at the first token, and was scored again from token 0 (two whole-prompt
# requests); 8 back covers every difference of the bench's prompts and choices, which lie within
# the prompt's last word (benches/results/2026-12-05-cpu-select-score-window.md).
RESCORE_WINDOW = 8
CONNECT_TIMEOUT_S = 10.0
# Seconds to wait for a response (for a stream: for its next event). Long enough for a long
# non-streamed gen queued behind others (the OpenAI client waits 600 s too); finite, so a wedged
# server fails a batch job's rows instead of hanging the job forever.
READ_TIMEOUT_S = 600.0
# Seconds to wait for the model info when connecting (at most ``timeout``): a server answers it at
# once, so a host that takes the connection and says nothing (a wedged server, another service on
# that port, a proxy with no backend) fails the connect now, not after READ_TIMEOUT_S.
MODEL_INFO_TIMEOUT_S = 20.0
# Seconds to wait before trying again a request answered HTTP 503 (SGLang: its queue is full; lmnb
# serve: its grammar compiler is busy), which the server refused before doing any of it; a
# Retry-After of whole seconds, up to RETRY_AFTER_MAX_S, is waited instead.
RETRY_503_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
RETRY_AFTER_MAX_S = 10.0
# An abort of a request that is being sent (not answered yet) is posted again every ABORT_REPEAT_S,
# up to ABORT_POSTS posts in all, until the request is answered: a server ignores the abort of a
# request id it has not received yet, which the abort's own post may overtake.
ABORT_REPEAT_S = 0.5
ABORT_POSTS = 5
# Seconds an abort's post waits for the server; shutdown() waits as long for a post in flight.
ABORT_TIMEOUT_S = 5.0
# The longest line a stream may send, in bytes: far above any real event (SGLang's events carry
# the whole text and logprobs so far: top-20 logprobs of a 128k-token prompt are about 90 MB), so
# that a server sending a line that never ends fails before it fills the memory.
MAX_LINE_BYTES = 256 * 2**20
# The largest body a response that is not streamed may have, in bytes (a batch of results with
# logprobs is several events' worth); beyond it, it is refused as it comes.
MAX_BODY_BYTES = 2**30
# The meta_info lists an incremental stream sends in pieces (SGLang's
# INCREMENTAL_STREAMING_META_INFO_KEYS that lmnb reads).
_OUTPUT_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")
# What a timeout's error says to do about it.
_TIMEOUT_FIX = ("check that it is not stuck or overloaded, or raise the timeout (RuntimeEndpoint(..., timeout=SECONDS); "
                "--timeout SECONDS for %lm connect and for an exported job)")


def _sampling_params(params: GenParams) -> dict:
    """SGLang's ``sampling_params`` object (its name for the seed is ``sampling_seed``; a JSON
    schema given as a dict or bool goes as its JSON text, SGLang's ``json_schema: str``, which its
    grammar cache keys on: a dict there is unhashable).

    Raises:
        ValueError: a number no request can carry (``check_sendable``)."""
    check_sendable(params)  # (as JSON below, it failed in Python's words)
    sp = params.sampling_kwargs()
    if "seed" in sp:
        sp["sampling_seed"] = sp.pop("seed")
    if sp.get("json_schema") is not None and not isinstance(sp["json_schema"], str):
        sp["json_schema"] = json.dumps(sp["json_schema"])
    return sp


class _Call:
    """The calls running under one request id (``RuntimeEndpoint._calling``); two calls may share
    an id, and ``abort`` of the id stops both."""

    def __init__(self) -> None:
        self.aborted = threading.Event()  # set by abort()
        self.users = 0  # calls running under the id
        self.sending = 0  # requests sent whose response has not begun
        self.sub_rids: list[str] = []  # the request ids of a batch being sent (a select's), aborted with it


def _logprob_fields(params: GenParams) -> dict:
    out = {}
    for key in ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs"):
        value = getattr(params, key)
        if value is not None:
            out[key] = value
    return out


def _check_url(base_url: Any) -> None:
    """Refuse a ``base_url`` that is no http(s) URL, naming the fix: httpx's own error for one
    (``UnsupportedProtocol: Request URL is missing an 'http://' or 'https://' protocol``, for a
    host and port without ``http://``) came as a failed ``GET`` of the model info."""
    if not isinstance(base_url, str):
        raise TypeError(f"RuntimeEndpoint takes the server's URL as a string, e.g. 'http://127.0.0.1:30000'; "
                        f"got {type(base_url).__name__}")
    scheme, sep, rest = base_url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        example = f"http://{base_url}" if not sep and base_url.strip() else "http://HOST:PORT"
        raise ValueError(f"RuntimeEndpoint takes the server's http(s) URL, e.g. {example}; got {base_url!r}")
    if "?" in rest or "#" in rest:  # (the routes' paths were put after it: "...:30000?x=1/generate")
        root = f"{scheme}://{re.split(r'[/?#]', rest, maxsplit=1)[0]}"
        raise ValueError(f"RuntimeEndpoint takes the server's root URL, without a query or fragment, e.g. {root}; "
                         f"got {base_url!r}")


class RuntimeEndpoint(AssignableChatTemplate, BaseBackend):
    """Run programs on a server speaking SGLang's native protocol.

    Args:
        base_url: e.g. ``http://127.0.0.1:30000``.
        api_key: sent as ``Authorization: Bearer <api_key>``; default ``$LMNB_API_KEY`` (the key
            ``lmnb serve`` reads too; empty counts as unset), else none.
        verify: TLS verification (httpx's ``verify``; default on).
        chat_template_name: a registered template instead of the server's (``lmnb serve`` reports
            the model's Jinja template in ``/get_model_info``; an SGLang server does not, and then
            the template is chosen from the model path, as SGLang does).
        timeout: seconds to wait for a response, or for a stream's next event (default
            ``READ_TIMEOUT_S``; None or ``math.inf``: no limit; at most ``threading.TIMEOUT_MAX``). Connecting may take ``CONNECT_TIMEOUT_S``, and the
            model info asked at once waits at most ``MODEL_INFO_TIMEOUT_S`` (or ``timeout``, if less). A
            stream's keep-alive comments, empty events and unfinished lines are not events: a
            stream that sends only those for ``timeout`` seconds fails as one that sends nothing.

    A request the server answers with HTTP 503 (busy, or not ready) is sent again after each of
    ``RETRY_503_DELAYS_S`` in turn, unless ``abort`` is called for it meanwhile; a Ctrl-C during
    that wait (on the main thread: the model info, ``flush_cache``) stops it at once, even one that
    lands as it begins (it waits in slices, ``lmnb_engine.waits``). A call whose request id was
    aborted before it began sends nothing (``abort``).

    A gen the server refuses for its API key (HTTP 401: the server restarted with another key,
    or a proxy guards /generate only) raises a ``BackendAuthError`` too, ending with
    ``key_fix``; a front end that made the endpoint sets its own words there (``%lm connect``'s
    ``--api-key``, a job's).

    Raises:
        BackendError: the server cannot be reached, does not answer ``/get_model_info`` within
            ``MODEL_INFO_TIMEOUT_S`` (or ``timeout``, if less), or that request fails;
            ``BackendAuthError`` (a ``BackendError``) when it fails with HTTP 401, its message
            ending with how to give the key (``api_key=``, ``$LMNB_API_KEY``): its ``key_fix``.
        ValueError: a ``timeout`` that is not a positive number of seconds (or is past
            ``threading.TIMEOUT_MAX``), or a ``base_url`` that
            is no http(s) URL (``TypeError`` where it is no string).
        TypeError: an ``api_key`` that is no string (``check_api_key``).
    """

    _template_fix = "lmnb.RuntimeEndpoint(URL, chat_template_name='chatml')"

    def __init__(self, base_url: str, api_key: Optional[str] = None, verify: Any = None,
                 chat_template_name: Optional[str] = None, timeout: Optional[float] = READ_TIMEOUT_S):
        import httpx

        # (here, not at the top: touching lmnb.RuntimeEndpoint loads no lmnb_engine module)
        from lmnb_engine import API_KEY_ENV  # (the package alone: no torch)

        timeout = check_timeout("RuntimeEndpoint", timeout)  # (httpx would fail every request)
        if chat_template_name is not None:  # (a bad name is refused here, not at the first program)
            get_chat_template(chat_template_name)
        _check_url(base_url)
        check_api_key("lmnb.RuntimeEndpoint", api_key)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # (the server's words are for an HTTP client: "send Authorization")
        self.key_fix = "; " + key_advice("the api_key given" if api_key else None, API_KEY_ENV,
                                         f"lmnb.RuntimeEndpoint(URL, api_key=KEY), or set ${API_KEY_ENV}")
        api_key = api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_kwargs = dict(
            base_url=self.base_url,
            headers=headers,
            verify=True if verify is None else verify,
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
        )
        self._httpx = httpx
        self._client: Optional[Any] = self._new_client()
        self._forget_calls()
        _endpoints.add(self)
        # a 404 here is mostly a URL with a path, often the /v1 root of the OpenAI API on the same server;
        # at a root URL, another kind of server (python -m http.server, a web app)
        if not self.client.base_url.path.strip("/"):
            hint = f"; is {self.base_url} an SGLang or lmnb server? It has no /get_model_info"
        else:
            hint = "; RuntimeEndpoint takes the server's root URL (http://HOST:PORT), where SGLang's native routes are"
            if self.base_url.endswith("/v1"):
                hint += ": drop the /v1, or use lmnb.OpenAI(model, base_url=...) for the OpenAI API it serves"
            else:  # (a route's URL, /generate, given for the server's)
                root = str(self.client.base_url.copy_with(path="/")).rstrip("/")
                hint += f": drop the {self.client.base_url.path.rstrip('/')} ({root})"
        try:
            self.model_info = self._request("GET", "/get_model_info", not_found=hint, quick=self._quick_timeout())
            if not isinstance(self.model_info, dict) or not isinstance(self.model_info.get("model_path"), str):
                raise BackendError(f"GET {self.base_url}/get_model_info returned {_shown(self.model_info)}, not "
                                   f"SGLang's model info (an object with a 'model_path' string); is {self.base_url} an "
                                   "SGLang or lmnb server?")
        except BaseException:
            # (no endpoint comes back to shut down: the connection it opened was left to the garbage
            # collector, "ResourceWarning: unclosed <socket.socket ...>")
            self.shutdown()
            raise
        self._template_name = chat_template_name
        self._template: Optional[ChatTemplate] = None
        self._incremental: Optional[bool] = None  # (_incremental_output: asked at the first stream)
        self._lock = threading.Lock()
        self._unconditional_ids: Optional[list[int]] = None

    @property
    def client(self) -> Any:
        """The ``httpx.Client`` of every request (this process's: see ``_after_fork``)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> Any:
        """A new ``httpx.Client``, which ``_close_client`` closes: ``shutdown``, or the garbage
        collector as it collects this endpoint. Code written for SGLang's RuntimeEndpoint, which
        holds no connection, shuts none down, and an endpoint that went with a cycle (a program's
        state, an error's traceback) left its pooled connections to the collector, "ResourceWarning:
        unclosed <socket.socket ...>" in whatever ran then. (Not at exit, where a daemon thread may
        still be using it.)"""
        client = self._httpx.Client(**self._client_kwargs)
        self._close_client = weakref.finalize(self, client.close)  # (holds the client, not the endpoint)
        self._close_client.atexit = False
        return client

    def _forget_calls(self) -> None:
        self._calls: dict[str, _Call] = {}  # request id -> its running calls
        self._aborted = AbortedIds()  # ids aborted before a call of theirs began
        self._calls_lock = threading.Lock()
        # abort posts in flight, which shutdown() waits for: closing the client while one connects
        # leaves the socket it then opens to the garbage collector (httpcore's closed pool drops it)
        self._posting, self._shut = 0, False
        self._posted = threading.Condition(self._calls_lock)

    def _after_fork(self) -> None:
        """In a process made by ``os.fork``: a client of its own, made at its first use (a fork
        that runs ``exec`` next needs none). The parent's pooled connections are the parent's
        sockets: a request of this process on one would share it with the parent's requests. The
        parent's calls in flight, and its locks, are not this process's. Nor is the parent's
        client closed here as this endpoint is collected: its pool's lock may have been held by a
        parent thread at the fork, and its close would wait for it for good."""
        self._close_client.detach()
        self._client = None
        self._forget_calls()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        """The backend as messages name it (``set_default_backend``'s warning, ``%lm stats``):
        ``lmnb.RuntimeEndpoint('URL')``."""
        return f"lmnb.RuntimeEndpoint({self.base_url!r})"

    # -- transport

    def _quick_timeout(self) -> Optional[float]:
        """The read timeout of a request the server answers at once (its model info), when
        ``MODEL_INFO_TIMEOUT_S`` is shorter than ``timeout``; else None (``timeout`` is)."""
        return MODEL_INFO_TIMEOUT_S if self.timeout is None or self.timeout > MODEL_INFO_TIMEOUT_S else None

    @contextlib.contextmanager
    def _calling(self, rid: str) -> Iterator[_Call]:
        """Register a call under request id ``rid`` while it runs, for ``abort``; a call whose id
        was aborted before it began starts aborted (and ``_send`` sends nothing for it)."""
        with self._calls_lock:
            call = self._calls.get(rid)
            if call is None:
                call = self._calls[rid] = _Call()
                if self._aborted.take(rid):
                    call.aborted.set()
            call.users += 1
        try:
            yield call
        finally:
            with self._calls_lock:
                call.users -= 1
                if not call.users:
                    del self._calls[rid]

    def _request(self, method: str, path: str, body: Optional[dict] = None, not_found: str = "",
                 reply: bool = True, quick: Optional[float] = None, call: Optional[_Call] = None) -> Any:
        """``not_found``: said after the server's words when it answers 404; ``reply``: whether
        the answer's JSON is wanted (False: any body, e.g. SGLang's plain-text ``/flush_cache``);
        ``quick``: seconds to wait for an answer the server gives at once, instead of ``timeout``;
        ``call``: as ``_send``'s."""
        what = f"{method} {self.base_url}{path}"
        timeout = self._httpx.Timeout(quick, connect=CONNECT_TIMEOUT_S) if quick is not None else None
        try:
            r = self._send(method, path, body, stream=True, timeout=timeout, call=call)
            try:
                content = _read_body(r, what)
            finally:
                r.close()
        except self._httpx.HTTPError as e:
            raise self._failure(what, e, quick) from None
        if r.status_code >= 400:
            hint = not_found if r.status_code == 404 else _busy() if r.status_code == 503 else ""
            raise _http_failure(what, r.status_code, _error_text(content), hint, _error_field(content), self.key_fix,
                                _error_field(content, "param"))
        _refuse_redirect(r, what)
        if not reply:
            return None
        try:
            return json.loads(content)
        except UnicodeDecodeError as e:  # (a ValueError too; JSON is UTF-8)
            raise BackendError(f"{what} returned a body that is not UTF-8 (byte {e.start}: "
                               f"{e.object[e.start:e.start + 1]!r}); JSON responses must be UTF-8") from None
        except ValueError:
            raise BackendError(f"{what} returned non-JSON: {content[:800].decode('utf-8', 'replace')[:200]!r}") from None

    def _send(self, method: str, path: str, body: Optional[dict], stream: bool = False, timeout: Any = None,
              call: Optional[_Call] = None) -> Any:
        """httpx's response to the request, sent again while the server answers 503 (a streamed
        response is not read: the caller closes it); ``timeout``: httpx's, instead of the client's;
        ``call``: the call (``_calling``) the request belongs to, which ``abort`` stops.

        Raises:
            httpx.HTTPError: as httpx's ``send``.
            BackendError: ``abort`` was called for the request's call before it was sent, or while
                it waited to be sent again.
        """
        from lmnb_engine.waits import sliced_wait  # torch-free (not at the top: import lmnb loads no engine)

        aborted = call.aborted if call is not None else threading.Event()
        batch_rids = body["rid"] if isinstance(body, dict) and isinstance(body.get("rid"), list) else []
        for delay in (*RETRY_503_DELAYS_S, None):
            request = self.client.build_request(method, path, json=body,
                                                timeout=self._httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
            if call is not None:
                with self._calls_lock:  # (an abort from here on sees it being sent)
                    if aborted.is_set():
                        raise BackendError(f"{method} {self.base_url}{path}: aborted before it was sent; it was "
                                           "not sent")
                    call.sending += 1
                    call.sub_rids += batch_rids
            try:
                r = self.client.send(request, stream=stream)
            finally:
                if call is not None:
                    with self._calls_lock:
                        call.sending -= 1
                        for sub in batch_rids:
                            call.sub_rids.remove(sub)
            if r.status_code != 503 or delay is None:
                return r
            r.close()
            after = r.headers.get("retry-after", "")
            wait_s = min(float(after), RETRY_AFTER_MAX_S) if after.isascii() and after.isdigit() else delay
            if sliced_wait(aborted.wait, wait_s):  # (sliced: a Ctrl-C that lands as it begins, on the main thread)
                raise BackendError(f"{method} {self.base_url}{path}: aborted while waiting to send it again to "
                                   "a busy server (HTTP 503)")

    def _failure(self, what: str, e: Exception, quick: Optional[float] = None) -> BackendError:
        """The error for a request (``what``: method and URL; ``quick``: its own read timeout, as
        ``_request``'s) that raised httpx's ``e``."""
        if isinstance(e, self._httpx.ConnectTimeout):
            return BackendUnreachable(f"{what}: no connection within {CONNECT_TIMEOUT_S:g} s; is the server running "
                                f"at {self.base_url}, and are the host and port right?")
        if isinstance(e, self._httpx.TimeoutException) and quick is not None:
            return BackendError(
                f"{what}: {self.base_url} took the connection but sent no answer within {quick:g} s, where an "
                "SGLang or lmnb server answers at once; check that the URL is the server's (not another service "
                "on that port, or a proxy with nothing behind it), that the server has finished starting, and "
                "that it is not stuck (if it is only slow, raise "
                "lmnb.backend.runtime_endpoint.MODEL_INFO_TIMEOUT_S)")
        if isinstance(e, self._httpx.TimeoutException):
            return BackendError(f"{what}: the server at {self.base_url} sent nothing for {self.timeout:g} s (the "
                                f"read timeout); {_TIMEOUT_FIX}")
        if isinstance(e, self._httpx.ConnectError):  # refused: no server (any more) at that host and port
            return BackendUnreachable(f"{what}: nothing answers at {self.base_url} ({type(e).__name__}: {e}); is the "
                                "server running, and are the host and port right?")
        if isinstance(e, tuple(getattr(self._httpx, name) for name in DROPPED_ERRORS)):  # (taken, then dropped)
            return BackendError(f"{what}: the server at {self.base_url} dropped the connection before its answer was "
                                f"complete ({type(e).__name__}: {e}); {DROPPED_FIX}")
        return BackendError(f"{what} failed: {type(e).__name__}: {e}")

    def get_chat_template(self) -> ChatTemplate:
        with self._lock:
            if self._template is None:
                if self._template_name:
                    self._template = get_chat_template(self._template_name)
                else:
                    info = self.model_info
                    special = {k: info[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if isinstance(info.get(k), str)}
                    jinja = info.get("chat_template") if isinstance(info.get("chat_template"), str) else None
                    tmpl = from_jinja(jinja, special, info["model_path"])
                    if tmpl.bos and info.get("encode_adds_bos"):
                        tmpl = dataclasses.replace(tmpl, bos="")
                    if isinstance(info.get("image_token"), str):  # [issue 10] lmnb serve names it
                        tmpl = dataclasses.replace(tmpl, image_token=info["image_token"])
                    # (lmnb serve says when the model has no template; an SGLang server says nothing)
                    self._template = self.guessed(jinja, tmpl, info["model_path"]) if "chat_template" in info else tmpl
            return self._template

    def check_images(self) -> None:
        """[issue 10] ``lmnb serve`` reports its model's ``image_token`` (None: text-only); an SGLang
        server reports nothing, and then its own answer tells.

        Raises:
            BackendCannotRun (a ValueError): the served model is text-only.
        """
        if "image_token" in self.model_info and not self.model_info["image_token"]:
            raise BackendCannotRun(f"image() and video() need a vision-language model, and the server at {self.base_url} "
                             f"serves the text-only {self.model_info.get('model_path')!r}; serve a LLaVA checkpoint")

    def _payload(self, prompt: Any) -> tuple[dict, list[int]]:
        """The ``text`` (and [issue 10] ``image_data``) of a prompt (a str, or a ``Prompt``), and
        how many images each of its ``image()``/``video()`` inputs became (``per_input`` reads the
        server's per-image meta_info with them)."""
        if isinstance(prompt, str) or not prompt.images:
            return {"text": prompt if isinstance(prompt, str) else prompt.text}, []
        text, images, counts = expand_frames(prompt, self.get_chat_template().image_token)
        return {"text": text, "image_data": [data_url(x) for x in images]}, counts

    # -- generation

    def cache_prefix(self, text: Any, rid: Optional[str] = None) -> dict:
        """Prefill ``text`` (a str, or [issue 10] a ``Prompt`` with images) on the server. ``rid``
        is optional, as in SGLang's ``RuntimeEndpoint.cache_prefix(prefix_str)``."""
        rid = rid or uuid.uuid4().hex
        with self._calling(rid) as call:
            payload, counts = self._payload(text)
            return per_input(self._prefill(payload, rid, call), counts)

    def _result(self, item: Any, what: str) -> tuple[str, dict]:
        """The text and meta_info of one ``/generate`` result (``what``: the request, for the error).

        Raises:
            BackendError: not SGLang's shape (an object with a ``text`` string and a ``meta_info``
                object), as from a server of another protocol.
        """
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not isinstance(meta, (dict, type(None))):
            raise BackendError(f"{what} returned {_shown(item)}, not SGLang's result (an object with a 'text' string "
                               f"and a 'meta_info' object); is {self.base_url} an SGLang or lmnb server?")
        return check_utf8(item["text"], what), meta or {}

    def _prefill(self, payload: dict, rid: str, call: _Call) -> dict:
        res = self._request("POST", "/generate", {**payload, "sampling_params": {"max_new_tokens": 0}, "rid": rid},
                            call=call)
        return self._result(res, f"POST {self.base_url}/generate")[1]

    def generate(self, prompt: Prompt, params: GenParams, rid: str) -> list[Completion]:
        with self._calling(rid) as call:
            payload, counts = self._payload(prompt)
            data = {**payload, "sampling_params": _sampling_params(params), "rid": rid, **_logprob_fields(params)}
            try:
                res = self._request("POST", "/generate", data, call=call)
            except BackendError as e:  # (the server names SGLang's sampling parameters)
                renamed = type(e)(in_gen_names(str(e)), e.reason)  # (a BackendAuthError stays one)
                if isinstance(e, BackendAuthError):
                    renamed.key_fix = e.key_fix
                raise renamed from None
        results = [self._result(it, f"POST {self.base_url}/generate") for it in (res if isinstance(res, list) else [res])]
        if len(results) != (params.n or 1):  # (the executor reads one sample per asked one)
            raise BackendError(f"POST {self.base_url}/generate returned {len(results)} results for n={params.n or 1}")
        return [Completion(text, per_input(meta, counts)) for text, meta in results]

    def generate_stream(self, prompt: Prompt, params: GenParams, rid: str) -> Iterator[tuple[str, dict]]:
        """``generate``'s output delta by delta. An abort that reaches the stream before the
        server's own abort does (the server got the request after the abort's post) closes it, so
        that the server stops, and ends it with an ``abort`` finish reason, as the server's would.

        Raises:
            BackendError: as ``_send`` (aborted before the request was sent, among others), or the
                stream fails (an error event, a timeout, a cut or malformed stream).
        """
        with self._calling(rid) as call:
            yield from self._stream(prompt, params, rid, call)

    def _stream(self, prompt: Prompt, params: GenParams, rid: str, call: _Call) -> Iterator[tuple[str, dict]]:
        payload, counts = self._payload(prompt)
        data = {
            **payload, "sampling_params": _sampling_params(params), "rid": rid, "stream": True,
            **_logprob_fields(params),
        }
        what = f"POST {self.base_url}/generate stream"
        try:
            with contextlib.closing(self._send("POST", "/generate", data, stream=True, call=call)) as r:
                if call.aborted.is_set():  # while it was sent: the server may have missed the abort
                    yield "", {"finish_reason": aborted_reason()}
                    return
                if r.status_code >= 400:
                    content = _read_body(r, f"POST {self.base_url}/generate")
                    raise _http_failure(f"POST {self.base_url}/generate", r.status_code,
                                        in_gen_names(_error_text(content)), _busy() if r.status_code == 503 else "",
                                        _error_field(content), self.key_fix)
                _refuse_redirect(r, what)
                text, meta, done = "", {}, False
                incremental = self._incremental_output()
                logprobs: dict[str, list] = {}  # (incremental: the output logprobs so far)
                last_event = time.monotonic()  # (or the response's start)

                def chunks() -> Iterator[bytes]:
                    """The body's bytes, failing once ``timeout`` passes without an event: a chunk
                    resets httpx's read timeout, and keep-alive comments would reset it forever."""
                    for chunk in r.iter_bytes():
                        if self.timeout is not None and time.monotonic() - last_event > self.timeout:
                            raise BackendError(
                                f"{what}: the server at {self.base_url} sent no event for {self.timeout:g} s (the "
                                "read timeout), only keep-alive comments, empty events or part of a line; "
                                f"{_TIMEOUT_FIX}")
                        yield chunk

                for line in _utf8_lines(chunks(), what):
                    if not line.startswith("data:"):
                        continue
                    last_event = time.monotonic()
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    try:
                        obj = json.loads(payload)
                    except ValueError:
                        raise BackendError(f"{what} sent an event that is not JSON: {payload[:200]!r}") from None
                    if isinstance(obj, dict) and "error" in obj:  # the server's own words, as _error_text
                        err = obj["error"]
                        message = err.get("message", err) if isinstance(err, dict) else err
                        raise BackendError(f"{what}: {in_gen_names(str(message))}")
                    cumulative, meta = self._result(obj, what)
                    if incremental:  # each event carries what is new: add it up to SGLang's usual form
                        cumulative = text + cumulative
                        for key in _OUTPUT_LOGPROB_KEYS:
                            if isinstance(meta.get(key), list):
                                logprobs.setdefault(key, []).extend(meta[key])
                        meta = {**meta, **logprobs}
                    if call.aborted.is_set() and finish_reason_dict(meta).get("type") != "abort":
                        yield "", per_input({**meta, "finish_reason": aborted_reason()}, counts)  # (its text came after it)
                        return
                    if not cumulative.startswith(text):  # (a delta read as the whole text lost the output)
                        raise BackendError(
                            f"{what} sent {cumulative!r} after {text[-40:]!r}, which does not continue it: SGLang's "
                            "stream carries the whole text so far in each event, unless the server's "
                            "/get_server_info says incremental_streaming_output, and this one did not")
                    yield cumulative[len(text):], per_input(meta, counts)
                    last_event = time.monotonic()  # (the time the consumer held the event is not the server's)
                    text = cumulative
                if not done and finish_reason_dict(meta).get("type") is None:
                    # the connection closed mid-output: what came would pass for the whole output
                    raise BackendError(f"{what} ended after {len(text)} characters with no finish reason and no "
                                       "[DONE]: the connection was cut mid-output; run it again")
        except self._httpx.HTTPError as e:
            raise self._failure(what, e) from None

    # -- select

    def _window(self, texts: list[str], start: int, rid: str, call: _Call,
                images: Optional[list[str]] = None) -> list[dict]:
        """Prompt logprobs of every text from token ``start`` on (each text after ``images``, the
        same data URLs for all, when the prompt has [issue 10] images), as part of ``call``."""
        body = {
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
        }
        if images:
            body["image_data"] = [images] * len(texts)
        return self._scores("text", texts, body, f"{rid}-", call)

    def _scores(self, key: str, prompts: list, body: dict, rid: str, call: _Call) -> list[dict]:
        """The results of POST /generate for ``prompts`` (under ``key``: "text" or "input_ids",
        the ``i``-th with request id ``rid + str(i)``) with the rest of ``body`` (whose lists of one
        item per prompt, ``image_data``, are cut as the prompts are), in order, as part of ``call``:
        in requests of at most ``MAX_BATCH_PROMPTS`` prompts, one after another, so that the
        prompt the caller put first is cached before the choices that share it are computed."""
        per_prompt = [k for k, v in body.items() if isinstance(v, list)]
        items: list = []
        for at in range(0, len(prompts), MAX_BATCH_PROMPTS):
            part = prompts[at:at + MAX_BATCH_PROMPTS]
            cut = {k: body[k][at:at + len(part)] for k in per_prompt}
            res = self._request("POST", "/generate", {
                **body, **cut, key: part, "rid": [f"{rid}{i}" for i in range(at, at + len(part))]}, call=call)
            items += self._batch(res, len(part))
        return items

    def _batch(self, res: Any, count: int) -> list:
        """The results of a ``/generate`` call for ``count`` prompts (one: SGLang answers an object).

        Raises:
            BackendError: another number of results (``zip`` dropped choices, an index failed).
        """
        items = res if isinstance(res, list) else [res]
        if len(items) != count:
            raise BackendError(f"POST {self.base_url}/generate returned {len(items)} results for {count} prompts")
        return items

    @staticmethod
    def _entries(item: dict) -> tuple[list[Optional[int]], list[Optional[float]]]:
        """(token ids, logprobs) of a scoring result. Raises ``BackendError`` if the server aborted it
        (its logprobs would be missing or noise, e.g. after NaN logits)."""
        meta = item.get("meta_info") if isinstance(item, dict) else None
        fr = finish_reason_dict(meta if isinstance(meta, dict) else {})
        if fr.get("type") == "abort":
            raise BackendError(f"scoring on the server was aborted: {fr.get('message') or 'no reason given'}")
        entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) >= 2 for e in entries):
            raise BackendError("the server returned no input_token_logprobs ([logprob, token id, ...] entries) for a "
                               "select(), which needs them (SGLang's return_logprob with logprob_start_len)")
        return [e[1] for e in entries], [e[0] for e in entries]

    def score_choices(self, prompt: Prompt, choices: Sequence[str], unconditional: bool, rid: str) -> list[ChoiceLogprobs]:
        """Prefill the prompt once, then score every ``prompt + choice`` in one batched request (in
        several of ``MAX_BATCH_PROMPTS`` each, in order, for more choices than that), returning the last ``SCORE_WINDOW`` prompt tokens' ids and logprobs, from which the first
        differing token is found (``lmnb.choices``). A choice whose tokens differ from the prompt's
        already at the window's first token is scored again with the prompt alone, from
        ``RESCORE_WINDOW`` tokens further back, then, if they differ there too, from token 0.

        The prompt's token count, which the window's start (SGLang's ``logprob_start_len``, counted
        from token 0) needs before the choices are sent, comes from the request that prefills the
        prompt alone, as in SGLang's frontend: the client has no tokenizer, and the protocol has no
        start counted from the end (SGLang's -1 means the output's tokens only). Caching the prompt
        is that request's lesser part: ``lmnb serve`` shares a prefix of 32 tokens or more among a
        batch's prompts anyway (its in-batch prefix caching), and the prompt is mostly cached by the
        program's earlier calls; without the count, the window would start at token 0, which
        recomputes the whole prompt for every choice."""
        with self._calling(rid) as call:
            return self._score_choices(prompt, choices, unconditional, rid, call)

    def _score_choices(self, prompt: Prompt, choices: Sequence[str], unconditional: bool, rid: str,
                       call: _Call) -> list[ChoiceLogprobs]:
        payload, counts = self._payload(prompt)  # [issue 10] images are encoded once for every request
        text, images = payload["text"], payload.get("image_data")
        token = self.get_chat_template().image_token
        for c in choices if images else ():
            if token in c:
                raise ValueError(f"select choice {c!r} holds the image placeholder; images go in image(), not in choices")
        prefill = per_input(self._prefill(payload, rid, call), counts) if text else None
        n_prompt = (prefill or {}).get("prompt_tokens", 0)
        start = max(n_prompt - SCORE_WINDOW, 0)
        # (an empty prompt has no tokens to compare with, and the server refuses an empty text)
        head = [text] if text else []
        try:
            items, start = self._choice_windows(head + [text + c for c in choices], start, rid, call, images)
        except BackendError as e:
            if len(head) + len(choices) > MAX_BATCH_PROMPTS:  # (sent in parts, whose indices restart)
                raise
            raise refused_choice(e, "text", choices, len(head)) or e from None
        p_ids = self._entries(items[0])[0] if text else []
        items = items[len(head):]
        out = []
        for i, c in enumerate(choices):
            item = items[i]  # (the request that scored the choice, whose cached tokens it reports)
            ids, lps = self._entries(item)
            rel, offset = first_difference(p_ids, ids), start
            while rel == 0 and offset > 0:  # differs at the window's first token or before it: look further back
                # (at most twice: RESCORE_WINDOW tokens further back, then from token 0)
                back = max(offset - RESCORE_WINDOW, 0) if offset == start else 0
                pair, offset = self._choice_windows([text, text + c], back, rid, call, images)
                (p_back, _), (ids, lps), item = self._entries(pair[0]), self._entries(pair[1]), pair[1]
                rel = first_difference(p_back, ids)
            first = max(offset + rel, 1) - offset  # absolute token 0 has no context to be scored in
            if first >= len(ids) or any(lp is None for lp in lps[first:]):
                raise ValueError(f"select choice {c!r} leaves no token to score after the prompt {prompt.text[-40:]!r}")
            out.append(ChoiceLogprobs(
                [int(t) for t in ids[first:]], [float(x) for x in lps[first:]], offset + first,
                int(item["meta_info"].get("cached_tokens", 0)), prompt_meta=prefill,
            ))
        if unconditional:
            ctx = self._context_ids(rid, call)
            res = self._scores("input_ids", [ctx + s.token_ids for s in out], {
                "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True,
                "logprob_start_len": len(ctx),
            }, f"{rid}-u", call)
            out = [dataclasses.replace(s, unconditional_logprobs=self._entries(r)[1]) for s, r in zip(out, res)]
        return out

    def _choice_windows(self, texts: list[str], start: int, rid: str, call: _Call,
                        images: Optional[list[str]]) -> tuple[list[dict], int]:
        """``_window(texts, start, ...)`` checked by ``_entries``, and the start it used: 0 when the
        server refused ``start`` because a choice merged with the prompt's last tokens into a text
        of ``start`` tokens or fewer ("questio" + "n": SGLang aborts it, ``lmnb serve`` answers 400;
        both name logprob_start_len), so that every text is scored from its first token instead."""
        try:
            items = self._window(texts, start, rid, call, images)
            for item in items:
                self._entries(item)
        except BackendError as e:
            if start == 0 or "logprob_start_len" not in str(e):
                raise
            start = 0
            items = self._window(texts, start, rid, call, images)
        return items, start

    def _context_ids(self, rid: str, call: _Call) -> list[int]:
        if self._unconditional_ids is None:
            ids, _ = self._entries(self._window([UNCONDITIONAL_CONTEXT], 0, rid, call)[0])
            self._unconditional_ids = [int(t) for t in ids]
        return self._unconditional_ids

    # -- control

    def abort(self, rid: str) -> None:
        """Ask the server to stop request ``rid``, from a thread of its own: waiting for a wedged
        server would hold the caller up to 5 s per request (a fork's branches and a batch's rows
        are aborted one after another), and aborting is best effort anyway. A request waiting to be
        sent again (the server answered 503) is not sent; nor is a call under ``rid`` that begins
        after this (the latest ``AbortedIds.kept`` ids are kept for that: do not use an aborted id
        again). While a request is being sent, the abort is posted again every ``ABORT_REPEAT_S``
        until it is answered, ``ABORT_POSTS`` posts at most: the first may reach the server before it."""
        with self._calls_lock:
            call = self._calls.get(rid)
            if call is not None:
                call.aborted.set()
            else:
                self._aborted.add(rid)
        threading.Thread(target=self._abort, args=(rid, call), name=f"lmnb-abort-{rid}", daemon=True).start()

    def _abort(self, rid: str, call: Optional[_Call]) -> None:
        """Post the abort of ``rid`` and of the batch ``call`` is sending (a select's scoring
        requests, each with a request id of its own), again while it is being sent."""
        for posts in range(1, ABORT_POSTS + 1):
            with self._calls_lock:
                rids = [rid] + (list(call.sub_rids) if call is not None else [])
            for r in rids:
                with self._calls_lock:
                    if self._shut:
                        return
                    self._posting += 1
                try:
                    self.client.post("/abort_request", json={"rid": r}, timeout=ABORT_TIMEOUT_S)
                except (self._httpx.HTTPError, RuntimeError):  # (RuntimeError: shutdown() gave up waiting for it)
                    pass  # the request may be gone already; aborting is best effort
                finally:
                    with self._calls_lock:
                        self._posting -= 1
                        self._posted.notify_all()
            if call is None or posts == ABORT_POSTS:
                return
            time.sleep(ABORT_REPEAT_S)
            with self._calls_lock:
                if not call.sending:  # answered (or not sent: _send sends nothing once it is aborted)
                    return

    def get_model_name(self) -> str:
        """The server's ``model_path`` (SGLang's ``RuntimeEndpoint.get_model_name``)."""
        return self.model_info["model_path"]

    def flush_cache(self, empty_cache: bool = True) -> bool:
        """Drop the server's prefix cache. ``empty_cache`` (SGLang's) is accepted and ignored."""
        # refused while requests run: HTTP 409 (SGLang: 400), a BackendError; SGLang answers in plain text
        self._request("POST", "/flush_cache", reply=False)
        return True

    def _incremental_output(self) -> bool:
        """Whether the server's ``/generate`` streams send only what is new in each event (SGLang's
        and ``lmnb serve``'s ``--incremental-streaming-output``, which their ``/get_server_info``
        reports), not the whole text and logprobs so far; asked at the first stream, and again at
        the next while it gets no answer (a timeout must not settle it). A server that answers
        without saying is taken to stream SGLang's default, the whole text."""
        if self._incremental is None:
            try:
                info = self._request("GET", "/get_server_info", quick=self._quick_timeout())
            except BackendError:
                return False  # (this stream then fails on a piece that does not continue the text)
            self._incremental = isinstance(info, dict) and info.get("incremental_streaming_output") is True
        return self._incremental

    def get_server_info(self) -> dict:
        try:
            return self._request("GET", "/get_server_info", quick=self._quick_timeout())
        except BackendError:
            return dict(self.model_info)

    def shutdown(self) -> None:
        """Close the client's connections, once an abort post in flight is answered (at most
        ``ABORT_TIMEOUT_S``, for a wedged server); no abort is posted after this."""
        with self._calls_lock:
            self._shut = True
            self._posted.wait_for(lambda: not self._posting, ABORT_TIMEOUT_S)
        if self._client is not None:  # (a forked process's, made at its first use: none yet)
            self._close_client()


# Every live endpoint: in a process made by os.fork, each makes a new client (_after_fork_in_child).
_endpoints: "weakref.WeakSet[RuntimeEndpoint]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Have every endpoint made before ``os.fork`` (multiprocessing's "fork" start method) use
    connections of its own in the child."""
    for endpoint in list(_endpoints):
        endpoint._after_fork()


if hasattr(os, "register_at_fork"):  # (POSIX; Windows has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _utf8_lines(chunks: Iterator[bytes], what: str) -> Iterator[str]:
    """The lines of a byte stream, each decoded as UTF-8 (httpx's ``iter_lines`` writes U+FFFD for
    bytes that are not, which would pass for generated text).

    Raises:
        BackendError: a line that is not UTF-8, or one longer than ``MAX_LINE_BYTES`` (raised as
            soon as that much of it has come).
    """
    pending: list[bytes] = []  # (the parts of a line that spans chunks, joined once it ends: a long
    pending_bytes = 0  # event re-joined per chunk copied quadratically)
    for chunk in itertools.chain(chunks, [b"\n"]):
        *lines, rest = chunk.split(b"\n")  # (the last newline ends a last line without one)
        if lines:
            lines[0] = b"".join(pending + [lines[0]])
            pending, pending_bytes = [], 0
        pending.append(rest)
        pending_bytes += len(rest)
        too_long = next((line for line in lines if len(line) > MAX_LINE_BYTES), None)
        if too_long is not None or pending_bytes > MAX_LINE_BYTES:
            start = (too_long or b"".join(pending))[:60]
            raise BackendError(f"{what} sent a line longer than {MAX_LINE_BYTES} bytes, starting {start!r}: no event "
                               "is that long (is the server, or a proxy before it, sending a line that never ends?); "
                               "if its events are, raise lmnb.backend.runtime_endpoint.MAX_LINE_BYTES")
        for line in lines:
            try:
                yield line.rstrip(b"\r").decode("utf-8")
            except UnicodeDecodeError as e:
                raise BackendError(f"{what} sent a line that is not UTF-8 (byte {e.start}: "
                                   f"{line[e.start:e.start + 1]!r}): {line[:120]!r}") from None


def _busy() -> str:
    """What an error for a request answered HTTP 503 at every try adds to the server's words."""
    return (f"; the server is overloaded or not ready yet (it answered 503 to {len(RETRY_503_DELAYS_S) + 1} tries "
            "in a row): run it again later, or send it fewer requests at once")


def _refuse_redirect(r: Any, what: str) -> None:
    """Raise ``BackendError`` for a redirect (httpx does not follow one here; its empty body was
    reported as "non-JSON: ''"), naming where it points."""
    if 300 <= r.status_code < 400:
        raise BackendError(f"{what}: HTTP {r.status_code}, a redirect to {r.headers.get('location')!r}; give "
                           "RuntimeEndpoint the server's own root URL (an https:// one, if that is where it points)")


def _shown(value: Any) -> str:
    """``value`` (a response's JSON) in an error message: its start, on one line."""
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _read_body(r: Any, what: str) -> bytes:
    """The body of httpx's streamed response ``r`` (``what``: its request, for the error).

    Raises:
        BackendError: a body longer than ``MAX_BODY_BYTES`` (raised as soon as that much has come).
        httpx.HTTPError: as httpx's ``iter_bytes``.
    """
    parts, size = [], 0
    for chunk in r.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BackendError(f"{what} returned a body longer than {MAX_BODY_BYTES} bytes, starting "
                               f"{(parts or [chunk])[0][:60]!r}: no answer is that long (is the server, or a proxy "
                               "before it, sending an endless body?); if its answers are, raise "
                               "lmnb.backend.runtime_endpoint.MAX_BODY_BYTES")
        parts.append(chunk)
    return b"".join(parts)


def _http_failure(what: str, status: int, words: str, hint: str = "", reason: Optional[str] = None,
                  key_fix: str = "", param: Optional[str] = None) -> BackendError:
    """The error of the call ``what`` that the server answered with HTTP ``status`` (>= 400) and
    ``words``, ``reason`` and ``param`` (the error's, ``_error_field``): a ``BackendAuthError`` for
    401 (its API key), its message ending with ``key_fix`` (how to give the key), else a ``BackendError``."""
    if status != 401:
        return BackendError(f"{what}: HTTP {status}: {words}{hint}", reason, param)
    auth = BackendAuthError(f"{what}: HTTP {status}: {words}{hint}{key_fix}", reason, param)
    auth.key_fix = key_fix
    return auth


def _error_field(content: bytes, name: str = "reason") -> Optional[str]:
    """The string ``name`` of the server's JSON error in ``content``: its ``"reason"`` (an lmnb
    serve extension) or ``"param"`` (the request's field it names, OpenAI's: ``text[1]``); None
    where it gives none (SGLang's server, a proxy, a body that is not JSON)."""
    try:
        body = json.loads(content)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) else None


def _error_text(content: bytes) -> str:
    """The server's words in an error response's body ``content``."""
    try:
        body = json.loads(content)
    except ValueError:
        text = content[:20000].decode("utf-8", "replace")
        if re.match(r"\s*<(!doctype html|html|head|body)\b", text, re.IGNORECASE):  # a web server's error page
            text = " ".join(re.sub(r"<!--.*?-->|<[^>]*>", " ", text, flags=re.DOTALL).split())
            return f"an HTML page ({text[:300]})" if text else "an HTML page"
        return text[:500]
    # SGLang's and lmnb's {"error": {"message": ...}}; FastAPI's HTTPException (a proxy, another
    # server in front) answers {"detail": ...}
    err = body.get("error", body.get("detail", body)) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
