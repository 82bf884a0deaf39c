"""Section ``native_images`` of benchmarks/faults.py: hostile native images (and store images) through the real
collator with the tiny processor: the sample is dropped and counted (native) or the concept stays text (store).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ._common import Tally, hostile

OUTCOME = (
    "native: sample dropped and counted (`samples_dropped_bad_native_image`), batch goes on; store "
    "image: the concept stays text (`concepts_text_corrupt_image`)"
)


def section_native_images(t: Tally, work: Path, model: Path) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    from tokenswap.collator import TokenSwapCollator
    from tokenswap.images import BadImageError
    from tokenswap.store import ImageStore, StoreWriter

    processor = AutoProcessor.from_pretrained(model)
    root = work / "native"
    root.mkdir(exist_ok=True)
    Image.new("RGB", (64, 48), "green").save(root / "good.png")
    bad = hostile.hostile_files(root)
    (root / "empty.png").write_bytes(b"")
    Image.new("RGB", (8, 8), "red").save(work / "outside.png")
    cases = [(p.name, p.name) for p in bad] + [("empty.png", "empty.png"), ("../outside.png", "a ../ path"),
                                               (str(work / "outside.png"), "an absolute path outside image_root")]
    collator = TokenSwapCollator(processor, None, image_root=str(root), max_length=512)

    def sample(sid: str, image: str) -> dict:
        return {"id": sid, "messages": [{"role": "user", "content": "<image>\nWhat is this?"},
                                        {"role": "assistant", "content": "A picture."}],
                "concepts": [], "images": [image]}

    for image, label in cases:
        before = collator.stats["samples_dropped_bad_native_image"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                batch = collator([sample("good", "good.png"), sample("bad", image)])
            dropped = collator.stats["samples_dropped_bad_native_image"] - before
            ok = dropped == 1 and batch["input_ids"].shape[0] == 1
            detail = f"dropped={dropped}, rows={batch['input_ids'].shape[0]}"
        except Exception as e:  # noqa: BLE001 - any exception here is the fault we look for
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("native_images", f"native image: {label} in a batch with a good sample", ok, detail)

    # Store images: StoreWriter refuses hostile bytes; one planted in a shard anyway (an old or
    # tampered store) leaves its swapped concept as text.
    for kind, make in [("bomb", hostile.bomb_png), ("sliver", hostile.sliver_png), ("truncated", hostile.truncated_jpeg)]:
        data = make(work / f"planted-{kind}.{'jpg' if kind == 'truncated' else 'png'}").read_bytes()
        store_root = work / f"store-{kind}"
        if kind != "truncated":  # a truncated file has a good header; StoreWriter reads headers only
            try:
                with StoreWriter(store_root / "refused") as w:
                    w.add("cat", data, source="test")
                t.add("native_images", f"StoreWriter.add of {kind} bytes", False, "accepted")
            except BadImageError as e:
                t.add("native_images", f"StoreWriter.add of {kind} bytes", "cat" in str(e), str(e))
        _plant(store_root, "cat", data)
        collator = TokenSwapCollator(processor, ImageStore(store_root), max_length=512)
        text = "Draw a cat please"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                collator([{"id": "s", "messages": [{"role": "user", "content": text},
                                                   {"role": "assistant", "content": "ok"}],
                           "concepts": [{"message": 0, "start": 7, "end": 10, "key": "cat"}], "images": []}])
            ok = collator.stats["concepts_text_corrupt_image"] == 1 and collator.stats["concepts_swapped"] == 0
            detail = dict(collator.stats)
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        t.add("native_images", f"store image of a swapped concept: {kind}", ok, str(detail))


def _plant(root: Path, concept: str, data: bytes) -> None:
    """Write a store shard holding ``data`` as-is, bypassing StoreWriter's checks."""
    import pyarrow as pa

    from tokenswap.files import atomic_write
    from tokenswap.store import StoreWriter
    from tokenswap.store.image_store import SCHEMA, image_id_of

    StoreWriter(root).close()  # store.json
    row = {"key": concept, "concept": concept, "image_id": image_id_of(data), "image": data, "source": "planted",
           "score": 1.0, "width": 0, "height": 0, "meta": "{}"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(pa.Table.from_pylist([row], schema=SCHEMA))
    atomic_write(root / "shards" / "part-r000-000000.arrow", sink.getvalue().to_pybytes())
