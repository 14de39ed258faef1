"""The FastAPI application of ``lmnb serve``: SGLang's native routes over an in-process engine.

Routes (SGLang's ``srt/entrypoints/http_server.py`` names and shapes): ``POST /generate`` (one
prompt or a batch, ``text`` or ``input_ids``, streaming as server-sent events with the cumulative
text in each event, or only the new text with ``incremental_streaming_output``), ``GET
/get_model_info``, ``GET /get_server_info``, ``GET|POST /flush_cache``, ``POST /abort_request``,
``GET /health``; the OpenAI routes come from ``openai_api``. [issue 10]
``/generate`` takes SGLang's ``image_data`` for a vision-language model: per prompt a string or a
list of strings, each a ``data:image/...;base64,`` URL or bare base64 (what SGLang's frontend
sends; one string for a whole batch is every prompt's image), one per image token in the prompt;
the server reads no files and fetches no URLs; a finished request's ``meta_info`` says per image
how much of its KV was cached. Every bad
request is answered with a 4xx JSON error ``{"error": {"message", "type", "param", "code"}}`` (and
``"reason"`` where a client acts on it: ``params.DOES_NOT_FIT``); an
unexpected failure is a 500 JSON error, and the engine keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import functools
import hmac
import itertools
import json
import logging
import re
import signal
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterator, NoReturn, Optional, Sequence

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.responses import Response

from lmnb_engine.http_server import DEFAULT_MAX_BODY_MB
from lmnb_engine.http_server.protocol import (
    RequestError,
    RequestFailed,
    StreamChunks,
    client_message,
    did_you_mean,
    meta_info,
    multimodal_processor,
    refused_field,
    refused_value,
    sampling_field,
    sampling_params_error,
    sampling_params_from_json,
    served_message,
    wire_message,
)
from lmnb_engine.json_schema import SHOWN_CHARS, json_value
from lmnb_engine.outputs import NEW_ENGINE_FIX, rid_in_use
from lmnb_engine.params import (MAX_N, SamplingParams, SamplingParamsError, long_integer_in_json, past_context_refusal,
                                past_digit_limit, shown_integer_text)
from lmnb_engine.suggest import close_match
from lmnb_engine.tokenizer import find_lone_surrogate, text_too_long

logger = logging.getLogger("lmnb.serve")

# Blocking engine calls (submit, encoding, logprob formatting) run on this many threads; a request
# waits for its results on the event loop (ServerContext.events), holding none.
MAX_WAITING_THREADS = 512
# The most samples (prompts times their n) one request may queue: each is a scheduler request of its
# own (about 5 KB), so 5000 prompts at n=128 queued 640000 of them (3.3 GB) ahead of every other
# client. 128 prompts at the most samples each (``params.MAX_N``), or 16384 prompts of one sample (a
# select of thousands of choices fits); SGLang and vLLM set no bound, OpenAI's Batch API takes
# 50000 requests per batch file, not per request.
MAX_REQUEST_SAMPLES = 128 * MAX_N


class _Route(APIRoute):
    """A route that answers an unexpected exception itself with a 500 JSON error.

    Left to an ``Exception`` handler, the exception reaches Starlette's ``ServerErrorMiddleware``,
    which answers and then re-raises it for the server to log; uvicorn then resets the client's
    keep-alive connection, and the client's next request on it fails. Errors with a handler of
    their own in the app (``RequestError``, validation, HTTP errors...) pass through to it. A
    client gone while it sent its body (``ClientDisconnect``: it closed the connection, or a
    shutdown cut it off, ``Server._cut_off``) is no server error: nobody is left to answer, and
    nothing is logged (it was "unexpected error serving /generate" with a traceback).
    """

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Any:
            try:
                return await handler(request)
            except ClientDisconnect:
                return Response(status_code=499)  # (nginx's "client closed request"; never sent)
            except Exception as exc:
                handled = [k for k in request.app.exception_handlers if isinstance(k, type) and k is not Exception]
                if isinstance(exc, tuple(handled)):
                    raise
                logger.exception("unexpected error serving %s", request.url.path)
                return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", 500), 500)

        return route_handler


class _SlashlessPaths:
    """ASGI middleware serving a path with a trailing slash (``POST /generate/``) as the route
    without it, when the app has that route: Starlette answered it with a 307 redirect and an
    empty body, which curl without ``-L`` shows as nothing and httpx and the openai client do not
    follow. The path names one route, so it is served, as a client that follows the redirect was
    served, rather than refused. A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``)
    leaves the receive channel as it is (``check_api_key``), and runs before the router, so the
    API key check and the route see the path without the slash (``/health/`` needs no key, and
    ``/v1/models/`` lists the models: it was read as ``/v1/models/{model}`` with model "")."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            slashless = {**scope, "path": path.rstrip("/") or "/",
                         "raw_path": scope.get("raw_path", path.encode()).rstrip(b"/") or b"/"}
            if any(r.matches(slashless)[0] is not Match.NONE for r in scope["app"].router.routes):
                scope = slashless
        await self.app(scope, receive, send)


class _Inbox:
    """Hands items from the engine's scheduler thread to asyncio queues on ``loop``, waking the
    loop once per batch of them: ``call_soon_threadsafe`` writes to the loop's self-pipe, a system
    call that gives up the GIL, and made once per event (a step emits one per running request),
    the scheduler thread waited each time to get the GIL back from the busy loop: 1000 streams
    took about 20 % longer (``benches/bench_server_streams.py``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._woken = False

    def put(self, queue: asyncio.Queue, item: Any) -> None:
        """Queue ``item`` for ``queue`` (any thread); the loop is woken unless a wake-up is pending."""
        with self._lock:
            self._items.append((queue, item))
            if self._woken:
                return
            self._woken = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:  # on the loop
        with self._lock:
            items, self._items, self._woken = self._items, collections.deque(), False
        for queue, item in items:
            queue.put_nowait(item)


class Batch(list):
    """The handles of one response's prompts (a list that can be weakly referenced)."""


def response_rids(rid: str, n: int) -> list[str]:
    """The engine rids of the ``n`` prompts of a response whose client named it ``rid`` (an OpenAI
    request's, a /generate batch's one string): ``rid`` itself for one prompt, ``<rid>-<k>`` for
    prompt k of several; /abort_request with ``rid`` aborts them all, with ``<rid>-<k>`` one."""
    return [rid] if n == 1 else [f"{rid}-{k}" for k in range(n)]


def rid_clash(rid: str, rids: list, k: int) -> RequestError:
    """The 400 of engine rid ``rids[k]`` (``response_rids``) in use: the client never sent
    ``<rid>-<k>``, so say how ``rid`` expands."""
    return RequestError(wire_message(rid_in_use(rid, len(rids), k), [rid, *rids]), param="rid")


