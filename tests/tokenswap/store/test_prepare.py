"""The prepared copy of a store reproduces the processor's pixels exactly."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore, StoreWriter
from tokenswap.store.prepare import load_prepared, prepare_store, prepared_dir


def test_prepared_copy_gives_identical_batches_and_is_resumable(tiny_processor, swap_samples, tmp_path):
    rng = np.random.default_rng(0)
    with StoreWriter(tmp_path / "store") as w:
        for i, key in enumerate(["circle", "square", "triangle", "apple", "banana", "tomato", "cat", "café"]):
            pixels = (rng.random((200 + 37 * i, 310 - 20 * i, 3)) * 255).astype(np.uint8)  # odd sizes: real resizes
            w.add(key, Image.fromarray(pixels), source="noise")
    store = ImageStore(tmp_path / "store")
    folder = prepare_store(store, tiny_processor.image_processor)
    assert folder == prepared_dir(store, tiny_processor.image_processor)
    files = sorted(folder.glob("*.npy"))
    assert len(files) == store.num_images
    some = next(iter(store))
    resized = load_prepared(folder, some.image_id)
    assert resized.dtype == torch.uint8 and resized.shape[0] == 3 and resized.shape[1] % 28 == 0

    plain = TokenSwapCollator(tiny_processor, store, dummy_image=False)(swap_samples)
    prepared = TokenSwapCollator(tiny_processor, store, dummy_image=False, prepared=str(folder))
    fast = prepared(swap_samples)
    for key in plain:
        torch.testing.assert_close(fast[key], plain[key], rtol=0, atol=0, msg=key)
    assert prepared.cache_info()["misses"] > 0  # the misses were served from the prepared copy

    mtimes = [f.stat().st_mtime_ns for f in files]
    prepare_store(store, tiny_processor.image_processor)  # a rerun rewrites nothing
    assert [f.stat().st_mtime_ns for f in files] == mtimes
