"""ImageStore / StoreWriter unit tests: atomic shards, key normalization, corrupt bytes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from PIL import Image

from tokenswap.store import CorruptImageError, ImageStore, StoreWriter
from tokenswap.store.image_store import SCHEMA


def test_leftover_tmp_shard_is_ignored_and_cleaned(tmp_path):
    with StoreWriter(tmp_path) as w:
        w.add("cat", Image.new("RGB", (8, 8), "black"), source="t")
    (tmp_path / "shards" / "part-r000-000001.arrow.tmp").write_bytes(b"half a shard")
    store = ImageStore(tmp_path)
    assert len(store) == 1 and store.num_images == 1
    StoreWriter(tmp_path, rank=0).close()
    assert not list((tmp_path / "shards").glob("*.tmp"))


def test_get_normalizes_the_concept(tmp_path):
    with StoreWriter(tmp_path) as w:
        w.add("Red Apple", Image.new("RGB", (8, 8), "red"), source="t", score=0.2)
        w.add("red apple", Image.new("RGB", (8, 8), "darkred"), source="t", score=0.9)
        w.add("unicorn", None, source="none")
    store = ImageStore(tmp_path)
    assert [im.score for im in store.get("  the RED apple. ")] == pytest.approx([0.9, 0.2])
    assert store.get("unicorn") == [] and store.attempted("Unicorn") and not store.attempted("dragon")
    assert "The red apple" in store and "unicorn" not in store


def test_corrupt_bytes_raise_on_load(tmp_path):
    # StoreWriter refuses undecodable bytes, so damage a committed shard as a bad disk would.
    with StoreWriter(tmp_path) as w:
        w.add("cat", Image.new("RGB", (8, 8), "black"), source="t")
    (shard,) = (tmp_path / "shards").glob("*.arrow")
    table = pa.ipc.open_stream(shard.read_bytes()).read_all()
    table = table.set_column(table.schema.get_field_index("image"), "image", pa.array([b"\x89PNG not really"], pa.binary()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(table)
    shard.write_bytes(sink.getvalue().to_pybytes())
    (im,) = ImageStore(tmp_path).get("cat")
    with pytest.raises(CorruptImageError, match="cat"):
        im.load()
