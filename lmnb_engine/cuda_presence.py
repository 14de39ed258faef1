"""Why torch cannot run on CUDA here, told without starting CUDA: an exported job asks before the
notebook's set-up cells run (a ``--device cuda`` on a machine without it was found only after them,
as the engine started), where ``torch.cuda.is_available()`` would start CUDA in the job's process
(``cuInit``): that fixes the GPUs it sees before a set-up cell sets ``CUDA_VISIBLE_DEVICES``, and
leaves processes forked later unable to use CUDA."""

from __future__ import annotations

import ctypes
import sys
from typing import Optional

from lmnb_engine.cli_options import option_error

# the NVIDIA driver's CUDA library, which a CUDA build of torch loads (torch does not ship it);
# elsewhere (Windows' nvcuda.dll) the driver is left to torch to find
DRIVER_LIBRARY = "libcuda.so.1" if sys.platform.startswith("linux") else None


def missing_cuda() -> Optional[str]:
    """Why torch certainly cannot use CUDA on this machine, as words that follow "but": torch is a
    CPU build (``torch.version.cuda`` None, not a ROCm build either), or, on Linux, a CUDA build
    finds no NVIDIA driver (``DRIVER_LIBRARY`` does not load). None where CUDA may be there (a
    driver without a GPU is told only by ``torch.cuda.is_available()``). Imports torch; starts no
    CUDA."""
    import torch

    if _cpu_build():
        return f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"
    if torch.version.cuda is not None and DRIVER_LIBRARY is not None:
        try:
            ctypes.CDLL(DRIVER_LIBRARY)  # (loading it runs no cuInit)
        except OSError:
            return f"no NVIDIA driver is installed ({DRIVER_LIBRARY} is not found)"
    return None


def no_cuda_error(device: str, reason: str) -> ValueError:
    """The error for ``device`` (a cuda device) on a machine without CUDA, ``reason`` saying why
    (``missing_cuda``, or torch's "torch sees no CUDA device"), with the fixes: ``device='cpu'``
    (``--device cpu`` on a command line, ``cli_options.in_option_syntax``), or a GPU machine."""
    build = " and a CUDA build of torch" if _cpu_build() else ""
    return option_error(ValueError, f"device {device!r} asked for, but {reason}", ("use {}", "device", "cpu"),
                        (f"run on a machine with an NVIDIA GPU{build}",))


def _cpu_build() -> bool:
    """Whether the torch installed is built for no GPU (neither CUDA nor ROCm, which torch.cuda runs too)."""
    import torch

    return torch.version.cuda is None and torch.version.hip is None
