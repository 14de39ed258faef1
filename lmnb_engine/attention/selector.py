"""Pick the attention backend for a device: on NVIDIA GPUs flash-attn (extend) with Triton
(decode) when flash-attn is installed or torch has its own (and it is the faster on the model,
``FlashAttentionBackend.prepare``), Triton alone when importable; torch otherwise.

flash-attn is optional: the Triton kernels cover extend and decode over the token-level pool by
themselves. ``LMNB_ATTENTION_BACKEND`` (``auto``/``torch``/``triton``/``flash_attn``) overrides
the default.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

from lmnb_engine.attention.base import AttentionBackend
from lmnb_engine.triton_support import device_arch, interpreting

BACKENDS = ("auto", "torch", "triton", "flash_attn")
ENV_VAR = "LMNB_ATTENTION_BACKEND"
log = logging.getLogger(__name__)


def triton_available() -> bool:
    """True if the ``triton`` package can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def flash_modules(dev: torch.device) -> tuple[str, ...]:
    """The flash-attn modules worth trying on ``dev``: FlashAttention-3 builds for Hopper (sm_90)
    only, FlashAttention-2 for sm_80 and later; no filter off CUDA (the tests' stand-ins)."""
    from lmnb_engine.attention.flash_backend import MODULES

    arch = device_arch(dev)
    if arch is None:
        return MODULES
    return MODULES if arch == 90 else ("flash_attn",) if arch >= 80 else ()


def extend_candidates(dev: torch.device) -> tuple[list, list[str]]:
    """The flash-attns to try for extend on ``dev``, in order, and why an installed one cannot be
    (``find_flash_attn`` over ``flash_modules``): the installed ones, then torch's own
    FlashAttention-2 (``flash_backend.torch_varlen``) on sm_80 and later."""
    from lmnb_engine.attention.flash_backend import find_flash_attn, torch_varlen

    found, problems = find_flash_attn(flash_modules(dev))
    arch = device_arch(dev)
    builtin = torch_varlen() if arch is not None and arch >= 80 else None
    return found + ([builtin] if builtin else []), problems


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # a module object without a spec: present, if broken
        return True


def _triton_imported_interpreted() -> bool:
    """True if triton was imported with ``TRITON_INTERPRET`` set: it decides at import, for its
    own library functions (which kernels call), whether they run interpreted."""
    import triton.language.standard as standard

    return type(standard.cdiv).__name__ == "InterpretedFunction"


def select_attention_backend(device: torch.device | str, name: str | None = None) -> AttentionBackend:
    """A new backend for ``device``.

    Args:
        device: where the model runs.
        name: "auto" (default; also from ``LMNB_ATTENTION_BACKEND``): on CUDA with ``triton``,
            flash-attn for extend when one imports or torch has one (``extend_candidates``;
            ``FlashAttentionBackend``, which keeps Triton for extend if flash-attn fails its
            start-up check or is slower on the model) or else Triton; torch otherwise. "torch";
            "triton" (CUDA, or any device under ``TRITON_INTERPRET=1``, the CPU interpreter used
            by the tests); "flash_attn" (as "triton", and flash-attn must import and pass its
            check).
    Raises:
        ValueError: an unknown name, or "triton"/"flash_attn" on a device they cannot run on.
        ImportError: "triton" or "flash_attn" asked for but the package is missing (the message
            says how to install).
    """
    from_env = not name and os.environ.get(ENV_VAR)
    name = (name or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if name not in BACKENDS:
        where = f" (from the environment variable {ENV_VAR})" if from_env else ""
        raise ValueError(f"unknown attention backend {name!r}{where}; choose one of {', '.join(BACKENDS)}")
    dev = torch.device(device)
    flash = []
    if name == "auto":
        name = "triton" if dev.type == "cuda" and triton_available() else "torch"
        if name == "triton":
            flash, problems = extend_candidates(dev)
            for problem in problems:  # installed, so wanted: say why it is not used
                log.warning("%s; extend attention runs on the Triton kernels", problem)
    if name == "torch":
        from lmnb_engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if not triton_available():
        raise ImportError(f"attention backend {name!r} needs the triton package: pip install triton "
                          "(Linux x86-64/aarch64), or use attention_backend='torch'")
    if dev.type != "cuda" and not interpreting():
        raise ValueError(f"the {name!r} attention backend runs on CUDA devices, not {dev.type!r} (set "
                         "TRITON_INTERPRET=1 to interpret it on CPU, slowly, for tests); use 'torch'")
    from lmnb_engine.attention.triton_backend import TritonAttentionBackend

    if dev.type != "cuda" and not _triton_imported_interpreted():
        raise ValueError("TRITON_INTERPRET=1 was set after triton was imported, so the kernels were built "
                         "for a GPU; set it before anything imports triton (in the shell, or first in the script)")

    if name == "flash_attn" or flash:
        from lmnb_engine.attention.flash_backend import MODULES, FlashAttentionBackend

        strict = name == "flash_attn"  # asked for by name: flash-attn must work
        if strict:
            modules = flash_modules(dev)
            flash, problems = extend_candidates(dev)
            if not flash:
                problems += [f"{m} is installed but not built for this GPU (sm_{device_arch(dev)})"
                             for m in MODULES if m not in modules and _present(m)]
                found = "; ".join(problems) or "none is installed"
                raise ImportError(f"attention backend 'flash_attn' needs flash-attn (FlashAttention-2 on sm_80+, "
                                  f"or a FlashAttention-3 build on sm_90, or torch 2.11+ on sm_80+, which has its "
                                  f"own), and {found}: pip install 'lmnb[flash]' --no-build-isolation, or use "
                                  "attention_backend='triton'")
        return FlashAttentionBackend(flash, strict=strict)
    return TritonAttentionBackend()
