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
4. **report** (rank 0): ``report.json`` with counts, coverage, time per stage and, per stage that
   asked a model, requests, tokens (``usage``), retries, errors and wall time (``llm``).

Model requests run ``llm.concurrency`` at a time (default 32) and are committed in sample order,
so every file is byte-identical to a build with one request in flight. A request that fails for
good (server down, stalled, 5xx after its retries) is not taken for "no concepts": its chunk (or
concept batch) is not committed, the stage finishes the rest, then the build stops with exit code 1
naming how many failed, and ``report.json`` says ``"complete": false`` with the failures. Rerunning
the same command retries exactly those (everything else is committed or in the response cache).

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

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tokenswap.config import flatten_dict
from tokenswap.errors import InputError
from tokenswap.files import atomic_write, read_json_object, remove_dead_temporaries
from tokenswap.inputs import looks_like_path
from tokenswap.ranks import rank_and_world
from tokenswap.store.build_config import (
    FIXTURE,
    DataConfig,
    ExtractorConfig,
    GenerationConfig,
    JudgeConfig,
    LLMConfig,
    OpenMojiConfig,
    RenderedTextConfig,
    RetrievalConfig,
    StoreBuildConfig,
    embedded_config,
)
from tokenswap.store.builders import lexicon_vocabulary
from tokenswap.store.coordination import BuildLockedError, OtherRankFailed, build_lock, wait_for
from tokenswap.store.stages import (
    RequestsFailed,
    build_report,
    iter_samples,
    load_swap_dataset,
    read_swap_dataset,
    stage_dataset,
    stage_extract,
    stage_images,
    write_failure_report,
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
    "BuildLockedError",
    "build_store",
    "cli_main",
    "embedded_config",
    "load_swap_dataset",
    "read_swap_dataset",
]


