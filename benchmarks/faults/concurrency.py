"""Section ``concurrency`` of benchmarks/faults.py: ``tokenswap build-store`` with the LLM extractor and the validity
judge at ``llm.concurrency=16`` against ``tests.support.LoadLLMServer`` answering in a random order: SIGKILLed
at random moments and resumed, then a rate-limited server (429 + Retry-After), a server dropping or stalling some
requests (the build exits 1 naming the failures, ``report.json`` says ``complete: false``, the same command after
the server recovers fills them in). Every chunk, store shard and dataset shard must be byte-identical to a build at
``concurrency=1``.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ._common import ENV, PY, REPO, Tally, files_in, llm_build_files, run

OUTCOME = (
    "kill at concurrency 16: resumes byte-identical to concurrency 1; 429s: slowed, same bytes; dropped/"
    "stalled requests: exit 1 naming them, report complete: false, the rerun fills them in byte-identical"
)


def llm_build_cmd(out: Path, base_url: str, concurrency: int, *extra: str) -> list[str]:
    return [PY, "-m", "tokenswap.cli", "build-store", "--config", "store_generate.yaml", f"output_dir={out}",
            "data.path=fixture", "data.max_samples=96", "sources=[rendered_text]", "extractor.kind=llm",
            "extractor.llm.model=m", f"extractor.llm.base_url={base_url}", f"extractor.llm.concurrency={concurrency}",
            "judge.llm.model=v", f"judge.llm.base_url={base_url}", f"judge.llm.concurrency={concurrency}",
            "samples_per_shard=8", "concept_batch_size=8", "progress=false", *extra]


LLM_COUNTS = ("samples_read", "samples_kept", "concepts_found", "concepts_with_images", "store_images", "spans")


def same_llm_build(out: Path, ref: Path) -> str:
    """'' when ``out`` is complete and byte-identical to ``ref`` (files and report counts)."""
    if not (out / "report.json").exists():
        return "no report.json"
    report, want = json.loads((out / "report.json").read_text()), json.loads((ref / "report.json").read_text())
    if not report.get("complete"):
        return f"report.json says complete={report.get('complete')}"
    a, b = llm_build_files(out), llm_build_files(ref)
    if a.keys() != b.keys():
        return f"files differ: {sorted(a.keys() ^ b.keys())[:4]}"
    differ = [k for k in a if a[k] != b[k]]
    if differ:
        return f"{len(differ)} files differ, e.g. {differ[:3]}"
    counts = {k: report[k] for k in LLM_COUNTS}
    return "" if counts == {k: want[k] for k in LLM_COUNTS} else f"counts {counts} vs {[want[k] for k in LLM_COUNTS]}"


def _until(reached: Callable[[], bool], p: subprocess.Popen, progress: Callable[[], object],
           stall_s: float = 600) -> str:
    """Wait until ``reached()`` or ``p`` ended (''), polling; a process whose ``progress()`` stayed the same for
    ``stall_s`` seconds is hung (said). The only clock here detects a hang: it never decides where a fault lands."""
    seen, since = progress(), time.monotonic()
    while p.poll() is None and not reached():
        now = progress()
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            return f"no progress for {stall_s:g}s (hung)"
        time.sleep(0.002)
    return ""


def section_concurrency(t: Tally, work: Path, rng: random.Random, n_kills: int) -> None:
    from tests.support import LoadLLMServer, concept_reply

    delays = random.Random(1)
    server = LoadLLMServer(concept_reply, latency=lambda payload: delays.uniform(0.0, 0.04))
    try:
        ref = work / "llm-ref"
        proc = run(llm_build_cmd(ref, server.base_url, 1), 1800)
        if proc.returncode != 0:
            raise RuntimeError(f"reference build at concurrency 1 failed: {proc.stderr[-2000:]}")

        # SIGKILLs at random points of a build's own progress (the r-th reply the server sent it, or the k-th new file
        # it wrote), each followed by the same command. No wait in seconds decides where a kill lands: a loaded
        # machine reaches the same points later, not other ones, and a hung build is the only thing a clock ends.
        out = work / "llm-killed"
        kills: list[str] = []
        for attempt in range(n_kills * 3):
            if len(kills) >= n_kills:
                break
            files0, replies0 = files_in(out), len(server.requests)
            if attempt % 2 == 0:
                n = rng.randint(1, 24)
                reached = lambda n=n, r=replies0: len(server.requests) - r >= n  # noqa: E731
            else:
                n = rng.randint(1, 4)
                reached = lambda n=n, f=files0: files_in(out) - f >= n  # noqa: E731
            p = subprocess.Popen(llm_build_cmd(out, server.base_url, 16), cwd=REPO, env=ENV,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            hung = _until(reached, p, progress=lambda: (len(server.requests), files_in(out)))
            running = p.poll() is None
            killed = running and not hung
            if running:
                p.send_signal(signal.SIGKILL)
                if hung:
                    t.add("concurrency", "a build at concurrency 16", False, hung)
                else:
                    kills.append(f"after {len(server.requests) - replies0} replies and {files_in(out) - files0} new "
                                 f"files, {server.in_flight} requests in flight")
            p.wait()
            if killed:  # what the dead writer left half-written: the restart must remove it
                stray = sum(1 for q in out.rglob("*.tmp") if not q.is_relative_to(out / "state" / "cache"))
                kills[-1] += f", {stray} temporary file(s) left"
            if (out / "report.json").exists():
                break
        final = run(llm_build_cmd(out, server.base_url, 16), 1800)
        problem = (final.stderr[-300:] if final.returncode else "") or same_llm_build(out, ref)
        for k in kills:
            t.add("concurrency", f"SIGKILL at concurrency 16 {k}, resumed", not problem, problem)
        if len(kills) < n_kills:
            t.note("concurrency", f"only {len(kills)} of {n_kills} kills landed before the build finished")

        # A rate-limited API: 4 at once, 429 + Retry-After beyond. Slowed down, same bytes.
        server.rate_limit, server.retry_after, server.rejected = 4, 0.3, 0
        out = work / "llm-429"
        # Retries enough for any load: a busy machine serves each slot slower, so more requests meet a full server.
        proc = run(llm_build_cmd(out, server.base_url, 16, "extractor.llm.max_retries=1000",
                                 "judge.llm.max_retries=1000"), 1800)
        rejected = server.rejected
        server.rate_limit = None
        problem = (proc.stderr[-300:] if proc.returncode else "") or same_llm_build(out, ref)
        if not problem and rejected == 0:
            problem = "the server refused nothing: the trial tried no 429"
        t.add("concurrency", f"rate-limited server (4 at once, {rejected} answers 429 + Retry-After)", not problem,
              problem)

        # Requests that fail for good: counted and named, never "no concepts"; the rerun fills them in.
        def dropping(payload):
            if "apple" in json.dumps(payload).lower():
                raise ConnectionError("scripted drop")
            return concept_reply(payload)

        def stalling(payload):
            # Held 12x past the client's 5 s deadline; a loaded machine answers the others well within it.
            return 60.0 if "apple" in json.dumps(payload).lower() else delays.uniform(0.0, 0.04)

        for what, reply, latency in [("drops the connection", dropping, server.latency),
                                     ("stalls past the deadline", concept_reply, stalling)]:
            out = work / f"llm-fail-{what.split()[0]}"
            server.reply, normal = reply, server.latency
            server.latency = latency
            cmd = llm_build_cmd(out, server.base_url, 16, "extractor.llm.max_retries=1", "extractor.llm.timeout=5",
                                "judge.llm.max_retries=1", "judge.llm.timeout=5")
            first = run(cmd, 1800)
            server.reply, server.latency = concept_reply, normal
            report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
            failed = report.get("failed_requests", 0)
            problem = ""
            if first.returncode != 1 or "failed for good" not in first.stderr:
                problem = f"first run rc={first.returncode} {first.stderr[-300:]}"
            elif report.get("complete") is not False or not failed:
                problem = f"report.json: complete={report.get('complete')} failed_requests={failed}"
            else:
                second = run(cmd, 1800)
                problem = (second.stderr[-300:] if second.returncode else "") or same_llm_build(out, ref)
            t.add("concurrency", f"server {what} for some rows ({failed} failed): exit 1, rerun fills them in",
                  not problem, problem)
    finally:
        server.close()