class ServerContext:
    """What every route needs: the engine, the served model name and a thread pool."""

    def __init__(self, engine: Any, served_model_name: str, incremental_streaming_output: bool = False):
        self.engine = engine
        self.model_name = served_model_name
        self.incremental_streaming_output = incremental_streaming_output  # (/generate's stream: StreamChunks)
        # [issue 10] the model's image processor; None: it takes no images (images_unavailable: why a
        # vision model's could not be made)
        self.multimodal, self.images_unavailable = multimodal_processor(engine)
        if self.images_unavailable is not None:
            logger.warning("requests with images will fail: %s", self.images_unavailable)
        self.pool = ThreadPoolExecutor(MAX_WAITING_THREADS, thread_name_prefix="lmnb-serve")
        # a response's id (an OpenAI request's, a /generate batch's one rid) -> its prompts' handles, for
        # /abort_request and to refuse the id while it runs (engine rids: response_rids); weak: an
        # entry goes when its request's route or stream lets go of the handles
        self.batches: weakref.WeakValueDictionary[str, Batch] = weakref.WeakValueDictionary()
        # /generate's rid (one per prompt) -> its request's handle, for ``in_use``; weak, as ``batches``
        self.generating: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        # a response's prompt's engine rid (<id>-<k>, or the id) -> its handle, for ``in_use``; weak
        self.prompts: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        # rids checked and not yet in batches / generating (their submit awaits tokenizing, a compile)
        self.submitting: collections.Counter[str] = collections.Counter()
        # those of them that /abort_request named meanwhile: the route aborts them once it has their handles
        self.aborted_early: set[str] = set()
        # a response being submitted (holding_response) -> its prompts' engine rids, which /abort_request
        # with its id aborts in the engine at once: those submitted already run meanwhile
        self.held_responses: dict[str, list] = {}
        self._inbox: Optional[_Inbox] = None  # (made on the server's event loop, by the first stream)

    @functools.cached_property
    def kv_pool_tokens(self) -> Optional[int]:
        """The KV pool's size in tokens, the most one request can hold (None: an engine stand-in
        that does not say)."""
        return self.engine.model_info().get("max_total_tokens")

    def refuse_images(self, text_only: RequestError) -> NoReturn:
        """Raise for a request with images, which ``multimodal`` (None) cannot take:
        ``RequestFailed`` (500) saying why a vision model's processor could not be made (the fix is
        the server's), else ``text_only``, the route's 400 for a text-only model."""
        if self.images_unavailable is not None:
            raise RequestFailed(self.images_unavailable)
        raise text_only

    def in_use(self, rid: str) -> bool:
        """Whether ``rid`` names a request still running, which ``/abort_request`` with it aborts:
        a response (``batches``: an OpenAI one, a /generate batch with one rid) or a /generate
        prompt (``generating``). Checked by both routes before they submit, as the engine cannot
        see every clash: an OpenAI response of
        several prompts runs as ``<rid>-<k>``, so the engine took a /generate ``rid`` beside it (or
        the other way round), and /abort_request could not tell which the client meant. SGLang
        takes both (it aborts by the exact engine rid), lmnb refuses the second. A running response's
        prompt's engine rid (``<id>-<k>``) is in use too: /abort_request with it aborts that prompt,
        and a response of several prompts given it as its id ran beside it (the engine saw only
        ``<id>-<k>-0``, ...), which /abort_request then aborted instead."""
        if self.submitting[rid]:  # (checked by a request still being submitted: both would be taken)
            return True
        batch, handle = self.batches.get(rid), self.generating.get(rid)
        if (batch is not None and not all(h.done for h in batch)) or (handle is not None and not handle.done):
            return True
        # (looked up, not searched for among every running response: a batch of 2000 rids beside 2000
        # running responses held the event loop, and every stream, for half a second)
        prompt = self.prompts.get(rid)
        return prompt is not None and not prompt.done

    @contextlib.contextmanager
    def holding(self, rids: list) -> Iterator[None]:
        """Count ``rids`` in use (``in_use``) from their check until the route records its handles
        (on leaving): the submit awaits in between, and a request on the other route with one of
        them was taken meanwhile."""
        self.submitting.update(rids)
        try:
            yield
        finally:
            self.submitting.subtract(rids)
            for rid in rids:
                if self.submitting[rid] <= 0:
                    del self.submitting[rid]
                    self.aborted_early.discard(rid)

    @contextlib.contextmanager
    def holding_response(self, rid: str, rids: list) -> Iterator[None]:
        """Refuse the response ``rid`` whose prompts run as engine rids ``rids``
        (``response_rids``) if ``rid`` or one of them is in use (``in_use``; the engine sees only
        ``<rid>-<k>``, and cannot tell that ``rid`` is a running response's id), and hold them all
        (``holding``) until the route has submitted them (``submit_response``): a request with
        one of them is refused meanwhile, and /abort_request with ``rid`` aborts the prompts once
        they are submitted. Held from before the prompts are tokenized (a chat's template
        applied, its images prepared)."""
        if self.in_use(rid):  # (of one prompt, the engine refuses it too; of several, it sees only <rid>-<k>)
            raise RequestError(wire_message(rid_in_use(rid), rid), param="rid")
        taken = next((k for k, r in enumerate(rids) if r != rid and self.in_use(r)), None)
        if taken is not None:
            raise rid_clash(rid, rids, taken)
        with self.holding(list(dict.fromkeys([rid, *rids]))):
            self.held_responses[rid] = rids
            try:
                yield
            finally:
                del self.held_responses[rid]

    async def submit_response(self, rid: str, prompts: list, params: list, rids: list,
                              refused: Callable[[Exception, int], RequestError], request: Any) -> "Batch":
        """``submit`` of the response ``rid``'s prompts as engine rids ``rids``
        (``holding_response``, which the caller holds), recorded so that /abort_request with
        ``rid`` aborts them all (``batches``) and each of ``rids`` is in use while it runs."""
        handles = Batch(await self.submit(prompts, params, rids, refused, request))
        self.batches[rid] = handles
        self.prompts.update(zip(rids, handles))
        await self.abort_early(rids, handles, rid)
        return handles

    async def abort_early(self, rids: Sequence[str], handles: Sequence[Any], response: Optional[str] = None) -> None:
        """Abort each of ``handles`` (engine rids ``rids``) that /abort_request named while it was
        being submitted (``holding``; the engine knew no such rid then), all of them if it named
        ``response``, their OpenAI response's id. Called by the route once it has recorded them.
        Until none is left: an abort naming another of them while one was being aborted here (its
        rid still held) was marked, answered true, and never done."""
        aborted: set[int] = set()
        while True:
            everyone = response is not None and response in self.aborted_early
            named = [h for rid, h in zip(rids, handles)
                     if id(h) not in aborted and (everyone or rid in self.aborted_early)]
            if not named:  # (and the caller lets go of the rids with no await in between)
                return
            aborted.update(map(id, named))
            await self.abort_unfinished(named)

    def engine_stopped(self) -> bool:
        """Whether the engine has stopped (the server shutting down, a failed recovery): its
        ``RuntimeError`` is then the server's state, not a bug. (An engine without a scheduler,
        a test's stand-in, never stops.)"""
        return not getattr(getattr(self.engine, "scheduler", None), "alive", True)

    async def run(self, fn: Callable, *args) -> Any:
        """``fn(*args)`` on the thread pool, awaited without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def submit(self, prompts: list, params: list, rids: list,
                     refused: Callable[[Exception, int], RequestError], request: Any) -> list:
        """Submit every prompt; if prompt ``k`` is rejected, abort those already queued and raise
        ``refused(error, k)``, the engine's refusal in the route's own field names: a 400, or a 503
        for a busy grammar compiler; a 503 too once the engine has stopped (``RuntimeError``).
        If the client of ``request`` (a Starlette ``Request``) disconnects meanwhile, asked before
        each prompt after the first, the rest are not submitted, those queued are aborted and
        ``ClientDisconnect`` is raised (the route's answer, a 499, is never sent): ``results``
        heard of it only once every prompt of a long batch had been queued."""
        handles = []
        try:
            for prompt, p, rid in zip(prompts, params, rids):
                # (a check is one receive with a zero timeout, small beside a submit's hop to the pool)
                if handles and await request.is_disconnected():
                    await self.abort_unfinished(handles)
                    raise ClientDisconnect()
                handles.append(await self.run(self.engine.submit, prompt, p, rid))
        except (ValueError, TypeError) as e:
            from lmnb_engine.constrained.errors import GrammarCompileStopped

            await self.abort_unfinished(handles)
            # a busy or restarting compiler is the server's state: 503, which clients retry. A pattern
            # too large to compile stays a 400: a retry would spend the whole time limit again.
            transient = isinstance(e, GrammarCompileStopped) and e.transient
            error = refused(e, len(handles))
            raise RequestError(str(error), 503 if transient else 400, error.param, error.reason) from None
        except RuntimeError as e:
            await self.abort_unfinished(handles)
            if not self.engine_stopped():
                raise  # (a bug: the 500 "internal error")
            # the engine stopped (the server shutting down, a failed recovery): the server's state, as a busy compiler
            raise RequestError("the server cannot take requests: its engine has stopped (the server is shutting "
                               f"down, or must be restarted); the engine said: {str(e).removesuffix(NEW_ENGINE_FIX)}",
                               503) from None
        return handles

    async def results(self, handles: list, request: Any, poll_s: float = 0.5) -> list:
        """``[h.result() for h in handles]``, waited for on the event loop (``events``): a thread
        per request let more than ``MAX_WAITING_THREADS`` requests waiting hold every thread, and
        every other request waited for them. If the client disconnects first, every handle is
        aborted: a client that gave up on a non-streaming request must not leave its work queued
        ahead of everyone else's."""
        async def finished() -> list:
            async for _ in self.events(handles):
                pass
            return [h.result() for h in handles]

        fut = asyncio.ensure_future(finished())
        try:
            while not fut.done():
                await asyncio.wait([fut], timeout=poll_s)
                if not fut.done() and await request.is_disconnected():
                    await self.abort_unfinished(handles)
                    break
            return await fut
        finally:
            await self.abort_unfinished(handles)

    async def events(self, handles: list) -> AsyncIterator[tuple[int, Any]]:
        """``(k, event)``: the ``StreamEvent``s of every ``handles[k]`` as they come, the prompts
        of a batch interleaved (SGLang streams a batch so, each chunk with its ``index``), until
        every sample has finished. The handles' listeners (``RequestHandle.subscribe``) hand the
        events to this loop through the context's ``_Inbox``: no thread waits, so open streams are
        not bounded by the pool. The caller aborts the unfinished handles if it stops early
        (``results``, ``EventStream``)."""
        loop = asyncio.get_running_loop()
        if self._inbox is None or self._inbox.loop is not loop:
            self._inbox = _Inbox(loop)
        inbox = self._inbox
        queue: asyncio.Queue = asyncio.Queue()
        for k, h in enumerate(handles):
            h.subscribe(lambda ev, k=k: inbox.put(queue, (k, ev)))
        left = sum(h.n for h in handles)
        while left:
            k, ev = await queue.get()
            if ev.finished and ev.result is not None:
                left -= 1
            yield k, ev

    async def abort_unfinished(self, handles: Sequence[Any]) -> list:
        """Abort every handle not done (a response that ended before its requests, a batch refused
        midway); each abort's result (``RequestHandle.abort``: True if it was live). On the thread
        pool, all at once: each waits for the engine's next pause between steps (a whole step,
        longer on a big batch), which on the event loop held every other request, and one after
        another took a step each. Started before the first await, and shielded: a response
        cancelled meanwhile (the server cutting it off) still aborts them all, and an abort's error
        that no one then hears is logged (else asyncio's "exception was never retrieved")."""
        aborts = asyncio.gather(*[asyncio.wrap_future(self.pool.submit(h.abort)) for h in handles if not h.done])
        shielded = asyncio.shield(aborts)

        def unheard(_: asyncio.Future) -> None:
            if shielded.cancelled() and not aborts.cancelled() and aborts.exception() is not None:
                logger.error("aborting the requests of a response that was cut off failed",
                             exc_info=aborts.exception())

        aborts.add_done_callback(unheard)
        return await shielded


# How long a stopping server waits, once its requests are aborted, for the open responses to send
# their last events (a client that reads nothing holds its stream open) before it cuts them off.
SHUTDOWN_GRACE_S = 5
# How long, after that cut-off, uvicorn waits for the responses' tasks to end before it cancels them.
CUT_OFF_WAIT_S = 10


class Server(uvicorn.Server):
    """uvicorn's server of ``app`` (``create_app``'s), which ends the open requests when it stops
    (Ctrl-C, SIGTERM, ``should_exit``): uvicorn waits for every open response to end, and a client
    streaming a long generation kept the server up until its last token. The app's engine is shut
    down first, which aborts every request (``ABORTED_BY_SHUTDOWN``): each stream sends its last
    event (/generate's finish reason abort, an OpenAI stream's error) and ``[DONE]``, each
    unstreamed request its answer, and a response still open ``SHUTDOWN_GRACE_S`` later (its
    client reads nothing) is cut off: its connection is closed (``_cut_off``). ``stopped``: called
    once it has stopped serving, before ``run`` gives the signal handlers from before back (a signal
    from then on meets them, and the caller's phase should say it came after the stop). ``config``:
    ``uvicorn.Config``'s keywords."""

    def __init__(self, app: FastAPI, stopped: Optional[Callable[[], None]] = None, **config: Any) -> None:
        # uvicorn's own limit cancels the tasks still running, and logs each one's CancelledError
        # with its traceback: here only a backstop for a task that outlives its closed connection,
        # a fixed time after the cut-off (a task on a loaded machine takes a while to see it).
        # No lifespan task (the app has no startup or shutdown hooks): a forced exit skips its
        # shutdown, and the closing loop cancelled it, with a traceback too.
        super().__init__(uvicorn.Config(app, timeout_graceful_shutdown=SHUTDOWN_GRACE_S + CUT_OFF_WAIT_S,
                                        lifespan="off", **config))
        self.engine = app.state.ctx.engine
        self.stop_signal: Optional[int] = None  # the signal that stopped it (handle_exit), if one did
        self._stopped = stopped

    def handle_exit(self, sig: int, frame: Any) -> None:
        """uvicorn's handler of SIGINT and SIGTERM (stop; a second Ctrl-C forces the exit), which
        keeps the first signal in ``stop_signal``: ``lmnb serve`` says why it stopped."""
        if self.stop_signal is None:
            self.stop_signal = sig
        super().handle_exit(sig, frame)

    def run(self, sockets: Optional[list] = None) -> None:
        """uvicorn's ``run``, SIGINT and SIGTERM stopping the server (``handle_exit``) all the
        while, the handlers from before back after it (on the main thread: no other can set
        them). uvicorn sets its own handlers only while it serves, and after its clean stop raises
        the signal again under the handlers it found: these, not Python's, which ended the process
        by SIGTERM with no word, and made SIGINT a KeyboardInterrupt ("lmnb: interrupted"). Once
        it has stopped, ``stopped`` (the constructor's) is called, before those handlers are back."""
        if threading.current_thread() is not threading.main_thread():
            try:
                return super().run(sockets)
            finally:
                self._call_stopped()
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            super().run(sockets)
        finally:
            try:
                self._call_stopped()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _call_stopped(self) -> None:
        if self._stopped is not None:
            self._stopped()

    async def shutdown(self, sockets: Optional[list] = None) -> None:
        """Shut the engine down (off the event loop, which meanwhile sends the streams' last
        events), then uvicorn's shutdown: it waits for the responses to end, those still open
        ``SHUTDOWN_GRACE_S`` from now being cut off."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.engine.shutdown)
        cut = loop.call_later(SHUTDOWN_GRACE_S, self._cut_off, f"{SHUTDOWN_GRACE_S:g} s after the shutdown")
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()
        if self.force_exit and self.server_state.tasks:  # a second Ctrl-C ("force quit") ended uvicorn's wait
            # the responses still open end now; left running, the closing loop cancelled their tasks,
            # each logged with a traceback
            self._cut_off("at a forced exit")
            await asyncio.wait(list(self.server_state.tasks), timeout=SHUTDOWN_GRACE_S)

    def _cut_off(self, when: str) -> None:
        """Close the connections still open: each response's task sees its client gone and ends
        quietly, as for a client that left."""
        connections = list(self.server_state.connections)
        if connections:
            logger.warning("cutting off %d response(s) still open %s", len(connections), when)
        for connection in connections:
            connection.transport.abort()


class EventStream(StreamingResponse):
    """The server-sent events of ``handles``' requests, aborting those not done however the
    response ends (a client gone, an error): a stream of several prompts that ends early must not
    leave the prompts after the one it was streaming running. Here, not in the events' generator:
    its clean-up runs only once it has started, and a client that left before the first event (the
    response's start failed, or the server heard the disconnect first) never starts it, so its
    requests ran on to their last token."""

    def __init__(self, ctx: ServerContext, events: AsyncIterator[str], handles: list) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.ctx, self.handles = ctx, handles

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.ctx.abort_unfinished(self.handles)


def error_body(message: str, status: int, param: Optional[str] = None, reason: Optional[str] = None) -> dict:
    """The JSON body of an error response (OpenAI's shape): message, type from ``status``, param,
    code; and ``reason`` where one is given (``RequestError.reason``, an lmnb extension)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    elif status == 404:
        kind = "not_found_error"
    error = {"message": message, "type": kind, "param": param, "code": status}
    return {"error": {**error, "reason": reason} if reason is not None else error}


def _no_route(request: Request) -> str:
    """The message of a request for a path no route of the server has ("Not Found" said neither the
    path nor the routes): the path, the closest route (difflib's ``get_close_matches``, as
    ``did_you_mean``), and every API route with its methods."""
    routes = {r.path_format: " or ".join(sorted(r.methods - {"HEAD"}))  # (path_format: {model}, not {model:path})
              for r in request.app.routes if isinstance(r, APIRoute)}
    path = request.url.path
    close = close_match(path, routes)
    hint = f" (did you mean {routes[close]} {close}?)" if close is not None else ""
    listed = ", ".join(f"{methods} {route}" for route, methods in routes.items())
    # (cut, as the other errors show a value: a path of 60 kB came back whole in the message)
    shown = path if len(path) <= SHOWN_CHARS else path[:SHOWN_CHARS] + "…"
    return f"the server has no route {shown}{hint}; its routes: {listed}"


def sse(obj: Any) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def _per_item(value: Any, n: int, name: str) -> list:
    """A request field given once for all prompts or as a list with one entry per prompt."""
    if isinstance(value, list):
        if len(value) != n:
            # (it said "has 1 entries for 2 prompts", naming no fix)
            entries = f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
            raise RequestError(f"{name} has {entries} for {n} prompt{'s' * (n != 1)}: give one entry per prompt, or "
                               "one value (not a list) for all of them", param=name)
        return value
    return [value] * n


def _prompt_params(body: dict, k: int, batch: bool, *fields) -> SamplingParams:
    """``sampling_params_from_json(*fields)`` of prompt ``k``, an error naming the entry of a field
    the body gave per prompt (``_entry_error``)."""
    try:
        return sampling_params_from_json(*fields)
    except RequestError as e:
        raise _entry_error(body, k, batch, e) from None


def _entry_error(body: dict, k: int, batch: bool, e: RequestError) -> RequestError:
    """``entry_error`` of /generate's ``body``: the fields it gave per prompt are those it gave as a
    list, and of a ``batch`` the prompt (``text`` or ``input_ids``)."""
    per_prompt = [key for key in _PER_PROMPT_KEYS if isinstance(body.get(key), list)]
    if batch:
        per_prompt.append(_prompt_field(body))
    return entry_error(e, k, per_prompt)


def _prompt_field(body: dict) -> str:
    """The field that holds /generate's prompts: ``text``, else ``input_ids``."""
    return "text" if body.get("text") is not None else "input_ids"


def entry_error(e: RequestError, k: int, per_prompt: Sequence[str]) -> RequestError:
    """``e``, an error in prompt ``k``'s fields named as for a single prompt, naming the entry of
    the field it is about where the request gave that field per prompt (``per_prompt``, each a
    list): ``sampling_params[1].temperature``, ``text[1]``, ``rid[1]``, ``prompt[1]``; a field that
    every prompt shares is named as it is."""
    key = next((key for key in per_prompt if e.param and (e.param == key or e.param.startswith(key + "."))), None)
    if key is None:
        return e
    entry = f"{key}[{k}]"
    message = str(e)  # (a message names its field first, when it does: "sampling_params.top_p=2 is invalid")
    message = entry + message[len(key):] if re.match(rf"{key}\b", message) else f"{entry}: {message}"
    return RequestError(message, e.status, entry + e.param[len(key):], e.reason)


def _refusal(body: dict, params: list, rids: list, batch: bool,
             response: Optional[str]) -> Callable[[Exception, int], RequestError]:
    """``ServerContext.submit``'s ``refused`` for /generate: the engine's refusal of prompt ``k``
    naming its field as the client sent it (``refused_field``; the prompt, ``text`` or
    ``input_ids``, where it names none, and its fix "shorten the text" then), with the entry of a batch's prompt (``_entry_error``),
    and its value as JSON (``wire_message``); of a batch named by one rid, ``response``, a rid in
    use says how that rid expands (``rid_clash``)."""
    def refused(e: Exception, k: int) -> RequestError:
        sp = body.get("sampling_params")
        d = sp[k] if isinstance(sp, list) else sp
        field = refused_field(e, params[k])
        if field == "rid" and response is not None:
            return rid_clash(response, rids, k)
        if isinstance(e, SamplingParamsError):
            error = sampling_params_error(e, d)
        else:
            param = (_prompt_field(body) if field is None else field if field == "rid" else sampling_field(d, field))
            message = client_message(e)
            if field is None:  # the prompt is the field the client sent, as where the server refuses the text
                message = message.replace("shorten the prompt", f"shorten the {param}")
            error = RequestError(wire_message(message, refused_value(e, field, rids[k])), param=param,
                                 reason=getattr(e, "reason", None))
        return _entry_error(body, k, batch, error)

    return refused


_PER_PROMPT_KEYS = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num", "rid")
_GENERATE_KEYS = {
    "text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs", "stream", "image_data",
}
# /abort_request's fields: SGLang's AbortReq's that a client sends (its finished_reason and
# abort_message are filled in by SGLang's own server, not by a client)
_ABORT_KEYS = {"rid", "abort_all"}
_EMPTY_OK_KEYS = {"video_data", "audio_data", "modalities", "lora_path", "session_params"}
_WHY_NOT = {"video_data": "send a video's frames as images in image_data, with one image token per frame"}


def _image(value: Any) -> Any:
    """[issue 10] One ``image_data`` entry as ``load_image`` takes it: a data URL as it is, bare
    base64 decoded to bytes. Anything else (a path, an http URL) is a 400: the server must not
    read its own disk or fetch for a client."""
    from lmnb_engine.multimodal.image_io import is_data_url

    if is_data_url(value):
        return value
    try:
        return base64.b64decode(value, validate=True) if isinstance(value, str) and value else None
    except (binascii.Error, ValueError):
        return None


def _parse_images(value: Any, n: int, batch: bool) -> list[list]:
    """[issue 10] The images of each of ``n`` prompts from ``image_data``: for one prompt a string
    or a list of strings; for a batch a list with one such entry (or null) per prompt, or one
    string for every prompt (SGLang's frontend scores a select's choices so). The entries are read
    by ``_with_images``."""
    if not value:
        return [[] for _ in range(n)]
    if batch and isinstance(value, str):
        return [[value] for _ in range(n)]
    if batch:
        if not isinstance(value, list) or len(value) != n:
            raise RequestError(f"image_data of a batch of {n} prompts must be one string for all of them, or a list "
                               "with one entry per prompt (a string, a list of strings, or null)", param="image_data")
        per_prompt = [[] if v is None else v if isinstance(v, list) else [v] for v in value]
    else:
        per_prompt = [value if isinstance(value, list) else [value]]
    return per_prompt


def not_an_object(body: Any) -> RequestError:
    """The error of a request body that is JSON but no object (``[]``, ``"x"``, ``null``), said
    alike by every route: the OpenAI routes said "Input should be a valid dictionary or instance
    of CompletionRequest (got [])", naming a class of the server's code."""
    return RequestError(f"the body must be a JSON object of the request's fields ({{\"field\": value, ...}}), not "
                        f"{json_value(body, SHOWN_CHARS)}")


def _parse_generate(body: Any) -> tuple[list, list, list, bool, dict]:
    """(prompts, SamplingParams per prompt, rids, is_batch, options) of a /generate body; options
    hold ``images``, each prompt's [issue 10] images."""
    if not isinstance(body, dict):
        raise not_an_object(body)
    for key, value in body.items():
        if key in _EMPTY_OK_KEYS:
            if value:
                raise RequestError(f"{key} is not supported by lmnb serve; "
                                   f"{_WHY_NOT.get(key, 'leave it out')}", param=key)
        elif key not in _GENERATE_KEYS:
            raise RequestError(f"unknown field {json_value(key, 40)}{did_you_mean(key, _GENERATE_KEYS)}; "
                               f"/generate takes {json_value(sorted(_GENERATE_KEYS))}", param=key)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of text and input_ids", param="text")
    if text is not None:
        batch = isinstance(text, list)
        prompts = text if batch else [text]
        if not all(isinstance(t, str) for t in prompts):
            raise RequestError("text must be a string or a list of strings", param="text")
    else:
        batch = isinstance(ids, list) and bool(ids) and all(isinstance(x, list) for x in ids)
        prompts = ids if batch else [ids]
        if not all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompts):
            raise RequestError("input_ids must be a list of token ids or a list of such lists", param="input_ids")
    n = len(prompts)
    if n == 0:
        # (only text can be empty: input_ids [] is one prompt of no tokens)
        raise RequestError("the batch is empty: text is an empty list; give at least one prompt", param="text")
    sps = _per_item(body.get("sampling_params"), n, "sampling_params")
    want_lp = _per_item(body.get("return_logprob", False), n, "return_logprob")
    starts = _per_item(body.get("logprob_start_len", -1), n, "logprob_start_len")
    tops = _per_item(body.get("top_logprobs_num", 0), n, "top_logprobs_num")
    params = [_prompt_params(body, k, batch, *item) for k, item in enumerate(zip(sps, want_lp, starts, tops))]
    check_samples(params, "text" if text is not None else "input_ids")
    rid = body.get("rid")
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    elif isinstance(rid, str):  # (of a batch, SGLang's prompt k runs as <rid>_<k>: docs/language.md)
        check_rid(rid)
        rids = response_rids(rid, n)
    elif isinstance(rid, list) and len(rid) == n and all(isinstance(r, str) for r in rid):
        for k, r in enumerate(rid):
            check_rid(r, f"rid[{k}]")
        rids = rid
    else:
        want = "a string" if n == 1 else f"a string (prompt k's rid is then <rid>-<k>) or a list of {n} strings, one per prompt"
        raise RequestError(f"rid must be {want}, not {json_value(rid, 40)}", param="rid")
    if len(set(rids)) != len(rids):
        raise RequestError("rid values must be distinct", param="rid")
    opts = {"stream": _flag(body, "stream"), "text_in_logprobs": _flag(body, "return_text_in_logprobs"),
            "images": _parse_images(body.get("image_data"), n, batch)}
    return prompts, params, rids, batch, opts


def check_samples(params: Sequence[SamplingParams], param: str) -> None:
    """Refuse a request whose prompts' samples (the sum of their ``n``) are more than
    ``MAX_REQUEST_SAMPLES``, with a 400 naming the count, the bound and how to split it; ``param``
    names the prompts' field. Checked by each route once the body is read, before any prompt is
    tokenized or queued."""
    count = sum(p.n for p in params)
    if count > MAX_REQUEST_SAMPLES:
        ns = {p.n for p in params}
        shown = f"{len(params)} prompts at n={ns.pop()}" if len(ns) == 1 else f"{len(params)} prompts"
        per = MAX_REQUEST_SAMPLES // max(p.n for p in params)
        raise RequestError(f"the request asks for {count} samples ({shown}), more than the {MAX_REQUEST_SAMPLES} "
                           f"lmnb serve takes in one request; split the batch into several requests (of at most "
                           f"{per} prompts each here)", param=param)


def check_rid(rid: str, param: str = "rid") -> None:
    """Refuse a client's request id (``param`` names it) that is empty or only whitespace: the
    engine gave an empty one an id of its own, which the client could not abort by, and a blank
    one is a mistake (an empty template variable) that no log shows."""
    if not rid.strip():
        raise RequestError(f"{param} must hold a character other than whitespace, not {json_value(rid)}; leave it "
                           "out for an id the server picks", param=param)


def encode_prompt(engine: Any, text: str, param: str, add_special_tokens: bool = True,
                  fix: Optional[Callable[..., tuple[str, Optional[str]]]] = None) -> list[int]:
    """The ids the engine runs ``text`` as, ``engine.prompt_ids(text)`` (without
    ``add_special_tokens``, a rendered chat template's: ``engine.encode(text, False)``); a text
    certainly longer than the context is refused (a 400 naming ``param``) without encoding it: a
    20 MB prompt took 20 s to encode, to be refused then. On a
    worker thread: the first look at a vocabulary takes a moment. ``fix``: the refusal's message
    and reason made of what it says of the text and the lower bound on its tokens
    (``params.past_context_refusal`` and its ``prompt_len``: by how much to shorten it at least,
    naming the request's length field too where that helps, ``DOES_NOT_FIT``); default:
    "...; shorten the ``param``"."""
    too_long = text_too_long(text, engine.tokenizer, engine.context_len)
    if too_long:
        said, at_least = too_long
        message, reason = fix(said, prompt_len=at_least) if fix else (f"{said}; shorten the {param}", None)
        raise RequestError(message, param=param, reason=reason)
    return engine.prompt_ids(text) if add_special_tokens else engine.encode(text, False)


_UNKNOWN = object()


def field_place(path: Any, body: Any = _UNKNOWN, missing: bool = False) -> str:
    """The place in a request body that ``path`` (object keys and list indices, as a pydantic
    error's ``loc``) names, written as every error names one: ``messages[0].content``, brackets
    for a list index, dots for an object key; "" for the body itself. Given the ``body``, a key
    where the body holds no object, or that its object lacks, is left out: pydantic's name of a
    union's alternative, so ``messages.0.content.list[ContentPart].0.type`` is
    ``messages[0].content[0].type``, and ``messages.0.content.str`` (an object as the content)
    ``messages[0].content``; ``missing``: the error is that the last key is missing, so it stays."""
    place, at = "", body
    for i, key in enumerate(path):
        if isinstance(key, int):
            place += f"[{key}]"
            at = at[key] if isinstance(at, list) and 0 <= key < len(at) else _UNKNOWN
        elif at is _UNKNOWN or (isinstance(at, dict) and (key in at or (missing and i == len(path) - 1))):
            place += f".{key}"
            at = at.get(key, _UNKNOWN) if isinstance(at, dict) else _UNKNOWN
    return place.removeprefix(".")


def _alternatives_error(errors: list, first: dict, body: Any = _UNKNOWN) -> dict:
    """``first`` (a pydantic error), its message naming every form a union field takes where the
    value fits none at all (each alternative's error has the same place but its own last part,
    the form's tag): ``"stop": 5`` said "Input should be a valid string", the first form pydantic
    tried, for a field that is a string or a list ("... a valid string or a valid list"). Given
    the ``body``, a last part that is a key of the object there is a field, not a form: two
    fields of one object refused for the same value (``"response_format": {"type": 5,
    "json_schema": 5}``) are not one field's forms."""
    loc, prefix = first.get("loc", ()), "Input should be "
    alike = [e for e in errors if len(e.get("loc", ())) == len(loc) and e["loc"][:-1] == loc[:-1]
             and e.get("input", first.get("input")) == first.get("input")]
    holder = _value_at(body, loc[1:-1] if loc[:1] == ("body",) else loc[:-1])
    if isinstance(holder, dict) and any(e["loc"][-1] in holder for e in alike):
        return first
    if len(loc) < 2 or len(alike) < 2 or not all(e.get("msg", "").startswith(prefix) for e in alike):
        return first
    forms = dict.fromkeys(pydantic_message(e, shown=False).removeprefix(prefix) for e in alike)
    return {**first, "msg": prefix + " or ".join(forms), "type": "union"}  # (not the first form's kind, reworded)


def _value_at(body: Any, path: Sequence) -> Any:
    """What ``body`` holds at ``path`` (object keys and list indices, as a pydantic error's ``loc``),
    or ``_UNKNOWN`` where it holds nothing there (or the body is unknown)."""
    at = body
    for key in path:
        if isinstance(at, dict) and not isinstance(key, int) and key in at:
            at = at[key]
        elif isinstance(at, list) and isinstance(key, int) and 0 <= key < len(at):
            at = at[key]
        else:
            return _UNKNOWN
    return at


def pydantic_message(error: dict, shown: bool = True) -> str:
    """A pydantic validation ``error``'s message as the server's other errors word theirs: in JSON's
    words (a literal's choices ``"text", "json_object"``, not Python's ``'text'``), and with the
    value the client sent as JSON (``json_value``), which pydantic's message leaves out ("Input
    should be a valid string (got 5)"); not for a missing field (the value is the object around
    it), nor for the prompt's own errors, which show it already, nor of an unknown field (its
    value is no matter: openai_api._with_guess), nor when ``shown`` is False."""
    msg = error.get("msg", "invalid request")
    kind = error.get("type")
    if kind == "literal_error":  # (pydantic writes the choices with repr; they are short strings here)
        msg = msg.replace("'", '"')
    elif kind in ("model_type", "dict_type"):  # (pydantic: "a valid dictionary or instance of ChatMessage", a class
        # of the server's code, and "a valid dictionary", Python's word)
        msg = "Input should be a JSON object"
    # ("prompt": openai_api._prompt_error)
    if shown and kind not in ("missing", "prompt", "unknown_field") and "input" in error:
        try:
            msg += f" (got {json_value(error['input'], 40)})"
        except (TypeError, ValueError):  # (a ValidationError of a value that is no JSON, raised by code)
            pass
    return msg


def _lone_surrogate_place(body: Any) -> Optional[str]:
    """The place (``field_place``; "" for the body itself) of the first lone surrogate in a
    parsed JSON body, or None."""
    found = find_lone_surrogate(body)
    return None if found is None else field_place(found[0])


def _loads(raw: bytes) -> Any:
    """``raw`` as ``json.loads`` reads it, refusing an integer of more digits than Python reads
    (``int_max_str_digits``), whose ValueError from ``json.loads`` was a 500, by its place and value.

    Raises:
        RequestError: such an integer. Else as ``json.loads``."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise
    except ValueError:
        found = long_integer_in_json(raw)
        if found is None:
            raise
        shown, place = shown_integer_text(found[1]), field_place(found[0])
        said = f"{place}={shown}" if place else f"the body, {shown},"
        raise RequestError(f"{said} has {past_digit_limit('lmnb serve')}; send a smaller number",
                           param=place or None) from None


def _flag(body: dict, key: str) -> bool:
    """A boolean field (false when absent); "no" is a 400, not true."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, not {json_value(value)}", param=key)
    return bool(value)


def create_app(engine: Any, api_key: Optional[str] = None, served_model_name: Optional[str] = None,
               max_body_mb: float = DEFAULT_MAX_BODY_MB, incremental_streaming_output: bool = False):
    """The ASGI app serving ``engine`` (an ``lmnb_engine.Engine`` or anything with its methods).

    ``api_key``: when set, every route except ``/health`` needs ``Authorization: Bearer <key>``.
    ``max_body_mb``: a request body larger than this many MiB is refused with a 413, unread.
    ``incremental_streaming_output``: each ``/generate`` stream chunk carries only the text, ids
    and output logprobs new since its sample's last one (SGLang's server option of that name).
    """
    from lmnb_engine.http_server.openai_api import add_openai_routes

    name = served_model_name or (engine.model_path or "lmnb-model")
    ctx = ServerContext(engine, name, incremental_streaming_output)

    # A route dependency, not an HTTP middleware: Starlette's middleware wraps the ASGI receive
    # channel, and then ``request.is_disconnected()`` never sees a client leave (ServerContext.results).
    async def check_api_key(request: Request) -> None:
        if api_key and request.url.path != "/health":
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            # the scheme is case-insensitive (RFC 7235); the key is compared in constant time, so the
            # time a refusal takes says nothing of how much of a guess was right
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
                raise RequestError("missing or wrong API key (send Authorization: Bearer <key>)", 401)

    app = FastAPI(title="lmnb serve", docs_url=None, redoc_url=None, dependencies=[Depends(check_api_key)])
    app.router.route_class = _Route  # before any route is added
    app.router.redirect_slashes = False  # (_SlashlessPaths serves the path instead)
    app.add_middleware(_SlashlessPaths)
    app.state.ctx = ctx

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return JSONResponse(error_body(str(exc), exc.status, exc.param, exc.reason), exc.status)

    # A handler of its own: an ``Exception`` handler would reset the connection (``_Route``).
    @app.exception_handler(RequestFailed)
    async def request_failed(request: Request, exc: RequestFailed):
        return JSONResponse(error_body(str(exc), exc.status), exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        # the deepest error: of a union's alternatives (a message's content is a string or a list of
        # parts), the one the value got furthest in, e.g. content[0].type, not content (a string)
        first = max(errs, key=lambda e: len(e.get("loc", ())), default={})
        first = _alternatives_error(errs, first, _UNKNOWN if exc.body is None else exc.body)
        loc = first.get("loc", ())
        where = field_place(loc[1:] if loc[:1] == ("body",) else loc, _UNKNOWN if exc.body is None else exc.body,
                            missing=first.get("type") == "missing")
        where += (first.get("ctx") or {}).get("at", "")  # (the item of a prompt: openai_api._prompt_error)
        msg = pydantic_message(first)
        return JSONResponse(error_body(f"{where}: {msg}" if where else msg, 400, where or None), 400)

    @app.exception_handler(ValidationError)
    async def body_error(request: Request, exc: ValidationError):
        return await validation_error(request, RequestValidationError(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message, allow = str(exc.detail), (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allow:  # the route is there: name the methods it takes
            methods = sorted(set(allow.split(", ")) - {"HEAD"})  # (HEAD goes with GET: no method to send)
            message = f"{request.method} is not allowed on {request.url.path}; send {' or '.join(methods)} {request.url.path}"
        elif exc.status_code == 404 and "endpoint" not in request.scope:  # (no route matched: the router's 404)
            message = _no_route(request)
        # (with its headers: a 405 must say Allow, RFC 9110 section 15.5.6)
        return JSONResponse(error_body(message, exc.status_code), exc.status_code, headers=exc.headers)

    max_body = int(max_body_mb * 2**20)
    too_large = RequestError(f"the request body is larger than the server's limit of {max_body_mb:g} MiB; send a "
                             "smaller one (split a batch into several requests), or start the server with a larger "
                             "--max-body-mb", 413)

    async def json_body(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body:  # refused before a byte of it is read
            raise too_large
        raw, size = [], 0
        async for chunk in request.stream():  # (a chunked body declares no length: counted as it comes)
            size += len(chunk)
            if size > max_body:
                raise too_large
            raw.append(chunk)
        try:
            body = _loads(b"".join(raw))
            where = _lone_surrogate_place(body)
        except UnicodeDecodeError as e:  # (before ValueError, its base: json's position means nothing here)
            coded = request.headers.get("content-encoding", "identity").lower()
            fix = (f"; the server does not undo Content-Encoding {coded}: send the body uncompressed"
                   if coded != "identity" else ": send JSON as UTF-8")
            raise RequestError(f"the body is not valid JSON: its bytes are no UTF-8 text ({e.reason} at byte "
                               f"{e.start}){fix}") from None
        except json.JSONDecodeError as e:
            raise RequestError(f"the body is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})") from None
        except RecursionError:  # (json's parser and the walk above recurse per level)
            raise RequestError("the body is nested too deeply; no request field nests more than a few levels") from None
        if where is not None:  # the tokenizer fails on one with a TypeError (a 500, or a 400 naming no field)
            raise RequestError(f"{where or 'the body'} holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which "
                               "is no Unicode character; send valid text (a character beyond U+FFFF as a pair, "
                               "\\ud83d\\ude00)", param=where or None)
        return body

    @app.get("/health")
    async def health():
        return {}

    @app.get("/get_model_info")
    async def get_model_info():
        return await ctx.run(model_info_dict, ctx)

    @app.get("/get_server_info")
    async def get_server_info():
        info = await ctx.run(model_info_dict, ctx)
        info["cache_stats"] = await ctx.run(engine.cache_stats)
        info["incremental_streaming_output"] = ctx.incremental_streaming_output  # (a server arg, as SGLang's)
        return info

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        ok = bool(await ctx.run(engine.flush_cache))
        msg = "Cache flushed." if ok else "Cache not flushed: requests are running; retry when idle."
        return JSONResponse({"success": ok, "message": msg}, 200 if ok else 409)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await json_body(request)
        if not isinstance(body, dict):
            raise not_an_object(body)
        # (SGLang's; false, its default, is taken; 0 or "no" is a 400 as for /generate's flags,
        # where it was refused as if it asked to abort all)
        if _flag(body, "abort_all"):
            raise RequestError("lmnb serve does not abort all requests at once (abort_all is true); abort each by "
                               'its id, {"rid": "<request id>"}, and leave abort_all out', param="abort_all")
        if "rid" not in body:
            raise RequestError('abort_request needs the id of the request to abort, {"rid": "<request id>"}; the body '
                               f"has no rid (it has {json_value(sorted(body), SHOWN_CHARS)})", param="rid")
        unknown = next((key for key in body if key not in _ABORT_KEYS), None)
        if unknown is not None:  # (SGLang's AbortReq drops unknown keys: {"rid": "x", "ridd": 1} passed unheard)
            raise RequestError(f"unknown field {json_value(unknown, 40)}{did_you_mean(unknown, _ABORT_KEYS)}; "
                               f"/abort_request takes {json_value(sorted(_ABORT_KEYS))}", param=unknown)
        rid = body["rid"]
        if not isinstance(rid, str):  # (an id is text: the rid /generate was given, or the one it made)
            raise RequestError(f'rid must be the request id as a JSON string, "rid": "<id>", not {json_value(rid, 40)}',
                               param="rid")
        batch = ctx.batches.get(rid)  # an OpenAI response id (of several prompts: each has a rid of its own)
        # (one finished, whose handles a route still holds, leaves the rid to a request taken since: in_use)
        if batch is not None and not all(h.done for h in batch):
            return {"success": any(await ctx.abort_unfinished(batch))}  # (at once: each waits for a pause)
        if ctx.submitting[rid]:  # (still being submitted: aborted once its handles exist)
            ctx.aborted_early.add(rid)
            # and now, in the engine, whatever of it the engine has: an earlier prompt of a batch, running
            # while a later one compiles its grammar (Engine.abort finds that one too). At once, not one
            # by one: each waits for the engine's next pause between steps.
            await asyncio.gather(*map(engine_abort, ctx.held_responses.get(rid, [rid])))
            return {"success": True}
        return {"success": await engine_abort(rid)}

    async def engine_abort(rid: str) -> bool:
        """``engine.abort(rid)``; False once the engine has stopped (the server shutting down): it
        has ended every request."""
        try:
            return bool(await ctx.run(engine.abort, rid))
        except RuntimeError:
            if not ctx.engine_stopped():
                raise  # (a bug: the 500 "internal error")
            return False

    @app.post("/generate")
    async def generate(request: Request):
        body = await json_body(request)
        prompts, params, rids, batch, opts = _parse_generate(body)
        # a batch's one rid names it as an OpenAI rid names a response of several prompts
        response = body["rid"] if isinstance(body.get("rid"), str) and len(rids) > 1 else None
        if response is None:
            for k, rid in enumerate(rids):  # (the engine cannot see an OpenAI response's rid: ServerContext.in_use)
                if ctx.in_use(rid):
                    raise _entry_error(body, k, batch, RequestError(wire_message(rid_in_use(rid), rid), param="rid"))
        prompt_texts = list(prompts)  # (the text prompts, before some are encoded below)
        with ctx.holding(rids) if response is None else ctx.holding_response(response, rids):
            # Prompt token 0 has no logprob but its id is named in input_token_logprobs: a text prompt
            # that needs it is tokenized here (off the event loop) and submitted as its ids.
            prompts = [await _encoded(ctx, x, k, body, batch, p) if isinstance(x, str) and p.logprob_start_len == 0
                       else x for k, (x, p) in enumerate(zip(prompts, params))]
            firsts = [int(x[0]) if p.logprob_start_len == 0 and x else None for x, p in zip(prompts, params)]
            if any(opts["images"]):
                prompts = [await _with_images(ctx, x, images) if images else x
                           for x, images in zip(prompts, opts["images"])]
            refused = _refusal(body, params, rids, batch, response)
            if response is None:
                handles = await ctx.submit(prompts, params, rids, refused, request)
                ctx.generating.update(zip(rids, handles))
                await ctx.abort_early(rids, handles)
            else:
                handles = await ctx.submit_response(response, prompts, params, rids, refused, request)
        decode = engine.decode if opts["text_in_logprobs"] else None
        if opts["stream"]:
            return EventStream(ctx, _stream_generate(ctx, handles, params, decode, firsts, prompts, prompt_texts), handles)
        outputs = []
        for res, p, first, x, text in zip(await ctx.results(handles, request), params, firsts, prompts, prompt_texts):
            for r in res if isinstance(res, list) else [res]:
                meta = await ctx.run(_finished_meta, r, decode, p, first, x)  # (decodes every logprob's token)
                await _with_cached_chars(ctx, meta, text, x)
                outputs.append({"text": r.text, "output_ids": list(r.token_ids), "meta_info": meta,
                                "index": len(outputs)})
        return outputs if batch or len(outputs) > 1 else outputs[0]

    add_openai_routes(app, ctx, json_body)
    # HEAD where GET only reads (RFC 9110 section 9.3.2; the server sends the headers only): FastAPI's
    # routes take only the methods named, so curl -I /health was a 405. Not /flush_cache, whose GET
    # (SGLang's) flushes: a HEAD, which clients and proxies take to change nothing, must not.
    for route in app.routes:
        if isinstance(route, APIRoute) and route.methods == {"GET"}:
            route.methods.add("HEAD")
    return app


async def _encoded(ctx: ServerContext, text: str, k: int, body: dict, batch: bool, params: SamplingParams) -> list[int]:
    """``encode_prompt`` of /generate's prompt ``k``, off the event loop; a prompt of a batch too
    long to encode is named by its entry (``text[1]``), and its ``params.max_new_tokens`` too where
    that fits beside no prompt, as ``Engine._to_ids`` refuses a text of the other prompts."""
    fix = functools.partial(past_context_refusal, max_new_tokens=params.max_new_tokens,
                            context_len=ctx.engine.context_len, noun="text")
    try:
        return await ctx.run(encode_prompt, ctx.engine, text, "text", True, fix)
    except RequestError as e:
        raise _entry_error(body, k, batch, e) from None


async def _with_images(ctx: ServerContext, prompt: Any, images: list) -> Any:
    """[issue 10] ``prompt`` (text or ids) with its images, prepared off the event loop; a
    text-only model, a placeholder count that does not match, or an unreadable image is a 400."""
    from lmnb_engine.multimodal import MultimodalPrompt

    mm = ctx.multimodal
    if mm is None:
        ctx.refuse_images(RequestError("image_data needs a vision-language model, and the served model is "
                                       "text-only; serve a LLaVA checkpoint to send images", param="image_data"))
    images = [_image(v) for v in images]
    if any(x is None for x in images):
        raise RequestError("image_data entries must be data:image/<type>;base64,<data> URLs or base64 strings; "
                           "the server reads no files and fetches no URLs", param="image_data")
    try:
        return await ctx.run(mm.prepare, MultimodalPrompt(prompt, images))
    except ValueError as e:
        raise RequestError(str(e), param="image_data") from None


def _finished_meta(result: Any, decode, params: SamplingParams, first: Optional[int], prompt: Any) -> dict:
    """/generate's ``meta_info`` of a finished ``result`` of ``prompt`` with ``params``:
    ``meta_info``, with the finish reason's message as a client of the server reads it
    (``served_message``: "aborted by /abort_request", not the in-process API's Engine.abort;
    "matched its regex", not "regex / JSON schema", for a request that sent a regex) and
    [issue 10] images (``_with_image_meta``)."""
    meta = meta_info(result, decode, params.top_logprobs_num, first)
    if result.finish_reason.message is not None:
        meta["finish_reason"]["message"] = served_message(result.finish_reason, params.constraint)
    return _with_image_meta(meta, prompt)


def _with_image_meta(meta: dict, prompt: Any) -> dict:
    """``meta`` (a finished request's meta_info) with [issue 10] ``images`` when ``prompt`` held
    images: per image in prompt order ``{"tokens": its placeholder positions, "cached_tokens":
    those inside the cached prefix, "hash": its pixel hash}`` (``cached_tokens == tokens``: its
    prefill and vision encoding were skipped). Clients show image reuse from it."""
    mm = getattr(prompt, "mm_inputs", None)
    if mm is not None and mm.images:
        cached = int(meta.get("cached_tokens", 0))
        meta["images"] = [{"tokens": s.length, "cached_tokens": min(max(cached - s.offset, 0), s.length),
                           "hash": s.hash} for s in mm.images]
    return meta


async def _with_cached_chars(ctx: ServerContext, meta: dict, text: Any, prompt: Any) -> None:
    """Add ``cached_chars`` (an lmnb extension; SGLang has no such key) to a text prompt's finished
    ``meta``: the characters of ``text`` its ``cached_tokens`` cover (``covered_chars``), so a
    client shades the cached span of its program text without a tokenizer of its own. Not for
    prompts of token ids or with images (their text is not the client's)."""
    if isinstance(text, str) and getattr(prompt, "mm_inputs", None) is None:
        from lmnb_engine.tokenizer import covered_chars

        meta["cached_chars"] = await ctx.run(covered_chars, ctx.engine, text, int(meta.get("cached_tokens", 0)))


async def _stream_generate(ctx: ServerContext, handles: list, params: list, decode,
                           firsts: list, prompts: list, prompt_texts: list) -> AsyncIterator[str]:
    """SSE events of /generate: one per new text, each with its sample's cumulative text (SGLang's
    form; only the new text with ``--incremental-streaming-output``) and ``index``. The prompts of
    a batch stream interleaved, as they generate; ``EventStream`` aborts them all if it ends early."""
    bases = list(itertools.accumulate((h.n for h in handles), initial=0))  # index of each prompt's first sample
    chunks = [StreamChunks(h.rid, decode, p.top_logprobs_num, ctx.incremental_streaming_output)
              for h, p in zip(handles, params)]
    try:
        async for k, ev in ctx.events(handles):
            chunks[k].add(ev)
            if ev.finished and ev.result is not None:  # (its meta_info decodes every logprob's token)
                meta = await ctx.run(_finished_meta, ev.result, decode, params[k], firsts[k], prompts[k])
                await _with_cached_chars(ctx, meta, prompt_texts[k], prompts[k])
            elif ev.text_delta:
                meta = None  # (the partial meta_info)
            else:
                continue
            yield sse(chunks[k].chunk(ev, meta, index=bases[k] + ev.index))
    except Exception as e:  # noqa: BLE001 - report in-stream; the status line is already sent
        logger.exception("stream failed")
        yield sse(error_body(f"{type(e).__name__}: {e}", 500))
    yield SSE_DONE


def model_info_dict(ctx: ServerContext) -> dict:
    """``/get_model_info``: SGLang's keys (``model_path``, ``tokenizer_path``, ``is_generation``)
    plus what a client needs to build prompts exactly as the model expects: the Jinja
    ``chat_template``, the special tokens it uses, whether encoding text adds BOS itself, and
    [issue 10] ``image_token`` (the placeholder of one image; None for a text-only model)."""
    engine = ctx.engine
    tok = engine.tokenizer
    info = dict(engine.model_info())
    bos_id = getattr(tok, "bos_token_id", None)
    probe = engine.encode("a")
    info.update(
        model_path=engine.model_path,
        tokenizer_path=engine.model_path,
        is_generation=True,
        served_model_name=ctx.model_name,
        chat_template=engine.chat_template,
        encode_adds_bos=bos_id is not None and bool(probe) and probe[0] == bos_id,
        bos_token_id=bos_id,
        image_token=ctx.multimodal.image_token if ctx.multimodal is not None else None,
    )
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tok, key, None)
        info[key] = value if isinstance(value, str) else None
    return info
