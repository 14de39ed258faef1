"""Build tiny Llama-family checkpoints in Hugging Face format with no downloads.

Random weights from a fixed seed, and a byte-level BPE tokenizer trained with the ``tokenizers``
library on text generated here. The result is a directory that ``transformers`` and
``lmnb_engine`` both load (config.json, model.safetensors, tokenizer.json, tokenizer_config.json
with a chat template, generation_config.json).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

CHAT_TEMPLATE = (
    "{% if add_bos is not defined or add_bos %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = (
    "the a an of to in is was red blue green cat dog bird tree river city house answer question "
    "yes no one two three four five six seven eight nine ten what who where when why how name "
    "color animal paris london tokyo capital country number plus minus equals hello world "
    "json key value true false null list item first second third alpha beta gamma delta"
).split()


def _corpus(seed: int, n_lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        line = " ".join(words)
        if rng.random() < 0.3:
            line = line.capitalize() + rng.choice([".", "?", "!", ":", ","])
        if rng.random() < 0.2:
            line += " " + str(rng.randint(0, 9999))
        if rng.random() < 0.1:
            line = '{"' + words[0] + '": "' + words[-1] + '", "n": ' + str(rng.randint(0, 99)) + "}"
        if rng.random() < 0.05:
            line += " café naïve 東京 😀"
        lines.append(line)
    return lines


def train_tiny_tokenizer(vocab_size: int = 512, seed: int = 0):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on generated text; returns it.

    The vocabulary holds all 256 byte symbols, so any text (any Unicode) is encodable.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok


def _config(arch: str, vocab_size: int, overrides: dict[str, Any]):
    import transformers

    base: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    if arch == "llama":
        cls = transformers.LlamaConfig
    elif arch == "mistral":
        cls = transformers.MistralConfig
        base["sliding_window"] = None
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
        base["use_sliding_window"] = False
    elif arch == "qwen3":
        cls = transformers.Qwen3Config
        base["head_dim"] = 16
        base["use_sliding_window"] = False
    else:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {ARCHITECTURES}")
    base.update(overrides)
    return cls(**base)


def randomize_weights_(model) -> None:
    """Redraw every parameter from the current torch seed, in ``named_parameters`` order: matrices
    N(0, 0.2) (large enough that greedy decoding is not flat), norm weights U(0.8, 1.2), LLaVA-NeXT's
    ``image_newline`` N(0, 1), other vectors (biases: Qwen2 qkv, CLIP, projector) N(0, 0.1)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.uniform_(0.8, 1.2)
            elif name.endswith("image_newline"):
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.1)


def make_tiny_checkpoint(
    path: str | Path,
    arch: str = "llama",
    seed: int = 0,
    vocab_size: int = 512,
    dtype: str = "float32",
    **config_overrides: Any,
) -> Path:
    """Write a random-weight checkpoint of ``arch`` (one of ``ARCHITECTURES``) to ``path``.

    ``config_overrides`` go into the HF config (e.g. ``num_hidden_layers=3``,
    ``tie_word_embeddings=True``, ``rope_scaling={...}``). Weights are drawn with
    ``torch.manual_seed(seed)`` and scaled up (std 0.2) so greedy decoding is not flat.
    Returns the directory path.
    """
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = train_tiny_tokenizer(vocab_size=vocab_size, seed=seed)
    config = _config(arch, tok.get_vocab_size(), config_overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype))
    randomize_weights_(model)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=False
    )
    model.save_pretrained(path, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(path)
    return path
