"""Turn a Llama-family model (``lmnb_engine.models.llama``) into one tensor-parallel shard.

Each rank keeps its slice: query/key/value heads and the MLP's intermediate features are split
(column-parallel ``qkv_proj``/``gate_up_proj``, row-parallel ``o_proj``/``down_proj``), the
embedding and LM head by vocabulary. Attention modules are told their local head counts, so the
attention backend and the KV pool see ``num_kv_heads / tp`` heads per rank.

``load_model(..., tp=...)`` shards the model while it is still on the meta device and fills
the shard from ``shard_checkpoint``'s slices of the checkpoint tensors, so a rank never holds
more than its part of the weights (plus one checkpoint tensor at a time, on the CPU).
``shard_model_`` also works on a model already loaded whole (then it keeps slices of it).
"""

from __future__ import annotations

import dataclasses

from typing import Iterable, Iterator

import torch
from torch import nn

from lmnb_engine.distributed.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    split_rows,
)


def local_config(config, tp: TPGroup):
    """``config`` (a ``ModelConfig``) with this rank's head counts (for the KV pool and backend).

    Raises ``ValueError`` unless the query and KV head counts divide by the group size."""
    if config.num_q_heads % tp.size or config.num_kv_heads % tp.size:
        raise ValueError(
            f"tensor parallelism over {tp.size} ranks needs head counts divisible by {tp.size}; "
            f"this model has {config.num_q_heads} query and {config.num_kv_heads} KV heads"
        )
    return dataclasses.replace(config, num_q_heads=config.num_q_heads // tp.size,
                               num_kv_heads=config.num_kv_heads // tp.size)


def _bias(linear: nn.Linear):
    return None if linear.bias is None else linear.bias.data


def shard_model_(model: nn.Module, tp: TPGroup) -> nn.Module:
    """Replace ``model``'s layers by this rank's parallel shards, in place; returns ``model``.

    Raises:
        ValueError: head counts or the intermediate size not divisible by ``tp.size``.
    """
    cfg = model.config
    local = local_config(cfg, tp)
    d = cfg.head_dim
    q, kv = cfg.num_q_heads * d, cfg.num_kv_heads * d
    inter = cfg.intermediate_size
    if inter % tp.size:
        raise ValueError(f"intermediate_size {inter} does not split over {tp.size} ranks")
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = attn.qkv_proj
        attn.qkv_proj = ColumnParallelLinear(
            split_rows(qkv.weight.data, [q, kv, kv], tp),
            None if qkv.bias is None else split_rows(qkv.bias.data, [q, kv, kv], tp),
        )
        q_local = local.num_q_heads * d
        o = attn.o_proj
        attn.o_proj = RowParallelLinear(o.weight.data[:, tp.rank * q_local : (tp.rank + 1) * q_local], _bias(o), tp)
        attn.num_q_heads, attn.num_kv_heads = local.num_q_heads, local.num_kv_heads
        attn.q_size, attn.kv_size = local.num_q_heads * d, local.num_kv_heads * d
        gu = mlp.gate_up_proj
        mlp.gate_up_proj = ColumnParallelLinear(
            split_rows(gu.weight.data, [inter, inter], tp),
            None if gu.bias is None else split_rows(gu.bias.data, [inter, inter], tp),
        )
        down = mlp.down_proj
        i_local = inter // tp.size
        mlp.down_proj = RowParallelLinear(down.weight.data[:, tp.rank * i_local : (tp.rank + 1) * i_local],
                                          _bias(down), tp)
    embed = VocabParallelEmbedding(model.model.embed_tokens.weight.data, tp)
    model.model.embed_tokens = embed
    if cfg.tie_word_embeddings:
        head_weight = embed.weight
    else:
        head_weight = VocabParallelEmbedding(model.lm_head.weight.data, tp).weight  # same row split
    model.lm_head = ParallelLMHead(head_weight, cfg.vocab_size, tp)
    model.tp_group = tp
    return model


def _vocab_rows(t: torch.Tensor, vocab: int, tp: TPGroup) -> torch.Tensor:
    """This rank's rows of a [vocab, hidden] table, the last shard zero-padded (as
    ``VocabParallelEmbedding``)."""
    shard = -(-vocab // tp.size)
    rows = t[tp.rank * shard : min((tp.rank + 1) * shard, vocab)]
    if rows.shape[0] == shard:
        return rows
    return torch.cat([rows, rows.new_zeros((shard - rows.shape[0],) + tuple(rows.shape[1:]))])


def shard_checkpoint(weights: Iterable[tuple[str, torch.Tensor]], config, tp: TPGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's part of each checkpoint tensor (HF names), split as ``shard_model_`` splits
    the modules: q/k/v and gate/up rows by heads / features, o/down columns, embedding and LM
    head rows by vocabulary; norms and the row-parallel biases whole.

    Raises ``ValueError`` (from ``local_config``) when the heads do not divide by ``tp.size``."""
    local = local_config(config, tp)
    d = config.head_dim
    q_local, kv_local = local.num_q_heads * d, local.num_kv_heads * d
    i_local = config.intermediate_size // tp.size
    for name, t in weights:
        leaf = name.rsplit(".", 2)[-2:]  # e.g. ["q_proj", "weight"]
        proj = leaf[0] if len(leaf) == 2 else ""
        if proj == "q_proj":
            t = t[tp.rank * q_local : (tp.rank + 1) * q_local]
        elif proj in ("k_proj", "v_proj"):
            t = t[tp.rank * kv_local : (tp.rank + 1) * kv_local]
        elif proj in ("gate_proj", "up_proj"):
            t = t[tp.rank * i_local : (tp.rank + 1) * i_local]
        elif proj == "o_proj" and leaf[1] == "weight":
            t = t[:, tp.rank * q_local : (tp.rank + 1) * q_local]
        elif proj == "down_proj" and leaf[1] == "weight":
            t = t[:, tp.rank * i_local : (tp.rank + 1) * i_local]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = _vocab_rows(t, config.vocab_size, tp)
        yield name, t
