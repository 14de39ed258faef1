"""``Engine``: the in-process inference runtime (SGLang's ``Engine`` / ``Runtime`` shape).

Loads a model, starts the scheduler thread and offers blocking (``generate``, ``score``),
streaming (``stream``) and non-blocking (``submit`` → ``RequestHandle``) calls, plus the cache's
observability (``cache_stats``, ``tree_snapshot``) and control (``flush_cache``, ``pin_prefix``).
All methods are thread-safe; the scheduler state is only touched on its own thread.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import random
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Callable, Optional, Sequence, Union

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.chat_messages import TEMPLATE_REJECTED, message_dicts, template_kwargs, text_message
from lmnb_engine.cli_options import option_error
from lmnb_engine.later_interrupts import LaterInterruptsHeld
from lmnb_engine.model_runner import ModelRunner
from lmnb_engine.multimodal.inputs import MultimodalPrompt, MultimodalTokens, as_multimodal_prompt, is_multimodal_prompt
from lmnb_engine.outputs import (
    ABORT_INTERRUPTED, ABORT_REQUESTED, FinishReason, GenerateResult, StreamEvent, rid_in_use,
)
from lmnb_engine.params import (SamplingParams, SamplingParamsError, both_fix, does_not_fit, outside_vocabulary,
                                past_context_refusal, python_value, shorten_fix, shown_number)
from lmnb_engine.prefix_cache import TreeNodeView
from lmnb_engine.request import Req, kv_to_finish
from lmnb_engine.sampler import min_new_tokens_conflict
from lmnb_engine.schedule_policy import POLICIES
from lmnb_engine.scheduler import Scheduler, SchedulerConfig
from lmnb_engine.stop_matcher import StopRegexes
from lmnb_engine.tokenizer import encode_text, text_too_long, without_added_bos
from lmnb_engine.waits import future_result, sliced_wait

# [issue 10] a MultimodalPrompt (or {"text": ..., "images": [...]}) carries images for LLaVA models
Prompt = Union[str, Sequence[int], MultimodalPrompt, dict]

DEFAULT_CHUNKED_PREFILL = {"cpu": 2048, "cuda": 8192}
_PREVIEW_TOKENS = 24
_PREVIEW_CHARS = 60
logger = logging.getLogger(__name__)


def _stop(scheduler: Scheduler, tp_group: Any) -> None:
    """Stop the scheduler thread, then (tensor parallelism) release the worker ranks: no forward
    may be in flight when rank 0 tells them to stop. On the scheduler thread itself (the garbage
    collector finalizing a dropped engine there, maybe in the middle of a step) the loop releases
    them once it has ended: released at once, the step's forward failed on the exited ranks."""
    if tp_group is not None and scheduler.on_loop_thread:
        scheduler.on_exit(tp_group.shutdown)
        scheduler.stop()
        return
    try:
        scheduler.stop()
    finally:
        if tp_group is not None:
            tp_group.shutdown()


def _refuse_wait_on_scheduler(scheduler: Scheduler, what: str, fix: str) -> None:
    """Raise ``RuntimeError`` on the scheduler thread (a ``subscribe`` listener calling
    ``Engine.generate``, or waiting on a handle): ``what`` would be waited for on the thread that
    computes it, forever. The message names ``what`` as the caller knows it, and the ``fix``."""
    if scheduler.on_loop_thread:
        raise RuntimeError(f"{what} cannot be waited for on the engine's scheduler thread (in a subscribe "
                           f"listener?): that thread computes it, so the wait would never end; {fix}")


class _Subscription:
    """One ``RequestHandle.subscribe`` listener. While its subscriber replays the events so far,
    new events wait in ``pending`` (the subscriber delivers them next); after that the scheduler
    thread delivers each event itself."""

    def __init__(self, listener: Callable[[StreamEvent], None]) -> None:
        self.listener = listener
        self.replaying = True
        self.pending: list[StreamEvent] = []


class RequestHandle:
    """A submitted request (all ``n`` samples). Thread-safe; events are kept, so ``events()`` can
    be iterated by several consumers and ``result()`` called at any time. Their waits are sliced
    (``lmnb_engine.waits``): a Ctrl-C stops them at once, even one that landed as the wait began.

    Attributes:
        rid: request id (``Engine.abort(rid)`` ends it).
        n: number of samples.
    """

    def __init__(self, engine: "Engine", rid: str, n: int) -> None:
        self.rid = rid
        self.n = n
        self._engine = engine
        self._events: list[StreamEvent] = []
        self._results: dict[int, GenerateResult] = {}
        self._cond = threading.Condition()
        self._subs: list[_Subscription] = []
        self._reqs: list[Req] = []  # its scheduler requests (Engine._make_reqs sets them)
        self._ended: Future = Future()  # done with the last event: ends submit's wait for a compile (an abort)

    def _put(self, event: StreamEvent) -> None:  # scheduler thread
        with self._cond:
            self._events.append(event)
            if event.finished and event.result is not None:
                self._results[event.index] = event.result
            self._cond.notify_all()
            direct = []
            for sub in self._subs:
                if sub.replaying:  # its subscriber delivers it after the events so far
                    sub.pending.append(event)
                else:
                    direct.append(sub)
            if self.done:  # (the last event: let go of the listeners, and what they hold)
                self._subs.clear()
                if not self._ended.done():
                    self._ended.set_result(None)
        # Outside the lock: a slow listener must not hold up readers (result(timeout) waited for it
        # past its timeout). One thread at a time calls _put (the scheduler's; once it has stopped,
        # Scheduler.answer_unqueued's), so each listener still hears the events in order.
        for sub in direct:
            try:
                sub.listener(event)
            except BaseException:  # noqa: BLE001 - a consumer gone (its event loop closed) must not stop the
                # engine, nor must a BaseException (asyncio's CancelledError, SystemExit) end its thread
                logger.exception("a listener of request %s failed; it hears no more events", self.rid)
                self._unsubscribe(sub)

    def _unsubscribe(self, sub: _Subscription) -> None:
        with self._cond:
            if sub in self._subs:
                self._subs.remove(sub)

    def subscribe(self, listener: Callable[[StreamEvent], None]) -> None:
        """Call ``listener(event)`` with each ``StreamEvent``, in order and each once: the events so
        far, and those that come meanwhile, here on the caller's thread before ``subscribe``
        returns; the later ones on the scheduler thread as they come (but for one case: a listener's
        submit whose grammar was still compiling when the engine shut down ends with its abort on
        that compile's own thread, the scheduler's being gone). No lock is held while the
        listener runs here, so it may wait (for the request's result, say) and the request goes on.

        On the scheduler thread the listener must not block (an asyncio consumer hands the event to
        its loop with ``call_soon_threadsafe``): a wait there holds up every request, and waiting
        for a request raises ``RuntimeError`` (the thread it would wait on is its own). Waiting so
        takes no thread, where ``events()`` holds one: a server streams any number of requests on
        its event loop. A listener that raises on the scheduler thread hears no more events
        (logged); one that raises here hears no more either, and ``subscribe`` raises its error."""
        sub = _Subscription(listener)
        with self._cond:
            batch = list(self._events)
            if not self.done:
                self._subs.append(sub)
        while True:
            try:
                for event in batch:
                    listener(event)
            except BaseException:
                self._unsubscribe(sub)
                raise
            with self._cond:  # what came while the batch ran; none left: the scheduler delivers from now
                batch, sub.pending = sub.pending, []
                if not batch:
                    sub.replaying = False
                    return

    @property
    def done(self) -> bool:
        """True once every sample has finished."""
        return len(self._results) == self.n

    def events(self, timeout: Optional[float] = None) -> Iterator[StreamEvent]:
        """An iterator over the request's ``StreamEvent``s in order until every sample finished.

        Raises ``TimeoutError`` if no event arrives within ``timeout`` seconds (None, or ``math.inf``:
        wait; 0 or less: no wait, so the events already there, then ``TimeoutError`` unless every
        sample finished, as ``concurrent.futures.as_completed`` does), and at once ``TypeError`` /
        ``ValueError`` for a timeout that is not a number of seconds."""
        return self._iter_events(_check_timeout(timeout))

    def _iter_events(self, timeout: Optional[float]) -> Iterator[StreamEvent]:
        """``events``' generator, once its timeout is checked."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events):
                    if self.done:
                        return
                    self._refuse_waiting_on_the_scheduler("the events")
                    if not sliced_wait(lambda s: self._cond.wait_for(lambda: i < len(self._events), s), timeout):
                        raise TimeoutError(_timed_out(f"no event for request {self.rid}", "the events there are",
                                                      timeout))
                event = self._events[i]
            i += 1
            yield event

    def result(self, timeout: Optional[float] = None) -> Union[GenerateResult, list[GenerateResult]]:
        """Wait for the end; a ``GenerateResult``, or a list ordered by sample index when n > 1.

        Raises ``TimeoutError`` after ``timeout`` seconds (None, or ``math.inf``: wait; 0 or less:
        no wait, so the result of a finished request, else ``TimeoutError`` at once, whose message
        says no wait was made, as ``concurrent.futures.Future.result`` does: a handle is a future's
        peer, not a queue's, whose ``get`` refuses a negative timeout with ``ValueError``; a wait
        with a computed time left may find it spent), and at once ``TypeError`` /
        ``ValueError`` for a timeout that is not a number of seconds."""
        timeout = _check_timeout(timeout)
        with self._cond:
            if not self.done:
                self._refuse_waiting_on_the_scheduler("the result")
            if not sliced_wait(lambda s: self._cond.wait_for(lambda: self.done, s), timeout):
                raise TimeoutError(_timed_out(f"request {self.rid} did not finish", "a finished request's result",
                                              timeout))
        out = [self._results[i] for i in range(self.n)]
        return out[0] if self.n == 1 else out

    def _refuse_waiting_on_the_scheduler(self, what: str) -> None:
        """Raise ``RuntimeError`` on the scheduler thread: waiting for ``what`` there (a listener
        waiting on this handle) would never end."""
        _refuse_wait_on_scheduler(self._engine.scheduler, f"{what} of request {self.rid}",
                                  "wait on another thread, or take the events in a listener (subscribe)")

    def abort(self) -> bool:
        """Abort the request (``Engine.abort``); True if it was still running or waiting.

        A finished request has nothing to abort: False, without asking the engine (which may be
        shut down by then, and would raise ``RuntimeError``). So is one that the engine's shutdown
        ends while this abort waits behind it (the shutdown fails the queued abort: it raised that
        ``RuntimeError``, which ``lmnb serve`` logged when a response that ended aborted its other
        requests as the server stopped)."""
        if self.done:
            return False
        try:
            return self._engine.abort(self.rid)
        except RuntimeError as e:
            scheduler = self._engine.scheduler
            # Only the shutdown's own error: another, such as the abort's clean-up failing (after
            # which a failed recovery may stop the engine), is the caller's to hear.
            if scheduler.alive or str(e) != str(scheduler.shut_down_error()):
                raise
            return False  # (the shutdown aborted the request: every request ends with it)


def _check_timeout(timeout: Any) -> Optional[float]:
    """``timeout`` as a wait of Python's threading takes it: None (no limit) for None and for a
    number of seconds past ``threading.TIMEOUT_MAX`` (``math.inf`` included), which that wait
    refused deep inside with ``OverflowError`` ("timestamp out of range for platform time_t").

    Raises:
        TypeError: a ``timeout`` that is neither None nor a number of seconds (a string: Python's
            threading code failed on it deep inside).
        ValueError: NaN, with which that code waited in a busy loop that never ended.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout={timeout!r} is not a number of seconds; give one (e.g. timeout=5.0), "
                        "or None to wait for the end")
    if math.isnan(timeout):
        raise ValueError("timeout=nan is not a number of seconds; give one (e.g. timeout=5.0), or None to wait "
                         "for the end")
    return None if timeout > threading.TIMEOUT_MAX else timeout


