"""The image store (concept key -> scored images), its image sources and its resumable builder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswap.lazy import lazy_exports

# Lazy (PEP 562): the collator imports the store reader, and the reader alone must not load the builder, its
# sources and their HTTP client. Every name below still imports from here.
_EXPORTS = {
    "build_store": "tokenswap.store.build",
    "load_swap_dataset": "tokenswap.store.build",
    "read_swap_dataset": "tokenswap.store.build",
    "build_embedded_store": "tokenswap.store.embedded",
    "load_fixture": "tokenswap.store.embedded",
    "CorruptImageError": "tokenswap.store.image_store",
    "ImageMismatchError": "tokenswap.store.image_store",
    "ImageStore": "tokenswap.store.image_store",
    "StoreFormatError": "tokenswap.store.image_store",
    "StoreImage": "tokenswap.store.image_store",
    "StoreWriter": "tokenswap.store.image_store",
    "GenerationSource": "tokenswap.store.sources",
    "OpenMojiSource": "tokenswap.store.sources",
    "RenderedTextSource": "tokenswap.store.sources",
    "RetrievalSource": "tokenswap.store.sources",
    "concept_seed": "tokenswap.store.sources",
}

__all__ = [
    "CorruptImageError",
    "GenerationSource",
    "ImageMismatchError",
    "ImageStore",
    "OpenMojiSource",
    "RenderedTextSource",
    "RetrievalSource",
    "StoreFormatError",
    "StoreImage",
    "StoreWriter",
    "build_embedded_store",
    "build_store",
    "concept_seed",
    "load_fixture",
    "load_swap_dataset",
    "read_swap_dataset",
]

if TYPE_CHECKING:
    from tokenswap.store.build import build_store, load_swap_dataset, read_swap_dataset
    from tokenswap.store.embedded import build_embedded_store, load_fixture
    from tokenswap.store.image_store import (
        CorruptImageError,
        ImageMismatchError,
        ImageStore,
        StoreFormatError,
        StoreImage,
        StoreWriter,
    )
    from tokenswap.store.sources import (
        GenerationSource,
        OpenMojiSource,
        RenderedTextSource,
        RetrievalSource,
        concept_seed,
    )


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
