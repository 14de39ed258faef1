"""The scheduler: continuous batching over one KV pool shared by the radix cache and running
requests (paper §3), on its own thread.

Each step:
1. make room for the running requests' next tokens: evict cached tokens, and if that is not
   enough, retract running requests (their KV goes to the cache, they re-queue with their output
   kept; SGLang's ``retract_decode``);
2. admit waiting requests in policy order (``schedule_policy``) while the per-step token budget
   (``chunked_prefill_size``) and memory allow: free + evictable slots minus a reserve for the
   tokens running requests are still expected to generate (``new_token_ratio``); a prompt longer
   than the budget is split into chunks, one chunked request at a time; a request that shares a
   long prefix with one admitted in the same round (or a sibling sample of it) waits one round so
   it hits the cache instead of recomputing the prefix (SGLang's in-batch prefix caching);
3. run one forward over the rows — new extends only, then decode steps (SGLang's default), or
   both together with ``mixed_batching``; every row computes its tokens ``[kv_committed_len:]``;
4. sample, detokenize, check stops, stream events; give finished requests' KV to the cache and
   insert extended prompts at once so concurrent requests share them. In a run of plain decode
   steps, step n+1 is launched before step n's tokens are processed (``overlap_schedule``), so
   the device does not wait for the host's part of 4.

Threading: callers never touch scheduler state. ``submit``/``abort``/``call`` post commands to an
inbox the loop drains between steps; events go back through each request's ``emit`` callback. An
exception inside a step fails the requests of that step (finish reason ``abort`` with the error)
and the loop goes on; if their memory cannot be returned cleanly, the pools and cache are rebuilt.
A request whose logits are not finite (next token or prompt logprobs) is aborted the same way,
alone, and the non-finite KV it leaves in the radix tree is dropped rather than shared.
"""

from __future__ import annotations

import bisect
import logging
import math
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from lmnb_engine.cli_options import UNPIN, option_message
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.kv_pool import span_index
from lmnb_engine.model_runner import ModelRunner
from lmnb_engine.outputs import (
    ABORT_REQUESTED,
    ABORT_SHUTDOWN,
    NEW_ENGINE_FIX,
    FinishReason,
    GenerateResult,
    RequestMeta,
    StreamEvent,
    TokenLogprob,
)
from lmnb_engine.prefix_cache import NoPrefixCache, PrefixCache
from lmnb_engine.radix_cache import RadixCache
from lmnb_engine.request import Req, ReqStatus, kv_to_finish
from lmnb_engine.sampler import (
    PendingSample,
    blocked_reason,
    grammar_end_reason,
    grammar_eos,
    nonfinite_rows,
    sample,
    sample_async,
    token_logprobs,
)
from lmnb_engine.schedule_policy import ARRIVAL, SchedulePolicy
from lmnb_engine.stop_request import StopHit

logger = logging.getLogger(__name__)

# A waiting request sharing at least this many more tokens with a request admitted in the same
# round than with the cache waits a round (SGLang: IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD).
IN_BATCH_PREFIX_THRESHOLD = 32
# Cap on the max_new_tokens counted in the decode reserve (SGLang: CLIP_MAX_NEW_TOKENS).
CLIP_MAX_NEW_TOKENS = 4096
# What frees KV slots for a request that pinned prefixes keep out (option_message: each front end names
# the engine's option its way, a %%lm cell "%lm load's --max-total-tokens", and rewords UNPIN: "%lm unpin NAME").
_POOL_FIXES = ((UNPIN,), ("raise {}", "max_total_tokens", None))


@dataclass
class SchedulerConfig:
    """Scheduling knobs.

    schedule_policy: "lpm", "fcfs" or "dfs-weight" (``schedule_policy.POLICIES``).
    chunked_prefill_size: new (extend) tokens per step; longer prompts are chunked.
    max_running_requests: concurrent requests (rows of the request→token table).
    mixed_batching: run decode rows in the same forward as new extends (SGLang's mixed chunk).
    overlap_schedule: launch a decode step before the previous one's tokens reach the host, so
        the device computes while the host detokenizes and streams (``Scheduler._chain``).
    init/min_new_token_ratio, new_token_ratio_decay, retract_ratio_step: the decode reserve is
        ``ratio × remaining max_new_tokens`` per running request; the ratio decays by ``decay``
        each decode step, rises by ``retract_ratio_step`` after a retraction and goes back to
        ``init`` whenever the scheduler is idle (SGLang), so a burst of requests is admitted the
        same way whatever ran before it.
    """

    schedule_policy: str = "lpm"
    chunked_prefill_size: int = 2048
    max_running_requests: int = 64
    mixed_batching: bool = False
    overlap_schedule: bool = True
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    retract_ratio_step: float = 0.1


@dataclass
class _Flight:
    """A step whose forward ran and whose sampling was launched, results not yet taken."""

    rows: list[tuple[Req, int]]
    mode: ForwardMode
    logits: torch.Tensor
    picked: list[Req] = field(default_factory=list)  # the requests sampled, in PendingSample order
    pending: Optional[PendingSample] = None
    verify_at: dict[int, int] = field(default_factory=dict)
    bad_prompt: list[Req] = field(default_factory=list)  # requests whose prompt logits are not finite
    # rows that sample nothing in this step (a prompt chunk, max_new_tokens=0): (request, new
    # tokens); their KV is checked before the cache shares it
    unsampled: list[tuple[Req, int]] = field(default_factory=list)


def _runs_to_length(req: Req, eos_token_ids: frozenset[int]) -> bool:
    """Whether nothing but its ``max_new_tokens`` can end ``req``: it ignores EOS or the model has
    none (``eos_token_ids``: the model's EOS ids), and it has no stop token, stop string, stop regex
    or constraint (a grammar ends it where its pattern does), each of which may end it sooner,
    before a pool that cannot hold its whole length runs out."""
    return (req.params.ignore_eos or not eos_token_ids) and not (req.stop_token_ids or _ended_by_its_text(req))


def _ended_by_its_text(req: Req) -> bool:
    """Whether a stop string, stop regex or constraint (a grammar, which ends it where its pattern
    does) may end ``req``: each is checked on the text, from its ``min_new_tokens``-th token on."""
    p = req.params
    return bool(any(p.stop_strings) or p.stop_regexes or p.constraint or req.grammar is not None)


def _tokens_of(nodes: dict[int, Any]) -> int:
    """KV slots the tree nodes ``nodes`` hold (``Scheduler._pinned_nodes``: each once, by ``id``)."""
    return sum(len(node.key) for node in nodes.values())


def _stops_after_min_new_tokens(req: Req) -> int:
    """New tokens past its ``min_new_tokens`` that ``req`` must sample before it may stop: 0 where a
    stop string, stop regex or grammar may end it at the token that makes that many (they are
    checked from that token on), 1 where only an EOS or stop token id can (they are masked until
    that many tokens exist, so the earliest is the next one). A length that ends it sooner is the
    caller's to count."""
    return 0 if _ended_by_its_text(req) else 1


def _peeks_next_token(req: Req) -> bool:
    """Whether ``req`` scores the token after its prompt without generating it: SGLang's prefill of
    a ``max_new_tokens=0`` request with ``return_logprob`` reports that token's logprob and top
    alternatives (its cot_decoding example reads the top-k first tokens this way)."""
    return req.params.max_new_tokens == 0 and req.params.return_logprob and not req.output_ids


