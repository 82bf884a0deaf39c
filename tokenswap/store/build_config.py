"""The store build's configuration: one dataclass per YAML section of ``configs/store_*.yaml``.

Typed sections mapped from YAML by :func:`tokenswap.config.parse_config`; each checks its values in
``__post_init__`` and names the key and the fix. The build itself is :mod:`tokenswap.store.build`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Literal

from tokenswap.redaction import base_url_problem

from .sources import (
    DEJAVU_SANS,
)

FIXTURE = "fixture"


SOURCE_NAMES = ("openmoji", "rendered_text", "retrieval", "generation")


@dataclass(kw_only=True)
class DataConfig:
    """Where the instruction samples come from."""

    path: str = "Magpie-Align/Magpie-Pro-300K-Filtered"
    """Hub dataset id, a local Magpie-format .jsonl/.json/.parquet file or folder, or `fixture` for the
    packaged Magpie-format fixture."""
    split: str = "train"
    """Split to read (local files have only `train`)."""
    streaming: bool = True
    """Stream rows instead of downloading and preparing the whole dataset first."""
    max_samples: int | None = None
    """Read at most this many rows (None: all)."""
    skip_malformed: bool = False
    """Skip (and count) malformed rows instead of stopping with an error that names the row."""

    def __post_init__(self) -> None:
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"`max_samples` must be >= 1 or null (all rows), got {self.max_samples}")
        if not self.path:
            raise ValueError(
                "`path` is empty; give a hub dataset id, a local Magpie-format file or folder, or `fixture`"
            )


@dataclass(kw_only=True)
class LLMConfig:
    """A chat model: an OpenAI-compatible endpoint or a local transformers checkpoint."""

    backend: Literal["openai", "transformers"] = "openai"
    """`openai`: POST {base_url}/chat/completions. `transformers`: load `model` locally."""
    model: str = ""
    """Model name sent to the endpoint, or the checkpoint path for the transformers backend."""
    base_url: str = "http://localhost:8000/v1"
    """Endpoint root (openai backend), e.g. a vLLM server or https://api.openai.com/v1; no `user:password@` and no
    query (put the key in the environment variable `api_key_env` names)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; the key itself never goes in a config."""
    temperature: float = 0.0
    """Sampling temperature (openai backend); 0 keeps cached answers reproducible."""
    max_tokens: int = 512
    """Completion length (openai backend)."""
    timeout: float = 60.0
    """Seconds per HTTP attempt, connect to last byte (openai backend); each retry gets its own."""
    max_retries: int = 3
    """Retries of transient HTTP failures (openai backend)."""
    max_new_tokens: int = 256
    """Completion length (transformers backend)."""
    concurrency: int = 32
    """Requests in flight at once (openai backend); 429/503 answers lower it for a while. 1 = one at a time.
    Outputs are identical for any value (results are committed in sample order)."""

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            problems.append(f"`concurrency` must be an integer >= 1 (1 = one request at a time), got {self.concurrency!r}")
        if not self.model:
            problems.append("`model` is required: the endpoint's model name or a local checkpoint path")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"`temperature` must be a finite number >= 0, got {self.temperature}")
        if self.max_tokens < 1 or self.max_new_tokens < 1:
            problems.append(
                f"`max_tokens` and `max_new_tokens` must be >= 1, got {self.max_tokens}, {self.max_new_tokens}"
            )
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            problems.append(f"`timeout` must be a finite number of seconds > 0, got {self.timeout}")
        if self.max_retries < 0:
            problems.append(f"`max_retries` must be >= 0, got {self.max_retries}")
        if self.backend == "openai":
            # user:password@ (or a query) would travel into error messages, report.json and the logs.
            problem = base_url_problem(self.base_url, "base_url", self.api_key_env)
            if problem:
                problems.append(problem)
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(kw_only=True)
class ExtractorConfig:
    """How concept spans are found in user messages."""

    kind: Literal["lexicon", "llm"] = "lexicon"
    """`lexicon`: offline longest match against a vocabulary. `llm`: ask `llm` for exact spans."""
    vocabulary: list[str] = field(default_factory=list)
    """Lexicon keys in addition to the vocabulary of the sources that have one (OpenMoji)."""
    vocabulary_file: str | None = None
    """A text file with one lexicon key per line, added to `vocabulary`."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Extra lexicon surface forms: {surface text: concept key}."""
    plurals: bool = True
    """Lexicon also matches regular plurals of every key."""
    llm: LLMConfig | None = None
    """The chat model for kind=llm."""
    max_concepts: int | None = None
    """Keep at most this many spans per message (None: all)."""

    def __post_init__(self) -> None:
        if self.kind == "llm" and self.llm is None:
            raise ValueError("extractor.kind is `llm` but extractor.llm is not set; add an `llm:` section")
        if self.max_concepts is not None and self.max_concepts < 1:
            raise ValueError(f"`max_concepts` must be >= 1 or null (all spans), got {self.max_concepts}")


