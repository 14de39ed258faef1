"""Load a Hugging Face checkpoint (local directory or hub id) into the engine's own model code.

``load_model`` reads ``config.json`` with ``transformers.AutoConfig``, builds the model on the meta
device (``accelerate.init_empty_weights``), materializes it on the target device and copies the
``*.safetensors`` tensors in (sharded checkpoints through ``model.safetensors.index.json``), or
fills seeded random weights for benchmarks of real shapes. The tokenizer, EOS ids, chat template
and generation defaults come along in one ``LoadedModel``.
"""

from __future__ import annotations

import os
import reprlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from lmnb_engine import is_demo_name
from lmnb_engine import tokenizer as tok
from lmnb_engine.byte_size import byte_size
from lmnb_engine.checkpoint_path import DEMO_MODEL_PATH, local_checkpoint, looked_in
from lmnb_engine.cli_options import option_error
from lmnb_engine.cuda_presence import missing_cuda, no_cuda_error
from lmnb_engine.device_names import check_device, dtype_name
from lmnb_engine.model_config import MULTIMODAL_ARCHITECTURES, SUPPORTED_ARCHITECTURES, ModelConfig
from lmnb_engine.models.presets import PRESETS, preset_hf_config
from lmnb_engine.models.registry import build_model

__all__ = ["DEMO_MODEL_PATH", "SUPPORTED_ARCHITECTURES", "LoadedModel", "load_model"]


