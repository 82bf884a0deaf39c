"""ImageStore / StoreWriter unit tests: atomic shards, key normalization, corrupt bytes."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from PIL import Image

from tokenswap.errors import InputError
from tokenswap.store import CorruptImageError, ImageStore, StoreWriter
from tokenswap.store.image_store import SCHEMA, StoreFormatError


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


# ---------------------------------------------------------------------------- damaged store files
def _store_with_two_shards(root):
    with StoreWriter(root, shard_size=1) as w:
        w.add("cat", Image.new("RGB", (8, 8), "red"), source="test")
        w.add("dog", Image.new("RGB", (8, 8), "blue"), source="test")
    return sorted((root / "shards").glob("*.arrow"))


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not a readable Arrow IPC stream"),
        (lambda p: p.write_bytes(b"garbage" * 100), "not a readable Arrow IPC stream"),
        (lambda p: p.write_bytes(b""), "not a readable Arrow IPC stream"),
    ],
    ids=["truncated", "garbage", "empty"],
)
def test_a_damaged_shard_is_named_with_what_is_wrong(tmp_path, damage, match):
    shard = _store_with_two_shards(tmp_path)[1]
    opened = ImageStore(tmp_path)
    damage(shard)
    with pytest.raises(StoreFormatError, match=rf"{shard}: {match}"):
        opened.to_dataset()
    with pytest.raises(StoreFormatError, match=rf"{shard}: {match}.*restore the file, or delete it"):
        ImageStore(tmp_path)
    StoreWriter(tmp_path).close()  # a writer reads no shard: it keeps working on a store with a damaged one


def test_a_shard_with_other_columns_or_a_bad_row_is_named(tmp_path):
    shard = _store_with_two_shards(tmp_path)[0]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("key", pa.string())])) as writer:
        writer.write_table(pa.table({"key": ["cat"]}))
    shard.write_bytes(sink.getvalue().to_pybytes())
    with pytest.raises(StoreFormatError, match=rf"{shard}: not an image-store shard, wrong columns: concept \(missing"):
        ImageStore(tmp_path)
    row = {n: None for n in SCHEMA.names} | {"key": "cat", "image_id": "x", "image": b"x", "score": 1.0, "meta": "{no"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist([row], schema=SCHEMA))
    shard.write_bytes(sink.getvalue().to_pybytes())
    with pytest.raises(StoreFormatError, match=rf"{shard} row 0: .*the shard is damaged"):
        ImageStore(tmp_path)


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", r"not valid JSON"),
        ('["a", "list"]', r"expected a JSON object with \"format\": 'tokenswap-image-store', got a JSON list"),
        ('{"format": "other"}', r"format is 'other', expected 'tokenswap-image-store'"),
        (b"\xff\xfe{}", r"not UTF-8 text"),
    ],
    ids=["invalid-json", "list", "other-format", "not-utf8"],
)
def test_a_damaged_store_json_is_named_with_what_is_wrong(tmp_path, content, match):
    _store_with_two_shards(tmp_path)
    info = tmp_path / "store.json"
    info.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StoreFormatError, match=rf"{info}: {match}"):
        ImageStore(tmp_path)
    if "format" not in match:  # a writer reads store.json to merge its info into it
        with pytest.raises(StoreFormatError, match=str(info)):
            StoreWriter(tmp_path)


def test_a_damaged_swap_dataset_shard_is_named_by_file_and_line(tmp_path):
    from tokenswap.store import read_swap_dataset

    part = tmp_path / "part-r000-000000.jsonl"
    good = '{"id": "s0", "messages": [{"role": "user", "content": "a cat"}], "concepts": [], "images": []}\n'
    part.write_bytes(good.encode() + b'{"id": "s1", "messages": "\xff\xfe"}\n')
    with pytest.raises(InputError, match=rf"swap dataset shard {part}:2 is not UTF-8 text \(byte 26 of the line\)"):
        read_swap_dataset(tmp_path)
    part.write_bytes(good.encode() + good[:20].encode() + b"\n")
    with pytest.raises(InputError, match=rf"{part}:2 is not valid JSON .*this build file is damaged"):
        read_swap_dataset(tmp_path)


# ---------------------------------------------------------------------------- shards changed under a reader
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
CONCEPTS = ["cat", "dog", "apple", "tree", "car", "boat", "house", "bird"]


def _one_shard_store(root, colours):
    """A store of the 8 concepts in one shard, concept i a noisy picture in ``colours[i]``; the shard's path.

    Noise keeps each PNG ~12 kB, so the shard spans many memory pages (a truncation then cuts pages a
    memory map would fault on)."""
    with StoreWriter(root) as w:
        for concept, colour in zip(CONCEPTS, colours):
            noise = Image.frombytes("RGB", (64, 64), random.Random(colour).randbytes(64 * 64 * 3))
            w.add(concept, Image.blend(Image.new("RGB", (64, 64), colour), noise, 0.5), source="test")
    (shard,) = (root / "shards").glob("*.arrow")
    return shard


def _sample(concept):
    text = f"Draw a {concept} please"
    return {"id": concept, "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
            "concepts": [{"message": 0, "start": 7, "end": 7 + len(concept), "key": concept}], "images": []}


def test_a_shard_copied_over_in_place_serves_no_other_concepts_picture(tmp_path, tiny_processor):
    import shutil
    import warnings

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.store.image_store import ImageMismatchError

    shard = _one_shard_store(tmp_path / "store", COLOURS)
    store = ImageStore(tmp_path / "store")
    assert len({store.get(c)[0].load_bytes() for c in CONCEPTS}) == 8  # each read (and hashed) once before
    # A rebuild elsewhere with the pictures of other concepts, copied over the live shard as `cp` does
    # (truncate and write the same inode, which is what a reader's memory map sees).
    other = _one_shard_store(tmp_path / "rebuilt", COLOURS[::-1])
    inode = shard.stat().st_ino
    shutil.copyfile(other, shard)
    assert shard.stat().st_ino == inode and shard.read_bytes() == other.read_bytes()
    for c in CONCEPTS:
        with pytest.raises(ImageMismatchError, match=rf"{shard}: image \w+ of concept '{c}' does not match its "
                                                     r"content hash .*rename it over the old one"):
            store.get(c)[0].load_bytes()
    collator = TokenSwapCollator(tiny_processor, store, max_length=512, dummy_image=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = collator([_sample(c) for c in CONCEPTS])
    assert collator.stats["concepts_text_hash_mismatch"] == 8, sorted(collator.stats.items())
    assert collator.stats["concepts_swapped"] == 0 and collator.stats["concepts_text_corrupt_image"] == 0
    assert "pixel_values" not in batch and (batch["mm_token_type_ids"] == 0).all()  # no picture at all
    assert len([w for w in caught if "content hash" in str(w.message)]) == 1


def test_bytes_written_in_place_fail_only_the_image_they_hit(tmp_path):
    from tokenswap.store.image_store import ImageMismatchError

    shard = _one_shard_store(tmp_path, COLOURS)
    store = ImageStore(tmp_path)
    before = {c: store.get(c)[0].load_bytes() for c in CONCEPTS}
    data = shard.read_bytes()
    at = data.index(before["apple"]) + len(before["apple"]) // 2
    with open(shard, "r+b") as f:  # rsync --inplace / a bad disk: the same file, some bytes changed
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data[at : at + 4]))
    with pytest.raises(ImageMismatchError, match="concept 'apple' does not match its content hash"):
        store.get("apple")[0].load_bytes()
    assert {c: store.get(c)[0].load_bytes() for c in CONCEPTS if c != "apple"} == \
        {c: b for c, b in before.items() if c != "apple"}


@pytest.mark.integration
def test_a_shard_truncated_in_place_under_a_reader_is_a_clear_fallback_not_sigbus(tmp_path):
    # In a child process: before the reads were preads, the reader's memory map died here with SIGBUS (rc -7).
    import subprocess
    import sys

    shard = _one_shard_store(tmp_path, COLOURS)
    half = shard.stat().st_size // 2
    code = f"""
