"""Build an image store and a swap dataset from instruction data, resumably and across processes.

Launch (see the headers of ``configs/store_*.yaml``)::

    tokenswap build-store --config store_embedded.yaml                       # offline, seconds
    accelerate launch -m tokenswap.cli build-store --config store_generate.yaml output_dir=/data/ts

Stages, each resumable on its own (a build killed at any moment, even by SIGKILL, restarts
where it stopped, redoes nothing already committed and never leaves a half-written entry):

1. **extract**: stream the samples; rank ``r`` takes samples ``i % world == r``, finds concept
   spans in user messages and commits them in chunks of ``samples_per_shard`` samples
   (``state/candidates/part-rRRR-CCCCCC.jsonl``). A resumed rank skips committed chunks.
2. **images**: every distinct concept is fetched once. Rank ``r`` owns the concepts with
   ``int(unit_hash("store", key) * world) == r``, skips those the store already ``attempted``,
   and commits each batch of concepts (all sources, judge verdicts, "nothing found" records)
   as one atomic store shard, so a concept is either fully in the store or not at all.
3. **dataset**: each candidate chunk becomes a swap-dataset shard
   (``dataset/part-rRRR-CCCCCC.jsonl``) keeping only concepts that have images and samples
   with at least ``min_concepts`` of them.
4. **report** (rank 0): ``report.json`` with counts, coverage and time per stage.

Ranks synchronise through ``done`` marker files, so nothing here needs a process group; when
ranks come from the launcher's RANK and WORLD_SIZE (``accelerate launch``, ``torchrun``).

Before anything is written, the inputs are checked (local paths exist, the data yields a first
row, the lexicon has a vocabulary), so a typo never ties a folder to wrong settings. Each rank
then holds an exclusive ``flock`` on ``.build-lock-rRRR`` for the whole build: a second build on
the folder fails at once naming the holder's PID and host, and a killed build leaves no stale lock
(the kernel drops it). ``state/plan.json`` records every setting that decides what lands where
(data, sharding, extractor, sources and their settings, judge); a resume with any of them changed
is refused, listing each difference. Images a source cannot use (bombs, slivers, broken files) are
rejected by name, counted in ``report.json`` (``images_rejected``) and the build goes on.

Output folder::

    store/      the image store (tokenswap.store.ImageStore)
    dataset/    swap-dataset JSONL shards: {"id", "messages", "concepts", "images"}
    state/      resumption state: candidate chunks, done markers, LLM caches, retrieval index
    report.json
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from tokenswap.cli import looks_like_path
from tokenswap.concepts import Concept, ConceptExtractor, validate_concepts
from tokenswap.swap import unit_hash

from .image_store import ImageStore, StoreWriter, atomic_write
from .sources import (
    DEJAVU_SANS,
    GenerationSource,
    ImageSource,
    OpenMojiSource,
    RenderedTextSource,
    RetrievalSource,
)

__all__ = [
    "DataConfig",
    "ExtractorConfig",
    "GenerationConfig",
    "JudgeConfig",
    "LLMConfig",
    "OpenMojiConfig",
    "RenderedTextConfig",
    "RetrievalConfig",
    "StoreBuildConfig",
    "build_embedded_store",
    "BuildLockedError",
    "build_store",
    "cli_main",
    "embedded_config",
    "load_swap_dataset",
    "read_swap_dataset",
]

FIXTURE = "fixture"
SOURCE_NAMES = ("openmoji", "rendered_text", "retrieval", "generation")
_PART = re.compile(r"part-r(\d{3})-(\d{6})\.jsonl$")


# ============================================================================ config


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
            raise ValueError("`path` is empty; give a hub dataset id, a local Magpie-format file or folder, or `fixture`")


@dataclass(kw_only=True)
class LLMConfig:
    """A chat model: an OpenAI-compatible endpoint or a local transformers checkpoint."""

    backend: Literal["openai", "transformers"] = "openai"
    """`openai`: POST {base_url}/chat/completions. `transformers`: load `model` locally."""
    model: str = ""
    """Model name sent to the endpoint, or the checkpoint path for the transformers backend."""
    base_url: str = "http://localhost:8000/v1"
    """Endpoint root (openai backend), e.g. a vLLM server or https://api.openai.com/v1."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; the key itself never goes in a config."""
    temperature: float = 0.0
    """Sampling temperature (openai backend); 0 keeps cached answers reproducible."""
    max_tokens: int = 512
    """Completion length (openai backend)."""
    timeout: float = 60.0
    """Seconds per request (openai backend)."""
    max_retries: int = 3
    """Retries of transient HTTP failures (openai backend)."""
    max_new_tokens: int = 256
    """Completion length (transformers backend)."""

    def __post_init__(self) -> None:
        problems = []
        if not self.model:
            problems.append("`model` is required: the endpoint's model name or a local checkpoint path")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"`temperature` must be a finite number >= 0, got {self.temperature}")
        if self.max_tokens < 1 or self.max_new_tokens < 1:
            problems.append(f"`max_tokens` and `max_new_tokens` must be >= 1, got {self.max_tokens}, {self.max_new_tokens}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            problems.append(f"`timeout` must be a finite number of seconds > 0, got {self.timeout}")
        if self.max_retries < 0:
            problems.append(f"`max_retries` must be >= 0, got {self.max_retries}")
        if self.backend == "openai" and not self.base_url.startswith(("http://", "https://")):
            problems.append(f"`base_url` must be an http(s) URL such as http://localhost:8000/v1, got {self.base_url!r}")
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
        counts = {"num_images": self.num_images, "num_inference_steps": self.num_inference_steps,
                  "batch_size": self.batch_size}
        problems = [f"`{k}` must be >= 1, got {v}" for k, v in counts.items() if v < 1]
        problems += [f"`{k}` must be >= 8 or null, got {v}" for k, v in (("height", self.height), ("width", self.width))
                     if v is not None and v < 8]
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
            problems.append(f"`barrier_timeout_s` must be a finite number of seconds > 0, got {self.barrier_timeout_s}")
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


# ============================================================================ builders (config -> library objects)


def build_chat_model(cfg: LLMConfig, cache_path: Path):
    """The chat client an ``llm`` config section describes (OpenAI-compatible endpoint or local transformers)."""
    from tokenswap.llm import OpenAIChatModel, TransformersChatModel

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


def _lexicon_vocabulary(cfg: StoreBuildConfig) -> list[str]:
    vocab = list(cfg.extractor.vocabulary)
    if cfg.extractor.vocabulary_file:
        lines = Path(cfg.extractor.vocabulary_file).read_text(encoding="utf-8").splitlines()
        vocab += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if "openmoji" in cfg.sources:
        vocab += OpenMojiSource(size=cfg.openmoji.size).vocabulary()
    if not vocab:
        raise ValueError(
            "the lexicon extractor has no vocabulary: add `openmoji` to `sources`, or set "
            "`extractor.vocabulary` / `extractor.vocabulary_file`, or use `extractor.kind: llm`"
        )
    return vocab


def _build_extractor(cfg: StoreBuildConfig, state: Path, rank: int) -> ConceptExtractor:
    from .extract import LLMConceptExtractor, build_lexicon

    ex = cfg.extractor
    if ex.kind == "lexicon":
        return build_lexicon(_lexicon_vocabulary(cfg), aliases=ex.aliases, plurals=ex.plurals)
    assert ex.llm is not None
    chat = build_chat_model(ex.llm, state / "cache" / f"extract-r{rank:03d}.jsonl")
    return LLMConceptExtractor(chat, max_concepts=ex.max_concepts)


def _iter_samples(cfg: DataConfig, stats: dict | None = None) -> Iterator[dict]:
    from tokenswap.data.magpie import fixture_path, iter_magpie

    path = str(fixture_path()) if cfg.path == FIXTURE else cfg.path
    yield from iter_magpie(
        path,
        split=cfg.split,
        streaming=cfg.streaming,
        max_samples=cfg.max_samples,
        skip_malformed=cfg.skip_malformed,
        stats=stats,
    )


# ============================================================================ distributed helpers


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes (1 outside a launcher).

    Read from the launcher's environment (``accelerate launch`` and ``torchrun`` set RANK and
    WORLD_SIZE): the build synchronises through marker files and needs no process group, and a
    bare ``PartialState()`` on CPU reports every process as rank 0 of 1.
    """
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _wait_for(paths: list[Path], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [p for p in paths if not p.exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout_s:.0f}s for other ranks to finish {what}; missing {[str(p) for p in missing][:4]}. "
                "Did a rank crash? Relaunch the same command to resume."
            )
        time.sleep(0.2)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a build's own JSONL file; a damaged one is a ValueError naming the file and line."""
    from tokenswap.data.magpie import MalformedLine, jsonl_rows

    rows = []
    for _, row in jsonl_rows(path):
        if isinstance(row, MalformedLine):
            # Written atomically by the build, so a disk or a hand broke it: its part cannot be trusted to resume.
            raise ValueError(f"{row}; this build file is damaged: build again in a new output_dir") from None
        rows.append(row)
    return rows


