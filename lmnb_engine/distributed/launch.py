"""Start and stop the tensor-parallel group of an ``Engine(tp_size=N)``.

Rank 0 lives in the calling process (its scheduler drives every forward); ranks 1..N-1 are
spawned worker processes. Start-up, in an order chosen so that every failure surfaces as an
error naming the rank rather than as a collective that never returns:

1. rank 0 loads its shard of the model (this checks the path, the architecture and that the
   heads divide by N) before any process is spawned;
2. the workers load their shards of the same checkpoint (same dtype) on their own device
   (``cuda:rank``, or the CPU) and report back through a pipe; rank 0 waits for all, and raises
   a worker's load error as it is (its type, its message, the fixes front ends reword):
   the caller sees what a single process's load would have raised;
3. every rank joins the process group (NCCL on GPUs, gloo on CPU; a rendezvous file in a fresh
   temporary directory) and builds its ``TensorParallelRunner`` shard; the workers then follow
   rank 0's broadcast batches in ``worker_loop``.

``shutdown`` releases the workers, joins them and leaves the process group. One tensor-parallel
engine per process at a time: ``torch.distributed`` has one default group.

The workers ignore SIGINT: Ctrl-C in a terminal, and Jupyter's "interrupt kernel", signal the
whole process group, and the interrupt is rank 0's to handle (it aborts the requests; the
workers wait for the next batch). A worker that dies anyway leaves the group unusable; the
engine then says so (``TensorParallelGroup.check_alive``) instead of running requests.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import types
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist

from lmnb_engine.distributed.layers import TPGroup
from lmnb_engine.distributed.runner import TensorParallelRunner, worker_loop

# Longest a collective may wait for a peer (a worker stuck or gone); generous, since the first
# forward on a GPU compiles kernels.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=600)
LOAD_TIMEOUT_S = 900.0


@contextlib.contextmanager
def _main_hidden_from_spawn():
    """While starting workers, show multiprocessing's spawn an empty ``__main__``.

    Spawn re-runs the parent's main script in each child (to find functions defined there); the
    workers need nothing from it (their target lives here). Re-running it would execute a
    script's top level again when it lacks an ``if __name__ == "__main__":`` guard, fail for a
    script read from stdin, and trip over IPython's ``__main__``, which has no ``__spec__``."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _worker_main(rank: int, size: int, init_method: str, backend: str, load_kwargs: dict, runner_kwargs: dict,
                 conn) -> None:
    """A worker rank: load, report, join, shard, follow rank 0 until it shuts the group down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are rank 0's (module docstring)
    from lmnb_engine.model_loader import load_model

    stage, code = "load the model", 0
    try:
        device = load_kwargs.pop("device")
        if device.startswith("cuda"):
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
        loaded = load_model(device=device, tp=TPGroup(rank, size), **load_kwargs)
        conn.send(("loaded", None, None))
        stage = "join the process group"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                timeout=COLLECTIVE_TIMEOUT)
        dist.barrier()  # (rank 0's side of the group is up too: see start_tensor_parallel)
        stage = "build its shard"
        runner = TensorParallelRunner(loaded, TPGroup(rank, size), **runner_kwargs)
        stage = "run a forward"
        worker_loop(runner)
    except BaseException as exc:  # noqa: BLE001 - reported to rank 0, then the worker ends
        _report(conn, stage, exc)
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    exit_rank(code)


def _report(conn, stage: str, exc: BaseException) -> None:
    """Tell rank 0 that this worker could not do ``stage``: ``("error", message, pickled)``,
    ``pickled`` the bytes of ``exc`` (its ``option_fixes`` included) where it is an ``Exception``
    that pickles, else None: a worker's SystemExit must not end the caller's process. Bytes, not
    the error itself: rank 0 unpickles them where a failure to (``_unpickled_error``) cannot lose
    the rank and the message, as one inside ``conn.recv()`` would."""
    message, pickled = f"could not {stage}: {type(exc).__name__}: {exc}", None
    if isinstance(exc, Exception):
        try:
            pickled = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an argument that does not pickle: the message alone
            pass
    try:
        conn.send(("error", message, pickled))
    except OSError:
        pass


def _unpickled_error(pickled: bytes | None) -> Exception | None:
    """The ``Exception`` a worker sent as ``pickled`` (``_report``), or None where there is none or
    it does not unpickle here: a class this process cannot import, an ``__init__`` that needs more
    than the error's ``args``. The caller then raises the worker's message instead."""
    if pickled is None:
        return None
    try:
        exc = pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - whatever unpickling raises, the message is still there
        return None
    return exc if isinstance(exc, Exception) else None


def exit_rank(code: int) -> None:
    """End a rank's process with ``code`` once it has left the process group, skipping the
    interpreter's teardown (stdout and stderr are flushed first). There gloo's worker threads,
    which can still hold finished work and its tensors, were destroyed after the interpreter and
    aborted the process ("terminate called without an active exception", exit -6) about once in
    20 to 40 exits, after every message was sent (pytorch/pytorch#179291 describes the teardown)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class TensorParallelGroup:
    """The running group: rank 0's runner, the worker processes and their pipes.

    Use ``start_tensor_parallel`` to make one; ``shutdown`` ends it (idempotent).
    """

    def __init__(self, runner: TensorParallelRunner | None, procs: list, conns: list, tmpdir: str) -> None:
        self.runner = runner
        self.procs = procs
        self.conns = conns
        self._tmpdir = tmpdir
        self._closed = False

    def check_alive(self, wait_s: float = 0.0) -> None:
        """Raise ``RuntimeError`` naming the worker ranks that have exited (their messages too):
        the group can no longer run a forward. ``wait_s``: give a dying worker that long to end
        (after a collective failed because of it)."""
        for p in self.procs:
            p.join(wait_s)
        dead = [rank for rank, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            errors = self.worker_errors()
            raise RuntimeError(f"tensor-parallel rank {dead[0]} has exited"
                               + (f" ({'; '.join(errors)})" if errors else "")
                               + ": this engine cannot run; shut it down and create a new Engine")

    def worker_errors(self) -> list[str]:
        """Messages the workers sent about their failures (read without blocking)."""
        errors = []
        for rank, conn in enumerate(self.conns, start=1):
            try:
                while conn.poll():
                    kind, msg, _ = conn.recv()
                    if kind == "error":
                        errors.append(f"rank {rank}: {msg}")
            except (EOFError, OSError):
                pass
        for rank, p in enumerate(self.procs, start=1):
            if p.exitcode not in (None, 0) and not any(e.startswith(f"rank {rank}:") for e in errors):
                errors.append(f"rank {rank}: exited with code {p.exitcode}")
        return errors

    def shutdown(self, graceful: bool = True) -> None:
        """Release the workers from ``worker_loop`` and wait for them (``graceful``; then end any
        that hang), or end them at once; leave the process group."""
        if self._closed:
            return
        self._closed = True
        try:
            if graceful and self.runner is not None and dist.is_initialized() and all(p.is_alive() for p in self.procs):
                self.runner.shutdown()
        finally:
            for p in self.procs:
                p.join(30 if graceful else 0)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
            if dist.is_initialized():
                dist.destroy_process_group()
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def _wait_loaded(group: TensorParallelGroup) -> None:
    """Block until every worker reported its model loaded. Raises a worker's load error as the
    worker raised it (caused by a ``RuntimeError`` naming the rank), else ``RuntimeError`` naming
    the rank that failed (with the error's text, where it does not unpickle here) or died, or that
    took longer than ``LOAD_TIMEOUT_S``."""
    pending = {rank: (conn, p.sentinel) for rank, (conn, p) in enumerate(zip(group.conns, group.procs), start=1)}
    while pending:
        waiting = {h: rank for rank, hs in pending.items() for h in hs}
        ready = wait(list(waiting), timeout=LOAD_TIMEOUT_S)
        if not ready:
            raise RuntimeError(f"tensor-parallel ranks {sorted(pending)} did not load the model "
                               f"within {LOAD_TIMEOUT_S:.0f} s")
        for handle in ready:
            rank = waiting[handle]
            if rank not in pending:
                continue
            conn, _ = pending[rank]
            if handle is conn or conn.poll():
                try:
                    kind, msg, pickled = conn.recv()
                except EOFError:
                    kind, msg, pickled = "error", "exited while loading the model", None
                exc = _unpickled_error(pickled)
                if exc is not None:  # (its traceback, in the worker, is not sent: the cause names the rank)
                    raise exc from RuntimeError(f"tensor-parallel rank {rank} could not load the model")
                if kind == "error":
                    raise RuntimeError(f"tensor-parallel rank {rank} {msg}")
                del pending[rank]
            else:  # the process ended without a word
                proc = group.procs[rank - 1]
                proc.join(5)
                raise RuntimeError(f"tensor-parallel rank {rank} died while loading the model "
                                   f"(exit code {proc.exitcode})")


def _uncount_failed_group() -> None:
    """Undo what a failed ``init_process_group`` leaves behind: torch names each default group by
    a per-process count (``distributed_c10d._world.group_count``) that only
    ``destroy_process_group`` resets, which needs a group. Left at 1, the next engine's rank 0 named
    its group "1" and its fresh workers theirs "0": their rendezvous keys never met, and start-up
    hung for ``COLLECTIVE_TIMEOUT``."""
    from torch.distributed import distributed_c10d

    if dist.is_initialized():
        return
    try:
        distributed_c10d._world.group_count = 0
    except AttributeError:  # (private: a torch without it, or with it read-only, has no count to
        pass  # reset here, and the failed init's own error must reach the caller, not this one)


def start_tensor_parallel(loaded, tp_size: int, model: Any, random_weights: bool, seed: int,
                          runner_kwargs: dict) -> TensorParallelGroup:
    """Start ranks 1..tp_size-1 and make rank 0's runner from ``loaded`` (already loaded here).

    Args:
        loaded: rank 0's ``LoadedModel``: its shard (``load_model(..., tp=TPGroup(0, tp_size))``).
        tp_size: ranks in the group (>= 2).
        model, random_weights, seed: what rank 0 loaded (``load_model``'s arguments); the
            workers load the same checkpoint (``loaded.path``, or the preset) in the same dtype.
        runner_kwargs: ``TensorParallelRunner`` arguments (sizes, mem_fraction, the attention
            backend by name).
    Returns:
        The ``TensorParallelGroup`` (its ``runner`` is rank 0's).
    Raises:
        ValueError: fewer GPUs than ranks, or an attention backend given as an object.
        ValueError, or another error carrying ``option_fixes`` (``option_error``): rank 0's runner
            refused its settings, raised as a single process's ``ModelRunner`` raises it.
        Exception: a worker's load error, as its load raised it (``_wait_loaded``).
        RuntimeError: a process group already exists in this process, or a worker failed (the
            message names the rank and what it could not do), or rank 0's runner failed otherwise
            ("tensor-parallel start-up failed": its error, caused by it, and the workers').
    """
    device = torch.device(loaded.config.device)
    if device.type == "cuda" and torch.cuda.device_count() < tp_size:
        raise ValueError(f"tp_size={tp_size} needs {tp_size} GPUs; torch sees {torch.cuda.device_count()}")
    backend_name = runner_kwargs.get("attention_backend")
    if not isinstance(backend_name or "", str):
        raise ValueError("with tp_size > 1 give attention_backend by name ('auto', 'torch', 'triton', 'flash_attn'): "
                         "every rank makes its own")
    from lmnb_engine.attention.selector import select_attention_backend

    attn = select_attention_backend(device, backend_name)  # a bad name or device fails here, before spawning
    if getattr(attn, "strict", False):  # flash-attn by name: a model it cannot take fails before spawning too
        from lmnb_engine.attention.flash_backend import refusal_fix, unsupported

        problem = unsupported(loaded.config.head_dim, loaded.config.dtype)
        if problem:
            raise ValueError(f"attention backend 'flash_attn' cannot run this model: {problem}; "
                             f"{refusal_fix(loaded.config.dtype)}")
    if dist.is_initialized():
        raise RuntimeError("this process already has a torch.distributed process group (another "
                           "tensor-parallel Engine?); shut that engine down first")
    tmpdir = tempfile.mkdtemp(prefix="lmnb-tp-")
    init_method = f"file://{tmpdir}/rendezvous"
    backend = "nccl" if device.type == "cuda" else "gloo"
    load_kwargs = dict(model=str(loaded.path) if loaded.path is not None else model, device=device.type,
                       dtype=str(loaded.config.dtype).replace("torch.", ""), random_weights=random_weights, seed=seed)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    procs, conns = [], []
    group = TensorParallelGroup(None, procs, conns, tmpdir)
    try:
        for rank in range(1, tp_size):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, name=f"lmnb-tp-rank{rank}", daemon=True,
                            args=(rank, tp_size, init_method, backend, dict(load_kwargs), runner_kwargs, child))
            with _main_hidden_from_spawn():
                p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        _wait_loaded(group)
        try:
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=tp_size,
                                    timeout=COLLECTIVE_TIMEOUT)
        except BaseException:  # (a worker gone before joining, Ctrl-C)
            _uncount_failed_group()
            raise
        try:
            # every rank has finished joining before any builds its shard: a worker that refused its
            # settings at once left while rank 0 was still connecting to it, and rank 0 was told
            # gloo's "Connection closed by peer" instead of the refusal (once in a loaded full run)
            dist.barrier()
            group.runner = TensorParallelRunner(loaded, TPGroup(0, tp_size), **runner_kwargs)
            group.runner.check_peers = group.check_alive
        except Exception as exc:
            if isinstance(exc, ValueError) or getattr(exc, "option_fixes", None) is not None:
                raise  # its settings, refused as by a single process's ModelRunner (front ends reword them)
            # anything else is no setting of the caller's (a bug, a torch that changed): rank 0's
            # own error first, then the workers', which may be its cause
            errors = [f"rank 0: {type(exc).__name__}: {exc}"] + group.worker_errors()
            raise RuntimeError("tensor-parallel start-up failed: " + "; ".join(errors)) from exc
    except BaseException:
        group.shutdown(graceful=False)
        raise
    return group
