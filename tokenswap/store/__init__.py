"""The image store (concept key -> scored images), its image sources and its resumable builder."""

from .build import build_store, load_swap_dataset, read_swap_dataset
from .embedded import build_embedded_store, load_fixture
from .image_store import CorruptImageError, ImageMismatchError, ImageStore, StoreFormatError, StoreImage, StoreWriter
from .sources import GenerationSource, OpenMojiSource, RenderedTextSource, RetrievalSource, concept_seed

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
