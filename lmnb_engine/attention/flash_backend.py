"""``AttentionBackend`` that runs extend attention on flash-attn when it is installed.

flash-attn is an optional extra (``pip install lmnb[flash]``, or a Hopper build of FlashAttention-3
that provides ``flash_attn_interface``); nothing requires it. torch 2.11 and later ship the same
FlashAttention-2 varlen kernel (``torch.nn.attention.varlen.varlen_attn``, ``torch_varlen``),
tried after any installed flash-attn. What it is used for, and why:

- EXTEND batches (prefills, chunks, cache-hit extends, mixed batches) whose new tokens are at
  least as many as their cached ones call its variable-length kernel, ``flash_attn_varlen_func``,
  with ``causal=True``. Since flash-attn 2.1 a causal mask of a non-square block is aligned at
  the bottom right, so a request's ``n`` new queries at the end of a ``p + n`` key sequence see
  exactly keys ``0..p+i``: the extend semantics. A batch with no cached prefix passes the new
  K/V as they are; otherwise each request's keys are gathered from the pool into one packed
  buffer first, because FlashAttention-2's paged mode takes only pages of 256 tokens and lmnb's
  pool has 1-token pages (RadixAttention's granularity). That gather is why an extend dominated
  by its cached prefix (a few new tokens after a long hit, decode rows of a mixed batch) stays
  on the Triton extend kernel, which reads the pool in place: the copy would cost more than
  flash-attn saves, and its buffer (at most twice the new tokens' K/V) stays small.
- DECODE batches stay on the Triton split-KV kernel (``TritonAttentionBackend``): it reads the
  pool in place, where a flash-attn call would need the whole KV gathered every step, and it is
  what the CUDA graphs capture. fp32 models, or shapes flash-attn does not take, stay on Triton
  too under "auto" (asked for by name, flash-attn refuses them at start-up).

Each installed flash-attn is checked against a float32 reference when the engine starts
(``prepare``), on small ragged batches laid out as real calls are (q a strided view of the fused
qkv output; with and without cached prefixes; GQA as the model has it); the first that passes
is used. One that fails it (a flash-attn older than 2.1 aligns the causal mask at the top left
and would be silently wrong) is not: with ``strict`` (the backend asked for by name) that is an
error, otherwise a warning and the Triton kernels. A flash-attn call that raises later (other
than for lack of memory), or returns a tensor of the wrong shape, dtype or device, falls back to
the Triton kernels for that batch and every later one, with a warning, so the batch's requests
are not lost; out of memory, only that batch runs on Triton. A sticky CUDA error (an illegal
memory access) cannot be recovered that way, nor is a NaN noticed after the start-up check.

Under "auto" (not ``strict``) a flash-attn that passes its check must also beat the Triton
extend kernel by 5 % on a timed prefill of the model's heads (``slower_than_triton``); otherwise
the Triton kernels keep extend, as they would without flash-attn. FlashAttention-2 is not always
the faster of the two: Triton compiles the extend kernel for the GPU it runs on (Hopper's
warpgroup MMA included), which FlashAttention-2 does not use.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from lmnb_engine.attention.torch_backend import sdpa_gqa
from lmnb_engine.attention.triton_backend import TritonAttentionBackend
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode

log = logging.getLogger(__name__)

FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# The modules that provide ``flash_attn_varlen_func``, in order of preference: FlashAttention-3
# (Hopper) and FlashAttention-2.
MODULES = ("flash_attn_interface", "flash_attn")
# Worst error the start-up check accepts: outputs are averages of values in [-1, 1], so 16-bit
# rounding of the softmax weights and the output stays under 2**-8; a wrong mask is off by ~0.1.
CHECK_TOLERANCE = 2 ** -6
# The prefill "auto" times a flash-attn on against the Triton extend kernel (``slower_than_triton``),
# and how much faster it must be to run extends.
TIMED_BATCH, TIMED_SEQ = 2, 2048
TIMED_MARGIN = 0.05
TIMED_REPS, TIMED_ROUNDS = 10, 4  # calls per timing (~0.2 ms each on an H200), timings per kernel


@dataclass(frozen=True)
class FlashAttn:
    """One importable flash-attn: its ``flash_attn_varlen_func`` and a label for messages.

    ``optional``: one lmnb found by itself (torch's own, ``torch_varlen``) rather than one the
    user installed, so its failing the start-up check is logged, not warned about.
    """

    varlen: Callable
    label: str
    optional: bool = False


def find_flash_attn(modules: Sequence[str] = MODULES) -> tuple[list[FlashAttn], list[str]]:
    """Every one of ``modules`` that imports and has ``flash_attn_varlen_func``, in order, and
    why each other one that is present is not usable (a build for another CUDA or torch, or a
    flash-attn 1.x). flash-attn is never required, so nothing here raises."""
    found, problems = [], []
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                continue
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure means "not usable here"
            problems.append(f"{name} is installed but does not import ({type(exc).__name__}: {exc})")
            continue
        version = getattr(mod, "__version__", None)
        label = f"{name} {version}" if version else name
        fn = getattr(mod, "flash_attn_varlen_func", None)
        if fn is None:
            problems.append(f"{label} has no flash_attn_varlen_func (flash-attn 1.x?)")
        else:
            found.append(FlashAttn(fn, label))
    return found, problems


def torch_varlen() -> Optional[FlashAttn]:
    """torch's own FlashAttention-2 varlen kernel (``torch.nn.attention.varlen.varlen_attn``) in
    flash-attn's calling convention, or None where this torch has none that takes ``scale`` and
    the causal ``window_size=(-1, 0)`` (torch 2.11 on; 2.10's has neither).

    It is the kernel of ``flash_attn_varlen_func`` built into torch's CUDA wheels, so a GPU
    without the flash-attn package still gets it; like an installed flash-attn it must pass the
    start-up check (``self_check``) before it runs anything.
    """
    try:
        from torch.nn.attention import varlen
    except ImportError:
        return None
    fn = getattr(varlen, "varlen_attn", None)
    params = set(inspect.signature(fn).parameters) if fn is not None else set()
    if not {"scale", "window_size"} <= params:
        return None
    # torch 2.12 on refuses fewer KV heads than query heads unless told (the kernel takes them
    # as flash-attn does); 2.11 has no such flag and passes them through
    gqa_flag = "enable_gqa" in params

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale=None, causal=False):
        gqa = {"enable_gqa": q.shape[1] != k.shape[1]} if gqa_flag else {}
        return fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=softmax_scale,
                  window_size=(-1, 0) if causal else (-1, -1), **gqa)

    return FlashAttn(flash_attn_varlen_func, f"torch {torch.__version__} varlen_attn", optional=True)


def unsupported(head_dim: int, dtype: torch.dtype) -> Optional[str]:
    """Why flash-attn cannot run a model of this head size and dtype, or None if it can."""
    if dtype not in FLASH_DTYPES:
        return f"it runs float16/bfloat16 models, not {str(dtype).replace('torch.', '')}"
    if head_dim > MAX_HEAD_DIM or head_dim % 8:
        return f"it takes head_dim <= {MAX_HEAD_DIM} in multiples of 8, not {head_dim}"
    return None


def refusal_fix(dtype: torch.dtype) -> str:
    """The fix to name when flash-attn, asked for by name, cannot take a model of this dtype."""
    if dtype not in FLASH_DTYPES:
        return "use dtype='bfloat16' (or 'float16'), or attention_backend='triton'"
    return "use attention_backend='triton'"


def _fused_qkv(T: int, hq: int, hkv: int, d: int, g: torch.Generator, dtype, device):
    """q, k, v [T, H, D] as views of one [T, (hq + 2 hkv) d] buffer, as the model's qkv split
    gives them; q, k standard normal, v uniform in [-1, 1]."""
    qk = torch.randn(T, (hq + hkv) * d, generator=g)
    qkv = torch.cat([qk, torch.rand(T, hkv * d, generator=g) * 2 - 1], dim=1).to(device, dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    return q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)


def _reference_extend(q, k, v, q_lens, k_lens, scale):
    """Float32 attention per request with the bottom-right causal mask, ``q``: [Tq, Hq, D]."""
    out, qo, ko = [], 0, 0
    for nq, nk in zip(q_lens, k_lens):
        qi, ki, vi = (x.float().transpose(0, 1)[None] for x in (q[qo:qo + nq], k[ko:ko + nk], v[ko:ko + nk]))
        allowed = torch.arange(nk)[None, :] <= torch.arange(nk - nq, nk)[:, None]
        out.append(sdpa_gqa(qi, ki, vi, scale, attn_mask=allowed.to(qi.device))[0].transpose(0, 1))
        qo, ko = qo + nq, ko + nk
    return torch.cat(out)


def _call(flash: FlashAttn, q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float) -> torch.Tensor:
    out = flash.varlen(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                       softmax_scale=scale, causal=True)
    return out[0] if isinstance(out, tuple) else out  # some FlashAttention-3 builds add the LSE


def _output_problem(out, q: torch.Tensor) -> Optional[str]:
    """Why ``out`` is not an attention result for queries ``q`` (same shape, dtype and device),
    or None; from tensor metadata only, so checking every call costs no device sync."""
    if isinstance(out, torch.Tensor) and (out.shape, out.dtype, out.device) == (q.shape, q.dtype, q.device):
        return None
    got = (tuple(out.shape), out.dtype, out.device) if isinstance(out, torch.Tensor) else type(out).__name__
    return f"it returned {got}, not a {tuple(q.shape)} {q.dtype} tensor on {q.device}"


def self_check(flash: FlashAttn, hq: int, hkv: int, d: int, dtype: torch.dtype,
               device: torch.device) -> Optional[str]:
    """None if ``flash`` matches the float32 reference on two small ragged batches laid out as
    the backend calls it, else what went wrong: a cold batch (q, k, v strided views of one
    fused buffer) and one with cached prefixes (q a view, k/v packed as the pool gather gives)."""
    g = torch.Generator().manual_seed(0)
    scale = d ** -0.5
    for q_lens, k_lens in (([5, 3], [5, 3]), ([3, 1, 5], [7, 4, 5])):  # prefixes 0 / 4, 3 and 0
        q, k, v = _fused_qkv(sum(q_lens), hq, hkv, d, g, dtype, device)
        if k_lens != q_lens:
            _, k, v = (x.contiguous() for x in _fused_qkv(sum(k_lens), hq, hkv, d, g, dtype, device))
        cu = [F.pad(torch.tensor(n, device=device).cumsum(0, dtype=torch.int32), (1, 0)) for n in (q_lens, k_lens)]
        try:
            out = _call(flash, q, k, v, cu[0], cu[1], max(q_lens), max(k_lens), scale)
        except Exception as exc:  # noqa: BLE001 - an unusable build is reported, not raised deep inside
            return f"flash_attn_varlen_func failed ({type(exc).__name__}: {exc})"
        problem = _output_problem(out, q)
        if problem:
            return problem
        err = (out.float() - _reference_extend(q, k, v, q_lens, k_lens, scale)).abs().max().item()
        if not err <= CHECK_TOLERANCE:  # NaN fails too
            return (f"its output differs from the reference by {err:.3g} on a batch "
                    f"{'with' if k_lens != q_lens else 'without'} cached prefixes "
                    "(e.g. flash-attn < 2.1 aligns the causal mask at the top left)")
    return None


def _gpu_ms(fn: Callable[[], object], reps: int = TIMED_REPS) -> float:
    """Milliseconds per call of ``fn`` over ``reps`` calls back to back on the current CUDA stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _alternating_ms(fns: Sequence[Callable[[], object]], time_ms: Callable[[Callable[[], object]], float],
                    rounds: int = TIMED_ROUNDS) -> list[float]:
    """The least of ``rounds`` timings (``time_ms``, ms) of each of ``fns``, timed in turn round
    by round (a, b, a, b, ...): a GPU whose clock is still rising after the warm-up (an idle H200
    runs at a sixth of its busy clock) then slows each kernel alike, instead of the one timed first."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], time_ms(fn))
    return best


def _extend_times(flash: FlashAttn, hq: int, hkv: int, d: int, dtype: torch.dtype,
                  device: torch.device) -> Optional[tuple[float, float]]:
    """(flash-attn ms, Triton extend kernel ms) on a cold causal prefill of ``TIMED_BATCH`` prompts
    of ``TIMED_SEQ`` tokens with the model's heads (``_alternating_ms`` after a warm-up call of
    each, which compiles the Triton kernel and lets flash-attn allocate its workspace), or None
    where there is nothing to compare: off CUDA, the Triton kernel failing on it, or flash-attn
    running out of memory (which, as at run time, does not make it unusable). Raises what another
    failure of the flash-attn call raises."""
    if device.type != "cuda":
        return None
    from lmnb_engine.attention.triton_ops import extend_attention_fwd

    batch, seq = TIMED_BATCH, TIMED_SEQ
    T, scale = batch * seq, d ** -0.5
    qkv = torch.randn(T, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    q, k, v = (x.view(T, -1, d) for x in qkv.split([hq * d, hkv * d, hkv * d], dim=1))
    lens = torch.full((batch,), seq, dtype=torch.int64, device=device)
    cu = F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    pool = torch.zeros(1, hkv, d, dtype=dtype, device=device)  # no cached prefix: never read
    # a table row stride of 1 would compile (and time) a specialization the engine never runs
    table = torch.zeros(batch, 16, dtype=torch.int32, device=device)
    rows, out = torch.arange(batch, device=device), torch.empty_like(q)

    def triton_call():
        extend_attention_fwd(q, k, v, out, pool, pool, table, rows, torch.zeros_like(lens), lens, cu[:-1].long(),
                             seq, scale)

    def flash_call():
        _call(flash, q, k, v, cu, cu, seq, seq, scale)

    try:
        triton_call()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the check passed flash-attn; the Triton kernel could not run this
        log.warning("the Triton extend kernel failed on a timed prefill", exc_info=True)
        return None
    try:
        flash_call()
        flash_ms, triton_ms = _alternating_ms([flash_call, triton_call], _gpu_ms)
    except torch.cuda.OutOfMemoryError:
        return None
    return flash_ms, triton_ms


def slower_than_triton(flash: FlashAttn, hq: int, hkv: int, d: int, dtype: torch.dtype,
                       device: torch.device) -> Optional[str]:
    """Why the Triton extend kernel should run this model's prefills instead of ``flash``: it is
    not at least ``TIMED_MARGIN`` faster on a timed prefill (``_extend_times``). None where
    ``flash`` is, or there is nothing to compare. The margin keeps near-ties on one kernel, so
    that restarts of the same engine rarely switch kernels (whose bf16 outputs may differ on
    near-tied tokens); ``model_info()["attention_backend"]`` says which runs. Raises what the
    flash-attn call raises when timed (other than running out of memory)."""
    times = _extend_times(flash, hq, hkv, d, dtype, device)
    if times is None or times[0] <= (1 - TIMED_MARGIN) * times[1]:
        return None
    return (f"it is not {TIMED_MARGIN:.0%} faster than the Triton extend kernel on a {TIMED_BATCH} x {TIMED_SEQ}-token "
            f"prefill of this model's heads ({times[0]:.3f} ms against {times[1]:.3f} ms)")


class FlashAttentionBackend(TritonAttentionBackend):
    """flash-attn for extend attention, the Triton kernels for decode and everything else.

    Args:
        candidates: the flash-attns to try, in order (``find_flash_attn()[0]``); ``prepare``
            keeps the first that passes its check.
        strict: raise, instead of warning and using Triton, when no candidate can run this
            model (fp32, head_dim over 256) or passes its start-up check.
        other arguments: as ``TritonAttentionBackend``.
    Raises:
        ValueError: no candidates.
    """

    def __init__(self, candidates: Sequence[FlashAttn], strict: bool = False, **triton_kwargs) -> None:
        super().__init__(**triton_kwargs)
        if not candidates:
            raise ValueError("FlashAttentionBackend needs at least one flash-attn (find_flash_attn)")
        self.candidates = list(candidates)
        self.strict = strict
        self.flash: Optional[FlashAttn] = None  # set by ``prepare``: the one extend runs on
        self._use_flash = False
        self._meta: Optional[tuple] = None

    @property
    def name(self) -> str:
        """"<flash-attn> (extend) + triton", or "triton" when flash-attn is not in use."""
        return f"{self.flash.label} (extend) + triton" if self.flash is not None else "triton"

    @property
    def active(self) -> bool:
        """True once ``prepare`` found a flash-attn for this model (until a call fails)."""
        return self.flash is not None

    def prepare(self, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device | str) -> None:
        """Pick the first candidate that can run this model and passes ``self_check`` (warning
        about any installed one passed over for failing it); unless
        ``strict``, also one that is faster than the Triton extend kernel on this model's heads
        (``slower_than_triton``, on CUDA), so that "auto" never trades a fast kernel for a slower
        one. Under tensor parallelism each rank times its own shard's heads, and the ranks then agree
        (``distributed.runner.agree_on_extend_kernel``).

        Raises:
            ValueError: ``strict`` and flash-attn does not take this model (dtype, head_dim), as
                ``Engine(tp_size=N)`` raises before spawning its workers.
            RuntimeError: ``strict`` and every installed build fails its check (the message says
                why, for each).
        """
        self.flash = None
        dev = torch.device(device)
        not_taken = unsupported(head_dim, dtype)
        reasons, failed = [], False
        for cand in self.candidates if not_taken is None else ():
            problem = self_check(cand, num_q_heads, num_kv_heads, head_dim, dtype, dev)
            if problem is None and not self.strict:
                try:
                    slower = slower_than_triton(cand, num_q_heads, num_kv_heads, head_dim, dtype, dev)
                except Exception as exc:  # noqa: BLE001 - fails like a failed check
                    problem = f"it failed on a timed prefill ({type(exc).__name__}: {exc})"
                else:
                    if slower is not None:  # expected on some GPUs: not a fault
                        reasons.append(f"{cand.label}: {slower}")
                        continue
            if problem is None:
                self.flash = cand
                if failed:  # an installed build passed over for a later candidate: say so all the same
                    warnings.warn(f"flash-attn does not run extend attention for this model: {'; '.join(reasons)}. "
                                  f"{cand.label} runs it instead", RuntimeWarning, stacklevel=2)
                return
            failed |= not cand.optional  # an installed build that fails: warn
            reasons.append(f"{cand.label}: {problem}")
        labels = ", ".join(c.label for c in self.candidates)
        msg = f"flash-attn ({labels}) does not run extend attention for this model: {not_taken or '; '.join(reasons)}"
        if self.strict:
            fix = refusal_fix(dtype)
            raise (ValueError if not_taken else RuntimeError)(f"{msg}. {fix[0].upper()}{fix[1:]}")
        if failed:  # a model flash-attn does not take, or a slower one, is expected; a broken build is not
            warnings.warn(f"{msg}. The Triton kernels run it instead", RuntimeWarning, stacklevel=2)
        else:
            log.info("%s; the Triton kernels run it instead", msg)

    def init_forward(self, batch: ForwardBatch) -> None:
        """As ``TritonAttentionBackend``, and whether flash-attn runs this batch: an EXTEND with
        at least as many new tokens as cached ones (its metadata waits for the first layer)."""
        super().init_forward(batch)
        self._meta = None
        self._use_flash = (self.active and batch.mode is ForwardMode.EXTEND
                           and sum(batch.seq_lens_cpu) <= 2 * sum(batch.extend_seq_lens_cpu))

    def _extend_meta(self, batch: ForwardBatch) -> tuple:
        """(cu_seqlens_q, cu_seqlens_k, max_q, max_k, kv_slots or None), built once per batch on
        the device (no host sync: the lengths are already there).

        ``kv_slots`` (int64 [sum(seq_lens)]) lists each request's pool slots ``0..seq_len`` in
        order; None when no request has a cached prefix (the new K/V are the whole keys).
        """
        if self._meta is None:
            ends_k = batch.seq_lens.cumsum(0)
            cu_q = F.pad(batch.extend_seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
            cu_k = F.pad(ends_k.to(torch.int32), (1, 0))
            slots = None
            if any(batch.extend_prefix_lens_cpu):
                total_k = sum(batch.seq_lens_cpu)
                dev = batch.seq_lens.device
                tok_req = torch.repeat_interleave(torch.arange(batch.batch_size, device=dev), batch.seq_lens,
                                                  output_size=total_k)
                pos = torch.arange(total_k, device=dev) - (ends_k - batch.seq_lens)[tok_req]
                slots = batch.req_to_token[batch.req_pool_indices[tok_req], pos].long()
            self._meta = (cu_q, cu_k, max(batch.extend_seq_lens_cpu), max(batch.seq_lens_cpu), slots)
        return self._meta

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
                v_pool: torch.Tensor, batch: ForwardBatch, scale: float) -> torch.Tensor:
        """An extend that ``init_forward`` gave to flash-attn on it (the new K/V already in the
        pool), anything else on the Triton kernels."""
        if not self._use_flash:
            return super()._attend(q, k, v, k_pool, v_pool, batch, scale)
        cu_q, cu_k, max_q, max_k, slots = self._extend_meta(batch)
        try:
            keys, values = (k, v) if slots is None else (k_pool.index_select(0, slots), v_pool.index_select(0, slots))
            out = _call(self.flash, q, keys, values, cu_q, cu_k, max_q, max_k, scale)
            problem = _output_problem(out, q)
            if problem is None:
                return out
            problem = f"returned a wrong result on an extend batch: {problem}"
        except torch.cuda.OutOfMemoryError:
            # the gathered keys or flash-attn's workspace did not fit: this batch on the Triton
            # kernel, which reads the pool in place; flash-attn stays on for the next ones
            log.warning("%s ran out of memory on an extend batch; the Triton kernel runs it", self.flash.label)
            return super()._attend(q, k, v, k_pool, v_pool, batch, scale)
        except Exception as exc:  # noqa: BLE001 - fall back rather than lose the batch's requests
            problem = f"failed on an extend batch ({type(exc).__name__}: {exc})"
        warnings.warn(f"{self.flash.label} {problem}; extend attention runs on the Triton kernels from now on "
                      "(attention_backend='triton' leaves flash-attn out)", RuntimeWarning, stacklevel=3)
        self.flash, self._use_flash = None, False
        return super()._attend(q, k, v, k_pool, v_pool, batch, scale)