def _parts(folder: Path, rank: int | None = None) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        p for p in folder.iterdir() if (m := _PART.search(p.name)) and (rank is None or int(m.group(1)) == rank)
    )


def _owner(key: str, world: int) -> int:
    return min(int(unit_hash("store", key) * world), world - 1)


def _progress(total: int | None, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=False)


# ============================================================================ stages


def _stage_extract(cfg: StoreBuildConfig, state: Path, rank: int, world: int) -> dict:
    folder = state / "candidates"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"done-r{rank:03d}.json"
    if done.exists():
        return {"skipped": True}
    for tmp in folder.glob(f"part-r{rank:03d}-*.tmp"):
        tmp.unlink()
    committed = {int(_PART.search(p.name).group(2)) for p in _parts(folder, rank)}
    extractor = None  # built lazily: a resumed rank with every chunk committed needs no model
    size = cfg.samples_per_shard
    rows: list[dict] = []
    local = 0
    chunk = 0
    bar = _progress(cfg.data.max_samples, f"[r{rank}] extract", cfg.progress and rank == 0)
    data_stats: dict = {}
    for i, sample in enumerate(_iter_samples(cfg.data, data_stats)):
        bar.update(1)
        if i % world != rank:
            continue
        chunk, local = local // size, local + 1
        if chunk in committed:
            continue
        if extractor is None:
            extractor = _build_extractor(cfg, state, rank)
        candidates = [
            {"message": m, "start": s, "end": e, "key": k}
            for m, msg in enumerate(sample["messages"])
            if msg["role"] == "user"
            for s, e, k in extractor.extract(msg["content"])
        ]
        if candidates:
            rows.append({"id": sample["id"], "messages": sample["messages"], "candidates": candidates})
        if local % size == 0:
            _write_jsonl(folder / f"part-r{rank:03d}-{chunk:06d}.jsonl", rows)
            rows = []
    if local % size != 0 and chunk not in committed:
        _write_jsonl(folder / f"part-r{rank:03d}-{chunk:06d}.jsonl", rows)
    bar.close()
    # Every rank reads every row, so each rank's count is the whole source's.
    info = {"samples_read": local, "malformed_skipped": data_stats.get("malformed", 0)}
    stats = getattr(extractor, "stats", None)  # only the LLM extractor keeps stats
    if stats is not None:
        info["llm_extraction"] = vars(stats)
    atomic_write(done, json.dumps(info).encode())
    return info


