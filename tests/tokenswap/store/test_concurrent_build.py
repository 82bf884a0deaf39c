"""A store build with many requests in flight writes exactly what one request at a time writes; failures are kept.

The LLM extractor and the validity judge ask :class:`tests.support.LoadLLMServer` on 127.0.0.1, which
answers every request after a random delay, so replies come back in a random order.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import LoadLLMServer, concept_reply
from tokenswap.config import load_config
from tokenswap.store.build import StoreBuildConfig, build_store
from tokenswap.store.stages import RequestsFailed

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def overrides(out: Path, base_url: str, concurrency: int, rows: int = 48) -> list[str]:
    return [
        f"output_dir={out}",
        "data.path=fixture",
        f"data.max_samples={rows}",
        "sources=[rendered_text]",
        "extractor.kind=llm",
        "extractor.llm.model=m",
        f"extractor.llm.base_url={base_url}",
        f"extractor.llm.concurrency={concurrency}",
        "judge.llm.model=v",
        f"judge.llm.base_url={base_url}",
        f"judge.llm.concurrency={concurrency}",
        "samples_per_shard=8",
        "concept_batch_size=8",
        "progress=false",
    ]


def build(out: Path, base_url: str, concurrency: int, **kw) -> dict:
    return build_store(load_config(StoreBuildConfig, "store_generate.yaml", overrides(out, base_url, concurrency, **kw)))


def outputs(out: Path) -> dict[str, bytes]:
    """Every file the build writes whose bytes must not depend on timing: chunks, store and dataset shards."""
    skip = ("state/cache/", ".build-lock")
    files = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if p.is_file() and not rel.startswith(skip) and "/done-" not in rel and rel != "report.json":
            files[rel] = p.read_bytes()
    return files


COUNTS = ("samples_read", "samples_kept", "concepts_found", "concepts_with_images", "concepts_used",
          "store_images", "spans", "images_rejected")


def random_delay(payload: dict) -> float:
    return random.uniform(0.0, 0.03)


def test_many_requests_in_flight_write_the_same_bytes_as_one(tmp_path):
    with LoadLLMServer(concept_reply, latency=random_delay) as server:
        one = build(tmp_path / "one", server.base_url, 1)
        assert server.max_in_flight == 1
        server.max_in_flight = 0
        many = build(tmp_path / "many", server.base_url, 16)
        assert server.max_in_flight > 4  # really concurrent
    a, b = outputs(tmp_path / "one"), outputs(tmp_path / "many")
    assert any(k.startswith("state/candidates/part-") for k in a) and any(k.startswith("store/") for k in a)
    assert any(k.startswith("dataset/part-") for k in a) and one["samples_kept"] > 0
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    assert {k: one[k] for k in COUNTS} == {k: many[k] for k in COUNTS}
    # What was asked is in report.json: requests, tokens, retries, errors, wall time per stage.
    for stage, n in (("extract", 48), ("judge", many["store_images"])):
        llm = many["llm"][stage]
        assert llm["requests"] + llm["cached"] >= n > 0 and llm["errors"] == 0 and llm["retries"] == 0 and llm["wall_s"] > 0
        assert llm["prompt_tokens"] == 10 * llm["replies"] and llm["completion_tokens"] == 5 * llm["replies"]
    assert many["llm"]["extract"]["max_in_flight"] > 4 and one["llm"]["extract"]["max_in_flight"] == 1


def test_failed_requests_are_counted_not_committed_and_a_rerun_fills_them_in(tmp_path):
    def flaky(payload):
        text = json.dumps(payload)
        if "apple" in text.lower():  # every request about apples fails: the server drops them
            raise ConnectionError("scripted drop")
        return concept_reply(payload)

    with LoadLLMServer(concept_reply, latency=random_delay) as server:
        reference = build(tmp_path / "ref", server.base_url, 8)
        server.reply = flaky
        cmd = [sys.executable, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml",
               *overrides(tmp_path / "out", server.base_url, 8), "extractor.llm.max_retries=1",
               "judge.llm.max_retries=1", "extractor.llm.timeout=5"]
        env_run = dict(cwd=REPO, capture_output=True, text=True, timeout=300)
        first = subprocess.run(cmd, **env_run, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert first.returncode == 1, first.stderr[-3000:]
        assert "request(s) failed for good" in first.stderr and "Rerun the same command" in first.stderr
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["complete"] is False and report["failed_requests"] > 0
        assert report["llm"]["extract"]["errors"] == report["failed_requests"]
        failed_ids = {r["id"] for m in report["ranks"]["extract"] for r in m.get("failed_rows", [])}
        assert failed_ids  # named, not turned into "no concepts"
        server.reply = concept_reply  # the server recovers: the same command fills the rows in
        second = subprocess.run(cmd, **env_run, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert second.returncode == 0, second.stderr[-3000:]
    assert outputs(tmp_path / "out") == outputs(tmp_path / "ref")
    final = json.loads((tmp_path / "out" / "report.json").read_text())
    assert final["complete"] is True and {k: final[k] for k in COUNTS} == {k: reference[k] for k in COUNTS}


def test_a_rank_with_failed_requests_stops_the_others_at_the_barrier_and_the_rerun_finishes(tmp_path):
    from tokenswap.data.magpie import fixture_path

    rows = [json.loads(line) for line in fixture_path().read_text().splitlines()[:2]]
    rank1_text = next(t["value"] for t in rows[1]["conversations"] if t["from"] == "human")[:40]

    def dropping(payload):  # sample 1 belongs to rank 1 of 2
        if rank1_text in payload["messages"][-1]["content"]:
            raise ConnectionError("scripted drop")
        return concept_reply(payload)

    with LoadLLMServer(dropping, latency=random_delay) as server:
        out = tmp_path / "two"
        cmd = [sys.executable, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml",
               *overrides(out, server.base_url, 8, rows=32), "extractor.llm.max_retries=0", "judge.llm.max_retries=0"]

        def launch() -> list[subprocess.CompletedProcess]:
            procs = [subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RANK": str(r),
                                                          "WORLD_SIZE": "2"}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for r in range(2)]
            return [(p.wait(timeout=120), p.stderr.read()) for p in procs]

        (rc0, err0), (rc1, err1) = launch()
        assert (rc0, rc1) == (1, 1), (err0[-2000:], err1[-2000:])
        assert "request(s) failed for good" in err1 and "another rank stopped extraction" in err0
        report = json.loads((out / "report.json").read_text())
        assert report["complete"] is False and report["failed_requests"] == 1
        server.reply = concept_reply
        (rc0, err0), (rc1, err1) = launch()
        assert (rc0, rc1) == (0, 0), (err0[-2000:], err1[-2000:])
        single = build(tmp_path / "one", server.base_url, 8, rows=32)
    final = json.loads((out / "report.json").read_text())
    assert final["complete"] is True and {k: final[k] for k in COUNTS} == {k: single[k] for k in COUNTS}


def whole_folder(out: Path) -> dict[str, bytes | object]:
    """Every file of a build folder by name, with what of it may differ between two builds of one config set aside.

    Set aside, each for a stated reason (everything else is compared byte for byte):
    - ``report.json`` and the stages' ``done-*`` markers: the fields that describe the run, not the output (its
      wall times, and the requests, fetches and writes *this run* made: documented as this run's counts, so a rerun
      that retried one batch rightly counts one batch), and ``output_dir`` (each folder's own path);
    - ``state/cache/*.jsonl``: an append-only log whose lines come in the order answers arrived (already random with
      many requests in flight), compared as a sorted list of lines;
    - ``.build-lock-*``: the holder tag of whichever process held the folder last (its pid and start time).
    """
    run_fields = {"output_dir", "time_s", "source_s", "source_s_by_name", "by_source", "judge_s", "overhead_s",
                  "overhead_frac_of_total", "llm", "llm_requests", "llm_extraction", "fetched", "images"}

    def product(value):
        if isinstance(value, dict):
            return {k: product(v) for k, v in value.items() if k not in run_fields}
        return [product(v) for v in value] if isinstance(value, list) else value

    files: dict[str, bytes | object] = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if not p.is_file():
            continue
        if rel == "report.json" or "/done-" in rel:
            files[rel] = product(json.loads(p.read_bytes()))
        elif rel.startswith("state/cache/"):
            files[rel] = sorted(p.read_bytes().splitlines())
        elif rel.startswith(".build-lock"):
            files[rel] = "(holder tag)"
        else:
            files[rel] = p.read_bytes()
    return files


def test_a_build_rerun_after_failed_extract_and_judge_batches_equals_an_uninterrupted_one_file_for_file(tmp_path):
    """Issue 38: shards were numbered in commit order, so a judge batch that failed and was redone took the last
    number and every later batch moved up one; shard (and rejected-list) names follow the batch, not the run."""
    import pyarrow as pa

    with LoadLLMServer(concept_reply, latency=random_delay) as server:
        build(tmp_path / "ref", server.base_url, 8)
        # A concept of the first batch (not the last: only a failure before other batches can renumber them).
        first = pa.ipc.open_stream(pa.memory_map(str(tmp_path / "ref/store/shards/part-r000-000000.arrow"))).read_all()
        assert len(list((tmp_path / "ref/store/shards").iterdir())) >= 3
        doomed = next(c for c, im in zip(first.column("concept").to_pylist(), first.column("image").to_pylist()) if im)

        def failing(stage: str):
            def reply(payload):
                text = json.dumps(payload)
                if stage == "extract" and payload["messages"][0]["role"] == "system" and "apple" in text.lower():
                    raise ConnectionError("scripted drop")
                if stage == "judge" and f'The phrase was \\"{doomed}\\"' in text:
                    raise ConnectionError("scripted drop")
                return concept_reply(payload)
            return reply

        out = tmp_path / "out"
        retries = ["extractor.llm.max_retries=0", "judge.llm.max_retries=0"]
        for stage in ("extract", "judge"):
            server.reply = failing(stage)
            with pytest.raises(RequestsFailed, match="request\\(s\\) failed for good"):
                build_store(load_config(StoreBuildConfig, "store_generate.yaml",
                                        overrides(out, server.base_url, 8) + retries))
            report = json.loads((out / "report.json").read_text())
            assert report["complete"] is False and report["ranks"][{"extract": "extract", "judge": "images"}[stage]]
        assert (out / "state/images/failed-r000.json").exists()  # the judge batch really failed
        server.reply = concept_reply
        build_store(load_config(StoreBuildConfig, "store_generate.yaml", overrides(out, server.base_url, 8) + retries))
    a, b = whole_folder(tmp_path / "ref"), whole_folder(out)
    assert sorted(a) == sorted(b)
    assert [(k, a[k], b[k]) if isinstance(a[k], dict) else k for k in a if a[k] != b[k]] == []
