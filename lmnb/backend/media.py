"""[issue 10] ``image()``/``video()`` inputs as backends send them.

A program's text holds the chat template's image token once per ``image()``/``video()``; a model
sees one image per placeholder, so a video becomes its sampled frames, each with a placeholder of
its own (``expand_frames``; SGLang's frontend samples frames client-side too). HTTP backends send
each image as a base64 data URL (``data_url``: a PNG/JPEG/WebP file as it is, other images as
PNG), the form both OpenAI's vision API and SGLang's ``image_data`` read. Pillow (and for
videos decord/PyAV) is imported only when an image is used.
"""

from __future__ import annotations

import base64
import io
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Optional

from lmnb.backend.base import Prompt
from lmnb.ir import Image


class _Recent:
    """The values of the last ``size`` keys put, the least recently used dropped first (and more
    while ``too_big(values)``), for any thread. Every request of a program sends all its inputs
    again: the caches below keep what each input cost to prepare."""

    def __init__(self, size: int, too_big: Callable[[Iterable], bool] = lambda values: False) -> None:
        self.size, self._too_big = size, too_big
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` for ``key``."""
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size or self._too_big(self._items.values()):
                self._items.popitem(last=False)


# Sampled frames of the last few videos, by file identity: decoding a video for each gen, select
# and fork of it took most of their time.
VIDEO_CACHE_SIZE = 4
_videos = _Recent(VIDEO_CACHE_SIZE)


def frames(media: Any) -> list:
    """The images of one input: ``[source]`` of an ``Image``, the sampled frames (``PIL.Image``)
    of a ``Video``, decoded once for the last ``VIDEO_CACHE_SIZE`` videos (a file is the same
    video while its path, size and modification time are).

    Raises:
        ValueError (``ImageInputError``): the video cannot be read.
    """
    if isinstance(media, Image):
        return [media.source]
    from lmnb_engine.multimodal import sample_video_frames

    try:
        path = os.path.expanduser(media.source)  # as the reader opens it: "~/clip.mp4" was never kept
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, media.num_frames)
    except (OSError, TypeError, ValueError):  # not a readable path: the reader says why
        return sample_video_frames(media.source, media.num_frames)
    sampled = _videos.get(key)
    if sampled is None:
        sampled = sample_video_frames(media.source, media.num_frames)
        _videos.put(key, sampled)
    return list(sampled)


def check_source(media: Any) -> None:
    """Raise where the program adds an ``image()``/``video()`` input that no request could send
    (a path with no file, a source of another type, a video that does not decode), so that the
    error names that input, not the next gen. An image is checked from its header, its pixels not
    decoded (``check_image_source``); a video's frames are sampled here, once (``frames`` keeps them for
    the requests that send them).

    Raises:
        ValueError (``ImageInputError``): as ``load_image`` and ``sample_video_frames`` word it.
    """
    if isinstance(media, Image):
        from lmnb_engine.multimodal.image_io import check_image_source

        check_image_source(media.source)
    else:
        frames(media)


def expand_frames(prompt: Prompt, token: str) -> tuple[str, list, list[int]]:
    """The prompt's text with one ``token`` per image (a video's repeated once per sampled frame),
    the images in order (each an ``Image`` source or a video frame as a ``PIL.Image``), and how many
    images each ``image()``/``video()`` input became.

    Raises:
        ValueError: the text holds a different number of ``token`` placeholders than there are
            inputs (the program wrote the token as text), or a video cannot be read.
    """
    parts = prompt.text.split(token)
    if len(parts) != len(prompt.images) + 1:
        raise ValueError(
            f"the prompt holds {len(parts) - 1} {token!r} placeholders for {len(prompt.images)} image/video "
            f"inputs; do not write {token} as text in a program that uses image()/video()"
        )
    text, images, counts = parts[0], [], []
    for media, rest in zip(prompt.images, parts[1:]):
        these = frames(media)
        images += these
        counts.append(len(these))
        text += token * len(these) + rest
    return text, images, counts


def per_input(meta: dict, counts: list[int]) -> dict:
    """``meta`` with a server's per-image ``images`` (``lmnb serve``: ``{"tokens", "cached_tokens",
    "hash"}`` per image in prompt order) summed per ``image()``/``video()`` input, ``counts`` being
    the images each input became: ``{"tokens", "cached_tokens", "hashes"}`` per input, the form the
    in-process backend reports and live views read. Left out when the server sent none, or not one
    per image."""
    entries = meta.get("images")
    if not isinstance(entries, list) or len(entries) != sum(counts):
        meta.pop("images", None)
        return meta
    grouped, i = [], 0
    for n in counts:
        span, i = entries[i : i + n], i + n
        grouped.append({"tokens": sum(int(e["tokens"]) for e in span),
                        "cached_tokens": sum(int(e["cached_tokens"]) for e in span),
                        "hashes": [e.get("hash") for e in span]})
    meta["images"] = grouped
    return meta


# Encoded formats sent as they are (both OpenAI's vision API and SGLang read them): the server's
# Pillow decodes the same pixels, and a photo stays the size the in-process engine accepts (a 4 MB
# JPEG photo re-encoded as PNG is over the 20 MB image limit, and takes seconds to encode). MPO is
# the JPEG of many phone cameras (a JPEG with more pictures after the first, which is what is read).
AS_IS_FORMATS = {"PNG": "png", "JPEG": "jpeg", "MPO": "jpeg", "WEBP": "webp"}

# PNG data URLs of the last few images encoded, by pixel hash: encoding a photo-sized image as PNG
# takes about a second each time.
PNG_CACHE_SIZE = 8
PNG_CACHE_CHARS = 64 * 2**20  # and at most this much text in all
_png_urls = _Recent(PNG_CACHE_SIZE, too_big=lambda urls: sum(map(len, urls)) > PNG_CACHE_CHARS)


def data_url(source: Any) -> str:
    """``source`` (a path, ``PIL.Image``, encoded bytes or a data URL) as a ``data:image/...;base64,``
    URL: a PNG, JPEG or WebP file or bytes as they are (also the file of a ``PIL.Image`` opened from
    one, while its pixels are the file's), other sources as PNG of their RGB pixels; a data URL is
    checked and kept as it is.

    Decoding here, not on the server, gives a bad image the same error as on the in-process engine,
    and the server decodes exactly the pixels this process sees (PNG is lossless).

    Raises:
        ValueError (``ImageInputError``): the image cannot be read (the message says why).
    """
    from lmnb_engine.multimodal.image_io import is_data_url, load_image

    loaded = load_image(source)
    if is_data_url(source):
        return source
    raw = _encoded(source, loaded.hash)
    fmt = _format(raw) if raw is not None else None
    if fmt in AS_IS_FORMATS:
        return f"data:image/{AS_IS_FORMATS[fmt]};base64," + base64.b64encode(raw).decode("ascii")
    return _png_url(loaded)


def _png_url(loaded: Any) -> str:
    """The PNG data URL of a ``LoadedImage``'s pixels, encoded once for the last
    ``PNG_CACHE_SIZE`` images (keyed by their pixel hash; ``PNG_CACHE_CHARS`` of URLs at most).

    Raises:
        ImageInputError: the PNG is over the servers' image limit (``DEFAULT_MAX_BYTES``)."""
    url = _png_urls.get(loaded.hash)
    if url is not None:
        return url
    from lmnb_engine.multimodal.image_io import DEFAULT_MAX_BYTES, ImageInputError

    buf = io.BytesIO()
    loaded.image.save(buf, format="PNG")
    if buf.tell() > DEFAULT_MAX_BYTES:  # the server would refuse it, naming a data URL the user never wrote
        w, h = loaded.image.size
        raise ImageInputError(
            f"the {w}x{h} image is {buf.tell()} bytes as PNG (how images without a file of their own are sent), "
            f"over a server's limit of {DEFAULT_MAX_BYTES}; resize it, or pass a JPEG file or its bytes")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    _png_urls.put(loaded.hash, url)
    return url


def _encoded(source: Any, pixel_hash: str) -> Optional[bytes]:
    """The encoded bytes of a path or bytes ``source``, or of the file a ``PIL.Image`` was opened
    from (``Image.open(path)``) when that file decodes to its pixels (``pixel_hash``: it was not
    edited since); None for other images and URLs."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    from lmnb_engine.multimodal.image_io import file_path, is_http_url

    if isinstance(source, (str, os.PathLike)) and not is_http_url(str(source)):
        return file_path(os.fspath(source)).read_bytes()
    filename = getattr(source, "filename", None)
    if getattr(source, "format", None) in AS_IS_FORMATS and isinstance(filename, str) and os.path.isfile(filename):
        raw = Path(filename).read_bytes()
        return raw if _file_holds(filename, raw, pixel_hash) else None
    return None


# Whether a file holds the pixels of a PIL image opened from it, for the last few (file, size,
# modification time, pixel hash): decoding the file again for each request doubled the time a
# photo took.
_file_checks = _Recent(PNG_CACHE_SIZE)


def _file_holds(filename: str, raw: bytes, pixel_hash: str) -> bool:
    """Whether ``raw``, the bytes of file ``filename``, decodes to the pixels ``pixel_hash``."""
    from lmnb_engine.multimodal import ImageInputError, load_image

    st = os.stat(filename)
    key = (filename, st.st_size, st.st_mtime_ns, pixel_hash)
    holds = _file_checks.get(key)
    if holds is None:
        try:
            holds = load_image(raw).hash == pixel_hash
        except ImageInputError:
            holds = False
        _file_checks.put(key, holds)
    return holds


def _format(raw: bytes) -> Optional[str]:
    """Pillow's name for the format of the encoded image ``raw`` (read from its header)."""
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(raw)) as img:
        return img.format
