"""``{image ...}`` in a real ``%%lm`` cell on a tiny random LLaVA loaded with ``%lm load``.

The reference is the equivalent lmnb program run directly on the same engine; the image span is
located with transformers' ``LlavaProcessor`` (independent of lmnb's own token layout).
"""

from __future__ import annotations

import base64
import io
import re

import pytest
from helpers_shell import process_shell
from bs4 import BeautifulSoup
from IPython.utils.capture import capture_output
from PIL import Image

import lmnb
from lmnb_kernel.session import Session
from tests.helpers_multimodal import png_bytes, random_image

CELL = """%%lm --static --temperature 0 --out st
{user}
{image photo}
What is in the picture?
{/user}
{assistant}
{gen answer max_tokens=6}
{/assistant}"""


@pytest.fixture(scope="module")
def ip(llava_ckpt):
    shell = process_shell()
    shell.extension_manager.load_extension("lmnb_kernel")
    magics = shell._lmnb_magics
    real, magics.session = magics.session, Session()  # leave any other module's engine alone
    with capture_output() as out:
        ok = shell.run_cell(f"%lm load {llava_ckpt} --max-total-tokens 4096").success
    assert ok, out.stdout
    yield shell
    magics.session.close()
    magics.session = real
    shell.extension_manager.unload_extension("lmnb_kernel")


def run(ip, code: str):
    with capture_output() as out:
        result = ip.run_cell(code)
    assert result.success, out.stdout
    return out


def view_html(out) -> BeautifulSoup:
    [html] = [o.data["text/html"] for o in out.outputs if "lmnb-run" in o.data.get("text/html", "")][-1:]
    return BeautifulSoup(html, "html.parser")


@lmnb.function
def ask(s, photo, question):
    s += lmnb.user(lmnb.image(photo) + "\n" + question)
    s += lmnb.assistant(lmnb.gen("answer", max_tokens=6))


def image_layout(llava_ckpt, prompt_text: str, img):
    """(processor, prompt ids, position after the image's last placeholder token), as
    transformers' LlavaProcessor lays the prompt out."""
    import transformers

    proc = transformers.AutoProcessor.from_pretrained(str(llava_ckpt))
    ids = proc(text=prompt_text, images=[img], return_tensors="pt")["input_ids"][0].tolist()
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    return proc, ids, max(i for i, t in enumerate(ids) if t == image_id) + 1


def test_image_cell_equals_the_lmnb_program_and_reuses_the_image_kv(ip, llava_ckpt, tmp_path):
    img = random_image(7, size=(200, 120))
    ip.user_ns["photo"] = img
    out1 = run(ip, CELL)
    backend = ip._lmnb_magics.session.backend()
    direct = ask.run(photo=img, question="What is in the picture?", temperature=0, backend=backend)
    assert ip.user_ns["answer"] == direct["answer"]
    assert ip.user_ns["st"].text() == direct.text()

    # The first cell's view: a ≤ 96 px PNG thumbnail of the picture, marked new (not from the cache).
    media = view_html(out1).select_one(".lmnb-media")
    assert "lmnb-media-computed" in str(media)
    src = media.img["src"]
    assert src.startswith("data:image/png;base64,")
    thumb = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    assert thumb.size == (96, 58) and (int(media.img["width"]), int(media.img["height"])) == thumb.size  # 200x120 scaled

    # A second question on the same pixels, now from a PNG file named in the cell: the image's
    # tokens come from the radix cache, and the view says so.
    path = tmp_path / "same.png"
    path.write_bytes(png_bytes(img))
    out2 = run(ip, CELL.replace("{image photo}", f'{{image "{path}"}}').replace("What is", "Which colour is")
               .replace("--out st", "--out st2"))
    st2 = ip.user_ns["st2"]
    prompt = st2.text()[: st2.text().rindex("<|assistant|>") + len("<|assistant|>")]
    assert st2.get_meta_info("answer")["cached_tokens"] >= image_layout(llava_ckpt, prompt, img)[2]
    assert "lmnb-media-cached" in str(view_html(out2).select_one(".lmnb-media"))
    # The shaded cached text is the prompt's text up to the cached position, mapped through the
    # processor's layout (the image is one placeholder in the text but many prompt positions).
    proc, ids, end = image_layout(llava_ckpt, prompt, img)
    n = st2.get_meta_info("answer")["cached_tokens"]
    before = prompt[: prompt.index(proc.image_token)]
    soup = view_html(out2)
    cached = "".join(x.get_text() for x in soup.select(".lmnb-text.lmnb-cached"))
    assert cached == before + proc.tokenizer.decode(ids[end:n])
    computed = "".join(x.get_text() for x in soup.select(".lmnb-text.lmnb-computed"))
    assert "Which colour" in computed


@lmnb.function
def ask_choice(s, photo):
    s += lmnb.user(lmnb.image(photo) + "\nWhat colour?")
    s += lmnb.assistant(lmnb.select("colour", choices=["red", "blue", "green"]))


def test_select_after_an_image_in_a_cell_equals_the_lmnb_program(ip):
    img = random_image(8)
    ip.user_ns["photo"] = img
    out = run(ip, '%%lm --static --out st3\n{user}\n{image photo}\nWhat colour?\n{/user}\n'
                  '{assistant}{select colour choices=["red", "blue", "green"]}{/assistant}')
    direct = ask_choice.run(photo=img, backend=ip._lmnb_magics.session.backend())
    assert ip.user_ns["st3"].text() == direct.text()
    assert ip.user_ns["colour"] == direct["colour"]
    # the select's prompt prefill sent the image: new in this cell (fresh pixels), cached in the next
    assert "lmnb-media-computed" in str(view_html(out).select_one(".lmnb-media"))
    out = run(ip, '%%lm --static\n{user}\n{image photo}\nWhat colour?\n{/user}\n'
                  '{assistant}{select colour choices=["red", "blue", "green"]}{/assistant}')
    assert "lmnb-media-cached" in str(view_html(out).select_one(".lmnb-media"))


