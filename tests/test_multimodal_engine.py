"""LLaVA on the engine: greedy parity with transformers, image-hash radix keys, bad input.

References are transformers' ``LlavaForConditionalGeneration`` and ``LlavaProcessor`` on the same
tiny random-weight checkpoint (built here), and a cold engine for the first-token distribution.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from lmnb_engine import SamplingParams
from lmnb_engine.engine import Engine
from lmnb_engine.multimodal import ImageInputError, MultimodalPrompt

Q1 = "<|user|><image>\nwhat color is the cat?<|end|>\n<|assistant|>"
Q2 = "<|user|><image>\nhow many birds are in the tree?<|end|>\n<|assistant|>"


@pytest.fixture(scope="module")
def engine(llava_ckpt):
    eng = Engine(str(llava_ckpt), device="cpu", max_total_tokens=4096)
    yield eng
    eng.scheduler.stop()


@pytest.fixture(scope="module")
def hf(llava_hf):
    return llava_hf


def _image(seed: int, size=(37, 23)) -> Image.Image:
    """A random RGB image; non-square so LLaVA-1.5's pad-to-square matters."""
    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _image_span(hf, text: str, img) -> tuple[int, int]:
    """(first, end) prompt positions of the image tokens, as LlavaProcessor lays them out."""
    model, proc = hf
    ids = proc(text=text, images=img, return_tensors="pt")["input_ids"][0].tolist()
    where = [i for i, t in enumerate(ids) if t == model.config.image_token_id]
    assert where == list(range(where[0], where[-1] + 1))
    return where[0], where[-1] + 1


def _greedy(max_new_tokens=8, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0, **kw)


