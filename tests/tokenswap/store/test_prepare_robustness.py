"""The prepared store copy on hostile stores: ids cannot name files outside it, damaged files fall back."""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import SCHEMA, ImageStore, StoreWriter, image_id_of
from tokenswap.store.prepare import PreparedImageError, load_prepared, prepare_store, prepared_name
from tokenswap.swap import SwapPolicy

HOSTILE_IDS = ["../../evil", "/tmp/tokenswap-abs-evil", "a/b", "..", ".", "", "x" * 300, "ok\\..\\win"]


def png(color, size=(90, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def write_rows(root, rows: list[dict]) -> None:
    full = [{"concept": r["key"], "source": "hostile", "score": 1.0, "width": 1, "height": 1, "meta": "{}", **r}
            for r in rows]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist(full, schema=SCHEMA))
    (root / "shards" / "part-r007-000000.arrow").write_bytes(sink.getvalue().to_pybytes())


def sample(words: list[str]) -> dict:
    user = " and ".join(words)
    concepts, pos = [], 0
    for w in words:
        start = user.index(w, pos)
        concepts.append({"message": 0, "start": start, "end": start + len(w), "key": w})
        pos = start + len(w)
    return {"id": "s", "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "ok"}],
            "concepts": concepts}


def batches_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


@pytest.fixture
def hostile_store(tmp_path):
    root = tmp_path / "store"
    with StoreWriter(root) as w:
        w.add("apple", Image.new("RGB", (70, 50), "red"), source="ok")
    colors = ["blue", "green", "yellow", "purple", "orange", "pink", "brown", "gray"]
    keys = [f"thing{i}" for i in range(len(HOSTILE_IDS))]
    write_rows(root, [{"key": k, "image_id": i, "image": png(c)} for k, i, c in zip(keys, HOSTILE_IDS, colors)])
    return ImageStore(root), keys


def test_prepared_names_never_leave_the_folder():
    names = {prepared_name(i) for i in HOSTILE_IDS}
    assert len(names) == len(HOSTILE_IDS)
    for name in names:
        assert "/" not in name and "\\" not in name and not name.startswith(".") and len(name) < 100
    assert prepared_name("0123abcd0123abcd") == "0123abcd0123abcd.npy"
    assert prepared_name("../x") != prepared_name("..x")


def test_hostile_ids_are_never_served_nor_name_a_file(tiny_processor, hostile_store, tmp_path, caplog):
    # An id that is not its bytes' content hash never gets past the read (ImageMismatchError): prepare_store
    # writes nothing for it, inside the folder or out, and the collator keeps its concept as text.
    store, keys = hostile_store
    ip = tiny_processor.image_processor
    planted = tmp_path / "store" / "prepared" / "evil.npy"  # where "<folder>/../../evil.npy" used to land
    planted.parent.mkdir(parents=True, exist_ok=True)
    np.save(planted, np.zeros((3, 28, 56), np.uint8))
    with caplog.at_level(logging.WARNING, logger="tokenswap.store.prepare"):
        folder = prepare_store(store, ip)
    outside = [p for p in tmp_path.rglob("*.npy") if folder not in p.parents]
    assert outside == [planted]  # only the planted file: nothing was written outside the folder
    assert [p.name for p in folder.glob("*.npy")] == [prepared_name(store.get("apple")[0].image_id)]
    assert f"{len(HOSTILE_IDS)} image(s)" in caplog.text and "does not match its content hash" in caplog.text
    assert not (tmp_path / "tokenswap-abs-evil.npy").exists()

    examples = [sample(["apple", *keys[:4]]), {**sample(keys[4:]), "id": "t"}]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = TokenSwapCollator(tiny_processor, store, SwapPolicy(swap_prob=1.0), dummy_image=False)(examples)
        collator = TokenSwapCollator(tiny_processor, store, SwapPolicy(swap_prob=1.0), dummy_image=False,
                                     prepared=str(folder))
        batches_equal(collator(examples), plain)
    assert collator.stats["prepared_fallback"] == 0 and collator.stats["concepts_swapped"] == 1
    assert collator.stats["concepts_text_hash_mismatch"] == len(HOSTILE_IDS)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda p: p.write_bytes(b"\x93NUMPY garbage"), "does not load"),
        (lambda p: p.write_bytes(b""), "does not load"),
        (lambda p: np.save(p, np.load(p).astype(np.float32)), "float32"),
        (lambda p: np.save(p, np.zeros((4, 28, 28), np.uint8)), r"\(4, 28, 28\)"),
        (lambda p: np.save(p, np.zeros((3, 30, 30), np.uint8)), "30x30, not a size"),
        (lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True), "does not load"),
    ],
)
def test_damaged_prepared_files_fall_back_to_the_store_image(tiny_processor, tmp_path, damage, match):
    with StoreWriter(tmp_path / "store") as w:
        for key, color in [("apple", "red"), ("pear", "green")]:
            w.add(key, Image.new("RGB", (70, 50), color), source="ok")
    store = ImageStore(tmp_path / "store")
    ip = tiny_processor.image_processor
    folder = prepare_store(store, ip)
    apple = store.get("apple")[0]
    damage(folder / prepared_name(apple.image_id))
    with pytest.raises(PreparedImageError, match=match):
        load_prepared(folder, apple.image_id, ip)

    examples = [sample(["apple", "pear"])]
    plain = TokenSwapCollator(tiny_processor, store, SwapPolicy(swap_prob=1.0), dummy_image=False)(examples)
    collator = TokenSwapCollator(tiny_processor, store, SwapPolicy(swap_prob=1.0), dummy_image=False,
                                 prepared=str(folder))
    with pytest.warns(UserWarning, match="prepared copy of 'apple' not used"):
        batch = collator(examples)
    batches_equal(batch, plain)
    assert collator.stats["prepared_fallback"] == 1
    assert collator.stats["image_decodes"] == 1  # apple from the store, pear from the prepared copy


def test_prepare_store_leaves_out_images_that_do_not_decode(tiny_processor, tmp_path, caplog):
    root = tmp_path / "store"
    with StoreWriter(root) as w:
        w.add("apple", Image.new("RGB", (70, 50), "red"), source="ok")
    cut, sliver = png("blue")[:60], png("white", (1, 4000))
    write_rows(root, [{"key": "cut", "image_id": image_id_of(cut), "image": cut},
                      {"key": "sliver", "image_id": image_id_of(sliver), "image": sliver}])
    store = ImageStore(root)
    with caplog.at_level(logging.WARNING, logger="tokenswap.store.prepare"):
        folder = prepare_store(store, tiny_processor.image_processor)
    assert [p.name for p in folder.glob("*.npy")] == [prepared_name(store.get("apple")[0].image_id)]
    assert "2 image(s)" in caplog.text and image_id_of(cut) in caplog.text
    collator = TokenSwapCollator(tiny_processor, store, SwapPolicy(swap_prob=1.0), dummy_image=False,
                                 prepared=str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = collator([sample(["apple", "cut", "sliver"])])
    assert batch["image_grid_thw"].shape[0] == 1
    assert collator.stats["concepts_text_corrupt_image"] == 2