def test_pinning_a_state_with_an_image_keeps_its_image_kv(ip, llava_ckpt):
    img = random_image(9)
    ip.user_ns["photo"] = img
    run(ip, CELL.replace("--out st", "--state pinned"))
    text = ip._lmnb_magics.session.state("pinned").state.text()
    _, ids, end = image_layout(llava_ckpt, text, img)
    # it failed: "the prompt has 1 '<image>' placeholder(s) but no images were given"
    out = run(ip, "%lm pin pinned")
    shown = " ".join(o.data.get("text/plain", "") for o in out.outputs)
    assert f"pinned state 'pinned': {len(ids)} tokens stay cached" in shown
    run(ip, "%lm flush")
    run(ip, "%%lm --static --temperature 0 --state pinned\n{user}And now?{/user}\n"
            "{assistant}{gen more max_tokens=3}{/assistant}")
    assert ip._lmnb_magics.session.state("pinned").state.get_meta_info("more")["cached_tokens"] >= end
    run(ip, "%lm unpin pinned")


def test_states_counts_an_image_as_its_placeholder_tokens(ip, llava_ckpt):
    img = random_image(10)
    ip.user_ns["photo"] = img
    run(ip, CELL.replace("--out st", "--state counted"))
    _, ids, _ = image_layout(llava_ckpt, ip._lmnb_magics.session.state("counted").state.text(), img)
    out = run(ip, "%lm states")
    lines = [line for o in out.outputs for line in o.data.get("text/plain", "").splitlines()]
    # (columns are two or more spaces apart; a cell reads "cell [1]")
    [header] = [re.split(r"\s{2,}", line.strip()) for line in lines if line.startswith("name ")]
    [row] = [re.split(r"\s{2,}", line.strip()) for line in lines if line.startswith("counted ")]
    assert int(row[header.index("tokens")]) == len(ids)  # it counted the image as 1 token, not its 16 placeholder positions


def test_tree_labels_follow_a_state_past_its_image(ip, llava_ckpt):
    img = random_image(11)
    ip.user_ns["photo"] = img
    run(ip, CELL.replace("--out st", "--state treeimg"))
    run(ip, "%lm pin treeimg")  # every token of the state, the image's included, is cached now
    magics = ip._lmnb_magics
    engine = magics.session.engine("test")
    paths = magics.tree_labels(engine)["paths"]
    # it was "treeimg (cell N) · 2/18 tok cached", at the node before the image: the text's bare
    # placeholder token matched none of the image's pixel-hash keys
    [label] = [k for k in paths if k.startswith("treeimg")]
    assert "tok cached" not in label
    _, ids, _ = image_layout(llava_ckpt, magics.session.state("treeimg").state.text(), img)
    assert sum(n.num_tokens for n in _path_to(engine.tree_snapshot(), paths[label])) == len(ids)
    run(ip, "%lm unpin treeimg")


def _path_to(root, node_id):
    """The nodes from ``root`` (a ``TreeNodeView``) down to the node ``node_id``, root excluded."""
    for child in root.children:
        if child.node_id == node_id:
            return [child]
        below = _path_to(child, node_id)
        if below:
            return [child] + below
    return []


def test_an_image_file_that_is_missing_is_reported_at_its_own_hole(ip):
    """A missing file was reported at the gen after the image ("line 7: Gen('answer') failed: ...
    no image file"), and a cell of images alone ran without an error."""
    for cell, where in [(CELL.replace("{image photo}", '{image "no-such-photo.png"}'), "line 3, col 1:"),
                        ('%%lm --static\n{user}\n\n{image "no-such-photo.png"}\n{/user}', "line 4, col 1:")]:
        with capture_output():
            result = ip.run_cell(cell)
        assert not result.success and type(result.error_in_exec).__name__ == "CellError"
        assert str(result.error_in_exec).startswith(
            f"{where} {{image \"no-such-photo.png\"}} failed: ImageInputError: no image file at 'no-such-photo.png'")


def test_an_image_file_pillow_cannot_read_is_reported_at_its_own_hole(ip, tmp_path):
    """Junk bytes, or a 4000x10 PNG the size limits refuse, were reported at the gen after the image
    ("line 7: Gen('answer') failed: ImageInputError: ..."), where a missing file is reported at
    its hole."""
    junk, wide = tmp_path / "notimg.png", tmp_path / "wide.png"
    junk.write_bytes(b"junk bytes, not a PNG")
    Image.new("RGB", (4000, 10)).save(wide)
    for path, words in [(junk, "is not a readable image (its bytes are in no image format Pillow knows); use PNG, "
                               "JPEG, GIF, WebP or BMP"),
                        (wide, "is 4000x10 pixels: its sides differ more than 200 to 1, the limit (the image "
                               "processor would scale the short side up into gigabytes); crop it into parts")]:
        with capture_output():
            result = ip.run_cell(CELL.replace("{image photo}", f'{{image "{path}"}}'))
        assert not result.success and type(result.error_in_exec).__name__ == "CellError"
        assert str(result.error_in_exec).startswith(
            f"line 3, col 1: {{image \"{path}\"}} failed: ImageInputError: {str(path)!r} {words}\n")
