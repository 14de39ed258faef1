"""One tensor-parallel rank's model runner, and the loop the other ranks run.

Rank 0 owns the scheduler; before each forward it broadcasts the batch (token ids, positions,
slots, lengths, and the ``req_to_token`` rows the batch reads), so every rank runs the same
forward on its shard with the same KV slots. Ranks > 0 sit in ``worker_loop``: receive, write the
rows into their own table, forward (the collectives inside the model pair up with rank 0's),
repeat until rank 0 ``shutdown``s. SGLang instead runs a scheduler per rank on broadcast
requests; broadcasting batches keeps lmnb's single scheduler and costs one small message per step.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from typing import Optional

import torch
import torch.distributed as dist

from lmnb_engine.distributed.layers import TPGroup
from lmnb_engine.distributed.shard import local_config, shard_model_
from lmnb_engine.forward_batch import ForwardBatch, ForwardMode
from lmnb_engine.model_runner import ModelRunner

log = logging.getLogger(__name__)

_MODES = (ForwardMode.EXTEND, ForwardMode.DECODE)
_STOP = -1
_HEADER = 5  # mode, T, B, L, max_seq


class TensorParallelRunner(ModelRunner):
    """``ModelRunner`` for one rank of a tensor-parallel group.

    Takes this rank's shard (``load_model(..., tp=tp)``; a model loaded whole is sharded in
    place by ``shard_model_``), sizes the KV pool for the local KV heads, and takes the smallest
    pool and request-table sizes any rank could afford, so slot indices from rank 0 are valid
    everywhere.

    Args:
        loaded: this rank's shard, or the whole model (every rank the same weights).
        tp: this rank's ``TPGroup`` (``torch.distributed`` already initialized).
        other arguments: as ``ModelRunner``. CUDA graphs are off by default (0): capturing the
            collectives is untested here.
    Raises:
        ValueError: head counts not divisible by the group size (from ``local_config``).
    """

    def __init__(self, loaded, tp: TPGroup, max_total_tokens: Optional[int] = None,
                 max_running_requests: Optional[int] = None, mem_fraction: Optional[float] = None,
                 attention_backend=None, cuda_graph_max_bs: Optional[int] = 0) -> None:
        self.tp = tp
        sharded = getattr(loaded.model, "tp_group", None)
        if sharded is None:
            shard_model_(loaded.model, tp)
        elif (sharded.rank, sharded.size) != (tp.rank, tp.size):
            raise ValueError(f"the model was sharded for rank {sharded.rank} of {sharded.size}, not {tp.rank} of {tp.size}")
        loaded = dataclasses.replace(loaded, config=local_config(loaded.config, tp))
        super().__init__(loaded, max_total_tokens, max_running_requests, mem_fraction, attention_backend,
                         cuda_graph_max_bs)
        if tp.size > 1:
            agree_on_extend_kernel(self.attn, tp, self._comm_device)
        sizes = torch.tensor([self.max_total_tokens, self.max_running_requests], device=self._comm_device)
        if tp.size > 1:
            dist.all_reduce(sizes, op=dist.ReduceOp.MIN, group=tp.group)
        total, reqs = (int(x) for x in sizes.tolist())
        if (total, reqs) != (self.max_total_tokens, self.max_running_requests):
            self.max_total_tokens, self.max_running_requests = total, reqs
            self.reset_pools()

    @property
    def _comm_device(self) -> torch.device:
        """Where messages live: the GPU for NCCL, the CPU for gloo."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def check_peers(self, wait_s: float = 0.0) -> None:
        """Raise ``RuntimeError`` if a peer rank is gone (``launch`` sets this to its check)."""

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Rank 0: broadcast ``batch``, then run it (logits on every rank); see ``ModelRunner``.

        Raises ``RuntimeError`` naming the rank when a worker has exited (before or during it)."""
        if self.tp.rank != 0 or self.tp.size == 1:
            return super().forward(batch)
        self.check_peers()
        try:
            self._send(batch)
            return super().forward(batch)
        except RuntimeError:
            self.check_peers(wait_s=1.0)  # a collective fails when a peer dies: name the peer
            raise

    def shutdown(self) -> None:
        """Rank 0: release the workers from ``worker_loop``; returns once every one has the word."""
        if self.tp.rank == 0 and self.tp.size > 1:
            dist.broadcast(torch.tensor([_STOP, 0, 0, 0, 0], device=self._comm_device), 0, group=self.tp.group)
            self._stopped_together()

    def _stopped_together(self) -> None:
        """Wait for every rank at the stop, so that no rank destroys the process group while a peer
        still reads the stop from it: gloo then aborted a rank at exit ("terminate called without
        an active exception") once in about 20 shutdowns (peers synchronize before
        ``destroy_process_group`` for the same reason)."""
        dist.all_reduce(torch.zeros(1, device=self._comm_device), group=self.tp.group)

    def _send(self, batch: ForwardBatch) -> None:
        dev = self._comm_device
        max_seq = max(batch.seq_lens_cpu)
        rows = batch.req_to_token[batch.req_pool_indices, :max_seq].to(dev, torch.int64)
        header = torch.tensor([_MODES.index(batch.mode), batch.num_tokens, batch.batch_size,
                               batch.logits_indices.numel(), max_seq], device=dev)
        fields = [batch.input_ids, batch.positions, batch.out_cache_loc, batch.req_pool_indices, batch.seq_lens,
                  batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc, batch.logits_indices]
        payload = torch.cat([f.to(dev, torch.int64).reshape(-1) for f in fields] + [rows.reshape(-1)])
        dist.broadcast(header, 0, group=self.tp.group)
        dist.broadcast(payload, 0, group=self.tp.group)

    def _receive(self) -> Optional[ForwardBatch]:
        dev = self._comm_device
        header = torch.empty(_HEADER, dtype=torch.int64, device=dev)
        dist.broadcast(header, 0, group=self.tp.group)
        mode, T, B, L, max_seq = header.tolist()
        if mode == _STOP:
            return None
        payload = torch.empty(3 * T + 5 * B + L + B * max_seq, dtype=torch.int64, device=dev)
        dist.broadcast(payload, 0, group=self.tp.group)
        parts = payload.to(self.device).split([T, T, T, B, B, B, B, B, L, B * max_seq])
        ids, pos, loc, req_idx, seq_lens, prefix, ext, start, logits_idx, rows = parts
        table = self.req_to_token_pool.req_to_token
        table[req_idx, :max_seq] = rows.view(B, max_seq).to(table.dtype)
        return ForwardBatch(
            mode=_MODES[mode], input_ids=ids, positions=pos, out_cache_loc=loc, req_to_token=table,
            req_pool_indices=req_idx, seq_lens=seq_lens, extend_prefix_lens=prefix, extend_seq_lens=ext,
            extend_start_loc=start, logits_indices=logits_idx, seq_lens_cpu=seq_lens.tolist(),
            extend_prefix_lens_cpu=prefix.tolist(), extend_seq_lens_cpu=ext.tolist(),
        )


def worker_loop(runner: TensorParallelRunner) -> int:
    """Ranks > 0: run every batch rank 0 broadcasts until it shuts down; returns the number run."""
    if runner.tp.rank == 0:
        raise ValueError("worker_loop is for ranks > 0; rank 0 drives the runner (an Engine's scheduler)")
    n = 0
    while (batch := runner._receive()) is not None:
        ModelRunner.forward(runner, batch)
        n += 1
    runner._stopped_together()
    return n


def agree_on_extend_kernel(attn, tp: TPGroup, device: torch.device) -> None:
    """[issue 9] Make every rank run extend attention on one kernel. Under "auto" each rank checks
    and times flash-attn on its own shard's heads (``FlashAttentionBackend.prepare``), so a near-tie
    may fall either way; where the ranks' choices differ, every rank runs the Triton kernel, which
    all of them have. One request's heads then come from one kernel, and ``model_info`` (rank 0's)
    holds for every rank.

    A collective: every rank of ``tp`` calls it once, after ``prepare``, with its own backend
    (``attn.flash``, named by its ``label``; any other backend counts as no flash-attn). Kernels
    are compared by name, not by place in a rank's candidate list, which depends on its GPU.
    ``device``: where the message lives (the GPU for NCCL, the CPU for gloo).

    Later, a rank whose flash-attn fails on a batch (out of memory, a fault) falls back to Triton
    alone; its heads are still attended exactly, only by another kernel.

    Raises:
        RuntimeError: on every rank, when flash-attn was asked for by name (``strict``) and the
            ranks found different builds (GPUs of different kinds): none is dropped silently."""
    flash = getattr(attn, "flash", None)
    mine = zlib.crc32(flash.label.encode()) if flash is not None else -1  # (str hash() differs by process)
    picks = torch.tensor([mine, -mine], dtype=torch.int64, device=device)
    dist.all_reduce(picks, op=dist.ReduceOp.MAX, group=tp.group)  # the highest pick and minus the lowest
    highest, lowest = int(picks[0]), -int(picks[1])
    if highest == lowest:
        return
    if getattr(attn, "strict", False):  # (every rank was given the same name: all raise)
        raise RuntimeError(f"attention_backend='flash_attn': the tensor-parallel ranks run different flash-attn "
                           f"builds (rank {tp.rank}: {flash.label if flash is not None else 'none'}); install one "
                           "build for all the GPUs, or use attention_backend='triton'")
    log.info("the tensor-parallel ranks chose different extend-attention kernels (each timed its own "
             "shard); every rank runs the Triton kernel")
    attn.flash = None
