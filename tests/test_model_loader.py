"""load_model: checkpoint variants (RoPE scaling, tying, shards, head_dim), metadata, errors,
random weights. Each variant is checked against transformers on the same checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import lmnb_engine.model_loader as loader
from helpers_model import ManualRunner, hf_logits, hf_model
from lmnb_engine.forward_batch import ForwardMode
from lmnb_engine.model_config import ModelConfig
from lmnb_engine.model_loader import SUPPORTED_ARCHITECTURES, load_model
from lmnb_engine.models.presets import PRESETS, preset_hf_config
from lmnb_engine.testing.tiny_checkpoint import CHAT_TEMPLATE

TEXT = "Hello world! the cat is red and the dog is blue. What is the capital of tokyo? 1234 " * 3


def assert_matches_hf(path, **load_kwargs):
    """Full-sequence logits of our model equal HF's (fp32, atol 1e-4); returns the LoadedModel."""
    lm = load_model(path, device="cpu", **load_kwargs)
    ids = lm.tokenizer(TEXT).input_ids
    r = ManualRunner(lm)
    ours = r.run(ForwardMode.EXTEND, [(r.new_request(), ids)], all_logits=True)
    torch.testing.assert_close(ours, hf_logits(hf_model(path), ids), atol=1e-4, rtol=0)
    return lm


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        # Short original context so all three llama3 frequency bands occur at head_dim 16.
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64},
        # YaRN changes every frequency band and scales cos/sin by its attention factor (Qwen3's
        # model card adds it for long context; it was refused)
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        # dynamic NTK rescales only past max_position_embeddings, beyond the engine's context
        {"rope_type": "dynamic", "factor": 2.0},
    ],
    ids=["linear", "llama3", "yarn", "dynamic"],
)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_rope_scaling_matches_hf(tiny_checkpoint_factory, rope_scaling, arch):
    lm = assert_matches_hf(tiny_checkpoint_factory(arch, rope_scaling=rope_scaling))
    assert lm.config.rope_type == rope_scaling["rope_type"]


def test_tied_embeddings(tiny_checkpoint_factory):
    path = tiny_checkpoint_factory("qwen2", tie_word_embeddings=True)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # the checkpoint really relies on tying
    lm = assert_matches_hf(path)
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight


def test_tied_embeddings_stored_as_the_head_alone(tiny_checkpoint_factory, tmp_path):
    """A tied checkpoint whose one copy is named lm_head.weight: transformers ties it into the
    embedding; lmnb refused it ("lacks model.embed_tokens.weight")."""

    from safetensors.torch import load_file, save_file

    src = tiny_checkpoint_factory("qwen2", tie_word_embeddings=True)
    dst = tmp_path / "head-only"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    lm = assert_matches_hf(dst)  # transformers' logits from the same file
    assert torch.equal(lm.model.model.embed_tokens.weight, tensors["lm_head.weight"])


def test_attention_bias_llama(tiny_checkpoint_factory):
    lm = assert_matches_hf(tiny_checkpoint_factory("llama", attention_bias=True, mlp_bias=True))
    assert lm.config.qkv_bias and lm.config.o_bias and lm.config.mlp_bias


def test_qwen3_head_dim_not_hidden_over_heads(tiny_checkpoint_factory):
    lm = assert_matches_hf(tiny_checkpoint_factory("qwen3", head_dim=32))
    assert lm.config.head_dim == 32 != lm.config.hidden_size // lm.config.num_q_heads


def test_sharded_checkpoint(tiny_checkpoint_factory, tmp_path):
    src = tiny_checkpoint_factory("llama")
    hf_model(src).save_pretrained(tmp_path, max_shard_size="40KB")
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, tmp_path / f.name)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert_matches_hf(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))  # was a bare KeyError: 'weight_map'
    with pytest.raises(ValueError, match=r"index\.json has no 'weight_map' \(tensor name -> shard file\)"):
        load_model(tmp_path)