def _collect_concepts(state: Path) -> dict[str, tuple[str, int, int]]:
    """Distinct candidate keys -> one context (text, start, end) for the judge, in a stable order."""
    contexts: dict[str, tuple[str, int, int]] = {}
    for path in _parts(state / "candidates"):
        for row in _read_jsonl(path):
            for c in row["candidates"]:
                if c["key"] not in contexts:
                    contexts[c["key"]] = (row["messages"][c["message"]]["content"], c["start"], c["end"])
    return dict(sorted(contexts.items()))


def _stage_images(cfg: StoreBuildConfig, out: Path, state: Path, rank: int, world: int) -> dict:
    folder = state / "images"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"done-r{rank:03d}.json"
    if done.exists():
        return {"skipped": True, "source_s": 0.0, "judge_s": 0.0}
    store_dir = out / "store"
    contexts = _collect_concepts(state)
    mine = [k for k in contexts if _owner(k, world) == rank]
    attempted = ImageStore(store_dir) if (store_dir / "store.json").exists() else None
    todo = [k for k in mine if attempted is None or not attempted.attempted(k)]
    info = {"concepts": len(mine), "fetched": len(todo), "source_s": 0.0, "judge_s": 0.0, "by_source": {}}
    build_info = {"build": {"tool": "tokenswap build-store", "sources": list(cfg.sources)}}
    if not todo:
        if rank == 0 and attempted is None:
            StoreWriter(store_dir, rank=0, info=build_info).close()  # an empty but valid store
        atomic_write(done, json.dumps(info).encode())
        return info
    sources = [SOURCE_BUILDERS[name](cfg, state) for name in cfg.sources]
    for source in sources:
        if isinstance(source, RetrievalSource):
            source.build_index(progress=cfg.progress and rank == 0)
            atomic_write(folder / "rejected-corpus.json", json.dumps(source.index_rejected).encode())
    judge = None
    if cfg.judge is not None:
        from .judge import ValidityJudge

        judge = ValidityJudge(build_chat_model(cfg.judge.llm, state / "cache" / f"judge-r{rank:03d}.jsonl"))
    build_info["sources_info"] = {s.name: s.info for s in sources}
    if any(s.name == "openmoji" for s in sources):
        build_info["attribution"] = sources[[s.name for s in sources].index("openmoji")].info["attribution"]
    # shard_size is effectively infinite: we flush once per concept batch so that a batch, with
    # every source's images for its concepts, is one atomic shard.
    writer = StoreWriter(store_dir, rank=rank, shard_size=1 << 62, info=build_info)
    bar = _progress(len(todo), f"[r{rank}] images", cfg.progress and rank == 0)
    n_images = 0
    for b in range(0, len(todo), cfg.concept_batch_size):
        batch = todo[b : b + cfg.concept_batch_size]
        found: dict[str, list[tuple]] = {k: [] for k in batch}
        for source in sources:
            t0 = time.perf_counter()
            result = source.images_for(batch)
            dt = time.perf_counter() - t0
            info["source_s"] += dt
            info["by_source"][source.name] = info["by_source"].get(source.name, 0.0) + dt
            for key in batch:
                found[key] += [(img, score, dict(meta), source.name) for img, score, meta in result.get(key, [])]
        if judge is not None:
            t0 = time.perf_counter()
            for key in batch:
                text, start, end = contexts[key]
                kept = []
                for img, score, meta, name in found[key]:
                    meta["judge"] = judge.judge(text, start, end, key, img)
                    if not (cfg.judge.drop_invalid and meta["judge"]["valid"] is False):
                        kept.append((img, score, meta, name))
                found[key] = kept
            info["judge_s"] += time.perf_counter() - t0
        for key in batch:
            if not found[key]:
                writer.add(key, None, source="none", score=0.0)
            for img, score, meta, name in found[key]:
                writer.add(key, img, source=name, score=score, meta=meta)
                n_images += 1
        # Named after the shard about to be committed: a batch redone after a kill overwrites its
        # own list, so every rejection is counted once.
        rejected = [r for s in sources for r in s.rejected]
        atomic_write(folder / f"rejected-r{rank:03d}-{writer.next_shard:06d}.json", json.dumps(rejected).encode())
        for s in sources:
            s.rejected.clear()
        writer.flush()
        bar.update(len(batch))
    bar.close()
    info["images"] = n_images
    atomic_write(done, json.dumps(info).encode())
    return info


