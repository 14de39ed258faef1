"""Image decoding, content hashes and video frame sampling (no model)."""

from __future__ import annotations

import base64
import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from lmnb_engine.multimodal import ImageInputError, load_image, pixel_hash, sample_video_frames
from lmnb_engine.multimodal.video import _av_frames, _decord_frames, _pillow_frames, frame_indices, video_backend, video_readers
from tests.helpers_multimodal import frame_color, png_bytes, random_image, write_video


def test_every_source_of_one_image_has_the_same_hash(tmp_path):
    img = random_image(0)
    data = png_bytes(img)
    path = tmp_path / "a.png"
    path.write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    expected = hashlib.sha256(f"RGB:{img.width}x{img.height}:".encode() + np.asarray(img).tobytes()).hexdigest()
    wrapped = "data:image/png;base64," + base64.encodebytes(data).decode()  # lines of 76 characters
    for source in (img, data, bytearray(data), str(path), path, url, wrapped, img.convert("RGBA")):
        loaded = load_image(source)
        assert loaded.hash == expected
        assert loaded.image.mode == "RGB" and np.array_equal(np.asarray(loaded.image), np.asarray(img))


def test_transparent_pixels_are_composited_onto_white():
    # HF's convert_to_rgb (what transformers' LLaVA processor does): out = a*c + (1-a)*255
    rgba = Image.new("RGBA", (2, 1))
    rgba.putdata([(0, 0, 0, 0), (200, 100, 0, 51)])
    assert np.asarray(load_image(rgba).image).tolist() == [[[255, 255, 255], [244, 224, 204]]]
    assert pixel_hash(rgba) == load_image(rgba).hash  # the hash lmnb_engine's meta reports
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 10, 20, 30])
    pal.putdata([0, 1])
    pal.info["transparency"] = 0
    assert np.asarray(load_image(png_bytes(pal)).image).tolist() == [[[255, 255, 255], [10, 20, 30]]]


def test_a_sixteen_bit_grayscale_png_keeps_its_transparent_value():
    """A 16-bit grey PNG's tRNS value was dropped with the 16 bits: its transparent pixels stayed
    grey, where every other transparent image's are composited onto white."""
    values = np.array([[0, 1000, 1001, 65535]], dtype=np.uint16)  # 1000 and 1001 are both 4 in 8 bits
    buf = io.BytesIO()
    Image.fromarray(values).save(buf, "PNG", transparency=1000)
    assert Image.open(io.BytesIO(buf.getvalue())).info["transparency"] == 1000  # (Pillow reads the tRNS)
    assert np.asarray(load_image(buf.getvalue()).image).tolist() == [[[0] * 3, [255] * 3, [4] * 3, [255] * 3]]


def test_a_photo_is_turned_upright_by_its_exif_orientation(tmp_path):
    # orientation 6: the stored rows are the picture's columns, top to bottom (rotate 90° clockwise)
    img = random_image(2, size=(5, 3))
    exif = img.getexif()
    exif[0x0112] = 6
    path = tmp_path / "portrait.png"
    img.save(path, exif=exif)
    upright = np.rot90(np.asarray(img), k=-1)
    for source in (path, path.read_bytes(), Image.open(path)):
        assert np.array_equal(np.asarray(load_image(source).image), upright)
    assert pixel_hash(Image.open(path)) == load_image(path).hash == pixel_hash(Image.fromarray(upright))


def test_a_pil_image_closed_before_it_was_read_says_so(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes(random_image(4)))
    with Image.open(path) as img:
        pass
    with pytest.raises(ImageInputError, match=r"closed before its pixels were read .*call \.load\(\) on it"):
        load_image(img)  # it was a bare AssertionError from Pillow
    with Image.open(path) as img:
        img.load()
    assert np.array_equal(np.asarray(load_image(img).image), np.asarray(random_image(4)))