def _plan(cfg: StoreBuildConfig, world: int) -> dict:
    """The settings that decide which samples, concepts and images land in which shard.

    Resuming with any of them changed would mix two different builds in one folder. Runtime
    knobs (progress bars, timeouts, retries, batch sizes of forward passes) are left out.
    """
    runtime = {
        "progress", "barrier_timeout_s", "timeout", "max_retries", "base_url", "api_key_env", "batch_size", "concurrency",
    }

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
        wait_for([path], "writing the build plan", cfg.barrier_timeout_s)
    saved = read_json_object(path, "build plan", "it records the settings this folder was built with: restore it, "
                             "or build again in a new output_dir")
    if isinstance(saved.get("data"), dict):
        saved["data"].pop("skip_malformed", None)  # plans written before it left the plan
    if saved == plan:
        return
    old, new = flatten_dict(saved), flatten_dict(plan)
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
        lexicon_vocabulary(cfg)
    try:
        first = next(iter_samples(DataConfig(**{**asdict(cfg.data), "max_samples": None})), None)
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
    rank, world = rank_and_world()
    _validate_inputs(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with build_lock(out, rank):
        # What a killed writer left half-written (its own temporary file) goes; a live rank's is kept.
        remove_dead_temporaries(out)
        return _build_locked(cfg, out, rank, world, t_start)


def _build_locked(cfg: StoreBuildConfig, out: Path, rank: int, world: int, t_start: float) -> dict:
    state = out / "state"
    _check_plan(cfg, state, world, rank)
    if rank == 0:
        _say_if_resumed(out, state)
    state.mkdir(parents=True, exist_ok=True)
    since = time.time() - (time.perf_counter() - t_start)
    try:
        return _run_stages(cfg, out, state, rank, world, t_start, since)
    except (RequestsFailed, OtherRankFailed) as e:
        if rank == 0:
            write_failure_report(out, state, world, str(e))
        raise


def _say_if_resumed(out: Path, state: Path) -> None:
    """One line when the build goes on from an earlier run's committed work (a rerun after a kill, a Ctrl-C or
    failed requests), so a resumed build is never mistaken for a fresh one."""
    chunks = len(list((state / "candidates").glob("part-r*.jsonl")))
    stages = [name for name, folder in (("extract", "candidates"), ("images", "images"), ("dataset", "dataset"))
              if any((state / folder).glob("done-r*.json"))]
    if chunks or stages:
        done = f"stages done: {', '.join(stages)}" if stages else "no stage done yet"
        print(f"build-store: resuming {out}: {chunks} extraction chunks kept, {done}; only the rest is built "
              "(answers in the response cache are not asked again)", file=sys.stderr, flush=True)


def _run_stages(cfg: StoreBuildConfig, out: Path, state: Path, rank: int, world: int, t_start: float, since: float):
    times: dict[str, float] = {}

    def failed(folder: str) -> list[Path]:
        return [state / folder / f"failed-r{r:03d}.json" for r in range(world) if r != rank]

    t0 = time.perf_counter()
    extract_info = stage_extract(cfg, state, rank, world)
    wait_for(
        [state / "candidates" / f"done-r{r:03d}.json" for r in range(world)], "extraction", cfg.barrier_timeout_s,
        abort_if=failed("candidates"), since=since,
    )
    times["extract"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    image_info = stage_images(cfg, out, state, rank, world)
    wait_for(
        [state / "images" / f"done-r{r:03d}.json" for r in range(world)], "images", cfg.barrier_timeout_s,
        abort_if=failed("images"), since=since,
    )
    times["images"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    dataset_info = stage_dataset(cfg, out, state, rank)
    wait_for([state / "dataset" / f"done-r{r:03d}.json" for r in range(world)], "dataset", cfg.barrier_timeout_s)
    times["dataset"] = time.perf_counter() - t0

    if rank != 0:
        return {"rank": rank, "extract": extract_info, "images": image_info, "dataset": dataset_info}
    return build_report(cfg, out, state, world, times, time.perf_counter() - t_start, image_info)


def cli_main(argv: list[str] | None = None) -> int:
    """``tokenswap build-store --config PATH_OR_NAME [key=value ...]``; a bare name resolves in ``configs/``.

    Raises:
        InputError: a config problem, or bad inputs or data found before or during the build (exit status 2);
            the message says whether the folder keeps committed work.
        RequestsFailed: requests failed for good (exit status 1; the same command retries exactly those).
        BuildLockedError: another build holds the folder (exit status 1).
    """
    from tokenswap.config import load_config, split_argv, usage

    if "-h" in (argv or []) or "--help" in (argv or []):
        print(usage(StoreBuildConfig, "tokenswap build-store"))
        return 0
    cfg = load_config(StoreBuildConfig, *split_argv(argv or []))
    try:
        report = build_store(cfg)
    except (RequestsFailed, OtherRankFailed) as e:
        raise type(e)(f"{e} ({cfg.output_dir}/report.json lists them)") from None
    except (FileNotFoundError, ValueError) as e:  # bad inputs or data; found before or during the build
        started = (Path(cfg.output_dir) / "state" / "plan.json").exists()
        # Say what is true of the folder: a build that stopped mid-way keeps its committed work for a rerun.
        if isinstance(e, _PlanChanged):
            after = ""
        elif started:
            after = f" ({cfg.output_dir} keeps what the build committed; rerun with the fix to resume from there)"
        else:
            after = " (nothing was written)"
        raise InputError(f"{e}{after}") from None
    if "samples_kept" in report:
        print(
            f"build-store: {report['samples_kept']}/{report['samples_read']} samples kept, "
            f"{report['concepts_with_images']}/{report['concepts_found']} concepts with images, "
            f"{report['images_per_sample']:.2f} images/sample, {report['images_rejected']} images rejected, "
            f"total {report['time_s']['total']:.1f}s "
            f"(image sources {report['source_s']:.1f}s) -> {cfg.output_dir}/report.json"
        )
    return 0