def _stage_dataset(cfg: StoreBuildConfig, out: Path, state: Path, rank: int) -> dict:
    folder = out / "dataset"
    folder.mkdir(parents=True, exist_ok=True)
    done = state / "dataset" / f"done-r{rank:03d}.json"
    done.parent.mkdir(parents=True, exist_ok=True)
    if done.exists():
        return {"skipped": True}
    for tmp in folder.glob(f"part-r{rank:03d}-*.tmp"):
        tmp.unlink()
    store = ImageStore(out / "store")
    written = 0
    for path in _parts(state / "candidates", rank):
        target = folder / path.name
        if target.exists():
            continue
        rows = []
        for row in _read_jsonl(path):
            kept = [Concept(**c) for c in row["candidates"] if store.get(c["key"])]
            if len(kept) < cfg.min_concepts:
                continue
            texts = [m["content"] for m in row["messages"]]
            concepts = validate_concepts(kept, texts, row["id"])
            rows.append(
                {
                    "id": row["id"],
                    "messages": row["messages"],
                    "concepts": [c.to_dict() for c in concepts],
                    "images": [],
                }
            )
        _write_jsonl(target, rows)
        written += len(rows)
    info = {"samples_written": written}
    atomic_write(done, json.dumps(info).encode())
    return info


def _report(cfg: StoreBuildConfig, out: Path, state: Path, world: int, times: dict, total_s: float, image_info: dict):
    samples = read_swap_dataset(out / "dataset")
    candidate_keys = _collect_concepts(state)
    store = ImageStore(out / "store")
    n_spans = sum(len(s["concepts"]) for s in samples)
    used_keys = {c["key"] for s in samples for c in s["concepts"]}
    extract_markers = [json.loads((state / "candidates" / f"done-r{r:03d}.json").read_text()) for r in range(world)]
    image_markers = [json.loads((state / "images" / f"done-r{r:03d}.json").read_text()) for r in range(world)]
    samples_read = sum(m.get("samples_read", 0) for m in extract_markers)
    source_s = image_info.get("source_s", 0.0)
    rejected = [r for p in sorted((state / "images").glob("rejected-*.json")) for r in json.loads(p.read_text())]
    report = {
        "output_dir": str(out),
        "world_size": world,
        "samples_read": samples_read,
        "samples_kept": len(samples),
        "sample_coverage": len(samples) / samples_read if samples_read else 0.0,
        "concepts_found": len(candidate_keys),
        "concepts_with_images": len(store),
        "concept_coverage": len(store) / len(candidate_keys) if candidate_keys else 0.0,
        "concepts_used": len(used_keys),
        "store_images": store.num_images,
        "images_per_sample": n_spans / len(samples) if samples else 0.0,
        "spans": n_spans,
        "rows_malformed_skipped": max((m.get("malformed_skipped", 0) for m in extract_markers), default=0),
        "images_rejected": len(rejected),
        "rejected_images": rejected[:100],
        "time_s": {**times, "total": total_s},
        "source_s": source_s,
        "source_s_by_name": image_info.get("by_source", {}),
        "judge_s": image_info.get("judge_s", 0.0),
        "overhead_s": total_s - source_s,
        "overhead_frac_of_total": (total_s - source_s) / total_s if total_s else 0.0,
        "ranks": {"extract": extract_markers, "images": image_markers},
        "complete": True,
    }
    atomic_write(out / "report.json", json.dumps(report, indent=2).encode())
    return report