def test_metadata_from_checkpoint_files(tiny_llama, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    gen = {"bos_token_id": 0, "eos_token_id": [1, 5], "temperature": 0.6, "top_p": 0.9, "transformers_version": "x"}
    (ck / "generation_config.json").write_text(json.dumps(gen))
    lm = load_model(ck, device="cpu")
    assert lm.tokenizer.eos_token_id == 1
    assert lm.eos_token_ids == frozenset({1, 5})
    assert lm.generation_defaults == {"temperature": 0.6, "top_p": 0.9}
    assert lm.chat_template == CHAT_TEMPLATE
    assert lm.path == ck
    c = lm.config
    assert (c.dtype, c.device.type, c.context_len) == (torch.float32, "cpu", 512)
    assert lm.tokenizer.decode(lm.tokenizer("the cat").input_ids) == "the cat"


def test_bfloat16_runs_and_stays_close(tiny_llama):
    lm32 = load_model(tiny_llama, device="cpu")
    lm16 = load_model(tiny_llama, device="cpu", dtype="bfloat16")
    assert next(lm16.model.parameters()).dtype == torch.bfloat16
    ids = lm32.tokenizer(TEXT).input_ids[:20]
    r32, r16 = ManualRunner(lm32), ManualRunner(lm16)
    a = r32.run(ForwardMode.EXTEND, [(r32.new_request(), ids)])
    b = r16.run(ForwardMode.EXTEND, [(r16.new_request(), ids)])
    assert b.dtype == torch.float32
    assert torch.corrcoef(torch.stack([a[0], b[0]]))[0, 1] > 0.99


def test_demo_names_the_demo_checkpoint_unless_a_local_path_is_named_so(tmp_path, monkeypatch):
    """load_model("demo") (so %lm load demo, lmnb serve --model demo) asked the model hub for a repo
    "demo"; it is the built-in demo model's name, as no model is. A folder "demo" is still that folder."""
    from lmnb_engine import model_or_env
    from lmnb_engine.model_loader import DEMO_MODEL_PATH, _resolve_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LMNB_MODEL", raising=False)
    assert _resolve_path("demo", False) == DEMO_MODEL_PATH and model_or_env("demo") is None
    monkeypatch.setenv("LMNB_MODEL", "demo")
    assert model_or_env(None) is None
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.json").write_text("{}")
    assert _resolve_path("demo", False) == Path("demo") and model_or_env(None) == "demo"


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_demo_taken_for_a_local_path_that_is_no_checkpoint_names_the_demo_models_directory(tmp_path, monkeypatch, kind):
    """With a folder (or file) "demo" that is no checkpoint where the model is read (a folder of demo
    notebooks), %lm load demo said only "demo is not a Hugging Face checkpoint directory: it has no
    config.json", not that the name was taken for that folder rather than the built-in demo model."""
    from lmnb_engine.model_loader import DEMO_MODEL_PATH, _resolve_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir() if kind == "folder" else (tmp_path / "demo").write_text("")
    with pytest.raises(FileNotFoundError) as e:
        _resolve_path("demo", False)
    assert str(e.value).endswith(f"; the name 'demo' is taken for the {kind} here: for the built-in demo model, "
                                 f"give its directory {DEMO_MODEL_PATH}"), str(e.value)
    with pytest.raises(FileNotFoundError) as e:  # (another name is told as before)
        _resolve_path(str(tmp_path / "demo"), False)
    assert "built-in demo model" not in str(e.value)


def test_unknown_path_names_it():
    with pytest.raises(FileNotFoundError, match="no/such/dir"):
        load_model("./no/such/dir")


@pytest.mark.parametrize("model, kind", [(123, "int"), (b"/models/llama", "bytes")])
def test_a_model_of_another_type_is_named_with_what_it_takes(model, kind):
    # lmnb.Engine(123) raised pathlib's "expected str, bytes or os.PathLike object, not int"
    with pytest.raises(TypeError) as e:
        load_model(model)
    assert str(e.value) == ("model must be a checkpoint directory (a str or a path), a Hugging Face hub id, or None "
                            f"for the built-in demo model; got {model!r} ({kind})")


def test_a_model_object_is_named_on_one_short_line():
    """lmnb.Engine(a torch module), a model object where a checkpoint's path is taken, pasted the
    module's whole repr into the error: one line per layer (31 lines, 1846 characters for 30
    Linear layers). Its repr is cut now, as reprlib cuts it, on one line, and its type named."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(30)])
    with pytest.raises(TypeError) as e:
        load_model(model)
    whole = repr(model)  # (reprlib keeps the first 13 and last 14 characters of a repr over 30)
    cut = " ".join((whole[:13] + "..." + whole[-14:]).split())
    assert cut == "Sequential( ..., bias=True) )"
    assert str(e.value) == ("model must be a checkpoint directory (a str or a path), a Hugging Face hub id, or None "
                            f"for the built-in demo model; got {cut} (Sequential)")


def test_uncached_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="lmnb-test/does-not-exist.*HF_HUB_OFFLINE"):
        load_model("lmnb-test/does-not-exist")


def test_a_misspelt_preset_with_random_weights_names_the_presets(monkeypatch, tmp_path):
    """A name that is no preset, path or cached hub id, with random_weights, was reported as a
    path or hub id only (offline, or with the hub client's several-line network error pasted in):
    nothing said which preset names exist."""
    import huggingface_hub

    presets = "llama-2-7b, llama-3-8b, llama-3.2-1b, mistral-7b, qwen2.5-0.5b, qwen3-0.6b"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        load_model("./lama-3-8b", random_weights=True)
    assert str(e.value) == (f"no checkpoint directory at './lama-3-8b' (none at {tmp_path}/lama-3-8b); check the path, "
                            f"or name a shape preset ({presets})")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        load_model("lama-3-8b", random_weights=True)
    assert str(e.value).endswith(f"where the network is reachable, or name a shape preset ({presets})")

    def snapshot_download(repo_id, local_files_only=False, **kw):
        raise OSError("no cache" if local_files_only else "Got: ConnectError: Name or service not known\nPlease check")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(FileNotFoundError) as e:
        load_model("lama-3-8b", random_weights=True)
    assert str(e.value) == ("'lama-3-8b' is not a local directory and could not be fetched from the Hugging Face hub "
                            "(OSError: Got: ConnectError: Name or service not known). Fix: check the id, log in for "
                            f"gated models, or pass a local path, or name a shape preset ({presets})")
    with pytest.raises(FileNotFoundError) as e:
        load_model("lama-3-8b")
    assert "preset" not in str(e.value)


def test_a_relative_path_that_reads_as_a_hub_id_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """`%lm load models/llama` in a kernel, which runs in the notebook's folder, said only "is not a
    local directory": not where it had looked, though the path was meant relative to another folder."""
    import huggingface_hub

    def snapshot_download(repo_id, local_files_only=False, **kw):
        raise OSError("no cache" if local_files_only else "Repository Not Found")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        load_model("models/llama")
    assert str(e.value).startswith(f"'models/llama' is not a local directory (none at {tmp_path}/models/llama) and "
                                   "could not be fetched from the Hugging Face hub (OSError: Repository Not Found)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        load_model("models/llama")
    assert str(e.value).startswith(f"'models/llama' is neither a local directory (none at {tmp_path}/models/llama) "
                                   "nor in the Hugging Face cache")


@pytest.mark.parametrize("model", ["./models/llama", "models/llama/v2", "../llama"])
def test_a_relative_path_that_is_no_hub_id_says_where_it_was_looked_for(tmp_path, monkeypatch, model):
    """As 53feb4c did for models/llama (which reads as a hub id too): ./models/llama from a kernel,
    which runs in the notebook's folder, said only "no checkpoint directory at './models/llama'"."""
    (tmp_path / "nb").mkdir()
    monkeypatch.chdir(tmp_path / "nb")
    looked = os.path.normpath(tmp_path / "nb" / model)
    with pytest.raises(FileNotFoundError) as e:
        load_model(model)
    assert str(e.value).startswith(f"no checkpoint directory at {model!r} (none at ")
    assert os.path.normpath(str(e.value).split("(none at ")[1].split(")")[0]) == looked


def test_dir_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)


def test_a_file_of_the_checkpoint_names_its_directory(tiny_llama):
    # was "<...>/config.json is not a Hugging Face checkpoint directory: it has no config.json"
    with pytest.raises(FileNotFoundError, match=f"config.json is a file, not a Hugging Face checkpoint directory; "
                                                f"pass its directory {tiny_llama}$"):
        load_model(tiny_llama / "config.json")


def test_unsupported_architecture_lists_supported(tiny_llama, tmp_path):
    shutil.copytree(tiny_llama, tmp_path / "ck")
    cfg_path = tmp_path / "ck" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel") as e:
        load_model(tmp_path / "ck")
    assert all(a in str(e.value) for a in SUPPORTED_ARCHITECTURES)


def test_check_model_refuses_what_load_model_refuses_before_any_weight_and_takes_a_weightless_checkpoint(
        tiny_llama, tmp_path):
    # the kernel's %lm load runs it before it frees the GPU its old engine holds: each refusal here
    # is load_model's own, word for word; a checkpoint whose weights are missing passes (only the
    # weights' load tells), which is what it leaves to load_model
    gpt2 = shutil.copytree(tiny_llama, tmp_path / "gpt2")
    cfg = json.loads((gpt2 / "config.json").read_text())
    (gpt2 / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    for model, kwargs in ((tmp_path / "nothing", {}), (gpt2, {}), (tiny_llama, {"dtype": "int8"}),
                          (tiny_llama, {"device": "gpu"}), ("llama-3-8b", {})):
        with pytest.raises((OSError, ValueError)) as checked:
            loader.check_model(model, **kwargs)
        with pytest.raises(type(checked.value)) as loaded:
            load_model(model, **kwargs)
        assert str(checked.value) == str(loaded.value)
    weightless = shutil.copytree(tiny_llama, tmp_path / "weightless", ignore=shutil.ignore_patterns("*.safetensors"))
    assert loader.check_model(weightless) is None
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(weightless)


def test_broken_checkpoint_files_are_named_with_the_fix(tiny_llama, tmp_path):
    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    weights = next(ck.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a download cut short
    with pytest.raises(ValueError, match=f"cannot read the weights in {weights}.*truncated or corrupt: download"):
        load_model(ck)
    cfg_path = ck / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "architectures": "LlamaForCausalLM"}))
    with pytest.raises(ValueError, match=r"'architectures' in .* must be a list, e\.g\. \['LlamaForCausalLM'\]"):
        load_model(ck)
    cfg_path.write_text(json.dumps(cfg)[:-3])
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON \(.*line 1.*\); fix or re-save"):
        load_model(ck)


@pytest.mark.parametrize("name, content, message", [
    ("tokenizer_config.json", "[1, 2]", r"tokenizer_config\.json holds a JSON list, not an object; fix or re-save"),
    ("tokenizer.json", '{"model": ', r"tokenizer\.json is not valid JSON \(.*line 1.*\); fix or re-save"),
])
def test_broken_tokenizer_file_is_named(tiny_llama, tmp_path, name, content, message):
    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    (ck / name).write_text(content)  # transformers alone fails here with "'list' object has no attribute 'get'"
    with pytest.raises(ValueError, match=message):
        load_model(ck)


def test_unknown_device_names_the_choices(tiny_llama):
    with pytest.raises(ValueError, match="unknown device 'tpu'; use 'cuda', 'cuda:N' or 'cpu'"):
        load_model(tiny_llama, device="tpu")
    for device in ("meta", "mps"):  # real torch devices this engine does not run on
        with pytest.raises(ValueError, match=f"device '{device}' is not supported: lmnb_engine runs on 'cuda'"):
            load_model(tiny_llama, device=device)


# a shared library that loads on any platform (ctypes' own extension module), standing in for the driver's
_LOADS = __import__("_ctypes").__file__


@pytest.mark.parametrize("cuda, hip, driver, why", [
    (None, None, _LOADS, f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"),
    ("12.4", None, "no-such-libcuda.so.1", "no NVIDIA driver is installed (no-such-libcuda.so.1 is not found)"),
    ("12.4", None, _LOADS, None),  # (a library that loads: the driver is there)
    ("12.4", None, None, None),  # (off Linux: torch tells)
    (None, "6.2", "no-such-libcuda.so.1", None),  # (ROCm: torch.cuda runs on it; no NVIDIA driver needed)
])
def test_a_machine_without_cuda_is_told_without_starting_cuda(tiny_llama, monkeypatch, cuda, hip, driver, why):
    """cuda_presence.missing_cuda says why torch cannot use CUDA where that is sure from torch's
    build and the NVIDIA driver's library (an exported job asks before its set-up cells, which may
    set CUDA_VISIBLE_DEVICES: CUDA is not started), else None; load_model's refusal of a cuda device
    says the same, where it said "torch sees no CUDA device" for a CPU build of torch too."""
    import lmnb_engine.cuda_presence as presence

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(presence, "DRIVER_LIBRARY", driver)
    assert presence.missing_cuda() == why
    assert not torch.cuda.is_initialized()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fix = "run on a machine with an NVIDIA GPU" + (" and a CUDA build of torch" if cuda is hip is None else "")
    with pytest.raises(ValueError) as refused:
        load_model(tiny_llama, device="cuda:0")
    assert str(refused.value) == (f"device 'cuda:0' asked for, but {why or 'torch sees no CUDA device'}; use "
                                  f"device='cpu', or {fix}")


def test_a_sliding_window_caps_the_context_only_where_a_layer_is_windowed(tiny_checkpoint_factory):
    """Mistral's window caps the context (we attend over the whole sequence) and the refusal of a
    longer prompt says so; a Qwen2 whose max_window_layers leaves no layer windowed attends fully in
    transformers, so its context is not capped (it was) and long prompts match transformers."""
    import warnings

    from lmnb_engine import Engine, SamplingParams

    with pytest.warns(UserWarning, match="sliding window of 32 tokens"):
        lm = load_model(tiny_checkpoint_factory("mistral", sliding_window=32), device="cpu")
    assert lm.config.context_len == 32
    with pytest.warns(UserWarning, match="sliding window of 32 tokens"):  # (the engine's own load says it too)
        eng = Engine(model=str(lm.path))
    try:
        with pytest.raises(ValueError, match=r"context length of 32 tokens \(the checkpoint's sliding window: lmnb "
                                             r"attends over the whole sequence, so it runs 32 of its 512 positions"):
            eng.generate([5] * 40, SamplingParams(max_new_tokens=1))
    finally:
        eng.shutdown()
    path = tiny_checkpoint_factory("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no capping warning
        lm = assert_matches_hf(path)  # TEXT is longer than the 32-token window
    assert lm.config.context_len == 512 and len(lm.tokenizer(TEXT).input_ids) > 32


def test_unsupported_rope_type(tiny_checkpoint_factory):
    path = tiny_checkpoint_factory("llama", rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="longrope"):
        load_model(path)


def test_activation_other_than_silu_is_refused(tiny_checkpoint_factory):
    # transformers runs this MLP with GELU; ours is SiLU-gated and used to load it silently,
    # giving logits off by ~0.7 nats.
    path = tiny_checkpoint_factory("llama", hidden_act="gelu_pytorch_tanh")
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu_pytorch_tanh'.*SiLU"):
        load_model(path)
    assert_matches_hf(tiny_checkpoint_factory("llama", hidden_act="swish"))  # transformers' other name


def test_missing_demo_model(monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "DEMO_MODEL_PATH", tmp_path / "demo_model")
    with pytest.raises(FileNotFoundError) as e:
        load_model(None)
    assert str(e.value) == (f"the demo checkpoint is not built yet ({tmp_path / 'demo_model'} has no config.json); "
                            "pass a checkpoint directory or hub id as `model`")


def test_bad_dtype(tiny_llama):
    with pytest.raises(ValueError, match="dtype"):
        load_model(tiny_llama, dtype="int8")


def test_checkpoint_without_tokenizer_uses_demo_tokenizer(tiny_llama, tiny_checkpoint_factory, tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(tiny_llama / name, ck / name)
    monkeypatch.setattr(loader, "DEMO_MODEL_PATH", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_model(ck)
    demo = tiny_checkpoint_factory("qwen2")
    monkeypatch.setattr(loader, "DEMO_MODEL_PATH", demo)
    with pytest.warns(UserWarning, match="demo checkpoint's tokenizer"):
        lm = load_model(ck)
    assert lm.tokenizer.get_vocab() == load_model(demo).tokenizer.get_vocab()


def test_random_weights_without_safetensors(tiny_llama, tmp_path):
    ck = tmp_path / "shapes"
    shutil.copytree(tiny_llama, ck)
    (ck / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(ck)
    a = load_model(ck, random_weights=True, seed=1)
    b = load_model(ck, random_weights=True, seed=1)
    c = load_model(ck, random_weights=True, seed=2)
    wa, wb, wc = (m.model.model.layers[0].mlp.gate_up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert abs(wa.std().item() - 0.02) < 0.002  # LlamaConfig.initializer_range
    assert torch.all(a.model.model.norm.weight == 1)
    r = ManualRunner(a)
    logits = r.run(ForwardMode.EXTEND, [(r.new_request(), a.tokenizer("the cat").input_ids)])
    assert logits.shape == (1, a.config.vocab_size) and torch.isfinite(logits).all()


def test_presets_are_valid_configs():
    for name in PRESETS:
        c = ModelConfig.from_hf(preset_hf_config(name), torch.bfloat16, "cpu")
        assert c.num_q_heads % c.num_kv_heads == 0
    with pytest.raises(ValueError, match="random_weights=True"):
        load_model("llama-3-8b")


def test_default_model_is_the_demo_checkpoint(monkeypatch, tiny_llama):
    monkeypatch.setattr(loader, "DEMO_MODEL_PATH", tiny_llama)
    assert load_model(None).path == tiny_llama


def test_hub_id_resolved_from_local_cache_offline(monkeypatch, tmp_path, tiny_llama):
    # The layout huggingface_hub documents for its cache: models--{org}--{name}/refs/main holds the
    # commit, snapshots/{commit}/ the files.
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "models--lmnb-test--tiny"
    shutil.copytree(tiny_llama, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = load_model("lmnb-test/tiny")
    assert lm.path == repo / "snapshots" / commit
    assert lm.eos_token_ids == load_model(tiny_llama).eos_token_ids


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"num_hidden_layers": 3}, "lacks .* tensors"),  # weights for 2 layers only
        ({"num_hidden_layers": 1}, "no place"),  # weights for a second layer left over
        ({"intermediate_size": 96}, "has shape"),
    ],
    ids=["missing", "unexpected", "shape"],
)
def test_config_that_does_not_describe_the_weights(tiny_llama, tmp_path, edit, message):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_llama, ck)
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError, match=message):
        load_model(ck)


def test_missing_tensor_is_named_as_the_checkpoint_spells_it(tiny_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    weights = load_file(ck / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]  # the message named our fused qkv_proj
    save_file(weights, ck / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 tensors .*\['model\.layers\.1\.self_attn\.k_proj\.weight'\]"):
        load_model(ck)


def test_eos_ids_of_config_json_when_there_is_no_generation_config(tiny_llama, tmp_path):
    from lmnb_engine import Engine, SamplingParams
    from transformers import AutoModelForCausalLM

    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    with Engine(str(ck), max_total_tokens=512) as eng:
        ids = eng.encode(TEXT)
        free = eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)).token_ids
    (ck / "generation_config.json").unlink()  # as many fine-tunes ship: EOS ids only in config.json
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [1, free[3]]}))
    hf = AutoModelForCausalLM.from_pretrained(ck).eval()
    ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      do_sample=False, max_new_tokens=8)[0, len(ids):].tolist()
    assert ref == free[:4]  # transformers stops at config.json's second EOS id
    with Engine(str(ck), max_total_tokens=512) as eng:
        r = eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=8))
    assert r.token_ids == ref and r.finish_reason.type == "stop"


