"""JSON ↔ engine types for SGLang's native HTTP protocol (``/generate``).

Field names are SGLang's (``GenerateReqInput`` and ``sampling_params`` in
``srt/managers/io_struct.py`` and ``srt/sampling/sampling_params.py``; ``meta_info`` as the srt
server returns it), so SGLang clients — its frontend's ``RuntimeEndpoint`` among them — talk to
``lmnb serve`` unchanged. Imports nothing heavy: the language's in-process backend uses
``meta_info`` too, so both paths describe a result the same way.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from lmnb_engine.cli_options import in_option_syntax
from lmnb_engine.json_schema import in_json_words, json_parts, json_value
from lmnb_engine.outputs import ABORT_SHUTDOWN, FinishReason, GenerateResult, StreamEvent, TokenLogprob
from lmnb_engine.params import SamplingParams, SamplingParamsError
from lmnb_engine.suggest import close_match


class RequestError(ValueError):
    """A bad request: becomes an HTTP 4xx JSON error naming the field and the fix. ``reason``: what
    the refusal was, for clients that act on it (``params.DOES_NOT_FIT``), None for most."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, reason: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.reason = reason


class RequestFailed(RuntimeError):
    """The engine ended a request without its result (finish reason ``abort``: NaN logits, an
    internal error, shutdown): an HTTP JSON error with the engine's message, 500, or 503 for the
    server shutting down (the engine-stopped refusal's status: clients retry a 503 elsewhere or
    later)."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


def wire_message(message: str, value: Any = None) -> str:
    """A ``SamplingParams`` or rid message as a JSON client reads it: the Python API's ``None``
    (``seed`` "must be None or an integer") is the ``null`` the client sends, and ``value``, the
    value of the field it is about, which it shows as Python writes it (``=True``, ``'x'``, the
    items of a list of strings), is written as JSON (``=true``, ``"x"``: ``in_json_words``).
    Without a value (None) the message is returned as it is: the engine's other refusals show no
    value of the client's, or (a regex's, a JSON schema's errors) write it as JSON already."""
    if value is None:
        return message
    message = message.replace("must be None or", "must be null or").replace(f"={value!r}", f"={json_value(value)}")
    return in_json_words(message, json_parts(value))


def client_message(e: Exception | str) -> str:
    """The engine's refusal ``e`` of a request (or an abort's message, ``option_message``) as the
    server's client reads it: a fix that names
    one of the engine's options (``raise max_total_tokens``) is the operator's to take, which no
    request can, so it is left out (``in_option_syntax`` with no options), and the KV pool the
    request did not fit is said to be the server's."""
    return in_option_syntax(e, ()).replace("the KV pool", "the server's KV cache")


# What an abort asked for says to the server's clients: the route they asked with, where the engine
# names its Python method (``outputs.ABORT_REQUESTED``, which the in-process API keeps). SGLang
# says only "Aborted" (its FINISH_ABORT's default), or "Abort before prefill" for a waiting request.
ABORTED_BY_REQUEST = "aborted by /abort_request"
# What the engine's shutdown (``outputs.ABORT_SHUTDOWN``, which names the Python API) says to the
# clients of a server stopped (Ctrl-C, SIGTERM) while their requests ran: ``app.Server``.
ABORTED_BY_SHUTDOWN = "the server shut down before the request finished; send it again once the server is restarted"


def served_message(fr: FinishReason, grammar: Optional[str]) -> Optional[str]:
    """``fr.message`` as a client of the server reads it: an abort that was asked for
    (``FinishReason.requested_abort``, which only ``/abort_request`` asks for a request whose
    client still listens) is ``ABORTED_BY_REQUEST``, one by the engine's shutdown (the server
    stopping) ``ABORTED_BY_SHUTDOWN``; the engine's "regex / JSON schema" (a grammar's output cut
    before it matched) is ``grammar``, the field that sent the request's (None for a request
    without one, whose message never says so). An abort's message that names a fix in the
    engine's options is worded for the client as a refusal is (``client_message``)."""
    if fr.requested_abort:
        return ABORTED_BY_REQUEST
    if fr.type == "abort" and fr.message == ABORT_SHUTDOWN:
        return ABORTED_BY_SHUTDOWN
    if fr.message is None:
        return None
    message = client_message(fr.message)  # (an abort's option_message: pinned prefixes fill the KV pool)
    return message if grammar is None else message.replace("regex / JSON schema", grammar)