# What a hub snapshot needs: config, weights, tokenizer files, chat template.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]
# Mistral's repos also hold its own format's weights (consolidated.safetensors), as large as the
# model again; _safetensors_files never reads them
_HUB_IGNORE = ["consolidated*.safetensors"]


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with everything the engine needs to talk to it.

    Attributes:
        model: ``model(batch, attn, kv_pool)`` -> float32 logits ``[len(batch.logits_indices), vocab]``.
        config: ``ModelConfig`` (geometry, dtype, device).
        tokenizer: transformers ``PreTrainedTokenizerFast``.
        eos_token_ids: from generation_config.json (config.json when there is none) and the tokenizer;
            empty where none of them names one (``load_model`` then warns: the output ends only at
            its max tokens or a stop).
        chat_template: Jinja template string, or None.
        generation_defaults: sampling keys from generation_config.json (may be empty).
        path: the checkpoint directory, or None for a built-in shape preset.
    """

    model: nn.Module
    config: ModelConfig
    tokenizer: Any
    eos_token_ids: frozenset[int]
    chat_template: str | None
    generation_defaults: dict[str, Any]
    path: Path | None


def load_model(
    model: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    random_weights: bool = False,
    seed: int = 0,
    tp: Any = None,
) -> LoadedModel:
    """Load a Llama-family causal LM.

    Args:
        model: None or "demo" (``lmnb_engine.DEMO_MODEL_NAME``, unless a local path of that name
            exists) for the bundled demo checkpoint (``DEMO_MODEL_PATH``); a local HF checkpoint
            directory; a hub id (taken from the local HF cache, downloaded only when
            ``HF_HUB_OFFLINE`` is not set); or, with ``random_weights=True``, a shape preset name
            from ``models.presets.PRESETS`` (e.g. ``"llama-3-8b"``).
        device: None -> "cuda" if available, else "cpu".
        dtype: None -> float32 on CPU, bfloat16 on CUDA; a ``torch.dtype`` or its name.
        random_weights: skip the safetensors and fill seeded random weights (normal with the
            config's ``initializer_range``, norms 1, biases 0).
        seed: seed of the random weights.
        tp: a ``distributed.TPGroup``: load only this tensor-parallel rank's shard (sharded on
            the meta device, filled from slices of the checkpoint tensors; with random weights
            each rank draws its own shard). ``config`` stays the whole model's.

    A checkpoint without tokenizer files, and every preset, use the demo checkpoint's tokenizer
    (with a warning); presets fall back to a freshly trained tiny BPE tokenizer if the demo
    checkpoint is absent.

    The EOS ids are those generation_config.json names (config.json's where there is no
    generation_config.json, as transformers reads them) and the tokenizer's ``eos_token``; a
    config.json that names none adds none (its config class's default, 2 for Llama, is no EOS of
    the checkpoint's). Where none is named a warning says so: outputs then end only at their max
    tokens or a stop.

    Raises:
        FileNotFoundError: no such directory (or a file given), hub id not available, no
            config.json or no safetensors, no demo checkpoint yet.
        ValueError: unsupported architecture (the message lists ``SUPPORTED_ARCHITECTURES``),
            unsupported RoPE type or hidden_act, a quantized checkpoint, bad dtype or device, a
            config.json that is not valid JSON, a truncated or corrupt safetensors file, weights that
            do not fit the config or the GPU;
            with ``tp``: heads that do not divide, or a multimodal model.
    """
    path, hf_config, config = _checked_config(model, device, dtype, random_weights)
    tokenizer, tok_dir = _tokenizer_for(path)  # before the weights: a missing tokenizer fails fast
    net = _instantiate(config, tp)
    if random_weights:
        _init_random(net, hf_config, seed)
    elif tp is not None:  # [issue 9]
        from lmnb_engine.distributed.shard import shard_checkpoint

        net.load_weights(shard_checkpoint(_iter_safetensors(path), config, tp))
    else:
        net.load_weights(_iter_safetensors(path))
    gen_cfg = tok.read_json(path / "generation_config.json") if path is not None else {}
    if path is not None and not (path / "generation_config.json").is_file():
        # transformers then stops at config.json's EOS ids (GenerationConfig.from_model_config);
        # Llama-3.1 Instruct lists three there, its tokenizer only one
        gen_cfg = {"eos_token_id": _written_eos_token_id(path)}
    eos_token_ids = tok.eos_token_ids(tokenizer, gen_cfg)
    if not eos_token_ids:
        warnings.warn(f"no EOS token id is known for {path or model}: its generation_config.json, config.json and "
                      "tokenizer name none, so an output ends only at its max_new_tokens, a stop string, stop_regex "
                      "or stop_token_ids; to stop where the model ends its text, add its end token's id as "
                      '"eos_token_id" to generation_config.json (or eos_token to tokenizer_config.json)', stacklevel=2)
    return LoadedModel(
        model=net,
        config=config,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids,
        chat_template=tok.chat_template(tokenizer, tok_dir) if tok_dir is not None else tokenizer.chat_template,
        generation_defaults=tok.generation_defaults(gen_cfg),
        path=path,
    )


def check_model(model: str | os.PathLike | None = None, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None, random_weights: bool = False) -> None:
    """The checks ``load_model`` makes before it takes any memory: the device and dtype, the
    checkpoint (found locally or in the hub cache, downloaded where online), its config.json (a
    supported, unquantized architecture). For a caller that must free memory before a load (the
    kernel's ``%lm load`` onto the GPU its old engine holds), so that a mistyped path does not
    cost it the old engine.

    Raises:
        The errors ``load_model`` raises for these (``FileNotFoundError``, ``ValueError``,
        ``TypeError``), with the same messages.
    """
    _checked_config(model, device, dtype, random_weights)


def tokenizer_and_config(model: str | os.PathLike | None = None, device: str | torch.device | None = None,
                         dtype: str | torch.dtype | None = None, random_weights: bool = False) -> tuple[Any, ModelConfig]:
    """``(tokenizer, ModelConfig)`` that ``load_model`` would give for these arguments, read without
    the weights: no device memory is taken. For a check that needs the tokenizer before a caller
    frees memory for the load (``pool_floor.refuse_a_pool_too_small_to_load``). Warnings
    ``load_model`` gives again (a checkpoint without tokenizer files) are not given here.

    Raises:
        As ``check_model``; ``FileNotFoundError`` where no tokenizer is found (``load_model``'s).
    """
    path, _, config = _checked_config(model, device, dtype, random_weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the load that follows says them)
        tokenizer, _ = _tokenizer_for(path)
    return tokenizer, config


def _checked_config(model, device, dtype, random_weights: bool) -> tuple[Path | None, dict, ModelConfig]:
    """``(checkpoint directory or None for a preset, its HF config dict, ModelConfig)`` of
    ``load_model``'s arguments, checked (``check_model``)."""
    dev = resolve_device(device)
    dt = _resolve_dtype(dtype, dev)
    if isinstance(model, str) and model in PRESETS and not Path(model).exists():
        if not random_weights:
            raise option_error(ValueError, f"{model!r} is a shape preset without weights",
                               ("pass {}", "random_weights", True), ("give a checkpoint directory or hub id",))
        hf_config, path = preset_hf_config(model), None
    else:
        path = _resolve_path(model, random_weights)
        hf_config = _read_hf_config(path)
        if not random_weights:
            _refuse_quantized(hf_config, path)
    return path, hf_config, ModelConfig.from_hf(hf_config, dt, dev)


def _written_eos_token_id(path: Path) -> Any:
    """The ``eos_token_id`` written in ``path``'s config.json (an int, a list of them, or None), or
    where it has none at the top, in its ``text_config`` (a multimodal model's language model), as
    transformers' ``GenerationConfig.from_model_config`` reads it. Not the config class's default:
    ``LlamaConfig`` gives 2 to a config.json that names no EOS, whatever token 2 is in its
    vocabulary, and the output was cut at that token with finish reason "stop"."""
    raw = tok.read_json(path / "config.json")
    text_config = raw.get("text_config")
    if raw.get("eos_token_id") is None and isinstance(text_config, dict):
        return text_config.get("eos_token_id")
    return raw.get("eos_token_id")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device the engine loads on for ``device``: None is the engine's default, CUDA where torch
    sees it, else the CPU (the kernel's ``shared_accelerator`` reads the same rule).

    Raises:
        ValueError: a device the engine does not run on (``device_names.check_device``), or a CUDA
            device where torch sees none (``no_cuda_error``)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(check_device(str(device)))  # (a torch.device as its name: one rule, device_names)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise no_cuda_error(str(device), missing_cuda() or "torch sees no CUDA device")
    return dev


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype)
    return getattr(torch, dtype_name(name))  # (a torch.dtype by its name: one rule, device_names)


def _resolve_path(model: str | os.PathLike | None, random_weights: bool) -> Path:
    """The local checkpoint directory for ``model`` (see ``load_model``).

    Raises:
        TypeError: ``model`` is neither None, a str nor an ``os.PathLike`` (pathlib's own error
            named neither the argument nor what it takes).
    """
    if model is not None and not isinstance(model, (str, os.PathLike)):
        # (cut, on one line: a model object's repr is its whole module tree, hundreds of lines)
        shown = " ".join(reprlib.repr(model).split())
        raise TypeError("model must be a checkpoint directory (a str or a path), a Hugging Face hub id, or None for "
                        f"the built-in demo model; got {shown} ({type(model).__name__})")
    if model is None or is_demo_name(model):  # ("demo", where the hub would be asked for a repo "demo")
        if not (DEMO_MODEL_PATH / "config.json").is_file():
            raise option_error(FileNotFoundError, f"the demo checkpoint is not built yet ({DEMO_MODEL_PATH} has no "
                               "config.json)", ("pass a checkpoint directory or hub id as `{}`", "model", None))
        return DEMO_MODEL_PATH
    return local_checkpoint(model, _presets_hint(random_weights)) or _from_hub(str(model), random_weights)


def _presets_hint(random_weights: bool) -> str:
    """With ``random_weights`` the model may also be a shape preset: a misspelt preset name was
    reported as a path or hub id only, so the error did not say which names exist."""
    return f", or name a shape preset ({', '.join(PRESETS)})" if random_weights else ""


def _relative_to_cwd(model: str) -> str:
    """``_looked_in`` for a name that reads as a hub id: a relative path too where it holds a "/"
    (``models/llama``); a bare name (``gpt2``) is only an id."""
    return looked_in(Path(model)) if "/" in model else ""


def _hub_offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return env or bool(constants.HF_HUB_OFFLINE)


def _from_hub(repo_id: str, random_weights: bool) -> Path:
    """Snapshot directory of ``repo_id``: the local HF cache first, then a download if online."""
    from huggingface_hub import constants, snapshot_download

    patterns = [p for p in _HUB_PATTERNS if not (random_weights and p == "*.safetensors")]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, ignore_patterns=_HUB_IGNORE,
                                      local_files_only=True))
    except Exception:  # not cached (the hub client raises several types); try the network below
        pass
    if _hub_offline():
        raise FileNotFoundError(
            f"{repo_id!r} is neither a local directory{_relative_to_cwd(repo_id)} nor in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and downloads are off (HF_HUB_OFFLINE). Fix: pass a local "
            f"checkpoint directory, or run `hf download {repo_id}` where the network is reachable"
            f"{_presets_hint(random_weights)}"
        )
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, ignore_patterns=_HUB_IGNORE))
    except Exception as e:  # (the hub client's messages run over several lines: the first says what)
        first = (str(e).strip().splitlines() or [""])[0]
        raise FileNotFoundError(
            f"{repo_id!r} is not a local directory{_relative_to_cwd(repo_id)} and could not be fetched from the "
            "Hugging Face hub "
            f"({type(e).__name__}: {first}). Fix: check the id, log in for gated models, or pass a local path"
            f"{_presets_hint(random_weights)}"
        ) from None


