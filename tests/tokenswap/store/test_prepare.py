"""The prepared copy of a store reproduces the processor's pixels exactly."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from tokenswap.collator import TokenSwapCollator
from tokenswap.store.image_store import ImageStore, StoreWriter
from tokenswap.store.prepare import (
    _fast_path_ok,
    load_prepared,
    prepare_store,
    prepared_dir,
    prepared_pixels,
    prepared_shape,
)


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


# ---------------------------------------------------------------------------- pixels of prepared images
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])  # 14- and 16-pixel patches, CLIP and 0.5 means
def test_prepared_pixels_equal_the_processor_call(family, family_processor):
    ip = family_processor(family).image_processor
    f = ip.patch_size * ip.merge_size
    gen = torch.Generator().manual_seed(0)
    for gh, gw in [(1, 1), (2, 5), (7, 3), (4, 4)]:
        chw = torch.randint(0, 256, (3, gh * f, gw * f), generator=gen).to(torch.uint8)
        ref = ip(images=[chw], do_resize=False, return_tensors="pt")
        pixels, grid = prepared_pixels(ip, chw)
        assert torch.equal(pixels, ref["pixel_values"]) and pixels.dtype == torch.float32
        assert grid == tuple(ref["image_grid_thw"][0].tolist())
        assert prepared_shape(ip, chw) == tuple(pixels.shape)
        out = torch.full(prepared_shape(ip, chw), float("nan"), dtype=torch.bfloat16)
        pixels, _ = prepared_pixels(ip, chw, out)
        assert pixels.data_ptr() == out.data_ptr() and torch.equal(pixels, ref["pixel_values"].to(torch.bfloat16))
    assert _fast_path_ok(ip)  # ... and it was the fast path that matched


def test_a_processor_that_patchifies_otherwise_keeps_its_own_call(tiny_processor):
    base = type(tiny_processor.image_processor)

    class Mirrored(base):
        """Patches in reverse order: the per-patch path would be wrong for it."""

        def patchify(self, images, **kwargs):
            patches, gh, gw = super().patchify(images, **kwargs)
            return patches.flip(1), gh, gw

    ip = copy.copy(tiny_processor.image_processor)
    ip.__class__ = Mirrored
    chw = torch.randint(0, 256, (3, 56, 84), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    ref = ip(images=[chw], do_resize=False, return_tensors="pt")["pixel_values"]
    assert not torch.equal(ref, tiny_processor.image_processor(images=[chw], do_resize=False,
                                                                return_tensors="pt")["pixel_values"])
    assert not _fast_path_ok(ip)
    assert torch.equal(prepared_pixels(ip, chw)[0], ref)


def same_size_store(root, n=6, side=120):
    rng = np.random.default_rng(2)
    with StoreWriter(root) as w:
        for i in range(n):
            w.add(f"thing{i}", Image.fromarray((rng.random((side, side, 3)) * 255).astype(np.uint8)), source="noise")
    return ImageStore(root)


def samples_for(keys):
    out = []
    for i, group in enumerate(keys):
        user = "Look: " + ", ".join(group) + "."
        concepts = []
        for key in group:
            start = user.index(key)
            concepts.append({"message": 0, "start": start, "end": start + len(key), "key": key})
        out.append({"id": f"s{i}", "messages": [{"role": "user", "content": user},
                                                {"role": "assistant", "content": "Seen."}], "concepts": concepts})
    return out


def test_evicted_entries_are_recycled_without_touching_pixels_still_in_use(tiny_processor, tmp_path):
    store = same_size_store(tmp_path / "store")
    folder = prepare_store(store, tiny_processor.image_processor)
    entry = prepared_pixels(tiny_processor.image_processor, load_prepared(folder, next(iter(store)).image_id))[0]
    # Room for one entry: every miss evicts the previous one, also within a batch, where the evicted
    # pixels are still to be copied into the batch (they must not be handed to the next miss).
    small = entry.nelement() * entry.element_size() * 3 // 2
    batches = [samples_for([["thing0", "thing1"], ["thing2", "thing3", "thing4"]]),
               samples_for([["thing5"], ["thing0", "thing2"]]),
               samples_for([["thing1", "thing3", "thing5", "thing4"]])]
    plain = TokenSwapCollator(tiny_processor, store, dummy_image=False, cache_bytes=0)
    fast = TokenSwapCollator(tiny_processor, store, dummy_image=False, cache_bytes=small, prepared=str(folder))
    for batch in batches * 2:
        want, got = plain(batch), fast(batch)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    assert fast.cache_info()["recycled"] > 0


def test_a_dropped_collators_cache_is_recycled_by_the_next(tiny_processor, tmp_path):
    store = same_size_store(tmp_path / "store")
    folder = prepare_store(store, tiny_processor.image_processor)
    batch = samples_for([["thing0", "thing1"], ["thing2"]])
    first = TokenSwapCollator(tiny_processor, store, dummy_image=False, prepared=str(folder))
    want = first(batch)
    del first  # its cache entries go to the recycler
    second = TokenSwapCollator(tiny_processor, store, dummy_image=False, prepared=str(folder))
    got = second(samples_for([["thing3", "thing4"], ["thing5"]]))
    assert second.cache_info()["recycled"] == 3
    plain = TokenSwapCollator(tiny_processor, store, dummy_image=False)
    for key in got:
        torch.testing.assert_close(got[key], plain(samples_for([["thing3", "thing4"], ["thing5"]]))[key], rtol=0, atol=0)
    for key in want:
        torch.testing.assert_close(want[key], plain(batch)[key], rtol=0, atol=0)  # the first batch is untouched
