"""[issue 10] Images through servers: ``RuntimeEndpoint`` and ``lmnb.OpenAI`` send ``image()``/
``video()`` to ``lmnb serve`` (``/generate``'s ``image_data``, ``/v1/chat/completions``'
``image_url`` parts), and the answers equal transformers' LLaVA and the in-process engine."""

from __future__ import annotations

import base64
import io

import httpx
import pytest

import lmnb as sgl
from lmnb.backend.base import BackendCannotRun
from lmnb.executor import ProgramError
from tests.helpers_lang import live_server, serve_http
from tests.helpers_multimodal import (
    ask_image,
    ask_video,
    hf_answer,
    image_end,
    image_start,
    png_bytes,
    prompt_before_answer,
    random_image,
    write_video,
)


@pytest.fixture(scope="module")
def hf(llava_hf):
    return llava_hf


@pytest.fixture(scope="module")
def served(llava_ckpt):
    """(in-process backend, its engine, the URL of ``lmnb serve`` on a second engine)."""
    from lmnb_engine import Engine

    local = Engine(model=str(llava_ckpt), device="cpu", max_total_tokens=4096)
    remote = Engine(model=str(llava_ckpt), device="cpu", max_total_tokens=4096)
    with live_server(remote, served_model_name="llava") as url:
        yield sgl.Engine(engine=local), local, url
    local.shutdown()
    remote.shutdown()


@sgl.function
def pick_after_image(s, img):
    s += sgl.user(sgl.image(img) + "what colour is it?")
    s += sgl.assistant_begin()
    s += "It is" + sgl.select("c", choices=[" red", " a deep blue", " green"])


@sgl.function
def one_picture_two_answers(s, img):
    s += sgl.user(sgl.image(img) + "what is it?")
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += sgl.assistant(sgl.gen("a", max_tokens=3, temperature=0.7, seed=i))
    forks.join()


def test_runtime_endpoint_sends_the_image_and_answers_like_transformers(served, hf):
    _, _, url = served
    img = random_image(31)
    remote = sgl.RuntimeEndpoint(url)
    st = ask_image.run(img=img, question="what is in the picture?", backend=remote)
    assert st["answer"] == hf_answer(hf, prompt_before_answer(st), [img])
    # the same pixels from a file: the server's radix cache keys the image by its pixels
    st2 = ask_image.run(img=img, question="is it a cat?", backend=remote)
    assert st2.get_meta_info("answer")["cached_tokens"] >= image_end(hf, prompt_before_answer(st2), [img])


def test_runtime_endpoint_video_select_and_fork_equal_the_in_process_engine(served, tmp_path):
    local, _, url = served
    remote = sgl.RuntimeEndpoint(url)
    path = tmp_path / "clip.mp4"
    write_video(path, num_frames=6)
    a = ask_video.run(path=str(path), question="what happens?", backend=local)
    b = ask_video.run(path=str(path), question="what happens?", backend=remote)
    assert (b.text(), b["answer"]) == (a.text(), a["answer"])

    img = random_image(32)
    a = pick_after_image.run(img=img, backend=local)
    b = pick_after_image.run(img=img, backend=remote)
    assert b["c"] == a["c"]
    got, want = b.get_meta_info("c"), a.get_meta_info("c")
    assert got["normalized_prompt_logprobs"] == pytest.approx(want["normalized_prompt_logprobs"], abs=1e-4)
    assert got["prefix_len"] == want["prefix_len"]

    a = one_picture_two_answers.run(img=img, backend=local)
    b = one_picture_two_answers.run(img=img, backend=remote)
    assert b["a"] == a["a"]


