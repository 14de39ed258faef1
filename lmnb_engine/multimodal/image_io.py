"""Decode an image from a path, PIL image, bytes or data URL, and hash its pixels.

The content hash (SHA-256 over mode, size and raw RGB bytes of the decoded image) is what the
radix cache keys an image's placeholder positions with (paper §6: image tokens are reused across
requests by keying on the image), so the same picture from a file, bytes or a data URL shares KV
and a one-pixel change does not. Decoding is Pillow's; remote URLs are refused unless enabled.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

DEFAULT_MAX_BYTES = 20 * 2**20  # encoded size (a file, bytes, a data URL's payload)
DEFAULT_MAX_PIXELS = 50_000_000  # width × height of the decoded image
# Longest side over shortest side. The image processors scale the short side up to the vision
# tower's size (336 for LLaVA), so a 100-byte 16000x1 PNG became gigabytes of pixels there; 200 is
# the limit Qwen2-VL's image utilities set (qwen_vl_utils MAX_RATIO), far past panoramas or receipts.
MAX_ASPECT_RATIO = 200
ALLOW_REMOTE_ENV = "LMNB_ALLOW_REMOTE_MEDIA"
SIXTEEN_BIT_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N")  # "I": a 16-bit PNG in older Pillow


class ImageInputError(ValueError):
    """An image input that cannot be used: unreadable, too large, or a refused remote URL."""


@dataclass(frozen=True)
class LoadedImage:
    """A decoded image and its content hash.

    Attributes:
        image: RGB ``PIL.Image.Image``.
        hash: hex SHA-256 of the decoded pixels (see the module docstring).
    """

    image: Image.Image
    hash: str


def pixel_hash(image: Image.Image) -> str:
    """Hex SHA-256 of ``image`` as ``load_image`` reads it (turned upright, RGB, transparency on
    white): mode, width, height, then the raw bytes."""
    rgb = _upright(image)
    rgb = rgb if rgb.mode == "RGB" else _to_rgb(rgb)
    h = hashlib.sha256(f"RGB:{rgb.width}x{rgb.height}:".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


# A notebook's PIL image is read by the live view's thumbnail and the engine at once.
_PIL_LOAD_LOCK = threading.Lock()


def load_image(
    source: Any,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    allow_remote: bool | None = None,
) -> LoadedImage:
    """Decode ``source`` into an RGB image and hash it.

    Args:
        source: a ``PIL.Image.Image``; a path (``str``/``PathLike``) or ``file://`` URL; ``bytes``/``bytearray`` of an
            encoded image (PNG, JPEG, ...); a ``data:image/...;base64,...`` URL; or an
            ``http(s)://`` URL when remote fetching is enabled.
        max_bytes: largest encoded size accepted.
        max_pixels: largest width × height accepted (guards against decompression bombs).
            Sides differing more than ``MAX_ASPECT_RATIO`` to 1 are refused too.
        allow_remote: fetch http(s) URLs; None = only when the environment variable
            ``LMNB_ALLOW_REMOTE_MEDIA=1`` is set.
    Returns:
        ``LoadedImage``.
    Raises:
        ImageInputError (a ValueError): wrong type, missing file, bad base64, an unreadable or
            truncated image, a size or aspect ratio over the limits, or a remote URL while fetching
            is off.
    """
    if isinstance(source, Image.Image):
        image = source
        _check_pixels(image, max_pixels, "the PIL image")
        with _PIL_LOAD_LOCK:  # Pillow's lazy decode of an Image.open() is not thread-safe
            if getattr(image, "tile", None) and getattr(image, "fp", True) is None:  # Pillow asserts here
                raise ImageInputError(
                    "the PIL image was closed before its pixels were read (used after its 'with Image.open(...)' "
                    "block, or after .close()); call .load() on it while it is open, or keep it open")
            return _finish(image, "the PIL image")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(bytes(source), max_bytes, max_pixels, "the image data")
    source = _source_string(source)
    if is_data_url(source):
        return _decode(_data_url_bytes(source, max_bytes), max_bytes, max_pixels, "the data URL")
    if is_http_url(source):
        return _decode(_fetch(source, max_bytes, allow_remote), max_bytes, max_pixels, source)
    return _decode(_image_file(source, max_bytes).read_bytes(), max_bytes, max_pixels, repr(source))


def check_image_source(
    source: Any,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    allow_remote: bool | None = None,
) -> None:
    """Raise what ``load_image(source)`` raises before it decodes the pixels: a source of another
    type, a path with no file or one over ``max_bytes``, a data URL not of the form
    ``data:image/<type>;base64,<data>``, bytes in no format Pillow knows or whose header gives a
    size over ``max_pixels`` or ``MAX_ASPECT_RATIO``, a remote URL while fetching is off. Cheap
    (only the image's header is read; nothing is fetched), so a front end checks an input where
    the program adds it, not only where a later request sends it.

    Raises:
        ImageInputError (a ValueError): as ``load_image`` words it.
    """
    if isinstance(source, Image.Image):
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        _check_header(io.BytesIO(source), max_pixels, "the image data")
        return
    source = _source_string(source)
    if is_data_url(source):
        _check_header(io.BytesIO(_data_url_bytes(source, max_bytes)), max_pixels, "the data URL")
    elif is_http_url(source):
        if not _remote_allowed(allow_remote):
            raise _remote_refused(source)
    else:
        with _image_file(source, max_bytes).open("rb") as f:
            _check_header(f, max_pixels, repr(source))


def _check_header(fp: Any, max_pixels: int, what: str) -> None:
    """Refuse the image in the binary file ``fp`` as ``load_image`` does, from its header alone.

    Raises:
        ImageInputError: see ``_opened``."""
    with _readable(what, max_pixels):
        _opened(fp, max_pixels, what)


def _source_string(source: Any) -> str:
    """A path, data URL or URL ``source`` as a string (a ``PathLike`` as its path).

    Raises:
        ImageInputError: ``source`` is of another type."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise ImageInputError(
            f"an image must be a file path, a PIL image, bytes or a base64 data URL; got {type(source).__name__}"
        )
    return source