def _timed_out(what: str, no_wait_gives: str, timeout: float) -> str:
    """A ``TimeoutError``'s message: ``what`` did not come within ``timeout`` seconds. A timeout of
    0 or less waits not at all (as ``concurrent.futures`` takes it), and is not written as a wait
    ("within -1 s"): the message says it gives only ``no_wait_gives``, and how to wait."""
    if timeout > 0:
        return f"{what} within {timeout} s"
    return (f"{what} yet, and timeout={timeout!r} does not wait (0 or less gives only {no_wait_gives}); give a "
            "positive number of seconds to wait, or None to wait for the end")


class _EventStream:
    """``Engine.stream``'s iterator over a request's events. Closing it, dropping it or an
    exception while it waits aborts the request unless it has ended, whether or not iteration has
    begun (a generator's clean-up runs only once it has started); an interrupt (Ctrl-C) ends it
    with ``outputs.ABORT_INTERRUPTED``, as ``generate``'s."""

    def __init__(self, handle: RequestHandle) -> None:
        self._handle = handle
        self._events = handle.events()

    def __iter__(self) -> "_EventStream":
        return self

    def __next__(self) -> StreamEvent:
        with LaterInterruptsHeld() as hold:  # (a second Ctrl-C waits for the first one's end to be posted)
            try:
                return next(self._events)
            except StopIteration:
                raise
            except KeyboardInterrupt:  # (ended as generate's wait ends its requests: no caller called abort)
                self._handle._engine._withdraw([self._handle], posted=True, hold=hold)
                raise
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Abort the request unless every sample has finished (``RequestHandle.abort``; on the
        scheduler thread, the garbage collector finalizing a dropped stream there, the abort is
        queued for the next pause between steps, see ``Engine.abort``)."""
        self._handle.abort()

    __del__ = close


def _is_token_id(t: Any) -> bool:
    """An integer (Python's or numpy's, or a 0-d integer tensor: an item of ``list(tensor)``) that
    is not a bool."""
    if getattr(t, "ndim", None) == 0 and hasattr(t, "item") and not isinstance(t, numbers.Number):
        t = t.item()  # (a torch scalar; numpy's are numbers.Integral already)
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def is_prompt_batch(prompt: Any) -> bool:
    """Whether ``generate``'s ``prompt`` is a batch of prompts: a non-empty list or tuple whose
    first item is not a number. A list that starts with a number (an int, a float, a bool, numpy's
    scalars too) is one prompt of token ids, since a batch's items are prompts, never numbers; so a
    bad item is named in its place ("item 1 is 6.0"), not read as a batch of number prompts."""
    if not isinstance(prompt, (list, tuple)) or not prompt:
        return False
    first = prompt[0]
    # numpy's bool_ is no numbers.Number; like every numpy scalar (its str_ too: a text) it has ndim 0
    return isinstance(first, str) or not (isinstance(first, numbers.Number) or getattr(first, "ndim", None) == 0)


def _id_items(prompt: Any) -> Optional[Sequence[Any]]:
    """The items of a prompt given as a sequence of token ids: a list or tuple, a 1-D array
    (numpy's or torch's, by its ``tolist``), a range or an iterator; None for anything else (a
    text, bytes, a set, a dict, a number, an array of another rank), for the caller to refuse.
    Bytes and sets are not read as ids: their items are characters' codes, or in no order."""
    if isinstance(prompt, (list, tuple)):
        return prompt
    if hasattr(prompt, "tolist") and getattr(prompt, "ndim", None) == 1:
        return prompt.tolist()
    if isinstance(prompt, (range, Iterator)):
        return list(prompt)
    return None


def _token_id_list(items: Sequence[Any], what: str = "a prompt is a string or a list of token ids (ints)") -> list[int]:
    """``items`` as a list of Python ints: Python's or numpy's integers, not bools.

    Raises:
        TypeError: ``what`` the caller takes, and the first item that is no token id and its place.
    """
    if all(type(t) is int for t in items):  # plain ints, by exact type, before the slow ABC test below
        return list(items)
    for i, t in enumerate(items):
        if not _is_token_id(t):
            raise TypeError(f"{what}; item {i} is {t!r}")
    return [int(t) for t in items]


# The largest limit setrlimit takes (a C long long): the grammar compiler's address space is set so.
_MAX_RLIMIT = 2**63 - 1


def _check_option_types(ints: dict, flags: dict, mem_fraction: Any) -> None:
    """Refuse an ``Engine`` option of the wrong type before the model loads (ranges are checked
    where each option is used). A string such as ``"no"`` would otherwise pass as a true flag.

    Raises:
        TypeError: naming the option, the value and the type it needs.
    """
    for name, value in ints.items():
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
            raise TypeError(f"Engine({name}={value!r}): {name} must be an int")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"Engine({name}={value!r}): {name} must be True or False")
    if mem_fraction is not None and (not isinstance(mem_fraction, (int, float)) or isinstance(mem_fraction, bool)):
        raise TypeError(f"Engine(mem_fraction={mem_fraction!r}): mem_fraction must be a number in (0, 1]")


def _past_context_error(said: str, max_new_tokens: Any, context_len: int, prompt_len: int) -> ValueError:
    """The refusal of a prompt of ``prompt_len`` tokens (or at least so many, counted without
    encoding it) past the context (``params.past_context_refusal``), whose ``reason`` is
    ``DOES_NOT_FIT`` where its fix names ``max_new_tokens``: a gen that took its ``max_tokens``
    from the run's defaults is then told so, as where a prompt fits but not beside them."""
    message, reason = past_context_refusal(said, max_new_tokens, context_len, prompt_len=prompt_len)
    error = ValueError(message)
    return does_not_fit(error) if reason else error


def _lower_max_new_tokens(most: int, params: SamplingParams) -> str:
    """The fix "lower max_new_tokens to at most ``most``" of a request that does not fit, and
    its ``min_new_tokens`` too where that is more (a max_new_tokens below it is refused), as the
    scheduler's abort says it (``Scheduler._fewer_new_tokens``)."""
    both = " and min_new_tokens" if params.min_new_tokens > most else ""
    return f"lower max_new_tokens{both} to at most {most}"


def _check_abort_rid_type(rid: Any) -> None:
    """``TypeError`` for an abort's ``rid`` that is no string (a ``RequestHandle`` passed for its
    rid found nothing, and the request ran on), naming the fix for a handle."""
    if not isinstance(rid, str):
        fix = "; call handle.abort(), or abort(handle.rid)" if isinstance(rid, RequestHandle) else ""
        raise TypeError(f"abort takes a request's rid, a string; got {type(rid).__name__}{fix}")


