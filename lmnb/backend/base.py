"""The contract between the interpreter and a model backend.

A backend turns one primitive of a program state into model calls: ``generate`` (one ``gen``),
``generate_stream`` (a streamed ``gen``), ``score_choices`` (the logprobs ``select`` decides on),
``cache_prefix`` (a ``max_new_tokens=0`` prefill, the fork / batch prefix hint of paper §3).
The interpreter owns the program's text, roles and variables; backends never change them.
Shaped after SGLang's ``lang/backend/base_backend.py``, with the select scoring moved to the
interpreter side (``lmnb.choices``) so every backend feeds the same method the same numbers.
"""

from __future__ import annotations

import collections
import math
import numbers
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from lmnb.chat_template import ChatTemplate
from lmnb.choices import ChoiceLogprobs
from lmnb.ir import GEN_NAMES, GenParams, shown_value
from lmnb.user_site import warn_at_user


@dataclass(frozen=True)
class Prompt:
    """What a backend sees of a program state at one primitive.

    text: the whole prompt text so far (roles already rendered with the chat template).
    messages: completed chat messages in OpenAI format (``{"role", "content"}``).
    role: the role currently open (``"assistant"`` while generating a reply), or None.
    role_text: the text written inside the open role so far.
    images: [issue 10] the ``image()``/``video()`` inputs so far (``lmnb.ir.Image``/``Video``), in
        order; ``text`` holds the chat template's ``image_token`` once where each one goes.
    """

    text: str
    messages: list = field(default_factory=list)
    role: Optional[str] = None
    role_text: str = ""
    images: tuple = ()


@dataclass(frozen=True)
class Completion:
    """One generated sample: its text and SGLang-style ``meta_info``.

    meta_info keys: ``id``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
    ``finish_reason`` (``{"type": "stop"|"length"|"abort", "matched"?, "length"?, "message"?}``) and, when
    asked, ``output_token_logprobs`` (``[[logprob, token_id, text_or_None], ...]``),
    ``output_top_logprobs`` and ``input_token_logprobs`` in the same form.
    """

    text: str
    meta_info: dict


# The most prompts one request of a select's scoring carries (the prompt and its choices; their
# unconditional scores): lmnb serve refuses a request of more samples (its MAX_REQUEST_SAMPLES) with a
# 400, so the server backends score a select of more choices in several requests, in the choices'
# order. SGLang sets no bound.
MAX_BATCH_PROMPTS = 16384

# httpx's errors (their class names; httpx2's are named alike) of a connection the server took, then
# dropped mid-exchange: a server that stopped or crashed resets the requests it was reading, and one
# that speaks no HTTP there answers with what httpx cannot read. The server backends say so with
# DROPPED_FIX, what to do about it.
DROPPED_ERRORS = ("ReadError", "WriteError", "RemoteProtocolError")
DROPPED_FIX = ("it stopped, restarted or crashed (see its log), or is no HTTP server: check that it runs at that URL, "
               "then run the call again")

DELTA_TOKENS = "delta_tokens"
"""``generate_stream`` meta_info key of the tokens of one streamed delta (see there)."""


class BackendError(RuntimeError):
    """A backend call failed (server error, bad response); the message names the call and cause.
    ``reason``: the server's JSON error's ``"reason"`` (lmnb serve's ``DOES_NOT_FIT``), else None;
    ``param``: its ``"param"``, the request's field it refused (``text[2]``), else None;
    ``status``: the HTTP status of the server's refusal (400), else None."""

    def __init__(self, message: str = "", reason: Optional[str] = None, param: Optional[str] = None,
                 status: Optional[int] = None):
        super().__init__(message)
        self.reason = reason
        self.param = param
        self.status = status


def refused_choice(e: BackendError, field: str, choices: Sequence[str], first: int) -> Optional[BackendError]:
    """``e`` said of the select choice it is about, where the server refused one prompt of a
    select's scoring request, naming it in the error's ``param`` (``field[i]``: ``text[i]``, lmnb
    serve's /generate; ``prompt[i]``, its /v1/completions), the request's prompt ``first`` being
    ``choices[0]``'s (those before it: the select's prompt alone); else None. The server's words
    name a prompt the program never wrote ("text[2]: prompt of 613 tokens exceeds ..."), where the
    in-process engine names the choice (a choice too long for the context)."""
    named = re.fullmatch(rf"{field}\[(\d+)\]", e.param or "")
    if not named or not 0 <= int(named[1]) - first < len(choices):
        return None
    c = choices[int(named[1]) - first]
    shown = repr(c) if len(c) <= 40 else repr(c[:30]) + "..."
    said = str(e)
    said = said.replace(f"{e.param}: ", "", 1) if f"{e.param}: " in said else said.replace(e.param, field, 1)
    return BackendError(f"select choice {shown}: the server refused its scoring {field} (the prompt, then the "
                        f"choice): {said}", e.reason)


