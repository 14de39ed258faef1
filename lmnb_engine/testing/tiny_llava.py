"""Build a tiny random-weight LLaVA-1.5 checkpoint (``LlavaForConditionalGeneration``) offline.

A CLIP vision tower, the two-layer GELU projector and a Llama/Mistral/Qwen2 language model, all a
few kilobytes, plus the tokenizer (the tiny BPE of ``tiny_checkpoint`` with an ``<image>`` special
token) and a ``LlavaProcessor`` whose image processor pads to a square first (LLaVA-1.5's
``image_aspect_ratio="pad"``). ``transformers`` and ``lmnb_engine`` both load the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmnb_engine.testing.tiny_checkpoint import CHAT_TEMPLATE, _config, randomize_weights_, train_tiny_tokenizer

IMAGE_TOKEN = "<image>"


def make_tiny_llava_checkpoint(
    path: str | Path,
    text_arch: str = "llama",
    seed: int = 0,
    image_size: int = 28,
    patch_size: int = 7,
    vision_overrides: dict | None = None,
    anyres: bool = False,
    siglip: bool = False,
    **text_overrides: Any,
) -> Path:
    """Write a random-weight LLaVA checkpoint to ``path`` and return it.

    Args:
        text_arch: the language model family ("llama", "mistral" or "qwen2").
        seed: ``torch.manual_seed`` of the weights (std 0.2 normal matrices, so greedy output varies).
        image_size, patch_size: CLIP geometry; an image becomes ``(image_size // patch_size) ** 2``
            placeholder tokens (the CLS feature is dropped: ``vision_feature_select_strategy="default"``).
        vision_overrides: keys of the ``CLIPVisionConfig`` (e.g. ``{"hidden_size": 256}``).
        anyres: write a LLaVA-NeXT checkpoint (``LlavaNextForConditionalGeneration``) instead:
            any-resolution tiling over the grid pinpoints 1x2, 2x1 and 2x2 tiles of ``image_size``.
        siglip: a SigLIP vision tower (no CLS feature) with the "full" feature strategy on its last
            layer, as llava-interleave checkpoints have, instead of CLIP's.
        text_overrides: keys of the text config (e.g. ``num_hidden_layers=3``).
    Raises:
        ValueError: an unknown ``text_arch``.
    """
    import torch
    import transformers

    if text_arch not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"text_arch={text_arch!r}: LLaVA checkpoints here use llama, mistral or qwen2")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=train_tiny_tokenizer(seed=seed), bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_token_id = fast.convert_tokens_to_ids(IMAGE_TOKEN)
    text_config = _config(text_arch, len(fast), text_overrides)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=patch_size, projection_dim=32)
    if siglip:
        vision.pop("projection_dim")
    vision_cls = transformers.SiglipVisionConfig if siglip else transformers.CLIPVisionConfig
    vision_config = vision_cls(**{**vision, **(vision_overrides or {})})
    strategy = "full" if siglip else "default"
    common = dict(vision_config=vision_config, text_config=text_config, image_token_id=image_token_id,
                  vision_feature_layer=-1 if siglip else -2, vision_feature_select_strategy=strategy,
                  projector_hidden_act="gelu")
    pinpoints = [[image_size, 2 * image_size], [2 * image_size, image_size], [2 * image_size, 2 * image_size]]
    if anyres:
        config = transformers.LlavaNextConfig(image_grid_pinpoints=pinpoints, **common)
        model_cls = transformers.LlavaNextForConditionalGeneration
    else:
        config = transformers.LlavaConfig(**common)
        model_cls = transformers.LlavaForConditionalGeneration
    torch.manual_seed(seed)
    model = model_cls(config)
    randomize_weights_(model)
    model.generation_config = transformers.GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2,
                                                            do_sample=False)
    model.save_pretrained(path, safe_serialization=True)
    size = dict(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    if anyres:
        image_processor = transformers.LlavaNextImageProcessor(image_grid_pinpoints=pinpoints, **size)
        processor_cls = transformers.LlavaNextProcessor
    elif siglip:
        image_processor = transformers.SiglipImageProcessor(size={"height": image_size, "width": image_size})
        processor_cls = transformers.LlavaProcessor
    else:
        image_processor = transformers.LlavaImageProcessor(do_pad=True, **size)
        processor_cls = transformers.LlavaProcessor
    processor = processor_cls(
        image_processor=image_processor, tokenizer=fast, patch_size=patch_size,
        vision_feature_select_strategy=strategy, num_additional_image_tokens=0 if siglip else 1, image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    fast.save_pretrained(path)
    return path
