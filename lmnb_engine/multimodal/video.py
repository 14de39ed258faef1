"""Sample ``num_frames`` frames uniformly from a video file.

``decord`` reads the frames when importable (SGLang's reader); where it is missing or cannot read
the file, PyAV (``av``); then Pillow, which reads animated GIF/WebP/APNG (decord fails on GIFs).
The frame indices are ``numpy.linspace(0, total - 1, n)`` truncated to integers, as SGLang's video
frame extraction samples them, so the first and last frames are always included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from lmnb_engine.multimodal.image_io import ImageInputError, _is_file, file_path, is_data_url, is_folder, is_http_url

DEFAULT_MAX_VIDEO_BYTES = 512 * 2**20


def video_readers() -> list[str]:
    """The readers this machine has, in the order they are tried: of "decord", "av", "pillow"."""
    found = []
    for name in ("decord", "av"):
        try:
            __import__(name)
            found.append(name)
        except ImportError:
            continue
    return found + ["pillow"]


def video_backend() -> str:
    """The reader tried first on this machine: "decord", "av" or "pillow"."""
    return video_readers()[0]


def frame_indices(total: int, num_frames: int) -> list[int]:
    """Uniform frame indices (see the module docstring); fewer when the video is shorter."""
    if total <= 0:
        raise ImageInputError("the video has no frames")
    n = min(num_frames, total)
    return [int(x) for x in np.linspace(0, total - 1, n)]


def sample_video_frames(source: Any, num_frames: int, max_bytes: int = DEFAULT_MAX_VIDEO_BYTES) -> list[Image.Image]:
    """RGB frames sampled uniformly from the video at ``source`` (a path).

    Args:
        source: path (``str``/``PathLike``) or ``file://`` URL of a video file (any format the reader decodes), or
            an animated image with the Pillow fallback.
        num_frames: frames wanted (>= 1); a shorter video gives all its frames.
        max_bytes: largest file accepted.
    Raises:
        ImageInputError (a ValueError): bad ``num_frames``, no such file, too large, or unreadable.
    """
    if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
        raise ImageInputError(f"num_frames must be a positive integer, got {num_frames!r}")
    if not isinstance(source, (str, os.PathLike)):
        raise ImageInputError(f"a video is given by its file path, got {type(source).__name__}")
    if is_data_url(source) or is_http_url(source):  # echoed whole, a data URL's megabytes filled the error
        raise ImageInputError(f"a video is read from a file, not a URL ({source[:40]!r}...); save it to a file "
                              "and pass its path")
    path = file_path(os.fspath(source))
    if is_folder(path):
        raise ImageInputError(f"{str(source)!r} is a folder, not a video file; give the path of a video in it")
    if not _is_file(path):
        raise ImageInputError(f"no video file at {str(source)!r}; check the path")
    if path.stat().st_size > max_bytes:
        raise ImageInputError(f"video {str(source)!r} is over the limit of {max_bytes} bytes")
    failures = []
    for reader in video_readers():
        try:
            return _READERS[reader](path, num_frames)
        except ImageInputError:
            raise
        except Exception as e:  # noqa: BLE001 - each reader raises its own types for a bad file
            failures.append(f"{reader}: {type(e).__name__}: {e}")
    raise ImageInputError(f"{str(source)!r} is not a readable video ({'; '.join(failures)})")


def _decord_frames(path: Path, num_frames: int) -> list[Image.Image]:
    import decord

    vr = decord.VideoReader(str(path), ctx=decord.cpu(0))
    idx = frame_indices(len(vr), num_frames)
    return [Image.fromarray(a) for a in vr.get_batch(idx).asnumpy()]


def _av_frames(path: Path, num_frames: int) -> list[Image.Image]:
    import av

    # A first pass counts the frames (counts in headers are unreliable), a second keeps only the
    # sampled ones: keeping every decoded frame took gigabytes for a minute of HD video.
    with av.open(str(path)) as container:
        total = sum(1 for _ in container.decode(video=0))
    wanted = frame_indices(total, num_frames)
    kept = {}
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                kept[i] = frame.to_image().convert("RGB")
            if i == wanted[-1]:
                break
    return [kept[i] for i in wanted]


def _pillow_frames(path: Path, num_frames: int) -> list[Image.Image]:
    with Image.open(path) as im:
        total = getattr(im, "n_frames", 1)
        out = []
        for i in frame_indices(total, num_frames):
            im.seek(i)
            out.append(im.convert("RGB"))
    return out


_READERS = {"decord": _decord_frames, "av": _av_frames, "pillow": _pillow_frames}