def reworded(e: Exception, message: str) -> Exception:
    """A new exception of ``e``'s type with ``message``, keeping its ``reason`` (``BackendError``'s,
    or the in-process engine's ``ValueError.reason``), which front ends read after it is reworded,
    and a ``BackendError``'s ``param`` and ``status`` (``speculative.refuses_logprobs`` reads them)."""
    new = type(e)(message)
    for name in ("reason", "param", "status"):
        if hasattr(e, name):
            setattr(new, name, getattr(e, name))
    return new


class BackendAuthError(BackendError):
    """The server refused a call for its API key (HTTP 401): none was given, or the wrong one.
    ``key_fix``: the end of the message that says how the Python API gives the key
    (``RuntimeEndpoint``'s and ``OpenAI``'s ``api_key=``), "" where it says none; front ends say
    their own instead (``%lm connect URL --api-key KEY``, a job's ``--api-key``): ``without_key_fix``,
    or, for ``OpenAI``, whose requests meet the 401 at the gen, the backend's ``key_fix`` set to theirs."""

    key_fix = ""


def without_key_fix(e: BaseException) -> str:
    """The message of ``e`` without a ``BackendAuthError``'s ``key_fix``, for a front end that says
    how to give the key in its own words."""
    return str(e).removesuffix(getattr(e, "key_fix", ""))


def key_refusal(given: Optional[str], env: str, how: str) -> tuple[str, Optional[str]]:
    """Why a server refused a call for its API key (HTTP 401), and how to give one, for the message
    of a front end (the Python API, ``%lm connect``, a job), each of which gives the key its own way.

    Args:
        given: how the caller gave the key ("the api_key given", "the --api-key given"); None where
            it gave none, so that the one in ``$env``, if set, was sent.
        env: the environment variable the key defaults from (``LMNB_API_KEY``, ``OPENAI_API_KEY``).
        how: how to give a key, for a server that got none ("pass --api-key KEY or set $LMNB_API_KEY").

    Returns:
        ("the server refused GIVEN" or "... the key in $ENV", None) where a key was sent, else
        ("the server asks for an API key", how).
    """
    sent = given or (f"the key in ${env}" if os.environ.get(env) else None)
    return (f"the server refused {sent}", None) if sent else ("the server asks for an API key", how)


def key_advice(given: Optional[str], env: str, how: str) -> str:
    """``key_refusal``'s why and fix as one clause: "the server refused the key in $ENV: check it",
    or "the server asks for an API key: HOW"."""
    why, fix = key_refusal(given, env, how)
    return f"{why}: {fix or 'check it'}"


def check_api_key(backend: str, api_key: Any) -> None:
    """Refuse an ``api_key`` given to ``backend`` (``lmnb.OpenAI``) that is neither a string nor None:
    its ``Authorization`` header wrote it with ``str()``, so an int went out as digits the server
    refused, or, of more digits than Python writes, failed in Python's words ("Exceeds the limit
    (4300 digits) for integer string conversion"). Its value is not shown: it is meant as a secret.

    Raises:
        TypeError: such an ``api_key``, named by its type."""
    if api_key is not None and not isinstance(api_key, str):
        raise TypeError(f"{backend} api_key must be a string (the server's API key) or None, got "
                        f"{type(api_key).__name__}")


def given(value: Any) -> str:
    """A caller's argument as a type error shows it: its value (``shown_number``'s) and its type,
    ``5 (int)``."""
    return f"{shown_value(value)} ({type(value).__name__})"


