"""Section ``sigterm`` of benchmarks/faults.py: SIGTERM during a save, at random moments, and to rank 1 only of a
2-rank run: a complete checkpoint at the next step end on every rank, exit 143, an exact resume.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from ._common import (
    PAUSE_ENV,
    PAUSE_LINE,
    TRAIN_STEPS,
    Tally,
    _free_port,
    _resume_to_end,
    _start,
    _stop,
    _train_reference,
    _two_rank_cmd,
    _wait_text,
    compare_logs,
    run,
    run_logs,
    train_cmd,
)

OUTCOME = (
    "a complete checkpoint at the next step end (every rank the same step), exit 143; the resume equals an "
    "uninterrupted run"
)


def _pid_with(tag: str, rank: int) -> int | None:
    """The process whose environment holds ``FAULTS_TAG=tag`` and ``RANK=rank`` (a launcher's worker)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FAULTS_TAG={tag}".encode() in env and f"RANK={rank}".encode() in env:
            return int(d.name)
    return None


def section_sigterm(t: Tally, work: Path, rng: random.Random, model: Path, store: Path) -> None:
    """SIGTERM (a scheduler's preemption notice): a complete checkpoint at the next step end, exit 143, exact resume."""
    from tokenswap.training import COMPLETE_MARKER, PREEMPTED_EXIT

    ref = _train_reference(work, model, store)
    history = json.loads((work / "train-ref" / "log_history.json").read_text())
    step_s = max(h["train_runtime"] for h in history if "train_runtime" in h) / TRAIN_STEPS
    # 1. during a save (held open 10 s: the signal lands in it however late a loaded machine delivers it; the run then
    # sleeps out the pause): the run stops at the end of the next step
    out = work / "sigterm-save"
    log = work / "sigterm-save.log"
    p = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "10@4"})
    problem = "" if _wait_text(p, log, f"checkpoint-4 {PAUSE_LINE}") else f"never reached checkpoint-4: {log.read_text()[-300:]}"
    if not problem:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        if p.returncode != PREEMPTED_EXIT or not (out / "checkpoint-5" / COMPLETE_MARKER).is_file():
            problem = f"rc={p.returncode} (want {PREEMPTED_EXIT}), checkpoint-5 complete: " \
                      f"{(out / 'checkpoint-5' / COMPLETE_MARKER).is_file()}: {log.read_text()[-300:]}"
    _stop(p)
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("sigterm", "SIGTERM during the save of checkpoint-4: checkpoint-5 complete, exit 143, resume equals an "
          "uninterrupted run", not problem, problem)
    # 2. at random moments in training, twice in one run
    out = work / "sigterm-random"
    stops = []
    problem = ""
    for attempt in range(2):
        resume = ["train.resume_from_checkpoint=latest"] if out.exists() else []
        log = work / f"sigterm-random-{attempt}.log"
        ids = out / "sample_ids.rank0.txt"
        # A random step of this attempt (counted in the id log, one line per trained batch), then a random moment
        # within it: timing from the reference run instead misses a run that trains 16 steps in half a second.
        lines = (ids.read_bytes().count(b"\n") if ids.exists() else 0) + rng.randint(1, 6)
        p = _start(train_cmd(out, model, store, *resume), log)
        deadline = time.monotonic() + 300
        while p.poll() is None and time.monotonic() < deadline and (
                not ids.exists() or ids.read_bytes().count(b"\n") < lines):
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 1.0) * min(step_s, 0.05))
        if p.poll() is not None:
            t.note("sigterm", f"random SIGTERM {attempt}: the run finished before the signal")
            continue
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        text = log.read_text()
        stopped = [ln for ln in text.splitlines() if "stopped by SIGTERM after step" in ln]
        if p.returncode != PREEMPTED_EXIT or not stopped:
            problem = problem or f"rc={p.returncode} (want {PREEMPTED_EXIT}): {text[-300:]}"
        else:
            step = int(stopped[0].split("after step ")[1].split(":")[0])
            if not (out / f"checkpoint-{step}" / COMPLETE_MARKER).is_file():
                problem = problem or f"checkpoint-{step} is not complete after the SIGTERM stop"
            stops.append(step)
    problem = problem or _resume_to_end(out, model, store, ref)
    for step in stops:
        t.add("sigterm", f"SIGTERM at a random moment (stopped after step {step}): exit 143, resume equals an "
              "uninterrupted run", not problem, problem)
    if not stops:
        t.add("sigterm", "SIGTERM at a random moment", False, problem or "every run finished before the signal")
    # 3. two ranks, the signal reaches rank 1 only: both stop after the same step, one complete checkpoint
    ref2_out = work / "sigterm-2rank-ref"
    proc = run(_two_rank_cmd(ref2_out, model, store, _free_port()), 900)
    if proc.returncode != 0:
        t.add("sigterm", "2 ranks: reference run", False, f"rc={proc.returncode}: {proc.stderr[-400:]}")
        return
    ref2 = run_logs(ref2_out)
    ref2_rank1 = (ref2_out / "sample_ids.rank1.txt").read_text()
    out = work / "sigterm-2rank"
    log = work / "sigterm-2rank.log"
    tag = f"sigterm-{os.getpid()}"
    p = _start(_two_rank_cmd(out, model, store, _free_port()), log, {PAUSE_ENV: "10@2", "FAULTS_TAG": tag})
    problem = ""
    if not _wait_text(p, log, f"checkpoint-2 {PAUSE_LINE}"):
        problem = f"never reached checkpoint-2: {log.read_text()[-300:]}"
    else:
        pid = _pid_with(tag, 1)
        if pid is None:
            problem = "rank 1's process not found"
        else:
            os.kill(pid, signal.SIGTERM)
            p.wait(timeout=300)
            states = sorted(x.name for x in (out / "checkpoint-3").glob("tokenswap_state.rank*.json"))
            if p.returncode == 0 or not (out / "checkpoint-3" / COMPLETE_MARKER).is_file() or len(states) != 2:
                problem = f"launcher rc={p.returncode}, checkpoint-3 marker/states: {states}: {log.read_text()[-400:]}"
            elif (out / "checkpoint-4").exists():
                problem = "a rank went on past the stop step"
    _stop(p)
    if not problem:
        again = run(_two_rank_cmd(out, model, store, _free_port(), "train.resume_from_checkpoint=latest"), 900)
        if again.returncode != 0:
            problem = f"2-rank resume rc={again.returncode}: {again.stderr[-400:]}"
        else:
            problem = compare_logs(out, ref2)
            if not problem and (out / "sample_ids.rank1.txt").read_text() != ref2_rank1:
                problem = "rank 1's sample_ids differ from the uninterrupted 2-rank run"
    t.add("sigterm", "2 ranks, SIGTERM to rank 1 only: both stop after step 3 with one complete checkpoint; the "
          "2-rank resume equals an uninterrupted 2-rank run", not problem, problem)
    # 4. SIGTERM to the launcher (what a scheduler signals): torch elastic forwards it to every rank and SIGKILLs
    # them 30 s later, so the step end and the save must fit in that.
    out = work / "sigterm-launcher"
    log = work / "sigterm-launcher.log"
    # The pause (6 s) must leave the rest of the step and the save inside elastic's 30 s, and be long enough for the
    # signal to land in it on a loaded machine.
    p = _start(_two_rank_cmd(out, model, store, _free_port()), log, {PAUSE_ENV: "6@2"})
    problem = ""
    if not _wait_text(p, log, f"checkpoint-2 {PAUSE_LINE}"):
        problem = f"never reached checkpoint-2: {log.read_text()[-300:]}"
    else:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        done = sorted(int(d.name.split("-")[1]) for d in out.glob("checkpoint-*") if (d / COMPLETE_MARKER).is_file())
        if p.returncode == 0 or done[-1:] != [3] or len(list((out / "checkpoint-3").glob("tokenswap_state.rank*"))) != 2:
            problem = f"launcher rc={p.returncode}, complete checkpoints {done}: {log.read_text()[-400:]}"
    _stop(p)
    if not problem:
        again = run(_two_rank_cmd(out, model, store, _free_port(), "train.resume_from_checkpoint=latest"), 900)
        problem = (f"2-rank resume rc={again.returncode}: {again.stderr[-400:]}" if again.returncode
                   else compare_logs(out, ref2))
        if not problem and (out / "sample_ids.rank1.txt").read_text() != ref2_rank1:
            problem = "rank 1's sample_ids differ from the uninterrupted 2-rank run"
    t.add("sigterm", "2 ranks, SIGTERM to the launcher: both ranks save checkpoint-3 and stop; the 2-rank resume "
          "equals an uninterrupted 2-rank run", not problem, problem)
