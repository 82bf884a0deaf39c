"""tokenswap.images.load_image against real hostile files and the official processor's pixels."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import torch
from PIL import Image

from tests.support import png_bomb
from tokenswap.images import BadImageError, check_image_size, load_image


def _encode(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _noise(mode: str, size=(50, 40)) -> Image.Image:
    rng = np.random.default_rng(0)
    channels = {"RGBA": 4, "LA": 2, "RGB": 3}[mode]
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8).squeeze(), mode)


def _p_with_transparency() -> Image.Image:
    im = _noise("RGB").quantize(16)
    im.info["transparency"] = 3  # palette index 3 is transparent
    return im


def test_decompression_bomb_refused_before_decoding(tmp_path):
    data = png_bomb(30000, 30000)
    assert len(data) < 2_000_000  # tiny on disk, 900 M pixels decoded
    path = tmp_path / "bomb.png"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(BadImageError, match=r"bomb\.png.*(30000x30000|900000000 pixels)") as err:
            load_image(str(path), what=str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "max_pixels" in str(err.value) or "decompression bomb" in str(err.value)
    assert peak < 50_000_000  # the header was read, the 900 MB of pixels never were


def test_max_pixels_is_ours_not_pils(tmp_path):
    path = tmp_path / "big.png"
    path.write_bytes(png_bomb(3000, 3000))
    with pytest.raises(BadImageError, match="max_pixels=1,000,000"):
        load_image(path, what="big", max_pixels=1_000_000)
    assert load_image(path, what="big").size == (3000, 3000)


@pytest.mark.parametrize("size", [(1, 4000), (4000, 1), (2, 401)])
def test_aspect_ratio_the_processor_refuses(tiny_processor, size, tmp_path):
    image = Image.new("RGB", size, "red")
    with pytest.raises(ValueError, match="aspect ratio"):  # the processor itself refuses it ...
        tiny_processor.image_processor(images=[image], return_tensors="pt")
    path = tmp_path / "thin.png"
    image.save(path)
    for source in (image, path, path.read_bytes()):  # ... and we refuse it up front, named
        with pytest.raises(BadImageError, match=r"sample 7.*aspect ratio"):
            load_image(source, what="sample 7")


def test_largest_accepted_aspect_ratio_goes_through_the_processor(tiny_processor):
    image = load_image(Image.new("RGB", (1, 200), "red"), what="x")
    out = tiny_processor.image_processor(images=[image], return_tensors="pt")
    assert out["image_grid_thw"].shape == (1, 3)


def test_empty_image_refused():
    with pytest.raises(BadImageError, match="no pixels"):
        check_image_size(0, 0, what="x")
    with pytest.raises(BadImageError, match="no pixels"):
        load_image(Image.new("RGB", (0, 0)), what="x")


def test_truncated_unknown_missing_and_empty(tmp_path):
    good = _encode(_noise("RGB", (64, 64)))
    with pytest.raises(BadImageError, match="cut.png: the image does not decode"):
        load_image(good[: len(good) // 2], what="cut.png")
    jpeg = _encode(_noise("RGB", (64, 64)), "JPEG")
    with pytest.raises(BadImageError, match="cut.jpg: the image does not decode"):
        load_image(jpeg[:300], what="cut.jpg")
    with pytest.raises(BadImageError, match="notes.txt: not an image"):
        load_image(b"just some text, not an image" * 10, what="notes.txt")
    with pytest.raises(BadImageError, match="empty"):
        load_image(b"", what="x")
    with pytest.raises(BadImageError, match="no such image file"):
        load_image(tmp_path / "missing.png", what="missing.png")
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(BadImageError, match="no such image file"):
        load_image(tmp_path / "dir.png", what="dir.png")
    with pytest.raises(TypeError, match="int"):
        load_image(3, what="x")


def test_exif_orientation_applied_like_transformers(tmp_path, tiny_processor):
    from transformers.image_utils import load_image as hf_load_image

    image = Image.new("RGB", (60, 30), "white")
    image.paste((255, 0, 0), (0, 0, 20, 30))  # red band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "rotated.jpg"
    image.save(path, "JPEG", exif=exif.tobytes(), quality=95)

    ours = load_image(str(path), what="rotated.jpg")
    assert ours.size == (30, 60)  # upright, not as stored
    assert np.array_equal(np.asarray(ours), np.asarray(hf_load_image(str(path))))
    ip = tiny_processor.image_processor
    official = ip(images=[str(path)], return_tensors="pt")  # the path the chat template takes
    mine = ip(images=[ours], return_tensors="pt")
    torch.testing.assert_close(mine["pixel_values"], official["pixel_values"], rtol=0, atol=0)
    assert torch.equal(mine["image_grid_thw"], official["image_grid_thw"])


@pytest.mark.parametrize("make", [lambda: _noise("RGBA"), lambda: _noise("LA"), _p_with_transparency])
def test_transparency_in_memory_matches_the_processor(tiny_processor, make):
    image = make()
    ip = tiny_processor.image_processor
    official = ip(images=[image], return_tensors="pt")["pixel_values"]
    ours = load_image(image, what="in-memory")
    assert ours.mode == "RGB"
    assert torch.equal(ip(images=[ours], return_tensors="pt")["pixel_values"], official)
    # Compositing on white is not what dropping the alpha gives: the test can fail.
    dropped = Image.fromarray(np.asarray(image.convert("RGB")))
    assert not torch.equal(ip(images=[dropped], return_tensors="pt")["pixel_values"], official)


@pytest.mark.parametrize("make", [lambda: _noise("RGBA"), lambda: _noise("LA"), _p_with_transparency])
def test_transparency_in_files_matches_the_processor(tiny_processor, make, tmp_path):
    path = tmp_path / "t.png"
    make().save(path)
    ip = tiny_processor.image_processor
    official = ip(images=[str(path)], return_tensors="pt")["pixel_values"]
    for source in (str(path), path.read_bytes()):
        ours = load_image(source, what="t.png")
        assert ours.mode == "RGB"
        assert torch.equal(ip(images=[ours], return_tensors="pt")["pixel_values"], official)


def test_lazy_in_memory_image_that_does_not_decode():
    good = _encode(_noise("RGB", (64, 64)))
    lazy = Image.open(io.BytesIO(good[: len(good) // 2]))  # header fine, data cut
    with pytest.raises(BadImageError, match="sample s1: the image does not decode"):
        load_image(lazy, what="sample s1")