class BuildLockedError(RuntimeError):
    """Another build is running on the same output folder."""


class _FolderLock:
    """An exclusive ``flock`` on ``<output_dir>/.build-lock-rRRR``, held for the whole build.

    The kernel drops the lock when its process exits, however it exits, so a SIGKILLed build
    never leaves a stale lock behind. Each rank locks its own file: the ranks of one launch never
    wait on each other, while a second build on the folder collides with the first on rank 0's
    file (or, for a second launch of N ranks, on every rank's file). The holder's PID, host and
    start time are written into the file so the refused build can say who holds it. Works on
    local disks and on NFS (Linux emulates flock with POSIX locks there).
    """

    def __init__(self, out: Path, rank: int):
        self.path = out / f".build-lock-r{rank:03d}"
        self._fd: int | None = None

    def __enter__(self) -> _FolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
            os.close(fd)
            raise BuildLockedError(
                f"{self.path.parent} is being built by another process ({holder}); wait for it to finish "
                f"(a killed build releases the folder at once), or use another output_dir"
            ) from None
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {stamp}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _plan(cfg: StoreBuildConfig, world: int) -> dict:
    """The settings that decide which samples, concepts and images land in which shard.

    Resuming with any of them changed would mix two different builds in one folder. Runtime
    knobs (progress bars, timeouts, retries, batch sizes of forward passes) are left out.
    """
    runtime = {"progress", "barrier_timeout_s", "timeout", "max_retries", "base_url", "api_key_env", "batch_size"}

    def settings(section) -> dict | None:
        if section is None:
            return None
        return {k: v for k, v in asdict(section).items() if k not in runtime}

    def llm(section: LLMConfig | None) -> dict | None:
        return settings(section)

    return {
        "world_size": world,
        "samples_per_shard": cfg.samples_per_shard,
        # Not data.skip_malformed: a build that stopped at a malformed row committed only rows before it, which
        # skipping lays out identically, so "rerun with data.skip_malformed: true" must resume, not be refused.
        "data": {"path": cfg.data.path, "split": cfg.data.split, "max_samples": cfg.data.max_samples},
        "extractor": {**settings(cfg.extractor), "llm": llm(cfg.extractor.llm)},
        "sources": list(cfg.sources),
        "source_settings": {name: settings(getattr(cfg, name)) for name in cfg.sources},
        "judge": None if cfg.judge is None else {"llm": llm(cfg.judge.llm), "drop_invalid": cfg.judge.drop_invalid},
        "min_concepts": cfg.min_concepts,
    }


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class _PlanChanged(ValueError):
    """A resume with settings other than the folder's plan (nothing is touched)."""


