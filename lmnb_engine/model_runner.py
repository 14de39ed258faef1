"""Owns the model, the attention backend and the KV memory; runs one forward per ``ForwardBatch``.

Pool sizing follows SGLang's ``ModelRunner.profile_max_num_token``: the KV pool takes a fraction
of the memory that is free once the weights are loaded, divided by the bytes one token's K and V
occupy across all layers. On CPU the fraction is of available RAM and the pool is capped, since
the buffers are zero-filled up front.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.byte_size import byte_size
from lmnb_engine.cli_options import option_error
from lmnb_engine.forward_batch import ForwardBatch
from lmnb_engine.kv_pool import ReqToTokenPool, TokenToKVPool
from lmnb_engine.layers.kernel_op import use_triton_kernels

DEFAULT_MEM_FRACTION = {"cpu": 0.1, "cuda": 0.8}
CPU_MAX_POOL_TOKENS = 131072
DEFAULT_MAX_RUNNING = {"cpu": 64, "cuda": 256}


def _free_memory_bytes(device: torch.device) -> int:
    """Bytes that new tensors on ``device`` can take: the GPU's free memory, or on CPU the RAM the
    kernel can hand out without swapping (psutil's ``available``, Linux's MemAvailable: free pages
    and the page cache it can drop; the free pages alone, which the pool was once sized from, leave
    out most of an idle machine's RAM)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return _available_ram_bytes()


def _available_ram_bytes() -> int:
    """Bytes of RAM the kernel can hand out without swapping (psutil's ``available``)."""
    import psutil

    return int(psutil.virtual_memory().available)


def _bytes(n: int) -> str:
    """``n`` bytes as a message says them: exactly, with the size in KiB, MiB or GiB to read them
    by from 1 KiB up (``byte_size``; an int too long to write or to make a float of, from a size of
    thousands of digits, in ``shown_number``'s form alone)."""
    from lmnb_engine.params import shown_number

    return f"{shown_number(n)} bytes" + (f" ({byte_size(n)})" if 1024 <= n < 2**1000 else "")


def _table_bytes(rows: int, context_len: int) -> int:
    """Bytes one copy of a request-to-token table of ``rows`` x ``context_len`` takes
    (``ReqToTokenPool``: int32, 4 bytes a position), the device's or the host's."""
    return rows * context_len * 4


def _check_pools_fit(device: torch.device, cfg, tokens: int, rows: int, asked: bool, free: int) -> None:
    """Refuse, before allocating anything, pools that need more than ``device`` has free (torch
    said "Overflow when unpacking long long" for a KV pool of 10**20 tokens, or its allocator's
    error; on CPU a pool past the free RAM is zero-filled into swap, or the process is killed).
    ``tokens``: the KV pool's capacity (one padding slot comes with it, ``TokenToKVPool``);
    ``rows``: the request→token table's rows (int32, one entry per position of the context);
    ``asked``: whether the caller gave ``max_total_tokens`` (else it was sized from memory);
    ``free``: the bytes ``device`` has free (``_free_memory_bytes``), the figure the pool was sized by.

    Raises:
        ValueError: naming the bytes each pool needs, the bytes free, and the sizes that fit.
    """
    from lmnb_engine.params import shown_number

    element = torch.empty((), dtype=cfg.dtype).element_size()
    per_token = TokenToKVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype)
    kv = (tokens + 1) * per_token
    table = _table_bytes(rows, cfg.context_len)
    if kv + table <= free:
        return
    pool = f"a KV pool of {shown_number(tokens)} tokens"
    if kv > free:
        fits = free // per_token - 1  # (the padding slot's bytes too)
        problem = (f"{pool} needs {_bytes(kv)}: {per_token} bytes a token ({cfg.num_layers} layers x "
                   f"{cfg.num_kv_heads} KV heads x {cfg.head_dim} dims x {element}-byte "
                   f"{str(cfg.dtype).replace('torch.', '')}, K and V), one padding token included; "
                   f"{device} has {_bytes(free)} free")
        fixes = [("pass {} or less", "max_total_tokens", fits)] if asked and fits >= 2 else []
        fixes.append(("leave {} unset to size the pool from free memory", "max_total_tokens", None) if asked
                     else ("lower {}", "mem_fraction", None))
        raise option_error(ValueError, problem, *fixes)
    most_rows = (free - kv) // _table_bytes(1, cfg.context_len)
    problem = (f"the request-to-token table of {shown_number(rows)} rows x {cfg.context_len} positions (the context "
               f"length) needs {_bytes(table)} at 4 bytes a position, beside the {_bytes(kv)} of {pool}; "
               f"{device} has {_bytes(free)} free")
    fixes = [("pass {} or less", "max_running_requests", most_rows)] if most_rows >= 1 else []
    fixes.append(("lower {}", "max_total_tokens" if asked else "mem_fraction", None))
    raise option_error(ValueError, problem, *fixes)