def finite(x: Optional[float]) -> Optional[float]:
    """``x``, or None (JSON null) where it is NaN or infinite: JSON has no such numbers, and a
    response carrying one would not be sent at all."""
    return x if x is None or math.isfinite(x) else None


# sampling_params keys -> SamplingParams fields (SGLang's names; ``sampling_seed`` is its seed).
_SAMPLING_KEYS = {
    "max_new_tokens": "max_new_tokens",
    "min_new_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "stop_regex": "stop_regex",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "n": "n",
    "seed": "seed",
    "sampling_seed": "seed",
    "regex": "regex",
    "json_schema": "json_schema",
    "logit_bias": "logit_bias",  # ({token id as a string: bias}, as SGLang's)
}
# SamplingParams fields that /generate takes beside sampling_params, at the request's top level.
_REQUEST_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num")
# Accepted only at their neutral value (SGLang clients send them; lmnb has no other behaviour).
_NEUTRAL_KEYS = {"spaces_between_special_tokens": True, "no_stop_trim": False, "ebnf": None, "structural_tag": None}


def multimodal_processor(engine: Any) -> tuple[Optional[Any], Optional[str]]:
    """[issue 10] ``(engine.multimodal, None)``: the processor of its images (``image_token``, the
    text that stands for one image in its prompts, ``image_token_id``, ``prepare``); ``(None,
    None)`` for a text-only model (or an engine stand-in without ``multimodal``); ``(None, why)``
    for a vision model whose processor cannot be made here (an ``ImportError``: this transformers
    needs torchvision for it; ``ImageProcessorUnavailable``: its checkpoint has no processor
    config), whose text the server still serves. The server asks once, as it makes its app
    (``ServerContext.multimodal``): the first ask reads the checkpoint's image processor config,
    which on the event loop held every other request meanwhile."""
    from lmnb_engine.multimodal.processor import ImageProcessorUnavailable

    try:
        return engine.multimodal, None
    except (ImportError, ImageProcessorUnavailable) as e:
        return None, str(e)
    except (ValueError, AttributeError):
        return None, None


def did_you_mean(key: Any, names: Any) -> str:
    """The hint an unknown field ``key`` gets, the closest of ``names`` (difflib's
    ``get_close_matches``, as Python's own "Did you mean" picks): ``' (did you mean "temperature"?)'``,
    or "" where none is close."""
    close = close_match(str(key), names)
    return f" (did you mean {json_value(close)}?)" if close is not None else ""