def test_a_lazily_opened_pil_image_read_from_two_threads_at_once(tmp_path):
    """A notebook's `photo = Image.open(path)` in `{image photo}`: the live view's thumbnail and the
    engine read the picture at the same time, and Pillow's lazy decode is not thread-safe (the
    cell failed at random with 'AssertionError' or 'I/O operation on closed file')."""
    import threading

    img = random_image(5, size=(64, 48))
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes(img))
    expected = hashlib.sha256(b"RGB:64x48:" + np.asarray(img).tobytes()).hexdigest()
    for _ in range(40):
        lazy = Image.open(path)
        barrier, results = threading.Barrier(2), []

        def read():
            barrier.wait()
            try:
                results.append(load_image(lazy).hash)
            except Exception as e:  # noqa: BLE001 - the failure under test
                results.append(repr(e))

        threads = [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [expected, expected]


def test_a_file_url_is_read_as_the_path_it_names(tmp_path):
    """SGLang's load_image reads a file:// URL as its path (urlparse, unquote); lmnb said "no image
    file at 'file:///...'; check the path" of a file that was there, and a remote backend's data URL
    and a video's frames likewise."""
    from lmnb.backend.media import data_url
    from lmnb_engine.multimodal.image_io import check_image_source

    img = random_image(1)
    path = tmp_path / "a b%.png"  # (a space and a "%": the URL percent-encodes both)
    path.write_bytes(png_bytes(img))
    for url in (path.as_uri(), "file://localhost" + path.as_uri()[len("file://"):]):
        assert "%20" in url and "%25" in url
        check_image_source(url)
        assert load_image(url).hash == load_image(path).hash
        assert data_url(url) == "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    with pytest.raises(ImageInputError, match=r"is a file on another host, 'elsewhere'; copy it here"):
        load_image("file://elsewhere" + str(path))
    with pytest.raises(ImageInputError, match="no image file at 'file:///no/such.png'; check the path"):
        load_image("file:///no/such.png")
    gif = tmp_path / "v w.gif"
    frames = [Image.new("RGB", (8, 8), (i * 30, 0, 0)) for i in range(8)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=40, loop=0)
    assert [f.getpixel((0, 0))[0] for f in sample_video_frames(gif.as_uri(), 4)] == [0, 60, 120, 210]


def test_a_folder_given_as_an_image_or_video_is_named_as_a_folder(tmp_path):
    """A folder said "no image file at '<folder>'; check the path", where the path was right."""
    from lmnb_engine.multimodal.image_io import check_image_source

    for check in (load_image, check_image_source):
        with pytest.raises(ImageInputError) as e:
            check(str(tmp_path))
        assert str(e.value) == f"{str(tmp_path)!r} is a folder, not an image file; give the path of an image in it"
    with pytest.raises(ImageInputError) as e:
        sample_video_frames(tmp_path, 2)
    assert str(e.value) == f"{str(tmp_path)!r} is a folder, not a video file; give the path of a video in it"


def test_bare_base64_passed_as_a_path_says_so_without_echoing_it():
    """image(<bare base64 string>) raised OSError 'File name too long' with the whole string."""
    data = base64.b64encode(png_bytes(random_image(3, size=(64, 64)))).decode()
    with pytest.raises(ImageInputError, match=r"characters: image data, not a path\?\); pass the image's bytes") as e:
        load_image(data)
    assert len(str(e.value)) < 300
    # short enough to be a file name (a 1x1 PNG is 92 characters): it was "no image file ...; check the path"
    tiny = base64.b64encode(png_bytes(Image.new("RGB", (1, 1)))).decode()
    assert len(tiny) < 255
    with pytest.raises(ImageInputError, match=r"characters: image data, not a path\?\); pass the image's bytes"):
        load_image(tiny)
    with pytest.raises(ImageInputError, match=r"no image file at 'abcd'; check the path"):  # base64, not an image
        load_image("abcd")


def test_one_pixel_changes_the_hash():
    img = random_image(0)
    other = img.copy()
    other.putpixel((0, 0), tuple((c + 1) % 256 for c in img.getpixel((0, 0))))
    assert load_image(img).hash != load_image(other).hash
    assert load_image(img).hash != load_image(img.resize((img.width + 1, img.height))).hash


def test_limits_and_refusals(tmp_path, monkeypatch):
    data = png_bytes(random_image(0))
    with pytest.raises(ImageInputError, match="over the limit"):
        load_image(data, max_bytes=len(data) - 1)
    with pytest.raises(ImageInputError, match="over the limit"):
        load_image(Image.new("RGB", (100, 100)), max_pixels=9999)
    for empty in ((5, 5, 5, 5), (5, 5, 6, 5)):  # a ZeroDivisionError from the image processor, or a 1x0 "image"
        with pytest.raises(ImageInputError, match=r"is [01]x0 pixels: it is empty"):
            load_image(random_image(0).crop(empty))
    with pytest.raises(ImageInputError, match="over the limit"):  # checked from the header, before decoding
        load_image(png_bytes(Image.new("RGB", (100, 100))), max_pixels=9999)
    with pytest.raises(ImageInputError, match="not a readable image"):
        load_image(data[:40])  # truncated
    # bytes of no image format: the message named Pillow's buffer ("<_io.BytesIO object at 0x7f...>")
    with pytest.raises(ImageInputError) as e:
        load_image(b"hello, not an image")
    assert str(e.value) == ("the image data is not a readable image (its bytes are in no image format Pillow knows); "
                            "use PNG, JPEG, GIF, WebP or BMP")
    # a 100-byte 16000x1 PNG: the image processor scaled its short side to 336, into 5.4e6x336 pixels
    for size in ((16000, 1), (1, 16000), (201, 1), (2010, 10)):
        with pytest.raises(ImageInputError, match=rf"is {size[0]}x{size[1]} pixels: its sides differ more than "
                                                   r"200 to 1, the limit .*; crop it into parts$"):
            load_image(png_bytes(Image.new("RGB", size)))
    for size in ((200, 1), (2000, 10), (10, 2000)):  # (at the limit)
        assert load_image(Image.new("RGB", size)).image.size == size
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Image.open refuses over twice this (a 20000² PNG)
    with pytest.raises(ImageInputError, match=r"over the limit of 50000000 pixels .*; resize it$") as e:
        load_image(png_bytes(Image.new("RGB", (100, 100))))
    assert "use PNG" not in str(e.value)  # it was "not a readable image ...; use PNG, JPEG, GIF, WebP or BMP"
    monkeypatch.undo()
    with pytest.raises(ImageInputError, match="data:image/<type>;base64"):
        load_image("data:text/plain;base64,aGk=")
    monkeypatch.delenv("LMNB_ALLOW_REMOTE_MEDIA", raising=False)
    with pytest.raises(ImageInputError, match="LMNB_ALLOW_REMOTE_MEDIA"):
        load_image("http://127.0.0.1:9/x.png")
    with pytest.raises(ImageInputError, match="LMNB_ALLOW_REMOTE_MEDIA"):  # it was "no image file at ..."
        load_image("HTTPS://127.0.0.1:9/x.png")
    assert issubclass(ImageInputError, ValueError)


def test_pyav_keeps_only_the_sampled_frames(tmp_path, monkeypatch):
    import av

    path = tmp_path / "v.mp4"
    write_video(path, num_frames=8)
    converted = []
    to_image = av.VideoFrame.to_image
    monkeypatch.setattr(av.VideoFrame, "to_image", lambda self, *a, **k: converted.append(1) or to_image(self, *a, **k))
    frames = _av_frames(path, 3)
    assert len(converted) == 3  # it was 8: every frame of the video held as an image at once
    for frame, i in zip(frames, (0, 3, 7)):  # linspace(0, 7, 3) = 0, 3.5, 7, truncated
        assert np.abs(np.asarray(frame).reshape(-1, 3).mean(0) - frame_color(i)).max() < 6


def test_frame_indices_are_uniform_and_include_both_ends():
    assert frame_indices(8, 4) == [0, 2, 4, 7]  # linspace(0, 7, 4) = 0, 2.33, 4.67, 7, truncated
    assert frame_indices(10, 1) == [0]
    assert frame_indices(3, 8) == [0, 1, 2]  # a short video gives all its frames


def test_video_frames_are_the_uniformly_spaced_ones(tmp_path):
    path = tmp_path / "v.mp4"
    write_video(path, num_frames=8)
    want = [frame_color(i) for i in (0, 2, 4, 7)]  # linspace(0, 7, 4) truncated
    readers = [sample_video_frames, _av_frames] + ([_decord_frames] if video_backend() == "decord" else [])
    for reader in readers:
        frames = reader(path, 4)
        assert len(frames) == 4
        for frame, color in zip(frames, want):  # lossy codec: colours survive to a few levels
            assert np.abs(np.asarray(frame).reshape(-1, 3).mean(0) - color).max() < 6, reader.__name__
    gif = tmp_path / "v.gif"
    frames = [Image.new("RGB", (8, 8), (i * 30, 0, 0)) for i in range(8)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=40, loop=0)
    assert [f.getpixel((0, 0))[0] for f in _pillow_frames(gif, 4)] == [0, 60, 120, 210]
    # through the public reader too: decord (tried first where installed) cannot read a GIF, so
    # the next reader takes it instead of the call failing
    assert [f.getpixel((0, 0))[0] for f in sample_video_frames(gif, 4)] == [0, 60, 120, 210]
    with pytest.raises(ImageInputError, match="positive integer"):
        sample_video_frames(path, 0)
    with pytest.raises(ImageInputError, match="no video file"):
        sample_video_frames(tmp_path / "missing.mp4", 2)
    # a URL was "no video file at <the whole URL>; check the path" (a data URL's megabytes)
    data = "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()
    for url in (data, "https://example.com/clip.mp4", "data:video/mp4;base64," + "A" * 400):
        with pytest.raises(ImageInputError, match="a video is read from a file, not a URL") as err:
            sample_video_frames(url, 2)
        assert len(str(err.value)) < 200
    with pytest.raises(ImageInputError, match="no video file"):  # it was OSError "File name too long"
        sample_video_frames("x" * 300, 2)
    (tmp_path / "junk.mp4").write_bytes(b"junk" * 10)
    with pytest.raises(ImageInputError, match="not a readable video") as err:
        sample_video_frames(tmp_path / "junk.mp4", 2)
    assert all(f"{reader}:" in str(err.value) for reader in video_readers())  # each reader's reason


def test_sixteen_bit_grayscale_is_scaled_to_eight_bits_not_clipped_to_white(tmp_path):
    # a 16-bit PNG holds 0..65535; 8 bits hold v / 257 (65535 -> 255), as viewers show it
    values = np.array([[0, 257 * 100, 40000, 65535]], dtype=np.uint16)
    expected = [[[g, g, g] for g in (0, 100, 156, 255)]]  # 40000 / 257 = 155.64 -> 156
    path = tmp_path / "scan.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode.startswith("I")  # Pillow keeps the 16 bits
    for source in (path, Image.open(path), Image.fromarray(values.astype(np.int32))):
        assert np.asarray(load_image(source).image).tolist() == expected
    assert load_image(path).hash == pixel_hash(Image.fromarray(np.array(expected, dtype=np.uint8)))


def test_the_check_where_an_image_is_added_refuses_what_its_header_refuses_as_load_image_does(tmp_path):
    """check_image_source (where image() adds an input) let through bytes in no image format and an
    image over the size limits, which failed only at the next gen's request."""
    from lmnb_engine.multimodal.image_io import check_image_source

    wide = io.BytesIO()
    Image.new("RGB", (4000, 10)).save(wide, format="PNG")
    for name, data in [("junk.png", b"junk bytes, not a PNG"), ("wide.png", wide.getvalue())]:
        (tmp_path / name).write_bytes(data)
        for source in (str(tmp_path / name), data, "data:image/png;base64," + base64.b64encode(data).decode()):
            with pytest.raises(ImageInputError) as loaded:
                load_image(source)
            with pytest.raises(ImageInputError) as checked:
                check_image_source(source)
            assert str(checked.value) == str(loaded.value)
    assert "4000x10 pixels: its sides differ more than 200 to 1" in str(loaded.value)
    good = tmp_path / "good.png"
    good.write_bytes(png_bytes(random_image(4)))
    for source in (str(good), good.read_bytes()):
        check_image_source(source)
