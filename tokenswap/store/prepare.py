"""A prepared copy of an image store at the processor's target resolution (the collator's cold path).

Decoding a 512-px PNG and resizing it dominate the first use of an image. ``prepare_store``
runs the processor's own resize once per image and keeps the result losslessly (uint8 ``.npy``
under ``<store>/prepared/<processor tag>/``); the collator then only rescales, normalizes and
patchifies (``do_resize=False``). Every prepared image is checked to give exactly the pixels of
the unprepared path before it is written, so the collator's output does not change.

The copy is a cache, never the truth: file names are a safe encoding of the image id (an id
holding ``../``, a separator or an absolute path cannot name a file outside the folder), and
:func:`load_prepared` checks that a file is a uint8 ``(3, H, W)`` array at a size the processor
could emit, raising :class:`PreparedImageError` otherwise so the caller falls back to the store
image. A store image that cannot be used is left out (logged) instead of stopping the run.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from pathlib import Path

import numpy as np
import torch

from tokenswap.files import atomic_write
from tokenswap.images import BadImageError
from tokenswap.store.image_store import ImageStore

__all__ = [
    "PreparedImageError",
    "load_prepared",
    "prepare_store",
    "prepared_dir",
    "prepared_name",
    "prepared_pixels",
    "prepared_shape",
    "processor_tag",
]

logger = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class PreparedImageError(ValueError):
    """A prepared file that cannot be trusted (corrupt, wrong dtype or shape); use the store image instead."""


def prepared_name(image_id: str) -> str:
    """File name of an image's prepared copy; never a path outside the folder, whatever the id holds.

    Store ids are content hashes (``image_id_of``) and keep their name. Any other id (``../x``,
    ``/etc/x``, ``a/b``, ``.``, empty, too long) is named by its hash after a ``~``, a character
    safe ids cannot contain, so the two kinds never collide.

    >>> prepared_name("0123abcd0123abcd"), prepared_name("../../x")[:5]
    ('0123abcd0123abcd.npy', '~9cdf')
    """
    if not isinstance(image_id, str):
        raise PreparedImageError(f"image id must be a str, got {type(image_id).__name__}")
    if _SAFE_ID.fullmatch(image_id):
        return f"{image_id}.npy"
    return f"~{hashlib.sha256(image_id.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.npy"


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
    skipped = 0
    for im in tqdm(list(store), desc="prepare store", disable=not progress):
        path = out / prepared_name(im.image_id)
        if path.exists():
            continue
        try:
            image = im.load()
        except BadImageError as e:  # the collator keeps such a concept as text; nothing to prepare
            skipped += 1
            logger.warning("prepare_store: left out %s", e)
            continue
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
    if skipped:
        logger.warning("prepare_store: %d image(s) of %s do not decode and were left out", skipped, store.root)
    return out


def load_prepared(folder: Path, image_id: str, image_processor=None) -> torch.Tensor | None:
    """The prepared (3, H, W) uint8 tensor of an image, or None if it was not prepared.

    Args:
        folder: the folder :func:`prepare_store` wrote.
        image_id: the store image id.
        image_processor: when given, H and W must also be a size its resize can emit (multiples of
            ``patch_size · merge_size``, ``H·W`` within its pixel bounds).

    Raises:
        PreparedImageError: the file does not load as a plain array, or has the wrong dtype or shape;
            the message names the file.
    """
    path = Path(folder) / prepared_name(image_id)
    if not path.is_file():
        return None
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError, OSError, EOFError or others on damaged files
        raise PreparedImageError(f"{path} does not load ({type(e).__name__}: {e})") from None
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 3 or array.shape[0] != 3:
        got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise PreparedImageError(f"{path} holds {got}, expected a uint8 (3, H, W) array")
    h, w = array.shape[1:]
    if image_processor is not None:
        factor = image_processor.patch_size * image_processor.merge_size
        size = image_processor.size
        if h % factor or w % factor or not size.shortest_edge <= h * w <= size.longest_edge:
            raise PreparedImageError(
                f"{path} is {h}x{w}, not a size {type(image_processor).__name__} emits (multiples of {factor}, "
                f"{size.shortest_edge}..{size.longest_edge} pixels); it was written for another processor"
            )
    elif h == 0 or w == 0:
        raise PreparedImageError(f"{path} is {h}x{w}, an empty image")
    return torch.from_numpy(array)


# ---------------------------------------------------------------------------- pixels of a prepared image
_FAST_PATH_OK: dict[tuple, bool] = {}


def _as_tuple(value):
    """A list mean/std as a tuple: hashable (the processor caches its fused mean/std by argument)."""
    return tuple(value) if isinstance(value, list) else value


def _signature(image_processor) -> tuple:
    """Everything :func:`_patchify_normalize` depends on; processors that agree on it compute the same pixels."""
    ip = image_processor
    return (type(ip), ip.patch_size, ip.merge_size, ip.temporal_patch_size, ip.do_rescale, ip.rescale_factor,
            ip.do_normalize, _as_tuple(ip.image_mean), _as_tuple(ip.image_std))


def prepared_shape(image_processor, chw: torch.Tensor) -> tuple[int, int]:
    """Shape of the ``pixel_values`` of a prepared ``(3, H, W)`` image: ``(patches, C·T·P·P)``."""
    ip = image_processor
    c, h, w = chw.shape
    return (h // ip.patch_size) * (w // ip.patch_size), c * ip.temporal_patch_size * ip.patch_size**2


def _patchify_normalize(
    image_processor, chw: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """The processor's pixels for a ``(3, H, W)`` uint8 image at its target size, without the call's overhead.

    The same two steps as the processor: its own ``rescale_and_normalize`` on the whole image, then
    the patch gather, written by one strided copy straight into the ``(N, C·T·P·P)`` output with each
    patch repeated over the temporal axis (the processor reshapes twice and validates its keyword
    arguments on every call: about half the time of a prepared image went there). ``out`` (of
    :func:`prepared_shape`, any float dtype) receives the pixels, cast as ``Tensor.to`` casts.
    """
    ip = image_processor
    c, h, w = chw.shape
    ps, m, t = ip.patch_size, ip.merge_size, ip.temporal_patch_size
    gh, gw = h // ps, w // ps
    normed = ip.rescale_and_normalize(chw[None], ip.do_rescale, ip.rescale_factor, ip.do_normalize,
                                      _as_tuple(ip.image_mean), _as_tuple(ip.image_std))[0]
    # (C, gh/m, m, P, gw/m, m, P) -> (gh/m, gw/m, m, m, C, [T], P, P): the processor's patch order
    src = normed.reshape(c, gh // m, m, ps, gw // m, m, ps).permute(1, 4, 2, 5, 0, 3, 6).unsqueeze(5)
    if out is None:
        out = torch.empty((gh * gw, c * t * ps * ps), dtype=normed.dtype)
    elif out.shape != (gh * gw, c * t * ps * ps) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {(gh * gw, c * t * ps * ps)} tensor, got {tuple(out.shape)}")
    out.view(gh // m, gw // m, m, m, c, t, ps, ps).copy_(src.expand(gh // m, gw // m, m, m, c, t, ps, ps))
    return out, (1, gh, gw)


def _fast_path_ok(image_processor) -> bool:
    """Whether :func:`_patchify_normalize` equals the processor exactly, checked once per processor configuration.

    The check runs both on a random image of 2 x 3 merged patches (a non-square grid, so a swapped
    axis shows) with every uint8 value present; any difference or error keeps the processor's own path.
    """
    try:
        key = _signature(image_processor)
    except AttributeError:  # not a Qwen2-VL-style processor: always its own path
        return False
    ok = _FAST_PATH_OK.get(key)
    if ok is None:
        ip = image_processor
        f = ip.patch_size * ip.merge_size
        gen = torch.Generator().manual_seed(0)
        probe = torch.randint(0, 256, (3, 2 * f, 3 * f), generator=gen, dtype=torch.int64).to(torch.uint8)
        probe.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
        try:
            ref = ip(images=[probe], do_resize=False, return_tensors="pt")
            ours, grid = _patchify_normalize(ip, probe)
            ok = torch.equal(ref["pixel_values"], ours) and tuple(ref["image_grid_thw"][0].tolist()) == grid
        except Exception as e:  # noqa: BLE001 - any surprise means: use the processor
            logger.info("prepared fast path off for %s (%s: %s)", type(ip).__name__, type(e).__name__, e)
            ok = False
        if not ok:
            logger.warning("prepared images of %s go through the processor call (the per-patch path differs "
                           "for this configuration)", type(ip).__name__)
        _FAST_PATH_OK[key] = ok
    return ok


def prepared_pixels(
    image_processor, chw: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``pixel_values`` and ``(t, h, w)`` grid of a prepared ``(3, H, W)`` uint8 image, as the processor gives.

    Equal to ``image_processor(images=[chw], do_resize=False)`` (cast to ``out.dtype`` when ``out`` is
    given; ``out`` must have :func:`prepared_shape`): computed without the processor call when that
    was verified for this processor configuration (:func:`_fast_path_ok`), by the processor otherwise.
    """
    if _fast_path_ok(image_processor):
        return _patchify_normalize(image_processor, chw, out)
    proc = image_processor(images=[chw], do_resize=False, return_tensors="pt")
    pixels = proc["pixel_values"]
    if out is not None:
        pixels = out.copy_(pixels)
    return pixels, tuple(proc["image_grid_thw"][0].tolist())
