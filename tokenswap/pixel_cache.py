"""Processed pixels in memory: a bounded LRU cache per collator, recycled storage, reused output buffers.

Concept images repeat across samples, so each is processed once and kept (:class:`PixelCache`); what the
cache evicts is recycled as storage for the next miss of the same size, and each batch's ``pixel_values``
are written into a few reused buffers (:func:`concat_pixels`), because first-touch page faults of fresh
memory cost more than the copies themselves. Used by :class:`tokenswap.collator.TokenSwapCollator`.
"""

from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict

import torch

__all__ = ["PIXEL_DTYPES", "PixelCache", "concat_pixels"]

PIXEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Pixel buffers shared by every collator of the process, per dtype. Four: the batch being built, the
# one accelerate holds prefetched, the one in the step, and the second arm of a paired batch.
_PIXEL_BUFFERS = 4
_PIXEL_POOL: dict[torch.dtype, list[torch.Tensor]] = {}


class _Recycler:
    """Storage of dropped pixel-cache entries, handed to new entries of the same size and dtype.

    A cache miss writes ~5 MB of pixels into fresh memory, and fresh memory costs first-touch page
    faults: ~1.6 ms per 5 MB on a 2-core VM, more than normalizing the image. Entries that an LRU
    eviction pushes out, and the whole cache of a collator that is dropped (a DataLoader worker of
    the last epoch, a collator per stage), wait here, up to ``max_bytes``, for the next miss of the
    same size (store images at one resolution all have one). A tensor is handed out only when
    nothing but this pool refers to it or to its storage.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}

    def give(self, t: torch.Tensor) -> None:
        size = t.element_size() * t.nelement()
        if t.is_shared() or t.storage_offset() or not t.is_contiguous() or t.untyped_storage().nbytes() != size:
            return  # a view, or shared with another process: not ours to overwrite
        if self.bytes + size > self.max_bytes:
            return
        self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)
        self.bytes += size

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        free = self._free.get((tuple(shape), dtype))
        while free:
            t = free.pop()
            self.bytes -= t.element_size() * t.nelement()
            # getrefcount: the local name and the argument; storage use count: ``t`` and the temporary
            # ``untyped_storage()`` (no view of it anywhere). A batch being built may still hold an entry
            # that a later miss of the same batch evicted; such a tensor is dropped, not reused.
            if sys.getrefcount(t) == 2 and torch._C._storage_Use_Count(t.untyped_storage()._cdata) == 2:
                return t
        return None


_RECYCLER = _Recycler(256 << 20)


class PixelCache:
    """LRU of processed pixels keyed by image id, bounded in bytes."""

    def __init__(self, max_bytes: int, dtype: torch.dtype = torch.float32):
        self.max_bytes = max_bytes
        self.dtype = dtype
        self.bytes = 0
        self._items: OrderedDict[str, tuple[torch.Tensor, tuple[int, int, int]]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.recycled = 0

    def get(self, key: str):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item

    def buffer(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        """Recycled storage for a new entry of this shape (in the cache's dtype), if there is one."""
        t = _RECYCLER.take(shape, self.dtype)
        self.recycled += t is not None
        return t

    def put(self, key: str, pixels: torch.Tensor, grid: tuple[int, int, int]) -> None:
        # Stored in the emitted dtype: bfloat16 holds twice the images per byte of bound.
        pixels = pixels.to(self.dtype)
        size = pixels.element_size() * pixels.nelement()
        if size > self.max_bytes:
            return
        if key in self._items:
            return
        self._items[key] = (pixels, grid)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (old, _) = self._items.popitem(last=False)
            self.bytes -= old.element_size() * old.nelement()
            _RECYCLER.give(old)

    def __len__(self) -> int:
        return len(self._items)

    def __del__(self) -> None:
        try:
            items, self._items = self._items, OrderedDict()
            for pixels, _ in items.values():
                _RECYCLER.give(pixels)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the pool may be gone already
            pass


def concat_pixels(pieces: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``torch.cat(pieces)`` in ``dtype``, written into a reused buffer when that is safe.

    A fresh 64 MiB tensor per batch costs mostly first-touch page faults (on a loaded 2-core VM,
    ~0.5 s for a 64 MiB clone against ~25 ms for the copy into touched memory); a buffer that no
    batch still references costs only the copy. The buffers belong to the process (shared by its
    collators). A buffer is reused only when its storage has no reference but the pool's (the
    Trainer, accelerate's one-batch prefetch or the user may still hold a previous batch), never in
    a DataLoader worker (tensors leave through shared memory, so the parent could still be reading
    the storage) and never once shared.
    """
    n = sum(p.shape[0] for p in pieces)
    width = pieces[0].shape[1]
    need = n * width
    buf = None
    if torch.utils.data.get_worker_info() is None:
        pool = _PIXEL_POOL.setdefault(dtype, [])
        pool[:] = [b for b in pool if not b.is_shared()]
        free = [b for b in pool if torch._C._storage_Use_Count(b.untyped_storage()._cdata) == 2]
        fits = [b for b in free if b.numel() >= need]
        if fits:
            buf = fits[0]
        elif free or len(pool) < _PIXEL_BUFFERS:
            if free:
                pool[:] = [b for b in pool if b is not free[0]]
            buf = torch.empty(need + need // 4, dtype=dtype)  # headroom: the next batch is rarely identical
            pool.append(buf)
    out = torch.empty((n, width), dtype=dtype) if buf is None else buf[:need].view(n, width)
    row = 0
    for p in pieces:
        rows = p.shape[0]
        if rows == 0:
            continue
        if p.dtype == dtype and p.is_contiguous() and p.shape[1] == width:
            # A plain memcpy: torch's float32 copy_ into row slices took twice memcpy's time on pieces
            # held in cache (10 vs 5 ms for 64 MiB); from DRAM, as in a warm batch, it saves ~10%.
            ctypes.memmove(out[row].data_ptr(), p.data_ptr(), rows * width * out.element_size())
        else:  # the first dummy image (processor float32) or a foreign tensor: cast on copy
            out[row : row + rows].copy_(p)
        row += rows
    return out

