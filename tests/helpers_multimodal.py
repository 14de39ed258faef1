"""Inputs for the multimodal tests: random images and a short video, written here."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def random_image(seed: int, size=(37, 23)) -> Image.Image:
    """A random RGB image (width, height); non-square so LLaVA-1.5's pad-to-square matters."""
    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def frame_color(i: int) -> tuple[int, int, int]:
    """The solid colour of frame ``i`` of ``write_video``'s videos."""
    return (i * 30 % 256, 220 - i * 25, 40 + i * 20)


def write_video(path, num_frames: int = 8, size: int = 32) -> None:
    """An MPEG-4 video (written with PyAV) whose frame ``i`` is a solid ``frame_color(i)``."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(num_frames):
            pixels = np.full((size, size, 3), frame_color(i), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
