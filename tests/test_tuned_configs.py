"""Tuned launch configurations (``lmnb_engine.attention.triton_ops.tuned``): a file written by the
kernel tuner for one GPU model replaces the built-in ``extend_config`` / ``decode_config`` there
and nowhere else. The GPU is stood in for: its name, index and architecture are patched."""

from __future__ import annotations

import json
import logging
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton (see test_triton_attention)

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from lmnb_engine import triton_support  # noqa: E402
from lmnb_engine.attention.triton_ops import tuned  # noqa: E402
from lmnb_engine.attention.triton_ops.decode_attention import DecodeConfig, decode_config  # noqa: E402
from lmnb_engine.attention.triton_ops.extend_attention import ExtendConfig, extend_config  # noqa: E402

GPU = torch.device("cuda", 0)
BUILT_IN_EXTEND = ExtendConfig(128, 64, 8, 2)  # sm_90, 16-bit, head_dim 128 (extend_config's docstring)
BUILT_IN_DECODE = DecodeConfig(64, 4, 2)


@pytest.fixture()
def h200(monkeypatch, tmp_path):
    """A stand-in H200 (sm_90) with an empty package config directory; caches cleared."""
    monkeypatch.setattr(triton_support, "device_arch", lambda device: 90 if torch.device(device).type == "cuda" else None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tuned, "CONFIG_DIR", tmp_path / "configs")
    monkeypatch.delenv(tuned.ENV_VAR, raising=False)
    for cached in (tuned._table, tuned._lookup):
        cached.cache_clear()
    yield tmp_path
    for cached in (tuned._table, tuned._lookup):
        cached.cache_clear()


def write(path, device="NVIDIA H200", extend=None, decode=None, triton_version=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "triton": triton_version or triton.__version__,
                                "extend": extend or {}, "decode": decode or {}}))
    return path


def test_the_key_and_file_name():
    assert tuned.config_key(128, 4, torch.bfloat16) == "d128/g4/bfloat16"
    assert tuned.file_name("NVIDIA H200") == "nvidia-h200.json"
    assert tuned.file_name("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb.json"


def test_without_a_file_the_built_in_configurations_run(h200):
    assert extend_config(GPU, 128, torch.bfloat16, group=4) == BUILT_IN_EXTEND
    assert decode_config(GPU, torch.bfloat16, 128, 1, direct=True) == BUILT_IN_DECODE
    assert tuned.table_in_effect(GPU) == {}


def test_a_package_file_for_this_gpu_replaces_the_built_in_ones_for_its_keys_only(h200):
    write(h200 / "configs" / "nvidia-h200.json",
          extend={"d128/g4/bfloat16": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3}},
          decode={"d128/g1/bfloat16/direct": {"block_n": 128, "num_warps": 4, "num_stages": 1}})
    assert extend_config(GPU, 128, torch.bfloat16, group=4) == ExtendConfig(64, 64, 4, 3)
    assert extend_config(GPU, 128, torch.bfloat16, group=1) == BUILT_IN_EXTEND  # another GQA group
    assert extend_config(GPU, 128, torch.float16, group=4) == BUILT_IN_EXTEND  # another dtype
    assert extend_config(GPU, 128, torch.bfloat16, group=4, tuned=False) == BUILT_IN_EXTEND  # the tuner's default
    assert decode_config(GPU, torch.bfloat16, 128, 1, direct=True) == DecodeConfig(128, 4, 1)
    assert decode_config(GPU, torch.bfloat16, 128, 1, direct=False) == BUILT_IN_DECODE  # the split kernel
    assert decode_config(GPU, torch.bfloat16, 128, 4, direct=True) == BUILT_IN_DECODE
    assert decode_config(torch.device("cpu"), torch.bfloat16, 128, 1, direct=True) == DecodeConfig(16, 4, 2)
    assert tuned.table_in_effect(GPU)["device"] == "NVIDIA H200"


def test_the_environment_variable_names_the_file_and_another_gpus_file_is_not_used(h200, monkeypatch, caplog):
    write(h200 / "configs" / "nvidia-h200.json", decode={"d128/g1/bfloat16/split": {"block_n": 32, "num_warps": 4,
                                                                                     "num_stages": 1}})
    mine = write(h200 / "mine.json", decode={"d128/g1/bfloat16/split": {"block_n": 128, "num_warps": 8,
                                                                        "num_stages": 2}})
    monkeypatch.setenv(tuned.ENV_VAR, str(mine))
    assert decode_config(GPU, torch.bfloat16, 128, 1) == DecodeConfig(128, 8, 2)  # the variable's, not the package's
    # tiles sized for an H200's shared memory may not fit another GPU: its file is refused by name
    monkeypatch.setenv(tuned.ENV_VAR, str(write(h200 / "a10g.json", device="NVIDIA A10G",
                                                decode={"d128/g1/bfloat16/split": {"block_n": 128, "num_warps": 8,
                                                                                   "num_stages": 2}})))
    with caplog.at_level(logging.WARNING, logger=tuned.__name__):
        assert decode_config(GPU, torch.bfloat16, 128, 1) == BUILT_IN_DECODE
    assert "are for 'NVIDIA A10G', not this 'NVIDIA H200'; the built-in ones run" in caplog.text


