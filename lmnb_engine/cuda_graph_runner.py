"""CUDA-graph capture and replay of decode forwards (GPU only).

A decode step of a 7B model launches hundreds of small kernels; at batch 1 the GPU work takes
~3 ms, so launching them one by one from Python would make the step launch-bound. Like SGLang's
``CudaGraphRunner`` (and vLLM's), the runner captures one graph per batch size in a fixed list,
each over static input tensors, and serves a decode batch of ``n`` requests by copying its
inputs into the smallest captured size ``>= n``, padding the rest, and replaying that graph.

Padded rows are harmless by construction: they read request row 0 of ``req_to_token`` up to
length 1 and write their K/V to pool slot 0, the padding slot that is never handed out
(``TokenToKVPool``). Only the Triton backend can be captured: its decode metadata lives on the
device, whereas the torch backend sizes tensors from host-side lengths.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

from lmnb_engine.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from lmnb_engine.model_runner import ModelRunner

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class CudaGraphRunner:
    """Decode graphs for ``runner.model``, one per batch size up to ``max_batch_size``.

    Args:
        runner: the ``ModelRunner`` (its model, Triton backend, and pools at capture time; call
            ``capture()`` again after the pools are rebuilt, since graphs hold their addresses).
        max_batch_size: largest batch served from a graph (larger decode batches run eagerly).
        batch_sizes: sizes to capture (default: ``DEFAULT_BATCH_SIZES`` up to ``max_batch_size``).
    Raises:
        ValueError: not on CUDA, a backend that cannot be captured (not ``supports_cuda_graph``,
            i.e. not ``TritonAttentionBackend``), or no sizes.
    """

    def __init__(self, runner: "ModelRunner", max_batch_size: int, batch_sizes: tuple[int, ...] | None = None) -> None:
        if runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {runner.device}")
        if not getattr(runner.attn, "supports_cuda_graph", False):
            raise ValueError(f"CUDA graphs need the Triton attention backend, not {type(runner.attn).__name__}")
        sizes = sorted({b for b in (batch_sizes or DEFAULT_BATCH_SIZES) if 1 <= b <= max_batch_size})
        if max_batch_size not in sizes and batch_sizes is None:
            sizes.append(max_batch_size)
        if not sizes:
            raise ValueError(f"no batch size to capture up to max_batch_size={max_batch_size}")
        self.runner = runner
        self.batch_sizes = sizes
        self.max_batch_size = sizes[-1]
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._batches: dict[int, ForwardBatch] = {}

    def _static_batch(self, bs: int) -> ForwardBatch:
        """A DECODE batch of ``bs`` padding rows over views of the shared static tensors."""
        s = self._static
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=s["input_ids"][:bs],
            positions=s["positions"][:bs],
            out_cache_loc=s["out_cache_loc"][:bs],
            req_to_token=self.runner.req_to_token_pool.req_to_token,
            req_pool_indices=s["req_pool_indices"][:bs],
            seq_lens=s["seq_lens"][:bs],
            extend_prefix_lens=s["positions"][:bs],  # == seq_lens - 1 in decode
            extend_seq_lens=s["ones"][:bs],
            extend_start_loc=s["arange"][:bs],
            logits_indices=s["arange"][:bs],
            seq_lens_cpu=[1] * bs,  # host lists are not read by the captured (Triton) path
            extend_prefix_lens_cpu=[0] * bs,
            extend_seq_lens_cpu=[1] * bs,
        )

    def _reset_padding(self) -> None:
        s = self._static
        s["input_ids"].zero_()
        s["positions"].zero_()
        s["out_cache_loc"].zero_()
        s["req_pool_indices"].zero_()
        s["seq_lens"].fill_(1)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first, into one shared memory pool."""
        runner, dev, n = self.runner, self.runner.device, self.max_batch_size
        cfg = runner.config  # under tensor parallelism, this rank's head counts
        runner.attn.reserve_decode(n, cfg.num_q_heads, cfg.head_dim, dev)
        i64 = dict(dtype=torch.int64, device=dev)
        self._static = {
            "input_ids": torch.zeros(n, **i64), "positions": torch.zeros(n, **i64),
            "out_cache_loc": torch.zeros(n, **i64), "req_pool_indices": torch.zeros(n, **i64),
            "seq_lens": torch.ones(n, **i64), "ones": torch.ones(n, **i64), "arange": torch.arange(n, **i64),
        }
        self.release()
        self._batches = {bs: self._static_batch(bs) for bs in self.batch_sizes}
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(dev)
        model, attn, kv = runner.model, runner.attn, runner.kv_pool
        for bs in reversed(self.batch_sizes):
            batch = self._batches[bs]
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):  # warm-up: Triton compiles, cuBLAS picks kernels
                for _ in range(2):
                    model(batch, attn, kv)
            torch.cuda.current_stream(dev).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._outputs[bs] = model(batch, attn, kv)
            self._graphs[bs] = graph
        torch.cuda.synchronize(dev)

    def release(self) -> None:
        """Drop the captured graphs and the batches they were captured on (the KV pool they write
        into and the request-to-token table those batches hold are about to be freed); decode runs
        eagerly until the next ``capture``."""
        self._graphs.clear()
        self._outputs.clear()
        self._batches.clear()

    def can_run(self, batch: ForwardBatch) -> bool:
        """True for a text-only DECODE batch no larger than the largest captured size (once captured)."""
        if getattr(batch, "mm_inputs", None) and any(m is not None for m in batch.mm_inputs):
            return False  # image features enter through the eager path (they are not graph inputs)
        return bool(self._graphs) and batch.mode is ForwardMode.DECODE and batch.batch_size <= self.max_batch_size

    def padded_size(self, batch_size: int) -> int:
        """The captured batch size a batch of ``batch_size`` rows replays: the smallest that fits."""
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, batch_size)]

    def graph(self, batch_size: int) -> torch.cuda.CUDAGraph:
        """The captured graph a batch of ``batch_size`` rows replays (benches time it alone)."""
        return self._graphs[self.padded_size(batch_size)]

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logits_indices), vocab] of a DECODE batch, as the eager
        forward returns them, from the smallest graph that fits.

        The graph computes every row's logits; the batch's ``logits_indices`` are gathered from
        them, which also copies them out of the graph's static output (reused by the next replay).
        """
        bs = batch.batch_size
        padded = self.padded_size(bs)
        s = self._static
        if padded != bs:
            self._reset_padding()
        s["input_ids"][:bs].copy_(batch.input_ids, non_blocking=True)
        s["positions"][:bs].copy_(batch.positions, non_blocking=True)
        s["out_cache_loc"][:bs].copy_(batch.out_cache_loc, non_blocking=True)
        s["req_pool_indices"][:bs].copy_(batch.req_pool_indices, non_blocking=True)
        s["seq_lens"][:bs].copy_(batch.seq_lens, non_blocking=True)
        self._graphs[padded].replay()
        return self._outputs[padded].index_select(0, batch.logits_indices)
