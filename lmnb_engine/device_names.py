"""The device and dtype names the engine accepts, told without torch: the one rule that
``model_loader`` applies as it loads and an exported job applies before any notebook cell runs
(a misspelt ``--device cdua`` was found only after every set-up cell had run)."""

from __future__ import annotations

import re

from lmnb_engine.suggest import close_match, did_you_mean

# torch.device's grammar (c10's Device.cpp): a type, then ":N" with no leading zero
DEVICE = re.compile(r"([a-zA-Z_]+)(?::(0|[1-9][0-9]*))?")
DEVICE_TYPES = ("cuda", "cpu")
# torch keeps a device's number as a c10::DeviceIndex, an int8_t: past 127 it reads another device
# (cuda:256 is cuda:0, cuda:255 the current one, cuda:128 cuda:-128) or none (past 2**31 - 1)
MAX_INDEX = 127
# device types torch knows that the engine does not run on (worded "not supported", not "unknown")
TORCH_ONLY_TYPES = frozenset((
    "mps", "meta", "xpu", "xla", "hip", "ipu", "hpu", "mtia", "maia", "lazy", "vulkan", "ve", "fpga", "ideep",
    "mkldnn", "opengl", "opencl", "privateuseone"))

# the dtypes the engine loads weights in, by torch's names (in the order its messages list them)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
# each dtype name the engine takes (torch's attribute names and the usual short ones) → torch's name
DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32", "float16": "float16", "half": "float16",
          "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def check_device(device: str) -> str:
    """``device`` (``cuda``, ``cuda:N``, ``cpu`` or ``cpu:N``, N from 0 to ``MAX_INDEX``) as given;
    whether CUDA and its device N are there is for torch to tell (``model_loader``).

    Raises:
        ValueError: a name torch does not read (with the closest device type, ``cdua`` → ``cuda``),
            a number past ``MAX_INDEX``, which torch reads as another device or not at all (for cpu,
            told to give ``cpu``, as a cpu number selects nothing), or a
            torch device the engine does not run on (``mps``, ``meta``).
    """
    m = DEVICE.fullmatch(device)
    if m is not None and m[1] in DEVICE_TYPES:
        if m[2] is not None and _past_max(m[2]):
            fix = ("give the device's number, 0, 1, ... (nvidia-smi lists the CUDA devices)" if m[1] == "cuda"
                   else "give 'cpu': a cpu device's number selects nothing (torch puts cpu:N's tensors on 'cpu')")
            raise ValueError(f"device {device!r}: its number is past {MAX_INDEX}, the largest torch reads as itself "
                             f"(it reads {m[1]}:256 as {m[1]}:0); {fix}")
        return device
    if m is not None and m[1] in TORCH_ONLY_TYPES:
        raise ValueError(f"device {device!r} is not supported: lmnb_engine runs on 'cuda', 'cuda:N' or 'cpu'")
    kind, colon, index = device.partition(":")
    known = kind if kind in DEVICE_TYPES else close_match(kind, DEVICE_TYPES)  # (cdua:1 → 'cuda:1')
    number = index.strip().lstrip("+")  # (cuda:01, cuda: 1, cuda:+1: torch reads none, but 1 is meant)
    if colon and not (number.isascii() and number.isdecimal() and not _past_max(number)):  # (cuda:-1, cuda:1:2)
        if known == "cpu":  # (a cpu device's number selects nothing: no N to explain)
            hint = "; did you mean 'cpu'?"
        else:
            hint = (f"; did you mean '{known}:N'?" if known else "") + " N is the device's number, 0, 1, ..."
    else:
        hint = f"; did you mean {known + colon + (str(int(number)) if colon else '')!r}?" if known else ""
    raise ValueError(f"unknown device {device!r}; use 'cuda', 'cuda:N' or 'cpu'{hint}")


def _past_max(number: str) -> bool:
    """Whether the decimal digits ``number`` are a number past ``MAX_INDEX`` (read without ``int``
    where they are many: Python refuses to read more than 4300 digits)."""
    digits = number.lstrip("0")
    return len(digits) > len(str(MAX_INDEX)) or int(digits or "0") > MAX_INDEX


def dtype_name(dtype: str) -> str:
    """torch's name (``float32``, ``float16`` or ``bfloat16``) of the dtype ``dtype`` names
    (those, ``float``, ``half`` or ``fp32``, ``fp16``, ``bf16``).

    Raises:
        ValueError: another name (with the closest, ``flaot16`` → ``float16``).
    """
    if dtype in DTYPES:
        return DTYPES[dtype]
    hint = did_you_mean([dtype], ("", DTYPE_NAMES))
    raise ValueError(f"unsupported dtype {dtype!r}; use {', '.join(DTYPE_NAMES[:-1])} or {DTYPE_NAMES[-1]}{hint}")
