"""The three resumable stages of a store build (extract, images, dataset) and its report.

Each stage commits its work in atomic units (candidate chunks, store shards, dataset shards) and
skips what a previous run committed; :func:`tokenswap.store.build.build_store` runs them in order.
The dataset stage's output is read back by :func:`read_swap_dataset` / :func:`load_swap_dataset`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tokenswap.concepts import Concept, validate_concepts
from tokenswap.errors import IncompleteRunError, InputError
from tokenswap.files import atomic_write, iter_jsonl, read_json, read_json_object, read_jsonl
from tokenswap.inference.types import LLMRequestError, RequestStats
from tokenswap.redaction import redact_data
from tokenswap.store.build_config import FIXTURE, DataConfig, StoreBuildConfig
from tokenswap.store.builders import SOURCE_BUILDERS, build_chat_model, build_extractor
from tokenswap.store.extract import ExtractionStats, LLMConceptExtractor
from tokenswap.swap import unit_hash

from .image_store import ImageStore, StoreWriter
from .sources import RetrievalSource

_PART = re.compile(r"part-r(\d{3})-(\d{6})\.jsonl$")


def iter_samples(cfg: DataConfig, stats: dict | None = None) -> Iterator[dict]:
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


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))


DAMAGED_FIX = "this build file is damaged: build again in a new output_dir"


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a build's own JSONL file; a damaged one is an InputError naming ``file:line``."""
    # Written atomically by the build, so a disk or a hand broke it: its part cannot be trusted to resume.
    return read_jsonl(path, "build file", DAMAGED_FIX)


MARKER_FIX = "delete it and rerun: the stage redoes only what it had not committed, and writes it again"


def _read_marker(path: Path) -> dict:
    """A rank's ``done`` or ``failed`` marker; a damaged one names itself and how to go on."""
    return read_json_object(path, "done marker" if path.name.startswith("done-") else "failed marker", MARKER_FIX)


def _read_rejected(path: Path) -> list[dict]:
    """A ``rejected-*.json`` list of the images a source could not use."""
    rows = read_json(path, "rejected-images list", "build again in a new output_dir (this build file is damaged)")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"rejected-images list {str(path)!r} is not a JSON list of objects; build again in a new "
                         "output_dir (this build file is damaged)")
    return rows


def _parts(folder: Path, rank: int | None = None) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        p for p in folder.iterdir() if (m := _PART.search(p.name)) and (rank is None or int(m.group(1)) == rank)
    )


def _chunk_stats_path(folder: Path, rank: int, chunk: int) -> Path:
    return folder / f"counts-r{rank:03d}-{chunk:06d}.json"


def _build_extraction_stats(folder: Path, rank: int) -> ExtractionStats | None:
    """The model's extraction counts summed over this rank's committed chunks (``None`` when none has any): a
    resumed build reports every chunk, not only those its last run extracted."""
    total, found = ExtractionStats(), False
    for part in _parts(folder, rank):
        path = _chunk_stats_path(folder, rank, int(_PART.search(part.name).group(2)))
        if not path.exists():
            continue
        counts = read_json_object(path, "extraction counts", MARKER_FIX)
        total.merge(ExtractionStats(**{k: v for k, v in counts.items() if k in ExtractionStats.__dataclass_fields__}))
        found = True
    return total if found else None


def _owner(key: str, world: int) -> int:
    return min(int(unit_hash("store", key) * world), world - 1)


class RequestsFailed(IncompleteRunError):
    """Requests of a stage failed for good; their rows were not committed and a rerun retries them (exit status 1)."""


def _failed_marker(folder: Path, rank: int) -> Path:
    return folder / f"failed-r{rank:03d}.json"


def _write_marker(path: Path, info: dict) -> None:
    """A stage's done or failed marker; its errors quote servers' answers, so every known secret is masked."""
    atomic_write(path, json.dumps(redact_data(info)).encode())


