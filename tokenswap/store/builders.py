"""Builders that turn the store build's config sections into the objects the stages use.

Chat models for the LLM extractor and judge, the image sources by name, and the concept extractor
(lexicon or LLM). Picking an implementation is a plain dict (:data:`SOURCE_BUILDERS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tokenswap.concepts import ConceptExtractor
from tokenswap.errors import InputError
from tokenswap.store.build_config import LLMConfig, StoreBuildConfig

from .sources import (
    GenerationSource,
    ImageSource,
    OpenMojiSource,
    RenderedTextSource,
    RetrievalSource,
)


def build_chat_model(cfg: LLMConfig, cache_path: Path):
    """The chat client an ``llm`` config section describes (OpenAI-compatible endpoint or local transformers)."""
    from tokenswap.inference import OpenAIChatModel, TransformersChatModel

    if cfg.backend == "openai":
        return OpenAIChatModel(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            cache_path=cache_path,
            concurrency=cfg.concurrency,
        )
    return TransformersChatModel(cfg.model, max_new_tokens=cfg.max_new_tokens, cache_path=cache_path)


def _build_openmoji(cfg: StoreBuildConfig, state: Path) -> ImageSource:
    return OpenMojiSource(size=cfg.openmoji.size)


def _build_rendered_text(cfg: StoreBuildConfig, state: Path) -> ImageSource:
    c = cfg.rendered_text
    return RenderedTextSource(size=c.size, font_path=c.font_path, score=c.score)


def _build_retrieval(cfg: StoreBuildConfig, state: Path) -> ImageSource:
    c = cfg.retrieval
    assert c is not None
    return RetrievalSource(
        clip_path=c.clip_path,
        corpus=c.corpus,
        index_dir=c.index_dir or state / "retrieval_index",
        image_column=c.image_column,
        split=c.split,
        prompt=c.prompt,
        top_k=c.top_k,
        min_score=c.min_score,
        batch_size=c.batch_size,
        chunk_size=c.chunk_size,
    )


def _build_generation(cfg: StoreBuildConfig, state: Path) -> ImageSource:
    c = cfg.generation
    assert c is not None
    return GenerationSource(
        pipeline_path=c.pipeline_path,
        prompt=c.prompt,
        num_images=c.num_images,
        num_inference_steps=c.num_inference_steps,
        guidance_scale=c.guidance_scale,
        height=c.height,
        width=c.width,
        batch_size=c.batch_size,
        seed=c.seed,
        dtype=c.dtype,
    )


SOURCE_BUILDERS: dict[str, Callable[[StoreBuildConfig, Path], ImageSource]] = {
    "openmoji": _build_openmoji,
    "rendered_text": _build_rendered_text,
    "retrieval": _build_retrieval,
    "generation": _build_generation,
}


def read_vocabulary_file(path: str | os.PathLike, key: str = "extractor.vocabulary_file") -> list[str]:
    """The concepts of a vocabulary file: one per line, blank lines and ``#`` comments skipped.

    Raises:
        InputError: the file is missing, a folder, unreadable or not UTF-8; names ``key`` and the file.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"`{key}` {str(path)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8, one concept "
                         "per line") from None
    except OSError as e:
        raise InputError(f"`{key}` {str(path)!r} cannot be read ({e.strerror or e}); give a text file with one "
                         "concept per line") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def lexicon_vocabulary(cfg: StoreBuildConfig) -> list[str]:
    vocab = list(cfg.extractor.vocabulary)
    if cfg.extractor.vocabulary_file:
        vocab += read_vocabulary_file(cfg.extractor.vocabulary_file)
    if "openmoji" in cfg.sources:
        vocab += OpenMojiSource(size=cfg.openmoji.size).vocabulary()
    if not vocab:
        raise ValueError(
            "the lexicon extractor has no vocabulary: add `openmoji` to `sources`, or set "
            "`extractor.vocabulary` / `extractor.vocabulary_file`, or use `extractor.kind: llm`"
        )
    return vocab


def request_concurrency(cfg: LLMConfig | None) -> int:
    """How many rows to have in hand at once for the model an ``llm`` section describes (1 for a local model).

    A little more than ``concurrency``: a row's thread also builds its request and parses its answer, and
    while it does so the client's slot should already serve another row. The client itself keeps at most
    ``concurrency`` HTTP requests in flight; ``concurrency: 1`` stays one row at a time.
    """
    if cfg is None or cfg.backend != "openai" or cfg.concurrency == 1:
        return 1
    return cfg.concurrency + max(2, cfg.concurrency // 4)


def build_extractor(cfg: StoreBuildConfig, state: Path, rank: int) -> ConceptExtractor:
    from .extract import LLMConceptExtractor, build_lexicon

    ex = cfg.extractor
    if ex.kind == "lexicon":
        return build_lexicon(lexicon_vocabulary(cfg), aliases=ex.aliases, plurals=ex.plurals)
    assert ex.llm is not None
    chat = build_chat_model(ex.llm, state / "cache" / f"extract-r{rank:03d}.jsonl")
    return LLMConceptExtractor(chat, max_concepts=ex.max_concepts)
