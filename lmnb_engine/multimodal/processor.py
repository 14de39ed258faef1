"""Turn a ``MultimodalPrompt`` into token ids, radix keys and pixels for a LLaVA checkpoint.

Pixels come from the checkpoint's own Hugging Face image processor (``AutoImageProcessor``:
``CLIPImageProcessor`` or ``LlavaImageProcessor``, whose ``do_pad`` is LLaVA-1.5's
``image_aspect_ratio="pad"``). Each ``<image>`` placeholder becomes as many tokens as the vision
tower yields features — ``(image_size // patch_size) ** 2``, plus CLIP's CLS feature (a SigLIP
tower has none), less one for ``vision_feature_select_strategy == "default"`` — as
``LlavaProcessor`` expands it. For
LLaVA-NeXT (any-resolution tiling) the count depends on the image's size; the checkpoint's
``LlavaNextProcessor`` is asked for it, with the tiles.
"""

from __future__ import annotations

import logging
import numbers
import threading
from collections import OrderedDict
from typing import Any

from lmnb_engine.multimodal.image_io import DEFAULT_MAX_BYTES, load_image
from lmnb_engine.multimodal.inputs import (
    ImageSlot,
    MultimodalInputs,
    MultimodalTokens,
    as_multimodal_prompt,
)
from lmnb_engine.params import outside_vocabulary
from lmnb_engine.tokenizer import encode_text, without_added_bos

_PIXEL_CACHE_SIZE = 64  # preprocessed images kept by content hash (repeat questions skip resizing)