def test_quantized_checkpoint_is_refused_as_such(tiny_llama, tmp_path):
    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    quant = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
    (ck / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    # a real AWQ checkpoint's qweight/qzeros/scales were reported as "config and weights disagree";
    # the config alone says what the checkpoint is
    with pytest.raises(ValueError, match=r"quantized checkpoint \(quantization_config\.quant_method: awq\)"):
        load_model(ck)
    assert load_model(ck, random_weights=True).config.num_layers == cfg["num_hidden_layers"]


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_git_lfs_pointer_in_place_of_a_file_says_to_pull_it(tiny_llama, tmp_path, name):
    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    # what `git clone` of a hub repository leaves without Git LFS: it was called truncated or not JSON
    (ck / name).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 123456\n")
    with pytest.raises(ValueError, match=f"{name} is a Git LFS pointer, not the file itself .* git lfs pull` in {ck}"):
        load_model(ck)


def test_other_safetensors_beside_model_safetensors_are_not_loaded(tiny_llama, tmp_path):
    from safetensors.torch import save_file

    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    # a LoRA adapter a training run left in the directory: transformers loads model.safetensors only,
    # lmnb_engine loaded every *.safetensors and refused the adapter's tensors
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 64)},
              ck / "adapter_model.safetensors")
    assert_matches_hf(ck)


