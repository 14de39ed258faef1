"""``image``/``video`` in programs on the in-process engine (tiny random LLaVA): answers equal
transformers' LLaVA on the rendered prompt, and a second question reuses the image/frame KV."""

from __future__ import annotations

import pytest
import torch

import lmnb as sgl
from lmnb.executor import ProgramError
from tests.helpers_multimodal import (
    ask_image,
    ask_video,
    hf_answer,
    image_end,
    image_start,
    prompt_before_answer,
    random_image,
    write_video,
)


@pytest.fixture(scope="module")
def backend(llava_ckpt):
    b = sgl.Engine(str(llava_ckpt), device="cpu", max_total_tokens=4096)
    yield b
    b.shutdown()


@pytest.fixture(scope="module")
def hf(llava_hf):
    return llava_hf


def test_image_program_matches_transformers_and_reuses_the_image(backend, hf):
    img = random_image(5)
    st = ask_image.run(img=img, question="what is in the picture?", backend=backend)
    prompt = prompt_before_answer(st)
    assert st["answer"] == hf_answer(hf, prompt, [img])
    st2 = ask_image.run(img=img, question="is it a cat?", backend=backend)
    assert st2.get_meta_info("answer")["cached_tokens"] >= image_end(hf, prompt, [img])


def test_video_program_runs_and_reuses_cached_frames(backend, hf, tmp_path):
    from lmnb_engine.multimodal import sample_video_frames

    path = tmp_path / "clip.mp4"
    write_video(path, num_frames=8)
    st = ask_video.run(path=str(path), question="what happens?", backend=backend)
    frames = sample_video_frames(str(path), 4)
    assert len(frames) == 4
    text = prompt_before_answer(st)
    assert text.count("<image>") == 1  # the program text holds one placeholder per video...
    prompt = text.replace("<image>", "<image>" * 4)  # ...the model sees one image per frame
    assert st.get_meta_info("answer")["cached_tokens"] <= image_start(hf, prompt, frames)  # frames are new
    assert st["answer"] == hf_answer(hf, prompt, frames)
    cache = backend.engine.loaded.model.encoder_cache
    misses = cache.misses
    st2 = ask_video.run(path=str(path), question="who is there?", backend=backend)
    assert st2.get_meta_info("answer")["cached_tokens"] >= image_end(hf, prompt, frames)
    assert cache.misses == misses  # no frame went through the vision tower again


def test_image_needs_a_backend_that_sends_images():
    class TextOnly(sgl.backend.base.BaseBackend):
        def get_chat_template(self):
            from lmnb.chat_template import get_chat_template

            return get_chat_template("default")

    st = ask_image.run(img=random_image(1), question="q", backend=TextOnly())
    with pytest.raises(ProgramError, match="multimodal .* model; TextOnly does not"):
        st.sync()


def test_an_image_a_text_only_backend_refuses_is_named_without_a_memory_address():
    """A PIL image was named by its default repr, "Image(<PIL.Image.Image image mode=RGB size=8x8
    at 0x7F63B49DABD0>) failed: ...": an address that differs on every run and says nothing. A source
    is named by its repr without the address, on one line, cut to 60 characters with "…"."""
    from PIL import Image

    class TextOnly(sgl.backend.base.BaseBackend):
        def get_chat_template(self):
            from lmnb.chat_template import get_chat_template

            return get_chat_template("default")

    st = images_alone.run(img=Image.new("RGB", (8, 8)), backend=TextOnly())
    assert str(st.error()).startswith("Image(<PIL.Image.Image image mode=RGB size=8x8>) failed: "), st.error()
    assert repr(sgl.image(b"\x00" * 20)) == "Image(b'" + "\\x00" * 14 + "\\…)"  # 59 characters of its repr, then "…"
    assert repr(sgl.video("clip.mp4", 2)) == "Video('clip.mp4', 2)"


@sgl.function
def images_alone(s, img):
    s += sgl.user(sgl.image(img) + "q")


