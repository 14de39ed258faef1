"""Tensor-parallel building blocks (Shoeybi et al. 2019, Megatron-LM §3; SGLang/vLLM
``layers/linear.py`` and ``vocab_parallel_embedding.py``).

A column-parallel linear holds a slice of the output features and needs no communication; a
row-parallel linear holds the matching slice of the input features and sums the partial outputs
across ranks (all-reduce). Attention (heads split) and the MLP (intermediate features split) each
become column -> row, one all-reduce per block. The embedding is split by vocabulary rows (each
rank looks up the ids it owns, zeros elsewhere, all-reduce); the LM head by vocabulary columns
(each rank computes its logits, all-gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group.

    rank: 0 .. size - 1; size: number of ranks; group: the ``torch.distributed`` process group
    (None = the default group).
    """

    rank: int
    size: int
    group: Optional[Any] = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside [0, {self.size})")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks in place (a no-op on one rank); returns ``x``."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension (rank order)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def split_rows(weight: torch.Tensor, parts: list[int], tp: TPGroup) -> torch.Tensor:
    """This rank's rows of a (possibly fused) weight whose rows are ``parts`` blocks laid end to
    end (e.g. q | k | v): each block is split evenly and the rank's pieces are concatenated.

    Raises ``ValueError`` if a block does not divide by the group size."""
    out, start = [], 0
    for n in parts:
        if n % tp.size:
            raise ValueError(f"a block of {n} output features does not split over {tp.size} ranks")
        share = n // tp.size
        out.append(weight[start + tp.rank * share : start + (tp.rank + 1) * share])
        start += n
    return torch.cat(out, dim=0)


class ColumnParallelLinear(nn.Module):
    """``y_local = x W_local^T + b_local``: this rank's output features, no communication.

    Args:
        weight: [out_local, in] (already this rank's rows); bias: [out_local] or None.
    """

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, out_local]."""
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local W_local^T) + b``: this rank's input features; the partial sums are
    added across ranks, then the (full, unsplit) bias once.

    Args:
        weight: [out, in_local] (this rank's columns); bias: [out] or None; tp: the group.
    """

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.contiguous(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in_local] -> [T, out] (identical on every rank)."""
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split across ranks (the last shard zero-padded).

    Args:
        weight: the full [vocab, hidden] table; tp: the group.
    """

    def __init__(self, weight: torch.Tensor, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = weight.shape[0]
        self.shard = -(-self.vocab_size // tp.size)
        self.start = tp.rank * self.shard
        rows = weight[self.start : min(self.start + self.shard, self.vocab_size)]
        local = torch.zeros((self.shard, weight.shape[1]), dtype=weight.dtype, device=weight.device)
        local[: rows.shape[0]] = rows
        self.weight = nn.Parameter(local, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: int64 [T] -> [T, hidden] (identical on every rank)."""
        local = ids - self.start
        mine = (local >= 0) & (local < self.shard)
        out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * mine[:, None].to(self.weight.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(nn.Module):
    """LM head split by vocabulary rows like ``VocabParallelEmbedding`` (so a tied head shares its
    shard); each rank computes its logits and they are gathered.

    Args:
        weight: this rank's [shard, hidden] rows (zero-padded); vocab_size: the real vocabulary.
    """

    def __init__(self, weight: torch.Tensor, vocab_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [L, hidden] -> [L, vocab_size] logits (identical on every rank)."""
        return self.tp.all_gather_last(F.linear(x, self.weight))[:, : self.vocab_size]
