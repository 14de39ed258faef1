"""[issue 10] ``image()``/``video()`` inputs as backends send them.

A program's text holds the chat template's image token once per ``image()``/``video()``; a model
sees one image per placeholder, so a video becomes its sampled frames, each with a placeholder of
its own (``expand_frames``; SGLang's frontend samples frames client-side too). HTTP backends send
each image as a base64 PNG data URL (``data_url``), the form both OpenAI's vision API and SGLang's
``image_data`` read. Pillow (and for videos decord/PyAV) is imported only when an image is used.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from lmnb.backend.base import Prompt
from lmnb.ir import Image


def frames(media: Any) -> list:
    """The images of one input: ``[source]`` of an ``Image``, the sampled frames (``PIL.Image``)
    of a ``Video``.

    Raises:
        ValueError (``ImageInputError``): the video cannot be read.
    """
    if isinstance(media, Image):
        return [media.source]
    from lmnb_engine.multimodal import sample_video_frames

    return sample_video_frames(media.source, media.num_frames)


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


def data_url(source: Any) -> str:
    """``source`` (a path, ``PIL.Image``, encoded bytes or a data URL) as a
    ``data:image/png;base64,...`` URL of its RGB pixels; a data URL is checked and kept as it is.

    Decoding here, not on the server, gives a bad image the same error as on the in-process engine,
    and the server decodes exactly the pixels this process sees (PNG is lossless).

    Raises:
        ValueError (``ImageInputError``): the image cannot be read (the message says why).
    """
    from lmnb_engine.multimodal import load_image

    loaded = load_image(source)
    if isinstance(source, str) and source.startswith("data:"):
        return source
    buf = io.BytesIO()
    loaded.image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