def test_a_jpeg_photo_goes_to_the_server_as_it_is(served, tmp_path):
    """A 4 MB JPEG (12 MB-class noisy photo) is over the server's 20 MB image limit once
    re-encoded as PNG; it is sent as its own bytes and answers like the in-process engine."""
    import numpy as np
    from PIL import Image

    local, _, url = served
    path = tmp_path / "photo.jpg"
    pixels = np.random.RandomState(7).randint(0, 256, (2400, 3000, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=75)
    assert path.stat().st_size < 20 * 2**20 < len(png_bytes(Image.open(path).convert("RGB")))
    want = ask_image.run(img=str(path), question="what is it?", backend=local)["answer"]
    for backend in (sgl.RuntimeEndpoint(url), sgl.OpenAI("llava", base_url=f"{url}/v1")):
        assert ask_image.run(img=str(path), question="what is it?", backend=backend)["answer"] == want
        # the photo as PIL.Image.open gives it: its file goes out
        assert ask_image.run(img=Image.open(path), question="what is it?", backend=backend)["answer"] == want


def test_a_phone_cameras_mpo_jpeg_goes_as_it_is():
    """Many phones write MPO (a JPEG followed by more pictures); Pillow names its format "MPO",
    which must not send a photo as PNG (over the server's limit for a large one)."""
    import io

    from PIL import Image

    from lmnb.backend.media import data_url

    buf = io.BytesIO()
    random_image(44).save(buf, format="MPO", save_all=True, append_images=[random_image(45)])
    assert data_url(buf.getvalue()) == "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    assert Image.open(buf).format == "MPO"


def test_a_remote_image_with_an_upper_case_scheme_is_fetched(monkeypatch, tmp_path):
    """URL schemes are case-insensitive: HTTP://host/x.png was read as a local path ("no image
    file"; with fetching on, FileNotFoundError in data_url)."""
    import functools
    import http.server

    from lmnb.backend.media import data_url

    (tmp_path / "x.png").write_bytes(png_bytes(random_image(46)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    monkeypatch.setenv("LMNB_ALLOW_REMOTE_MEDIA", "1")
    for proxy in ("http_proxy", "HTTP_PROXY"):  # the test server is on this machine
        monkeypatch.delenv(proxy, raising=False)
    with serve_http(handler) as base:
        url = data_url(base.replace("http://", "HTTP://") + "/x.png")
    assert url == "data:image/png;base64," + base64.b64encode(png_bytes(random_image(46))).decode()


def test_a_pil_image_is_encoded_as_png_once_for_all_requests(monkeypatch):
    """Every request of a program sends all its images; a PIL image (about a second of PNG
    encoding at photo size) is encoded once while its pixels stay the same."""
    from PIL import Image

    from lmnb.backend import media

    saves = []
    real_save = Image.Image.save
    monkeypatch.setattr(Image.Image, "save", lambda self, *a, **k: saves.append(1) or real_save(self, *a, **k))
    img = random_image(46, size=(64, 48))
    url = media.data_url(img)
    assert media.data_url(img.copy()) == url and len(saves) == 1
    img.putpixel((0, 0), (1, 2, 3))  # edited in place: new pixels, a new encoding
    edited = media.data_url(img)
    assert len(saves) == 2 and Image.open(io.BytesIO(base64.b64decode(edited.split(",", 1)[1]))).getpixel((0, 0)) == (1, 2, 3)


def test_a_pil_image_opened_from_a_file_is_checked_against_its_file_once(monkeypatch, tmp_path):
    """A PIL image opened from a JPEG goes as its file's bytes while the file holds its pixels;
    checking that decoded the file again for every request of the program."""
    import lmnb_engine.multimodal as mm
    from PIL import Image

    from lmnb.backend import media

    path = tmp_path / "photo.jpg"
    random_image(47, size=(64, 48)).save(path, format="JPEG")
    decoded = []
    real_load = mm.load_image
    monkeypatch.setattr(mm, "load_image", lambda src, *a, **k: decoded.append(type(src)) or real_load(src, *a, **k))
    img = Image.open(path)
    want = "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()
    assert media.data_url(img) == want and media.data_url(img) == want
    assert decoded.count(bytes) == 1  # the file, decoded once; (the image's own pixels are hashed per call)
    random_image(48, size=(64, 48)).save(path, format="JPEG")  # the file now holds other pixels
    assert media.data_url(img).startswith("data:image/png;base64,")  # its own pixels, as PNG
    assert decoded.count(bytes) == 2


def test_a_pil_image_too_large_as_png_is_refused_before_sending(monkeypatch):
    # the server refused it as "data URL image is over the limit", a data URL the user never wrote
    from lmnb.backend import media
    from lmnb_engine.multimodal import ImageInputError
    from lmnb_engine.multimodal import image_io

    img = random_image(47, size=(64, 48))
    png = len(png_bytes(img))
    monkeypatch.setattr(image_io, "DEFAULT_MAX_BYTES", png - 1)  # (a noise photo of 4000x3000 is ~36 MB)
    with pytest.raises(ImageInputError, match=f"the 64x48 image is {png} bytes as PNG .* resize it"):
        media.data_url(img)
    monkeypatch.setattr(image_io, "DEFAULT_MAX_BYTES", png)
    assert media.data_url(img).startswith("data:image/png;base64,")


def test_an_edited_pil_image_goes_as_its_pixels_not_its_file(served, tmp_path):
    """A PIL image opened from a file and then edited in place still names the file; the edited
    pixels are what the server gets."""
    from PIL import Image

    from lmnb.backend.media import data_url

    local, _, url = served
    path = tmp_path / "small.jpg"
    random_image(42).save(path, format="JPEG")
    img = Image.open(path)
    img.load()
    img.paste((255, 0, 0), (0, 0, 12, 12))
    assert data_url(img).startswith("data:image/png;base64,") and data_url(Image.open(path)).startswith("data:image/jpeg")
    want = ask_image.run(img=img, question="what is it?", backend=local)["answer"]
    assert want != ask_image.run(img=str(path), question="what is it?", backend=local)["answer"]
    assert ask_image.run(img=img, question="what is it?", backend=sgl.RuntimeEndpoint(url))["answer"] == want


def test_generate_reports_each_images_cache_and_runtime_endpoint_sums_a_videos_frames(served, hf, tmp_path):
    """/generate's meta_info ``images``: per image its placeholder positions and how many were
    cached; RuntimeEndpoint gives programs the in-process backend's per-input form (a video's
    frames summed), which live views mark images "new"/"cached" from."""
    local, _, url = served
    img = random_image(39)
    raw = base64.b64encode(png_bytes(img)).decode()
    text = "USER: <image>\nwhat is it? ASSISTANT:"
    body = {"text": text, "image_data": raw, "sampling_params": {"max_new_tokens": 1}}
    n = image_end(hf, text, [img]) - image_start(hf, text, [img])
    first, again = (httpx.post(f"{url}/generate", json=body, timeout=60).json()["meta_info"]["images"] for _ in range(2))
    assert [(e["tokens"], e["cached_tokens"]) for e in first] == [(n, 0)]
    assert [(e["tokens"], e["cached_tokens"]) for e in again] == [(n, n)]

    path = tmp_path / "clip.mp4"
    write_video(path, num_frames=6, size=24)  # frames no other test sends
    remote = sgl.RuntimeEndpoint(url)
    want = ask_video.run(path=str(path), question="what happens?", frames=3, backend=local).get_meta_info("answer")["images"]
    got = ask_video.run(path=str(path), question="what happens?", frames=3, backend=remote).get_meta_info("answer")["images"]
    assert got == want and got[0]["tokens"] == 3 * n and got[0]["cached_tokens"] == 0
    st = ask_video.run(path=str(path), question="who is there?", frames=3, backend=remote, stream=True)
    st.sync()
    assert st.get_meta_info("answer")["images"][0]["cached_tokens"] == 3 * n


def cell_badges(codes: list, photo) -> list:
    """The image badge class (``lmnb-media-...``) of each of ``codes``' live views, run in the
    kernel's shell on a fresh session with ``photo`` as the kernel variable ``photo``."""
    from bs4 import BeautifulSoup
    from IPython.utils.capture import capture_output

    from lmnb_kernel.session import Session
    from tests.helpers_shell import process_shell

    shell = process_shell()
    shell.extension_manager.load_extension("lmnb_kernel")
    magics = shell._lmnb_magics
    real, magics.session = magics.session, Session()
    badges = []
    try:
        shell.user_ns["photo"] = photo
        for code in codes:
            with capture_output() as out:
                assert shell.run_cell(code).success, out.stdout
            html = [o.data["text/html"] for o in out.outputs if "lmnb-run" in o.data.get("text/html", "")]
            if html:
                media = BeautifulSoup(html[-1], "html.parser").select_one(".lmnb-media .lmnb-badge")
                badges.append(next(c for c in media["class"] if c.startswith("lmnb-media-")))
    finally:
        magics.session.close()
        magics.session = real
        shell.extension_manager.unload_extension("lmnb_kernel")
    return badges


IMAGE_CELL = "%%lm --static --temperature 0\n{user}{image photo}What is it?{/user}\n{assistant}{gen a max_tokens=2}{/assistant}"


def test_a_cell_over_lmnb_serve_marks_its_image_new_then_cached(served):
    """%lm connect URL: the live view's image badge says "new", then "cached" in the next cell
    (it said "not sent yet" after the server had answered about the image)."""
    _, _, url = served
    select = '%%lm --static\n{user}{image photo}Colour?{/user}\n{assistant}{select c choices=["red", "blue"]}{/assistant}'
    codes = [f"%lm connect {url}", IMAGE_CELL, IMAGE_CELL, "photo = photo.rotate(90)", select, select]
    assert cell_badges(codes, random_image(40)) == ["lmnb-media-computed", "lmnb-media-cached"] * 2


def test_a_cell_over_an_openai_api_marks_its_image_sent(served):
    """%lm connect URL/v1 --openai: the API reports no per-image cache, so the badge says "sent"
    (it said "not sent yet" after the model had answered about the image)."""
    _, _, url = served
    assert cell_badges([f"%lm connect {url}/v1 --openai llava", IMAGE_CELL], random_image(41)) == ["lmnb-media-sent"]


def test_runtime_endpoint_refuses_a_choice_holding_the_image_token(served):
    _, _, url = served

    @sgl.function
    def bad(s):
        s += sgl.user(sgl.image(random_image(33)) + "q")
        s += sgl.select("c", choices=[" red", " <image>"])

    st = bad.run(backend=sgl.RuntimeEndpoint(url))
    with pytest.raises(ProgramError, match="holds the image placeholder"):
        st.sync()


def test_openai_chat_backend_sends_images_as_image_url_parts(served, tmp_path):
    local, _, url = served
    remote = sgl.OpenAI("llava", base_url=f"{url}/v1")
    img = random_image(34)
    a = ask_image.run(img=img, question="what is in the picture?", backend=local)
    b = ask_image.run(img=img, question="what is in the picture?", backend=remote)
    assert b["answer"] == a["answer"]
    path = tmp_path / "clip.mp4"
    write_video(path, num_frames=6)
    a = ask_video.run(path=str(path), question="what happens?", backend=local)
    b = ask_video.run(path=str(path), question="what happens?", backend=remote)
    assert b["answer"] == a["answer"]


def test_openai_completion_backend_says_images_need_a_chat_model(served):
    _, _, url = served
    st = ask_image.run(img=random_image(35), question="q", backend=sgl.OpenAI("llava", base_url=f"{url}/v1",
                                                                              is_chat_model=False))
    with pytest.raises(ProgramError, match="completions API takes no images"):
        st.sync()


def test_an_image_outside_every_role_names_the_fix_for_programs_and_cells(served):
    _, _, url = served

    @sgl.function
    def outside(s):
        s += sgl.image(random_image(43))
        s += sgl.user("what is it?")
        s += sgl.assistant(sgl.gen("a", max_tokens=2))

    st = outside.run(backend=sgl.OpenAI("llava", base_url=f"{url}/v1"))
    with pytest.raises(ProgramError, match=r"s \+= user\(image\(path\) \+ question\); in a %%lm cell \{user\}\{image"):
        st.sync()


def test_generate_reads_image_data_as_data_urls_or_bare_base64(served):
    from lmnb_engine import SamplingParams
    from lmnb_engine.multimodal import MultimodalPrompt

    _, local, url = served
    img, other = random_image(36), random_image(37)
    raw = base64.b64encode(png_bytes(img)).decode()
    text = "USER: <image>\nwhat is it? ASSISTANT:"
    want = local.generate(local.multimodal.prepare(MultimodalPrompt(text, [img])),
                          SamplingParams(max_new_tokens=5, temperature=0)).text
    sp = {"max_new_tokens": 5, "temperature": 0}
    for entry in (raw, "data:image/png;base64," + raw, [raw]):
        r = httpx.post(f"{url}/generate", json={"text": text, "image_data": entry, "sampling_params": sp}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == want
    # a batch: one entry per prompt, null for a prompt without images
    other_raw = base64.b64encode(png_bytes(other)).decode()
    want_other = local.generate(local.multimodal.prepare(MultimodalPrompt(text, [other])),
                                SamplingParams(max_new_tokens=5, temperature=0)).text
    want_plain = local.generate("what is it?", SamplingParams(max_new_tokens=5, temperature=0)).text
    r = httpx.post(f"{url}/generate", json={"text": [text, text, "what is it?"], "image_data": [raw, [other_raw], None],
                                            "sampling_params": sp}, timeout=60)
    assert [x["text"] for x in r.json()] == [want, want_other, want_plain]
    # the data: scheme, media type and ;base64 are case-insensitive (it was read as a server path: HTTP 500)
    for entry in ("DATA:image/png;base64," + raw, "Data:Image/PNG;Base64," + raw):
        r = httpx.post(f"{url}/generate", json={"text": text, "image_data": entry, "sampling_params": sp}, timeout=60)
        assert r.status_code == 200, r.text[:300]
        assert r.json()["text"] == want
    # SGLang's frontend scores a select's choices as a batch with one image_data string for all
    r = httpx.post(f"{url}/generate", json={"text": [text, text.replace("what", "which")], "image_data": raw,
                                            "sampling_params": sp}, timeout=60)
    assert r.status_code == 200, r.text
    want_which = local.generate(local.multimodal.prepare(MultimodalPrompt(text.replace("what", "which"), [img])),
                                SamplingParams(max_new_tokens=5, temperature=0)).text
    assert [x["text"] for x in r.json()] == [want, want_which]


@pytest.mark.parametrize("body,message", [
    ({"text": "<image>a", "image_data": "/etc/hostname"}, "reads no files"),
    ({"text": "<image>a", "image_data": "https://example.com/cat.png"}, "fetches no URLs"),
    ({"text": "<image>a", "image_data": base64.b64encode(b"not an image").decode()}, "not a readable image"),
    ({"text": "a", "image_data": "data:image/png;base64," + base64.b64encode(png_bytes(random_image(1))).decode()},
     "0 '<image>' placeholders but 1 image was given"),  # it read "1 images were given"
    ({"text": ["<image>a", "<image>b"], "image_data": ["x"]}, "one entry per prompt"),
    ({"text": "<image>a", "video_data": "clip.mp4"}, "frames as images in image_data"),
    # the placeholder without an image ran as a token of its own (HTTP 200)
    ({"text": "<image>a", "image_data": ""}, "1 '<image>' placeholder but no images were given"),
    ({"text": "<image>a", "image_data": []}, "1 '<image>' placeholder but no images were given"),
    ({"text": "<image>a"}, "1 '<image>' placeholder but no images were given"),
])
def test_generate_image_data_errors_name_the_fix(served, body, message):
    _, _, url = served
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]


def test_a_text_only_server_reports_no_image_token_and_refuses_images(tiny_llama):
    from lmnb_engine import Engine

    engine = Engine(model=str(tiny_llama), max_total_tokens=512)
    try:
        with live_server(engine) as url:
            assert httpx.get(f"{url}/get_model_info").json()["image_token"] is None
            st = ask_image.run(img=random_image(2), question="q", backend=sgl.RuntimeEndpoint(url))
            with pytest.raises(ProgramError, match="serves the text-only") as e:
                st.sync()
            assert isinstance(e.value.__cause__, BackendCannotRun)  # (no row's input would run: a job says so)
            # an OpenAI API says nothing of images: the server's refusal at the gen, naming the fix (language.md)
            st = ask_image.run(img=random_image(2), question="q", backend=sgl.OpenAI("default", base_url=f"{url}/v1",
                                                                                    api_key="x"))
            with pytest.raises(ProgramError, match=r"failed: BackendError: .*HTTP 400: messages\[0\] has an image_url "
                               "part, but the served model is text-only; serve a LLaVA checkpoint to send images"):
                st.sync()
    finally:
        engine.shutdown()


def test_a_vision_model_without_its_processor_config_is_not_called_text_only(llava_ckpt, tmp_path):
    """A LLaVA checkpoint missing its processor config: its requests with images got the
    text-only model's 400 ("the served model is text-only; serve a LLaVA checkpoint"), whose fix is
    the one thing already done. They get a 500 saying the config is missing (the fix is the
    server's), as when transformers needs torchvision; its text is still served."""
    import shutil

    from lmnb_engine import Engine

    path = tmp_path / "llava"
    shutil.copytree(llava_ckpt, path)
    for name in ("preprocessor_config.json", "processor_config.json"):
        (path / name).unlink(missing_ok=True)
    engine = Engine(model=str(path), device="cpu", max_total_tokens=512)
    url_image = "data:image/png;base64," + base64.b64encode(png_bytes(random_image(1))).decode()
    missing = f"{path} has no usable image processor config"
    try:
        with live_server(engine, served_model_name="llava") as url:
            parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url_image}}]
            chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "llava", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})
            assert chat.status_code == 500 and chat.json()["error"]["message"].startswith(missing), chat.text
            generate = httpx.post(f"{url}/generate", json={"text": "<image>a", "image_data": url_image}, timeout=60)
            assert generate.status_code == 500 and generate.json()["error"]["message"].startswith(missing), generate.text
            text = httpx.post(f"{url}/generate", timeout=60,
                              json={"text": "a", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
            assert text.status_code == 200, text.text
    finally:
        engine.shutdown()


def test_an_image_prompt_that_writes_its_own_bos_runs_as_the_same_ids_on_every_path(llava_ckpt, tmp_path):
    """A text prompt that writes the BOS its tokenizer adds runs with that one BOS
    (``Engine.prompt_ids``); a prompt with images did not: ``multimodal.prepare`` encoded its text
    with both BOS, so /generate ran "<s><image> what is it?" one token longer than where its prompt
    logprobs from token 0 were asked (the server read the text as ``prompt_ids`` first), and the
    in-process gen and select ran it with both. Every path reads it as ``prompt_ids`` now: the
    tokenizer's ids less its BOS, each placeholder expanded to the image's 16 tokens ((28 // 7) ** 2
    patches, CLIP's CLS dropped: the "default" strategy), worked from the tokenizer here."""
    import shutil

    from tokenizers import processors
    from transformers import AutoTokenizer

    from lmnb_engine import Engine

    path = tmp_path / "llava-bos"  # the tiny LLaVA, its tokenizer adding a BOS as Llama's does
    shutil.copytree(llava_ckpt, path)
    tok = AutoTokenizer.from_pretrained(str(path))
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    tok.save_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    image_id = tok.convert_tokens_to_ids("<image>")

    def runs_as(text):  # (the text's own BOS the one BOS; the placeholder as the image's tokens)
        ids = tok.encode(text)
        assert ids[:2] == [bos, bos]  # (the case: the tokenizer adds one, the text writes one)
        return [t for i in ids[1:] for t in ([i] * 16 if i == image_id else [i])]

    text = "<s><image> what is it? Answer:"
    want = runs_as(text)
    img = random_image(47)

    @sgl.function
    def ask(s, logprobs):
        s += "<s>" + sgl.image(img) + " what is it? Answer:"
        s += sgl.gen("a", max_tokens=1, temperature=0, return_logprob=logprobs, logprob_start_len=0)

    @sgl.function
    def pick(s):
        s += "<s>" + sgl.image(img) + " what is it? Answer:" + sgl.select("c", choices=[" red", " a blue"])

    local = Engine(model=str(path), device="cpu", max_total_tokens=4096)
    remote = Engine(model=str(path), device="cpu", max_total_tokens=4096)
    try:
        backend = sgl.Engine(engine=local)
        for logprobs in (False, True):
            meta = ask.run(logprobs=logprobs, backend=backend).get_meta_info("a")
            assert meta["prompt_tokens"] == len(want), logprobs
        assert [e[1] for e in meta["input_token_logprobs"]] == want
        meta = pick.run(backend=backend).get_meta_info("c")
        for c, start, scored in zip([" red", " a blue"], meta["prefix_len"], meta["input_token_logprobs"]):
            c_ids = runs_as(text + c)
            d = next(i for i, (a, b) in enumerate(zip(want + [None], c_ids)) if a != b)
            assert (start, [e[1] for e in scored]) == (d, c_ids[d:]), c

        raw = base64.b64encode(png_bytes(img)).decode()
        with live_server(remote, served_model_name="llava") as url:
            plain, scored = (httpx.post(f"{url}/generate", timeout=60, json={
                "text": text, "image_data": raw, "sampling_params": {"max_new_tokens": 0}, **extra}).json()
                for extra in ({}, {"return_logprob": True, "logprob_start_len": 0}))
        assert plain["meta_info"]["prompt_tokens"] == scored["meta_info"]["prompt_tokens"] == len(want)
        assert [e[1] for e in scored["meta_info"]["input_token_logprobs"]] == want
    finally:
        local.shutdown()
        remote.shutdown()