def check_timeout(backend: str, timeout: Any, others: str = "", name: str = "timeout") -> Optional[float]:
    """Check a ``timeout`` given to ``backend`` (``lmnb.RuntimeEndpoint``): None or a positive number
    of seconds, at most ``threading.TIMEOUT_MAX`` (the longest wait of the platform's socket and
    thread waits, about 292 years on 64-bit Linux), or ``math.inf``. A string failed on a bare ``>``
    comparison, zero or NaN on every request, and a number past that bound on every request with
    ``OverflowError`` ("timestamp out of range for platform time_t"). ``others``: the other kinds
    the caller lets through, for the message (" (or an httpx.Timeout)"); ``name``: what the
    message calls the value (``timeout.read``, one part of an ``httpx.Timeout``).

    Returns:
        The timeout for the HTTP client: None (httpx's and the openai client's no limit) for None
        and for ``math.inf``, else ``timeout``.

    Raises:
        TypeError: no number (a bool neither), naming what was given and its type.
        ValueError: a number that is not positive (NaN too), or a finite one past
            ``threading.TIMEOUT_MAX``, naming that bound."""
    if timeout is None:
        return None
    expected = f"a positive number of seconds{others}, or None for no limit"
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{backend} {name} must be {expected}; got {given(timeout)}")
    if not timeout > 0:  # (not <= 0: NaN too)
        raise ValueError(f"{backend} {name}={shown_value(timeout)}: give {expected}")
    if timeout == math.inf:
        return None
    if timeout > threading.TIMEOUT_MAX:
        raise ValueError(f"{backend} {name}={shown_value(timeout)} is longer than this platform's waits take "
                         f"(at most {threading.TIMEOUT_MAX:.0f} s, threading.TIMEOUT_MAX): give at most that, "
                         "or None (or math.inf) for no limit")
    return timeout


class BackendUnreachable(BackendError):
    """No connection to the backend's server could be made (refused, no route, an unknown host, a
    connect timeout): the request never reached it, so it says nothing of the request itself.
    Front ends say to check the server and its URL (a batch job's summary does)."""


class BackendCannotRun(ValueError, NotImplementedError):
    """The program asks for what this backend cannot do (an OpenAI chat model generating after text
    in its reply, ``select`` on a chat API, a regex on the official API): the program or the backend
    must change, whatever values the program is given. Both a ``ValueError`` and a
    ``NotImplementedError``, which these refusals were before. Front ends say so (a batch job's
    summary blames the program, not the rows' input)."""


def in_gen_names(message: str) -> str:
    """An engine's or server's error ``message`` about a gen's request in ``gen()``'s names: the
    sampling parameters ``max_new_tokens`` and ``min_new_tokens`` (SGLang's, the engine's) are
    ``gen(max_tokens=..., min_tokens=...)`` in a program, and the prompt that lmnb serve's
    /generate tells to shorten by its field (``text``, ``input_ids``) is the program's prompt, as
    the in-process engine calls it."""
    from lmnb_engine.params import in_front_end_names  # torch-free

    return re.sub(r"\bshorten the (text|input_ids)\b", "shorten the prompt", in_front_end_names(message, GEN_NAMES))


def check_sendable(params: GenParams) -> None:
    """Refuse, before any request, a gen's integer of more digits than Python writes
    (``sys.get_int_max_str_digits()``): no JSON request body can carry it, and the client failed
    while writing one with Python's "ValueError: Exceeds the limit (4300 digits) for integer string
    conversion". A server backend calls it on each gen's resolved ``params``; the in-process engine
    takes such a number and refuses it itself (max_tokens: past the model's context length).

    Raises:
        ValueError: such a number, in ``gen()``'s names; ``max_tokens`` (more tokens than any
            model's context holds) as the engine's refusal, with its ``reason`` ``DOES_NOT_FIT``
            (so a gen that took it from ``run(max_new_tokens=...)`` is told so)."""
    from lmnb_engine.params import DOES_NOT_FIT, decimal_digits, digits_over_limit, past_digit_limit

    # (GenParams bounds n and seed, and refuses a logit_bias id this long; these it takes of any size)
    values = [(f, getattr(params, f)) for f in ("max_new_tokens", "min_new_tokens", "top_k", "logprob_start_len",
                                                 "top_logprobs_num")]
    values += [("stop_token_ids", t) for t in params.stop_token_ids or ()]
    for f, value in values:
        if not isinstance(value, int) or not digits_over_limit(decimal_digits(value)):
            continue
        name, shown = GEN_NAMES.get(f, f), shown_value(value)
        if f == "max_new_tokens":
            e = ValueError(f"{name}={shown} exceeds the model's context length; lower {name} to at most the "
                           "model's context length")
            e.reason = DOES_NOT_FIT
            raise e
        said = f"{name} holds {shown}, which" if f == "stop_token_ids" else f"{name}={shown}"
        raise ValueError(f"{said} has {past_digit_limit(verb='writes')}, so no request to the server can carry it; "
                         "give a smaller number")


