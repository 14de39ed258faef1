"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) over a ragged ``ForwardBatch``.

Matches transformers' ``LlamaForCausalLM`` and its relatives layer for layer; the per-family
differences (qkv bias, q/k norm, tied embeddings, RoPE scaling) come from ``ModelConfig``. All new
tokens of the batch are packed in one dimension ``T``; attention, including the KV-cache reads and
writes, goes through the ``AttentionBackend`` (SGLang's model/attention split, paper §3). Weight
layout: q/k/v are fused into ``qkv_proj`` and gate/up into ``gate_up_proj``; ``load_weights`` maps
the checkpoint's separate tensors onto the fused ones.
"""

from __future__ import annotations

import re
import warnings
from typing import Iterable

import torch
from torch import nn

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.forward_batch import ForwardBatch
from lmnb_engine.kv_pool import TokenToKVPool
from lmnb_engine.layers.mlp import GatedMLP
from lmnb_engine.layers.rmsnorm import RMSNorm
from lmnb_engine.layers.rotary import RotaryEmbedding, RotaryStoreKV
from lmnb_engine.model_config import ModelConfig


class LlamaAttention(nn.Module):
    """Self-attention of one layer: fused qkv projection, optional q/k RMSNorm, RoPE with the KV-pool
    write, backend, o_proj."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_q_heads, self.num_kv_heads = config.num_q_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_q_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rope = RotaryStoreKV()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        attn: AttentionBackend,
        kv_pool: TokenToKVPool,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [T, hidden]; cos, sin: [T, head_dim] -> [T, hidden], or [len(rows), hidden] for the
        tokens ``rows`` (int64) alone: every token's K/V is still stored, but the output
        projection runs on those rows only."""
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_q_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, k, v, cos, sin, kv_pool, self.layer_id, batch.out_cache_loc)  # and stores k, v
        out = attn.forward(q, k, v, self.layer_id, batch, kv_pool, self.scale, save_kv=False).reshape(T, self.q_size)
        return self.o_proj(out if rows is None else out[rows])


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``.

    The residual stream is carried separately (as vLLM and SGLang do), so each residual add is
    fused into the norm that follows it: a layer takes ``(h, residual)``, where the stream so far
    is ``h + residual`` (the first layer: ``h`` = the embeddings, no residual yet), and returns the
    same pair for the next; adds and roundings are exactly those of the unfused block.
    """

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(self, h, residual, cos, sin, batch, attn, kv_pool, rows=None) -> tuple[torch.Tensor, torch.Tensor]:
        """h, residual: [T, hidden] (residual None in the first layer) -> (mlp output, residual),
        [T, hidden] each, or [len(rows), hidden] for the tokens ``rows`` alone after attention."""
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        h = self.self_attn(x, cos, sin, batch, attn, kv_pool, rows)
        x, residual = self.post_attention_layernorm(h, residual if rows is None else residual[rows])
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm (HF's ``model.*`` submodule)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


# Checkpoint projection -> (our fused parameter, the part of its rows it fills; see _fused_slice).
_FUSED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_FUSED_RE = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_UNFUSED = {target: proj for proj, target in _FUSED.items()}


def _checkpoint_name(name: str, part: str | None) -> str:
    """The checkpoint tensor that fills ``part`` of our parameter ``name`` (``..qkv_proj.weight``,
    ``"k"`` -> ``..k_proj.weight``); ``name`` itself for an unfused parameter."""
    if part is None:
        return name
    prefix, fused, kind = name.rsplit(".", 2)
    return f"{prefix}.{_UNFUSED[(fused, part)]}.{kind}"


class LlamaForCausalLM(nn.Module):
    """The causal LM: ``model(batch, attn, kv_pool)`` -> float32 logits ``[L, vocab_size]``.

    Args:
        config: geometry and family switches (``ModelConfig``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share ``lm_head.weight`` with the embedding when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()  # not inference_mode: callers may update the returned logits in place
    def forward(
        self,
        batch: ForwardBatch,
        attn: AttentionBackend,
        kv_pool: TokenToKVPool,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward pass over the batch's new tokens (``input_embeds`` [T, hidden]: use these
        instead of embedding ``batch.input_ids``; a vision-language model passes image features in).

        Calls ``attn.init_forward(batch)`` once, then runs every layer; each layer's attention
        writes the new K/V into ``kv_pool`` at ``batch.out_cache_loc`` (its RoPE op does, fused).

        Returns:
            float32 [len(batch.logits_indices), vocab_size]: logits of the rows
            ``batch.logits_indices`` only (the LM head runs on those rows alone).
        """
        attn.init_forward(batch)
        x = self.model.embed_tokens(batch.input_ids) if input_embeds is None else input_embeds  # [issue 10]
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        residual = None
        rows = batch.logits_indices
        # Only the rows with logits need the last layer's output; the other tokens need their K/V
        # alone. So a prefill runs that layer's output projection and MLP on those rows (~2 % of a
        # Llama-2-7B prefill's FLOPs saved); the later norms are per token. (A decode step has a
        # logit on every row: its captured graph stays as it is.)
        cut = 0 < rows.numel() < x.shape[0]
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(x, residual, cos, sin, batch, attn, kv_pool, rows if cut and i == last else None)
        if not cut:
            x, residual = x[rows], residual[rows]
        x, _ = self.model.norm(x, residual)
        return self.lm_head(x).float()

    def _fused_slice(self, param: torch.Tensor, fused: str, part: str) -> torch.Tensor:
        """The rows of a fused parameter that one checkpoint projection fills. Sizes come from the
        parameter itself (q:k:v in the ratio of the head counts, gate:up half and half), so a
        tensor-parallel shard is filled the same way as the whole parameter."""
        c = self.config
        rows = param.shape[0]
        if fused == "qkv_proj":
            q = rows * c.num_q_heads // (c.num_q_heads + 2 * c.num_kv_heads)
            kv = (rows - q) // 2
            start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[part]
        else:
            start, size = {"gate": (0, rows // 2), "up": (rows // 2, rows // 2)}[part]
        return param.narrow(0, start, size)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names, e.g. ``model.layers.0.self_attn.q_proj.weight``) in.

        Separate q/k/v and gate/up tensors go into their slices of the fused parameters; tensors
        are cast to the model dtype. With tied embeddings a stored ``lm_head.weight`` fills the
        embedding where that is not stored, is ignored where it equals it, and unties the head
        (with a warning) where it differs, as transformers 5 does; stored RoPE ``inv_freq``
        buffers are ignored (recomputed from the config).

        Raises:
            ValueError: a tensor's shape does not match, the checkpoint has tensors the model has
                no place for, or some parameter got no tensor (the message names examples). Any
                of these means config.json does not describe the weights, and running anyway
                would silently give wrong outputs.
        """
        params = dict(self.named_parameters())
        loaded: set[tuple[str, str | None]] = set()
        tied_head = None
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # recomputed from the config
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                tied_head = tensor  # shared: the embedding where one is stored, else this (as transformers ties)
                continue
            m = _FUSED_RE.match(name)
            if m:
                prefix, proj, kind = m.groups()
                fused, part = _FUSED[proj]
                target_name = f"{prefix}.{fused}.{kind}"
            else:
                target_name, part = name, None
            if target_name not in params:
                raise ValueError(f"checkpoint tensor {name} has no place in a {self.config.architecture} built "
                                 "from this config.json: config and weights disagree")
            target = params[target_name]
            if part is not None:
                target = self._fused_slice(target, fused, part)
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the model expects "
                    f"{tuple(target.shape)}: config.json does not describe these weights"
                )
            target.copy_(tensor)
            loaded.add((target_name, part))
        embed = ("model.embed_tokens.weight", None)
        if tied_head is not None and embed not in loaded and tuple(tied_head.shape) == tuple(params[embed[0]].shape):
            params[embed[0]].copy_(tied_head)
            loaded.add(embed)
        elif tied_head is not None and embed in loaded and not _same_rows(tied_head, params[embed[0]]):
            # saved untied under a config that says tied: transformers (5.x) keeps both and warns
            warnings.warn(
                "config.json ties the word embeddings (tie_word_embeddings: true), but the checkpoint stores an "
                "lm_head.weight other than model.embed_tokens.weight; both are used as stored (not tied), as "
                "transformers does: set tie_word_embeddings to false in config.json to silence this", stacklevel=4)
            self.lm_head.weight = nn.Parameter(torch.empty_like(params[embed[0]]), requires_grad=False)
            self.lm_head.weight.copy_(tied_head)
            loaded.add(("lm_head.weight", None))
        # named as the checkpoint spells them (k_proj, not our fused qkv_proj) so the user can look
        # for them in the checkpoint
        missing = [_checkpoint_name(n, part) for n, part in self._expected_parts() if (n, part) not in loaded]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors the config.json calls for, e.g. "
                             f"{sorted(set(missing))[:5]}")

    def _expected_parts(self) -> list[tuple[str, str | None]]:
        parts: list[tuple[str, str | None]] = []
        for name, _ in self.named_parameters():  # tied lm_head is not listed (deduplicated)
            if ".qkv_proj." in name:
                parts += [(name, p) for p in ("q", "k", "v")]
            elif ".gate_up_proj." in name:
                parts += [(name, p) for p in ("gate", "up")]
            else:
                parts.append((name, None))
        return parts


def _same_rows(stored: torch.Tensor, param: torch.Tensor, chunk: int = 4096) -> bool:
    """Whether checkpoint tensor ``stored`` equals parameter ``param`` once cast to its dtype and
    device; compared ``chunk`` rows at a time so that no second full copy is made on the GPU."""
    if tuple(stored.shape) != tuple(param.shape):
        return False
    return all(torch.equal(stored[i:i + chunk].to(param.device, param.dtype), param[i:i + chunk])
               for i in range(0, stored.shape[0], chunk))