def _check_plan(cfg: StoreBuildConfig, state: Path, world: int, rank: int) -> None:
    """Refuse to resume with settings that would re-map samples or concepts, or mix sources.

    Rank 0 writes the plan of a new build; the other ranks wait for it, so every rank of a
    launch checks itself against the same plan.
    """
    plan = _plan(cfg, world)
    path = state / "plan.json"
    if rank == 0 and not path.exists():
        state.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(plan, indent=2).encode())
        return
    if rank != 0:
        _wait_for([path], "writing the build plan", cfg.barrier_timeout_s)
    saved = json.loads(path.read_text())
    if isinstance(saved.get("data"), dict):
        saved["data"].pop("skip_malformed", None)  # plans written before it left the plan
    if saved == plan:
        return
    old, new = _flatten(saved), _flatten(plan)
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k, "<absent>") != new.get(k, "<absent>")]
    diff = "; ".join(f"{k}: was {old.get(k, '<absent>')!r}, now {new.get(k, '<absent>')!r}" for k in changed)
    raise _PlanChanged(
        f"{path}: this build was started with other settings ({diff}); resuming would mix two builds in one "
        f"folder. Resume with the original settings or use a new output_dir"
    )


def _validate_inputs(cfg: StoreBuildConfig) -> None:
    """Check the inputs a build reads before anything is written into its folder.

    A typo found only after the plan is written would tie the folder to the wrong settings.

    Raises:
        FileNotFoundError: a local input (data, vocabulary file, corpus, checkpoint) does not exist.
        ValueError: the data source cannot be read or has no rows; the lexicon has no vocabulary.
    """
    problems = []
    data = cfg.data.path
    if data != FIXTURE and not os.path.exists(data) and looks_like_path(data):
        problems.append(f"`data.path` {data!r} does not exist")
    if cfg.extractor.vocabulary_file and not os.path.isfile(cfg.extractor.vocabulary_file):
        problems.append(f"`extractor.vocabulary_file` {cfg.extractor.vocabulary_file!r} does not exist")
    local = []
    if cfg.retrieval is not None and "retrieval" in cfg.sources:
        local += [("retrieval.clip_path", cfg.retrieval.clip_path), ("retrieval.corpus", cfg.retrieval.corpus)]
    if cfg.generation is not None and "generation" in cfg.sources:
        local.append(("generation.pipeline_path", cfg.generation.pipeline_path))
    for llm_key, llm_cfg in (("extractor.llm", cfg.extractor.llm), ("judge.llm", cfg.judge and cfg.judge.llm)):
        if llm_cfg is not None and llm_cfg.backend == "transformers":
            local.append((f"{llm_key}.model", llm_cfg.model))
    for key, value in local:
        if not os.path.exists(value) and looks_like_path(value):
            problems.append(f"`{key}` {value!r} does not exist")
    if problems:
        raise FileNotFoundError("; ".join(problems) + "; fix the path(s) and rerun")
    if cfg.extractor.kind == "lexicon":
        _lexicon_vocabulary(cfg)
    try:
        first = next(_iter_samples(DataConfig(**{**asdict(cfg.data), "max_samples": None})), None)
    except (ValueError, KeyError) as e:
        raise ValueError(f"`data.path` {data!r}: {e}") from None
    except Exception as e:  # hub/network/format errors of `datasets`, reported with the key to fix
        raise ValueError(f"`data.path` {data!r} cannot be read ({type(e).__name__}: {e})") from None
    if first is None:
        raise ValueError(f"`data.path` {data!r} has no usable rows")