def _check_host_table_fits(device: torch.device, rows: int, context_len: int, free: int) -> None:
    """Refuse, before allocating anything, a request-to-token table whose host copy needs more RAM
    than is available. On CUDA the table (``ReqToTokenPool``: int32 ``[rows, context_len]``) has
    two copies: one on the GPU, weighed with the KV pool by ``_check_pools_fit``, and one in RAM
    that the scheduler reads, which that check does not see (on CPU the two are one tensor, already
    weighed). A copy past the available RAM was zero-filled into swap, or the process was killed.
    ``free``: the bytes of RAM available (``_available_ram_bytes``).

    Raises:
        ValueError: naming the copy's bytes, the RAM available, and the rows that fit.
    """
    from lmnb_engine.params import shown_number

    table = _table_bytes(rows, context_len)
    if table <= free:
        return
    most_rows = free // _table_bytes(1, context_len)
    problem = (f"the request-to-token table's host copy (the one the scheduler reads, beside the one on {device}) of "
               f"{shown_number(rows)} rows x {context_len} positions (the context length) needs {_bytes(table)} of "
               f"RAM at 4 bytes a position; the host has {_bytes(free)} available")
    fixes = [("pass {} or less", "max_running_requests", most_rows)] if most_rows >= 1 else []
    fixes.append(("free some RAM",))
    raise option_error(ValueError, problem, *fixes)


