"""Images and videos for vision-language models (LLaVA): input decoding, content hashes, the HF
preprocessing, video frame sampling, and the cache of vision-encoder outputs (paper §2, §6)."""

from lmnb_engine.multimodal.image_io import ImageInputError, LoadedImage, load_image, pixel_hash
from lmnb_engine.multimodal.inputs import (
    ImageSlot,
    MultimodalInputs,
    MultimodalPrompt,
    MultimodalTokens,
    is_multimodal_prompt,
)
from lmnb_engine.multimodal.video import sample_video_frames, video_backend

__all__ = [
    "ImageInputError",
    "ImageSlot",
    "LoadedImage",
    "MultimodalInputs",
    "MultimodalPrompt",
    "MultimodalTokens",
    "is_multimodal_prompt",
    "load_image",
    "pixel_hash",
    "sample_video_frames",
    "video_backend",
]