def test_a_sentencepiece_only_tokenizer_without_the_package_names_the_install(tmp_path, monkeypatch):
    """A checkpoint with tokenizer.model and no tokenizer.json (older Llama/Mistral repos): without
    sentencepiece, transformers' error said tiktoken was required."""
    import importlib.util

    from lmnb_engine.tokenizer import load_tokenizer

    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x05hello")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(ValueError, match=r"only a SentencePiece tokenizer\.model, which needs the sentencepiece "
                                         r"package to convert: pip install sentencepiece$"):
        load_tokenizer(tmp_path)


def test_a_hub_download_fetches_the_transformers_weights_but_not_mistrals_consolidated_copy(tmp_path, monkeypatch):
    """Mistral repos hold consolidated.safetensors beside the HF shards: fetched, it doubled the
    download (and the loader never reads it). The hub's own filter decides what the patterns fetch."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    calls = []

    def snapshot_download(repo_id, **kw):
        calls.append(kw)
        raise OSError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="downloads are off"):
        load_model("mistralai/Mistral-7B-Instruct-v0.3")
    repo = ["config.json", "generation_config.json", "model-00001-of-00003.safetensors",
            "model.safetensors.index.json", "consolidated.safetensors", "params.json", "tokenizer.json",
            "tokenizer.model", "tokenizer.model.v3", "tokenizer_config.json", "README.md", "pytorch_model.bin"]
    fetched = list(filter_repo_objects(repo, allow_patterns=calls[0]["allow_patterns"],
                                       ignore_patterns=calls[0]["ignore_patterns"]))
    assert fetched == ["config.json", "generation_config.json", "model-00001-of-00003.safetensors",
                       "model.safetensors.index.json", "params.json", "tokenizer.json", "tokenizer.model",
                       "tokenizer_config.json"]


@pytest.mark.parametrize("value,expected", [
    ("ok", None),
    ("a\ud800", ((), False)),
    ({"a": ["x", {"b": "\udfff"}]}, (("a", 1, "b"), False)),
    ({"a": {"k\ud83d": "v"}}, (("a", "k\ud83d"), True)),
    ({"a": "\U0001F600"}, None),  # (what JSON's "\\ud83d\\ude00" pair parses to)
    ([1, None, 2.5, {"n": 3}], None),
])
def test_find_lone_surrogate_gives_the_path_to_the_first_one(value, expected):
    from lmnb_engine.tokenizer import find_lone_surrogate

    assert find_lone_surrogate(value) == expected


def test_a_tied_config_with_a_different_stored_head_keeps_both_as_transformers_does(tiny_checkpoint_factory,
                                                                                     tmp_path):
    """A checkpoint saved untied under a config that says tied: transformers 5 keeps the stored
    head and warns; lmnb tied it, silently dropping the head."""
    import warnings

    from safetensors.torch import load_file, save_file

    src = tiny_checkpoint_factory("qwen2", tie_word_embeddings=True)
    dst = tmp_path / "untied-head"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"ties the word embeddings .* stores an lm_head.weight other than "
                                         r"model.embed_tokens.weight; both are used as stored"):
        lm = assert_matches_hf(dst)  # transformers' logits from the same file
    assert torch.equal(lm.model.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(lm.model.model.embed_tokens.weight, tensors["model.embed_tokens.weight"])
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # stored twice, the same: tied, quiet
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*tie_word_embeddings")
        lm = assert_matches_hf(dst)
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:12", "cpu:1", "cuda:01", "cuda:-1", "cuda:", " cuda",
                                  "CUDA", "cuda:0:1", "cdua", "mps", "meta", "xla:0", "tpu", "", "cuda:127", "cuda:128",
                                  "cuda:255", "cuda:256", "cpu:256", "cuda:2147483648", "cuda:99999999999999999999"])
def test_the_torch_free_device_check_takes_the_names_torch_reads_as_cuda_or_cpu(name):
    """device_names.check_device (an exported job's check before its cells run, without torch) is
    the rule the loader applies: it takes a name exactly where torch.device reads it as that cuda or
    cpu device (not cuda:256 as cuda:0), and calls 'not supported' exactly the other device types
    torch reads."""
    from lmnb_engine.device_names import check_device

    try:
        read = torch.device(name)
    except (RuntimeError, TypeError):
        read = None
    if read is not None and read.type in ("cuda", "cpu") and str(read) == name:
        assert check_device(name) == name
    else:
        other = read is not None and read.type not in ("cuda", "cpu")
        with pytest.raises(ValueError, match="is not supported" if other else "unknown device|its number is past 127"):
            check_device(name)


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
@pytest.mark.parametrize("number", ["128", "255", "256", "2147483648", "99999999999999999999", "9" * 5000],
                         ids=lambda n: n if len(n) < 30 else f"{len(n)}-digits")
def test_a_device_number_torch_does_not_read_as_itself_is_refused_saying_the_largest(kind, number):
    """--device cuda:99999999999999999999 passed a job's early check and failed only as the backend
    started, after the set-up cells ran (torch: "Could not parse device index"), and cuda:256 ran
    on cuda:0 (torch keeps a device's number in 8 bits). Each number torch does not read as itself,
    or at all, is refused, naming the largest it does (127, which it reads) and the fix: for cuda the
    device's number; for cpu 'cpu', as a cpu device's number selects nothing (it was told to give
    "the device's number, 0, 1, ...")."""
    from lmnb_engine.device_names import check_device

    assert check_device(f"{kind}:127") == str(torch.device(f"{kind}:127"))
    name = f"{kind}:{number}"
    try:
        assert str(torch.device(name)) != name
    except RuntimeError:
        pass  # (refused: past 2**31 - 1)
    fix = {"cuda": "give the device's number, 0, 1, ... (nvidia-smi lists the CUDA devices)",
           "cpu": "give 'cpu': a cpu device's number selects nothing (torch puts cpu:N's tensors on 'cpu')"}[kind]
    with pytest.raises(ValueError) as refused:
        check_device(name)
    assert str(refused.value) == (f"device {name!r}: its number is past 127, the largest torch reads as itself (it "
                                  f"reads {kind}:256 as {kind}:0); {fix}")
    # (what the cpu words say holds: a tensor made on cpu:N is on 'cpu', as one made there)
    assert torch.zeros(1, device="cpu:3").device == torch.zeros(1, device="cpu").device == torch.device("cpu")
    # (the example it gives is of the device type asked for, and holds: a cpu device was told of cuda's)
    assert str(torch.device(f"{kind}:256")) == f"{kind}:0"


@pytest.mark.parametrize("name, hint", [
    ("cuda:01", "; did you mean 'cuda:1'?"), ("cuda: 1", "; did you mean 'cuda:1'?"), ("cpu:+0", "; did you mean 'cpu:0'?"),
    ("cuda:-1", "; did you mean 'cuda:N'? N is the device's number, 0, 1, ..."), ("cdua:01", "; did you mean 'cuda:1'?"),
    ("cuda:1:2", "; did you mean 'cuda:N'? N is the device's number, 0, 1, ..."), ("xyz:-1", " N is the device's number, 0, 1, ..."),
    ("cuda:0256", "; did you mean 'cuda:N'? N is the device's number, 0, 1, ..."),
    ("cpu:-1", "; did you mean 'cpu'?"), ("cpu:1:2", "; did you mean 'cpu'?"), ("cpux:0256", "; did you mean 'cpu'?"),
])
def test_a_device_whose_number_torch_does_not_read_is_offered_the_number_not_itself(name, hint):
    """--device cuda:01 (cuda: 1, cuda:-1) was told "did you mean 'cuda:01'?", the name given, as the
    offer only respelled the type: a right type is offered its number as torch.device reads one
    (which takes each offer and refuses each name), or told what N is; a misspelt type is so too.
    A cpu device with no number torch reads is offered 'cpu', as its number selects nothing (it was
    offered 'cpu:N', "N is the device's number, 0, 1, ...")."""
    from lmnb_engine.device_names import check_device

    with pytest.raises(RuntimeError):
        torch.device(name)
    with pytest.raises(ValueError) as refused:
        check_device(name)
    assert str(refused.value) == f"unknown device {name!r}; use 'cuda', 'cuda:N' or 'cpu'{hint}"
    offer = re.search(r"did you mean '([^']*[0-9])'", hint)  # (a number offered: torch reads it)
    assert offer is None or check_device(offer[1]) == str(torch.device(offer[1])) == offer[1]


@pytest.mark.parametrize("name", ["float32", "float", "fp32", "float16", "half", "fp16", "bfloat16", "bf16", "float64",
                                  "double", "int8", "flaot16", "torch.float16", "Float32", ""])
def test_the_torch_free_dtype_check_takes_the_names_torch_gives_a_supported_dtype(name):
    """device_names.dtype_name gives the torch dtype a name stands for (torch's own attribute, or a
    short name fp32/fp16/bf16), and refuses every name that is none of float32, float16, bfloat16."""
    from lmnb_engine.device_names import dtype_name

    short = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    want = short.get(name, getattr(torch, name, None) if name.isidentifier() else None)
    if want in (torch.float32, torch.float16, torch.bfloat16):
        assert getattr(torch, dtype_name(name)) == want
    else:
        with pytest.raises(ValueError, match=f"unsupported dtype {name!r}; use float32, bfloat16 or float16"):
            dtype_name(name)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8])
def test_a_torch_dtype_is_taken_or_refused_as_its_name_is(dtype):
    # a torch.dtype had a rule of its own, whose refusal repeated the supported names by hand
    name = str(dtype).removeprefix("torch.")
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert loader._resolve_dtype(dtype, torch.device("cpu")) is dtype
    else:
        from lmnb_engine.device_names import dtype_name

        with pytest.raises(ValueError) as by_name:
            dtype_name(name)
        with pytest.raises(ValueError, match=f"^unsupported dtype {name!r}; use float32, bfloat16 or float16") as e:
            loader._resolve_dtype(dtype, torch.device("cpu"))
        assert str(e.value) == str(by_name.value)


def _without_eos_in_config(tiny_llama, tmp_path) -> Path:
    """``tiny_llama`` copied with no generation_config.json and no ``eos_token_id`` in config.json,
    as some fine-tunes ship."""
    ck = shutil.copytree(tiny_llama, tmp_path / "ck")
    (ck / "generation_config.json").unlink()
    cfg = json.loads((ck / "config.json").read_text())
    del cfg["eos_token_id"]
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


def test_a_config_json_naming_no_eos_adds_no_eos_id(tiny_llama, tmp_path):
    # LlamaConfig's default eos_token_id, 2, was taken as an EOS of a config.json that names none:
    # here token 2 is "<pad>", and the greedy output, which samples it 36th, was cut there with
    # finish reason "stop". The EOS is the tokenizer's eos_token alone, "</s>" (token 1)
    from lmnb_engine import Engine, SamplingParams

    ck = _without_eos_in_config(tiny_llama, tmp_path)
    lm = load_model(ck, device="cpu")
    assert lm.tokenizer.convert_ids_to_tokens([1, 2]) == ["</s>", "<pad>"]
    assert lm.eos_token_ids == frozenset({1})
    with Engine(str(ck), max_total_tokens=512) as eng:
        ids = eng.encode(TEXT)
        free = eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)).token_ids
        r = eng.generate(ids, SamplingParams(temperature=0, max_new_tokens=40))
    assert 2 in free and 1 not in free  # (what makes this case)
    assert r.token_ids == free and r.finish_reason.type == "length"
    # a multimodal config.json names its language model's EOS in text_config, as transformers reads it
    cfg = json.loads((ck / "config.json").read_text())
    assert loader._written_eos_token_id(ck) is None
    (ck / "config.json").write_text(json.dumps({**cfg, "text_config": {"eos_token_id": [7, 9]}}))
    assert loader._written_eos_token_id(ck) == [7, 9]


def test_a_checkpoint_naming_no_eos_anywhere_warns_once(tiny_llama, tmp_path):
    import warnings

    ck = _without_eos_in_config(tiny_llama, tmp_path)
    config = json.loads((ck / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (ck / "tokenizer_config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load_model(ck, device="cpu")
    said = [str(w.message) for w in caught if "EOS" in str(w.message)]
    assert len(said) == 1 and re.search(r"no EOS token id is known for .*ck: .* ends only at its max_new_tokens, .*"
                                        r'add its end token\'s id as "eos_token_id" to generation_config\.json', said[0])
    assert lm.eos_token_ids == frozenset()