class BaseBackend:
    """Interface every backend implements. Methods may be called from many threads at once."""

    #: True when prompts go out as chat messages (OpenAI chat models), not as text.
    is_chat_model: bool = False
    #: True when a gen's ``length`` finish reason says how many tokens it wrote (SGLang's
    #: ``{"type": "length", "length": N}``, the engine's and an SGLang server's); the OpenAI API's says
    #: only ``{"type": "length"}``. API speculative execution writes a gen's finish reason alike.
    length_in_finish_reason: bool = True

    def check_images(self) -> None:
        """[issue 10] Return if ``Prompt.images`` reach a model that takes them (so image/video
        primitives may run); otherwise raise, saying why.

        Raises:
            BackendCannotRun (a NotImplementedError and a ValueError): this backend sends no images,
                or its model is text-only.
        """
        raise BackendCannotRun(
            f"image() and video() need a backend that sends images to a multimodal (vision-language) model; "
            f"{type(self).__name__} does not. Use lmnb.Engine(<LLaVA checkpoint>)"
        )

    def get_chat_template(self) -> ChatTemplate:
        """The role markers programs on this backend use."""
        raise NotImplementedError

    def note_role(self, template: ChatTemplate) -> None:
        """A program begins a chat role written with ``template`` (the executor calls it at each
        role); a backend that guessed ``template`` for a model with none may warn. Default: nothing."""

    def cache_prefix(self, text: str, rid: Optional[str] = None) -> dict:
        """Prefill ``text`` into the prefix cache without generating; returns its meta_info.
        Backends without a prefix cache return ``{}``."""
        return {}

    def generate(self, prompt: Prompt, params: GenParams, rid: str) -> list[Completion]:
        """Generate ``params.n`` (default 1) samples continuing ``prompt``.

        ``params`` is fully resolved (program defaults merged, chat-template stops added, dtype
        turned into a regex). ``rid`` identifies the request for ``abort``.

        Raises:
            BackendError: the model call failed; ValueError: a parameter this backend rejects.
        """
        raise NotImplementedError

    def generate_stream(self, prompt: Prompt, params: GenParams, rid: str) -> Iterator[tuple[str, dict]]:
        """Like ``generate`` for one sample, yielding ``(text_delta, meta_info_so_far)``; the last
        item's meta_info is complete (it holds ``finish_reason``). A backend that knows the tokens
        of each delta may add ``meta_info[DELTA_TOKENS]``: ``[[logprob or None, token_id, text],
        ...]`` (logprob only when ``return_logprob`` was asked); the interpreter moves it into the
        delta's ``text`` event and does not keep it in the variable's meta_info."""
        raise NotImplementedError

    def check_picks(self) -> None:
        """Return unless this backend refuses every pick (``select``, ``gen(choices=...)``) whatever
        its prompt: the executor asks before refusing a pick for where it stands in a program, so
        that a fix the backend would refuse in turn is not offered. Default: nothing (a backend that
        cannot score refuses at ``score_choices``).

        Raises:
            BackendCannotRun: this backend scores no choices, naming the backends that do.
        """

    def score_choices(
        self, prompt: Prompt, choices: Sequence[str], unconditional: bool, rid: str
    ) -> list[ChoiceLogprobs]:
        """Per-token logprobs of each choice after ``prompt`` (see ``lmnb.choices``).

        Raises:
            BackendCannotRun (a NotImplementedError): the backend cannot score prompts.
        """
        raise BackendCannotRun(f"{type(self).__name__} cannot score choices for select()")

    def abort(self, rid: str) -> None:
        """Stop request ``rid`` if it is still running (no error if it is not)."""

    def flush_cache(self) -> Any:
        """Drop the backend's prefix cache; True when it was dropped (backends without one: None).

        Raises:
            BackendError: requests are running, so the cache cannot be dropped now (SGLang's
                RuntimeEndpoint raises for its server's refusal too).
        """

    def get_server_info(self) -> dict:
        """A description of the model and backend."""
        return {}

    def shutdown(self) -> None:
        """Free the backend's resources."""


class AbortedIds:
    """Request ids aborted while no call of theirs ran, the latest ``kept``: a remote backend's
    call that begins after the abort of its id must not be sent. The executor names a request id
    before the call reaches the backend, and an abort in between was lost: the request ran to its
    end. Not thread-safe: the backend's lock guards it with its calls."""

    kept = 4096

    def __init__(self) -> None:
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    def add(self, rid: str) -> None:
        """Remember that ``rid`` was aborted (the oldest id is forgotten past ``kept``)."""
        self._ids[rid] = None
        while len(self._ids) > self.kept:
            self._ids.popitem(last=False)

    def take(self, rid: str) -> bool:
        """Whether ``rid`` was aborted before its call began (forgotten now: the call ends it)."""
        return self._ids.pop(rid, False) is None


