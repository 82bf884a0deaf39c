"""A bench's pictures are checked when it is loaded and decoded when a request first needs them
(:class:`tokenswap.images.StoredPicture`): the same pixels and digests as pictures decoded up front, a damaged file
refused at load where opening shows it, and nothing hashed before the plan needs it."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tokenswap.data.tokenswap_bench import load_tokenswap_bench_pairs, write_tokenswap_bench
from tokenswap.errors import InputError
from tokenswap.eval.form_runs import FormPlan
from tokenswap.eval.mc import MCItem, as_rgb, build_conversation
from tokenswap.images import StoredPicture
from tokenswap.inference import pictures
from tokenswap.inference.backends import OpenAIBackend
from tokenswap.inference.pictures import picture_digest
from tokenswap.inference.types import Reply, RequestStats


def _encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _noise(size=(48, 32), mode="RGB") -> Image.Image:
    return Image.frombytes(mode, size, bytes((i * 7919) % 251 for i in range(size[0] * size[1] * len(mode))))


def _rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[Image.ExifTags.Base.Orientation] = 6  # "rotate 90° clockwise to view": width and height swap
    return _encoded(_noise(), "JPEG", exif=exif.tobytes(), quality=90)


@pytest.mark.parametrize("data, mode", [
    (_encoded(_noise(), "PNG"), None),
    (_encoded(_noise(mode="RGBA"), "PNG"), None),
    (_encoded(_noise(mode="RGBA"), "PNG"), "RGB"),
    (_encoded(_noise(mode="L"), "PNG"), None),
    (_rotated_jpeg(), None),
])
def test_a_stored_picture_decodes_to_what_datasets_gives(data, mode):
    from datasets import Image as ImageFeature

    stored = StoredPicture(data, mode, "bench row 0: the picture in column image_1")
    theirs = ImageFeature(mode=mode).decode_example({"bytes": data, "path": None})
    mine = stored.decode()
    assert (mine.mode, mine.size, mine.tobytes()) == (theirs.mode, theirs.size, theirs.tobytes())
    # Its digest is the decoded picture's, computed once and kept with it; as_rgb gives the RGB pixels.
    assert picture_digest(stored) == picture_digest(theirs) == stored.digest
    assert as_rgb(stored).tobytes() == theirs.convert("RGB").tobytes()


def test_the_rotation_is_applied():
    assert StoredPicture(_rotated_jpeg()).decode().size == (32, 48)


def test_a_damaged_file_is_refused_when_stored_and_a_cut_one_when_decoded_each_naming_the_picture():
    where = "bench (img/test) row 2: the picture in column image_1"
    png = _encoded(_noise(), "PNG")
    with pytest.raises(ValueError, match=r"row 2: the picture in column image_1 does not decode .*replace it or drop"):
        StoredPicture(b"\x89PNG\r\n\x1a\n not a png at all", None, where)
    with pytest.raises(ValueError, match="row 2: the picture in column image_1 does not decode"):
        StoredPicture(png[: len(png) // 2], None, where)  # a cut PNG: its chunks show it without decoding
    cut_jpeg = _encoded(_noise((64, 64)), "JPEG", quality=95)
    stored = StoredPicture(cut_jpeg[: len(cut_jpeg) * 3 // 5], None, where)  # a JPEG's cut shows only in decoding
    with pytest.raises(InputError, match=r"row 2: the picture in column image_1 does not decode \(OSError"):
        stored.decode()


def test_a_bench_loaded_for_eval_keeps_its_pictures_stored_and_gives_the_same_items(tmp_path):
    red, blue = Image.new("RGB", (24, 16), "red"), _noise()
    text = [MCItem(f"q{i}", "s", f"Is {w} here?", ["a", "b", "c", "d"], i % 4) for i, w in enumerate(["x", "y"])]
    inter = [MCItem("q0", "s", "Is <image 1> here?", ["a", "b", "c", "d"], 0, {1: red}),
             MCItem("q1", "s", "Is <image 1> with <image 2> here?", ["a", "b", "c", "d"], 1, {1: blue, 2: red})]
    write_tokenswap_bench(list(zip(text, inter)), tmp_path)
    decoded = load_tokenswap_bench_pairs(tmp_path)
    stored = load_tokenswap_bench_pairs(tmp_path, decode=False)
    assert all(isinstance(p, StoredPicture) for _, i in stored for p in i.images.values())
    assert [(t, i.question, i.concepts) for t, i in decoded] == [(t, i.question, i.concepts) for t, i in stored]
    for (_, a), (_, b) in zip(decoded, stored):
        assert {k: picture_digest(v) for k, v in a.images.items()} == {k: picture_digest(v) for k, v in b.images.items()}
        # The conversation a backend is sent has the same text and digests, and the same pixels once decoded.
        one, two = build_conversation(a, digests=True), build_conversation(b, digests=True)
        for p, q in zip(one[0]["content"], two[0]["content"]):
            assert {k: v for k, v in p.items() if k != "image"} == {k: v for k, v in q.items() if k != "image"}
            if p["type"] == "image":
                assert isinstance(q["image"], StoredPicture) and as_rgb(q["image"]).tobytes() == p["image"].tobytes()
    # A stored bench writes back the very bytes it read.
    write_tokenswap_bench(stored, tmp_path / "again")
    again = load_tokenswap_bench_pairs(tmp_path / "again", decode=False)
    assert [p.data for _, i in again for p in i.images.values()] == [p.data for _, i in stored for p in i.images.values()]


class _Endpoint:
    base_url = "http://127.0.0.1:9/v1"

    def __init__(self):
        self.stats = RequestStats()

    def request(self, messages, **kw) -> Reply:
        return Reply(text="A")


def test_the_item_forms_hash_no_picture_before_the_first_request_and_decode_each_once_per_purpose(monkeypatch):
    pictures_ = [StoredPicture(_encoded(Image.new("RGB", (20, 20), (k * 40, 0, 0)), "PNG")) for k in range(3)]
    pairs = [(MCItem(f"q{i}", "s", "Is a cat here?", ["a", "b", "c", "d"], 0),
              MCItem(f"q{i}", "s", "Is a <image 1> here?", ["a", "b", "c", "d"], 0, {1: pictures_[i % 3]}, {1: "cat"}))
             for i in range(9)]
    decodes = []
    decode = StoredPicture.decode
    monkeypatch.setattr(StoredPicture, "decode", lambda self: decodes.append(self) or decode(self))
    hashed = []
    digest = pictures._pixels_digest
    monkeypatch.setattr(pictures, "_pixels_digest", lambda image: hashed.append(1) or digest(image))

    plan = FormPlan(pairs, ("text", "interleaved"))
    units = plan.all_units()
    assert len(units) == 18 and not hashed and not decodes  # nothing hashed or decoded to plan these forms
    backend = OpenAIBackend(_Endpoint(), "served", concurrency=4)
    list(backend.generate((plan.conversation(u) for u in units), max_new_tokens=4))
    # Each picture decoded twice in the whole run: once for its digest, once to encode it; hashed once.
    assert len(hashed) == 3 and sorted(map(id, decodes)) == sorted(2 * [id(p) for p in pictures_])
    # The caption form needs the digests for its unit keys: the plan computes them when asked for those units.
    plan = FormPlan(pairs, ("text", "caption"))
    assert len(plan.caption_units()) == 3