def sampling_params_from_json(
    d: Optional[dict],
    return_logprob: bool = False,
    logprob_start_len: int = -1,
    top_logprobs_num: int = 0,
) -> SamplingParams:
    """A validated ``SamplingParams`` from a ``sampling_params`` JSON object plus the request's
    logprob fields. ``regex`` and ``json_schema`` are passed through unchanged.

    Raises:
        RequestError: unknown keys, unsupported values, or values ``SamplingParams.validate`` rejects.
    """
    if d is not None and not isinstance(d, dict):
        raise RequestError("sampling_params must be a JSON object", param="sampling_params")
    d = dict(d or {})
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key in _SAMPLING_KEYS:
            if value is not None:
                kwargs[_SAMPLING_KEYS[key]] = value
        elif key in _NEUTRAL_KEYS:
            if value is not None and value != _NEUTRAL_KEYS[key]:
                neutral = _NEUTRAL_KEYS[key]
                raise RequestError(f"sampling_params.{key}={json_value(value)} is not supported by lmnb serve; "
                                   f"leave it out{'' if neutral is None else f' (or send {json_value(neutral)})'}",
                                   param=f"sampling_params.{key}")
        elif key in _REQUEST_KEYS:  # (SGLang's GenerateReqInput field, not a sampling parameter)
            raise RequestError(f"{key} is a field of the request, not a sampling parameter: send it beside "
                               "sampling_params, at the top level", param=f"sampling_params.{key}")
        else:
            raise RequestError(f"unknown sampling parameter {json_value(key, 40)}"
                               + did_you_mean(key, _SAMPLING_KEYS)  # (max_tokens: OpenAI's name)
                               + f"; supported: {json_value(sorted(_SAMPLING_KEYS))}",
                               param=f"sampling_params.{key}")
    bias = kwargs.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):  # (SamplingParams says "a dict ... got a list": Python's words)
        raise RequestError("sampling_params.logit_bias is invalid: must be a JSON object mapping token ids (as strings) "
                           f"to biases, e.g. {{\"1234\": -100}}; got {json_value(bias, 40)}",
                           param="sampling_params.logit_bias")
    return_logprob = False if return_logprob is None else return_logprob  # SGLang's default is null
    kwargs.update(
        return_logprob=return_logprob,
        # as in SGLang, prompt logprobs come with return_logprob only (and are not computed without)
        logprob_start_len=-1 if logprob_start_len is None or return_logprob is False else logprob_start_len,
        top_logprobs_num=top_logprobs_num or 0,
    )
    try:
        params = SamplingParams(**kwargs)
        params.validate()
    except SamplingParamsError as e:  # named as the client sent it, not as SamplingParams' field
        raise sampling_params_error(e, d) from None
    except (TypeError, ValueError) as e:
        raise RequestError(str(e), param="sampling_params") from None
    return params


def sampling_field(d: Optional[dict], field: str) -> str:
    """The name under which a /generate client sent ``SamplingParams`` field ``field`` (an
    error's ``param``), ``d`` being its ``sampling_params``: a request field (``return_logprob``)
    as it is, a sampling parameter inside ``sampling_params`` by the key the client used
    (``sampling_params.sampling_seed`` for ``seed``)."""
    if field in _REQUEST_KEYS:
        return field
    keys = [key for key in (d if isinstance(d, dict) else {}) if _SAMPLING_KEYS.get(key) == field]
    return f"sampling_params.{keys[-1] if keys else field}"


def sampling_params_error(e: SamplingParamsError, d: Optional[dict]) -> RequestError:
    """``e`` (``SamplingParams``' refusal, or the engine's) as a /generate client reads it: the
    field named as it was sent in ``sampling_params`` ``d`` (``sampling_field``), in JSON's words."""
    name = sampling_field(d, e.field)
    return RequestError(wire_message(str(e).replace(f"SamplingParams.{e.field}", name, 1), e.value), param=name)


def refused_field(e: Exception, params: SamplingParams) -> Optional[str]:
    """The field that the engine's refusal ``e`` of a request with ``params`` is about: a
    ``SamplingParams`` field (its own error's, ``logit_bias`` keys outside the vocabulary among
    them, ``regex`` or ``json_schema`` for a grammar that does not compile, ``stop_token_ids``
    outside the vocabulary, ``logprob_start_len`` past the
    prompt, ``max_new_tokens`` the context's length or more), ``rid`` (in use), or None for the
    prompt (too long, or too long for a ``max_new_tokens`` that fits alone: OpenAI's
    ``context_length_exceeded`` names the messages, ids outside the vocabulary)."""
    from lmnb_engine.constrained.errors import GrammarError

    if isinstance(e, SamplingParamsError):
        return e.field
    if isinstance(e, GrammarError):
        return params.constraint
    if getattr(e, "field", None) == "max_new_tokens":  # (Engine._check: a max_new_tokens no prompt fits beside)
        return "max_new_tokens"
    # (the engine's messages name these fields first: Engine._check_in_vocabulary, Engine._check ...)
    return next((f for f in ("stop_token_ids", "logprob_start_len", "rid") if str(e).startswith(f)), None)