def _stop_on_failed_requests(folder: Path, rank: int, info: dict, failed: list[dict], list_field: str, stage: str,
                             first: str, uncommitted: str) -> NoReturn:
    """Record a stage's requests that failed for good in ``failed-rRRR.json`` (in place of its done marker) and
    raise :class:`RequestsFailed` naming how many and the first.

    Args:
        folder: the stage's state folder.
        rank: this rank.
        info: the stage's counts, written into the marker with the failures.
        failed: one ``{...: what, "error": ...}`` per failed request, in input order (at least one).
        list_field: the marker's field listing them (the first 100).
        stage: the stage as the message names it (``extraction``, ``judge``).
        first: how the message names the first failure.
        uncommitted: what was not committed (``their chunks``).

    Raises:
        RequestsFailed: always.
    """
    info["failed_requests"] = len(failed)
    info[list_field] = failed[:100]
    _write_marker(_failed_marker(folder, rank), info)
    raise RequestsFailed(
        f"{stage}: {len(failed)} request(s) failed for good (first: {first}: {failed[0]['error']}); {uncommitted} "
        "were not committed. Rerun the same command to retry them (answers so far are cached)"
    )


def stage_extract(cfg: StoreBuildConfig, state: Path, rank: int, world: int) -> dict:
    """Find concept spans in this rank's samples, many requests in flight, and commit them chunk by chunk.

    Outcomes come back in sample order (:func:`map_ordered`), so every chunk is byte-identical to a build
    with one request in flight. A chunk holding a row whose request failed for good is not committed:
    the stage goes on with the others, records the failures in ``failed-rRRR.json`` instead of its done
    marker and raises :class:`RequestsFailed`; a rerun redoes only the uncommitted chunks, asking again
    only what the response cache does not hold.
    """
    from tokenswap.inference import map_ordered
    from tokenswap.inference.progress import RequestProgress

    from .builders import request_concurrency

    folder = state / "candidates"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"done-r{rank:03d}.json"
    if done.exists():
        return {"skipped": True}
    _failed_marker(folder, rank).unlink(missing_ok=True)  # this run retries them
    for tmp in folder.glob(f"part-r{rank:03d}-*.tmp"):
        tmp.unlink()
    committed = {int(_PART.search(p.name).group(2)) for p in _parts(folder, rank)}
    size = cfg.samples_per_shard
    llm = cfg.extractor.llm if cfg.extractor.kind == "llm" else None
    concurrency = request_concurrency(llm)
    # Counts this rank's rows as they are committed (not as they are read: reading runs a window ahead).
    mine = None if cfg.data.max_samples is None else len(range(rank, cfg.data.max_samples, world))
    bar = RequestProgress(mine, f"[r{rank}] extract", cfg.progress and rank == 0)
    data_stats: dict = {}
    counts = {"samples_read": 0}
    holder: dict = {}  # the extractor, built on the first uncommitted row: a resumed rank may need no model

    def todo() -> Iterator[tuple[int, dict]]:
        local = 0
        for i, sample in enumerate(iter_samples(cfg.data, data_stats)):
            if i % world != rank:
                continue
            chunk, local = local // size, local + 1
            counts["samples_read"] = local
            if chunk in committed:
                bar.update(1)
                continue
            if "extractor" not in holder:
                holder["extractor"] = build_extractor(cfg, state, rank)
                bar.add_model(getattr(holder["extractor"], "chat_model", None))
            yield chunk, sample

    def extract(job: tuple[int, dict]) -> tuple[list[dict], ExtractionStats | None]:
        _, sample = job
        extractor = holder["extractor"]
        counted = ExtractionStats() if isinstance(extractor, LLMConceptExtractor) else None
        spans = [
            {"message": m, "start": s, "end": e, "key": k}
            for m, msg in enumerate(sample["messages"])
            if msg["role"] == "user"
            for s, e, k in (extractor.extract(msg["content"]) if counted is None
                            else extractor.extract(msg["content"], into=counted))
        ]
        return spans, counted

    t0 = time.perf_counter()
    failed: list[dict] = []
    rows: list[dict] = []
    current: int | None = None
    broken = False  # the current chunk has a failed row: not committed
    chunk_stats: ExtractionStats | None = None  # the model's extraction counts of the current chunk

    def commit() -> None:
        if current is not None and not broken:
            if chunk_stats is not None:  # before the part: a part in place always has its counts beside it
                atomic_write(_chunk_stats_path(folder, rank, current), json.dumps(vars(chunk_stats)).encode())
            _write_jsonl(folder / f"part-r{rank:03d}-{current:06d}.jsonl", rows)

    for outcome in map_ordered(extract, todo(), concurrency):
        bar.update(1)
        chunk, sample = outcome.item
        if chunk != current:
            commit()
            current, rows, broken, chunk_stats = chunk, [], False, None
        if not outcome.ok:
            if not isinstance(outcome.error, LLMRequestError):
                raise outcome.error
            broken = True
            failed.append({"id": sample["id"], "error": str(outcome.error)[:500]})
            continue
        spans, counted = outcome.value
        if counted is not None:
            chunk_stats = chunk_stats or ExtractionStats()
            chunk_stats.merge(counted)
        if spans:
            rows.append({"id": sample["id"], "messages": sample["messages"], "candidates": spans})
    commit()
    bar.close()
    # Every rank reads every row, so each rank's count is the whole source's.
    info: dict = {"samples_read": counts["samples_read"], "malformed_skipped": data_stats.get("malformed", 0)}
    extractor = holder.get("extractor")
    build_counts = _build_extraction_stats(folder, rank)
    if build_counts is not None:  # the whole build's, over every committed chunk, whichever run extracted it
        info["llm_extraction"] = vars(build_counts)
    if isinstance(extractor, LLMConceptExtractor):  # the lexicon asks no model
        if failed:  # the failed rows' counts are in no committed chunk: this run's, so the failure is counted
            info["llm_extraction"] = vars(extractor.stats).copy()
        info["llm_requests"] = {**extractor.chat_model.stats.as_dict(), "stage_wall_s": time.perf_counter() - t0}
    if failed:
        _stop_on_failed_requests(folder, rank, info, failed, "failed_rows", "extraction", failed[0]["id"],
                                 "their chunks")
    _write_marker(done, info)
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


