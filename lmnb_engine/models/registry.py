"""Architecture name (``config.json`` ``architectures[0]``) -> model class."""

from __future__ import annotations

from torch import nn

from lmnb_engine.model_config import MULTIMODAL_ARCHITECTURES, SUPPORTED_ARCHITECTURES, ModelConfig
from lmnb_engine.models.llama import LlamaForCausalLM

# Mistral, Qwen2 and Qwen3 differ from Llama only in switches that ModelConfig sets.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES if arch not in MULTIMODAL_ARCHITECTURES
}


def build_model(config: ModelConfig) -> nn.Module:
    """Instantiate the model class for ``config.architecture`` (weights uninitialized)."""
    if config.architecture == "LlavaForConditionalGeneration":  # [issue 10] imported only when used
        from lmnb_engine.models.llava import LlavaForConditionalGeneration

        return LlavaForConditionalGeneration(config)
    if config.architecture == "LlavaNextForConditionalGeneration":
        from lmnb_engine.models.llava_next import LlavaNextForConditionalGeneration

        return LlavaNextForConditionalGeneration(config)
    return MODEL_REGISTRY[config.architecture](config)