import os
from tokenswap.store import ImageStore
from tokenswap.store.image_store import ImageMismatchError
store = ImageStore({str(tmp_path)!r})
os.truncate({str(shard)!r}, {half})
served, refused = 0, []
for c in {CONCEPTS!r}:
    try:
        store.get(c)[0].load(); served += 1
    except ImageMismatchError as e:
        refused.append(str(e))
print(served, len(refused))
print(refused[0])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    served, refused = map(int, proc.stdout.splitlines()[0].split())
    assert served + refused == 8 and 3 <= served <= 4, proc.stdout  # the pictures wholly before the cut are intact
    assert f"{shard}: image" in proc.stdout and f"the shard is {half} bytes now" in proc.stdout
    assert "truncated in place" in proc.stdout


def test_a_store_pickles_and_reads_in_the_copy(tmp_path):
    import pickle

    _one_shard_store(tmp_path, COLOURS)
    store = ImageStore(tmp_path)
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("cat")[0].load_bytes() == store.get("cat")[0].load_bytes()


def test_concurrent_atomic_writes_of_one_file_never_rename_each_others_file_away(tmp_path):
    # Two ranks of a build write store.json at once; with one shared temporary name one rank's rename found the
    # other's file gone (FileNotFoundError in a 2-rank CI build) or renamed a file the other was still writing.
    import json
    import threading

    from tokenswap.files import atomic_write

    path = tmp_path / "store.json"
    errors: list[BaseException] = []

    def writer(tag: str) -> None:
        try:
            for i in range(300):
                atomic_write(path, json.dumps({"writer": tag, "i": i, "pad": "x" * 4096}).encode())
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert json.loads(path.read_text())["i"] == 299  # a whole file, the last write of one writer
    assert not list(tmp_path.glob("*.tmp"))


def test_a_writer_commits_the_shard_number_asked_for_and_never_overwrites_a_committed_one(tmp_path):
    """The store build numbers a batch's shard by its position (a redone batch keeps its name); a number already
    committed is refused, and free_shard gives the next free one instead."""
    w = StoreWriter(tmp_path, rank=1)
    w.add("apple", None, source="none")
    w.flush(shard=3)
    assert [p.name for p in (tmp_path / "shards").iterdir()] == ["part-r001-000003.arrow"]
    assert (w.next_shard, w.free_shard(3), w.free_shard(1)) == (4, 4, 1)
    w.add("pear", None, source="none")
    with pytest.raises(ValueError, match="shard 3 of rank 1 is committed"):
        w.flush(shard=3)
    again = StoreWriter(tmp_path, rank=1)  # a resumed writer knows what is committed
    assert (again.free_shard(3), StoreWriter(tmp_path, rank=0).free_shard(3)) == (4, 3)
    w.flush(shard=w.free_shard(3))
    assert ImageStore(tmp_path).attempted("apple") and ImageStore(tmp_path).attempted("pear")
