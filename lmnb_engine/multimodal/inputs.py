"""The request shape of a multimodal prompt, and what a prepared one hands the scheduler.

A caller writes ``MultimodalPrompt(text, images)`` (or the dict ``{"text": ..., "images": [...]}``)
with one image placeholder (``<image>``, the checkpoint's image token) in ``text`` per image, in
order. ``MultimodalProcessor.prepare`` turns it into ``MultimodalTokens``: the token ids with each
placeholder repeated once per image feature, the radix-cache key of every position (``(hash, i)``
at the ``i``-th position of an image, the token id elsewhere), and the pixels for the vision tower.
This module imports neither torch nor Pillow, so the engine can check prompts cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence


@dataclass
class MultimodalPrompt:
    """A prompt with images.

    Attributes:
        text: the prompt text (or token ids) with one ``<image>`` placeholder per image.
        images: each a file path, ``PIL.Image.Image``, encoded bytes or ``data:image/...;base64``
            URL (``lmnb_engine.multimodal.load_image``); the frames of a video are images too
            (``sample_video_frames``). One image may be given alone, not in a list.
    """

    text: Any
    images: Sequence[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a lone path or bytes is a sequence too: "cat.png" was taken for 7 images
        if not isinstance(self.images, (list, tuple)):
            self.images = [self.images]


@dataclass(frozen=True)
class ImageSlot:
    """One image inside a prepared prompt.

    Attributes:
        offset: prompt position of its first placeholder token.
        length: placeholder tokens (= feature vectors the projector yields for it).
        hash: hex SHA-256 of the decoded pixels (``pixel_hash``); the radix key and encoder-cache key.
        pixel_values: float32 CPU tensor from the checkpoint's image processor: [3, H, W], or
            [num_tiles, 3, H, W] for LLaVA-NeXT any-resolution tiling.
        image_size: (height, width) of the original image (LLaVA-NeXT unpads to it), else None.
    """

    offset: int
    length: int
    hash: str
    pixel_values: Any
    image_size: tuple[int, int] | None = None


@dataclass(frozen=True)
class MultimodalInputs:
    """The images of one request, in prompt order (``Req.mm_inputs``, ``ForwardBatch.mm_inputs``)."""

    images: tuple[ImageSlot, ...]


class MultimodalTokens(list):
    """Token ids of a prepared multimodal prompt (a ``list[int]``) carrying ``input_key`` (one
    hashable per position, for the radix cache) and ``mm_inputs`` (``MultimodalInputs``)."""

    def __init__(self, ids: Sequence[int], input_key: Sequence[Hashable], mm_inputs: MultimodalInputs) -> None:
        super().__init__(ids)
        self.input_key = list(input_key)
        self.mm_inputs = mm_inputs


def is_multimodal_prompt(prompt: Any) -> bool:
    """True for a ``MultimodalPrompt`` or a dict with "text" and "images" keys."""
    return isinstance(prompt, MultimodalPrompt) or (isinstance(prompt, dict) and "images" in prompt)


def as_multimodal_prompt(prompt: Any) -> MultimodalPrompt:
    """Normalize a dict prompt; raises ``ValueError`` naming unknown or missing keys."""
    if isinstance(prompt, MultimodalPrompt):
        return prompt
    unknown = set(prompt) - {"text", "images"}
    if unknown or "text" not in prompt:
        raise ValueError(f"a multimodal prompt dict has the keys 'text' and 'images'; got {sorted(prompt)}")
    return MultimodalPrompt(prompt["text"], prompt["images"])
