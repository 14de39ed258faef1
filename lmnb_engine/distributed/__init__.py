"""Tensor parallelism over the GPUs of one machine (Megatron-LM's layer split, as SGLang and vLLM
use it), on ``torch.distributed``: NCCL on GPUs, gloo on CPUs (the tests).

- ``layers``: column-/row-parallel linear layers, vocab-parallel embedding and LM head;
- ``shard``: turns a loaded Llama-family model into this rank's shard, in place;
- ``runner``: ``TensorParallelRunner`` (rank 0 drives: every forward's batch is broadcast) and
  ``worker_loop`` (ranks > 0 replay the broadcast batches).
"""

from lmnb_engine.distributed.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
)
from lmnb_engine.distributed.runner import TensorParallelRunner, worker_loop
from lmnb_engine.distributed.shard import local_config, shard_model_

__all__ = [
    "ColumnParallelLinear",
    "ParallelLMHead",
    "RowParallelLinear",
    "TPGroup",
    "TensorParallelRunner",
    "VocabParallelEmbedding",
    "local_config",
    "shard_model_",
    "worker_loop",
]
