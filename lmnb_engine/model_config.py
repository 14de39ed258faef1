"""The model geometry the engine needs, read once from a Hugging Face ``config.json``.

``ModelConfig`` is the one place that knows how the four supported families differ (which
projections carry a bias, whether q/k get a per-head RMSNorm) and how transformers 4.x and 5.x
spell RoPE settings (``rope_scaling`` + ``rope_theta`` in 4.x, ``rope_parameters`` in 5.x).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

# Per-architecture differences from Llama, matching the transformers modeling files:
#   qkv_bias: "attention_bias" = follow config.attention_bias, True = always (Qwen2).
#   o_bias:   same for o_proj (Qwen2 has qkv bias but no o_proj bias).
#   qk_norm:  RMSNorm over head_dim on q and k before RoPE (Qwen3).
_ARCH_FLAGS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm=False),
    "MistralForCausalLM": dict(qkv_bias=False, o_bias=False, qk_norm=False),
    "Qwen2ForCausalLM": dict(qkv_bias=True, o_bias=False, qk_norm=False),
    "Qwen3ForCausalLM": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm=True),
}

# [issue 10] Vision-language wrappers: the geometry is their text model's (``text_config``).
MULTIMODAL_ARCHITECTURES: tuple[str, ...] = ("LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration")
_TEXT_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCH_FLAGS) + MULTIMODAL_ARCHITECTURES

# RoPE variants whose inverse frequencies are fixed over the context the engine runs: YaRN's are,
# with a constant attention factor on cos/sin (Qwen2.5/Qwen3 model cards add it for long context);
# dynamic NTK rescales only past max_position_embeddings, which caps our context, so within it its
# frequencies are the default ones (as transformers computes them). LongRoPE switches frequency
# sets with the sequence length, and is refused.
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn", "dynamic")

# The MLP is SiLU-gated (``layers.mlp.SiluAndMul``); transformers' ACT2FN spells SiLU both ways.
SUPPORTED_HIDDEN_ACTS: tuple[str, ...] = ("silu", "swish")


@dataclass(frozen=True)
class ModelConfig:
    """Geometry and per-family switches of a decoder-only Llama-family model.

    Attributes:
        architecture: HF class name, one of ``SUPPORTED_ARCHITECTURES``.
        num_layers, num_q_heads, num_kv_heads, head_dim, hidden_size, intermediate_size, vocab_size.
        context_len: longest sequence (tokens) the engine may run: ``max_position_embeddings``,
            capped at the sliding window when one is active (we attend over the full sequence, so
            beyond the window we would no longer match the reference model).
        dtype, device: of weights and activations.
        rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: ``lm_head`` shares the embedding matrix.
        qkv_bias, o_bias, mlp_bias: which linear layers carry a bias.
        qk_norm: per-head RMSNorm on q and k (Qwen3).
        rope_type, rope_theta: RoPE variant (``SUPPORTED_ROPE_TYPES``) and base.
        hf_config: the transformers config object (RoPE init functions read it); for a
            multimodal model, its ``text_config``.
        multimodal_hf_config: [issue 10] the whole config of a vision-language model (LLaVA), else None.
    """

    architecture: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    context_len: int
    dtype: torch.dtype
    device: torch.device
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope_type: str
    rope_theta: float
    hf_config: Any = field(repr=False, compare=False)
    multimodal_hf_config: Any = field(default=None, repr=False, compare=False)  # [issue 10]

    @classmethod
    def from_hf(cls, hf_config: Any, dtype: torch.dtype, device: torch.device | str) -> "ModelConfig":
        """Build from a transformers ``PretrainedConfig``.

        Raises:
            ValueError: the architecture is not in ``SUPPORTED_ARCHITECTURES``, the RoPE type is
                not in ``SUPPORTED_ROPE_TYPES``, ``hidden_act`` is not in ``SUPPORTED_HIDDEN_ACTS``,
                or the head geometry is inconsistent.
        """
        if _architecture(hf_config) in MULTIMODAL_ARCHITECTURES:  # [issue 10]
            return _multimodal_config(cls, hf_config, dtype, device)
        arch = _architecture(hf_config)
        flags = _ARCH_FLAGS[arch]
        attention_bias = bool(getattr(hf_config, "attention_bias", False))

        def flag(name: str) -> bool:
            v = flags[name]
            return attention_bias if v == "attention_bias" else bool(v)

        num_q_heads = hf_config.num_attention_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_q_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_q_heads
        if num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_q_heads}) must be a multiple of num_key_value_heads "
                f"({num_kv_heads}) for grouped-query attention"
            )
        # transformers' MLP applies config.hidden_act; ours is always SiLU, so any other
        # activation would load and run with silently wrong logits.
        hidden_act = getattr(hf_config, "hidden_act", "silu")
        if hidden_act not in SUPPORTED_HIDDEN_ACTS:
            raise ValueError(
                f"unsupported hidden_act {hidden_act!r} in config.json; lmnb_engine's {arch} MLP is "
                f"SiLU-gated ({', '.join(SUPPORTED_HIDDEN_ACTS)})"
            )
        rope_type, rope_theta = rope_settings(hf_config)
        return cls(
            architecture=arch,
            num_layers=hf_config.num_hidden_layers,
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            vocab_size=hf_config.vocab_size,
            context_len=_context_len(hf_config),
            dtype=dtype,
            device=torch.device(device),
            rms_norm_eps=float(hf_config.rms_norm_eps),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=flag("qkv_bias"),
            o_bias=flag("o_bias"),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            qk_norm=flags["qk_norm"],
            rope_type=rope_type,
            rope_theta=rope_theta,
            hf_config=hf_config,
        )


def _multimodal_config(cls, hf_config: Any, dtype: torch.dtype, device: torch.device | str) -> "ModelConfig":
    """[issue 10] A LLaVA config: the text model's geometry, the wrapper's architecture name."""
    import dataclasses

    text = hf_config.text_config
    text_arch = _TEXT_ARCH_BY_MODEL_TYPE.get(getattr(text, "model_type", None))
    if text_arch is None:
        raise ValueError(
            f"the language model of this {_architecture(hf_config)} is a {getattr(text, 'model_type', '?')!r}; "
            f"lmnb_engine runs LLaVA on {', '.join(_TEXT_ARCH_BY_MODEL_TYPE)} language models"
        )
    text.architectures = [text_arch]
    base = cls.from_hf(text, dtype, device)
    return dataclasses.replace(base, architecture=_architecture(hf_config), multimodal_hf_config=hf_config)


def _architecture(hf_config: Any) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for a in archs:
        if a in _ARCH_FLAGS or a in MULTIMODAL_ARCHITECTURES:
            return a
    raise ValueError(
        f"unsupported architecture {archs or '(none given in config.json)'}; lmnb_engine supports "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} (the 'architectures' field of config.json)"
    )


def rope_settings(hf_config: Any) -> tuple[str, float]:
    """``(rope_type, rope_theta)`` from a transformers 4.x or 5.x config.

    Raises:
        ValueError: a RoPE type other than ``SUPPORTED_ROPE_TYPES`` (e.g. dynamic NTK or YaRN).
    """
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:  # transformers >= 5
        rope_type = params.get("rope_type", "default")
        theta = params["rope_theta"]
    else:  # transformers 4.x: rope_theta plus an optional rope_scaling dict
        scaling = getattr(hf_config, "rope_scaling", None) or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        theta = getattr(hf_config, "rope_theta", 10000.0)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported RoPE type {rope_type!r}; lmnb_engine supports {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return rope_type, float(theta)


def _context_len(hf_config: Any) -> int:
    ctx = int(hf_config.max_position_embeddings)
    window = getattr(hf_config, "sliding_window", None)
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:  # Qwen2/3: windowed layers are those from max_window_layers on
        active = window is not None and "sliding_attention" in layer_types
    else:  # Mistral applies its window whenever set
        active = window is not None and getattr(hf_config, "use_sliding_window", True)
    if active and window < ctx:
        warnings.warn(
            f"config has a sliding window of {window} tokens; lmnb_engine attends over the full "
            f"sequence, so context_len is capped at {window} to stay exact",
            stacklevel=3,
        )
        ctx = int(window)
    return ctx
