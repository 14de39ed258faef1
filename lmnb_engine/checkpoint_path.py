"""Where a model name points on this machine, told without torch or the hub: the local part of
the engine's model loading (``model_loader._resolve_path``), so that an exported job refuses a
checkpoint directory that is not there before any notebook cell runs (it ran them all first)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

import lmnb_engine

DEMO_MODEL_PATH = Path(lmnb_engine.__file__).parent / "demo_model"

# a Hugging Face repo id (name or org/name)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def local_checkpoint(model: str | os.PathLike, hint: str = "") -> Optional[Path]:
    """The checkpoint directory ``model`` (not the demo model's name) names on this machine, or
    None where nothing is there and it reads as a hub id (``org/name``), which only the hub (or
    its cache) can tell. ``hint``: what else the name may be, added to the missing path's error.

    Raises:
        FileNotFoundError: ``model`` is a file, a directory without config.json, or a path (or a
            name no hub id has, ``./x``, ``~/x``) where nothing is.
    """
    p = Path(model).expanduser()
    if p.exists():
        # ("demo", the demo model's name, is taken for the file or folder of that name where there is one)
        demo = (f"; the name {lmnb_engine.DEMO_MODEL_NAME!r} is taken for the {'file' if p.is_file() else 'folder'} "
                f"here: for the built-in demo model, give its directory {DEMO_MODEL_PATH}"
                if str(model) == lmnb_engine.DEMO_MODEL_NAME else "")
        if p.is_file():  # config.json or model.safetensors itself: "it has no config.json" puzzled
            more = f"; pass its directory {p.parent}" if (p.parent / "config.json").is_file() else demo
            raise FileNotFoundError(f"{p} is a file, not a Hugging Face checkpoint directory{more}")
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} is not a Hugging Face checkpoint directory: it has no config.json{demo}")
        return p
    s = str(model)
    if not HUB_ID.match(s) or s.startswith((".", "~")):
        raise FileNotFoundError(f"no checkpoint directory at {s!r}{looked_in(p)}; check the path{hint}")
    return None


def looked_in(path: Path) -> str:
    """" (none at /abs/path)" for a relative ``path``, where it was looked for ("" for an absolute
    one): a kernel, and so ``lmnb run``, works in the notebook's folder, so a path relative to the
    shell's folder was not found, and the error did not say where it had looked."""
    return "" if path.is_absolute() else f" (none at {path.absolute()})"
