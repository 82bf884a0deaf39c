"""A prepared copy of an image store at the processor's target resolution (the collator's cold path).

Decoding a 512-px PNG and resizing it dominate the first use of an image. ``prepare_store``
runs the processor's own resize once per image and keeps the result losslessly (uint8 ``.npy``
under ``<store>/prepared/<processor tag>/``); the collator then only rescales, normalizes and
patchifies (``do_resize=False``). Every prepared image is checked to give exactly the pixels of
the unprepared path before it is written, so the collator's output does not change.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from tokenswap.store.image_store import ImageStore, atomic_write

__all__ = ["load_prepared", "prepare_store", "prepared_dir", "processor_tag"]


def processor_tag(image_processor) -> str:
    """Folder name that changes whenever the target resolution would."""
    size = image_processor.size
    return (
        f"{type(image_processor).__name__}-min{size.shortest_edge}-max{size.longest_edge}"
        f"-p{image_processor.patch_size}-m{image_processor.merge_size}"
    )


def prepared_dir(store: ImageStore, image_processor) -> Path:
    return store.root / "prepared" / processor_tag(image_processor)


def _resize(image_processor, image) -> torch.Tensor:
    """(3, H, W) uint8 at the target size, by the processor's own resize."""
    chw = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).contiguous()
    factor = image_processor.patch_size * image_processor.merge_size
    return image_processor.resize(chw[None], size=image_processor.size, resample=image_processor.resample,
                                  factor=factor)[0]


def prepare_store(store: ImageStore, image_processor, progress: bool = False) -> Path:
    """Write the prepared copy of every image of ``store`` (resumable: existing files are kept).

    Returns:
        The folder holding ``<image_id>.npy`` files.

    Raises:
        ValueError: the processor's resize is not reproducible this way (e.g. another
            processor class); nothing wrong is ever written.
    """
    from tqdm.auto import tqdm

    out = prepared_dir(store, image_processor)
    out.mkdir(parents=True, exist_ok=True)
    for im in tqdm(list(store), desc="prepare store", disable=not progress):
        path = out / f"{im.image_id}.npy"
        if path.exists():
            continue
        image = im.load()
        resized = _resize(image_processor, image)
        reference = image_processor(images=[image], return_tensors="pt")["pixel_values"]
        prepared = image_processor(images=[resized], do_resize=False, return_tensors="pt")["pixel_values"]
        if not torch.equal(reference, prepared):
            raise ValueError(
                f"{type(image_processor).__name__}: the prepared copy of image {im.image_id} ({im.key!r}) does not "
                "reproduce the processor's pixels; use the collator without prepare_store for this processor"
            )
        buf = io.BytesIO()
        np.save(buf, resized.numpy(), allow_pickle=False)
        atomic_write(path, buf.getvalue())
    return out


def load_prepared(folder: Path, image_id: str) -> torch.Tensor | None:
    """The prepared (3, H, W) uint8 tensor of an image, or None if it was not prepared."""
    path = folder / f"{image_id}.npy"
    if not path.exists():
        return None
    return torch.from_numpy(np.load(path, allow_pickle=False))
