"""Image sources: OpenMoji, rendered text, CLIP retrieval (tiny CLIP) and generation (tiny diffusers)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tokenswap.store.sources import GenerationSource, OpenMojiSource, RenderedTextSource, RetrievalSource


def test_openmoji_names_come_from_the_emoji_package():
    src = OpenMojiSource(size=64)
    vocab = src.vocabulary()
    assert {"red apple", "apple", "cat", "bicycle", "pizza"} <= set(vocab)
    assert "grinning face" not in vocab and "france" not in vocab  # faces and flags are left out
    assert src.codepoints("The Red Apple") == src.codepoints("apple") == "1F34E"
    out = src.images_for(["red apple", "no such thing"])
    image, score, meta = out["red apple"][0]
    assert image.size == (64, 64) and image.mode == "RGB" and score == 1.0 and meta == {"openmoji": "1F34E"}
    assert out["no such thing"] == []
    # Not a blank canvas: the pictogram drew something.
    assert np.asarray(image).std() > 10
    assert "CC BY-SA 4.0" in src.info["attribution"]


def test_rendered_text_draws_dark_text_on_white():
    (image, score, meta), = RenderedTextSource(size=96).images_for(["ice cream"])["ice cream"]
    pixels = np.asarray(image)
    assert image.size == (96, 96) and pixels[0, 0].tolist() == [255, 255, 255] and pixels.min() < 50
    assert score == 0.5 and meta == {"text": "ice cream"}
    fallback = RenderedTextSource(size=64, font_path="/nonexistent.ttf")
    assert fallback.images_for(["cat"])["cat"][0][0].size == (64, 64) and fallback.info["font"] == "pillow-default"


def _corpus(folder, n=6):
    folder.mkdir()
    colours = ["red", "green", "blue", "yellow", "black", "white", "purple", "orange"]
    for i in range(n):
        Image.new("RGB", (40, 30), colours[i % len(colours)]).save(folder / f"img{i}.png")
    return folder


def test_retrieval_over_a_folder_embeds_once_and_reuses_the_index(tiny_clip, tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    src = RetrievalSource(tiny_clip, str(corpus), tmp_path / "index", top_k=3, min_score=-1.0, chunk_size=4, batch_size=2)
    assert src.build_index() == 6
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["emb-000000.npy", "emb-000001.npy", "index.json"]
    out = src.images_for(["cat", "red apple"])
    assert [len(v) for v in out.values()] == [3, 3]
    scores = [s for _, s, _ in out["cat"]]
    assert scores == sorted(scores, reverse=True) and all(-1 <= s <= 1 for s in scores)
    assert out["cat"][0][2]["prompt"] == "An image describing cat"
    # Rerun: the saved chunks are loaded, not recomputed (their files are not rewritten).
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "index").iterdir()}
    again = RetrievalSource(tiny_clip, str(corpus), tmp_path / "index", top_k=3, min_score=-1.0, chunk_size=4)
    assert again.images_for(["cat"])["cat"][0][1] == pytest.approx(scores[0], abs=1e-2)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "index").iterdir()} == mtimes
    # The cosine threshold drops everything when set above 1.
    strict = RetrievalSource(tiny_clip, str(corpus), tmp_path / "index", min_score=1.0, chunk_size=4)
    assert strict.images_for(["cat"]) == {"cat": []}


def test_retrieval_over_a_saved_dataset(tiny_clip, tmp_path):
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    images = [Image.new("RGB", (20, 20), c) for c in ("red", "green", "blue")]
    ds = Dataset.from_dict({"img": images, "id": ["a", "b", "c"]}, features=Features({"img": ImageFeature(), "id": Value("string")}))
    ds.save_to_disk(tmp_path / "ds")
    src = RetrievalSource(tiny_clip, str(tmp_path / "ds"), tmp_path / "index", image_column="img", top_k=5, min_score=-1.0)
    out = src.images_for(["cat"])["cat"]
    assert len(out) == 3 and sorted(m["item"] for _, _, m in out) == [0, 1, 2]
    with pytest.raises(KeyError, match="image_column"):
        RetrievalSource(tiny_clip, str(tmp_path / "ds"), tmp_path / "index2", image_column="nope").build_index()


def test_generation_is_seeded_per_concept_not_per_batch(tiny_sd):
    src = GenerationSource(tiny_sd, num_inference_steps=2, batch_size=3, dtype="float32", num_images=2, device="cpu")
    together = src.images_for(["cat", "dog", "bicycle"])
    alone = GenerationSource(tiny_sd, num_inference_steps=2, batch_size=1, dtype="float32", num_images=2, device="cpu")
    single = alone.images_for(["dog"])
    assert [len(v) for v in together.values()] == [2, 2, 2]
    image, score, meta = together["dog"][0]
    assert image.mode == "RGB" and meta["prompt"] == "generate an image of a dog"
    for (a, _, ma), (b, _, mb) in zip(together["dog"], single["dog"]):
        assert ma["seed"] == mb["seed"]
        diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16))
        assert diff.max() <= 2  # same seed; batching may move a pixel by a rounding step
    assert not np.array_equal(np.asarray(together["dog"][0][0]), np.asarray(together["dog"][1][0]))