def refused_value(e: Exception, field: Optional[str], rid: Optional[str]) -> Any:
    """The value of ``field`` (``refused_field`` of the engine's refusal ``e``) in a request with
    rid ``rid`` that the message shows as Python writes it (``wire_message``): a
    ``SamplingParams`` error's, or the rid in use; else None (a grammar's error writes its pattern
    as JSON already, and the engine's other refusals name only numbers)."""
    if isinstance(e, SamplingParamsError):
        return e.value
    return rid if field == "rid" else None


def _entry(lp: Optional[TokenLogprob], decode: Optional[Callable[[list[int]], str]],
           token_id: Optional[int] = None) -> list:
    if lp is None:  # prompt token 0: no context, no logprob; its id when the caller knows it
        return [None, token_id, decode([token_id]) if decode and token_id is not None else None]
    return [finite(lp.logprob), lp.token_id, decode([lp.token_id]) if decode else None]


def _top(lp: Optional[TokenLogprob], decode) -> Optional[list]:
    if lp is None:
        return None
    return [[finite(v), t, decode([t]) if decode else None] for t, v in lp.top]


class StreamMeta:
    """SGLang's ``meta_info`` of a streamed chunk before the last: the request's ``prompt_tokens``
    and ``cached_tokens`` (every SGLang chunk carries them), ``finish_reason`` None and, when
    logprobs were asked for, the output logprobs of every token so far (cumulative, as SGLang's
    stream sends them). Feed each ``StreamEvent`` to ``add``; entries are converted once."""

    def __init__(self, rid: str, decode: Optional[Callable[[list[int]], str]] = None, top_logprobs_num: int = 0):
        self.rid, self.decode, self.top_logprobs_num = rid, decode, top_logprobs_num
        self.prompt_tokens = self.cached_tokens = 0
        self.tokens: list = []
        self.tops: list = []
        self.logprobs = False

    def add(self, ev: StreamEvent) -> None:
        """Take one ``StreamEvent``: the request's counts and its ``TokenLogprob`` entries (which
        are None when no logprobs were asked for)."""
        self.prompt_tokens, self.cached_tokens = ev.prompt_tokens, ev.cached_tokens
        if ev.logprobs is None:
            return
        self.logprobs = True
        self.tokens += [_entry(lp, self.decode) for lp in ev.logprobs]
        if self.top_logprobs_num:
            self.tops += [_top(lp, self.decode) for lp in ev.logprobs]

    def dict(self, completion_tokens: int, start: int = 0) -> dict:
        """The chunk's meta_info after ``completion_tokens`` tokens, with the output logprobs of
        the tokens from ``start`` on."""
        m = {"id": self.rid, "prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
             "cached_tokens": self.cached_tokens, "finish_reason": None}
        if self.logprobs:
            m["output_token_logprobs"] = self.tokens[start:]
            if self.top_logprobs_num:
                m["output_top_logprobs"] = self.tops[start:]
        return m


# meta_info keys that an incremental stream sends only the new entries of (SGLang's
# INCREMENTAL_STREAMING_META_INFO_KEYS, less the token-ids logprobs lmnb does not have)
_OUTPUT_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")