@pytest.mark.parametrize("source, message", [
    ("no-such-photo.png", "no image file at 'no-such-photo.png'; check the path"),
    (42, "an image must be a file path, a PIL image, bytes or a base64 data URL; got int"),
    ("data:text/plain;base64,aGk=", "data URL 'data:text/plain;base64,aGk='... is not of the form"),
])
def test_an_image_that_cannot_be_read_fails_its_image_not_the_next_gen(backend, source, message):
    """A missing file failed the gen after it ("Gen('answer') failed: ... no image file"), so a cell
    pointed at the gen's hole, and a program that only added the image (a state the next cell
    asks about) did not fail at all."""
    st = ask_image.run(img=source, question="q", backend=backend)
    with pytest.raises(ProgramError) as e:
        st.sync()
    assert isinstance(e.value.primitive, sgl.ir.Image) and e.value.primitive.source == source
    assert message in str(e.value)
    alone = images_alone.run(img=source, backend=backend)
    assert isinstance(alone.error(), ProgramError) and isinstance(alone.error().primitive, sgl.ir.Image)


def test_a_video_that_cannot_be_read_fails_its_video_not_the_next_gen(backend, tmp_path):
    path = tmp_path / "none.mp4"
    st = ask_video.run(path=str(path), question="q", backend=backend)
    with pytest.raises(ProgramError, match=f"no video file at '{path}'") as e:
        st.sync()
    assert isinstance(e.value.primitive, sgl.ir.Video)


@sgl.function
def two_pictures_forked(s, a, b):
    s += sgl.user_begin()
    forks = s.fork(2)
    for f, img in zip(forks, [a, b]):
        f += sgl.image(img) + "\n"
    forks.join("concate_and_append")
    s += "Are they the same?"
    s += sgl.user_end()
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))


@sgl.function
def two_pictures(s, a, b):
    s += sgl.user(sgl.image(a) + "\n" + sgl.image(b) + "\nAre they the same?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))


def test_images_added_in_fork_branches_are_carried_back_by_concat_join(backend):
    a, b = random_image(11), random_image(12)
    joined = two_pictures_forked.run(a=a, b=b, backend=backend)
    joined.sync()
    straight = two_pictures.run(a=a, b=b, backend=backend)
    assert joined.text() == straight.text()
    assert joined["answer"] == straight["answer"]
    # the joined state sent both images, in branch order: the straight program found them all cached
    swapped = two_pictures.run(a=b, b=a, backend=backend)
    assert straight.get_meta_info("answer")["cached_tokens"] > swapped.get_meta_info("answer")["cached_tokens"]


@sgl.function
def one_picture_two_answers(s, img):
    s += sgl.user(sgl.image(img) + "what is it?")
    forks = s.fork(2)
    for f in forks:
        f += sgl.assistant(sgl.gen("a", max_tokens=3, temperature=0))
    forks.join()


def test_a_fork_after_an_image_prefills_the_image_once_for_every_branch(backend, hf):
    img = random_image(13)
    st = one_picture_two_answers.run(img=img, backend=backend)
    end = image_end(hf, st.text(), [img])  # the state's text is the prefix the branches share
    assert [m["cached_tokens"] >= end for m in st.get_meta_info("a")] == [True, True]


@sgl.function
def pick_after_image(s, img, choices, method):
    s += sgl.user(sgl.image(img) + "what colour is it?")
    s += sgl.assistant_begin()
    s += "It is" + sgl.select("c", choices=choices, choices_method=method)


def _hf_choice_scores(hf, prompt: str, choice: str, images) -> tuple[int, list[float]]:
    """(first position where tokens(prompt + choice) departs from tokens(prompt), the choice's
    token logprobs from there), from transformers' LLaVA on the same pixels."""
    model, proc = hf
    p = proc(text=prompt, images=images, return_tensors="pt")["input_ids"][0].tolist()
    inputs = proc(text=prompt + choice, images=images, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    d = next((i for i, (a, b) in enumerate(zip(p, ids)) if a != b), min(len(p), len(ids)))
    with torch.no_grad():
        logp = torch.log_softmax(model(**inputs).logits[0].float(), dim=-1)
    return d, [logp[j - 1, ids[j]].item() for j in range(d, len(ids))]


def test_select_after_an_image_scores_the_choices_like_transformers(backend, hf):
    """It raised NotImplementedError; each choice is scored after the image's tokens, and the
    image's KV is prefilled once for all choices."""
    img = random_image(21)
    choices = [" red", " a deep blue", " green"]
    st = pick_after_image.run(img=img, choices=choices, method=sgl.token_length_normalized, backend=backend)
    prompt = st.text()[: -len(st["c"])]
    expected = [_hf_choice_scores(hf, prompt, c, [img]) for c in choices]
    meta = st.get_meta_info("c")
    for (d, want), got, start in zip(expected, meta["input_token_logprobs"], meta["prefix_len"]):
        assert start == d
        assert [x[0] for x in got] == pytest.approx(want, abs=1e-4)
    means = [sum(v) / len(v) for _, v in expected]
    assert st["c"] == choices[max(range(len(choices)), key=lambda i: means[i])]
    assert min(meta["cached_tokens"]) >= image_end(hf, prompt, [img])  # no choice prefilled the image again

    model, proc = hf  # unconditional likelihood: the choice tokens again after "Answer:" alone, no image
    ctx = proc.tokenizer("Answer:").input_ids
    gains = []
    for c, (d, cond) in zip(choices, expected):
        scored = proc(text=prompt + c, images=[img], return_tensors="pt")["input_ids"][0].tolist()[d:]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ctx + scored])).logits[0].float(), dim=-1)
        unc = [logp[len(ctx) + j - 1, t].item() for j, t in enumerate(scored)]
        gains.append(sum(a - b for a, b in zip(cond, unc)) / len(cond))
    st = pick_after_image.run(img=img, choices=choices, method=sgl.unconditional_likelihood_normalized, backend=backend)
    assert st["c"] == choices[max(range(len(choices)), key=lambda i: gains[i])]


