"""The offline default image store, built once from the packaged fixture, and the fixture as samples.

The data layer (:mod:`tokenswap.data.magpie`) knows the fixture file; joining it with the store's
lexicon happens here, so the data layer never imports the store.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenswap.concepts import Concept, validate_concepts
from tokenswap.store.build import build_store
from tokenswap.store.build_config import embedded_config

from .image_store import ImageStore


def default_embedded_root() -> Path:
    """``$TOKENSWAP_CACHE/embedded-store-v1`` (default ``~/.cache/tokenswap``)."""
    base = os.environ.get("TOKENSWAP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tokenswap")
    return Path(base) / "embedded-store-v1"


def build_embedded_store(root: str | os.PathLike | None = None) -> ImageStore:
    """The offline default store: OpenMoji pictograms + rendered text for the concepts of the fixture.

    Built once into ``root`` (a few seconds on a laptop), then reused: a second call only opens it.
    The build folder also holds the fixture's swap dataset in ``root/dataset``.

    Args:
        root: build folder; default :func:`default_embedded_root`.

    Returns:
        The image store at ``root/store``.
    """
    root = Path(root) if root is not None else default_embedded_root()
    if not (root / "report.json").exists():
        build_store(embedded_config(root))
    return ImageStore(root / "store")


def load_fixture(store=None) -> list[dict]:
    """The packaged fixture as samples, with concepts found by the lexicon of the embedded store.

    Only samples with at least one concept are returned, every concept key has images in the
    store, and spans are validated.

    Args:
        store: an :class:`tokenswap.store.ImageStore`; default the embedded store built (once,
            then cached) by :func:`tokenswap.store.build_embedded_store` in its default folder.
    """
    from tokenswap.data.magpie import fixture_path, magpie_to_sample
    from tokenswap.store.extract import build_lexicon

    if store is None:
        store = build_embedded_store()
    lexicon = build_lexicon(store.keys())
    samples = []
    with open(fixture_path(), encoding="utf-8") as f:
        for i, line in enumerate(f):
            sample = magpie_to_sample(json.loads(line), i)
            concepts = [
                Concept(m, s, e, k)
                for m, msg in enumerate(sample["messages"])
                if msg["role"] == "user"
                for s, e, k in lexicon.extract(msg["content"])
                if store.get(k)
            ]
            if not concepts:
                continue
            texts = [m["content"] for m in sample["messages"]]
            sample["concepts"] = [c.to_dict() for c in validate_concepts(concepts, texts, sample["id"])]
            samples.append(sample)
    return samples