class StreamChunks:
    """SGLang's stream chunks of one request (``/generate``'s SSE events, the offline engine's
    ``generate(stream=True)``): each carries its sample's whole text, ids and output logprobs so
    far or, ``incremental`` (SGLang's ``--incremental-streaming-output``), only those new since the
    sample's last chunk: a long stream then sends each once, not its length's square. Feed every
    ``StreamEvent`` to ``add``, then take ``chunk`` for the events that make one."""

    def __init__(self, rid: str, decode: Optional[Callable[[list[int]], str]] = None, top_logprobs_num: int = 0,
                 incremental: bool = False):
        self.rid, self.decode, self.top_logprobs_num = rid, decode, top_logprobs_num
        self.incremental = incremental
        self.texts: dict[int, str] = {}
        self.ids: dict[int, list[int]] = {}
        self.partial: dict[int, StreamMeta] = {}
        self.sent: dict[int, tuple[int, int]] = {}  # sample -> (characters, tokens) sent, when incremental

    def add(self, ev: StreamEvent) -> None:
        """Take one event of sample ``ev.index``: its text, token ids and counts."""
        i = ev.index
        self.texts[i] = self.texts.get(i, "") + ev.text_delta
        self.ids.setdefault(i, []).extend(ev.token_ids)
        self.partial.setdefault(i, StreamMeta(self.rid, self.decode, self.top_logprobs_num)).add(ev)

    def chunk(self, ev: StreamEvent, meta: Optional[dict] = None, index: Optional[int] = None) -> dict:
        """``{"text", "output_ids", "meta_info", "index"}`` after ``ev`` (added already): ``meta``
        is the finished sample's meta_info, None for the partial one; ``index`` defaults to
        ``ev.index``."""
        i = ev.index
        chars, tokens = self.sent.get(i, (0, 0))
        if meta is None:
            meta = self.partial[i].dict(len(self.ids[i]), tokens)
        elif tokens:
            meta = {**meta, **{k: meta[k][tokens:] for k in _OUTPUT_LOGPROB_KEYS if k in meta}}
        if self.incremental:
            self.sent[i] = (len(self.texts[i]), len(self.ids[i]))
        return {"text": self.texts[i][chars:], "output_ids": self.ids[i][tokens:], "meta_info": meta,
                "index": i if index is None else index}


def meta_info(result: GenerateResult, decode: Optional[Callable[[list[int]], str]] = None,
              top_logprobs_num: int = 0, first_token_id: Optional[int] = None) -> dict:
    """SGLang's ``meta_info`` of a finished (or partial) result.

    Logprob entries are ``[logprob, token_id, text]`` (text only when ``decode`` is given, i.e.
    ``return_text_in_logprobs``); ``input_token_logprobs`` starts at ``logprob_start_len`` and its
    entry for prompt token 0, which has no context, is ``[None, first_token_id, text]`` as SGLang
    sends it (clients read the prompt's ids from these entries). A logprob that is not finite
    (-inf after a model's own mask, NaN for a token forced by jump-forward) is None.
    """
    m = {
        "id": result.rid,
        "prompt_tokens": result.meta.prompt_tokens,
        "completion_tokens": result.meta.completion_tokens,
        "cached_tokens": result.meta.cached_tokens,
        "finish_reason": result.finish_reason.to_dict() if result.finish_reason else None,
    }
    if result.meta.jumped_tokens or result.meta.forward_passes:
        m["forward_passes"] = result.meta.forward_passes
        m["jumped_tokens"] = result.meta.jumped_tokens
    if result.logprobs is not None:
        # a max_new_tokens=0 request's next token, scored but not generated: SGLang reports it here
        lps = result.logprobs + ([result.next_token_logprob] if result.next_token_logprob else [])
        m["output_token_logprobs"] = [_entry(lp, decode) for lp in lps]
        if top_logprobs_num:
            m["output_top_logprobs"] = [_top(lp, decode) for lp in lps]
    if result.prompt_logprobs is not None:
        m["input_token_logprobs"] = [_entry(lp, decode, first_token_id if i == 0 else None)
                                     for i, lp in enumerate(result.prompt_logprobs)]
        if top_logprobs_num:
            m["input_top_logprobs"] = [_top(lp, decode) for lp in result.prompt_logprobs]
    return m