class Engine:
    """An inference engine with RadixAttention, continuous batching and exact outputs.

    Args:
        model: HF checkpoint directory or hub id (None or "demo" = the bundled demo model); a shape preset
            name with ``random_weights=True`` (see ``lmnb_engine.model_loader.load_model``).
        device, dtype: default cuda/bfloat16 when available, else cpu/float32.
        max_total_tokens: KV pool size in tokens (None = from ``mem_fraction``).
        random_weights, seed: seeded random weights; ``seed`` also seeds unseeded sampling.
        schedule_policy: "lpm" (longest prefix match, default), "fcfs" or "dfs-weight" (paper §3).
        disable_radix_cache: no prefix reuse across requests (for comparisons).
        chunked_prefill_size: new tokens per step (default 2048 on CPU, 8192 on CUDA).
        max_running_requests: concurrent requests (default 64 on CPU, 256 on CUDA; at most
            ``max_total_tokens``).
        mem_fraction: share of free memory for the KV pool when ``max_total_tokens`` is None.
        mixed_batching: run decode rows together with new prefills in one forward.
        attention_backend: an ``AttentionBackend`` or a name: "auto" (default: on CUDA, flash-attn
            for extend plus Triton for decode when flash-attn is installed, else Triton when
            importable; torch otherwise), "torch", "triton" or "flash_attn".
        disable_jump_forward: decode constrained output one token per pass (the compressed FSM's
            forced strings are then not drafted; output is the same either way, paper §4).
        cuda_graph_max_bs: decode batches up to this size replay captured CUDA graphs (None = on
            for CUDA with the Triton backend, up to 256; 0 = off; at most ``max_running_requests``,
            the largest decode batch). Not with ``tp_size > 1``.
        disable_overlap_schedule: run each decode step only once the previous step's tokens are
            on the host (by default runs of decode steps overlap: the device computes step n+1
            while the host processes step n, SGLang's overlap scheduler; output is the same).
        tp_size: tensor parallelism over this many GPUs of the machine (``cuda:0`` ..), or CPU
            processes with ``device="cpu"``: worker processes hold the other shards
            (``lmnb_engine.distributed.launch``); 1 = one device, no workers.
        grammar_compile_timeout_s: seconds one regex / JSON-schema automaton may take to build
            before its child process is killed (None = 60).
        grammar_compile_memory_bytes: address space of that child process (None = 8 GiB; 0 = no
            limit).
    Raises:
        FileNotFoundError / ValueError: from model loading (unknown path, unsupported
        architecture, ...) or a bad setting; the message names it.
        RuntimeError: a tensor-parallel worker failed to start (the message names the rank).
    """

    def __init__(
        self,
        model: Optional[str] = None,
        device: Optional[str] = None,
        dtype: Optional[str] = None,
        max_total_tokens: Optional[int] = None,
        random_weights: bool = False,
        seed: int = 0,
        schedule_policy: str = "lpm",
        disable_radix_cache: bool = False,
        chunked_prefill_size: Optional[int] = None,
        max_running_requests: Optional[int] = None,
        mem_fraction: Optional[float] = None,
        mixed_batching: bool = False,
        attention_backend: Optional[Union[AttentionBackend, str]] = None,
        disable_jump_forward: bool = False,
        cuda_graph_max_bs: Optional[int] = None,
        disable_overlap_schedule: bool = False,
        tp_size: int = 1,
        grammar_compile_timeout_s: Optional[float] = None,
        grammar_compile_memory_bytes: Optional[int] = None,
    ) -> None:
        from lmnb_engine.model_loader import load_model

        _check_option_types(
            ints=dict(max_total_tokens=max_total_tokens, chunked_prefill_size=chunked_prefill_size,
                      max_running_requests=max_running_requests, cuda_graph_max_bs=cuda_graph_max_bs, seed=seed,
                      grammar_compile_memory_bytes=grammar_compile_memory_bytes),
            flags=dict(random_weights=random_weights, disable_radix_cache=disable_radix_cache,
                       mixed_batching=mixed_batching, disable_jump_forward=disable_jump_forward,
                       disable_overlap_schedule=disable_overlap_schedule),
            mem_fraction=mem_fraction,
        )
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
            raise ValueError(f"tp_size={tp_size!r} must be an int >= 1 (the number of GPUs to shard over)")
        if schedule_policy not in POLICIES:  # before loading (and starting tensor-parallel workers)
            raise ValueError(f"unknown schedule_policy {schedule_policy!r}; choose one of {', '.join(POLICIES)}")
        if chunked_prefill_size is not None and chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size={chunked_prefill_size} must be >= 1 (None: the default)")
        if cuda_graph_max_bs is not None and cuda_graph_max_bs < 0:
            raise ValueError(f"cuda_graph_max_bs={cuda_graph_max_bs} must be >= 0 (0 = no CUDA graphs, None: the default)")
        t = grammar_compile_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t < float("inf")):
            raise ValueError(f"grammar_compile_timeout_s={shown_number(t)} must be a number of seconds > 0 (or None for 60)")
        if t is not None and t > threading.TIMEOUT_MAX:  # (every compile's wait failed: "timestamp out of range")
            raise ValueError(f"grammar_compile_timeout_s={shown_number(t)} is longer than this platform's waits take "
                             f"(at most {threading.TIMEOUT_MAX:.0f} s, threading.TIMEOUT_MAX); give at most that")
        m = grammar_compile_memory_bytes
        if m is not None and m < 0:
            raise ValueError(f"grammar_compile_memory_bytes={shown_number(m)} must be >= 0 (0 = no limit, None = 8 GiB)")
        if m is not None and m > _MAX_RLIMIT:  # (each compile's child failed in setrlimit: "int too large")
            raise ValueError(f"grammar_compile_memory_bytes={shown_number(m)} is more than an address-space limit can "
                             f"be (at most {_MAX_RLIMIT} bytes, 2**63 - 1); give less, or 0 for no limit")
        self._grammar_limits: dict = {}  # GrammarBackend arguments; its defaults where not given
        if t is not None:
            self._grammar_limits["compile_timeout_s"] = float(t)
        if grammar_compile_memory_bytes is not None:
            self._grammar_limits["compile_memory_bytes"] = grammar_compile_memory_bytes or None  # 0: no limit
        if tp_size > 1 and cuda_graph_max_bs:
            raise ValueError("CUDA graphs are not captured under tensor parallelism; leave cuda_graph_max_bs unset")
        tp = None
        if tp_size > 1:  # [issue 9] this process is rank 0 and loads only its shard
            from lmnb_engine.distributed.layers import TPGroup

            tp = TPGroup(0, tp_size)
        self.loaded = load_model(model, device=device, dtype=dtype, random_weights=random_weights, seed=seed, tp=tp)
        self.tp_size = tp_size
        self._tp_group: Any = None
        if tp_size == 1:
            self.runner = ModelRunner(
                self.loaded, max_total_tokens, max_running_requests, mem_fraction, attention_backend, cuda_graph_max_bs
            )
        else:  # [issue 9] rank 0 here, ranks 1.. in worker processes
            from lmnb_engine.distributed.launch import start_tensor_parallel

            self._tp_group = start_tensor_parallel(
                self.loaded, tp_size, model, random_weights, seed,
                dict(max_total_tokens=max_total_tokens, max_running_requests=max_running_requests,
                     mem_fraction=mem_fraction, attention_backend=attention_backend),
            )
            self.runner = self._tp_group.runner
        kind = "cuda" if self.runner.device.type == "cuda" else "cpu"
        config = SchedulerConfig(
            schedule_policy=schedule_policy,
            chunked_prefill_size=chunked_prefill_size or DEFAULT_CHUNKED_PREFILL[kind],
            max_running_requests=self.runner.max_running_requests,
            mixed_batching=mixed_batching,
            overlap_schedule=not disable_overlap_schedule,
        )
        try:
            self.scheduler = Scheduler(
                self.runner,
                self.loaded.tokenizer,
                self.loaded.eos_token_ids,
                self.context_len,
                config,
                disable_radix_cache=disable_radix_cache,
            )
        except BaseException:  # the workers and the process group would outlive this engine
            if self._tp_group is not None:
                self._tp_group.shutdown()
            raise
        self.disable_jump_forward = disable_jump_forward
        self._mm_processor: Any = None  # [issue 10] lmnb_engine.multimodal.processor, made on first use
        self._grammar_backend: Any = None  # lmnb_engine.constrained.GrammarBackend, made on first use
        self._rng = random.Random(seed)
        self._handles: dict[str, RequestHandle] = {}  # by rid: running ones, and finished ones not yet dropped
        self._handles_kept = 0  # len(_handles) after the last drop of the finished ones (_register)
        self._lock = threading.Lock()
        self.scheduler.start()
        self._finalizer = weakref.finalize(self, _stop, self.scheduler, self._tp_group)

    # --- model facts ---------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The checkpoint's Hugging Face tokenizer."""
        return self.loaded.tokenizer

    @property
    def chat_template(self) -> Optional[str]:
        """The checkpoint's Jinja chat template; None when it has none."""
        return self.loaded.chat_template

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The token ids that end a generation (unless ``ignore_eos``)."""
        return self.loaded.eos_token_ids

    @property
    def context_len(self) -> int:
        """The model's context length: prompt plus output tokens of one request."""
        return self.loaded.config.context_len

    @property
    def model_path(self) -> Optional[str]:
        """The checkpoint directory or hub id; None for a model built in memory."""
        return str(self.loaded.path) if self.loaded.path is not None else None

    def model_info(self) -> dict:
        """Architecture, geometry, dtype, device, context length, KV pool size, and what runs
        the attention (``attention_backend``: "torch", "triton", or flash-attn's name with
        Triton; it follows a fallback from flash-attn to Triton)."""
        c = self.loaded.config
        return {
            "model_path": self.model_path,
            "architecture": c.architecture,
            "num_layers": c.num_layers,
            "num_q_heads": c.num_q_heads,
            "num_kv_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
            "context_len": c.context_len,
            "dtype": str(c.dtype).replace("torch.", ""),
            "device": str(c.device),
            "max_total_tokens": self.runner.max_total_tokens,
            "max_running_requests": self.runner.max_running_requests,
            "radix_cache": not self.scheduler.disable_radix_cache,
            "tp_size": self.tp_size,
            "attention_backend": self.runner.attn.name,
            "schedule_policy": self.scheduler.config.schedule_policy,
        }

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (the tokenizer's ``encode``; without its warning about a text longer
        than the model: submitting such a prompt fails with the engine's own message). Every text
        prompt is encoded here.

        Raises:
            TypeError: ``text`` is no string (the tokenizer's own error listed batch forms this takes not).
            ValueError: ``text`` holds a lone UTF-16 surrogate (named, with its position and the fix).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a text (a string), got {type(text).__name__}")
        return encode_text(self.tokenizer, text, add_special_tokens=add_special_tokens, verbose=False)

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids a text prompt runs as: ``encode(text)``, less the tokenizer's BOS where the
        text writes its own ("<s>..." on a tokenizer that adds one: ``apply_chat_template``'s output,
        a rendered template sent to /generate), which would be one too many. Every text prompt is
        read so, whether its ids are wanted before it is submitted (its prompt logprobs from token
        0, a select's scoring, ``/v1/completions``) or not: "<s>hi" was 3 tokens run alone and 4
        where its logprobs were asked, so a select scored it apart from a gen.

        A prompt with images reads its text so too (``multimodal.prepare``: ``without_added_bos``).

        Raises:
            as ``encode``."""
        return without_added_bos(self.tokenizer, text, self.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of token ``ids`` (a list of ints, or a 1-D numpy or torch array; the tokenizer's
        ``decode``).

        Raises:
            TypeError: ``ids`` is no sequence of token ids (a text, say), or an item is no int (named).
            ValueError: naming the ids outside the vocabulary (the tokenizer decoded one too large
                as "", and failed on a negative one with an ``OverflowError``).
        """
        items = _id_items(ids)
        if items is None:
            raise TypeError(f"decode takes token ids (a list of ints), got {type(ids).__name__}")
        ids = _token_id_list(items, "decode takes token ids (ints)")
        self._check_in_vocabulary(ids, "token ids")
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _window_note(self) -> str:
        """Why the context is shorter than the checkpoint's ``max_position_embeddings``, when a
        sliding window caps it (``model_config._context_len``), else ''."""
        hf = self.loaded.config.hf_config
        if self.context_len < int(getattr(hf, "max_position_embeddings", self.context_len)):
            return (f" (the checkpoint's sliding window: lmnb attends over the whole sequence, so it runs "
                    f"{self.context_len} of its {hf.max_position_embeddings} positions, where the two agree)")
        return ""

    def apply_chat_template(self, messages: list, add_generation_prompt: bool = True,
                            chat_template_kwargs: Optional[dict] = None, continue_final_message: bool = False) -> str:
        """Render chat ``messages`` ([{"role", "content"}]) with the model's chat template. A message
        may also be a pydantic model (the OpenAI SDK's ``ChatCompletionMessage``, a reply's
        ``choices[0].message``) or a dataclass with those fields (``chat_messages.message_dicts``).
        ``chat_template_kwargs``: extra variables for the template (vLLM's and SGLang's field of
        that name, e.g. Qwen3's ``{"enable_thinking": False}``, gpt-oss's ``reasoning_effort``),
        rendered as transformers' ``apply_chat_template(..., **chat_template_kwargs)`` renders them.
        ``continue_final_message``: the prompt ends inside the last message, after its content and
        before whatever the template writes to end the turn, so that the model continues it (a
        partial assistant reply, "prefill"); transformers' ``apply_chat_template(...,
        continue_final_message=True)`` renders it, and vLLM's and SGLang's chat field of that name
        asks for it. It needs ``add_generation_prompt=False``: a new turn's header cannot follow.

        Raises:
            ValueError: the checkpoint has no chat template, or ``messages`` is empty, or the template
                refused the conversation (its ``raise_exception``, e.g. an unknown role: "the chat
                template rejected the messages: ...", as the server says), or a message has no role
                or content, or
                a content other than a string or text parts (as the server refuses it:
                ``chat_messages.text_message``, which renders "developer" as "system" as the server does),
                or ``chat_template_kwargs`` sets a variable the render sets itself (``messages``,
                ``add_generation_prompt``...: ``chat_messages.template_kwargs``), or
                ``continue_final_message`` is set with ``add_generation_prompt`` or with a template
                that does not write the last message's content as it is (one that cuts or changes
                it), so that no prompt ends with it.
            TypeError: ``messages`` is not a list of messages (a string, one message), or a message
                is not one (``chat_messages.message_dicts``), or ``chat_template_kwargs`` is not a dict,
                or ``add_generation_prompt`` or ``continue_final_message`` is not True or False.
        """
        from jinja2 import TemplateError  # (transformers renders with jinja2)

        if not self.chat_template:
            raise ValueError(
                f"the model at {self.model_path} has no chat template; format the prompt yourself"
            )
        add_generation_prompt, continue_final_message = flags = (python_value(add_generation_prompt),
                                                                 python_value(continue_final_message))
        for name, flag in zip(("add_generation_prompt", "continue_final_message"), flags):
            if not isinstance(flag, bool):  # (a truthy "no" added the assistant's header)
                raise TypeError(f"{name}={flag!r} must be True or False")
        if add_generation_prompt and continue_final_message:  # (transformers refuses it too, from inside)
            raise ValueError("continue_final_message=True continues the last message, and add_generation_prompt=True "
                             "starts a new assistant turn after it: pass add_generation_prompt=False with it")
        extra = template_kwargs(chat_template_kwargs)
        # (rendered as the server renders them: text parts joined, not written as a Python list)
        messages = [text_message(i, m) for i, m in enumerate(message_dicts(messages))]
        if not messages:  # (transformers said so in its own words, from inside its render)
            raise ValueError('messages is empty: give at least one message, [{"role": "user", "content": "..."}]')
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message, **extra,
            )
        except TemplateError as e:  # the template's own checks, raised from inside jinja2's sandbox
            raise ValueError(f"{TEMPLATE_REJECTED}: {e}") from None
        except ValueError:
            if not continue_final_message:
                raise
            # transformers finds the content's end by a marker appended to it; a template that cuts or
            # changes the content (or reads no "content") loses it. Its message prints the whole prompt.
            raise ValueError(f"{TEMPLATE_REJECTED}: continue_final_message needs the prompt to end with the last "
                             "message's content, and this chat template does not write that content as it is; "
                             "format the prompt yourself") from None

    # --- requests ------------------------------------------------------------------------------
    def _to_ids(self, prompt: Prompt, max_new_tokens: Any = None) -> list[int]:
        """``prompt``'s token ids. A text certainly longer than the context is refused before it is
        encoded (``ValueError``), naming ``max_new_tokens`` too where that fits beside no prompt
        (``_past_context_error``; None: a call that samples nothing), as ``_check`` does once counted."""
        if isinstance(prompt, MultimodalTokens):  # [issue 10] prepared already (``multimodal.prepare``)
            return prompt
        if is_multimodal_prompt(prompt):  # [issue 10] ids + radix keys + pixels (MultimodalTokens)
            mm = as_multimodal_prompt(prompt)
            if mm.images or self.loaded.config.multimodal_hf_config is not None:
                return self.multimodal.prepare(mm)
            prompt = mm.text  # no images for a text-only model: a plain prompt (SGLang's image_data=[] too)
        if isinstance(prompt, str):
            too_long = text_too_long(prompt, self.tokenizer, self.context_len)
            if too_long:  # (by at least what its lower bound lacks: more, were it counted)
                said, at_least = too_long
                raise _past_context_error(f"{said}{self._window_note()}", max_new_tokens, self.context_len, at_least)
            ids = self.prompt_ids(prompt)
        elif (items := _id_items(prompt)) is not None:
            if is_prompt_batch(items):  # (submit, stream, score, pin_prefix: else "item 0 is 'the cat'")
                raise TypeError(f"one prompt is taken here (a string or a list of token ids), got a list of "
                                f"{len(items)} prompts; pass them one at a time (generate takes a list of prompts)")
            ids = _token_id_list(items)  # numpy integers too (a tokenizer's array, .tolist() or not)
        elif isinstance(prompt, dict):  # [issue 10] the form with images, its key misspelt ("image_data")
            raise ValueError(f"a prompt dict is a prompt with images, with the keys 'text' and 'images'; got "
                             f"{sorted(prompt)}")
        else:
            ndim = getattr(prompt, "ndim", None)
            shape = f"a {ndim}-d {type(prompt).__name__}" if isinstance(ndim, int) else type(prompt).__name__
            fix = "; for a batch, pass a list of prompts (list(array))" if ndim == 2 else ""
            raise TypeError(f"a prompt is a string or a list of token ids, got {shape}{fix}")
        if not ids:
            raise ValueError("empty prompt: give at least one token (a non-empty string or id list)")
        self._check_in_vocabulary(ids, "prompt token ids")
        if self.loaded.config.multimodal_hf_config is not None:  # [issue 10]
            self._check_no_placeholder(ids)
        return ids

    def _check_no_placeholder(self, ids: Sequence[int]) -> None:
        """[issue 10] A plain prompt (no images) for a vision-language model must not hold its image
        placeholder: the model would read the placeholder's own embedding as if it were an image.

        Raises:
            ValueError: naming how many placeholders there are and how to pass the images.
        """
        from lmnb_engine.multimodal.processor import placeholder_id, placeholders

        tid = placeholder_id(self.loaded.config.multimodal_hf_config)
        n = sum(1 for t in ids if t == tid)
        if n:
            token = self.tokenizer.convert_ids_to_tokens(tid)
            raise ValueError(
                f"the prompt has {placeholders(n, token)} but no images were given; pass one image per "
                f"{token} (a MultimodalPrompt, lmnb's image(), or /generate's image_data), or remove the "
                "placeholder from the text")

    def _check_bias_in_vocabulary(self, params: SamplingParams) -> None:
        """Raises ``SamplingParamsError`` (field ``logit_bias``) naming the ``logit_bias`` keys of
        validated ``params`` outside ``[0, vocab_size)``: no logit of the model is theirs to bias."""
        vocab = self.loaded.config.vocab_size
        bad, shown = outside_vocabulary(params.logit_bias or (), vocab)
        if bad:
            ids = shown + (", ..." if len(bad) > 5 else "")
            raise SamplingParamsError(
                f"SamplingParams.logit_bias is invalid: token id{'s' * (len(bad) > 1)} {ids} "
                f"{'are' if len(bad) > 1 else 'is'} outside this model's vocabulary [0, {vocab}); remove "
                f"{'them' if len(bad) > 1 else 'it'}, or take the ids from this model's tokenizer", "logit_bias")

    def _check_in_vocabulary(self, ids: Sequence[int], what: str) -> None:
        """Raises ``ValueError`` naming the ids of ``ids`` outside ``[0, vocab_size)``."""
        vocab = self.loaded.config.vocab_size
        bad, shown = outside_vocabulary(ids, vocab)
        if bad:
            raise ValueError(f"{what} [{shown}] are outside the vocabulary [0, {vocab})")

    @property
    def multimodal(self) -> Any:
        """[issue 10] The ``lmnb_engine.multimodal.processor.MultimodalProcessor`` of this model
        (``image_token``, ``tokens_per_image``, ``prepare``), made on first use.

        Raises ``ValueError`` if the model cannot take images (a text-only model)."""
        with self._lock:
            if self._mm_processor is None:
                from lmnb_engine.multimodal.processor import MultimodalProcessor

                self._mm_processor = MultimodalProcessor(self.loaded)
            return self._mm_processor

    def _split_batch(self, prompt: Union[Prompt, Sequence[Prompt]], params: Any = None) -> tuple[list[list[int]], bool]:
        """(list of id lists, whether the caller passed a batch: ``is_prompt_batch``). A bad prompt
        of a batch is named by its place ("prompt 2 of the batch: ..."). ``params``: ``generate``'s,
        not yet checked, whose ``max_new_tokens`` a text too long to encode is refused beside."""
        def max_new_tokens(i: int) -> Any:  # (None for what _check refuses as no SamplingParams)
            p = SamplingParams() if params is None else params  # (None in a list is no default: refused)
            p = p[i] if isinstance(p, (list, tuple)) and i < len(p) else p
            return p.max_new_tokens if isinstance(p, SamplingParams) else None

        if not is_prompt_batch(prompt):
            if isinstance(prompt, (list, tuple)) and not prompt:
                # no item tells a batch from a list of ids: SGLang refuses it as empty input_ids too
                raise ValueError("empty prompt: an empty list is read as one prompt of no token ids; give at "
                                 "least one token id, or for a batch at least one prompt")
            return [self._to_ids(prompt, max_new_tokens(0))], False
        ids = []
        for i, p in enumerate(prompt):
            try:
                ids.append(self._to_ids(p, max_new_tokens(i)))
            except (TypeError, ValueError) as e:
                if type(e) not in (TypeError, ValueError):  # a subclass of its own (multimodal): as it is
                    raise
                raise type(e)(f"prompt {i} of the batch: {e}") from None
        return ids, True

    def _check(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse a bad request (``ValueError`` / ``TypeError`` naming it); all but the compiled
        grammar's checks (``_check_grammar``)."""
        if not isinstance(params, SamplingParams):
            # (None gets here only inside generate's list of params, where it is not read as the defaults)
            fix = ("write SamplingParams() for the defaults" if params is None else
                   "for a dict write SamplingParams(**d) (fields: max_new_tokens, temperature, top_p, stop, ...)")
            raise TypeError(f"params must be a lmnb_engine.SamplingParams, got {type(params).__name__}; {fix}")
        params.validate()
        # a stop token outside the vocabulary can never be sampled, so the stop would never happen
        self._check_in_vocabulary(params.stop_token_ids or (), "stop_token_ids")
        self._check_bias_in_vocabulary(params)
        n = len(ids)
        prompt = f"prompt of {n} token{'s' * (n != 1)}"
        # a prompt too long by itself is not fixed by fewer new tokens (a select's or a fork's
        # prefill asks for none), so the message then names the prompt, and max_new_tokens too
        # only where it fits beside no prompt
        if n > self.context_len:
            raise _past_context_error(f"{prompt} exceeds the model's context length of {self.context_len} "
                                      f"tokens{self._window_note()}", params.max_new_tokens, self.context_len, n)
        if n + params.max_new_tokens > self.context_len:
            # max_new_tokens the context's length or more fits beside no prompt: shortening it is no
            # fix, and the error is the field's (lmnb serve's param, as OpenAI's "max_tokens is too large");
            # but a prompt that fills the context leaves room for none: "at most 0" would be no fix either,
            # and neither alone is one (it said "shorten the prompt or lower max_new_tokens"). Else each fix
            # comes with its number (it gave none): a prompt that fills the context is shortened by
            # max_new_tokens' tokens, or by fewer beside a lower max_new_tokens (it said the first alone, as
            # if no lower one helped); one that leaves some room by what it lacks, or max_new_tokens lowered
            # to that room
            m, room = params.max_new_tokens, self.context_len - n
            lower = _lower_max_new_tokens(room, params)
            no_prompt_fits = m >= self.context_len
            alone = no_prompt_fits and room > 0
            over = m - room
            shorten = f"shorten the prompt by at least {shown_number(over)} token{'s' * (over != 1)}"
            fix = (lower if alone else
                   both_fix(self.context_len) if no_prompt_fits else
                   f"{shorten} or {lower}" if room > 0 else
                   shorten_fix(0, m))
            error = does_not_fit(ValueError(
                f"{prompt} + max_new_tokens={shown_number(m)} exceeds the model's "
                f"context length of {self.context_len} tokens{self._window_note()}; {fix}"))
            if alone:
                error.field = "max_new_tokens"  # (refused_field reads it; an attribute, kept by pickling)
            raise error
        # (option_error: max_total_tokens is the engine's option, which each front end names its own way,
        # or not at all: a server's client cannot size its KV pool; max_new_tokens is the request's field)
        # The fixes come with their numbers, as the context's (they gave none): the pool the request
        # needs, and what fits it. It holds the slots of the request once finished, as the scheduler
        # counts them, a slot per token but the last sampled (80 + 21 new tokens fit 100), so a
        # pool of P tokens holds a prompt and its new tokens as a context of P + 1 would (one new
        # token, or none, costs none), and a prompt of P + 1 or more is refused as one past it is.
        pool, m = self.runner.max_total_tokens, params.max_new_tokens
        slots = kv_to_finish(n, m)
        if slots > pool:
            grow = (f"raise {{}} to at least {slots}", "max_total_tokens", None)
            room = pool + 1 - n
            if room < 1:  # the prompt alone does not fit: shortening it is a fix, fewer new tokens only a help
                fix = shorten_fix(n - pool - 1, max(m, 1), alone=m <= pool)
                error = option_error(ValueError, f"{prompt} does not fit the KV pool of {pool} tokens", grow, (fix,))
                raise does_not_fit(error) if m > 1 else error  # (its fix names max_new_tokens, as past the context)
            # (m <= pool: the prompt shortened by what it lacks keeps a token at least)
            fix = (f"shorten the prompt by at least {slots - pool} token{'s' * (slots - pool != 1)} or " * (m <= pool)
                   + _lower_max_new_tokens(room, params))
            error = does_not_fit(option_error(
                ValueError, f"{prompt} + max_new_tokens={m} does not fit the KV pool of {pool} tokens", grow, (fix,)))
            if m > pool:
                error.field = "max_new_tokens"  # (lowering it is the request's one fix, as for the context)
            raise error
        if params.logprob_start_len > n:
            raise ValueError(f"logprob_start_len={shown_number(params.logprob_start_len)} is past the prompt's {n} "
                             f"tokens; give at most {n} (0: the logprobs of every prompt token; -1, the default: "
                             "none)")

    def _check_grammar(self, params: SamplingParams, abandoned: Optional[Future] = None) -> Any:
        """Compile (waiting) ``params``' grammar, if any, and refuse it as ``_grammar`` does, or if
        ``min_new_tokens`` bans its every first token; the compiled grammar (None: no constraint,
        or ``abandoned`` completed first, as ``_grammar``)."""
        grammar = self._grammar(params, abandoned)
        if grammar is not None and params.min_new_tokens:
            self._check_first_token_allowed(grammar, params)
        return grammar

    def _check_first_token_allowed(self, grammar: Any, params: SamplingParams) -> None:
        """Refuse a grammar whose every first token is one that ``min_new_tokens`` bans (a stop token
        id or EOS): no output could begin. It costs one mask, the initial state's; a conflict
        further on aborts the request when it is reached (``sampler.blocked_reason``), as does a
        grammar complete before ``min_new_tokens`` output tokens (``sampler.grammar_end_reason``).
        Its longest output is not checked here: in tokens, that takes every transition of the
        token-level automaton (which is built lazily, state by state, as requests reach them), not
        one mask; a grammar that can go on forever never meets it."""
        from lmnb_engine.constrained import RequestGrammar

        vocab = self.loaded.config.vocab_size
        allowed = RequestGrammar(grammar).allowed_token_mask(vocab)
        stops = [t for t in set(params.stop_token_ids or ()) - self.eos_token_ids if t < vocab]
        stop_ids = bool(allowed[stops].any())  # (then removing those stop ids frees them; else only EOS is allowed)
        allowed[stops + [t for t in self.eos_token_ids if t < vocab]] = False  # (a grammar request never ignores EOS)
        if not bool(allowed.any()):
            what = params.constraint
            raise SamplingParamsError(
                f"SamplingParams.min_new_tokens={params.min_new_tokens} conflicts with the {what}: at output token 1 "
                + min_new_tokens_conflict(f"the {what}", params.min_new_tokens, 0, stop_ids), "min_new_tokens")

    def _grammar(self, params: SamplingParams, abandoned: Optional[Future] = None) -> Any:
        """The compiled grammar of a regex / json_schema request (None if unconstrained, or if
        ``abandoned``, the request's ``RequestHandle._ended``, completes first: an abort meanwhile
        ends the wait at once, the compile going on for the cache alone).

        Compiles on the grammar backend's worker thread (cached per pattern and tokenizer) and
        waits here, on the caller's thread: the scheduler never waits for a compile.
        Raises ``GrammarError`` (a ``ValueError``) naming an unsupported regex feature or schema
        keyword, a pattern this vocabulary can never complete, or a compile that took longer
        than ``grammar_compile_timeout_s``; ``RuntimeError`` as every call does once the engine is
        shut down (its compiler stops with it)."""
        if params.constraint is None:
            return None
        from lmnb_engine.constrained import GrammarCompileStopped

        backend, regex = self._grammar_regex(params)
        try:
            return backend.wait(regex, source=params.regex, abandoned=abandoned)
        except GrammarCompileStopped as e:
            if e.by_shutdown and not self.scheduler.alive:
                raise self.scheduler.shut_down_error() from e
            raise

    def _grammar_regex(self, params: SamplingParams) -> tuple[Any, str]:
        """The ``GrammarBackend`` (made on first use) and the regex it compiles for ``params``'
        constraint; ``GrammarError`` for a constraint it cannot use (``GrammarBackend.to_regex``),
        ``RuntimeError`` once the engine is shut down."""
        from lmnb_engine.constrained import GrammarBackend

        with self._lock:
            if not self.scheduler.alive:  # no compiler for an engine that is gone (shutdown looks under this lock)
                raise self.scheduler.shut_down_error()
            if self._grammar_backend is None:
                self._grammar_backend = GrammarBackend(
                    self.tokenizer, self.eos_token_ids, vocab_size=self.loaded.config.vocab_size, **self._grammar_limits
                )
            backend = self._grammar_backend
        return backend, backend.to_regex(params.regex, params.json_schema, params.extra.get("whitespace_pattern"))

    def _make_reqs(
        self, ids: list[int], params: SamplingParams, rid: Optional[str] = None, grammar: Any = None
    ) -> tuple[RequestHandle, list[Req]]:
        """A handle and its ``n`` scheduler requests for one checked prompt, not yet queued nor
        registered: an interrupt (KeyboardInterrupt) in here or before the caller's ``try`` leaves
        nothing behind. The caller registers the handle (``_register``) as the first step of the
        ``try`` whose failure withdraws it (``_withdraw``). ``ValueError`` (``rid_in_use``) for a
        ``rid`` a running request holds, checked here so that a duplicate is refused before any
        work, and again as it is registered.

        The requests get their own copy of ``params``: the scheduler reads it at every step, so
        the caller's object, changed after ``submit`` returns (a loop reusing one
        ``SamplingParams``), must not change a running request or put unchecked values in it.
        ``grammar``: the compiled grammar of ``params``' constraint, or None, the caller then
        compiling it and adding it (``_attach_grammar``) before queueing the requests."""
        params = params.copy()
        if self._tp_group is not None:  # [issue 9] a dead worker rank: say so, queue nothing
            self._tp_group.check_alive()
        if params.regex is not None or params.json_schema is not None:  # EOS only where the text matches
            params = params.copy(ignore_eos=False)
        rid = rid or uuid.uuid4().hex
        handle = RequestHandle(self, rid, params.n)
        with self._lock:
            self._check_rid_free(rid)
            seeds = [
                params.seed + i if params.seed is not None else self._rng.randrange(2**62) for i in range(params.n)
            ]
        mm_key, mm_inputs = getattr(ids, "input_key", None), getattr(ids, "mm_inputs", None)  # [issue 10]
        stop_regexes = StopRegexes(params.stop_regexes)  # one per request: a search gone wrong stops every sample
        reqs = [
            Req(rid, i, ids, params, self.tokenizer, handle._put, seeds[i], input_key=mm_key, mm_inputs=mm_inputs,
                stop_regexes=stop_regexes)
            for i in range(params.n)
        ]
        if grammar is not None:
            self._attach_grammar(reqs, grammar)
        handle._reqs = reqs
        return handle, reqs

    def _register(self, handles: list[RequestHandle]) -> None:
        """Register ``handles`` (``_make_reqs``' own, their requests made) under their rids, so that
        ``abort(rid)`` finds them from now on, and can end their requests (``_abort_here``) while
        the caller has yet to queue them. ``ValueError`` (``rid_in_use``) if a running request
        took a rid meanwhile (another thread's submit): a caller then ``_unregister``s them all."""
        with self._lock:
            # The finished are dropped once the table has doubled since the last drop: dropping them
            # on every call read every handle each time, so a select of 10,000 choices (a request
            # each, all running) read 50 million in all. So the reads per call are O(1) amortized,
            # and at most half the table (or 64 handles) is finished ones kept for nothing.
            if len(self._handles) >= 2 * self._handles_kept:
                self._handles = {k: h for k, h in self._handles.items() if not h.done}
                self._handles_kept = max(len(self._handles), 64)
            for h in handles:
                self._check_rid_free(h.rid)
                self._handles[h.rid] = h

    def _unregister(self, handles: Iterable[RequestHandle]) -> None:
        """Forget ``handles`` whose requests were never queued (their submission failed on the way):
        nothing would ever end them, and their rids are free for a retry."""
        with self._lock:
            for h in handles:
                if self._handles.get(h.rid) is h:
                    del self._handles[h.rid]

    def _attach_grammar(self, reqs: list[Req], grammar: Any) -> None:
        """Give each of ``reqs`` (one prompt's samples) its state in the compiled ``grammar``."""
        from lmnb_engine.constrained import RequestGrammar

        p = reqs[0].params
        # A forced string skips the per-token stop checks, so stops decode token by token too.
        jump = not (self.disable_jump_forward or p.min_new_tokens or p.repetition_penalty != 1
                    or p.frequency_penalty or p.presence_penalty or p.stop_strings or p.stop_regex
                    or p.stop_token_ids)
        for r in reqs:
            r.grammar = RequestGrammar(grammar, jump_forward=jump, logprobs=p.return_logprob)

    def _compiling(self, params: SamplingParams) -> bool:
        """Whether this is the scheduler thread (a ``subscribe`` listener) and ``params``' grammar
        is still compiling (its compile started now if it had not). A constraint that cannot be
        used raises ``GrammarError`` here, as everywhere (``GrammarBackend.to_regex``)."""
        if not self.scheduler.on_loop_thread or params.constraint is None:
            return False
        backend, regex = self._grammar_regex(params)
        return not backend.submit(regex).done()

    def _submit_when_compiled(self, ids: list[int], params: SamplingParams, rid: Optional[str]) -> RequestHandle:
        """A listener's ``submit`` of a grammar still compiling: waiting for the compile there would
        hold the scheduler thread, and every request with it, for as long as it takes. The handle
        comes back now; a thread of its own waits for the compile and then queues the requests.
        A failure then (a pattern this vocabulary cannot complete, a compile over its limits, a
        first token ``min_new_tokens`` bans), which ``submit`` raises elsewhere, ends the request
        with an abort naming it (``field``: the constraint, or ``min_new_tokens``, where the
        request's settings caused it)."""
        handle, reqs = self._make_reqs(ids, params, rid)
        # (no interrupt to withdraw from: the scheduler's thread is never the main one, where they land)
        self._register([handle])
        threading.Thread(target=self._queue_when_compiled, args=(reqs,), name="lmnb-grammar-wait", daemon=True).start()
        return handle

    def _queue_when_compiled(self, reqs: list[Req]) -> None:
        """``_submit_when_compiled``'s thread: wait for the grammar, check it, queue ``reqs``."""
        from lmnb_engine.constrained import GrammarError

        params = reqs[0].params
        try:
            grammar = self._grammar(params)
            if params.min_new_tokens:
                self._check_first_token_allowed(grammar, params)
            self._attach_grammar(reqs, grammar)
        except Exception as e:  # noqa: BLE001 - what submit would have raised ends the request instead
            field = getattr(e, "field", None)
            if isinstance(e, GrammarError) and not getattr(e, "transient", False):
                field = params.constraint
            message = str(e) if isinstance(e, ValueError) else f"internal error: {type(e).__name__}: {e}"
            for r in reqs:
                r.to_abort = FinishReason("abort", message=message, field=field)
        try:
            self.scheduler.submit(reqs)
        except RuntimeError:  # shut down meanwhile (the engine's own stop ends the compile): answered here
            self.scheduler.answer_unqueued(reqs)

    def _refuse_waiting_here(self, what: str, fix: str) -> None:
        """A blocking call on the scheduler thread (a ``subscribe`` listener): ``RuntimeError``
        before anything is queued, naming the call (``_refuse_wait_on_scheduler``); once the engine
        is shut down (by that listener, say), the shutdown's error, as every call raises then."""
        if self.scheduler.on_loop_thread and not self.scheduler.alive:
            raise self.scheduler.shut_down_error()
        _refuse_wait_on_scheduler(self.scheduler, what, fix)

    def _check_rid_free(self, rid: str) -> None:
        """Raise ``ValueError`` (``rid_in_use``) if a running request holds ``rid``. Under ``_lock``."""
        old = self._handles.get(rid)
        if old is not None and not old.done:
            raise ValueError(rid_in_use(rid))

    def submit(
        self, prompt: Prompt, params: Optional[SamplingParams] = None, rid: Optional[str] = None
    ) -> RequestHandle:
        """Queue one prompt without waiting; returns its ``RequestHandle``.

        ``rid``: the id ``abort`` takes (None: a random one); a running request's rid, or one with no
        character but whitespace, is refused.

        Raises ``ValueError``/``TypeError`` for a bad prompt, bad params or a bad rid (nothing is
        queued, and the rid is free again; a prompt that fits the model but not with its
        ``max_new_tokens``, the context length or the KV pool, is a ``ValueError`` whose ``reason``
        is ``params.DOES_NOT_FIT``, ``"does_not_fit"``, as from ``generate``), and ``RuntimeError``
        once the engine is shut down. The
        rid is taken once the prompt and params are checked, before the grammar's compile: an
        ``abort(rid)`` from another thread during that compile returns True, the request ends at
        once with finish reason abort, the rid is free for a new request, as once any request ends,
        and this call returns at once with that ended handle: the compile goes on in the background
        for the grammar cache alone, and queues nothing (SGLang's abort ends a request waiting for
        its grammar at once too). An interrupt
        (KeyboardInterrupt) once submit may have queued the request ends it, with finish reason abort
        and ``outputs.ABORT_INTERRUPTED``, before it propagates: no request runs whose handle no
        caller got (a second one that came before that end was posted is held until it is:
        ``later_interrupts``); one before leaves nothing queued or registered (the rid is free). A request
        queued before the shutdown ends with finish reason abort and the message
        ``outputs.ABORT_SHUTDOWN``, as do those running.

        In a ``subscribe`` listener (the scheduler thread), a regex / JSON schema not compiled yet
        does not hold that thread for the compile: the handle comes back at once, the request is
        queued once the compile ends, and a failure found then (a pattern this vocabulary cannot
        complete, a compile over its limits) ends it with an abort naming it instead of raising.
        The constraint's own checks (an unsupported feature) still raise here."""
        if rid is not None and not isinstance(rid, str):
            raise TypeError(f"rid={shown_number(rid)} must be a string (or None for a random one)")
        if rid is not None and not rid.strip():  # (an empty one was replaced by a random id abort() could not name)
            raise ValueError(f"rid={rid!r} must hold a character other than whitespace (or be None for a random one)")
        if params is None:  # (not `params or ...`: an empty dict passed for the defaults, a fuller one was refused)
            params = SamplingParams()
        ids = self._to_ids(prompt, params.max_new_tokens if isinstance(params, SamplingParams) else None)
        self._check(ids, params)
        if self._compiling(params):
            return self._submit_when_compiled(ids, params, rid)
        handle, reqs = self._make_reqs(ids, params, rid)
        posting = False
        with LaterInterruptsHeld() as hold:  # (a second Ctrl-C waits for the first one's end to be posted)
            try:
                # The rid is taken before the compile: an abort from another thread meanwhile finds the
                # request (and ends it) instead of missing it and letting it run.
                self._register([handle])
                grammar = self._check_grammar(params, handle._ended)
                if handle.done:  # aborted during the compile: it has its end, and nothing is queued
                    return handle
                if grammar is not None:
                    self._attach_grammar(reqs, grammar)
                posting = True
                self.scheduler.submit(reqs)
                return handle  # (in the try: an interrupt just before the return still withdraws the request)
            except BaseException:
                self._withdraw([handle], posting, hold)
                raise

    def generate(
        self,
        prompt: Union[Prompt, Sequence[Prompt]],
        params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
    ) -> Union[GenerateResult, list[GenerateResult]]:
        """Generate for one prompt (str or token ids: a list or tuple, a 1-D numpy or torch array,
        a range) or a list of prompts, blocking. A text that begins with the BOS token
        (``apply_chat_template``'s output) gets no second one from the tokenizer.

        ``params``: one ``SamplingParams`` for every prompt (None: the defaults), or for a list of
        prompts a list of as many, one per prompt (SGLang's list of ``sampling_params``); then a
        prompt refused with its params is named by its place ("prompt 2 of the batch: ...").

        [issue 10] With a LLaVA checkpoint a prompt may carry images:
        ``MultimodalPrompt("<image>\nwhat is this?", [path_or_pil_or_bytes_or_data_url])`` or
        ``{"text": ..., "images": [...]}``, one ``<image>`` per image. Image positions are keyed
        in the radix cache by the pixels' SHA-256, so a later prompt with the same image reuses
        its KV (``meta.cached_tokens``). A bad image raises ``ImageInputError`` (a ValueError).

        An empty list is one prompt of no token ids, refused (``ValueError``), as SGLang refuses
        an empty ``input_ids``: a batch holds at least one prompt.

        Returns a ``GenerateResult`` for one prompt with n == 1; otherwise a flat list, prompt by
        prompt, samples in index order (each prompt's ``n`` samples). Every prompt is checked
        before any is queued, and a prompt that fails later on (a tensor-parallel worker found
        dead) fails the call with nothing of it queued or registered. An interrupt
        (KeyboardInterrupt) once the requests may be queued, while waiting or just before, ends them
        (finish reason abort, ``outputs.ABORT_INTERRUPTED``) before it propagates; a second one while
        that end waits behind a long step propagates at once, the end coming with the step (one
        that came before the end was posted is held until it is: ``later_interrupts``).

        Shutdown: a call made once the engine is shut down raises ``RuntimeError`` ("the engine is
        shut down; create a new Engine"). A request the engine accepted, even just before another
        thread's ``shutdown``, is answered like those already running: a result whose finish reason
        is abort with the message ``outputs.ABORT_SHUTDOWN`` (naming the shutdown), and a batch keeps
        the results of its prompts that had finished.

        On the scheduler thread (a ``subscribe`` listener) it raises ``RuntimeError`` before
        queueing anything: that thread would wait for itself.
        """
        self._refuse_waiting_here("Engine.generate's result", "call generate on another thread, or submit() the "
                                  "prompt and take its events in a listener (subscribe)")
        prompts, is_batch = self._split_batch(prompt, params)
        each = self._params_per_prompt(params, len(prompts), is_batch)
        grammars = {}  # by params object: one compile wait for a batch that shares its params
        for i, (ids, p) in enumerate(zip(prompts, each)):
            try:
                self._check(ids, p)
                if id(p) not in grammars:
                    grammars[id(p)] = self._check_grammar(p)
            except (TypeError, ValueError) as e:
                if not (isinstance(params, (list, tuple)) and len(e.args) == 1 and isinstance(e.args[0], str)):
                    raise
                # a new error of its type with its fields (a front end reads SamplingParamsError.field),
                # made without __init__, whose signature varies; not e changed: the grammar cache
                # raises the same GrammarError object for every request of its pattern
                named = type(e).__new__(type(e), f"prompt {i} of the batch: {e.args[0]}")
                named.__dict__.update(vars(e))
                raise named from None
        # (not registered yet: a later prompt's failure, or an interrupt, leaves nothing registered)
        made = [self._make_reqs(ids, p, grammar=grammars[id(p)]) for ids, p in zip(prompts, each)]
        # One submission for the whole batch: the scheduler sees every prompt at once, so the
        # batch is ordered and admitted the same way whatever the thread timing.
        results = self._run(made)
        return results if is_batch or each[0].n > 1 else results[0]

    @staticmethod
    def _params_per_prompt(params: Any, count: int, is_batch: bool) -> list[SamplingParams]:
        """``generate``'s ``params`` as one per prompt (not yet checked: ``_check`` refuses an item
        that is no ``SamplingParams``).

        Raises:
            TypeError: a list of params for one prompt.
            ValueError: a list of params whose length is not the batch's.
        """
        if params is None:
            params = SamplingParams()
        if not isinstance(params, (list, tuple)):
            return [params] * count
        if not is_batch:
            raise TypeError("a list of SamplingParams goes with a list of prompts, one per prompt; for one "
                            "prompt pass one SamplingParams")
        if len(params) != count:
            raise ValueError(f"{len(params)} SamplingParams for {count} prompts: pass one per prompt, or one "
                             "SamplingParams for them all")
        return list(params)

    def _run(self, made: list) -> list[GenerateResult]:
        """Register and queue the requests of ``made`` (``_make_reqs``' (handle, reqs) pairs) at once
        and wait for their results, in order; an interrupt aborts them. Requests that cannot be
        queued (the engine shut down meanwhile) leave no handle registered."""
        handles = [h for h, _ in made]
        posting = False
        with LaterInterruptsHeld() as hold:  # (a second Ctrl-C waits for the first one's end to be posted)
            try:  # (one try from the registration to the results: an interrupt anywhere in it withdraws them)
                self._register(handles)
                posting = True
                self.scheduler.submit([r for _, reqs in made for r in reqs])
                results: list[GenerateResult] = []
                for h in handles:
                    r = h.result()
                    results.extend(r if isinstance(r, list) else [r])
            except BaseException:
                self._withdraw(handles, posting, hold)
                raise
        return results

    def _withdraw(self, handles: list[RequestHandle], posted: bool,
                  hold: Optional[LaterInterruptsHeld] = None) -> None:
        """Undo a submission of ``handles`` that raised. Before its post (``posted`` False) nothing
        was queued: the handles are forgotten (``_unregister``), their rids free at once for a retry.
        From the post on, an interrupt (KeyboardInterrupt) may have come after the requests went in,
        and no caller would hold their handles: so the scheduler ends them, aborted, wherever they
        are (``Scheduler.end_requests``, which also drops them if they come later); waited for,
        except on the scheduler thread, where it comes between steps. The wait is sliced
        (``waits.future_result``): it may sit behind a long step, and a second Ctrl-C meanwhile
        stops it at once, the end being posted already (the requests still end with that step).
        One that came before the post is held by ``hold`` (the caller's ``LaterInterruptsHeld``)
        until the post, then raised in place of the wait: raised before it, the requests ran on.
        Once the engine is shut down (the post failed so, or the stop came meanwhile) the stop
        answered whatever it had: the handles are forgotten."""
        scheduler = self.scheduler
        if posted:
            reqs, reason = [r for h in handles for r in h._reqs], FinishReason("abort", message=ABORT_INTERRUPTED)
            try:
                ended = scheduler.call(lambda: scheduler.end_requests(reqs, reason))
                if hold is not None:
                    hold.release()
                if not scheduler.on_loop_thread:
                    future_result(ended)
                return
            except Exception:  # noqa: BLE001 - shut down (answered by the stop, or never queued), or a
                # request's clean-up failed (answered with it): the caller hears of its own error, not this
                pass
        self._unregister(handles)

    def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> Iterator[StreamEvent]:
        """Queue one prompt and return an iterator of its ``StreamEvent``s; the last event of each
        sample has ``finished=True`` and its ``result``. Closing or dropping the iterator before the
        end aborts the request.

        Bad input raises here, before any iteration (as ``submit``)."""
        return _EventStream(self.submit(prompt, params))

    def score(self, prompt_ids: Union[Prompt, Iterable[int]], start: int) -> list[float]:
        """Logprobs (natural log) of ``prompt_ids[j]`` given ``prompt_ids[:j]`` for j in
        ``[start, len)`` — what ``select`` compares (paper §2). Uses and fills the radix cache.
        ``prompt_ids`` is token ids (a list, a numpy array, ...) or one prompt as ``generate``
        takes it (a text is encoded as there, and ``start`` counts its tokens).

        Raises ``ValueError`` unless ``1 <= start < len(prompt_ids)`` (a 1-token prompt: named);
        ``TypeError`` / ``ValueError`` for a bad prompt, and ``RuntimeError`` on the scheduler
        thread, as ``generate``."""
        self._refuse_waiting_here("Engine.score's logprobs", "call score on another thread")
        if isinstance(start, bool) or not isinstance(start, numbers.Integral):
            raise TypeError(f"start={start!r} must be an int: the first position whose logprob is wanted")
        ids = self._to_ids(prompt_ids)
        if len(ids) == 1:  # (else "start=1 must be in [1, 1)": no start fits, and the message said not why)
            raise ValueError("score needs a prompt of at least 2 tokens: the first token has no logprob (nothing "
                             "comes before it), so a 1-token prompt has none to give")
        if not 1 <= start < len(ids):
            raise ValueError(f"start={start} must be in [1, {len(ids)}) for a prompt of {len(ids)} tokens")
        result = self.generate(ids, SamplingParams(max_new_tokens=0, logprob_start_len=start))
        assert isinstance(result, GenerateResult) and result.prompt_logprobs is not None
        if result.finish_reason.type == "abort":
            raise RuntimeError(f"scoring failed: {result.finish_reason.message}")
        return [lp.logprob for lp in result.prompt_logprobs if lp is not None]

    def abort(self, rid: str) -> bool:
        """Abort request ``rid`` (all its samples), freeing its KV; True if it was live.

        On the scheduler thread (a ``subscribe`` listener, or the garbage collector there) the abort
        is queued for the next pause between steps, and True means the request had not finished
        when asked: run at once, in the middle of a step, it would free a request the step is still
        using (leaking its KV slots), or miss one the step has taken out of its queues (its first
        event comes then) and return False while the request ran on to its end.

        A request accepted but not queued yet (another thread's ``submit`` has not returned, even
        while it waits for its grammar's compile, or a listener's submit waits for that compile) is
        aborted too, at once (its rid is free again), and True returned; one whose rid is not taken
        yet (``submit`` takes it once the prompt and params are checked) is not.

        Raises ``TypeError`` for a ``rid`` that is no string (a ``RequestHandle`` passed for its rid
        found nothing, and the request ran on), and ``RuntimeError`` once the engine is shut down."""
        _check_abort_rid_type(rid)
        scheduler = self.scheduler
        if not scheduler.on_loop_thread:
            return bool(self._call(lambda: self._abort_here(rid)))
        # (no lock: the garbage collector may run this on a thread that holds self._lock)
        handle = self._handles.get(rid)
        if handle is None or handle.done:
            return False
        if scheduler.alive:  # (once stopped, every request is being aborted already)
            scheduler.call(lambda: self._abort_here(rid))
        return True

    def queue_abort(self, rid: str) -> None:
        """``abort(rid)`` without waiting for its answer: the abort is queued for the scheduler's
        next pause between steps, ahead of any call made after this one, and this returns at once.
        For a clean-up that must not be held up by a long step (a long prefill, a first kernel
        compile) or a wedged scheduler: lmnb aborts a stopped program's requests so, with Ctrl-C
        held (``lmnb.interrupt.held_interrupts``). Once the engine is shut down it does nothing
        (the shutdown ended every request).

        Raises ``TypeError`` for a ``rid`` that is no string, as ``abort``."""
        _check_abort_rid_type(rid)
        scheduler = self.scheduler
        try:
            scheduler.call(lambda: self._abort_here(rid))
        except RuntimeError:
            if scheduler.alive:  # (only the shutdown's refusal means there is nothing to abort)
                raise

    def _abort_here(self, rid: str) -> bool:
        """``Engine.abort`` on the scheduler thread, between steps: the requests of ``rid`` it
        holds end now; so do those of a handle registered but not queued yet (another thread is
        between ``_register`` and its post, compiling the grammar maybe, and the post may come
        after this command), which the scheduler then drops as they arrive: their rid is free at
        once, not only once the compile ends. True if either. A registered handle's requests are
        ended from its own list: looking them up by rid (``Scheduler.abort``) scans every request
        the scheduler holds, once per abort, which a server aborting each prompt of a big batch did
        thousands of times."""
        handle = self._handles.get(rid)
        if handle is None or handle.done:
            return bool(self.scheduler.abort(rid))
        self.scheduler.end_requests(handle._reqs, FinishReason("abort", message=ABORT_REQUESTED))
        return True

    # --- cache control and observability -----------------------------------------------------
    def _call(self, fn, timeout: Optional[float] = None):
        """``fn()`` run on the scheduler thread between its steps (here, on that thread), its
        answer waited for within ``timeout`` seconds (None: no limit; sliced, ``lmnb_engine.waits``)."""
        if self.scheduler.on_loop_thread:
            return fn()
        return future_result(self.scheduler.call(fn), timeout)

    def cache_stats(self) -> dict:
        """Cache and pool figures: hit_rate (cumulative cached / prompt tokens, paper §3, of the
        requests: the prefills of ``pin_prefix`` are not counted),
        last_batch_hit_rate, cached_tokens, prompt_tokens, evicted_tokens, pool_size, pool_used,
        free_tokens, evictable_tokens, protected_tokens, held_tokens (owned by running requests),
        pinned_prefixes, running_requests, waiting_requests, retracted_requests, overlapped_steps
        (decode steps launched before the previous step's tokens were taken), new_token_ratio."""
        return self._call(self.scheduler.stats)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the KV accounting or the tree's bookkeeping is broken."""
        self._call(self.scheduler.check_invariants)

    def _preview(self, key: Sequence[Any]) -> str:
        head = list(key[:_PREVIEW_TOKENS])
        parts, ids = [], []
        for item in head:
            if isinstance(item, int):
                ids.append(item)
            else:
                if ids:
                    parts.append(self.tokenizer.decode(ids))
                    ids = []
                if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):  # [issue 10]
                    if item[1] == 0:  # an image position (hash, i): one marker per image
                        parts.append(f"<image {item[0][:8]}>")
                    continue
                parts.append(f"<{type(item).__name__}>")
        if ids:
            parts.append(self.tokenizer.decode(ids))
        text = "".join(parts)
        if len(key) > _PREVIEW_TOKENS or len(text) > _PREVIEW_CHARS:
            text = text[:_PREVIEW_CHARS] + "…"
        return text

    def tree_snapshot(self) -> TreeNodeView:
        """Frozen copy of the radix tree (root first; an empty root when the cache is disabled)."""
        return self._call(lambda: self.scheduler.cache.snapshot(self._preview))

    def match_node(self, token_ids: Sequence[int]) -> Optional[tuple[int, int]]:
        """Where ``token_ids`` (list[int], or [issue 10] ``MultimodalTokens``, a prompt prepared
        with its images) ends in the radix tree, without touching it: ``(node_id, cached_tokens)``
        for the deepest node its longest cached prefix reaches (the prefix may end inside that
        node's edge), or None when none of it is cached. No edge is split, no LRU time refreshed
        and no lock taken, so widgets can label ``tree_snapshot()`` paths freely."""
        if isinstance(token_ids, MultimodalTokens):
            ids = token_ids.input_key
        elif (items := _id_items(token_ids)) is not None:
            ids = _token_id_list(items)
        else:
            raise TypeError(f"match_node takes token ids (a list of ints) or a prepared MultimodalTokens, got "
                            f"{type(token_ids).__name__}; for a text pass engine.encode(text)")
        node, n = self._call(lambda: self.scheduler.cache.peek_prefix(ids))
        return (node, n) if node is not None else None

    def pinned_node_ids(self) -> list[int]:
        """Ids of the ``tree_snapshot()`` nodes locked by ``pin_prefix`` (one per live pin, in
        handle order; a node pinned twice appears twice)."""
        return self._call(lambda: [node.id for _, node in sorted(self.scheduler.pins.items())])

    def flush_cache(self) -> bool:
        """Evict every unpinned cached prefix and the cached image features, and reset the hit-rate
        counters; False (and nothing done) while requests are running or waiting."""

        def flush() -> bool:
            s = self.scheduler
            # (a listener calls this on the scheduler thread mid-step, where the step's new requests
            # are in no queue yet: _step_reqs holds them)
            if s._step_reqs:
                return False
            # (an abort among the commands of this pause left the waiting requests it ended in the
            # queue, finished, for the loop to drop after the commands: they wait for nothing)
            s._drop_finished_waiting()
            if s._has_work():
                return False
            s.cache.evict(s.cache.evictable_size())
            encoder_cache = getattr(self.runner.model, "encoder_cache", None)  # [issue 10] LLaVA
            if encoder_cache is not None:
                encoder_cache.clear()
            s.reset_stats()
            return True

        return self._call(flush)

    def pin_prefix(self, token_ids: Union[str, Sequence[int], MultimodalPrompt]) -> int:
        """Compute (if needed) and lock the KV of ``token_ids`` (token ids, or a text, encoded as
        ``generate`` encodes it; [issue 10] or a prompt with images, as ``generate`` takes it) so it
        is never evicted; returns a handle for ``unpin``. Pinned tokens count as protected in
        ``cache_stats``.

        Raises ``RuntimeError`` when the radix cache is disabled, computing the prefix failed (the
        message says why), the pool is too busy to keep the prefix cached until it is locked, or
        the call is made on the scheduler thread (a ``subscribe`` listener, which would wait for
        itself); ``ValueError`` for a bad prefix."""
        if self.scheduler.disable_radix_cache:
            raise RuntimeError("the radix cache is disabled (disable_radix_cache=True); nothing can be pinned")
        self._refuse_waiting_here("Engine.pin_prefix's prefill of the prefix", "call pin_prefix on another thread")
        ids = self._to_ids(token_ids)
        self._check(ids, SamplingParams(max_new_tokens=0))
        key = getattr(ids, "input_key", ids)  # [issue 10] image positions are keyed by pixel hash
        for _ in range(3):
            handle, reqs = self._make_reqs(ids, SamplingParams(max_new_tokens=0))
            for req in reqs:  # (pinning is a cache action, not traffic: the hit rate leaves it out)
                req.counted = False
            r = self._run([(handle, reqs)])[0]
            if r.finish_reason.type == "abort":  # e.g. its KV came out NaN: nothing worth pinning
                # (an abort's fixes that name the engine's options, e.g. pins that keep it out, stay the
                # error's, for a front end to say them its way: in_option_syntax)
                message = r.finish_reason.message
                problem, fixes = getattr(message, "option_fixes", (message, ()))
                raise option_error(RuntimeError, f"could not compute the prefix to pin: {problem}", *fixes)
            handle = self._pin(key)
            if handle is not None:
                return handle
        raise RuntimeError("the prefix was evicted before it could be pinned; the KV pool is too busy, retry later")

    def _pin(self, key: Sequence[Any]) -> Optional[int]:
        """``Scheduler.pin(key)``, on the scheduler thread (``pin_prefix`` is refused there). An
        interrupt (Ctrl-C) while waiting for it, or as it is posted, leaves behind no pin whose
        handle no caller holds: the scheduler makes the pin all the same, and it is released as
        soon as it is made, or, made before the interrupt came, between the scheduler's next steps.
        (The wait's future is not enough to find it: an interrupt that comes inside
        ``Scheduler.call``, once the pin is posted, leaves the caller without it.)"""
        lock = threading.Lock()
        made: list[int] = []  # the pin's handle, once made for a caller still waiting
        given_up = False

        def pin() -> Optional[int]:  # (on the scheduler thread)
            handle = self.scheduler.pin(key)
            with lock:
                if handle is not None and given_up:
                    self._release_pin(handle)
                    return None
                if handle is not None:
                    made.append(handle)
            return handle

        try:
            return future_result(self.scheduler.call(pin))
        except KeyboardInterrupt:
            with lock:
                given_up = True
            if made:
                with contextlib.suppress(RuntimeError):  # (shut down meanwhile: its pins went with it)
                    self.queue_unpin(made[0])
            raise

    def _release_pin(self, handle: Any) -> None:
        """(On the scheduler thread.) Release pin ``handle``; ``ValueError`` if unknown."""
        # (only an int is a handle: True or 1.0, equal to 1 as a dict key, released the pin whose handle is 1)
        is_handle = isinstance(handle, numbers.Integral) and not isinstance(handle, bool)
        node = self.scheduler.pins.pop(handle, None) if is_handle else None
        if node is None:
            raise ValueError(f"unknown pin handle {handle!r}")
        self.scheduler.cache.dec_lock_ref(node)

    def unpin(self, handle: int) -> None:
        """Release a ``pin_prefix`` lock (the prefix becomes evictable). ``ValueError`` if unknown."""
        self._call(lambda: self._release_pin(handle))

    def queue_unpin(self, handle: int) -> Future:
        """``unpin(handle)`` without waiting: the release is queued for the scheduler's next pause
        between steps, ahead of any call made after this one, and its ``Future`` returned
        (``ValueError`` there if the handle is unknown). For a caller that holds Ctrl-C while it
        hands a pin over (lmnb_kernel's ``%lm pin`` / ``%lm unpin``) and waits for the answer
        after, where a press can stop the wait: a long step or a wedged scheduler held it for good.

        Raises ``RuntimeError`` once the engine is shut down; on the scheduler thread (which would
        wait for itself), use ``unpin``."""
        return self.scheduler.call(lambda: self._release_pin(handle))

    # --- lifetime -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Abort pending requests and stop the scheduler thread (idempotent). Every request accepted
        before, running or queued, ends with finish reason abort and ``outputs.ABORT_SHUTDOWN``;
        later calls raise ``RuntimeError``."""
        self._finalizer()
        self.scheduler.stop()  # (a second caller, the finalizer spent: waits for the first one's stop too)
        with self._lock:  # (after the stop: no compiler is made from now on)
            backend = self._grammar_backend
        if backend is not None:
            backend.shutdown()

    def release_memory(self) -> None:
        """``shutdown``, then free the memory the engine holds on its device: the weights, the KV
        pool and the captured CUDA graphs (``ModelRunner.release_memory``; on CUDA given back to
        the driver, so that a model loaded next in this process finds it free). ``shutdown`` alone
        leaves them to the garbage collector, which frees nothing while anything still refers to the
        engine (a ``ProgramState`` run on it, a notebook variable, a traceback): on a GPU a second
        model was then refused for memory the first one's idle engine held. Idempotent.

        Raises:
            RuntimeError: the scheduler thread is still in a step it did not leave within
                ``shutdown``'s wait (its memory is left as it is: the step still uses it).
        """
        self.shutdown()
        if not self.scheduler.ended:
            raise RuntimeError("the engine's scheduler is still in a step after its shutdown; its memory is kept "
                               "while that step runs (restart the process to free it)")
        self.runner.release_memory()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
