"""Launch configurations of the attention kernels measured on one GPU model, used in place of the
built-in defaults (``extend_config``, ``decode_config``) on that GPU.

vLLM and SGLang ship their Triton kernels' tuned configurations the same way: one JSON file per
device name, written by a tuning script and looked up at launch. Here the script is
``benches/gpu_kernels.py --write-tuned PATH``, which times each configuration on the device and
keeps one only where it is correct in every case and at least ``TUNED_MARGIN`` faster than the
default over them, slower in none. A file
is read from ``$LMNB_TRITON_CONFIGS`` if set, else ``configs/<device name>.json`` beside this
module; it applies only on a GPU whose name it gives (tiles sized for an H200's shared memory
may not fit an A10G's) and under the Triton release (major.minor) it was measured with: another
compiler allocates registers and shared memory its own way, so a tile that fit may no longer
compile, and the timings that chose it no longer hold (SGLang keeps its tuned Triton configurations
in one directory per Triton version for the same reason). The file::

    {"device": "NVIDIA H200", "triton": "3.6.0",
     "extend": {"d128/g1/bfloat16": {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2}},
     "decode": {"d128/g1/bfloat16/direct": {"block_n": 64, "num_warps": 4, "num_stages": 2}}}

keys ``d<head_dim>/g<query heads per KV head>/<dtype>`` (decode: and ``/direct`` or ``/split``,
``config_key``); values the fields of ``ExtendConfig`` / ``DecodeConfig``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Optional, TypeVar

import torch
import triton

log = logging.getLogger(__name__)

ENV_VAR = "LMNB_TRITON_CONFIGS"
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TUNED_MARGIN = 0.05  # how much faster than the default a configuration must be to be kept
T = TypeVar("T", bound=tuple)


def config_key(head_dim: int, group: int, dtype: torch.dtype, variant: str = "") -> str:
    """The key of a configuration in a tuned file: ``d<head_dim>/g<group>/<dtype>``, and for
    decode ``/direct`` or ``/split``: the one-split kernel that writes the output itself and the
    split kernel before a merge compile and run differently, so each is tuned apart."""
    return f"d{head_dim}/g{group}/{str(dtype).replace('torch.', '')}" + (f"/{variant}" if variant else "")


def file_name(device_name: str) -> str:
    """The package file of a device: its name in lower case, runs of other characters as one
    '-' (``NVIDIA H200`` -> ``nvidia-h200.json``)."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + ".json"


def tuned_config(kind: str, device: torch.device, key: str, make: Callable[..., T]) -> Optional[T]:
    """The tuned ``kind`` ("extend" or "decode") configuration under ``key`` (``config_key``) on
    ``device``'s GPU model, made by ``make`` (``ExtendConfig`` / ``DecodeConfig``) from its
    entry; None where there is none (off CUDA, no file, another GPU's file, no entry) or the entry
    is no configuration the kernel can launch (``_problem``; warned about once)."""
    if device.type != "cuda":
        return None
    return _lookup(kind, _index(device), key, make, os.environ.get(ENV_VAR) or None)


def table_in_effect(device: torch.device) -> dict:
    """The tuned file that applies on ``device`` ({} where none, and off CUDA): what a benchmark
    records beside its figures."""
    if device.type != "cuda":
        return {}
    return _table(torch.cuda.get_device_name(_index(device)), os.environ.get(ENV_VAR) or None)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)  # (looked up at every kernel launch outside a CUDA graph)
def _lookup(kind: str, index: int, key: str, make: Callable[..., T], env_path: Optional[str]) -> Optional[T]:
    entry = _table(torch.cuda.get_device_name(index), env_path).get(kind, {}).get(key)
    if entry is None:
        return None
    try:
        cfg = make(**entry)
        problem = _problem(cfg)
    except TypeError as exc:
        problem = str(exc)
    if problem:
        log.warning("tuned %s configuration %s = %r not used (%s); the built-in one runs", kind, key, entry, problem)
        return None
    return cfg


def _problem(cfg: tuple) -> Optional[str]:
    """Why the kernels cannot launch ``cfg`` (an ``ExtendConfig`` or ``DecodeConfig``), or None:
    tiles and warps are powers of two (``tl.arange`` needs them), tiles 16 to 256 (``tl.dot``
    needs 16 rows), up to 32 warps, 1 to 8 pipeline stages, ``block_m`` a multiple of ``block_n``."""
    fields = cfg._asdict()
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in fields.values()):
        return "every field must be an int"
    for name, v in fields.items():
        if name.startswith("block_") and not (16 <= v <= 256 and v & (v - 1) == 0):
            return f"{name}={v} must be a power of two from 16 to 256"
    if not (1 <= fields["num_warps"] <= 32 and fields["num_warps"] & (fields["num_warps"] - 1) == 0):
        return f"num_warps={fields['num_warps']} must be a power of two up to 32"
    if not 1 <= fields["num_stages"] <= 8:
        return f"num_stages={fields['num_stages']} must be 1 to 8"
    if fields.get("block_m", 0) % fields["block_n"]:
        return "block_m must be a multiple of block_n"
    return None


@functools.lru_cache(maxsize=None)
def _table(device_name: str, env_path: Optional[str]) -> dict:
    """The tuned file for ``device_name`` (``env_path``, else the package's), read once. A file
    that cannot be read, or names another device, is warned about (once) and left out: the
    defaults run."""
    path = Path(env_path) if env_path else CONFIG_DIR / file_name(device_name)
    if not env_path and not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text())
        if not isinstance(table, dict) or not all(isinstance(table.get(k, {}), dict) for k in ("extend", "decode")):
            raise ValueError("not an object with 'extend' and 'decode' objects")
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("tuned Triton configurations %s not used (%s); the built-in ones run", path, exc)
        return {}
    if table.get("device") != device_name:
        log.warning("tuned Triton configurations %s are for %r, not this %r; the built-in ones run",
                    path, table.get("device"), device_name)
        return {}
    if _release(str(table.get("triton"))) != _release(triton.__version__):
        log.warning("tuned Triton configurations %s were measured under Triton %s, not this %s; the built-in ones "
                    "run (retune with benches/gpu_kernels.py --write-tuned)", path, table.get("triton"),
                    triton.__version__)
        return {}
    log.info("Triton attention configurations tuned for %s from %s", device_name, path)
    return table


def _release(version: str) -> str:
    """``major.minor`` of a version string ("3.6.0" -> "3.6"; "3.6.0+git1a2b" -> "3.6")."""
    return ".".join(version.split(".")[:2])