@dataclass
class _Found:
    """One image a source found for a concept, with the judge's verdict in ``meta`` once it has one."""

    image: Any
    score: float
    meta: dict
    source: str


@dataclass
class _ToJudge:
    """A job of the images stage: one found image the judge is asked about."""

    key: str
    image: Any


@dataclass
class _Batch:
    """A job of the images stage: a concept batch, every source's images fetched; committed as shard ``shard``."""

    shard: int
    keys: list[str]
    found: dict[str, list[_Found]]
    rejected: list[dict]


def _batches(mine: list[str], attempted: ImageStore | None, size: int) -> list[tuple[int, list[str]]]:
    """``(shard number, concepts to fetch)`` of each batch of this rank's concepts that the store does not hold yet.

    Batches are cut from all of the rank's concepts and numbered by position, not in commit order, so a build that
    redoes a failed batch names every shard as an uninterrupted build does.
    """
    out = []
    for number, b in enumerate(range(0, len(mine), size)):
        todo = [k for k in mine[b : b + size] if attempted is None or not attempted.attempted(k)]
        if todo:
            out.append((number, todo))
    return out


def _open_sources(cfg: StoreBuildConfig, state: Path, folder: Path, rank: int) -> list:
    """The configured image sources, a retrieval index built (and the corpus items it refused recorded)."""
    sources = [SOURCE_BUILDERS[name](cfg, state) for name in cfg.sources]
    for source in sources:
        if isinstance(source, RetrievalSource):
            source.build_index(progress=cfg.progress and rank == 0)
            atomic_write(folder / "rejected-corpus.json", json.dumps(source.index_rejected).encode())
    return sources


def _fetch(batches: list[tuple[int, list[str]]], sources: list, judge_images: bool, info: dict
           ) -> Iterator[_ToJudge | _Batch]:
    """Fetch each batch from every source: a :class:`_ToJudge` per image (when judged), then the :class:`_Batch`."""
    for shard, batch in batches:
        found: dict[str, list[_Found]] = {k: [] for k in batch}
        for source in sources:
            t0 = time.perf_counter()
            result = source.images_for(batch)
            dt = time.perf_counter() - t0
            info["source_s"] += dt
            info["by_source"][source.name] = info["by_source"].get(source.name, 0.0) + dt
            for key in batch:
                found[key] += [_Found(img, score, dict(meta), source.name) for img, score, meta in result.get(key, [])]
        rejected = [r for s in sources for r in s.rejected]
        for s in sources:
            s.rejected.clear()
        if judge_images:
            for key in batch:
                for f in found[key]:
                    yield _ToJudge(key, f.image)
        yield _Batch(shard, batch, found, rejected)


