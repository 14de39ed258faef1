"""The in-process backend: programs call an ``lmnb_engine.Engine`` living in this process.

No HTTP, no serialization: the engine's radix cache outlives every program, which is what lets a
notebook reuse a prompt prefix from cell to cell. ``lmnb_engine`` (and torch) are imported only
when this backend is created. SGLang exports an in-process ``Engine`` but no language backend
for it (``research/features.md`` §1.9); ``Engine`` here is that missing backend, and ``Runtime``
(SGLang's name for "start a model for my programs") is the same thing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import threading
from typing import Any, AsyncIterator, Iterator, Optional, Sequence

from lmnb.backend.base import (
    DELTA_TOKENS, AssignableChatTemplate, BackendCannotRun, BackendError, BaseBackend, Completion, Prompt, in_gen_names,
)
from lmnb.backend.media import expand_frames
from lmnb_engine.cli_options import in_option_syntax, option_error
from lmnb.chat_template import ChatTemplate, from_jinja, get_chat_template
from lmnb.choices import ChoiceLogprobs, first_difference
from lmnb.ir import DEFAULT_MAX_NEW_TOKENS, GenParams

# Context of the unconditional score in unconditional_likelihood_normalized (EleutherAI's choice).
UNCONDITIONAL_CONTEXT = "Answer:"


def engine_sampling_params(params: GenParams, **overrides: Any):
    """``lmnb_engine.SamplingParams`` of a resolved ``GenParams`` (regex/json_schema unchanged).

    Raises:
        ValueError: a value the engine rejects (the message names the field).
    """
    from lmnb_engine import SamplingParams

    kw = params.sampling_kwargs()
    kw.update(
        return_logprob=bool(params.return_logprob),
        top_logprobs_num=params.top_logprobs_num or 0,
        logprob_start_len=-1 if params.logprob_start_len is None else params.logprob_start_len,
    )
    kw.update(overrides)
    sp = SamplingParams(**kw)
    sp.validate()
    return sp


def media_cache(slots: Sequence[Any], counts: Sequence[int], cached_tokens: int) -> list[dict]:
    """[issue 10] How much of each ``image()``/``video()`` input's KV came from the radix cache.

    ``slots``: the prompt's ``ImageSlot``s (offset, length: prompt positions of each image's
    placeholder tokens), ``counts``: images per input (1, or a video's frames), ``cached_tokens``:
    the request's cached prefix length (``RequestMeta.cached_tokens``). Returns per input, in
    prompt order, ``{"tokens": its placeholder tokens, "cached_tokens": those inside the cached
    prefix, "hashes": its pixel hashes}``; ``cached_tokens == tokens`` means its prefill and vision
    encoding were skipped.
    """
    out, i = [], 0
    for n in counts:
        span = slots[i : i + n]
        i += n
        out.append({
            "tokens": sum(s.length for s in span),
            "cached_tokens": sum(min(max(cached_tokens - s.offset, 0), s.length) for s in span),
            "hashes": [s.hash for s in span],
        })
    return out


def _extend_multimodal(mm: Any, p_ids: list[int], c_ids: list[int], d: int, choice: str, image_token_id: int):
    """[issue 10] ``prompt + choice`` as prepared multimodal tokens, for ``select`` after an image:
    the prompt's ``mm`` (``MultimodalTokens``: each image placeholder of its tokenization ``p_ids``
    expanded to the image's tokens) up to ``d``, where the tokenization of prompt + choice
    ``c_ids`` departs from ``p_ids``, then ``c_ids[d:]``. Returns (those tokens, ``d`` moved past
    the expansion). The images' slots all lie before ``d``: a placeholder is a special token, so a
    choice cannot change how the text before it is tokenized.

    Raises ``ValueError`` if the choice holds the image placeholder itself."""
    from lmnb_engine.multimodal.inputs import MultimodalTokens

    if image_token_id in c_ids[d:]:
        raise ValueError(f"select choice {choice!r} holds the image placeholder; images go in image(), not in choices")
    at = d + len(mm) - len(p_ids)  # the placeholders expanded to several tokens each
    last = mm.mm_inputs.images[-1]
    assert at >= last.offset + last.length, "the choice re-tokenized the text before an image"
    return MultimodalTokens(list(mm[:at]) + c_ids[d:], mm.input_key[:at] + c_ids[d:], mm.mm_inputs), at


def _check_engine_kwargs(engine_class: type, kwargs: dict) -> None:
    """Refuse keywords that ``engine_class`` (``lmnb_engine.Engine``) does not take, naming those it
    does: SGLang's ``Runtime`` takes its server's arguments (``port``, ``log_level``,
    ``mem_fraction_static``), which a program ported from SGLang still passes, and Python's own
    message would name ``Engine.__init__`` rather than the ``Runtime`` the user called.

    Raises:
        TypeError: an unknown keyword; the message lists the accepted ones.
    """
    accepted = [p for p in inspect.signature(engine_class).parameters if p != "model"]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        hint = ("; SGLang's mem_fraction_static (weights and KV cache) is closest to mem_fraction here (the "
                "share of free memory, after the weights, for the KV pool)" if "mem_fraction_static" in unknown else "")
        if "chat_template" in unknown:  # (SGLang's server argument; the backend's own argument has another name)
            hint += ("; SGLang's chat_template (a registered template's name) is chat_template_name here "
                     "(lmnb.Runtime(model_path=..., chat_template_name='chatml'))")
        raise TypeError(
            f"lmnb.Runtime / lmnb.Engine got {', '.join(map(repr, unknown))}, which lmnb_engine.Engine does not take: "
            f"it runs the model in this process and takes model (or model_path), {', '.join(accepted)}{hint}. "
            "For a server (SGLang's port, host, log_level) run `lmnb serve` and connect with lmnb.RuntimeEndpoint"
        )


class Engine(AssignableChatTemplate, BaseBackend):
    """Run programs on an in-process ``lmnb_engine.Engine``.

    Args:
        model: HF checkpoint directory or hub id; None or "demo" = the built-in demo model.
        engine: an existing ``lmnb_engine.Engine`` to use instead of creating one.
        chat_template_name: a registered template (``lmnb.chat_template``) instead of the model's.
        **engine_kwargs: passed to ``lmnb_engine.Engine`` (device, dtype, max_total_tokens, ...);
            ``model_path`` is accepted as SGLang's name for ``model``.

    Raises:
        ValueError: the engine's KV pool is too small for one gen of lmnb's default max_tokens and
            a one-character prompt (``max_total_tokens`` below about 130, or the model's context length if
            shorter). For a smaller pool on purpose, pass ``engine=lmnb_engine.Engine(...,
            max_total_tokens=N)``: an engine given is taken as it is.
    """

    _template_fix = "lmnb.Engine(MODEL, chat_template_name='chatml')"

    def __init__(self, model: Optional[str] = None, *, engine: Any = None,
                 chat_template_name: Optional[str] = None, **engine_kwargs: Any):
        model = model or engine_kwargs.pop("model_path", None)
        if engine is None:
            from lmnb_engine import Engine as RuntimeEngine

            _check_engine_kwargs(RuntimeEngine, engine_kwargs)
            from lmnb_engine.pool_floor import pool_to_make, refuse_a_pool_too_small

            asked = engine_kwargs.get("max_total_tokens")
            if "max_total_tokens" in engine_kwargs:  # (the engine's own floor said "pass 2 or more", then lmnb's least)
                engine_kwargs = {**engine_kwargs, "max_total_tokens": pool_to_make(asked)}
            engine = RuntimeEngine(model=model, **engine_kwargs)
            refuse_a_pool_too_small(engine, asked, DEFAULT_MAX_NEW_TOKENS)
        elif model is not None or engine_kwargs:
            raise ValueError("pass either engine= or model/engine arguments, not both")
        elif not callable(getattr(engine, "model_info", None)):  # (an int failed at the first program, "no attribute 'model_info'")
            from lmnb.backend.base import given

            raise TypeError(f"lmnb.Engine engine= must be an lmnb_engine.Engine (the in-process runtime, "
                            f"lmnb_engine.Engine(model=...)), or None to start one; got {given(engine)}")
        self.engine = engine
        # The options the front end that made this backend names the engine's by, and its command, for
        # the engine's request errors (in_option_syntax): a kernel's cell says "raise %lm load's
        # --max-total-tokens", an exported job "--max-total-tokens"; a third item, its words for a fix
        # with no option (in_option_syntax's reworded: a cell's "%lm unpin NAME"). (None, ""): the Python
        # API's keywords.
        self.front_end_options: tuple = (None, "")
        self._template: Optional[ChatTemplate] = get_chat_template(chat_template_name) if chat_template_name else None
        self._lock = threading.RLock()  # (an abort may come from within a submission: a hook, a test)
        self._sub_rids: dict[str, list[str]] = {}
        self._aborted: set[str] = set()  # selects aborted while they ran (before a submission, too)

    def __repr__(self) -> str:
        """The backend as messages name it (``set_default_backend``'s warning, ``%lm stats``):
        ``lmnb.Engine (demo model)``, ``lmnb.Engine (model PATH)``; an engine given that names no
        model path (a test's stand-in) is ``lmnb.Engine (engine CLASS)``. Reads the engine's
        ``model_path``, which starts nothing."""
        path = getattr(self.engine, "model_path", None)
        if not isinstance(path, str):  # (a model built in memory has none; a stand-in engine no such attribute)
            what = "model built in memory" if hasattr(self.engine, "model_path") else f"engine {type(self.engine).__name__}"
        else:
            from lmnb_engine.checkpoint_path import DEMO_MODEL_PATH  # (torch-free; the engine is loaded already)

            what = "demo model" if os.path.realpath(path) == os.path.realpath(DEMO_MODEL_PATH) else f"model {path}"
        return f"lmnb.{type(self).__name__} ({what})"

    # -- chat template

    def get_chat_template(self) -> ChatTemplate:
        """The model's own template as role markers (``lmnb.chat_template.from_jinja``)."""
        with self._lock:
            if self._template is None:
                info = self.engine.model_info()
                tok = getattr(self.engine, "tokenizer", None)
                special = {
                    k: getattr(tok, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                    if tok is not None and isinstance(getattr(tok, k, None), str)
                }
                path = str(info.get("model_path") or "")
                tmpl = from_jinja(self.engine.chat_template, special, path)
                if tmpl.bos and self._encode_adds_bos():
                    tmpl = dataclasses.replace(tmpl, bos="")  # the tokenizer writes BOS itself
                self._template = self.guessed(self.engine.chat_template, tmpl, path)
            return self._template

    def _encode_adds_bos(self) -> bool:
        tok = getattr(self.engine, "tokenizer", None)
        bos_id = getattr(tok, "bos_token_id", None)
        ids = self.engine.encode("a")
        return bos_id is not None and bool(ids) and ids[0] == bos_id

    # -- requests

    def _meta(self, result, params: GenParams, ids: Any = None, counts: Sequence[int] = (), text: str = "",
              first: Optional[int] = None) -> dict:
        from lmnb_engine.http_server.protocol import meta_info

        decode = self.engine.decode if params.return_text_in_logprobs else None
        meta = meta_info(result, decode, params.top_logprobs_num or 0, first)
        if result.finish_reason is not None and result.finish_reason.message:  # (an abort's: pinned prefixes...)
            meta["finish_reason"]["message"] = in_gen_names(self._worded(result.finish_reason.message))
        if counts:  # [issue 10]
            meta["images"] = media_cache(ids.mm_inputs.images, counts, result.meta.cached_tokens)
            meta["cached_chars"] = self._cached_chars(text, ids, counts, result.meta.cached_tokens)
        return meta

    def _cached_chars(self, text: str, ids: Any, counts: Sequence[int], cached_tokens: int) -> int:
        """[issue 10] Characters of the program text ``text`` whose tokens lie in the cached prefix
        of the prepared ``ids``. Live views shade the cached span from this: they cannot map
        ``cached_tokens`` onto the text themselves, because an input that is one placeholder in the
        text fills many prompt positions (a video: one image per frame)."""
        token = self.get_chat_template().image_token
        parts, slots = text.split(token), ids.mm_inputs.images
        chars = start = k = 0
        for i, part in enumerate(parts):
            end = slots[k].offset if i < len(counts) else len(ids)
            if cached_tokens < end or i == len(counts):
                region = list(ids[start : start + max(cached_tokens - start, 0)])
                bos = getattr(self.engine.tokenizer, "bos_token_id", None)
                if i == 0 and region and region[0] == bos and not part.startswith(self.engine.decode([bos])):
                    region = region[1:]  # the tokenizer's BOS is not in the program text
                return chars + min(len(self.engine.decode(region)), len(part))
            group = slots[k : k + counts[i]]
            k += counts[i]
            start = group[-1].offset + group[-1].length
            if cached_tokens < start:  # the image itself is not (fully) cached
                return chars + len(part)
            chars += len(part) + len(token)
        return chars

    def cache_prefix(self, text: Any, rid: Optional[str] = None) -> dict:
        """Prefill ``text`` (a str, or [issue 10] a ``Prompt`` with images: a fork after ``image()``
        shares the image KV too) into the radix cache; returns its meta_info. ``rid`` is optional,
        so SGLang's ``runtime.cache_prefix(prefix)`` works."""
        from lmnb_engine import SamplingParams

        ids, counts = self._engine_prompt(text) if isinstance(text, Prompt) else (text, [])
        result = self.engine.generate(ids, SamplingParams(max_new_tokens=0))
        return self._meta(result, GenParams(), ids, counts, text.text if counts else "")

    def token_text(self, token_id: int) -> str:
        """Token ``token_id``'s text as OpenAI's logprobs (and ``lmnb serve``'s) write it: one holding
        part of a character, whose decoded text is U+FFFD, as ``bytes:`` then its bytes
        (``bytes:\\xc3``). API speculative execution finds where a call's tokens end in its text from
        these (``lmnb.speculative.Speculation``): U+FFFD says neither how many bytes a token holds nor
        which token completes a character."""
        from lmnb_engine.token_text import token_text  # (lmnb serve's own reading of the bytes)

        return token_text(self.engine, token_id)

    def check_images(self) -> None:
        """[issue 10] Raises ``BackendCannotRun`` (a ``ValueError``) naming a text-only model for image() and video() alike, as
        ``RuntimeEndpoint`` does (the engine's own message speaks of images only), or a checkpoint
        without its image processor (the engine's multimodal check)."""
        config = self.engine.loaded.config
        if config.multimodal_hf_config is None:
            raise BackendCannotRun(f"image() and video() need a vision-language model, and {config.architecture} is a "
                             "text-only model; load a LLaVA checkpoint (LlavaForConditionalGeneration)")
        self.engine.multimodal

    def _engine_prompt(self, prompt: Prompt) -> tuple[Any, list[int]]:
        """[issue 10] (``prompt.text``, []), or with images the prepared ``MultimodalTokens`` of the
        prompt (a video's placeholder repeated once per sampled frame; frames are images) and the
        number of images each ``image()``/``video()`` input became, in prompt order."""
        if not prompt.images:
            return prompt.text, []
        from lmnb_engine.multimodal import MultimodalPrompt

        text, images, counts = self._frames(prompt)
        return self.engine.multimodal.prepare(MultimodalPrompt(text, images)), counts

    def _frames(self, prompt: Prompt) -> tuple[str, list, list[int]]:
        """[issue 10] ``lmnb.backend.media.expand_frames`` with this model's image token."""
        return expand_frames(prompt, self.get_chat_template().image_token)

    def _first_token(self, ids: Any, params: GenParams) -> tuple[Any, Optional[int]]:
        """(``ids``, the id of prompt token 0) when the input logprobs start there: their first
        entry names it, as SGLang's (and ``lmnb serve``'s) do; a text prompt is encoded for it."""
        if not params.return_logprob or params.logprob_start_len != 0:
            return ids, None
        if isinstance(ids, str):
            ids = self.engine.prompt_ids(ids)  # (as the engine runs the text: prompt_ids)
        return ids, (int(ids[0]) if len(ids) else None)

    def generate(self, prompt: Any = None, params: Any = None, rid: Optional[str] = None, **offline: Any) -> Any:
        """A gen's completions (the interpreter's call: a ``Prompt``, its ``GenParams`` and a
        request id), or SGLang's offline ``Engine.generate`` (``sgl.Engine`` is also SGLang's
        offline engine): see ``offline_generate``."""
        if not isinstance(prompt, Prompt):  # SGLang's positional order: prompt, sampling_params, input_ids
            given = {"sampling_params": params, "input_ids": rid}
            return self.offline_generate(prompt, **{k: v for k, v in given.items() if v is not None}, **offline)
        ids, counts = self._engine_prompt(prompt)
        ids, first = self._first_token(ids, params)
        handle = self._submit_gen(ids, params, rid)
        results = handle.result()
        if not isinstance(results, list):
            results = [results]
        return [Completion(r.text, self._meta(r, params, ids, counts, prompt.text, first))
                for r in sorted(results, key=lambda r: r.index)]

    def _submit_gen(self, ids: Any, params: GenParams, rid: str) -> Any:
        """Submit a gen's request. The engine's refusal (a prompt too long for its max_new_tokens)
        is worded in gen()'s names: a program says max_tokens.

        Raises:
            ValueError: the engine refused the request.
        """
        with self._worded_refusal():  # (engine_sampling_params refuses a gen's bad params too)
            return self.engine.submit(ids, engine_sampling_params(params), rid=rid)

    def _worded(self, message: Any) -> str:
        """The engine's ``message`` (an ``option_error``, or an abort's ``option_message``) as the front
        end that made this backend names the engine's options (``front_end_options``)."""
        return in_option_syntax(message, *self.front_end_options)

    @contextlib.contextmanager
    def _worded_refusal(self) -> Iterator[None]:
        """Reword the engine's refusal of a request (a ``ValueError``) raised within, for the program
        and its front end: in ``gen()``'s names (``in_gen_names``), and naming the engine's options
        as the front end that made this backend does (``_worded``). The refusal's ``reason`` is kept
        (the executor reads ``DOES_NOT_FIT``: a gen's default max_tokens did not fit)."""
        try:
            yield
        except ValueError as e:
            shown = in_gen_names(self._worded(e))
            if shown == str(e):
                raise
            worded = ValueError(shown)
            worded.reason = getattr(e, "reason", None)
            raise worded from None

    def offline_generate(self, prompt: Any = None, sampling_params: Optional[dict] = None, input_ids: Any = None,
                         return_logprob: bool = False, logprob_start_len: Optional[int] = None,
                         top_logprobs_num: Optional[int] = None, return_text_in_logprobs: bool = False,
                         stream: bool = False) -> Any:
        """SGLang's offline ``Engine.generate(prompt, sampling_params)``: a prompt (or ``input_ids``)
        or a list of them, and SGLang's sampling-params dict (for a list of prompts, one dict for
        all or, as SGLang takes, a list of dicts, one per prompt). Returns SGLang's
        ``{"text", "meta_info"}`` for one prompt (with ``n`` > 1, a list), a flat list for a list.
        With ``stream=True`` (one prompt), an iterator of such dicts as the text grows, each with
        the whole text so far, as SGLang's offline stream yields them (``index``: the sample).

        Raises:
            ValueError: bad sampling params (unknown keys are refused, not ignored; of a list,
                named by their place), a list of them that is not one per prompt, neither or both
                of ``prompt`` and ``input_ids``, or ``stream`` with a list of prompts.
            TypeError: text given as ``input_ids``, or a bad prompt (as ``lmnb_engine.Engine``).
        """
        from lmnb_engine.engine import is_prompt_batch
        from lmnb_engine.http_server.protocol import meta_info, sampling_params_from_json
        from lmnb_engine.multimodal.inputs import is_multimodal_prompt

        if (prompt is None) == (input_ids is None):
            raise ValueError("generate() takes a prompt (or a list of prompts) or input_ids, not both or neither")
        if any(isinstance(p, str) or is_multimodal_prompt(p)
               for p in (input_ids if is_prompt_batch(input_ids) else [input_ids])):
            raise TypeError("input_ids takes token ids (a list of ints, or one such list per prompt); pass a text "
                            "(or a prompt with images) as prompt=")
        source = prompt if prompt is not None else input_ids
        if isinstance(sampling_params, (list, tuple)):  # SGLang's list: one dict per prompt
            if not is_prompt_batch(source):  # ("1 for one prompt" read as the count that was asked for)
                raise ValueError("a list of sampling_params goes with a list of prompts, one dict per prompt; "
                                 "this is one prompt, not in a list: pass its dict alone "
                                 "(sampling_params={...}), or the prompt in a list")
            if len(sampling_params) != len(source):
                raise ValueError(f"a list of sampling_params gives one dict per prompt: {len(sampling_params)} "
                                 f"for {len(source)} prompts; pass one dict for all the prompts, or one per prompt")
            params_list = []
            for i, d in enumerate(sampling_params):
                try:
                    params_list.append(sampling_params_from_json(d, return_logprob, logprob_start_len,
                                                                 top_logprobs_num))
                except ValueError as e:
                    raise type(e)(f"sampling_params {i} of the batch: {e}") from None
            params = params_list[0] if params_list else None
        else:
            params = sampling_params_from_json(sampling_params, return_logprob, logprob_start_len, top_logprobs_num)
            params_list = None
        decode = self.engine.decode if return_text_in_logprobs else None
        if stream:
            if is_prompt_batch(source):
                raise ValueError("generate(..., stream=True) streams one prompt; call it once per prompt")
            return self._offline_stream(source, params, decode)
        # (the logprob fields are the call's, so every prompt's params have the same top_logprobs_num)
        results = self.engine.generate(source, params if params_list is None else params_list)
        out = [{"text": r.text, "meta_info": meta_info(r, decode, params.top_logprobs_num)}
               for r in (results if isinstance(results, list) else [results])]
        return out if isinstance(results, list) else out[0]

    def _offline_stream(self, source: Any, params: Any, decode: Any) -> Iterator[dict]:
        """``generate(..., stream=True)``'s chunks: ``{"text", "output_ids", "meta_info", "index"}``
        with the text and ids so far (SGLang's offline stream, like its ``/generate`` stream); the
        request is aborted if the caller stops reading early."""
        from lmnb_engine.http_server.protocol import StreamChunks, meta_info

        handle = self.engine.submit(source, params)
        chunks = StreamChunks(handle.rid, decode, params.top_logprobs_num or 0)
        try:
            for ev in handle.events():
                chunks.add(ev)
                if ev.finished and ev.result is not None:
                    yield chunks.chunk(ev, meta_info(ev.result, decode, params.top_logprobs_num or 0))
                elif ev.text_delta:
                    yield chunks.chunk(ev)
        finally:
            if not handle.done:
                handle.abort()

    async def async_generate(self, prompt: Any = None, sampling_params: Optional[dict] = None,
                             input_ids: Any = None, stream: bool = False, **kwargs: Any) -> Any:
        """SGLang's offline ``await Engine.async_generate(prompt, sampling_params)``: what
        ``generate`` returns, or with ``stream=True`` an async iterator of its chunks
        (``async for chunk in await engine.async_generate(p, sp, stream=True)``)."""
        import asyncio

        call = dict(prompt=prompt, sampling_params=sampling_params, input_ids=input_ids, stream=stream, **kwargs)
        if not stream:
            return await asyncio.to_thread(self.offline_generate, **call)
        chunks = self.offline_generate(**call)  # (checks the arguments now, as the call is awaited)

        async def agen():
            end, pending = object(), None
            try:
                while True:
                    pending = asyncio.ensure_future(asyncio.to_thread(next, chunks, end))
                    # shielded: a cancelled consumer (task.cancel, wait_for's timeout) must not leave
                    # a worker thread inside next(chunks), or close() raises "generator already executing"
                    chunk = await asyncio.shield(pending)
                    if chunk is end:
                        return
                    yield chunk
            finally:
                if pending is not None and not pending.done():
                    await asyncio.wait([pending])  # (the next chunk: one decode step)
                chunks.close()  # aborts the request if it has not finished

        return agen()

    def generate_stream(self, prompt: Prompt, params: GenParams, rid: str) -> Iterator[tuple[str, dict]]:
        ids, counts = self._engine_prompt(prompt)
        ids, first = self._first_token(ids, params)
        from lmnb_engine.http_server.protocol import StreamMeta

        handle = self._submit_gen(ids, params, rid)
        completion_tokens = 0
        partial = StreamMeta(rid, self.engine.decode if params.return_text_in_logprobs else None,
                             params.top_logprobs_num or 0)
        media: dict = {}  # [issue 10] how each image's KV was got: known once the request is admitted
        for ev in handle.events():
            completion_tokens += len(ev.token_ids)
            partial.add(ev)
            if ev.finished and ev.result is not None:
                meta = self._meta(ev.result, params, ids, counts, prompt.text, first)
            else:
                meta = partial.dict(completion_tokens)
                if counts and not media:
                    media = {"images": media_cache(ids.mm_inputs.images, counts, ev.cached_tokens),
                             "cached_chars": self._cached_chars(prompt.text, ids, counts, ev.cached_tokens)}
                meta.update(media)
            meta[DELTA_TOKENS] = self._delta_tokens(ev)
            yield ev.text_delta, meta

    def _delta_tokens(self, ev) -> list[list]:
        """``[[logprob or None, token_id, text], ...]`` of one ``StreamEvent``'s ids (for live views'
        per-token tooltips); a jump-forward token was forced, not sampled: its logprob is None."""
        lps = ev.logprobs or [None] * len(ev.token_ids)
        out = []
        for tid, lp in zip(ev.token_ids, lps):
            value = None if lp is None or math.isnan(lp.logprob) else lp.logprob
            out.append([value, tid, self.engine.decode([tid], skip_special_tokens=True)])
        return out

    def score_choices(self, prompt: Prompt, choices: Sequence[str], unconditional: bool, rid: str) -> list[ChoiceLogprobs]:
        """Token-healed choice scores (``lmnb.choices``): the prompt is prefilled once, then every
        ``prompt + choice`` is scored from its first token that differs from the prompt's own
        tokenization, all choices submitted together so the engine batches them."""
        with self._lock:
            self._sub_rids[rid] = []
        try:
            return self._score_choices(prompt, choices, unconditional, rid)
        finally:
            with self._lock:
                self._sub_rids.pop(rid, None)
                self._aborted.discard(rid)

    def _submit_unless_aborted(self, rid: str, jobs: list) -> list:
        """Submit ``jobs`` ((ids, params, request id)) unless select ``rid`` was aborted; under the
        lock, so that an abort comes before (and raises here) or after them (and reaches them)."""
        with self._lock:
            if rid in self._aborted:
                raise RuntimeError("the select was aborted")
            self._sub_rids[rid] = [r for _, _, r in jobs if r != rid]
            with self._worded_refusal():
                return [self.engine.submit(ids, params, rid=r) for ids, params, r in jobs]

    def _score_choices(self, prompt: Prompt, choices: Sequence[str], unconditional: bool, rid: str) -> list:
        from lmnb_engine import SamplingParams

        eng = self.engine
        text, mm, counts = prompt.text, None, []
        if prompt.images:  # [issue 10] the images are prepared once; each choice extends their tokens
            from lmnb_engine.multimodal import MultimodalPrompt

            text, images, counts = self._frames(prompt)
            mm = eng.multimodal.prepare(MultimodalPrompt(text, images))
        p_ids = eng.prompt_ids(text)  # (the ids a gen of the text runs as: prepare reads a text so too)
        prefill = None
        if p_ids:  # its meta_info says [issue 10] how each image's KV was got, as a gen's does
            # under the select's own request id, so that an abort while the prompt is prefilled stops it
            [done] = self._submit_unless_aborted(rid, [(mm or p_ids, SamplingParams(max_new_tokens=0), rid)])
            done = done.result()
            if done.finish_reason.type == "abort":
                raise RuntimeError(f"the select's prompt prefill was aborted: {self._worded(done.finish_reason.message)}")
            prefill = self._meta(done, GenParams(), mm, counts, prompt.text)
        jobs = []  # (token ids to submit, index of the first scored token)
        for c in choices:
            c_ids = eng.prompt_ids(text + c)
            d = first_difference(p_ids, c_ids)
            if mm is not None:
                c_ids, d = _extend_multimodal(mm, p_ids, c_ids, d, c, eng.multimodal.image_token_id)
            start = max(d, 1)  # token 0 has no context to be scored in
            if start >= len(c_ids):
                raise ValueError(f"select choice {c!r} leaves no token to score after the prompt {prompt.text[-40:]!r}")
            jobs.append((c_ids, start))
        self._check_choice_lengths(choices, [ids for ids, _ in jobs], len(p_ids))
        if unconditional:
            ctx = eng.encode(UNCONDITIONAL_CONTEXT)
            jobs += [(ctx + ids[start:], len(ctx)) for ids, start in list(jobs)]
        sub = [f"{rid}-{i}" for i in range(len(jobs))]
        handles = self._submit_unless_aborted(
            rid, [(ids, SamplingParams(max_new_tokens=0, logprob_start_len=start), r) for (ids, start), r in zip(jobs, sub)])
        results = [h.result() for h in handles]
        out = []
        k = len(choices)
        for j, r in enumerate(results):  # the unconditional scores (j >= k) count as much
            if r.finish_reason.type == "abort":
                how = " without its context (unconditional likelihood)" if j >= k else ""
                raise RuntimeError(f"scoring choice {choices[j % k]!r}{how} was aborted: "
                                   f"{self._worded(r.finish_reason.message)}")
        for i in range(k):
            ids, start = jobs[i]
            r = results[i]
            lps = [lp.logprob for lp in r.prompt_logprobs]
            unc = [lp.logprob for lp in results[k + i].prompt_logprobs] if unconditional else None
            out.append(ChoiceLogprobs(ids[start:], lps, start, r.meta.cached_tokens, unc, prefill))
        return out

    def _check_choice_lengths(self, choices: Sequence[str], ids: list, prompt_len: int) -> None:
        """Raise ``ValueError`` naming the choice whose prompt + choice tokens do not fit the
        context or the KV pool: the engine's own message blamed the prompt, which fits alone. The
        fixes come with their numbers, as the engine's (a scoring request samples no token)."""
        info = self.engine.model_info()
        for c, c_ids in zip(choices, ids):
            n = len(c_ids)
            for what, limit, fixes in (("the model's context length", info["context_len"], ()),
                                       ("the KV pool", info["max_total_tokens"],
                                        ((f"raise {{}} to at least {n}", "max_total_tokens", None),))):
                if n > limit:
                    shown = repr(c) if len(c) <= 40 else repr(c[:30]) + "..."
                    e = option_error(ValueError, f"select choice {shown} makes the prompt {n} tokens "
                                     f"({prompt_len} without it), more than {what} of {limit} tokens",
                                     (f"shorten the prompt or the choice, by at least {n - limit} "
                                      f"token{'s' * (n - limit != 1)} between them",), *fixes)
                    raise ValueError(self._worded(e))

    def abort(self, rid: str) -> None:
        """Stop request ``rid`` (a select's: all its requests), best effort, as the other backends
        do: the engine raising (it was shut down, or the request's release failed) ends the
        request all the same, with that reason, and must not stop the abort of the rest (the
        other requests of the select, the state's other fork branches)."""
        with self._lock:
            if rid in self._sub_rids:  # a select: what it submits after this is not submitted
                self._aborted.add(rid)
            rids = [rid] + self._sub_rids.get(rid, [])
        for r in rids:  # (queued, not waited for: a Ctrl-C's clean-up holds the next press meanwhile)
            with contextlib.suppress(Exception):  # (what a failed release raised: of any type)
                self.engine.queue_abort(r)

    def flush_cache(self, empty_cache: bool = True) -> bool:
        """Drop the engine's prefix cache. ``empty_cache`` (SGLang's ``RuntimeEndpoint.flush_cache``
        argument; ``Runtime(...).endpoint`` is this backend) is accepted and ignored."""
        if not self.engine.flush_cache():  # a False here was easy to miss: the cache stayed warm
            raise BackendError("the prefix cache was not flushed: requests are running; retry when they finish")
        return True

    def get_model_name(self) -> str:
        """The engine's ``model_path``, as SGLang's ``RuntimeEndpoint.get_model_name`` answers
        (``Runtime(...).endpoint`` is this backend)."""
        return self.engine.model_info()["model_path"]

    def get_server_info(self) -> dict:
        return {**self.engine.model_info(), "cache_stats": self.engine.cache_stats()}

    def get_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer, as SGLang's ``Runtime.get_tokenizer()`` returns it
        (to count a text's tokens, e.g. a gen's ``min_tokens``)."""
        return self.engine.tokenizer

    def shutdown(self) -> None:
        self.engine.shutdown()


class Runtime(Engine):
    """SGLang's ``Runtime(model_path=...)``: here the same in-process engine as ``Engine`` (SGLang
    starts a server subprocess; lmnb needs none). ``lmnb serve`` gives an HTTP server when one is
    wanted."""

    @property
    def endpoint(self) -> "Runtime":
        """SGLang's ``Runtime.endpoint`` (the ``RuntimeEndpoint`` its server is reached by): here
        the runtime itself, so ``runtime.endpoint.chat_template = ...`` works as there."""
        return self

    async def add_request(self, prompt: str, sampling_params: Optional[dict] = None) -> AsyncIterator[str]:
        """SGLang's ``Runtime.add_request`` (there another name for ``Runtime.async_generate``): an
        async generator of the output's new text, piece by piece, ``async for piece in
        runtime.add_request(prompt, sampling_params)``. Kept in SGLang's form under this name
        because lmnb's ``async_generate`` is the offline engine's (awaited; whole-text chunks).
        Closing it early (``await it.aclose()``, or ``contextlib.aclosing``) aborts the request."""
        stream = await self.async_generate(prompt, sampling_params, stream=True)
        pos = 0
        try:
            async for chunk in stream:
                piece = chunk["text"][pos:]
                if piece:
                    yield piece
                pos = len(chunk["text"])
        finally:  # (leaving early closes this generator only; closing the stream aborts the request)
            await stream.aclose()