@pytest.mark.parametrize("seed", [1, 2])
def test_greedy_matches_transformers(engine, hf, seed):
    model, proc = hf
    img = _image(seed)
    inputs = proc(text=Q1, images=img, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=10, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    ref = ref[: ref.index(eos)] if eos in ref else ref
    out = engine.generate(MultimodalPrompt(Q1, [img]), _greedy(10))
    assert out.token_ids == ref
    assert out.meta.prompt_tokens == inputs["input_ids"].shape[1]


def test_same_image_any_source_hits_the_cache(engine, hf, tmp_path):
    engine.flush_cache()
    img = _image(7)
    path = tmp_path / "img.png"
    path.write_bytes(_png(img))
    data_url = "data:image/png;base64," + base64.b64encode(_png(img)).decode()
    _, end = _image_span(hf, Q1, img)
    first = engine.generate(MultimodalPrompt(Q1, [str(path)]), _greedy(4))
    assert first.meta.cached_tokens == 0
    for source in (img, _png(img), data_url, path):
        again = engine.generate({"text": Q2, "images": [source]}, _greedy(4))
        assert again.meta.cached_tokens >= end, source if not isinstance(source, bytes) else "bytes"


def test_one_pixel_changed_is_a_different_image(engine, hf, llava_ckpt):
    engine.flush_cache()
    img = _image(11)
    other = img.copy()
    other.putpixel((5, 5), tuple(255 - c for c in img.getpixel((5, 5))))
    start, _ = _image_span(hf, Q1, img)
    params = _greedy(1, return_logprob=True, top_logprobs_num=20)
    engine.generate(MultimodalPrompt(Q1, [img]), params)
    warm = engine.generate(MultimodalPrompt(Q1, [other]), params)
    assert warm.meta.cached_tokens <= start
    cold_engine = Engine(str(llava_ckpt), device="cpu", max_total_tokens=1024)
    try:
        cold = cold_engine.generate(MultimodalPrompt(Q1, [other]), params)
    finally:
        cold_engine.scheduler.stop()
    assert warm.logprobs[0].token_id == cold.logprobs[0].token_id
    w, c = dict(warm.logprobs[0].top), dict(cold.logprobs[0].top)
    assert w.keys() == c.keys()
    for t in w:
        assert w[t] == pytest.approx(c[t], abs=1e-5)


def test_two_images_in_one_prompt_match_transformers(engine, hf):
    model, proc = hf
    text = "<|user|><image> and <image>\nsame?<|end|>\n<|assistant|>"
    imgs = [_image(3), _image(4, size=(19, 40))]
    inputs = proc(text=text, images=imgs, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    ref = ref[: ref.index(eos)] if eos in ref else ref
    assert engine.generate(MultimodalPrompt(text, imgs), _greedy(6)).token_ids == ref


def test_a_transparent_image_matches_transformers(engine, hf):
    """The engine composites transparency onto white, as transformers 5.25's convert_to_rgb does;
    5.17's drops the alpha band. transformers is given the composite, worked out here (round half
    up of c * a / 255 + 255 * (1 - a / 255)), so the reference is the same on every version."""
    model, proc = hf
    rgba = np.asarray(_image(5).convert("RGBA")).copy()
    rgba[..., 3] = np.random.RandomState(5).randint(0, 256, rgba.shape[:2])
    img = Image.fromarray(rgba)
    c, a = rgba[..., :3].astype(np.int64), rgba[..., 3:].astype(np.int64)
    on_white = Image.fromarray((((c * a + 255 * (255 - a)) * 2 + 255) // 510).astype(np.uint8))
    inputs = proc(text=Q1, images=on_white, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    ref = ref[: ref.index(eos)] if eos in ref else ref
    assert engine.generate(MultimodalPrompt(Q1, [img]), _greedy(8)).token_ids == ref


def test_a_prefix_with_an_image_can_be_pinned(engine, hf):
    img = _image(12)
    handle = engine.pin_prefix(MultimodalPrompt(Q1, [img]))  # it raised "'MultimodalPrompt' object is not iterable"
    try:
        assert engine.flush_cache()
        _, end = _image_span(hf, Q1, img)
        assert engine.generate(MultimodalPrompt(Q2, [img]), _greedy(2)).meta.cached_tokens >= end
    finally:
        engine.unpin(handle)


def test_score_of_a_prompt_with_an_image_matches_transformers(engine, hf):
    """``score`` keeps a prompt's images: a prepared one (``MultimodalTokens``) was read as a plain
    id list and refused for its placeholders, a ``MultimodalPrompt`` as "not iterable"."""
    model, proc = hf
    img = _image(15)
    inputs = proc(text=Q1, images=img, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(**inputs).logits[0].double(), -1)
    _, start = _image_span(hf, Q1, img)
    want = [logprobs[j - 1, ids[j]].item() for j in range(start, len(ids))]
    prepared = engine.multimodal.prepare(MultimodalPrompt(Q1, [img]))
    for prompt in (prepared, MultimodalPrompt(Q1, [img])):
        assert engine.score(prompt, start) == pytest.approx(want, abs=1e-4)


def test_one_image_may_be_given_alone(engine, tmp_path):
    img = _image(13)
    path = tmp_path / "one.png"
    path.write_bytes(_png(img))
    want = engine.generate(MultimodalPrompt(Q1, [img]), _greedy(4)).token_ids
    # a path was taken for one image per character ("1 placeholders but 24 images were given"),
    # a PIL image failed with "object of type 'Image' has no len()"
    for source in (str(path), path, _png(img), img):
        assert engine.generate(MultimodalPrompt(Q1, source), _greedy(4)).token_ids == want
        assert engine.generate({"text": Q1, "images": source}, _greedy(4)).token_ids == want


def test_token_ids_from_numpy_are_a_prompt_with_images(engine):
    img = _image(14)
    want = engine.generate(MultimodalPrompt(Q1, [img]), _greedy(4)).token_ids
    ids = list(np.array(engine.encode(Q1)))  # numpy integers, as a text-only prompt may hold
    # it was "a multimodal prompt's text is a string or token ids, got list"
    assert engine.generate(MultimodalPrompt(ids, [img]), _greedy(4)).token_ids == want


def test_bad_image_input_is_a_clear_error(engine, tmp_path):
    cases = [
        (MultimodalPrompt(Q1, [str(tmp_path / "missing.png")]), "no image file"),
        (MultimodalPrompt(Q1, [b"not an image at all"]), "not a readable image"),
        (MultimodalPrompt(Q1, ["data:image/png;base64,@@@"]), "not valid base64"),
        (MultimodalPrompt(Q1, ["https://example.com/cat.png"]), "not fetched"),
        (MultimodalPrompt(Q1, [42]), "must be a file path"),
        ({"text": Q1, "image_data": [_image(1)]}, r"keys 'text' and 'images'; got \['image_data', 'text'\]"),
        (MultimodalPrompt(Q1, []), "1 '<image>' placeholder but 0 images were given"),
        # a plain prompt holding the placeholder: the model read its embedding as an image
        (Q1, "1 '<image>' placeholder but no images were given"),
        (engine.encode(Q1 + Q1), "2 '<image>' placeholders but no images"),
        (MultimodalPrompt("<|user|>no image here", [_image(1)]), "0 '<image>' placeholders but 1 image was given"),
        (MultimodalPrompt(Q1 + Q1, [_image(1)]), "2 '<image>' placeholders but 1 image was given"),
        # the tokenizer's "TextEncodeInput must be Union[...]" (a TypeError)
        (MultimodalPrompt(Q1 + "\ud800", [_image(1)]), f"holds the lone surrogate '\\\\ud800' at position {len(Q1)}"),
    ]
    for prompt, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.generate(prompt, _greedy(2))
    huge = Image.new("RGB", (10, 10))
    with pytest.raises(ImageInputError, match="over the limit"):
        from lmnb_engine.multimodal import load_image

        load_image(_png(huge), max_bytes=10)
    assert engine.generate(MultimodalPrompt(Q1, [_image(1)]), _greedy(2)).finish_reason.type != "abort"
    engine.check_invariants()


def test_a_multimodal_prompt_of_ids_past_the_vocabulary_names_them_as_a_plain_prompts_check_does(engine):
    """A multimodal prompt of token ids holding one of 5001 digits (10**5000) failed in Python's
    words ("Exceeds the limit (4300 digits) for integer string conversion") as its refusal showed
    it; it is named as a plain prompt's ids are (shown_number), with the other id past the end."""
    vocab = engine.loaded.config.vocab_size
    ids = engine.encode(Q1)
    for prompt in (MultimodalPrompt(ids + [10**5000, vocab], [_image(1)]), ids + [10**5000, vocab]):
        with pytest.raises(ValueError) as e:
            engine.generate(prompt, _greedy(2))
        assert str(e.value) == (f"prompt token ids [1.000e+5000 (an integer of 5001 digits), {vocab}] are outside the "
                                f"vocabulary [0, {vocab})")


def test_text_only_model_rejects_images(tiny_llama):
    eng = Engine(str(tiny_llama), device="cpu", max_total_tokens=512)
    try:
        with pytest.raises(ValueError, match="text-only model"):
            eng.generate(MultimodalPrompt("hello <image>", [_image(1)]), _greedy(2))
        # no image at all is a plain prompt, as SGLang takes image_data=[]: it was refused as images
        plain = eng.generate("hello there", _greedy(3))
        for prompt in (MultimodalPrompt("hello there", []), {"text": "hello there", "images": []},
                       {"text": eng.encode("hello there"), "images": ()}):
            r = eng.generate(prompt, _greedy(3))
            assert (r.token_ids, r.text, r.meta.prompt_tokens) == (plain.token_ids, plain.text, plain.meta.prompt_tokens)
        with pytest.raises(ValueError, match="empty prompt"):  # and the text is checked as a plain one
            eng.generate({"text": "", "images": []}, _greedy(3))
    finally:
        eng.scheduler.stop()


def test_openai_chat_endpoint_takes_image_parts(engine, hf, tmp_path):
    from fastapi.testclient import TestClient

    from lmnb_engine.http_server import create_app

    model, proc = hf
    img = _image(21)
    url = "data:image/png;base64," + base64.b64encode(_png(img)).decode()

    def ask(question, image_url=url):
        parts = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": question}]
        return client.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": parts}], "max_tokens": 8, "temperature": 0,
        })

    engine.flush_cache()
    with TestClient(create_app(engine)) as client:
        first = ask("\nwhat is it?")
        assert first.status_code == 200, first.text
        text = engine.apply_chat_template([{"role": "user", "content": "<image>\nwhat is it?"}])
        inputs = proc(text=text, images=img, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        assert first.json()["choices"][0]["message"]["content"] == proc.tokenizer.decode(out, skip_special_tokens=True)
        ids = inputs["input_ids"][0].tolist()
        image_end = max(i for i, t in enumerate(ids) if t == model.config.image_token_id) + 1
        second = ask("\nis it a dog?")
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= image_end
        bad = ask("\nq", image_url="data:image/png;base64,AAAA")
        assert bad.status_code == 400 and "not a readable image" in bad.json()["error"]["message"]
        # a path is not read from the server's disk (its answer would tell whether the file exists)
        path = tmp_path / "cat.png"
        path.write_bytes(_png(img))
        for local in (str(path), f"file://{path}", "/etc/passwd", "/no/such/file.png"):
            refused = ask("\nq", image_url=local)
            assert refused.status_code == 400 and "must be a data: URL" in refused.json()["error"]["message"]
        # the image token written as text: the error named MultimodalPrompt, lmnb's image() and /generate's image_data
        for content in ("what is an <image> tag?", [{"type": "image_url", "image_url": {"url": url}},
                                                     {"type": "text", "text": "an <image> tag?"}]):
            refused = client.post("/v1/chat/completions", json={
                "model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 2})
            error = refused.json()["error"]
            assert refused.status_code == 400 and error["param"] == "messages"
            assert error["message"].startswith('the messages\' text holds the image token "<image>" 1 time(s)')


def test_chunked_prefill_splitting_an_image_matches_transformers(llava_ckpt, hf):
    """Chunks of 7 tokens cut the 16 image tokens in three places: each chunk takes its slice."""
    img = _image(9)
    ref = _hf_greedy(hf, Q1, [img], 6)
    eng = Engine(str(llava_ckpt), device="cpu", max_total_tokens=1024, chunked_prefill_size=7)
    try:
        assert eng.generate(MultimodalPrompt(Q1, [img]), _greedy(6)).token_ids == ref
    finally:
        eng.scheduler.stop()


def _hf_greedy(hf, text, images, max_new_tokens):
    model, proc = hf
    if images:
        inputs = proc(text=text, images=images, return_tensors="pt")
    else:
        inputs = proc.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    ref = out[0, inputs["input_ids"].shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    return ref[: ref.index(eos)] if eos in ref else ref


def test_a_batch_mixing_images_and_text_matches_transformers(engine, hf):
    """Several rows in one forward: each row's image features land on its own placeholders."""
    engine.flush_cache()
    cases = [(Q1, [_image(31)]), ("<|user|>just text, no picture<|end|>\n<|assistant|>", []),
             (Q2, [_image(32, size=(50, 12))]), (Q1, [_image(31)])]
    prompts = [MultimodalPrompt(t, imgs) if imgs else t for t, imgs in cases]
    outs = engine.generate(prompts, _greedy(6))
    for (text, imgs), out in zip(cases, outs):
        assert out.token_ids == _hf_greedy(hf, text, imgs, 6)


def test_qwen2_language_model(tmp_path_factory):
    import transformers

    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    path = make_tiny_llava_checkpoint(tmp_path_factory.mktemp("llava-qwen2"), text_arch="qwen2", seed=3)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ref_hf = (model, transformers.AutoProcessor.from_pretrained(str(path)))
    img = _image(41)
    eng = Engine(str(path), device="cpu", max_total_tokens=1024)
    try:
        assert eng.generate(MultimodalPrompt(Q1, [img]), _greedy(8)).token_ids == _hf_greedy(ref_hf, Q1, [img], 8)
    finally:
        eng.scheduler.stop()


def test_a_siglip_vision_tower_matches_transformers(tmp_path_factory):
    import transformers

    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    # SigLIP has no CLS feature: an image is (28 // 7)**2 = 16 tokens with the "full" strategy (it was
    # 17, one more placeholder than the tower's features, and the forward failed)
    path = make_tiny_llava_checkpoint(tmp_path_factory.mktemp("llava-siglip"), text_arch="qwen2", siglip=True)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ref_hf = (model, transformers.AutoProcessor.from_pretrained(str(path)))
    img = _image(42)
    eng = Engine(str(path), device="cpu", max_total_tokens=1024)
    try:
        assert eng.multimodal.prepare(MultimodalPrompt("<image>", [img])).mm_inputs.images[0].length == 16
        assert eng.generate(MultimodalPrompt(Q1, [img]), _greedy(8)).token_ids == _hf_greedy(ref_hf, Q1, [img], 8)
    finally:
        eng.scheduler.stop()


def test_llava_next_anyres_tiling_matches_transformers(tmp_path_factory):
    """Wide, tall and square images pick different tile grids (and so token counts)."""
    import transformers

    from lmnb_engine.testing.tiny_llava import make_tiny_llava_checkpoint

    path = make_tiny_llava_checkpoint(tmp_path_factory.mktemp("llava-next"), anyres=True, seed=5)
    model = transformers.LlavaNextForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ref_hf = (model, transformers.AutoProcessor.from_pretrained(str(path)))
    eng = Engine(str(path), device="cpu", max_total_tokens=2048)
    try:
        lengths = set()
        for i, size in enumerate([(37, 23), (20, 60), (28, 28), (90, 30)]):
            img = _image(50 + i, size=size)
            out = eng.generate(MultimodalPrompt(Q1, [img]), _greedy(8))
            assert out.token_ids == _hf_greedy(ref_hf, Q1, [img], 8)
            lengths.add(out.meta.prompt_tokens)
        assert len(lengths) > 1  # the tilings differ
        again = eng.generate(MultimodalPrompt(Q2, [img]), _greedy(2))
        assert again.meta.cached_tokens >= _image_span(ref_hf, Q2, img)[1]
    finally:
        eng.scheduler.stop()


def test_an_image_processor_that_needs_torchvision_falls_back_to_the_pil_one(llava_ckpt, hf, monkeypatch):
    """transformers 5.17 without torchvision refuses AutoImageProcessor outright (ImportError) while
    AutoProcessor builds the PIL image processor; the engine takes that one and still matches."""
    import transformers

    class NeedsTorchvision:  # what transformers 5.17 puts in transformers' namespace without torchvision
        @classmethod
        def from_pretrained(cls, *args, **kw):
            raise ImportError("AutoImageProcessor requires the Torchvision library but it was not found")

    monkeypatch.setattr(transformers, "AutoImageProcessor", NeedsTorchvision)
    img = _image(3)
    ref = _hf_greedy(hf, Q1, [img], 6)
    with Engine(str(llava_ckpt), device="cpu", max_total_tokens=1024) as eng:
        assert eng.generate(MultimodalPrompt(Q1, [img]), _greedy(6)).token_ids == ref
    # and with no image processor to be had at all, one error that names the fix
    monkeypatch.setattr(transformers, "AutoProcessor", NeedsTorchvision)
    with Engine(str(llava_ckpt), device="cpu", max_total_tokens=1024) as eng:
        with pytest.raises(ImportError, match="without torchvision .*pip install torchvision, or upgrade transformers"):
            eng.generate(MultimodalPrompt(Q1, [img]), _greedy(6))
        assert eng.generate("plain text still works", _greedy(2)).finish_reason.type != "abort"


def test_nonfinite_image_features_are_not_kept_and_flush_clears_the_features(engine, hf):
    """A projector that yields NaN fails the image's requests; once it is fine again the same
    image works at once (its NaN features were not cached). flush_cache empties the feature cache."""
    img = _image(11)
    bias = engine.runner.model.multi_modal_projector.linear_2.bias
    saved = bias.detach().clone()
    engine.flush_cache()
    try:
        with torch.no_grad():
            bias[0] = float("nan")
        r = engine.generate(MultimodalPrompt(Q1, [img]), _greedy(4))
        assert r.finish_reason.type == "abort" and "NaN or infinite" in r.finish_reason.message
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    assert engine.generate(MultimodalPrompt(Q1, [img]), _greedy(4)).token_ids == _hf_greedy(hf, Q1, [img], 4)
    assert len(engine.runner.model.encoder_cache) > 0
    assert engine.flush_cache() and len(engine.runner.model.encoder_cache) == 0
