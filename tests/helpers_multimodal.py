"""Inputs for the multimodal tests (random images and a short video, written here), the programs
that ask about them, and transformers' LLaVA answers to compare with."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

import lmnb as sgl


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


@sgl.function
def ask_image(s, img, question):
    s += sgl.user(sgl.image(img) + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))


@sgl.function
def ask_video(s, path, question, frames=4):
    s += sgl.user(sgl.video(path, frames) + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))


# -- transformers' LLaVA as the reference (``hf``: (LlavaForConditionalGeneration, AutoProcessor))


def hf_answer(hf, prompt_text: str, images) -> str:
    """transformers' greedy 6-token answer to ``prompt_text`` with ``images``, as text of whole
    characters: a character the sixth token cuts is left out, as the engine's detokenizer leaves it
    (``utf8_whole_characters``; ``tokenizer.decode`` would end it in U+FFFD)."""
    import torch

    from tests.helpers_engine import utf8_whole_characters

    model, proc = hf
    inputs = proc(text=prompt_text, images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    special = set(proc.tokenizer.all_special_ids)
    return utf8_whole_characters(proc.tokenizer, [t for t in out.tolist() if t not in special])


def prompt_before_answer(st) -> str:
    """The rendered prompt the answer was generated from (the text up to the assistant's turn)."""
    head, sep, _ = st.text().rpartition("<|assistant|>")
    return head + sep


def image_start(hf, prompt_text: str, images) -> int:
    """Prompt position of the first image token, as LlavaProcessor lays the prompt out."""
    model, proc = hf
    ids = proc(text=prompt_text, images=images, return_tensors="pt")["input_ids"][0].tolist()
    return ids.index(model.config.image_token_id)


def image_end(hf, prompt_text: str, images) -> int:
    """Prompt position after the last image token, as LlavaProcessor lays the prompt out."""
    model, proc = hf
    ids = proc(text=prompt_text, images=images, return_tensors="pt")["input_ids"][0].tolist()
    return max(i for i, t in enumerate(ids) if t == model.config.image_token_id) + 1
