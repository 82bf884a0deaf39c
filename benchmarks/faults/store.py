"""Section ``store`` of benchmarks/faults.py: store builds SIGKILLed at random moments then resumed (output equal to an
uninterrupted build, the next start never refused by a stale lock); two builds started together on one folder (one
builds, the other is refused naming the holder, nothing lost or duplicated); resumes with other sources/settings
(refused with the difference, folder untouched); a typo in ``data.path`` (exit 2, nothing written, the fixed command
runs); a negative limit.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

from ._common import ENV, REPO, Tally, files_in, run, store_cmd, tree_digest

OUTCOME = (
    "kill: resumes to the uninterrupted build's rows, no stale lock; concurrent: one builds, the other exits 1 "
    "naming folder + PID; changed sources/settings: exit 2 showing the difference, folder untouched; typo/negative "
    "limit: exit 2, nothing written"
)


def store_rows(out: Path) -> list[tuple]:
    from tokenswap.store import ImageStore

    ds = ImageStore(out / "store").to_dataset()
    return sorted(zip(ds["key"], ds["source"], ds["image_id"]))


def dataset_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "dataset").glob("*.jsonl"))}


def same_build(out: Path, ref: Path) -> str:
    """'' when ``out`` holds the same store rows and byte-identical dataset shards as ``ref``."""
    if not (out / "report.json").exists():
        return "no report.json"
    rows = store_rows(out)
    if len(rows) != len(set(rows)):
        return f"{len(rows) - len(set(rows))} duplicate store rows"
    if rows != store_rows(ref):
        return f"store rows differ ({len(rows)} vs {len(store_rows(ref))})"
    if dataset_bytes(out) != dataset_bytes(ref):
        return "dataset shards differ"
    return ""


def section_store(t: Tally, work: Path, rng: random.Random, n_kills: int) -> None:
    ref = work / "store-ref"
    proc = run(store_cmd(ref), 300)
    if proc.returncode != 0:
        raise RuntimeError(f"reference store build failed: {proc.stderr[-2000:]}")

    # SIGKILLs at random moments; every restart must start (no stale lock) and the end must match.
    out = work / "store-killed"
    kills: list[str] = []
    refused = ""
    for _ in range(n_kills * 3):
        if len(kills) >= n_kills:
            break
        before = files_in(out)
        err_path = work / "store-killed.err"
        with open(err_path, "w") as err:
            p = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
        target = before + rng.randint(1, 6)
        deadline = time.monotonic() + 120
        while p.poll() is None and files_in(out) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills.append(f"after {files_in(out) - before} new files")
        p.wait()
        if "being built by another process" in err_path.read_text():
            refused = err_path.read_text()[-300:]
        if (out / "report.json").exists():
            break
    final = run(store_cmd(out), 300)
    problem = refused or (final.stderr[-300:] if final.returncode else "") or same_build(out, ref)
    for k in kills:
        t.add("store", f"SIGKILL of a store build {k}, resumed", not problem, problem)
    if len(kills) < n_kills:
        t.note("store", f"only {len(kills)} of {n_kills} store-build kills landed before the build finished")

    # Two builds on one folder at (nearly) the same time.
    for trial, delay in enumerate([0.0, 0.0, 0.5, 1.5]):
        out = work / f"store-concurrent-{trial}"
        a = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        b = subprocess.Popen(store_cmd(out), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = [(q.wait(timeout=300), q.stderr.read()) for q in (a, b)]
        codes = sorted(code for code, _ in results)
        refusal = next((err for code, err in results if code == 1), "")
        problem = ""
        if codes == [0, 0]:
            problem = "" if delay > 0 else "both exited 0 although started together"
        elif codes != [0, 1]:
            problem = f"exit codes {codes}: {results[0][1][-200:]} {results[1][1][-200:]}"
        elif str(out) not in refusal or "pid " not in refusal:
            problem = f"refusal does not name folder and holder: {refusal[-200:]}"
        problem = problem or same_build(out, ref)
        t.add("store", f"two builds on one folder, {delay:g}s apart", not problem, problem)

    # Resuming with other plan settings is refused with the difference, and the folder is untouched.
    for override, expect in [
        (["sources=[rendered_text]", "extractor.vocabulary=[cat]"], "sources: was"),
        (["openmoji.size=64"], "source_settings.openmoji.size: was 112, now 64"),
        (["samples_per_shard=7"], "samples_per_shard: was 10, now 7"),
    ]:
        before = tree_digest(ref)
        proc = run(store_cmd(ref, *override), 120)
        ok = proc.returncode == 2 and expect in proc.stderr and tree_digest(ref) == before
        t.add("store", f"resume with {' '.join(override)}", ok, f"rc={proc.returncode} {proc.stderr[-200:]}")

    # A typo in data.path writes nothing, so the corrected command just runs.
    out = work / "store-typo"
    proc = run(store_cmd(out, f"data.path={work / 'magpie.jsonll'}"), 120)
    typo_ok = proc.returncode == 2 and "does not exist" in proc.stderr and not (out / "state").exists()
    fixed = run(store_cmd(out, "data.max_samples=20"), 300)
    t.add("store", "typo in data.path, then the corrected command", typo_ok and fixed.returncode == 0,
          f"rc={proc.returncode}/{fixed.returncode} {proc.stderr[-200:]} {fixed.stderr[-200:]}")
    out = work / "store-negative"
    proc = run(store_cmd(out, "data.max_samples=-1"), 120)
    t.add("store", "data.max_samples=-1", proc.returncode == 2 and not (out / "state").exists(),
          f"rc={proc.returncode} {proc.stderr[-200:]}")