def _read_hf_config(path: Path) -> Any:
    """``AutoConfig`` of ``path``, after checking the architecture from the raw JSON.

    The check comes first so an unknown ``model_type`` (which AutoConfig cannot parse) still gets
    the "unsupported architecture" message.
    """
    from transformers import AutoConfig

    archs = tok.read_json(path / "config.json").get("architectures") or []
    if not isinstance(archs, list):
        example = f"[{archs!r}]" if isinstance(archs, str) else "['LlamaForCausalLM']"
        raise ValueError(f"'architectures' in {path / 'config.json'} is {archs!r}; it must be a list, e.g. {example}")
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ValueError(
            f"unsupported architecture {archs or '(none)'} in {path / 'config.json'}; lmnb_engine "
            f"supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as e:  # transformers raises ValueError/KeyError/OSError; name the file instead
        import transformers

        raise ValueError(
            f"transformers {transformers.__version__} could not parse {path / 'config.json'} "
            f"({type(e).__name__}: {str(e)[:300]}); if its model_type is newer than this transformers "
            "(Qwen3 needs >= 4.51), upgrade transformers"
        ) from None


def _refuse_quantized(hf_config: Any, path: Path) -> None:
    """Raise ``ValueError`` for a quantized checkpoint (AWQ, GPTQ, FP8, bitsandbytes...): its
    packed tensors (``qweight``, ``weight_scale_inv``) would otherwise be reported as weights that
    do not fit config.json, which names the wrong problem."""
    q = getattr(hf_config, "quantization_config", None)
    if q:
        method = q.get("quant_method", "unknown") if isinstance(q, dict) else getattr(q, "quant_method", "unknown")
        raise option_error(
            ValueError, f"{path} holds a quantized checkpoint (quantization_config.quant_method: {method}); "
            "lmnb_engine loads unquantized float32/bfloat16/float16 weights",
            ("use the original model's checkpoint",), ("pass {} for its shapes", "random_weights", True))


def _instantiate(config: ModelConfig, tp: Any = None) -> nn.Module:
    """Build on the meta device (and cut it to the rank's shard under ``tp``), then give every
    parameter real (uninitialized) storage.

    Parameters are replaced one by one, keeping shared ones (tied embeddings) shared; buffers
    (RoPE inverse frequencies, built on CPU) just move. ``Module.to_empty`` would untie them.
    """
    from accelerate import init_empty_weights

    with init_empty_weights():
        net = build_model(config)
    net.tie_weights()  # again outside the context: accelerate's patched setattr copies parameters
    if tp is not None:  # [issue 9]
        from lmnb_engine.distributed.shard import shard_model_

        if config.architecture in MULTIMODAL_ARCHITECTURES:
            raise ValueError(f"tensor parallelism supports the text-only Llama family, not {config.architecture}")
        shard_model_(net, tp)
    _check_fits(net, config)  # [issue 9]
    made: dict[int, nn.Parameter] = {}
    for module in net.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(
                        torch.empty(p.shape, dtype=config.dtype, device=config.device), requires_grad=False
                    )
                module._parameters[name] = made[id(p)]
    return net.to(config.device).eval()


def _check_fits(net: nn.Module, config: ModelConfig) -> None:
    """[issue 9] Raise ``ValueError`` before materializing weights that cannot fit in free GPU
    memory (rather than a CUDA out-of-memory error from deep inside the loader)."""
    if config.device.type != "cuda":
        return
    params = {id(p): p for p in net.parameters()}.values()  # tied parameters counted once
    need = sum(p.numel() for p in params) * torch.empty((), dtype=config.dtype).element_size()
    free = torch.cuda.mem_get_info(config.device)[0]
    if need > free:
        raise ValueError(
            f"the model's weights need {byte_size(need)} in {str(config.dtype).replace('torch.', '')} but "
            f"only {byte_size(free)} of memory is free on {config.device}; free the GPU, choose a smaller "
            "model, or use bfloat16/float16 instead of float32"
        )


@torch.no_grad()
def _init_random(net: nn.Module, hf_config: Any, seed: int) -> None:
    """Seeded random weights: normal(0, initializer_range) matrices, ones for norms, zeros for biases."""
    std = float(getattr(hf_config, "initializer_range", 0.02))
    device = next(net.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in net.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.zero_()


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = tok.read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' (tensor name -> shard file); download or save it again")
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not (path / f).is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are missing: {absent}")
        return [path / f for f in files]
    if (path / "model.safetensors").is_file():
        # what transformers loads: other *.safetensors beside it (a PEFT adapter_model.safetensors
        # left by training, Mistral's consolidated.safetensors) are not this model's weights
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise option_error(
            FileNotFoundError, f"no *.safetensors weights in {path} (PyTorch .bin checkpoints are not supported)",
            ("re-save it with save_pretrained(safe_serialization=True)",), ("pass {}", "random_weights", True))
    return files


def _iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor of the checkpoint, one shard open at a time."""
    from safetensors import SafetensorError, safe_open

    for f in _safetensors_files(path):
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for name in st.keys():
                    yield name, st.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:  # SafetensorError is no OSError
            raise ValueError(tok.lfs_pointer_fix(f) or f"cannot read the weights in {f} ({type(e).__name__}: {e}); "
                             "the file is truncated or corrupt: download or save it again") from None


def _tokenizer_for(path: Path | None) -> tuple[Any, Path | None]:
    """(tokenizer, the directory it came from) for checkpoint ``path`` (None for presets)."""
    if path is not None and tok.has_tokenizer(path):
        return tok.load_tokenizer(path), path
    where = f"{path} has no tokenizer files" if path is not None else "shape presets have no tokenizer"
    if tok.has_tokenizer(DEMO_MODEL_PATH):
        warnings.warn(f"{where}; using the demo checkpoint's tokenizer ({DEMO_MODEL_PATH})", stacklevel=3)
        return tok.load_tokenizer(DEMO_MODEL_PATH), DEMO_MODEL_PATH
    if path is not None:
        raise FileNotFoundError(
            f"{where} (tokenizer.json / tokenizer_config.json) and the demo tokenizer is not built; "
            "copy the tokenizer files of the model into the directory"
        )
    from transformers import PreTrainedTokenizerFast

    from lmnb_engine.testing.tiny_checkpoint import SPECIAL_TOKENS, train_tiny_tokenizer

    warnings.warn(f"{where} and the demo checkpoint is absent; training a tiny BPE tokenizer", stacklevel=3)
    fast = PreTrainedTokenizerFast(tokenizer_object=train_tiny_tokenizer(), bos_token=SPECIAL_TOKENS[0],
                                   eos_token=SPECIAL_TOKENS[1], pad_token=SPECIAL_TOKENS[2])
    return fast, None
