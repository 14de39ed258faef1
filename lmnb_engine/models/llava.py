"""LLaVA (``LlavaForConditionalGeneration``): a CLIP vision tower, a two-layer projector and a
Llama-family language model whose image-placeholder embeddings are replaced by image features.

Follows transformers' ``LlavaForConditionalGeneration`` (Liu et al., "Improved Baselines with
Visual Instruction Tuning", LLaVA-1.5): features are the vision tower's hidden states at
``vision_feature_layer`` (CLS dropped for ``vision_feature_select_strategy="default"``), projected
by ``linear_2(act(linear_1(x)))``. The vision tower is transformers' own ``CLIPVisionModel`` (built
with ``AutoModel.from_config``); the language model is ``LlamaForCausalLM`` over the ragged
``ForwardBatch``. Each image is encoded only when some of its placeholder positions are computed
in this pass (a radix-cache hit skips it, paper §6), and once per content hash while its features
stay in the ``EncoderCache``.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.forward_batch import ForwardBatch
from lmnb_engine.kv_pool import TokenToKVPool
from lmnb_engine.model_config import ModelConfig
from lmnb_engine.models.llama import LlamaForCausalLM
from lmnb_engine.multimodal.encoder_cache import EncoderCache


class LlavaMultiModalProjector(nn.Module):
    """``linear_2(act(linear_1(x)))``: vision hidden size -> text hidden size (HF's projector)."""

    def __init__(self, vision_hidden: int, text_hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_1 = nn.Linear(vision_hidden, text_hidden, bias=bias)
        self.act = ACT2FN[act]
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project vision features into the language model's hidden size."""
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    """``model(batch, attn, kv_pool)`` -> float32 logits ``[L, vocab_size]``, with image features
    placed at the placeholder positions named by ``batch.mm_inputs``.

    Args:
        config: the text geometry, with the whole ``LlavaConfig`` in ``multimodal_hf_config``.
    Raises:
        ValueError: a list of ``vision_feature_layer``s (multi-layer features) — not supported.
    Attributes:
        encoder_cache: ``EncoderCache`` of projected features per image hash (``hits``/``misses``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        import transformers

        mm = config.multimodal_hf_config
        if not isinstance(mm.vision_feature_layer, int):
            raise ValueError("LLaVA checkpoints with several vision_feature_layer values are not supported")
        self.config = config
        self.feature_layer = mm.vision_feature_layer
        self.drop_cls = mm.vision_feature_select_strategy == "default"
        self.vision_tower = transformers.AutoModel.from_config(mm.vision_config)
        self.multi_modal_projector = LlavaMultiModalProjector(
            mm.vision_config.hidden_size, config.hidden_size, mm.projector_hidden_act,
            bool(getattr(mm, "multimodal_projector_bias", True)),
        )
        self.language_model = LlamaForCausalLM(config)
        self.encoder_cache = EncoderCache()

    @property
    def model(self) -> nn.Module:
        """The language model's decoder (``embed_tokens``, ``layers``, ``norm``), where code written
        for ``LlamaForCausalLM`` looks for it (e.g. the CUDA-graph runner reads its head count)."""
        return self.language_model.model

    def tie_weights(self) -> None:
        """Tie the language model's weights (its own ``tie_weights``)."""
        self.language_model.tie_weights()

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected features of a stack of images.

        Args:
            pixel_values: float [N, 3, H, W] from the checkpoint's image processor.
        Returns:
            [N, tokens_per_image, text_hidden] in the model dtype.
        """
        tower = self.vision_tower
        dtype = next(tower.parameters()).dtype
        out = tower(pixel_values.to(self.config.device, dtype), output_hidden_states=True)
        feats = out.hidden_states[self.feature_layer]
        if self.drop_cls:
            feats = feats[:, 1:]
        return self.multi_modal_projector(feats)

    def encode_slots(self, slots: list) -> list[torch.Tensor]:
        """[tokens, hidden] features per ``ImageSlot`` (one vision-tower batch for all of them)."""
        return list(self.encode_images(torch.stack([s.pixel_values for s in slots])))

    def _features(self, slots: list) -> dict[str, torch.Tensor]:
        """hash -> [tokens, hidden] for ``slots`` (``ImageSlot``s), encoding the uncached ones in one batch."""
        found: dict[str, torch.Tensor] = {}
        todo = {}
        for s in slots:
            if s.hash in found or s.hash in todo:
                continue
            feats = self.encoder_cache.get(s.hash)
            if feats is None:
                todo[s.hash] = s
            else:
                found[s.hash] = feats
        if todo:
            encoded = self.encode_slots(list(todo.values()))
            for h, feats in zip(todo, encoded):
                found[h] = feats
                if bool(torch.isfinite(feats).all()):  # NaN features fail their request; not kept
                    self.encoder_cache.put(h, feats)
        return found

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend, kv_pool: TokenToKVPool) -> torch.Tensor:
        """One forward pass (see ``LlamaForCausalLM.forward``). For every request row, the new
        positions that fall inside an image's placeholder span take that image's features
        (a chunked prefill may cover part of a span: the matching slice is used)."""
        if batch.mm_inputs is None:
            return self.language_model(batch, attn, kv_pool)
        plan = []  # (row in T, slot, first feature, end feature)
        start = 0
        for mm, prefix, n in zip(batch.mm_inputs, batch.extend_prefix_lens_cpu, batch.extend_seq_lens_cpu):
            for slot in mm.images if mm is not None else ():
                lo, hi = max(slot.offset, prefix), min(slot.offset + slot.length, prefix + n)
                if lo < hi:
                    plan.append((start + lo - prefix, slot, lo - slot.offset, hi - slot.offset))
            start += n
        if not plan:
            return self.language_model(batch, attn, kv_pool)
        embeds = self.language_model.model.embed_tokens(batch.input_ids)
        feats = self._features([slot for _, slot, _, _ in plan])
        for row, slot, a, b in plan:
            embeds[row : row + b - a] = feats[slot.hash][a:b].to(embeds.dtype)
        return self.language_model(batch, attn, kv_pool, input_embeds=embeds)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in; both transformers 5 names (``model.vision_tower.*``,
        ``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head.*``) and 4.x
        names (``vision_tower.vision_model.*``, ``language_model.model.*``, ...) are accepted.

        Raises:
            ValueError: a tensor has no place, a wrong shape, or some parameter got no tensor.
        """
        own = {n: p for n, p in self.named_parameters() if not n.startswith("language_model.")}
        loaded: set[str] = set()
        self.language_model.load_weights(self._route(weights, own, loaded))
        missing = sorted(set(own) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} vision/projector tensors, e.g. {missing[:5]}")

    def _route(self, weights, own: dict, loaded: set) -> Iterator[tuple[str, torch.Tensor]]:
        """Copy vision and projector tensors into ``own``; yield the language model's, renamed."""
        for name, tensor in weights:
            n = name[len("model."):] if name.startswith("model.") else name
            if n.startswith("language_model."):
                rest = n[len("language_model."):]
                yield (rest if rest.startswith(("model.", "lm_head.")) else f"model.{rest}"), tensor
                continue
            if n.startswith("lm_head."):
                yield n, tensor
                continue
            # CLIPVisionModel nests its modules under ``vision_model.`` in transformers 4.x only
            spellings = (n, n.replace("vision_tower.vision_model.", "vision_tower.", 1),
                         n.replace("vision_tower.", "vision_tower.vision_model.", 1))
            target = next((t for t in spellings if t in own), None)
            if target is None:
                if name.endswith("position_ids"):  # a buffer some checkpoints store
                    continue
                raise ValueError(f"checkpoint tensor {name} has no place in a LLaVA built from this config.json")
            p = own[target]
            if tuple(p.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the model expects "
                                 f"{tuple(p.shape)}: config.json does not describe these weights")
            p.copy_(tensor)
            loaded.add(target)