def _first_line(e: BaseException) -> str:
    """An allocator's error as a message quotes it: its first line whole (cut at 120 characters, it
    ended inside the number of bytes it tried to allocate), or its type where it says nothing."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _current_device(device: torch.device):
    """A context in which ``device`` is CUDA's current device (nothing to do on CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class ModelRunner:
    """Runs ``loaded.model`` on batches built by the scheduler.

    Args:
        loaded: a ``LoadedModel`` from ``lmnb_engine.model_loader.load_model``.
        max_total_tokens: KV pool capacity in tokens; None sizes it from ``mem_fraction``.
        max_running_requests: rows of the request→token table; None picks a device default; at
            most ``max_total_tokens``.
        mem_fraction: share of free device memory (RAM on CPU) for the KV pool (default 0.8 on
            CUDA, 0.1 on CPU, where the pool is also capped at ``CPU_MAX_POOL_TOKENS``).
        attention_backend: an ``AttentionBackend``, or a name for ``select_attention_backend``
            ("auto" = flash-attn for extend with Triton for decode on CUDA when flash-attn is
            installed, else Triton on CUDA when importable, else torch; "torch"; "triton";
            "flash_attn"). A Triton or flash-attn backend also switches the model's norms, RoPE
            and activation to fused Triton kernels (``layers.use_triton_kernels``).
        cuda_graph_max_bs: decode batches up to this size replay CUDA graphs (``CudaGraphRunner``);
            None = ``max_running_requests`` capped at 256 on CUDA with the Triton backend, 0 = off;
            at most ``max_running_requests`` (no decode batch is larger).
    Raises:
        ValueError: a non-positive size, a memory budget too small for one full-length request, or
            pools that need more memory than is free (``_check_pools_fit``; on a GPU, the RAM the
            request-to-token table's host copy takes too, ``_check_host_table_fits``) or cannot be
            allocated.
    """

    def __init__(
        self,
        loaded,
        max_total_tokens: Optional[int] = None,
        max_running_requests: Optional[int] = None,
        mem_fraction: Optional[float] = None,
        attention_backend: Optional[AttentionBackend | str] = None,
        cuda_graph_max_bs: Optional[int] = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        cfg = self.config = loaded.config
        self.device = torch.device(cfg.device)
        kind = "cuda" if self.device.type == "cuda" else "cpu"
        per_token = TokenToKVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype)
        asked = max_total_tokens is not None
        # (read once: sizing and the check weigh one figure; on CPU MemAvailable moves between two
        # reads, and a pool sized to all of the first could be refused by a lower second)
        free = _free_memory_bytes(self.device)
        if max_total_tokens is None:
            fraction = DEFAULT_MEM_FRACTION[kind] if mem_fraction is None else mem_fraction
            if not 0 < fraction <= 1:
                raise ValueError(f"mem_fraction={fraction} must be in (0, 1]")
            share = int(free * fraction)
            max_total_tokens = share // per_token
            # the request-to-token table and the pool's padding slot come out of the share first
            # (given all of it, mem_fraction=1.0 was refused by _check_pools_fit every time); where
            # they leave no room, the check names the table's rows
            rows = min(DEFAULT_MAX_RUNNING[kind] if max_running_requests is None else max_running_requests,
                       max_total_tokens)
            room = (share - _table_bytes(rows, cfg.context_len)) // per_token - 1
            if room >= 2:
                max_total_tokens = room
            if kind == "cpu":
                max_total_tokens = min(max_total_tokens, CPU_MAX_POOL_TOKENS)
            if max_total_tokens < 2:
                raise option_error(
                    ValueError, f"the KV pool's share of free memory on {self.device} ({fraction:g}) leaves room "
                    f"for only {max_total_tokens} KV tokens ({per_token} bytes each)",
                    ("raise {}", "mem_fraction", None), ("pass {}", "max_total_tokens", None),
                    ("free some memory",))
        elif max_total_tokens < 2:
            raise option_error(ValueError, f"a KV pool of {max_total_tokens} token{'s' * (max_total_tokens != 1)} is too small",
                               ("pass {} or more", "max_total_tokens", 2))
        if max_running_requests is None:
            max_running_requests = min(DEFAULT_MAX_RUNNING[kind], max_total_tokens)
        elif max_running_requests < 1:
            raise ValueError(f"max_running_requests={max_running_requests} must be >= 1")
        # each running request holds at least one KV slot, so more rows could never run (as SGLang
        # caps it); 10**7 rows of the request→token table would take 20 GB at a 512-token context
        max_running_requests = min(max_running_requests, max_total_tokens)
        _check_pools_fit(self.device, cfg, max_total_tokens, max_running_requests, asked, free)
        if self.device.type != "cpu":
            _check_host_table_fits(self.device, max_running_requests, cfg.context_len, _available_ram_bytes())
        self.max_total_tokens = max_total_tokens
        self.sized_from_memory = not asked  # (mem_fraction sized the pool: the option to lower)
        self.max_running_requests = max_running_requests
        # [issue 9] Triton launches on the current device, whatever device the tensors are on: the
        # backend's start-up check and the graph capture run on the model's device (say cuda:1)
        with _current_device(self.device):
            self._start_on_device(attention_backend, cuda_graph_max_bs)

    def _start_on_device(self, attention_backend, cuda_graph_max_bs: Optional[int]) -> None:
        """Pick and prepare the attention backend, make the pools, capture the decode graphs."""
        cfg = self.config
        if attention_backend is None or isinstance(attention_backend, str):  # [issue 9] backend selector
            from lmnb_engine.attention.selector import select_attention_backend

            attention_backend = select_attention_backend(self.device, attention_backend)
        self.attn = attention_backend
        attention_backend.prepare(cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.dtype, self.device)
        # [issue 9] the fused Triton layer kernels go with the Triton attention backend; with the
        # torch backend the whole model is plain torch (the reference the GPU path is checked against)
        use_triton_kernels(self.model, attention_backend.triton_kernels)
        self.graph_runner = None
        self.reset_pools()
        # [issue 9] CUDA-graph decode: on by default where it can run (CUDA + Triton backend).
        if cuda_graph_max_bs is None:
            capturable = self.device.type == "cuda" and getattr(self.attn, "supports_cuda_graph", False)
            cuda_graph_max_bs = min(self.max_running_requests, 256) if capturable else 0
        # a decode batch holds at most max_running_requests rows, so a graph for more is never replayed
        # (SGLang caps its capture sizes so); cuda_graph_max_bs=10**20 made static tensors of 10**20 rows
        cuda_graph_max_bs = min(cuda_graph_max_bs, self.max_running_requests)
        if cuda_graph_max_bs > 0:
            from lmnb_engine.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(self, cuda_graph_max_bs)
            self.graph_runner.capture()

    def reset_pools(self) -> None:
        """(Re)create empty KV and request pools (start-up, and recovery after an internal error),
        the old ones freed first (``_free_pools``).

        Raises:
            ValueError: the request-to-token table's host copy needs more RAM than is available
                (``_check_host_table_fits``, on a GPU), or the KV pool or the table could not be
                allocated."""
        cfg = self.config
        # [issue 9] the old pools first: two do not fit on a GPU, nor two host tables in a tight RAM
        self._free_pools()
        self.kv_pool = None
        if self.device.type != "cpu":  # (the RAM available now: the old host table's is back in it)
            _check_host_table_fits(self.device, self.max_running_requests, cfg.context_len, _available_ram_bytes())
        try:
            self.kv_pool = TokenToKVPool(
                self.max_total_tokens, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype, self.device
            )
        except RuntimeError as e:  # torch.OutOfMemoryError on CUDA; an allocator error on CPU
            # (free memory was weighed before, _check_pools_fit: here another process took it since,
            # or a GPU's free memory lies in pieces)
            need = (self.max_total_tokens + 1) * TokenToKVPool.bytes_per_token(
                cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.dtype)
            raise option_error(
                ValueError, f"a KV pool of {self.max_total_tokens} tokens needs {_bytes(need)} on {self.device}, "
                f"and allocating it failed ({_first_line(e)})",
                ("lower {}", "mem_fraction" if self.sized_from_memory else "max_total_tokens", None),
                ("free some memory",)) from None
        try:
            self.req_to_token_pool = ReqToTokenPool(self.max_running_requests, cfg.context_len, self.device)
        except RuntimeError as e:  # (as the KV pool's: memory taken since the check)
            need = _table_bytes(self.max_running_requests, cfg.context_len)
            raise option_error(
                ValueError, f"the request-to-token table of {self.max_running_requests} rows x {cfg.context_len} "
                f"positions (the context length) needs {_bytes(need)} on {self.device}, and allocating it failed "
                f"({_first_line(e)})",
                ("lower {}", "max_running_requests", None), ("free some memory",)) from None
        if self.graph_runner is not None:  # [issue 9] graphs hold the old pools' addresses
            self.graph_runner.capture()

    def _free_pools(self) -> None:
        """Free the KV pool's buffers and the request-to-token table's copies, releasing the
        captured decode graphs first: they write into those buffers and read that table, so they
        must never replay once these are freed, even if no new pools come. Each tensor's storage
        is freed in place, whatever refers to it: the scheduler's prefix cache refers to the pool
        objects, and in the recovery after an internal error the failed step's traceback to its
        batch, which holds the table's device copy."""
        if self.graph_runner is not None:
            self.graph_runner.release()
        kv = getattr(self, "kv_pool", None)  # (none yet at start-up)
        if kv is not None:
            for t in [*kv.k_buffer, *kv.v_buffer]:
                t.untyped_storage().resize_(0)
            kv.k_buffer.clear()
            kv.v_buffer.clear()
        table = getattr(self, "req_to_token_pool", None)
        if table is not None:
            for t in (table.host, table.req_to_token):
                t.untyped_storage().resize_(0)
            table.host = torch.empty(0, dtype=torch.int32)
            table.req_to_token = torch.empty(0, dtype=torch.int32, device=self.device)

    def release_memory(self) -> None:
        """Free the device memory this runner holds: the captured decode graphs, the KV and
        request pools, and the model's weights and buffers (each tensor left empty, 0 elements, on
        its device), then hand the freed blocks back to the driver on CUDA
        (``torch.cuda.empty_cache``: ``mem_get_info``, which the next model's weight check and KV
        pool sizing read, counts blocks torch's allocator keeps cached as taken). The runner cannot
        run again; call it only once nothing runs on it (the engine's scheduler has stopped)."""
        self._free_pools()
        self.graph_runner = None
        with torch.no_grad():
            for module in self.model.modules():
                # (in place, not replaced: whatever else refers to a tensor, its storage goes)
                for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logits_indices), vocab_size] for ``batch``; writes its KV."""
        with torch.inference_mode():
            if self.graph_runner is not None and self.graph_runner.can_run(batch):  # [issue 9]
                return self.graph_runner.replay(batch)
            return self.model(batch, self.attn, self.kv_pool)