def _image_file(source: str, max_bytes: int) -> Path:
    """The file at path ``source`` (``~`` expanded, a ``file://`` URL read as its path).

    Raises:
        ImageInputError: no file there, or one over ``max_bytes``."""
    path = file_path(source)
    if not _is_file(path):
        raise _no_file(source, path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ImageInputError(f"image file {source!r} is {size} bytes, over the limit of {max_bytes}; shrink it")
    return path


def file_path(source: str) -> Path:
    """The local path that ``source`` names: a ``file://`` URL's (``file:///tmp/a%20b.png`` is
    ``/tmp/a b.png``; SGLang's ``load_image`` reads them so), else ``source`` with ``~`` expanded.

    Raises:
        ImageInputError: a ``file://`` URL of a host other than this one."""
    if source[:7].lower() != "file://":
        return Path(source).expanduser()
    url = urllib.parse.urlsplit(source)
    if url.netloc not in ("", "localhost"):
        raise ImageInputError(f"{source!r} is a file on another host, {url.netloc!r}; copy it here and pass its path")
    return Path(urllib.parse.unquote(url.path))


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False too where the name is too long to be a file's (``OSError``)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _no_file(source: str, path: Path) -> ImageInputError:
    """The error for a path with no file (``path``: where ``source`` points); a string longer than
    any file name, or one that is the base64 of an image (a 1x1 PNG is 92 characters), is image
    data, said so without echoing it all; a folder is named as one."""
    if len(source) > 255 or _is_base64_image(source):
        return ImageInputError(f"no image file at {source[:40]!r}... ({len(source)} characters: image data, not a "
                               "path?); pass the image's bytes or a data:image/<type>;base64,<data> URL")
    if is_folder(path):
        return ImageInputError(f"{source!r} is a folder, not an image file; give the path of an image in it")
    return ImageInputError(f"no image file at {source!r}; check the path")


def is_folder(path: Path) -> bool:
    """``path.is_dir()``, False too where the name is too long to be a folder's (``OSError``)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _is_base64_image(text: str) -> bool:
    """Whether ``text`` is bare base64 whose bytes start as an image file PIL knows (only the
    header is read)."""
    try:
        with Image.open(io.BytesIO(base64.b64decode(text, validate=True))):
            return True
    except (binascii.Error, ValueError, OSError):  # not base64, or not an image (UnidentifiedImageError)
        return False


def is_data_url(source: Any) -> bool:
    """True for a ``data:`` URL string; the scheme, like the media type and ``;base64``, is
    case-insensitive (RFC 2397), so ``DATA:image/PNG;BASE64,...`` is one too (not a file path)."""
    return isinstance(source, str) and source[:5].lower() == "data:"


def is_http_url(source: Any) -> bool:
    """True for an ``http://`` or ``https://`` URL string, the scheme in any case (RFC 3986), so
    ``HTTPS://host/cat.png`` is a URL too (not a file path)."""
    return isinstance(source, str) and source[:8].lower().startswith(("http://", "https://"))


def _data_url_bytes(url: str, max_bytes: int) -> bytes:
    head, sep, payload = url.partition(",")
    head = head.lower()
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageInputError(
            f"data URL {url[:40]!r}... is not of the form data:image/<type>;base64,<data>; encode the image as base64"
        )
    if len(payload) * 3 // 4 > max_bytes:
        raise ImageInputError(f"data URL image is over the limit of {max_bytes} bytes; shrink it")
    # base64 wrapped in lines (base64.encodebytes, the base64 tool) is base64 too: browsers read
    # data URLs ignoring whitespace (WHATWG forgiving-base64)
    payload = "".join(payload.split())
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError("the data URL's payload is not valid base64") from None


def _remote_allowed(allow_remote: bool | None) -> bool:
    """``allow_remote``, or where None whether ``$LMNB_ALLOW_REMOTE_MEDIA`` turns fetching on."""
    if allow_remote is None:
        return os.environ.get(ALLOW_REMOTE_ENV, "") in ("1", "true", "yes")
    return allow_remote


def _remote_refused(url: str) -> ImageInputError:
    return ImageInputError(
        f"remote image {url!r} is not fetched (fetching is off); download it and pass the path or bytes, "
        f"or set {ALLOW_REMOTE_ENV}=1"
    )


def _fetch(url: str, max_bytes: int, allow_remote: bool | None) -> bytes:
    if not _remote_allowed(allow_remote):
        raise _remote_refused(url)
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - opt-in, http(s) only
            data = resp.read(max_bytes + 1)
    except OSError as e:
        raise ImageInputError(f"could not fetch {url!r}: {e}") from None
    if len(data) > max_bytes:
        raise ImageInputError(f"remote image {url!r} is over the limit of {max_bytes} bytes")
    return data


def _check_pixels(image: Image.Image, max_pixels: int, what: str) -> None:
    if not image.width or not image.height:  # the image processor divides by zero, or pads nothing to a square
        raise ImageInputError(f"{what} is {image.width}x{image.height} pixels: it is empty (a crop box outside "
                              "the picture, or of zero width?)")
    if image.width * image.height > max_pixels:
        raise ImageInputError(
            f"{what} is {image.width}x{image.height} pixels, over the limit of {max_pixels}; resize it"
        )
    if max(image.size) > MAX_ASPECT_RATIO * min(image.size):
        raise ImageInputError(
            f"{what} is {image.width}x{image.height} pixels: its sides differ more than {MAX_ASPECT_RATIO} to 1, the "
            "limit (the image processor would scale the short side up into gigabytes); crop it into parts"
        )


def _decode(data: bytes, max_bytes: int, max_pixels: int, what: str) -> LoadedImage:
    if len(data) > max_bytes:
        raise ImageInputError(f"{what} is {len(data)} bytes, over the limit of {max_bytes}; shrink it")
    with _readable(what, max_pixels):
        image = _opened(io.BytesIO(data), max_pixels, what)
        image.load()
    return _finish(image, what)


def _opened(fp: Any, max_pixels: int, what: str) -> Image.Image:
    """``Image.open(fp)``, its size checked from the header (``_check_pixels``), its pixels not
    decoded yet; Pillow's errors are raised as they come, for ``_readable`` to word."""
    image = Image.open(fp)
    _check_pixels(image, max_pixels, what)
    return image


@contextlib.contextmanager
def _readable(what: str, max_pixels: int) -> Iterator[None]:
    """Raise Pillow's errors of opening or decoding the image ``what`` as ``ImageInputError``s."""
    try:
        yield
    except ImageInputError:
        raise
    except Image.DecompressionBombError as e:  # Pillow's own limit, met in Image.open before ours
        raise ImageInputError(f"{what} is over the limit of {max_pixels} pixels ({e}); resize it") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        # (Pillow's UnidentifiedImageError names the buffer it read, "cannot identify image file
        # <_io.BytesIO object at 0x7f...>": an address, where the file's name is in ``what``)
        detail = ("its bytes are in no image format Pillow knows" if isinstance(e, UnidentifiedImageError)
                  else f"{type(e).__name__}: {e}")
        raise ImageInputError(f"{what} is not a readable image ({detail}); use PNG, JPEG, GIF, WebP or BMP") from None


def _finish(image: Image.Image, what: str) -> LoadedImage:
    try:
        rgb = _to_rgb(_upright(image))
    except (OSError, ValueError) as e:
        raise ImageInputError(f"{what} cannot be converted to RGB ({e})") from None
    return LoadedImage(rgb, pixel_hash(rgb))


def _upright(image: Image.Image) -> Image.Image:
    """``image`` turned as its EXIF orientation tag says, as viewers show it and transformers'
    ``load_image`` reads it: a phone stores a portrait photo sideways with that tag, and the model
    was given it on its side."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
        return image
    return ImageOps.exif_transpose(image)


def _to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as RGB, any transparency composited onto white as the HF image processors'
    ``convert_to_rgb`` does: a plain ``convert("RGB")`` keeps the colour under transparent pixels
    (black in most PNGs with alpha), so a dark logo on a transparent background became all black.
    16-bit grayscale is scaled to 8 bits first (see ``_to_8_bit``)."""
    image = _to_8_bit(image)
    if "A" not in image.getbands() and image.info.get("transparency") is None:
        return image.convert("RGB")
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")


def _to_8_bit(image: Image.Image) -> Image.Image:
    """16-bit grayscale (a PNG or TIFF from a scanner, a microscope, a depth camera) as 8-bit "L",
    each value v becoming round(v / 257), so 65535 is 255. ``convert("RGB")`` clips every value
    above 255 instead, and such an image came out almost all white (transformers' ``load_image``
    does the same). A transparent value (a PNG's tRNS, a 16-bit one) becomes an alpha band ("LA"):
    scaled to 8 bits it would also mark the values that round onto it. Other modes are returned
    as they are."""
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    values = np.asarray(image, dtype=np.float64)
    gray = Image.fromarray(np.clip(np.rint(values / 257), 0, 255).astype(np.uint8))
    transparent = image.info.get("transparency")
    if not isinstance(transparent, int):  # (none, or not a grey value: nothing is transparent)
        return gray
    alpha = Image.fromarray(np.where(values == transparent, 0, 255).astype(np.uint8))
    return Image.merge("LA", (gray, alpha))