def _commit(batch: _Batch, verdicts: list[dict] | None, drop_invalid: bool, writer: StoreWriter, folder: Path,
            rank: int) -> int:
    """Write one batch as its store shard (verdicts, in job order, put into each image's meta); its image count."""
    found = batch.found
    if verdicts is not None:
        it = iter(verdicts)
        for key in batch.keys:
            for f in found[key]:
                f.meta["judge"] = next(it)
            found[key] = [f for f in found[key] if not (drop_invalid and f.meta["judge"]["valid"] is False)]
    n_images = 0
    for key in batch.keys:
        if not found[key]:
            writer.add(key, None, source="none", score=0.0)
        for f in found[key]:
            writer.add(key, f.image, source=f.source, score=f.score, meta=f.meta)
            n_images += 1
    # A name already taken means a folder resumed with another concept_batch_size (the plan does not pin it): the
    # batch then takes the next free number, as a committed shard is never overwritten.
    shard = writer.free_shard(batch.shard)
    # Named after the batch's shard: a batch redone after a kill or a failure overwrites its own list, so every
    # rejection is counted once.
    atomic_write(folder / f"rejected-r{rank:03d}-{shard:06d}.json", json.dumps(batch.rejected).encode())
    writer.flush(shard=shard)
    return n_images


def stage_images(cfg: StoreBuildConfig, out: Path, state: Path, rank: int, world: int) -> dict:
    """Fetch every concept's images from each source, judge them (many requests in flight) and commit batch by batch.

    The sources run batch after batch in this thread; the judge's requests run ``judge.llm.concurrency``
    at a time across batch boundaries (the next batch's images are fetched while the judge answers).
    Verdicts come back in order, so every shard is byte-identical to a build with one request in flight.
    A batch with a failed judge request is not committed (a rerun fetches and judges it again, the
    answers so far from the cache, and commits it under the shard name it would have had); the stage
    records the failures and raises :class:`RequestsFailed`.
    """
    from tokenswap.inference import map_ordered
    from tokenswap.inference.progress import RequestProgress

    from .builders import request_concurrency

    folder = state / "images"
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / f"done-r{rank:03d}.json"
    if done.exists():
        return {"skipped": True, "source_s": 0.0, "judge_s": 0.0}
    _failed_marker(folder, rank).unlink(missing_ok=True)
    store_dir = out / "store"
    contexts = _collect_concepts(state)
    mine = [k for k in contexts if _owner(k, world) == rank]
    attempted = ImageStore(store_dir) if (store_dir / "store.json").exists() else None
    batches = _batches(mine, attempted, cfg.concept_batch_size)
    todo = [k for _, batch in batches for k in batch]
    info = {"concepts": len(mine), "fetched": len(todo), "source_s": 0.0, "judge_s": 0.0, "by_source": {}}
    build_info = {"build": {"tool": "tokenswap build-store", "sources": list(cfg.sources)}}
    if not todo:
        if rank == 0 and attempted is None:
            StoreWriter(store_dir, rank=0, info=build_info).close()  # an empty but valid store
        _write_marker(done, info)
        return info
    sources = _open_sources(cfg, state, folder, rank)
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
    bar = RequestProgress(len(todo), f"[r{rank}] images", cfg.progress and rank == 0,
                          [judge.chat_model if judge else None])

    def verdict(job: _ToJudge | _Batch) -> dict | None:
        if isinstance(job, _Batch):
            return None
        text, start, end = contexts[job.key]
        return judge.judge(text, start, end, job.key, job.image)

    n_images = 0
    failed: list[dict] = []
    verdicts: list[dict | None] = []  # of the current batch, in job order
    batch_failed = False
    t_loop = time.perf_counter()
    commit_s = 0.0
    concurrency = request_concurrency(cfg.judge.llm) if judge is not None else 1
    for outcome in map_ordered(verdict, _fetch(batches, sources, judge is not None, info), concurrency):
        job = outcome.item
        if isinstance(job, _ToJudge):
            if not outcome.ok:
                if not isinstance(outcome.error, LLMRequestError):
                    raise outcome.error
                batch_failed = True
                failed.append({"concept": job.key, "error": str(outcome.error)[:500]})
            verdicts.append(outcome.value)
            continue
        if not batch_failed:  # else not committed: a rerun fetches and judges this batch again
            t0 = time.perf_counter()
            n_images += _commit(job, verdicts if judge is not None else None,
                                judge is not None and cfg.judge.drop_invalid, writer, folder, rank)
            commit_s += time.perf_counter() - t0
            bar.update(len(job.keys))
        verdicts, batch_failed = [], False
    bar.close()
    if judge is not None:
        # The time the stage waited for verdicts: the loop's wall time less fetching and committing.
        info["judge_s"] = max(0.0, time.perf_counter() - t_loop - info["source_s"] - commit_s)
        info["llm_requests"] = {**judge.chat_model.stats.as_dict(), "stage_wall_s": time.perf_counter() - t_loop}
    info["images"] = n_images
    if failed:
        _stop_on_failed_requests(folder, rank, info, failed, "failed_concepts", "judge",
                                 f"concept {failed[0]['concept']!r}", "their concept batches")
    _write_marker(done, info)
    return info