class Scheduler:
    """Runs requests on ``runner``; see the module docstring.

    Args:
        runner: the model runner (owns the pools).
        tokenizer: for detokenization.
        eos_token_ids: the model's EOS ids.
        context_len: longest sequence the model takes.
        config: ``SchedulerConfig``.
        disable_radix_cache: use ``NoPrefixCache``.
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        context_len: int,
        config: SchedulerConfig,
        disable_radix_cache: bool = False,
    ) -> None:
        if config.chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size={config.chunked_prefill_size} must be >= 1")
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.grammar_eos = grammar_eos(tokenizer, eos_token_ids)
        self.context_len = context_len
        self.config = config
        self.disable_radix_cache = disable_radix_cache
        self._build_cache()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Optional[Req] = None  # the request whose prompt is being prefilled in chunks
        self.new_token_ratio = config.init_new_token_ratio
        self.pins: dict[int, Any] = {}  # handle -> locked node
        self._next_pin = 1
        self._arrivals = 0
        self._step_reqs: list[Req] = []
        self._finished_waiting = False  # end_requests left finished requests in ``waiting``
        self._inflight: Optional[_Flight] = None  # a decode step launched ahead (overlap_schedule)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()
        # a command is queued before the stop, or refused after it; re-entrant: the garbage collector
        # can finalize a stream or an engine inside _post on the loop thread, and that posts too
        self._post_lock = threading.RLock()
        self._exit_hooks: list[Callable[[], None]] = []
        self._death = ""  # why the loop stopped on its own (a failed recovery), for later callers
        # an abort's release raised: that request's KV is neither free nor held; the loop rebuilds
        # the memory before its next step, as after a failed step
        self._kv_suspect = False
        self.reset_stats()

    # --- setup and stats ------------------------------------------------------------------------
    def _build_cache(self) -> None:
        cache_cls = NoPrefixCache if self.disable_radix_cache else RadixCache
        self.cache: PrefixCache = cache_cls(self.runner.req_to_token_pool, self.runner.kv_pool)
        self.policy = SchedulePolicy(self.config.schedule_policy, self.cache)

    def reset_stats(self) -> None:
        """Zero the cache-hit and retraction counters of ``stats``."""
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.last_batch = (0, 0)  # (cached, prompt) tokens of the last step that admitted requests
        self.retracted_requests = 0
        self.overlapped_steps = 0  # decode steps launched before the previous step's tokens were taken
        self.cache.evicted_tokens = 0

    @property
    def kv_pool(self):
        """The model runner's token KV pool."""
        return self.runner.kv_pool

    @property
    def req_to_token_pool(self):
        """The model runner's request-to-token table."""
        return self.runner.req_to_token_pool

    # --- thread and commands ------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler loop on its own daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="lmnb-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort every request (``ABORT_SHUTDOWN``) and end the thread; idempotent.

        On the loop thread (a ``subscribe`` listener shutting the engine down, or an engine
        collected there, mid-step) the loop stops at its next pause, and from now on it counts as
        stopped: later commands are refused (``shut_down_error``), as after a stop from another
        thread, which waits for the loop to end (whoever stopped it)."""
        if self._thread is None:
            return
        if self.on_loop_thread:
            with self._post_lock:
                if not self._stopped.is_set():
                    self._inbox.put(("stop", None, None))
                    self._stopped.set()
            return
        if not self._stopped.is_set():
            self._inbox.put(("stop", None, None))
        self._thread.join(timeout)

    def on_exit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the scheduler thread once the loop has ended (after a stop). Call it
        from the scheduler thread, before the stop (``Engine``'s finalizer running there)."""
        self._exit_hooks.append(fn)

    def _run_exit_hooks(self) -> None:
        while self._exit_hooks:
            fn = self._exit_hooks.pop(0)
            try:
                fn()
            except Exception:  # noqa: BLE001 - the loop is ending; nothing is left to fail
                logger.exception("scheduler exit hook failed")

    @property
    def on_loop_thread(self) -> bool:
        """Whether the caller runs on the loop thread: a command there runs inline (posting it
        would wait for itself), and the garbage collector can finalize engines and streams there,
        in the middle of a step."""
        return threading.current_thread() is self._thread

    @property
    def alive(self) -> bool:
        """Whether the loop thread runs and was not stopped."""
        return self._thread is not None and self._thread.is_alive() and not self._stopped.is_set()

    @property
    def ended(self) -> bool:
        """Whether the loop thread has ended, or never started: nothing runs on the model runner."""
        return self._thread is None or not self._thread.is_alive()

    def submit(self, reqs: list[Req]) -> None:
        """Queue requests (thread-safe)."""
        self._post("add", reqs)

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the scheduler thread between steps; the future holds its result."""
        return self._post("call", fn)

    def answer_unqueued(self, reqs: list[Req]) -> None:
        """End ``reqs``, which ``submit`` could not queue (the loop had stopped), with
        ``ABORT_SHUTDOWN``, on the caller's thread: the loop never saw them, so nothing else will.
        Those ended already (``end_requests``) are not answered twice."""
        for req in reqs:
            if not req.finished:
                self._report_failure(req, ABORT_SHUTDOWN)

    def end_requests(self, reqs: list[Req], reason: FinishReason) -> None:
        """End each of ``reqs`` not finished yet with ``reason``, wherever it is: waiting, running, or
        made but not queued yet (an ``Engine.submit`` still compiling its grammar, or one whose post
        was interrupted). On the loop thread, between steps. Their handle hears the end at once, so
        their rid is free for a new request, as SGLang's abort ends a request in its grammar queue
        at once; a submission of theirs that comes later is dropped (``_handle``).

        Raises the first error a request's clean-up raised, once every request is ended (that one
        is answered with it, and the KV it did not return is recovered by a rebuild before the next
        step)."""
        failure: Optional[Exception] = None
        for req in reqs:
            if req.finished:
                continue
            # A waiting one stays in the queue, finished, until the loop drops every such request
            # in one pass after the commands (``_drop_finished_waiting``): ``_finish`` looks each
            # request up in the queue, one scan per request, and a server aborting each prompt of a
            # disconnected client's batch (5000 prompts at n=128) held the loop for most of an hour.
            self._finished_waiting = True
            try:
                self._end(req, reason)
            except Exception as exc:  # noqa: BLE001 - raised below, once the others are ended too
                self._report_failure(req, f"internal error: {type(exc).__name__}: {exc}")
                self._kv_suspect = True
                failure = failure or exc
        if failure is not None:
            raise failure

    def pin(self, key: list) -> Optional[int]:
        """Lock the cached prefix ``key`` (a cache key: token ids, or [issue 10] a multimodal
        prompt's ``input_key``) for ``Engine.pin_prefix``; its new handle, or None if ``key`` is not
        cached whole (evicted since it was computed). On the loop thread."""
        match = self.cache.match_prefix(key)
        if match.length < len(key):
            return None
        self.cache.inc_lock_ref(match.node)
        handle, self._next_pin = self._next_pin, self._next_pin + 1
        self.pins[handle] = match.node
        return handle

    def pinned_tokens(self) -> int:
        """KV slots held by ``pin_prefix`` pins (each node on a pinned path once). Not
        ``protected_size``: that also counts the prefixes running requests lock."""
        return _tokens_of(self._pinned_nodes())

    def _pinned_nodes(self) -> dict[int, Any]:
        """The tree nodes on a pinned path (below the root), each once, by ``id``."""
        seen: dict[int, Any] = {}
        for node in self.pins.values():
            while node.parent is not None and id(node) not in seen:  # up to the root (or a counted node)
                seen[id(node)] = node
                node = node.parent
        return seen

    def _reused_from_pins(self, req: Req, nodes: dict[int, Any]) -> int:
        """Tokens of ``req``'s prompt that an admission of it from the start would take from the
        pinned prefixes (``nodes``, ``_pinned_nodes``), which are counted as pinned already: only
        what a match may cover (``max_prefix_len``; a prompt pinned whole still computes its last
        token), and of the prompt alone (a retracted request's output is not pinned)."""
        key = req.cache_key(min(req.max_prefix_len(), max(req.prompt_len - 1, 0)))
        path, matched = self.cache.peek_path(key)
        reused = 0
        for node in path:  # a pinned path runs from the root, so the pinned nodes lead the path
            if id(node) not in nodes:
                break
            reused = min(reused + len(node.key), matched)
        return reused

    def _fewer_new_tokens(self, req: Req, free: int, reused: int) -> tuple[tuple[str], ...]:
        """The fix "lower max_new_tokens to M" for ``req`` kept out by pins (``option_message``'s
        fixes: none or one), M the most new tokens that finish in ``free`` unpinned slots with
        ``reused`` prompt tokens pinned already: prompt + M - 1 - reused == free; "lower
        max_new_tokens and min_new_tokens to M" where its min_new_tokens exceeds M (a max_new_tokens
        below it is refused). None where even its prompt does not fit (M < 1: no length helps)."""
        most = self._most_new_tokens(req, free, reused)
        both = " and min_new_tokens" if req.params.min_new_tokens > most else ""
        return ((f"lower max_new_tokens{both} to {most}",),) if most >= 1 else ()

    @staticmethod
    def _most_new_tokens(req: Req, free: int, reused: int) -> int:
        """The most new tokens ``req`` can sample in ``free`` unpinned slots with ``reused`` prompt
        tokens pinned already (``kv_to_finish``: prompt + M - 1 - reused == free); below 1 where
        its prompt does not fit."""
        return free + reused - req.prompt_len + 1

    def _kept_out_by_pins(self, req: Req, nodes: dict[int, Any]) -> Optional[FinishReason]:
        """The abort of ``req``, as it arrives, if it cannot finish even alone beside the pinned
        prefixes (``nodes``, ``_pinned_nodes``, taken once for the requests that arrive together):
        the slots it surely needs, less the part of its prompt it would reuse from a pinned prefix
        (counted as pinned already), exceed the pool's unpinned slots. It surely needs its
        ``kv_to_finish`` where only its length can end it (``_runs_to_length``), else those of the
        fewest tokens it may stop at: its ``min_new_tokens``, which holds off EOS, stop tokens and
        stops (a grammar complete before them aborts; the context length is no nearer:
        ``Engine._check``), and one more where only an EOS or stop token id can end it
        (``_stops_after_min_new_tokens``), as many as its max_new_tokens at most. Admitted, it
        would generate until the pool ran out and then abort (``_unblock_head``, which still ends
        one that a pin taken after it came keeps out, or that did not stop in time). The
        min_new_tokens offered is the most that fits by the same count. None if it can."""
        if not nodes:  # (no pins; none with the radix cache disabled either: pin_prefix refuses then)
            return None
        pinned = _tokens_of(nodes)
        to_length = _runs_to_length(req, self.eos_token_ids)
        after = _stops_after_min_new_tokens(req)
        least = req.params.max_new_tokens if to_length else min(req.params.min_new_tokens + after,
                                                                 req.params.max_new_tokens)
        needs = kv_to_finish(req.prompt_len, least)
        reused = self._reused_from_pins(req, nodes)
        free = self.kv_pool.size - pinned
        if needs - reused <= free:
            return None
        already = f" ({reused} of them pinned already)" if reused else ""
        # (its length is the problem only where its prompt fits, and only where nothing else may end it)
        most = self._most_new_tokens(req, free, reused)
        if to_length:
            what, fewer = "to finish", self._fewer_new_tokens(req, free, reused)
        elif most >= 1:  # (so min_new_tokens > most - after >= 0: its prompt alone fits)
            # (min_new_tokens=N may then stop at N + after == most tokens, which fit)
            what = f"for its prompt + min_new_tokens={req.params.min_new_tokens}"
            fewer = ((f"lower min_new_tokens to {most - after}",),)
        else:
            what, fewer, needs = "for its prompt", (), req.prompt_len
        return FinishReason("abort", message=option_message(
            f"request needs {needs} KV slots {what}{already} but only "
            f"{free} of {self.kv_pool.size} can be freed ({pinned} are pinned)", *_POOL_FIXES, *fewer))

    def shut_down_error(self) -> RuntimeError:
        """The error of a call made once the loop has stopped (a shutdown, or a failed recovery)."""
        return RuntimeError(f"the engine is shut down{self._death}{NEW_ENGINE_FIX}")

    def _post(self, kind: str, payload: Any) -> Future:
        fut: Future = Future()
        with self._post_lock:  # else a command put just after the stop drained the inbox waits forever
            if not self.alive:
                raise self.shut_down_error()
            self._inbox.put((kind, payload, fut))
        return fut

    def _loop(self) -> None:
        if self.runner.device.type == "cuda":
            # a new thread's current device is cuda:0, and Triton launches its kernels (and a CUDA
            # event records) on the current device, whatever device the tensors are on; the
            # request table's device has the index a bare "cuda" leaves out (set_device needs it)
            torch.cuda.set_device(self.req_to_token_pool.req_to_token.device)
        while True:
            try:
                if not self._has_work():  # idle: the decode reserve starts over (as SGLang's)
                    self.new_token_ratio = self.config.init_new_token_ratio
                if not self._drain_inbox(block=not self._has_work() and not self._kv_suspect):
                    self._run_exit_hooks()
                    return
                self._drop_finished_waiting()
                if self._kv_suspect:
                    self._rebuild_memory()  # (raising, it is tried once more by _recover)
                if self._has_work():
                    self._step()
            except Exception as exc:  # noqa: BLE001 - any failure must not kill the loop
                try:
                    self._recover(exc)
                except Exception as fatal:  # noqa: BLE001 - no KV memory to run on: stop, answering everyone
                    self._stop_after_failed_recovery(fatal)
                    return

    def _drop_finished_waiting(self) -> None:
        """Take the requests ``end_requests`` ended out of the waiting queue, all in one pass: the
        loop after its commands, ``_admit``, and ``Engine.flush_cache``, a command that asks
        whether anything waits."""
        if self._finished_waiting:
            self._finished_waiting = False
            self.waiting = [r for r in self.waiting if not r.finished]

    def _has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked or self._inflight)

    def _drain_inbox(self, block: bool) -> bool:
        """Handle queued commands; return False when told to stop."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, payload, fut = item
            if kind == "stop":
                self._abort_all(ABORT_SHUTDOWN)
                with self._post_lock:
                    self._stopped.set()
                self._fail_pending_commands()  # everything posted before the stop: nothing comes after
                return False
            if fut is not None and fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(self._handle(kind, payload))
                except Exception as exc:  # noqa: BLE001 - reported to the caller through the future
                    fut.set_exception(exc)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, kind: str, payload: Any) -> Any:
        if kind == "add":
            # (one ended before it came, aborted while its submit compiled the grammar: nothing more
            # is said of it, and its rid may be a newer request's by now)
            payload = [r for r in payload if not r.finished]
            # (its grammar refused before it came; or the pins keep it out: admitted, it would
            # generate until the pool ran out, then abort, the work wasted)
            nodes = self._pinned_nodes()
            ends = [(r, r.to_abort or self._kept_out_by_pins(r, nodes)) for r in payload]
            for req, end in ends:
                if end is not None:
                    self._finish(req, end)
            payload = [r for r, end in ends if end is None]
            for req in payload:
                req.arrival = self._arrivals
                self._arrivals += 1
                self.waiting.append(req)
            for req in payload:
                if req.grammar is not None:  # a forced prefix is drafted before the first pass
                    try:
                        self._jump_forward(req)
                    except Exception as exc:  # noqa: BLE001 - only this request fails; the caller's
                        # future is not read, so raising would leave every request of the batch unanswered
                        logger.exception("jump-forward of request %s failed", req.rid)
                        self.waiting.remove(req)
                        self._finish(req, FinishReason("abort", message=f"internal error: {type(exc).__name__}: {exc}"))
            return None
        if kind == "call":
            return payload()
        raise ValueError(f"unknown scheduler command {kind!r}")

    def _fail_pending_commands(self, message: str = ABORT_SHUTDOWN) -> None:
        """Answer every queued command once the loop stops: requests abort with ``message`` (they
        were never admitted, so hold no KV), other commands raise."""
        while True:
            try:
                kind, payload, fut = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                for req in [r for r in payload if not r.finished]:  # (not those ended before they came)
                    self._finish(req, FinishReason("abort", message=message))
            if fut is not None and fut.set_running_or_notify_cancel():
                fut.set_exception(self.shut_down_error())

    # --- one step -------------------------------------------------------------------------------
    def _step(self) -> None:
        self._step_reqs = []
        if self._inflight is not None:
            self._advance()
            self._step_reqs = []
            return
        retracted = self._make_room_for_running()
        rows = [] if retracted else self._admit()
        if not rows or self.config.mixed_batching:
            rows += [(r, r.extend_len) for r in self.running]
        if not rows:
            if not retracted:
                self._unblock_head()
            return
        self._step_reqs = [r for r, _ in rows]  # a failure from here on is the forward's: running
        self._run(rows)  # requests outside it (an extend-only step) and retracted ones are sound
        self._step_reqs = []

    def _alloc(self, n: int) -> torch.Tensor:
        """``n`` free KV slots (int64, CPU), evicting cached tokens if needed."""
        short = n - self.kv_pool.available_size()
        if short > 0:
            self.cache.evict(short)
        return self.kv_pool.alloc(n)

    def _alloc_for(self, wants: list[tuple[Req, int]]) -> None:
        """Give each ``(req, n)`` slots for positions up to ``kv_committed_len + n``: one
        allocation and one table write for all of them (a decode step's every row)."""
        spans: list[tuple[int, int, int]] = []  # (row, first position, count) of the slots to add
        ends = []
        for req, n in wants:
            end = req.kv_committed_len + n
            if end > req.kv_allocated_len:
                spans.append((req.req_pool_idx, req.kv_allocated_len, end - req.kv_allocated_len))
                ends.append((req, end))
        if spans:
            self.req_to_token_pool.write_spans(spans, self._alloc(sum(n for _, _, n in spans)))
            for req, end in ends:
                req.kv_allocated_len = end

    def _reserve(self, req: Req) -> int:
        """Slots held back for the tokens ``req`` may still generate."""
        remaining = min(req.params.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)
        return math.ceil(max(remaining, 0) * self.new_token_ratio)

    def _make_room_for_running(self) -> bool:
        """Allocate the running requests' next slots, evicting and then retracting requests
        (least output first, then longest prompt) until they fit. Returns True if any was retracted."""
        self._step_reqs.extend(self.running)
        retracted = False
        while self.running:
            need = sum(r.seq_len - r.kv_allocated_len for r in self.running)
            if need <= self.kv_pool.available_size() + self.cache.evictable_size():
                break
            victim = min(self.running, key=lambda r: (len(r.output_ids), -r.prompt_len, -r.arrival))
            self._retract(victim)
            retracted = True
        self._alloc_for([(r, r.extend_len) for r in self.running])
        return retracted

    def _retract(self, req: Req) -> None:
        self._drop_draft(req)
        self._release(req)
        self.running.remove(req)
        req.status = ReqStatus.WAITING
        # back to its place by arrival: the policy reads the queue as kept in arrival order
        # (``SchedulePolicy.order``); a binary search and one move of the list's tail
        bisect.insort(self.waiting, req, key=ARRIVAL)
        self.retracted_requests += 1
        self.new_token_ratio = min(1.0, self.new_token_ratio + self.config.retract_ratio_step)
        logger.info("retracted request %s (%d output tokens) to free KV memory", req.rid, len(req.output_ids))

    def _admit(self) -> list[tuple[Req, int]]:
        """Choose this step's extend rows: the chunked request's next chunk, then new requests."""
        self._drop_finished_waiting()  # (the loop drops them after its commands; a step run by hand, here)
        rows: list[tuple[Req, int]] = []
        budget = self.config.chunked_prefill_size
        sim = RadixCache(None, None)  # prefixes being computed this round
        in_flight: set[str] = set()
        reserved = sum(self._reserve(r) for r in self.running)
        if self.chunked is not None:
            req = self.chunked
            # the running requests' slots were taken first (_make_room_for_running); the next
            # chunk gets what is left, or waits (running requests are retracted before it, so
            # room comes); with nothing running and no room, it can never go on
            n = min(req.extend_len, budget, self.kv_pool.available_size() + self.cache.evictable_size())
            if n > 0:
                self._step_reqs.append(req)
                self._alloc_for([(req, n)])
                rows.append((req, n))
                budget -= n
                self._note_in_flight(req, sim, in_flight)
            elif not self.running:
                self._finish(req, FinishReason("abort", message=option_message(
                    f"a chunked prompt needs more KV slots but none of {self.kv_pool.size} can be freed "
                    f"({self.pinned_tokens()} are pinned)", *_POOL_FIXES)))
                return rows
            reserved += req.extend_len - n + self._reserve(req)
        if budget <= 0 or not self.waiting:
            return rows
        admitted: list[Req] = []
        try:
            self._admit_waiting(rows, budget, reserved, sim, in_flight, admitted)
        finally:  # (even when it failed: only a request with status WAITING is in the queue, _finish reads it so)
            self._take_from_waiting(admitted)
        counted = [r for r in admitted if r.counted]
        if counted:
            cached = sum(r.kv_committed_len for r in counted)
            prompt = sum(r.seq_len for r in counted)
            self.cached_tokens += cached
            self.prompt_tokens += prompt
            self.last_batch = (cached, prompt)
        return rows

    def _admit_waiting(self, rows: list[tuple[Req, int]], budget: int, reserved: int, sim: RadixCache,
                       in_flight: set[str], admitted: list[Req]) -> None:
        """``_admit``'s new requests: add waiting ones, in the policy's order, to ``rows`` and
        ``admitted`` while the budget (tokens this step), the KV room less ``reserved`` and the
        request rows allow."""
        for req in self.policy.order(self.waiting):
            active = len(self.running) + len(rows)
            if active >= self.config.max_running_requests or self.req_to_token_pool.available_size() == 0:
                break
            match = self.cache.match_prefix(req.cache_key(req.max_prefix_len()))
            if in_flight and not self.disable_radix_cache and self._should_wait(req, match.length, sim, in_flight):
                continue
            self.cache.inc_lock_ref(match.node)
            if req.num_speculative and req.seq_len - match.length > budget:
                self._drop_draft(req)  # a chunked prompt: its jump-forward draft waits until it samples
            extend = req.seq_len - match.length
            n = min(extend, budget)
            room = self.kv_pool.available_size() + self.cache.evictable_size()
            too_big = extend + self._reserve(req) > room - reserved and bool(self.running or rows)
            if too_big or n > room or (n < extend and self.chunked is not None):
                self.cache.dec_lock_ref(match.node)
                break
            try:
                self._start(req, match)  # (after it, a failure releases the lock with the request)
            except Exception:
                # The request is in no row of the step, so recovery would not release what it took
                # (its table row, its lock on the prefix): give them back, and let recovery fail it
                # with the step's error (left waiting, it would fail again on every step).
                self._unstart(req, match.node)
                self._step_reqs.append(req)
                raise
            admitted.append(req)
            self._step_reqs.append(req)
            self._alloc_for([(req, n)])
            rows.append((req, n))
            reserved += extend - n + self._reserve(req)
            budget -= n
            self._note_in_flight(req, sim, in_flight)
            if n < extend:
                self.chunked = req
            if budget <= 0:
                break

    def _take_from_waiting(self, admitted: list[Req]) -> None:
        """Remove ``admitted`` from the waiting queue. They are most often its head, in order
        (first come, first served), cut off in one C-level step: filtering the whole queue on
        every step made a select of thousands of choices (a request each) quadratic."""
        if not admitted:
            return
        if self.waiting[: len(admitted)] == admitted:  # (Req has no __eq__: compared by identity)
            del self.waiting[: len(admitted)]
            return
        gone = set(map(id, admitted))
        self.waiting = [r for r in self.waiting if id(r) not in gone]

    @staticmethod
    def _note_in_flight(req: Req, sim: RadixCache, in_flight: set[str]) -> None:
        key = req.cache_key(req.seq_len)
        sim.insert(key, torch.zeros(len(key), dtype=torch.int64))
        in_flight.add(req.rid)

    @staticmethod
    def _should_wait(req: Req, matched: int, sim: RadixCache, in_flight: set[str]) -> bool:
        """True if ``req`` would recompute a prefix another request computes this round."""
        shared = sim.match_prefix(req.cache_key(req.max_prefix_len())).length
        if req.rid in in_flight:  # a sibling sample of the same prompt: wait unless its prompt is cached
            return shared > matched
        return shared >= matched + IN_BATCH_PREFIX_THRESHOLD

    def _start(self, req: Req, match) -> None:
        """Bind an admitted request to a table row holding its matched (locked) prefix."""
        req.req_pool_idx = self.req_to_token_pool.alloc()
        req.last_node = match.node
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = match.length
        if match.length:
            self.req_to_token_pool.write(req.req_pool_idx, 0, match.indices)
        if req.cached_tokens is None:
            req.cached_tokens = min(match.length, req.prompt_len)
        req.status = ReqStatus.RUNNING

    def _unstart(self, req: Req, node) -> None:
        """Undo what a failed ``_start`` of ``req`` took: its table row, if it got one, and the
        lock ``_admit_waiting`` put on the matched prefix's ``node``; ``req`` is a waiting request
        again, holding nothing."""
        if req.req_pool_idx is not None:
            self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node = None, None
        req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = 0
        self.cache.dec_lock_ref(node)

    def _unblock_head(self) -> None:
        """Nothing runs and nothing could be admitted: the head request can never fit. Its abort
        offers the max_new_tokens that would have finished beside the pins, where its prompt fits."""
        if self.running or self.chunked or not self.waiting:
            return
        head = self.policy.order(self.waiting)[0]
        self.waiting.remove(head)
        nodes = self._pinned_nodes()
        reused = self._reused_from_pins(head, nodes)
        free = self.kv_pool.available_size() + self.cache.evictable_size()
        already = f", {reused} of them pinned already" if reused else ""
        self._finish(
            head,
            FinishReason(
                "abort",
                message=option_message(
                    f"request needs {head.kv_to_finish} KV slots to finish "
                    f"({head.seq_len} for its tokens so far{already}) but only {free} of {self.kv_pool.size} can be "
                    f"freed ({_tokens_of(nodes)} are pinned)", *_POOL_FIXES,
                    *self._fewer_new_tokens(head, free, reused)
                ),
            ),
        )

    # --- forward and results -----------------------------------------------------------------
    def _run(self, rows: list[tuple[Req, int]]) -> None:
        flight = self._launch(rows)
        if self._can_chain(flight):  # leave it in flight: the next step launches its successor first
            self._inflight = flight
        else:
            self._complete(flight)

    # --- overlapped decoding ------------------------------------------------------------------
    # SGLang v0.4's overlap ("zero-overhead") scheduler, for runs of plain decode steps: step n+1
    # is launched with step n's sampled ids still on the device as its inputs, then step n's
    # tokens are taken and processed (detokenized, checked for stops, streamed) while the device
    # computes step n+1. A request that ends at step n had one more token computed; it is
    # dropped, and its KV (of token n, which is part of the output) goes to the cache with the
    # rest. Output is the same as without overlap: nothing step n+1 samples depends on host state
    # that step n changes, for the requests ``_overlap_safe`` admits.

    def _advance(self) -> None:
        """Finish the step in flight, launching the next decode step first when it can be."""
        flight, self._inflight = self._inflight, None
        self._step_reqs.extend(r for r, _ in flight.rows)
        nxt = self._chain(flight) if self._can_chain(flight) else None
        self.overlapped_steps += nxt is not None
        self._complete(flight)
        self._inflight = nxt

    def _overlap_safe(self, req: Req) -> bool:
        """True if ``req``'s next token can be sampled before its newest one (in flight) is on
        the host: no grammar mask, no penalties over output ids, no ``min_new_tokens`` mask left,
        and the token in flight is not its last by length."""
        p = req.params
        return (req.grammar is None and p.repetition_penalty == 1 and not p.frequency_penalty
                and not p.presence_penalty and len(req.output_ids) >= p.min_new_tokens
                and len(req.output_ids) + 1 < p.max_new_tokens and req.seq_len + 1 < self.context_len)

    def _can_chain(self, flight: _Flight) -> bool:
        """True if the decode step after ``flight`` may be launched before ``flight``'s tokens are
        taken: overlap on, ``flight`` a decode step of every running request (an abort drained
        from the inbox since removed one), nothing waiting or being chunked (those go through a
        normal step), a free or evictable slot for each request's next token, and every request
        ``_overlap_safe``. Other commands (stats, snapshots) do not stop the overlap."""
        if not self.config.overlap_schedule or flight.mode is not ForwardMode.DECODE or flight.pending is None:
            return False
        if self.waiting or self.chunked is not None:  # (commands were drained: adds wait, aborts left)
            return False
        reqs = flight.picked
        if len(reqs) != len(self.running) or any(a is not b for a, b in zip(reqs, self.running)):
            return False
        if len(reqs) > self.kv_pool.available_size() + self.cache.evictable_size():
            return False
        return all(self._overlap_safe(r) for r in reqs)

    def _chain(self, flight: _Flight) -> _Flight:
        """Launch the decode step after ``flight``: each request's input is its token in flight
        (on the device), at position ``kv_committed_len``."""
        rows = [(r, 1) for r in flight.picked]
        self._alloc_for(rows)
        return self._launch(rows, input_ids=flight.pending.token_ids)

    # --- forward and results -----------------------------------------------------------------
    def _launch(self, rows: list[tuple[Req, int]], input_ids: Optional[torch.Tensor] = None) -> _Flight:
        """Build the batch of ``rows``, run the forward and launch the sampling.

        ``input_ids``: the inputs of a chained decode step (``_chain``), already on the device;
        each request then has one sampled token not yet in ``output_ids``.
        """
        ahead = int(input_ids is not None)
        ids: list[int] = []
        spans: list[tuple[int, int, int]] = []  # (req_to_token row, first position, tokens) per request
        logit_rows: list[int] = []
        sample_at: dict[int, int] = {}  # row -> index into logits
        verify_at: dict[int, int] = {}  # row -> first of its jump-forward draft's logits rows
        prompt_lp_at: dict[int, tuple[int, int, int]] = {}  # row -> (logits index, first pos, end pos)
        peek_at: dict[int, int] = {}  # row -> logits index of the next token of a max_new_tokens=0 request
        offset = 0
        unsampled: list[tuple[Req, int]] = []
        for i, (req, n) in enumerate(rows):
            start = req.kv_committed_len
            if not ahead:
                ids += req.token_slice(start, start + n)
            spans.append((req.req_pool_idx, start, n))
            if not req.prompt_logprobs_done:
                lo = max(start, req.params.logprob_start_len - 1, 0)
                hi = min(start + n, req.prompt_len - 1)  # logits at p score token p + 1
                if hi > lo:
                    prompt_lp_at[i] = (len(logit_rows), lo, hi)
                    logit_rows += range(offset + lo - start, offset + hi - start)
            if start + n == req.seq_len + ahead and len(req.output_ids) + ahead < req.params.max_new_tokens:
                k = req.num_speculative  # jump-forward: sample every draft position as well
                assert n > k, "a jump-forward draft was served from the cache unverified"
                (verify_at if k else sample_at)[i] = len(logit_rows)
                logit_rows += range(offset + n - 1 - k, offset + n)
            else:
                unsampled.append((req, n))
                if not ahead and start + n == req.seq_len and _peeks_next_token(req):
                    peek_at[i] = len(logit_rows)
                    logit_rows.append(offset + n - 1)
            offset += n
        mode = ForwardMode.DECODE if all(n == 1 for _, n in rows) else ForwardMode.EXTEND
        batch = ForwardBatch.build(
            mode,
            ids if not ahead else [0] * len(rows),
            self.req_to_token_pool.host[tuple(span_index(spans))],
            self.req_to_token_pool.req_to_token,
            [r.req_pool_idx for r, _ in rows],
            [r.kv_committed_len for r, _ in rows],
            [n for _, n in rows],
            logits_indices=logit_rows,
            device=self.runner.device,
        )
        if ahead:
            batch.input_ids = input_ids
        if any(r.mm_inputs is not None for r, _ in rows):  # [issue 10] images for the vision tower
            batch.mm_inputs = [r.mm_inputs for r, _ in rows]
        logits = self.runner.forward(batch)
        for req, n in rows:
            req.kv_committed_len += n
        flight = _Flight(rows, mode, logits, verify_at=verify_at, unsampled=unsampled)
        flight.bad_prompt = self._record_prompt_logprobs(rows, logits, prompt_lp_at)
        for i, k in peek_at.items():
            req = rows[i][0]
            lps = torch.log_softmax(logits[k : k + 1].float(), dim=-1)
            (req.next_token_logprob,) = token_logprobs(lps, lps.argmax(dim=-1), [req.params.top_logprobs_num])
        if sample_at:
            flight.picked = [rows[i][0] for i in sample_at]
            at = list(sample_at.values())
            rows_logits = logits  # a decode step samples every row, in order: no gather
            if at != list(range(len(logits))):
                rows_logits = logits[torch.tensor(at, device=logits.device)]
            # a chained step samples the token after the one in flight
            positions = [len(r.output_ids) + ahead for r in flight.picked]
            flight.pending = sample_async(rows_logits, flight.picked, self.eos_token_ids, positions=positions)
        return flight

    def _complete(self, flight: _Flight) -> None:
        """Take a launched step's results: append and stream the sampled tokens, verify drafts,
        finish, share computed prompts with the cache, move new requests to running. Requests
        that ended while the step was in flight (overlap) are skipped: their token is dropped."""
        rows = flight.rows
        live = [req for req, _ in rows if not req.finished]
        for req in live:
            req.forward_passes += 1
        for req in flight.bad_prompt:
            if not req.finished:
                self._fail_nonfinite(req, "while scoring the prompt")
        self._check_unsampled_kv(flight)
        if flight.pending is not None:
            out = flight.pending.result()
            for i, (req, tok, lp) in enumerate(zip(flight.picked, out.token_ids, out.logprobs)):
                if req.finished:
                    continue
                if i in out.bad_rows:
                    self._fail_nonfinite(req)
                elif i in out.blocked_rows:  # a user's conflicting constraints: no traceback
                    self._finish(req, blocked_reason(req))
                else:
                    self._append_token(req, tok, lp)
        for i, at in flight.verify_at.items():
            req = rows[i][0]
            if not req.finished:  # (failed above: its prompt logits were not finite)
                self._verify_jump(req, flight.logits[at : at + req.num_speculative + 1])
        if flight.mode is ForwardMode.DECODE and live:  # (a step run ahead for ended requests only: no decay)
            self.new_token_ratio = max(
                self.config.min_new_token_ratio, self.new_token_ratio - self.config.new_token_ratio_decay
            )
        running = set(map(id, self.running))
        sampled = set(map(id, flight.picked))
        for req, n in rows:
            if not req.finished and req.kv_committed_len == req.seq_len and req.params.max_new_tokens == 0:
                message = req.grammar.incomplete_message() if req.grammar else None  # '' may not match
                self._finish(req, FinishReason("length", message=message))
            if req.finished:
                continue
            new = id(req) not in running
            if n > 1 or new:  # share the freshly computed prompt (or forced tokens) at once
                self.cache.cache_unfinished_req(req)
            if req is self.chunked:
                # more chunks to come, unless the last one sampled: a jump-forward draft appended
                # then is no prompt, and runs (and is verified) in one piece as a running request's
                if req.kv_committed_len < req.seq_len and id(req) not in sampled:
                    continue
                self.chunked = None
            if new:
                self.running.append(req)

    def _check_unsampled_kv(self, flight: _Flight) -> None:
        """Fail the requests of ``flight.unsampled`` whose new KV is not finite. No logits tell it
        for them, and a prompt chunk's KV is shared at once (another request matching it would
        fail in its place); last layer only, which any non-finite value reaches."""
        rows = [(req, n) for req, n in flight.unsampled if not req.finished]
        if not rows:
            return
        table = self.req_to_token_pool.host
        slots = torch.cat([table[req.req_pool_idx, req.kv_committed_len - n : req.kv_committed_len] for req, n in rows])
        bad = self.kv_pool.nonfinite_slots(slots.to(torch.int64), last_layer_only=True).tolist()
        at = 0
        for req, n in rows:
            if any(bad[at : at + n]):
                self._fail_nonfinite(req, f"at positions {req.kv_committed_len - n}..{req.kv_committed_len - 1}",
                                     what="keys/values")
            at += n

    def _record_prompt_logprobs(self, rows, logits: torch.Tensor, at: dict[int, tuple[int, int, int]]) -> list[Req]:
        """Append this step's prompt logprobs to each request; returns the requests among them whose
        logits were not finite (failed in ``_complete``, once the step's sampling is taken)."""
        bad: list[Req] = []
        for i, (req, _) in enumerate(rows):
            if req.prompt_logprobs_done:
                continue
            if req.prompt_logprobs is None:
                req.prompt_logprobs = [None] if req.params.logprob_start_len == 0 else []
            if i in at:
                k, lo, hi = at[i]
                rows_logits = logits[k : k + hi - lo].float()
                lps = torch.log_softmax(rows_logits, dim=-1)
                targets = torch.tensor(req.token_slice(lo + 1, hi + 1), dtype=torch.int64)
                req.prompt_logprobs.extend(token_logprobs(lps, targets, [req.params.top_logprobs_num] * (hi - lo)))
                if bool(nonfinite_rows(rows_logits).any()):
                    bad.append(req)
            if req.kv_committed_len >= req.prompt_len:
                req.prompt_logprobs_done = True
        return bad

    def _append_token(self, req: Req, token: int, logprob: Optional[TokenLogprob]) -> None:
        """Add a sampled token, update text, decide whether the request is done, stream."""
        req.output_ids.append(token)
        if logprob is not None:
            req.output_logprobs.append(logprob)
        p = req.params
        reason: Optional[FinishReason] = None
        if token in req.stop_token_ids or (token in self.eos_token_ids and not p.ignore_eos):
            reason = FinishReason("stop", matched=token)  # the stop token is not part of the text
        elif token in req.stops.special_stops and len(req.output_ids) >= p.min_new_tokens:
            # a stop string that is this special token's text, which the text leaves out (SGLang reads
            # its stops in text holding special tokens): a stop, from min_new_tokens on as any stop string
            reason = FinishReason("stop", matched=req.stops.special_stops[token])
        else:
            d = req.detokenizer
            checked = len(d.text)
            d.add(token)
            hit = None
            if len(req.output_ids) >= p.min_new_tokens:
                hit = req.stops.find(d, checked, d.num_tokens - 1)
            if hit is not None:  # before the grammar's end: the stop text is never output
                self._cut_at_stop(req, hit)
                reason = FinishReason("stop", matched=hit.matched)
            elif req.stops.problem:  # a stop regex search ran too long (this sample's or another's)
                req.final_text = req.detokenizer.text[: req.sent_text_len]  # (what was held back may be a stop)
                reason = FinishReason("abort", message=req.stops.problem, field="stop_regex")
            elif req.grammar is not None and req.grammar.is_terminated():
                reason = grammar_end_reason(req, self.grammar_eos)  # (an abort if min_new_tokens bans that EOS)
        if reason is None and len(req.output_ids) >= p.max_new_tokens:
            reason = FinishReason("length", message=req.grammar.incomplete_message() if req.grammar else None)
        if reason is None and req.seq_len >= self.context_len:
            message = f"reached the context length ({self.context_len} tokens)"
            if req.grammar is not None and req.grammar.incomplete_message():
                message += "; " + req.grammar.incomplete_message()
            reason = FinishReason("length", message=message)
        if reason is not None:
            self._finish(req, reason)
        else:
            self._emit(req)
            if req.grammar is not None:
                self._jump_forward(req)

    def _fail_nonfinite(self, req: Req, where: str = "", what: str = "logits") -> None:
        """Abort a request whose logits (or, for a step that samples nothing, keys/values) were NaN
        or inf: its token or prompt logprobs would be noise. Then drop the non-finite KV it leaves
        in the cache, which would fail every request sharing the prefix."""
        where = where or f"at output token {len(req.output_ids) - req.num_speculative + 1}"
        dtype = str(self.runner.config.dtype).replace("torch.", "")
        fix = ("float16 overflows where bfloat16 does not: load the model with dtype='bfloat16' (or 'float32')"
               if dtype == "float16" else "check the checkpoint's weights for NaN or inf values")
        key = req.cache_key(min(req.kv_committed_len, req.seq_len))
        self._finish(req, FinishReason("abort", message=(
            f"the model produced NaN or infinite {what} {where} (model dtype {dtype}): {fix}")))
        dropped = self.cache.drop_nonfinite(key)
        logger.warning("request %s aborted: NaN or inf in the %s %s%s", req.rid, what, where,
                       f"; {dropped} cached tokens with non-finite KV dropped" if dropped else "")

    def _emit(self, req: Req) -> None:
        if req.finished:
            if req.final_text is None:
                req.detokenizer.flush()
                req.final_text = req.detokenizer.text
            visible, upto = req.final_text, req.kept_len
        else:
            text = req.detokenizer.text
            # what may begin a stop string is held back, and a token goes out with all its text
            safe = req.stops.safe_len(text, req.detokenizer.marks)
            upto, cut = req.detokenizer.whole_tokens(safe)
            visible = text[:cut]
        delta = visible[req.sent_text_len :]
        req.sent_text_len = max(req.sent_text_len, len(visible))
        ids = req.output_ids[req.sent_token_len : upto]
        lps = req.output_logprobs[req.sent_token_len : upto] if req.params.return_logprob else None
        req.sent_token_len = max(req.sent_token_len, upto)
        result = self._result(req) if req.finished else None
        req.emit(StreamEvent(req.rid, delta, ids, req.finished, result, req.index, lps, req.prompt_len,
                             req.cached_tokens or 0))

    @staticmethod
    def _result(req: Req) -> GenerateResult:
        assert req.finish_reason is not None and req.final_text is not None
        return GenerateResult(
            rid=req.rid,
            text=req.final_text,
            token_ids=req.output_ids[: req.kept_len],
            finish_reason=req.finish_reason,
            meta=RequestMeta(
                prompt_tokens=req.prompt_len,
                cached_tokens=req.cached_tokens or 0,
                completion_tokens=req.kept_len,
                forward_passes=req.forward_passes,
                jumped_tokens=req.jumped_tokens,
            ),
            logprobs=req.output_logprobs[: req.kept_len] if req.params.return_logprob else None,
            prompt_logprobs=list(req.prompt_logprobs or []) if req.params.logprob_start_len >= 0 else None,
            index=req.index,
            next_token_logprob=req.next_token_logprob,
        )

    # --- ending requests ---------------------------------------------------------------------
    def _release(self, req: Req) -> None:
        """Return the request's KV to the cache/pool and its table row."""
        if req.req_pool_idx is None:
            return
        # A step launched ahead (overlap) may have computed KV for a token that never reached
        # output_ids (its step failed before the token was taken): only KV of known tokens is cached.
        req.kv_committed_len = min(req.kv_committed_len, req.seq_len)
        self.cache.cache_finished_req(req)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.kv_committed_len = req.kv_allocated_len = 0

    def _finish(self, req: Req, reason: FinishReason) -> None:
        # Only a request with status WAITING is in the waiting queue (_admit takes out what it
        # admits even when it fails; end_requests' finished ones are dropped before any admission):
        # a search of the queue for every request that finished made a select of thousands of
        # choices quadratic.
        if req.status is ReqStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        self._end(req, reason)

    def _end(self, req: Req, reason: FinishReason) -> None:
        """``_finish`` of a request in no waiting queue (``end_requests`` took a batch out at once)."""
        self._drop_draft(req)
        if reason.type != "abort" and req.final_text is None:
            reason = self._stop_at_end(req, cut=reason.type == "length") or reason
        if reason.type == "length":  # (SGLang's FINISH_LENGTH says how long the output got)
            reason = replace(reason, length=len(req.output_ids))
        req.finish_reason = reason
        req.status = ReqStatus.FINISHED
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked:
            self.chunked = None
        self._release(req)
        self._emit(req)

    @staticmethod
    def _stop_at_end(req: Req, cut: bool = False) -> Optional[FinishReason]:
        """The stop at the end of ``req``'s output (its max tokens, an EOS or stop token, its
        grammar's end), met in what the output's end settles: the text the detokenizer held back
        until then (a run of SentencePiece byte tokens, as Llama 2 writes "\\n"; the bytes of a
        character), which ``flush`` gives and any stop string or regex may read, as where a later
        token gives it; a stop regex's match that reads the end of the text, a stop only once what
        follows it is known (``StopStringMatcher.find``), and here nothing does, unless the output
        was ``cut`` (max tokens, the context length: finish reason ``length``), whose end is no end
        of the output a match may read (``x$`` on an output cut after "x" is no stop: the output
        was cut, not stopped, its finish reason stays ``length``, as SGLang's); a stop string
        holding a special token's text that reads text held back before the token
        (``stop_special``). Sets ``final_text`` cut there, as for any stop; None where there is
        none. Where a stop regex's search ran too long (``StopStringMatcher.problem``), an abort
        naming it, the text cut where the stream stood, as at a token (what was held back may be a
        stop)."""
        if len(req.output_ids) < req.params.min_new_tokens:  # (no text was checked)
            return None
        d = req.detokenizer
        checked = len(d.text)
        d.flush()
        if len(d.text) == checked and not req.stops.reads_end:
            return None  # (nothing new to read: the text was read as it came)
        hit = req.stops.find(d, checked, d.num_tokens, at_end=not cut)
        if hit is None and req.stops.problem:
            req.final_text = req.detokenizer.text[: req.sent_text_len]
            return FinishReason("abort", message=req.stops.problem, field="stop_regex")
        if hit is None:
            return None
        Scheduler._cut_at_stop(req, hit)
        return FinishReason("stop", matched=hit.matched)

    @staticmethod
    def _cut_at_stop(req: Req, hit: StopHit) -> None:
        """End ``req``'s output at the stop ``hit``: its text where the stop begins, its tokens (ids,
        logprobs, ``completion_tokens``) through the one that ends the stop (``StopHit.tokens``),
        as SGLang stops at that token; those wholly after the stop (text held back before it came
        with them: a run of byte tokens, a character's bytes; one that settled a regex's match;
        an EOS) are dropped. What was streamed stays (a stop in text shown before was met late), and
        so do the first ``min_new_tokens``: no stop is read before then, and SGLang's first check,
        which stops, is there (a "\\n" held back in a byte token before it is met at it)."""
        req.final_text = req.detokenizer.text[: max(hit.start, req.sent_text_len)]
        # (at least the token after which the stop was met: an empty match at the output's start, a
        # stop regex that is a lookahead, (?= ok) on " ok", ends before any token's text, so
        # hit.tokens is 0; SGLang, which cuts only the text, keeps the tokens it read, as does
        # vLLM for a stop string met in the first token, text "")
        req.finished_len = max(hit.tokens, req.sent_token_len, req.params.min_new_tokens, 1)

    def _requests(self) -> list[Req]:
        """Every request the scheduler holds: waiting, running and the one being chunked."""
        return self.waiting + self.running + ([self.chunked] if self.chunked else [])

    def abort(self, rid: str, message: str = ABORT_REQUESTED) -> int:
        """Finish every sample of ``rid`` with reason abort; returns how many were live."""
        live = [r for r in self._requests() if r.rid == rid and not r.finished]
        self.end_requests(live, FinishReason("abort", message=message))
        return len(live)

    def _abort_all(self, message: str) -> None:
        for r in self._requests():
            if not r.finished:
                try:
                    self._finish(r, FinishReason("abort", message=message))
                except Exception:  # noqa: BLE001 - the engine stops: the others and the stop go on
                    logger.exception("could not release request %s at shutdown", r.rid)
                    self._report_failure(r, message)
        self._inflight = None

    def _recover(self, exc: Exception) -> None:
        """Fail the requests of the step that raised; rebuild memory if it cannot be returned."""
        logger.exception("scheduler step failed")
        message = f"internal error: {type(exc).__name__}: {exc}"
        affected = list(dict.fromkeys(self._step_reqs))
        self._step_reqs = []
        clean = True
        for req in affected:
            if req.finished and req.req_pool_idx is not None:
                # its own clean-up raised (the failure of this step): finished, never answered
                clean = False
                self._report_failure(req, message)
                continue
            if req.finished:
                continue
            try:
                self._finish(req, FinishReason("abort", message=message))
            except Exception:  # noqa: BLE001 - memory state is suspect; rebuild below
                clean = False
                self._report_failure(req, message)
        if not clean or self._kv_suspect:
            self._rebuild_memory()

    def _report_failure(self, req: Req, message: str) -> None:
        """Finish ``req`` as aborted with ``message`` without touching KV memory (it is suspect)."""
        req.req_pool_idx = None
        req.finish_reason = FinishReason("abort", message=message)
        req.final_text = req.detokenizer.text
        try:
            req.emit(StreamEvent(req.rid, "", [], True, self._result(req), req.index))
        except Exception:  # noqa: BLE001 - the other requests must still hear of it
            logger.exception("could not report the failure of request %s", req.rid)

    def _rebuild_memory(self) -> None:
        """Last resort after a failed clean-up: fail everything that holds KV, start empty pools."""
        for req in self.running + ([self.chunked] if self.chunked else []):
            self._report_failure(req, "internal error: KV memory was reset")
        self.running, self.chunked, self.pins, self._inflight = [], None, {}, None
        for req in self.waiting:
            req.req_pool_idx, req.last_node = None, None
            req.cache_protected_len = req.kv_committed_len = req.kv_allocated_len = 0
        self.runner.reset_pools()
        self._build_cache()
        self._kv_suspect = False

    def _stop_after_failed_recovery(self, exc: Exception) -> None:
        """End the loop when even new KV pools could not be made (out of memory on the GPU, say):
        every request and queued command fails with the reason, and later calls say it too,
        rather than waiting on a loop that is gone."""
        logger.exception("scheduler recovery failed; the engine stops")
        message = f"internal error, and the engine could not recover: {type(exc).__name__}: {exc}"
        for req in self._requests():
            if not req.finished:
                self._report_failure(req, message)
        self.waiting, self.running, self.chunked, self._inflight = [], [], None, None
        with self._post_lock:
            self._death = f" ({message})"
            self._stopped.set()
        self._fail_pending_commands(message)
        self._run_exit_hooks()

    # --- jump-forward support ------------------------------------------------------------------
    def rollback(self, req: Req, num_kept: int) -> None:
        """Drop ``req``'s output tokens after the first ``num_kept`` and free their KV, so forced
        tokens appended next (``req.append_forced``) are extended by the next step. Scheduler
        thread only (constrained decoding calls it from its post-sampling hook)."""
        old_protected = req.cache_protected_len
        req.truncate_output(num_kept)
        new_len = req.seq_len
        if req.req_pool_idx is None or req.kv_allocated_len <= new_len:
            req.kv_committed_len = min(req.kv_committed_len, new_len)
            return
        if new_len < old_protected:  # the cut falls inside the locked cached prefix: lock less
            match = self.cache.match_prefix(req.cache_key(new_len))
            assert match.length == new_len, "a locked prefix vanished from the cache"
            self.cache.inc_lock_ref(match.node)
            self.cache.dec_lock_ref(req.last_node)
            req.last_node, req.cache_protected_len = match.node, new_len
        own_from = max(new_len, old_protected)
        self.kv_pool.free(self.req_to_token_pool.host[req.req_pool_idx, own_from : req.kv_allocated_len].to(torch.int64))
        req.kv_committed_len = req.kv_allocated_len = new_len

    # --- constrained decoding: jump-forward (lmnb_engine.constrained.request_grammar) ------------
    def _jump_forward(self, req: Req) -> None:
        """Append the draft of the grammar's forced string; the next step extends it. Certain
        tokens are output at once; if they complete the output, the request ends here."""
        budget = min(req.params.max_new_tokens - len(req.output_ids), self.context_len - req.seq_len) - 1
        certain, draft = req.grammar.plan_jump(req.output_ids, budget)
        if draft:
            req.append_forced(draft)
            req.num_speculative = len(draft) - certain
        if req.grammar.is_terminated():
            self._finish(req, grammar_end_reason(req, self.grammar_eos))

    def _verify_jump(self, req: Req, logits: torch.Tensor) -> None:
        """Sample each draft position (rows of ``logits``, float [k+1, V]) under its own mask; keep
        the draft tokens the sampler agrees with, roll back the rest, append the sampler's token."""
        k = req.num_speculative
        first = len(req.output_ids) - k
        # row i samples output position first + i: the draw one-token decoding would use there
        out = sample(logits, [req] * (k + 1), self.eos_token_ids, grammar_bitmask=req.grammar.verification_bitmask(),
                     positions=range(first, first + k + 1))
        if out.bad_rows:
            self._fail_nonfinite(req)
            return
        kept, token = req.grammar.verify(out.token_ids)
        req.num_speculative = 0
        if kept < k:
            self.rollback(req, first + kept)
            req.jumped_tokens -= k - kept
        if req.params.return_logprob:
            req.output_logprobs[first : first + kept] = out.logprobs[:kept]
        if token is None:  # the kept draft completed the output
            self._finish(req, grammar_end_reason(req, self.grammar_eos))
        else:
            self._append_token(req, token, out.logprobs[kept])

    def _drop_draft(self, req: Req) -> None:
        """Remove an unverified draft from a request that stops running (it is not output)."""
        k = req.num_speculative
        if not k:
            return
        req.grammar.drop_speculative()
        req.num_speculative = 0
        req.jumped_tokens -= k
        keep = len(req.output_ids) - k
        if req.kv_committed_len > req.prompt_len + keep:  # computed, but the step failed before verifying
            self.rollback(req, keep)
        else:
            req.truncate_output(keep)

    # --- observability (scheduler thread) -------------------------------------------------------
    def held_by_requests(self) -> int:
        """KV slots owned by running requests (not by the cache). Mid-step (a ``subscribe``
        listener asking) these include the step's new requests, not among the running ones yet."""
        reqs = dict.fromkeys(self.running + ([self.chunked] if self.chunked else []) + self._step_reqs)
        return sum(r.kv_allocated_len - r.cache_protected_len for r in reqs if r.req_pool_idx is not None)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless free + evictable + protected + held == pool size."""
        self.cache.check_invariants()
        total = (
            self.kv_pool.available_size()
            + self.cache.evictable_size()
            + self.cache.protected_size()
            + self.held_by_requests()
        )
        assert total == self.kv_pool.size, (
            f"KV accounting broken: free {self.kv_pool.available_size()} + evictable "
            f"{self.cache.evictable_size()} + protected {self.cache.protected_size()} + held "
            f"{self.held_by_requests()} != pool size {self.kv_pool.size}"
        )

    def stats(self) -> dict:
        """Cache hit rates, KV pool usage and queue lengths (``Engine.cache_stats``)."""
        cached, prompt = self.last_batch
        pool = self.kv_pool
        return {
            "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "last_batch_hit_rate": cached / prompt if prompt else 0.0,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "evicted_tokens": self.cache.evicted_tokens,
            "pool_size": pool.size,
            "pool_used": pool.size - pool.available_size(),
            "free_tokens": pool.available_size(),
            "evictable_tokens": self.cache.evictable_size(),
            "protected_tokens": self.cache.protected_size(),
            "held_tokens": self.held_by_requests(),
            "pinned_prefixes": len(self.pins),
            "running_requests": len(self.running) + (1 if self.chunked else 0),
            "waiting_requests": sum(not r.finished for r in self.waiting),  # (finished: end_requests left them)
            "retracted_requests": self.retracted_requests,
            "overlapped_steps": self.overlapped_steps,
            "new_token_ratio": self.new_token_ratio,
        }