def counted(n: int, noun: str) -> str:
    """``"1 image"``, ``"2 images"``, ``"0 images"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def placeholders(n: int, token: str) -> str:
    """``"1 '<image>' placeholder"``, ``"2 '<image>' placeholders"`` (for error messages)."""
    return counted(n, f"{token!r} placeholder")


def placeholder_id(mm_config: Any) -> int:
    """The token id of the image placeholder of a vision-language model's HF config (LLaVA's
    ``image_token_id``, ``image_token_index`` in older configs)."""
    return int(getattr(mm_config, "image_token_id", None) or mm_config.image_token_index)


class ImageProcessorUnavailable(ValueError):
    """A vision-language model whose image processor cannot be made from its checkpoint (no
    usable processor config): unlike a text-only model's refusal, the fix is the checkpoint's."""


class MultimodalProcessor:
    """Prepares multimodal prompts for one loaded vision-language model (thread-safe).

    Args:
        loaded: a ``LoadedModel`` whose ``config.multimodal_hf_config`` is a ``LlavaConfig`` or
            ``LlavaNextConfig``.
        max_image_bytes: largest encoded image accepted (``load_image``).
    Raises:
        ValueError: the model is not a vision-language model.
        ImageProcessorUnavailable (a ValueError): its checkpoint has no (image) processor config.
        ImportError: this transformers cannot build its image processor without torchvision.
    """

    def __init__(self, loaded: Any, max_image_bytes: int = DEFAULT_MAX_BYTES) -> None:
        mm = loaded.config.multimodal_hf_config
        if mm is None:
            raise ValueError(
                f"{loaded.config.architecture} is a text-only model: it cannot take images. Load a "
                "LlavaForConditionalGeneration checkpoint, or drop the images from the prompt"
            )
        # LLaVA-NeXT tiling: the token count depends on each image's size (hf_processor counts it)
        self.anyres = loaded.config.architecture == "LlavaNextForConditionalGeneration"
        self.grid_pinpoints = getattr(mm, "image_grid_pinpoints", None)
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.image_token_id = placeholder_id(mm)
        self.image_token = self.tokenizer.convert_ids_to_tokens(self.image_token_id)
        vision = mm.vision_config
        per_side = vision.image_size // vision.patch_size
        # the features the tower yields: a patch each, and CLIP's CLS first (SigLIP has none); the
        # "default" strategy drops the first one, as transformers' LLaVA does
        cls = 1 if vision.model_type == "clip_vision_model" else 0
        default = mm.vision_feature_select_strategy == "default"
        self.tokens_per_image = per_side * per_side + cls - (1 if default else 0)
        self.image_size = vision.image_size
        self.max_image_bytes = max_image_bytes
        self.image_processor = _load_image_processor(loaded.path)
        self.hf_processor = _load_processor(loaded.path, "AutoProcessor") if self.anyres else None
        self._pixels: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def prepare(self, prompt: Any) -> MultimodalTokens:
        """Token ids, radix keys and pixels of ``prompt`` (``MultimodalPrompt`` or dict).

        Raises:
            ImageInputError (a ValueError): an image cannot be read or is too large.
            ValueError: the number of ``<image>`` placeholders differs from the number of images,
                the text is empty, or a token id is outside the vocabulary.
        """
        p = as_multimodal_prompt(prompt)
        if isinstance(p.text, str):
            # (as a text prompt runs: one BOS where the text writes its own)
            ids = without_added_bos(self.tokenizer, p.text, encode_text(self.tokenizer, p.text))
        elif isinstance(p.text, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                       for t in p.text):
            ids = [int(t) for t in p.text]  # numpy integers too, as a text-only prompt's ids
        else:
            raise TypeError(f"a multimodal prompt's text is a string or token ids, got {type(p.text).__name__}")
        bad, shown = outside_vocabulary(ids, self.vocab_size)  # (as the engine checks a plain prompt's)
        if bad:
            raise ValueError(f"prompt token ids [{shown}] are outside the vocabulary [0, {self.vocab_size})")
        where = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(where) != len(p.images):
            raise ValueError(
                f"the prompt has {placeholders(len(where), self.image_token)} but {counted(len(p.images), 'image')} "
                f"{'was' if len(p.images) == 1 else 'were'} given; put one {self.image_token} in the text where "
                "each image goes, in order"
            )
        images = [load_image(src, max_bytes=self.max_image_bytes) for src in p.images]
        pixels = self._pixel_values(images)  # (pixel_values, image_size, tokens) per image
        out_ids: list[int] = []
        key: list[Any] = []
        slots: list[ImageSlot] = []
        prev = 0
        for pos, img, (pv, size, n) in zip(where, images, pixels):
            out_ids += ids[prev:pos]
            key += ids[prev:pos]
            slots.append(ImageSlot(len(out_ids), n, img.hash, pv, size))
            out_ids += [self.image_token_id] * n
            key += [(img.hash, i) for i in range(n)]
            prev = pos + 1
        out_ids += ids[prev:]
        key += ids[prev:]
        if not out_ids:
            raise ValueError("empty prompt: give at least one token")
        return MultimodalTokens(out_ids, key, MultimodalInputs(tuple(slots)))

    def _pixel_values(self, images: list) -> list:
        """(pixel_values, image_size, placeholder tokens) per image, from the HF processor (cached
        by content hash); see ``ImageSlot``."""
        found: dict[str, Any] = {}
        with self._lock:
            for im in images:
                if im.hash in self._pixels:
                    self._pixels.move_to_end(im.hash)
                    found[im.hash] = self._pixels[im.hash]
        todo = list({im.hash: im for im in images if im.hash not in found}.values())
        if todo:
            found.update(zip((im.hash for im in todo), self._preprocess([im.image for im in todo])))
            with self._lock:
                for im in todo:
                    self._pixels[im.hash] = found[im.hash]
                while len(self._pixels) > _PIXEL_CACHE_SIZE:
                    self._pixels.popitem(last=False)
        return [found[im.hash] for im in images]


    def _preprocess(self, images: list) -> list:
        if self.anyres:  # one call per image: the HF processor says how many tokens its tiles make
            from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

            out = []
            for image in images:
                feat = self.hf_processor(text=self.image_token, images=[image], return_tensors="pt")
                n = int((feat["input_ids"] == self.image_token_id).sum())
                size = tuple(int(x) for x in feat["image_sizes"][0])
                tiles = image_size_to_num_patches(size, self.grid_pinpoints, self.image_size)  # drop batch padding
                out.append((feat["pixel_values"][0][:tiles].float(), size, n))
            pv = out[0][0]
        else:
            pv = self.image_processor(images=images, return_tensors="pt")["pixel_values"].float()
            out = [(p, None, self.tokens_per_image) for p in pv]
        if tuple(pv.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"the image processor gives {tuple(pv.shape[-2:])} pixels but the vision tower takes "
                f"{self.image_size}x{self.image_size}; the checkpoint's processor config does not fit it"
            )
        return out


def _load_image_processor(path: Any) -> Any:
    """The checkpoint's HF image processor. Raises ``ImageProcessorUnavailable`` when it has none,
    ``ImportError`` when this transformers cannot build one without torchvision."""
    import transformers

    try:
        return _load_processor(path, "AutoImageProcessor")
    except ImportError as e:
        # transformers 5.17 (at least) makes AutoImageProcessor require torchvision even where the
        # model has a PIL image processor; AutoProcessor still builds the PIL one.
        why = _first_sentence(str(e))
    try:
        processor = _load_processor(path, "AutoProcessor")  # ImageProcessorUnavailable when the checkpoint has none
    except ImportError:
        raise ImportError(
            f"transformers {transformers.__version__} cannot build the image processor of {path} without "
            f"torchvision ({why}); pip install torchvision, or upgrade transformers"
        ) from None
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:  # a processor without an image part (a bare tokenizer, say)
        raise ImageProcessorUnavailable(f"{path} has no image processor config (preprocessor_config.json / "
                         "processor_config.json); save the model's processor there")
    return image_processor


def _first_sentence(text: str) -> str:
    return text.strip().split(". ")[0].split("\n")[0]


def _load_processor(path: Any, kind: str) -> Any:
    """The checkpoint's HF ``AutoImageProcessor`` or ``AutoProcessor``. Raises
    ``ImageProcessorUnavailable`` when it has none."""
    import transformers

    if path is None:
        raise ImageProcessorUnavailable("a vision-language model needs its checkpoint directory (for the image processor)")
    # transformers warns when it falls back from the torchvision processor to the PIL one: both
    # give the same pixels, so the warning is noise here.
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return getattr(transformers, kind).from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ImageProcessorUnavailable(
            f"{path} has no usable image processor config (preprocessor_config.json / processor_config.json): "
            f"{type(e).__name__}: {_first_sentence(str(e))}; save the model's processor there"
        ) from None
    finally:
        logger.setLevel(level)
