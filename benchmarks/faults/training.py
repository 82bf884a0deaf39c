"""Section ``training`` of benchmarks/faults.py: ``recipes/post_train.py`` on the tiny config SIGKILLed at random
moments and right as a checkpoint folder appears (mid-save), resumed with ``train.resume_from_checkpoint=latest``;
the final losses, ``sample_ids.rank0.txt`` and ``swap_stats.json`` must equal an uninterrupted run. Each kill is
handled only if the run it belongs to ends equal to the reference. A kill counts as mid-save only when the
checkpoint it hit was left partial; fewer kills landed than asked are said in a note.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

from ._common import ENV, REPO, TRAIN_STEPS, Tally, compare_logs, run, run_logs, train_cmd

OUTCOME = (
    "resume from the newest complete checkpoint; losses, sample_ids and swap_stats equal an uninterrupted run"
)


def _file_state(path: Path) -> tuple[int, int] | None:
    """(size, mtime) of a file, None while it does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def section_training(t: Tally, work: Path, rng: random.Random, model: Path, store: Path, n_kills: int) -> None:
    from tokenswap.training import COMPLETE_MARKER

    ref_out = work / "train-ref"
    proc = run(train_cmd(ref_out, model, store), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference training run failed: {proc.stderr[-2000:]}")
    ref = run_logs(ref_out)
    # Seconds per optimizer step of the reference run, so a "random moment" lands within the next few steps:
    # on an idle machine the tiny run trains 16 steps in under a second, and the earlier fixed 0-3 s delay let
    # it finish before the kill (fewer kills tried than asked for).
    history = json.loads((ref_out / "log_history.json").read_text())
    step_s = max(h["train_runtime"] for h in history if "train_runtime" in h) / TRAIN_STEPS

    out = work / "train-killed"
    # Half the kills (rounded up) must land mid-save: while a new checkpoint folder is still partial.
    want = {"save": (n_kills + 1) // 2, "random": n_kills // 2}
    landed = {"save": 0, "random": 0}
    kills: list[str] = []
    problem = ""
    finished = False
    for attempt in range(3 * n_kills):
        if landed["save"] >= want["save"] and landed["random"] >= want["random"]:
            break
        resume = ["train.resume_from_checkpoint=latest"] if any(out.glob("checkpoint-*")) else []
        seen = {p.name for p in out.glob("*checkpoint-*")} if out.exists() else set()
        log = work / f"train-attempt-{attempt}.log"
        with open(log, "w") as f:
            p = subprocess.Popen(train_cmd(out, model, store, *resume), cwd=REPO, env=ENV, stdout=f, stderr=f)
        kind = "save" if landed["save"] < want["save"] and (
            landed["random"] >= want["random"] or landed["save"] <= landed["random"]) else "random"
        deadline = time.monotonic() + 300
        if kind == "save":  # kill the moment a new checkpoint folder appears: mid-save
            while p.poll() is None and time.monotonic() < deadline:
                if any(d.name not in seen for d in (out.glob("*checkpoint-*") if out.exists() else [])):
                    time.sleep(rng.uniform(0.0, 0.005))
                    break
                time.sleep(0.002)
        else:  # a random moment within the next few steps, once this attempt has started training
            ids = out / "sample_ids.rank0.txt"
            # The first batch trained writes the id log, or a resumed run rewinds it first: either changes it.
            start = _file_state(ids)
            while p.poll() is None and time.monotonic() < deadline and _file_state(ids) == start:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.5, 3.0) * step_s)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            # What the kill hit is read from the folder it froze, not guessed before the signal.
            new = sorted(d for d in (out.glob("*checkpoint-*") if out.exists() else []) if d.name not in seen)
            partial = [d.name for d in new if not (d / COMPLETE_MARKER).exists()]
            if kind == "save" and partial:
                landed["save"] += 1
                kills.append(f"during the save of {partial[0]} (partial at the kill)")
            elif kind == "save":
                landed["random"] += 1  # a kill all the same, but not mid-save
                kills.append(f"just after {new[0].name} was complete (not counted as mid-save)")
            else:
                landed["random"] += 1
                where = f", {partial[0]} partial" if partial else ""
                kills.append(f"at a random moment in training{where}")
            continue
        p.wait()
        finished = True
        if p.returncode != 0:
            problem = f"attempt {attempt} failed (rc={p.returncode}): {log.read_text()[-400:]}"
        break  # finished (or failed) before the kill
    if not problem and not (finished and (out / "log_history.json").exists()):
        resume = ["train.resume_from_checkpoint=latest"] if any(out.glob("checkpoint-*")) else []
        final = run(train_cmd(out, model, store, *resume), 600)
        problem = f"final resume failed: {final.stderr[-400:]}" if final.returncode else ""
    problem = problem or compare_logs(out, ref)
    for k in kills:
        t.add("training", f"SIGKILL {k}, resumed with resume_from_checkpoint=latest", not problem, problem)
    if not kills:
        t.add("training", "SIGKILL of training", False, problem or "the run finished before any kill")
    # Fewer faults tried than asked: say so rather than report a smaller total quietly.
    if len(kills) < n_kills:
        t.note("training", f"only {len(kills)} of {n_kills} training kills landed before the run finished")
    if landed["save"] < want["save"]:
        t.note("training", f"only {landed['save']} of {want['save']} mid-save kills hit a partial checkpoint")
    # A scheduler that relaunches a job which had already finished: the same command must change nothing.
    if not problem:
        again = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 600)
        problem = f"rc={again.returncode}: {again.stderr[-300:]}" if again.returncode else compare_logs(out, ref)
        t.add("training", "relaunch of the finished run with resume_from_checkpoint=latest", not problem, problem)