@pytest.mark.parametrize("tuned_with, running, used", [
    ("3.6.0", "3.6.0", True), ("3.6.0", "3.6.1", True),  # a patch release keeps the code generator
    ("3.6.0", "3.9.0", False), ("3.6.0", "4.6.0", False), (None, "3.6.0", False),
])
def test_a_file_applies_only_under_the_triton_release_it_was_measured_with(h200, monkeypatch, caplog, tuned_with,
                                                                           running, used):
    entry = {"d128/g1/bfloat16/direct": {"block_n": 128, "num_warps": 4, "num_stages": 1}}
    path = write(h200 / "configs" / "nvidia-h200.json", decode=entry, triton_version=tuned_with)
    if tuned_with is None:  # a file without the field
        path.write_text(json.dumps({"device": "NVIDIA H200", "extend": {}, "decode": entry}))
    monkeypatch.setattr(triton, "__version__", running)
    with caplog.at_level(logging.WARNING, logger=tuned.__name__):
        got = decode_config(GPU, torch.bfloat16, 128, 1, direct=True)
    assert got == (DecodeConfig(128, 4, 1) if used else BUILT_IN_DECODE)
    assert ("not this " + running in caplog.text) == (not used)


@pytest.mark.parametrize("content, why", [
    ("{not json", "Expecting property name"),
    ('{"device": "NVIDIA H200", "extend": []}', "not an object with 'extend' and 'decode' objects"),
    (None, "No such file"),
])
def test_an_unreadable_file_is_warned_about_and_the_built_in_ones_run(h200, monkeypatch, caplog, content, why):
    path = h200 / "tuned.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv(tuned.ENV_VAR, str(path))
    with caplog.at_level(logging.WARNING, logger=tuned.__name__):
        assert extend_config(GPU, 128, torch.bfloat16) == BUILT_IN_EXTEND
        assert decode_config(GPU, torch.bfloat16) == BUILT_IN_DECODE
    assert caplog.text.count("not used") == 1 and why in caplog.text  # (read once)


@pytest.mark.parametrize("kind, entry, why", [
    ("decode", {"block_n": 64, "num_warps": 4}, "missing 1 required positional argument: 'num_stages'"),
    ("decode", {"block_n": 64, "num_warps": 4, "num_stages": 2, "block_h": 16}, "unexpected keyword argument"),
    ("decode", {"block_n": "64", "num_warps": 4, "num_stages": 2}, "every field must be an int"),
    ("decode", {"block_n": 64, "num_warps": 4, "num_stages": 0}, "num_stages=0 must be 1 to 8"),
    # launches Triton refuses deep inside a forward ("arange's range must be a power of 2")
    ("decode", {"block_n": 24, "num_warps": 4, "num_stages": 2}, "block_n=24 must be a power of two from 16 to 256"),
    ("decode", {"block_n": 2**40, "num_warps": 4, "num_stages": 2}, "must be a power of two from 16 to 256"),
    ("decode", {"block_n": 64, "num_warps": 3, "num_stages": 2}, "num_warps=3 must be a power of two up to 32"),
    ("extend", {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 2}, "block_m must be a multiple of block_n"),
])
def test_an_entry_the_kernel_cannot_launch_is_warned_about_and_the_built_in_one_runs(h200, monkeypatch, caplog,
                                                                                    kind, entry, why):
    key = "d128/g1/bfloat16" + ("/direct" if kind == "decode" else "")
    monkeypatch.setenv(tuned.ENV_VAR, str(write(h200 / "t.json", **{kind: {key: entry}})))
    with caplog.at_level(logging.WARNING, logger=tuned.__name__):
        got = decode_config(GPU, torch.bfloat16, 128, 1, direct=True) if kind == "decode" else \
            extend_config(GPU, 128, torch.bfloat16, 1)
    assert got == (BUILT_IN_DECODE if kind == "decode" else BUILT_IN_EXTEND)
    assert f"tuned {kind} configuration {key}" in caplog.text and why in caplog.text
    assert "the built-in one runs" in caplog.text


def test_a_tuned_file_nested_too_deeply_is_warned_about(h200, monkeypatch, caplog):
    path = h200 / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    monkeypatch.setenv(tuned.ENV_VAR, str(path))
    with caplog.at_level(logging.WARNING, logger=tuned.__name__):
        assert extend_config(GPU, 128, torch.bfloat16) == BUILT_IN_EXTEND
    assert "not used" in caplog.text