class GuessedTemplate:
    """The generic ``default`` chat template a backend chose for a model that has none, told of
    once: at the first role a program writes with it (a model trained on another format answers
    worse, with no other sign of why), also where a batch's threads meet it together."""

    def __init__(self, template: ChatTemplate):
        self._template: Optional[ChatTemplate] = template
        self._lock = threading.Lock()

    def take(self, template: ChatTemplate) -> bool:
        """Whether the caller, writing a role with ``template``, tells of the guess: it is the
        guessed template and no caller told first (then the guess is forgotten)."""
        if template is not self._template:  # (unlocked: one identity test per role written)
            return False
        with self._lock:
            told, self._template = self._template is None, None
        return not told


def tell_guessed_template(on_guessed_template: Optional[Callable[[str], None]], what: str, warning: str) -> None:
    """Say ``what`` was guessed through ``on_guessed_template`` where a front end set it (a kernel's
    line in the cell's output, a job's line on stderr: its own words and fixes); otherwise a
    ``UserWarning`` at the user's line saying ``warning`` (``what`` and the backend's fixes)."""
    if on_guessed_template is not None:
        on_guessed_template(what)
    else:
        warn_at_user(warning, UserWarning)


class AssignableChatTemplate:
    """``chat_template`` as SGLang's backends have it, for a backend that keeps its template in
    ``self._template`` under ``self._lock`` and makes it in ``get_chat_template()``: reading gives
    ``get_chat_template()``; assigning a ``ChatTemplate`` (``lmnb.get_chat_template(name)``) uses
    that one instead, as SGLang's examples do with ``runtime.endpoint.chat_template = ...``.

    A model with no chat template gets the registry's for its path (``from_jinja``); where that is
    the generic ``default``, the backend keeps it as a ``GuessedTemplate`` (``guessed``), and the
    first role a program writes with it says so once per backend: a ``UserWarning`` naming
    ``_template_fix``, or ``on_guessed_template`` where a front end set it."""

    _template_fix = ""  # (the backend's own way to give a template, for the warning)
    _guessed: Optional[GuessedTemplate] = None
    _guessed_for = ""  # (its model path)
    on_guessed_template: Optional[Callable[[str], None]] = None

    def guessed(self, jinja: Optional[str], template: ChatTemplate, model_path: str) -> ChatTemplate:
        """``template`` (``from_jinja(jinja, ..., model_path)``), remembered to tell of at the first
        role when the model has no template (``jinja`` empty) and it is the generic ``default``."""
        if not jinja and template.name == "default":
            self._guessed, self._guessed_for = GuessedTemplate(template), model_path
        return template

    def note_role(self, template: ChatTemplate) -> None:
        guess = self._guessed
        if guess is None or not guess.take(template):
            return
        what = (f"the model {self._guessed_for or '(unnamed)'!r} has no chat template, so the program's roles go out "
                "in the generic 'default' format ('SYSTEM:', 'USER:' and 'ASSISTANT:' lines), which the model may "
                "not be trained on")
        tell_guessed_template(self.on_guessed_template, what, f"{what}. Give its format: {self._template_fix}, or "
                              "backend.chat_template = lmnb.get_chat_template('chatml') (or another registered name)")

    @property
    def chat_template(self) -> ChatTemplate:
        """The role markers programs are written with."""
        return self.get_chat_template()

    @chat_template.setter
    def chat_template(self, template: ChatTemplate) -> None:
        if not isinstance(template, ChatTemplate):
            raise TypeError(f"chat_template must be a ChatTemplate (lmnb.get_chat_template(name)), got {template!r}")
        with self._lock:
            self._template, self._guessed = template, None


def aborted_reason() -> dict:
    """The finish reason of a remote call that ``abort`` stopped (SGLang's for a request its
    server aborted)."""
    return {"type": "abort", "message": "the request was aborted"}


def finish_reason_dict(meta_info: dict) -> dict:
    """``meta_info["finish_reason"]`` as a dict (SGLang servers may send a bare string)."""
    fr = meta_info.get("finish_reason")
    if isinstance(fr, str):
        return {"type": fr}
    return fr or {}


def check_utf8(text: str, what: str) -> str:
    """``text``, a server's output, if UTF-8 can hold it.

    Raises:
        BackendError: a lone surrogate (a JSON escape such as ``\\ud800``, which ``json.loads``
            lets through): it failed the program's next request, far from where it came in.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BackendError(f"{what} returned text with the lone surrogate {text[e.start]!r} (a JSON \\u escape "
                           f"that no UTF-8 text holds) after {text[max(e.start - 40, 0):e.start]!r}") from None
    return text