@dataclass(kw_only=True)
class OpenMojiConfig:
    """Packaged OpenMoji pictograms (offline, CC BY-SA 4.0)."""

    size: int = 112
    """Side of the rasterized square images in pixels."""

    def __post_init__(self) -> None:
        _check_side("size", self.size)


@dataclass(kw_only=True)
class RenderedTextConfig:
    """The concept word rendered black on white (offline)."""

    size: int = 112
    """Side of the square images in pixels."""
    font_path: str = DEJAVU_SANS
    """TrueType font; Pillow's default font when missing."""
    score: float = 0.5
    """Score of these images; below 1 so pictures rank first in the store."""

    def __post_init__(self) -> None:
        _check_side("size", self.size)
        if not math.isfinite(self.score):
            raise ValueError(f"`score` must be a finite number, got {self.score}")


@dataclass(kw_only=True)
class RetrievalConfig:
    """CLIP retrieval over a user image corpus."""

    clip_path: str
    """CLIPModel checkpoint (folder or hub id), e.g. openai/clip-vit-large-patch14."""
    corpus: str
    """Image folder, a `save_to_disk` dataset folder, or a hub dataset id with an image column."""
    index_dir: str | None = None
    """Where corpus embeddings are saved (default: <output_dir>/state/retrieval_index)."""
    image_column: str = "image"
    """Image column of a dataset corpus."""
    split: str = "train"
    """Split of a hub dataset corpus."""
    prompt: str = "An image describing {c}"
    """Query template; {c} is the concept."""
    top_k: int = 5
    """Images kept per concept at most."""
    min_score: float = 0.3
    """Keep images with cosine similarity strictly above this."""
    batch_size: int = 64
    """Images or prompts per CLIP forward pass."""
    chunk_size: int = 4096
    """Images per saved embedding chunk (unit of index resumption)."""

    def __post_init__(self) -> None:
        counts = {"top_k": self.top_k, "batch_size": self.batch_size, "chunk_size": self.chunk_size}
        problems = [f"`{k}` must be >= 1, got {v}" for k, v in counts.items() if v < 1]
        if not (math.isfinite(self.min_score) and -1.0 <= self.min_score <= 1.0):
            problems.append(f"`min_score` is a cosine similarity and must be in [-1, 1], got {self.min_score}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(kw_only=True)
class GenerationConfig:
    """A diffusers text-to-image pipeline."""

    pipeline_path: str
    """Folder or hub id loadable by DiffusionPipeline.from_pretrained."""
    prompt: str = "generate an image of a {c}"
    """Prompt template; {c} is the concept."""
    num_images: int = 1
    """Images per concept."""
    num_inference_steps: int = 30
    """Denoising steps."""
    guidance_scale: float = 7.5
    """Classifier-free guidance scale."""
    height: int | None = None
    """Output height (None: the pipeline's default)."""
    width: int | None = None
    """Output width (None: the pipeline's default)."""
    batch_size: int = 8
    """Prompts per pipeline call."""
    seed: int = 0
    """Mixed into every concept's seed."""
    dtype: Literal["float32", "float16", "bfloat16"] = "float16"
    """Pipeline dtype (float32 on CPU)."""

    def __post_init__(self) -> None:
        counts = {
            "num_images": self.num_images,
            "num_inference_steps": self.num_inference_steps,
            "batch_size": self.batch_size,
        }
        problems = [f"`{k}` must be >= 1, got {v}" for k, v in counts.items() if v < 1]
        problems += [
            f"`{k}` must be >= 8 or null, got {v}"
            for k, v in (("height", self.height), ("width", self.width))
            if v is not None and v < 8
        ]
        if not math.isfinite(self.guidance_scale):
            problems.append(f"`guidance_scale` must be a finite number, got {self.guidance_scale}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(kw_only=True)
class JudgeConfig:
    """Validity filter: a VLM judges each image in context (one-at-a-time restoration)."""

    llm: LLMConfig
    """A chat model that accepts images."""
    drop_invalid: bool = True
    """Do not store images judged invalid (verdicts of kept images are in their `meta`)."""


@dataclass(kw_only=True)
class StoreBuildConfig:
    """Everything `tokenswap build-store` needs."""

    output_dir: str
    """Build folder: store/, dataset/, state/ and report.json go here."""
    data: DataConfig = field(default_factory=DataConfig)
    """Instruction samples."""
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    """Concept extraction."""
    sources: list[str] = field(default_factory=lambda: ["openmoji", "rendered_text"])
    """Image sources, in order: any of openmoji, rendered_text, retrieval, generation."""
    openmoji: OpenMojiConfig = field(default_factory=OpenMojiConfig)
    """Settings of the openmoji source."""
    rendered_text: RenderedTextConfig = field(default_factory=RenderedTextConfig)
    """Settings of the rendered_text source."""
    retrieval: RetrievalConfig | None = None
    """Settings of the retrieval source (required when it is listed)."""
    generation: GenerationConfig | None = None
    """Settings of the generation source (required when it is listed)."""
    judge: JudgeConfig | None = None
    """Optional validity filter."""
    samples_per_shard: int = 1000
    """Samples per candidate/dataset shard: the unit of extraction resumption."""
    concept_batch_size: int = 32
    """Concepts per source call and per store shard: the unit of image resumption."""
    min_concepts: int = 1
    """Samples with fewer image-backed concepts are left out of the swap dataset."""
    progress: bool = True
    """Show tqdm progress bars."""
    barrier_timeout_s: float = 86400.0
    """How long a rank waits for the others at a stage boundary before failing."""

    def __post_init__(self) -> None:
        problems = []
        for name in self.sources:
            if name not in SOURCE_NAMES:
                problems.append(f"`sources` has unknown source {name!r}; choose from {list(SOURCE_NAMES)}")
        if len(set(self.sources)) != len(self.sources):
            problems.append(f"`sources` lists a source twice: {self.sources}")
        if "retrieval" in self.sources and self.retrieval is None:
            problems.append("`sources` includes retrieval but there is no `retrieval:` section (clip_path, corpus)")
        if "generation" in self.sources and self.generation is None:
            problems.append("`sources` includes generation but there is no `generation:` section (pipeline_path)")
        if self.samples_per_shard < 1:
            problems.append(f"`samples_per_shard` must be >= 1, got {self.samples_per_shard}")
        if self.concept_batch_size < 1:
            problems.append(f"`concept_batch_size` must be >= 1, got {self.concept_batch_size}")
        if self.min_concepts < 1:
            problems.append(f"`min_concepts` must be >= 1, got {self.min_concepts}")
        if not (math.isfinite(self.barrier_timeout_s) and self.barrier_timeout_s > 0):
            problems.append(
                f"`barrier_timeout_s` must be a finite number of seconds > 0, got {self.barrier_timeout_s}"
            )
        if not self.output_dir:
            problems.append("`output_dir` is empty; give the build folder")
        if problems:
            raise ValueError("; ".join(problems))


def _check_side(name: str, value: int) -> None:
    if not 8 <= value <= 4096:
        raise ValueError(f"`{name}` must be an image side in pixels within [8, 4096], got {value}")


def embedded_config(output_dir: str | os.PathLike, progress: bool = False) -> StoreBuildConfig:
    """The offline build of ``configs/store_embedded.yaml``: OpenMoji + rendered text over the fixture."""
    return StoreBuildConfig(
        output_dir=str(output_dir),
        data=DataConfig(path=FIXTURE, streaming=True),
        extractor=ExtractorConfig(kind="lexicon"),
        sources=["openmoji", "rendered_text"],
        samples_per_shard=100,
        concept_batch_size=32,
        progress=progress,
    )