def test_select_after_an_image_refuses_a_choice_holding_the_placeholder(backend):
    st = pick_after_image.run(img=random_image(22), choices=[" red", " <image>"], method=sgl.token_length_normalized,
                              backend=backend)
    with pytest.raises(ProgramError, match="holds the image placeholder"):
        st.sync()


@sgl.function
def two_questions_on_a_video(s, path):
    s += sgl.user(sgl.video(path, 3) + "what happens?")
    s += sgl.assistant(sgl.gen("a", max_tokens=2, temperature=0))
    s += sgl.user("and then?")
    s += sgl.assistant(sgl.gen("b", max_tokens=2, temperature=0))


def test_a_video_is_decoded_once_for_all_requests_of_its_program(backend, tmp_path, monkeypatch):
    # every request sends all the program's inputs; the video was decoded again for each of them
    import os

    import lmnb_engine.multimodal as mm

    decoded = []
    real = mm.sample_video_frames
    monkeypatch.setattr(mm, "sample_video_frames", lambda *a, **k: decoded.append(a) or real(*a, **k))
    path = tmp_path / "clip.mp4"
    write_video(path, num_frames=6)
    st = two_questions_on_a_video.run(path=str(path), backend=backend)
    st.sync()
    assert len(decoded) == 1
    write_video(path, num_frames=5)  # the file changed: its frames are read again
    os.utime(path, ns=(1, 1))
    two_questions_on_a_video.run(path=str(path), backend=backend).sync()
    assert len(decoded) == 2
    monkeypatch.setenv("HOME", str(tmp_path))  # a path from the home directory: it was decoded per request
    write_video(path, num_frames=4)
    two_questions_on_a_video.run(path="~/clip.mp4", backend=backend).sync()
    assert len(decoded) == 3


@pytest.mark.parametrize("name", ["chatml-llava", "llama-3-instruct-llava", "vicuna_v1.1"])
def test_sglang_llava_template_places_the_image_as_transformers_does_on_its_text(backend, hf, name):
    # SGLang's LLaVA templates write the image as "<image>\n" (vicuna: " <image>\n"); the engine must
    # read that text as LlavaProcessor does: the image's tokens, then the newline.
    shared = sgl.Engine(engine=backend.engine, chat_template_name=name)
    img = random_image(7)
    st = ask_image.run(img=img, question="what is it?", backend=shared)
    _, assistant_suffix = shared.chat_template.role_prefix_and_suffix["assistant"]
    prompt = st.text()[: len(st.text()) - len(st["answer"] + assistant_suffix)]
    assert shared.chat_template.image_token + "what is it?" in prompt
    assert st["answer"] == hf_answer(hf, prompt, [img])