def build_store(cfg: StoreBuildConfig) -> dict:
    """Run (or resume) a build; return the report (rank 0) or this rank's stage info (other ranks).

    Inputs are checked before the folder is touched; then each rank holds an exclusive lock on
    the folder for the whole build, so a second build on the same folder fails at once.

    Args:
        cfg: the build configuration.

    Returns:
        The contents of ``report.json`` on rank 0.

    Raises:
        BuildLockedError: another build holds the folder; names its PID and host.
        FileNotFoundError: a local input is missing (nothing is written).
        ValueError: bad data, or a resume with different plan settings (the message shows the difference).
    """
    t_start = time.perf_counter()
    rank, world = _rank_and_world()
    _validate_inputs(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _FolderLock(out, rank):
        return _build_locked(cfg, out, rank, world, t_start)


def _build_locked(cfg: StoreBuildConfig, out: Path, rank: int, world: int, t_start: float) -> dict:
    state = out / "state"
    _check_plan(cfg, state, world, rank)
    state.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    extract_info = _stage_extract(cfg, state, rank, world)
    _wait_for(
        [state / "candidates" / f"done-r{r:03d}.json" for r in range(world)], "extraction", cfg.barrier_timeout_s
    )
    times["extract"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    image_info = _stage_images(cfg, out, state, rank, world)
    _wait_for([state / "images" / f"done-r{r:03d}.json" for r in range(world)], "images", cfg.barrier_timeout_s)
    times["images"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    dataset_info = _stage_dataset(cfg, out, state, rank)
    _wait_for([state / "dataset" / f"done-r{r:03d}.json" for r in range(world)], "dataset", cfg.barrier_timeout_s)
    times["dataset"] = time.perf_counter() - t0

    if rank != 0:
        return {"rank": rank, "extract": extract_info, "images": image_info, "dataset": dataset_info}
    return _report(cfg, out, state, world, times, time.perf_counter() - t_start, image_info)


# ============================================================================ reading the output


def read_swap_dataset(path: str | os.PathLike) -> list[dict]:
    """All samples of a swap dataset folder (``dataset/``), shard by shard in name order.

    Raises:
        ValueError: a torn or non-UTF-8 line, or a bad sample; names the shard file and line.
    """
    from tokenswap.data.magpie import MalformedLine, jsonl_rows
    from tokenswap.data.schema import check_sample

    rows = []
    for part in _parts(Path(path)):
        for where, row in jsonl_rows(part):  # a torn or non-UTF-8 line is named by file and line
            if isinstance(row, MalformedLine):
                raise row
            check_sample(row, where)
            rows.append(row)
    return rows


def load_swap_dataset(path: str | os.PathLike):
    """A swap dataset folder as a ``datasets.Dataset`` (same rows as :func:`read_swap_dataset`)."""
    from datasets import Dataset

    return Dataset.from_list(read_swap_dataset(path))


# ============================================================================ embedded store


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


# ============================================================================ CLI


def cli_main(argv: list[str] | None = None) -> int:
    """``tokenswap build-store --config PATH_OR_NAME [key=value ...]``; a bare name resolves in ``configs/``."""
    from tokenswap.config import parse_config

    try:
        cfg = parse_config(StoreBuildConfig, argv)
    except SystemExit as e:  # --help, or config problems (already printed with their fixes)
        return int(e.code or 0)
    try:
        report = build_store(cfg)
    except BuildLockedError as e:
        print(f"build-store: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as e:  # bad inputs or data; found before or during the build
        started = (Path(cfg.output_dir) / "state" / "plan.json").exists()
        # Say what is true of the folder: a build that stopped mid-way keeps its committed work for a rerun.
        if isinstance(e, _PlanChanged):
            after = ""
        elif started:
            after = f" ({cfg.output_dir} keeps what the build committed; rerun with the fix to resume from there)"
        else:
            after = " (nothing was written)"
        print(f"build-store: error: {e}{after}", file=sys.stderr)
        return 2
    if "samples_kept" in report:
        print(
            f"build-store: {report['samples_kept']}/{report['samples_read']} samples kept, "
            f"{report['concepts_with_images']}/{report['concepts_found']} concepts with images, "
            f"{report['images_per_sample']:.2f} images/sample, {report['images_rejected']} images rejected, "
            f"total {report['time_s']['total']:.1f}s "
            f"(image sources {report['source_s']:.1f}s) -> {cfg.output_dir}/report.json"
        )
    return 0