def stage_dataset(cfg: StoreBuildConfig, out: Path, state: Path, rank: int) -> dict:
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
    _write_marker(done, info)
    return info


def build_report(cfg: StoreBuildConfig, out: Path, state: Path, world: int, times: dict, total_s: float, image_info: dict):
    samples = read_swap_dataset(out / "dataset")
    candidate_keys = _collect_concepts(state)
    store = ImageStore(out / "store")
    n_spans = sum(len(s["concepts"]) for s in samples)
    used_keys = {c["key"] for s in samples for c in s["concepts"]}
    extract_markers = [_read_marker(state / "candidates" / f"done-r{r:03d}.json") for r in range(world)]
    image_markers = [_read_marker(state / "images" / f"done-r{r:03d}.json") for r in range(world)]
    samples_read = sum(m.get("samples_read", 0) for m in extract_markers)
    source_s = image_info.get("source_s", 0.0)
    rejected = [r for p in sorted((state / "images").glob("rejected-*.json")) for r in _read_rejected(p)]
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
        "llm": _llm_report(extract_markers, image_markers),
        "ranks": {"extract": extract_markers, "images": image_markers},
        "complete": True,
    }
    atomic_write(out / "report.json", json.dumps(redact_data(report), indent=2).encode())
    return report


def _llm_report(extract_markers: list[dict], image_markers: list[dict]) -> dict:
    """Requests, tokens, retries, errors and wall time of each stage that asked a model, summed over ranks.

    Counts are this run's (a resumed stage counts what it asked after the resume; answers served from the
    cache are ``cached``); ``wall_s`` is the slowest rank's.
    """
    out = {}
    for stage, markers in (("extract", extract_markers), ("judge", image_markers)):
        rows = [m["llm_requests"] for m in markers if "llm_requests" in m]
        if not rows:
            continue
        total = RequestStats.merge({k: v for k, v in row.items() if k not in ("in_flight", "limit", "wall_s",
                                                                             "stage_wall_s")} for row in rows)
        total["wall_s"] = max(r.get("stage_wall_s", 0.0) for r in rows)
        out[stage] = total
    return out


def write_failure_report(out: Path, state: Path, world: int, error: str) -> dict:
    """``report.json`` of a build that stopped on failed requests: what failed, where, and how to go on."""
    markers: dict[str, list[dict]] = {"extract": [], "images": []}
    failed = 0
    for stage, folder in (("extract", "candidates"), ("images", "images")):
        for r in range(world):
            for name in (f"failed-r{r:03d}.json", f"done-r{r:03d}.json"):
                path = state / folder / name
                if path.exists():
                    marker = _read_marker(path)
                    markers[stage].append(marker)
                    failed += marker.get("failed_requests", 0)
                    break
    report = {
        "output_dir": str(out),
        "complete": False,
        "failed_requests": failed,
        "error": error,
        "next": "rerun the same command: it retries only the failed rows (everything else is committed or cached)",
        "llm": _llm_report(markers["extract"], markers["images"]),
        "ranks": markers,
    }
    atomic_write(out / "report.json", json.dumps(redact_data(report), indent=2).encode())
    return report


def read_swap_dataset(path: str | os.PathLike) -> list[dict]:
    """All samples of a swap dataset folder (``dataset/``), shard by shard in name order.

    Raises:
        InputError: a torn or non-UTF-8 line (names ``shard:line``).
        ValueError: a bad sample; names the shard file and line.
    """
    from tokenswap.data.schema import check_sample

    rows = []
    for part in _parts(Path(path)):
        for where, row in iter_jsonl(part, "swap dataset shard", DAMAGED_FIX):
            check_sample(row, where)
            rows.append(row)
    return rows


def load_swap_dataset(path: str | os.PathLike):
    """A swap dataset folder as a ``datasets.Dataset`` (same rows as :func:`read_swap_dataset`)."""
    from datasets import Dataset

    return Dataset.from_list(read_swap_dataset(path))
